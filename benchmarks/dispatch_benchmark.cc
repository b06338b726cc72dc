// Dispatch() cost on the default 51-size ladder (max_num_seqs=256 -> M=512),
// FULL_AND_PIECEWISE, for uniform-decode and mixed batches.
#include <vector>

#include "benchmark/benchmark.h"
#include "common/graph/dispatcher.h"
#include "common/graph/graph_policy.h"

namespace tandem {
namespace {

CudaGraphDispatcher MakeDispatcher() {
  // FULL_AND_PIECEWISE, max_num_seqs 256, 8192 tokens: the 51-size ladder.
  GraphPolicy policy = ResolveGraphPolicy(GraphPolicyConfig{}, BatchLimits{},
                                          AttentionCgSupport::kAlways, true)
                           .value();
  CudaGraphDispatcher d(std::move(policy.dispatcher));
  (void)d.InitializeKeys(policy.resolution.mode);
  return d;
}

void BM_DispatchUniformDecode(benchmark::State& state) {
  const CudaGraphDispatcher d = MakeDispatcher();
  int n = 1;
  for (auto _ : state) {
    auto r = d.Dispatch(n, /*uniform_decode=*/true);
    benchmark::DoNotOptimize(r);
    n = n % 256 + 1;
  }
}
BENCHMARK(BM_DispatchUniformDecode);

void BM_DispatchMixed(benchmark::State& state) {
  const CudaGraphDispatcher d = MakeDispatcher();
  int n = 1;
  for (auto _ : state) {
    auto r = d.Dispatch(n, /*uniform_decode=*/false);
    benchmark::DoNotOptimize(r);
    n = n % 512 + 1;
  }
}
BENCHMARK(BM_DispatchMixed);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
