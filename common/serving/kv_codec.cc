// The parts of the KV-transfer codec that need no engine or model: fingerprint
// comparison, chunk sizing, parsing and verification of a received chunk (declared in
// kv_transfer.h). Kept apart
// so the KV-stream fuzzer links them alone.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/base/crc32c.h"
#include "common/serving/kv_transfer.h"

namespace tandem {

absl::Status CheckFingerprint(const v1::ModelFingerprint& remote,
                              const v1::ModelFingerprint& local) {
  auto mismatch = [](const char* field, const auto& r, const auto& l) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV fingerprint mismatch: prefill worker has ", field, "=", r, ", this decode worker has ",
        l, "; both workers must serve the same model"));
  };
  if (remote.num_layers() != local.num_layers()) {
    return mismatch("num_layers", remote.num_layers(), local.num_layers());
  }
  if (remote.num_kv_heads() != local.num_kv_heads()) {
    return mismatch("num_kv_heads", remote.num_kv_heads(), local.num_kv_heads());
  }
  if (remote.head_dim() != local.head_dim()) {
    return mismatch("head_dim", remote.head_dim(), local.head_dim());
  }
  if (remote.dtype() != local.dtype()) return mismatch("dtype", remote.dtype(), local.dtype());
  if (remote.config_hash() != local.config_hash()) {
    return mismatch("config_hash", absl::Hex(remote.config_hash()), absl::Hex(local.config_hash()));
  }
  if (remote.lora_fingerprint() != local.lora_fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV fingerprint mismatch: the prefill worker computed it with LoRA adapter ",
        absl::Hex(remote.lora_fingerprint()), ", this decode worker's is ",
        absl::Hex(local.lora_fingerprint()),
        " (0: the base model); both workers need the same --lora-modules"));
  }
  return absl::OkStatus();
}

int TokensPerChunk(size_t slot_bytes, size_t max_bytes) {
  const size_t per_token = slot_bytes * 2;
  return static_cast<int>(std::max<size_t>(1, max_bytes / per_token));
}

int KvStreamsFor(int64_t kv_bytes, int max_streams, int64_t bytes_per_stream) {
  const int64_t most = std::max(1, max_streams);
  if (bytes_per_stream <= 0) return static_cast<int>(most);
  const int64_t wanted = std::max<int64_t>(kv_bytes, 0) / bytes_per_stream + 1;
  return static_cast<int>(std::min(wanted, most));
}

ReceivedChunk ReceivedChunk::Of(v1::KvChunk chunk) {
  auto owned = std::make_shared<v1::KvChunk>(std::move(chunk));
  ReceivedChunk c;
  c.layer = owned->layer();
  c.first_token = owned->first_token();
  c.num_tokens = owned->num_tokens();
  c.crc32c = owned->crc32c();
  c.k = {owned->k()};
  c.v = {owned->v()};
  c.k_bytes = owned->k().size();
  c.v_bytes = owned->v().size();
  c.storage = std::move(owned);
  return c;
}

namespace {

// Reads protobuf's wire format across pieces. Hand-written because the
// point is to leave the `bytes` fields where they lie: protobuf's parser
// copies them into strings.
class PieceReader {
 public:
  explicit PieceReader(absl::Span<const absl::string_view> pieces) : pieces_(pieces) {
    for (absl::string_view p : pieces) left_ += p.size();
  }
  size_t left() const { return left_; }

  bool Byte(uint8_t* b) {
    if (left_ == 0) return false;
    while (at_ == pieces_[i_].size()) ++i_, at_ = 0;
    *b = static_cast<uint8_t>(pieces_[i_][at_++]);
    --left_;
    return true;
  }
  // At most 10 bytes; false past the end or for an overlong varint.
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  bool Fixed32(uint32_t* v) {
    *v = 0;
    for (int i = 0; i < 4; ++i) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= uint32_t{b} << (8 * i);
    }
    return true;
  }
  // The next n bytes as pieces (no copy).
  bool Take(size_t n, std::vector<absl::string_view>* out, size_t* total) {
    if (n > left_) return false;
    *total = n;
    left_ -= n;
    while (n > 0) {
      if (at_ == pieces_[i_].size()) {
        ++i_, at_ = 0;
        continue;
      }
      const size_t part = std::min(n, pieces_[i_].size() - at_);
      out->push_back(pieces_[i_].substr(at_, part));
      at_ += part;
      n -= part;
    }
    return true;
  }

 private:
  absl::Span<const absl::string_view> pieces_;
  size_t i_ = 0, at_ = 0, left_ = 0;
};

// The canonical chunk: tag 2 (length-delimited) over the whole message, then
// KvChunk's fields, each at most once, in any order. nullopt for anything
// else (protobuf's parser decides what that is).
std::optional<ReceivedChunk> ParseCanonicalChunk(absl::Span<const absl::string_view> pieces) {
  PieceReader r(pieces);
  uint64_t tag, len;
  if (!r.Varint(&tag) || tag != ((2 << 3) | 2) || !r.Varint(&len) || len != r.left()) {
    return std::nullopt;
  }
  ReceivedChunk c;
  uint32_t seen = 0;
  while (r.left() > 0) {
    if (!r.Varint(&tag) || tag >> 3 > 6 || tag >> 3 == 0) return std::nullopt;
    const int field = static_cast<int>(tag >> 3);
    if (seen & (1u << field)) return std::nullopt;
    seen |= 1u << field;
    const uint64_t type = tag & 7;
    uint64_t v;
    if (field <= 3) {
      if (type != 0 || !r.Varint(&v) || v > UINT32_MAX) return std::nullopt;
      (field == 1 ? c.layer : field == 2 ? c.first_token : c.num_tokens) = static_cast<uint32_t>(v);
    } else if (field <= 5) {
      if (type != 2 || !r.Varint(&v)) return std::nullopt;
      if (!(field == 4 ? r.Take(v, &c.k, &c.k_bytes) : r.Take(v, &c.v, &c.v_bytes))) {
        return std::nullopt;
      }
    } else if (type != 5 || !r.Fixed32(&c.crc32c)) {
      return std::nullopt;
    }
  }
  return c;
}

}  // namespace

absl::StatusOr<ReceivedMessage> ParseReceived(std::vector<absl::string_view> pieces,
                                              std::shared_ptr<const void> storage) {
  ReceivedMessage out;
  if (std::optional<ReceivedChunk> chunk = ParseCanonicalChunk(pieces)) {
    chunk->storage = std::move(storage);
    out.chunk = std::move(chunk);
    return out;
  }
  std::string flat;
  for (absl::string_view p : pieces) flat.append(p.data(), p.size());
  if (!out.message.ParseFromString(flat)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV stream message (", flat.size(), " bytes) is not a PrefillResponse"));
  }
  if (out.message.has_chunk()) {
    out.chunk = ReceivedChunk::Of(std::move(*out.message.mutable_chunk()));
    out.message.Clear();
  }
  return out;
}

absl::Status VerifyChunk(const ReceivedChunk& chunk, size_t slot_bytes) {
  const size_t expected = static_cast<size_t>(chunk.num_tokens) * slot_bytes;
  if (chunk.k_bytes != expected || chunk.v_bytes != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunk of layer ", chunk.layer, " has ", chunk.k_bytes, "+", chunk.v_bytes,
        " bytes for ", chunk.num_tokens, " tokens; expected ", expected, " each"));
  }
  uint32_t crc = 0;
  for (const std::vector<absl::string_view>* rows : {&chunk.k, &chunk.v}) {
    for (absl::string_view p : *rows) crc = Crc32c(crc, p.data(), p.size());
  }
  if (crc != chunk.crc32c) {
    return absl::DataLossError(absl::StrCat("KV chunk of layer ", chunk.layer, " tokens [",
                                            chunk.first_token, ", ",
                                            uint64_t{chunk.first_token} + chunk.num_tokens,
                                            ") failed its CRC32C check"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
