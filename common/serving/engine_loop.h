// EngineLoop: the one thread that owns an LlmEngine.
//
// RPC threads never touch the engine: services go through an EngineClient,
// which Post()s closures that the loop runs in order between steps and
// registers per-request output callbacks, which the loop calls (on its
// thread) with every RequestOutput. While the
// engine has work the loop steps it; otherwise it sleeps until a Post().
//
// Start-up work (model load, graph capture) runs on the loop thread too, so a
// worker can serve health checks while it warms up.
//
// Thread-safe: Post(), Stop() and the accessors may be called from any thread.
#ifndef TANDEM_COMMON_SERVING_ENGINE_LOOP_H_
#define TANDEM_COMMON_SERVING_ENGINE_LOOP_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "common/base/mutex.h"
#include "common/engine/engine.h"

namespace tandem {

class EngineLoop {
 public:
  using Task = std::function<void(LlmEngine&)>;
  using OutputCallback = std::function<void(const RequestOutput&)>;
  // Called on the loop thread after every step (metrics).
  using StepObserver = std::function<void(LlmEngine&, const std::vector<RequestOutput>&)>;

  // Creates the engine on the loop thread; `on_ready` is called there with
  // the result (OK once graphs are captured) and the engine (null on error).
  using ReadyCallback = std::function<void(const absl::Status&, LlmEngine*)>;
  EngineLoop(EngineConfig config, ReadyCallback on_ready);
  ~EngineLoop();  // Stop()s and joins.

  // Runs `task` on the loop thread. Tasks posted before the engine is ready
  // wait for it; if creation failed they are dropped.
  void Post(Task task);
  // Registers the callback for request `id` (on the loop thread: call from a
  // Post()ed task). The callback is removed after the finished output.
  void SetCallback(const std::string& id, OutputCallback cb);
  void RemoveCallback(const std::string& id);
  // Passes `o` to its request's callback, dropping the callback after a
  // finished output (on the loop thread).
  void Deliver(const RequestOutput& o);
  // Adds an observer (call on the loop thread, e.g. from on_ready). Observers
  // also run every ~50 ms while the engine is idle.
  void AddStepObserver(StepObserver observer) { observers_.push_back(std::move(observer)); }
  // Runs `task` on the loop thread after the next layer that a step
  // finishes (LlmEngine::SetLayerHook), inside that step, or at the loop's
  // next turn if sooner: work waiting for KV rows to become final (export).
  // Inside a step it may only read the engine (KvReadyTokens, ReadKv) and
  // post; it must not add, abort or step. One pending task per `key` (a
  // second one before it ran is dropped). Does not wake an idle loop (Post
  // does). With `poll` (a task waiting for the device's copies, not for a
  // step) an idle loop comes back every kPollInterval instead of sleeping.
  using LayerTask = std::function<void(const LlmEngine&)>;
  void AtNextLayer(const void* key, LayerTask task, bool poll = false);
  static constexpr absl::Duration kPollInterval = absl::Microseconds(50);
  // Stops after the current step; pending tasks are dropped.
  void Stop();
  bool ready() const { return ready_.load(); }
  // The engine's immutable start-up facts, valid once ready(): the model's
  // config and the KV fingerprint peers must match.
  const LlamaConfig& model_config() const { return engine_->model_config(); }
  const KvCache& kv_cache() const { return engine_->kv_cache(); }
  const LoraSet& lora() const { return engine_->lora(); }
  int max_model_len() const { return engine_->max_model_len(); }
  int max_num_batched_tokens() const { return config_.runner.max_num_batched_tokens; }
  bool kv_final_per_layer() const { return engine_->kv_final_per_layer(); }

 private:
  void Run();
  // Runs the layer tasks due; returns whether one registered again to poll.
  bool RunLayerTasks();

  EngineConfig config_;
  ReadyCallback on_ready_;
  std::unique_ptr<LlmEngine> engine_;
  absl::flat_hash_map<std::string, OutputCallback> callbacks_;  // loop thread only
  std::vector<StepObserver> observers_;  // loop thread only
  Mutex layer_mu_;
  std::vector<std::pair<const void*, LayerTask>> layer_tasks_ ABSL_GUARDED_BY(layer_mu_);
  bool poll_ ABSL_GUARDED_BY(layer_mu_) = false;  // a task in layer_tasks_ polls
  Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> ready_{false};
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_ENGINE_LOOP_H_
