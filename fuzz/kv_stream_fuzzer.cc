// The KV stream as the decode worker consumes it: length-prefixed
// PrefillResponse messages, each header checked against the local
// fingerprint and token count, each chunk's sizes and CRC32C verified, and
// the chunk's range checked against the reserved token slots as the import
// does. Any input must end in a Status, never a crash or UB.
#include <cstddef>
#include <cstdint>
#include <cstring>

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
  constexpr uint32_t kPromptTokens = 40;
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
      if (!tandem::CheckFingerprint(msg.header().fingerprint(), local).ok()) break;
      if (msg.header().num_tokens() != kPromptTokens) break;
    } else if (msg.has_chunk()) {
      const tandem::v1::KvChunk& c = msg.chunk();
      if (!tandem::VerifyChunk(c, kSlotBytes).ok()) break;
      const uint64_t end = uint64_t{c.first_token()} + c.num_tokens();
      if (c.layer() >= local.num_layers() || end > kPromptTokens + 1) break;
      // The import copies num_tokens rows of kSlotBytes from k and v.
      volatile uint8_t sink = 0;
      for (size_t i = 0; i < c.k().size(); i += kSlotBytes) sink ^= c.k()[i] ^ c.v()[i];
    } else if (msg.has_done()) {
      break;
    }
  }
  return 0;
}
