#include "common/backend/cpu/cpu_stream.h"

#include <chrono>
#include <cstring>

namespace tandem {

absl::Status CpuGraph::Replay() {
  for (const auto& [kind, op] : ops_) stream_->Run(kind, op);
  stream_->ops_executed_ += static_cast<int64_t>(ops_.size());
  return absl::OkStatus();
}

void CpuStream::Launch(const char* kind, Op op) {
  ++ops_launched_;
  if (recording_ != nullptr) {
    recording_->ops_.emplace_back(kind, std::move(op));
    return;
  }
  Run(kind, op);
  ++ops_executed_;
}

void CpuStream::Run(const char* kind, const Op& op) {
  if (!profiling_) return op();
  const auto start = std::chrono::steady_clock::now();
  op();
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (OpTime& t : op_times_) {
    if (std::strcmp(t.kind, kind) == 0) {
      t.seconds += took;
      ++t.runs;
      return;
    }
  }
  op_times_.push_back({kind, took, 1});
}

absl::Status CpuStream::BeginCapture() {
  if (recording_ != nullptr) {
    return absl::FailedPreconditionError("BeginCapture: the stream is already capturing");
  }
  recording_.reset(new CpuGraph(this));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Graph>> CpuStream::EndCapture() {
  if (recording_ == nullptr) {
    return absl::FailedPreconditionError("EndCapture: the stream is not capturing");
  }
  return std::unique_ptr<Graph>(std::move(recording_));
}

}  // namespace tandem
