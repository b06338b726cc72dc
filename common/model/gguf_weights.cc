#include "common/model/gguf_weights.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// Per-layer tensor names: GGUF suffix after "blk.N." and HF suffix after
// "model.layers.N.".
constexpr std::pair<const char*, const char*> kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},  // the experts' router (Qwen)
    {"ffn_gate_inp.weight", "block_sparse_moe.gate.weight"},  // (Mixtral)
    {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
    {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"},  // [H]; HF [1, H]
};
// Experts: GGUF stacks every expert's matrix of a layer in one tensor
// [experts, rows, cols] (files written before 2024-04 hold one tensor an
// expert, "ffn_gate.J.weight"); Hugging Face names each (ExpertTensorSuffix).
// By matrix: gate, up, down.
struct ExpertTensor {
  const char* stacked;  // GGUF suffix after "blk.N."
  const char* legacy;   // GGUF "blk.N.<legacy>.J.weight"
};
constexpr ExpertTensor kExpertTensors[] = {
    {"ffn_gate_exps.weight", "ffn_gate"},
    {"ffn_up_exps.weight", "ffn_up"},
    {"ffn_down_exps.weight", "ffn_down"},
};
constexpr std::pair<const char*, const char*> kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"rope_freqs.weight", "rope_freqs"},
};

std::string ShapeText(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

// Inverse of llama.cpp's permute(): rows of each head go from
// [half, 2] (interleaved) back to [2, half] (rotate_half layout).
void UnpermuteRows(char* w, int64_t rows, size_t row_bytes, int heads) {
  const int64_t head_dim = rows / heads, half = head_dim / 2;
  // Fewer rows than heads (a tensor whose shape the caller did not check
  // against the config): nothing to move, and no empty buffer to copy from.
  if (head_dim == 0 || row_bytes == 0) return;
  std::vector<char> tmp(head_dim * row_bytes);
  for (int h = 0; h < heads; ++h) {
    char* base = w + h * head_dim * row_bytes;
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t k = 0; k < 2; ++k) {
        std::memcpy(&tmp[(k * half + i) * row_bytes], base + (i * 2 + k) * row_bytes, row_bytes);
      }
    }
    std::memcpy(base, tmp.data(), tmp.size());
  }
}

}  // namespace

bool IsGgufSpec(const std::string& spec) { return absl::EndsWith(spec, ".gguf"); }

absl::StatusOr<LlamaConfig> LlamaConfigFromGguf(const GgufFile& f) {
  const std::string& path = f.path();
  ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
  const std::string experts_key = absl::StrCat(arch, ".expert_count");
  const GgufValue* experts = f.Find(experts_key);
  const bool has_experts = experts != nullptr && experts->i > 0;
  const ModelFamily* family = FindGgufFamily(arch, has_experts);
  if (family == nullptr && FindGgufFamily(arch, !has_experts) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": general.architecture is '", arch,
                                                   "'; the engine implements ",
                                                   SupportedGgufArchitectures()));
  }
  if (family == nullptr && has_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", experts_key, " ", experts->i, ": experts are implemented for ",
        SupportedGgufArchitectures(true), " only"));
  }
  if (family == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", experts_key, " is missing"));
  }
  LlamaConfig c;
  c.name = family->model_type;
  c.family = family;
  // Every architecture's keys are prefixed with its name: llama.block_count,
  // qwen2.block_count, ...
  auto key = [&](absl::string_view k) { return absl::StrCat(arch, ".", k); };
  auto get_int = [&](absl::string_view k, auto* dst) -> absl::Status {
    ASSIGN_OR_RETURN(int64_t v, f.GetInt(key(k)));
    *dst = static_cast<std::remove_pointer_t<decltype(dst)>>(v);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(get_int("embedding_length", &c.hidden_size));
  if (has_experts && !f.Find(key("feed_forward_length"))) {
    // No dense layer to size: the experts' width stands in.
    RETURN_IF_ERROR(get_int("expert_feed_forward_length", &c.intermediate_size));
  } else {
    RETURN_IF_ERROR(get_int("feed_forward_length", &c.intermediate_size));
  }
  RETURN_IF_ERROR(get_int("block_count", &c.num_hidden_layers));
  RETURN_IF_ERROR(get_int("attention.head_count", &c.num_attention_heads));
  c.num_key_value_heads = c.num_attention_heads;
  if (f.Find(key("attention.head_count_kv"))) {
    RETURN_IF_ERROR(get_int("attention.head_count_kv", &c.num_key_value_heads));
  }
  RETURN_IF_ERROR(get_int("context_length", &c.max_position_embeddings));
  c.head_dim = c.num_attention_heads > 0 ? static_cast<int>(c.hidden_size / c.num_attention_heads) : 0;
  if (f.Find(key("attention.key_length"))) {
    RETURN_IF_ERROR(get_int("attention.key_length", &c.head_dim));
  }
  if (const GgufValue* v = f.Find(key("attention.value_length")); v && v->i != c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", key("attention.value_length"), " ", v->i, " differs from the key length ",
        c.head_dim, "; the engine needs them equal"));
  }
  if (const GgufValue* v = f.Find(key("rope.dimension_count")); v && v->i != c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", key("rope.dimension_count"), " ", v->i, " is not the head dim ", c.head_dim,
        "; partial rotary embeddings are not implemented"));
  }
  ASSIGN_OR_RETURN(c.rms_norm_eps, f.GetFloat(key("attention.layer_norm_rms_epsilon")));
  if (f.Find(key("rope.freq_base"))) {
    ASSIGN_OR_RETURN(c.rope_theta, f.GetFloat(key("rope.freq_base")));
  }
  // Rope scaling as llama.cpp's converter writes it: linear and yarn as
  // keys (llama3's as rope_freqs.weight, read with the weights).
  if (const GgufValue* v = f.Find(key("rope.scaling.type")); v && v->s != "none") {
    if (v->s != "linear" && v->s != "yarn") {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ", key("rope.scaling.type"), " '", v->s,
          "' is not implemented (none, linear, yarn, or llama3 scaling through rope_freqs.weight)"));
    }
    RopeScaling& s = c.rope_scaling;
    s.type = v->s;
    ASSIGN_OR_RETURN(s.factor, f.GetFloat(key("rope.scaling.factor")));
    if (s.type == "yarn") {
      ASSIGN_OR_RETURN(s.original_max_position_embeddings, f.GetInt(key("rope.scaling.original_context_length")));
      for (auto [name, dst] : {std::pair<const char*, double*>{"rope.scaling.yarn_beta_fast", &s.beta_fast},
                               {"rope.scaling.yarn_beta_slow", &s.beta_slow},
                               {"rope.scaling.yarn_attn_factor", &s.attention_factor}}) {
        if (f.Find(key(name))) {
          ASSIGN_OR_RETURN(*dst, f.GetFloat(key(name)));
        }
      }
      for (const char* name : {"rope.scaling.yarn_ext_factor", "rope.scaling.yarn_log_multiplier"}) {
        if (const GgufValue* x = f.Find(key(name)); x != nullptr && x->f != (absl::EndsWith(name, "ext_factor") ? 1.0 : 0.0)) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": ", key(name), " ", x->f, " is not implemented"));
        }
      }
    }
    if (s.type == "linear" && s.factor == 1.0) s.type.clear();
  }
  if (has_experts) {
    RETURN_IF_ERROR(get_int("expert_count", &c.num_experts));
    RETURN_IF_ERROR(get_int("expert_used_count", &c.num_experts_per_tok));
    // Mixtral's ("llama" with experts) are feed_forward_length wide.
    c.moe_intermediate_size = c.intermediate_size;
    if (f.Find(key("expert_feed_forward_length"))) {
      RETURN_IF_ERROR(get_int("expert_feed_forward_length", &c.moe_intermediate_size));
    }
    if (f.Find(key("expert_shared_feed_forward_length"))) {
      RETURN_IF_ERROR(
          get_int("expert_shared_feed_forward_length", &c.shared_expert_intermediate_size));
    }
    // llama.cpp renormalizes the chosen experts' scores for qwen3moe (as
    // Qwen3-MoE's checkpoints set norm_topk_prob) and llama (Mixtral's
    // router), not for qwen2moe (nor do Qwen2-MoE's); a file may say
    // otherwise.
    c.norm_topk_prob = arch != "qwen2moe";
    if (f.Find(key("expert_weights_norm"))) {
      ASSIGN_OR_RETURN(c.norm_topk_prob, f.GetBool(key("expert_weights_norm")));
    }
  }
  if (const GgufValue* v = f.Find(key("attention.sliding_window")); v && v->i > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", key("attention.sliding_window"), " ", v->i,
        ": sliding-window attention is not implemented"));
  }
  const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no 2-d token_embd.weight tensor"));
  }
  c.vocab_size = embd->dims[1];
  if (const GgufValue* v = f.Find(key("vocab_size")); v && v->i != c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", key("vocab_size"), " ", v->i,
                                                   " differs from token_embd.weight's ",
                                                   c.vocab_size, " rows"));
  }
  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  if (f.Find("tokenizer.ggml.eos_token_id")) {
    ASSIGN_OR_RETURN(int64_t eos, f.GetInt("tokenizer.ggml.eos_token_id"));
    c.eos_token_ids.push_back(static_cast<int32_t>(eos));
  }
  if (f.Find("tokenizer.ggml.eot_token_id")) {
    ASSIGN_OR_RETURN(int64_t eot, f.GetInt("tokenizer.ggml.eot_token_id"));
    if (c.eos_token_ids.empty() || c.eos_token_ids[0] != eot) {
      c.eos_token_ids.push_back(static_cast<int32_t>(eot));
    }
  }
  if (auto s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return c;
}

std::string GgufWeights::GgufName(const std::string& hf, int* expert) {
  if (expert != nullptr) *expert = -1;
  for (const auto& [g, h] : kGlobalNames) {
    if (hf == h) return g;
  }
  constexpr absl::string_view kPrefix = "model.layers.";
  if (!absl::StartsWith(hf, kPrefix)) return "";
  std::vector<std::string> parts = absl::StrSplit(hf.substr(kPrefix.size()), absl::MaxSplits('.', 1));
  if (parts.size() != 2) return "";
  for (const auto& [g, h] : kLayerNames) {
    if (parts[1] == h) return absl::StrCat("blk.", parts[0], ".", g);
  }
  int j = 0, matrix = 0;
  if (!ParseExpertTensorSuffix(parts[1], &j, &matrix)) return "";
  if (expert != nullptr) *expert = j;
  return absl::StrCat("blk.", parts[0], ".", kExpertTensors[matrix].stacked);
}

std::string GgufWeights::HfName(const std::string& gguf) {
  for (const auto& [g, h] : kGlobalNames) {
    if (gguf == g) return h;
  }
  if (!absl::StartsWith(gguf, "blk.")) return gguf;
  std::vector<std::string> parts = absl::StrSplit(gguf.substr(4), absl::MaxSplits('.', 1));
  int layer = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &layer)) return gguf;
  for (const auto& [g, h] : kLayerNames) {
    if (parts[1] == g) return absl::StrCat("model.layers.", parts[0], ".", h);
  }
  return gguf;
}

const GgufTensorInfo* GgufWeights::Resolve(const std::string& name, int* expert) const {
  const std::string g = GgufName(name, expert);
  if (g.empty()) return nullptr;
  if (const GgufTensorInfo* t = file_->FindTensor(g); t != nullptr || *expert < 0) return t;
  // One tensor an expert (older files): "blk.N.ffn_gate.J.weight".
  for (const ExpertTensor& e : kExpertTensors) {
    if (!absl::EndsWith(g, e.stacked)) continue;
    const std::string legacy = absl::StrCat(g.substr(0, g.size() - strlen(e.stacked)), e.legacy,
                                            ".", *expert, ".weight");
    const GgufTensorInfo* t = file_->FindTensor(legacy);
    if (t != nullptr) *expert = -1;  // a whole tensor
    return t;
  }
  return nullptr;
}

bool GgufWeights::Has(const std::string& name) const {
  int expert = -1;
  const GgufTensorInfo* t = Resolve(name, &expert);
  return t != nullptr && (expert < 0 || (t->dims.size() == 3 && expert < t->dims[2]));
}

std::vector<std::string> GgufWeights::TensorNames() const {
  // Experts by the family's names.
  const ExpertsSpec& x =
      config_.family->experts ? *config_.family->experts : DefaultExpertsSpec();
  auto expert_name = [&](absl::string_view layer, int64_t j, int matrix) {
    return absl::StrCat("model.layers.", layer, ".", ExpertTensorSuffix(x, j, matrix));
  };
  std::vector<std::string> names;
  for (const GgufTensorInfo& t : file_->tensors()) {
    std::vector<std::string> parts = absl::StrSplit(t.name, absl::MaxSplits('.', 2));
    int layer = 0, j = 0;
    bool named = false;
    if (parts.size() == 3 && parts[0] == "blk" && absl::SimpleAtoi(parts[1], &layer)) {
      for (int matrix = 0; matrix < 3; ++matrix) {
        const ExpertTensor& e = kExpertTensors[matrix];
        if (parts[2] == e.stacked && t.dims.size() == 3) {
          // Experts past the config's count are listed up to one (the
          // unused-tensor check names it): a file of empty slices may claim
          // any count.
          const int64_t listed = std::min<int64_t>(t.dims[2], int64_t{config_.num_experts} + 1);
          for (int64_t k = 0; k < listed; ++k) names.push_back(expert_name(parts[1], k, matrix));
          named = true;
        }
        std::vector<std::string> legacy = absl::StrSplit(parts[2], '.');
        if (legacy.size() == 3 && legacy[0] == e.legacy && legacy[2] == "weight" &&
            absl::SimpleAtoi(legacy[1], &j)) {
          names.push_back(expert_name(parts[1], j, matrix));
          named = true;
        }
      }
      if (parts[2] == "ffn_gate_inp.weight") {
        names.push_back(absl::StrCat("model.layers.", parts[1], ".", RouterTensorSuffix(x)));
        named = true;
      }
    }
    if (!named) names.push_back(HfName(t.name));
  }
  return names;
}

absl::StatusOr<GgufWeights::View> GgufWeights::Find(const std::string& name,
                                                   const std::vector<int64_t>& shape) const {
  int expert = -1;
  const GgufTensorInfo* t = Resolve(name, &expert);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("tensor '", name, "' (GGUF '", GgufName(name),
                                            "') is missing from ", file_->path()));
  }
  // GGUF lists dims fastest first: [in, out] for a [out, in] matrix, [in,
  // out, experts] for stacked experts.
  const std::vector<int64_t> hf_shape(t->dims.rbegin(), t->dims.rend());
  std::vector<int64_t> want = shape;
  if (expert >= 0) want.insert(want.begin(), hf_shape.empty() ? 0 : hf_shape[0]);
  // A [1, H] matrix (Qwen2-MoE's shared expert gate) is stored as a vector.
  if (want.size() == hf_shape.size() + 1 && want[0] == 1) want.erase(want.begin());
  if (hf_shape != want || (expert >= 0 && expert >= hf_shape[0])) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t->name, "' in ", file_->path(), " has shape ", ShapeText(hf_shape),
        ", expected ", ShapeText(expert >= 0 ? want : shape),
        expert >= 0 ? absl::StrCat(" (expert ", expert, " of '", name, "')") : ""));
  }
  RETURN_IF_ERROR(file_->CheckDecodable(*t));
  View v{t, file_->TensorData(*t), t->numel()};
  if (expert >= 0) {  // whole blocks a slice (the type's rows are whole blocks)
    int64_t elems = 0, bytes = 0;
    GgmlBlockLayout(t->type, &elems, &bytes);
    v.numel = t->numel() / hf_shape[0];
    v.data += expert * (v.numel / elems) * bytes;
  }
  return v;
}

void GgufWeights::UnpermuteIfQk(const std::string& g, char* rows, int64_t num_rows,
                                size_t row_bytes) const {
  if (!config_.family->gguf_qk_permuted) return;
  if (absl::EndsWith(g, ".attn_q.weight")) {
    UnpermuteRows(rows, num_rows, row_bytes, config_.num_attention_heads);
  } else if (absl::EndsWith(g, ".attn_k.weight")) {
    UnpermuteRows(rows, num_rows, row_bytes, config_.num_key_value_heads);
  }
}

void GgufWeights::ForRows(const View& v, int64_t rows, size_t out_row_bytes,
                          const std::function<void(const uint8_t*, int64_t, size_t)>& fn) const {
  int64_t block_elems = 1, block_bytes = 0;
  TANDEM_CHECK(GgmlBlockLayout(v.tensor->type, &block_elems, &block_bytes));
  const int64_t cols = v.numel / rows;
  const size_t src_row_bytes = static_cast<size_t>(cols / block_elems * block_bytes);
  ForRanges(rows, MinRowsPerRange(out_row_bytes), [&](int64_t begin, int64_t end) {
    fn(v.data + begin * src_row_bytes, (end - begin) * cols, begin * out_row_bytes);
  });
}

absl::Status GgufWeights::ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                                  float* dst) const {
  ASSIGN_OR_RETURN(const View v, Find(name, shape));
  const GgmlType type = static_cast<GgmlType>(v.tensor->type);
  const int64_t cols = v.numel / shape[0];
  ForRows(v, shape[0], sizeof(float) * cols, [&](const uint8_t* src, int64_t n, size_t at) {
    DequantizeGgml(type, src, dst + at / sizeof(float), n);
  });
  UnpermuteIfQk(v.tensor->name, reinterpret_cast<char*>(dst), shape[0],
                sizeof(float) * (shape.size() == 2 ? shape[1] : 1));
  return absl::OkStatus();
}

std::optional<DType> GgufWeights::BlockType(const std::string& name) const {
  int expert = -1;
  const GgufTensorInfo* t = Resolve(name, &expert);
  if (t == nullptr) return std::nullopt;
  return KeptBlockType(static_cast<GgmlType>(t->type));
}

absl::Status GgufWeights::ReadBlocks(const std::string& name, const std::vector<int64_t>& shape,
                                     void* dst) const {
  ASSIGN_OR_RETURN(const View v, Find(name, shape));
  const GgufTensorInfo* t = v.tensor;
  const std::optional<DType> dt = KeptBlockType(static_cast<GgmlType>(t->type));
  if (!dt.has_value() || shape.size() != 2 || shape[1] % kBlockElems != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t->name, "' in ", file_->path(), " is ", GgmlTypeName(t->type),
        ", not rows of whole blocks of a type the kernels multiply (or keep as Q8_0)"));
  }
  ForRows(v, shape[0], DTypeBytes(*dt, shape[1]), [&](const uint8_t* src, int64_t n, size_t at) {
    ToKeptBlocks(static_cast<GgmlType>(t->type), src, n, static_cast<char*>(dst) + at);
  });
  UnpermuteIfQk(t->name, static_cast<char*>(dst), shape[0], DTypeBytes(*dt, shape[1]));
  return absl::OkStatus();
}

}  // namespace tandem
