// prefill_worker: the Prefill gRPC service (PIECEWISE graphs by default).
#include <iostream>

#include "common/base/flags.h"
#include "common/serving/engine_flags.h"
#include "common/serving/tokenizer_loader.h"
#include "common/serving/worker.h"
#include "prefill_worker/prefill_service.h"

int main(int argc, char** argv) {
  tandem::BlockTerminationSignals();  // before any thread exists
  tandem::FlagSet flags("prefill_worker");
  tandem::EngineFlags engine_flags("PIECEWISE");
  // Prompts run in chunks of 512 tokens, and every chunk size has a PIECEWISE
  // graph (recording graphs costs no forward on the CPU).
  engine_flags.max_num_batched_tokens = 512;
  engine_flags.capture_up_to_token_budget = true;
  engine_flags.Register(&flags);
  tandem::WorkerOptions options;
  options.role = "prefill";
  options.grpc_address = "0.0.0.0:50052";
  options.metrics_address = "0.0.0.0:9401";
  int max_waiting = 256;
  double kv_export_timeout_s = 30;
  tandem::RegisterWorkerFlags(&flags, &options);
  flags.Add("max-waiting", &max_waiting, "queued prompts beyond which requests get RESOURCE_EXHAUSTED");
  flags.Add("kv-export-timeout-seconds", &kv_export_timeout_s,
            "a prefilled request's KV is freed when its reader takes nothing for this long, "
            "whatever the call's deadline");
  tandem::EngineConfig config;
  if (int code = tandem::ParseWorkerCommandLine("prefill_worker", &flags, engine_flags, argc, argv, &config);
      code >= 0) {
    return code;
  }
  // The tokenizer's bytes of each token, for structured outputs' first token,
  // and bad words' tokens.
  auto tokenizer = tandem::LoadTokenizer(config.model);
  if (!tokenizer.ok()) {
    std::cerr << "prefill_worker: " << tokenizer.status().message() << std::endl;
    return 1;
  }
  if (*tokenizer != nullptr) config.vocabulary = tandem::TokenVocabularyOf(**tokenizer);
  tandem::WorkerState state;
  tandem::WorkerMetrics metrics("prefill");
  if (!(kv_export_timeout_s > 0)) {
    std::cerr << "prefill_worker: --kv-export-timeout-seconds=" << kv_export_timeout_s
              << " must be > 0" << std::endl;
    return 2;
  }
  tandem::PrefillServiceImpl service(&state, &metrics, max_waiting,
                                     absl::Seconds(kv_export_timeout_s), tokenizer->get());
  return tandem::RunWorker(options, config, &state, &metrics, {&service},
                           [&](tandem::EngineClient* client) { service.SetEngine(client); });
}
