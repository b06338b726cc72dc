#include "common/engine/model_runner.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/graph/forward_context.h"

namespace tandem {
namespace {

// The forward context a runnable was given: set, and its batch within the
// persistent buffers. A runnable called outside a ModelRunner step (or with a
// descriptor the buffers cannot hold) fails instead of reading past them.
absl::StatusOr<const ForwardContext*> RequireForwardContext(const ForwardBuffers& b) {
  const ForwardContext* ctx = CurrentForwardContext();
  if (ctx == nullptr) {
    return absl::FailedPreconditionError("a forward runnable ran outside a forward context");
  }
  const int64_t n = ctx->descriptor.num_tokens;
  if (n < 1 || n > b.input_ids.dim(0)) {
    return absl::InvalidArgumentError(absl::StrCat("forward context has ", n,
                                                   " tokens; the buffers hold 1 to ",
                                                   b.input_ids.dim(0)));
  }
  return ctx;
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const RunnerConfig& config,
                                                                 const LlamaModel* model,
                                                                 KvCache* kv_cache, Ops* ops,
                                                                 const LoraSet* lora) {
  std::unique_ptr<ModelRunner> r(new ModelRunner());
  if (lora != nullptr && lora->capacity() == 0) lora = nullptr;
  if ((lora != nullptr) != config.graph.lora_enabled) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the graph policy's lora_enabled (", config.graph.lora_enabled,
        ") disagrees with the adapter slots (", lora == nullptr ? 0 : lora->capacity(), ")"));
  }
  if (lora != nullptr && !ops->supports_lora()) {
    return absl::InvalidArgumentError(
        "LoRA adapters (--lora-modules, --allow-runtime-lora-updating) are not implemented on "
        "this backend; use --device=cpu");
  }
  r->buffers_.lora = lora;
  r->config_ = config;
  r->model_ = model;
  r->kv_cache_ = kv_cache;
  r->ops_ = ops;
  const LlamaConfig& mc = model->config();
  if (r->config_.max_model_len <= 0) {
    r->config_.max_model_len = mc.DefaultMaxModelLen();
  }
  if (r->config_.max_model_len > mc.MaxContext()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_model_len ", r->config_.max_model_len, " exceeds the model's context of ", mc.MaxContext(),
        " positions (max_position_embeddings ", mc.max_position_embeddings,
        mc.rope_scaling.type.empty() ? "" : absl::StrCat(", rope scaling ", mc.rope_scaling.type), ")"));
  }
  if (config.max_num_batched_tokens < 1 || config.max_num_seqs < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_num_batched_tokens (", config.max_num_batched_tokens, ") and max_num_seqs (",
        config.max_num_seqs, ") must be >= 1"));
  }

  // Resolve sizes and mode against what the attention backend declares. The
  // forward is always split at attention, so piecewise graphs are available.
  ASSIGN_OR_RETURN(GraphPolicy policy,
                   ResolveGraphPolicy(config.graph,
                                      BatchLimits{config.max_num_seqs,
                                                  config.max_num_batched_tokens},
                                      ops->attention_cg_support(), /*piecewise_split=*/true));
  r->resolution_ = std::move(policy.resolution);
  for (const auto& note : r->resolution_.notes) TANDEM_LOG(WARNING) << "graph policy: " << note;
  r->dispatcher_ = std::make_unique<CudaGraphDispatcher>(std::move(policy.dispatcher));
  RETURN_IF_ERROR(r->dispatcher_->InitializeKeys(r->resolution_.mode));
  RETURN_IF_ERROR(r->AllocateBuffers());

  ModelRunner* self = r.get();
  CudaGraphWrapperOptions opts{config.check_input_addresses};
  auto addresses = [self] { return self->InputAddresses(); };
  for (int p = 0; p < model->num_pieces(); ++p) {
    r->pieces_.push_back(std::make_unique<CudaGraphWrapper>(
        absl::StrCat("piece", p), CudaGraphMode::kPiecewise, ops->device()->stream(),
        [self, p]() -> absl::Status {
          ASSIGN_OR_RETURN(const ForwardContext* ctx, RequireForwardContext(self->buffers_));
          self->model_->IssuePiece(p, ctx->descriptor.num_tokens, self->buffers_);
          return absl::OkStatus();
        },
        addresses, opts));
  }
  r->full_ = std::make_unique<CudaGraphWrapper>("forward", CudaGraphMode::kFull,
                                                ops->device()->stream(),
                                                [self] { return self->Forward(); }, addresses, opts);
  return r;
}

absl::Status ModelRunner::AllocateBuffers() {
  const int bs = kv_cache_->block_size();
  max_blocks_per_seq_ = (config_.max_model_len + bs - 1) / bs;
  max_logit_rows_ = std::min<int64_t>(
      config_.max_num_batched_tokens,
      int64_t{config_.max_num_seqs} * dispatcher_->uniform_decode_query_len());
  std::unique_ptr<Arena> measure = Arena::Measure("runner-buffers");
  RETURN_IF_ERROR(PlaceBuffers(measure.get()));
  ASSIGN_OR_RETURN(arena_, Arena::Create(ops_->device(), measure->used(), "runner-buffers"));
  RETURN_IF_ERROR(PlaceBuffers(arena_.get()));
  const LlamaConfig& c = model_->config();
  const int64_t t = config_.max_num_batched_tokens, s = config_.max_num_seqs;
  h_ids_.resize(t);
  h_pos_.resize(t);
  h_slots_.resize(t);
  h_qsl_.resize(s + 1);
  h_seq_lens_.resize(s);
  h_tables_.resize(s * max_blocks_per_seq_);
  h_logit_idx_.resize(max_logit_rows_);
  if (buffers_.lora != nullptr) h_lora_.resize(t);
  h_logits_.resize(max_logit_rows_ * c.vocab_size);
  return absl::OkStatus();
}

absl::Status ModelRunner::PlaceBuffers(Arena* arena) {
  const LlamaConfig& c = model_->config();
  const int64_t t = config_.max_num_batched_tokens, s = config_.max_num_seqs;
  const int bs = kv_cache_->block_size();
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const size_t workspace = ops_->AttentionWorkspaceBytes(
      model_->attention_shape(), static_cast<int>(s), max_blocks_per_seq_ * bs);
  auto alloc = [arena](DType d, std::initializer_list<int64_t> dims, Tensor* out) {
    auto r = arena->Allocate(d, dims);
    if (!r.ok()) return r.status();
    *out = *r;
    return absl::OkStatus();
  };
  ForwardBuffers& b = buffers_;
  const DType act = ops_->dtype();  // activations; logits stay f32
  RETURN_IF_ERROR(alloc(DType::kI32, {t}, &b.input_ids));
  RETURN_IF_ERROR(alloc(DType::kI32, {t}, &b.positions));
  RETURN_IF_ERROR(alloc(DType::kI32, {1}, &b.meta.num_reqs));
  RETURN_IF_ERROR(alloc(DType::kI32, {s + 1}, &b.meta.query_start_loc));
  RETURN_IF_ERROR(alloc(DType::kI32, {s}, &b.meta.seq_lens));
  RETURN_IF_ERROR(alloc(DType::kI32, {s, max_blocks_per_seq_}, &b.meta.block_tables));
  RETURN_IF_ERROR(alloc(DType::kI32, {t}, &b.meta.slot_mapping));
  b.meta.block_size = bs;
  if (workspace > 0) {
    RETURN_IF_ERROR(alloc(DType::kI32, {static_cast<int64_t>((workspace + 3) / 4)},
                          &b.meta.workspace));
  }
  RETURN_IF_ERROR(alloc(act, {t, h}, &b.hidden));
  RETURN_IF_ERROR(alloc(act, {t, h}, &b.residual));
  RETURN_IF_ERROR(alloc(act, {t, h}, &b.normed));
  RETURN_IF_ERROR(alloc(act, {t, c.qkv_size()}, &b.qkv));
  RETURN_IF_ERROR(alloc(act, {t, int64_t{c.num_attention_heads} * c.head_dim}, &b.attn_out));
  RETURN_IF_ERROR(alloc(act, {t, 2 * inter}, &b.gate_up));
  RETURN_IF_ERROR(alloc(act, {t, inter}, &b.mlp_act));
  if (c.num_experts > 0) {
    const int64_t moe = std::max(c.moe_intermediate_size, c.shared_expert_intermediate_size);
    RETURN_IF_ERROR(alloc(DType::kF32, {t, c.num_experts}, &b.moe.router_logits));
    RETURN_IF_ERROR(alloc(act, {t, h}, &b.moe.x));
    RETURN_IF_ERROR(alloc(act, {t, 2 * moe}, &b.moe.gate_up));
    RETURN_IF_ERROR(alloc(act, {t, moe}, &b.moe.act));
    RETURN_IF_ERROR(alloc(act, {t, h}, &b.moe.y));
  }
  if (b.lora != nullptr) {
    RETURN_IF_ERROR(alloc(DType::kI32, {t}, &b.lora_slots));
    RETURN_IF_ERROR(alloc(DType::kF32, {t, b.lora->max_stack_rank()}, &b.lora_scratch));
  }
  const int64_t rows = max_logit_rows_;
  RETURN_IF_ERROR(alloc(DType::kI32, {rows}, &logits_indices_));
  RETURN_IF_ERROR(alloc(act, {rows, h}, &gathered_));
  RETURN_IF_ERROR(alloc(DType::kF32, {rows, c.vocab_size}, &logits_));
  return absl::OkStatus();
}

std::vector<const void*> ModelRunner::InputAddresses() const {
  const ForwardBuffers& b = buffers_;
  std::vector<const void*> addresses = {
      b.input_ids.data,  b.positions.data,          b.meta.slot_mapping.data,
      b.meta.seq_lens.data, b.meta.query_start_loc.data, b.meta.block_tables.data,
      b.meta.num_reqs.data};
  if (b.lora != nullptr) addresses.push_back(b.lora_slots.data);
  return addresses;
}

absl::Status ModelRunner::Forward() {
  ASSIGN_OR_RETURN(const ForwardContext* ctx, RequireForwardContext(buffers_));
  const int64_t n = ctx->descriptor.num_tokens;
  // A start-up PIECEWISE capture pass records the pieces; attention between
  // them is eager and its output unread, so it is not run at all.
  const bool skip_attention = ctx->capture_only && ctx->runtime_mode == CudaGraphMode::kPiecewise;
  // Attention ran eagerly between pieces and wrote the layer's KV rows (on
  // a GPU: issued them, ahead of the device).
  const bool observe = layer_observer_ != nullptr && !ctx->capture_only &&
                       ctx->runtime_mode != CudaGraphMode::kFull;
  for (int layer = 0; layer < model_->num_layers(); ++layer) {
    RETURN_IF_ERROR(pieces_[layer]->Run());
    if (!skip_attention) model_->IssueAttention(layer, n, buffers_, kv_cache_->layer(layer));
    if (observe) layer_observer_(layer);
  }
  return pieces_.back()->Run();
}

absl::Status ModelRunner::CopyInputs(const std::vector<ScheduledSeq>& batch, int padded_tokens) {
  Device* dev = ops_->device();
  int tok = 0, sampled = 0;
  const int num_reqs = static_cast<int>(batch.size());
  h_qsl_[0] = 0;
  for (int r = 0; r < num_reqs; ++r) {
    const ScheduledSeq& s = batch[r];
    const std::vector<int32_t>& table = *s.block_table;
    for (int i = 0; i < s.num_tokens; ++i, ++tok) {
      const int64_t pos = s.start_pos + i;
      h_ids_[tok] = s.tokens[i];
      h_pos_[tok] = static_cast<int32_t>(pos);
      h_slots_[tok] = static_cast<int32_t>(kv_cache_->SlotOf(table, pos));
      if (!h_lora_.empty()) h_lora_[tok] = s.lora_slot;
    }
    h_qsl_[r + 1] = tok;
    h_seq_lens_[r] = static_cast<int32_t>(s.start_pos + s.num_tokens);
    int32_t* row = h_tables_.data() + r * max_blocks_per_seq_;
    std::copy(table.begin(), table.end(), row);
    std::fill(row + table.size(), row + max_blocks_per_seq_, 0);
    if (s.sample) {
      for (int i = s.num_sampled; i > 0; --i) h_logit_idx_[sampled++] = tok - i;
    }
  }
  for (int i = tok; i < padded_tokens; ++i) {  // padding: no KV write
    h_ids_[i] = 0;
    h_pos_[i] = 0;
    h_slots_[i] = -1;
    if (!h_lora_.empty()) h_lora_[i] = 0;
  }
  const ForwardBuffers& b = buffers_;
  const int32_t nr = num_reqs;
  RETURN_IF_ERROR(dev->CopyToDevice(b.input_ids.data, h_ids_.data(), padded_tokens * 4));
  RETURN_IF_ERROR(dev->CopyToDevice(b.positions.data, h_pos_.data(), padded_tokens * 4));
  RETURN_IF_ERROR(dev->CopyToDevice(b.meta.slot_mapping.data, h_slots_.data(), padded_tokens * 4));
  RETURN_IF_ERROR(dev->CopyToDevice(b.meta.query_start_loc.data, h_qsl_.data(), (num_reqs + 1) * 4));
  RETURN_IF_ERROR(dev->CopyToDevice(b.meta.seq_lens.data, h_seq_lens_.data(), num_reqs * 4));
  RETURN_IF_ERROR(dev->CopyToDevice(b.meta.block_tables.data, h_tables_.data(),
                                    num_reqs * max_blocks_per_seq_ * 4));
  RETURN_IF_ERROR(dev->CopyToDevice(b.meta.num_reqs.data, &nr, 4));
  if (b.lora != nullptr) {
    RETURN_IF_ERROR(dev->CopyToDevice(b.lora_slots.data, h_lora_.data(), padded_tokens * 4));
  }
  return dev->CopyToDevice(logits_indices_.data, h_logit_idx_.data(), sampled * 4);
}

absl::Status ModelRunner::RunForward(const std::vector<ScheduledSeq>& batch, CudaGraphMode mode,
                                     const BatchDescriptor& descriptor, bool capture_only) {
  // A FULL graph bakes its attention kernel in: decode-only (one query token
  // per request) exactly when its key is a uniform-decode one with q = 1.
  // Eager attention follows the batch itself.
  if (mode == CudaGraphMode::kFull) {
    buffers_.meta.decode_only = descriptor.uniform && dispatcher_->uniform_decode_query_len() == 1;
  } else {
    buffers_.meta.decode_only = std::all_of(
        batch.begin(), batch.end(), [](const ScheduledSeq& s) { return s.num_tokens == 1; });
  }
  // The LoRA ops are issued where the step's key says so (a graph captured
  // with them replays them), or eagerly for a batch that has an adapter.
  const bool batch_lora = std::any_of(batch.begin(), batch.end(),
                                      [](const ScheduledSeq& s) { return s.lora_slot != 0; });
  if (batch_lora && mode != CudaGraphMode::kNone && !descriptor.has_lora) {
    return absl::InternalError(absl::StrCat("a batch with LoRA adapters was dispatched to ",
                                            descriptor.ToString(), ", a graph without them"));
  }
  buffers_.lora_active = buffers_.lora != nullptr && (descriptor.has_lora || batch_lora);
  ForwardContextScope scope(mode, descriptor, capture_only);
  return full_->Run();
}

int64_t ModelRunner::PiecewiseReplays() const {
  int64_t n = 0;
  for (const auto& p : pieces_) n += p->replays();
  return n;
}

int64_t ModelRunner::PiecewiseCaptures() const {
  int64_t n = 0;
  for (const auto& p : pieces_) n += p->captures();
  return n;
}

absl::StatusOr<StepResult> ModelRunner::Execute(const std::vector<ScheduledSeq>& batch,
                                                bool force_eager) {
  const int num_reqs = static_cast<int>(batch.size());
  if (num_reqs == 0) return absl::InvalidArgumentError("Execute: empty batch");
  if (num_reqs > config_.max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("Execute: ", num_reqs,
                                                   " sequences exceed max_num_seqs ",
                                                   config_.max_num_seqs));
  }
  int num_tokens = 0, max_query = 0, sampled = 0;
  bool has_lora = false;
  const int adapters = buffers_.lora == nullptr ? 0 : buffers_.lora->capacity();
  for (const ScheduledSeq& s : batch) {
    if (s.lora_slot < 0 || s.lora_slot > adapters) {
      return absl::InvalidArgumentError(absl::StrCat("Execute: lora_slot ", s.lora_slot,
                                                     " is outside [0, ", adapters, "]"));
    }
    has_lora = has_lora || s.lora_slot != 0;
    if (s.num_tokens < 1 || s.block_table == nullptr) {
      return absl::InvalidArgumentError("Execute: a sequence has no tokens or no block table");
    }
    const int64_t end = s.start_pos + s.num_tokens;
    if (end > config_.max_model_len ||
        static_cast<int64_t>(s.block_table->size()) * kv_cache_->block_size() < end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Execute: sequence length ", end, " exceeds max_model_len ", config_.max_model_len,
          " or its block table (", s.block_table->size(), " blocks)"));
    }
    if (s.sample && (s.num_sampled < 1 || s.num_sampled > s.num_tokens)) {
      return absl::InvalidArgumentError(absl::StrCat("Execute: num_sampled ", s.num_sampled,
                                                     " is outside [1, ", s.num_tokens,
                                                     "] (the sequence's tokens)"));
    }
    num_tokens += s.num_tokens;
    max_query = std::max(max_query, s.num_tokens);
    sampled += s.sample ? s.num_sampled : 0;
  }
  if (sampled > max_logit_rows_) {
    return absl::InvalidArgumentError(absl::StrCat("Execute: ", sampled,
                                                   " rows of logits exceed the runner's ",
                                                   max_logit_rows_));
  }
  if (num_tokens > config_.max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("Execute: ", num_tokens,
                                                   " tokens exceed max_num_batched_tokens ",
                                                   config_.max_num_batched_tokens));
  }
  // vLLM: uniform decode iff every request schedules exactly q tokens.
  const int q = dispatcher_->uniform_decode_query_len();
  const bool uniform_decode = max_query == q && num_tokens == max_query * num_reqs;
  DispatchResult d{CudaGraphMode::kNone, BatchDescriptor(num_tokens)};
  if (!force_eager) {
    ASSIGN_OR_RETURN(d, dispatcher_->Dispatch(num_tokens, uniform_decode, has_lora));
  }
  const int64_t full_replays = full_->replays();
  const int64_t pw_replays = PiecewiseReplays();
  RETURN_IF_ERROR(CopyInputs(batch, d.descriptor.num_tokens));
  RETURN_IF_ERROR(RunForward(batch, d.runtime_mode, d.descriptor));

  ++stats_.steps[d.runtime_mode];
  if (d.runtime_mode == CudaGraphMode::kFull && full_->replays() > full_replays) {
    ++stats_.replays[CudaGraphMode::kFull];
  }
  if (d.runtime_mode == CudaGraphMode::kPiecewise &&
      PiecewiseReplays() - pw_replays == static_cast<int64_t>(pieces_.size())) {
    ++stats_.replays[CudaGraphMode::kPiecewise];
  }
  stats_.captured[CudaGraphMode::kFull] = full_->captures();
  stats_.captured[CudaGraphMode::kPiecewise] = PiecewiseCaptures();
  StepResult result;
  result.runtime_mode = d.runtime_mode;
  result.descriptor = d.descriptor;
  result.num_tokens = num_tokens;
  result.padded_tokens = d.descriptor.num_tokens - num_tokens;
  stats_.padded_tokens += result.padded_tokens;

  if (sampled > 0) {  // logits outside the graph, for the sampled rows only
    model_->IssueLogits(buffers_.normed, logits_indices_, gathered_.Rows(sampled),
                        logits_.Rows(sampled));
    RETURN_IF_ERROR(AwaitStep(d.runtime_mode));
    RETURN_IF_ERROR(ops_->device()->CopyToHost(
        h_logits_.data(), logits_.data, sampled * model_->config().vocab_size * sizeof(float)));
  }
  result.logits = h_logits_.data();
  result.logit_rows = sampled;
  return result;
}

absl::Status ModelRunner::AwaitStep(CudaGraphMode mode) {
  Stream* stream = ops_->device()->stream();
  // The observer's readers (LlmEngine::IssueKvRead from the layer hook) go
  // on while a GPU runs the layers the host has issued: a layer's rows leave
  // as its copy lands, not after the step.
  if (layer_observer_ != nullptr && mode != CudaGraphMode::kFull) {
    while (stream->Busy() && layer_observer_(model_->num_layers() - 1)) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  return stream->Synchronize();
}

absl::Status ModelRunner::CaptureGraphs() {
  if (captured_) return absl::OkStatus();
  captured_ = true;
  const auto groups = dispatcher_->CaptureDescriptors();
  const auto start = std::chrono::steady_clock::now();
  // Dummy requests read block 0 and write no KV (slots -1).
  std::vector<int32_t> dummy_table(max_blocks_per_seq_, 0);
  std::vector<int32_t> dummy_tokens(config_.max_num_batched_tokens, 0);
  for (const CaptureGroup& g : groups) {
    const auto group_start = std::chrono::steady_clock::now();
    const int64_t graphs_per_desc = g.mode == CudaGraphMode::kPiecewise ? pieces_.size() : 1;
    TANDEM_LOG(INFO) << "capturing " << g.descriptors.size() * graphs_per_desc << " "
                     << g.mode.name() << " graphs (" << g.descriptors.size()
                     << " batch sizes, largest " << g.descriptors.front().num_tokens << ") ...";
    bool warmed_up = false;
    for (const BatchDescriptor& d : g.descriptors) {
      std::vector<ScheduledSeq> batch;
      const int reqs = d.uniform ? *d.num_reqs : std::min(d.num_tokens, config_.max_num_seqs);
      const int per = d.num_tokens / reqs;
      for (int r = 0; r < reqs; ++r) {
        ScheduledSeq s;
        s.tokens = dummy_tokens.data();
        s.num_tokens = r == reqs - 1 ? d.num_tokens - per * (reqs - 1) : per;
        s.block_table = &dummy_table;
        batch.push_back(s);
      }
      RETURN_IF_ERROR(CopyInputs(batch, d.num_tokens));
      std::fill(h_slots_.begin(), h_slots_.begin() + d.num_tokens, -1);
      RETURN_IF_ERROR(ops_->device()->CopyToDevice(buffers_.meta.slot_mapping.data, h_slots_.data(),
                                                   d.num_tokens * 4));
      if (!warmed_up && ops_->device()->warmup_before_capture()) {
        // One eager run per group, as vLLM's warm-up dummy runs.
        RETURN_IF_ERROR(RunForward(batch, CudaGraphMode::kNone, d));
        warmed_up = true;
      }
      RETURN_IF_ERROR(RunForward(batch, g.mode, d, /*capture_only=*/true));
    }
    RETURN_IF_ERROR(ops_->device()->stream()->Synchronize());
    TANDEM_LOG(INFO) << "captured " << g.descriptors.size() * graphs_per_desc << " "
                     << g.mode.name() << " graphs ... done in "
                     << absl::StrFormat("%.2f", SecondsSince(group_start)) << " s";
  }
  stats_.captured[CudaGraphMode::kFull] = full_->captures();
  stats_.captured[CudaGraphMode::kPiecewise] = PiecewiseCaptures();
  stats_.capture_seconds = SecondsSince(start);
  return absl::OkStatus();
}

}  // namespace tandem
