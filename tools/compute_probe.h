// The compute probe of `tandem bench step`: this CPU's measured peak for
// each multiply-add form the kernels can use, so that a prefill or batched
// figure is also stated as a fraction of what the cores can do (as the read
// probe states a decode step against reading its weights).
//
// Each form runs register-resident multiply-adds (12 independent
// accumulators per thread, enough to cover a two-port FMA unit's latency)
// on every thread at once; the figure is operations per second, a
// multiply-add counting two:
//   f32 FMA      vfmadd231ps (AVX2 / AVX-512), fmla (NEON)
//   bf16 dot     vdpbf16ps (AVX512-BF16): 2 products per f32 lane
//   int8 dot     vpdpbusd (AVX512-VNNI, or AVX-VNNI's 256-bit form):
//                4 products per i32 lane; sdot (Arm dot product)
// A form the CPU lacks is not listed.
#ifndef TANDEM_TOOLS_COMPUTE_PROBE_H_
#define TANDEM_TOOLS_COMPUTE_PROBE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct ComputePeak {
  std::string form;         // "f32 FMA", "bf16 dot", "int8 dot"
  std::string instruction;  // e.g. "vfmadd231ps zmm (AVX-512)"
  double gops = 0;          // 10^9 operations per second, all threads
};

// Every form this CPU has, each run for about `seconds` on `threads`
// threads (the best of three runs).
std::vector<ComputePeak> MeasureComputePeaks(int threads, double seconds);

// One thread's kernel of form `index` into the list the CPU supports (for
// tests): runs `iterations` rounds of 12 multiply-adds of known inputs and
// returns the sum of the accumulators' lanes, so the work cannot be dropped
// and its arithmetic can be checked; *ops_per_iteration says what a round
// counts.
struct ProbeKernel {
  std::string form;
  std::string instruction;
  double ops_per_iteration = 0;
  // Sum of the lanes after `iterations` rounds with the inputs the probe
  // uses (every product 1 * 1, starting from 0): iterations *
  // ops_per_iteration / 2 (the products), exactly while a lane stays below
  // 2^24 (f32).
  double (*run)(int64_t iterations) = nullptr;
};
std::vector<ProbeKernel> SupportedProbeKernels();

}  // namespace tandem

#endif  // TANDEM_TOOLS_COMPUTE_PROBE_H_
