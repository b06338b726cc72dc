// The Prefill service: runs prompts (batched with chunked prefill, PIECEWISE
// graphs by default, reusing its prefix cache), then streams each request's
// KV from the caller's num_cached_tokens on (header, per-layer chunks, first
// token) with flow control: chunks are copied out of the cache as the reader
// takes them, at most kStreamWindowBytes ahead of it, so a slow reader holds
// cache blocks (back-pressure on new prefills) but never an unbounded copy.
// A request's blocks are released when its last chunk has been made, or when
// its stream fails or is cancelled (full blocks stay cached for reuse).
//
// Threads: Prefill() runs on a gRPC thread and submits to the EngineClient;
// engine outputs and KV windows arrive on the engine loop thread, the only
// thread that touches a Transfer.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
#define TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_

#include <atomic>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "common/base/mutex.h"
#include "common/serving/engine_client.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/stream_writer.h"
#include "common/serving/metrics.h"
#include "common/serving/worker.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {

class PrefillServiceImpl final : public v1::Prefill::CallbackService {
 public:
  // `max_waiting`: requests queued for the engine beyond which new ones get
  // RESOURCE_EXHAUSTED.
  PrefillServiceImpl(WorkerState* state, WorkerMetrics* metrics, int max_waiting)
      : state_(state), metrics_(metrics), max_waiting_(max_waiting) {}
  void SetEngine(EngineClient* client) { client_ = client; }
  // Fault injection for tests: corrupt the checksum of one chunk in each of
  // the next `n` streams.
  void CorruptNextStreams(int n) { corrupt_streams_ = n; }

  grpc::ServerWriteReactor<v1::PrefillResponse>* Prefill(
      grpc::CallbackServerContext* context, const v1::PrefillRequest* request) override;

  // KV bytes a stream may have copied out and not yet written (~2 chunks).
  static constexpr size_t kStreamWindowBytes = 2 * kMaxChunkBytes;

 private:
  struct Transfer;
  // Asks the engine thread to make the chunks that fit the stream's window
  // (any thread), then the first token once the KV is out.
  void SendMore(const std::shared_ptr<StreamWriter<v1::PrefillResponse>>& writer,
                const std::shared_ptr<Transfer>& transfer);
  // Engine thread: the work of SendMore.
  void Fill(const std::shared_ptr<StreamWriter<v1::PrefillResponse>>& writer, Transfer& transfer,
            const EngineClient::NextChunk& next);
  // Engine thread: the transfer is over; releases the request's blocks.
  void EndTransfer(Transfer& transfer);
  void Release(const std::string& id);

  WorkerState* state_;
  WorkerMetrics* metrics_;
  int max_waiting_;
  std::atomic<EngineClient*> client_{nullptr};
  std::atomic<int> corrupt_streams_{0};
  Mutex mu_;
  absl::flat_hash_set<std::string> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem

#endif  // TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
