#include "common/serving/worker.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <map>
#include <thread>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

#include "common/base/logging.h"
#include "common/serving/kv_events.h"
#include "common/serving/kv_transfer.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace tandem {

void BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

void RegisterWorkerFlags(FlagSet* flags, WorkerOptions* options) {
  flags->Add("grpc-address", &options->grpc_address, "HOST:PORT to serve gRPC on (port 0: any)");
  flags->Add("metrics-address", &options->metrics_address,
             "HOST:PORT of the Prometheus /metrics endpoint (port 0: any)");
  flags->Add("drain-seconds", &options->drain_seconds,
             "grace period for in-flight streams on SIGTERM");
  flags->Add("max-connection-age-seconds", &options->max_connection_age_seconds,
             "close each client connection after this long (calls in flight finish), so "
             "clients re-resolve DNS and spread over replicas added since (0 = never)");
  flags->Add("cudagraph-metrics-interval", &options->cudagraph_metrics_interval,
             "log a table of recent steps every N seconds (0 = off)");
  flags->Add("kv-events-config", &options->kv_events_config,
             "vLLM's KV events JSON, e.g. '{\"enable_kv_cache_events\": true, \"publisher\": "
             "\"zmq\", \"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": "
             "\"tcp://*:5558\"}': publish which prefix blocks this worker caches");
  options->tls.Register(flags, "", /*server=*/true);
}

int ParseWorkerCommandLine(const std::string& program, FlagSet* flags,
                           const EngineFlags& engine_flags, int argc, char** argv,
                           EngineConfig* config) {
  auto positional = flags->Parse(argc, argv);
  if (!positional.ok()) {
    std::cerr << program << ": " << positional.status().message() << std::endl;
    return 2;
  }
  if (flags->help_requested()) {
    std::cout << flags->Usage();
    return 0;
  }
  if (!positional->empty()) {
    std::cerr << program << ": unexpected argument '" << positional->front() << "'" << std::endl;
    return 2;
  }
  auto parsed = engine_flags.ToConfig(*flags);
  if (!parsed.ok()) {
    std::cerr << program << ": " << parsed.status().message() << std::endl;
    return 2;
  }
  *config = *std::move(parsed);
  return -1;
}

namespace {

// Logs the steps since the last call grouped by (tokens, padded, mode).
void LogStepTable(const std::string& role, const std::vector<StepRecord>& records) {
  if (records.empty()) return;
  std::map<std::tuple<int, int, std::string>, int> counts;
  for (const StepRecord& r : records) {
    ++counts[{r.num_tokens, r.num_tokens + r.padded_tokens, std::string(r.runtime_mode.name())}];
  }
  std::string table = absl::StrCat(role, " steps since last report:\n",
                                   "  unpadded  padded  runtime_mode  count\n");
  for (const auto& [key, n] : counts) {
    absl::StrAppend(&table, absl::StrFormat("  %8d  %6d  %-12s  %5d\n", std::get<0>(key),
                                            std::get<1>(key), std::get<2>(key), n));
  }
  TANDEM_LOG(INFO) << table;
}

}  // namespace

int RunWorker(const WorkerOptions& options, EngineConfig engine_config, WorkerState* state,
              WorkerMetrics* metrics,
              const std::vector<grpc::Service*>& services,
              const std::function<void(EngineClient*)>& on_engine, FrontDoor* front_door,
              const std::function<void()>& before_engine_stops) {
  // Signals are taken by sigwait() below; block them in every thread (main()
  // did so before any thread started; this covers callers that did not).
  BlockTerminationSignals();
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  const pthread_t main_thread = pthread_self();
  if (!KeepKvBuffersInHeap()) {
    TANDEM_LOG(INFO) << options.role << " worker: the allocator's thresholds are its own "
                        "(not glibc's malloc): KV stream buffers may be mapped per chunk";
  }

  if (options.max_connection_age_seconds < 0 || options.drain_seconds < 0) {
    TANDEM_LOG(ERROR) << options.role << " worker: --max-connection-age-seconds="
                      << options.max_connection_age_seconds << " and --drain-seconds="
                      << options.drain_seconds << " must be >= 0";
    return 2;
  }
  std::unique_ptr<KvEventPublisher> kv_events;
  if (!options.kv_events_config.empty()) {
    auto config = ParseKvEventsConfig(options.kv_events_config);
    if (!config.ok()) {
      TANDEM_LOG(ERROR) << options.role << " worker: " << config.status().message();
      return 2;
    }
    if (config->publishes()) {
      auto publisher = KvEventPublisher::Start(*config, metrics->registry().get(), options.role);
      if (!publisher.ok()) {
        TANDEM_LOG(ERROR) << options.role << " worker: " << publisher.status().message();
        return 1;
      }
      kv_events = *std::move(publisher);
      TANDEM_LOG(INFO) << options.role << " worker: KV events on " << kv_events->endpoint()
                       << (kv_events->replay_endpoint().empty()
                               ? std::string(" (no replay)")
                               : " (replay on " + kv_events->replay_endpoint() + ")");
    }
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto credentials = ServerCredentials(options.tls);
  if (!credentials.ok()) {
    TANDEM_LOG(ERROR) << options.role << " worker: " << credentials.status().message();
    return 1;
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.grpc_address, *credentials, &port);
  // gRPC sets SO_REUSEPORT by default: a second worker on a busy port would
  // bind too and split the connections. A busy port must fail start-up.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxSendMessageSize(8 << 20);
  // Keepalive: a peer that stops answering (frozen, its host gone) has its
  // connection closed, and its calls cancelled, within ~15 s; clients (the
  // decode worker's prefill channels ping every 2 s) may ping once a second,
  // with or without calls in flight.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // gRPC's DNS resolver looks a name up again only when a connection drops:
  // without an age limit a client keeps the replicas it saw first. The grace
  // period is unbounded: a stream in flight (a long generation, a KV
  // transfer) always finishes on its old connection.
  if (options.max_connection_age_seconds > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               options.max_connection_age_seconds * 1000);
  }
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    TANDEM_LOG(ERROR) << options.role << " worker: cannot listen on --grpc-address="
                      << options.grpc_address << " (the port is in use, or the address is not "
                      << "one of this host's)";
    return 1;
  }
  state->SetHealthService(server->GetHealthCheckService());
  // Before `server` is destroyed, on every way out: a service's thread may
  // still update the health then.
  absl::Cleanup forget_health = [state] { state->SetHealthService(nullptr); };
  state->UpdateHealth();
  const std::string host = options.grpc_address.substr(0, options.grpc_address.rfind(':'));
  TANDEM_LOG(INFO) << options.role << " worker: gRPC listening on " << host << ":" << port
                   << (options.tls.cert.empty() ? "" : options.tls.ca.empty() ? " (TLS)" : " (mTLS)")
                   << " (NOT_SERVING until graphs are captured)";

  auto metrics_port = metrics->Serve(options.metrics_address);
  if (!metrics_port.ok()) {
    TANDEM_LOG(ERROR) << options.role << " worker: " << metrics_port.status().message();
    server->Shutdown();
    return 1;
  }
  const std::string metrics_host =
      options.metrics_address.substr(0, options.metrics_address.rfind(':'));
  TANDEM_LOG(INFO) << options.role << " worker: metrics on http://" << metrics_host << ":"
                   << *metrics_port << "/metrics";

  if (front_door != nullptr) {
    if (absl::Status s = front_door->Start(server.get()); !s.ok()) {
      TANDEM_LOG(ERROR) << options.role << " worker: " << s.message();
      server->Shutdown();
      return 1;
    }
  }

  std::atomic<bool> failed{false};
  absl::Time last_table = absl::Now();
  std::unique_ptr<EngineClient> client;
  EngineLoop loop(std::move(engine_config), [&](const absl::Status& s, LlmEngine* engine) {
    if (s.ok()) {
      metrics->ObserveEngine(*engine);  // capture counts are visible once SERVING
      if (kv_events != nullptr) engine->kv_cache().pool().RecordEvents(true);
      loop.AddStepObserver([&, metrics](LlmEngine& engine, const std::vector<RequestOutput>&) {
        metrics->ObserveEngine(engine);
        if (kv_events != nullptr) {
          kv_events->Publish(engine.kv_cache().pool().TakeEvents(), engine.kv_cache().block_size());
        }
        if (options.cudagraph_metrics_interval > 0 &&
            absl::Now() - last_table >= absl::Seconds(options.cudagraph_metrics_interval)) {
          last_table = absl::Now();
          LogStepTable(options.role, engine.TakeStepRecords());
        }
      });
      client = std::make_unique<EngineClient>(&loop);
      on_engine(client.get());
      state->ready = true;
      state->UpdateHealth();
      TANDEM_LOG(INFO) << options.role << " worker: SERVING";
    } else {
      failed = true;
      // Wake sigwait() in the main thread only: a signal sent to the process
      // could land in a thread that never blocked it and kill us with 143.
      pthread_kill(main_thread, SIGTERM);
    }
  });

  int sig = 0;
  sigwait(&signals, &sig);
  if (failed) {
    server->Shutdown();
    if (front_door != nullptr) front_door->Stop();
    return 1;
  }
  TANDEM_LOG(INFO) << options.role << " worker: signal " << sig << ", draining (up to "
                   << options.drain_seconds << " s)";
  // Report NOT_SERVING and refuse new streams first, while the server still
  // answers health checks; stop accepting only when the open streams are done
  // or the drain deadline comes (then gRPC cancels what is left).
  state->draining = true;
  state->UpdateHealth();
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::seconds(options.drain_seconds);
  while (state->open_streams.load() > 0 && std::chrono::system_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  server->Shutdown(deadline);
  if (front_door != nullptr) front_door->Stop();
  if (before_engine_stops) before_engine_stops();
  loop.Stop();
  TANDEM_LOG(INFO) << options.role << " worker: stopped";
  return 0;
}

}  // namespace tandem
