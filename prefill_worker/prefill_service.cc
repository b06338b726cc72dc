#include "prefill_worker/prefill_service.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/status_convert.h"
#include "common/serving/stream_writer.h"

namespace tandem {

void PrefillServiceImpl::Release(const std::string& id) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(id);
}

grpc::ServerWriteReactor<v1::PrefillResponse>* PrefillServiceImpl::Prefill(
    grpc::CallbackServerContext* context, const v1::PrefillRequest* request) {
  auto [writer, admitted] = OpenStream<v1::PrefillResponse>(state_, metrics_);
  if (!admitted) return writer.get();
  const absl::Time start = absl::Now();
  // Room for the "#attempt" suffix the decode worker adds to a client's id.
  auto resolved_id = ResolveRequestId(request->request_id(), kMaxRequestIdBytes + 16);
  if (!resolved_id.ok()) {
    writer->End(ToGrpcStatus(resolved_id.status()));
    return writer.get();
  }
  const std::string id = *resolved_id;
  {
    absl::MutexLock lock(&mu_);
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
      // Copy the KV out, free the blocks, then stream from host memory.
      const absl::Time export_start = absl::Now();
      auto messages = ExportKv(engine, id, num_tokens);
      (void)engine.Abort(id);
      Release(id);
      if (!messages.ok()) {
        writer->End(ToGrpcStatus(messages.status()));
        return;
      }
      if (corrupt_streams_.fetch_sub(1) > 0 && messages->size() > 1) {
        (*messages)[1].mutable_chunk()->set_crc32c((*messages)[1].chunk().crc32c() ^ 1u);
      }
      size_t bytes = 0;
      for (const auto& m : *messages) bytes += m.chunk().k().size() + m.chunk().v().size();
      metrics_->KvTransfer(bytes, absl::ToDoubleSeconds(absl::Now() - export_start));
      for (auto& m : *messages) writer->Send(std::move(m));
      v1::PrefillResponse done;
      done.mutable_done()->set_first_token(o.new_tokens.back());
      writer->Send(std::move(done));
      writer->End(grpc::Status::OK);
    });
  });
  return writer.get();
}

}  // namespace tandem
