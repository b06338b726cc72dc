// LoRA adapters through the pair: a request naming an adapter gets the same
// tokens disaggregated as from one aggregated worker, and KV computed without
// the adapter it names (a prefill worker lacking it, or holding other weights
// under its name) is never used: the request fails instead of answering wrong.
// Adapters loaded and unloaded while the pair serves reach both workers or
// neither.
#include "gtest/gtest.h"
#include "tests/engine/lora_fixture.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

using lora_fixture::MakeAdapter;

// Token ids of tiny_llama's 256-entry vocabulary.
std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 29 + 7) % 250 + 3;
  return t;
}

v1::GenerateRequest Request(const std::string& id, const std::string& lora) {
  v1::GenerateRequest r = MakeRequest(id, Prompt(40), 12);
  r.mutable_sampling()->set_ignore_eos(true);
  r.set_lora_name(lora);
  return r;
}

TEST(LoraPairTest, AdapterThroughThePairEqualsOneWorker) {
  const std::string a = MakeAdapter("pair_a", 4, 8.0, {}, 21).dir.string();
  const std::string other = MakeAdapter("pair_other", 4, 8.0, {}, 22).dir.string();
  const std::string model = "--model=" + lora_fixture::kBase;
  Worker alone = StartWorker("decode_worker", {model, "--lora-modules=a=" + a});
  const GenerateResult want = Generate(alone.address(), Request("alone", "a"));
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  ASSERT_EQ(want.tokens.size(), 12u);
  const GenerateResult base = Generate(alone.address(), Request("base", ""));
  ASSERT_TRUE(base.status.ok()) << base.status.error_message();
  EXPECT_NE(base.tokens, want.tokens);  // the adapter matters
  const GenerateResult unknown = Generate(alone.address(), Request("unknown", "b"));
  EXPECT_EQ(unknown.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(unknown.status.error_message().find("'b' is not loaded (loaded: a)"), std::string::npos)
      << unknown.status.error_message();

  Worker prefill = StartWorker("prefill_worker", {model, "--lora-modules=a=" + a});
  Worker decode = StartWorker(
      "decode_worker", {model, "--prefill-address=" + prefill.address(), "--lora-modules=a=" + a});
  const GenerateResult pair = Generate(decode.address(), Request("pair", "a"));
  ASSERT_TRUE(pair.status.ok()) << pair.status.error_message();
  EXPECT_EQ(pair.tokens, want.tokens);
  EXPECT_GT(decode.Metric("tandem_kv_transfer_bytes_total"), 0);
  const GenerateResult pair_base = Generate(decode.address(), Request("pair_base", ""));
  ASSERT_TRUE(pair_base.status.ok()) << pair_base.status.error_message();
  EXPECT_EQ(pair_base.tokens, base.tokens);
  // The gateway's LoRA affinity reads which adapters a server runs.
  EXPECT_NE(decode.Metrics().find("vllm:lora_requests_info{"), std::string::npos);

  // Other weights under the same name: the KV's fingerprint disagrees.
  Worker wrong = StartWorker("prefill_worker", {model, "--lora-modules=a=" + other});
  Worker decode_wrong = StartWorker(
      "decode_worker", {model, "--prefill-address=" + wrong.address(), "--lora-modules=a=" + a});
  const GenerateResult mismatched = Generate(decode_wrong.address(), Request("mismatch", "a"));
  EXPECT_FALSE(mismatched.status.ok());
  EXPECT_NE(mismatched.status.error_message().find("LoRA adapter"), std::string::npos)
      << mismatched.status.error_message();
  EXPECT_EQ(decode_wrong.Metric("tandem_kv_transfer_failures_total",
                                {{"reason", "fingerprint_mismatch"}}),
            1);
  // A prefill worker without the adapter refuses the request by name.
  Worker bare = StartWorker("prefill_worker", {model});
  Worker decode_bare = StartWorker(
      "decode_worker", {model, "--prefill-address=" + bare.address(), "--lora-modules=a=" + a});
  const GenerateResult missing = Generate(decode_bare.address(), Request("missing", "a"));
  EXPECT_FALSE(missing.status.ok());
  EXPECT_NE(missing.status.error_message().find("'a' is not loaded"), std::string::npos)
      << missing.status.error_message();

  ExpectBlocksFreed(prefill, decode);
  ExpectBlocksFreed(wrong, decode_wrong);
  ExpectBlocksFreed(bare, decode_bare);
  for (Worker* w : {&decode_bare, &bare, &decode_wrong, &wrong, &decode, &prefill, &alone}) {
    StopWorker(*w);
  }
}

grpc::Status LoadAdapter(const std::string& address, const std::string& name,
                         const std::string& path, uint64_t* fingerprint = nullptr) {
  auto stub = DecodeStub(address);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::LoadLoraAdapterRequest req;
  req.set_lora_name(name);
  req.set_lora_path(path);
  v1::LoadLoraAdapterResponse resp;
  grpc::Status s = stub->LoadLoraAdapter(&ctx, req, &resp);
  if (fingerprint != nullptr) *fingerprint = resp.fingerprint();
  return s;
}

grpc::Status UnloadAdapter(const std::string& address, const std::string& name) {
  auto stub = DecodeStub(address);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::UnloadLoraAdapterRequest req;
  req.set_lora_name(name);
  v1::UnloadLoraAdapterResponse resp;
  return stub->UnloadLoraAdapter(&ctx, req, &resp);
}

TEST(LoraPairTest, AdaptersLoadedAndUnloadedWhileServing) {
  const std::string a = MakeAdapter("runtime_a", 4, 8.0, {}, 23).dir.string();
  const std::string b = MakeAdapter("runtime_b", 2, 4.0, {}, 24).dir.string();
  const std::string model = "--model=" + lora_fixture::kBase;
  Worker alone = StartWorker("decode_worker", {model, "--lora-modules=a=" + a + ",b=" + b});
  const GenerateResult want_a = Generate(alone.address(), Request("alone_a", "a"));
  const GenerateResult want_b = Generate(alone.address(), Request("alone_b", "b"));
  ASSERT_TRUE(want_a.status.ok()) << want_a.status.error_message();
  ASSERT_TRUE(want_b.status.ok()) << want_b.status.error_message();

  const std::vector<std::string> runtime = {model, "--allow-runtime-lora-updating", "--max-loras=1"};
  Worker prefill = StartWorker("prefill_worker", runtime);
  std::vector<std::string> decode_flags = runtime;
  decode_flags.push_back("--prefill-address=" + prefill.address());
  Worker decode = StartWorker("decode_worker", decode_flags);
  EXPECT_EQ(Generate(decode.address(), Request("none", "a")).status.error_code(),
            grpc::StatusCode::NOT_FOUND);
  uint64_t fingerprint = 0;
  grpc::Status loaded = LoadAdapter(decode.address(), "a", a, &fingerprint);
  ASSERT_TRUE(loaded.ok()) << loaded.error_message();
  EXPECT_NE(fingerprint, 0u);
  // Both workers have it: the prefill worker computes the prompt with it.
  const GenerateResult pair_a = Generate(decode.address(), Request("pair_a", "a"));
  ASSERT_TRUE(pair_a.status.ok()) << pair_a.status.error_message();
  EXPECT_EQ(pair_a.tokens, want_a.tokens);
  EXPECT_EQ(decode.Metric("tandem_kv_transfer_failures_total",
                          {{"reason", "fingerprint_mismatch"}}),
            0);
  EXPECT_EQ(LoadAdapter(decode.address(), "a", a).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  grpc::Status full = LoadAdapter(decode.address(), "b", b);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << full.error_message();
  EXPECT_EQ(LoadAdapter(decode.address(), "", a).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // Unloaded: new requests are refused; its slot takes b, on both workers.
  ASSERT_TRUE(UnloadAdapter(decode.address(), "a").ok());
  EXPECT_EQ(Generate(decode.address(), Request("gone", "a")).status.error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(UnloadAdapter(decode.address(), "a").error_code(), grpc::StatusCode::NOT_FOUND);
  loaded = LoadAdapter(decode.address(), "b", b);
  ASSERT_TRUE(loaded.ok()) << loaded.error_message();
  const GenerateResult pair_b = Generate(decode.address(), Request("pair_b", "b"));
  ASSERT_TRUE(pair_b.status.ok()) << pair_b.status.error_message();
  EXPECT_EQ(pair_b.tokens, want_b.tokens);
  // A prefill worker started since lacks it: the decode worker gives it the
  // adapter it loaded, then retries there.
  const int prefill_port = prefill.grpc_port;
  StopWorker(prefill);
  prefill = StartWorker("prefill_worker", runtime, prefill_port);
  // Once the decode worker has reconnected (its health counts usable prefill workers).
  ASSERT_TRUE(WaitForServing(decode.address(), std::chrono::seconds(20)));
  const GenerateResult healed = Generate(decode.address(), Request("healed", "b"));
  ASSERT_TRUE(healed.status.ok()) << healed.status.error_message();
  EXPECT_EQ(healed.tokens, want_b.tokens);

  // A prefill worker holding other weights under the name refuses it, and
  // the decode worker's own load is undone: the name is loaded nowhere.
  Worker other = StartWorker("prefill_worker", {model, "--allow-runtime-lora-updating",
                                                "--max-loras=2", "--lora-modules=a=" + b});
  std::vector<std::string> other_flags = runtime;
  other_flags.push_back("--prefill-address=" + other.address());
  Worker decode_other = StartWorker("decode_worker", other_flags);
  grpc::Status refused = LoadAdapter(decode_other.address(), "a", a);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::ALREADY_EXISTS) << refused.error_message();
  EXPECT_NE(refused.error_message().find("prefill worker " + other.address()), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(Generate(decode_other.address(), Request("undone", "a")).status.error_code(),
            grpc::StatusCode::NOT_FOUND);
  // Without --allow-runtime-lora-updating the adapters are fixed.
  EXPECT_EQ(LoadAdapter(alone.address(), "c", a).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  ExpectBlocksFreed(prefill, decode);
  ExpectBlocksFreed(other, decode_other);
  for (Worker* w : {&decode_other, &other, &decode, &prefill, &alone}) StopWorker(*w);
}

}  // namespace
}  // namespace tandem::testing
