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

// The fused weights: their modules, in the order of the stacks of a layer.
struct Fused {
  std::vector<int> modules;
};
const std::vector<Fused>& FusedWeights() {
  static const std::vector<Fused> fused = {{{kQ, kK, kV}}, {{kO}}, {{kGate, kUp}}, {{kDown}}};
  return fused;
}

}  // namespace

std::vector<const LoraStack*> LoraSet::Stacks() const {
  std::vector<const LoraStack*> out;
  for (const Layer& l : layers_) {
    for (const LoraStack* st : {&l.qkv, &l.o, &l.gate_up, &l.down}) out.push_back(st);
  }
  return out;
}

namespace {

// `host`'s matrices in one slot of every stack of `stacks` (LoraImage's
// order), rounded to bf16 (nearest even), B times its scale.
void Lay(const LlamaConfig& config, const HostAdapter& host,
         const std::vector<const LoraStack*>& stacks, std::vector<std::vector<uint16_t>>* a_rows,
         std::vector<std::vector<uint16_t>>* bt_rows, std::vector<std::vector<int32_t>>* ranks) {
  const std::vector<Fused>& fused = FusedWeights();
  a_rows->assign(stacks.size(), {});
  bt_rows->assign(stacks.size(), {});
  ranks->assign(stacks.size(), {});
  std::vector<float> ha, hb;
  for (size_t i = 0; i < stacks.size(); ++i) {
    const LoraStack& st = *stacks[i];
    if (st.a.data == nullptr) continue;
    const int l = static_cast<int>(i / fused.size());
    const Fused& f = fused[i % fused.size()];
    const int64_t R = st.a.dim(1), in = st.a.dim(2), out = st.bt.dim(2), rank = st.rank;
    ha.assign(R * in, 0.f);
    hb.assign(R * out, 0.f);
    int64_t row0 = 0;
    for (size_t j = 0; j < f.modules.size(); ++j) {
      const int m = f.modules[j];
      const int64_t mo = ShapeOf(config, m).out;
      auto it = host.pairs.find({l, m});
      (*ranks)[i].push_back(it != host.pairs.end() ? host.rank : 0);
      if (it != host.pairs.end()) {
        const int64_t r = host.rank, col0 = static_cast<int64_t>(j) * rank;
        std::copy(it->second.a.begin(), it->second.a.end(), ha.begin() + col0 * in);
        for (int64_t o = 0; o < mo; ++o) {
          for (int64_t t = 0; t < r; ++t) {
            hb[(col0 + t) * out + row0 + o] = host.scale * it->second.b[o * r + t];
          }
        }
      }
      row0 += mo;
    }
    for (auto [src, dst] : {std::pair{&ha, &(*a_rows)[i]}, std::pair{&hb, &(*bt_rows)[i]}}) {
      dst->resize(src->size());
      ConvertFromF32(src->data(), DType::kBF16, dst->data(), static_cast<int64_t>(src->size()));
    }
  }
}

}  // namespace

std::vector<std::string> LoraSet::names() const {
  MutexLock lock(&mu_);
  return LoadedNamesLocked();
}

std::vector<std::string> LoraSet::LoadedNamesLocked() const {
  std::vector<std::string> out;
  for (const Slot& s : slots_) {
    if (!s.name.empty() && !s.draining) out.push_back(s.name);
  }
  return out;
}

absl::StatusOr<LoraRef> LoraSet::Find(absl::string_view name) const {
  if (name.empty()) return LoraRef{};
  MutexLock lock(&mu_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].name == name && !slots_[i].draining) {
      return LoraRef{static_cast<int>(i) + 1, slots_[i].fingerprint};
    }
  }
  const std::string loaded = absl::StrJoin(LoadedNamesLocked(), ", ");
  return absl::NotFoundError(absl::StrCat(
      "lora_name '", name, "' is not loaded",
      !loaded.empty()  ? absl::StrCat(" (loaded: ", loaded, ")")
      : updatable_     ? std::string(" (no adapter is loaded)")
                       : std::string(" (this worker has no --lora-modules)")));
}

uint64_t LoraSet::Fingerprint(int slot) const {
  if (slot <= 0) return 0;
  MutexLock lock(&mu_);
  return slots_[slot - 1].fingerprint;
}

std::string LoraSet::SlotName(int slot) const {
  if (slot <= 0) return "";
  MutexLock lock(&mu_);
  return slots_[slot - 1].name;
}

absl::Status LoraSet::Write(int slot, const LoraImage& image) {
  const std::vector<const LoraStack*> stacks = Stacks();
  for (size_t i = 0; i < stacks.size(); ++i) {
    const LoraStack& st = *stacks[i];
    if (st.a.data == nullptr) continue;
    std::copy(image.ranks_[i].begin(), image.ranks_[i].end(),
              slot_ranks_[i].begin() + slot * image.ranks_[i].size());
    const size_t a_bytes = image.a_[i].size() * sizeof(uint16_t);
    const size_t bt_bytes = image.bt_[i].size() * sizeof(uint16_t);
    RETURN_IF_ERROR(device_->CopyToDevice(static_cast<char*>(st.a.data) + slot * a_bytes,
                                          image.a_[i].data(), a_bytes));
    RETURN_IF_ERROR(device_->CopyToDevice(static_cast<char*>(st.bt.data) + slot * bt_bytes,
                                          image.bt_[i].data(), bt_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LoraImage>> LoraSet::Prepare(const LoraModuleSpec& spec) const {
  if (!updatable_) {
    return absl::FailedPreconditionError(
        "adapters are loaded at run time only with --allow-runtime-lora-updating (this worker's "
        "are fixed at start-up by --lora-modules)");
  }
  if (spec.name.empty()) return absl::InvalidArgumentError("lora_name must not be empty");
  if (spec.path.empty()) return absl::InvalidArgumentError("lora_path must not be empty");
  ASSIGN_OR_RETURN(HostAdapter host, ReadAdapter(config_, spec, max_rank_));
  auto image = std::make_unique<LoraImage>();
  image->name_ = spec.name;
  image->rank_ = host.rank;
  image->fingerprint_ = host.fingerprint;
  Lay(config_, host, Stacks(), &image->a_, &image->bt_, &image->ranks_);
  TANDEM_LOG(INFO) << "LoRA adapter '" << spec.name << "' read from " << spec.path << ": rank "
                   << host.rank << ", scale " << host.scale << ", " << host.pairs.size()
                   << " pairs of matrices";
  return image;
}

absl::StatusOr<int> LoraSet::Add(const LoraImage& image, absl::FunctionRef<bool(int slot)> in_use) {
  int slot = -1;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].name == image.name_ && !slots_[i].draining) {
        return absl::AlreadyExistsError(
            absl::StrCat("the LoRA adapter '", image.name_, "' has already been loaded"));
      }
    }
    for (size_t i = 0; i < slots_.size() && slot < 0; ++i) {
      const Slot& s = slots_[i];
      if (s.name.empty() || (s.draining && !in_use(static_cast<int>(i) + 1))) {
        slot = static_cast<int>(i);
      }
    }
    if (slot < 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "every one of the ", slots_.size(), " LoRA slots (--max-loras) holds an adapter (",
          absl::StrJoin(LoadedNamesLocked(), ", "),
          "; unloaded ones until their requests end): unload one first"));
    }
  }
  // No request holds the slot, so no step reads it: its rows may change.
  RETURN_IF_ERROR(Write(slot, image));
  MutexLock lock(&mu_);
  slots_[slot] = Slot{image.name_, image.fingerprint_, false};
  TANDEM_LOG(INFO) << "LoRA adapter '" << image.name_ << "' loaded into slot " << slot + 1 << " of "
                   << slots_.size();
  return slot + 1;
}

absl::Status LoraSet::Remove(absl::string_view name) {
  MutexLock lock(&mu_);
  for (Slot& s : slots_) {
    if (s.name == name && !s.draining) {
      s.draining = true;
      TANDEM_LOG(INFO) << "LoRA adapter '" << name << "' unloaded";
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("the LoRA adapter '", name, "' cannot be found"));
}

absl::StatusOr<std::unique_ptr<LoraSet>> LoraSet::Load(const LlamaConfig& config, Device* device,
                                                       const std::vector<LoraModuleSpec>& modules,
                                                       int max_lora_rank, int runtime_slots) {
  if (max_lora_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-lora-rank must be >= 1, got ", max_lora_rank));
  }
  if (config.num_experts > 0 && (!modules.empty() || runtime_slots > 0)) {
    return absl::InvalidArgumentError(
        "LoRA adapters on a mixture-of-experts model are not implemented");
  }
  std::unique_ptr<LoraSet> set(new LoraSet());
  set->config_ = config;
  set->device_ = device;
  set->max_rank_ = max_lora_rank;
  set->updatable_ = runtime_slots > 0;
  std::vector<HostAdapter> adapters;
  int rank = 0;
  for (const LoraModuleSpec& spec : modules) {
    ASSIGN_OR_RETURN(HostAdapter a, ReadAdapter(config, spec, max_lora_rank));
    rank = std::max(rank, a.rank);
    TANDEM_LOG(INFO) << "LoRA adapter '" << spec.name << "' from " << spec.path << ": rank "
                     << a.rank << ", scale " << a.scale << ", " << a.pairs.size()
                     << " pairs of matrices";
    adapters.push_back(std::move(a));
  }
  const int L = config.num_hidden_layers;
  set->layers_.resize(L);
  const int64_t S = std::max<int64_t>(runtime_slots, static_cast<int64_t>(adapters.size()));
  set->capacity_ = static_cast<int>(S);
  {
    MutexLock lock(&set->mu_);
    set->slots_.resize(S);
  }
  if (S == 0) return set;
  // Updatable: every weight at the largest rank allowed, for any adapter.
  if (set->updatable_) rank = max_lora_rank;

  const std::vector<Fused>& fused = FusedWeights();
  LoraStack Layer::*const members[] = {&Layer::qkv, &Layer::o, &Layer::gate_up, &Layer::down};
  // Which (layer, fused weight) gets a stack: any an adapter targets, or all.
  auto targeted = [&](int l, const Fused& f) {
    if (set->updatable_) return true;
    for (const HostAdapter& a : adapters) {
      for (int m : f.modules) {
        if (a.pairs.count({l, m})) return true;
      }
    }
    return false;
  };
  auto place = [&](Arena* arena) -> absl::Status {
    for (int l = 0; l < L; ++l) {
      for (size_t k = 0; k < fused.size(); ++k) {
        const Fused& f = fused[k];
        if (!targeted(l, f)) continue;
        const int64_t R = rank * static_cast<int64_t>(f.modules.size());
        int64_t out = 0;
        for (int m : f.modules) out += ShapeOf(config, m).out;
        const int64_t in = ShapeOf(config, f.modules[0]).in;
        LoraStack& st = set->layers_[l].*(members[k]);
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
  // Every slot's ranks 0 until an adapter is written there (reserved: the
  // stacks keep pointers into them).
  set->slot_ranks_.reserve(4 * set->layers_.size());
  for (Layer& layer : set->layers_) {
    for (LoraStack* st : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down}) {
      set->slot_ranks_.emplace_back(st->a.data == nullptr ? 0 : S * (st->splits.size() - 1), 0);
      st->slot_ranks = set->slot_ranks_.back().data();
    }
  }

  const std::vector<const LoraStack*> stacks = set->Stacks();
  for (size_t s = 0; s < adapters.size(); ++s) {
    LoraImage image;
    image.name_ = modules[s].name;
    image.rank_ = adapters[s].rank;
    image.fingerprint_ = adapters[s].fingerprint;
    Lay(config, adapters[s], stacks, &image.a_, &image.bt_, &image.ranks_);
    RETURN_IF_ERROR(set->Write(static_cast<int>(s), image));
    MutexLock lock(&set->mu_);
    set->slots_[s] = Slot{image.name_, image.fingerprint_, false};
  }
  TANDEM_LOG(INFO) << "LoRA: " << adapters.size() << " adapter(s) in " << S << " slot(s)"
                   << (set->updatable_ ? " (runtime updating on)" : "") << ", stacked rank "
                   << rank << " per module, " << set->arena_->used() / (1 << 20) << " MiB";
  return set;
}

}  // namespace tandem
