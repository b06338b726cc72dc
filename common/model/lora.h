// LoRA adapters applied at run time to a LlamaModel's dense projections,
// several adapters in one batch (vLLM's --lora-modules, multi-LoRA serving).
//
// An adapter is a PEFT directory: adapter_config.json (r, lora_alpha,
// use_rslora) and adapter_model.safetensors with, for layer i and module m of
// q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj,
//   base_model.model.model.layers.i.{self_attn,mlp}.m.lora_A.weight  [r, in]
//   base_model.model.model.layers.i.{self_attn,mlp}.m.lora_B.weight  [out, r]
// A targeted projection computes y = x W^T + scale * (x A^T) B^T, scale =
// lora_alpha / r (lora_alpha / sqrt(r) with use_rslora), as PEFT does.
//
// The adapters are kept in bf16 (the scale folded into B before it is
// rounded), as vLLM keeps them in a bf16 model's dtype: a batch-1 decode step
// reads every stack of the adapter it runs, and bf16 halves those bytes
// (docs/benchmarks.md, "LoRA adapters"). They are stacked per weight of the model, the fused
// ones fused likewise (q, k, v -> qkv; gate, up -> gate_up), so that one op
// per weight serves every adapter of a batch:
//   a:  [S, R, in]   adapter s's A rows of the weight's modules, one after another
//   bt: [S, R, out]  B transposed and times scale: module j's rank rows hold its
//                    B in its output columns (zeros elsewhere, and where the
//                    adapter does not target the module)
// S = adapters loaded; R = the largest loaded rank x the modules fused. A token's slot is
// 0 for the base model and s + 1 for adapter s (ForwardBuffers::lora_slots).
//
// Refused at start-up, naming the adapter and what it asks: DoRA, biases,
// modules_to_save, rank or alpha patterns, fan_in_fan_out, a rank above
// max_lora_rank, a module or tensor the engine does not apply, a shape that is
// not the model's, and models with experts.
//
// Immutable after Load(); read by the engine thread.
#ifndef TANDEM_COMMON_MODEL_LORA_H_
#define TANDEM_COMMON_MODEL_LORA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/backend/device.h"
#include "common/kernels/ops.h"
#include "common/model/llama_config.h"

namespace tandem {

// One --lora-modules entry: the name requests give, and the PEFT directory.
struct LoraModuleSpec {
  std::string name;
  std::string path;
};

// One weight's stacked adapters (Ops' LoraWeights); a null `a` when no
// adapter targets it.
using LoraStack = LoraWeights;

class LoraSet {
 public:
  // Reads every adapter for `config`'s model onto `device`.
  static absl::StatusOr<std::unique_ptr<LoraSet>> Load(const LlamaConfig& config, Device* device,
                                                       const std::vector<LoraModuleSpec>& modules,
                                                       int max_lora_rank);

  int size() const { return static_cast<int>(names_.size()); }
  const std::vector<std::string>& names() const { return names_; }
  int max_lora_rank() const { return max_rank_; }
  // The slot of adapter `name` (1 + its index); 0 for the empty name (the
  // base model); NOT_FOUND for a name not loaded, naming those that are.
  absl::StatusOr<int> Slot(absl::string_view name) const;
  // A hash of adapter `slot`'s rank, scale and weights (0 for slot 0): the
  // prefix cache's root for its requests, and what both workers of a pair
  // compare before KV computed with it is used.
  uint64_t Fingerprint(int slot) const { return slot == 0 ? 0 : fingerprints_[slot - 1]; }

  const LoraStack& qkv(int layer) const { return layers_[layer].qkv; }
  const LoraStack& o(int layer) const { return layers_[layer].o; }
  const LoraStack& gate_up(int layer) const { return layers_[layer].gate_up; }
  const LoraStack& down(int layer) const { return layers_[layer].down; }
  // The widest R of any stack: the scratch a LoRA op needs per token.
  int64_t max_stack_rank() const { return max_stack_rank_; }

 private:
  struct Layer {
    LoraStack qkv, o, gate_up, down;
  };
  LoraSet() = default;

  std::vector<std::string> names_;
  std::vector<uint64_t> fingerprints_;
  int max_rank_ = 0;
  int64_t max_stack_rank_ = 0;
  std::unique_ptr<Arena> arena_;
  std::vector<Layer> layers_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_LORA_H_
