#include "common/backend/cpu/cpu_stream.h"

namespace tandem {

absl::Status CpuGraph::Replay() {
  for (const auto& op : ops_) op();
  stream_->ops_executed_ += static_cast<int64_t>(ops_.size());
  return absl::OkStatus();
}

void CpuStream::Launch(Op op) {
  ++ops_launched_;
  if (recording_ != nullptr) {
    recording_->ops_.push_back(std::move(op));
    return;
  }
  op();
  ++ops_executed_;
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
