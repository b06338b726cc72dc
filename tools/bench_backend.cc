#include "tools/bench_backend.h"

#include <curl/curl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/serving/status_convert.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {
namespace {

double Seconds(BenchClock::duration d) { return std::chrono::duration<double>(d).count(); }

// Timing of a stream of token-carrying events, shared by both backends.
class Timer {
 public:
  Timer(RequestRecord* r, BenchClock::time_point bench_start)
      : r_(r), start_(BenchClock::now()), last_(start_) {
    r_->start_s = Seconds(start_ - bench_start);
  }
  // An event that carried `tokens` new tokens.
  void Tokens(int tokens) {
    if (tokens <= 0) return;
    const BenchClock::time_point now = BenchClock::now();
    if (r_->output_tokens == 0) {
      r_->ttft_s = Seconds(now - start_);
    } else {
      r_->itl_s.push_back(Seconds(now - last_));
    }
    last_ = now;
    r_->output_tokens += tokens;
  }
  void Done() { r_->e2e_s = Seconds(BenchClock::now() - start_); }

 private:
  RequestRecord* r_;
  BenchClock::time_point start_, last_;
};

class GrpcBackend final : public BenchBackend {
 public:
  GrpcBackend(const BenchBackendOptions& o, std::shared_ptr<grpc::Channel> channel)
      : o_(o), stub_(v1::Decode::NewStub(channel)) {}

  absl::StatusOr<ServedModel> Model() override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ModelInfoResponse info;
    grpc::Status s = stub_->ModelInfo(&ctx, v1::ModelInfoRequest(), &info);
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat("ModelInfo on ", o_.address, ": ", s.error_message()));
    }
    return ServedModel{info.model(), static_cast<int>(info.vocab_size()),
                       static_cast<int>(info.max_model_len())};
  }

  RequestRecord Send(const Planned& p, int index, BenchClock::time_point bench_start) override {
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
    request.mutable_sampling()->set_ignore_eos(o_.ignore_eos);
    request.set_priority(p.priority);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1e3)));
    Timer timer(&r, bench_start);
    auto reader = stub_->Generate(&context, request);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      timer.Tokens(msg.token_ids_size());
      if (msg.has_usage() && msg.usage().prompt_tokens() > 0) {
        r.input_tokens = static_cast<int>(msg.usage().prompt_tokens());
      }
    }
    const grpc::Status status = reader->Finish();
    timer.Done();
    r.status = GrpcCodeName(status.error_code());
    r.error = status.error_message();
    return r;
  }

  std::string target() const override { return o_.address; }

 private:
  BenchBackendOptions o_;
  std::unique_ptr<v1::Decode::Stub> stub_;
};

// OpenAI's streamed completions over HTTP/1.1 (libcurl, one easy handle per
// request on the calling thread).
class OpenAiBackend final : public BenchBackend {
 public:
  OpenAiBackend(const BenchBackendOptions& o, bool chat) : o_(o), chat_(chat) {
    static std::once_flag init;
    std::call_once(init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  }

  absl::StatusOr<ServedModel> Model() override {
    long code = 0;
    std::string body;
    if (absl::Status s = Get("/v1/models", &code, &body); !s.ok()) return s;
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (code != 200 || j.is_discarded() || !j.contains("data") || !j["data"].is_array() ||
        j["data"].empty()) {
      return absl::UnavailableError(absl::StrCat(o_.base_url, "/v1/models answered ", code, ": ",
                                                 body.substr(0, 200)));
    }
    const nlohmann::json& m = j["data"][0];
    ServedModel served;
    served.name = m.value("id", "");
    if (m.contains("vocab_size") && m["vocab_size"].is_number_integer()) {
      served.vocab_size = m["vocab_size"].get<int>();
    } else if (m.contains("meta") && m["meta"].is_object() && m["meta"].contains("n_vocab")) {
      served.vocab_size = m["meta"]["n_vocab"].get<int>();  // llama.cpp's server
    }
    if (m.contains("max_model_len") && m["max_model_len"].is_number_integer()) {
      served.max_model_len = m["max_model_len"].get<int>();
    }
    if (model_.empty()) model_ = o_.model.empty() ? served.name : o_.model;
    return served;
  }

  RequestRecord Send(const Planned& p, int index, BenchClock::time_point bench_start) override {
    RequestRecord r;
    r.index = index;
    r.klass = p.klass;
    nlohmann::json body = {{"model", model_},
                           {"max_tokens", p.output_len},
                           {"stream", true},
                           {"stream_options", {{"include_usage", true}}},
                           {"ignore_eos", o_.ignore_eos},
                           {"return_token_ids", true}};
    if (p.priority != 0) body["priority"] = p.priority;  // vLLM's; servers without it refuse it
    if (chat_) {
      body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", p.text}}});
    } else if (!p.text.empty()) {
      body["prompt"] = p.text;
    } else {
      body["prompt"] = p.ids;
      r.input_tokens = static_cast<int>(p.ids.size());
    }
    const std::string payload = body.dump();
    Stream stream{&r, Timer(&r, bench_start), chat_, {}, {}, {}};
    CURL* curl = curl_easy_init();
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    // A UUID: some servers (llama-cpp-python's) refuse any other X-Request-Id.
    char id[64];
    std::snprintf(id, sizeof(id), "X-Request-Id: %08x-0000-4000-8000-%012x",
                  static_cast<unsigned>(getpid()), static_cast<unsigned>(index));
    headers = curl_slist_append(headers, id);
    const std::string url = o_.base_url + (chat_ ? "/v1/chat/completions" : "/v1/completions");
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, payload.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(payload.size()));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Stream::Write);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &stream);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(o_.timeout_s * 1e3));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    const CURLcode rc = curl_easy_perform(curl);
    long code = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    stream.timer.Done();
    if (rc != CURLE_OK) {
      r.status = rc == CURLE_OPERATION_TIMEDOUT ? "DEADLINE_EXCEEDED" : "UNAVAILABLE";
      r.error = curl_easy_strerror(rc);
    } else if (code != 200) {
      r.status = absl::StrCat("HTTP_", code);
      r.error = stream.raw.substr(0, 300);
    } else if (!stream.error.empty()) {
      r.status = "STREAM_ERROR";
      r.error = stream.error;
    } else if (!stream.done) {
      r.status = "INCOMPLETE";
      r.error = "the stream ended without data: [DONE]";
    }
    if (stream.usage_completion > 0) r.output_tokens = stream.usage_completion;
    if (stream.usage_prompt > 0) r.input_tokens = stream.usage_prompt;
    return r;
  }

  std::string target() const override { return o_.base_url; }

 private:
  // The SSE parser: `data: {...}` lines; a chunk with text is one token
  // event (servers send one per token); usage, when sent, is the truth.
  struct Stream {
    RequestRecord* r;
    Timer timer;
    bool chat;
    std::string pending, raw, error;
    bool done = false;
    int usage_prompt = 0, usage_completion = 0;

    static size_t Write(char* data, size_t size, size_t n, void* user) {
      auto* s = static_cast<Stream*>(user);
      s->Feed(std::string(data, size * n));
      return size * n;
    }
    void Feed(const std::string& bytes) {
      if (raw.size() < 4096) raw += bytes;
      pending += bytes;
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!absl::StartsWith(line, "data:")) continue;
        std::string data = line.substr(5);
        if (!data.empty() && data[0] == ' ') data.erase(0, 1);
        if (data == "[DONE]") {
          done = true;
          continue;
        }
        const nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
        if (j.is_discarded()) continue;
        if (j.contains("error")) {
          error = j["error"].dump();
          continue;
        }
        if (j.contains("usage") && j["usage"].is_object()) {
          usage_prompt = j["usage"].value("prompt_tokens", 0);
          usage_completion = j["usage"].value("completion_tokens", 0);
        }
        if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
        const nlohmann::json& c = j["choices"][0];
        std::string text;
        if (chat && c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
            c["delta"]["content"].is_string()) {
          text = c["delta"]["content"].get<std::string>();
        } else if (!chat && c.contains("text") && c["text"].is_string()) {
          text = c["text"].get<std::string>();
        }
        // Token ids, when the server sends them (vLLM's return_token_ids,
        // Tandem without a tokenizer), count exactly; else a chunk with
        // text is one token.
        if (c.contains("token_ids") && c["token_ids"].is_array()) {
          timer.Tokens(static_cast<int>(c["token_ids"].size()));
        } else if (!text.empty()) {
          timer.Tokens(1);
        }
      }
    }
  };

  absl::Status Get(const std::string& path, long* code, std::string* body) {
    CURL* curl = curl_easy_init();
    const std::string url = o_.base_url + path;
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION,
                     +[](char* d, size_t s, size_t n, void* u) -> size_t {
                       static_cast<std::string*>(u)->append(d, s * n);
                       return s * n;
                     });
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    const CURLcode rc = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, code);
    curl_easy_cleanup(curl);
    if (rc != CURLE_OK) {
      return absl::UnavailableError(absl::StrCat("cannot reach --base-url=", o_.base_url, ": ",
                                                 curl_easy_strerror(rc)));
    }
    return absl::OkStatus();
  }

  BenchBackendOptions o_;
  bool chat_;
  std::string model_;  // set by Model(), before the first Send()
};

// Several servers as one: each request goes to one of them, by the spread.
class SpreadBackend final : public BenchBackend {
 public:
  SpreadBackend(std::vector<std::unique_ptr<BenchBackend>> parts, bool least_outstanding)
      : parts_(std::move(parts)),
        least_outstanding_(least_outstanding),
        outstanding_(parts_.size()),
        sent_(parts_.size()),
        aside_until_(parts_.size()) {}

  absl::StatusOr<ServedModel> Model() override {
    // Every server is asked: a fleet serving different models is a mistake
    // the report would hide.
    absl::StatusOr<ServedModel> first = parts_[0]->Model();
    if (!first.ok()) return first;
    for (size_t i = 1; i < parts_.size(); ++i) {
      absl::StatusOr<ServedModel> m = parts_[i]->Model();
      if (!m.ok()) return m;
      if (m->name != first->name || m->vocab_size != first->vocab_size) {
        return absl::FailedPreconditionError(
            absl::StrCat(parts_[i]->target(), " serves '", m->name, "' (vocabulary ", m->vocab_size,
                         "); ", parts_[0]->target(), " serves '", first->name, "' (vocabulary ",
                         first->vocab_size, ")"));
      }
    }
    return first;
  }

  RequestRecord Send(const Planned& p, int index, BenchClock::time_point bench_start) override {
    const size_t n = parts_.size();
    const int64_t now = BenchClock::now().time_since_epoch().count();
    // A target that answered UNAVAILABLE (draining, gone) is passed over for
    // kAside, as a gateway stops picking a pod that fails its readiness
    // check; when every target is set aside, the turn decides.
    auto usable = [&](size_t j) { return aside_until_[j].load() <= now; };
    size_t k = next_.fetch_add(1) % n;
    for (size_t i = 0, start = k; i < n && !usable(k); ++i) k = (start + i) % n;
    if (least_outstanding_) {
      // The fewest in flight; ties to the next in turn.
      for (size_t i = 1, start = k; i < n; ++i) {
        const size_t j = (start + i) % n;
        if (usable(j) && (!usable(k) || outstanding_[j].load() < outstanding_[k].load())) k = j;
      }
    }
    outstanding_[k].fetch_add(1);
    RequestRecord r = parts_[k]->Send(p, index, bench_start);
    outstanding_[k].fetch_sub(1);
    sent_[k].fetch_add(1);
    if (r.status == "UNAVAILABLE") {
      aside_until_[k].store(BenchClock::now().time_since_epoch().count() +
                            std::chrono::duration_cast<BenchClock::duration>(kAside).count());
    }
    return r;
  }

  std::string target() const override {
    std::vector<std::string> t;
    for (const auto& p : parts_) t.push_back(p->target());
    return absl::StrJoin(t, ",");
  }

  std::string Distribution() const override {
    std::vector<std::string> d;
    for (size_t i = 0; i < parts_.size(); ++i) {
      d.push_back(absl::StrCat(parts_[i]->target(), "=", sent_[i].load()));
    }
    return absl::StrCat(least_outstanding_ ? "least_outstanding: " : "round_robin: ",
                        absl::StrJoin(d, ", "));
  }

 private:
  std::vector<std::unique_ptr<BenchBackend>> parts_;
  bool least_outstanding_;
  std::atomic<uint64_t> next_{0};
  static constexpr std::chrono::seconds kAside{5};
  std::vector<std::atomic<int>> outstanding_;
  std::vector<std::atomic<int64_t>> sent_;
  std::vector<std::atomic<int64_t>> aside_until_;  // BenchClock ticks
};

}  // namespace

absl::StatusOr<std::unique_ptr<BenchBackend>> MakeBenchBackend(const BenchBackendOptions& o) {
  // Several targets: one backend each, spread over.
  const bool grpc = o.backend == "tandem";
  const std::string& list = grpc ? o.address : o.base_url;
  const bool one_target = grpc && (absl::StrContains(list, ":/") || absl::StartsWith(list, "ipv4:") ||
                                   absl::StartsWith(list, "ipv6:") || absl::StartsWith(list, "unix:"));
  if (!one_target && absl::StrContains(list, ',')) {
    if (o.spread != "round_robin" && o.spread != "least_outstanding") {
      return absl::InvalidArgumentError(
          absl::StrCat("--spread='", o.spread, "': expected round_robin or least_outstanding"));
    }
    std::vector<std::unique_ptr<BenchBackend>> parts;
    for (absl::string_view t : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
      BenchBackendOptions one = o;
      (grpc ? one.address : one.base_url) = std::string(absl::StripAsciiWhitespace(t));
      auto part = MakeBenchBackend(one);
      if (!part.ok()) return part.status();
      parts.push_back(*std::move(part));
    }
    return std::unique_ptr<BenchBackend>(
        new SpreadBackend(std::move(parts), o.spread == "least_outstanding"));
  }
  if (o.backend == "tandem") {
    auto credentials = ChannelCredentials(o.tls);
    if (!credentials.ok()) return credentials.status();
    grpc::ChannelArguments args;
    // One HTTP/2 connection carries every stream; lift gRPC's default limit
    // of 100 concurrent streams per connection from the client's side too.
    args.SetInt(GRPC_ARG_MAX_CONCURRENT_STREAMS, 100000);
    auto channel = grpc::CreateCustomChannel(o.address, *credentials, args);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
      return absl::UnavailableError(absl::StrCat("cannot connect to --address=", o.address));
    }
    return std::unique_ptr<BenchBackend>(new GrpcBackend(o, channel));
  }
  if (o.backend == "openai" || o.backend == "openai-chat") {
    if (!absl::StartsWith(o.base_url, "http://")) {
      return absl::InvalidArgumentError(
          absl::StrCat("--base-url='", o.base_url, "': expected http://HOST:PORT"));
    }
    return std::unique_ptr<BenchBackend>(new OpenAiBackend(o, o.backend == "openai-chat"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend='", o.backend, "': expected tandem, openai or openai-chat"));
}

}  // namespace tandem
