#include "common/serving/engine_loop.h"

#include "common/base/logging.h"

namespace tandem {

EngineLoop::EngineLoop(EngineConfig config, ReadyCallback on_ready)
    : config_(std::move(config)), on_ready_(std::move(on_ready)) {
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() {
  Stop();
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::Post(Task task) {
  MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void EngineLoop::Stop() {
  MutexLock lock(&mu_);
  stop_ = true;
}

void EngineLoop::SetCallback(const std::string& id, OutputCallback cb) {
  callbacks_[id] = std::move(cb);
}

void EngineLoop::RemoveCallback(const std::string& id) { callbacks_.erase(id); }

void EngineLoop::Deliver(const RequestOutput& o) {
  auto it = callbacks_.find(o.id);
  if (it == callbacks_.end()) return;
  if (!o.finished) {
    it->second(o);
    return;
  }
  OutputCallback cb = std::move(it->second);  // the last call: drop it first
  callbacks_.erase(it);
  cb(o);
}

void EngineLoop::AtNextLayer(const void* key, LayerTask task, bool poll) {
  MutexLock lock(&layer_mu_);
  poll_ = poll_ || poll;
  for (const auto& [k, t] : layer_tasks_) {
    if (k == key) return;
  }
  layer_tasks_.emplace_back(key, std::move(task));
}

bool EngineLoop::RunLayerTasks() {
  std::vector<std::pair<const void*, LayerTask>> due;
  {
    MutexLock lock(&layer_mu_);
    due.swap(layer_tasks_);  // a task that must wait longer registers again
    poll_ = false;
  }
  for (auto& [key, task] : due) task(*engine_);
  MutexLock lock(&layer_mu_);
  return poll_;
}

void EngineLoop::Run() {
  auto engine = LlmEngine::Create(config_);
  if (!engine.ok()) {
    TANDEM_LOG(ERROR) << "engine start-up failed: " << engine.status();
    on_ready_(engine.status(), nullptr);
    return;
  }
  engine_ = std::move(engine).value();
  engine_->SetLayerHook([this](int) { return RunLayerTasks(); });
  ready_ = true;
  on_ready_(absl::OkStatus(), engine_.get());
  std::deque<Task> batch;
  // The last step could advance nothing (every request waits for remote KV
  // or for blocks): only a task can change that, so wait for one rather
  // than spin a core that a prefill worker on the same host could use.
  bool stuck = false;
  while (true) {
    {
      MutexLock lock(&mu_);
      if (!engine_->HasWork() || stuck) {
        // Sleep until a task or stop arrives (bounded, to stay responsive;
        // briefly while a layer task waits for the device's copies).
        bool poll;
        {
          MutexLock layer_lock(&layer_mu_);
          poll = poll_;
        }
        mu_.AwaitWithTimeout(
            [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); },
            poll ? kPollInterval : absl::Milliseconds(50));
      }
      if (stop_) break;
      batch.swap(tasks_);
    }
    for (Task& t : batch) t(*engine_);
    batch.clear();
    RunLayerTasks();  // between steps too: what a step finished, or a request gone
    // A first token that arrived from a prefill worker goes out now, not
    // after the next decode step.
    for (const RequestOutput& o : engine_->TakeOutputs()) Deliver(o);
    if (!engine_->HasWork()) {
      for (auto& observer : observers_) observer(*engine_, {});
      continue;
    }
    auto outputs = engine_->Step();
    if (!outputs.ok()) {
      // A failed step is an engine bug or a device fault: fail every request
      // in flight rather than serve wrong tokens.
      TANDEM_LOG(ERROR) << "engine step failed: " << outputs.status();
      absl::flat_hash_map<std::string, OutputCallback> failed;
      failed.swap(callbacks_);
      for (auto& [id, cb] : failed) {
        (void)engine_->Abort(id);
        RequestOutput o;
        o.id = id;
        o.finished = true;
        o.finish_reason = FinishReason::kError;
        o.status = outputs.status();
        cb(o);
      }
      continue;
    }
    // Observers (the metrics) first: a client that has its tokens finds the
    // step that made them already counted.
    stuck = !engine_->last_step_ran() && outputs->empty();
    for (auto& observer : observers_) observer(*engine_, *outputs);
    for (const RequestOutput& o : *outputs) Deliver(o);
  }
  engine_.reset();
}

}  // namespace tandem
