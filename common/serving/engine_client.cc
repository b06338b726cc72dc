#include "common/serving/engine_client.h"

#include "absl/strings/str_cat.h"
#include "common/serving/status_convert.h"

namespace tandem {

EngineClient::EngineClient(EngineLoop* loop)
    : loop_(loop),
      fingerprint_(MakeFingerprint(loop->model_config(), loop->kv_cache().dtype())),
      slot_bytes_(loop->kv_cache().slot_bytes()),
      token_bytes_(loop->kv_cache().token_bytes()),
      block_size_(loop->kv_cache().block_size()) {}

void EngineClient::FailOnLoop(LlmEngine& engine, const std::string& id,
                              const absl::Status& status) {
  (void)engine.Abort(id);
  RequestOutput o;
  o.id = id;
  o.finished = true;
  o.finish_reason = FinishReason::kError;
  o.status = status;
  loop_->Deliver(o);
}

void EngineClient::Submit(Submission s, OutputCallback cb) {
  loop_->Post([this, s = std::move(s), cb = std::move(cb)](LlmEngine& engine) mutable {
    absl::Status added;
    const bool full = s.max_waiting > 0 && static_cast<int>(engine.num_waiting()) >= s.max_waiting;
    const Request* displaced = full ? engine.DisplacedBy(s.params.priority) : nullptr;
    if (full && displaced == nullptr) {
      added = absl::ResourceExhaustedError(absl::StrCat(
          engine.num_waiting(), " requests already waiting (limit ", s.max_waiting, ")"));
    } else {
      if (displaced != nullptr) {
        const int32_t priority = displaced->params.priority;
        FailOnLoop(engine, std::string(displaced->id),
                   absl::ResourceExhaustedError(absl::StrCat(
                       "displaced from a full queue (", engine.num_waiting(),
                       " requests waiting, limit ", s.max_waiting, ") by a request of priority ",
                       s.params.priority, ", ahead of its ", priority)));
      }
      added = engine.AddRequest(s.id, std::move(s.prompt), s.params, s.kind);
    }
    if (!added.ok()) {
      RequestOutput o;
      o.id = s.id;
      o.finished = true;
      o.finish_reason = FinishReason::kError;
      o.status = added;
      cb(o);
      return;
    }
    loop_->SetCallback(s.id, std::move(cb));
  });
}

void EngineClient::ImportKv(const std::string& id, ReceivedChunk chunk) {
  loop_->Post([this, id, chunk = std::move(chunk)](LlmEngine& engine) {
    absl::Status s = engine.ImportKv(id, static_cast<int>(chunk.layer), chunk.first_token,
                                     chunk.num_tokens, chunk.k, chunk.v);
    if (!s.ok()) FailOnLoop(engine, id, s);
  });
}

void EngineClient::RemoteKvArrived(const std::string& id, int32_t token,
                                   TokenLogprobs logprobs) {
  loop_->Post([this, id, token, logprobs = std::move(logprobs)](LlmEngine& engine) mutable {
    absl::Status s = engine.RemoteKvArrived(id, token, std::move(logprobs));
    if (!s.ok()) FailOnLoop(engine, id, s);
  });
}

void EngineClient::ComputeLocally(const std::string& id) {
  loop_->Post([this, id](LlmEngine& engine) {
    absl::Status s = engine.ComputeLocally(id);
    if (!s.ok()) FailOnLoop(engine, id, s);
  });
}

void EngineClient::Cancel(const std::string& id) {
  loop_->Post([this, id](LlmEngine& engine) {
    (void)engine.Abort(id);  // NOT_FOUND: already finished and gone
    loop_->RemoveCallback(id);
  });
}

void EngineClient::LoadLora(const LoraModuleSpec& spec, uint64_t expect_fingerprint,
                            LoadDone done) {
  absl::StatusOr<std::unique_ptr<LoraImage>> image = loop_->lora().Prepare(spec);
  if (!image.ok()) return done(image.status());
  if (expect_fingerprint != 0 && (*image)->fingerprint() != expect_fingerprint) {
    return done(absl::FailedPreconditionError(absl::StrCat(
        "LoRA adapter '", spec.name, "' (", spec.path,
        ") holds other weights here than on the worker that asked (fingerprints ",
        absl::Hex((*image)->fingerprint()), " and ", absl::Hex(expect_fingerprint), ")")));
  }
  loop_->Post([image = std::shared_ptr<LoraImage>(std::move(image).value()), expect_fingerprint,
               done = std::move(done)](LlmEngine& engine) {
    if (expect_fingerprint != 0) {
      absl::StatusOr<LoraRef> loaded = engine.lora().Find(image->name());
      if (loaded.ok() && loaded->fingerprint == expect_fingerprint) return done(expect_fingerprint);
      if (loaded.ok()) {
        return done(absl::AlreadyExistsError(absl::StrCat(
            "the LoRA adapter '", image->name(), "' is loaded here with other weights (fingerprint ",
            absl::Hex(loaded->fingerprint), ", not ", absl::Hex(expect_fingerprint), ")")));
      }
    }
    absl::StatusOr<int> slot = engine.LoadLora(*image);
    if (!slot.ok()) return done(slot.status());
    done(image->fingerprint());
  });
}

void EngineClient::UnloadLora(const std::string& name, std::function<void(absl::Status)> done) {
  loop_->Post([name, done = std::move(done)](LlmEngine& engine) { done(engine.UnloadLora(name)); });
}

void EngineClient::ExportKv(std::shared_ptr<KvExporter> exporter, Fill fill) {
  // Whichever comes first: the next layer of a step running now, or the
  // loop's next turn (Post wakes an idle loop). The later one finds the
  // reader's window full or no new rows, and waits for the next layer.
  KvExporter* key = exporter.get();
  EngineLoop::LayerTask task = [this, exporter = std::move(exporter),
                                fill = std::move(fill)](const LlmEngine& engine) {
    FillOnLoop(engine, exporter, fill);
  };
  loop_->AtNextLayer(key, task);
  loop_->Post([task = std::move(task)](LlmEngine& engine) { task(engine); });
}

void EngineClient::FillOnLoop(const LlmEngine& engine,
                              const std::shared_ptr<KvExporter>& exporter, const Fill& fill) {
  fill([&]() {
    absl::StatusOr<std::optional<WireMessage>> msg = exporter->Next(engine);
    if (msg.ok() && !msg->has_value()) {  // its rows are being computed or copied
      loop_->AtNextLayer(
          exporter.get(),
          [this, exporter, fill](const LlmEngine& e) { FillOnLoop(e, exporter, fill); },
          /*poll=*/exporter->reads_in_flight());
    }
    return msg;
  });
}

void LoadLoraAdapterHere(EngineClient* client, const v1::LoadLoraAdapterRequest& request,
                         std::function<void(const grpc::Status&, uint64_t fingerprint)> done) {
  if (request.lora_name().empty() || request.lora_path().empty()) {
    return done(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             "both lora_name and lora_path must be given"),
                0);
  }
  if (client == nullptr) {
    return done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading"), 0);
  }
  client->LoadLora({request.lora_name(), request.lora_path()}, request.expect_fingerprint(),
                   [done = std::move(done)](absl::StatusOr<uint64_t> fingerprint) {
                     if (!fingerprint.ok()) return done(ToGrpcStatus(fingerprint.status()), 0);
                     done(grpc::Status::OK, *fingerprint);
                   });
}

void UnloadLoraAdapterHere(EngineClient* client, const v1::UnloadLoraAdapterRequest& request,
                           std::function<void(const grpc::Status&)> done) {
  if (request.lora_name().empty()) {
    return done(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "lora_name must be given"));
  }
  if (client == nullptr) {
    return done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading"));
  }
  client->UnloadLora(request.lora_name(),
                     [done = std::move(done)](const absl::Status& s) { done(ToGrpcStatus(s)); });
}

}  // namespace tandem
