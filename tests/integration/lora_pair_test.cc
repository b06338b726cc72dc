// LoRA adapters through the pair: a request naming an adapter gets the same
// tokens disaggregated as from one aggregated worker, and KV computed without
// the adapter it names (a prefill worker lacking it, or holding other weights
// under its name) is never used: the request fails instead of answering wrong.
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

}  // namespace
}  // namespace tandem::testing
