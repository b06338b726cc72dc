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
// S = the slots; R = the stacks' rank x the modules fused. A token's slot is
// 0 for the base model and s + 1 for the adapter in slot s
// (ForwardBuffers::lora_slots).
//
// The slots: with --lora-modules only, one per adapter, the stacks' rank the
// largest of theirs, and stacks only where one of them has matrices. With
// runtime updating (vLLM's /v1/load_lora_adapter), `runtime_slots` slots at
// max_lora_rank on every weight, allocated at start-up as vLLM's
// --max-loras stacks are, so that captured graphs (which hold the stacks'
// addresses) stay valid: an adapter loaded later is written into a free
// slot between steps. An unloaded adapter's name goes at once; its slot
// drains (its requests, preempted ones included, run to their end with it)
// and is reused only once no request holds it.
//
// Refused, naming the adapter and what it asks: DoRA, biases,
// modules_to_save, rank or alpha patterns, fan_in_fan_out, a rank above
// max_lora_rank, a module or tensor the engine does not apply, a shape that is
// not the model's, and models with experts.
//
// Thread-safe: names and fingerprints may be looked up from any thread;
// Add() and Remove() run on the engine thread, between steps, which alone
// reads the stacks.
#ifndef TANDEM_COMMON_MODEL_LORA_H_
#define TANDEM_COMMON_MODEL_LORA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/base/mutex.h"
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

// One adapter read from its directory and laid out for a LoraSet's slots
// (bf16 rows of every stack), made off the engine thread (LoraSet::Prepare).
class LoraImage {
 public:
  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  friend class LoraSet;
  std::string name_;
  int rank_ = 0;
  uint64_t fingerprint_ = 0;
  // Per stack in the set's order (layer by layer: qkv, o, gate_up, down),
  // its slot's a rows [R, in] and bt rows [R, out], and the adapter's rank on
  // each module of the stack (0: not targeted); empty where the set has no
  // stack.
  std::vector<std::vector<uint16_t>> a_, bt_;
  std::vector<std::vector<int32_t>> ranks_;
};

// An adapter's slot and fingerprint, as one lookup found them.
struct LoraRef {
  int slot = 0;  // 0: the base model
  uint64_t fingerprint = 0;
};

class LoraSet {
 public:
  // Reads every adapter of `modules` for `config`'s model onto `device`;
  // `runtime_slots` > 0 allocates that many slots for adapters loaded at run
  // time too (at least one per module).
  static absl::StatusOr<std::unique_ptr<LoraSet>> Load(const LlamaConfig& config, Device* device,
                                                       const std::vector<LoraModuleSpec>& modules,
                                                       int max_lora_rank, int runtime_slots = 0);

  // Slots: the graphs' adapters dimension (0: no adapters, no LoRA graphs).
  int capacity() const { return capacity_; }
  // Whether adapters may be loaded and unloaded at run time.
  bool updatable() const { return updatable_; }
  int max_lora_rank() const { return max_rank_; }
  // The adapters requests may name, in slot order (draining ones left out).
  std::vector<std::string> names() const;
  // Adapter `name`'s slot (>= 1) and fingerprint; {0, 0} for the empty name
  // (the base model); NOT_FOUND for a name not loaded, naming those that are.
  absl::StatusOr<LoraRef> Find(absl::string_view name) const;
  // A hash of adapter `slot`'s rank, scale and weights (0 for slot 0): the
  // prefix cache's root for its requests, and what both workers of a pair
  // compare before KV computed with it is used. A draining slot keeps its.
  uint64_t Fingerprint(int slot) const;
  // The name of the adapter in `slot`, draining or not ("" if free).
  std::string SlotName(int slot) const;

  // Runtime updating. Reads the adapter at `spec` for this set's slots (any
  // thread): FAILED_PRECONDITION when the set is not updatable, the loading
  // errors of start-up otherwise.
  absl::StatusOr<std::unique_ptr<LoraImage>> Prepare(const LoraModuleSpec& spec) const;
  // Writes `image` into a free slot (a draining one only when `in_use` says
  // no request holds it) and makes its name known; returns the slot.
  // ALREADY_EXISTS for a name loaded, RESOURCE_EXHAUSTED when every slot
  // holds an adapter. Engine thread, between steps.
  absl::StatusOr<int> Add(const LoraImage& image, absl::FunctionRef<bool(int slot)> in_use);
  // Forgets `name` for new requests; its slot drains. NOT_FOUND if not loaded.
  absl::Status Remove(absl::string_view name);

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
  struct Slot {
    std::string name;  // "" when free
    uint64_t fingerprint = 0;
    bool draining = false;  // unloaded, maybe still held by requests
  };
  LoraSet() = default;
  // Every stack, in LoraImage's order.
  std::vector<const LoraStack*> Stacks() const;
  absl::Status Write(int slot, const LoraImage& image);
  // The loaded names (draining ones left out), in slot order.
  std::vector<std::string> LoadedNamesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  LlamaConfig config_;
  Device* device_ = nullptr;
  bool updatable_ = false;
  int capacity_ = 0;
  int max_rank_ = 0;
  int64_t max_stack_rank_ = 0;
  std::unique_ptr<Arena> arena_;
  std::vector<Layer> layers_;
  // Per stack (Stacks()' order): [S, modules] ranks, the stacks' slot_ranks.
  std::vector<std::vector<int32_t>> slot_ranks_;
  mutable Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_LORA_H_
