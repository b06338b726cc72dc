// The parts of the KV-transfer codec that need no engine or model: fingerprint
// comparison, chunk sizing and chunk verification (declared in kv_transfer.h). Kept apart
// so the KV-stream fuzzer links them alone.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/serving/crc32c.h"
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
  return absl::OkStatus();
}

int TokensPerChunk(size_t slot_bytes, size_t max_bytes) {
  const size_t per_token = slot_bytes * 2;
  return static_cast<int>(std::max<size_t>(1, max_bytes / per_token));
}

absl::Status VerifyChunk(const v1::KvChunk& chunk, size_t slot_bytes) {
  const size_t expected = static_cast<size_t>(chunk.num_tokens()) * slot_bytes;
  if (chunk.k().size() != expected || chunk.v().size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunk of layer ", chunk.layer(), " has ", chunk.k().size(), "+", chunk.v().size(),
        " bytes for ", chunk.num_tokens(), " tokens; expected ", expected, " each"));
  }
  const uint32_t crc = Crc32c(Crc32c(0, chunk.k().data(), chunk.k().size()), chunk.v().data(),
                              chunk.v().size());
  if (crc != chunk.crc32c()) {
    return absl::DataLossError(absl::StrCat("KV chunk of layer ", chunk.layer(), " tokens [",
                                            chunk.first_token(), ", ",
                                            chunk.first_token() + chunk.num_tokens(),
                                            ") failed its CRC32C check"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
