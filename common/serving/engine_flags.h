// The engine flags shared by both workers, `tandem generate --local` and
// `tandem bench`: one definition, one set of defaults.
#ifndef TANDEM_COMMON_SERVING_ENGINE_FLAGS_H_
#define TANDEM_COMMON_SERVING_ENGINE_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/base/flags.h"
#include "common/engine/engine.h"

namespace tandem {

// "NAME=PATH,NAME=PATH,..." (vLLM's --lora-modules name=path ...). Names are
// unique and non-empty; INVALID_ARGUMENT names the entry.
absl::StatusOr<std::vector<LoraModuleSpec>> ParseLoraModules(absl::string_view flag);

struct EngineFlags {
  std::string model = "synthetic";
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string weight_dtype = "auto";
  std::string cudagraph_mode;  // default given by the caller
  int max_num_batched_tokens = 2048;
  int max_num_seqs = 64;
  int max_model_len = 0;
  int block_size = 16;
  int num_kv_blocks = 0;
  int64_t kv_cache_mb = 512;
  std::string capture_sizes;
  int max_capture_size = 0;
  // Without --capture-sizes or --max-capture-size, capture the ladder up to
  // the token budget, so every (chunked) step has a graph: the prefill
  // worker's default, where steps are chunks of long prompts.
  bool capture_up_to_token_budget = false;
  int threads = 0;
  bool enable_prefix_caching = true;
  bool check_input_addresses = false;
  bool debug_async_kv_reads = false;
  std::string speculative_config;  // JSON, as vLLM's --speculative-config
  std::string rope_scaling;        // JSON, as vLLM's --rope-scaling
  std::string lora_modules;        // NAME=PATH,... as vLLM's --lora-modules
  bool enable_lora = false;        // vLLM's --enable-lora (implied by --lora-modules)
  int max_loras = 0;               // vLLM's --max-loras; 0: as many as --lora-modules
  bool allow_runtime_lora_updating = false;  // LoadLoraAdapter / UnloadLoraAdapter
  int max_lora_rank = 16;          // vLLM's --max-lora-rank
  std::string scheduling_policy = "fcfs";  // vLLM's --scheduling-policy
  int max_logprobs = kDefaultMaxLogprobs;  // vLLM's --max-logprobs

  explicit EngineFlags(std::string default_mode) : cudagraph_mode(std::move(default_mode)) {}
  void Register(FlagSet* flags);
  // INVALID_ARGUMENT names the flag and the value.
  absl::StatusOr<EngineConfig> ToConfig(const FlagSet& flags) const;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_ENGINE_FLAGS_H_
