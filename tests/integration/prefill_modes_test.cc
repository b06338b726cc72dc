// Where the decode worker prefills: remote (disaggregated), local
// (aggregated), conditional (short prompts local) and the local fallback when
// no prefill worker is reachable. Real processes, real gRPC; greedy outputs
// must be the same whichever way the prompt was prefilled.
#include <signal.h>

#include <thread>

#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

constexpr uint32_t kMaxTokens = 8;
constexpr int kShortPromptMax = 32;  // --local-prefill-max-tokens of the conditional worker

// Prompts of 1 .. 600 tokens: both sides of the conditional threshold, and
// long enough to be prefilled in chunks next to running decodes.
std::vector<std::vector<int32_t>> Prompts() {
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {1, 5, 17, 32, 33, 64, 150, 600}) prompts.push_back(TestPrompt(n, n));
  return prompts;
}

// Sends every prompt at once (they share batches) and returns the token ids
// in prompt order.
std::vector<std::vector<int32_t>> GenerateAll(const Worker& decode, const std::string& tag) {
  const auto prompts = Prompts();
  std::vector<GenerateResult> results(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = Generate(decode.address(),
                            MakeRequest(tag + "-" + std::to_string(i), prompts[i], kMaxTokens));
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::vector<int32_t>> tokens;
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_TRUE(results[i].status.ok()) << tag << " prompt " << i << ": "
                                        << results[i].status.error_message();
    EXPECT_EQ(results[i].completion_tokens, kMaxTokens) << tag << " prompt " << i;
    tokens.push_back(results[i].tokens);
  }
  return tokens;
}

void ExpectNoBlockInUse(const Worker& w) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (w.Metric("tandem_kv_cache_blocks_in_use") != 0 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(w.Metric("tandem_kv_cache_blocks_in_use"), 0);
}

class PrefillModesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    prefill_ = new Worker(StartWorker("prefill_worker", {}));
    remote_ = new Worker(StartWorker("decode_worker", {"--prefill-address=" + prefill_->address()}));
    expected_ = new std::vector<std::vector<int32_t>>(GenerateAll(*remote_, "remote"));
  }
  static void TearDownTestSuite() {
    for (Worker* w : {remote_, prefill_}) {
      ExpectNoBlockInUse(*w);
      StopWorker(*w);
      delete w;
    }
    delete expected_;
  }
  static Worker* prefill_;
  static Worker* remote_;
  static std::vector<std::vector<int32_t>>* expected_;  // remote prefill's greedy tokens
};
Worker* PrefillModesTest::prefill_ = nullptr;
Worker* PrefillModesTest::remote_ = nullptr;
std::vector<std::vector<int32_t>>* PrefillModesTest::expected_ = nullptr;

TEST_F(PrefillModesTest, AggregatedEqualsRemoteAndRunsMixedBatchesEager) {
  // No --prefill-address: this worker prefills everything itself.
  Worker aggregated = StartWorker("decode_worker", {});
  EXPECT_NE(aggregated.process->Log().find("prefill: local"), std::string::npos);
  EXPECT_EQ(GenerateAll(aggregated, "aggregated"), *expected_);
  const double n = static_cast<double>(Prompts().size());
  EXPECT_EQ(aggregated.Metric("tandem_prefill_local_total", {{"reason", "aggregated"}}), n);
  EXPECT_EQ(aggregated.Metric("tandem_kv_transfer_bytes_total"), 0);
  // FULL_DECODE_ONLY: steps with a prompt in them run eager, uniform decode
  // steps replay FULL graphs, nothing is PIECEWISE.
  EXPECT_GT(aggregated.Metric("tandem_forward_steps_total", {{"runtime_mode", "NONE"}}), 0);
  EXPECT_GT(aggregated.Metric("tandem_forward_steps_total", {{"runtime_mode", "FULL"}}), 0);
  EXPECT_EQ(aggregated.Metric("tandem_forward_steps_total", {{"runtime_mode", "FULL"}}),
            aggregated.Metric("tandem_cudagraph_replays_total", {{"mode", "FULL"}}));
  EXPECT_EQ(aggregated.Metric("tandem_forward_steps_total", {{"runtime_mode", "PIECEWISE"}}), 0);
  EXPECT_EQ(aggregated.Metric("tandem_requests_total", {{"status", "OK"}}), n);
  ExpectNoBlockInUse(aggregated);
  // --prefill=local keeps it local even with an address.
  Worker forced = StartWorker("decode_worker",
                              {"--prefill=local", "--prefill-address=" + prefill_->address()});
  GenerateResult r = Generate(forced.address(), MakeRequest("forced", Prompts()[3], kMaxTokens));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, (*expected_)[3]);
  EXPECT_EQ(forced.Metric("tandem_prefill_local_total", {{"reason", "aggregated"}}), 1);
  StopWorker(aggregated);
  StopWorker(forced);
}

TEST_F(PrefillModesTest, ConditionalPrefillsShortPromptsLocally) {
  const double prefill_ok_before = prefill_->Metric("tandem_requests_total", {{"status", "OK"}});
  Worker conditional = StartWorker(
      "decode_worker", {"--prefill-address=" + prefill_->address(),
                        "--local-prefill-max-tokens=" + std::to_string(kShortPromptMax)});
  EXPECT_EQ(GenerateAll(conditional, "conditional"), *expected_);
  int short_prompts = 0, long_prompts = 0;
  for (const auto& p : Prompts()) ++(p.size() <= kShortPromptMax ? short_prompts : long_prompts);
  EXPECT_EQ(conditional.Metric("tandem_prefill_local_total", {{"reason", "short_prompt"}}),
            short_prompts);
  // Only the long prompts went to the prefill worker.
  EXPECT_EQ(prefill_->Metric("tandem_requests_total", {{"status", "OK"}}) - prefill_ok_before,
            long_prompts);
  EXPECT_GT(conditional.Metric("tandem_kv_transfer_bytes_total"), 0);
  ExpectNoBlockInUse(conditional);
  StopWorker(conditional);
}

TEST_F(PrefillModesTest, FallbackPrefillsLocallyWhenThePrefillWorkerIsKilled) {
  Worker prefill = StartWorker("prefill_worker", {});
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address(),
                                                "--prefill-fallback=local"});
  GenerateResult before = Generate(decode.address(), MakeRequest("fb-0", Prompts()[5], kMaxTokens));
  ASSERT_TRUE(before.status.ok()) << before.status.error_message();
  EXPECT_EQ(before.tokens, (*expected_)[5]);
  EXPECT_EQ(decode.Metric("tandem_prefill_local_total", {{"reason", "fallback"}}), 0);
  // Killed while a long prompt may still be in transfer, then gone for good.
  GenerateResult during;
  std::thread t([&] {
    during = Generate(decode.address(), MakeRequest("fb-1", Prompts()[7], kMaxTokens));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  prefill.process->Signal(SIGKILL);
  t.join();
  ASSERT_TRUE(during.status.ok()) << during.status.error_message();
  EXPECT_EQ(during.tokens, (*expected_)[7]);
  EXPECT_EQ(GenerateAll(decode, "fallback"), *expected_);
  EXPECT_GE(decode.Metric("tandem_prefill_local_total", {{"reason", "fallback"}}),
            static_cast<double>(Prompts().size()));
  EXPECT_GT(decode.Metric("tandem_kv_transfer_failures_total", {{"reason", "unavailable"}}), 0);
  EXPECT_EQ(decode.Metric("tandem_requests_total", {{"status", "OK"}}),
            2 + static_cast<double>(Prompts().size()));
  ExpectNoBlockInUse(decode);
  StopWorker(decode);
}

// A gateway (llm-d's P/D routing) names the prefill worker per request in
// x-prefiller-host-port: honoured where the operator trusts it (here:
// loopback's network) even when the configured pool is unreachable; without
// it the pool is used; a malformed one is refused; and where it is not
// trusted, a name is refused (403) and never dialled.
TEST_F(PrefillModesTest, GatewayChosenPrefillWorkerIsHonoured) {
  {
    Worker untrusting = StartWorker("decode_worker", {"--prefill-address=127.0.0.1:1"});
    GenerateResult refused = Generate(untrusting.address(), MakeRequest("gw-0", Prompts()[5], kMaxTokens),
                                      std::chrono::seconds(30),
                                      {{"x-prefiller-host-port", prefill_->address()}});
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << refused.status.error_message();
    EXPECT_NE(refused.status.error_message().find("--prefiller-allow"), std::string::npos);
    ExpectNoBlockInUse(untrusting);
    StopWorker(untrusting);
  }
  Worker decode = StartWorker("decode_worker", {"--prefill-address=127.0.0.1:1", "--prefiller-allow=127.0.0.0/8"});
  const auto prompts = Prompts();
  GenerateResult chosen = Generate(decode.address(), MakeRequest("gw-1", prompts[5], kMaxTokens),
                                   std::chrono::seconds(60),
                                   {{"x-prefiller-host-port", prefill_->address()}});
  ASSERT_TRUE(chosen.status.ok()) << chosen.status.error_message();
  EXPECT_EQ(chosen.tokens, (*expected_)[5]);
  GenerateResult pool = Generate(decode.address(), MakeRequest("gw-2", prompts[5], kMaxTokens),
                                 std::chrono::seconds(30));
  EXPECT_EQ(pool.status.error_code(), grpc::StatusCode::UNAVAILABLE) << pool.status.error_message();
  GenerateResult bad = Generate(decode.address(), MakeRequest("gw-3", prompts[5], kMaxTokens),
                                std::chrono::seconds(30), {{"x-prefiller-host-port", "no port"}});
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad.status.error_message().find("x-prefiller-host-port"), std::string::npos)
      << bad.status.error_message();
  ExpectNoBlockInUse(decode);
  StopWorker(decode);
}

TEST(PrefillModesFlagsTest, BadPrefillFlagsExitTwo) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--prefill=remote"}, {"--prefill=elsewhere"},
        {"--prefill-fallback=maybe"}, {"--local-prefill-max-tokens=-1"},
        {"--kv-streams=0"}, {"--kv-bytes-per-stream=-1"}, {"--kv-receive-window-bytes=1024"},
        {"--kv-receive-window-bytes=2147483647"}}) {
    Process p({BinDir() + "/decode_worker", "--grpc-address=127.0.0.1:0",
               "--metrics-address=127.0.0.1:0", flags[0]},
              ::testing::TempDir() + "/bad_prefill_flags.log");
    EXPECT_EQ(p.Wait(std::chrono::seconds(20)), 2) << flags[0] << "\n" << p.Log();
  }
}

}  // namespace
}  // namespace tandem::testing
