// CRC32C over one KV chunk's worth of bytes (1 MiB): what Crc32c uses here
// (carry-less folds with VPCLMULQDQ where the CPU has them), the CPU's CRC
// instruction alone, and the slicing-by-8 tables;
// and a chunk copied out of a 256 MiB buffer (a KV cache larger than the
// caches) and checksummed: memcpy then Crc32c, against Crc32cCopy's one pass.
//   build/bin/crc32c_benchmark
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/base/crc32c.h"

namespace tandem {
namespace {

// Each form this CPU has (Crc32cImplementations(), best first: carry-less
// folds, the CRC instruction, the tables), by its index.
void BM_Crc32c(benchmark::State& state) {
  const std::vector<std::string> forms = Crc32cImplementations();
  const size_t form = static_cast<size_t>(state.range(1));
  if (form >= forms.size()) return state.SkipWithError("no such form on this CPU");
  UseCrc32cImplementation(forms[form]);
  std::vector<uint8_t> data(static_cast<size_t>(state.range(0)), 0x5a);
  for (auto _ : state) benchmark::DoNotOptimize(Crc32c(0, data.data(), data.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
  state.SetLabel(forms[form]);
  UseCrc32cImplementation("");
}
BENCHMARK(BM_Crc32c)->ArgsProduct({{1 << 20}, {0, 1, 2, 3}});

// Chunks of range(0) bytes taken in turn from a 256 MiB source into one
// destination buffer, as the KV exporter reads rows out of the cache.
template <bool kOnePass>
void BM_CopyAndCrc32c(benchmark::State& state) {
  const size_t chunk = static_cast<size_t>(state.range(0)), total = size_t{256} << 20;
  std::vector<uint8_t> src(total, 0x5a), dst(chunk);
  size_t at = 0;
  for (auto _ : state) {
    if constexpr (kOnePass) {
      benchmark::DoNotOptimize(Crc32cCopy(0, dst.data(), src.data() + at, chunk));
    } else {
      std::memcpy(dst.data(), src.data() + at, chunk);
      benchmark::DoNotOptimize(Crc32c(0, dst.data(), chunk));
    }
    at = (at + chunk) % (total - chunk + 1);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
  state.SetLabel(kOnePass ? "Crc32cCopy" : "memcpy, then Crc32c");
}
BENCHMARK(BM_CopyAndCrc32c<false>)->Arg(1 << 20);
BENCHMARK(BM_CopyAndCrc32c<true>)->Arg(1 << 20);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
