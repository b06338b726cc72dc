#include "common/serving/engine_flags.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<std::vector<LoraModuleSpec>> ParseLoraModules(absl::string_view flag) {
  std::vector<LoraModuleSpec> out;
  if (flag.empty()) return out;
  absl::flat_hash_set<std::string> seen;
  for (absl::string_view entry : absl::StrSplit(flag, ',')) {
    const std::pair<std::string, std::string> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    if (kv.first.empty() || kv.second.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--lora-modules entry '", entry, "' is not NAME=PATH (a PEFT adapter directory)"));
    }
    if (!seen.insert(kv.first).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lora-modules names '", kv.first, "' twice"));
    }
    out.push_back({kv.first, kv.second});
  }
  return out;
}

void EngineFlags::Register(FlagSet* f) {
  f->Add("model", &model,
         "synthetic | synthetic:smollm2-135m | synthetic:llama-3.2-1b | a Hugging Face "
         "directory (config.json + safetensors)");
  f->Add("device", &device, "cpu or cuda (loads the CUDA backend module)");
  f->Add("dtype", &dtype,
         "storage dtype of weights, activations and KV: auto (cpu: f32, cuda: bf16), f32, "
         "bf16 or f16 (cuda); cpu bf16 keeps weights and KV in bf16, activations in f32");
  f->Add("weight-dtype", &weight_dtype,
         "matmul weights: auto (cpu: a GGUF's Q4_0/Q4_1/Q8_0 tensors as stored, Q4_K as Q4_1, "
         "its other block types as Q8_0, the rest in --dtype; cuda: --dtype), dense (every matmul "
         "weight in --dtype, a GGUF's blocks widened), q8_0 (cpu: 8-bit weights, f32 "
         "activations, KV in --dtype) or gguf (the old name of auto on the cpu)");
  f->Add("cudagraph-mode", &cudagraph_mode,
         "NONE, PIECEWISE, FULL, FULL_DECODE_ONLY or FULL_AND_PIECEWISE");
  f->Add("max-num-batched-tokens", &max_num_batched_tokens, "token budget of one step");
  f->Add("max-num-seqs", &max_num_seqs, "most requests in one step");
  f->Add("max-model-len", &max_model_len,
         "longest sequence (prompt + output); 0 = the model's context (with rope scaling, as "
         "vLLM derives it), at most 8192");
  f->Add("block-size", &block_size, "tokens per KV cache block");
  f->Add("num-kv-blocks", &num_kv_blocks, "KV cache blocks; 0 = fit --kv-cache-mb");
  f->Add("kv-cache-mb", &kv_cache_mb, "KV cache memory when --num-kv-blocks=0");
  f->Add("capture-sizes", &capture_sizes, "graph capture sizes, e.g. 1,2,4,8 (default ladder)");
  f->Add("max-capture-size", &max_capture_size,
         capture_up_to_token_budget
             ? "largest size of the default ladder (default: --max-num-batched-tokens)"
             : "largest size of the default ladder (default: min(2 x max-num-seqs, 512))");
  f->Add("threads", &threads,
         "CPU backend: threads every op is split over (0 = every CPU this process may use: "
         "its affinity (taskset, a cgroup cpuset), capped by a cgroup CPU limit)");
  f->Add("blas-threads", &threads, "the old name of --threads");
  f->Add("enable-prefix-caching", &enable_prefix_caching,
         "reuse the KV of full blocks a request shares with an earlier one (true|false)");
  f->Add("speculative-config", &speculative_config,
         "speculative decoding, JSON as vLLM's: {\"method\": \"ngram\", "
         "\"num_speculative_tokens\": k, \"prompt_lookup_min\": a, \"prompt_lookup_max\": b} "
         "(drafts copied from the context, verified in steps of 1 + k tokens per request; "
         "empty: off)");
  f->Add("rope-scaling", &rope_scaling,
         "rope scaling replacing the model's, JSON as config.json's rope_scaling (vLLM's), e.g. "
         "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768} "
         "for Qwen past its trained context; both workers of a pair need the same (empty: the model's)");
  f->Add("lora-modules", &lora_modules,
         "LoRA adapters requests may name, NAME=PATH,... (PEFT directories: adapter_config.json + "
         "adapter_model.safetensors), all loaded at start-up; a request names one by lora_name "
         "(gRPC) or as its model (OpenAI API). Both workers of a pair need the same (cpu only)");
  f->Add("enable-lora", &enable_lora,
         "accepted as vLLM's; adapters come from --lora-modules and, with "
         "--allow-runtime-lora-updating, LoadLoraAdapter");
  f->Add("allow-runtime-lora-updating", &allow_runtime_lora_updating,
         "adapters may also be loaded and unloaded while serving (gRPC LoadLoraAdapter / "
         "UnloadLoraAdapter, the OpenAI API's /v1/load_lora_adapter and /v1/unload_lora_adapter: "
         "vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING), into --max-loras slots of rank "
         "--max-lora-rank allocated at start-up (cpu only)");
  f->Add("max-loras", &max_loras,
         "adapters resident at once; every --lora-modules adapter is, so at least their number "
         "(0: that number, or 1 with --allow-runtime-lora-updating if more)");
  f->Add("max-lora-rank", &max_lora_rank, "largest rank r an adapter may have");
  f->Add("scheduling-policy", &scheduling_policy,
         "fcfs (first come, first served) or priority (vLLM's: requests are served in order of "
         "their `priority`, a lower value first, ties by arrival, and a request of lower priority "
         "is preempted first); under fcfs a request giving a priority other than 0 is refused. "
         "Both workers of a pair need the same");
  f->Add("max-logprobs", &max_logprobs,
         "the most top log-probabilities a request may ask for each token (logprobs, "
         "top_logprobs, prompt_logprobs; vLLM's); -1: the whole vocabulary. Both workers of a "
         "pair need it (the prefill worker samples the first token)");
  f->Add("check-input-addresses", &check_input_addresses,
         "debug: verify graph inputs stay at their captured addresses");
  f->Add("debug-async-kv-reads", &debug_async_kv_reads,
         "debug (cpu): KV reads for the hand-off complete after the engine has gone on, as a "
         "GPU's copies do, so the GPU's streaming path runs on the CPU");
}

absl::StatusOr<EngineConfig> EngineFlags::ToConfig(const FlagSet& flags) const {
  EngineConfig c;
  c.model = model;
  c.backend.device = device;
  c.backend.dtype = dtype;
  c.backend.threads = threads;
  c.backend.weight_dtype = weight_dtype;
  c.backend.debug_async_kv_reads = debug_async_kv_reads;
  c.block_size = block_size;
  c.num_kv_blocks = num_kv_blocks;
  c.kv_cache_bytes = kv_cache_mb << 20;
  ASSIGN_OR_RETURN(c.runner.graph.requested_mode, CudaGraphMode::Parse(cudagraph_mode));
  c.runner.max_num_batched_tokens = max_num_batched_tokens;
  c.runner.max_num_seqs = max_num_seqs;
  c.runner.max_model_len = max_model_len;
  ASSIGN_OR_RETURN(c.runner.graph.capture_sizes, ParseIntList(capture_sizes, "--capture-sizes"));
  if (flags.IsSet("max-capture-size")) {
    c.runner.graph.max_capture_size = max_capture_size;
  } else if (capture_up_to_token_budget && !flags.IsSet("capture-sizes")) {
    c.runner.graph.max_capture_size = max_num_batched_tokens;
  }
  c.runner.check_input_addresses = check_input_addresses;
  c.enable_prefix_caching = enable_prefix_caching;
  c.rope_scaling = rope_scaling;
  ASSIGN_OR_RETURN(c.speculative, ParseSpeculativeConfig(speculative_config));
  ASSIGN_OR_RETURN(c.lora_modules, ParseLoraModules(lora_modules));
  if (max_loras < 0 || (max_loras > 0 && max_loras < static_cast<int>(c.lora_modules.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-loras=", max_loras, " is less than the ", c.lora_modules.size(),
        " adapters of --lora-modules, which are all resident"));
  }
  c.max_lora_rank = max_lora_rank;
  ASSIGN_OR_RETURN(c.scheduling_policy, ParseSchedulingPolicy(scheduling_policy));
  if (max_logprobs < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-logprobs=", max_logprobs, " must be -1 (the whole vocabulary) or >= 0"));
  }
  c.max_logprobs = max_logprobs;
  if (allow_runtime_lora_updating) {
    c.runtime_lora_slots =
        max_loras > 0 ? max_loras : std::max(1, static_cast<int>(c.lora_modules.size()));
  }
  return c;
}

}  // namespace tandem
