#include "tools/serve_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem {

absl::StatusOr<std::vector<RequestClass>> ParseMix(absl::string_view text) {
  std::vector<RequestClass> out;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("--mix entry '", entry, "': ", why,
                                                     " (expected [NAME=]IN/OUT:WEIGHT[@PRIORITY], "
                                                     "e.g. chat=128/64:0.8@0)"));
    };
    RequestClass c;
    absl::string_view rest = entry;
    if (const size_t eq = rest.find('='); eq != absl::string_view::npos) {
      c.name = std::string(rest.substr(0, eq));
      rest = rest.substr(eq + 1);
      if (c.name.empty()) return bad("empty name");
    }
    const size_t slash = rest.find('/'), colon = rest.find(':');
    if (slash == absl::string_view::npos || colon == absl::string_view::npos || colon < slash) {
      return bad("no IN/OUT:WEIGHT");
    }
    if (!absl::SimpleAtoi(rest.substr(0, slash), &c.input_len) || c.input_len < 1) {
      return bad("input length must be an integer >= 1");
    }
    if (!absl::SimpleAtoi(rest.substr(slash + 1, colon - slash - 1), &c.output_len) ||
        c.output_len < 1) {
      return bad("output length must be an integer >= 1");
    }
    absl::string_view weight = rest.substr(colon + 1);
    if (const size_t at = weight.find('@'); at != absl::string_view::npos) {
      if (!absl::SimpleAtoi(weight.substr(at + 1), &c.priority)) {
        return bad("priority must be an integer");
      }
      weight = weight.substr(0, at);
    }
    if (!absl::SimpleAtod(weight, &c.weight) || !(c.weight > 0) ||
        !std::isfinite(c.weight)) {
      return bad("weight must be a number > 0");
    }
    if (c.name.empty()) c.name = absl::StrCat(c.input_len, "/", c.output_len);
    out.push_back(std::move(c));
  }
  if (out.empty()) return absl::InvalidArgumentError("--mix is empty");
  return out;
}

std::vector<double> ArrivalTimes(int n, double rate, double burstiness, std::mt19937_64& rng) {
  std::vector<double> t(std::max(n, 0), 0.0);
  if (std::isinf(rate)) return t;
  // Gamma(shape k, scale theta) has mean k * theta = 1 / rate.
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double now = 0;
  for (int i = 0; i < n; ++i) {
    now += gap(rng);
    t[i] = now;
  }
  return t;
}

int SampleLength(int len, double range_ratio, std::mt19937_64& rng) {
  const int lo = std::max(1, static_cast<int>(std::floor(len * (1 - range_ratio))));
  const int hi = std::max(lo, static_cast<int>(std::ceil(len * (1 + range_ratio))));
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

absl::StatusOr<Slo> ParseSlo(absl::string_view text) {
  Slo slo;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const size_t colon = entry.find(':');
    double ms = 0;
    if (colon == absl::string_view::npos || !absl::SimpleAtod(entry.substr(colon + 1), &ms) ||
        !(ms > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--slo entry '", entry, "': expected METRIC:MILLISECONDS with a value > 0"));
    }
    const absl::string_view metric = entry.substr(0, colon);
    if (metric == "ttft") {
      slo.ttft_ms = ms;
    } else if (metric == "tpot") {
      slo.tpot_ms = ms;
    } else if (metric == "e2el") {
      slo.e2el_ms = ms;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--slo metric '", metric, "': expected ttft, tpot or e2el"));
    }
  }
  return slo;
}

double Tpot(const RequestRecord& r) {
  if (r.output_tokens < 2) return -1;
  return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1);
}

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok()) return false;
  if (slo.ttft_ms > 0 && r.ttft_s * 1e3 > slo.ttft_ms) return false;
  if (slo.tpot_ms > 0 && Tpot(r) * 1e3 > slo.tpot_ms) return false;
  if (slo.e2el_ms > 0 && r.e2e_s * 1e3 > slo.e2el_ms) return false;
  return true;
}

double Percentile(const std::vector<double>& sorted, double p) {
  const double pos = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

LatencyStats Describe(std::vector<double> seconds) {
  LatencyStats s;
  s.count = static_cast<int>(seconds.size());
  if (seconds.empty()) return s;
  for (double& v : seconds) v *= 1e3;
  std::sort(seconds.begin(), seconds.end());
  s.mean = std::accumulate(seconds.begin(), seconds.end(), 0.0) / seconds.size();
  double var = 0;
  for (double v : seconds) var += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(var / seconds.size());
  s.median = Percentile(seconds, 50);
  s.p90 = Percentile(seconds, 90);
  s.p99 = Percentile(seconds, 99);
  return s;
}

ServeSummary Summarize(const std::vector<RequestRecord>& records, double duration_s,
                       const Slo& slo) {
  ServeSummary s;
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  int good = 0;
  for (const RequestRecord& r : records) {
    ++s.by_status[r.status];
    if (!r.ok()) {
      ++s.failed;
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.input_tokens;
    s.total_output_tokens += r.output_tokens;
    if (r.output_tokens > 0) ttft.push_back(r.ttft_s);
    if (Tpot(r) >= 0) tpot.push_back(Tpot(r));
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    e2el.push_back(r.e2e_s);
    if (slo.any() && MeetsSlo(r, slo)) ++good;
  }
  if (duration_s > 0) {
    s.request_throughput = s.completed / duration_s;
    s.output_throughput = s.total_output_tokens / duration_s;
    s.total_token_throughput = (s.total_input_tokens + s.total_output_tokens) / duration_s;
    if (slo.any()) s.goodput = good / duration_s;
  }
  s.ttft = Describe(std::move(ttft));
  s.tpot = Describe(std::move(tpot));
  s.itl = Describe(std::move(itl));
  s.e2el = Describe(std::move(e2el));
  return s;
}

}  // namespace tandem
