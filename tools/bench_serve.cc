// `tandem bench serve`: a load generator against a decode worker, reporting
// what `vllm bench serve` reports (see tools/serve_stats.h for the
// definitions). One thread per in-flight request, each a blocking Generate()
// stream on one shared channel: requests are few and long (seconds), so a
// thread each costs nothing next to the model and keeps timing simple.
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

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/flags.h"
#include "common/serving/prometheus_scrape.h"
#include "common/serving/status_convert.h"
#include "common/serving/tls.h"
#include "common/serving/tokenizer_loader.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/tandem/v1/tandem.grpc.pb.h"
#include "tools/bench.h"
#include "tools/serve_stats.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

int Fail(const absl::Status& s) {
  std::cerr << "tandem bench serve: " << s.message() << std::endl;
  return 2;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Planned {
  std::string klass;
  std::vector<int32_t> ids;  // or
  std::string text;
  int output_len = 0;
  double arrival_s = 0;
};

struct Options {
  std::string address;
  double timeout_s = 600;
  bool ignore_eos = true;
  int max_concurrency = 0;  // 0: unbounded
};

// One request, start to finish, on the calling thread.
RequestRecord RunOne(v1::Decode::Stub* stub, const Planned& p, const Options& o, int index,
                     Clock::time_point bench_start) {
  RequestRecord r;
  r.index = index;
  r.klass = p.klass;
  v1::GenerateRequest request;
  request.set_request_id(absl::StrCat("bench-", getpid(), "-", index));
  if (!p.text.empty()) {
    request.set_prompt(p.text);
  } else {
    request.mutable_prompt_token_ids()->Add(p.ids.begin(), p.ids.end());
    r.input_tokens = static_cast<int>(p.ids.size());
  }
  request.mutable_sampling()->set_max_tokens(p.output_len);
  request.mutable_sampling()->set_ignore_eos(o.ignore_eos);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1e3)));
  const Clock::time_point start = Clock::now();
  r.start_s = Seconds(start - bench_start);
  Clock::time_point last = start;
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (msg.token_ids_size() > 0) {
      const Clock::time_point now = Clock::now();
      if (r.output_tokens == 0) {
        r.ttft_s = Seconds(now - start);
      } else {
        r.itl_s.push_back(Seconds(now - last));
      }
      last = now;
      r.output_tokens += msg.token_ids_size();
    }
    if (msg.has_usage() && msg.usage().prompt_tokens() > 0) {
      r.input_tokens = static_cast<int>(msg.usage().prompt_tokens());
    }
  }
  const grpc::Status status = reader->Finish();
  r.e2e_s = Seconds(Clock::now() - start);
  r.status = GrpcCodeName(status.error_code());
  r.error = status.error_message();
  return r;
}

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

}  // namespace

int RunServeBench(const std::vector<std::string>& args) {
  FlagSet flags("tandem bench serve");
  Options o;
  o.address = "127.0.0.1:50051";
  int num_prompts = 100;
  std::string rate_text = "inf";
  double burstiness = 1;
  uint64_t seed = 0;
  std::string dataset = "random";
  int input_len = 128, output_len = 64, prefix_len = 0;
  double range_ratio = 0;
  std::string mix, prompts_file, model, slo_text, metrics_address, json_path, label;
  int vocab_size = 0;
  flags.Add("address", &o.address, "decode worker HOST:PORT");
  flags.Add("num-prompts", &num_prompts, "requests to send");
  flags.Add("request-rate", &rate_text, "requests/s (Poisson with --burstiness=1); inf: all at once");
  flags.Add("burstiness", &burstiness, "gamma shape of the arrival gaps: < 1 burstier, > 1 steadier");
  flags.Add("max-concurrency", &o.max_concurrency, "most requests in flight (0 = no limit)");
  flags.Add("seed", &seed, "seed of lengths, token ids and arrivals");
  flags.Add("dataset", &dataset, "random (token ids) or prompts (--prompts-file, text)");
  flags.Add("input-len", &input_len, "random: prompt tokens");
  flags.Add("output-len", &output_len, "tokens to generate (max_tokens)");
  flags.Add("range-ratio", &range_ratio, "random: lengths uniform in len * [1 - r, 1 + r]");
  flags.Add("prefix-len", &prefix_len,
            "random: every prompt starts with the same N tokens (a shared system prompt), "
            "then its own --input-len");
  flags.Add("mix", &mix,
            "random: a mixed workload, [NAME=]IN/OUT:WEIGHT,... e.g. "
            "chat=128/64:0.8,doc=1024/16:0.2 (overrides --input-len/--output-len)");
  flags.Add("prompts-file", &prompts_file,
            "prompts: a file of prompts, one per line: text, or {\"prompt\": \"...\"} (JSONL)");
  flags.Add("model", &model, "random: the model whose vocabulary token ids are drawn from");
  flags.Add("vocab-size", &vocab_size, "random: token ids in [0, N) (instead of --model)");
  flags.Add("ignore-eos", &o.ignore_eos, "generate exactly max_tokens (vLLM's random dataset does)");
  flags.Add("slo", &slo_text, "goodput SLOs in ms, e.g. ttft:500,tpot:50,e2el:5000");
  flags.Add("metrics-address", &metrics_address,
            "decode worker's metrics HOST:PORT: report its counters' deltas over the run");
  flags.Add("json", &json_path, "write the results, per-request timings included, to this file");
  flags.Add("label", &label, "a name for this run in the JSON (e.g. the setup)");
  flags.Add("timeout-seconds", &o.timeout_s, "deadline of each request");
  TlsFiles tls;
  tls.Register(&flags, "", /*server=*/false);
  if (auto code = ParseCommandLine(&flags, args)) return *code;
  double rate = 0;
  if (rate_text == "inf") {
    rate = std::numeric_limits<double>::infinity();
  } else if (!absl::SimpleAtod(rate_text, &rate) || !(rate > 0)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--request-rate='", rate_text, "': expected a number > 0 or inf")));
  }
  if (!(burstiness > 0)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--burstiness=", burstiness, " must be > 0")));
  }
  if (num_prompts < 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--num-prompts=", num_prompts, " must be >= 1")));
  }
  if (!(range_ratio >= 0 && range_ratio < 1)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--range-ratio=", range_ratio, " must be in [0, 1)")));
  }
  if (output_len < 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--output-len=", output_len, " must be >= 1")));
  }
  auto slo = ParseSlo(slo_text);
  if (!slo.ok()) return Fail(slo.status());
  std::string metrics_host;
  int metrics_port = 0;
  if (!metrics_address.empty()) {
    const size_t colon = metrics_address.rfind(':');
    if (colon == std::string::npos ||
        !absl::SimpleAtoi(metrics_address.substr(colon + 1), &metrics_port)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--metrics-address='", metrics_address, "': expected HOST:PORT")));
    }
    metrics_host = metrics_address.substr(0, colon);
  }

  // The workload, fixed before the first request is sent.
  std::mt19937_64 rng(seed);
  std::vector<Planned> plan(num_prompts);
  if (dataset == "random") {
    if (vocab_size <= 0 && !model.empty()) {
      auto tok = LoadTokenizer(model);
      if (!tok.ok()) return Fail(tok.status());
      if (*tok == nullptr) {
        return Fail(absl::InvalidArgumentError(absl::StrCat(
            "--model='", model, "' has no tokenizer to take the vocabulary from; give --vocab-size")));
      }
      vocab_size = (*tok)->vocab_size();
    }
    if (vocab_size <= 0) {
      return Fail(absl::InvalidArgumentError(
          "the random dataset needs the vocabulary: give --model or --vocab-size"));
    }
    std::vector<RequestClass> classes = {{"random", input_len, output_len, 1}};
    if (!mix.empty()) {
      auto parsed = ParseMix(mix);
      if (!parsed.ok()) return Fail(parsed.status());
      classes = *parsed;
    } else if (input_len < 1) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--input-len=", input_len, " must be >= 1")));
    }
    std::vector<double> weights;
    for (const RequestClass& c : classes) weights.push_back(c.weight);
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    if (prefix_len < 0) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--prefix-len=", prefix_len, " must be >= 0")));
    }
    std::uniform_int_distribution<int32_t> token(0, vocab_size - 1);
    std::vector<int32_t> prefix(prefix_len);
    for (int32_t& id : prefix) id = token(rng);
    for (Planned& p : plan) {
      const RequestClass& c = classes[pick(rng)];
      p.klass = c.name;
      p.ids = prefix;
      p.ids.resize(prefix.size() + SampleLength(c.input_len, range_ratio, rng));
      for (size_t i = prefix.size(); i < p.ids.size(); ++i) p.ids[i] = token(rng);
      p.output_len = SampleLength(c.output_len, range_ratio, rng);
    }
  } else if (dataset == "prompts") {
    std::ifstream in(prompts_file);
    if (prompts_file.empty() || !in) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--dataset=prompts needs --prompts-file; cannot read '", prompts_file, "'")));
    }
    std::vector<std::string> lines;
    int line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      if (line.empty()) continue;
      if (line[0] == '{') {  // JSONL, as vLLM's custom dataset: {"prompt": "..."}
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
          return Fail(absl::InvalidArgumentError(absl::StrCat(
              "--prompts-file='", prompts_file, "': line ", line_no,
              " starts with '{' but is not a JSON object with a string \"prompt\"")));
        }
        line = j["prompt"].get<std::string>();
      }
      lines.push_back(line);
    }
    if (lines.empty()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--prompts-file='", prompts_file, "' has no prompts")));
    }
    std::shuffle(lines.begin(), lines.end(), rng);
    for (size_t i = 0; i < plan.size(); ++i) {
      plan[i].klass = "prompts";
      plan[i].text = lines[i % lines.size()];
      plan[i].output_len = SampleLength(output_len, range_ratio, rng);
    }
  } else {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--dataset='", dataset, "': expected random or prompts")));
  }
  const std::vector<double> arrivals = ArrivalTimes(num_prompts, rate, burstiness, rng);
  for (int i = 0; i < num_prompts; ++i) plan[i].arrival_s = arrivals[i];

  auto credentials = ChannelCredentials(tls);
  if (!credentials.ok()) return Fail(credentials.status());
  grpc::ChannelArguments channel_args;
  // One HTTP/2 connection carries every stream; lift gRPC's default limit
  // of 100 concurrent streams per connection from the client's side too.
  channel_args.SetInt(GRPC_ARG_MAX_CONCURRENT_STREAMS, 100000);
  auto channel = grpc::CreateCustomChannel(o.address, *credentials, channel_args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    return Fail(absl::UnavailableError(absl::StrCat("cannot connect to --address=", o.address)));
  }
  auto stub = v1::Decode::NewStub(channel);
  WorkerCounters before;
  if (metrics_port > 0) {
    before = Scrape(metrics_host, metrics_port);
    if (!before.ok) {
      return Fail(absl::UnavailableError(
          absl::StrCat("cannot read http://", metrics_address, "/metrics")));
    }
  }
  std::printf("bench serve: %d requests to %s, rate %s, burstiness %.2f, max concurrency %s, "
              "dataset %s%s%s\n",
              num_prompts, o.address.c_str(), rate_text.c_str(), burstiness,
              o.max_concurrency > 0 ? std::to_string(o.max_concurrency).c_str() : "none",
              dataset.c_str(), mix.empty() ? "" : absl::StrCat(" mix ", mix).c_str(),
              prefix_len > 0 ? absl::StrCat(", shared prefix ", prefix_len, " tokens").c_str() : "");
  std::fflush(stdout);

  std::vector<RequestRecord> records(num_prompts);
  std::mutex mu;  // guards in_flight, done, failed
  std::condition_variable cv;
  int in_flight = 0, done = 0, failed = 0;
  Progress progress(num_prompts);
  std::vector<std::thread> threads;
  threads.reserve(num_prompts);
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < num_prompts; ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(plan[i].arrival_s)));
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return o.max_concurrency <= 0 || in_flight < o.max_concurrency; });
      ++in_flight;
    }
    threads.emplace_back([&, i] {
      records[i] = RunOne(stub.get(), plan[i], o, i, start);
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      ++done;
      if (!records[i].ok()) ++failed;
      progress.Update(done, failed);
      cv.notify_all();
    });
  }
  for (std::thread& t : threads) t.join();
  const double duration = Seconds(Clock::now() - start);
  progress.Update(done, failed, /*final=*/true);
  WorkerCounters after;
  if (metrics_port > 0) after = Scrape(metrics_host, metrics_port);

  const ServeSummary s = Summarize(records, duration, *slo);
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

  // Per class, when the workload mixes several.
  std::map<std::string, std::vector<RequestRecord>> by_class;
  for (const RequestRecord& r : records) by_class[r.klass].push_back(r);
  nlohmann::json classes_json = nlohmann::json::object();
  if (by_class.size() > 1) {
    std::printf("-------------------By request class---------------\n");
    std::printf("%-12s %6s %12s %12s %12s %12s\n", "class", "ok", "TTFT p50", "TTFT p99",
                "ITL p50", "ITL p99");
    for (const auto& [name, rs] : by_class) {
      const ServeSummary c = Summarize(rs, duration, *slo);
      std::printf("%-12s %6d %12.1f %12.1f %12.1f %12.1f\n", name.c_str(), c.completed,
                  c.ttft.median, c.ttft.p99, c.itl.median, c.itl.p99);
      classes_json[name] = SummaryJson(c);
    }
  }
  nlohmann::json worker_json = nlohmann::json::object();
  if (metrics_port > 0) {
    if (!after.ok) {
      std::printf("(the decode worker's /metrics could not be read after the run)\n");
    } else {
      std::map<std::string, double> delta;
      for (const auto& [k, v] : after.values) delta[k] = v - before.values[k];
      const double steps = delta["tandem_forward_steps_total{runtime_mode=FULL}"] +
                           delta["tandem_forward_steps_total{runtime_mode=PIECEWISE}"] +
                           delta["tandem_forward_steps_total{runtime_mode=NONE}"];
      const double full_ratio =
          steps > 0 ? delta["tandem_cudagraph_replays_total{mode=FULL}"] / steps : 0;
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
      std::printf("%-40s %.0f / %.0f (%.1f%%)\n", "Spec decode accepted / drafted tokens:",
                  accepted, drafted, 100 * acceptance);
      std::printf("%-40s %-10.2f\n", "Spec decode mean acceptance length:",
                  drafts > 0 ? 1 + accepted / drafts : 0.0);
      std::printf("%-40s %-10.2f\n", "Generated tokens per step:", tokens_per_step);
      worker_json = delta;
      worker_json["full_replay_ratio"] = full_ratio;
      worker_json["spec_decode_acceptance_rate"] = acceptance;
      worker_json["tokens_per_step"] = tokens_per_step;
    }
  }
  std::printf("==================================================\n");
  std::fflush(stdout);

  if (!json_path.empty()) {
    nlohmann::json j;
    j["label"] = label;
    j["config"] = {{"address", o.address},       {"num_prompts", num_prompts},
                   {"request_rate", rate_text},  {"burstiness", burstiness},
                   {"max_concurrency", o.max_concurrency}, {"seed", seed},
                   {"dataset", dataset},         {"input_len", input_len},
                   {"prefix_len", prefix_len},
                   {"output_len", output_len},   {"range_ratio", range_ratio},
                   {"mix", mix},                 {"slo", slo_text}};
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
    std::ofstream out(json_path);
    out << j.dump(1) << "\n";
    if (!out) return Fail(absl::InternalError(absl::StrCat("cannot write --json=", json_path)));
  }
  return 0;  // failed requests are results, reported above
}

}  // namespace tandem
