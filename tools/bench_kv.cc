// `tandem bench kv`: goodput of the prefill worker's KV stream over loopback
// next to a raw TCP socket moving the same bytes in the same chunk sizes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"
#include "tools/bench.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

int Fail(const std::string& message) {
  std::cerr << "tandem bench kv: " << message << std::endl;
  return 2;
}

int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Seconds for the receiver to get `total` bytes sent in `chunk`-byte writes
// over a loopback TCP connection (first byte to last byte).
double RawSocketSeconds(size_t total, size_t chunk) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  listen(listener, 1);
  std::thread sender([&] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    std::vector<char> buf(chunk, 'k');
    for (size_t sent = 0; sent < total;) {
      const size_t n = std::min(chunk, total - sent);
      const ssize_t w = write(fd, buf.data(), n);
      if (w <= 0) break;
      sent += static_cast<size_t>(w);
    }
    close(fd);
  });
  int conn = accept(listener, nullptr, nullptr);
  std::vector<char> buf(chunk);
  size_t got = 0;
  Clock::time_point first;
  while (got < total) {
    const ssize_t r = read(conn, buf.data(), buf.size());
    if (r <= 0) break;
    if (got == 0) first = Clock::now();
    got += static_cast<size_t>(r);
  }
  const double secs = std::chrono::duration<double>(Clock::now() - first).count();
  sender.join();
  close(conn);
  close(listener);
  return secs;
}

}  // namespace

int RunKvBench(const std::vector<std::string>& args) {
  FlagSet flags("tandem bench kv");
  std::string model = "synthetic:smollm2-135m";
  int prompt_tokens = 2048;
  int iters = 3;
  std::string prefill_binary;
  flags.Add("model", &model, "model of the prefill worker (its KV shape)");
  flags.Add("prompt-tokens", &prompt_tokens, "prompt length whose KV is transferred");
  flags.Add("iters", &iters, "transfers measured (median reported)");
  flags.Add("prefill-binary", &prefill_binary, "prefill_worker to start (default: next to tandem)");
  if (auto code = ParseCommandLine(&flags, args)) return *code;
  if (prefill_binary.empty()) {
    char self[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    std::string dir = n > 0 ? std::string(self, n) : "";
    prefill_binary = dir.substr(0, dir.rfind('/')) + "/prefill_worker";
  }
  const int port = FreeLoopbackPort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::vector<std::string> argv = {
      prefill_binary, "--grpc-address=" + address,
      absl::StrCat("--metrics-address=127.0.0.1:", FreeLoopbackPort()), "--model=" + model,
      "--cudagraph-mode=NONE", absl::StrCat("--max-num-batched-tokens=", prompt_tokens),
      absl::StrCat("--max-model-len=", prompt_tokens + 16), "--max-num-seqs=1"};
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> c;
    for (auto& a : argv) c.push_back(a.data());
    c.push_back(nullptr);
    freopen("/dev/null", "w", stderr);
    execv(c[0], c.data());
    _exit(127);
  }
  auto stop = [pid] {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  };
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  bool serving = false;
  for (auto end = Clock::now() + std::chrono::seconds(120); Clock::now() < end && !serving;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc::health::v1::HealthCheckResponse r;
    serving = health->Check(&ctx, {}, &r).ok() &&
              r.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    if (!serving) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!serving) {
    stop();
    return Fail("the prefill worker did not become SERVING: " + prefill_binary);
  }
  auto stub = v1::Prefill::NewStub(channel);
  std::vector<double> grpc_gbps;
  size_t kv_bytes = 0, max_chunk = 0;
  for (int i = 0; i < iters; ++i) {
    v1::PrefillRequest req;
    req.set_request_id(absl::StrCat("bench-kv-", i));
    for (int t = 0; t < prompt_tokens; ++t) req.add_prompt_token_ids(3 + t % 100);
    req.mutable_sampling()->set_max_tokens(1);
    grpc::ClientContext ctx;
    auto reader = stub->Prefill(&ctx, req);
    v1::PrefillResponse msg;
    Clock::time_point start;
    size_t bytes = 0;
    bool done = false;
    while (reader->Read(&msg)) {
      if (msg.has_header()) start = Clock::now();
      if (msg.has_chunk()) {
        const size_t n = msg.chunk().k().size() + msg.chunk().v().size();
        bytes += n;
        max_chunk = std::max(max_chunk, n);
      }
      if (msg.has_done()) done = true;
    }
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    grpc::Status st = reader->Finish();
    if (!st.ok() || !done) {
      stop();
      return Fail("prefill stream failed: " + st.error_message());
    }
    kv_bytes = bytes;
    grpc_gbps.push_back(bytes / secs / 1e9);
  }
  stop();
  std::vector<double> raw_gbps;
  for (int i = 0; i < iters; ++i) raw_gbps.push_back(kv_bytes / RawSocketSeconds(kv_bytes, max_chunk) / 1e9);
  std::sort(grpc_gbps.begin(), grpc_gbps.end());
  std::sort(raw_gbps.begin(), raw_gbps.end());
  const double g = grpc_gbps[grpc_gbps.size() / 2], r = raw_gbps[raw_gbps.size() / 2];
  std::printf("model %s | %d prompt tokens | %.1f MiB of KV in chunks of <= %.2f MiB | median of %d\n",
              model.c_str(), prompt_tokens, kv_bytes / 1048576.0, max_chunk / 1048576.0, iters);
  std::printf("prefill stream (gRPC)  %7.3f GB/s\n", g);
  std::printf("raw TCP socket         %7.3f GB/s\n", r);
  std::printf("ratio                  %7.2f\n", g / r);
  return 0;
}

}  // namespace tandem
