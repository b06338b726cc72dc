// WorkerMetrics: every Prometheus family a worker exports, built once here,
// with the prefix tandem_ and the constant label role (prefill|decode).
//
// Graph and cache families are refreshed from the engine after every step
// (on the engine thread, via ObserveEngine); request and transfer families
// are updated by the services from any thread (prometheus-cpp metrics are
// thread-safe).
#ifndef TANDEM_COMMON_SERVING_METRICS_H_
#define TANDEM_COMMON_SERVING_METRICS_H_

#include <array>
#include <atomic>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/engine/engine.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

class WorkerMetrics {
 public:
  explicit WorkerMetrics(const std::string& role);

  const std::string& role() const { return role_; }
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }
  // The registry in Prometheus' text format: what /metrics serves.
  std::string Text() const;

  // Engine-thread refresh: graph counters, steps, replays and ratios, padded
  // tokens, the request-state gauges, prefix-cache counters, KV cache usage.
  void ObserveEngine(LlmEngine& engine);

  // Services.
  void RequestFinished(const std::string& grpc_code_name);
  void PromptTokens(int n);        // prefill role
  void GenerationTokens(int n);    // decode role
  void TimeToFirstToken(double s);
  void InterTokenLatency(double s);
  void EndToEndLatency(double s);
  // A prefill's time from its call to its first token, of which `queued`
  // waiting for the engine to schedule it (prefill role).
  void PrefillSeconds(double total, double queued);
  // One request's KV moved: `bytes`, first KV byte to last (sent or received).
  void KvTransfer(size_t bytes, double seconds);
  // From a Prefill call to its first KV byte: the prefill worker's queue and
  // compute as the decode worker waits for them (decode role).
  void KvTransferWait(double seconds);
  void KvTransferFailure(const std::string& reason);
  // KV a decode worker did not ask for: its prefix cache held it.
  void KvTransferSaved(size_t bytes);
  // A decode worker prefilled a prompt itself: "aggregated", "short_prompt",
  // "prompt_logprobs" or "fallback".
  void PrefillLocal(const std::string& reason);
  // A prompt routed to a prefill endpoint: why ("prefix", "hash", "load",
  // "round_robin"; PrefillPool::RouteInfo) and the prefix tokens the chosen
  // endpoint was last sent.
  void PrefillRoute(const std::string& reason, int64_t matched_tokens);
  // The decode worker's prefill endpoints, and how many are usable now.
  void PrefillEndpoints(int total, int usable);

  // Also exports the gauges the Gateway API Inference Extension's endpoint
  // picker reads from vLLM model servers by default, under vLLM's names
  // (labelled model_name): vllm:num_requests_waiting, vllm:num_requests_running,
  // vllm:kv_cache_usage_perc (0-1) and its older name vllm:gpu_cache_usage_perc,
  // and vllm:cache_config_info{block_size,num_gpu_blocks} = 1. Call before
  // the engine starts.
  void ExportGatewayMetrics(const std::string& model_name);

  // Serves /metrics on `address` (HOST:PORT, port 0 = any). Returns the bound
  // port, or an error naming the address.
  absl::StatusOr<int> Serve(const std::string& address);

 private:
  std::string role_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;

  prometheus::Family<prometheus::Counter>* captured_;
  prometheus::Family<prometheus::Counter>* steps_;
  prometheus::Family<prometheus::Counter>* replays_;
  prometheus::Family<prometheus::Gauge>* ratio_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* transfer_failures_;
  prometheus::Family<prometheus::Counter>* prefill_local_ = nullptr;  // decode role
  prometheus::Family<prometheus::Counter>* prefill_routes_ = nullptr;  // decode role
  prometheus::Counter* prefill_route_matched_ = nullptr;               // decode role
  prometheus::Gauge* capture_seconds_;
  prometheus::Counter* padded_tokens_;
  prometheus::Counter* preemptions_;
  int64_t folded_preemptions_ = 0;  // engine thread only
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* waiting_for_kv_;
  prometheus::Gauge* sending_kv_;
  prometheus::Counter* prefix_queries_;
  prometheus::Counter* prefix_hits_;
  prometheus::Gauge* kv_cached_blocks_;
  prometheus::Counter* transfer_saved_bytes_ = nullptr;  // decode role
  PrefixCacheStats folded_prefix_;  // engine thread only
  // Speculative decoding (vLLM's spec_decode_* counters).
  prometheus::Counter* spec_drafts_;
  prometheus::Counter* spec_draft_tokens_;
  prometheus::Counter* spec_accepted_tokens_;
  prometheus::Family<prometheus::Counter>* spec_accepted_per_pos_;
  SpecDecodeStats folded_spec_;  // engine thread only
  prometheus::Counter* tokens_;  // prompt (prefill) or generation (decode)
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* itl_ = nullptr;
  prometheus::Histogram* e2e_ = nullptr;
  prometheus::Histogram* prefill_ = nullptr;
  prometheus::Histogram* prefill_queue_ = nullptr;
  prometheus::Histogram* prefill_compute_ = nullptr;
  prometheus::Histogram* transfer_wait_ = nullptr;  // decode role
  prometheus::Gauge* prefill_endpoints_ = nullptr;  // decode role
  prometheus::Gauge* prefill_endpoints_usable_ = nullptr;
  prometheus::Gauge* kv_usage_;
  prometheus::Gauge* kv_blocks_;
  // vLLM's names for the gateway (null unless ExportGatewayMetrics).
  std::string gateway_model_;
  prometheus::Gauge* vllm_waiting_ = nullptr;
  prometheus::Gauge* vllm_running_ = nullptr;
  prometheus::Gauge* vllm_kv_usage_ = nullptr;
  prometheus::Gauge* vllm_gpu_cache_usage_ = nullptr;
  // vllm:lora_requests_info: one series, replaced when its labels change.
  prometheus::Family<prometheus::Gauge>* vllm_lora_info_ = nullptr;
  prometheus::Gauge* vllm_lora_series_ = nullptr;
  std::string vllm_lora_labels_;
  bool cache_config_exported_ = false;  // engine thread
  prometheus::Counter* transfer_bytes_;
  prometheus::Histogram* transfer_seconds_;

  // Last runner totals folded into the counters (engine thread only).
  RunnerStats folded_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_METRICS_H_
