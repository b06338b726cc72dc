// The statistics and workload of `tandem bench serve`, against hand-computed
// values (numpy's percentile and std definitions).
#include "tools/serve_stats.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ServeStatsTest, PercentilesInterpolateLikeNumpy) {
  const std::vector<double> one_to_ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(Percentile(one_to_ten, 50), 5.5);
  EXPECT_DOUBLE_EQ(Percentile(one_to_ten, 90), 9.1);
  EXPECT_DOUBLE_EQ(Percentile(one_to_ten, 99), 9.91);
  EXPECT_DOUBLE_EQ(Percentile(one_to_ten, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(one_to_ten, 100), 10);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
}

TEST(ServeStatsTest, DescribeReportsMillisecondsFromUnsortedSeconds) {
  // Sorted: 1 1 2 3 3 4 5 5 5 6 9 (ms).
  const LatencyStats s =
      Describe({0.003, 0.001, 0.004, 0.001, 0.005, 0.009, 0.002, 0.006, 0.005, 0.003, 0.005});
  EXPECT_EQ(s.count, 11);
  EXPECT_NEAR(s.mean, 4, 1e-9);
  EXPECT_NEAR(s.median, 4, 1e-9);
  EXPECT_NEAR(s.p90, 6, 1e-9);
  EXPECT_NEAR(s.p99, 8.7, 1e-9);
  EXPECT_NEAR(s.std, std::sqrt(56.0 / 11), 1e-9);  // population std
  EXPECT_EQ(Describe({}).count, 0);
}

RequestRecord Record(double ttft, double e2e, int out, std::vector<double> itl, int in = 10) {
  RequestRecord r;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.output_tokens = out;
  r.input_tokens = in;
  r.itl_s = std::move(itl);
  return r;
}

TEST(ServeStatsTest, TpotExcludesTheFirstToken) {
  EXPECT_DOUBLE_EQ(Tpot(Record(0.5, 1.5, 11, {})), 0.1);
  EXPECT_LT(Tpot(Record(0.5, 0.5, 1, {})), 0);  // undefined for one token
}

TEST(ServeStatsTest, GoodputCountsRequestsMeetingEverySlo) {
  std::vector<RequestRecord> rs = {
      Record(0.1, 1.1, 11, {0.1}),  // ttft 100 ms, tpot 100 ms, e2e 1100 ms
      Record(0.6, 1.6, 11, {0.1}),  // ttft 600 ms: misses ttft:500
      Record(0.1, 3.1, 11, {0.3}),  // tpot 300 ms: misses tpot:200
      Record(0.1, 1.1, 11, {0.1}),
  };
  rs[3].status = "UNAVAILABLE";  // failed requests never count
  auto slo = ParseSlo("ttft:500,tpot:200");
  ASSERT_TRUE(slo.ok()) << slo.status();
  const ServeSummary s = Summarize(rs, 2.0, *slo);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.by_status.at("OK"), 3);
  EXPECT_EQ(s.by_status.at("UNAVAILABLE"), 1);
  EXPECT_DOUBLE_EQ(s.goodput, 0.5);  // 1 request in 2 s
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.5);
  EXPECT_EQ(s.total_output_tokens, 33);
  EXPECT_DOUBLE_EQ(s.output_throughput, 16.5);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, (33 + 30) / 2.0);
  EXPECT_EQ(s.itl.count, 3);
  EXPECT_EQ(s.ttft.count, 3);
  EXPECT_NEAR(s.ttft.median, 100, 1e-9);
  // Without an SLO goodput is not reported; an e2el SLO alone works too.
  EXPECT_EQ(Summarize(rs, 2.0, Slo{}).goodput, -1);
  EXPECT_DOUBLE_EQ(Summarize(rs, 2.0, *ParseSlo("e2el:2000")).goodput, 1.0);
}

TEST(ServeStatsTest, SloAndMixErrorsNameTheEntry) {
  EXPECT_FALSE(ParseSlo("ttft").ok());
  EXPECT_FALSE(ParseSlo("ttft:-1").ok());
  auto bad_metric = ParseSlo("latency:5");
  ASSERT_FALSE(bad_metric.ok());
  EXPECT_NE(bad_metric.status().message().find("latency"), std::string::npos);
  auto mix = ParseMix("chat=128/64:0.8,1024/16:0.2");
  ASSERT_TRUE(mix.ok()) << mix.status();
  ASSERT_EQ(mix->size(), 2u);
  EXPECT_EQ((*mix)[0].name, "chat");
  EXPECT_EQ((*mix)[0].input_len, 128);
  EXPECT_EQ((*mix)[0].output_len, 64);
  EXPECT_DOUBLE_EQ((*mix)[0].weight, 0.8);
  EXPECT_EQ((*mix)[1].name, "1024/16");
  EXPECT_EQ((*mix)[0].priority, 0);
  // A class's requests may carry a priority.
  mix = ParseMix("chat=128/64:1@-1,batch=512/16:3@2");
  ASSERT_TRUE(mix.ok()) << mix.status();
  EXPECT_EQ((*mix)[0].priority, -1);
  EXPECT_DOUBLE_EQ((*mix)[1].weight, 3);
  EXPECT_EQ((*mix)[1].priority, 2);
  for (const char* bad : {"", "chat=128:0.8", "chat=0/4:1", "chat=4/4:0", "=4/4:1", "4/4:x",
                          "4/4:1@", "4/4:1@x", "4/4:@1"}) {
    auto r = ParseMix(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
  EXPECT_NE(ParseMix("a=1/2:1,b=3/x:1").status().message().find("b=3/x:1"), std::string::npos);
}

TEST(ServeStatsTest, ArrivalsHaveTheRequestedRateAndBurstiness) {
  std::mt19937_64 rng(1);
  const int n = 20000;
  for (double burstiness : {1.0, 0.25, 4.0}) {
    const std::vector<double> t = ArrivalTimes(n, 8.0, burstiness, rng);
    std::vector<double> gaps(n);
    gaps[0] = t[0];
    for (int i = 1; i < n; ++i) gaps[i] = t[i] - t[i - 1];
    const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / n;
    double var = 0;
    for (double g : gaps) var += (g - mean) * (g - mean);
    var /= n;
    EXPECT_NEAR(mean, 1.0 / 8, 0.01 / 8 * 3) << burstiness;  // within 3%
    // A gamma gap's squared coefficient of variation is 1 / shape.
    EXPECT_NEAR(var / (mean * mean), 1.0 / burstiness, 0.1 / burstiness) << burstiness;
    for (int i = 1; i < n; ++i) ASSERT_GE(t[i], t[i - 1]);
  }
  const std::vector<double> all_at_once =
      ArrivalTimes(5, std::numeric_limits<double>::infinity(), 1, rng);
  EXPECT_EQ(all_at_once, std::vector<double>(5, 0.0));
}

TEST(ServeStatsTest, SampledLengthsStayInRange) {
  std::mt19937_64 rng(2);
  int lo = 1 << 30, hi = 0;
  for (int i = 0; i < 5000; ++i) {
    const int n = SampleLength(100, 0.5, rng);
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  EXPECT_EQ(lo, 50);
  EXPECT_EQ(hi, 150);
  EXPECT_EQ(SampleLength(100, 0, rng), 100);
  EXPECT_EQ(SampleLength(1, 0.9, rng) >= 1, true);
}

}  // namespace
}  // namespace tandem
