// The workload and the statistics of `tandem bench serve`, apart from the
// gRPC client so that they can be tested on their own.
//
// Definitions follow `vllm bench serve` (vLLM 0.15.1), so figures compare
// directly:
//  - TTFT: request start to the first message carrying tokens;
//  - ITL: the gaps between consecutive token-carrying messages;
//  - TPOT: (E2E - TTFT) / (output tokens - 1), for requests with > 1 token;
//  - percentiles interpolate linearly between order statistics (numpy's
//    default), the standard deviation is the population one (numpy.std);
//  - goodput: completed requests meeting every given SLO, per second;
//  - arrivals: gamma-distributed gaps with shape `burstiness` and mean
//    1 / rate (burstiness 1 is a Poisson process); rate inf sends all at once.
#ifndef TANDEM_TOOLS_SERVE_STATS_H_
#define TANDEM_TOOLS_SERVE_STATS_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// ---- workload ----

// One kind of request in a mixed workload: lengths and a share.
struct RequestClass {
  std::string name;
  int input_len = 0;
  int output_len = 0;
  double weight = 1;
  int32_t priority = 0;  // the requests' priority (--scheduling-policy=priority)
};

// "[NAME=]IN/OUT:WEIGHT[@PRIORITY],..." e.g. "chat=128/64:0.8@0,doc=1024/16:0.2@1";
// weights need not sum to 1; PRIORITY (default 0) is sent as each request's
// priority. INVALID_ARGUMENT names the entry at fault.
absl::StatusOr<std::vector<RequestClass>> ParseMix(absl::string_view text);

// Seconds from the start at which each of `n` requests is sent. `rate` in
// requests/s (infinity: all at 0); `burstiness` > 0.
std::vector<double> ArrivalTimes(int n, double rate, double burstiness, std::mt19937_64& rng);

// A length drawn uniformly from [len * (1 - ratio), len * (1 + ratio)],
// at least 1 (vLLM's random dataset, range_ratio in [0, 1)).
int SampleLength(int len, double range_ratio, std::mt19937_64& rng);

// ---- results ----

struct RequestRecord {
  int index = 0;
  std::string klass;       // RequestClass::name, or the dataset's name
  double start_s = 0;      // sent, seconds after the benchmark started
  int input_tokens = 0;
  int output_tokens = 0;
  std::string status = "OK";  // gRPC code name
  std::string error;
  double ttft_s = 0;
  double e2e_s = 0;
  std::vector<double> itl_s;  // gaps between token-carrying messages
  bool ok() const { return status == "OK"; }
};

// Service-level objectives in milliseconds; 0 = not set.
struct Slo {
  double ttft_ms = 0;
  double tpot_ms = 0;
  double e2el_ms = 0;
  bool any() const { return ttft_ms > 0 || tpot_ms > 0 || e2el_ms > 0; }
};
// "ttft:500,tpot:50,e2el:2000" (any subset).
absl::StatusOr<Slo> ParseSlo(absl::string_view text);

// TPOT of one request in seconds; negative when it has < 2 output tokens.
double Tpot(const RequestRecord& r);
bool MeetsSlo(const RequestRecord& r, const Slo& slo);

// Linear interpolation between order statistics; `sorted` ascending and
// non-empty; p in [0, 100].
double Percentile(const std::vector<double>& sorted, double p);

struct LatencyStats {
  int count = 0;
  double mean = 0, std = 0, median = 0, p90 = 0, p99 = 0;  // milliseconds
};
LatencyStats Describe(std::vector<double> seconds);

struct ServeSummary {
  int completed = 0;
  int failed = 0;
  std::map<std::string, int> by_status;
  double duration_s = 0;
  int64_t total_input_tokens = 0;   // completed requests
  int64_t total_output_tokens = 0;
  double request_throughput = 0;    // completed / s
  double goodput = -1;              // SLO-meeting / s; -1 without an SLO
  double output_throughput = 0;     // tokens / s
  double total_token_throughput = 0;
  LatencyStats ttft, tpot, itl, e2el;
};
ServeSummary Summarize(const std::vector<RequestRecord>& records, double duration_s,
                       const Slo& slo);

}  // namespace tandem

#endif  // TANDEM_TOOLS_SERVE_STATS_H_
