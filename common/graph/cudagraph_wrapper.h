// CudaGraphWrapper: vLLM's CUDAGraphWrapper (vllm/compilation/cuda_graph.py).
//
// Wraps a runnable (a callable that issues ops on a Stream, reading and
// writing persistent buffers) and is bound to one runtime mode, FULL or
// PIECEWISE. On each call it reads the thread's ForwardContext and:
//   - context mode NONE, or not its own mode: calls the runnable through;
//   - its mode and a descriptor it has not seen: captures the runnable into a
//     graph for that descriptor, then replays it once so the call returns the
//     real output (not in a start-up capture pass, ForwardContext::capture_only,
//     whose outputs nobody reads);
//   - its mode and a seen descriptor: replays the graph.
// The wrapper trusts the context blindly: the dispatcher decides which graphs
// exist. Wrappers nest: one FULL wrapper around the whole forward and one
// PIECEWISE wrapper around each piece; each fires only for its own mode.
//
// With check_input_addresses, capture records the runnable's input addresses
// and a replay whose inputs moved fails with FAILED_PRECONDITION naming the
// expected and actual addresses (upstream's debug-mode assertion).
//
// Not thread-safe: owned and called by the engine thread.
#ifndef TANDEM_COMMON_GRAPH_CUDAGRAPH_WRAPPER_H_
#define TANDEM_COMMON_GRAPH_CUDAGRAPH_WRAPPER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/graph/batch_descriptor.h"
#include "common/graph/cudagraph_mode.h"
#include "common/graph/stream.h"

namespace tandem {

struct CudaGraphWrapperOptions {
  // Record input addresses at capture and check them at every replay.
  bool check_input_addresses = false;
};

class CudaGraphWrapper {
 public:
  using Runnable = std::function<absl::Status()>;
  // Returns the addresses of the runnable's inputs (for the address check).
  using InputAddresses = std::function<std::vector<const void*>()>;

  // `mode` must be FULL or PIECEWISE; `stream` must outlive the wrapper.
  CudaGraphWrapper(std::string name, CudaGraphMode mode, Stream* stream,
                   Runnable runnable, InputAddresses input_addresses = nullptr,
                   CudaGraphWrapperOptions options = {});

  // Runs per the rules above. Errors: the runnable's, the stream's, or
  // FAILED_PRECONDITION for moved inputs.
  absl::Status Run();

  CudaGraphMode mode() const { return mode_; }
  const std::string& name() const { return name_; }
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }        // cache hits only
  int64_t passthroughs() const { return passthroughs_; }
  size_t num_graphs() const { return entries_.size(); }
  bool HasGraph(const BatchDescriptor& d) const { return entries_.contains(d); }

 private:
  struct Entry {
    std::unique_ptr<Graph> graph;
    std::vector<const void*> input_addresses;
  };
  // Records the runnable as a graph; `run` replays it once so this call
  // produces the real output (not during a start-up capture pass).
  absl::Status Capture(const BatchDescriptor& descriptor, bool run);
  absl::Status CheckAddresses(const BatchDescriptor& descriptor, const Entry& entry) const;

  std::string name_;
  CudaGraphMode mode_;
  Stream* stream_;
  Runnable runnable_;
  InputAddresses input_addresses_;
  CudaGraphWrapperOptions options_;
  absl::flat_hash_map<BatchDescriptor, Entry> entries_;
  int64_t captures_ = 0;
  int64_t replays_ = 0;
  int64_t passthroughs_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GRAPH_CUDAGRAPH_WRAPPER_H_
