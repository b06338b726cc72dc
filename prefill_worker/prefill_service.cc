#include "prefill_worker/prefill_service.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/sampling_proto.h"
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

// One request's streams (PrefillRequest.num_streams; 1 for most): the engine
// request they share, its progress, and who is attached.
struct PrefillServiceImpl::Group {
  std::string id;
  int num_streams = 1;
  int64_t first = 0;       // num_cached_tokens
  int64_t num_tokens = 0;
  uint64_t lora_fingerprint = 0;  // the request's adapter's (0: the base model)
  // Any thread.
  std::atomic<bool> released{false};
  std::atomic<bool> failure_counted{false};
  std::atomic<int> finished{0};          // streams whose last message is queued
  std::atomic<int64_t> prefilled_ns{0};  // the prompt's compute ended (0: not yet)
  Mutex mu;
  // By stream index; empty until attached. Weak: a stream's own callbacks
  // keep it alive, and it keeps the group.
  std::vector<std::weak_ptr<Transfer>> members ABSL_GUARDED_BY(mu);
  std::vector<bool> opened ABSL_GUARDED_BY(mu);  // each index attaches once
  std::atomic<int> num_opened{0};
  // Engine thread.
  int32_t first_token = 0;
  std::optional<TokenLogprobs> first_logprobs;  // when the request asked
  bool prefilled = false;  // first_token is known: the prompt is computed

  std::vector<std::shared_ptr<Transfer>> Members() {
    std::vector<std::shared_ptr<Transfer>> out;
    MutexLock lock(&mu);
    for (const std::weak_ptr<Transfer>& w : members) {
      if (std::shared_ptr<Transfer> t = w.lock()) out.push_back(std::move(t));
    }
    return out;
  }
  bool AllAttached() const { return num_opened.load() == num_streams; }
};

// One Prefill call: its stream (any thread), its export (engine thread).
struct PrefillServiceImpl::Transfer {
  std::shared_ptr<Group> group;
  int index = 0;  // stream index in the group
  std::shared_ptr<StreamWriter<grpc::ByteBuffer>> writer;
  // Any thread.
  std::atomic<bool> exporting{false};        // the KV began to go out
  std::atomic<int64_t> last_progress_ns{0};  // the reader last took a chunk
  // Engine thread.
  std::shared_ptr<KvExporter> exporter;
  size_t bytes = 0;
  absl::Time first_sent;  // the first chunk was queued
  bool finished = false;  // the last message is queued, or the export failed

  void Progress() { last_progress_ns = absl::ToUnixNanos(absl::Now()); }
};

PrefillServiceImpl::PrefillServiceImpl(WorkerState* state, WorkerMetrics* metrics,
                                       int max_waiting, absl::Duration export_timeout,
                                       const Tokenizer* tokenizer)
    : state_(state),
      metrics_(metrics),
      max_waiting_(max_waiting),
      export_timeout_(export_timeout),
      tokenizer_(tokenizer),
      lease_watcher_([this] { WatchLeases(); }) {}

PrefillServiceImpl::~PrefillServiceImpl() {
  stop_.Notify();
  lease_watcher_.join();
}

// Called before the streams' End, never after: the id is free by the time
// the client sees the end, so it may reuse it at once.
void PrefillServiceImpl::Release(Group& g) {
  if (g.released.exchange(true)) return;
  client_.load()->Cancel(g.id);  // frees its blocks wherever it is
  in_flight_.Release(g.id);
  MutexLock lock(&groups_mu_);
  auto it = groups_.find(g.id);
  if (it != groups_.end() && it->second.get() == &g) groups_.erase(it);
}

void PrefillServiceImpl::Fail(Group& g, const grpc::Status& status, const char* reason) {
  if (reason != nullptr && !g.failure_counted.exchange(true)) metrics_->KvTransferFailure(reason);
  Release(g);
  for (const std::shared_ptr<Transfer>& t : g.Members()) t->writer->End(status);
}

void PrefillServiceImpl::WatchLeases() {
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
    const int64_t now = absl::ToUnixNanos(absl::Now());
    const int64_t limit = absl::ToInt64Nanoseconds(export_timeout_);
    std::vector<std::shared_ptr<Group>> expired;
    {
      MutexLock lock(&leases_mu_);
      for (auto it = leases_.begin(); it != leases_.end();) {
        std::shared_ptr<Transfer> t = it->lock();
        if (t == nullptr || t->group->released.load()) {
          it = leases_.erase(it);
        } else if (now - t->last_progress_ns.load() > limit) {
          expired.push_back(t->group);
          it = leases_.erase(it);
        } else {
          ++it;
        }
      }
    }
    {
      // A stream of the request that never attached holds it as long.
      MutexLock lock(&groups_mu_);
      for (const auto& [id, g] : groups_) {
        const int64_t prefilled = g->prefilled_ns.load();
        if (prefilled != 0 && now - prefilled > limit && !g->AllAttached()) expired.push_back(g);
      }
    }
    for (const std::shared_ptr<Group>& g : expired) {
      if (g->released.load()) continue;
      TANDEM_LOG(WARNING) << "request " << g->id << ": its reader took no KV for "
                          << absl::FormatDuration(export_timeout_) << "; freeing its blocks";
      Fail(*g,
           grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("KV export lease expired: the reader took nothing for ",
                                     absl::FormatDuration(export_timeout_))),
           "expired");
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
  if (t->group->released.load()) return;
  client_.load()->ExportKv(t->exporter,
                           [this, t](const EngineClient::NextChunk& next) { Fill(*t, next); });
}

void PrefillServiceImpl::Fill(Transfer& t, const EngineClient::NextChunk& next) {
  Group& g = *t.group;
  if (t.finished || g.released.load()) return;
  StreamWriter<grpc::ByteBuffer>& writer = *t.writer;
  if (writer.ended()) {  // cancelled or broken: the request's other streams end too
    return Fail(g, grpc::Status(grpc::StatusCode::CANCELLED,
                                absl::StrCat("stream ", t.index, " of request '", g.id,
                                             "' ended before its KV was out")),
                nullptr);
  }
  // While the prompt is computed the engine thread comes back after each
  // layer (or, where a step's rows are final only after it, between steps):
  // each visit may queue what one layer (one step) computed, so the stream
  // never waits with KV ready in the cache. After it, the window.
  EngineClient* client = client_.load();
  const size_t visit = static_cast<size_t>(client->max_num_batched_tokens()) * 2 *
                       client->slot_bytes() *
                       (client->kv_final_per_layer() ? 1 : client->model_config().num_hidden_layers);
  const size_t window = g.prefilled ? kStreamWindowBytes : std::max(kStreamWindowBytes, visit);
  while (!t.exporter->done() && writer.buffered_bytes() < window) {
    absl::StatusOr<std::optional<WireMessage>> msg = next();
    if (!msg.ok()) {
      t.finished = true;
      return Fail(g, ToGrpcStatus(msg.status()), "other");
    }
    if (!msg->has_value()) return;  // more after the engine's next step
    if (t.bytes == 0) t.first_sent = absl::Now();
    t.bytes += (*msg)->kv_bytes;
    writer.Send(ToByteBuffer(**std::move(msg)));
  }
  // More when the reader has taken these, or once the prompt is computed.
  if (!t.exporter->done() || !g.prefilled) return;
  t.finished = true;
  // Every chunk of every stream is copied out: the blocks may go.
  if (g.finished.fetch_add(1) + 1 == g.num_streams) Release(g);
  v1::PrefillResponse done;
  done.mutable_done()->set_first_token(g.first_token);
  if (g.first_logprobs) ToProto(*g.first_logprobs, done.mutable_done()->mutable_first_token_logprobs());
  writer.Send(ToByteBuffer(WireMessage::Of(done)));
  writer.End(grpc::Status::OK);
}

std::shared_ptr<PrefillServiceImpl::Transfer> PrefillServiceImpl::OpenTransfer(
    const std::shared_ptr<Group>& g, int index,
    std::shared_ptr<StreamWriter<grpc::ByteBuffer>> writer) {
  EngineClient* client = client_.load();
  auto t = std::make_shared<Transfer>();
  t->group = g;
  t->index = index;
  t->writer = std::move(writer);
  v1::ModelFingerprint fingerprint = client->fingerprint();
  fingerprint.set_lora_fingerprint(g->lora_fingerprint);
  t->exporter = std::make_shared<KvExporter>(
      g->id, g->first, g->num_tokens, fingerprint, client->slot_bytes(),
      client->model_config().num_hidden_layers, index, g->num_streams);
  // The header goes out now: the caller knows this worker took the stream.
  t->writer->Send(ToByteBuffer(WireMessage::Of(t->exporter->Header())));
  t->writer->OnFinished([this, t](const grpc::Status& s) {
    if (s.ok()) {
      metrics_->KvTransfer(t->bytes, t->bytes == 0 ? 0.0 : absl::ToDoubleSeconds(absl::Now() - t->first_sent));
    } else if (t->exporting.load() && !t->group->failure_counted.exchange(true)) {
      metrics_->KvTransferFailure("cancelled");  // the reader went away mid-transfer
    }
  });
  t->writer->OnCancelled([this, t] {
    Fail(*t->group,
         grpc::Status(grpc::StatusCode::CANCELLED,
                      absl::StrCat("stream ", t->index, " of request '", t->group->id,
                                   "' was cancelled")),
         nullptr);
  });
  return t;
}

void PrefillServiceImpl::Attach(const std::shared_ptr<StreamWriter<grpc::ByteBuffer>>& writer,
                                const v1::PrefillRequest& request) {
  const uint32_t index = request.stream_index(), n = request.num_streams();
  if (request.request_id().empty() || request.prompt_token_ids_size() != 0) {
    return writer->End(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("stream_index ", index, " attaches to an open request: it needs the "
                     "request_id of the first stream and no prompt_token_ids (has ",
                     request.prompt_token_ids_size(), ")")));
  }
  std::shared_ptr<Group> g;
  {
    MutexLock lock(&groups_mu_);
    auto it = groups_.find(request.request_id());
    if (it != groups_.end()) g = it->second;
  }
  if (g == nullptr || g->released.load()) {
    return writer->End(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("request '", request.request_id(), "' has no open first stream to attach "
                     "stream_index ", index, " to")));
  }
  if (n != static_cast<uint32_t>(g->num_streams) || index >= n) {
    return writer->End(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("stream_index ", index, " of num_streams ", n, ": request '", g->id,
                     "' was opened with num_streams ", g->num_streams)));
  }
  {
    MutexLock lock(&g->mu);
    if (g->opened[index]) {
      return writer->End(grpc::Status(
          grpc::StatusCode::ALREADY_EXISTS,
          absl::StrCat("stream_index ", index, " of request '", g->id, "' is already open")));
    }
    g->opened[index] = true;
    ++g->num_opened;
  }
  std::shared_ptr<Transfer> t = OpenTransfer(g, static_cast<int>(index), writer);
  {
    MutexLock lock(&g->mu);
    g->members[index] = t;
  }
  if (g->prefilled_ns.load() != 0) {  // the compute is over: its lease runs
    t->Progress();
    MutexLock lock(&leases_mu_);
    leases_.push_back(t);
  }
  BeginExport(t);
  SendMore(t);
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
  if (request->stream_index() > 0) {
    Attach(writer, *request);
    return writer.get();
  }
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
  EngineClient* client = client_.load();
  const int layers = client->model_config().num_hidden_layers;
  const int max_streams = std::min(kMaxStreams, layers);
  const uint32_t num_streams = std::max<uint32_t>(1, request->num_streams());
  if (num_streams > static_cast<uint32_t>(max_streams)) {
    writer->End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             absl::StrCat("num_streams (", request->num_streams(),
                                          ") must be at most ", max_streams, " (",
                                          kMaxStreams, ", and the model's ", layers,
                                          " layers)")));
    return writer.get();
  }
  absl::StatusOr<SamplingParams> params = FromProto(request->sampling(), tokenizer_);
  if (!params.ok()) {
    writer->End(ToGrpcStatus(params.status()));
    return writer.get();
  }
  params->lora_name = request->lora_name();
  params->priority = request->priority();
  params->cache_salt = request->cache_salt();
  absl::StatusOr<LoraRef> lora = client->lora().Find(params->lora_name);
  if (!lora.ok()) {
    writer->End(ToGrpcStatus(lora.status()));
    return writer.get();
  }
  params->lora_fingerprint = lora->fingerprint;
  if (absl::Status claimed = in_flight_.Claim(*resolved_id); !claimed.ok()) {
    writer->End(ToGrpcStatus(claimed));
    return writer.get();
  }
  auto g = std::make_shared<Group>();
  g->id = *resolved_id;
  g->num_streams = static_cast<int>(num_streams);
  g->first = cached;
  g->num_tokens = num_tokens;
  g->lora_fingerprint = lora->fingerprint;
  std::shared_ptr<Transfer> t = OpenTransfer(g, 0, writer);
  {
    MutexLock lock(&g->mu);
    g->members.resize(num_streams);
    g->opened.assign(num_streams, false);
    g->members[0] = t;
    g->opened[0] = true;
    g->num_opened = 1;
  }
  if (num_streams > 1) {
    MutexLock lock(&groups_mu_);
    groups_[g->id] = g;
  }
  EngineClient::Submission s;
  s.id = g->id;
  s.prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  s.params = *std::move(params);
  s.params.max_tokens = 1;  // the prefill worker samples only the first token
  s.kind = RequestKind::kPrefillOnly;
  s.max_waiting = max_waiting_;
  client->Submit(std::move(s), [this, g, num_tokens, start](const RequestOutput& o) {
    if (g->released.load()) return;
    if (!o.finished) {  // a chunk of the prompt is computed: stream its KV now
      for (const std::shared_ptr<Transfer>& m : g->Members()) {
        BeginExport(m);
        SendMore(m);
      }
      return;
    }
    if (!o.status.ok() || o.new_tokens.empty()) {
      return Fail(*g, ToGrpcStatus(o.status.ok() ? absl::InternalError("no first token") : o.status),
                  nullptr);
    }
    const double total = absl::ToDoubleSeconds(absl::Now() - start);
    const double queued = std::min(total, absl::ToDoubleSeconds(o.queue_time));
    metrics_->PrefillSeconds(total, queued);
    metrics_->PromptTokens(static_cast<int>(num_tokens));
    // Stream the KV straight from the cache as the readers take it: at most
    // kStreamWindowBytes of copies per stream, under the export lease.
    g->first_token = o.new_tokens.back();
    if (!o.logprobs.empty()) g->first_logprobs = o.logprobs.back();
    g->prefilled = true;
    g->prefilled_ns = absl::ToUnixNanos(absl::Now());
    for (const std::shared_ptr<Transfer>& m : g->Members()) {
      m->Progress();
      {
        MutexLock lock(&leases_mu_);
        leases_.push_back(m);
      }
      BeginExport(m);
      SendMore(m);
    }
  });
  // Its KV leaves layer by layer as the steps compute it (the engine's layer
  // hook), the first layers' while the later ones run.
  BeginExport(t);
  SendMore(t);
  return writer.get();
}

grpc::ServerUnaryReactor* PrefillServiceImpl::LoadLoraAdapter(
    grpc::CallbackServerContext* context, const v1::LoadLoraAdapterRequest* request,
    v1::LoadLoraAdapterResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  LoadLoraAdapterHere(client_.load(), *request,
                      [reactor, response](const grpc::Status& s, uint64_t fingerprint) {
                        response->set_fingerprint(fingerprint);
                        reactor->Finish(s);
                      });
  return reactor;
}

grpc::ServerUnaryReactor* PrefillServiceImpl::UnloadLoraAdapter(
    grpc::CallbackServerContext* context, const v1::UnloadLoraAdapterRequest* request,
    v1::UnloadLoraAdapterResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  UnloadLoraAdapterHere(client_.load(), *request,
                        [reactor](const grpc::Status& s) { reactor->Finish(s); });
  return reactor;
}

}  // namespace tandem
