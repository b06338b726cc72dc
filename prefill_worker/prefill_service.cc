#include "prefill_worker/prefill_service.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/status_convert.h"
#include "common/serving/stream_writer.h"

namespace tandem {

// One request's KV export. Engine thread only, after creation.
struct PrefillServiceImpl::Transfer {
  Transfer(std::shared_ptr<KvExporter> exporter, const std::string& id, int32_t first_token,
           bool corrupt)
      : id(id), exporter(std::move(exporter)), first_token(first_token), corrupt(corrupt),
        start(absl::Now()) {}
  std::string id;
  std::shared_ptr<KvExporter> exporter;
  int32_t first_token;
  bool corrupt;          // testing: flip the checksum of the first chunk
  int chunks = 0;
  size_t bytes = 0;
  absl::Time start;
  bool finished = false;
};

void PrefillServiceImpl::EndTransfer(Transfer& t) {
  if (t.finished) return;
  t.finished = true;
  client_.load()->Cancel(t.id);  // releases the blocks kept for the export
  Release(t.id);
}

void PrefillServiceImpl::SendMore(const std::shared_ptr<StreamWriter<v1::PrefillResponse>>& writer,
                                  const std::shared_ptr<Transfer>& t) {
  client_.load()->ExportKv(t->exporter, [this, writer, t](const EngineClient::NextChunk& next) {
    Fill(writer, *t, next);
  });
}

void PrefillServiceImpl::Fill(const std::shared_ptr<StreamWriter<v1::PrefillResponse>>& writer,
                              Transfer& t, const EngineClient::NextChunk& next) {
  if (t.finished) return;
  if (writer->ended()) return EndTransfer(t);  // cancelled or broken: drop the rest
  while (!t.exporter->done() && writer->buffered_bytes() < kStreamWindowBytes) {
    absl::StatusOr<v1::PrefillResponse> msg = next();
    if (!msg.ok()) {
      writer->End(ToGrpcStatus(msg.status()));
      return EndTransfer(t);
    }
    if (t.corrupt && ++t.chunks == 1) {
      msg->mutable_chunk()->set_crc32c(msg->chunk().crc32c() ^ 1u);
    }
    t.bytes += msg->chunk().k().size() + msg->chunk().v().size();
    writer->Send(*std::move(msg));
  }
  if (!t.exporter->done()) return;  // more when the reader has taken these
  metrics_->KvTransfer(t.bytes, absl::ToDoubleSeconds(absl::Now() - t.start));
  v1::PrefillResponse done;
  done.mutable_done()->set_first_token(t.first_token);
  writer->Send(std::move(done));
  writer->End(grpc::Status::OK);
  EndTransfer(t);
}

void PrefillServiceImpl::Release(const std::string& id) {
  MutexLock lock(&mu_);
  in_flight_.erase(id);
}

grpc::ServerWriteReactor<v1::PrefillResponse>* PrefillServiceImpl::Prefill(
    grpc::CallbackServerContext* context, const v1::PrefillRequest* request) {
  auto opened = OpenStream<v1::PrefillResponse>(state_, metrics_, context);
  const std::shared_ptr<StreamWriter<v1::PrefillResponse>> writer = opened.first;
  if (!opened.second) return writer.get();
  const absl::Time start = absl::Now();
  // Room for the "#attempt" suffix the decode worker adds to a client's id.
  auto resolved_id = ResolveRequestId(request->request_id(), kMaxRequestIdBytes + 16);
  if (!resolved_id.ok()) {
    writer->End(ToGrpcStatus(resolved_id.status()));
    return writer.get();
  }
  const std::string id = *resolved_id;
  const int64_t num_tokens = request->prompt_token_ids_size();
  const int64_t cached = request->num_cached_tokens();
  if (num_tokens > 0 && cached >= num_tokens) {
    writer->End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             absl::StrCat("num_cached_tokens (", cached,
                                          ") must be below the prompt's ", num_tokens,
                                          " tokens: the last one is computed to sample")));
    return writer.get();
  }
  {
    MutexLock lock(&mu_);
    if (!in_flight_.insert(id).second) {
      writer->End(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                               absl::StrCat("request_id '", EchoClientText(id),
                                            "' is already in flight")));
      return writer.get();
    }
  }
  EngineClient* client = client_.load();
  EngineClient::Submission s;
  s.id = id;
  s.prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  s.params = FromProto(request->sampling());
  s.params.max_tokens = 1;  // the prefill worker samples only the first token
  s.kind = RequestKind::kPrefillOnly;
  s.max_waiting = max_waiting_;
  writer->OnCancelled([this, client, id] {
    client->Cancel(id);  // frees its blocks wherever it is
    Release(id);
  });
  client->Submit(std::move(s), [this, client, writer, id, num_tokens, cached,
                                start](const RequestOutput& o) {
    if (!o.finished) return;
    if (!o.status.ok() || o.new_tokens.empty()) {
      client->Cancel(id);
      Release(id);
      writer->End(ToGrpcStatus(o.status.ok() ? absl::InternalError("no first token") : o.status));
      return;
    }
    metrics_->PrefillSeconds(absl::ToDoubleSeconds(absl::Now() - start));
    metrics_->PromptTokens(static_cast<int>(num_tokens));
    // Stream the KV straight from the cache as the reader takes it: at most
    // kStreamWindowBytes of copies per stream; the blocks are released when
    // the last chunk has been made.
    auto exporter = std::make_shared<KvExporter>(id, cached, num_tokens, client->fingerprint(),
                                                 client->slot_bytes(),
                                                 client->model_config().num_hidden_layers);
    auto transfer = std::make_shared<Transfer>(exporter, id, o.new_tokens.back(),
                                               corrupt_streams_.fetch_sub(1) > 0);
    writer->Send(exporter->Header());
    writer->OnDrained([this, writer, transfer] { SendMore(writer, transfer); });
    SendMore(writer, transfer);
  });
  return writer.get();
}

}  // namespace tandem
