// LlamaConfig: the architecture of a Llama-family decoder, read from a
// Hugging Face config.json or taken from a synthetic preset.
#ifndef TANDEM_COMMON_MODEL_LLAMA_CONFIG_H_
#define TANDEM_COMMON_MODEL_LLAMA_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// Rotary embeddings' scaling for a longer context than the model was
// trained on, as transformers computes it: "llama3" (Llama 3.1+), "linear"
// (positions divided by `factor`) or "yarn" (Qwen2.5/Qwen3's long-context
// setting: each frequency between its interpolated and original value by
// the beta_fast / beta_slow ramp, and the attention scores scaled by
// attention_factor squared, which is transformers' cos and sin times
// attention_factor).
struct RopeScaling {
  std::string type;  // "" (none), "llama3", "linear" or "yarn"
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, yarn
  double beta_fast = 32.0, beta_slow = 1.0;         // yarn
  // yarn: 0 = from factor (0.1 ln(factor) + 1, or with mscale and
  // mscale_all_dim their ratio, as transformers).
  double attention_factor = 0.0;
  double mscale = 0.0, mscale_all_dim = 0.0;
  bool truncate = true;  // yarn: the ramp's ends rounded outwards
};

// How a family with experts names them in a Hugging Face checkpoint
// (model.layers.N.<block>.experts.J.<gate|up|down>.weight, the router
// <block>.gate.weight), whether its router renormalizes the chosen experts'
// scores when config.json does not say (norm_topk_prob), and whether they
// are intermediate_size wide (Mixtral) or say moe_intermediate_size (Qwen).
struct ExpertsSpec {
  const char* block;  // "mlp" (Qwen) or "block_sparse_moe" (Mixtral)
  const char* gate;
  const char* up;
  const char* down;
  bool renormalize;
  bool intermediate_size_wide;
};

// The Hugging Face name, after "model.layers.N.", of expert `expert`'s gate
// (matrix 0), up (1) or down (2) under `spec`'s names, and of the router.
std::string ExpertTensorSuffix(const ExpertsSpec& spec, int64_t expert, int matrix);
std::string RouterTensorSuffix(const ExpertsSpec& spec);
// The expert and matrix a layer tensor's suffix names under any family's
// names ("mlp.experts.3.up_proj.weight": 3, 1); false when it names none.
bool ParseExpertTensorSuffix(absl::string_view suffix, int* expert, int* matrix);
// The names of a file's experts where its family has none (Qwen's): they
// then fail the check that every tensor is one the engine uses.
const ExpertsSpec& DefaultExpertsSpec();

// A decoder family: the parts in which it differs from Llama. One table
// (llama_config.cc) maps the Hugging Face and GGUF architecture names to it;
// a model of any other family is refused by name.
struct ModelFamily {
  const char* hf_architecture;    // config.json "architectures", e.g. Qwen2ForCausalLM
  const char* model_type;         // config.json "model_type"
  const char* gguf_architecture;  // GGUF general.architecture
  bool qkv_bias;                  // q/k/v projections add a bias (Qwen2)
  bool qk_norm;                   // RMSNorm over each q and k head before RoPE (Qwen3)
  // llama.cpp's converter permutes q/k rows for its interleaved rope (Llama
  // and Mistral); families it runs with NeoX rope are stored as they are.
  bool gguf_qk_permuted;
  // Sparse layers of experts (LlamaConfig::num_experts) and their names;
  // null for a dense family.
  const ExpertsSpec* experts;
};

// The family of a Hugging Face architecture / a GGUF general.architecture
// (with experts or without: llama.cpp writes Mixtral as a "llama" file with
// experts); null when the table has none.
const ModelFamily* FindHfFamily(absl::string_view hf_architecture);
const ModelFamily* FindGgufFamily(absl::string_view gguf_architecture, bool experts = false);
// "LlamaForCausalLM, MistralForCausalLM, ..." / "llama, qwen2, ..." for messages;
// the families with experts alone when `experts_only`.
std::string SupportedHfArchitectures(bool experts_only = false);
std::string SupportedGgufArchitectures(bool experts_only = false);

struct LlamaConfig {
  std::string name;  // preset name or model_type; part of the fingerprint
  const ModelFamily* family = FindHfFamily("LlamaForCausalLM");  // never null
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  std::vector<int32_t> eos_token_ids;
  std::string torch_dtype = "float32";  // storage dtype of the checkpoint
  // Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE; 0 experts: a dense MLP in
  // every layer). A sparse layer routes each token to its
  // num_experts_per_tok experts of the softmax over a router (renormalized
  // when norm_topk_prob) and sums their SwiGLU MLPs (moe_intermediate_size)
  // weighted by those scores, plus, where shared_expert_intermediate_size is
  // set (Qwen2-MoE), a shared SwiGLU MLP of that width that every token
  // takes, weighted by the sigmoid of its own one-row gate.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = false;
  int decoder_sparse_step = 1;       // layer i is sparse when (i + 1) % step == 0
  std::vector<int> mlp_only_layers;  // ...and not listed here

  // Sliding-window attention, per layer: the number of keys a query of that
  // layer sees (itself included), 0 for full attention; empty: full
  // attention in every layer. From config.json's layer_types, Qwen2/Qwen3's
  // use_sliding_window with max_window_layers, or Mistral/Mixtral's
  // sliding_window, as transformers reads them.
  std::vector<int> layer_windows;

  bool IsSparseLayer(int layer) const;
  int LayerWindow(int layer) const {
    return layer < static_cast<int>(layer_windows.size()) ? layer_windows[layer] : 0;
  }
  int64_t qkv_size() const {
    return static_cast<int64_t>(num_attention_heads + 2 * num_key_value_heads) * head_dim;
  }
  // A stable 64-bit hash of the architecture (FNV-1a over the fields that
  // decide the KV layout and the weights' shapes); equal on every machine.
  uint64_t Fingerprint() const;
  // Validates the fields; INVALID_ARGUMENT names the field and its value.
  absl::Status Validate() const;
  // max_model_len when none is configured: the model's context, at most 8192
  // (vLLM takes the model's; the cap keeps a CPU cache of a long-context
  // model within reason).
  int DefaultMaxModelLen() const {
    const int64_t context = MaxContext();
    return static_cast<int>(context < 8192 ? context : 8192);
  }
  // The longest sequence the model serves: max_position_embeddings, or with
  // linear scaling that times the factor and with yarn the original context
  // times the factor (as vLLM derives max_model_len).
  int64_t MaxContext() const;
  // Rotary scaling's factor on the attention scores' scale (yarn's
  // attention_factor squared; 1 otherwise), and the scores' scale.
  double RopeScoreFactor() const;
  float AttentionScale() const;
};

// vLLM's --rope-scaling (Qwen's model cards give it for contexts past the
// trained one): a JSON object as config.json's rope_scaling (rope_type,
// factor, original_max_position_embeddings, ...; rope_theta too) that
// replaces the model's, from config.json or a GGUF alike.
absl::Status ApplyRopeScalingOverride(absl::string_view json_text, LlamaConfig* config);

// Parses a Hugging Face config.json (rope_theta / rope_scaling, or the newer
// rope_parameters). INVALID_ARGUMENT names the file and the missing field, or
// the field and value of anything the engine does not implement: an
// architecture the family table lacks, hidden_act other than silu, biases
// other than Qwen2's q/k/v ones, layer types other than full and sliding attention, experts outside
// the Mixtral, Qwen2-MoE and Qwen3-MoE families, logit soft-capping, partial rotary embeddings,
// unknown rope scaling.
absl::StatusOr<LlamaConfig> ParseLlamaConfig(absl::string_view json_text,
                                             absl::string_view source_name);

// Applies a Hugging Face generation_config.json: its eos_token_id (an id or a
// list) replaces the config's, as transformers' generate() does.
// INVALID_ARGUMENT names the file when it is not a JSON object.
absl::Status ApplyGenerationConfig(absl::string_view json_text, absl::string_view source_name,
                                   LlamaConfig* config);

// Llama inverse RoPE frequencies, head_dim / 2 of them, with llama3 scaling
// applied when configured (as transformers' _compute_llama3_parameters).
std::vector<float> RopeInverseFrequencies(const LlamaConfig& config);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_LLAMA_CONFIG_H_
