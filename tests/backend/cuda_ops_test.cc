// The CUDA backend against the CPU reference: every op on random inputs, graph
// replay against eager, greedy tokens and capture counts of whole engines.
// Every test skips, saying why, when --device=cuda cannot start (no GPU).
//
// Tolerances (|cuda - cpu| <= atol + rtol * |cpu|), with inputs first rounded
// to the storage dtype so both sides see the same values:
//   f32  1e-4   (cuBLAS without TF32 vs OpenBLAS: summation order only)
//   f16  4e-3   (one f16 rounding of each output, ~2^-11, plus accumulation)
//   bf16 2e-2   (one bf16 rounding of each output, ~2^-8, plus accumulation)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "common/base/crc32c.h"
#include "common/engine/engine.h"
#include "common/kernels/backend.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using M = CudaGraphMode;

float Tolerance(DType d) {
  switch (d) {
    case DType::kF16: return 4e-3f;
    case DType::kBF16: return 2e-2f;
    default: return 1e-4f;
  }
}

// A CPU backend and a CUDA backend side by side, with arenas to carve
// tensors holding the same values on both.
class Rig {
 public:
  struct Pair {
    Tensor cpu, gpu;
  };

  static absl::StatusOr<std::unique_ptr<Rig>> Create(DType dtype) {
    auto rig = std::unique_ptr<Rig>(new Rig());
    rig->dtype_ = dtype;
    auto cpu = CreateBackend({"cpu"});
    if (!cpu.ok()) return cpu.status();
    rig->cpu_ = std::move(cpu).value();
    auto gpu = CreateBackend({"cuda", std::string(DTypeName(dtype))});
    if (!gpu.ok()) return gpu.status();
    rig->gpu_ = std::move(gpu).value();
    auto ca = Arena::Create(rig->cpu_->device.get(), size_t{256} << 20, "test-cpu");
    if (!ca.ok()) return ca.status();
    rig->cpu_arena_ = std::move(ca).value();
    auto ga = Arena::Create(rig->gpu_->device.get(), size_t{256} << 20, "test-gpu");
    if (!ga.ok()) return ga.status();
    rig->gpu_arena_ = std::move(ga).value();
    return rig;
  }

  Ops* cpu() { return cpu_->ops.get(); }
  Ops* gpu() { return gpu_->ops.get(); }
  DType dtype() const { return dtype_; }

  // Random values in [lo, hi), rounded to `dtype` (default: the rig's).
  Pair Random(std::initializer_list<int64_t> dims, float lo, float hi,
              std::optional<DType> dtype = std::nullopt) {
    const DType d = dtype.value_or(dtype_);
    Pair p = Alloc(dims, d);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(p.cpu.numel());
    for (float& x : v) x = dist(rng_);
    Set(p, v);
    return p;
  }
  Pair Zeros(std::initializer_list<int64_t> dims, std::optional<DType> dtype = std::nullopt) {
    Pair p = Alloc(dims, dtype.value_or(dtype_));
    Set(p, std::vector<float>(p.cpu.numel(), 0.f));
    return p;
  }
  Pair Ints(std::initializer_list<int64_t> dims, const std::vector<int32_t>& values) {
    Pair p = Alloc(dims, DType::kI32);
    EXPECT_EQ(static_cast<int64_t>(values.size()), p.cpu.numel());
    std::memcpy(p.cpu.data, values.data(), values.size() * 4);
    EXPECT_TRUE(gpu_->device->CopyToDevice(p.gpu.data, values.data(), values.size() * 4).ok());
    return p;
  }

  // Both sides as f32, after the GPU's stream finished.
  std::vector<float> ReadCpu(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }
  std::vector<float> ReadGpu(const Tensor& t) {
    absl::Status s = gpu_->device->stream()->Synchronize();
    EXPECT_TRUE(s.ok()) << s;
    std::vector<char> raw(t.nbytes());
    EXPECT_TRUE(gpu_->device->CopyToHost(raw.data(), t.data, raw.size()).ok());
    std::vector<float> out(t.numel());
    ConvertToF32(raw.data(), t.dtype, out.data(), t.numel());
    return out;
  }

  // Compares the pair elementwise at the rig's tolerance (or `tol`).
  void ExpectClose(const Pair& p, const char* what, float tol = 0.f) {
    tol = tol > 0 ? tol : Tolerance(p.gpu.dtype == DType::kF32 && dtype_ != DType::kF32
                                         ? dtype_
                                         : p.gpu.dtype);
    const std::vector<float> want = ReadCpu(p.cpu), got = ReadGpu(p.gpu);
    ASSERT_EQ(want.size(), got.size());
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = std::fabs(got[i] - want[i]);
      worst = std::max(worst, err);
      if (!(err <= tol + tol * std::fabs(want[i]))) {
        if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: cuda " << got[i] << " cpu " << want[i];
      }
    }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size()
                      << " elements out of tolerance " << tol << " (worst " << worst << ")";
  }

 private:
  Rig() = default;
  Pair Alloc(std::initializer_list<int64_t> dims, DType d) {
    Pair p;
    p.cpu = cpu_arena_->Allocate(d == DType::kI32 ? DType::kI32 : DType::kF32, dims).value();
    p.gpu = gpu_arena_->Allocate(d, dims).value();
    return p;
  }
  // The GPU gets `v` rounded to its dtype; the CPU gets the rounded values.
  void Set(Pair& p, std::vector<float> v) {
    std::vector<char> raw(p.gpu.nbytes());
    ConvertFromF32(v.data(), p.gpu.dtype, raw.data(), p.gpu.numel());
    ConvertToF32(raw.data(), p.gpu.dtype, v.data(), p.gpu.numel());
    std::memcpy(p.cpu.data, v.data(), v.size() * 4);
    EXPECT_TRUE(gpu_->device->CopyToDevice(p.gpu.data, raw.data(), raw.size()).ok());
  }

  DType dtype_ = DType::kF32;
  std::unique_ptr<Backend> cpu_, gpu_;
  std::unique_ptr<Arena> cpu_arena_, gpu_arena_;
  std::mt19937 rng_{1234};
};

class CudaOpsTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    auto rig = Rig::Create(GetParam());
    if (!rig.ok()) GTEST_SKIP() << "CUDA backend unavailable: " << rig.status().message();
    rig_ = std::move(rig).value();
  }
  std::unique_ptr<Rig> rig_;
};

TEST_P(CudaOpsTest, EmbeddingClampsIds) {
  auto table = rig_->Random({100, 64}, -1, 1);
  auto ids = rig_->Ints({7}, {0, 5, 99, -3, 150, 42, 7});
  auto out = rig_->Zeros({7, 64});
  rig_->cpu()->Embedding(ids.cpu, table.cpu, out.cpu);
  rig_->gpu()->Embedding(ids.gpu, table.gpu, out.gpu);
  rig_->ExpectClose(out, "embedding", 1e-6f);  // a copy: exact
}

TEST_P(CudaOpsTest, RmsNormAndFusedAdd) {
  auto x = rig_->Random({9, 576}, -2, 2);
  auto residual = rig_->Random({9, 576}, -2, 2);
  auto w = rig_->Random({576}, 0.5, 1.5);
  auto out = rig_->Zeros({9, 576});
  rig_->cpu()->RmsNorm(x.cpu, w.cpu, 1e-5f, out.cpu);
  rig_->gpu()->RmsNorm(x.gpu, w.gpu, 1e-5f, out.gpu);
  rig_->ExpectClose(out, "rmsnorm");
  rig_->cpu()->AddRmsNorm(x.cpu, residual.cpu, w.cpu, 1e-5f, out.cpu);
  rig_->gpu()->AddRmsNorm(x.gpu, residual.gpu, w.gpu, 1e-5f, out.gpu);
  rig_->ExpectClose(residual, "fused residual");
  rig_->ExpectClose(out, "fused rmsnorm");
}

TEST_P(CudaOpsTest, RopeAtLargePositions) {
  const AttentionShape shape{4, 2, 64, 0.125f};
  auto qkv = rig_->Random({5, (4 + 2 * 2) * 64}, -1, 1);
  auto pos = rig_->Ints({5}, {0, 1, 17, 1000, 4000});
  std::vector<float> freq(32);
  for (int i = 0; i < 32; ++i) freq[i] = std::pow(10000.f, -2.f * i / 64);
  auto inv_freq = rig_->Random({32}, 0, 1, DType::kF32);
  std::memcpy(inv_freq.cpu.data, freq.data(), 32 * 4);
  ASSERT_TRUE(rig_->gpu()->device()->CopyToDevice(inv_freq.gpu.data, freq.data(), 32 * 4).ok());
  rig_->cpu()->Rope(pos.cpu, qkv.cpu, inv_freq.cpu, shape);
  rig_->gpu()->Rope(pos.gpu, qkv.gpu, inv_freq.gpu, shape);
  // f32 angles of ~4000 rad lose ~2^-12 absolutely in either implementation.
  rig_->ExpectClose(qkv, "rope", std::max(Tolerance(rig_->dtype()), 1e-3f));
}

// Qwen2's q/k/v biases and Qwen3's per-head q/k norms (v left as it is).
TEST_P(CudaOpsTest, BiasAndHeadRmsNorm) {
  const AttentionShape shape{4, 2, 64, 0.125f};
  auto qkv = rig_->Random({7, (4 + 2 * 2) * 64}, -2, 2);
  auto bias = rig_->Random({(4 + 2 * 2) * 64}, -1, 1);
  auto q_norm = rig_->Random({64}, 0.5, 1.5);
  auto k_norm = rig_->Random({64}, 0.5, 1.5);
  rig_->cpu()->AddBias(qkv.cpu, bias.cpu);
  rig_->gpu()->AddBias(qkv.gpu, bias.gpu);
  rig_->ExpectClose(qkv, "bias");
  rig_->cpu()->HeadRmsNorm(qkv.cpu, q_norm.cpu, k_norm.cpu, shape, 1e-6f);
  rig_->gpu()->HeadRmsNorm(qkv.gpu, q_norm.gpu, k_norm.gpu, shape, 1e-6f);
  rig_->ExpectClose(qkv, "head rmsnorm");
}

TEST_P(CudaOpsTest, MatmulIncludingF32Logits) {
  auto x = rig_->Random({13, 576}, -1, 1);
  auto w = rig_->Random({1536, 576}, -0.05f, 0.05f);
  auto out = rig_->Zeros({13, 1536});
  rig_->cpu()->Matmul(x.cpu, w.cpu, out.cpu);
  rig_->gpu()->Matmul(x.gpu, w.gpu, out.gpu);
  rig_->ExpectClose(out, "matmul");
  // The LM head writes f32 logits from storage-dtype inputs.
  auto logits = rig_->Zeros({3, 1536}, DType::kF32);
  rig_->cpu()->Matmul(x.cpu.Rows(3), w.cpu, logits.cpu);
  rig_->gpu()->Matmul(x.gpu.Rows(3), w.gpu, logits.gpu);
  rig_->ExpectClose(logits, "f32 logits", Tolerance(rig_->dtype()) / 4 + 1e-4f);
}

// Decode's matmuls (up to kMaxGemvRows rows) take the weight-streaming
// kernel, larger batches and unaligned widths cuBLAS: every row count on
// both sides of the switch, widths that fill and that do not fill a group's
// vectors, an odd number of output rows, and f32 logits.
TEST_P(CudaOpsTest, SmallBatchMatmulEveryRowCount) {
  for (int64_t k : {576, 2048, 72, 100}) {
    auto x = rig_->Random({10, k}, -1, 1);
    for (int64_t big_n : {37, 1536}) {
      auto w = rig_->Random({big_n, k}, -0.05f, 0.05f);
      for (int64_t m = 1; m <= 10; ++m) {
        SCOPED_TRACE(testing::Message() << "m " << m << " n " << big_n << " k " << k);
        auto out = rig_->Zeros({m, big_n});
        rig_->cpu()->Matmul(x.cpu.Rows(m), w.cpu, out.cpu);
        rig_->gpu()->Matmul(x.gpu.Rows(m), w.gpu, out.gpu);
        rig_->ExpectClose(out, "matmul");
        auto logits = rig_->Zeros({m, big_n}, DType::kF32);
        rig_->cpu()->Matmul(x.cpu.Rows(m), w.cpu, logits.cpu);
        rig_->gpu()->Matmul(x.gpu.Rows(m), w.gpu, logits.gpu);
        rig_->ExpectClose(logits, "f32 logits", Tolerance(rig_->dtype()) / 4 + 1e-4f);
      }
    }
  }
}

// The gate/up projection with SiLU x up in its epilogue at decode sizes: bit
// for bit the GPU's separate Matmul and SiluMul, at every row count on both
// sides of the switch, and close to the CPU.
TEST_P(CudaOpsTest, MatmulSiluMulEqualsItsParts) {
  const int64_t h = 576, inter = 1536;
  auto x = rig_->Random({6, h}, -1, 1);
  auto w = rig_->Random({2 * inter, h}, -0.05f, 0.05f);
  for (int64_t m = 1; m <= 6; ++m) {
    SCOPED_TRACE(m);
    auto gate_up = rig_->Zeros({m, 2 * inter});
    auto fused = rig_->Zeros({m, inter});
    auto parts = rig_->Zeros({m, inter});
    rig_->gpu()->MatmulSiluMul(x.gpu.Rows(m), w.gpu, gate_up.gpu, fused.gpu);
    rig_->gpu()->Matmul(x.gpu.Rows(m), w.gpu, gate_up.gpu);
    rig_->gpu()->SiluMul(gate_up.gpu, parts.gpu);
    EXPECT_EQ(rig_->ReadGpu(fused.gpu), rig_->ReadGpu(parts.gpu));
    rig_->cpu()->MatmulSiluMul(x.cpu.Rows(m), w.cpu, gate_up.cpu, fused.cpu);
    rig_->ExpectClose(fused, "silu_mul of gate_up");
  }
}

TEST_P(CudaOpsTest, SiluMulAndGatherRows) {
  auto gate_up = rig_->Random({6, 256}, -4, 4);
  auto act = rig_->Zeros({6, 128});
  rig_->cpu()->SiluMul(gate_up.cpu, act.cpu);
  rig_->gpu()->SiluMul(gate_up.gpu, act.gpu);
  rig_->ExpectClose(act, "silu_mul");
  auto src = rig_->Random({10, 64}, -1, 1);
  auto idx = rig_->Ints({3}, {7, 0, 9});
  auto gathered = rig_->Zeros({3, 64});
  rig_->cpu()->GatherRows(src.cpu, idx.cpu, gathered.cpu);
  rig_->gpu()->GatherRows(src.gpu, idx.gpu, gathered.gpu);
  rig_->ExpectClose(gathered, "gather", 1e-6f);
}

// A paged-attention case: requests of (cached, new) tokens, blocks shuffled.
struct AttentionCase {
  std::vector<std::pair<int, int>> reqs;
  int padded_rows;
  bool decode_only;
  int head_dim = 64;
  int sliding_window = 0;
};

void RunAttention(Rig* rig, const AttentionCase& c) {
  const int hd = c.head_dim;
  AttentionShape shape{8, 2, hd, 1.f / std::sqrt(static_cast<float>(hd))};
  shape.sliding_window = c.sliding_window;
  const int bs = 16, max_seqs = 8, table_width = 128;  // up to 2048 tokens
  const int num_blocks = 600;
  const int row = (8 + 2 * 2) * hd;
  auto qkv = rig->Random({c.padded_rows, row}, -1, 1);
  auto k = rig->Random({num_blocks, bs, 2, hd}, -1, 1);
  auto v = rig->Random({num_blocks, bs, 2, hd}, -1, 1);
  std::vector<int32_t> blocks(num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(7));
  std::vector<int32_t> qsl = {0}, seq_lens, tables(max_seqs * table_width, 0),
                       slots(c.padded_rows, -1);
  int next_block = 0, tok = 0;
  for (size_t r = 0; r < c.reqs.size(); ++r) {
    const auto [cached, fresh] = c.reqs[r];
    const int len = cached + fresh;
    for (int b = 0; b < (len + bs - 1) / bs; ++b) tables[r * table_width + b] = blocks[next_block++];
    for (int i = 0; i < fresh; ++i, ++tok) {
      const int pos = cached + i;
      slots[tok] = tables[r * table_width + pos / bs] * bs + pos % bs;
    }
    qsl.push_back(tok);
    seq_lens.push_back(len);
  }
  qsl.resize(max_seqs + 1, tok);
  seq_lens.resize(max_seqs, 0);
  AttentionMetadata cm, gm;
  Rig::Pair num_reqs = rig->Ints({1}, {static_cast<int32_t>(c.reqs.size())});
  Rig::Pair q = rig->Ints({max_seqs + 1}, qsl);
  Rig::Pair sl = rig->Ints({max_seqs}, seq_lens);
  Rig::Pair bt = rig->Ints({max_seqs, table_width}, tables);
  Rig::Pair sm = rig->Ints({c.padded_rows}, slots);
  const size_t ws = rig->gpu()->AttentionWorkspaceBytes(shape, max_seqs, table_width * bs);
  Rig::Pair workspace = rig->Zeros({static_cast<int64_t>(ws / 4) + 1}, DType::kF32);
  for (auto [m, side] : {std::pair{&cm, 0}, std::pair{&gm, 1}}) {
    auto pick = [&, gpu = side == 1](const Rig::Pair& p) { return gpu ? p.gpu : p.cpu; };
    m->num_reqs = pick(num_reqs);
    m->query_start_loc = pick(q);
    m->seq_lens = pick(sl);
    m->block_tables = pick(bt);
    m->slot_mapping = pick(sm);
    m->workspace = pick(workspace);
    m->block_size = bs;
    m->decode_only = c.decode_only;
  }
  auto out = rig->Random({c.padded_rows, 8 * hd}, -1, 1);  // padding rows must become 0
  rig->cpu()->PagedAttention(qkv.cpu, {k.cpu, v.cpu}, cm, shape, out.cpu);
  rig->gpu()->PagedAttention(qkv.gpu, {k.gpu, v.gpu}, gm, shape, out.gpu);
  rig->ExpectClose(k, "k cache", 1e-6f);
  rig->ExpectClose(v, "v cache", 1e-6f);
  rig->ExpectClose(out, "attention");
}

TEST_P(CudaOpsTest, MixedAttentionPrefillChunkAndDecode) {
  // A new 37-token prompt, a decode at 600 cached tokens, a 20-token chunk
  // after 100 cached, then 3 rows of padding.
  RunAttention(rig_.get(), {{{0, 37}, {600, 1}, {100, 20}}, 61, false});
}

// Prompts long enough for 64-row query tiles of one request (tensor cores on
// sm_80+ with 16-bit storage), after a cached prefix and from scratch, with
// tiles that straddle a request boundary and padding beside them; head_dim 64
// and 128 (both tensor-core shapes) and 96 (CUDA cores).
TEST_P(CudaOpsTest, LongPromptAttentionOnEveryPath) {
  for (int hd : {64, 128, 96}) {
    SCOPED_TRACE(hd);
    RunAttention(rig_.get(), {{{0, 300}, {600, 1}, {130, 200}}, 512, false, hd});
  }
}

// Sliding windows on every path against the CPU's: one key (the query's
// own), shorter than a query tile, longer than a flash tile's keys, and
// across decode splits.
TEST_P(CudaOpsTest, SlidingWindowAttentionOnEveryPath) {
  for (int window : {1, 13, 100, 700}) {
    for (int hd : {64, 96}) {
      SCOPED_TRACE(testing::Message() << "window " << window << " hd " << hd);
      RunAttention(rig_.get(), {{{0, 300}, {600, 1}, {130, 200}}, 512, false, hd, window});
    }
    RunAttention(rig_.get(), {{{0, 1}, {16, 1}, {510, 1}, {1299, 1}}, 8, true, 64, window});
  }
}

TEST_P(CudaOpsTest, DecodeAttentionSplitsLongContexts) {
  // Contexts around the 512-key split boundary and past several splits;
  // 5 requests padded to 8 rows.
  RunAttention(rig_.get(), {{{0, 1}, {16, 1}, {510, 1}, {511, 1}, {1299, 1}}, 8, true});
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaOpsTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// --- whole engines -------------------------------------------------------------

absl::StatusOr<std::unique_ptr<LlmEngine>> MakeEngine(const std::string& device,
                                                      const std::string& dtype, M mode,
                                                      bool prefix_caching = true,
                                                      bool debug_async_kv_reads = false) {
  EngineConfig c;
  c.enable_prefix_caching = prefix_caching;
  c.backend.debug_async_kv_reads = debug_async_kv_reads;
  c.model = "synthetic";
  c.backend.device = device;
  c.backend.dtype = dtype;
  c.runner.graph.requested_mode = mode;
  c.runner.max_num_batched_tokens = 256;
  c.runner.max_num_seqs = 16;
  c.runner.max_model_len = 1024;
  c.runner.check_input_addresses = true;
  return LlmEngine::Create(c);
}

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (seed * 97 + i * 13) % 509 + 3;
  return t;
}

std::map<std::string, std::vector<int32_t>> Greedy(LlmEngine* e) {
  SamplingParams p;
  p.max_tokens = 10;
  p.ignore_eos = true;
  for (int i = 0; i < 8; ++i) {  // 1..~600 tokens, the long ones chunked
    EXPECT_TRUE(e->AddRequest("r" + std::to_string(i), Prompt(1 + i * i * 11, i), p).ok());
  }
  std::map<std::string, std::vector<int32_t>> out;
  for (int guard = 0; e->HasWork() && guard < 10000; ++guard) {
    auto step = e->Step();
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) break;
    for (const auto& o : *step) out[o.id].insert(out[o.id].end(), o.new_tokens.begin(), o.new_tokens.end());
  }
  return out;
}

#define SKIP_WITHOUT_GPU(engine_or)                                                        \
  if (!(engine_or).ok()) GTEST_SKIP() << "CUDA backend unavailable: "                     \
                                      << (engine_or).status().message()

TEST(CudaEngineTest, GreedyTokensEqualCpuInF32) {
  auto cpu = MakeEngine("cpu", "auto", M::kNone);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const auto want = Greedy(cpu->get());
  for (M mode : {M::kNone, M::kFullDecodeOnly, M::kPiecewise, M::kFullAndPiecewise}) {
    SCOPED_TRACE(mode.name());
    auto gpu = MakeEngine("cuda", "f32", mode);
    SKIP_WITHOUT_GPU(gpu);
    EXPECT_EQ(Greedy(gpu->get()), want);
    EXPECT_EQ((*gpu)->kv_cache().pool().num_used(), 0);
  }
}

// In f16 and bf16 a near-tie may flip an argmax, so half precision is held
// to the logits instead: one prefill of 40 tokens per request and one decode
// step after it, relative L2 error against the CPU's f32 logits.
TEST(CudaEngineTest, HalfPrecisionLogitsTrackCpu) {
  auto cpu = MakeEngine("cpu", "auto", M::kNone);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  for (const auto& [dtype, limit] : {std::pair{"f16", 1e-2}, std::pair{"bf16", 5e-2}}) {
    SCOPED_TRACE(dtype);
    auto gpu = MakeEngine("cuda", dtype, M::kFullAndPiecewise);
    SKIP_WITHOUT_GPU(gpu);
    std::vector<float> logits[2];
    for (int side = 0; side < 2; ++side) {
      LlmEngine& e = side == 0 ? **cpu : **gpu;
      KvCache& kv = e.kv_cache();
      const std::vector<int32_t> prompt = Prompt(40, 3);
      const int32_t next = 17;
      ASSERT_TRUE(kv.EnsureCapacity("x", 41).ok());
      std::vector<ScheduledSeq> prefill = {{prompt.data(), 40, 0, kv.BlockTable("x"), true}};
      auto r = e.runner().Execute(prefill, false);
      ASSERT_TRUE(r.ok()) << r.status();
      logits[side].assign(r->logits, r->logits + e.model_config().vocab_size);
      std::vector<ScheduledSeq> decode = {{&next, 1, 40, kv.BlockTable("x"), true}};
      r = e.runner().Execute(decode, false);
      ASSERT_TRUE(r.ok()) << r.status();
      logits[side].insert(logits[side].end(), r->logits, r->logits + e.model_config().vocab_size);
      kv.Free("x");
    }
    double err = 0, norm = 0;
    for (size_t i = 0; i < logits[0].size(); ++i) {
      err += (logits[1][i] - logits[0][i]) * (logits[1][i] - logits[0][i]);
      norm += logits[0][i] * logits[0][i];
    }
    EXPECT_LT(std::sqrt(err / norm), limit);
  }
}

TEST(CudaEngineTest, CaptureCountsEqualCpu) {
  for (M mode : {M::kFullDecodeOnly, M::kPiecewise, M::kFullAndPiecewise}) {
    SCOPED_TRACE(mode.name());
    auto gpu = MakeEngine("cuda", "bf16", mode);
    SKIP_WITHOUT_GPU(gpu);
    auto cpu = MakeEngine("cpu", "auto", mode);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    const RunnerStats& g = (*gpu)->runner().stats();
    const RunnerStats& c = (*cpu)->runner().stats();
    EXPECT_EQ(g.captured[CudaGraphMode::kPiecewise], c.captured[CudaGraphMode::kPiecewise]);  // PIECEWISE
    EXPECT_EQ(g.captured[CudaGraphMode::kFull], c.captured[CudaGraphMode::kFull]);  // FULL
    EXPECT_GT(g.captured[CudaGraphMode::kPiecewise] + g.captured[CudaGraphMode::kFull], 0);
    EXPECT_EQ((*gpu)->runner().resolved_mode(), (*cpu)->runner().resolved_mode());
  }
}

// Replays of FULL graphs give the eager step's logits bit for bit (same
// shapes: batch sizes on the capture ladder, so no padding).
TEST(CudaEngineTest, FullReplayEqualsEager) {
  auto gpu = MakeEngine("cuda", "bf16", M::kFullAndPiecewise);
  SKIP_WITHOUT_GPU(gpu);
  ModelRunner& runner = (*gpu)->runner();
  KvCache& kv = (*gpu)->kv_cache();
  std::vector<int32_t> tokens(8, 11);
  const int vocab = (*gpu)->model_config().vocab_size;
  for (int batch : {1, 4, 8}) {
    for (int context : {5, 300}) {
      std::vector<ScheduledSeq> seqs;
      for (int i = 0; i < batch; ++i) {
        const std::string id = "d" + std::to_string(i);
        ASSERT_TRUE(kv.EnsureCapacity(id, context + 1).ok());
        tokens[i] = 3 + i * 7 + context;
        seqs.push_back({tokens.data() + i, 1, context, kv.BlockTable(id), true});
      }
      auto eager = runner.Execute(seqs, /*force_eager=*/true);
      ASSERT_TRUE(eager.ok()) << eager.status();
      std::vector<float> want(eager->logits, eager->logits + batch * vocab);
      const int64_t replays = runner.stats().replays[CudaGraphMode::kFull];
      auto graph = runner.Execute(seqs, false);
      ASSERT_TRUE(graph.ok()) << graph.status();
      EXPECT_EQ(graph->runtime_mode, M::kFull);
      EXPECT_EQ(runner.stats().replays[CudaGraphMode::kFull], replays + 1);
      EXPECT_EQ(std::memcmp(want.data(), graph->logits, want.size() * 4), 0)
          << "batch " << batch << " context " << context;
      for (int i = 0; i < batch; ++i) kv.Free("d" + std::to_string(i));
    }
  }
}

// A request's KV rows cross between a CPU and a CUDA engine in both
// directions, as a P/D pair moves them: rows imported into the GPU's blocks
// (ScatterToDevice) read back bit for bit (IssueGather) with the CPU's
// checksum and decode to the CPU's greedy tokens; rows the GPU computed read
// out close to the CPU's, with the checksum of the bytes returned. No block
// is left held on either side.
TEST(CudaEngineTest, KvRowsCrossBetweenCpuAndCuda) {
  auto cpu = MakeEngine("cpu", "f32", M::kNone);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  // No prefix caching: the imported request must not find the GPU's own
  // prefill of the same prompt.
  auto gpu = MakeEngine("cuda", "f32", M::kFullAndPiecewise, /*prefix_caching=*/false);
  SKIP_WITHOUT_GPU(gpu);
  const std::vector<int32_t> prompt = Prompt(300, 5);  // two chunks, 19 blocks
  const int64_t n = static_cast<int64_t>(prompt.size());
  SamplingParams once;
  once.max_tokens = 1;
  once.ignore_eos = true;
  for (LlmEngine* e : {cpu->get(), gpu->get()}) {
    ASSERT_TRUE(e->AddRequest("p", prompt, once, RequestKind::kPrefillOnly).ok());
    while (e->HasWork()) ASSERT_TRUE(e->Step().ok());
  }
  SamplingParams greedy;
  greedy.max_tokens = 8;
  greedy.ignore_eos = true;
  ASSERT_TRUE((*gpu)->AddRequest("d", prompt, greedy, RequestKind::kRemotePrefill).ok());
  auto reserved = (*gpu)->Step();
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  ASSERT_EQ((*gpu)->num_waiting_for_remote_kv(), 1u);
  const int64_t w = (*cpu)->kv_cache().slot_width();
  const size_t bytes = static_cast<size_t>(n * w) * sizeof(float);
  for (int layer = 0; layer < (*cpu)->model_config().num_hidden_layers; ++layer) {
    SCOPED_TRACE(layer);
    std::vector<float> k(n * w), v(n * w), k2(n * w), v2(n * w);
    auto crc = (*cpu)->ReadKv("p", layer, 0, n, k.data(), v.data());
    ASSERT_TRUE(crc.ok()) << crc.status();
    // Pieces of 1000 bytes, as gRPC's slices cut a message anywhere.
    std::vector<absl::string_view> kp, vp;
    for (size_t at = 0; at < bytes; at += 1000) {
      kp.push_back(absl::string_view(reinterpret_cast<const char*>(k.data()), bytes).substr(at, 1000));
      vp.push_back(absl::string_view(reinterpret_cast<const char*>(v.data()), bytes).substr(at, 1000));
    }
    ASSERT_TRUE((*gpu)->ImportKv("d", layer, 0, n, kp, vp).ok());
    auto back = (*gpu)->ReadKv("d", layer, 0, n, k2.data(), v2.data());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, *crc);
    EXPECT_EQ(k2, k);
    EXPECT_EQ(v2, v);
    // The GPU's own prefill, read out: the CPU's rows to 1e-3 (the layers
    // before it add up f32 summation-order differences; a row out of place
    // is off by the rows' own size).
    auto own = (*gpu)->ReadKv("p", layer, 0, n, k2.data(), v2.data());
    ASSERT_TRUE(own.ok()) << own.status();
    EXPECT_EQ(*own, Crc32c(Crc32c(0, k2.data(), bytes), v2.data(), bytes));
    for (int64_t i = 0; i < n * w; ++i) {
      ASSERT_NEAR(k2[i], k[i], 1e-3f + 1e-3f * std::fabs(k[i])) << i;
      ASSERT_NEAR(v2[i], v[i], 1e-3f + 1e-3f * std::fabs(v[i])) << i;
    }
  }
  // The imported rows are where the GPU's attention reads them: its tokens
  // after them are the CPU's own.
  ASSERT_TRUE((*cpu)->AddRequest("local", prompt, greedy).ok());
  std::vector<int32_t> want, got;
  while ((*cpu)->HasWork()) {
    auto o = (*cpu)->Step();
    ASSERT_TRUE(o.ok());
    for (const RequestOutput& x : *o) {
      if (x.id == "local") want.insert(want.end(), x.new_tokens.begin(), x.new_tokens.end());
    }
  }
  ASSERT_EQ(want.size(), 8u);
  ASSERT_TRUE((*gpu)->RemoteKvArrived("d", want[0]).ok());  // the first of its outputs
  while ((*gpu)->HasWork()) {
    auto o = (*gpu)->Step();
    ASSERT_TRUE(o.ok()) << o.status();
    for (const RequestOutput& x : *o) {
      if (x.id == "d") got.insert(got.end(), x.new_tokens.begin(), x.new_tokens.end());
    }
  }
  EXPECT_EQ(got, want);
  for (LlmEngine* e : {cpu->get(), gpu->get()}) {
    ASSERT_TRUE(e->Abort("p").ok());
    EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
  }
}

}  // namespace
// On a GPU the layer hook comes when a layer's ops are issued, ahead of the
// device: reads issued there (LlmEngine::IssueKvRead, as the prefill
// worker's exporter does) are ordered after the layer's KV writes, so once
// finished they hold exactly what a read after the step finds. Every
// PIECEWISE prompt step calls the hook once per layer. The same body runs on
// the CPU with reads that complete late (--debug-async-kv-reads).
void ExpectLayerHookReadsHoldTheStepsRows(LlmEngine* e) {
  ASSERT_TRUE(e->kv_reads_async());
  const int layers = e->model_config().num_hidden_layers;
  const std::vector<int32_t> prompt = Prompt(300, 7);  // two steps of the 256-token budget
  const int64_t n = static_cast<int64_t>(prompt.size());
  SamplingParams once;
  once.max_tokens = 1;
  once.ignore_eos = true;
  ASSERT_TRUE(e->AddRequest("p", prompt, once, RequestKind::kPrefillOnly).ok());
  struct Issued {
    int layer;
    int64_t first, count;
    KvRead read;
  };
  std::vector<Issued> issued;
  std::vector<int64_t> sent(layers, 0);  // rows of each layer issued so far
  int hooks = 0;
  auto on_layer = [&](int layer) {
    ++hooks;
    const int64_t ready = e->KvReadyTokens("p", layer);
    if (ready <= sent[layer]) return;
    auto read = e->IssueKvRead("p", layer, sent[layer], ready - sent[layer]);
    ASSERT_TRUE(read.ok()) << read.status();
    issued.push_back({layer, sent[layer], ready - sent[layer], std::move(*read)});
    sent[layer] = ready;
  };
  e->SetLayerHook([&](int layer) {
    on_layer(layer);
    return false;  // the reads are finished after the steps
  });
  int steps = 0;
  while (e->HasWork()) {
    ASSERT_TRUE(e->Step().ok());
    ++steps;
  }
  e->SetLayerHook(nullptr);
  EXPECT_EQ(steps, 2);
  EXPECT_GE(hooks, 2 * layers);
  ASSERT_EQ(issued.size(), static_cast<size_t>(2 * layers));
  for (int l = 0; l < layers; ++l) EXPECT_EQ(sent[l], n) << "layer " << l;
  const int64_t w = e->kv_cache().slot_width();
  for (Issued& x : issued) {
    SCOPED_TRACE(testing::Message() << "layer " << x.layer << " rows " << x.first);
    std::vector<float> k(x.count * w), v(x.count * w), k2(x.count * w), v2(x.count * w);
    auto crc = x.read.Finish(k.data(), v.data());
    ASSERT_TRUE(crc.ok()) << crc.status();
    auto after = e->ReadKv("p", x.layer, x.first, x.count, k2.data(), v2.data());
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(*crc, *after);
    EXPECT_EQ(k, k2);
    EXPECT_EQ(v, v2);
  }
  issued.clear();
  ASSERT_TRUE(e->Abort("p").ok());
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
}

TEST(CudaEngineTest, ReadsIssuedFromTheLayerHookHoldTheStepsRows) {
  auto gpu = MakeEngine("cuda", "f32", M::kPiecewise);
  SKIP_WITHOUT_GPU(gpu);
  ExpectLayerHookReadsHoldTheStepsRows(gpu->get());
}

TEST(CudaEngineTest, LateCpuReadsIssuedFromTheLayerHookHoldTheStepsRows) {
  auto cpu = MakeEngine("cpu", "f32", M::kPiecewise, /*prefix_caching=*/true,
                        /*debug_async_kv_reads=*/true);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ExpectLayerHookReadsHoldTheStepsRows(cpu->get());
}

}  // namespace tandem
