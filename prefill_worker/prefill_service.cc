#include "prefill_worker/prefill_service.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/status_convert.h"
#include "common/serving/stream_writer.h"

namespace tandem {

struct PrefillServiceImpl::Transfer {
  Transfer(const LlmEngine& engine, const std::string& id, int64_t num_tokens, int32_t first_token,
           bool corrupt)
      : id(id), exporter(engine, id, num_tokens), first_token(first_token), corrupt(corrupt),
        start(absl::Now()) {}
  std::string id;
  KvExporter exporter;
  int32_t first_token;
  bool corrupt;          // testing: flip the checksum of the second chunk
  int chunks = 0;
  size_t bytes = 0;
  absl::Time start;
  bool finished = false;  // engine thread
};

void PrefillServiceImpl::SendMore(LlmEngine& engine,
                                  const std::shared_ptr<StreamWriter<v1::PrefillResponse>>& writer,
                                  const std::shared_ptr<Transfer>& t) {
  if (t->finished) return;
  auto finish = [&] {
    t->finished = true;
    (void)engine.Abort(t->id);  // frees the blocks kept for the export
    Release(t->id);
  };
  if (writer->ended()) return finish();  // cancelled or broken: drop the rest
  while (!t->exporter.done() && writer->buffered_bytes() < kStreamWindowBytes) {
    auto msg = t->exporter.Next(engine);
    if (!msg.ok()) {
      writer->End(ToGrpcStatus(msg.status()));
      return finish();
    }
    if (t->corrupt && ++t->chunks == 1) {
      msg->mutable_chunk()->set_crc32c(msg->chunk().crc32c() ^ 1u);
    }
    t->bytes += msg->chunk().k().size() + msg->chunk().v().size();
    writer->Send(*std::move(msg));
  }
  if (!t->exporter.done()) return;  // more when the reader has taken these
  metrics_->KvTransfer(t->bytes, absl::ToDoubleSeconds(absl::Now() - t->start));
  v1::PrefillResponse done;
  done.mutable_done()->set_first_token(t->first_token);
  writer->Send(std::move(done));
  writer->End(grpc::Status::OK);
  finish();
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
  {
    MutexLock lock(&mu_);
    if (!in_flight_.insert(id).second) {
      writer->End(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                               absl::StrCat("request_id '", EchoClientText(id),
                                            "' is already in flight")));
      return writer.get();
    }
  }
  std::vector<int32_t> prompt(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  SamplingParams params = FromProto(request->sampling());
  params.max_tokens = 1;  // the prefill worker samples only the first token
  EngineLoop* loop = loop_.load();
  writer->OnCancelled([this, loop, id] {
    loop->Post([this, loop, id](LlmEngine& engine) {
      (void)engine.Abort(id);  // frees its blocks wherever it is
      loop->RemoveCallback(id);
      Release(id);
    });
  });
  const int max_waiting = max_waiting_;
  loop->Post([this, loop, writer, id, prompt = std::move(prompt), params, max_waiting,
              start](LlmEngine& engine) mutable {
    if (writer->ended()) {  // cancelled before it reached the engine
      Release(id);
      return;
    }
    if (static_cast<int>(engine.num_waiting()) >= max_waiting) {
      Release(id);
      writer->End(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("prefill queue is full: ", engine.num_waiting(), " requests waiting (limit ",
                       max_waiting, ")")));
      return;
    }
    const int64_t num_tokens = static_cast<int64_t>(prompt.size());
    absl::Status added = engine.AddRequest(id, std::move(prompt), params, RequestKind::kPrefillOnly);
    if (!added.ok()) {
      Release(id);
      writer->End(ToGrpcStatus(added));
      return;
    }
    loop->SetCallback(id, [this, writer, id, num_tokens, start](LlmEngine& engine,
                                                                const RequestOutput& o) {
      if (!o.finished) return;
      if (!o.status.ok() || o.new_tokens.empty()) {
        (void)engine.Abort(id);
        Release(id);
        writer->End(ToGrpcStatus(o.status.ok() ? absl::InternalError("no first token") : o.status));
        return;
      }
      metrics_->PrefillSeconds(absl::ToDoubleSeconds(absl::Now() - start));
      metrics_->PromptTokens(static_cast<int>(num_tokens));
      // Stream the KV straight from the cache as the reader takes it: at most
      // kStreamWindowBytes of copies per stream; the blocks are freed when the
      // last chunk has been made.
      auto transfer = std::make_shared<Transfer>(engine, id, num_tokens, o.new_tokens.back(),
                                                 corrupt_streams_.fetch_sub(1) > 0);
      writer->Send(transfer->exporter.Header());
      writer->OnDrained([this, writer, transfer] {
        loop_.load()->Post([this, writer, transfer](LlmEngine& engine) {
          SendMore(engine, writer, transfer);
        });
      });
      SendMore(engine, writer, transfer);
    });
  });
  return writer.get();
}

}  // namespace tandem
