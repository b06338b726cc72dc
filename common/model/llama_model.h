// LlamaModel: a Llama-shaped decoder (RMSNorm, RoPE, grouped-query attention,
// SwiGLU MLP, tied or separate LM head) with the parts its family adds
// (ModelFamily: Qwen2's q/k/v biases, Qwen3's per-head q/k norms, Qwen3-MoE's
// sparse layers, whose MLP is a routed mixture of experts), whose
// forward is a list of pieces split at attention:
//
//   piece 0        embed, input norm of layer 0, qkv projection (+ bias,
//                  + q/k head norms), rope
//   attention 0    paged attention of layer 0 (KV write + attention)
//   piece i        o_proj of layer i-1, residual + post norm, MLP, residual +
//                  input norm of layer i, qkv projection, rope
//   attention i    ...
//   piece L        o_proj of layer L-1, residual + post norm, MLP, residual +
//                  final norm
//
// so a PIECEWISE graph can capture each piece and leave attention eager, and
// a FULL graph can capture the whole list. Pieces and attention only issue
// ops on buffers the caller owns (ForwardBuffers): the model holds weights
// and nothing per step.
//
// Weights come from a Hugging Face directory (config.json + safetensors) or
// from a built-in synthetic preset: "synthetic" (tiny), "synthetic:smollm2-135m",
// "synthetic:llama-3.2-1b". A preset gives the same weights in every process
// on every machine (counter-based generator seeded by preset and tensor name).
//
// Immutable after Load(); used by the engine thread.
#ifndef TANDEM_COMMON_MODEL_LLAMA_MODEL_H_
#define TANDEM_COMMON_MODEL_LLAMA_MODEL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/device.h"
#include "common/kernels/ops.h"
#include "common/model/llama_config.h"

namespace tandem {

class LoraSet;
class WeightSource;

// The runner's persistent activation and input buffers, sized for the
// largest step (max_num_batched_tokens rows). Activations are in the
// backend's dtype (Ops::dtype()).
struct ForwardBuffers {
  Tensor input_ids;   // i32[T]
  Tensor positions;   // i32[T]
  AttentionMetadata meta;
  Tensor hidden;      // [T, H]   projection outputs
  Tensor residual;    // [T, H]
  Tensor normed;      // [T, H]   norm outputs; after the last piece: final hidden
  Tensor qkv;         // [T, qkv_size]
  Tensor attn_out;    // [T, heads * head_dim]
  Tensor gate_up;     // [T, 2 * I]
  Tensor mlp_act;     // [T, I]
  MoeBuffers moe;     // sparse layers' scratch (models with experts only)
  // LoRA adapters, when loaded (null otherwise): each row's adapter slot
  // (0: the base model, and padding), the ops' scratch, and whether the
  // pieces issue the LoRA ops (set per step by the runner: the step's
  // descriptor has has_lora, or an eager step has a row with an adapter).
  const LoraSet* lora = nullptr;
  Tensor lora_slots;    // i32[T]
  Tensor lora_scratch;  // f32[T, LoraSet::max_stack_rank()]
  bool lora_active = false;
};

// The known synthetic presets and their configs.
absl::StatusOr<LlamaConfig> SyntheticConfig(const std::string& spec);
bool IsSyntheticSpec(const std::string& spec);

class LlamaModel {
 public:
  // `spec`: a synthetic preset name or a directory with config.json and
  // safetensors. Errors name the file and the tensor at fault.
  // `rope_scaling`: JSON replacing the model's rope scaling
  // (ApplyRopeScalingOverride); empty: the model's own.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& spec, Ops* ops,
                                                          const std::string& rope_scaling = "");

  const LlamaConfig& config() const { return config_; }
  const std::string& spec() const { return spec_; }
  int num_layers() const { return config_.num_hidden_layers; }
  int num_pieces() const { return config_.num_hidden_layers + 1; }
  AttentionShape attention_shape() const;

  // Issues piece `piece` (0..num_pieces()-1) for the first `n` rows.
  void IssuePiece(int piece, int64_t n, const ForwardBuffers& b) const;
  // Issues layer `layer`'s paged attention for the first `n` rows.
  void IssueAttention(int layer, int64_t n, const ForwardBuffers& b, const KvLayer& kv) const;
  // logits[rows, V] = lm_head(hidden[indices[i]]) for i < rows.
  void IssueLogits(const Tensor& hidden, const Tensor& indices, const Tensor& gathered,
                   const Tensor& logits) const;

  // Bytes of one KV block (all layers, K and V) for `block_size` tokens.
  size_t KvBytesPerBlock(int block_size) const;

  // The weights every decode step reads in full: each layer's, the final
  // norm and the lm_head (embedding rows are gathered, not streamed), as
  // tensors of the model's arena. `tandem bench step` times reading them.
  std::vector<Tensor> StreamedWeights() const;
  // What one token's experts add to that: each sparse layer's first top_k
  // experts' rows (gate_up and down), as many bytes as a token routed
  // anywhere reads. Empty for a dense model.
  std::vector<Tensor> RoutedExpertsOfOneToken() const;
  // The matmul weights' dtypes and how many tensors each, e.g. "q4_1 x210,
  // q8_0 x1" (logs and benchmarks).
  std::string WeightDTypes() const;

 private:
  struct Layer {
    Tensor input_norm, qkv, o, post_norm, gate_up, down;  // gate_up, down: dense layers
    Tensor qkv_bias;        // [qkv_size] when the family has q/k/v biases
    Tensor q_norm, k_norm;  // [head_dim] when it norms each q/k head
    MoeWeights moe;         // sparse layers (config().IsSparseLayer)
  };
  // Every matmul weight, the experts' included.
  std::vector<Tensor> MatmulWeights() const;
  LlamaModel() = default;
  // Measures the weight tensors' bytes, then allocates exactly that arena.
  absl::Status AllocateWeights(Device* device, const WeightSource* source);
  // Places every weight tensor in `arena` (a measuring or a real one).
  absl::Status PlaceWeights(Arena* arena, const WeightSource* source);

  std::string spec_;
  LlamaConfig config_;
  Ops* ops_ = nullptr;
  std::unique_ptr<Arena> arena_;
  Tensor embed_, final_norm_, lm_head_, inv_freq_;
  float attention_scale_ = 1.f;  // config_.AttentionScale(), once the config is final
  std::vector<Layer> layers_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_LLAMA_MODEL_H_
