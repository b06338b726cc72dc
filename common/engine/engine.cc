#include "common/engine/engine.h"

#include <algorithm>
#include <limits>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/base/crc32c.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace tandem {

LlmEngine::~LlmEngine() = default;

absl::StatusOr<std::unique_ptr<LlmEngine>> LlmEngine::Create(const EngineConfig& config) {
  std::unique_ptr<LlmEngine> e(new LlmEngine());
  e->config_ = config;
  ASSIGN_OR_RETURN(e->backend_, CreateBackend(config.backend));
  Ops* ops = e->backend_->ops.get();
  ASSIGN_OR_RETURN(e->model_, LlamaModel::Load(config.model, ops, config.rope_scaling));
  const LlamaConfig& mc = e->model_->config();
  if (config.block_size < 1 || config.block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be in [1, 1024], got ", config.block_size));
  }
  const int max_model_len = config.runner.max_model_len > 0 ? config.runner.max_model_len
                                                            : mc.DefaultMaxModelLen();
  int num_blocks = config.num_kv_blocks;
  if (num_blocks <= 0) {
    const int64_t per_seq = (max_model_len + config.block_size - 1) / config.block_size;
    const int64_t need = per_seq * config.runner.max_num_seqs;
    const int64_t fit = config.kv_cache_bytes /
                        static_cast<int64_t>(e->model_->KvBytesPerBlock(config.block_size));
    num_blocks = static_cast<int>(std::max<int64_t>(1, std::min(need, fit)));
  }
  ASSIGN_OR_RETURN(e->kv_cache_, KvCache::Create(e->backend_->device.get(), ops->kv_dtype(),
                                                 mc.num_hidden_layers, num_blocks,
                                                 config.block_size, mc.num_key_value_heads,
                                                 mc.head_dim, config.enable_prefix_caching));
  TANDEM_LOG(INFO) << "KV cache: " << num_blocks << " blocks of " << config.block_size
                   << " tokens ("
                   << (e->model_->KvBytesPerBlock(config.block_size) * num_blocks) / (1 << 20)
                   << " MiB), prefix caching "
                   << (config.enable_prefix_caching ? "on" : "off");
  RunnerConfig runner = config.runner;
  if (config.speculative.enabled()) {
    const int q = config.speculative.query_len();
    if (runner.graph.uniform_decode_query_len != 1 && runner.graph.uniform_decode_query_len != q) {
      return absl::InvalidArgumentError(absl::StrCat(
          "uniform_decode_query_len ", runner.graph.uniform_decode_query_len,
          " disagrees with speculative decoding's 1 + num_speculative_tokens = ", q));
    }
    runner.graph.uniform_decode_query_len = q;
    e->spec_stats_.accepted_per_pos.assign(config.speculative.num_speculative_tokens, 0);
    TANDEM_LOG(INFO) << "speculative decoding: ngram, " << config.speculative.num_speculative_tokens
                     << " tokens, lookup " << config.speculative.prompt_lookup_min << ".."
                     << config.speculative.prompt_lookup_max << " (uniform decode query len "
                     << q << ")";
  }
  ASSIGN_OR_RETURN(e->lora_, LoraSet::Load(mc, e->backend_->device.get(), config.lora_modules,
                                           config.max_lora_rank, config.runtime_lora_slots));
  runner.graph.lora_enabled = e->lora_->capacity() > 0;
  ASSIGN_OR_RETURN(e->runner_, ModelRunner::Create(runner, e->model_.get(),
                                                   e->kv_cache_.get(), ops, e->lora_.get()));
  TANDEM_LOG(INFO) << "cudagraph mode " << e->runner_->resolved_mode() << " (requested "
                   << config.runner.graph.requested_mode << "), "
                   << e->runner_->dispatcher().capture_sizes().size() << " capture sizes up to "
                   << e->runner_->dispatcher().max_capture_size();
  RETURN_IF_ERROR(e->runner_->CaptureGraphs());
  LlmEngine* raw = e.get();
  e->runner_->SetLayerObserver([raw](int layer) {
    raw->step_layers_done_ = layer + 1;
    return raw->layer_hook_ != nullptr && raw->layer_hook_(layer);
  });
  e->scheduler_ = std::make_unique<Scheduler>(config.runner.max_num_batched_tokens,
                                              config.runner.max_num_seqs, e->kv_cache_.get(),
                                              config.waiting_timeout,
                                              static_cast<int>(e->runner_->max_logit_rows()),
                                              config.scheduling_policy);
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
  const int64_t max_logprobs = config_.max_logprobs < 0 ? vocab : config_.max_logprobs;
  RETURN_IF_ERROR(
      ValidateSamplingParams(params, static_cast<uint32_t>(limit), static_cast<int32_t>(max_logprobs)));
  if (params.priority != 0 && config_.scheduling_policy != SchedulingPolicy::kPriority) {
    return absl::InvalidArgumentError(absl::StrCat(
        "priority is ", params.priority,
        ", but priority scheduling is not enabled (--scheduling-policy=fcfs; give "
        "--scheduling-policy=priority to every worker of the pair, or priority 0)"));
  }
  ASSIGN_OR_RETURN(const LoraRef lora, lora_->Find(params.lora_name));
  if (params.lora_fingerprint != 0 && params.lora_fingerprint != lora.fingerprint) {
    return absl::AbortedError(absl::StrCat("the LoRA adapter '", params.lora_name,
                                           "' was replaced by another while the request was "
                                           "on its way to the engine"));
  }
  if (params.prior_output_tokens >= prompt.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.prior_output_tokens (", params.prior_output_tokens,
        ") must be less than the prompt's ", prompt.size(), " tokens"));
  }
  if (params.grammar != nullptr && config_.vocabulary == nullptr) {
    return absl::InvalidArgumentError(
        "structured outputs need the model's tokenizer (its tokens' bytes), and this worker has none");
  }
  for (const auto& [id, bias] : params.logit_bias) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.logit_bias names token ", id, ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  for (size_t i = 0; i < params.allowed_token_ids.size(); ++i) {
    const int32_t id = params.allowed_token_ids[i];
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.allowed_token_ids[", i, "] = ", id,
                                                     " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  // A request that cannot fit even in an empty cache would wait in vain (or
  // preempt itself forever).
  const int64_t need_tokens =
      std::min<int64_t>(static_cast<int64_t>(prompt.size()) + params.max_tokens, limit);
  const int64_t need_blocks = (need_tokens + kv_cache_->block_size() - 1) / kv_cache_->block_size();
  if (need_blocks > kv_cache_->pool().num_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt_token_ids (", prompt.size(), ") + max_tokens (", params.max_tokens, ") need ",
        need_blocks, " KV blocks of ", kv_cache_->block_size(), " tokens; the whole cache has ",
        kv_cache_->pool().num_blocks()));
  }
  return absl::OkStatus();
}

absl::Status LlmEngine::AddRequest(const std::string& id, std::vector<int32_t> prompt,
                                   const SamplingParams& params, RequestKind kind) {
  if (id.empty()) return absl::InvalidArgumentError("request_id is empty");
  if (requests_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("request_id '", id, "' is already in flight"));
  }
  RETURN_IF_ERROR(Validate(prompt, params));
  if (params.prompt_logprobs >= 0 && kind != RequestKind::kGenerate) {
    // A prompt computed elsewhere (or for elsewhere) has its logits there.
    return absl::InvalidArgumentError(
        "sampling.prompt_logprobs needs the prompt computed where it is served (a local prefill)");
  }
  auto r = std::make_unique<Request>();
  r->id = id;
  r->kind = kind;
  r->prompt_len = static_cast<int64_t>(prompt.size());
  r->tokens = std::move(prompt);
  r->params = params;
  const LoraRef lora = *lora_->Find(params.lora_name);  // Validate() found it
  r->lora_slot = lora.slot;
  // A salted request's first block has a parent no unsalted or otherwise
  // salted request's has (the hash is this process's, as the blocks' are).
  r->cache_root = params.cache_salt.empty() ? lora.fingerprint
                                            : absl::HashOf(lora.fingerprint, params.cache_salt);
  r->arrival = next_arrival_++;
  r->queued_at = absl::Now();
  r->rng.seed(params.seed.has_value() ? *params.seed : std::random_device{}());
  if (params.grammar != nullptr) {
    r->matcher = std::make_unique<GrammarMatcher>(params.grammar);
    // A re-prefilled request's output so far is in its prompt.
    for (int64_t i = r->prompt_len - params.prior_output_tokens; i < r->prompt_len; ++i) {
      if (!r->matcher->Accept(TokenBytes(r->tokens[i]))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the request's earlier output (sampling.prior_output_tokens) does not match its "
            "structured output at token ", i - (r->prompt_len - params.prior_output_tokens)));
      }
    }
  }
  scheduler_->AddWaiting(r.get());
  requests_.emplace(id, std::move(r));
  return absl::OkStatus();
}

void LlmEngine::LorasInUse(std::vector<std::string>* running,
                           std::vector<std::string>* waiting) const {
  std::vector<bool> run(lora_->capacity() + 1), wait(lora_->capacity() + 1);
  for (const auto& [id, r] : requests_) {
    if (r->state == RequestState::kRunning) {
      run[r->lora_slot] = true;
    } else if (!IsFinished(r->state)) {
      wait[r->lora_slot] = true;
    }
  }
  running->clear();
  waiting->clear();
  for (int s = 1; s <= lora_->capacity(); ++s) {
    if (run[s]) running->push_back(lora_->SlotName(s));
    if (wait[s]) waiting->push_back(lora_->SlotName(s));
  }
}

absl::StatusOr<int> LlmEngine::LoadLora(const LoraImage& image) {
  return lora_->Add(image, [this](int slot) {
    for (const auto& [id, r] : requests_) {
      if (r->lora_slot == slot) return true;
    }
    return false;
  });
}

absl::Status LlmEngine::UnloadLora(absl::string_view name) { return lora_->Remove(name); }

Request* LlmEngine::Find(const std::string& id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

absl::Status LlmEngine::Abort(const std::string& id) {
  Request* r = Find(id);
  if (r == nullptr) {
    return absl::NotFoundError(absl::StrCat("request_id '", id, "' is not in flight"));
  }
  scheduler_->Remove(r);
  pending_outputs_.erase(std::remove_if(pending_outputs_.begin(), pending_outputs_.end(),
                                        [&](const RequestOutput& o) { return o.id == id; }),
                         pending_outputs_.end());
  requests_.erase(id);
  return absl::OkStatus();
}

std::array<int, kNumRequestStates> LlmEngine::CountStates() const {
  std::array<int, kNumRequestStates> n{};
  for (const auto& [id, r] : requests_) ++n[static_cast<int>(r->state)];
  return n;
}

RequestOutput& LlmEngine::OutputFor(const Request* r, std::vector<RequestOutput>* out,
                                    size_t search_end) {
  // One output per request per step: a remotely prefilled request's first
  // token (queued by RemoteKvArrived) and the token sampled in the same step
  // travel together, and a finished output is the request's last word.
  for (size_t i = 0; i < search_end; ++i) {
    if ((*out)[i].id == r->id) return (*out)[i];
  }
  RequestOutput& o = out->emplace_back();
  o.id = r->id;
  return o;
}

void LlmEngine::Finish(Request* r, FinishReason reason, std::vector<RequestOutput>* out) {
  r->finish = reason;
  switch (reason) {
    case FinishReason::kStop: r->state = RequestState::kFinishedStopped; break;
    case FinishReason::kLength: r->state = RequestState::kFinishedLengthCapped; break;
    case FinishReason::kAborted: r->state = RequestState::kFinishedAborted; break;
    default: r->state = RequestState::kFinishedError; break;
  }
  RequestOutput& o = OutputFor(r, out, out->size());  // rare: one search per request
  o.finished = true;
  o.finish_reason = reason;
  o.stop_token = reason == FinishReason::kStop && r->stop_token;
  o.status = r->error;
  o.prompt_tokens = static_cast<int>(r->prompt_len);
  o.completion_tokens = static_cast<int>(r->num_output_tokens());
  // A prefill-only request keeps its KV (and its place in requests_) for
  // export until Abort().
  const bool keep = r->kind == RequestKind::kPrefillOnly && reason != FinishReason::kError;
  scheduler_->Remove(r, /*free_blocks=*/!keep);
  if (!keep) requests_.erase(r->id);
}

void LlmEngine::AppendToken(Request* r, int32_t token, RequestOutput& o,
                            TokenLogprobs* logprobs) {
  const bool first = r->num_output_tokens() == 0;
  r->tokens.push_back(token);
  o.new_tokens.push_back(token);
  // The mask allowed it; EOS (no bytes) leaves the matcher as it is.
  if (r->matcher != nullptr) r->matcher->Accept(TokenBytes(token));
  if (r->params.logprobs >= 0) o.logprobs.push_back(logprobs ? std::move(*logprobs) : TokenLogprobs{});
  o.prompt_tokens = static_cast<int>(r->prompt_len);
  o.completion_tokens = static_cast<int>(r->num_output_tokens());
  if (first) {
    o.cached_tokens = static_cast<int>(r->num_cached_tokens);
    o.queue_time = r->admitted_at - r->queued_at;
  }
  const std::vector<int32_t>& eos = model_->config().eos_token_ids;
  const auto& stops = r->params.stop_token_ids;
  // Stop ids end the output only from the min_tokens-th token on (vLLM's
  // check_stop); the length limits always do.
  const bool may_stop = r->num_output_tokens() >= r->params.min_tokens;
  if (r->kind == RequestKind::kPrefillOnly) {
    r->finish = FinishReason::kLength;
  } else if (may_stop &&
             (std::find(stops.begin(), stops.end(), token) != stops.end() ||
              (!r->params.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()))) {
    r->finish = FinishReason::kStop;
    r->stop_token = true;
  } else if (r->matcher != nullptr && r->matcher->Done()) {
    // The structured output is whole and nothing may follow it: the reply
    // ends here, without a step for its EOS (which min_tokens could ban).
    r->finish = FinishReason::kStop;
  } else if (r->num_output_tokens() >= r->params.max_tokens ||
             r->num_tokens() >= max_model_len()) {
    r->finish = FinishReason::kLength;
  }
}

std::vector<RequestOutput> LlmEngine::TakeOutputs() {
  std::vector<RequestOutput> out;
  out.swap(pending_outputs_);
  return out;
}

absl::StatusOr<std::vector<RequestOutput>> LlmEngine::Step() {
  std::vector<RequestOutput> out = TakeOutputs();
  // A request samples once per step: only these outputs, produced between
  // steps, can already be its own.
  const size_t carried = out.size();
  if (config_.speculative.enabled()) ProposeDrafts();
  SchedulerOutput sched = scheduler_->Schedule();
  for (Request* r : sched.failed) Finish(r, FinishReason::kError, &out);
  for (Request* r : sched.kv_needed) {
    RequestOutput o;
    o.id = r->id;
    o.kv_needed = true;
    o.kv_tokens = static_cast<int>(r->num_tokens());
    o.cached_tokens = static_cast<int>(r->num_cached_tokens);
    o.prompt_tokens = static_cast<int>(r->prompt_len);
    o.completion_tokens = static_cast<int>(r->num_output_tokens());
    out.push_back(std::move(o));
  }
  const std::vector<ScheduledChunk>& chunks = sched.chunks;
  last_step_ran_ = !chunks.empty();
  if (chunks.empty()) return out;

  batch_.clear();
  for (const ScheduledChunk& c : chunks) {
    ScheduledSeq s;
    Request* r = c.request;
    s.lora_slot = r->lora_slot;
    s.tokens = r->tokens.data() + c.start;
    if (c.num_drafts > 0) {  // the last token, then the drafts (never in tokens)
      r->step_tokens.assign(1, r->tokens.back());
      r->step_tokens.insert(r->step_tokens.end(), r->drafts.begin(), r->drafts.end());
      s.tokens = r->step_tokens.data();
    }
    s.num_tokens = c.num_tokens;
    s.start_pos = c.start;
    s.block_table = kv_cache_->BlockTable(r->id);
    s.sample = c.logit_rows() > 0;
    s.num_sampled = c.logit_rows();
    batch_.push_back(s);
  }
  // A prefill-only request's rows of this step become final layer by layer
  // (KvReadyTokens(id, layer)), so its KV can leave while later layers run.
  for (const ScheduledChunk& c : chunks) {
    if (c.request->kind == RequestKind::kPrefillOnly) {
      c.request->step_kv_end = c.start + c.num_tokens;
    }
  }
  step_layers_done_ = 0;
  stepping_ = true;
  absl::StatusOr<StepResult> executed = runner_->Execute(batch_);
  stepping_ = false;
  for (const ScheduledChunk& c : chunks) c.request->step_kv_end = 0;
  step_layers_done_ = 0;
  ASSIGN_OR_RETURN(StepResult step, std::move(executed));
  // A bounded window of recent steps for the step table: nobody may drain it
  // (the table is off by default), so it must not grow with uptime.
  if (records_.size() >= kMaxStepRecords) {
    records_.erase(records_.begin(), records_.begin() + kMaxStepRecords / 2);
  }
  int max_query_len = 0;
  for (const ScheduledSeq& s : batch_) max_query_len = std::max(max_query_len, s.num_tokens);
  records_.push_back({step.runtime_mode, step.num_tokens, step.padded_tokens, step.descriptor,
                      static_cast<int>(batch_.size()), max_query_len});

  const int vocab = static_cast<int>(model_->config().vocab_size);
  int row = 0;
  std::vector<Request*> done;
  for (const ScheduledChunk& c : chunks) {
    Request* r = c.request;
    const float* logits = step.logits + int64_t{row} * vocab;
    row += c.logit_rows();
    if (!c.sample) {
      r->num_computed = c.start + c.num_tokens;
      kv_cache_->CacheComputed(r->id, r->tokens, r->num_computed, r->cache_root);
      // Its KV so far may be streamed out while the rest is computed.
      if (r->kind == RequestKind::kPrefillOnly) {
        OutputFor(r, &out, carried).kv_ready_tokens = r->num_computed;
      }
    } else {
      // With prompt logits, the last row samples.
      AcceptTokens(c, logits + (c.all_rows ? int64_t{c.num_tokens - 1} * vocab : 0), &out, carried);
    }
    // Into the output the token went to, if any: one output a request a step.
    if (c.all_rows) PromptLogprobs(c, logits, &out);
    if (r->finished()) done.push_back(r);
  }
  for (Request* r : done) Finish(r, r->finish, &out);
  return out;
}

void LlmEngine::ProposeDrafts() {
  const SpeculativeConfig& spec = config_.speculative;
  for (Request* r : scheduler_->running()) {
    r->drafts.clear();
    if (r->num_tokens() - r->num_computed != 1) continue;  // prefilling
    if (r->matcher != nullptr) continue;  // drafts would skip the grammar's mask
    // No draft past max_tokens or max_model_len: the step yields up to
    // drafts + 1 tokens, the last of them sampled after the drafts.
    const int64_t room = std::min<int64_t>(
        int64_t{r->params.max_tokens} - r->num_output_tokens(),
        max_model_len() - r->num_tokens()) - 1;
    if (room < 1) continue;
    if (r->proposer == nullptr) {
      r->proposer =
          std::make_unique<NgramProposer>(spec.prompt_lookup_min, spec.prompt_lookup_max);
      r->draft_length = std::make_unique<DraftLength>(spec.num_speculative_tokens, spec.adaptive);
    }
    const int k = static_cast<int>(std::min<int64_t>(r->draft_length->Next(), room));
    r->proposer->Propose(r->tokens, k, &r->drafts);
  }
}

const std::string& LlmEngine::TokenBytes(int32_t token) const {
  static const std::string kNone;
  const TokenVocabulary* v = config_.vocabulary.get();
  return v != nullptr && token >= 0 && token < v->size() ? v->bytes(token) : kNone;
}

const float* LlmEngine::Masked(const GrammarMatcher& matcher, const float* logits, int vocab) {
  allowed_.resize(vocab);
  matcher.FillMask(*config_.vocabulary, model_->config().eos_token_ids, &allowed_);
  masked_logits_.assign(logits, logits + vocab);
  for (int i = 0; i < vocab; ++i) {
    if (!allowed_[i]) masked_logits_[i] = -std::numeric_limits<float>::infinity();
  }
  return masked_logits_.data();
}

void LlmEngine::PromptLogprobs(const ScheduledChunk& c, const float* logits,
                               std::vector<RequestOutput>* out) {
  Request* r = c.request;
  const int vocab = static_cast<int>(model_->config().vocab_size);
  const int64_t end = r->prompt_logprobs_end();
  RequestOutput* o = nullptr;  // found (rare: one search) once there is one to report
  // Row j holds the distribution of position c.start + j + 1.
  for (int j = 0; j < c.num_tokens && c.start + j + 1 < end; ++j) {
    const int64_t position = c.start + j + 1;
    if (position <= r->prompt_logprobs_done) continue;  // reported before a preemption
    TokenLogprobs lp;
    sampler_.Logprobs(logits + int64_t{j} * vocab, vocab, r->tokens[position],
                      r->params.prompt_logprobs, &lp);
    if (o == nullptr) o = &OutputFor(r, out, out->size());
    o->prompt_logprobs.push_back(std::move(lp));
    r->prompt_logprobs_done = position;
  }
}

void LlmEngine::AcceptTokens(const ScheduledChunk& c, const float* logits,
                             std::vector<RequestOutput>* out, size_t carried) {
  Request* r = c.request;
  const int vocab = static_cast<int>(model_->config().vocab_size);
  const int drafts = c.num_drafts;
  // The KV of the last token and of every kept draft is valid; the rows
  // written for rejected drafts are past num_computed, to be overwritten.
  int kept = 0;
  int32_t next = 0;
  // The penalties at a draft's position count the drafts accepted before it.
  const absl::Span<const int32_t> all(r->tokens);
  const int64_t split = r->prompt_len - r->params.prior_output_tokens;
  auto history = [&](int accepted) {
    return TokenHistory{all.subspan(0, split), all.subspan(split),
                        absl::MakeConstSpan(r->drafts).subspan(0, accepted),
                        model_->config().eos_token_ids};
  };
  for (; kept < drafts; ++kept) {
    if (!sampler_.Verify(logits + int64_t{kept} * vocab, vocab, r->params, history(kept),
                         r->drafts[kept], &r->rng, &next)) {
      break;
    }
  }
  if (r->matcher != nullptr) {
    // Structured outputs (never drafted): the tokens that cannot come next
    // are out of the draw, and out of the logprobs, as vLLM's bitmask does.
    logits = Masked(*r->matcher, logits, vocab);
  }
  if (kept == drafts) {
    next = sampler_.Sample(logits + int64_t{drafts} * vocab, vocab, r->params, history(drafts),
                           &r->rng);
  }
  if (drafts > 0) {
    r->draft_length->Verified(drafts, kept);
    ++spec_stats_.num_drafts;
    spec_stats_.num_draft_tokens += drafts;
    spec_stats_.num_accepted_tokens += kept;
    for (int i = 0; i < kept; ++i) ++spec_stats_.accepted_per_pos[i];
  }
  const int64_t computed = c.start + c.num_tokens - drafts + kept;
  // Kept drafts, then the sampled token, up to the first that stops; all
  // in the request's one output of the step.
  RequestOutput& o = OutputFor(r, out, carried);
  for (int i = 0; i <= kept && !r->finished(); ++i) {
    const int32_t token = i < kept ? r->drafts[i] : next;
    if (r->params.logprobs < 0) {
      AppendToken(r, token, o);
      continue;
    }
    TokenLogprobs lp;  // from the raw logits of the token's own position
    sampler_.Logprobs(logits + int64_t{i} * vocab, vocab, token, r->params.logprobs, &lp);
    AppendToken(r, token, o, &lp);
  }
  r->drafts.clear();
  r->num_computed = std::min<int64_t>(computed, r->num_tokens());
  kv_cache_->CacheComputed(r->id, r->tokens, r->num_computed, r->cache_root);
}

absl::Status LlmEngine::ImportKv(const std::string& id, int layer, int64_t first, int64_t count,
                                 absl::Span<const absl::string_view> k,
                                 absl::Span<const absl::string_view> v) {
  Request* r = Find(id);
  if (r == nullptr || r->state != RequestState::kWaitingForRemoteKv) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request '", id, "' is ", r == nullptr ? "not in flight" : RequestStateName(r->state),
        ", not waiting_for_remote_kv"));
  }
  if (first < r->num_computed || first + count > r->num_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV rows [", first, ", ", first + count, ") for request '", id, "': it expects rows [",
        r->num_computed, ", ", r->num_tokens(), ")"));
  }
  const size_t expected = static_cast<size_t>(count) * kv_cache_->slot_bytes();
  if (TotalBytes(k) != expected || TotalBytes(v) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV rows [", first, ", ", first + count, ") for request '", id, "': ", TotalBytes(k), "+",
        TotalBytes(v), " bytes, expected ", expected, " each"));
  }
  // Straight from the pieces (gRPC's slices) into the cache: on the CPU one
  // memcpy wherever a piece and a run of rows meet; a GPU stages them once.
  std::vector<DeviceRun> runs;
  std::vector<absl::string_view> pieces(k.begin(), k.end());
  pieces.insert(pieces.end(), v.begin(), v.end());
  RETURN_IF_ERROR(KvRuns(id, layer, first, count, &runs));
  return backend_->device->ScatterToDevice(pieces, runs);
}

absl::Status LlmEngine::RemoteKvArrived(const std::string& id, int32_t first_token,
                                        TokenLogprobs first_logprobs) {
  Request* r = Find(id);
  if (r == nullptr || r->state != RequestState::kWaitingForRemoteKv) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request '", id, "' is ", r == nullptr ? "not in flight" : RequestStateName(r->state),
        ", not waiting_for_remote_kv"));
  }
  if (first_token < 0 || first_token >= model_->config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("first token ", first_token,
                                                   " is outside the vocabulary [0, ",
                                                   model_->config().vocab_size, ")"));
  }
  r->num_computed = r->num_tokens();
  kv_cache_->CacheComputed(r->id, r->tokens, r->num_computed, r->cache_root);
  // The token was sampled elsewhere with the same seed: consume its draw so
  // seeded sampling continues as it would have in one process.
  if (r->params.temperature > 0.f) r->rng();
  scheduler_->RemoteKvArrived(r);
  AppendToken(r, first_token, OutputFor(r, &pending_outputs_, pending_outputs_.size()),
              &first_logprobs);
  if (r->finished()) Finish(r, r->finish, &pending_outputs_);
  return absl::OkStatus();
}

absl::Status LlmEngine::ComputeLocally(const std::string& id) {
  Request* r = Find(id);
  if (r == nullptr || r->state != RequestState::kWaitingForRemoteKv) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request '", id, "' is ", r == nullptr ? "not in flight" : RequestStateName(r->state),
        ", not waiting_for_remote_kv"));
  }
  scheduler_->ComputeLocally(r);
  return absl::OkStatus();
}

absl::Status LlmEngine::ForEachKvRun(
    const std::string& id, int layer, int64_t first, int64_t count,
    const std::function<absl::Status(size_t offset, char* k, char* v, size_t bytes)>& copy) const {
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
  for (int64_t i = 0; i < count;) {
    const int64_t slot = kv_cache_->SlotOf(*table, first + i);
    int64_t run = 1;
    while (i + run < count && kv_cache_->SlotOf(*table, first + i + run) == slot + run) ++run;
    RETURN_IF_ERROR(copy(i * row, static_cast<char*>(l.k.data) + slot * row,
                         static_cast<char*>(l.v.data) + slot * row, run * row));
    i += run;
  }
  return absl::OkStatus();
}

int64_t LlmEngine::KvReadyTokens(const std::string& id) const {
  const Request* r = Find(id);
  return r == nullptr ? 0 : r->num_computed;
}

int64_t LlmEngine::KvReadyTokens(const std::string& id, int layer) const {
  const Request* r = Find(id);
  if (r == nullptr) return 0;
  return layer < step_layers_done_ ? std::max(r->num_computed, r->step_kv_end) : r->num_computed;
}

absl::StatusOr<uint32_t> LlmEngine::ReadKv(const std::string& id, int layer, int64_t first,
                                           int64_t count, void* k, void* v) const {
  ASSIGN_OR_RETURN(KvRead read, IssueKvRead(id, layer, first, count));
  return read.Finish(k, v);
}

absl::StatusOr<KvRead> LlmEngine::IssueKvRead(const std::string& id, int layer, int64_t first,
                                              int64_t count) const {
  KvRead read;
  RETURN_IF_ERROR(KvRuns(id, layer, first, count, &read.runs_));
  Device* device = backend_->device.get();
  // A GPU gathers every run into one transfer, queued now; host memory is
  // read where it lies when the read is finished.
  if (device->async_gathers()) {
    ASSIGN_OR_RETURN(read.gather_, device->IssueGather(read.runs_));
    read.runs_.clear();
  }
  return read;
}

absl::StatusOr<uint32_t> KvRead::Finish(void* k, void* v) {
  uint32_t crc = 0;
  if (gather_ != nullptr) {  // the copy out of pinned memory is the checksum's one pass
    ASSIGN_OR_RETURN(const absl::Span<const char> rows, gather_->Wait());
    const size_t half = rows.size() / 2;
    crc = Crc32cCopy(crc, k, rows.data(), half);
    return Crc32cCopy(crc, v, rows.data() + half, half);
  }
  // K's runs, then V's: the checksum's order. Each byte is read once, copied
  // and checksummed in one pass (a chunk out of a KV cache larger than the
  // CPU's caches: 10.0-10.6 GB/s against 8.6-8.7 for memcpy, then the
  // checksum, on an Intel Xeon; crc32c_benchmark, docs/benchmarking.md).
  const size_t k_runs = runs_.size() / 2;
  char* out = static_cast<char*>(k);
  for (size_t i = 0; i < runs_.size(); ++i) {
    if (i == k_runs) out = static_cast<char*>(v);
    crc = Crc32cCopy(crc, out, runs_[i].device, runs_[i].bytes);
    out += runs_[i].bytes;
  }
  return crc;
}

absl::Status LlmEngine::KvRuns(const std::string& id, int layer, int64_t first, int64_t count,
                               std::vector<DeviceRun>* runs) const {
  runs->clear();
  std::vector<DeviceRun> v_runs;  // K's runs, then V's
  RETURN_IF_ERROR(ForEachKvRun(id, layer, first, count,
                               [&](size_t, char* ck, char* cv, size_t bytes) -> absl::Status {
                                 runs->push_back({ck, bytes});
                                 v_runs.push_back({cv, bytes});
                                 return absl::OkStatus();
                               }));
  runs->insert(runs->end(), v_runs.begin(), v_runs.end());
  return absl::OkStatus();
}

std::vector<StepRecord> LlmEngine::TakeStepRecords() {
  std::vector<StepRecord> r;
  r.swap(records_);
  return r;
}

const char* RequestStateName(RequestState s) {
  switch (s) {
    case RequestState::kWaiting: return "waiting";
    case RequestState::kWaitingForRemoteKv: return "waiting_for_remote_kv";
    case RequestState::kRunning: return "running";
    case RequestState::kPreempted: return "preempted";
    case RequestState::kFinishedStopped: return "finished_stopped";
    case RequestState::kFinishedLengthCapped: return "finished_length_capped";
    case RequestState::kFinishedAborted: return "finished_aborted";
    case RequestState::kFinishedError: return "finished_error";
  }
  return "unknown";
}

}  // namespace tandem
