// The prefill/decode pair as a user meets it: real processes, real gRPC.
#include <signal.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <fstream>

#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/fault_proxy.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

std::vector<int32_t> Prompt(int n, int seed) { return TestPrompt(n, seed); }

// Greedy outputs (8 tokens, EOS ignored) of every prompt, batched through one
// local engine made from `config`; by id "p<i>".
std::map<std::string, std::vector<int32_t>> RunLocally(const EngineConfig& config,
                                                       const std::vector<std::vector<int32_t>>& prompts) {
  std::map<std::string, std::vector<int32_t>> out;
  auto local = LlmEngine::Create(config);
  EXPECT_TRUE(local.ok()) << local.status();
  if (!local.ok()) return out;
  SamplingParams p;
  p.max_tokens = 8;
  p.ignore_eos = true;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE((*local)->AddRequest("p" + std::to_string(i), prompts[i], p).ok());
  }
  while ((*local)->HasWork()) {
    auto step = (*local)->Step();
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) break;
    for (const auto& o : *step) {
      auto& v = out[o.id];
      v.insert(v.end(), o.new_tokens.begin(), o.new_tokens.end());
    }
  }
  return out;
}

// Waits (bounded) until both workers report no KV block in use.
// One pair shared by the tests of this suite; prefill and decode use
// different block sizes on purpose.
class PairTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    prefill_ = new Worker(StartWorker("prefill_worker", {"--block-size=4"}));
    decode_ = new Worker(StartWorker(
        "decode_worker", {"--block-size=32", "--prefill-address=" + prefill_->address()}));
  }
  static void TearDownTestSuite() {
    ExpectBlocksFreed(*prefill_, *decode_);
    for (Worker* w : {decode_, prefill_}) {
      StopWorker(*w);
      delete w;
    }
  }
  static Worker* prefill_;
  static Worker* decode_;
};
Worker* PairTest::prefill_ = nullptr;
Worker* PairTest::decode_ = nullptr;

TEST_F(PairTest, GreedyTokensEqualLocalNoneForTwentyPrompts) {
  EngineConfig config;
  config.runner.graph.requested_mode = CudaGraphMode::kNone;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 22; ++i) prompts.push_back(Prompt(1 + i * i * 3, i));  // 1 .. 1324 tokens
  std::map<std::string, std::vector<int32_t>> expected = RunLocally(config, prompts);
  const double steps_before = decode_->Metric("tandem_forward_steps_total", {{"runtime_mode", "FULL"}});
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = "p" + std::to_string(i);
    GenerateResult r = Generate(decode_->address(), MakeRequest("pair-" + id, prompts[i], 8));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, expected[id]) << "prompt " << i << " of " << prompts[i].size() << " tokens";
    EXPECT_EQ(r.finish_reason, v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(r.prompt_tokens, prompts[i].size());
    EXPECT_EQ(r.completion_tokens, 8u);
  }
  // Every decode step was a pure decode step served by a FULL graph: 7 per request.
  EXPECT_EQ(decode_->Metric("tandem_forward_steps_total", {{"runtime_mode", "FULL"}}) - steps_before,
            7.0 * prompts.size());
  EXPECT_EQ(decode_->Metric("tandem_forward_steps_total", {{"runtime_mode", "NONE"}}), 0);
  EXPECT_EQ(decode_->Metric("tandem_cudagraph_replay_ratio", {{"mode", "FULL"}}), 1.0);
  // Prefill steps within the capture range (<= 128 tokens here) are PIECEWISE.
  EXPECT_GT(prefill_->Metric("tandem_forward_steps_total", {{"runtime_mode", "PIECEWISE"}}), 0);
}

TEST_F(PairTest, ConcurrentStreams) {
  constexpr int kStreams = 10;
  std::vector<GenerateResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Generate(decode_->address(),
                            MakeRequest("conc-" + std::to_string(i), Prompt(5 + 7 * i, i), 16));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens.size(), 16u);
  }
}

TEST_F(PairTest, BadInputsNameFieldValueAndLimit) {
  struct Case {
    const char* what;
    v1::GenerateRequest request;
    grpc::StatusCode code;
    const char* needle;
  };
  std::vector<Case> cases;
  cases.push_back({"empty prompt", MakeRequest("bad-1", {}, 4), grpc::StatusCode::INVALID_ARGUMENT,
                   "prompt_token_ids"});
  cases.push_back({"too long", MakeRequest("bad-2", std::vector<int32_t>(5000, 3), 4),
                   grpc::StatusCode::INVALID_ARGUMENT, "limit"});
  cases.push_back({"vocab", MakeRequest("bad-3", {1, 512}, 4), grpc::StatusCode::INVALID_ARGUMENT,
                   "512"});
  cases.push_back({"max_tokens 0", MakeRequest("bad-4", {1, 2}, 0),
                   grpc::StatusCode::INVALID_ARGUMENT, "max_tokens"});
  cases.push_back({"max_tokens big", MakeRequest("bad-5", {1, 2}, 100000),
                   grpc::StatusCode::INVALID_ARGUMENT, "max_tokens"});
  auto urgent = MakeRequest("bad-priority", {1, 2}, 4);
  urgent.set_priority(3);
  cases.push_back({"priority under fcfs", urgent, grpc::StatusCode::INVALID_ARGUMENT,
                   "priority is 3, but priority scheduling is not enabled"});
  auto temp = MakeRequest("bad-6", {1, 2}, 4);
  temp.mutable_sampling()->set_temperature(-1);
  cases.push_back({"temperature", temp, grpc::StatusCode::INVALID_ARGUMENT, "temperature"});
  auto top_p = MakeRequest("bad-7", {1, 2}, 4);
  top_p.mutable_sampling()->set_top_p(1.5f);
  cases.push_back({"top_p", top_p, grpc::StatusCode::INVALID_ARGUMENT, "top_p"});
  auto top_k = MakeRequest("bad-8", {1, 2}, 4);
  top_k.mutable_sampling()->set_top_k(-2);
  cases.push_back({"top_k", top_k, grpc::StatusCode::INVALID_ARGUMENT, "top_k"});
  auto text = MakeRequest("bad-9", {}, 4);
  text.set_prompt("hello");
  cases.push_back({"text prompt", text, grpc::StatusCode::INVALID_ARGUMENT, "tokenizer"});
  cases.push_back({"id too long", MakeRequest(std::string(257, 'i'), {1}, 4),
                   grpc::StatusCode::INVALID_ARGUMENT, "request_id has 257 bytes"});
  for (const Case& c : cases) {
    GenerateResult r = Generate(decode_->address(), c.request);
    EXPECT_EQ(r.status.error_code(), c.code) << c.what;
    EXPECT_NE(r.status.error_message().find(c.needle), std::string::npos)
        << c.what << ": " << r.status.error_message();
  }
  // Duplicate in-flight request_id: the first call has streamed, so its id is registered.
  {
    HeldStream first(decode_->address(), MakeRequest("dup", Prompt(600, 1), 2000));
    ASSERT_TRUE(first.started());
    GenerateResult dup = Generate(decode_->address(), MakeRequest("dup", {1, 2}, 2));
    EXPECT_EQ(dup.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
    EXPECT_NE(dup.status.error_message().find("dup"), std::string::npos);
    EXPECT_EQ(first.Cancel().error_code(), grpc::StatusCode::CANCELLED);
  }
  // A cancel reaches the server asynchronously: wait (bounded) for the id to come free.
  for (int i = 0; i < 500; ++i) {
    GenerateResult r = Generate(decode_->address(), MakeRequest("dup", {1, 2, 3}, 1));
    if (r.status.error_code() != grpc::StatusCode::ALREADY_EXISTS) {
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // An id is free the moment its client sees the end: reused at once, never refused.
  for (int i = 0; i < 20; ++i) {
    GenerateResult again = Generate(decode_->address(), MakeRequest("dup", {1, 2, 3}, 1));
    ASSERT_TRUE(again.status.ok()) << i << ": " << again.status.error_message();
  }
  // Still serving.
  EXPECT_TRUE(Generate(decode_->address(), MakeRequest("after-bad", {1, 2, 3}, 3)).status.ok());
}

TEST_F(PairTest, CancelAndDeadlineFreeEveryBlock) {
  auto stub = v1::Decode::NewStub(
      grpc::CreateChannel(decode_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, MakeRequest("cancel-me", Prompt(300, 3), 3000));
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));  // streaming has started
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);

  GenerateResult late = Generate(decode_->address(), MakeRequest("deadline", Prompt(300, 4), 3000),
                                 std::chrono::milliseconds(150));
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ExpectBlocksFreed(*prefill_, *decode_);
  EXPECT_TRUE(Generate(decode_->address(), MakeRequest("after-cancel", {4, 5}, 3)).status.ok());
}

TEST(PairFailureTest, PrefillUnreachableIsUnavailable) {
  Worker decode = StartWorker("decode_worker",
                              {"--prefill-address=127.0.0.1:" + std::to_string(FreePort())});
  GenerateResult r = Generate(decode.address(), MakeRequest("nowhere", {1, 2, 3}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_EQ(AwaitMetric(decode, "tandem_kv_cache_blocks_in_use", 0), 0);
  // UNAVAILABLE is retried, on the one endpoint too: three attempts, each
  // counted.
  EXPECT_EQ(decode.Metric("tandem_kv_transfer_failures_total", {{"reason", "unavailable"}}), 3);
}

TEST(PairFailureTest, KilledPrefillIsUnavailableThenRecovers) {
  // SmolLM2's shapes: a 2000-token prefill takes seconds, not milliseconds,
  // however fast the kernels get, so the kill lands while it runs.
  const std::string model = "--model=synthetic:smollm2-135m";
  Worker prefill = StartWorker("prefill_worker", {model});
  const int port = prefill.grpc_port;
  Worker decode = StartWorker("decode_worker", {model, "--prefill-address=" + prefill.address()});
  GenerateResult r;
  std::thread t([&] { r = Generate(decode.address(), MakeRequest("killed", Prompt(2000, 7), 4)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  prefill.process->Signal(SIGKILL);
  t.join();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_EQ(AwaitMetric(decode, "tandem_kv_cache_blocks_in_use", 0), 0);
  Worker restarted = StartWorker("prefill_worker", {model}, port);
  GenerateResult ok;
  for (int attempt = 0; attempt < 20; ++attempt) {  // the channel reconnects with backoff
    ok = Generate(decode.address(), MakeRequest("after-restart-" + std::to_string(attempt), {1, 2, 3}, 4));
    if (ok.status.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

TEST(PairFailureTest, TwoPrefillWorkersBothGetTraffic) {
  Worker a = StartWorker("prefill_worker", {});
  Worker b = StartWorker("prefill_worker", {});
  Worker decode = StartWorker(
      "decode_worker", {"--prefill-address=ipv4:" + a.address() + "," + b.address()});
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(Generate(decode.address(), MakeRequest("rr-" + std::to_string(i), {1, 2, 3}, 2)).status.ok());
  }
  EXPECT_GT(a.Metric("tandem_requests_total", {{"status", "OK"}}), 0);
  EXPECT_GT(b.Metric("tandem_requests_total", {{"status", "OK"}}), 0);
}

TEST(PairFailureTest, BadChecksumRetriedOnceThenDataLoss) {
  Worker prefill = StartWorker("prefill_worker", {});
  FaultProxy proxy(prefill.address());
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + proxy.address()});
  proxy.Inject(Fault::kCorruptChecksum, 1);
  GenerateResult r = Generate(decode.address(), MakeRequest("crc-1", Prompt(40, 1), 4));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(decode.Metric("tandem_kv_transfer_failures_total", {{"reason", "data_loss"}}), 1);

  proxy.Inject(Fault::kCorruptChecksum, 2);
  r = Generate(decode.address(), MakeRequest("crc-2", Prompt(40, 1), 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DATA_LOSS) << r.status.error_message();
  ExpectBlocksFreed(prefill, decode);
}

TEST(PairFailureTest, FingerprintMismatchIsFailedPrecondition) {
  Worker prefill = StartWorker(
      "prefill_worker", {"--model=" + std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tiny_llama"});
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address()});
  GenerateResult r = Generate(decode.address(), MakeRequest("fp", {5, 6, 7}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(r.status.error_message().find("fingerprint"), std::string::npos);
  ExpectBlocksFreed(prefill, decode);  // freed on the engine thread, just after the error
}

// --dtype=bf16 on both CPU workers: bf16 KV travels and the pair's greedy
// tokens equal a local bf16 engine's; a pair whose KV dtypes differ refuses
// the transfer by name.
TEST(PairBf16Test, Bf16KvTravelsAndDtypeMismatchIsNamed) {
  EngineConfig config;
  config.backend.dtype = "bf16";
  config.runner.graph.requested_mode = CudaGraphMode::kNone;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(Prompt(3 + i * 37, i));
  std::map<std::string, std::vector<int32_t>> expected = RunLocally(config, prompts);
  Worker prefill = StartWorker("prefill_worker", {"--dtype=bf16"});
  Worker decode =
      StartWorker("decode_worker", {"--dtype=bf16", "--prefill-address=" + prefill.address()});
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = "p" + std::to_string(i);
    GenerateResult r = Generate(decode.address(), MakeRequest("bf16-" + id, prompts[i], 8));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, expected[id]) << "prompt " << i;
  }
  EXPECT_GT(decode.Metric("tandem_kv_transfer_bytes_total", {{"role", "decode"}}), 0);

  Worker f32_decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address()});
  GenerateResult r = Generate(f32_decode.address(), MakeRequest("mixed", {5, 6, 7}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(r.status.error_message().find("dtype"), std::string::npos) << r.status.error_message();
  ExpectBlocksFreed(prefill, decode);
  ExpectBlocksFreed(prefill, f32_decode);
}

// A cache too small for two requests: the second waits in the bounded queue,
// then gets RESOURCE_EXHAUSTED; the worker keeps serving.
TEST(PairFailureTest, CacheFullWaitsThenResourceExhausted) {
  // A slower model so the first request holds its blocks for a while.
  Worker prefill = StartWorker("prefill_worker", {"--model=synthetic:smollm2-135m",
                                                  "--max-num-seqs=2", "--max-capture-size=8"});
  Worker decode = StartWorker(
      "decode_worker", {"--model=synthetic:smollm2-135m", "--max-num-seqs=2",
                        "--num-kv-blocks=8", "--block-size=64", "--queue-timeout-ms=200",
                        "--prefill-address=" + prefill.address()});
  // 400 prompt tokens reserve 7 of the 8 blocks at once; 111 more fill the
  // 8th (about a second of decode steps, however fast they get).
  GenerateResult holder;
  std::thread t([&] { holder = Generate(decode.address(), MakeRequest("holder", Prompt(400, 1), 111)); });
  // The holder has its blocks before the waiter comes, however loaded the machine.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (decode.Metric("tandem_kv_cache_blocks_in_use") < 7 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(decode.Metric("tandem_kv_cache_blocks_in_use"), 7);  // (EXPECT: t must be joined)
  const auto start = std::chrono::steady_clock::now();
  GenerateResult waiter = Generate(decode.address(), MakeRequest("waiter", Prompt(200, 2), 4));
  const auto waited = std::chrono::steady_clock::now() - start;
  t.join();
  EXPECT_TRUE(holder.status.ok()) << holder.status.error_message();
  EXPECT_EQ(waiter.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << waiter.status.error_message();
  EXPECT_NE(waiter.status.error_message().find("KV cache full"), std::string::npos);
  EXPECT_GE(waited, std::chrono::milliseconds(200));
  EXPECT_TRUE(Generate(decode.address(), MakeRequest("after-full", Prompt(20, 3), 2)).status.ok());
  ExpectBlocksFreed(prefill, decode);
}

// --scheduling-policy=priority on both workers: while one request holds the
// decode worker's only sequence slot, a request of priority 5 and then one of
// priority -1 wait (their KV in); the second is served first.
TEST(PairPriorityTest, TheLowerValueIsServedFirst) {
  Worker prefill = StartWorker("prefill_worker", {"--model=synthetic:smollm2-135m",
                                                  "--scheduling-policy=priority", "--max-capture-size=8"});
  Worker decode = StartWorker(
      "decode_worker", {"--model=synthetic:smollm2-135m", "--scheduling-policy=priority",
                        "--max-num-seqs=1", "--prefill-address=" + prefill.address()});
  std::mutex mu;
  std::vector<std::string> finished;
  const auto run = [&](const std::string& id, int seed, uint32_t max_tokens, int32_t priority) {
    v1::GenerateRequest r = MakeRequest(id, Prompt(16, seed), max_tokens);
    r.set_priority(priority);
    const GenerateResult g = Generate(decode.address(), r);
    EXPECT_TRUE(g.status.ok()) << id << ": " << g.status.error_message();
    EXPECT_EQ(g.tokens.size(), max_tokens) << id;
    std::lock_guard<std::mutex> lock(mu);
    finished.push_back(id);
  };
  // The holder decodes for seconds (however fast the machine, the two below
  // are queued long before it ends: the wait is on the gauge, bounded).
  std::thread holder([&] { run("holder", 1, 200, 0); });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (decode.Metric("tandem_requests_running") < 1 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::thread low([&] { run("low", 2, 4, 5); });
  while (decode.Metric("tandem_requests_waiting") < 1 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::thread urgent([&] { run("urgent", 3, 4, -1); });
  while (decode.Metric("tandem_requests_waiting") < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double running = decode.Metric("tandem_requests_running");
  holder.join();
  low.join();
  urgent.join();
  EXPECT_EQ(running, 1) << "the holder ended before both were queued: the order says nothing";
  EXPECT_EQ(finished, (std::vector<std::string>{"holder", "urgent", "low"}));
  ExpectBlocksFreed(prefill, decode);
}

// Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE and Mixtral through the pair (prefill PIECEWISE, decode
// FULL_DECODE_ONLY, KV over gRPC), from safetensors and from llama.cpp's GGUF
// of the same tiny models (tests/fixtures/make_family_reference.py):
// transformers' greedy tokens for token prompts, and for a text prompt its
// tokens and text through each file's own tokenizer.
class FamilyPairTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(FamilyPairTest, GreedyTokensAndTextEqualTransformers) {
  const auto& [family, file] = GetParam();
  const std::string fixture = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tiny_" + family;
  std::ifstream in(fixture + "/reference.json");
  ASSERT_TRUE(in) << fixture;
  const nlohmann::json ref = nlohmann::json::parse(in);
  const std::string model = "--model=" + (file.empty() ? fixture : fixture + "/" + file);
  Worker prefill = StartWorker("prefill_worker", {model});
  Worker decode = StartWorker("decode_worker", {model, "--prefill-address=" + prefill.address()});
  int i = 0;
  for (const auto& c : ref["cases"]) {
    const std::vector<int32_t> tokens = c["tokens"];
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + c["prompt_len"].get<int>());
    const std::vector<int32_t> want = c["greedy"];
    GenerateResult g = Generate(decode.address(),
                                MakeRequest("ids-" + std::to_string(i++), prompt, want.size()));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens, want);
  }
  v1::GenerateRequest text;
  text.set_request_id("text");
  text.set_prompt(ref["text"]["prompt"].get<std::string>());
  text.mutable_sampling()->set_max_tokens(ref["text"]["greedy"].size());
  text.mutable_sampling()->set_ignore_eos(true);
  GenerateResult g = Generate(decode.address(), text);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.prompt_tokens, ref["text"]["prompt_ids"].size());
  EXPECT_EQ(g.tokens, ref["text"]["greedy"].get<std::vector<int32_t>>());
  EXPECT_EQ(g.text, ref["text"]["greedy_text"].get<std::string>());
  ExpectBlocksFreed(prefill, decode);
  StopWorker(decode);
  StopWorker(prefill);
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyPairTest,
                         ::testing::Combine(::testing::Values("qwen2", "qwen3", "qwen2_moe",
                                                              "qwen3_moe", "mixtral"),
                                            ::testing::Values("", "model-f32.gguf")),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param).empty() ? "_safetensors" : "_gguf");
                         });

}  // namespace
}  // namespace tandem::testing
