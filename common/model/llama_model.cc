#include "common/model/llama_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/container/flat_hash_set.h"
#include "common/base/fnv1a.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/model/gguf_weights.h"
#include "common/model/lora.h"
#include "common/model/safetensors.h"

namespace tandem {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fills dst with values in [center - scale, center + scale), exactly
// reproducible: value i depends only on (seed, i) through integer arithmetic.
void FillSynthetic(uint64_t seed, float center, float scale, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(i)));
    const float unit = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    dst[i] = center + scale * (2.f * unit - 1.f);
  }
}

// Reads one named tensor of a given shape into dst (f32).
using TensorReader = std::function<absl::Status(const std::string& name,
                                                const std::vector<int64_t>& shape, float* dst)>;

}  // namespace

bool IsSyntheticSpec(const std::string& spec) {
  return spec == "synthetic" || absl::StartsWith(spec, "synthetic:");
}

absl::StatusOr<LlamaConfig> SyntheticConfig(const std::string& spec) {
  LlamaConfig c;
  c.name = spec;
  if (spec == "synthetic" || spec == "synthetic:tiny") {
    c.name = "synthetic";
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 4096;
    c.rope_theta = 10000;
    c.tie_word_embeddings = false;
    c.eos_token_ids = {2};
  } else if (spec == "synthetic:smollm2-135m") {
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_hidden_layers = 30;
    c.num_attention_heads = 9;
    c.num_key_value_heads = 3;
    c.head_dim = 64;
    c.max_position_embeddings = 8192;
    c.rope_theta = 100000;
    c.tie_word_embeddings = true;
    c.eos_token_ids = {2};
  } else if (spec == "synthetic:llama-3.2-1b") {
    c.vocab_size = 128256;
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.num_hidden_layers = 16;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 64;
    c.max_position_embeddings = 131072;
    c.rope_theta = 500000;
    c.rope_scaling = {"llama3", 32.0, 1.0, 4.0, 8192};
    c.tie_word_embeddings = true;
    c.eos_token_ids = {128001, 128008, 128009};
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", spec,
        "' is not a synthetic preset (synthetic, synthetic:smollm2-135m, "
        "synthetic:llama-3.2-1b)"));
  }
  c.rms_norm_eps = 1e-5;
  return c;
}

AttentionShape LlamaModel::attention_shape() const {
  return {config_.num_attention_heads, config_.num_key_value_heads, config_.head_dim, attention_scale_};
}

std::vector<Tensor> LlamaModel::StreamedWeights() const {
  std::vector<Tensor> out;
  for (const Layer& l : layers_) {
    // A sparse layer's router and shared expert, not its experts: a step
    // reads only those its tokens are routed to.
    for (const Tensor* t : {&l.input_norm, &l.qkv, &l.qkv_bias, &l.q_norm, &l.k_norm, &l.o,
                            &l.post_norm, &l.gate_up, &l.down, &l.moe.router,
                            &l.moe.shared_gate_up, &l.moe.shared_down, &l.moe.shared_gate}) {
      if (t->data != nullptr) out.push_back(*t);
    }
  }
  out.push_back(final_norm_);
  out.push_back(lm_head_);
  return out;
}

std::vector<Tensor> LlamaModel::RoutedExpertsOfOneToken() const {
  std::vector<Tensor> out;
  for (const Layer& l : layers_) {
    if (l.moe.gate_up.data == nullptr) continue;
    const int64_t experts = l.moe.router.dim(0);
    for (const Tensor* t : {&l.moe.gate_up, &l.moe.down}) {
      out.push_back(t->Rows(t->dim(0) / experts * l.moe.top_k));
    }
  }
  return out;
}

std::vector<Tensor> LlamaModel::MatmulWeights() const {
  std::vector<Tensor> out;
  for (const Tensor& t : StreamedWeights()) {
    if (t.ndim == 2) out.push_back(t);
  }
  for (const Layer& l : layers_) {  // the experts (their shared one is streamed)
    if (l.moe.gate_up.data == nullptr) continue;
    out.push_back(l.moe.gate_up);
    out.push_back(l.moe.down);
  }
  return out;
}

std::string LlamaModel::WeightDTypes() const {
  std::vector<std::pair<DType, int>> counts;  // in order of first use
  for (const Tensor& t : MatmulWeights()) {
    auto it = std::find_if(counts.begin(), counts.end(),
                           [&](const auto& c) { return c.first == t.dtype; });
    if (it == counts.end()) {
      counts.push_back({t.dtype, 1});
    } else {
      ++it->second;
    }
  }
  std::vector<std::string> parts;
  for (const auto& [dt, n] : counts) parts.push_back(absl::StrCat(DTypeName(dt), " x", n));
  return absl::StrJoin(parts, ", ");
}

size_t LlamaModel::KvBytesPerBlock(int block_size) const {
  return static_cast<size_t>(block_size) * config_.num_key_value_heads * config_.head_dim *
         DTypeSize(ops_->kv_dtype()) * 2 * config_.num_hidden_layers;
}

namespace {

// The source tensors behind each fused matmul weight of layer `i`, stacked
// along dim 0 (Hugging Face names).
struct LayerSources {
  std::vector<std::string> qkv, o, gate_up, down;
  std::string router;                                    // a sparse layer's
  std::vector<std::string> shared_gate_up, shared_down;  // its shared expert's
};
// A sparse layer's gate_up and down are its experts', one after another
// (each expert's gate rows, then its up rows).
LayerSources LayerTensorNames(const LlamaConfig& c, int i) {
  const std::string p = absl::StrCat("model.layers.", i, ".");
  LayerSources s{{p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight"},
                 {p + "self_attn.o_proj.weight"},
                 {},
                 {}};
  if (!c.IsSparseLayer(i)) {
    s.gate_up = {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"};
    s.down = {p + "mlp.down_proj.weight"};
    return s;
  }
  if (c.shared_expert_intermediate_size > 0) {
    s.shared_gate_up = {p + "mlp.shared_expert.gate_proj.weight",
                        p + "mlp.shared_expert.up_proj.weight"};
    s.shared_down = {p + "mlp.shared_expert.down_proj.weight"};
  }
  const ExpertsSpec& x = *c.family->experts;  // Validate(): experts need a family with them
  s.router = p + RouterTensorSuffix(x);
  for (int e = 0; e < c.num_experts; ++e) {
    s.gate_up.push_back(p + ExpertTensorSuffix(x, e, 0));
    s.gate_up.push_back(p + ExpertTensorSuffix(x, e, 1));
    s.down.push_back(p + ExpertTensorSuffix(x, e, 2));
  }
  return s;
}

}  // namespace

absl::Status LlamaModel::PlaceWeights(Arena* arena, const WeightSource* source) {
  const LlamaConfig& c = config_;
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const DType w = ops_->weight_dtype();  // matmul weights and the embedding table
  const DType act = ops_->dtype();       // norms
  if (w == DType::kQ8_0) {
    for (const auto& [field, value] :
         {std::pair<const char*, int64_t>{"hidden_size", h}, {"intermediate_size", inter},
          {"num_attention_heads x head_dim", int64_t{c.num_attention_heads} * c.head_dim},
          {"moe_intermediate_size", c.num_experts > 0 ? c.moe_intermediate_size : 0}}) {
      if (value % kBlockElems != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "weight_dtype=q8_0 needs rows of whole 32-element blocks; ", field, " is ", value));
      }
    }
  }
  // A fused weight keeps its source's block type when the ops keep file
  // blocks and every part is stored in that one type; parts in different
  // block types (a Q4_K_M file's q, k as Q5_0 and v as Q8_0) are all kept
  // as Q8_0, the narrowest type each converts to; else it is `w`.
  auto dtype_of = [&](const std::vector<std::string>& parts) {
    if (!ops_->keeps_file_blocks() || source == nullptr) return w;
    const std::optional<DType> first = source->BlockType(parts[0]);
    if (!first.has_value()) return w;
    for (const std::string& p : parts) {
      if (!source->BlockType(p).has_value()) return w;
      if (source->BlockType(p) != first) return h % kBlockElems == 0 ? DType::kQ8_0 : w;
    }
    return *first;
  };
  ASSIGN_OR_RETURN(embed_, arena->Allocate(dtype_of({"model.embed_tokens.weight"}),
                                           {c.vocab_size, h}));
  ASSIGN_OR_RETURN(final_norm_, arena->Allocate(act, {h}));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    ASSIGN_OR_RETURN(lm_head_, arena->Allocate(dtype_of({"lm_head.weight"}), {c.vocab_size, h}));
  }
  ASSIGN_OR_RETURN(inv_freq_, arena->Allocate(DType::kF32, {c.head_dim / 2}));
  layers_.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    Layer& l = layers_[i];
    const LayerSources names = LayerTensorNames(c, i);
    ASSIGN_OR_RETURN(l.input_norm, arena->Allocate(act, {h}));
    ASSIGN_OR_RETURN(l.qkv, arena->Allocate(dtype_of(names.qkv), {c.qkv_size(), h}));
    if (c.family->qkv_bias) {
      ASSIGN_OR_RETURN(l.qkv_bias, arena->Allocate(act, {c.qkv_size()}));
    }
    if (c.family->qk_norm) {
      ASSIGN_OR_RETURN(l.q_norm, arena->Allocate(act, {c.head_dim}));
      ASSIGN_OR_RETURN(l.k_norm, arena->Allocate(act, {c.head_dim}));
    }
    ASSIGN_OR_RETURN(l.o, arena->Allocate(dtype_of(names.o),
                                          {h, int64_t{c.num_attention_heads} * c.head_dim}));
    ASSIGN_OR_RETURN(l.post_norm, arena->Allocate(act, {h}));
    if (c.IsSparseLayer(i)) {
      const int64_t e = c.num_experts, moe = c.moe_intermediate_size;
      ASSIGN_OR_RETURN(l.moe.router, arena->Allocate(act, {e, h}));
      ASSIGN_OR_RETURN(l.moe.gate_up, arena->Allocate(dtype_of(names.gate_up), {e * 2 * moe, h}));
      ASSIGN_OR_RETURN(l.moe.down, arena->Allocate(dtype_of(names.down), {e * h, moe}));
      if (const int64_t shared = c.shared_expert_intermediate_size; shared > 0) {
        ASSIGN_OR_RETURN(l.moe.shared_gate_up,
                         arena->Allocate(dtype_of(names.shared_gate_up), {2 * shared, h}));
        ASSIGN_OR_RETURN(l.moe.shared_down,
                         arena->Allocate(dtype_of(names.shared_down), {h, shared}));
        ASSIGN_OR_RETURN(l.moe.shared_gate, arena->Allocate(act, {1, h}));
      }
      l.moe.top_k = c.num_experts_per_tok;
      l.moe.renormalize = c.norm_topk_prob;
      continue;
    }
    ASSIGN_OR_RETURN(l.gate_up, arena->Allocate(dtype_of(names.gate_up), {2 * inter, h}));
    ASSIGN_OR_RETURN(l.down, arena->Allocate(dtype_of(names.down), {h, inter}));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::AllocateWeights(Device* device, const WeightSource* source) {
  std::unique_ptr<Arena> measure = Arena::Measure("weights");
  RETURN_IF_ERROR(PlaceWeights(measure.get(), source));
  ASSIGN_OR_RETURN(arena_, Arena::Create(device, measure->used(), "weights"));
  return PlaceWeights(arena_.get(), source);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& spec, Ops* ops,
                                                             const std::string& rope_scaling) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->spec_ = spec;
  m->ops_ = ops;
  // Keeps the GGUF mapping alive while the weights are read.
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<WeightSource> checkpoint;
  if (IsSyntheticSpec(spec)) {
    ASSIGN_OR_RETURN(m->config_, SyntheticConfig(spec));
  } else if (IsGgufSpec(spec)) {
    ASSIGN_OR_RETURN(gguf, GgufFile::Open(spec));
    ASSIGN_OR_RETURN(m->config_, LlamaConfigFromGguf(*gguf));
    checkpoint = std::make_unique<GgufWeights>(gguf.get(), m->config_);
  } else {
    std::ifstream in(spec + "/config.json");
    if (!in) {
      return absl::NotFoundError(absl::StrCat(
          "model '", spec, "': no ", spec,
          "/config.json (give a Hugging Face model directory, a .gguf file or a synthetic "
          "preset)"));
    }
    std::string text((std::istreambuf_iterator<char>(in)), {});
    ASSIGN_OR_RETURN(m->config_, ParseLlamaConfig(text, spec + "/config.json"));
    std::ifstream gen(spec + "/generation_config.json");
    if (gen) {
      std::string gen_text((std::istreambuf_iterator<char>(gen)), {});
      RETURN_IF_ERROR(ApplyGenerationConfig(gen_text, spec + "/generation_config.json",
                                            &m->config_));
    }
    ASSIGN_OR_RETURN(auto ckpt, SafetensorsCheckpoint::Open(spec));
    checkpoint = std::make_unique<SafetensorsCheckpoint>(std::move(ckpt));
  }
  if (!rope_scaling.empty()) RETURN_IF_ERROR(ApplyRopeScalingOverride(rope_scaling, &m->config_));
  m->attention_scale_ = m->config_.AttentionScale();  // not per layer and step
  const LlamaConfig& c = m->config_;
  if (c.num_experts > 0 && !ops->supports_experts()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", spec, "' has ", c.num_experts,
        " experts a layer; mixture-of-experts layers run on the CPU backend only "
        "(--device=cpu)"));
  }
  RETURN_IF_ERROR(m->AllocateWeights(ops->device(), checkpoint.get()));

  // Weights are produced on the host in f32, converted to the backend's
  // dtype and copied to the device; where the device's memory is the host's
  // (the CPU backend) they are converted in place. Decoding, repacking and
  // rounding (and the first touch of the weights' pages) are split by rows
  // over every CPU this process may use: start-up work, before anything else
  // runs (a Q4_K_M file of two Qwen3-30B-A3B layers, 833 MiB of weights, on
  // 2 vCPUs: 1.6 s -> 0.9 s; docs/models.md).
  ThreadPool pool(ThreadPool::AvailableCpus());
  if (checkpoint) checkpoint->set_pool(&pool);
  const bool in_place = ops->device()->host_memory();
  std::vector<float> host;
  std::vector<char> converted;
  // `rows` rows of `cols` f32 at src rounded to `dtype` at dst.
  auto convert = [&](const float* src, DType dtype, char* dst, int64_t rows, int64_t cols) {
    const size_t row_bytes = DTypeBytes(dtype, cols);
    pool.ParallelFor(rows, WeightSource::MinRowsPerRange(row_bytes), [&](int64_t begin, int64_t end) {
      ConvertFromF32(src + begin * cols, dtype, dst + begin * row_bytes, (end - begin) * cols);
    });
  };
  const uint64_t model_seed = Fnv1a64(c.name);
  absl::flat_hash_set<std::string> used;
  TensorReader read = [&](const std::string& name, const std::vector<int64_t>& shape,
                          float* dst) -> absl::Status {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    used.insert(name);
    if (checkpoint) return checkpoint->ReadF32(name, shape, dst);
    const bool is_norm = absl::StrContains(name, "norm");
    const float scale = is_norm ? 0.1f : 1.0f / std::sqrt(static_cast<float>(shape.back()));
    FillSynthetic(model_seed ^ Fnv1a64(name), is_norm ? 1.0f : 0.0f,
                  absl::StrContains(name, "embed") ? 1.0f : scale, dst, n);
    return absl::OkStatus();
  };
  // Reads the listed tensors stacked along dim 0 into `dst`: as stored when
  // `dst` keeps the source's block type (PlaceWeights chose it), else as f32
  // converted to `dst`'s dtype.
  auto load = [&](const Tensor& dst, std::vector<std::pair<std::string, int64_t>> parts)
      -> absl::Status {
    const int64_t cols = dst.ndim == 2 ? dst.dim(1) : 1;
    auto shape_of = [&](int64_t rows) {
      return dst.ndim == 2 ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
    };
    // Where dst's bytes are written: dst itself, or a staging copy.
    char* out = static_cast<char*>(dst.data);
    if (!in_place) {
      converted.resize(dst.nbytes());
      out = converted.data();
    }
    const auto done = [&] {
      return in_place ? absl::OkStatus() : ops->device()->CopyToDevice(dst.data, out, dst.nbytes());
    };
    if (IsBlockType(dst.dtype) && checkpoint && checkpoint->BlockType(parts[0].first)) {
      // Each part as stored, or (a part of a fused weight in another block
      // type) read as f32 and rounded to dst's type.
      size_t at = 0;
      for (const auto& [name, rows] : parts) {
        used.insert(name);
        if (checkpoint->BlockType(name) == dst.dtype) {
          RETURN_IF_ERROR(checkpoint->ReadBlocks(name, shape_of(rows), out + at));
        } else {
          host.resize(rows * cols);
          RETURN_IF_ERROR(checkpoint->ReadF32(name, shape_of(rows), host.data()));
          convert(host.data(), dst.dtype, out + at, rows, cols);
        }
        at += DTypeBytes(dst.dtype, rows * cols);
      }
      return done();
    }
    // f32 read straight into dst's bytes; any other dtype through f32.
    float* f32 = reinterpret_cast<float*>(out);
    if (dst.dtype != DType::kF32) {
      host.resize(dst.numel());
      f32 = host.data();
    }
    int64_t row = 0;
    for (const auto& [name, rows] : parts) {
      RETURN_IF_ERROR(read(name, shape_of(rows), f32 + row * cols));
      row += rows;
    }
    if (dst.dtype != DType::kF32) convert(f32, dst.dtype, out, dst.numel() / cols, cols);
    return done();
  };
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_rows = int64_t{c.num_attention_heads} * c.head_dim;
  const int64_t kv_rows = int64_t{c.num_key_value_heads} * c.head_dim;
  RETURN_IF_ERROR(load(m->embed_, {{"model.embed_tokens.weight", c.vocab_size}}));
  RETURN_IF_ERROR(load(m->final_norm_, {{"model.norm.weight", h}}));
  if (!c.tie_word_embeddings) RETURN_IF_ERROR(load(m->lm_head_, {{"lm_head.weight", c.vocab_size}}));
  // A large model's load (tens of GB decoded, a 30B MoE's experts requantized
  // layer by layer) says how far it is, every few seconds.
  auto last_report = std::chrono::steady_clock::now();
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    if (const auto now = std::chrono::steady_clock::now();
        now - last_report >= std::chrono::seconds(5)) {
      last_report = now;
      TANDEM_LOG(INFO) << "loading model '" << spec << "': " << i << " of "
                       << c.num_hidden_layers << " layers read, "
                       << absl::StrFormat("%.1f",
                                          std::chrono::duration<double>(now - start).count())
                       << " s";
    }
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const LayerSources names = LayerTensorNames(c, i);
    Layer& l = m->layers_[i];
    RETURN_IF_ERROR(load(l.input_norm, {{p + "input_layernorm.weight", h}}));
    RETURN_IF_ERROR(load(l.qkv, {{names.qkv[0], q_rows}, {names.qkv[1], kv_rows},
                                 {names.qkv[2], kv_rows}}));
    if (c.family->qkv_bias) {
      RETURN_IF_ERROR(load(l.qkv_bias, {{p + "self_attn.q_proj.bias", q_rows},
                                        {p + "self_attn.k_proj.bias", kv_rows},
                                        {p + "self_attn.v_proj.bias", kv_rows}}));
    }
    if (c.family->qk_norm) {
      RETURN_IF_ERROR(load(l.q_norm, {{p + "self_attn.q_norm.weight", c.head_dim}}));
      RETURN_IF_ERROR(load(l.k_norm, {{p + "self_attn.k_norm.weight", c.head_dim}}));
    }
    RETURN_IF_ERROR(load(l.o, {{names.o[0], h}}));
    RETURN_IF_ERROR(load(l.post_norm, {{p + "post_attention_layernorm.weight", h}}));
    if (c.IsSparseLayer(i)) {
      RETURN_IF_ERROR(load(l.moe.router, {{names.router, c.num_experts}}));
      std::vector<std::pair<std::string, int64_t>> gate_up, down;
      for (const std::string& name : names.gate_up) gate_up.push_back({name, c.moe_intermediate_size});
      for (const std::string& name : names.down) down.push_back({name, h});
      RETURN_IF_ERROR(load(l.moe.gate_up, gate_up));
      RETURN_IF_ERROR(load(l.moe.down, down));
      if (const int64_t shared = c.shared_expert_intermediate_size; shared > 0) {
        RETURN_IF_ERROR(load(l.moe.shared_gate_up, {{names.shared_gate_up[0], shared},
                                                    {names.shared_gate_up[1], shared}}));
        RETURN_IF_ERROR(load(l.moe.shared_down, {{names.shared_down[0], h}}));
        RETURN_IF_ERROR(load(l.moe.shared_gate, {{p + "mlp.shared_expert_gate.weight", 1}}));
      }
      continue;
    }
    RETURN_IF_ERROR(load(l.gate_up, {{names.gate_up[0], inter}, {names.gate_up[1], inter}}));
    RETURN_IF_ERROR(load(l.down, {{names.down[0], h}}));
  }
  std::vector<float> inv = RopeInverseFrequencies(c);
  if (checkpoint && checkpoint->Has("rope_freqs")) {
    // GGUF's llama3-style scaling: per-frequency divisors of the base inverse
    // frequencies (llama.cpp's rope_freqs tensor).
    std::vector<float> factors(inv.size());
    RETURN_IF_ERROR(read("rope_freqs", {static_cast<int64_t>(inv.size())}, factors.data()));
    for (size_t i = 0; i < inv.size(); ++i) inv[i] /= factors[i];
  }
  RETURN_IF_ERROR(ops->device()->CopyToDevice(m->inv_freq_.data, inv.data(), inv.size() * 4));
  if (checkpoint) {
    // A tensor the engine does not use means a model it does not implement
    // (biases, extra norms, experts...): refuse it rather than run it wrong.
    std::vector<std::string> unused;
    for (const std::string& name : checkpoint->TensorNames()) {
      if (used.contains(name) || absl::EndsWith(name, "rotary_emb.inv_freq")) continue;
      // A tied model may still carry a copy of the head; transformers ignores it.
      if (name == "lm_head.weight" && c.tie_word_embeddings) continue;
      unused.push_back(name);
    }
    if (!unused.empty()) {
      const size_t shown = std::min<size_t>(unused.size(), 5);
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec, "' has ", unused.size(), " tensor(s) the engine does not implement: ",
          absl::StrJoin(unused.begin(), unused.begin() + shown, ", "),
          unused.size() > shown ? ", ..." : ""));
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  TANDEM_LOG(INFO) << "loaded model '" << spec << "': " << c.family->hf_architecture << ", "
                   << c.num_hidden_layers << " layers, hidden "
                   << c.hidden_size << ", heads " << c.num_attention_heads << "/"
                   << c.num_key_value_heads << ", vocab " << c.vocab_size << ", "
                   << DTypeName(ops->dtype()) << " (matmul weights " << m->WeightDTypes() << ")"
                   << ", " << m->arena_->used() / (1 << 20) << " MiB of weights in "
                   << absl::StrFormat("%.2f", secs) << " s";
  return m;
}

void LlamaModel::IssuePiece(int piece, int64_t n, const ForwardBuffers& b) const {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const int L = num_layers();
  TANDEM_CHECK(piece >= 0 && piece <= L) << "piece " << piece;
  const LoraSet* lora = b.lora_active ? b.lora : nullptr;
  // out += the adapters' term of a projection they target (LoraSet).
  const auto add_lora = [&](const LoraStack& st, const Tensor& x, const Tensor& out) {
    if (st.a.data != nullptr) ops_->LoraAdd(x, b.lora_slots, st, b.lora_scratch, out);
  };
  if (piece > 0) {
    // Finish layer piece-1: o_proj, residual + post norm, MLP, residual.
    const Layer& prev = layers_[piece - 1];
    ops_->Matmul(b.attn_out.Rows(n), prev.o, b.hidden.Rows(n));
    if (lora) add_lora(lora->o(piece - 1), b.attn_out.Rows(n), b.hidden.Rows(n));
    ops_->AddRmsNorm(b.hidden.Rows(n), b.residual.Rows(n), prev.post_norm, eps, b.normed.Rows(n));
    if (prev.moe.gate_up.data != nullptr) {
      ops_->MoeMlp(b.normed.Rows(n), prev.moe, b.moe, b.meta, b.hidden.Rows(n));
    } else if (lora && lora->gate_up(piece - 1).a.data != nullptr) {
      // The adapters' term joins gate_up before the activation.
      ops_->Matmul(b.normed.Rows(n), prev.gate_up, b.gate_up.Rows(n));
      add_lora(lora->gate_up(piece - 1), b.normed.Rows(n), b.gate_up.Rows(n));
      ops_->SiluMul(b.gate_up.Rows(n), b.mlp_act.Rows(n));
      ops_->Matmul(b.mlp_act.Rows(n), prev.down, b.hidden.Rows(n));
      add_lora(lora->down(piece - 1), b.mlp_act.Rows(n), b.hidden.Rows(n));
    } else {
      ops_->MatmulSiluMul(b.normed.Rows(n), prev.gate_up, b.gate_up.Rows(n), b.mlp_act.Rows(n));
      ops_->Matmul(b.mlp_act.Rows(n), prev.down, b.hidden.Rows(n));
      if (lora) add_lora(lora->down(piece - 1), b.mlp_act.Rows(n), b.hidden.Rows(n));
    }
    const Tensor& next_norm = piece < L ? layers_[piece].input_norm : final_norm_;
    ops_->AddRmsNorm(b.hidden.Rows(n), b.residual.Rows(n), next_norm, eps, b.normed.Rows(n));
  } else {
    ops_->Embedding(b.input_ids, embed_, b.residual.Rows(n));
    ops_->RmsNorm(b.residual.Rows(n), layers_[0].input_norm, eps, b.normed.Rows(n));
  }
  if (piece < L) {
    const Layer& l = layers_[piece];
    ops_->Matmul(b.normed.Rows(n), l.qkv, b.qkv.Rows(n));
    if (lora) add_lora(lora->qkv(piece), b.normed.Rows(n), b.qkv.Rows(n));
    if (config_.family->qkv_bias) ops_->AddBias(b.qkv.Rows(n), l.qkv_bias);
    if (config_.family->qk_norm) {
      ops_->HeadRmsNorm(b.qkv.Rows(n), l.q_norm, l.k_norm, attention_shape(), eps);
    }
    ops_->Rope(b.positions, b.qkv.Rows(n), inv_freq_, attention_shape());
  }
}

void LlamaModel::IssueAttention(int layer, int64_t n, const ForwardBuffers& b,
                                const KvLayer& kv) const {
  AttentionShape shape = attention_shape();
  shape.sliding_window = config_.LayerWindow(layer);
  ops_->PagedAttention(b.qkv.Rows(n), kv, b.meta, shape, b.attn_out.Rows(n));
}

void LlamaModel::IssueLogits(const Tensor& hidden, const Tensor& indices, const Tensor& gathered,
                             const Tensor& logits) const {
  ops_->GatherRows(hidden, indices, gathered);
  ops_->Matmul(gathered, lm_head_, logits);
}

}  // namespace tandem
