#include "tools/generate.h"

#include <chrono>
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/flags.h"
#include "common/engine/engine.h"
#include "common/serving/engine_flags.h"
#include "common/serving/status_convert.h"
#include "common/serving/text_output.h"
#include "common/serving/tls.h"
#include "common/serving/tokenizer_loader.h"
#include "grpcpp/grpcpp.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {
namespace {

int Fail(const absl::Status& s) {
  std::cerr << "tandem generate: " << s.message() << std::endl;
  return 2;
}

// Prints the output as it arrives: token ids ("1,2,3" on one line), or text
// (then the summary line goes to stderr, so stdout is the text alone).
class OutputPrinter {
 public:
  explicit OutputPrinter(bool text) : text_(text) {}
  void Tokens(const std::vector<int32_t>& tokens) {
    for (int32_t t : tokens) {
      if (!text_) std::printf(first_ ? "%d" : ",%d", t);
      first_ = false;
      ++count_;
    }
    std::fflush(stdout);
  }
  void Text(const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
  void End() {
    std::printf("\n");
    std::fflush(stdout);
  }
  int count() const { return count_; }
  FILE* summary() const { return text_ ? stderr : stdout; }

 private:
  bool text_;
  bool first_ = true;
  int count_ = 0;
};

// What to generate from: ids, or text with the model's tokenizer.
struct Prompt {
  std::vector<int32_t> ids;
  std::string text;  // non-empty: a text prompt
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
};

int RunLocal(const EngineConfig& config, const Prompt& prompt, const SamplingParams& params) {
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int32_t> ids = prompt.ids;
  if (!prompt.text.empty() || !prompt.stop.empty()) {
    auto t = LoadTokenizer(config.model);
    if (!t.ok()) return Fail(t.status());
    if (*t == nullptr) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--prompt and --stop need a tokenizer; model '", config.model,
          "' has none (give --prompt-token-ids)")));
    }
    tokenizer = std::move(*t);
    if (!prompt.text.empty()) ids = tokenizer->Encode(prompt.text);
  }
  auto engine = LlmEngine::Create(config);
  if (!engine.ok()) return Fail(engine.status());
  if (auto s = (*engine)->AddRequest("local-0", ids, params); !s.ok()) return Fail(s);
  std::unique_ptr<TextOutput> text;
  if (tokenizer) text = std::make_unique<TextOutput>(tokenizer.get(), prompt.skip_special_tokens, prompt.stop);
  OutputPrinter printer(!prompt.text.empty());
  const auto start = std::chrono::steady_clock::now();
  double ttft = -1;
  FinishReason reason = FinishReason::kNone;
  bool stopped = false;
  while ((*engine)->HasWork() && !stopped) {
    auto outputs = (*engine)->Step();
    if (!outputs.ok()) return Fail(outputs.status());
    for (const RequestOutput& o : *outputs) {
      if (!o.status.ok()) return Fail(o.status);
      if (ttft < 0 && !o.new_tokens.empty()) {
        ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      if (text) {
        std::string piece;
        const size_t keep = text->AddUntilStop(o.new_tokens, &piece, o.stop_token);
        printer.Tokens({o.new_tokens.begin(), o.new_tokens.begin() + keep});
        printer.Text(piece);
        if (text->stopped()) {
          stopped = true;
          reason = FinishReason::kStop;
          (void)(*engine)->Abort(o.id);
        }
      } else {
        printer.Tokens(o.new_tokens);
      }
      if (o.finished) reason = o.finish_reason;
    }
  }
  if (text) printer.Text(text->Finish());
  printer.End();
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const RunnerStats& st = (*engine)->runner().stats();
  // Decode: the tokens after the first over the time after it.
  const double decode_rate =
      printer.count() > 1 && total > ttft ? (printer.count() - 1) / (total - ttft) : 0.0;
  std::fprintf(
      printer.summary(),
      "steps: FULL=%lld PIECEWISE=%lld NONE=%lld | mode %s | finish %s | ttft %.1f ms | %.1f "
      "tokens/s | decode %.1f tokens/s | %d tokens",
      static_cast<long long>(st.steps[CudaGraphMode::kFull]), static_cast<long long>(st.steps[CudaGraphMode::kPiecewise]),
      static_cast<long long>(st.steps[CudaGraphMode::kNone]),
      std::string((*engine)->runner().resolved_mode().name()).c_str(),
      reason == FinishReason::kStop ? "stop" : "length", ttft * 1e3,
      total > 0 ? printer.count() / total : 0.0, decode_rate, printer.count());
  const SpecDecodeStats& spec = (*engine)->spec_decode_stats();
  if (spec.num_drafts > 0) {
    std::fprintf(printer.summary(), " | drafts %lld, accepted %lld / %lld tokens",
                 static_cast<long long>(spec.num_drafts),
                 static_cast<long long>(spec.num_accepted_tokens),
                 static_cast<long long>(spec.num_draft_tokens));
  }
  std::fprintf(printer.summary(), "\n");
  return 0;
}

int RunRemote(const std::string& address, const TlsFiles& tls, const Prompt& prompt,
              const SamplingParams& params, double timeout_s) {
  auto credentials = ChannelCredentials(tls);
  if (!credentials.ok()) return Fail(credentials.status());
  auto channel = grpc::CreateChannel(address, *credentials);
  auto stub = v1::Decode::NewStub(channel);
  v1::GenerateRequest request;
  request.set_request_id(absl::StrCat("cli-", getpid(), "-",
                                      std::chrono::steady_clock::now().time_since_epoch().count()));
  if (!prompt.text.empty()) {
    request.set_prompt(prompt.text);
  } else {
    request.mutable_prompt_token_ids()->Add(prompt.ids.begin(), prompt.ids.end());
  }
  v1::SamplingParams* p = request.mutable_sampling();
  for (const std::string& stop : prompt.stop) p->add_stop(stop);
  p->mutable_skip_special_tokens()->set_value(prompt.skip_special_tokens);
  p->set_max_tokens(params.max_tokens);
  p->set_temperature(params.temperature);
  p->set_top_p(params.top_p);
  p->set_top_k(params.top_k);
  if (params.seed.has_value()) p->mutable_seed()->set_value(*params.seed);
  p->set_ignore_eos(params.ignore_eos);
  request.set_lora_name(params.lora_name);
  request.set_priority(params.priority);
  request.set_cache_salt(params.cache_salt);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  const auto start = std::chrono::steady_clock::now();
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  OutputPrinter printer(!prompt.text.empty());
  double ttft = -1;
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  while (reader->Read(&response)) {
    if (ttft < 0 && response.token_ids_size() > 0) {
      ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    printer.Tokens({response.token_ids().begin(), response.token_ids().end()});
    if (!prompt.text.empty()) printer.Text(response.text());
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) reason = response.finish_reason();
  }
  grpc::Status status = reader->Finish();
  if (printer.count() > 0) printer.End();
  if (!status.ok()) {
    std::cerr << "tandem generate: " << GrpcCodeName(status.error_code()) << ": "
              << status.error_message() << std::endl;
    return 1;
  }
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(printer.summary(), "finish %s | ttft %.1f ms | %.1f tokens/s | %d tokens\n",
               reason == v1::FINISH_REASON_STOP ? "stop" : "length", ttft * 1e3,
               total > 0 ? printer.count() / total : 0.0, printer.count());
  return 0;
}

}  // namespace

int RunGenerateCommand(const std::vector<std::string>& args) {
  FlagSet flags("tandem generate");
  EngineFlags engine_flags("FULL_AND_PIECEWISE");
  engine_flags.Register(&flags);
  bool local = false;
  std::string address;
  std::string prompt_ids;
  SamplingParams params;
  int max_tokens = 16;
  double temperature = 0, top_p = 1;
  int top_k = -1;
  int64_t seed = -1;
  flags.Add("local", &local, "run the engine in this process");
  flags.Add("address", &address, "decode worker HOST:PORT (instead of --local)");
  flags.Add("prompt-token-ids", &prompt_ids, "prompt as token ids, e.g. 1,2,3 (prints ids)");
  Prompt prompt;
  std::string stop;
  flags.Add("prompt", &prompt.text, "prompt as text (needs the model's tokenizer; prints text)");
  flags.Add("stop", &stop, "a stop string: the output ends before it (needs a tokenizer)");
  flags.Add("skip-special-tokens", &prompt.skip_special_tokens,
            "leave special tokens out of the printed text");
  flags.Add("max-tokens", &max_tokens, "tokens to generate");
  flags.Add("temperature", &temperature, "0 = greedy");
  flags.Add("top-p", &top_p, "nucleus sampling mass, (0, 1]");
  flags.Add("top-k", &top_k, "-1 = off");
  flags.Add("seed", &seed, "sampling seed (-1 = random)");
  flags.Add("ignore-eos", &params.ignore_eos, "keep generating past EOS");
  flags.Add("lora-name", &params.lora_name,
            "the LoRA adapter to run with (a --lora-modules name: the worker's, or with --local "
            "this process's); empty: the base model");
  flags.Add("priority", &params.priority,
            "the request's priority under --scheduling-policy=priority (a lower value first); 0 "
            "under fcfs");
  flags.Add("cache-salt", &params.cache_salt,
            "salts the prefix cache: the request reuses only cached blocks of requests with the "
            "same salt; empty: none");
  double timeout_s = 300;
  flags.Add("timeout-seconds", &timeout_s, "deadline of the remote call");
  TlsFiles tls;
  tls.Register(&flags, "", /*server=*/false);
  if (auto code = ParseCommandLine(&flags, args)) return *code;
  auto ids = ParseIntList(prompt_ids, "--prompt-token-ids");
  if (!ids.ok()) return Fail(ids.status());
  prompt.ids = std::move(*ids);
  if (!prompt.text.empty() && !prompt.ids.empty()) {
    return Fail(absl::InvalidArgumentError("give one of --prompt and --prompt-token-ids"));
  }
  if (!stop.empty()) prompt.stop.push_back(stop);
  if (max_tokens < 0) return Fail(absl::InvalidArgumentError("--max-tokens must be >= 1"));
  params.max_tokens = static_cast<uint32_t>(max_tokens);
  params.temperature = static_cast<float>(temperature);
  params.top_p = static_cast<float>(top_p);
  params.top_k = top_k;
  if (seed >= 0) params.seed = static_cast<uint64_t>(seed);
  if (local == !address.empty()) {
    return Fail(absl::InvalidArgumentError("give exactly one of --local and --address"));
  }
  if (local) {
    auto config = engine_flags.ToConfig(flags);
    if (!config.ok()) return Fail(config.status());
    return RunLocal(*config, prompt, params);
  }
  return RunRemote(address, tls, prompt, params, timeout_s);
}

int RunTokenizeCommand(const std::vector<std::string>& args, bool detokenize) {
  const char* name = detokenize ? "tandem detokenize" : "tandem tokenize";
  FlagSet flags(name);
  std::string model = "synthetic", text, ids_text;
  bool special = true, show_tokens = false;
  flags.Add("model", &model, "a .gguf file or a Hugging Face directory with tokenizer.json");
  if (detokenize) {
    flags.Add("ids", &ids_text, "token ids, e.g. 1,2,3");
    flags.Add("skip-special-tokens", &special, "leave special tokens out");
  } else {
    flags.Add("text", &text, "the text to tokenize");
    flags.Add("add-special-tokens", &special, "add the post-processor's BOS/EOS");
    flags.Add("show-tokens", &show_tokens, "print each id with its token string");
  }
  auto fail = [name](const absl::Status& s) {
    std::cerr << name << ": " << s.message() << std::endl;
    return 2;
  };
  if (auto code = ParseCommandLine(&flags, args)) return *code;
  auto tok = LoadTokenizer(model);
  if (!tok.ok()) return fail(tok.status());
  if (*tok == nullptr) {
    return fail(absl::InvalidArgumentError(absl::StrCat("model '", model, "' has no tokenizer")));
  }
  if (detokenize) {
    auto ids = ParseIntList(ids_text, "--ids");
    if (!ids.ok()) return fail(ids.status());
    std::cout << (*tok)->Decode(*ids, special) << std::endl;
    return 0;
  }
  const std::vector<int32_t> ids = (*tok)->Encode(text, special);
  for (size_t i = 0; i < ids.size(); ++i) {
    std::cout << (i ? "," : "") << ids[i];
    if (show_tokens) std::cout << "(" << (*tok)->IdToToken(ids[i]) << ")";
  }
  std::cout << std::endl;
  return 0;
}

}  // namespace tandem
