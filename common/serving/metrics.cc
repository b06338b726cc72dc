#include "common/serving/metrics.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "prometheus/text_serializer.h"

namespace tandem {
namespace {

std::string Name(CudaGraphMode m) { return std::string(m.name()); }

// 1 ms to 10 min, roughly x2.5 per bucket: past the longest default budget
// (a prefill's: 60 s + 10 ms per token, 142 s at 8,192 tokens).
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
          2.5,   5,      10,    20,   40,    60,   120, 300, 600};
}

}  // namespace

WorkerMetrics::WorkerMetrics(const std::string& role)
    : role_(role), registry_(std::make_shared<prometheus::Registry>()) {
  const prometheus::Labels role_label = {{"role", role}};
  auto& r = *registry_;
  captured_ = &prometheus::BuildCounter()
                   .Name("tandem_cudagraph_captured_total")
                   .Help("Graphs captured at start-up, by mode (PIECEWISE counts every piece)")
                   .Labels(role_label)
                   .Register(r);
  capture_seconds_ = &prometheus::BuildGauge()
                          .Name("tandem_cudagraph_capture_seconds")
                          .Help("Time spent capturing graphs at start-up")
                          .Labels(role_label)
                          .Register(r)
                          .Add({});
  steps_ = &prometheus::BuildCounter()
                .Name("tandem_forward_steps_total")
                .Help("Forward steps by dispatched runtime mode")
                .Labels(role_label)
                .Register(r);
  replays_ = &prometheus::BuildCounter()
                  .Name("tandem_cudagraph_replays_total")
                  .Help("Steps served by replaying graphs of that mode")
                  .Labels(role_label)
                  .Register(r);
  ratio_ = &prometheus::BuildGauge()
                .Name("tandem_cudagraph_replay_ratio")
                .Help("Steps served by that mode's graphs / all steps")
                .Labels(role_label)
                .Register(r);
  for (const char* m : {"FULL", "PIECEWISE"}) {
    captured_->Add({{"mode", m}});
    replays_->Add({{"mode", m}});
    ratio_->Add({{"mode", m}});
  }
  for (CudaGraphMode m : PerMode<int>::kModes) steps_->Add({{"runtime_mode", Name(m)}});
  padded_tokens_ = &prometheus::BuildCounter()
                        .Name("tandem_cudagraph_padded_tokens_total")
                        .Help("Tokens added by padding batches to a capture size")
                        .Labels(role_label)
                        .Register(r)
                        .Add({});
  requests_ = &prometheus::BuildCounter()
                   .Name("tandem_requests_total")
                   .Help("Finished requests by gRPC status")
                   .Labels(role_label)
                   .Register(r);
  requests_->Add({{"status", "OK"}});
  running_ = &prometheus::BuildGauge()
                  .Name("tandem_requests_running")
                  .Help("Requests in the running batch")
                  .Labels(role_label)
                  .Register(r)
                  .Add({});
  waiting_ = &prometheus::BuildGauge()
                  .Name("tandem_requests_waiting")
                  .Help("Requests waiting for the running batch or for KV blocks")
                  .Labels(role_label)
                  .Register(r)
                  .Add({});
  preemptions_ = &prometheus::BuildCounter()
                      .Name("tandem_preemptions_total")
                      .Help("Requests preempted for lack of KV blocks (recomputed, never failed)")
                      .Labels(role_label)
                      .Register(r)
                      .Add({});
  waiting_for_kv_ = &prometheus::BuildGauge()
                         .Name("tandem_requests_waiting_for_kv")
                         .Help("Requests whose prompt KV is being transferred from a prefill "
                               "worker (decode)")
                         .Labels(role_label)
                         .Register(r)
                         .Add({});
  sending_kv_ = &prometheus::BuildGauge()
                     .Name("tandem_requests_sending_kv")
                     .Help("Prefilled requests whose KV is being streamed out, holding their "
                           "blocks (prefill)")
                     .Labels(role_label)
                     .Register(r)
                     .Add({});
  prefix_queries_ = &prometheus::BuildCounter()
                         .Name("tandem_prefix_cache_queries_total")
                         .Help("Tokens looked up in the prefix cache (each admitted request's)")
                         .Labels(role_label)
                         .Register(r)
                         .Add({});
  prefix_hits_ = &prometheus::BuildCounter()
                      .Name("tandem_prefix_cache_hits_total")
                      .Help("Tokens whose KV the prefix cache held (not computed again)")
                      .Labels(role_label)
                      .Register(r)
                      .Add({});
  spec_drafts_ = &prometheus::BuildCounter()
                      .Name("tandem_spec_decode_num_drafts_total")
                      .Help("Verification steps of a request that carried drafted tokens "
                            "(speculative decoding)")
                      .Labels(role_label)
                      .Register(r)
                      .Add({});
  spec_draft_tokens_ = &prometheus::BuildCounter()
                            .Name("tandem_spec_decode_num_draft_tokens_total")
                            .Help("Drafted tokens verified")
                            .Labels(role_label)
                            .Register(r)
                            .Add({});
  spec_accepted_tokens_ = &prometheus::BuildCounter()
                               .Name("tandem_spec_decode_num_accepted_tokens_total")
                               .Help("Drafted tokens accepted (each one a token gained)")
                               .Labels(role_label)
                               .Register(r)
                               .Add({});
  spec_accepted_per_pos_ = &prometheus::BuildCounter()
                                .Name("tandem_spec_decode_num_accepted_tokens_per_pos_total")
                                .Help("Drafts whose token at `position` (0-based) was accepted")
                                .Labels(role_label)
                                .Register(r);
  kv_cached_blocks_ = &prometheus::BuildGauge()
                           .Name("tandem_kv_cache_blocks_cached")
                           .Help("KV cache blocks registered for prefix reuse (in use or free)")
                           .Labels(role_label)
                           .Register(r)
                           .Add({});
  if (role == "prefill") {
    tokens_ = &prometheus::BuildCounter()
                   .Name("tandem_prompt_tokens_total")
                   .Help("Prompt tokens prefilled")
                   .Labels(role_label)
                   .Register(r)
                   .Add({});
    prefill_ = &prometheus::BuildHistogram()
                    .Name("tandem_prefill_seconds")
                    .Help("Time from a Prefill call to its first token (queue and compute)")
                    .Labels(role_label)
                    .Register(r)
                    .Add({}, LatencyBuckets());
    prefill_queue_ = &prometheus::BuildHistogram()
                          .Name("tandem_prefill_queue_seconds")
                          .Help("Time a Prefill call waited for the engine to schedule it")
                          .Labels(role_label)
                          .Register(r)
                          .Add({}, LatencyBuckets());
    prefill_compute_ = &prometheus::BuildHistogram()
                            .Name("tandem_prefill_compute_seconds")
                            .Help("Time from a prompt's first scheduled step to its first token")
                            .Labels(role_label)
                            .Register(r)
                            .Add({}, LatencyBuckets());
  } else {
    tokens_ = &prometheus::BuildCounter()
                   .Name("tandem_generation_tokens_total")
                   .Help("Tokens generated")
                   .Labels(role_label)
                   .Register(r)
                   .Add({});
    ttft_ = &prometheus::BuildHistogram()
                 .Name("tandem_time_to_first_token_seconds")
                 .Help("Time from Generate to the first token")
                 .Labels(role_label)
                 .Register(r)
                 .Add({}, LatencyBuckets());
    itl_ = &prometheus::BuildHistogram()
                .Name("tandem_inter_token_latency_seconds")
                .Help("Time between consecutive tokens of a stream")
                .Labels(role_label)
                .Register(r)
                .Add({}, LatencyBuckets());
    transfer_saved_bytes_ =
        &prometheus::BuildCounter()
             .Name("tandem_kv_transfer_saved_bytes_total")
             .Help("KV bytes not transferred because this worker's prefix cache held them")
             .Labels(role_label)
             .Register(r)
             .Add({});
    prefill_local_ = &prometheus::BuildCounter()
                          .Name("tandem_prefill_local_total")
                          .Help("Prompts the decode worker prefilled itself, by reason "
                                "(aggregated, short_prompt, prompt_logprobs, fallback)")
                          .Labels(role_label)
                          .Register(r);
    for (const char* reason : {"aggregated", "short_prompt", "prompt_logprobs", "fallback"}) {
      prefill_local_->Add({{"reason", reason}});
    }
    prefill_routes_ = &prometheus::BuildCounter()
                           .Name("tandem_prefill_routes_total")
                           .Help("Prompts sent to a prefill worker, by why that one (prefix: it "
                                 "was sent the longest prefix; hash: no worker was, rendezvous "
                                 "hashing chose; load: the best was past its load bound; "
                                 "round_robin)")
                           .Labels(role_label)
                           .Register(r);
    for (const char* reason : {"prefix", "hash", "load", "round_robin"}) {
      prefill_routes_->Add({{"reason", reason}});
    }
    prefill_route_matched_ = &prometheus::BuildCounter()
                                  .Name("tandem_prefill_route_matched_tokens_total")
                                  .Help("Prompt tokens of a prefix the chosen prefill worker "
                                        "was sent before (what its cache may hold)")
                                  .Labels(role_label)
                                  .Register(r)
                                  .Add({});
    transfer_wait_ = &prometheus::BuildHistogram()
                          .Name("tandem_kv_transfer_wait_seconds")
                          .Help("Time from a Prefill call to its first KV byte (the prefill "
                                "worker's queue and compute)")
                          .Labels(role_label)
                          .Register(r)
                          .Add({}, LatencyBuckets());
    prefill_endpoints_ = &prometheus::BuildGauge()
                              .Name("tandem_prefill_endpoints")
                              .Help("Prefill endpoints named by --prefill-address")
                              .Labels(role_label)
                              .Register(r)
                              .Add({});
    prefill_endpoints_usable_ =
        &prometheus::BuildGauge()
             .Name("tandem_prefill_endpoints_usable")
             .Help("Prefill endpoints usable now: connected or connectable, not set aside "
                   "after a stalled call")
             .Labels(role_label)
             .Register(r)
             .Add({});
    e2e_ = &prometheus::BuildHistogram()
                .Name("tandem_e2e_request_latency_seconds")
                .Help("Time from Generate to the last token")
                .Labels(role_label)
                .Register(r)
                .Add({}, LatencyBuckets());
  }
  kv_usage_ = &prometheus::BuildGauge()
                   .Name("tandem_kv_cache_usage_ratio")
                   .Help("KV cache blocks in use / all blocks")
                   .Labels(role_label)
                   .Register(r)
                   .Add({});
  kv_blocks_ = &prometheus::BuildGauge()
                    .Name("tandem_kv_cache_blocks_in_use")
                    .Help("KV cache blocks in use")
                    .Labels(role_label)
                    .Register(r)
                    .Add({});
  transfer_bytes_ = &prometheus::BuildCounter()
                         .Name("tandem_kv_transfer_bytes_total")
                         .Help("KV bytes transferred (sent by prefill, received by decode)")
                         .Labels(role_label)
                         .Register(r)
                         .Add({});
  transfer_seconds_ = &prometheus::BuildHistogram()
                           .Name("tandem_kv_transfer_seconds")
                           .Help("One request's KV transfer, first KV byte to last (sent by "
                                 "prefill, received by decode)")
                           .Labels(role_label)
                           .Register(r)
                           .Add({}, LatencyBuckets());
  transfer_failures_ = &prometheus::BuildCounter()
                            .Name("tandem_kv_transfer_failures_total")
                            .Help("Failed KV transfers by reason")
                            .Labels(role_label)
                            .Register(r);
  // decode: unavailable, stalled (no first message), deadline (over budget),
  // data_loss (CRC), incomplete (rows missing or repeated), fingerprint_mismatch;
  // prefill: expired (lease), cancelled (the reader went away); both: other.
  for (const char* reason : {"unavailable", "stalled", "deadline", "data_loss", "incomplete",
                             "fingerprint_mismatch", "expired", "cancelled", "other"}) {
    transfer_failures_->Add({{"reason", reason}});
  }
}

void WorkerMetrics::ObserveEngine(LlmEngine& engine) {
  const RunnerStats& s = engine.runner().stats();
  int64_t total = 0;
  for (CudaGraphMode m : PerMode<int>::kModes) {
    steps_->Add({{"runtime_mode", Name(m)}}).Increment(s.steps[m] - folded_.steps[m]);
    total += s.steps[m];
  }
  padded_tokens_->Increment(static_cast<double>(s.padded_tokens - folded_.padded_tokens));
  for (CudaGraphMode m : {CudaGraphMode::kPiecewise, CudaGraphMode::kFull}) {
    captured_->Add({{"mode", Name(m)}}).Increment(s.captured[m] - folded_.captured[m]);
    replays_->Add({{"mode", Name(m)}}).Increment(s.replays[m] - folded_.replays[m]);
    ratio_->Add({{"mode", Name(m)}})
        .Set(total == 0 ? 0.0 : static_cast<double>(s.replays[m]) / total);
  }
  capture_seconds_->Set(s.capture_seconds);
  folded_ = s;
  preemptions_->Increment(static_cast<double>(engine.num_preemptions() - folded_preemptions_));
  folded_preemptions_ = engine.num_preemptions();
  // Every request the engine holds is in exactly one state, so in exactly
  // one of these gauges.
  const std::array<int, kNumRequestStates> n = engine.CountStates();
  auto count = [&](RequestState state) { return n[static_cast<int>(state)]; };
  running_->Set(count(RequestState::kRunning));
  waiting_->Set(count(RequestState::kWaiting) + count(RequestState::kPreempted));
  waiting_for_kv_->Set(count(RequestState::kWaitingForRemoteKv));
  int finished = 0;
  for (int i = static_cast<int>(RequestState::kFinishedStopped); i < kNumRequestStates; ++i) {
    finished += n[i];
  }
  sending_kv_->Set(finished);
  const PrefixCacheStats& p = engine.prefix_cache_stats();
  prefix_queries_->Increment(static_cast<double>(p.queries - folded_prefix_.queries));
  prefix_hits_->Increment(static_cast<double>(p.hits - folded_prefix_.hits));
  folded_prefix_ = p;
  const SpecDecodeStats& sd = engine.spec_decode_stats();
  spec_drafts_->Increment(static_cast<double>(sd.num_drafts - folded_spec_.num_drafts));
  spec_draft_tokens_->Increment(
      static_cast<double>(sd.num_draft_tokens - folded_spec_.num_draft_tokens));
  spec_accepted_tokens_->Increment(
      static_cast<double>(sd.num_accepted_tokens - folded_spec_.num_accepted_tokens));
  folded_spec_.accepted_per_pos.resize(sd.accepted_per_pos.size());
  for (size_t i = 0; i < sd.accepted_per_pos.size(); ++i) {
    spec_accepted_per_pos_->Add({{"position", std::to_string(i)}})
        .Increment(static_cast<double>(sd.accepted_per_pos[i] - folded_spec_.accepted_per_pos[i]));
  }
  folded_spec_ = sd;
  const BlockPool& pool = engine.kv_cache().pool();
  kv_usage_->Set(pool.usage());
  kv_blocks_->Set(pool.num_used());
  kv_cached_blocks_->Set(pool.num_cached());
  if (vllm_waiting_ != nullptr) {
    vllm_waiting_->Set(count(RequestState::kWaiting) + count(RequestState::kPreempted) +
                       count(RequestState::kWaitingForRemoteKv));
    vllm_running_->Set(count(RequestState::kRunning));
    vllm_kv_usage_->Set(pool.usage());
    vllm_gpu_cache_usage_->Set(pool.usage());
    if (engine.lora().capacity() > 0) {
      // The inference gateway's LoRA affinity reads the adapters each server
      // runs and queues; the series' value is when it was set (vLLM's).
      std::vector<std::string> running, waiting;
      engine.LorasInUse(&running, &waiting);
      const std::string r = absl::StrJoin(running, ","), w = absl::StrJoin(waiting, ",");
      const std::string labels = absl::StrCat(r, "|", w);
      if (vllm_lora_series_ == nullptr || labels != vllm_lora_labels_) {
        if (vllm_lora_info_ == nullptr) {
          vllm_lora_info_ = &prometheus::BuildGauge()
                                 .Name("vllm:lora_requests_info")
                                 .Help("LoRA adapters of the running and waiting requests, for "
                                       "the inference gateway (vLLM's name; value: when set)")
                                 .Register(*registry_);
        }
        if (vllm_lora_series_ != nullptr) vllm_lora_info_->Remove(vllm_lora_series_);
        vllm_lora_series_ = &vllm_lora_info_->Add(
            {{"max_lora", std::to_string(engine.lora().capacity())},
             {"running_lora_adapters", r},
             {"waiting_lora_adapters", w}});
        vllm_lora_labels_ = labels;
      }
      vllm_lora_series_->SetToCurrentTime();
    }
    if (!cache_config_exported_) {
      cache_config_exported_ = true;
      prometheus::BuildGauge()
          .Name("vllm:cache_config_info")
          .Help("The KV cache's configuration, for the inference gateway (vLLM's name)")
          .Register(*registry_)
          .Add({{"model_name", gateway_model_},
                {"block_size", std::to_string(engine.kv_cache().block_size())},
                {"num_gpu_blocks", std::to_string(pool.num_blocks())}})
          .Set(1);
    }
  }
}

void WorkerMetrics::ExportGatewayMetrics(const std::string& model_name) {
  gateway_model_ = model_name;
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add(
        {{"model_name", model_name}});
  };
  vllm_waiting_ = gauge("vllm:num_requests_waiting",
                        "Requests waiting to be scheduled, for the inference gateway (vLLM's "
                        "name; tandem_requests_waiting plus those awaiting remote KV)");
  vllm_running_ = gauge("vllm:num_requests_running",
                        "Requests in the running batch, for the inference gateway (vLLM's name)");
  vllm_kv_usage_ = gauge("vllm:kv_cache_usage_perc",
                         "KV cache usage, 1 = full, for the inference gateway (vLLM's name)");
  vllm_gpu_cache_usage_ = gauge("vllm:gpu_cache_usage_perc",
                                "KV cache usage, 1 = full (vLLM's older name)");
}

void WorkerMetrics::RequestFinished(const std::string& code) {
  requests_->Add({{"status", code}}).Increment();
}
void WorkerMetrics::PromptTokens(int n) { tokens_->Increment(n); }
void WorkerMetrics::GenerationTokens(int n) { tokens_->Increment(n); }
void WorkerMetrics::TimeToFirstToken(double s) {
  if (ttft_) ttft_->Observe(s);
}
void WorkerMetrics::InterTokenLatency(double s) {
  if (itl_) itl_->Observe(s);
}
void WorkerMetrics::EndToEndLatency(double s) {
  if (e2e_) e2e_->Observe(s);
}
void WorkerMetrics::PrefillSeconds(double total, double queued) {
  if (prefill_ == nullptr) return;
  prefill_->Observe(total);
  prefill_queue_->Observe(queued);
  prefill_compute_->Observe(total - queued);
}
void WorkerMetrics::KvTransferWait(double s) {
  if (transfer_wait_) transfer_wait_->Observe(s);
}
void WorkerMetrics::PrefillEndpoints(int total, int usable) {
  if (prefill_endpoints_ == nullptr) return;
  prefill_endpoints_->Set(total);
  prefill_endpoints_usable_->Set(usable);
}
void WorkerMetrics::KvTransfer(size_t bytes, double seconds) {
  transfer_bytes_->Increment(static_cast<double>(bytes));
  transfer_seconds_->Observe(seconds);
}
void WorkerMetrics::KvTransferSaved(size_t bytes) {
  if (transfer_saved_bytes_) transfer_saved_bytes_->Increment(static_cast<double>(bytes));
}
void WorkerMetrics::KvTransferFailure(const std::string& reason) {
  transfer_failures_->Add({{"reason", reason}}).Increment();
}

void WorkerMetrics::PrefillRoute(const std::string& reason, int64_t matched_tokens) {
  if (prefill_routes_ == nullptr) return;
  prefill_routes_->Add({{"reason", reason}}).Increment();
  prefill_route_matched_->Increment(static_cast<double>(matched_tokens));
}

void WorkerMetrics::PrefillLocal(const std::string& reason) {
  if (prefill_local_) prefill_local_->Add({{"reason", reason}}).Increment();
}

absl::StatusOr<int> WorkerMetrics::Serve(const std::string& address) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ",
                                               address, ": ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

std::string WorkerMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace tandem
