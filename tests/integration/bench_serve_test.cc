// `tandem bench serve` against a real pair for a few seconds: every request
// accounted for, timings sane, the decode worker's counters read.
#include <algorithm>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

class BenchServeTest : public ::testing::Test {
 protected:
  // Runs the benchmark; returns its exit code (log in *log).
  static int Bench(const std::vector<std::string>& flags, std::string* log) {
    std::vector<std::string> argv = {BinDir() + "/tandem", "bench", "serve"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    // One log per test: CTest runs these tests side by side.
    const std::string path = ::testing::TempDir() + "/bench_serve." +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                             ".log";
    Process p(argv, path);
    const int code = p.Wait(std::chrono::seconds(120));
    *log = p.Log();
    return code;
  }
};

TEST_F(BenchServeTest, MixedWorkloadAgainstThePair) {
  Worker prefill = StartWorker("prefill_worker", {});
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address(),
                                                "--local-prefill-max-tokens=16"});
  const std::string json_path = ::testing::TempDir() + "/bench_serve.json";
  std::string log;
  const int code =
      Bench({"--address=" + decode.address(),
             "--metrics-address=127.0.0.1:" + std::to_string(decode.metrics_port),
             "--num-prompts=24", "--request-rate=40", "--seed=3", "--vocab-size=503",
             "--mix=chat=12/6:0.7,doc=200/3:0.3", "--slo=ttft:60000", "--json=" + json_path,
             "--label=test"},
            &log);
  ASSERT_EQ(code, 0) << log;
  // Not a terminal: plain progress lines, then the report.
  EXPECT_NE(log.find("progress: 24/24 requests, 0 failed"), std::string::npos) << log;
  EXPECT_NE(log.find("Serving Benchmark Result"), std::string::npos) << log;
  EXPECT_NE(log.find("Median TTFT (ms):"), std::string::npos) << log;

  std::ifstream in(json_path);
  ASSERT_TRUE(in) << json_path;
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["label"], "test");
  const auto& s = j["summary"];
  EXPECT_EQ(s["completed"], 24);
  EXPECT_EQ(s["failed"], 0);
  EXPECT_DOUBLE_EQ(s["request_goodput"].get<double>(), s["request_throughput"].get<double>());
  ASSERT_EQ(j["requests"].size(), 24u);
  int64_t input = 0, output = 0, chats = 0;
  for (const auto& r : j["requests"]) {
    EXPECT_EQ(r["status"], "OK") << r["error"];
    const bool chat = r["class"] == "chat";
    chats += chat;
    // ignore_eos: exactly max_tokens, one ITL gap fewer than tokens.
    EXPECT_EQ(r["output_tokens"], chat ? 6 : 3);
    EXPECT_EQ(r["itl_s"].size(), r["output_tokens"].get<size_t>() - 1);
    EXPECT_GT(r["ttft_s"].get<double>(), 0);
    EXPECT_GE(r["e2e_s"].get<double>(), r["ttft_s"].get<double>());
    input += r["input_tokens"].get<int64_t>();
    output += r["output_tokens"].get<int64_t>();
  }
  EXPECT_GT(chats, 0);
  EXPECT_LT(chats, 24);
  EXPECT_EQ(s["total_input_tokens"], input);
  EXPECT_EQ(s["total_output_tokens"], output);
  EXPECT_EQ(j["by_class"]["chat"]["completed"], chats);
  // The worker's view of the same run: short prompts local, long ones over
  // the wire, the decode steps FULL.
  const auto& w = j["worker_metrics_delta"];
  EXPECT_EQ(w["tandem_prefill_local_total{reason=short_prompt}"], chats);
  EXPECT_GT(w["tandem_kv_transfer_bytes_total"].get<double>(), 0);
  EXPECT_GT(w["tandem_forward_steps_total{runtime_mode=FULL}"].get<double>(), 0);
  EXPECT_EQ(w["tandem_generation_tokens_total"], output);
  EXPECT_GT(w["full_replay_ratio"].get<double>(), 0);
  EXPECT_EQ(decode.Metric("tandem_requests_total", {{"status", "OK"}}), 24);
}

// A shared system prompt, one request at a time: after the first, each
// request finds the 64 shared tokens (4 blocks) cached on the decode worker
// and asks the prefill worker only for the rest.
TEST_F(BenchServeTest, SharedPrefixIsServedFromThePrefixCache) {
  Worker prefill = StartWorker("prefill_worker", {});
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address()});
  const std::string json_path = ::testing::TempDir() + "/bench_serve_prefix.json";
  std::string log;
  ASSERT_EQ(Bench({"--address=" + decode.address(),
                   "--metrics-address=127.0.0.1:" + std::to_string(decode.metrics_port),
                   "--num-prompts=12", "--max-concurrency=1", "--vocab-size=503",
                   "--prefix-len=64", "--input-len=16", "--output-len=4", "--json=" + json_path},
                  &log),
            0)
      << log;
  EXPECT_NE(log.find("shared prefix 64 tokens"), std::string::npos) << log;
  EXPECT_NE(log.find("Prefix cache hits / queried tokens:"), std::string::npos) << log;
  std::ifstream in(json_path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["summary"]["completed"], 12);
  EXPECT_EQ(j["config"]["prefix_len"], 64);
  for (const auto& r : j["requests"]) EXPECT_EQ(r["input_tokens"], 80);
  const auto& w = j["worker_metrics_delta"];
  EXPECT_EQ(w["tandem_prefix_cache_queries_total"], 12 * 80);
  EXPECT_EQ(w["tandem_prefix_cache_hits_total"], 11 * 64);
  const double per_token = w["tandem_kv_transfer_bytes_total"].get<double>() / (12 * 80 - 11 * 64);
  EXPECT_GT(per_token, 0);
  EXPECT_EQ(w["tandem_kv_transfer_saved_bytes_total"], 11 * 64 * per_token);
}

// --prefix-seed: runs of different seeds share one system prompt (several
// tenants' prompts, each its own run): the second run's first request finds
// the prefix the first run left.
TEST_F(BenchServeTest, PrefixSeedSharesTheSystemPromptAcrossRuns) {
  Worker prefill = StartWorker("prefill_worker", {});
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address()});
  auto run = [&](int seed, const std::string& json_path) {
    std::string log;
    EXPECT_EQ(Bench({"--address=" + decode.address(),
                     "--metrics-address=127.0.0.1:" + std::to_string(decode.metrics_port),
                     "--num-prompts=3", "--max-concurrency=1", "--vocab-size=503", "--prefix-len=64",
                     "--prefix-seed=5", "--seed=" + std::to_string(seed), "--input-len=16",
                     "--output-len=2", "--json=" + json_path},
                    &log),
              0)
        << log;
    std::ifstream in(json_path);
    return nlohmann::json::parse(in);
  };
  const nlohmann::json first = run(1, ::testing::TempDir() + "/prefix_seed_1.json");
  const nlohmann::json second = run(2, ::testing::TempDir() + "/prefix_seed_2.json");
  EXPECT_EQ(first["config"]["prefix_seed"], 5);
  EXPECT_EQ(first["worker_metrics_delta"]["tandem_prefix_cache_hits_total"], 2 * 64);
  EXPECT_EQ(second["worker_metrics_delta"]["tandem_prefix_cache_hits_total"], 3 * 64);
}

// Multi-turn, multi-tenant conversations: each turn is sent after the last
// one's reply, its prompt the last prompt plus a reply's worth and a new
// question, so every turn after the first finds the whole last prompt cached.
TEST_F(BenchServeTest, ConversationsExtendTheirLastTurn) {
  Worker decode = StartWorker("decode_worker", {"--prefill=local"});
  const std::string json_path = ::testing::TempDir() + "/bench_serve_turns.json";
  std::string log;
  ASSERT_EQ(Bench({"--address=" + decode.address(),
                   "--metrics-address=127.0.0.1:" + std::to_string(decode.metrics_port),
                   "--num-prompts=6", "--turns=3", "--tenants=2", "--vocab-size=503",
                   "--prefix-len=32", "--input-len=16", "--output-len=16", "--json=" + json_path},
                  &log),
            0)
      << log;
  std::ifstream in(json_path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["config"]["turns"], 3);
  EXPECT_EQ(j["config"]["tenants"], 2);
  const auto& r = j["requests"];
  ASSERT_EQ(r.size(), 6u);
  // Request i is turn i / 2 of conversation i % 2; a turn adds 32 tokens.
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(r[i]["input_tokens"], 32 + 16 + (i / 2) * 32) << i;
    if (i >= 2) {
      const double prev_end = r[i - 2]["start_s"].get<double>() + r[i - 2]["e2e_s"].get<double>();
      EXPECT_GE(r[i]["start_s"].get<double>(), prev_end - 1e-3) << "turn sent before the last reply, " << i;
    }
  }
  // Each later turn finds its whole last prompt (whole blocks of it) cached.
  const auto& w = j["worker_metrics_delta"];
  EXPECT_GE(w["tandem_prefix_cache_hits_total"].get<double>(), 4 * 32);
  std::string bad;
  EXPECT_NE(Bench({"--address=" + decode.address(), "--turns=0"}, &bad), 0);
  EXPECT_NE(bad.find("--turns=0"), std::string::npos) << bad;
}

// Several decode workers (a gateway's fleet): --address lists them and
// --spread says how requests go round; the report says where they went.
TEST_F(BenchServeTest, SeveralTargetsShareTheLoad) {
  Worker a = StartWorker("decode_worker", {});
  Worker b = StartWorker("decode_worker", {});
  const std::string both = a.address() + "," + b.address();
  std::string log;
  ASSERT_EQ(Bench({"--address=" + both, "--num-prompts=8", "--vocab-size=503", "--input-len=16",
                   "--output-len=2"},
                  &log),
            0)
      << log;
  EXPECT_NE(log.find("Requests per target (round_robin: " + a.address() + "=4, " + b.address() + "=4)"),
            std::string::npos)
      << log;
  EXPECT_EQ(a.Metric("tandem_requests_total", {{"status", "OK"}}), 4);
  EXPECT_EQ(b.Metric("tandem_requests_total", {{"status", "OK"}}), 4);
  ASSERT_EQ(Bench({"--address=" + both, "--spread=least_outstanding", "--num-prompts=8",
                   "--vocab-size=503", "--input-len=16", "--output-len=2"},
                  &log),
            0)
      << log;
  EXPECT_NE(log.find("Requests per target (least_outstanding: "), std::string::npos) << log;
  EXPECT_EQ(a.Metric("tandem_requests_total", {{"status", "OK"}}) +
                b.Metric("tandem_requests_total", {{"status", "OK"}}),
            16);
  EXPECT_NE(Bench({"--address=" + both, "--spread=random", "--num-prompts=1"}, &log), 0);
  EXPECT_NE(log.find("--spread='random'"), std::string::npos) << log;
}

TEST_F(BenchServeTest, TextPromptsAndUsageErrors) {
  Worker decode = StartWorker("decode_worker", {});
  std::string log;
  // Text prompts need a tokenizer; the synthetic model has none: every
  // request fails, and the report says how.
  const std::string prompts = ::testing::TempDir() + "/prompts.txt";
  std::ofstream(prompts) << "Hello there\nWhat is 2+2?\n";
  ASSERT_EQ(Bench({"--address=" + decode.address(), "--dataset=prompts",
                   "--prompts-file=" + prompts, "--num-prompts=3", "--output-len=2"},
                  &log),
            0)
      << log;
  std::string compact = log;
  compact.erase(std::remove(compact.begin(), compact.end(), ' '), compact.end());
  EXPECT_NE(compact.find("Failedrequests(INVALID_ARGUMENT):3\n"), std::string::npos) << log;
  EXPECT_NE(compact.find("Successfulrequests:0\n"), std::string::npos) << log;
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--request-rate=0"}, {"--request-rate=fast"}, {"--burstiness=0"},
        {"--mix=chat=1/1"}, {"--slo=ttft"}, {"--dataset=prompts"}, {"--dataset=other"},
        {"--range-ratio=1"}, {"--num-prompts=0"}, {"--prefix-len=-1"}}) {
    std::vector<std::string> flags = {"--address=" + decode.address(), "--vocab-size=503"};
    flags.insert(flags.end(), bad.begin(), bad.end());
    EXPECT_EQ(Bench(flags, &log), 2) << bad[0] << "\n" << log;
    EXPECT_NE(log.find(bad[0].substr(0, bad[0].find('='))), std::string::npos) << log;
  }
  // Without --vocab-size or --model the vocabulary comes from the server (ModelInfo).
  EXPECT_EQ(Bench({"--address=" + decode.address(), "--num-prompts=2", "--input-len=4",
                   "--output-len=2"},
                  &log),
            0)
      << log;
  compact = log;
  compact.erase(std::remove(compact.begin(), compact.end(), ' '), compact.end());
  EXPECT_NE(compact.find("Successfulrequests:2\n"), std::string::npos) << log;
  EXPECT_EQ(Bench({"--backend=grpc", "--address=" + decode.address()}, &log), 2);
  EXPECT_NE(log.find("--backend='grpc'"), std::string::npos) << log;
}

// The same load through the decode worker's OpenAI API (/v1/completions,
// streamed): every request completes with its max_tokens, the vocabulary
// taken from /v1/models.
TEST_F(BenchServeTest, OpenAiBackendAgainstTheHttpApi) {
  Worker decode = StartWorker("decode_worker", {});
  const int http_port = PortAfter(decode.process->Log(), "OpenAI API on http://");
  ASSERT_GT(http_port, 0) << decode.process->Log();
  const std::string json_path = ::testing::TempDir() + "/bench_serve_openai.json";
  std::string log;
  ASSERT_EQ(Bench({"--backend=openai", "--base-url=http://127.0.0.1:" + std::to_string(http_port) + "/v1",
                   "--num-prompts=10", "--max-concurrency=5", "--input-len=20", "--output-len=5",
                   "--json=" + json_path},
                  &log),
            0)
      << log;
  EXPECT_NE(log.find("(openai, model synthetic"), std::string::npos) << log;
  std::ifstream in(json_path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["summary"]["completed"], 10);
  for (const auto& r : j["requests"]) {
    EXPECT_EQ(r["status"], "OK") << r["error"];
    EXPECT_EQ(r["input_tokens"], 20);
    EXPECT_EQ(r["output_tokens"], 5);
    EXPECT_GT(r["ttft_s"].get<double>(), 0);
  }
  EXPECT_EQ(decode.Metric("tandem_requests_total", {{"status", "OK"}}), 10);
  // Chat needs text: random ids without a tokenizer are refused, naming what to give.
  EXPECT_EQ(Bench({"--backend=openai-chat", "--base-url=http://127.0.0.1:" + std::to_string(http_port)},
                  &log),
            2);
  EXPECT_NE(log.find("--dataset=prompts"), std::string::npos) << log;
}

}  // namespace
}  // namespace tandem::testing
