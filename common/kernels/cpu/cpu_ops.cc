// CPU implementation of Ops: each op is a closure over its tensors, launched
// on the CpuStream (run now, or recorded while capturing). Every op splits its
// work over one ThreadPool (--threads), in eager steps and graph replays
// alike: matmuls by output columns (each thread's slice through the kernels of
// cpu_kernels.h, on the Highway target the CPU runs best), attention by
// (request, KV head, query tile) for prefill chunks and by (token, KV head)
// for the rest, the row-wise ops by rows.
#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/backend/cpu/cpu_stream.h"
#include "common/base/logging.h"
#include "common/base/thread_pool.h"
#include "common/kernels/cpu/cpu_kernels.h"
#include "common/kernels/ops.h"

namespace tandem {
namespace {

// The start-up log's word on bf16 prefill where the CPU has AVX512-BF16:
// which kernel multiplies it, and the measurement that chose it.
std::string Bf16PrefillNote() {
  if (!cpu::HasAvx512Bf16()) return "";
  return absl::StrFormat(" (AVX512-BF16's vdpbf16ps at %.2fx the FMA's rate here: %s)",
                         cpu::DpBf16Speedup(),
                         cpu::PreferDpBf16() ? "bf16 prefill by vdpbf16ps"
                                             : "bf16 prefill by f32 FMAs");
}

// Floats of widened weight rows per thread (4 MiB). sgemm packs the
// activations again for every chunk of weight rows, so chunks are large:
// a 512-token bf16 prefill took 1317 ms with 256 KiB chunks, 1217 with these.
constexpr int64_t kScratchFloats = 1024 * 1024;

// out[n, big_n] = a[n, k] . w^T for weights `b` of type `wt` (checked by
// CheckMatmulWeights when issued), now, split over `pool` by output columns;
// what a launched matmul runs, and what MoeMlp runs for each expert's rows.
void MatmulNow(ThreadPool* pool, std::vector<std::vector<float>>* scratch, const float* a,
               int64_t n, DType wt, const uint8_t* b, int64_t k, int64_t big_n, float* c) {
  if (n == 0) return;
  const size_t row_bytes = DTypeBytes(wt, k);
  const bool small = n <= cpu::kSmallMatmulMaxRows;
  // Block weights as integers at every row count on x86 from AVX2 up (the
  // interleaved products above 16 rows on AVX-512, 32 on AVX2), in runs of
  // rows whose int16 quants fit the thread's scratch. Against widening the
  // weights for the f32 tiles or sgemm: docs/benchmarks.md, "Interleaved
  // block rows".
  const bool integer = IsBlockType(wt) && (small || cpu::BlocksAtEveryRowCount());
  int64_t run = n;
  while (integer && run > 1 && cpu::MatmulBlocksScratchFloats(run, k) > kScratchFloats) {
    run = (run + 1) / 2;
  }
  const bool dp_bf16 = wt == DType::kBF16 && !small && cpu::PreferDpBf16() &&
                       cpu::MatmulDpBf16ScratchElems(k) <= 2 * kScratchFloats;
  // Prefill-sized f32 products: the register tiles on AVX-512 targets,
  // OpenBLAS's sgemm below them. SmolLM2 512-token f32 prefill on a 2-vCPU
  // Zen 5, 2 threads: AVX-512 tiles 324 GFLOP/s, 1.35x the sgemm probe;
  // the same tiles on the AVX2 target (2 x 4: 16 registers) 158 GFLOP/s,
  // 0.66x sgemm's 240 (which packs its operands for its cache blocking).
  const bool sgemm = !small && !cpu::TargetHasAvx512();
  const auto multiply = [sgemm](const float* x, int64_t rows, const float* wf, int64_t kk,
                                int64_t j0, int64_t j1, float* o, int64_t ldo) {
    if (!sgemm) return cpu::MatmulF32(x, kk, rows, wf, kk, j0, j1, o, ldo);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, j1 - j0, kk, 1.f, x, kk,
                wf + j0 * kk, kk, 0.f, o + j0, ldo);
  };
  // Slices of output columns, 16 at least (64 bytes of each output row).
  pool->ParallelFor(big_n, 16, [=](int64_t j0, int64_t j1) {
    if (wt == DType::kF32) {
      return multiply(a, n, reinterpret_cast<const float*>(b), k, j0, j1, c, big_n);
    }
    if (wt == DType::kBF16 && !dp_bf16 && !sgemm) {
      return cpu::MatmulBf16(a, k, n, reinterpret_cast<const uint16_t*>(b), k, j0, j1, c, big_n);
    }
    float* rows = (*scratch)[ThreadPool::CurrentThread()].data();
    if (dp_bf16) {
      return cpu::MatmulDpBf16(a, k, n, reinterpret_cast<const uint16_t*>(b), k, j0, j1, c,
                               big_n, reinterpret_cast<uint16_t*>(rows));
    }
    if (integer) {  // blocks multiplied as integers in registers
      for (int64_t r = 0; r < n; r += run) {
        cpu::MatmulBlocks(wt, a + r * k, k, std::min(run, n - r), b, k, j0, j1, c + r * big_n,
                          big_n, rows);
      }
      return;
    }
    // Prefill: widen this slice's weight rows a chunk at a time into the
    // thread's scratch, and multiply each chunk as f32.
    const int64_t chunk = std::max<int64_t>(1, kScratchFloats / k);
    for (int64_t j = j0; j < j1; j += chunk) {
      const int64_t m = std::min(chunk, j1 - j);
      cpu::WidenRow(wt, b + j * row_bytes, m * k, rows);
      multiply(a, n, rows, k, 0, m, c + j, big_n);
    }
  });
}

void CheckMatmulWeights(const Tensor& w) {
  const DType wt = w.dtype;
  TANDEM_CHECK(wt == DType::kF32 || wt == DType::kBF16 ||
               (IsBlockType(wt) && w.dim(w.ndim - 1) % kBlockElems == 0))
      << DTypeName(wt) << " weights " << w.ShapeString();
}

// MoeMlp's routing of one step: for each expert, the rows sent to it and
// their scores (host vectors whose capacity is kept from step to step).
struct MoeRouting {
  std::vector<std::vector<int32_t>> rows;
  std::vector<std::vector<float>> scores;
  std::vector<int32_t> order;
};

class CpuOps : public Ops {
 public:
  CpuOps(Device* device, int threads, DType weight_dtype, DType kv_dtype, bool keep_file_blocks)
      : device_(device),
        stream_(static_cast<CpuStream*>(device->stream())),
        pool_(std::make_unique<ThreadPool>(threads > 0 ? threads : ThreadPool::AvailableCpus())),
        weight_dtype_(weight_dtype),
        kv_dtype_(kv_dtype),
        keep_file_blocks_(keep_file_blocks) {
    TANDEM_CHECK(weight_dtype_ == DType::kF32 || weight_dtype_ == DType::kBF16 ||
                 weight_dtype_ == DType::kQ8_0)
        << DTypeName(weight_dtype_);
    TANDEM_CHECK(kv_dtype_ == DType::kF32 || kv_dtype_ == DType::kBF16) << DTypeName(kv_dtype_);
    // Parallelism is the pool's: each thread's sgemm runs on that thread.
    openblas_set_num_threads(1);
    if (weight_dtype_ != DType::kF32 || keep_file_blocks_) {
      // Per-thread rows of widened weights for prefill, allocated
      // here so that no step allocates.
      scratch_.assign(pool_->num_threads(), std::vector<float>(kScratchFloats));
    }
    TANDEM_LOG(INFO) << "cpu backend: " << pool_->num_threads() << " threads, "
                     << "Highway kernels on " << cpu::Target()
                     << Bf16PrefillNote()
                     << (cpu::TargetHasAvx512()
                             ? std::string()
                             : std::string(cpu::BlocksAtEveryRowCount()
                                               ? ", f32/bf16 prefill by OpenBLAS sgemm ("
                                               : ", prefill by OpenBLAS sgemm (") +
                                   openblas_get_corename() + " kernels)")
                     << ", weights "
                     << DTypeName(weight_dtype_) << ", KV "
                     << DTypeName(kv_dtype_) << ", activations f32"
                     << (keep_file_blocks_ ? "; GGUF Q4_0/Q4_1/Q8_0 weights kept as they are, Q4_K as "
                                              "Q4_1, other block types as Q8_0"
                                            : "");
  }

  Device* device() override { return device_; }
  DType dtype() const override { return DType::kF32; }
  DType weight_dtype() const override { return weight_dtype_; }
  DType kv_dtype() const override { return kv_dtype_; }
  bool keeps_file_blocks() const override { return keep_file_blocks_; }
  // Attention reads num_reqs, offsets, lengths and block tables from buffers
  // when it runs, so any batch may be captured.
  AttentionCgSupport attention_cg_support() const override { return AttentionCgSupport::kAlways; }
  size_t AttentionWorkspaceBytes(const AttentionShape&, int, int) const override { return 0; }

  void Embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    TANDEM_CHECK(out.dim(0) <= ids.dim(0) && out.dim(1) == table.dim(1))
        << out.ShapeString() << " " << ids.ShapeString() << " " << table.ShapeString();
    const int64_t n = out.dim(0), h = table.dim(1), vocab = table.dim(0);
    const int32_t* id = ids.i32();
    const void* t = table.data;
    const DType dt = table.dtype;
    const size_t row_bytes = DTypeBytes(dt, h);
    // The types cpu::WidenRow takes in vectors; others (f16) one by one.
    const bool widen = dt == DType::kF32 || dt == DType::kBF16 ||
                       ((dt == DType::kQ8_0 || dt == DType::kQ4_0 || dt == DType::kQ4_1) &&
                        h % kBlockElems == 0);
    float* o = out.f32();
    stream_->Launch("embedding", [=] {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = std::min<int64_t>(std::max<int32_t>(id[i], 0), vocab - 1);
        const char* src = static_cast<const char*>(t) + row * row_bytes;
        if (widen) {
          cpu::WidenRow(dt, src, h, o + i * h);
        } else {
          ConvertToF32(src, dt, o + i * h, h);
        }
      }
    });
  }

  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override {
    const int64_t n = out.dim(0), h = out.dim(1);
    TANDEM_CHECK(x.dim(1) == h && weight.dim(0) == h);
    const float* xs = x.f32();
    const float* w = weight.f32();
    float* o = out.f32();
    ThreadPool* pool = pool_.get();
    stream_->Launch("norm", [=] {
      pool->ParallelFor(n, kMinRows, [=](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          cpu::RmsNormRow(xs + i * h, nullptr, nullptr, w, eps, h, o + i * h);
        }
      });
    });
  }

  void AddRmsNorm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                  const Tensor& out) override {
    const int64_t n = out.dim(0), h = out.dim(1);
    TANDEM_CHECK(x.dim(1) == h && residual.dim(1) == h && weight.dim(0) == h);
    const float* xs = x.f32();
    float* r = residual.f32();
    const float* w = weight.f32();
    float* o = out.f32();
    ThreadPool* pool = pool_.get();
    stream_->Launch("norm", [=] {
      pool->ParallelFor(n, kMinRows, [=](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          cpu::RmsNormRow(r + i * h, xs + i * h, r + i * h, w, eps, h, o + i * h);
        }
      });
    });
  }

  void Rope(const Tensor& positions, const Tensor& qkv, const Tensor& inv_freq,
            const AttentionShape& shape) override {
    const int64_t n = qkv.dim(0), row = qkv.dim(1);
    const int heads = shape.num_heads + shape.num_kv_heads;
    const int hd = shape.head_dim, half = hd / 2;
    TANDEM_CHECK(inv_freq.dim(0) == half);
    const int32_t* pos = positions.i32();
    const float* freq = inv_freq.f32();
    float* base = qkv.f32();
    ThreadPool* pool = pool_.get();
    stream_->Launch("rope", [=] {
      pool->ParallelFor(n, kMinRows, [=](int64_t begin, int64_t end) {
        thread_local std::vector<float> cos, sin;
        cos.resize(half);
        sin.resize(half);
        for (int64_t i = begin; i < end; ++i) {
          const float p = static_cast<float>(pos[i]);
          for (int f = 0; f < half; ++f) {
            const float angle = p * freq[f];
            cos[f] = std::cos(angle);
            sin[f] = std::sin(angle);
          }
          cpu::RopeRow(base + i * row, heads, hd, cos.data(), sin.data());
        }
      });
    });
  }

  void Matmul(const Tensor& x, const Tensor& w, const Tensor& out) override {
    const int64_t n = out.dim(0), big_n = w.dim(0), k = w.dim(1);
    TANDEM_CHECK(x.dim(1) == k && out.dim(1) == big_n && x.dim(0) >= n)
        << "matmul " << x.ShapeString() << " x " << w.ShapeString() << " -> "
        << out.ShapeString();
    CheckMatmulWeights(w);
    const float* a = x.f32();
    float* c = out.f32();
    const DType wt = w.dtype;
    const uint8_t* b = w.as<uint8_t>();
    ThreadPool* pool = pool_.get();
    std::vector<std::vector<float>>* scratch = &scratch_;
    stream_->Launch("matmul", [=] { MatmulNow(pool, scratch, a, n, wt, b, k, big_n, c); });
  }

  bool supports_experts() const override { return true; }

  void MoeMlp(const Tensor& x, const MoeWeights& w, const MoeBuffers& scratch,
              const AttentionMetadata& meta, const Tensor& out) override {
    const int64_t n_rows = out.dim(0), h = out.dim(1), experts = w.router.dim(0);
    const int64_t inter = w.down.dim(1);
    const bool shared = w.shared_gate_up.data != nullptr;
    const int64_t shared_inter = shared ? w.shared_down.dim(1) : 0;
    const int64_t wide = std::max(inter, shared_inter);
    TANDEM_CHECK(x.dim(1) == h && w.router.dim(1) == h && w.gate_up.dim(1) == h &&
                 w.gate_up.dim(0) == experts * 2 * inter && w.down.dim(0) == experts * h &&
                 w.top_k > 0 && w.top_k <= experts && scratch.router_logits.dim(1) == experts &&
                 scratch.x.dim(0) >= n_rows && scratch.gate_up.numel() >= n_rows * 2 * wide &&
                 scratch.act.numel() >= n_rows * wide && scratch.y.dim(1) == h &&
                 (!shared || (w.shared_gate_up.dim(0) == 2 * shared_inter &&
                              w.shared_gate_up.dim(1) == h && w.shared_down.dim(0) == h &&
                              w.shared_gate.numel() == h)))
        << "moe " << x.ShapeString() << " router " << w.router.ShapeString() << " gate_up "
        << w.gate_up.ShapeString() << " down " << w.down.ShapeString() << " shared "
        << w.shared_gate_up.ShapeString() << " " << w.shared_down.ShapeString();
    for (const Tensor* t : {&w.router, &w.gate_up, &w.down}) CheckMatmulWeights(*t);
    if (shared) {
      for (const Tensor* t : {&w.shared_gate_up, &w.shared_down}) CheckMatmulWeights(*t);
    }
    const float* xs = x.f32();
    float* o = out.f32();
    float* logits = scratch.router_logits.f32();
    float* ex = scratch.x.f32();
    float* gu = scratch.gate_up.f32();
    float* act = scratch.act.f32();
    float* y = scratch.y.f32();
    const MoeWeights wts = w;
    const int top_k = w.top_k;
    ThreadPool* pool = pool_.get();
    std::vector<std::vector<float>>* mm_scratch = &scratch_;
    MoeRouting* routing = &routing_;
    const int32_t* num_reqs = meta.num_reqs.i32();
    const int32_t* query_start = meta.query_start_loc.i32();
    stream_->Launch("moe", [=] {
      std::fill(o, o + n_rows * h, 0.f);
      const int64_t n = std::min<int64_t>(n_rows, query_start[num_reqs[0]]);  // the real rows
      if (n <= 0) return;
      MatmulNow(pool, mm_scratch, xs, n, wts.router.dtype, wts.router.as<uint8_t>(), h, experts,
                logits);
      // Each row's experts by score (softmax in f32 as transformers' router,
      // the k largest, ties to the lower index), grouped by expert.
      routing->rows.resize(experts);
      routing->scores.resize(experts);
      for (int64_t e = 0; e < experts; ++e) {
        routing->rows[e].clear();
        routing->scores[e].clear();
      }
      std::vector<int32_t>& order = routing->order;
      order.resize(experts);
      for (int64_t i = 0; i < n; ++i) {
        float* l = logits + i * experts;
        cpu::Softmax(l, experts);
        for (int64_t e = 0; e < experts; ++e) order[e] = static_cast<int32_t>(e);
        std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                          [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
        float chosen = 0.f;
        for (int j = 0; j < top_k; ++j) chosen += l[order[j]];
        for (int j = 0; j < top_k; ++j) {
          routing->rows[order[j]].push_back(static_cast<int32_t>(i));
          routing->scores[order[j]].push_back(wts.renormalize ? l[order[j]] / chosen
                                                              : l[order[j]]);
        }
      }
      // y[m, H] = one SwiGLU MLP of the m rows of `in` (gate rows, then up
      // rows, in gate_up; width `width`).
      const auto mlp = [=](const float* in, int64_t m, DType gate_up_type,
                           const uint8_t* gate_up, DType down_type, const uint8_t* down,
                           int64_t width) {
        MatmulNow(pool, mm_scratch, in, m, gate_up_type, gate_up, h, 2 * width, gu);
        pool->ParallelFor(m, kMinRows, [=](int64_t b, int64_t end) {
          for (int64_t r = b; r < end; ++r) {
            cpu::SiluMul(gu + r * 2 * width, gu + r * 2 * width + width, act + r * width, width);
          }
        });
        MatmulNow(pool, mm_scratch, act, m, down_type, down, width, h, y);
      };
      const size_t gate_up_bytes = DTypeBytes(wts.gate_up.dtype, 2 * inter * h);
      const size_t down_bytes = DTypeBytes(wts.down.dtype, h * inter);
      for (int64_t e = 0; e < experts; ++e) {  // in expert order, as transformers sums
        const std::vector<int32_t>& rows = routing->rows[e];
        const int64_t m = static_cast<int64_t>(rows.size());
        if (m == 0) continue;
        for (int64_t r = 0; r < m; ++r) {
          std::memcpy(ex + r * h, xs + int64_t{rows[r]} * h, sizeof(float) * h);
        }
        mlp(ex, m, wts.gate_up.dtype, wts.gate_up.as<uint8_t>() + e * gate_up_bytes,
            wts.down.dtype, wts.down.as<uint8_t>() + e * down_bytes, inter);
        const std::vector<float>& score = routing->scores[e];
        for (int64_t r = 0; r < m; ++r) {
          float* dst = o + int64_t{rows[r]} * h;
          const float* src = y + r * h;
          for (int64_t c = 0; c < h; ++c) dst[c] += score[r] * src[c];
        }
      }
      if (!shared) return;
      mlp(xs, n, wts.shared_gate_up.dtype, wts.shared_gate_up.as<uint8_t>(),
          wts.shared_down.dtype, wts.shared_down.as<uint8_t>(), shared_inter);
      const float* gate = wts.shared_gate.f32();
      for (int64_t i = 0; i < n; ++i) {
        const float weight = 1.f / (1.f + std::exp(-cpu::Dot(xs + i * h, gate, h)));
        for (int64_t c = 0; c < h; ++c) o[i * h + c] += weight * y[i * h + c];
      }
    });
  }

  void AddBias(const Tensor& x, const Tensor& bias) override {
    const int64_t n = x.dim(0), width = x.dim(1);
    TANDEM_CHECK(bias.numel() == width) << x.ShapeString() << " + " << bias.ShapeString();
    float* xs = x.f32();
    const float* b = bias.f32();
    ThreadPool* pool = pool_.get();
    stream_->Launch("bias", [=] {
      pool->ParallelFor(n, kMinRows, [=](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) cpu::AddRow(xs + i * width, b, width);
      });
    });
  }

  void HeadRmsNorm(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                   const AttentionShape& shape, float eps) override {
    const int64_t n = qkv.dim(0), row = qkv.dim(1);
    const int hd = shape.head_dim, q_heads = shape.num_heads;
    const int heads = shape.num_heads + shape.num_kv_heads;
    TANDEM_CHECK(q_weight.numel() == hd && k_weight.numel() == hd && row >= int64_t{heads} * hd);
    float* base = qkv.f32();
    const float* qw = q_weight.f32();
    const float* kw = k_weight.f32();
    ThreadPool* pool = pool_.get();
    stream_->Launch("head_norm", [=] {
      pool->ParallelFor(n, kMinRows, [=](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          for (int h = 0; h < heads; ++h) {
            float* x = base + i * row + int64_t{h} * hd;
            cpu::RmsNormRow(x, nullptr, nullptr, h < q_heads ? qw : kw, eps, hd, x);
          }
        }
      });
    });
  }

  void SiluMul(const Tensor& gate_up, const Tensor& out) override {
    const int64_t n = out.dim(0), inter = out.dim(1);
    TANDEM_CHECK(gate_up.dim(1) == 2 * inter);
    const float* g = gate_up.f32();
    float* o = out.f32();
    ThreadPool* pool = pool_.get();
    stream_->Launch("silu_mul", [=] {
      pool->ParallelFor(n, kMinRows, [=](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const float* gi = g + i * 2 * inter;
          float* oi = o + i * inter;
          cpu::SiluMul(gi, gi + inter, oi, inter);
        }
      });
    });
  }

  bool supports_lora() const override { return true; }

  void LoraAdd(const Tensor& x, const Tensor& slots, const LoraWeights& w, const Tensor& scratch,
               const Tensor& out) override {
    const int64_t n = x.dim(0), in = x.dim(1), adapters = w.a.dim(0), big_r = w.a.dim(1);
    const int64_t width = w.bt.dim(2), rank = w.rank;
    const std::vector<int64_t> splits = w.splits;
    TANDEM_CHECK(w.a.dtype == DType::kBF16 && w.bt.dtype == DType::kBF16 && w.a.dim(2) == in &&
                 w.bt.dim(0) == adapters && w.bt.dim(1) == big_r &&
                 rank * static_cast<int64_t>(splits.size() - 1) == big_r &&
                 splits.back() == width && out.dim(0) == n && out.dim(1) == width &&
                 scratch.numel() >= n * big_r && slots.numel() >= n)
        << "lora " << x.ShapeString() << " a " << w.a.ShapeString() << " bt "
        << w.bt.ShapeString() << " out " << out.ShapeString();
    const float* xs = x.f32();
    const int32_t* sl = slots.i32();
    const int32_t* slot_ranks = w.slot_ranks;
    const int64_t modules = static_cast<int64_t>(splits.size()) - 1;
    const uint16_t* as = w.a.as<uint16_t>();
    const uint16_t* bts = w.bt.as<uint16_t>();
    float* u = scratch.f32();
    float* o = out.f32();
    ThreadPool* pool = pool_.get();
    stream_->Launch("lora", [=] {
      // fn(first, end, slot) for each run of rows [first, end) in [t0, t1)
      // with one adapter: a request's rows are one run, and consecutive
      // requests of one adapter merge, so that prompts multiply as matrices.
      const auto for_runs = [&](int64_t t0, int64_t t1, const auto& fn) {
        for (int64_t t = t0; t < t1;) {
          int64_t e = t + 1;
          while (e < t1 && sl[e] == sl[t]) ++e;
          if (sl[t] >= 1 && sl[t] <= adapters) fn(t, e, sl[t] - 1);
          t = e;
        }
      };
      // Adapter s's rank on module m: its A rows (u's columns) and B rows
      // past it are zero, and none at all where it does not target m (an
      // adapter of lower rank than the stacks, or of other modules).
      const auto rank_of = [&](int64_t s, int64_t m) -> int64_t {
        return slot_ranks == nullptr ? rank : slot_ranks[s * modules + m];
      };
      // u = x . a^T (the bf16 rows widened as they stream, as a bf16
      // model's weights) over the columns of each module's rank, those of
      // modules one after another in one call: rows split over the pool.
      pool->ParallelFor(n, 1, [&](int64_t t0, int64_t t1) {
        for_runs(t0, t1, [&](int64_t r0, int64_t r1, int64_t s) {
          int64_t j0 = 0, j1 = 0;  // the span of columns not yet multiplied
          for (int64_t m = 0; m <= modules; ++m) {
            const int64_t c0 = m * rank, c1 = m < modules ? c0 + rank_of(s, m) : c0;
            if (c0 == j1 && c1 > c0) {
              j1 = c1;
              continue;
            }
            if (j1 > j0) {
              cpu::MatmulBf16(xs + r0 * in, in, r1 - r0, as + s * big_r * in, in, j0, j1,
                              u + r0 * big_r, big_r);
            }
            j0 = c0;
            j1 = c1;
          }
        });
      });
      // out += u . bt, each module over its own columns only (bt is zero
      // elsewhere): output columns split over the pool.
      pool->ParallelFor(width, 16, [&](int64_t j0, int64_t j1) {
        for_runs(0, n, [&](int64_t r0, int64_t r1, int64_t s) {
          for (int64_t m = 0; m < modules; ++m) {
            const int64_t c0 = std::max(j0, splits[m]), c1 = std::min(j1, splits[m + 1]);
            const int64_t r = rank_of(s, m);
            if (c0 >= c1 || r == 0) continue;
            const int64_t k0 = m * rank;
            cpu::AddProductBf16(u + r0 * big_r + k0, big_r, r1 - r0, r,
                                bts + (s * big_r + k0) * width + c0, width, c1 - c0,
                                o + r0 * width + c0, width);
          }
        });
      });
    });
  }

  void GatherRows(const Tensor& src, const Tensor& indices, const Tensor& out) override {
    const int64_t rows = out.dim(0), h = out.dim(1);
    TANDEM_CHECK(src.dim(1) == h);
    const float* s = src.f32();
    const int32_t* idx = indices.i32();
    float* o = out.f32();
    stream_->Launch("gather", [=] {
      for (int64_t i = 0; i < rows; ++i) std::memcpy(o + i * h, s + idx[i] * h, sizeof(float) * h);
    });
  }

  void PagedAttention(const Tensor& qkv, const KvLayer& cache, const AttentionMetadata& meta,
                      const AttentionShape& shape, const Tensor& out) override {
    const int64_t n = qkv.dim(0), row = qkv.dim(1);
    const int nh = shape.num_heads, nkv = shape.num_kv_heads, hd = shape.head_dim;
    TANDEM_CHECK(out.dim(1) == nh * hd && row == (nh + 2 * nkv) * hd);
    const float* q_base = qkv.f32();
    const DType kv_dt = cache.k.dtype;
    TANDEM_CHECK(kv_dt == kv_dtype_ && cache.v.dtype == kv_dt) << DTypeName(kv_dt);
    char* kc = static_cast<char*>(cache.k.data);
    char* vc = static_cast<char*>(cache.v.data);
    const int64_t es = static_cast<int64_t>(DTypeSize(kv_dt));
    const int32_t* num_reqs_p = meta.num_reqs.i32();
    const int32_t* qsl = meta.query_start_loc.i32();
    const int32_t* seq_lens = meta.seq_lens.i32();
    const int32_t* tables = meta.block_tables.i32();
    const int64_t table_width = meta.block_tables.dim(1);
    const int32_t* slots = meta.slot_mapping.i32();
    const int bs = meta.block_size;
    const float scale = shape.scale;
    const int32_t window = shape.sliding_window;
    float* o = out.f32();
    ThreadPool* pool = pool_.get();
    const bool sgemm = !cpu::TargetHasAvx512();  // see KvView::sgemm
    // The op's own list of query tiles, reused by every run (eager or replay).
    stream_->Launch("attention", [=, tiles = std::vector<QueryTile>()]() mutable {
      const int64_t kv_row = static_cast<int64_t>(nkv) * hd;
      // 1. Write this step's k and v into their slots.
      for (int64_t i = 0; i < n; ++i) {
        const int32_t slot = slots[i];
        if (slot < 0) continue;
        const float* k = q_base + i * row + nh * hd;
        StoreKv(k, kv_dt, kc + slot * kv_row * es, kv_row);
        StoreKv(k + kv_row, kv_dt, vc + slot * kv_row * es, kv_row);
      }
      // 2. Attention. Rows past the last request's tokens are padding and
      // stay zero.
      const int32_t num_reqs = num_reqs_p[0];
      const int64_t real = std::min<int64_t>(n, qsl[num_reqs]);
      std::memset(o + real * nh * hd, 0, sizeof(float) * (n - real) * nh * hd);
      const int group = nh / nkv;
      // 2a. Requests with many query tokens (prefill chunks): per (request,
      // KV head, tile of queries), for each query head of the group, scores
      // and outputs as two products over the request's K and V, widened
      // once per thread and extended tile by tile.
      const KvView view{kc, vc, kv_dt, es, bs, kv_row, hd, sgemm};
      // A (request, KV head)'s tiles go first, last, second, second to
      // last...: the later tiles see longer contexts, and in this order any
      // contiguous run of them (a thread's share) holds as much work as the
      // rest; the first long tile gathers the context the short ones reuse.
      // (In order, the second of two threads took 1.75 of the first's 1.25
      // at 4096 tokens and 3 KV heads.)
      tiles.clear();
      for (int32_t r = 0; r < num_reqs; ++r) {
        const int32_t q_len = qsl[r + 1] - qsl[r];
        if (q_len < kGemmMinQueries) continue;
        const int32_t count = (q_len + kQueryTile - 1) / kQueryTile;
        for (int kvh = 0; kvh < nkv; ++kvh) {
          for (int32_t lo = 0, hi = count - 1; lo <= hi; ++lo, --hi) {
            for (int32_t k : {lo, hi}) {
              const int32_t t = qsl[r] + k * kQueryTile;
              tiles.push_back({r, kvh, t, std::min(qsl[r + 1], t + kQueryTile)});
              if (lo == hi) break;
            }
          }
        }
      }
      pool->ParallelFor(static_cast<int64_t>(tiles.size()), 1, [&](int64_t b, int64_t e) {
        thread_local ContextKv kv;
        thread_local std::vector<float> scores;
        kv.r = -1;  // nothing gathered yet in this run
        for (int64_t i = b; i < e; ++i) {
          const QueryTile& qt = tiles[i];
          const int32_t q_begin = qsl[qt.r], q_len = qsl[qt.r + 1] - q_begin;
          const int32_t cached = seq_lens[qt.r] - q_len;
          const int32_t ctx = cached + (qt.t_end - q_begin);  // the last query's context
          view.Extend(&kv, qt.r, qt.kvh, tables + qt.r * table_width, seq_lens[qt.r], ctx);
          for (int h = qt.kvh * group; h < (qt.kvh + 1) * group; ++h) {
            view.Attend(kv, q_base + int64_t{qt.t_begin} * row + h * hd, row,
                        qt.t_end - qt.t_begin, ctx, cached + (qt.t_begin - q_begin) + 1, window,
                        scale, &scores, o + int64_t{qt.t_begin} * nh * hd + h * hd, nh * hd);
          }
        }
      });
      // 2b. The other tokens (decodes, short chunks): per (token, KV head),
      // the group's query heads as the rows of one product.
      pool->ParallelFor(real * nkv, 4, [&](int64_t item_begin, int64_t item_end) {
        thread_local std::vector<float> scores;
        thread_local std::vector<int64_t> offsets;  // of request r's rows in the cache
        int32_t r = 0, offsets_r = -1;
        for (int64_t item = item_begin; item < item_end; ++item) {
          const int32_t t = static_cast<int32_t>(item / nkv);
          const int kvh = static_cast<int>(item % nkv);
          while (qsl[r + 1] <= t) ++r;  // items are in token order
          const int32_t q_len = qsl[r + 1] - qsl[r];
          if (q_len >= kGemmMinQueries) continue;  // done in 2a
          const int32_t ctx = seq_lens[r] - q_len + (t - qsl[r]) + 1;  // causal
          const float* q = q_base + t * row + kvh * group * hd;
          float* oh = o + t * nh * hd + kvh * group * hd;
          if (r != offsets_r) {
            const int32_t* table = tables + r * table_width;
            offsets.resize(seq_lens[r]);
            for (int32_t j = 0; j < seq_lens[r]; ++j) {
              offsets[j] = (int64_t{table[j / bs]} * bs + j % bs) * kv_row;
            }
            offsets_r = r;
          }
          // A window's query sees its last `window` keys.
          const int32_t first = window > 0 ? std::max(0, ctx - window) : 0;
          const int32_t keys = ctx - first;
          if (static_cast<int64_t>(scores.size()) < int64_t{group} * keys) {
            scores.resize(int64_t{group} * keys);
          }
          const int64_t head = int64_t{kvh} * hd;
          if (kv_dt == DType::kBF16) {
            cpu::AttentionDecode(q, group, hd, reinterpret_cast<const uint16_t*>(kc) + head,
                                 reinterpret_cast<const uint16_t*>(vc) + head,
                                 offsets.data() + first, keys, scale, scores.data(), oh);
          } else {
            cpu::AttentionDecode(q, group, hd, reinterpret_cast<const float*>(kc) + head,
                                 reinterpret_cast<const float*>(vc) + head,
                                 offsets.data() + first, keys, scale, scores.data(), oh);
          }
        }
      });
    });
  }

 private:
  // Row-wise ops split only when each thread gets this many rows.
  static constexpr int64_t kMinRows = 4;
  // Attention of a request with at least kGemmMinQueries query tokens runs
  // per head over tiles of kQueryTile queries.
  static constexpr int32_t kGemmMinQueries = 8;
  static constexpr int32_t kQueryTile = 64;
  struct QueryTile {
    int32_t r;
    int kvh;
    int32_t t_begin, t_end;
  };

  // One request's K and V rows for one KV head, widened to f32: K transposed
  // (k[d * ld + j], as cpu::AttentionScores reads it) or, for sgemm, rows of
  // hd like V. Kept by a thread across the query tiles it runs in
  // one step, which see ever longer prefixes of the same context.
  struct ContextKv {
    int32_t r = -1;
    int kvh = 0;
    int32_t have = 0;  // rows gathered
    int64_t ld = 0;    // transposed K: floats from one dimension to the next
    std::vector<float> k, v, row;
  };

  // The KV cache of one layer as attention reads it.
  struct KvView {
    const char* kc;
    const char* vc;
    DType dt;
    int64_t es, bs, kv_row;
    int hd;
    // The two products by OpenBLAS's sgemm, not the Highway tiles: below
    // AVX-512 targets, where it measured faster (SmolLM2 2048-token f32
    // prefill on a 2-vCPU Zen 5 running the AVX2 target, 2 threads:
    // attention 31% of 2976 ms by sgemm, 44% of 3410 ms by the 2 x 4 tiles,
    // whose loads of K then outnumber their FMAs). On AVX-512 the tiles win
    // (4096 tokens: 4.41 against 5.07 s).
    bool sgemm;

    // Makes `c` hold rows [0, ctx) of request r's context for kv head kvh
    // (its block table `table`, `seq_len` tokens in all).
    void Extend(ContextKv* c, int32_t r, int kvh, const int32_t* table, int32_t seq_len,
                int32_t ctx) const {
      if (c->r != r || c->kvh != kvh) {
        c->r = r;
        c->kvh = kvh;
        c->have = 0;
        c->ld = (seq_len + 15) / 16 * 16;
        const size_t need = static_cast<size_t>(c->ld) * hd;
        if (c->k.size() < need) {
          c->k.resize(need);
          c->v.resize(need);
        }
        c->row.resize(hd);
      }
      for (int32_t j = c->have; j < ctx; ++j) {
        const int64_t at = ((int64_t{table[j / bs]} * bs + j % bs) * kv_row + kvh * hd) * es;
        ConvertToF32(vc + at, dt, &c->v[int64_t{j} * hd], hd);
        if (sgemm) {
          ConvertToF32(kc + at, dt, &c->k[int64_t{j} * hd], hd);
          continue;
        }
        ConvertToF32(kc + at, dt, c->row.data(), hd);
        for (int d = 0; d < hd; ++d) c->k[d * c->ld + j] = c->row[d];
      }
      c->have = std::max(c->have, ctx);
    }

    // Attention of `rows` queries (q rows ldq apart) over the first ctx rows
    // of c; query i sees the first visible0 + i keys (causal within a
    // chunk), and of those, with a sliding window (window > 0), only the
    // last `window`. Outputs rows ldo apart.
    void Attend(const ContextKv& c, const float* q, int64_t ldq, int32_t rows, int32_t ctx,
                int32_t visible0, int32_t window, float scale, std::vector<float>* scores,
                float* out, int64_t ldo) const {
      // Keys before the first row's window are no row's: the products
      // start at `lo`.
      const int32_t lo = window > 0 ? std::max(0, visible0 - window) : 0;
      const int32_t width = ctx - lo;
      if (static_cast<int64_t>(scores->size()) < int64_t{rows} * width) {
        scores->resize(int64_t{rows} * width);
      }
      float* s = scores->data();
      const float* v = c.v.data() + int64_t{lo} * hd;
      if (sgemm) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, width, hd, scale, q, ldq,
                    c.k.data() + int64_t{lo} * hd, hd, 0.f, s, width);
      } else {
        cpu::AttentionScores(q, ldq, rows, c.k.data() + lo, c.ld, width, hd, scale, s, width);
      }
      for (int32_t i = 0; i < rows; ++i) {
        float* srow = s + int64_t{i} * width;
        const int32_t visible = visible0 + i - lo;
        const int32_t first = window > 0 ? std::max(0, visible0 + i - window) - lo : 0;
        std::fill(srow, srow + first, 0.f);
        cpu::Softmax(srow + first, visible - first);
        std::fill(srow + visible, srow + width, 0.f);
      }
      if (sgemm) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, width, 1.f, s, width, v,
                    hd, 0.f, out, ldo);
      } else {
        cpu::AttentionPv(s, width, rows, v, width, hd, out, ldo);
      }
    }
  };

  // One token's k or v row into its cache slot, in the cache's dtype.
  static void StoreKv(const float* src, DType dt, char* dst, int64_t n) {
    if (dt == DType::kBF16) return cpu::ToBf16(src, reinterpret_cast<uint16_t*>(dst), n);
    std::memcpy(dst, src, sizeof(float) * n);
  }


  Device* device_;
  CpuStream* stream_;
  std::unique_ptr<ThreadPool> pool_;
  DType weight_dtype_;
  DType kv_dtype_;
  bool keep_file_blocks_;
  std::vector<std::vector<float>> scratch_;  // [thread][kScratchFloats], weights not f32
  MoeRouting routing_;  // MoeMlp's, filled and read when it runs (the engine thread)
};

}  // namespace

absl::StatusOr<std::unique_ptr<Ops>> CreateCpuOps(Device* cpu_device, int threads,
                                                  DType weight_dtype, DType kv_dtype,
                                                  bool keep_file_blocks) {
  // TANDEM_CPU_TARGET runs the kernels on another Highway target than the
  // CPU's best (benchmarks of e.g. AVX2 on an AVX-512 machine).
  if (const char* target = std::getenv("TANDEM_CPU_TARGET");
      target != nullptr && !cpu::UseTarget(target)) {
    return absl::InvalidArgumentError(absl::StrCat("TANDEM_CPU_TARGET=", target,
                                                   " is not a target this CPU runs (one of: ",
                                                   absl::StrJoin(cpu::Targets(), ", "), ")"));
  }
  return std::make_unique<CpuOps>(cpu_device, threads, weight_dtype, kv_dtype, keep_file_blocks);
}

}  // namespace tandem
