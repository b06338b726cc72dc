#include "prefill_worker/prefill_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/status_convert.h"
#include "common/serving/stream_writer.h"

namespace tandem {
namespace {

// The message's buffer handed to gRPC as it is (freed when sent).
grpc::ByteBuffer ToByteBuffer(WireMessage msg) {
  const size_t size = msg.size;
  grpc::Slice slice(msg.data.release(), size, [](void* p) { delete[] static_cast<char*>(p); });
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

// One Prefill call: its id and stream (any thread), its export (engine thread).
struct PrefillServiceImpl::Transfer {
  std::string id;
  std::shared_ptr<StreamWriter<grpc::ByteBuffer>> writer;
  // Any thread.
  std::atomic<bool> released{false};
  std::atomic<bool> exporting{false};       // the KV began to go out
  std::atomic<bool> failure_counted{false};
  std::atomic<int64_t> last_progress_ns{0};  // the reader last took a chunk
  // Engine thread.
  std::shared_ptr<KvExporter> exporter;
  int32_t first_token = 0;
  bool prefilled = false;  // first_token is known: the prompt is computed
  size_t bytes = 0;
  absl::Time first_sent;  // the first chunk was queued
  bool finished = false;  // the last message is queued, or the export failed

  void Progress() { last_progress_ns = absl::ToUnixNanos(absl::Now()); }
};

PrefillServiceImpl::PrefillServiceImpl(WorkerState* state, WorkerMetrics* metrics,
                                       int max_waiting, absl::Duration export_timeout)
    : state_(state),
      metrics_(metrics),
      max_waiting_(max_waiting),
      export_timeout_(export_timeout),
      lease_watcher_([this] { WatchLeases(); }) {}

PrefillServiceImpl::~PrefillServiceImpl() {
  stop_.Notify();
  lease_watcher_.join();
}

// Called before the stream's End, never after: the id is free by the time
// the client sees the end, so it may reuse it at once.
void PrefillServiceImpl::Release(Transfer& t) {
  if (t.released.exchange(true)) return;
  client_.load()->Cancel(t.id);  // frees its blocks wherever it is
  in_flight_.Release(t.id);
}

void PrefillServiceImpl::WatchLeases() {
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
    const int64_t now = absl::ToUnixNanos(absl::Now());
    const int64_t limit = absl::ToInt64Nanoseconds(export_timeout_);
    std::vector<std::shared_ptr<Transfer>> expired;
    {
      MutexLock lock(&leases_mu_);
      for (auto it = leases_.begin(); it != leases_.end();) {
        std::shared_ptr<Transfer> t = it->lock();
        if (t == nullptr || t->released.load()) {
          it = leases_.erase(it);
        } else if (now - t->last_progress_ns.load() > limit) {
          expired.push_back(std::move(t));
          it = leases_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const std::shared_ptr<Transfer>& t : expired) {
      TANDEM_LOG(WARNING) << "request " << t->id << ": its reader took no KV for "
                          << absl::FormatDuration(export_timeout_) << "; freeing its blocks";
      if (!t->failure_counted.exchange(true)) metrics_->KvTransferFailure("expired");
      Release(*t);
      t->writer->End(grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("KV export lease expired: the reader took nothing for ",
                       absl::FormatDuration(export_timeout_))));
    }
  }
}

void PrefillServiceImpl::BeginExport(const std::shared_ptr<Transfer>& t) {
  if (t->exporting.exchange(true)) return;
  // Refilled at half the window, so the transport never waits for a copy.
  t->writer->OnDrained(
      [this, t] {
        t->Progress();
        SendMore(t);
      },
      kStreamWindowBytes / 2);
}

void PrefillServiceImpl::SendMore(const std::shared_ptr<Transfer>& t) {
  if (t->released.load()) return;
  client_.load()->ExportKv(t->exporter,
                           [this, t](const EngineClient::NextChunk& next) { Fill(*t, next); });
}

void PrefillServiceImpl::Fill(Transfer& t, const EngineClient::NextChunk& next) {
  if (t.finished || t.released.load()) return;
  StreamWriter<grpc::ByteBuffer>& writer = *t.writer;
  if (writer.ended()) return Release(t);  // cancelled or broken: drop the rest
  // While the prompt is computed the engine thread comes back only between
  // steps: each visit may queue what one step computed, so the stream never
  // waits a whole step with KV ready in the cache. After it, the window.
  EngineClient* client = client_.load();
  const size_t window =
      t.prefilled ? kStreamWindowBytes
                  : std::max(kStreamWindowBytes,
                             static_cast<size_t>(client->max_num_batched_tokens()) * 2 *
                                 client->slot_bytes() * client->model_config().num_hidden_layers);
  while (!t.exporter->done() && writer.buffered_bytes() < window) {
    absl::StatusOr<std::optional<WireMessage>> msg = next();
    if (!msg.ok()) {
      t.finished = true;
      if (!t.failure_counted.exchange(true)) metrics_->KvTransferFailure("other");
      Release(t);
      return writer.End(ToGrpcStatus(msg.status()));
    }
    if (!msg->has_value()) return;  // more after the engine's next step
    if (t.bytes == 0) t.first_sent = absl::Now();
    t.bytes += (*msg)->kv_bytes;
    writer.Send(ToByteBuffer(**std::move(msg)));
  }
  // More when the reader has taken these, or once the prompt is computed.
  if (!t.exporter->done() || !t.prefilled) return;
  t.finished = true;
  Release(t);  // every chunk is copied out: the blocks may go
  v1::PrefillResponse done;
  done.mutable_done()->set_first_token(t.first_token);
  writer.Send(ToByteBuffer(WireMessage::Of(done)));
  writer.End(grpc::Status::OK);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* PrefillServiceImpl::Prefill(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  auto opened = OpenStream<grpc::ByteBuffer>(state_, metrics_, context);
  const std::shared_ptr<StreamWriter<grpc::ByteBuffer>> writer = opened.first;
  if (!opened.second) return writer.get();
  v1::PrefillRequest parsed;
  grpc::ByteBuffer copy(*raw);  // shares the slices; Deserialize consumes its buffer
  if (!grpc::SerializationTraits<v1::PrefillRequest>::Deserialize(&copy, &parsed).ok()) {
    writer->End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             absl::StrCat("the request (", raw->Length(),
                                          " bytes) is not a tandem.v1.PrefillRequest")));
    return writer.get();
  }
  const v1::PrefillRequest* request = &parsed;
  const absl::Time start = absl::Now();
  // Room for the "#prefill.attempt" suffix the decode worker adds to a client's id.
  auto resolved_id = ResolveRequestId(request->request_id(), kMaxRequestIdBytes + 16);
  if (!resolved_id.ok()) {
    writer->End(ToGrpcStatus(resolved_id.status()));
    return writer.get();
  }
  const int64_t num_tokens = request->prompt_token_ids_size();
  const int64_t cached = request->num_cached_tokens();
  if (num_tokens > 0 && cached >= num_tokens) {
    writer->End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             absl::StrCat("num_cached_tokens (", cached,
                                          ") must be below the prompt's ", num_tokens,
                                          " tokens: the last one is computed to sample")));
    return writer.get();
  }
  if (absl::Status claimed = in_flight_.Claim(*resolved_id); !claimed.ok()) {
    writer->End(ToGrpcStatus(claimed));
    return writer.get();
  }
  EngineClient* client = client_.load();
  auto t = std::make_shared<Transfer>();
  t->id = *resolved_id;
  t->writer = writer;
  t->exporter = std::make_shared<KvExporter>(t->id, cached, num_tokens, client->fingerprint(),
                                             client->slot_bytes(),
                                             client->model_config().num_hidden_layers);
  // The header goes out now: the caller knows this worker took the request.
  writer->Send(ToByteBuffer(WireMessage::Of(t->exporter->Header())));
  writer->OnFinished([this, t](const grpc::Status& s) {
    if (s.ok()) {
      metrics_->KvTransfer(t->bytes, t->bytes == 0 ? 0.0 : absl::ToDoubleSeconds(absl::Now() - t->first_sent));
    } else if (t->exporting.load() && !t->failure_counted.exchange(true)) {
      metrics_->KvTransferFailure("cancelled");  // the reader went away mid-transfer
    }
  });
  writer->OnCancelled([this, t] { Release(*t); });
  EngineClient::Submission s;
  s.id = t->id;
  s.prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  s.params = FromProto(request->sampling());
  s.params.max_tokens = 1;  // the prefill worker samples only the first token
  s.kind = RequestKind::kPrefillOnly;
  s.max_waiting = max_waiting_;
  client->Submit(std::move(s), [this, t, num_tokens, start](const RequestOutput& o) {
    if (t->released.load()) return;
    if (!o.finished) {  // a chunk of the prompt is computed: stream its KV now
      BeginExport(t);
      return SendMore(t);
    }
    if (!o.status.ok() || o.new_tokens.empty()) {
      Release(*t);
      return t->writer->End(
          ToGrpcStatus(o.status.ok() ? absl::InternalError("no first token") : o.status));
    }
    const double total = absl::ToDoubleSeconds(absl::Now() - start);
    const double queued = std::min(total, absl::ToDoubleSeconds(o.queue_time));
    metrics_->PrefillSeconds(total, queued);
    metrics_->PromptTokens(static_cast<int>(num_tokens));
    // Stream the KV straight from the cache as the reader takes it: at most
    // kStreamWindowBytes of copies per stream, under the export lease.
    t->first_token = o.new_tokens.back();
    t->prefilled = true;
    t->Progress();
    {
      MutexLock lock(&leases_mu_);
      leases_.push_back(t);
    }
    BeginExport(t);
    SendMore(t);
  });
  return writer.get();
}

}  // namespace tandem
