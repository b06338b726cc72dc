// KV events as vLLM publishes them, so a consumer written for vLLM (its
// examples/online_serving/kv_events_subscriber.py, llm-d's KV indexer,
// Dynamo's KV router) reads a Tandem worker unchanged.
//
// Configuration: vLLM's --kv-events-config JSON (enable_kv_cache_events,
// publisher, endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size,
// topic). Wire: a ZeroMQ PUB socket sends three-frame messages
// [topic, seq as 8 bytes big-endian, payload], the payload a msgpack
// KVEventBatch: [ts, [event...], data_parallel_rank], each event an array
// tagged by its type's name:
//   ["BlockStored", block_hashes, parent_block_hash|nil, token_ids,
//    block_size, lora_id|nil, medium, lora_name|nil]
//   ["BlockRemoved", block_hashes, medium]
//   ["AllBlocksCleared"]
// A subscriber that saw a gap asks the ROUTER replay socket for everything
// from a sequence number (one 8-byte big-endian frame) and gets back
// [seq, payload] for every batch still in the buffer, then [-1, ""].
//
// Block hashes are this worker's 64-bit chain keys: opaque, stable for the
// life of the process; a restarted worker starts with AllBlocksCleared.
// `medium` is "GPU" on every device, as vLLM names its engine's own cache on
// its CPU backend too.
//
// Thread-safe: Publish() from the engine thread encodes and queues; one
// sender thread owns the sockets, so the engine never waits on the network.
#ifndef TANDEM_COMMON_SERVING_KV_EVENTS_H_
#define TANDEM_COMMON_SERVING_KV_EVENTS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/base/mutex.h"
#include "common/model/kv_cache.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace tandem {

struct KvEventsConfig {
  bool enable_kv_cache_events = false;
  std::string publisher = "null";  // "null" or "zmq"
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;  // empty: no replay socket
  int buffer_steps = 10000;     // batches kept for replay
  int hwm = 100000;             // the PUB socket's high-water mark
  int max_queue_size = 100000;  // batches waiting for the sender thread
  std::string topic;
  bool publishes() const { return enable_kv_cache_events && publisher == "zmq"; }
};

// Parses vLLM's --kv-events-config JSON; an unknown key, a wrong type or an
// out-of-range value is INVALID_ARGUMENT naming the key.
absl::StatusOr<KvEventsConfig> ParseKvEventsConfig(std::string_view json);

// One KVEventBatch payload (msgpack), as described above.
std::string EncodeKvEventBatch(double ts, absl::Span<const KvCacheEvent> events, int block_size);

class KvEventPublisher {
 public:
  // Binds (an endpoint with '*', '::', ipc:// or inproc://) or connects the
  // PUB socket and binds the replay socket, as vLLM does, and starts the
  // sender thread. Counters go into `registry` (may be null).
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Start(
      const KvEventsConfig& config, prometheus::Registry* registry, const std::string& role);
  ~KvEventPublisher();  // sends what is queued (up to ~1 s), then closes

  // Queues `events` as the next batch (none: nothing sent). Never blocks on
  // the network; past max_queue_size the oldest queued batch is dropped from
  // the queue (it stays in the replay buffer).
  void Publish(absl::Span<const KvCacheEvent> events, int block_size);

  // The addresses bound (port 0 or '*' resolved), for logs and tests.
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

 private:
  struct Batch {
    uint64_t seq;
    std::shared_ptr<const std::string> payload;
  };
  struct Sockets;  // cppzmq's, used by the sender thread only
  explicit KvEventPublisher(const KvEventsConfig& config);
  void Run();
  void ServeReplay();

  const KvEventsConfig config_;
  std::string endpoint_;
  std::string replay_endpoint_;
  std::unique_ptr<Sockets> sockets_;
  std::thread sender_;

  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Batch> queue_ ABSL_GUARDED_BY(mu_);   // for the sender
  std::deque<Batch> replay_ ABSL_GUARDED_BY(mu_);  // the last buffer_steps sent or queued

  prometheus::Counter* batches_ = nullptr;
  prometheus::Counter* dropped_ = nullptr;
  prometheus::Counter* replays_ = nullptr;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_KV_EVENTS_H_
