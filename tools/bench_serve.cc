// `tandem bench serve`: a load generator against a decode worker's gRPC
// front door or any OpenAI-compatible server (tools/bench_backend.h),
// reporting what `vllm bench serve` reports (see tools/serve_stats.h for the
// definitions). One thread per in-flight request, each a blocking stream:
// requests are few and long (seconds), so a thread each costs nothing next
// to the model and keeps timing simple.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "common/serving/prometheus_scrape.h"
#include "common/serving/status_convert.h"
#include "common/serving/tls.h"
#include "common/serving/tokenizer_loader.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/tandem/v1/tandem.grpc.pb.h"
#include "tools/bench.h"
#include "tools/bench_backend.h"
#include "tools/serve_stats.h"

namespace tandem {
namespace {

using Clock = BenchClock;

int Fail(const absl::Status& s) {
  std::cerr << "tandem bench serve: " << s.message() << std::endl;
  return 2;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The decode worker's counters that tell how the run was served.
struct WorkerCounters {
  std::map<std::string, double> values;
  bool ok = false;
};

const std::vector<std::pair<std::string, std::map<std::string, std::string>>>& CounterKeys() {
  static const auto* keys = new std::vector<std::pair<std::string, std::map<std::string, std::string>>>{
      {"tandem_forward_steps_total", {{"runtime_mode", "FULL"}}},
      {"tandem_forward_steps_total", {{"runtime_mode", "PIECEWISE"}}},
      {"tandem_forward_steps_total", {{"runtime_mode", "NONE"}}},
      {"tandem_cudagraph_replays_total", {{"mode", "FULL"}}},
      {"tandem_cudagraph_replays_total", {{"mode", "PIECEWISE"}}},
      {"tandem_cudagraph_padded_tokens_total", {}},
      {"tandem_kv_transfer_bytes_total", {}},
      {"tandem_kv_transfer_saved_bytes_total", {}},
      {"tandem_prefix_cache_queries_total", {}},
      {"tandem_prefix_cache_hits_total", {}},
      {"tandem_prefill_local_total", {{"reason", "aggregated"}}},
      {"tandem_prefill_local_total", {{"reason", "short_prompt"}}},
      {"tandem_prefill_local_total", {{"reason", "fallback"}}},
      {"tandem_preemptions_total", {}},
      {"tandem_generation_tokens_total", {}},
      {"tandem_spec_decode_num_drafts_total", {}},
      {"tandem_spec_decode_num_draft_tokens_total", {}},
      {"tandem_spec_decode_num_accepted_tokens_total", {}},
  };
  return *keys;
}

std::string KeyName(const std::string& name, const std::map<std::string, std::string>& labels) {
  std::string key = name;
  for (const auto& [k, v] : labels) absl::StrAppend(&key, "{", k, "=", v, "}");
  return key;
}

WorkerCounters Scrape(const std::string& host, int port) {
  WorkerCounters c;
  const std::string text = HttpGet(host, port, "/metrics");
  if (text.empty()) return c;
  c.ok = true;
  for (const auto& [name, labels] : CounterKeys()) {
    c.values[KeyName(name, labels)] = MetricValue(text, name, labels).value_or(0);
  }
  return c;
}

// Progress on stderr: a redrawn bar on a terminal, a plain line every 5 s
// otherwise (CI logs).
class Progress {
 public:
  explicit Progress(int total) : total_(total), tty_(isatty(2) != 0), start_(Clock::now()) {}
  void Update(int done, int failed, bool final = false) {
    const Clock::time_point now = Clock::now();
    if (!final && !tty_ && now - last_ < std::chrono::seconds(5)) return;
    if (!final && tty_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double elapsed = Seconds(now - start_);
    const double rate = elapsed > 0 ? done / elapsed : 0;
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = total_ > 0 ? done * kWidth / total_ : kWidth;
      std::fprintf(stderr, "\r[%s%s] %d/%d requests, %d failed, %.1f s, %.2f req/s   ",
                   std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                   done, total_, failed, elapsed, rate);
      if (final) std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "progress: %d/%d requests, %d failed, %.1f s, %.2f req/s\n", done,
                   total_, failed, elapsed, rate);
    }
    std::fflush(stderr);
  }

 private:
  int total_;
  bool tty_;
  Clock::time_point start_;
  Clock::time_point last_{};
};

void PrintStats(const char* title, const char* name, const LatencyStats& s) {
  std::printf("%s\n", title);
  std::printf("%-40s %-10.2f\n", absl::StrCat("Mean ", name, " (ms):").c_str(), s.mean);
  std::printf("%-40s %-10.2f\n", absl::StrCat("Median ", name, " (ms):").c_str(), s.median);
  std::printf("%-40s %-10.2f\n", absl::StrCat("P90 ", name, " (ms):").c_str(), s.p90);
  std::printf("%-40s %-10.2f\n", absl::StrCat("P99 ", name, " (ms):").c_str(), s.p99);
}

nlohmann::json StatsJson(const LatencyStats& s) {
  return {{"count", s.count}, {"mean_ms", s.mean}, {"std_ms", s.std}, {"median_ms", s.median},
          {"p90_ms", s.p90}, {"p99_ms", s.p99}};
}

nlohmann::json SummaryJson(const ServeSummary& s) {
  return {{"completed", s.completed},
          {"failed", s.failed},
          {"by_status", s.by_status},
          {"duration_s", s.duration_s},
          {"total_input_tokens", s.total_input_tokens},
          {"total_output_tokens", s.total_output_tokens},
          {"request_throughput", s.request_throughput},
          {"request_goodput", s.goodput},
          {"output_throughput", s.output_throughput},
          {"total_token_throughput", s.total_token_throughput},
          {"ttft", StatsJson(s.ttft)},
          {"tpot", StatsJson(s.tpot)},
          {"itl", StatsJson(s.itl)},
          {"e2el", StatsJson(s.e2el)}};
}

// Everything the command line sets.
struct ServeConfig {
  BenchBackendOptions backend;
  int max_concurrency = 0;  // 0: unbounded
  int num_prompts = 100;
  std::string rate_text = "inf";
  double rate = 0;
  double burstiness = 1;
  uint64_t seed = 0;
  std::string dataset = "random";
  int input_len = 128, output_len = 64, prefix_len = 0;
  int64_t prefix_seed = -1;  // -1: the shared prefix from --seed's stream
  int tenants = 1, turns = 1;
  double range_ratio = 0;
  std::string mix, prompts_file, model, slo_text, metrics_address, json_path, label;
  int vocab_size = 0;
  Slo slo;
  std::string metrics_host;
  int metrics_port = 0;
};

// Parses and checks the flags; returns the exit code when the command is
// done (--help: 0, a bad flag: 2).
std::optional<int> ParseServeConfig(const std::vector<std::string>& args, ServeConfig* c) {
  FlagSet flags("tandem bench serve");
  BenchBackendOptions& b = c->backend;
  b.address = "127.0.0.1:50051";
  b.base_url = "http://127.0.0.1:8000";
  flags.Add("backend", &b.backend,
            "tandem (gRPC Decode/Generate at --address), openai (/v1/completions at "
            "--base-url) or openai-chat (/v1/chat/completions): any OpenAI-compatible server");
  flags.Add("address", &b.address,
            "tandem: decode worker HOST:PORT, or several comma-separated (spread by --spread)");
  flags.Add("base-url", &b.base_url,
            "openai*: the server's http://HOST:PORT, or several comma-separated (--spread)");
  flags.Add("spread", &b.spread,
            "several targets: round_robin, or least_outstanding (the fewest requests in "
            "flight), a target that answered UNAVAILABLE passed over for 5 s, as a gateway in "
            "front of several decode workers would");
  flags.Add("served-model", &b.model, "openai*: the `model` to request (default: the server's first)");
  flags.Add("num-prompts", &c->num_prompts, "requests to send");
  flags.Add("request-rate", &c->rate_text, "requests/s (Poisson with --burstiness=1); inf: all at once");
  flags.Add("burstiness", &c->burstiness, "gamma shape of the arrival gaps: < 1 burstier, > 1 steadier");
  flags.Add("max-concurrency", &c->max_concurrency, "most requests in flight (0 = no limit)");
  flags.Add("seed", &c->seed, "seed of lengths, token ids and arrivals");
  flags.Add("dataset", &c->dataset, "random (token ids) or prompts (--prompts-file, text)");
  flags.Add("input-len", &c->input_len, "random: prompt tokens");
  flags.Add("output-len", &c->output_len, "tokens to generate (max_tokens)");
  flags.Add("range-ratio", &c->range_ratio, "random: lengths uniform in len * [1 - r, 1 + r]");
  flags.Add("prefix-len", &c->prefix_len,
            "random: every prompt starts with the same N tokens (a shared system prompt), "
            "then its own --input-len");
  flags.Add("prefix-seed", &c->prefix_seed,
            "random: draw the shared prefix from this seed instead (-1: from --seed), so that "
            "runs of different --seed share one system prompt, or runs of one tenant each "
            "keep theirs");
  flags.Add("tenants", &c->tenants,
            "random: this many shared prefixes of --prefix-len tokens (tenants' system prompts), "
            "conversations taking them in turn");
  flags.Add("turns", &c->turns,
            "random: requests per conversation, each sent when the last one finished, its "
            "prompt the last one's, --output-len tokens standing for the reply, and "
            "--input-len new ones (a multi-turn chat whose every turn extends the last)");
  flags.Add("mix", &c->mix,
            "random: a mixed workload, [NAME=]IN/OUT:WEIGHT[@PRIORITY],... e.g. "
            "chat=128/64:0.8,doc=1024/16:0.2 (overrides --input-len/--output-len)");
  flags.Add("prompts-file", &c->prompts_file,
            "prompts: a file of prompts, one per line: text, or {\"prompt\": \"...\"} (JSONL)");
  flags.Add("model", &c->model,
            "a local model whose tokenizer gives the vocabulary (default: asked of the server) "
            "and, for openai-chat with random ids, their text");
  flags.Add("vocab-size", &c->vocab_size, "random: token ids in [0, N) (default: the server's)");
  flags.Add("ignore-eos", &b.ignore_eos, "generate exactly max_tokens (vLLM's random dataset does)");
  flags.Add("slo", &c->slo_text, "goodput SLOs in ms, e.g. ttft:500,tpot:50,e2el:5000");
  flags.Add("metrics-address", &c->metrics_address,
            "decode worker's metrics HOST:PORT: report its counters' deltas over the run");
  flags.Add("json", &c->json_path, "write the results, per-request timings included, to this file");
  flags.Add("label", &c->label, "a name for this run in the JSON (e.g. the setup)");
  flags.Add("timeout-seconds", &b.timeout_s, "deadline of each request");
  b.tls.Register(&flags, "", /*server=*/false);
  if (auto code = ParseCommandLine(&flags, args)) return code;
  auto bad = [](std::string message) {
    return Fail(absl::InvalidArgumentError(std::move(message)));
  };
  while (!b.base_url.empty() && b.base_url.back() == '/') b.base_url.pop_back();
  if (absl::EndsWith(b.base_url, "/v1")) b.base_url.resize(b.base_url.size() - 3);
  if (c->rate_text == "inf") {
    c->rate = std::numeric_limits<double>::infinity();
  } else if (!absl::SimpleAtod(c->rate_text, &c->rate) || !(c->rate > 0)) {
    return bad(absl::StrCat("--request-rate='", c->rate_text, "': expected a number > 0 or inf"));
  }
  if (!(c->burstiness > 0)) return bad(absl::StrCat("--burstiness=", c->burstiness, " must be > 0"));
  if (c->num_prompts < 1) return bad(absl::StrCat("--num-prompts=", c->num_prompts, " must be >= 1"));
  if (!(c->range_ratio >= 0 && c->range_ratio < 1)) {
    return bad(absl::StrCat("--range-ratio=", c->range_ratio, " must be in [0, 1)"));
  }
  if (c->output_len < 1) return bad(absl::StrCat("--output-len=", c->output_len, " must be >= 1"));
  if (c->prefix_len < 0) return bad(absl::StrCat("--prefix-len=", c->prefix_len, " must be >= 0"));
  if (c->tenants < 1) return bad(absl::StrCat("--tenants=", c->tenants, " must be >= 1"));
  if (c->turns < 1) return bad(absl::StrCat("--turns=", c->turns, " must be >= 1"));
  if ((c->tenants > 1 || c->turns > 1) && c->dataset != "random") {
    return bad("--tenants and --turns shape the random dataset; --dataset=prompts has neither");
  }
  auto slo = ParseSlo(c->slo_text);
  if (!slo.ok()) return Fail(slo.status());
  c->slo = *slo;
  if (!c->metrics_address.empty()) {
    const size_t colon = c->metrics_address.rfind(':');
    if (colon == std::string::npos ||
        !absl::SimpleAtoi(c->metrics_address.substr(colon + 1), &c->metrics_port)) {
      return bad(absl::StrCat("--metrics-address='", c->metrics_address, "': expected HOST:PORT"));
    }
    c->metrics_host = c->metrics_address.substr(0, colon);
  }
  return std::nullopt;
}

// The workload, fixed before the first request is sent. `tok` (may be
// null) turns random ids into text where the backend needs text.
absl::StatusOr<std::vector<Planned>> BuildWorkload(const ServeConfig& c, int vocab_size,
                                                   const Tokenizer* tok, std::mt19937_64& rng) {
  std::vector<Planned> plan(c.num_prompts);
  if (c.dataset == "random") {
    if (vocab_size <= 0) {
      return absl::InvalidArgumentError(
          "the random dataset needs the vocabulary, and the server did not say: give --model or "
          "--vocab-size");
    }
    const bool needs_text = c.backend.backend == "openai-chat";
    if (needs_text && tok == nullptr) {
      return absl::InvalidArgumentError(
          "--backend=openai-chat sends text: give --model (its tokenizer turns the random ids "
          "into text) or --dataset=prompts");
    }
    std::vector<RequestClass> classes = {{"random", c.input_len, c.output_len, 1}};
    if (!c.mix.empty()) {
      ASSIGN_OR_RETURN(classes, ParseMix(c.mix));
    } else if (c.input_len < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--input-len=", c.input_len, " must be >= 1"));
    }
    std::vector<double> weights;
    for (const RequestClass& k : classes) weights.push_back(k.weight);
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    std::uniform_int_distribution<int32_t> token(0, vocab_size - 1);
    // Tenant 0's prefix as a single shared prefix always was; the others'
    // from seeds of their own.
    std::vector<std::vector<int32_t>> prefixes(c.tenants, std::vector<int32_t>(c.prefix_len));
    if (c.prefix_seed >= 0) {
      std::mt19937_64 own(static_cast<uint64_t>(c.prefix_seed));
      for (int32_t& id : prefixes[0]) id = token(own);
    } else {
      for (int32_t& id : prefixes[0]) id = token(rng);
    }
    for (int t = 1; t < c.tenants; ++t) {
      std::mt19937_64 own((c.prefix_seed >= 0 ? static_cast<uint64_t>(c.prefix_seed) : c.seed) +
                          0x9e3779b97f4a7c15ull * static_cast<uint64_t>(t));
      for (int32_t& id : prefixes[t]) id = token(own);
    }
    // Request i is turn i / C of conversation i % C: every conversation's
    // first turn, then every second turn, and so on.
    const int conversations = (c.num_prompts + c.turns - 1) / c.turns;
    std::vector<std::vector<int32_t>> history(conversations);
    for (size_t i = 0; i < plan.size(); ++i) {
      Planned& p = plan[i];
      const int conversation = static_cast<int>(i) % conversations;
      const RequestClass& k = classes[pick(rng)];
      p.klass = k.name;
      p.priority = k.priority;
      std::vector<int32_t>& h = history[conversation];
      if (i < static_cast<size_t>(conversations)) {
        h = prefixes[conversation % c.tenants];
      } else {
        p.after = static_cast<int>(i) - conversations;
        // The last reply, as random ids: the prefill side never computed
        // the reply's KV, so what it can reuse is the last prompt either way.
        for (int j = 0; j < plan[p.after].output_len; ++j) h.push_back(token(rng));
      }
      const size_t start = h.size();
      h.resize(start + SampleLength(k.input_len, c.range_ratio, rng));
      for (size_t j = start; j < h.size(); ++j) h[j] = token(rng);
      p.ids = h;
      p.output_len = SampleLength(k.output_len, c.range_ratio, rng);
      if (needs_text) p.text = tok->Decode(p.ids);
    }
    return plan;
  }
  if (c.dataset != "prompts") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dataset='", c.dataset, "': expected random or prompts"));
  }
  std::ifstream in(c.prompts_file);
  if (c.prompts_file.empty() || !in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dataset=prompts needs --prompts-file; cannot read '", c.prompts_file, "'"));
  }
  std::vector<std::string> lines;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    if (line[0] == '{') {  // JSONL, as vLLM's custom dataset: {"prompt": "..."}
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--prompts-file='", c.prompts_file, "': line ", line_no,
            " starts with '{' but is not a JSON object with a string \"prompt\""));
      }
      line = j["prompt"].get<std::string>();
    }
    lines.push_back(line);
  }
  if (lines.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--prompts-file='", c.prompts_file, "' has no prompts"));
  }
  std::shuffle(lines.begin(), lines.end(), rng);
  for (size_t i = 0; i < plan.size(); ++i) {
    plan[i].klass = "prompts";
    plan[i].text = lines[i % lines.size()];
    plan[i].output_len = SampleLength(c.output_len, c.range_ratio, rng);
  }
  return plan;
}

// Sends the plan at its arrival times, at most --max-concurrency at once,
// a thread per request in flight. Returns the records; *duration_s the wall time.
std::vector<RequestRecord> RunLoad(const ServeConfig& c, const std::vector<Planned>& plan,
                                   BenchBackend* backend, double* duration_s) {
  const int n = static_cast<int>(plan.size());
  std::vector<RequestRecord> records(n);
  std::mutex mu;  // guards in_flight, done, failed, finished
  std::condition_variable cv;
  int in_flight = 0, done = 0, failed = 0;
  std::vector<bool> finished(n);
  Progress progress(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(plan[i].arrival_s)));
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return c.max_concurrency <= 0 || in_flight < c.max_concurrency; });
      ++in_flight;
    }
    threads.emplace_back([&, i] {
      if (const int after = plan[i].after; after >= 0) {
        // The next turn of a conversation (an earlier index, so already
        // started): sent once the last turn's reply is in.
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return finished[after]; });
      }
      records[i] = backend->Send(plan[i], i, start);
      std::lock_guard<std::mutex> lock(mu);
      finished[i] = true;
      --in_flight;
      ++done;
      if (!records[i].ok()) ++failed;
      progress.Update(done, failed);
      cv.notify_all();
    });
  }
  for (std::thread& t : threads) t.join();
  *duration_s = Seconds(Clock::now() - start);
  progress.Update(done, failed, /*final=*/true);
  return records;
}

void PrintSummary(const ServeSummary& s) {
  std::printf("============ Serving Benchmark Result ============\n");
  std::printf("%-40s %-10d\n", "Successful requests:", s.completed);
  for (const auto& [code, n] : s.by_status) {
    if (code != "OK") std::printf("%-40s %-10d\n", absl::StrCat("Failed requests (", code, "):").c_str(), n);
  }
  std::printf("%-40s %-10.2f\n", "Benchmark duration (s):", s.duration_s);
  std::printf("%-40s %-10lld\n", "Total input tokens:", static_cast<long long>(s.total_input_tokens));
  std::printf("%-40s %-10lld\n", "Total generated tokens:", static_cast<long long>(s.total_output_tokens));
  std::printf("%-40s %-10.2f\n", "Request throughput (req/s):", s.request_throughput);
  if (s.goodput >= 0) std::printf("%-40s %-10.2f\n", "Request goodput (req/s):", s.goodput);
  std::printf("%-40s %-10.2f\n", "Output token throughput (tok/s):", s.output_throughput);
  std::printf("%-40s %-10.2f\n", "Total Token throughput (tok/s):", s.total_token_throughput);
  PrintStats("---------------Time to First Token----------------", "TTFT", s.ttft);
  PrintStats("-----Time per Output Token (excl. 1st token)------", "TPOT", s.tpot);
  PrintStats("---------------Inter-token Latency----------------", "ITL", s.itl);
  PrintStats("----------------End-to-end Latency----------------", "E2EL", s.e2el);
}

// Per class, when the workload mixes several.
nlohmann::json ReportClasses(const std::vector<RequestRecord>& records, double duration,
                             const Slo& slo) {
  std::map<std::string, std::vector<RequestRecord>> by_class;
  for (const RequestRecord& r : records) by_class[r.klass].push_back(r);
  nlohmann::json classes_json = nlohmann::json::object();
  if (by_class.size() <= 1) return classes_json;
  std::printf("-------------------By request class---------------\n");
  std::printf("%-12s %6s %12s %12s %12s %12s\n", "class", "ok", "TTFT p50", "TTFT p99",
              "ITL p50", "ITL p99");
  for (const auto& [name, rs] : by_class) {
    const ServeSummary c = Summarize(rs, duration, slo);
    std::printf("%-12s %6d %12.1f %12.1f %12.1f %12.1f\n", name.c_str(), c.completed,
                c.ttft.median, c.ttft.p99, c.itl.median, c.itl.p99);
    classes_json[name] = SummaryJson(c);
  }
  return classes_json;
}

// The decode worker's counters over the run.
nlohmann::json ReportWorker(const WorkerCounters& before, const WorkerCounters& after) {
  if (!after.ok) {
    std::printf("(the decode worker's /metrics could not be read after the run)\n");
    return nlohmann::json::object();
  }
  std::map<std::string, double> delta;
  for (const auto& [k, v] : after.values) delta[k] = v - before.values.at(k);
  const double steps = delta["tandem_forward_steps_total{runtime_mode=FULL}"] +
                       delta["tandem_forward_steps_total{runtime_mode=PIECEWISE}"] +
                       delta["tandem_forward_steps_total{runtime_mode=NONE}"];
  const double full_ratio = steps > 0 ? delta["tandem_cudagraph_replays_total{mode=FULL}"] / steps : 0;
  std::printf("-------------Decode worker (/metrics deltas)-------\n");
  std::printf("%-40s %.0f / %.0f / %.0f\n", "Steps FULL / PIECEWISE / NONE:",
              delta["tandem_forward_steps_total{runtime_mode=FULL}"],
              delta["tandem_forward_steps_total{runtime_mode=PIECEWISE}"],
              delta["tandem_forward_steps_total{runtime_mode=NONE}"]);
  std::printf("%-40s %-10.3f\n", "FULL replay ratio:", full_ratio);
  std::printf("%-40s %-10.0f\n", "Padded tokens:", delta["tandem_cudagraph_padded_tokens_total"]);
  std::printf("%-40s %-10.0f\n", "KV bytes received:", delta["tandem_kv_transfer_bytes_total"]);
  std::printf("%-40s %-10.0f\n", "KV bytes saved by its prefix cache:",
              delta["tandem_kv_transfer_saved_bytes_total"]);
  const double queries = delta["tandem_prefix_cache_queries_total"];
  std::printf("%-40s %.0f / %.0f (%.1f%%)\n", "Prefix cache hits / queried tokens:",
              delta["tandem_prefix_cache_hits_total"], queries,
              queries > 0 ? 100 * delta["tandem_prefix_cache_hits_total"] / queries : 0.0);
  std::printf("%-40s %.0f / %.0f / %.0f\n", "Local prefills (aggr./short/fallback):",
              delta["tandem_prefill_local_total{reason=aggregated}"],
              delta["tandem_prefill_local_total{reason=short_prompt}"],
              delta["tandem_prefill_local_total{reason=fallback}"]);
  std::printf("%-40s %-10.0f\n", "Preemptions:", delta["tandem_preemptions_total"]);
  // As vLLM reports speculative decoding: the share of drafted tokens
  // kept, and the tokens one verification yields (1 + accepted / drafts).
  const double drafts = delta["tandem_spec_decode_num_drafts_total"];
  const double drafted = delta["tandem_spec_decode_num_draft_tokens_total"];
  const double accepted = delta["tandem_spec_decode_num_accepted_tokens_total"];
  const double generated = delta["tandem_generation_tokens_total"];
  const double acceptance = drafted > 0 ? accepted / drafted : 0;
  const double tokens_per_step = steps > 0 ? generated / steps : 0;
  std::printf("%-40s %.0f / %.0f (%.1f%%)\n", "Spec decode accepted / drafted tokens:", accepted,
              drafted, 100 * acceptance);
  std::printf("%-40s %-10.2f\n", "Spec decode mean acceptance length:",
              drafts > 0 ? 1 + accepted / drafts : 0.0);
  std::printf("%-40s %-10.2f\n", "Generated tokens per step:", tokens_per_step);
  nlohmann::json worker_json = delta;
  worker_json["full_replay_ratio"] = full_ratio;
  worker_json["spec_decode_acceptance_rate"] = acceptance;
  worker_json["tokens_per_step"] = tokens_per_step;
  return worker_json;
}

absl::Status WriteJson(const ServeConfig& c, const std::string& target, const ServeSummary& s,
                       const nlohmann::json& classes_json, const nlohmann::json& worker_json,
                       const std::vector<RequestRecord>& records) {
  nlohmann::json j;
  j["label"] = c.label;
  j["config"] = {{"backend", c.backend.backend}, {"address", target},
                 {"num_prompts", c.num_prompts}, {"request_rate", c.rate_text},
                 {"burstiness", c.burstiness},   {"max_concurrency", c.max_concurrency},
                 {"seed", c.seed},               {"dataset", c.dataset},
                 {"input_len", c.input_len},     {"prefix_len", c.prefix_len}, {"prefix_seed", c.prefix_seed},
                 {"tenants", c.tenants}, {"turns", c.turns},
                 {"output_len", c.output_len},   {"range_ratio", c.range_ratio},
                 {"mix", c.mix},                 {"slo", c.slo_text}};
  j["summary"] = SummaryJson(s);
  j["by_class"] = classes_json;
  j["worker_metrics_delta"] = worker_json;
  nlohmann::json reqs = nlohmann::json::array();
  for (const RequestRecord& r : records) {
    reqs.push_back({{"index", r.index}, {"class", r.klass}, {"start_s", r.start_s},
                    {"input_tokens", r.input_tokens}, {"output_tokens", r.output_tokens},
                    {"status", r.status}, {"error", r.error}, {"ttft_s", r.ttft_s},
                    {"e2e_s", r.e2e_s}, {"itl_s", r.itl_s}});
  }
  j["requests"] = reqs;
  std::ofstream out(c.json_path);
  out << j.dump(1) << "\n";
  if (!out) return absl::InternalError(absl::StrCat("cannot write --json=", c.json_path));
  return absl::OkStatus();
}

}  // namespace

int RunServeBench(const std::vector<std::string>& args) {
  ServeConfig c;
  if (auto code = ParseServeConfig(args, &c)) return *code;
  auto backend = MakeBenchBackend(c.backend);
  if (!backend.ok()) return Fail(backend.status());
  // The vocabulary and the model's name come from the server unless given.
  auto served = (*backend)->Model();
  if (!served.ok() && (c.backend.backend != "tandem" ||
                       served.status().code() == absl::StatusCode::kFailedPrecondition)) {
    return Fail(served.status());  // (several targets serving different models)
  }
  std::unique_ptr<Tokenizer> tok;
  if (!c.model.empty()) {
    auto loaded = LoadTokenizer(c.model);
    if (!loaded.ok()) return Fail(loaded.status());
    tok = *std::move(loaded);
    if (tok == nullptr) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--model='", c.model, "' has no tokenizer to take the vocabulary from; give --vocab-size")));
    }
  }
  int vocab_size = c.vocab_size;
  if (vocab_size <= 0 && tok != nullptr) vocab_size = tok->vocab_size();
  if (vocab_size <= 0 && served.ok()) vocab_size = served->vocab_size;
  std::mt19937_64 rng(c.seed);
  auto plan = BuildWorkload(c, vocab_size, tok.get(), rng);
  if (!plan.ok()) return Fail(plan.status());
  const std::vector<double> arrivals = ArrivalTimes(c.num_prompts, c.rate, c.burstiness, rng);
  for (int i = 0; i < c.num_prompts; ++i) (*plan)[i].arrival_s = arrivals[i];

  WorkerCounters before;
  if (c.metrics_port > 0) {
    before = Scrape(c.metrics_host, c.metrics_port);
    if (!before.ok) {
      return Fail(absl::UnavailableError(absl::StrCat("cannot read http://", c.metrics_address, "/metrics")));
    }
  }
  std::printf("bench serve: %d requests to %s (%s%s), rate %s, burstiness %.2f, max concurrency "
              "%s, dataset %s%s%s\n",
              c.num_prompts, (*backend)->target().c_str(), c.backend.backend.c_str(),
              served.ok() && !served->name.empty() ? (", model " + served->name).c_str() : "",
              c.rate_text.c_str(), c.burstiness,
              c.max_concurrency > 0 ? std::to_string(c.max_concurrency).c_str() : "none",
              c.dataset.c_str(), c.mix.empty() ? "" : absl::StrCat(" mix ", c.mix).c_str(),
              c.prefix_len > 0 ? absl::StrCat(", shared prefix ", c.prefix_len, " tokens").c_str() : "");
  std::fflush(stdout);

  double duration = 0;
  const std::vector<RequestRecord> records = RunLoad(c, *plan, backend->get(), &duration);
  WorkerCounters after;
  if (c.metrics_port > 0) after = Scrape(c.metrics_host, c.metrics_port);
  const ServeSummary s = Summarize(records, duration, c.slo);
  PrintSummary(s);
  if (const std::string d = (*backend)->Distribution(); !d.empty()) {
    std::printf("Requests per target (%s)\n", d.c_str());
  }
  const nlohmann::json classes_json = ReportClasses(records, duration, c.slo);
  const nlohmann::json worker_json =
      c.metrics_port > 0 ? ReportWorker(before, after) : nlohmann::json::object();
  std::printf("==================================================\n");
  std::fflush(stdout);
  if (!c.json_path.empty()) {
    if (absl::Status st = WriteJson(c, (*backend)->target(), s, classes_json, worker_json, records);
        !st.ok()) {
      return Fail(st);
    }
  }
  return 0;  // failed requests are results, reported above
}

}  // namespace tandem
