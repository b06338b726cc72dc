#include "common/serving/kv_transfer.h"

#include <algorithm>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace tandem {

v1::ModelFingerprint MakeFingerprint(const LlamaConfig& config, DType kv_dtype) {
  v1::ModelFingerprint f;
  f.set_config_hash(config.Fingerprint());
  f.set_dtype(std::string(DTypeName(kv_dtype)));
  f.set_num_layers(config.num_hidden_layers);
  f.set_num_kv_heads(config.num_key_value_heads);
  f.set_head_dim(config.head_dim);
  return f;
}


KvExporter::KvExporter(std::string id, int64_t first, int64_t num_tokens,
                       v1::ModelFingerprint fingerprint, size_t slot_bytes, int num_layers,
                       int stream_index, int num_streams)
    : id_(std::move(id)),
      first_(first),
      num_tokens_(num_tokens),
      fingerprint_(std::move(fingerprint)),
      row_(slot_bytes),
      per_chunk_(TokensPerChunk(row_)),
      num_layers_(num_layers),
      stream_index_(stream_index),
      num_streams_(std::max(1, num_streams)),
      run_begin_(first),
      run_end_(first),
      layer_(num_layers),
      next_(first) {}

v1::PrefillResponse KvExporter::Header() const {
  v1::PrefillResponse header;
  *header.mutable_header()->mutable_fingerprint() = fingerprint_;
  header.mutable_header()->set_num_tokens(static_cast<uint32_t>(num_tokens_));
  header.mutable_header()->set_first_token(static_cast<uint32_t>(first_));
  if (num_streams_ > 1) {
    header.mutable_header()->set_num_streams(static_cast<uint32_t>(num_streams_));
    header.mutable_header()->set_stream_index(static_cast<uint32_t>(stream_index_));
  }
  return header;
}

namespace {

// Protobuf wire format: varints, and tags of (field << 3) | wire type.
constexpr uint8_t kVarint = 0, kLen = 2, kFixed32 = 5;

size_t VarintBytes(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, ++n;
  return n;
}

char* PutVarint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

char* PutTag(char* p, int field, uint8_t type) { return PutVarint(p, (field << 3) | type); }

}  // namespace

WireMessage WireMessage::Of(const v1::PrefillResponse& msg) {
  WireMessage w;
  w.size = msg.ByteSizeLong();
  w.data.reset(new char[w.size]);  // not zeroed: every byte is written
  msg.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(w.data.get()));
  return w;
}

absl::StatusOr<std::optional<WireMessage>> KvExporter::Next(const LlmEngine& engine, bool wait) {
  // From host memory a read costs nothing until it is finished: one at a
  // time. From a GPU the reads issued ahead are copied while it computes.
  const size_t ahead = engine.kv_reads_async() ? kMaxReadsInFlight : 1;
  while (in_flight_.size() < ahead) {
    ASSIGN_OR_RETURN(const bool issued, Issue(engine));
    if (!issued) break;
  }
  if (in_flight_.empty() || (!wait && !in_flight_.front().read.ready())) return std::nullopt;
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  ASSIGN_OR_RETURN(const uint32_t crc, f.read.Finish(f.k, f.v));
  for (int i = 0; i < 4; ++i) f.crc[i] = static_cast<char>(crc >> (8 * i));  // little-endian
  return std::move(f.message);
}

absl::StatusOr<bool> KvExporter::Issue(const LlmEngine& engine) {
  // Inside a step (the engine's layer hook) only the rows the step computes
  // leave, each layer as it is done; rows final before it (a cached prefix,
  // what the reader's window held back) wait for the step's end rather than
  // take the cores from its compute.
  const bool stepping = engine.stepping();
  const int64_t before = engine.KvReadyTokens(id_);  // final in every layer
  if (layer_ >= num_layers_) {  // the run is out: start one over the tokens computed since
    int64_t ready = std::min(before, num_tokens_);
    if (ready <= run_end_) {
      ready = std::min(engine.KvReadyTokens(id_, stream_index_), num_tokens_);
    } else if (stepping) {
      return false;
    }
    if (ready <= run_end_) return false;
    run_begin_ = run_end_;
    run_end_ = ready;
    layer_ = stream_index_;
    next_ = run_begin_;
  }
  if (stepping && run_begin_ < before) return false;
  // Inside a step the run's later layers are still being computed.
  if (next_ == run_begin_ && engine.KvReadyTokens(id_, layer_) < run_end_) return false;
  const int64_t n = std::min<int64_t>(per_chunk_, run_end_ - next_);
  const size_t rows = static_cast<size_t>(n) * row_;
  // PrefillResponse { chunk (2) = KvChunk { layer (1), first_token (2),
  // num_tokens (3), k (4), v (5), crc32c (6) } }.
  const size_t inner = 1 + VarintBytes(layer_) + 1 + VarintBytes(next_) + 1 + VarintBytes(n) +
                       2 * (1 + VarintBytes(rows) + rows) + 1 + 4;
  InFlight f;
  ASSIGN_OR_RETURN(f.read, engine.IssueKvRead(id_, layer_, next_, n));
  WireMessage& w = f.message;
  w.size = 1 + VarintBytes(inner) + inner;
  w.kv_bytes = 2 * rows;
  w.data.reset(new char[w.size]);  // not zeroed: every byte is written
  char* p = PutVarint(PutTag(w.data.get(), 2, kLen), inner);
  p = PutVarint(PutTag(p, 1, kVarint), layer_);
  p = PutVarint(PutTag(p, 2, kVarint), next_);
  p = PutVarint(PutTag(p, 3, kVarint), n);
  f.k = PutVarint(PutTag(p, 4, kLen), rows);
  f.v = PutVarint(PutTag(f.k + rows, 5, kLen), rows);
  f.crc = PutTag(f.v + rows, 6, kFixed32);
  TANDEM_CHECK(f.crc + 4 == w.data.get() + w.size)
      << "KV chunk encoding: " << f.crc + 4 - w.data.get() << " bytes written, " << w.size
      << " sized";
  in_flight_.push_back(std::move(f));
  next_ += n;
  if (next_ >= run_end_) {
    next_ = run_begin_;
    layer_ += num_streams_;
  }
  return true;
}

void SetKvReceiveWindow(grpc::ChannelArguments* args, int bytes) {
  args->SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args->SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, bytes);
}

// A sanitizer's allocator serves malloc in place of glibc's, which mallopt
// would still configure (TSan does not intercept it): nothing to keep there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TANDEM_SANITIZER_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define TANDEM_SANITIZER_MALLOC 1
#endif
#endif

bool KeepKvBuffersInHeap() {
#if defined(__GLIBC__) && !defined(TANDEM_SANITIZER_MALLOC)
  // Setting either threshold fixes both (glibc stops adjusting them), so both
  // are set: the mmap threshold alone would leave the trim threshold at 128 KiB.
  return mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 64 << 20) == 1;
#else
  return false;
#endif
}

absl::StatusOr<ReceivedMessage> ParseReceived(grpc::ByteBuffer* buffer) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  std::vector<absl::string_view> pieces;
  if (buffer->Dump(slices.get()).ok()) {
    pieces.reserve(slices->size());
    for (const grpc::Slice& slice : *slices) {
      pieces.emplace_back(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  buffer->Clear();
  return ParseReceived(std::move(pieces), std::move(slices));
}

absl::StatusOr<std::vector<v1::PrefillResponse>> ExportKv(const LlmEngine& engine,
                                                         const std::string& id,
                                                         int64_t num_tokens, int64_t first) {
  KvExporter exporter(id, first, num_tokens,
                      MakeFingerprint(engine.model_config(), engine.kv_cache().dtype()),
                      engine.kv_cache().slot_bytes(), engine.model_config().num_hidden_layers);
  std::vector<v1::PrefillResponse> out = {exporter.Header()};
  while (!exporter.done()) {
    ASSIGN_OR_RETURN(std::optional<WireMessage> msg, exporter.Next(engine, /*wait=*/true));
    if (!msg.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "request '", id, "' has computed ", engine.KvReadyTokens(id), " of ", num_tokens,
          " tokens"));
    }
    if (!out.emplace_back().ParseFromArray(msg->data.get(), static_cast<int>(msg->size))) {
      return absl::InternalError("a KV chunk's wire encoding does not parse");
    }
  }
  return out;
}

}  // namespace tandem
