// The KV-transfer codec: how a prefill worker turns a request's cached KV
// into a stream of PrefillResponse messages and how a decode worker checks and
// writes them into its own cache.
//
// Chunks are per layer, token-major (independent of either side's block
// size), at most kMaxChunkBytes each, with a CRC32C over k followed by v.
// Export and import run on the engine thread (they touch the cache).
#ifndef TANDEM_COMMON_SERVING_KV_TRANSFER_H_
#define TANDEM_COMMON_SERVING_KV_TRANSFER_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/engine/engine.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/tandem/v1/tandem.pb.h"

namespace tandem {

inline constexpr size_t kMaxChunkBytes = size_t{1} << 20;

// What both workers must agree on for their KV to be interchangeable: the
// model config and the KV cache's dtype.
v1::ModelFingerprint MakeFingerprint(const LlamaConfig& config, DType kv_dtype);
// FAILED_PRECONDITION naming the first differing field and both values.
absl::Status CheckFingerprint(const v1::ModelFingerprint& remote,
                              const v1::ModelFingerprint& local);

// Tokens per chunk so that k + v of one chunk fit in max_bytes.
// `slot_bytes`: bytes of one token's K (and of its V) in one layer.
int TokensPerChunk(size_t slot_bytes, size_t max_bytes = kMaxChunkBytes);

// Streams for a request whose KV is `kv_bytes`, up to `max_streams` (the
// decode worker's --kv-streams): one, and one more for each whole
// `bytes_per_stream` of KV (its --kv-bytes-per-stream, by default
// kKvBytesPerStream; 0: max_streams at once).
// On a 2-vCPU Xeon two streams moved a 90 MiB KV 1.3x as fast as one on
// loopback and at the wire's rate on a 10 Gbit/s link where one stream
// reached 0.80-0.85 of it; for the serving mix's 64-token chats (3 MiB) a
// second stream only added its attach round trip and threads (goodput at 2
// requests/s 4% lower). docs/benchmarking.md, "Two streams per request".
inline constexpr int64_t kKvBytesPerStream = int64_t{8} << 20;
int KvStreamsFor(int64_t kv_bytes, int max_streams, int64_t bytes_per_stream = kKvBytesPerStream);

// One stream message as its bytes on the wire. A chunk is encoded by hand
// (tandem.proto's field numbers; any protobuf parser reads it as the
// PrefillResponse it is) so that its K and V rows go from the cache straight
// into the buffer gRPC sends: a protobuf message would hold them in `bytes`
// fields and be copied once more to be serialized.
struct WireMessage {
  std::unique_ptr<char[]> data;
  size_t size = 0;
  size_t kv_bytes = 0;  // K and V bytes in it

  static WireMessage Of(const v1::PrefillResponse& msg);
};

// Produces the KV of request `id`'s tokens [first, num_tokens) as a header,
// then one chunk at a time, so a sender can make chunks as fast as its reader
// takes them instead of copying the whole KV at once. Chunks go out as the
// prompt is computed: each run of newly computed tokens (a prefill chunk's,
// LlmEngine::KvReadyTokens) layer by layer, each layer as soon as it is final
// (from the engine's layer hook, while the step computes the next layers, or
// after the step), while the engine computes the next; the reader's
// KvStreamChecker accepts rows in any order.
// Next() runs on the engine thread; the request's blocks must stay allocated
// until done().
//
// With num_streams > 1 the exporter makes stream `stream_index`'s share: the
// layers l with l % num_streams == stream_index.
class KvExporter {
 public:
  KvExporter(std::string id, int64_t first, int64_t num_tokens, v1::ModelFingerprint fingerprint,
             size_t slot_bytes, int num_layers, int stream_index = 0, int num_streams = 1);
  v1::PrefillResponse Header() const;
  // The next chunk, or nullopt when its rows are not computed yet (more after
  // the engine's next layer or step) or, unless `wait`, not copied out of the
  // device yet (reads_in_flight()); check done() first. Its CRC32C is taken
  // as the rows are copied out of the cache (or out of the device's pinned
  // buffer), in one pass. Reads are issued ahead (LlmEngine::IssueKvRead):
  // on a GPU up to kMaxReadsInFlight chunks are copied while it computes.
  absl::StatusOr<std::optional<WireMessage>> Next(const LlmEngine& engine, bool wait = false);
  bool done() const {
    return run_end_ >= num_tokens_ && layer_ >= num_layers_ && in_flight_.empty();
  }
  // Chunks whose rows are being copied out of the device: the engine thread
  // should come back soon even with no step to run.
  bool reads_in_flight() const { return !in_flight_.empty(); }

  // 16 MiB of pinned memory per stream at most, in chunks of up to 1 MiB:
  // five layers ahead for a 2048-token SmolLM2 prompt (three chunks a
  // layer). Not yet measured on a GPU.
  static constexpr size_t kMaxReadsInFlight = 16;

 private:
  std::string id_;
  int64_t first_;
  int64_t num_tokens_;
  v1::ModelFingerprint fingerprint_;
  size_t row_;
  int per_chunk_;
  int num_layers_;
  int stream_index_;
  int num_streams_;
  // The run of tokens being sent: [run_begin_, run_end_), layer_ by layer_,
  // next_ the first token of the next chunk in it.
  int64_t run_begin_;
  int64_t run_end_;
  int layer_;
  int64_t next_;
  // A chunk issued (its rows on their way) and not yet returned by Next().
  struct InFlight {
    WireMessage message;  // encoded but for its rows and checksum
    char* k = nullptr;
    char* v = nullptr;
    char* crc = nullptr;
    KvRead read;
  };
  std::deque<InFlight> in_flight_;

  // Issues the next chunk's read; false when its rows are not computed yet.
  absl::StatusOr<bool> Issue(const LlmEngine& engine);
};

// The header and every chunk of tokens [first, num_tokens) at once, parsed
// back from the wire (tests and benchmarks).
absl::StatusOr<std::vector<v1::PrefillResponse>> ExportKv(const LlmEngine& engine,
                                                         const std::string& id,
                                                         int64_t num_tokens, int64_t first = 0);

// A KV chunk as the decode worker received it: its fields, and its K and V
// rows where they arrived: pieces of the received message in order (gRPC's
// slices), so that the checksum and the import into the cache read them there
// instead of from a parsed protobuf message's copy.
struct ReceivedChunk {
  uint32_t layer = 0;
  uint32_t first_token = 0;
  uint32_t num_tokens = 0;
  uint32_t crc32c = 0;
  std::vector<absl::string_view> k, v;
  size_t k_bytes = 0, v_bytes = 0;  // the pieces' sizes summed
  std::shared_ptr<const void> storage;  // what the pieces point into

  // A parsed message's chunk, owned by the result (tests, other senders).
  static ReceivedChunk Of(v1::KvChunk chunk);
};

// One stream message: a header or done in `message`, or a chunk in `chunk`.
struct ReceivedMessage {
  v1::PrefillResponse message;
  std::optional<ReceivedChunk> chunk;
};

// Parses a PrefillResponse from the pieces it arrived in (`storage` keeps
// them alive). A chunk in the canonical encoding (one chunk field over the
// whole message, each of its fields at most once) keeps its rows in the
// pieces; anything else goes through protobuf's parser, so the result is
// what protobuf would make of the bytes. INVALID_ARGUMENT when they are not
// a PrefillResponse.
absl::StatusOr<ReceivedMessage> ParseReceived(std::vector<absl::string_view> pieces,
                                              std::shared_ptr<const void> storage);
// The same over a message gRPC received: its slices are shared with the
// result (reference counted, not copied), and `buffer` is left empty.
absl::StatusOr<ReceivedMessage> ParseReceived(grpc::ByteBuffer* buffer);

// Checks a chunk's sizes against `slot_bytes` (INVALID_ARGUMENT) and its
// checksum (DATA_LOSS).
absl::Status VerifyChunk(const ReceivedChunk& chunk, size_t slot_bytes);

// Prefill called for its response as bytes (for ParseReceived): the generic
// stub's bidi call with one request and a half-close is, on the wire, the
// server-streaming call tandem.v1.Prefill/Prefill is.
using RawPrefillStub = grpc::TemplatedGenericStub<v1::PrefillRequest, grpc::ByteBuffer>;
inline constexpr char kPrefillMethod[] = "/tandem.v1.Prefill/Prefill";

// The HTTP/2 receive window of a channel that reads KV streams: a fixed
// `bytes` per stream (the decode worker's --kv-receive-window-bytes, by
// default kKvReceiveWindowBytes) instead of gRPC's BDP probing. On loopback
// the probing's estimate keeps the window small and the sender waits for
// window updates: on a 2-vCPU Zen 5 the prefill stream read as bytes moved
// 1.6 GB/s median with probing, 1.9 with this (4 interleaved runs each), and
// gRPC alone (a prebuilt buffer streamed, `tandem bench kv`'s ceiling line)
// 2.4-3.1 GB/s against 4.4-5.1; on a veth link shaped to 10 Gbit/s both move
// at the wire's rate (docs/benchmarking.md). 16 MiB covers a link's
// bandwidth-delay product up to 13 Gbit/s at 10 ms.
inline constexpr int kKvReceiveWindowBytes = 16 << 20;
// HTTP/2's smallest initial window (64 KiB - 1, RFC 9113) rounded up, and a
// bound far above any link's need that keeps the int arithmetic safe.
inline constexpr int kMinKvReceiveWindowBytes = 64 << 10;
inline constexpr int kMaxKvReceiveWindowBytes = 1 << 30;
void SetKvReceiveWindow(grpc::ChannelArguments* args, int bytes = kKvReceiveWindowBytes);

// Keeps a KV stream's buffers in the allocator's heap. glibc's malloc serves
// a block above its mmap threshold with a fresh mapping (the threshold starts
// at 128 KiB and follows the largest block freed) and returns free memory at
// a heap's top above its trim threshold to the system; a stream's MiB-sized
// buffers (gRPC's read slices, the encoded chunks) were then mapped, faulted
// in page by page, zeroed and unmapped again for every chunk. On a 2-vCPU
// Zen 5 the prefill stream, read as the decode worker reads it, moved 1.7-2.1
// GB/s on loopback with glibc's defaults and 3.4-3.5 with these thresholds in
// the same session (`tandem bench kv --prompt-tokens=16 --iters=6`;
// docs/benchmarking.md). Blocks above 32 MiB (weights, the KV cache) are still
// mapped; a heap keeps up to 64 MiB free. Call before threads start; returns
// false where the allocator is not glibc's (a sanitizer's, another libc).
bool KeepKvBuffersInHeap();

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_KV_TRANSFER_H_
