// The KV stream as the decode worker consumes it: length-prefixed
// PrefillResponse messages, each split into pieces as gRPC's slices split
// them, parsed by ParseReceived and fed to the KvStreamChecker the
// PrefillClient uses (header against the local fingerprint and range, chunk
// sizes and CRC32C, coverage). Any input must end in a Status, never a crash
// or UB; ParseReceived must make of every message what protobuf's parser
// makes of it; and no stream may be accepted at `done` unless an independent
// count here says every (layer, token) row of the range arrived exactly once.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/serving/kv_stream_checker.h"
#include "common/serving/kv_transfer.h"
#include "proto/tandem/v1/tandem.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::v1::ModelFingerprint local;
  local.set_config_hash(0x1234);
  local.set_dtype("f32");
  local.set_num_layers(4);
  local.set_num_kv_heads(2);
  local.set_head_dim(16);
  constexpr size_t kSlotBytes = 2 * 16 * 4;
  constexpr int64_t kFirst = 8, kPromptTokens = 40;
  tandem::KvStreamChecker checker(local, kSlotBytes, kFirst, kPromptTokens);
  // The oracle: how often each (layer, token) row was accepted.
  std::vector<int> seen(4 * kPromptTokens, 0);
  size_t pos = 0;
  while (pos + 4 <= size) {
    uint32_t len;
    std::memcpy(&len, data + pos, 4);
    pos += 4;
    if (len > size - pos) break;
    const char* bytes = reinterpret_cast<const char*>(data + pos);
    tandem::v1::PrefillResponse msg;
    const bool parsed = msg.ParseFromArray(bytes, static_cast<int>(len));
    // Pieces of 1 + len % 5 bytes (at most 16), the rest in one.
    std::vector<absl::string_view> pieces;
    size_t at = 0;
    while (at < len) {
      const size_t n = pieces.size() < 15 ? std::min<size_t>(1 + len % 5, len - at) : len - at;
      pieces.emplace_back(bytes + at, n);
      at += n;
    }
    pos += len;
    absl::StatusOr<tandem::ReceivedMessage> received = tandem::ParseReceived(pieces, nullptr);
    if (received.ok() != parsed) std::abort();  // disagrees with protobuf
    if (!parsed) break;
    if (received->chunk.has_value()) {
      const tandem::ReceivedChunk& r = *received->chunk;
      std::string k, v;
      for (absl::string_view p : r.k) k.append(p.data(), p.size());
      for (absl::string_view p : r.v) v.append(p.data(), p.size());
      if (!msg.has_chunk() || r.layer != msg.chunk().layer() ||
          r.first_token != msg.chunk().first_token() || r.num_tokens != msg.chunk().num_tokens() ||
          r.crc32c != msg.chunk().crc32c() || k != msg.chunk().k() || v != msg.chunk().v() ||
          r.k_bytes != k.size() || r.v_bytes != v.size()) {
        std::abort();
      }
    } else if (received->message.SerializeAsString() != msg.SerializeAsString()) {
      std::abort();
    }
    if (msg.has_header()) {
      if (!checker.Header(msg.header()).ok()) break;
    } else if (msg.has_chunk()) {
      const tandem::v1::KvChunk& c = msg.chunk();
      if (!checker.Chunk(*received->chunk).ok()) break;
      // Accepted: within the range, and the import copies num_tokens rows.
      if (c.layer() >= 4 || c.first_token() < kFirst ||
          uint64_t{c.first_token()} + c.num_tokens() > kPromptTokens ||
          c.k().size() != c.num_tokens() * kSlotBytes) {
        std::abort();
      }
      for (uint32_t t = 0; t < c.num_tokens(); ++t) ++seen[c.layer() * kPromptTokens + c.first_token() + t];
    } else if (msg.has_done()) {
      if (checker.Done().ok()) {
        for (int layer = 0; layer < 4; ++layer) {
          for (int64_t t = kFirst; t < kPromptTokens; ++t) {
            if (seen[layer * kPromptTokens + t] != 1) std::abort();  // accepted incomplete KV
          }
        }
      }
      break;
    }
  }
  return 0;
}
