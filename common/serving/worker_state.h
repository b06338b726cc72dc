// WorkerState: what every service of a worker reads (readiness, draining,
// open streams) and what the health service reports. Thread-safe.
#ifndef TANDEM_COMMON_SERVING_WORKER_STATE_H_
#define TANDEM_COMMON_SERVING_WORKER_STATE_H_

#include <atomic>

#include "absl/base/thread_annotations.h"
#include "common/base/mutex.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

namespace tandem {

struct WorkerState {
  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};
  // False while the worker cannot serve for lack of something outside it
  // (a decode worker with no usable prefill worker and no local fallback).
  std::atomic<bool> upstream_usable{true};
  // Streams admitted and not finished; draining waits for them to end.
  std::atomic<int> open_streams{0};
  // UNAVAILABLE while warming up or draining, else OK.
  grpc::Status Admit() const;
  // The server's health service: set by RunWorker once the server runs, and
  // cleared (null) before the server is destroyed. A service's own thread
  // may still call UpdateHealth then (the decode worker's endpoint watcher
  // stops only with its service): it must not reach a destroyed server.
  void SetHealthService(grpc::HealthCheckServiceInterface* health);
  // Health: SERVING when ready, not draining and upstream_usable.
  void UpdateHealth();

 private:
  Mutex health_mu_;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(health_mu_) = nullptr;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_WORKER_STATE_H_
