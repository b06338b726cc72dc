// The workers' Prometheus endpoints: families, exact values after a known
// run, promtool's verdict, and a real Prometheus server scraping both.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

// Runs `command` with `input` on stdin; returns the exit code.
int RunWithInput(const std::string& command, const std::string& input, std::string* output) {
  const std::string in_path = ::testing::TempDir() + "metrics_input.txt";
  std::ofstream(in_path) << input;
  FILE* p = popen((command + " < " + in_path + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p) != nullptr) output->append(buf);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string TypeOf(const std::string& text, const std::string& name) {
  const std::string key = "# TYPE " + name + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return "";
  return text.substr(at + key.size(), text.find('\n', at) - at - key.size());
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefill_ = StartWorker("prefill_worker", {"--capture-sizes=8,16,32,64"});
    decode_ = StartWorker("decode_worker", {"--prefill-address=" + prefill_.address(),
                                            "--capture-sizes=1,2,4,8"});
  }
  Worker prefill_, decode_;
};

TEST_F(MetricsTest, EveryFamilyWithItsTypeAndLabels) {
  ASSERT_TRUE(Generate(decode_.address(), MakeRequest("fam", {1, 2, 3}, 3)).status.ok());
  const std::string p = prefill_.Metrics(), d = decode_.Metrics();
  const std::vector<std::pair<std::string, std::string>> both = {
      {"tandem_cudagraph_captured_total", "counter"},
      {"tandem_cudagraph_capture_seconds", "gauge"},
      {"tandem_forward_steps_total", "counter"},
      {"tandem_cudagraph_replays_total", "counter"},
      {"tandem_cudagraph_replay_ratio", "gauge"},
      {"tandem_cudagraph_padded_tokens_total", "counter"},
      {"tandem_requests_total", "counter"},
      {"tandem_requests_running", "gauge"},
      {"tandem_requests_waiting", "gauge"},
      {"tandem_kv_cache_usage_ratio", "gauge"},
      {"tandem_kv_cache_blocks_in_use", "gauge"},
      {"tandem_kv_transfer_bytes_total", "counter"},
      {"tandem_kv_transfer_seconds", "histogram"},
      {"tandem_kv_transfer_failures_total", "counter"}};
  for (const auto& [name, type] : both) {
    EXPECT_EQ(TypeOf(p, name), type) << name;
    EXPECT_EQ(TypeOf(d, name), type) << name;
  }
  EXPECT_EQ(TypeOf(p, "tandem_prompt_tokens_total"), "counter");
  EXPECT_EQ(TypeOf(p, "tandem_prefill_seconds"), "histogram");
  for (const char* name : {"tandem_time_to_first_token_seconds", "tandem_inter_token_latency_seconds",
                           "tandem_e2e_request_latency_seconds"}) {
    EXPECT_EQ(TypeOf(d, name), "histogram") << name;
    EXPECT_EQ(TypeOf(p, name), "") << name << " belongs to the decode role";
  }
  EXPECT_EQ(TypeOf(d, "tandem_generation_tokens_total"), "counter");
  // Label sets, and every tandem_ series carries role.
  EXPECT_TRUE(MetricValue(d, "tandem_cudagraph_captured_total", {{"role", "decode"}, {"mode", "FULL"}}));
  EXPECT_TRUE(MetricValue(d, "tandem_forward_steps_total", {{"role", "decode"}, {"runtime_mode", "NONE"}}));
  EXPECT_TRUE(MetricValue(p, "tandem_cudagraph_replay_ratio", {{"role", "prefill"}, {"mode", "PIECEWISE"}}));
  EXPECT_TRUE(MetricValue(p, "tandem_requests_total", {{"role", "prefill"}, {"status", "OK"}}));
  EXPECT_TRUE(MetricValue(d, "tandem_kv_transfer_failures_total", {{"role", "decode"}, {"reason", "data_loss"}}));
  for (const std::string& text : {p, d}) {
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      // prometheus-cpp adds its own exposer_* series; ours all start tandem_.
      if (!absl::StartsWith(line, "tandem_")) continue;
      EXPECT_NE(line.find("role=\""), absl::string_view::npos) << line;
    }
  }
}

TEST_F(MetricsTest, CountersHoldExactlyWhatWasDriven) {
  // Capture counts: decode FULL keys for sizes 1,2,4,8 (<= max_num_seqs);
  // prefill PIECEWISE graphs = 5 pieces x 4 sizes.
  EXPECT_EQ(decode_.Metric("tandem_cudagraph_captured_total", {{"mode", "FULL"}}), 4);
  EXPECT_EQ(decode_.Metric("tandem_cudagraph_captured_total", {{"mode", "PIECEWISE"}}), 0);
  EXPECT_EQ(prefill_.Metric("tandem_cudagraph_captured_total", {{"mode", "PIECEWISE"}}), 20);
  constexpr int kRequests = 5, kTokens = 7;
  int prompt_tokens = 0, padded = 0;
  for (int i = 0; i < kRequests; ++i) {
    const int len = 3 + 9 * i;  // 3, 12, 21, 30, 39: padded to 8, 16, 32, 32, 64
    std::vector<int32_t> prompt(len, 9 + i);
    prompt_tokens += len;
    padded += (len <= 8 ? 8 : len <= 16 ? 16 : len <= 32 ? 32 : 64) - len;
    ASSERT_TRUE(Generate(decode_.address(), MakeRequest(absl::StrCat("exact-", i), prompt, kTokens)).status.ok());
  }
  // K pure-decode steps, all FULL replays: ratio 1.
  const double k = kRequests * (kTokens - 1);
  EXPECT_EQ(decode_.Metric("tandem_forward_steps_total", {{"runtime_mode", "FULL"}}), k);
  EXPECT_EQ(decode_.Metric("tandem_cudagraph_replays_total", {{"mode", "FULL"}}), k);
  EXPECT_EQ(decode_.Metric("tandem_cudagraph_replay_ratio", {{"mode", "FULL"}}), 1);
  EXPECT_EQ(decode_.Metric("tandem_cudagraph_padded_tokens_total"), 0);
  EXPECT_EQ(decode_.Metric("tandem_generation_tokens_total"), kRequests * kTokens);
  EXPECT_EQ(decode_.Metric("tandem_requests_total", {{"status", "OK"}}), kRequests);
  EXPECT_EQ(decode_.Metric("tandem_time_to_first_token_seconds_count"), kRequests);
  EXPECT_EQ(decode_.Metric("tandem_inter_token_latency_seconds_count"), k);
  // One PIECEWISE step per prompt on the prefill worker.
  EXPECT_EQ(prefill_.Metric("tandem_forward_steps_total", {{"runtime_mode", "PIECEWISE"}}), kRequests);
  EXPECT_EQ(prefill_.Metric("tandem_cudagraph_replays_total", {{"mode", "PIECEWISE"}}), kRequests);
  EXPECT_EQ(prefill_.Metric("tandem_cudagraph_replay_ratio", {{"mode", "PIECEWISE"}}), 1);
  EXPECT_EQ(prefill_.Metric("tandem_cudagraph_padded_tokens_total"), padded);
  EXPECT_EQ(prefill_.Metric("tandem_prompt_tokens_total"), prompt_tokens);
  // KV bytes: prompt tokens x layers x (k + v) x kv_heads x head_dim x 4 bytes.
  const double bytes = prompt_tokens * 4.0 * 2 * 2 * 16 * 4;
  EXPECT_EQ(prefill_.Metric("tandem_kv_transfer_bytes_total"), bytes);
  EXPECT_EQ(decode_.Metric("tandem_kv_transfer_bytes_total"), bytes);
  EXPECT_EQ(decode_.Metric("tandem_kv_cache_blocks_in_use"), 0);
  EXPECT_EQ(prefill_.Metric("tandem_kv_cache_blocks_in_use"), 0);
}

TEST_F(MetricsTest, PromtoolAcceptsBothEndpoints) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Generate(decode_.address(), MakeRequest(absl::StrCat("lint-", i), {1, 2, 3, 4}, 4)).status.ok());
  }
  for (const Worker* w : {&prefill_, &decode_}) {
    // The decode worker also exports the gauges the inference gateway reads
    // under vLLM's names, which promtool's lint flags for their ':'
    // (reserved for recording rules): every other line must pass it.
    std::string ours, vllm;
    std::istringstream page(w->Metrics());
    for (std::string line; std::getline(page, line);) {
      const bool is_vllm = absl::StrContains(line, "vllm:");
      (is_vllm ? vllm : ours) += line + "\n";
    }
    std::string out;
    EXPECT_EQ(RunWithInput("promtool check metrics", ours, &out), 0) << out;
    if (w == &decode_) {
      for (const char* name : {"vllm:num_requests_waiting{", "vllm:num_requests_running{",
                               "vllm:kv_cache_usage_perc{", "vllm:gpu_cache_usage_perc{",
                               "vllm:cache_config_info{"}) {
        EXPECT_TRUE(absl::StrContains(vllm, name)) << name << " missing:\n" << vllm;
      }
    } else {
      EXPECT_EQ(vllm, "");
    }
  }
}

// Debian's prometheus scrapes both workers on loopback; the replay ratio per
// mode and the time to first token are read back through its query API.
TEST_F(MetricsTest, PrometheusServerScrapesBothWorkers) {
  const int port = FreePort();
  const std::string dir = ::testing::TempDir() + "prometheus_" + std::to_string(port);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/prometheus.yml") << absl::StrCat(
      "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      "scrape_configs:\n"
      "  - job_name: tandem-prefill\n    static_configs:\n      - targets: ['127.0.0.1:",
      prefill_.metrics_port, "']\n",
      "  - job_name: tandem-decode\n    static_configs:\n      - targets: ['127.0.0.1:",
      decode_.metrics_port, "']\n");
  Process prometheus({"/usr/bin/prometheus", "--config.file=" + dir + "/prometheus.yml",
                      "--storage.tsdb.path=" + dir + "/data",
                      "--web.listen-address=127.0.0.1:" + std::to_string(port)},
                     dir + "/prometheus.log");
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(Generate(decode_.address(), MakeRequest(absl::StrCat("prom-", i), {5, 6, 7}, 6)).status.ok());
  }
  auto query = [&](const std::string& promql) -> std::optional<double> {
    std::string q;
    for (char c : promql) {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
        q += c;
      } else {
        char hex[4];
        std::snprintf(hex, sizeof(hex), "%%%02X", static_cast<unsigned char>(c));
        q += hex;
      }
    }
    auto j = nlohmann::json::parse(HttpGet(port, "/api/v1/query?query=" + q), nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") return std::nullopt;
    const auto& result = j["data"]["result"];
    if (result.empty()) return std::nullopt;
    return std::stod(result[0]["value"][1].get<std::string>());
  };
  std::optional<double> full, piecewise, ttft;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < end) {
    full = query("tandem_cudagraph_replay_ratio{role=\"decode\",mode=\"FULL\"}");
    piecewise = query("tandem_cudagraph_replay_ratio{role=\"prefill\",mode=\"PIECEWISE\"}");
    ttft = query("tandem_time_to_first_token_seconds_count{role=\"decode\"}");
    if (full && piecewise && ttft && *ttft == 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_TRUE(full.has_value()) << prometheus.Log();
  EXPECT_EQ(*full, 1.0);
  ASSERT_TRUE(piecewise.has_value());
  EXPECT_EQ(*piecewise, 1.0);
  ASSERT_TRUE(ttft.has_value());
  EXPECT_EQ(*ttft, 4.0);
  auto p50 = query("histogram_quantile(0.5, tandem_time_to_first_token_seconds_bucket{role=\"decode\"})");
  ASSERT_TRUE(p50.has_value());
  EXPECT_GT(*p50, 0.0);
  EXPECT_LT(*p50, 60.0);
  EXPECT_EQ(query("up{job=\"tandem-prefill\"}").value_or(0), 1.0);
  EXPECT_EQ(query("up{job=\"tandem-decode\"}").value_or(0), 1.0);
}

}  // namespace
}  // namespace tandem::testing
