// The KV stream as the decode worker consumes it: length-prefixed
// PrefillResponse messages fed to the KvStreamChecker the PrefillClient uses
// (header against the local fingerprint and range, chunk sizes and CRC32C,
// coverage). Any input must end in a Status, never a crash or UB; and no
// stream may be accepted at `done` unless an independent count here says
// every (layer, token) row of the range arrived exactly once.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/serving/kv_stream_checker.h"
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
    tandem::v1::PrefillResponse msg;
    const bool parsed = msg.ParseFromArray(data + pos, static_cast<int>(len));
    pos += len;
    if (!parsed) break;
    if (msg.has_header()) {
      if (!checker.Header(msg.header()).ok()) break;
    } else if (msg.has_chunk()) {
      const tandem::v1::KvChunk& c = msg.chunk();
      if (!checker.Chunk(c).ok()) break;
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
