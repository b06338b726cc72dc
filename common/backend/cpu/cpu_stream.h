// CpuStream / CpuGraph: the CPU implementation of Stream and Graph.
//
// Ops are closures over bound buffers: Launch() runs one at once, or, while
// capturing, appends it to the graph being recorded. Replay() runs the
// recorded closures in order; the host code that built them (shape work,
// metadata building, allocation) is not run again, and each closure reads
// whatever its buffers hold when it runs.
//
// Counters let tests prove that a replay issues no host op code:
// ops_launched() counts Launch() calls (host code issuing an op),
// ops_executed() counts closures actually run (eager or replayed).
// With profiling on, every run of a closure (eager or replayed) also adds
// its wall time to its kind (the op's name: "matmul", "attention", ...);
// `tandem bench step` reads them. Off, it costs one branch per op.
//
// Owned and used by one thread.
#ifndef TANDEM_COMMON_BACKEND_CPU_CPU_STREAM_H_
#define TANDEM_COMMON_BACKEND_CPU_CPU_STREAM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/graph/stream.h"

namespace tandem {

class CpuStream;

class CpuGraph : public Graph {
 public:
  absl::Status Replay() override;
  size_t num_nodes() const override { return ops_.size(); }

 private:
  friend class CpuStream;
  explicit CpuGraph(CpuStream* stream) : stream_(stream) {}
  CpuStream* stream_;
  std::vector<std::pair<const char*, std::function<void()>>> ops_;
};

class CpuStream : public Stream {
 public:
  using Op = std::function<void()>;

  // Runs `op` now, or records it when capturing; `kind` (a string literal)
  // names it in the profile.
  void Launch(const char* kind, Op op);

  struct OpTime {
    const char* kind;
    double seconds = 0;
    int64_t runs = 0;
  };
  void set_profiling(bool on) { profiling_ = on; }
  const std::vector<OpTime>& op_times() const { return op_times_; }
  void ClearOpTimes() { op_times_.clear(); }

  absl::Status BeginCapture() override;
  absl::StatusOr<std::unique_ptr<Graph>> EndCapture() override;
  bool capturing() const override { return recording_ != nullptr; }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  int64_t ops_launched() const { return ops_launched_; }
  int64_t ops_executed() const { return ops_executed_; }

 private:
  friend class CpuGraph;
  void Run(const char* kind, const Op& op);

  std::unique_ptr<CpuGraph> recording_;
  bool profiling_ = false;
  std::vector<OpTime> op_times_;
  int64_t ops_launched_ = 0;
  int64_t ops_executed_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_BACKEND_CPU_CPU_STREAM_H_
