// LlmEngine: the model, its KV cache, the runner and the scheduler in one
// object, stepped by one thread. Used in-process by `tandem generate --local`
// and `tandem bench`, and by each worker's engine loop.
//
// Not thread-safe: one engine thread owns it. Services post work to that
// thread; they never call it from RPC threads.
#ifndef TANDEM_COMMON_ENGINE_ENGINE_H_
#define TANDEM_COMMON_ENGINE_ENGINE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "absl/time/time.h"
#include "common/backend/device.h"
#include "common/engine/model_runner.h"
#include "common/engine/request.h"
#include "common/engine/sampling.h"
#include "common/engine/scheduler.h"
#include "common/kernels/backend.h"

namespace tandem {

struct EngineConfig {
  std::string model = "synthetic";
  BackendOptions backend;
  int block_size = 16;
  int num_kv_blocks = 0;  // 0: as many as fit kv_cache_bytes (capped at need)
  int64_t kv_cache_bytes = int64_t{512} << 20;
  bool enable_prefix_caching = true;
  // vLLM's --rope-scaling: JSON replacing the model's rope scaling (empty:
  // the model's own).
  std::string rope_scaling;
  // How long a new request may wait for KV blocks before it fails.
  absl::Duration waiting_timeout = absl::InfiniteDuration();
  RunnerConfig runner;
  // Speculative decoding (off by default); when on, the runner's
  // uniform_decode_query_len is 1 + num_speculative_tokens.
  SpeculativeConfig speculative;
  // The tokens' bytes, for structured outputs (SamplingParams::grammar);
  // null when the model has no tokenizer, and then such requests are refused.
  std::shared_ptr<const TokenVocabulary> vocabulary;
  // LoRA adapters requests may name (SamplingParams::lora_name), all loaded
  // at start-up; ranks at most max_lora_rank (vLLM's --max-lora-rank).
  std::vector<LoraModuleSpec> lora_modules;
  int max_lora_rank = 16;
  // > 0: adapters may also be loaded and unloaded at run time (vLLM's
  // /v1/load_lora_adapter), into this many slots allocated at start-up
  // (vLLM's --max-loras); at least one per lora_modules entry.
  int runtime_lora_slots = 0;
  // vLLM's --scheduling-policy: fcfs, or priority (SamplingParams::priority).
  SchedulingPolicy scheduling_policy = SchedulingPolicy::kFcfs;
  // vLLM's --max-logprobs: the most top log-probabilities a request may ask
  // for each token (logprobs, prompt_logprobs); -1: the whole vocabulary.
  int max_logprobs = kDefaultMaxLogprobs;
};

// Speculative decoding counters since start-up (vLLM's SpecDecodingStats).
struct SpecDecodeStats {
  int64_t num_drafts = 0;           // verification steps of a request with drafts
  int64_t num_draft_tokens = 0;     // tokens drafted
  int64_t num_accepted_tokens = 0;  // drafted tokens kept
  // accepted_per_pos[i]: drafts whose (i+1)-th token was kept.
  std::vector<int64_t> accepted_per_pos;
};

struct RequestOutput {
  std::string id;
  std::vector<int32_t> new_tokens;  // tokens sampled this step
  // Per new token, when the request asked for them (SamplingParams::logprobs).
  std::vector<TokenLogprobs> logprobs;
  // Prompt logprobs (SamplingParams::prompt_logprobs), in prompt order from
  // position 1, as the chunks that compute them run; all of them come before
  // or with the first token.
  std::vector<TokenLogprobs> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  // The last of new_tokens is the stop token (EOS or a stop_token_ids id)
  // that ended the request: vLLM leaves its text out of the reply's.
  bool stop_token = false;
  absl::Status status;  // non-OK when the request failed
  int prompt_tokens = 0;
  int completion_tokens = 0;
  // Prompt tokens served from this engine's prefix cache (set on the first
  // output of each admission: the first token, or a kv_needed output).
  int cached_tokens = 0;
  // With the first token: how long the request waited to be first given
  // blocks (its queue time).
  absl::Duration queue_time;
  // A kRemotePrefill request now holds blocks for `kv_tokens` tokens and
  // waits for their KV from position `cached_tokens` on (ImportKv), then
  // for the token sampled after them (RemoteKvArrived).
  bool kv_needed = false;
  int kv_tokens = 0;
  // A kPrefillOnly request has an output after each of its prompt's chunks
  // (chunked prefill): rows [0, kv_ready_tokens) of every layer are final and
  // may be read out (ReadKv) while the rest of the prompt is computed.
  int64_t kv_ready_tokens = 0;
};

// One step's record, for the --cudagraph-metrics style table.
struct StepRecord {
  CudaGraphMode runtime_mode;
  int num_tokens = 0;
  int padded_tokens = 0;
  BatchDescriptor descriptor;  // the dispatched key
  int num_reqs = 0;
  int max_query_len = 0;       // tokens of the longest request's share
};

// Rows of one layer of a request's KV on their way out of the cache
// (LlmEngine::IssueKvRead). From host memory nothing moves until Finish(),
// which copies and checksums each byte in one pass; from a GPU the device
// gathers them into pinned memory meanwhile (PendingGather). May be dropped
// unfinished, on any thread.
class KvRead {
 public:
  // Whether Finish() would not wait.
  bool ready() const { return gather_ == nullptr || gather_->ready(); }
  // Writes the K rows to `k` and the V rows to `v` (once) and returns the
  // CRC32C of the K rows followed by the V rows. From host memory, call it
  // while the request still holds its blocks.
  absl::StatusOr<uint32_t> Finish(void* k, void* v);

 private:
  friend class LlmEngine;
  std::vector<DeviceRun> runs_;  // host memory: K's runs, then V's
  std::unique_ptr<PendingGather> gather_;  // device memory
};

class LlmEngine {
 public:
  // Loads the model, sizes the KV cache, builds the runner and captures its
  // graphs (logging progress). Errors name the config field to change.
  static absl::StatusOr<std::unique_ptr<LlmEngine>> Create(const EngineConfig& config);
  ~LlmEngine();

  // Validates and queues a request (WAITING). INVALID_ARGUMENT names the
  // field, value and limit; RESOURCE_EXHAUSTED when prompt and max_tokens
  // could not fit even in an empty cache; ALREADY_EXISTS for an id in flight.
  absl::Status AddRequest(const std::string& id, std::vector<int32_t> prompt,
                          const SamplingParams& params, RequestKind kind = RequestKind::kGenerate);
  // Validates a prompt and parameters without queueing anything.
  absl::Status Validate(const std::vector<int32_t>& prompt, const SamplingParams& params) const;
  // The one way out for a request in any state: drops it and frees its KV
  // blocks (a finished prefill-only request's too). NOT_FOUND for an unknown id.
  absl::Status Abort(const std::string& id);

  // KV transfer (disaggregated serving). Token-major rows: for each token,
  // num_kv_heads * head_dim elements of K (and of V) of one layer, in the
  // cache's dtype (kv_cache().slot_bytes() bytes per row).
  //
  // Writes rows [first, first + count) of `layer` into a WAITING_FOR_REMOTE_KV
  // request's blocks, K's and V's from the pieces they arrived in (in order,
  // count rows each). FAILED_PRECONDITION in another state; INVALID_ARGUMENT
  // when the range is outside its reserved blocks or the pieces hold another
  // number of bytes.
  absl::Status ImportKv(const std::string& id, int layer, int64_t first, int64_t count,
                        absl::Span<const absl::string_view> k,
                        absl::Span<const absl::string_view> v);
  // A WAITING_FOR_REMOTE_KV request's KV is complete and `first_token` was
  // sampled after it elsewhere: it joins the decode batch (or finishes, when
  // that token stops it). The token comes out of TakeOutputs(), or of the
  // next Step() when nobody takes it before.
  absl::Status RemoteKvArrived(const std::string& id, int32_t first_token,
                               TokenLogprobs first_logprobs = {});
  // A WAITING_FOR_REMOTE_KV request is computed here after all (its prefill
  // worker is gone, stalled or sent incomplete KV), reusing its cached prefix;
  // rows imported so far are overwritten.
  absl::Status ComputeLocally(const std::string& id);
  // Tokens of request `id` whose KV is final in every layer (0 for an unknown
  // id): what ReadKv may read. It may go down when the request is preempted.
  int64_t KvReadyTokens(const std::string& id) const;
  // The same for one layer. Inside a step (from the layer hook) a
  // kPrefillOnly request's rows of the layers the step has finished are
  // final up to the step's end, the others' up to its start.
  int64_t KvReadyTokens(const std::string& id, int layer) const;
  // Called on the stepping thread after each layer of a step whose rows
  // become final layer by layer (ModelRunner::SetLayerObserver), with the
  // engine in the middle of Step(): the hook may read KV (KvReadyTokens,
  // ReadKv, IssueKvRead) and must not change the engine. It returns whether
  // it waits for the device's copies: then, while the device still runs the
  // step, it is called again (with the last layer) until it says no.
  using LayerHook = std::function<bool(int layer)>;
  void SetLayerHook(LayerHook hook) { layer_hook_ = std::move(hook); }
  // Whether a step is running (the layer hook is called from inside it).
  bool stepping() const { return stepping_; }
  // Whether prompt steps call the hook: prompts run in NONE or PIECEWISE
  // steps (any mode but FULL, whose one graph has no point between layers).
  // On a GPU the hook comes when a layer's ops are issued, not run: reads go
  // through IssueKvRead, ordered after them. Elsewhere a step's rows are
  // final after the step.
  bool kv_final_per_layer() const { return runner_->resolved_mode() != CudaGraphMode::kFull; }
  // Whether IssueKvRead returns before the rows are copied (a GPU).
  bool kv_reads_async() const { return backend_->device->async_gathers(); }
  // Reads rows [first, first + count) of `layer` of a request's cached KV
  // (final only below KvReadyTokens(id, layer)) into k and v; returns the
  // CRC32C of the k rows followed by the v rows, taken as they are copied.
  // IssueKvRead then KvRead::Finish.
  absl::StatusOr<uint32_t> ReadKv(const std::string& id, int layer, int64_t first,
                                  int64_t count, void* k, void* v) const;
  // The same in two halves, for a reader that issues reads from the layer
  // hook and finishes them later: on a GPU the rows are copied to pinned
  // memory while the later layers compute (ordered after the ops issued so
  // far, which is what "final" means for a layer the hook reports there).
  absl::StatusOr<KvRead> IssueKvRead(const std::string& id, int layer, int64_t first,
                                     int64_t count) const;

  // Runs one scheduling step and the model; returns the outputs of the
  // requests that advanced, finished or now wait for remote KV. Each request
  // has at most one output per step (TakeOutputs()'s included).
  absl::StatusOr<std::vector<RequestOutput>> Step();
  // The outputs produced between steps (remotely sampled first tokens), so
  // that a caller can stream them before the next step's forward pass.
  std::vector<RequestOutput> TakeOutputs();
  bool HasWork() const { return !scheduler_->empty() || !pending_outputs_.empty(); }
  // Whether the last Step() ran the model. A step that ran nothing and
  // returned nothing had no request it could advance (all of them waiting
  // for remote KV, or for blocks): the caller waits for news instead of
  // stepping again at once.
  bool last_step_ran() const { return last_step_ran_; }

  const LlamaConfig& model_config() const { return model_->config(); }
  const LoraSet& lora() const { return *lora_; }
  // The adapters of the running requests and of the waiting ones (each
  // name once, in slot order): vLLM's lora_requests_info.
  void LorasInUse(std::vector<std::string>* running, std::vector<std::string>* waiting) const;
  // Runtime LoRA updating (config.runtime_lora_slots > 0). Puts a prepared
  // adapter (lora().Prepare) into a free slot, or one whose unloaded adapter
  // no request holds any more; returns the slot (LoraSet::Add's errors).
  absl::StatusOr<int> LoadLora(const LoraImage& image);
  // New requests may no longer name `name`; those that do run to their end.
  absl::Status UnloadLora(absl::string_view name);
  ModelRunner& runner() { return *runner_; }
  KvCache& kv_cache() { return *kv_cache_; }
  const KvCache& kv_cache() const { return *kv_cache_; }
  size_t num_running() const { return scheduler_->num_running(); }
  size_t num_waiting() const { return scheduler_->num_waiting(); }
  size_t num_waiting_for_remote_kv() const { return scheduler_->num_waiting_for_remote_kv(); }
  // A full queue under --scheduling-policy=priority (SGLang's
  // --max-queued-requests with priority scheduling): the waiting request, never
  // started, that a new one of `priority` displaces: the one that would be
  // served last, when its priority value is larger. nullptr otherwise.
  const Request* DisplacedBy(int32_t priority) const {
    const Request* last = scheduler_->LastUnstarted();
    return last != nullptr && last->params.priority > priority ? last : nullptr;
  }
  // Requests in each RequestState (finished ones still holding KV included).
  std::array<int, kNumRequestStates> CountStates() const;
  int64_t num_preemptions() const { return scheduler_->num_preemptions(); }
  const PrefixCacheStats& prefix_cache_stats() const { return scheduler_->prefix_cache_stats(); }
  const SpecDecodeStats& spec_decode_stats() const { return spec_stats_; }
  int max_model_len() const { return runner_->max_model_len(); }
  const EngineConfig& config() const { return config_; }
  // Records of the steps since the last call (cleared on read; the most recent
  // kMaxStepRecords at most).
  static constexpr size_t kMaxStepRecords = 4096;
  std::vector<StepRecord> TakeStepRecords();
  // "cpu", or the GPU's index and name for cuda.
  std::string device_name() const { return backend_->device->name(); }
  // The device and ops the engine runs on (benchmarks probe them).
  Backend& backend() { return *backend_; }

 private:
  LlmEngine() = default;
  Request* Find(const std::string& id) const;
  // The request's output among the first `search_end` of `out`, else a new
  // one at the end.
  RequestOutput& OutputFor(const Request* r, std::vector<RequestOutput>* out, size_t search_end);
  // Appends `token` to the request and to its output `o` (the step's one
  // output for it), and decides whether it stops.
  // `logprobs`: the token's, kept in the output when the request asked.
  void AppendToken(Request* r, int32_t token, RequestOutput& o, TokenLogprobs* logprobs = nullptr);
  void Finish(Request* r, FinishReason reason, std::vector<RequestOutput>* out);
  // Speculative decoding: drafts for every decoding request, before the
  // scheduler sizes the step.
  void ProposeDrafts();
  // Verifies a chunk's drafts against its `logits` rows (1 + drafts), appends
  // the kept drafts and the token sampled after them, and rolls the request's
  // computed length back to the last kept one.
  void AcceptTokens(const ScheduledChunk& c, const float* logits, std::vector<RequestOutput>* out,
                    size_t carried);
  // A chunk's prompt logprobs from its `logits` rows (one a token), those
  // not reported yet, into the request's output of the step (after its
  // token's, which it joins).
  void PromptLogprobs(const ScheduledChunk& c, const float* logits,
                      std::vector<RequestOutput>* out);
  // Structured outputs: a token's bytes ("" past the tokenizer's vocabulary),
  // and a copy of a row of logits with what `matcher` rules out at -inf.
  const std::string& TokenBytes(int32_t token) const;
  const float* Masked(const GrammarMatcher& matcher, const float* logits, int vocab);
  // Calls copy(offset, cache_k, cache_v, bytes) for each run of consecutive
  // slots that rows [first, first + count) of `layer` occupy in a request's
  // blocks (at most one block each), `offset` being the run's first byte in
  // the rows: one range check and one slot walk for both directions.
  absl::Status ForEachKvRun(
      const std::string& id, int layer, int64_t first, int64_t count,
      const std::function<absl::Status(size_t offset, char* k, char* v, size_t bytes)>& copy) const;
  // The same runs as a list: K's, then V's (ImportKv's and a GPU's ReadKv's
  // order).
  absl::Status KvRuns(const std::string& id, int layer, int64_t first, int64_t count,
                      std::vector<DeviceRun>* runs) const;

  EngineConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> kv_cache_;
  std::unique_ptr<LoraSet> lora_;  // never null; empty without adapters
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Scheduler> scheduler_;
  Sampler sampler_;
  absl::flat_hash_map<std::string, std::unique_ptr<Request>> requests_;
  bool last_step_ran_ = false;
  // Layers the running step has finished (with Request::step_kv_end).
  int step_layers_done_ = 0;
  bool stepping_ = false;
  LayerHook layer_hook_;
  uint64_t next_arrival_ = 0;
  std::vector<ScheduledSeq> batch_;  // reused per step
  std::vector<StepRecord> records_;
  SpecDecodeStats spec_stats_;
  // Outputs made between steps (a remote request's first token), returned
  // by the next Step().
  std::vector<RequestOutput> pending_outputs_;
  std::vector<uint8_t> allowed_;       // Masked()'s, reused
  std::vector<float> masked_logits_;   // Masked()'s, reused
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_ENGINE_H_
