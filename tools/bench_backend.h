// The servers `tandem bench serve` can load: Tandem's gRPC front door
// (tandem.v1.Decode/Generate), or any OpenAI-compatible HTTP server
// (/v1/completions or /v1/chat/completions, streamed), Tandem's own HTTP API,
// vLLM's or llama.cpp's alike. A backend sends one request on the calling
// thread and times it; Send() is called from many threads at once.
#ifndef TANDEM_TOOLS_BENCH_BACKEND_H_
#define TANDEM_TOOLS_BENCH_BACKEND_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/serving/tls.h"
#include "tools/serve_stats.h"

namespace tandem {

using BenchClock = std::chrono::steady_clock;

// One request of the workload, fixed before the first is sent.
struct Planned {
  std::string klass;
  std::vector<int32_t> ids;  // or
  std::string text;
  int output_len = 0;
  int32_t priority = 0;
  double arrival_s = 0;
  int after = -1;  // the request (a conversation's last turn) this one waits for
};

// What the server says of its model.
struct ServedModel {
  std::string name;
  int vocab_size = 0;     // 0: the server did not say
  int max_model_len = 0;  // 0: the server did not say
};

class BenchBackend {
 public:
  virtual ~BenchBackend() = default;
  // Asks the server for its model (gRPC ModelInfo, or GET /v1/models: its
  // vocab_size, or llama.cpp's meta.n_vocab).
  virtual absl::StatusOr<ServedModel> Model() = 0;
  // Sends `p` and records it; `model` names the model in OpenAI requests.
  virtual RequestRecord Send(const Planned& p, int index, BenchClock::time_point bench_start) = 0;
  // Where requests go, for the report.
  virtual std::string target() const = 0;
  // With several targets, how many requests each was sent ("" otherwise).
  virtual std::string Distribution() const { return ""; }
};

struct BenchBackendOptions {
  std::string backend = "tandem";  // tandem, openai or openai-chat
  // tandem: HOST:PORT, or several, comma-separated (a target with a scheme,
  // ipv4:h1:p1,h2:p2 say, is one gRPC target that gRPC balances)
  std::string address;
  std::string base_url;            // openai*: http://HOST:PORT, or several, comma-separated
  // Several targets: each request to the next in turn (round_robin) or to
  // the one with the fewest requests in flight (least_outstanding), as a
  // client-side stand-in for a gateway in front of several decode workers.
  std::string spread = "round_robin";
  TlsFiles tls;                    // tandem
  double timeout_s = 600;
  bool ignore_eos = true;
  std::string model;               // openai*: the `model` field ("": the server's first)
};

// INVALID_ARGUMENT for an unknown backend or spread; UNAVAILABLE when a
// server cannot be reached.
absl::StatusOr<std::unique_ptr<BenchBackend>> MakeBenchBackend(const BenchBackendOptions& options);

}  // namespace tandem

#endif  // TANDEM_TOOLS_BENCH_BACKEND_H_
