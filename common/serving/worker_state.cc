#include "common/serving/worker_state.h"

namespace tandem {

grpc::Status WorkerState::Admit() const {
  if (draining.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is shutting down; retry elsewhere");
  }
  if (!ready.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the worker is warming up (loading the model, capturing graphs); retry");
  }
  return grpc::Status::OK;
}

void WorkerState::SetHealthService(grpc::HealthCheckServiceInterface* health) {
  MutexLock lock(&health_mu_);
  health_ = health;
}

void WorkerState::UpdateHealth() {
  MutexLock lock(&health_mu_);
  if (health_ != nullptr) {
    health_->SetServingStatus(ready.load() && !draining.load() && upstream_usable.load());
  }
}

}  // namespace tandem
