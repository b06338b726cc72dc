#include "common/model/llama_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "common/base/fnv1a.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

// Qwen-MoE checkpoints say norm_topk_prob (transformers' default: false);
// Mixtral's router always renormalizes.
constexpr ExpertsSpec kQwenExperts{"mlp", "gate_proj", "up_proj", "down_proj", false, false};
constexpr ExpertsSpec kMixtralExperts{"block_sparse_moe", "w1", "w3", "w2", true, true};

constexpr ModelFamily kFamilies[] = {
    {"LlamaForCausalLM", "llama", "llama", false, false, true, nullptr},
    // Llama-shaped; llama.cpp converts it to a "llama" GGUF.
    {"MistralForCausalLM", "mistral", "llama", false, false, true, nullptr},
    {"Qwen2ForCausalLM", "qwen2", "qwen2", true, false, false, nullptr},
    {"Qwen3ForCausalLM", "qwen3", "qwen3", false, true, false, nullptr},
    // Mistral's attention, sparse layers of experts: a "llama" GGUF with experts.
    {"MixtralForCausalLM", "mixtral", "llama", false, false, true, &kMixtralExperts},
    // Qwen2's and Qwen3's attention; sparse layers of experts.
    {"Qwen2MoeForCausalLM", "qwen2_moe", "qwen2moe", true, false, false, &kQwenExperts},
    {"Qwen3MoeForCausalLM", "qwen3_moe", "qwen3moe", false, true, false, &kQwenExperts},
};

}  // namespace

std::string ExpertTensorSuffix(const ExpertsSpec& spec, int64_t expert, int matrix) {
  const char* name = matrix == 0 ? spec.gate : matrix == 1 ? spec.up : spec.down;
  return absl::StrCat(spec.block, ".experts.", expert, ".", name, ".weight");
}

std::string RouterTensorSuffix(const ExpertsSpec& spec) {
  return absl::StrCat(spec.block, ".gate.weight");
}

bool ParseExpertTensorSuffix(absl::string_view suffix, int* expert, int* matrix) {
  for (const ExpertsSpec* spec : {&kQwenExperts, &kMixtralExperts}) {
    const std::string prefix = absl::StrCat(spec->block, ".experts.");
    if (!absl::StartsWith(suffix, prefix)) continue;
    const std::vector<std::string> rest =
        absl::StrSplit(suffix.substr(prefix.size()), absl::MaxSplits('.', 1));
    int j = 0;
    if (rest.size() != 2 || !absl::SimpleAtoi(rest[0], &j) || j < 0) return false;
    for (int m = 0; m < 3; ++m) {
      if (suffix == ExpertTensorSuffix(*spec, j, m)) {
        *expert = j;
        *matrix = m;
        return true;
      }
    }
  }
  return false;
}

const ExpertsSpec& DefaultExpertsSpec() { return kQwenExperts; }

const ModelFamily* FindHfFamily(absl::string_view hf_architecture) {
  for (const ModelFamily& f : kFamilies) {
    if (hf_architecture == f.hf_architecture) return &f;
  }
  return nullptr;
}

const ModelFamily* FindGgufFamily(absl::string_view gguf_architecture, bool experts) {
  // The first of a name: llama, not mistral; mixtral for llama with experts.
  for (const ModelFamily& f : kFamilies) {
    if (gguf_architecture == f.gguf_architecture && (f.experts != nullptr) == experts) return &f;
  }
  return nullptr;
}

std::string SupportedHfArchitectures(bool experts_only) {
  std::vector<std::string> names;
  for (const ModelFamily& f : kFamilies) {
    if (f.experts || !experts_only) names.push_back(f.hf_architecture);
  }
  return absl::StrJoin(names, ", ");
}

std::string SupportedGgufArchitectures(bool experts_only) {
  std::vector<std::string> names;
  for (const ModelFamily& f : kFamilies) {
    if ((f.experts || !experts_only) &&
        std::find(names.begin(), names.end(), f.gguf_architecture) == names.end()) {
      names.push_back(f.gguf_architecture);
    }
  }
  return absl::StrJoin(names, ", ");
}

uint64_t LlamaConfig::Fingerprint() const {
  const std::string canonical = absl::StrCat(
      family->hf_architecture, "|", name, "|", vocab_size, "|", hidden_size, "|", intermediate_size, "|", num_hidden_layers,
      "|", num_attention_heads, "|", num_key_value_heads, "|", head_dim, "|", rms_norm_eps,
      "|", rope_theta, "|", rope_scaling.type, "|", rope_scaling.factor, "|",
      // yarn's own fields (absent otherwise, so earlier fingerprints hold)
      rope_scaling.type == "yarn"
          ? absl::StrCat(rope_scaling.original_max_position_embeddings, "|", rope_scaling.beta_fast, "|",
                         rope_scaling.beta_slow, "|", RopeScoreFactor(), "|", rope_scaling.truncate, "|")
          : std::string(),
      max_position_embeddings, "|", tie_word_embeddings, "|", num_experts, "|",
      num_experts_per_tok, "|", moe_intermediate_size, "|", shared_expert_intermediate_size,
      "|", norm_topk_prob, "|",
      decoder_sparse_step, "|", absl::StrJoin(mlp_only_layers, ","),
      // windows (absent without them, so earlier fingerprints hold)
      layer_windows.empty() ? std::string() : absl::StrCat("|w", absl::StrJoin(layer_windows, ",")));
  return Fnv1a64(canonical);
}

bool LlamaConfig::IsSparseLayer(int layer) const {
  return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
             mlp_only_layers.end();
}

absl::Status LlamaConfig::Validate() const {
  auto positive = [](const char* field, int64_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("config: ", field, " must be > 0, got ", v));
  };
  for (auto [f, v] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"vocab_size", vocab_size},
           {"hidden_size", hidden_size},
           {"intermediate_size", intermediate_size},
           {"num_hidden_layers", num_hidden_layers},
           {"num_attention_heads", num_attention_heads},
           {"num_key_value_heads", num_key_value_heads},
           {"head_dim", head_dim},
           {"max_position_embeddings", max_position_embeddings}}) {
    if (auto s = positive(f, v); !s.ok()) return s;
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: num_attention_heads (", num_attention_heads,
        ") must be a multiple of num_key_value_heads (", num_key_value_heads, ")"));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config: head_dim must be even, got ", head_dim));
  }
  if (num_experts > 0) {
    if (family->experts == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("config: ", family->hf_architecture,
                                                     " has no experts; num_experts is ",
                                                     num_experts));
    }
    if (num_experts_per_tok <= 0 || num_experts_per_tok > num_experts) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: num_experts_per_tok must be in 1..num_experts (", num_experts, "), got ",
          num_experts_per_tok));
    }
    if (moe_intermediate_size <= 0 || decoder_sparse_step <= 0 ||
        shared_expert_intermediate_size < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: moe_intermediate_size and decoder_sparse_step must be > 0 and "
          "shared_expert_intermediate_size >= 0, got ",
          moe_intermediate_size, ", ", decoder_sparse_step, " and ",
          shared_expert_intermediate_size));
    }
  }
  if (!layer_windows.empty() && static_cast<int>(layer_windows.size()) != num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", layer_windows.size(),
                                                   " layer windows for ", num_hidden_layers, " layers"));
  }
  for (int w : layer_windows) {
    if (w < 0) return absl::InvalidArgumentError(absl::StrCat("config: a sliding window is ", w));
  }
  const RopeScaling& s = rope_scaling;
  if (!s.type.empty() && s.type != "llama3" && s.type != "linear" && s.type != "yarn") {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: rope_scaling type '", s.type, "' is not supported (llama3, linear and yarn are)"));
  }
  if (!s.type.empty() && !(s.factor > 0 && std::isfinite(s.factor))) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: rope_scaling factor must be > 0, got ", s.factor));
  }
  if (s.type == "yarn" && !(s.beta_fast > 0 && s.beta_slow > 0 && std::isfinite(s.beta_fast) &&
                            std::isfinite(s.beta_slow) && s.attention_factor >= 0 &&
                            std::isfinite(s.attention_factor))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: rope_scaling beta_fast and beta_slow must be > 0 and attention_factor >= 0, got ",
        s.beta_fast, ", ", s.beta_slow, " and ", s.attention_factor));
  }
  if (MaxContext() > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: the context with rope scaling is ", MaxContext(), " positions; at most ", INT32_MAX));
  }
  return absl::OkStatus();
}

int64_t LlamaConfig::MaxContext() const {
  if (rope_scaling.type == "linear") {
    return static_cast<int64_t>(static_cast<double>(max_position_embeddings) * rope_scaling.factor);
  }
  if (rope_scaling.type == "yarn") {
    return static_cast<int64_t>(static_cast<double>(rope_scaling.original_max_position_embeddings) *
                                rope_scaling.factor);
  }
  return max_position_embeddings;
}

double LlamaConfig::RopeScoreFactor() const {
  const RopeScaling& s = rope_scaling;
  if (s.type != "yarn") return 1.0;
  double attention = s.attention_factor;
  if (attention == 0) {
    auto mscale = [&](double m) { return s.factor <= 1 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0; };
    attention = s.mscale != 0 && s.mscale_all_dim != 0 ? mscale(s.mscale) / mscale(s.mscale_all_dim)
                                                       : mscale(1.0);
  }
  return attention * attention;
}

float LlamaConfig::AttentionScale() const {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return rope_scaling.type == "yarn" ? static_cast<float>(scale * RopeScoreFactor()) : scale;
}

namespace {

// A rope_scaling / rope_parameters object (its type "default" is none) into
// config->rope_scaling, replacing what was there.
absl::Status ParseRopeScaling(const nlohmann::json& scaling, absl::string_view source_name,
                              LlamaConfig* config) {
  LlamaConfig& c = *config;
  std::string type = scaling.value("rope_type", scaling.value("type", std::string()));
  if (type == "default") type.clear();
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                          "attention_factor", "mscale", "mscale_all_dim", "original_max_position_embeddings"}) {
    if (scaling.contains(key) && !scaling[key].is_null() && !scaling[key].is_number()) {
      return absl::InvalidArgumentError(absl::StrCat(source_name, ": rope ", key, " must be a number, got ",
                                                     scaling[key].dump()));
    }
  }
  RopeScaling& s = c.rope_scaling;
  s = RopeScaling();
  s.type = type;
  // null is "not given" (transformers' `or` defaults).
  auto number = [&](const char* key, double otherwise) {
    return scaling.contains(key) && scaling[key].is_number() ? scaling[key].get<double>() : otherwise;
  };
  s.factor = number("factor", 1.0);
  s.low_freq_factor = number("low_freq_factor", 1.0);
  s.high_freq_factor = number("high_freq_factor", 4.0);
  s.beta_fast = number("beta_fast", 32.0);
  s.beta_slow = number("beta_slow", 1.0);
  s.attention_factor = number("attention_factor", 0.0);
  s.mscale = number("mscale", 0.0);
  s.mscale_all_dim = number("mscale_all_dim", 0.0);
  s.truncate = scaling.value("truncate", true);
  const double original = number("original_max_position_embeddings",
                                 type == "yarn" ? static_cast<double>(c.max_position_embeddings) : 8192.0);
  if (!(original >= 1 && original <= INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name, ": rope original_max_position_embeddings is ", original,
        "; a positive integer in int32's range is expected"));
  }
  s.original_max_position_embeddings = static_cast<int64_t>(original);
  return absl::OkStatus();
}

// eos_token_id: an id or a list of ids (null: none).
absl::StatusOr<std::vector<int32_t>> EosIds(const nlohmann::json& e,
                                            absl::string_view source_name) {
  std::vector<int32_t> ids;
  for (const nlohmann::json& x : e.is_array() ? e : nlohmann::json::array({e})) {
    if (x.is_null()) continue;
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_name, ": eos_token_id holds ", x.dump(), "; token ids are expected"));
    }
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return ids;
}

absl::StatusOr<LlamaConfig> ParseConfigJson(absl::string_view json_text,
                                            absl::string_view source_name) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": not a JSON object"));
  }
  // What the engine implements; anything else is refused by name.
  auto refuse = [&](const std::string& field, const std::string& value,
                    const std::string& supported) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": ", field, " is ", value,
                                                   "; the engine implements ", supported));
  };
  const ModelFamily* family = nullptr;
  if (j.contains("architectures") && j["architectures"].is_array()) {
    for (const auto& a : j["architectures"]) {
      const ModelFamily* f = a.is_string() ? FindHfFamily(a.get<std::string>()) : nullptr;
      if (f == nullptr || (family != nullptr && f != family)) {
        return refuse("architectures", a.dump(), SupportedHfArchitectures().c_str());
      }
      family = f;
    }
  }
  if (j.contains("model_type")) {
    const ModelFamily* by_type = nullptr;
    std::vector<std::string> types;
    for (const ModelFamily& f : kFamilies) {
      if (j["model_type"] == f.model_type) by_type = &f;
      types.push_back(absl::StrCat("\"", f.model_type, "\""));
    }
    if (by_type == nullptr || (family != nullptr && by_type != family)) {
      return refuse("model_type", j["model_type"].dump(),
                    family != nullptr ? absl::StrCat("\"", family->model_type, "\" for ",
                                                     family->hf_architecture)
                                      : absl::StrJoin(types, ", "));
    }
    family = by_type;
  }
  if (family == nullptr) family = FindHfFamily("LlamaForCausalLM");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    return refuse("hidden_act", j["hidden_act"].dump(), "\"silu\" (SwiGLU)");
  }
  // Qwen2 always has q/k/v biases (its config has no field for them); a
  // bias anywhere else (Llama's attention_bias also biases o_proj) is not
  // implemented.
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if (j.contains(bias) && j[bias].is_boolean() && j[bias].get<bool>()) {
      return refuse(bias, "true", "layers without biases besides Qwen2's q/k/v ones");
    }
  }
  auto is_true = [&](const char* key) {
    return j.contains(key) && j[key].is_boolean() && j[key].get<bool>();
  };
  auto is_positive = [&](const char* key) {
    return j.contains(key) && j[key].is_number() && j[key].get<double>() > 0;
  };
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    for (const auto& t : j["layer_types"]) {
      if (t != "full_attention" && t != "sliding_attention") {
        return refuse("layer_types", t.dump(), "\"full_attention\" and \"sliding_attention\"");
      }
    }
  }
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    // Qwen3-MoE's checkpoints say num_experts; transformers 5 saves it as
    // num_local_experts.
    if (is_positive(key) && !(family->experts && std::string(key) != "n_routed_experts")) {
      return refuse(key, j[key].dump(),
                    absl::StrCat("experts in ", SupportedHfArchitectures(true), " only"));
    }
  }
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (is_positive(key)) return refuse(key, j[key].dump(), "no logit soft-capping");
  }
  if (j.contains("partial_rotary_factor") && j["partial_rotary_factor"].is_number() &&
      j["partial_rotary_factor"].get<double>() != 1.0) {
    return refuse("partial_rotary_factor", j["partial_rotary_factor"].dump(), "1.0");
  }
  LlamaConfig c;
  // An integer field in int32's range (Validate() judges its value): absent
  // or null, `fallback`, or NOT_FOUND-like INVALID_ARGUMENT when required.
  // Checked here, not by get<>(), which converts a float (or a number past
  // the type) without a word.
  constexpr int64_t kRequired = INT64_MIN;
  auto integer = [&](const char* key, int64_t fallback) -> absl::StatusOr<int64_t> {
    if (!j.contains(key) || j[key].is_null()) {
      if (fallback != kRequired) return fallback;
      return absl::InvalidArgumentError(
          absl::StrCat(source_name, ": missing field '", key, "'"));
    }
    const nlohmann::json& v = j[key];
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t{INT32_MAX}
                                : v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_name, ": ", key, " is ", v.dump(), "; an integer in int32's range is expected"));
    }
    return v.get<int64_t>();
  };
  for (auto [key, dst] : std::initializer_list<std::pair<const char*, int64_t*>>{
           {"vocab_size", &c.vocab_size},
           {"hidden_size", &c.hidden_size},
           {"intermediate_size", &c.intermediate_size}}) {
    ASSIGN_OR_RETURN(*dst, integer(key, kRequired));
  }
  ASSIGN_OR_RETURN(c.num_hidden_layers, integer("num_hidden_layers", kRequired));
  ASSIGN_OR_RETURN(c.num_attention_heads, integer("num_attention_heads", kRequired));
  ASSIGN_OR_RETURN(c.num_key_value_heads,
                   integer("num_key_value_heads", c.num_attention_heads));
  // No head_dim: hidden_size over the heads (none: Validate() says so).
  ASSIGN_OR_RETURN(c.head_dim, integer("head_dim", c.num_attention_heads > 0
                                                       ? c.hidden_size / c.num_attention_heads
                                                       : 0));
  c.name = j.value("model_type", std::string("llama"));
  c.family = family;
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-5);
  ASSIGN_OR_RETURN(c.max_position_embeddings, integer("max_position_embeddings", 2048));
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) {
    c.torch_dtype = j["torch_dtype"].get<std::string>();
  } else if (j.contains("dtype") && j["dtype"].is_string()) {
    c.torch_dtype = j["dtype"].get<std::string>();
  }
  // Sliding windows, as transformers reads them: layer_types when given;
  // else Qwen2/Qwen3's use_sliding_window (layers from max_window_layers
  // on); else Mistral's and Mixtral's sliding_window, every layer.
  {
    ASSIGN_OR_RETURN(const int64_t window, integer("sliding_window", 0));
    auto need_window = [&]() -> absl::Status {
      if (window > 0) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(
          source_name, ": sliding_window is ", j.contains("sliding_window") ? j["sliding_window"].dump() : "absent",
          "; a positive window is needed for the sliding-attention layers"));
    };
    if (j.contains("layer_types") && j["layer_types"].is_array()) {
      const auto& types = j["layer_types"];
      if (static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
        return absl::InvalidArgumentError(absl::StrCat(source_name, ": layer_types has ", types.size(),
                                                       " entries for ", c.num_hidden_layers, " layers"));
      }
      bool any = false;
      for (const auto& t : types) any |= t == "sliding_attention";
      if (any) {
        RETURN_IF_ERROR(need_window());
        for (const auto& t : types) {
          c.layer_windows.push_back(t == "sliding_attention" ? static_cast<int>(window) : 0);
        }
      }
    } else if (j.contains("use_sliding_window")) {
      if (is_true("use_sliding_window")) {
        RETURN_IF_ERROR(need_window());
        ASSIGN_OR_RETURN(const int64_t first, integer("max_window_layers", c.num_hidden_layers));
        for (int i = 0; i < c.num_hidden_layers; ++i) {
          c.layer_windows.push_back(i >= first ? static_cast<int>(window) : 0);
        }
      }
    } else if ((family == FindHfFamily("MistralForCausalLM") ||
                family == FindHfFamily("MixtralForCausalLM")) &&
               window > 0) {
      c.layer_windows.assign(c.num_hidden_layers, static_cast<int>(window));
    }
    if (std::all_of(c.layer_windows.begin(), c.layer_windows.end(), [](int w) { return w == 0; })) {
      c.layer_windows.clear();
    }
  }
  if (family->experts) {
    ASSIGN_OR_RETURN(
        c.num_experts,
        integer(j.contains("num_local_experts") ? "num_local_experts" : "num_experts", kRequired));
    ASSIGN_OR_RETURN(c.num_experts_per_tok, integer("num_experts_per_tok", 0));
    if (family->experts->intermediate_size_wide) {
      c.moe_intermediate_size = c.intermediate_size;
    } else {
      ASSIGN_OR_RETURN(c.moe_intermediate_size, integer("moe_intermediate_size", 0));
    }
    ASSIGN_OR_RETURN(c.shared_expert_intermediate_size,
                     integer("shared_expert_intermediate_size", 0));
    c.norm_topk_prob = j.value("norm_topk_prob", family->experts->renormalize);
    ASSIGN_OR_RETURN(c.decoder_sparse_step, integer("decoder_sparse_step", 1));
    if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array()) {
      for (const auto& l : j["mlp_only_layers"]) {
        if (!l.is_number_integer()) {
          return absl::InvalidArgumentError(absl::StrCat(
              source_name, ": mlp_only_layers holds ", l.dump(), "; layer numbers are expected"));
        }
        c.mlp_only_layers.push_back(static_cast<int>(l.get<int64_t>()));
      }
    }
  }
  // Rope: transformers < 5 writes rope_theta + rope_scaling; 5 writes rope_parameters.
  const nlohmann::json* scaling = nullptr;
  c.rope_theta = j.value("rope_theta", 10000.0);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    scaling = &j["rope_parameters"];
    c.rope_theta = scaling->value("rope_theta", c.rope_theta);
  } else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    scaling = &j["rope_scaling"];
  }
  if (scaling != nullptr) RETURN_IF_ERROR(ParseRopeScaling(*scaling, source_name, &c));
  if (j.contains("eos_token_id")) {
    const auto& e = j["eos_token_id"];
    ASSIGN_OR_RETURN(c.eos_token_ids, EosIds(e, source_name));
  }
  if (auto s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": ", s.message()));
  }
  return c;
}

}  // namespace

absl::StatusOr<LlamaConfig> ParseLlamaConfig(absl::string_view json_text,
                                             absl::string_view source_name) {
  // A field of another JSON type ("num_hidden_layers": "2") throws from
  // get<>(): the file's fault, reported as such.
  try {
    return ParseConfigJson(json_text, source_name);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": a field has the wrong JSON type (", e.what(), ")"));
  }
}

absl::Status ApplyRopeScalingOverride(absl::string_view json_text, LlamaConfig* config) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("--rope-scaling must be a JSON object as config.json's "
                                                   "rope_scaling, got '", json_text, "'"));
  }
  try {
    RETURN_IF_ERROR(ParseRopeScaling(j, "--rope-scaling", config));
    if (j.contains("rope_theta")) config->rope_theta = j["rope_theta"].get<double>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("--rope-scaling: a field has the wrong JSON type (", e.what(), ")"));
  }
  if (auto s = config->Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--rope-scaling: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status ApplyGenerationConfig(absl::string_view json_text, absl::string_view source_name,
                                   LlamaConfig* config) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": not a JSON object"));
  }
  if (!j.contains("eos_token_id")) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int32_t> eos, EosIds(j["eos_token_id"], source_name));
  if (!eos.empty()) config->eos_token_ids = std::move(eos);
  return absl::OkStatus();
}

std::vector<float> RopeInverseFrequencies(const LlamaConfig& config) {
  const int half = config.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    // As transformers: base ** (arange(0, dim, 2).float() / dim), in float32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(config.head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(config.rope_theta), exponent);
  }
  if (config.rope_scaling.type == "linear") {
    for (float& f : inv) f = static_cast<float>(f / config.rope_scaling.factor);
  }
  if (config.rope_scaling.type == "yarn") {
    // transformers' _compute_yarn_parameters, in its float32 steps.
    const RopeScaling& s = config.rope_scaling;
    const double dim = config.head_dim;
    auto correction_dim = [&](double rotations) {
      return dim * std::log(static_cast<double>(s.original_max_position_embeddings) / (rotations * 2 * M_PI)) /
             (2 * std::log(config.rope_theta));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) /
                                        static_cast<float>(high - low), 0.0f, 1.0f);
      const float extrapolation = 1.0f - ramp;
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(config.head_dim);
      const float pos_freq = std::pow(static_cast<float>(config.rope_theta), exponent);
      const float interpolated = 1.0f / (static_cast<float>(s.factor) * pos_freq);
      inv[i] = interpolated * (1.0f - extrapolation) + inv[i] * extrapolation;
    }
  }
  if (config.rope_scaling.type == "llama3") {
    const RopeScaling& s = config.rope_scaling;
    const double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    const double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    for (int i = 0; i < half; ++i) {
      const double wavelen = 2 * M_PI / inv[i];
      if (wavelen > low_wavelen) {
        inv[i] = static_cast<float>(inv[i] / s.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        inv[i] = static_cast<float>((1 - smooth) * inv[i] / s.factor + smooth * inv[i]);
      }
    }
  }
  return inv;
}

}  // namespace tandem
