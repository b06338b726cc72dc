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
#include "grpcpp/grpcpp.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {
namespace {

int Fail(const absl::Status& s) {
  std::cerr << "tandem generate: " << s.message() << std::endl;
  return 2;
}

// Prints tokens as they arrive: "1,2,3" on one line.
class TokenPrinter {
 public:
  void Print(int32_t token) {
    std::printf(first_ ? "%d" : ",%d", token);
    std::fflush(stdout);
    first_ = false;
    ++count_;
  }
  void End() { std::printf("\n"); }
  int count() const { return count_; }

 private:
  bool first_ = true;
  int count_ = 0;
};

int RunLocal(const EngineConfig& config, const std::vector<int32_t>& prompt,
             const SamplingParams& params) {
  auto engine = LlmEngine::Create(config);
  if (!engine.ok()) return Fail(engine.status());
  if (auto s = (*engine)->AddRequest("local-0", prompt, params); !s.ok()) return Fail(s);
  TokenPrinter printer;
  const auto start = std::chrono::steady_clock::now();
  double ttft = -1;
  FinishReason reason = FinishReason::kNone;
  while ((*engine)->HasWork()) {
    auto outputs = (*engine)->Step();
    if (!outputs.ok()) return Fail(outputs.status());
    for (const RequestOutput& o : *outputs) {
      if (!o.status.ok()) return Fail(o.status);
      for (int32_t t : o.new_tokens) {
        if (ttft < 0) {
          ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
        printer.Print(t);
      }
      if (o.finished) reason = o.finish_reason;
    }
  }
  printer.End();
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const RunnerStats& st = (*engine)->runner().stats();
  std::printf(
      "steps: FULL=%lld PIECEWISE=%lld NONE=%lld | mode %s | finish %s | ttft %.1f ms | %.1f "
      "tokens/s\n",
      static_cast<long long>(st.steps[2]), static_cast<long long>(st.steps[1]),
      static_cast<long long>(st.steps[0]),
      std::string((*engine)->runner().resolved_mode().name()).c_str(),
      reason == FinishReason::kStop ? "stop" : "length", ttft * 1e3,
      total > 0 ? printer.count() / total : 0.0);
  return 0;
}

int RunRemote(const std::string& address, const std::vector<int32_t>& prompt,
              const SamplingParams& params, double timeout_s) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::Decode::NewStub(channel);
  v1::GenerateRequest request;
  request.set_request_id(absl::StrCat("cli-", getpid(), "-",
                                      std::chrono::steady_clock::now().time_since_epoch().count()));
  request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  v1::SamplingParams* p = request.mutable_sampling();
  p->set_max_tokens(params.max_tokens);
  p->set_temperature(params.temperature);
  p->set_top_p(params.top_p);
  p->set_top_k(params.top_k);
  p->set_seed(params.seed);
  p->set_ignore_eos(params.ignore_eos);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  const auto start = std::chrono::steady_clock::now();
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  TokenPrinter printer;
  double ttft = -1;
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  while (reader->Read(&response)) {
    for (int32_t t : response.token_ids()) {
      if (ttft < 0) {
        ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      printer.Print(t);
    }
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
  std::printf("finish %s | ttft %.1f ms | %.1f tokens/s | %d tokens\n",
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
  flags.Add("local", &local, "run the engine in this process");
  flags.Add("address", &address, "decode worker HOST:PORT (instead of --local)");
  flags.Add("prompt-token-ids", &prompt_ids, "prompt as token ids, e.g. 1,2,3");
  flags.Add("max-tokens", &max_tokens, "tokens to generate");
  flags.Add("temperature", &temperature, "0 = greedy");
  flags.Add("top-p", &top_p, "nucleus sampling mass, (0, 1]");
  flags.Add("top-k", &top_k, "-1 = off");
  flags.Add("seed", &params.seed, "sampling seed (0 = random)");
  flags.Add("ignore-eos", &params.ignore_eos, "keep generating past EOS");
  double timeout_s = 300;
  flags.Add("timeout-seconds", &timeout_s, "deadline of the remote call");
  auto positional = flags.Parse(args);
  if (!positional.ok()) return Fail(positional.status());
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  auto prompt = ParseIntList(prompt_ids, "--prompt-token-ids");
  if (!prompt.ok()) return Fail(prompt.status());
  if (max_tokens < 0) return Fail(absl::InvalidArgumentError("--max-tokens must be >= 1"));
  params.max_tokens = static_cast<uint32_t>(max_tokens);
  params.temperature = static_cast<float>(temperature);
  params.top_p = static_cast<float>(top_p);
  params.top_k = top_k;
  if (local == !address.empty()) {
    return Fail(absl::InvalidArgumentError("give exactly one of --local and --address"));
  }
  if (local) {
    auto config = engine_flags.ToConfig(flags);
    if (!config.ok()) return Fail(config.status());
    return RunLocal(*config, *prompt, params);
  }
  return RunRemote(address, *prompt, params, timeout_s);
}

}  // namespace tandem
