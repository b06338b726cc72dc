// The Prefill service: runs prompts (batched with chunked prefill, PIECEWISE
// graphs by default, reusing its prefix cache) and streams each request's KV
// from the caller's num_cached_tokens on while the prompt is computed: the
// KV of each prefill chunk, layer by layer, goes out as soon as that chunk
// has run, overlapping the compute of the next. The stream: the header at
// once on admission (so a caller can tell a live worker from a stuck one
// before the prompt is computed), per-layer chunks, then the first token.
//
// Flow control: chunks are copied out of the cache as the reader takes them,
// at most kStreamWindowBytes ahead of it (while the prompt is computed, at
// most one step's KV ahead: the engine thread makes chunks only between
// steps), so a slow reader holds cache blocks (back-pressure on new
// prefills) but never an unbounded copy.
// Lease (from the end of the prompt's compute on): a reader that takes
// nothing for `export_timeout` (a frozen decode
// worker, a direct caller that stopped reading), whatever its deadline,
// loses the transfer: its blocks are freed and it is counted as
// tandem_kv_transfer_failures_total{reason="expired"}.
// A request is released (its blocks freed, its id free for reuse) exactly
// once: when its last chunk has been made, or its stream fails, is cancelled
// or expires (full blocks stay cached for reuse).
//
// Threads: Prefill() runs on a gRPC thread and submits to the EngineClient;
// engine outputs and KV windows arrive on the engine loop thread, the only
// thread that touches a Transfer's export state; the lease watcher is a
// thread of its own.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
#define TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_

#include <atomic>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/base/mutex.h"
#include "common/serving/engine_client.h"
#include "common/serving/in_flight_ids.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/metrics.h"
#include "common/serving/stream_writer.h"
#include "common/serving/open_stream.h"
#include "common/serving/request_id.h"
#include "common/serving/sampling_proto.h"
#include "common/serving/worker_state.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {

// The method is registered raw (grpc::ByteBuffer in and out) so that KV
// chunks go out as the bytes KvExporter encoded, not as protobuf messages
// serialized once more; callers see the PrefillResponse stream tandem.proto
// declares.
class PrefillServiceImpl final
    : public v1::Prefill::WithRawCallbackMethod_Prefill<v1::Prefill::CallbackService> {
 public:
  // `max_waiting`: requests queued for the engine beyond which new ones get
  // RESOURCE_EXHAUSTED. `export_timeout`: the lease (see above).
  // `tokenizer` (may be null: the model has none) encodes requests' bad words.
  PrefillServiceImpl(WorkerState* state, WorkerMetrics* metrics, int max_waiting,
                     absl::Duration export_timeout = absl::Seconds(30),
                     const Tokenizer* tokenizer = nullptr);
  ~PrefillServiceImpl() override;
  void SetEngine(EngineClient* client) { client_ = client; }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Prefill(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* raw) override;
  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const v1::LoadLoraAdapterRequest* request,
                                            v1::LoadLoraAdapterResponse* response) override;
  grpc::ServerUnaryReactor* UnloadLoraAdapter(grpc::CallbackServerContext* context,
                                              const v1::UnloadLoraAdapterRequest* request,
                                              v1::UnloadLoraAdapterResponse* response) override;

  // KV bytes a stream may have copied out and not yet written (2 chunks;
  // 2, 4 and 8 measured alike with refills at half the window).
  static constexpr size_t kStreamWindowBytes = 2 * kMaxChunkBytes;
  // PrefillRequest.num_streams' limit (also at most the model's layers).
  static constexpr int kMaxStreams = 16;

 private:
  struct Group;
  struct Transfer;
  // A stream of group `g` (its header queued, its cancellation failing the
  // group).
  std::shared_ptr<Transfer> OpenTransfer(const std::shared_ptr<Group>& g, int index,
                                         std::shared_ptr<StreamWriter<grpc::ByteBuffer>> writer);
  // A stream with stream_index > 0: joins its request's group.
  void Attach(const std::shared_ptr<StreamWriter<grpc::ByteBuffer>>& writer,
              const v1::PrefillRequest& request);
  // Once per request, when its first KV is ready: refills from the stream's
  // writer as the reader takes chunks.
  void BeginExport(const std::shared_ptr<Transfer>& transfer);
  // Asks the engine thread to make the chunks that fit the stream's window
  // (any thread), then the first token once the KV is out.
  void SendMore(const std::shared_ptr<Transfer>& transfer);
  // Engine thread: the work of SendMore.
  void Fill(Transfer& transfer, const EngineClient::NextChunk& next);
  // Any thread: frees the request's blocks and id, once per request.
  void Release(Group& group);
  // Any thread: releases the request and ends each of its streams with
  // `status`, counting the failure once under `reason` (null: not counted).
  void Fail(Group& group, const grpc::Status& status, const char* reason);
  // Every 250 ms: ends the transfers whose reader made no progress within
  // export_timeout_.
  void WatchLeases();

  WorkerState* state_;
  WorkerMetrics* metrics_;
  int max_waiting_;
  absl::Duration export_timeout_;
  const Tokenizer* tokenizer_;
  std::atomic<EngineClient*> client_{nullptr};
  InFlightIds in_flight_;
  Mutex groups_mu_;
  // Requests of several streams, for their streams to attach to, until
  // released: what keeps a request whose streams are not all open.
  absl::flat_hash_map<std::string, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(groups_mu_);
  Mutex leases_mu_;
  std::list<std::weak_ptr<Transfer>> leases_ ABSL_GUARDED_BY(leases_mu_);
  absl::Notification stop_;
  std::thread lease_watcher_;
};

}  // namespace tandem

#endif  // TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
