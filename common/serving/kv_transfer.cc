#include "common/serving/kv_transfer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/serving/crc32c.h"

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
                       v1::ModelFingerprint fingerprint, size_t slot_bytes, int num_layers)
    : id_(std::move(id)),
      begin_(first),
      num_tokens_(num_tokens),
      fingerprint_(std::move(fingerprint)),
      row_(slot_bytes),
      per_chunk_(TokensPerChunk(row_)),
      num_layers_(num_tokens > first ? num_layers : 0),
      first_(first) {}

v1::PrefillResponse KvExporter::Header() const {
  v1::PrefillResponse header;
  *header.mutable_header()->mutable_fingerprint() = fingerprint_;
  header.mutable_header()->set_num_tokens(static_cast<uint32_t>(num_tokens_));
  header.mutable_header()->set_first_token(static_cast<uint32_t>(begin_));
  return header;
}

absl::StatusOr<v1::PrefillResponse> KvExporter::Next(const LlmEngine& engine) {
  const int64_t n = std::min<int64_t>(per_chunk_, num_tokens_ - first_);
  v1::PrefillResponse msg;
  v1::KvChunk* chunk = msg.mutable_chunk();
  chunk->set_layer(layer_);
  chunk->set_first_token(static_cast<uint32_t>(first_));
  chunk->set_num_tokens(static_cast<uint32_t>(n));
  std::string* k = chunk->mutable_k();
  std::string* v = chunk->mutable_v();
  k->resize(n * row_);
  v->resize(n * row_);
  RETURN_IF_ERROR(engine.ReadKv(id_, layer_, first_, n, k->data(), v->data()));
  chunk->set_crc32c(Crc32c(Crc32c(0, k->data(), k->size()), v->data(), v->size()));
  first_ += n;
  if (first_ >= num_tokens_) {
    first_ = begin_;
    ++layer_;
  }
  return msg;
}

absl::StatusOr<std::vector<v1::PrefillResponse>> ExportKv(const LlmEngine& engine,
                                                         const std::string& id,
                                                         int64_t num_tokens, int64_t first) {
  KvExporter exporter(id, first, num_tokens,
                      MakeFingerprint(engine.model_config(), engine.kv_cache().dtype()),
                      engine.kv_cache().slot_bytes(), engine.model_config().num_hidden_layers);
  std::vector<v1::PrefillResponse> out = {exporter.Header()};
  while (!exporter.done()) {
    ASSIGN_OR_RETURN(v1::PrefillResponse msg, exporter.Next(engine));
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace tandem
