// CRC32C over one KV chunk's worth of bytes (1 MiB): the CPU's instruction
// (what Crc32c uses where the CPU has it) against the slicing-by-8 tables.
//   build/bin/crc32c_benchmark
#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/serving/crc32c.h"

namespace tandem {
namespace {

template <uint32_t (*kCrc)(uint32_t, const void*, size_t)>
void BM_Crc32c(benchmark::State& state) {
  std::vector<uint8_t> data(static_cast<size_t>(state.range(0)), 0x5a);
  for (auto _ : state) benchmark::DoNotOptimize(kCrc(0, data.data(), data.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
  state.SetLabel(kCrc == &Crc32c ? Crc32cImplementation() : "tables");
}
BENCHMARK(BM_Crc32c<&Crc32c>)->Arg(1 << 20);
BENCHMARK(BM_Crc32c<&Crc32cPortable>)->Arg(1 << 20);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
