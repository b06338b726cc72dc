// The block-weight matmul kernel alone (cpu::MatmulBlocks, one thread), at
// SmolLM2-135M's shapes and the row counts a decode step gives it: 1 (plain
// decoding), 5 (a verification step of 1 + 4 tokens), 8 to 32 (batches).
// Whole-step timings (`tandem bench step`) swing 20-40% on shared 2-vCPU
// machines; the minimum of repetitions here holds to a few percent, so
// kernel changes are compared with it (quote the min):
//   build/bin/matmul_blocks_benchmark --benchmark_repetitions=9
//     --benchmark_report_aggregates_only=true
//   TANDEM_CPU_TARGET=AVX2 build/bin/matmul_blocks_benchmark ...
// The prefill rows (`--benchmark_filter=prefill`) set the integer products
// beside what MatmulNow ran for them before (weights widened to f32 a chunk
// at a time, then OpenBLAS's sgemm), the way it still multiplies f32 and
// bf16 weights below AVX-512.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "cblas.h"
#include "common/backend/tensor.h"
#include "common/kernels/cpu/cpu_kernels.h"

namespace tandem {
namespace {

// A benchmark's operands: n rows of x and `rows` weight rows of K, random,
// the weights stored as `dtype`.
struct Operands {
  int64_t n, k, rows;
  std::vector<float> x, out;
  std::vector<uint8_t> stored;
};

Operands MakeOperands(const benchmark::State& state, DType dtype) {
  Operands o{state.range(0), state.range(1), state.range(2), {}, {}, {}};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> w(o.rows * o.k);
  o.x.resize(o.n * o.k);
  o.out.resize(o.n * o.rows);
  for (float& v : w) v = uni(rng);
  for (float& v : o.x) v = uni(rng);
  o.stored.resize(DTypeBytes(dtype, o.rows * o.k));
  ConvertFromF32(w.data(), dtype, o.stored.data(), o.rows * o.k);
  return o;
}

// Weights of `dtype`, K x N (SmolLM2: q/o 576 x 576, gate/up 576 x 1536,
// down 1536 x 576, and the output layer, 576 x 49152: 30 MB of Q8_0, which
// streams from beyond the core's caches), times n rows of x.
void BM_MatmulBlocks(benchmark::State& state, DType dtype) {
  Operands o = MakeOperands(state, dtype);
  const int64_t n = o.n, k = o.k, rows = o.rows;
  std::vector<float>& x = o.x;
  std::vector<float>& out = o.out;
  std::vector<uint8_t>& stored = o.stored;
  std::vector<float> scratch(cpu::MatmulBlocksScratchFloats(n, k));
  for (auto _ : state) {
    cpu::MatmulBlocks(dtype, x.data(), k, n, stored.data(), k, 0, rows, out.data(), rows,
                      scratch.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(stored.size()));
  state.counters["GMAC/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(n * k * rows) / 1e9,
      benchmark::Counter::kIsRate);
  state.SetLabel(cpu::Target());
}

// As BM_MatmulBlocks, by widening the weights to f32 (chunks of 4 MiB, as
// MatmulNow's scratch) and multiplying each chunk by OpenBLAS's sgemm.
void BM_WidenedSgemm(benchmark::State& state, DType dtype) {
  Operands o = MakeOperands(state, dtype);
  const int64_t n = o.n, k = o.k, rows = o.rows;
  std::vector<float>& x = o.x;
  std::vector<float>& out = o.out;
  std::vector<uint8_t>& stored = o.stored;
  const int64_t chunk = std::max<int64_t>(1, (1 << 20) / k);
  std::vector<float> widened(chunk * k);
  const size_t row_bytes = DTypeBytes(dtype, k);
  openblas_set_num_threads(1);
  for (auto _ : state) {
    for (int64_t j = 0; j < rows; j += chunk) {
      const int64_t m = std::min(chunk, rows - j);
      cpu::WidenRow(dtype, stored.data() + j * row_bytes, m * k, widened.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1.f, x.data(), k,
                  widened.data(), k, 0.f, out.data() + j, rows);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GMAC/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(n * k * rows) / 1e9,
      benchmark::Counter::kIsRate);
  state.SetLabel(openblas_get_corename());
}

// Arguments named, and the minimum of repetitions reported.
void Named(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "K", "N"});
  b->ComputeStatistics("min", [](const std::vector<double>& v) {
    return *std::min_element(v.begin(), v.end());
  });
}

void Shapes(benchmark::internal::Benchmark* b) {
  Named(b);
  for (int64_t n : {1, 5, 8, 16, 24, 32}) {
    b->Args({n, 576, 1536});
    b->Args({n, 1536, 576});
    b->Args({n, 576, 576});
    b->Args({n, 576, 49152});
  }
}
BENCHMARK_CAPTURE(BM_MatmulBlocks, q4_1, DType::kQ4_1)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatmulBlocks, q8_0, DType::kQ8_0)->Apply(Shapes);

// One expert of Qwen3-30B-A3B (hidden 2048, expert width 768: gate and up
// 2048 x 1536, down 768 x 2048) times the rows a prefill routes to it: a
// 256-token prompt sends each of 128 experts 16 rows on average (top 8);
// above 16 rows on AVX-512, 32 on AVX2, the interleaved products.
void ExpertShapes(benchmark::internal::Benchmark* b) {
  Named(b);
  for (int64_t n : {8, 16, 24, 32, 64, 128}) {
    b->Args({n, 2048, 1536});
    b->Args({n, 768, 2048});
  }
}
BENCHMARK_CAPTURE(BM_MatmulBlocks, expert_q4_1, DType::kQ4_1)->Apply(ExpertShapes);
BENCHMARK_CAPTURE(BM_MatmulBlocks, expert_q8_0, DType::kQ8_0)->Apply(ExpertShapes);

// Prefill products: Llama-3.2-1B's q/o (2048 x 2048), gate/up (2048 x 8192)
// and down (8192 x 2048), and SmolLM2's gate/up, by prompts' row counts.
void PrefillShapes(benchmark::internal::Benchmark* b) {
  Named(b);
  for (int64_t n : {64, 256}) {
    b->Args({n, 2048, 2048});
    b->Args({n, 2048, 8192});
    b->Args({n, 8192, 2048});
    b->Args({n, 576, 1536});
  }
}
BENCHMARK_CAPTURE(BM_MatmulBlocks, prefill_q8_0, DType::kQ8_0)->Apply(PrefillShapes);
BENCHMARK_CAPTURE(BM_WidenedSgemm, prefill_q8_0, DType::kQ8_0)->Apply(PrefillShapes);
BENCHMARK_CAPTURE(BM_MatmulBlocks, prefill_q4_1, DType::kQ4_1)->Apply(PrefillShapes);
BENCHMARK_CAPTURE(BM_WidenedSgemm, prefill_q4_1, DType::kQ4_1)->Apply(PrefillShapes);

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  if (const char* t = std::getenv("TANDEM_CPU_TARGET"); t != nullptr && *t != '\0') {
    if (!tandem::cpu::UseTarget(t)) return 2;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
