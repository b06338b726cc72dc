// OpenStream: how a worker's service starts a server stream, admitted or
// refused by the WorkerState and counted in the WorkerMetrics.
#ifndef TANDEM_COMMON_SERVING_OPEN_STREAM_H_
#define TANDEM_COMMON_SERVING_OPEN_STREAM_H_

#include <atomic>
#include <memory>
#include <utility>

#include "common/serving/metrics.h"
#include "common/serving/status_convert.h"
#include "common/serving/stream_writer.h"
#include "common/serving/worker_state.h"

namespace tandem {

// A server stream of a worker: its final status is counted in
// tandem_requests_total and, once admitted, in state->open_streams. Returns
// the writer and whether it was admitted; when not (warming up, draining), it
// has already ended with UNAVAILABLE.
template <typename Msg>
std::pair<std::shared_ptr<StreamWriter<Msg>>, bool> OpenStream(
    WorkerState* state, WorkerMetrics* metrics, grpc::CallbackServerContext* context) {
  auto admitted = std::make_shared<std::atomic<bool>>(false);
  auto writer = StreamWriter<Msg>::Create(
      [state, metrics, admitted](const grpc::Status& s) {
        metrics->RequestFinished(GrpcCodeName(s.error_code()));
        if (admitted->load()) --state->open_streams;
      },
      context->deadline());
  if (grpc::Status s = state->Admit(); !s.ok()) {
    writer->End(s);
    return {writer, false};
  }
  ++state->open_streams;
  admitted->store(true);
  return {writer, true};
}

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_OPEN_STREAM_H_
