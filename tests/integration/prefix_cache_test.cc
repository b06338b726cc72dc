// Prefix caching across the pair: a second chat turn moves only its new
// tokens' KV, outputs equal those of workers without caching, and cancelled
// shared-prefix requests leave no block held on either worker.
#include <thread>

#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

struct Pair {
  Worker prefill, decode;
};

Pair StartPair(bool caching) {
  const std::string flag = caching ? "--enable-prefix-caching=true" : "--enable-prefix-caching=false";
  Pair p;
  p.prefill = StartWorker("prefill_worker", {flag});
  p.decode = StartWorker("decode_worker", {"--prefill-address=" + p.prefill.address(), flag});
  return p;
}

TEST(PrefixCacheTest, SecondTurnSendsOnlyItsNewTokensKv) {
  // Turn 1: a 100-token prompt and 20 tokens out. Turn 2: all of that plus
  // 30 new tokens. The decode worker computed KV for 119 of turn 1's tokens
  // (the last sampled token never runs), so 7 full blocks of 16 = 112 tokens
  // are cached there; the prefill worker saw only the 100-token prompt: 96.
  const std::vector<int32_t> turn1 = TestPrompt(100, 1);
  std::vector<int32_t> turn2;
  std::vector<int32_t> outputs[2];
  double bytes1[2], bytes2[2];
  for (bool caching : {true, false}) {
    SCOPED_TRACE(caching ? "caching" : "no caching");
    Pair pair = StartPair(caching);
    GenerateResult g1 = Generate(pair.decode.address(), MakeRequest("t1", turn1, 20));
    ASSERT_TRUE(g1.status.ok()) << g1.status.error_message();
    ASSERT_EQ(g1.tokens.size(), 20u);
    bytes1[caching] = pair.decode.Metric("tandem_kv_transfer_bytes_total");
    turn2 = turn1;
    turn2.insert(turn2.end(), g1.tokens.begin(), g1.tokens.end());
    const std::vector<int32_t> user = TestPrompt(30, 2);
    turn2.insert(turn2.end(), user.begin(), user.end());
    GenerateResult g2 = Generate(pair.decode.address(), MakeRequest("t2", turn2, 10));
    ASSERT_TRUE(g2.status.ok()) << g2.status.error_message();
    outputs[caching] = g2.tokens;
    bytes2[caching] = pair.decode.Metric("tandem_kv_transfer_bytes_total") - bytes1[caching];
    const double queries = 100 + 150;
    EXPECT_EQ(AwaitMetric(pair.decode, "tandem_prefix_cache_queries_total", queries), queries);
    EXPECT_EQ(AwaitMetric(pair.prefill, "tandem_prefix_cache_queries_total", queries), queries);
    const double per_token = bytes1[caching] / 100;
    if (caching) {
      EXPECT_EQ(pair.decode.Metric("tandem_prefix_cache_hits_total"), 112);
      EXPECT_EQ(pair.prefill.Metric("tandem_prefix_cache_hits_total"), 96);
      EXPECT_EQ(bytes2[caching], (150 - 112) * per_token);
      EXPECT_EQ(pair.decode.Metric("tandem_kv_transfer_saved_bytes_total"), 112 * per_token);
      EXPECT_GT(pair.decode.Metric("tandem_kv_cache_blocks_cached"), 0);
    } else {
      EXPECT_EQ(pair.decode.Metric("tandem_prefix_cache_hits_total"), 0);
      EXPECT_EQ(pair.prefill.Metric("tandem_prefix_cache_hits_total"), 0);
      EXPECT_EQ(bytes2[caching], 150 * per_token);
      EXPECT_EQ(pair.decode.Metric("tandem_kv_transfer_saved_bytes_total"), 0);
    }
    EXPECT_EQ(AwaitMetric(pair.decode, "tandem_kv_cache_blocks_in_use", 0), 0);
    EXPECT_EQ(AwaitMetric(pair.prefill, "tandem_kv_cache_blocks_in_use", 0), 0);
    StopWorker(pair.decode);
    StopWorker(pair.prefill);
  }
  EXPECT_EQ(outputs[true], outputs[false]);
  EXPECT_EQ(bytes1[true], bytes1[false]);
}

// Many requests behind one system prompt, some cancelled by short deadlines
// while their KV is in flight or they decode, with a cache small enough to
// evict: the survivors' tokens equal a caching-off run's and both workers end
// with every block free (ASan runs this too: no double free, no leak).
TEST(PrefixCacheTest, SharedPrefixesUnderCancelsAndEvictionLeakNothing) {
  const std::vector<int32_t> system = TestPrompt(64, 3);
  auto prompt = [&](int i) {
    std::vector<int32_t> p = system;
    const std::vector<int32_t> user = TestPrompt(5 + i % 40, 10 + i);
    p.insert(p.end(), user.begin(), user.end());
    return p;
  };
  constexpr int kRequests = 24;
  std::map<int, std::vector<int32_t>> survivors[2];
  for (bool caching : {true, false}) {
    SCOPED_TRACE(caching ? "caching" : "no caching");
    const std::string flag = caching ? "--enable-prefix-caching=true" : "--enable-prefix-caching=false";
    Worker prefill = StartWorker("prefill_worker", {flag, "--num-kv-blocks=24"});
    Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address(), flag,
                                                  "--num-kv-blocks=40", "--max-num-seqs=8"});
    std::vector<GenerateResult> results(kRequests);
    std::vector<std::thread> threads;
    for (int i = 0; i < kRequests; ++i) {
      threads.emplace_back([&, i] {
        // Every third request gives up after 30-120 ms.
        const auto deadline = i % 3 == 0 ? std::chrono::milliseconds(30 + 10 * (i % 10))
                                         : std::chrono::milliseconds(60000);
        results[i] = Generate(decode.address(),
                              MakeRequest("s" + std::to_string(i), prompt(i), 24), deadline);
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < kRequests; ++i) {
      if (i % 3 != 0) {
        ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
        survivors[caching][i] = results[i].tokens;
      }
    }
    EXPECT_EQ(AwaitMetric(decode, "tandem_kv_cache_blocks_in_use", 0), 0);
    EXPECT_EQ(AwaitMetric(prefill, "tandem_kv_cache_blocks_in_use", 0), 0);
    EXPECT_EQ(AwaitMetric(decode, "tandem_requests_waiting_for_kv", 0), 0);
    if (caching) {
      EXPECT_GT(decode.Metric("tandem_prefix_cache_hits_total"), 0);
    }
    StopWorker(decode);
    StopWorker(prefill);
  }
  EXPECT_EQ(survivors[true], survivors[false]);
}

}  // namespace
}  // namespace tandem::testing
