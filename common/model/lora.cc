#include "common/model/lora.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/crc32c.h"
#include "common/base/fnv1a.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

// The modules an adapter may target, in the order of the model's fused
// weights: q, k, v make qkv; gate, up make gate_up.
enum Module { kQ, kK, kV, kO, kGate, kUp, kDown, kNumModules };
constexpr std::array<const char*, kNumModules> kModuleNames = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// Input and output widths of module m.
struct ModuleShape {
  int64_t in = 0, out = 0;
};
ModuleShape ShapeOf(const LlamaConfig& c, int m) {
  const int64_t q = int64_t{c.num_attention_heads} * c.head_dim;
  const int64_t kv = int64_t{c.num_key_value_heads} * c.head_dim;
  switch (m) {
    case kQ: return {c.hidden_size, q};
    case kK:
    case kV: return {c.hidden_size, kv};
    case kO: return {q, c.hidden_size};
    case kGate:
    case kUp: return {c.hidden_size, c.intermediate_size};
    default: return {c.intermediate_size, c.hidden_size};
  }
}

// One adapter's matrices for one layer and module, on the host.
struct Pair {
  std::vector<float> a;  // [r, in]
  std::vector<float> b;  // [out, r]
};

struct HostAdapter {
  int rank = 0;
  float scale = 1.f;
  // (layer, module) -> matrices
  std::map<std::pair<int, int>, Pair> pairs;
  uint64_t fingerprint = 0;
};

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  }
  return j;
}

// A config key that must be absent, null, false, "none" or empty for the
// adapter to be applied as plain LoRA.
bool Unset(const nlohmann::json& c, const char* key) {
  if (!c.contains(key)) return true;
  const nlohmann::json& v = c[key];
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v == "none") ||
         ((v.is_object() || v.is_array()) && v.empty());
}

absl::StatusOr<HostAdapter> ReadAdapter(const LlamaConfig& config, const LoraModuleSpec& spec,
                                        int max_lora_rank) {
  const std::string where = absl::StrCat("LoRA adapter '", spec.name, "' (", spec.path, ")");
  auto cfg = ReadJson(spec.path + "/adapter_config.json");
  if (!cfg.ok()) return absl::Status(cfg.status().code(), absl::StrCat(where, ": ", cfg.status().message()));
  const nlohmann::json& c = *cfg;
  if (c.contains("peft_type") && c["peft_type"] != "LORA") {
    return absl::InvalidArgumentError(absl::StrCat(where, ": peft_type ", c["peft_type"].dump(),
                                                   " is not LORA"));
  }
  for (const char* key : {"use_dora", "modules_to_save", "rank_pattern", "alpha_pattern",
                          "fan_in_fan_out", "layer_replication"}) {
    if (!Unset(c, key)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, " = ", c[key].dump(),
                                                     " is not implemented (plain LoRA only)"));
    }
  }
  if (c.contains("bias") && c["bias"] != "none") {
    return absl::InvalidArgumentError(absl::StrCat(where, ": bias = ", c["bias"].dump(),
                                                   " is not implemented (bias \"none\" only)"));
  }
  if (!c.contains("r") || !c["r"].is_number_integer() || c["r"].get<int64_t>() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": adapter_config.json needs r >= 1"));
  }
  HostAdapter ad;
  const int64_t r = c["r"].get<int64_t>();
  if (r > max_lora_rank) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": rank r = ", r,
                                                   " exceeds --max-lora-rank=", max_lora_rank));
  }
  ad.rank = static_cast<int>(r);
  const double alpha = c.contains("lora_alpha") && c["lora_alpha"].is_number()
                           ? c["lora_alpha"].get<double>()
                           : 8.0;  // PEFT's default
  const bool rslora = c.contains("use_rslora") && c["use_rslora"].is_boolean() &&
                      c["use_rslora"].get<bool>();
  ad.scale = static_cast<float>(rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / r);

  auto file = SafetensorsCheckpoint::OpenFile(spec.path + "/adapter_model.safetensors");
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat(where, ": ", file.status().message()));
  }
  std::string canonical = absl::StrCat(r, "|", ad.scale);
  for (const std::string& full : file->TensorNames()) {
    // base_model.model.model.layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>[.weight]
    absl::string_view n = full;
    absl::ConsumePrefix(&n, "base_model.model.");
    absl::ConsumeSuffix(&n, ".weight");
    const std::vector<std::string> parts = absl::StrSplit(n, '.');
    int layer = -1;
    int module = -1;
    if (parts.size() == 6 && parts[0] == "model" && parts[1] == "layers" &&
        absl::SimpleAtoi(parts[2], &layer) && (parts[3] == "self_attn" || parts[3] == "mlp") &&
        (parts[5] == "lora_A" || parts[5] == "lora_B")) {
      for (int m = 0; m < kNumModules; ++m) {
        if (parts[4] == kModuleNames[m] && (parts[3] == "mlp") == (m >= kGate)) module = m;
      }
    }
    if (module < 0 || layer < 0 || layer >= config.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor '", full, "' is not a LoRA matrix the engine applies (lora_A/lora_B of ",
          absl::StrJoin(kModuleNames, ", "), " in layers 0..", config.num_hidden_layers - 1, ")"));
    }
    const ModuleShape s = ShapeOf(config, module);
    const bool is_a = parts[5] == "lora_A";
    Pair& p = ad.pairs[{layer, module}];
    std::vector<float>& dst = is_a ? p.a : p.b;
    dst.resize(is_a ? r * s.in : s.out * r);
    const std::vector<int64_t> shape = is_a ? std::vector<int64_t>{r, s.in}
                                            : std::vector<int64_t>{s.out, r};
    if (absl::Status st = file->ReadF32(full, shape, dst.data()); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat(where, ": ", st.message()));
    }
    absl::StrAppend(&canonical, "|", full, ":", Crc32c(0, dst.data(), dst.size() * sizeof(float)));
  }
  if (ad.pairs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": adapter_model.safetensors holds no LoRA matrices"));
  }
  for (const auto& [key, p] : ad.pairs) {
    if (p.a.empty() || p.b.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": layer ", key.first, " ", kModuleNames[key.second], " has lora_",
          p.a.empty() ? "B without lora_A" : "A without lora_B"));
    }
  }
  ad.fingerprint = Fnv1a64(canonical) | 1;  // never 0, the base model's
  return ad;
}

// `host` rounded to bf16 (nearest even) and copied to `dst` on `device`.
absl::Status CopyBf16(Device* device, const std::vector<float>& host, void* dst,
                      std::vector<uint16_t>* bits) {
  bits->resize(host.size());
  ConvertFromF32(host.data(), DType::kBF16, bits->data(), static_cast<int64_t>(host.size()));
  return device->CopyToDevice(dst, bits->data(), bits->size() * sizeof(uint16_t));
}

}  // namespace

absl::StatusOr<int> LoraSet::Slot(absl::string_view name) const {
  if (name.empty()) return 0;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return static_cast<int>(i) + 1;
  }
  return absl::NotFoundError(absl::StrCat(
      "lora_name '", name, "' is not loaded",
      names_.empty() ? std::string(" (this worker has no --lora-modules)")
                     : absl::StrCat(" (loaded: ", absl::StrJoin(names_, ", "), ")")));
}

absl::StatusOr<std::unique_ptr<LoraSet>> LoraSet::Load(const LlamaConfig& config, Device* device,
                                                       const std::vector<LoraModuleSpec>& modules,
                                                       int max_lora_rank) {
  if (max_lora_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-lora-rank must be >= 1, got ", max_lora_rank));
  }
  if (config.num_experts > 0 && !modules.empty()) {
    return absl::InvalidArgumentError(
        "LoRA adapters on a mixture-of-experts model are not implemented");
  }
  std::unique_ptr<LoraSet> set(new LoraSet());
  set->max_rank_ = max_lora_rank;
  std::vector<HostAdapter> adapters;
  int rank = 0;
  for (const LoraModuleSpec& spec : modules) {
    ASSIGN_OR_RETURN(HostAdapter a, ReadAdapter(config, spec, max_lora_rank));
    rank = std::max(rank, a.rank);
    set->names_.push_back(spec.name);
    set->fingerprints_.push_back(a.fingerprint);
    TANDEM_LOG(INFO) << "LoRA adapter '" << spec.name << "' from " << spec.path << ": rank "
                     << a.rank << ", scale " << a.scale << ", " << a.pairs.size()
                     << " pairs of matrices";
    adapters.push_back(std::move(a));
  }
  const int L = config.num_hidden_layers;
  set->layers_.resize(L);
  if (adapters.empty()) return set;

  // The fused weights: their modules and each module's first output row.
  struct Fused {
    std::vector<int> modules;
    LoraStack Layer::*stack;
  };
  const std::vector<Fused> fused = {{{kQ, kK, kV}, &Layer::qkv},
                                    {{kO}, &Layer::o},
                                    {{kGate, kUp}, &Layer::gate_up},
                                    {{kDown}, &Layer::down}};
  const int64_t S = static_cast<int64_t>(adapters.size());
  // Which (layer, fused weight) any adapter targets: only those get stacks.
  auto targeted = [&](int l, const Fused& f) {
    for (const HostAdapter& a : adapters) {
      for (int m : f.modules) {
        if (a.pairs.count({l, m})) return true;
      }
    }
    return false;
  };
  auto place = [&](Arena* arena) -> absl::Status {
    for (int l = 0; l < L; ++l) {
      for (const Fused& f : fused) {
        if (!targeted(l, f)) continue;
        const int64_t R = rank * static_cast<int64_t>(f.modules.size());
        int64_t out = 0;
        for (int m : f.modules) out += ShapeOf(config, m).out;
        const int64_t in = ShapeOf(config, f.modules[0]).in;
        LoraStack& st = set->layers_[l].*(f.stack);
        ASSIGN_OR_RETURN(st.a, arena->Allocate(DType::kBF16, {S, R, in}));
        ASSIGN_OR_RETURN(st.bt, arena->Allocate(DType::kBF16, {S, R, out}));
        st.rank = rank;
        st.splits = {0};
        for (int m : f.modules) st.splits.push_back(st.splits.back() + ShapeOf(config, m).out);
        set->max_stack_rank_ = std::max(set->max_stack_rank_, R);
      }
    }
    return absl::OkStatus();
  };
  std::unique_ptr<Arena> measure = Arena::Measure("lora");
  RETURN_IF_ERROR(place(measure.get()));
  ASSIGN_OR_RETURN(set->arena_, Arena::Create(device, measure->used(), "lora"));
  RETURN_IF_ERROR(place(set->arena_.get()));

  std::vector<float> ha, hb;
  std::vector<uint16_t> bits;
  for (int l = 0; l < L; ++l) {
    for (const Fused& f : fused) {
      const LoraStack& st = set->layers_[l].*(f.stack);
      if (st.a.data == nullptr) continue;
      const int64_t R = st.a.dim(1), in = st.a.dim(2), out = st.bt.dim(2);
      ha.assign(S * R * in, 0.f);
      hb.assign(S * out * R, 0.f);
      for (int64_t s = 0; s < S; ++s) {
        int64_t row0 = 0;
        for (size_t j = 0; j < f.modules.size(); ++j) {
          const int m = f.modules[j];
          const int64_t mo = ShapeOf(config, m).out;
          auto it = adapters[s].pairs.find({l, m});
          if (it != adapters[s].pairs.end()) {
            const int64_t r = adapters[s].rank, col0 = static_cast<int64_t>(j) * rank;
            const float scale = adapters[s].scale;
            std::copy(it->second.a.begin(), it->second.a.end(),
                      ha.begin() + (s * R + col0) * in);
            for (int64_t o = 0; o < mo; ++o) {
              for (int64_t t = 0; t < r; ++t) {
                hb[(s * R + col0 + t) * out + row0 + o] = scale * it->second.b[o * r + t];
              }
            }
          }
          row0 += mo;
        }
      }
      RETURN_IF_ERROR(CopyBf16(device, ha, st.a.data, &bits));
      RETURN_IF_ERROR(CopyBf16(device, hb, st.bt.data, &bits));
    }
  }
  TANDEM_LOG(INFO) << "LoRA: " << S << " adapter(s), stacked rank " << rank << " per module, "
                   << set->arena_->used() / (1 << 20) << " MiB";
  return set;
}

}  // namespace tandem
