// Test harness for integration tests: real worker processes on 127.0.0.1
// with free ports, health polling, /metrics scraping. Every process is
// killed when its Process object goes away.
#ifndef TANDEM_TESTS_INTEGRATION_HARNESS_H_
#define TANDEM_TESTS_INTEGRATION_HARNESS_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/serving/prometheus_scrape.h"
#include "grpcpp/grpcpp.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem::testing {

std::string BinDir();
// A port that was free a moment ago on 127.0.0.1.
int FreePort();

class Process {
 public:
  Process(std::vector<std::string> argv, std::string log_path);
  ~Process();
  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // Waits for exit; returns the exit code, or -1 on timeout / signal death.
  int Wait(std::chrono::milliseconds timeout);
  bool running();
  std::string Log() const;

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  std::optional<int> exit_code_;
};

// Polls the standard health service until SERVING or the timeout.
// `credentials`: null for plaintext.
bool WaitForServing(const std::string& address, std::chrono::milliseconds timeout,
                    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// HTTP GET http://127.0.0.1:port/path; empty on failure.
std::string HttpGet(int port, const std::string& path);

using ::tandem::MetricValue;  // Prometheus text lookup

// One worker process with its addresses.
struct Worker {
  std::unique_ptr<Process> process;
  int grpc_port = 0;
  int metrics_port = 0;
  std::string address() const { return "127.0.0.1:" + std::to_string(grpc_port); }
  std::string Metrics() const { return HttpGet(metrics_port, "/metrics"); }
  double Metric(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
};

// Polls `name` on `w` until it equals `want` or `timeout` passes (gauges are
// refreshed by the engine thread after steps, a little after a stream ends);
// returns the last value read.
double AwaitMetric(const Worker& w, const std::string& name, double want,
                   std::chrono::milliseconds timeout = std::chrono::seconds(5));

// Starts `binary` (prefill_worker or decode_worker) with free ports and
// `flags`; waits until it is SERVING (fails the test otherwise).
// The port after `marker` in a worker's log ("...127.0.0.1:PORT"), or 0.
int PortAfter(const std::string& log, const std::string& marker);

Worker StartWorker(const std::string& binary, const std::vector<std::string>& flags,
                   int grpc_port = 0,
                   std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// A Prefill stub whose transport takes no more than its reader reads (no
// BDP growth of the HTTP/2 window), as a slow client over a real network.
std::unique_ptr<v1::Prefill::Stub> SlowReaderPrefillStub(const std::string& address);

// Expects both workers to hold no KV block within 10 s (freed on their
// engine threads a little after a stream ends).
void ExpectBlocksFreed(const Worker& a, const Worker& b);

// SIGTERM, then expects a clean drain: exit 0 within 20 s (the log otherwise).
void StopWorker(Worker& w);

// A deterministic prompt of `n` token ids below 503 (the synthetic vocabulary).
std::vector<int32_t> TestPrompt(int n, int seed);

struct GenerateResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  std::string text;                   // all messages' text, concatenated
  std::vector<std::string> messages;  // each message's text
  std::string stop_string;
};

v1::GenerateRequest MakeRequest(const std::string& id, const std::vector<int32_t>& prompt,
                                uint32_t max_tokens);
// A Decode stub on a new insecure channel to `address`.
std::unique_ptr<v1::Decode::Stub> DecodeStub(const std::string& address);
using Metadata = std::vector<std::pair<std::string, std::string>>;
GenerateResult Generate(const std::string& address, const v1::GenerateRequest& request,
                        std::chrono::milliseconds deadline = std::chrono::seconds(60),
                        const Metadata& metadata = {});
// The same over an existing stub (its channel's connections are reused).
GenerateResult Generate(v1::Decode::Stub* stub, const v1::GenerateRequest& request,
                        std::chrono::milliseconds deadline = std::chrono::seconds(60),
                        const Metadata& metadata = {});

// A Generate call held open: constructed once its first response has arrived, so the
// server has registered the request (and its id) whatever the machine's load; the
// caller then ends it with Cancel(). For tests of what happens while a request is in
// flight, without guessing how long to sleep.
class HeldStream {
 public:
  HeldStream(const std::string& address, const v1::GenerateRequest& request);
  ~HeldStream();
  HeldStream(const HeldStream&) = delete;
  HeldStream& operator=(const HeldStream&) = delete;

  // Whether the first response arrived (false: the call ended first; Cancel() returns why).
  bool started() const { return started_; }
  // Cancels the call (if not yet ended) and returns its final status.
  grpc::Status Cancel();

 private:
  std::unique_ptr<v1::Decode::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader_;
  bool started_ = false;
  bool finished_ = false;
  grpc::Status status_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_HARNESS_H_
