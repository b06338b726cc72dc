// Stream and Graph: the backend-agnostic capture interface.
//
// A Stream runs the ops issued on it in order. Between BeginCapture() and
// EndCapture() the ops issued on the stream are recorded into a Graph instead
// of being run; Graph::Replay() runs the recording again, reading whatever the
// bound buffers hold at that moment, without re-running the host code that
// issued the ops. This is CUDA stream capture (cudaStreamBeginCapture /
// cudaGraphLaunch); the CPU backend records closures over bound buffers.
//
// Two constraints follow, as for CUDA graphs: one graph per shape, and inputs
// at fixed addresses (persistent buffers the runner copies each step into).
//
// A Stream is owned by one engine thread and used only from it.
#ifndef TANDEM_COMMON_GRAPH_STREAM_H_
#define TANDEM_COMMON_GRAPH_STREAM_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

class Graph {
 public:
  virtual ~Graph() = default;
  // Runs the recorded ops on the stream they were captured from.
  virtual absl::Status Replay() = 0;
  // Number of recorded ops (CPU) or graph nodes (CUDA).
  virtual size_t num_nodes() const = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  // FAILED_PRECONDITION if a capture is already in progress.
  virtual absl::Status BeginCapture() = 0;
  // Ends the capture and returns the instantiated graph. FAILED_PRECONDITION
  // if no capture is in progress.
  virtual absl::StatusOr<std::unique_ptr<Graph>> EndCapture() = 0;
  virtual bool capturing() const = 0;
  // Waits for every op issued so far.
  virtual absl::Status Synchronize() = 0;
  // Whether ops issued so far are still running (never blocks; an error
  // reads as not busy and comes out of Synchronize()). A stream whose ops
  // run when issued is never busy.
  virtual bool Busy() { return false; }
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GRAPH_STREAM_H_
