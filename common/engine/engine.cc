#include "common/engine/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace tandem {

LlmEngine::~LlmEngine() = default;

absl::StatusOr<std::unique_ptr<LlmEngine>> LlmEngine::Create(const EngineConfig& config) {
  std::unique_ptr<LlmEngine> e(new LlmEngine());
  e->config_ = config;
  ASSIGN_OR_RETURN(e->backend_, CreateBackend(config.backend));
  Ops* ops = e->backend_->ops.get();
  ASSIGN_OR_RETURN(e->model_, LlamaModel::Load(config.model, ops));
  const LlamaConfig& mc = e->model_->config();
  if (config.block_size < 1 || config.block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size must be in [1, 1024], got ", config.block_size));
  }
  int max_model_len = config.runner.max_model_len > 0
                          ? config.runner.max_model_len
                          : static_cast<int>(std::min<int64_t>(mc.max_position_embeddings, 8192));
  int num_blocks = config.num_kv_blocks;
  if (num_blocks <= 0) {
    const int64_t per_seq = (max_model_len + config.block_size - 1) / config.block_size;
    const int64_t need = per_seq * config.runner.max_num_seqs;
    const int64_t fit = config.kv_cache_bytes /
                        static_cast<int64_t>(e->model_->KvBytesPerBlock(config.block_size));
    num_blocks = static_cast<int>(std::max<int64_t>(1, std::min(need, fit)));
  }
  ASSIGN_OR_RETURN(e->kv_cache_, KvCache::Create(e->backend_->device.get(), ops->dtype(),
                                                 mc.num_hidden_layers, num_blocks,
                                                 config.block_size, mc.num_key_value_heads,
                                                 mc.head_dim));
  TANDEM_LOG(INFO) << "KV cache: " << num_blocks << " blocks of " << config.block_size
                   << " tokens ("
                   << (e->model_->KvBytesPerBlock(config.block_size) * num_blocks) / (1 << 20)
                   << " MiB)";
  ASSIGN_OR_RETURN(e->runner_, ModelRunner::Create(config.runner, e->model_.get(),
                                                   e->kv_cache_.get(), ops));
  TANDEM_LOG(INFO) << "cudagraph mode " << e->runner_->resolved_mode() << " (requested "
                   << config.runner.graph.requested_mode << "), "
                   << e->runner_->dispatcher().capture_sizes().size() << " capture sizes up to "
                   << e->runner_->dispatcher().max_capture_size();
  RETURN_IF_ERROR(e->runner_->CaptureGraphs());
  e->scheduler_ = std::make_unique<Scheduler>(config.runner.max_num_batched_tokens,
                                              config.runner.max_num_seqs, e->kv_cache_.get());
  e->batch_.reserve(config.runner.max_num_seqs);
  return e;
}

absl::Status LlmEngine::Validate(const std::vector<int32_t>& prompt,
                                 const SamplingParams& params) const {
  const int limit = max_model_len();
  if (prompt.empty()) {
    return absl::InvalidArgumentError("prompt_token_ids is empty: give at least 1 token");
  }
  if (static_cast<int64_t>(prompt.size()) >= limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt_token_ids has ", prompt.size(), " tokens; the limit is ", limit - 1,
        " (max_model_len ", limit, " minus 1 generated token)"));
  }
  const int64_t vocab = model_->config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt_token_ids[", i, "] = ", prompt[i],
                                                     " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return ValidateSamplingParams(params, static_cast<uint32_t>(limit));
}

absl::StatusOr<Request*> LlmEngine::NewRequest(const std::string& id, std::vector<int32_t> prompt,
                                               const SamplingParams& params, RequestKind kind) {
  if (id.empty()) return absl::InvalidArgumentError("request_id is empty");
  if (requests_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("request_id '", id, "' is already in flight"));
  }
  RETURN_IF_ERROR(Validate(prompt, params));
  auto r = std::make_unique<Request>();
  r->id = id;
  r->kind = kind;
  r->prompt_len = static_cast<int64_t>(prompt.size());
  r->tokens = std::move(prompt);
  r->params = params;
  r->arrival = next_arrival_++;
  r->rng.seed(params.seed != 0 ? params.seed : std::random_device{}());
  Request* raw = r.get();
  requests_.emplace(id, std::move(r));
  return raw;
}

absl::Status LlmEngine::AddRequest(const std::string& id, std::vector<int32_t> prompt,
                                   const SamplingParams& params, RequestKind kind) {
  ASSIGN_OR_RETURN(Request * r, NewRequest(id, std::move(prompt), params, kind));
  scheduler_->AddWaiting(r);
  return absl::OkStatus();
}

absl::Status LlmEngine::Abort(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    // A finished prefill-only request may still hold KV blocks.
    if (kv_cache_->BlockTable(id) != nullptr) {
      kv_cache_->Free(id);
      return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat("request_id '", id, "' is not in flight"));
  }
  scheduler_->Remove(it->second.get(), /*keep_kv=*/false);
  requests_.erase(it);
  return absl::OkStatus();
}

void LlmEngine::Finish(Request* r, FinishReason reason, std::vector<RequestOutput>* out) {
  r->finish = reason;
  RequestOutput o;
  o.id = r->id;
  o.finished = true;
  o.finish_reason = reason;
  o.status = r->error;
  o.prompt_tokens = static_cast<int>(r->prompt_len);
  o.completion_tokens = static_cast<int>(r->num_output_tokens());
  // Prefill-only requests keep their KV for export; the caller frees it.
  scheduler_->Remove(r, /*keep_kv=*/r->kind == RequestKind::kPrefillOnly &&
                            reason != FinishReason::kError);
  // Merge with an output already produced for this request this step.
  auto it = std::find_if(out->begin(), out->end(), [&](const RequestOutput& x) { return x.id == r->id; });
  if (it != out->end()) {
    o.new_tokens = std::move(it->new_tokens);
    *it = std::move(o);
  } else {
    out->push_back(std::move(o));
  }
  requests_.erase(r->id);
}

absl::StatusOr<std::vector<RequestOutput>> LlmEngine::Step() {
  std::vector<RequestOutput> out;
  std::vector<Request*> failed, returned;
  std::vector<ScheduledChunk> chunks = scheduler_->Schedule(&failed, &returned);
  for (Request* r : failed) Finish(r, FinishReason::kError, &out);
  for (Request* r : returned) {
    RequestOutput o;
    o.id = r->id;
    o.preempted = true;
    o.prompt_tokens = static_cast<int>(r->prompt_len);
    o.completion_tokens = static_cast<int>(r->num_output_tokens());
    out.push_back(std::move(o));
    requests_.erase(r->id);
  }
  if (chunks.empty()) return out;

  batch_.clear();
  for (const ScheduledChunk& c : chunks) {
    ScheduledSeq s;
    Request* r = c.request;
    s.tokens = r->tokens.data() + c.start;
    s.num_tokens = c.num_tokens;
    s.start_pos = c.start;
    s.block_table = kv_cache_->BlockTable(r->id);
    s.sample = c.sample;
    batch_.push_back(s);
  }
  ASSIGN_OR_RETURN(StepResult step, runner_->Execute(batch_));
  // A bounded window of recent steps for the step table: nobody may drain it
  // (the table is off by default), so it must not grow with uptime.
  if (records_.size() >= kMaxStepRecords) {
    records_.erase(records_.begin(), records_.begin() + kMaxStepRecords / 2);
  }
  records_.push_back({step.runtime_mode, step.num_tokens, step.padded_tokens});

  const int vocab = static_cast<int>(model_->config().vocab_size);
  const std::vector<int32_t>& eos = model_->config().eos_token_ids;
  int row = 0;
  std::vector<Request*> done;
  for (const ScheduledChunk& c : chunks) {
    Request* r = c.request;
    r->num_computed = c.start + c.num_tokens;
    if (!c.sample) continue;
    const int32_t token = sampler_.Sample(step.logits + int64_t{row} * vocab, vocab, r->params, &r->rng);
    ++row;
    r->tokens.push_back(token);
    RequestOutput o;
    o.id = r->id;
    o.new_tokens = {token};
    o.prompt_tokens = static_cast<int>(r->prompt_len);
    o.completion_tokens = static_cast<int>(r->num_output_tokens());
    out.push_back(std::move(o));
    const auto& stops = r->params.stop_token_ids;
    const bool stop = std::find(stops.begin(), stops.end(), token) != stops.end() ||
                      (!r->params.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end());
    if (r->kind == RequestKind::kPrefillOnly) {
      r->finish = FinishReason::kLength;
    } else if (stop) {
      r->finish = FinishReason::kStop;
    } else if (r->num_output_tokens() >= r->params.max_tokens || r->num_tokens() >= max_model_len()) {
      r->finish = FinishReason::kLength;
    }
    if (r->finished()) done.push_back(r);
  }
  for (Request* r : done) Finish(r, r->finish, &out);
  return out;
}

absl::Status LlmEngine::ReserveKv(const std::string& id, int64_t num_tokens) {
  if (requests_.contains(id) || kv_cache_->BlockTable(id) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("request_id '", id, "' already holds KV blocks"));
  }
  return kv_cache_->EnsureCapacity(id, num_tokens);
}

absl::Status LlmEngine::CopyKvRows(const std::string& id, int layer, int64_t first,
                                   int64_t count, bool to_cache, char* k, char* v) const {
  const std::vector<int32_t>* table = kv_cache_->BlockTable(id);
  if (table == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("request '", id, "' holds no KV blocks"));
  }
  const int64_t capacity = static_cast<int64_t>(table->size()) * kv_cache_->block_size();
  if (layer < 0 || layer >= kv_cache_->num_layers() || first < 0 || count < 0 ||
      first + count > capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV rows [", first, ", ", first + count, ") of layer ", layer, " are outside request '",
        id, "' (", capacity, " token slots, ", kv_cache_->num_layers(), " layers)"));
  }
  const size_t row = kv_cache_->slot_bytes();
  const KvLayer& l = kv_cache_->layer(layer);
  Device* device = backend_->device.get();
  // One copy per run of consecutive slots (at most one block).
  for (int64_t i = 0; i < count;) {
    const int64_t slot = kv_cache_->SlotOf(*table, first + i);
    int64_t run = 1;
    while (i + run < count && kv_cache_->SlotOf(*table, first + i + run) == slot + run) ++run;
    char* ck = static_cast<char*>(l.k.data) + slot * row;
    char* cv = static_cast<char*>(l.v.data) + slot * row;
    const size_t bytes = run * row;
    if (to_cache) {
      RETURN_IF_ERROR(device->CopyToDevice(ck, k + i * row, bytes));
      RETURN_IF_ERROR(device->CopyToDevice(cv, v + i * row, bytes));
    } else {
      RETURN_IF_ERROR(device->CopyToHost(k + i * row, ck, bytes));
      RETURN_IF_ERROR(device->CopyToHost(v + i * row, cv, bytes));
    }
    i += run;
  }
  return absl::OkStatus();
}

absl::Status LlmEngine::WriteKv(const std::string& id, int layer, int64_t first, int64_t count,
                                const void* k, const void* v) {
  // With to_cache the host buffers are only read.
  return CopyKvRows(id, layer, first, count, /*to_cache=*/true,
                    static_cast<char*>(const_cast<void*>(k)),
                    static_cast<char*>(const_cast<void*>(v)));
}

absl::Status LlmEngine::ReadKv(const std::string& id, int layer, int64_t first, int64_t count,
                               void* k, void* v) const {
  return CopyKvRows(id, layer, first, count, /*to_cache=*/false, static_cast<char*>(k),
                    static_cast<char*>(v));
}

absl::Status LlmEngine::AddPrefilledRequest(const std::string& id, std::vector<int32_t> prompt,
                                            int32_t first_token, const SamplingParams& params,
                                            bool return_on_preemption) {
  if (first_token < 0 || first_token >= model_->config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("first token ", first_token,
                                                   " is outside the vocabulary"));
  }
  const std::vector<int32_t>* table = kv_cache_->BlockTable(id);
  if (table == nullptr || static_cast<int64_t>(table->size()) * kv_cache_->block_size() <
                              static_cast<int64_t>(prompt.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request '", id, "' has no KV blocks for its ", prompt.size(), " prompt tokens"));
  }
  ASSIGN_OR_RETURN(Request * r, NewRequest(id, std::move(prompt), params, RequestKind::kGenerate));
  // The first token was sampled elsewhere with the same seed: consume its draw
  // so seeded sampling continues as it would have in one process.
  if (params.temperature > 0.f) r->rng();
  r->tokens.push_back(first_token);
  r->num_computed = r->prompt_len;
  r->return_on_preemption = return_on_preemption;
  scheduler_->AddWaiting(r);
  return absl::OkStatus();
}

std::vector<StepRecord> LlmEngine::TakeStepRecords() {
  std::vector<StepRecord> r;
  r.swap(records_);
  return r;
}

}  // namespace tandem
