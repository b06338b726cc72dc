// Worker: the process scaffolding both workers share. It starts the gRPC
// server (services, the standard health service, reflection) before the
// engine, reports NOT_SERVING while the engine loads and captures its graphs,
// SERVING after, and NOT_SERVING while draining. SIGTERM/SIGINT drain: stop
// accepting, let in-flight streams finish within the drain deadline (then
// cancel them), stop the engine, exit 0.
#ifndef TANDEM_COMMON_SERVING_WORKER_H_
#define TANDEM_COMMON_SERVING_WORKER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/base/flags.h"
#include "common/serving/engine_flags.h"
#include "common/serving/engine_client.h"
#include "common/serving/metrics.h"
#include "common/serving/tls.h"
#include "common/serving/worker_state.h"
#include "grpcpp/grpcpp.h"

namespace tandem {

// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts
// afterwards. Call first in main(), before anything starts a thread (gRPC
// channels do), so that only RunWorker's sigwait() ever takes them.
void BlockTerminationSignals();

struct WorkerOptions {
  std::string role;  // "prefill" or "decode"
  std::string grpc_address;
  std::string metrics_address;
  int drain_seconds = 30;
  // Connections are closed (GOAWAY; calls in flight finish) after this long,
  // so clients of a DNS name re-resolve it and reach workers added since
  // (Kubernetes scale-up). 0: never.
  int max_connection_age_seconds = 300;
  // Log a table of recent steps (tokens, padded tokens, runtime mode, count)
  // every N seconds, like vLLM's --cudagraph-metrics; 0 = off.
  int cudagraph_metrics_interval = 0;
  TlsFiles tls;  // --tls-cert/--tls-key/--tls-ca of the gRPC server
  // vLLM's --kv-events-config JSON (common/serving/kv_events.h); empty: off.
  std::string kv_events_config;
};

// A second front door beside the gRPC server (the decode worker's HTTP
// API): started once the gRPC server listens, and reaching the services
// through it (an in-process channel), so that every request takes the same
// path; stopped after the gRPC server has drained.
class FrontDoor {
 public:
  virtual ~FrontDoor() = default;
  virtual absl::Status Start(grpc::Server* server) = 0;
  virtual void Stop() = 0;
};

// Registers the flags every worker has (addresses besides gRPC's, draining,
// the step table).
void RegisterWorkerFlags(FlagSet* flags, WorkerOptions* options);

// Parses a worker's command line into `*config`. Returns -1 to go on, or the
// exit code to return from main (0 after --help, 2 with a message on stderr).
int ParseWorkerCommandLine(const std::string& program, FlagSet* flags,
                           const EngineFlags& engine_flags, int argc, char** argv,
                           EngineConfig* config);

// Runs a worker until a signal: `services` are registered on the server; the
// engine loop is handed to `on_engine` (on the loop thread) once graphs are
// captured, just before the worker reports SERVING, as the EngineClient the
// services use from then on. `front_door` (may be null) starts after the
// gRPC server and stops after it. `before_engine_stops` (may be null) runs
// once the server and the front door have stopped, before the engine loop
// does: work the services still have in flight (the decode worker's prefill
// streams) ends there. Returns the exit code.
int RunWorker(const WorkerOptions& options, EngineConfig engine_config, WorkerState* state,
              WorkerMetrics* metrics,
              const std::vector<grpc::Service*>& services,
              const std::function<void(EngineClient*)>& on_engine,
              FrontDoor* front_door = nullptr,
              const std::function<void()>& before_engine_stops = nullptr);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_WORKER_H_
