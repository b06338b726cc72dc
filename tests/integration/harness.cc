#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace tandem::testing {

// TANDEM_BIN_DIR in the environment points the tests at executables moved
// away from the build tree (benchmarks/gpu/run.sh on a GPU host).
std::string BinDir() {
  const char* env = std::getenv("TANDEM_BIN_DIR");
  return env != nullptr && *env != '\0' ? env : TANDEM_BIN_DIR;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

Process::Process(std::vector<std::string> argv, std::string log_path) : log_path_(std::move(log_path)) {
  // Truncated here, before the child exists: a stale log of the same name
  // (an earlier test process with the same pid) must never be read as this
  // one's, e.g. for the port it listens on.
  const int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  // Everything the child needs is made before the fork: between fork and
  // exec it may only make async-signal-safe calls. An allocation there can
  // wait forever on a malloc lock another thread of this process held at the
  // fork (a worker then never starts and logs nothing).
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  if (fd >= 0) close(fd);
}

Process::~Process() {
  if (running()) {
    Signal(SIGKILL);
    Wait(std::chrono::seconds(5));
  }
}

void Process::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

bool Process::running() {
  if (exit_code_.has_value() || pid_ <= 0) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return false;
  }
  return true;
}

int Process::Wait(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() > end) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return exit_code_.value_or(-1);
}

std::string Process::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

bool PortAccepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

bool WaitForServing(const std::string& address, std::chrono::milliseconds timeout,
                    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  // Wait for the port first: a gRPC channel that saw "connection refused"
  // backs off before it tries again.
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  while (!PortAccepts(port)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
      address, credentials ? credentials : grpc::InsecureChannelCredentials()));
  while (std::chrono::steady_clock::now() < end) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    if (stub->Check(&ctx, req, &resp).ok() &&
        resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::string HttpGet(int port, const std::string& path) {
  return tandem::HttpGet("127.0.0.1", port, path);
}

double Worker::Metric(const std::string& name, const std::map<std::string, std::string>& labels) const {
  auto v = MetricValue(Metrics(), name, labels);
  EXPECT_TRUE(v.has_value()) << "metric " << name << " missing";
  return v.value_or(-1);
}

int PortAfter(const std::string& log, const std::string& marker) {
  const size_t at = log.find(marker);
  if (at == std::string::npos) return 0;
  size_t colon = log.find(':', at + marker.size());
  if (colon == std::string::npos) return 0;
  int port = 0;
  for (size_t i = colon + 1; i < log.size() && std::isdigit(static_cast<unsigned char>(log[i])); ++i) {
    port = port * 10 + (log[i] - '0');
  }
  return port;
}

Worker StartWorker(const std::string& binary, const std::vector<std::string>& flags, int grpc_port,
                   std::shared_ptr<grpc::ChannelCredentials> credentials) {
  // Port 0 unless the caller needs a fixed one: the worker binds what the
  // kernel gives it and logs it, so parallel tests never race for a port.
  Worker w;
  std::vector<std::string> argv = {BinDir() + "/" + binary,
                                   "--grpc-address=127.0.0.1:" + std::to_string(grpc_port),
                                   "--metrics-address=127.0.0.1:0"};
  // The decode worker's HTTP API too (its default port is fixed: 8000).
  if (binary == "decode_worker") argv.push_back("--http-address=127.0.0.1:0");
  argv.insert(argv.end(), flags.begin(), flags.end());
  static std::atomic<int> started{0};
  const std::string log = ::testing::TempDir() + binary + "_" + std::to_string(getpid()) + "_" +
                          std::to_string(started++) + ".log";
  w.process = std::make_unique<Process>(argv, log);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && w.process->running() &&
         (w.grpc_port == 0 || w.metrics_port == 0)) {
    const std::string text = w.process->Log();
    w.grpc_port = PortAfter(text, "gRPC listening on ");
    w.metrics_port = PortAfter(text, "metrics on http://");
    if (w.grpc_port == 0 || w.metrics_port == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const bool serving = w.grpc_port != 0 && w.metrics_port != 0 &&
                       WaitForServing(w.address(), std::chrono::seconds(60), credentials);
  EXPECT_TRUE(serving) << binary << " did not become SERVING; log:\n" << w.process->Log();
  return w;
}

std::unique_ptr<v1::Prefill::Stub> SlowReaderPrefillStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  return v1::Prefill::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

void ExpectBlocksFreed(const Worker& a, const Worker& b) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  double in_a = -1, in_b = -1;
  while (std::chrono::steady_clock::now() < end) {
    in_a = a.Metric("tandem_kv_cache_blocks_in_use");
    in_b = b.Metric("tandem_kv_cache_blocks_in_use");
    if (in_a == 0 && in_b == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "KV blocks still in use: " << in_a << " and " << in_b;
}

void StopWorker(Worker& w) {
  w.process->Signal(SIGTERM);
  EXPECT_EQ(w.process->Wait(std::chrono::seconds(20)), 0) << w.process->Log();
}

double AwaitMetric(const Worker& w, const std::string& name, double want,
                   std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  double v = w.Metric(name);
  while (v != want && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    v = w.Metric(name);
  }
  return v;
}

std::vector<int32_t> TestPrompt(int n, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (seed * 131 + i * 29) % 500 + 3;
  return t;
}

v1::GenerateRequest MakeRequest(const std::string& id, const std::vector<int32_t>& prompt,
                                uint32_t max_tokens) {
  v1::GenerateRequest r;
  r.set_request_id(id);
  r.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  r.mutable_sampling()->set_max_tokens(max_tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

std::unique_ptr<v1::Decode::Stub> DecodeStub(const std::string& address) {
  return v1::Decode::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

GenerateResult Generate(const std::string& address, const v1::GenerateRequest& request,
                        std::chrono::milliseconds deadline, const Metadata& metadata) {
  auto stub = DecodeStub(address);
  return Generate(stub.get(), request, deadline, metadata);
}

GenerateResult Generate(v1::Decode::Stub* stub, const v1::GenerateRequest& request,
                        std::chrono::milliseconds deadline, const Metadata& metadata) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  for (const auto& [k, v] : metadata) ctx.AddMetadata(k, v);
  auto reader = stub->Generate(&ctx, request);
  GenerateResult result;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    result.tokens.insert(result.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
    result.text += resp.text();
    result.messages.push_back(resp.text());
    if (resp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      result.stop_string = resp.stop_string();
      result.finish_reason = resp.finish_reason();
      result.prompt_tokens = resp.usage().prompt_tokens();
      result.completion_tokens = resp.usage().completion_tokens();
    }
  }
  result.status = reader->Finish();
  return result;
}

HeldStream::HeldStream(const std::string& address, const v1::GenerateRequest& request)
    : stub_(DecodeStub(address)) {
  ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  reader_ = stub_->Generate(&ctx_, request);
  v1::GenerateResponse first;
  started_ = reader_->Read(&first);
  if (!started_) {
    status_ = reader_->Finish();
    finished_ = true;
  }
}

HeldStream::~HeldStream() { Cancel(); }

grpc::Status HeldStream::Cancel() {
  if (finished_) return status_;
  ctx_.TryCancel();
  v1::GenerateResponse rest;
  while (reader_->Read(&rest)) {
  }
  status_ = reader_->Finish();
  finished_ = true;
  return status_;
}

}  // namespace tandem::testing
