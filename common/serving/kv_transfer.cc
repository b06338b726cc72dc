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
      first_(first),
      num_tokens_(num_tokens),
      fingerprint_(std::move(fingerprint)),
      row_(slot_bytes),
      per_chunk_(TokensPerChunk(row_)),
      num_layers_(num_layers),
      run_begin_(first),
      run_end_(first),
      layer_(num_layers),
      next_(first) {}

v1::PrefillResponse KvExporter::Header() const {
  v1::PrefillResponse header;
  *header.mutable_header()->mutable_fingerprint() = fingerprint_;
  header.mutable_header()->set_num_tokens(static_cast<uint32_t>(num_tokens_));
  header.mutable_header()->set_first_token(static_cast<uint32_t>(first_));
  return header;
}

absl::StatusOr<std::optional<v1::PrefillResponse>> KvExporter::Next(const LlmEngine& engine) {
  if (layer_ >= num_layers_) {  // the run is out: start one over the tokens computed since
    const int64_t ready = std::min(engine.KvReadyTokens(id_), num_tokens_);
    if (ready <= run_end_) return std::nullopt;
    run_begin_ = run_end_;
    run_end_ = ready;
    layer_ = 0;
    next_ = run_begin_;
  }
  const int64_t n = std::min<int64_t>(per_chunk_, run_end_ - next_);
  v1::PrefillResponse msg;
  v1::KvChunk* chunk = msg.mutable_chunk();
  chunk->set_layer(layer_);
  chunk->set_first_token(static_cast<uint32_t>(next_));
  chunk->set_num_tokens(static_cast<uint32_t>(n));
  std::string* k = chunk->mutable_k();
  std::string* v = chunk->mutable_v();
  k->resize(n * row_);
  v->resize(n * row_);
  RETURN_IF_ERROR(engine.ReadKv(id_, layer_, next_, n, k->data(), v->data()));
  chunk->set_crc32c(Crc32c(Crc32c(0, k->data(), k->size()), v->data(), v->size()));
  next_ += n;
  if (next_ >= run_end_) {
    next_ = run_begin_;
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
    ASSIGN_OR_RETURN(std::optional<v1::PrefillResponse> msg, exporter.Next(engine));
    if (!msg.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "request '", id, "' has computed ", engine.KvReadyTokens(id), " of ", num_tokens,
          " tokens"));
    }
    out.push_back(*std::move(msg));
  }
  return out;
}

}  // namespace tandem
