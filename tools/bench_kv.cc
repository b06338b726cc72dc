// `tandem bench kv`: what the KV hand-off costs.
//  1. Goodput of one request's KV (first chunk to last message) next
//     to a raw TCP socket moving the same bytes in the same chunk sizes over
//     the same link, in the same run. The prompt is in the prefill worker's
//     prefix cache, so the stream is not waiting for compute. The KV is read
//     as the decode worker reads it (bytes, each chunk checksummed, over
//     --kv-streams streams on connections of their own), or also with
//     protobuf messages on one stream (--goodput-readers=bytes,protobuf, in
//     alternating turns). A third line times gRPC alone on the link (a
//     prebuilt buffer streamed in the same chunks by an in-process server):
//     the ceiling any gRPC stream can reach there.
//  2. The TTFT overhead of disaggregation, per prompt length: the pair's TTFT
//     (a decode worker fed by the prefill worker) minus an aggregated decode
//     worker's TTFT on the same cores, split into the prefill worker's compute
//     and what follows it (the stream's tail, import and hand-off).
// The link: loopback, or (--link=veth, root and iproute2 needed) a veth pair
// into a network namespace the benchmark makes, its egress shaped by a token
// bucket (tc tbf) to --link-rate; the prefill worker and the raw sender run
// inside it, the readers outside.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/base/flags.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/prometheus_scrape.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"
#include "tools/bench.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int Fail(const std::string& message) {
  std::cerr << "tandem bench kv: " << message << std::endl;
  return 2;
}

// Two free TCP ports on `ip`, in the calling thread's network namespace
// (both bound at once, so they differ).
std::pair<int, int> FreePorts(const std::string& ip) {
  int ports[2] = {0, 0};
  int fds[2];
  for (int i = 0; i < 2; ++i) {
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
    bind(fds[i], reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(fds[i], reinterpret_cast<sockaddr*>(&addr), &len);
    ports[i] = ntohs(addr.sin_port);
  }
  close(fds[0]);
  close(fds[1]);
  return {ports[0], ports[1]};
}

// The link the KV crosses: loopback, or a shaped veth pair into a namespace.
class Link {
 public:
  ~Link() {
    if (!ns_.empty()) Run("ip netns del " + ns_);
    if (ns_fd_ >= 0) close(ns_fd_);
  }
  // Loopback: both ends 127.0.0.1.
  void Loopback() { far_ip_ = near_ip_ = "127.0.0.1"; }
  // A namespace joined to this one by a veth pair, each side's egress shaped
  // to `rate` (tc's syntax: 10gbit). Needs root and iproute2.
  bool Veth(const std::string& rate) {
    ns_ = absl::StrCat("tandem-kv-", getpid());
    const std::string near = absl::StrCat("tkv", getpid() % 100000, "a");
    const std::string far = absl::StrCat("tkv", getpid() % 100000, "b");
    near_ip_ = "10.213.0.1";
    far_ip_ = "10.213.0.2";
    // tbf's burst must hold at least one timer tick of the rate.
    const std::string shape = " root tbf rate " + rate + " burst 4mb latency 50ms";
    const bool ok =
        Run("ip netns add " + ns_) &&
        Run("ip link add " + near + " type veth peer name " + far + " netns " + ns_) &&
        Run("ip addr add " + near_ip_ + "/24 dev " + near) && Run("ip link set " + near + " up") &&
        Run("ip -n " + ns_ + " addr add " + far_ip_ + "/24 dev " + far) &&
        Run("ip -n " + ns_ + " link set " + far + " up") &&
        Run("ip -n " + ns_ + " link set lo up") && Run("tc qdisc add dev " + near + shape) &&
        Run("ip netns exec " + ns_ + " tc qdisc add dev " + far + shape);
    if (!ok) return false;
    ns_fd_ = open(("/var/run/netns/" + ns_).c_str(), O_RDONLY | O_CLOEXEC);
    return ns_fd_ >= 0;
  }
  // Moves the calling thread (or a child before exec) to the far side.
  bool EnterFar() const { return ns_fd_ < 0 || setns(ns_fd_, CLONE_NEWNET) == 0; }
  const std::string& near_ip() const { return near_ip_; }
  const std::string& far_ip() const { return far_ip_; }
  std::string name() const { return ns_.empty() ? "loopback" : "veth into netns " + ns_; }

 private:
  static bool Run(const std::string& command) {
    if (std::system((command + " >/dev/null 2>&1").c_str()) == 0) return true;
    std::cerr << "tandem bench kv: failed: " << command << std::endl;
    return false;
  }
  std::string ns_;
  int ns_fd_ = -1;
  std::string near_ip_;
  std::string far_ip_;
};

// Seconds for a reader on the near side to get `total` bytes that a sender
// on the far side writes in `chunk`-byte writes (first byte to last byte).
double RawSocketSeconds(const Link& link, size_t total, size_t chunk) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, link.near_ip().c_str(), &addr.sin_addr);
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  listen(listener, 1);
  std::thread sender([&] {
    if (!link.EnterFar()) return;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    std::vector<char> buf(chunk, 'k');
    for (size_t sent = 0; sent < total;) {
      const ssize_t w = write(fd, buf.data(), std::min(chunk, total - sent));
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
  const double secs = Seconds(Clock::now() - first);
  sender.join();
  close(conn);
  close(listener);
  return secs;
}

// The bare stream's method: the generic service below answers any name.
constexpr char kBareMethod[] = "/tandem.bench.Bare/Stream";

// Streams exactly `total` bytes of `bytes` (one chunk's worth, never copied:
// each message's slice points into it), then finishes.
class BareStreamer : public grpc::ServerGenericBidiReactor {
 public:
  BareStreamer(const std::vector<char>* bytes, size_t total) : bytes_(bytes), total_(total) {
    StartRead(&request_);
  }
  void OnReadDone(bool) override { Next(); }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
    sent_ += message_.Length();
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    if (sent_ >= total_) return Finish(grpc::Status::OK);
    grpc::Slice slice(bytes_->data(), std::min(bytes_->size(), total_ - sent_),
                      grpc::Slice::STATIC_SLICE);
    message_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&message_);
  }
  const std::vector<char>* bytes_;
  size_t total_;
  size_t sent_ = 0;
  grpc::ByteBuffer request_, message_;
};

class BareService : public grpc::CallbackGenericService {
 public:
  BareService(size_t total, size_t chunk) : bytes_(chunk, 'k'), total_(total) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new BareStreamer(&bytes_, total_);
  }

 private:
  std::vector<char> bytes_;
  size_t total_;
};

class BareRead : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit BareRead(grpc::GenericStub* stub) {
    stub->PrepareBidiStreamingCall(&context_, kBareMethod, grpc::StubOptions(), this);
    grpc::Slice empty("", 0);
    request_ = grpc::ByteBuffer(&empty, 1);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (got_ == 0) first_ = Clock::now();
    got_ += response_.Length();
    last_ = Clock::now();
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& s) override {
    status_ = s;
    finished_.Notify();
  }
  // Seconds from the first message to the last; nullopt if the call failed.
  std::optional<double> Wait(size_t total) {
    finished_.WaitForNotification();
    if (!status_.ok() || got_ != total) return std::nullopt;
    return Seconds(last_ - first_);
  }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer request_, response_;
  size_t got_ = 0;
  Clock::time_point first_, last_;
  grpc::Status status_;
  absl::Notification finished_;
};

// gRPC's own ceiling on the link: seconds for a reader on the near side to
// get `total` bytes that an in-process gRPC server on the far side streams in
// `chunk`-byte messages of one prebuilt buffer (no copy, no checksum, nothing
// parsed: only gRPC's framing, flow control and threads), first message to
// last. Next to the raw socket's time it says how much of the gap between the
// KV stream and TCP the transport itself takes.
std::optional<double> BareGrpcSeconds(const Link& link, size_t total, size_t chunk) {
  BareService service(total, chunk);
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  // Built on a thread moved to the far side: its listening socket is there.
  std::thread start([&] {
    if (!link.EnterFar()) return;
    grpc::ServerBuilder builder;
    builder.AddListeningPort(link.far_ip() + ":0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterCallbackGenericService(&service);
    server = builder.BuildAndStart();
  });
  start.join();
  if (!server || port == 0) return std::nullopt;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(chunk) + 4096);
  SetKvReceiveWindow(&args);  // read as the decode worker reads its KV
  grpc::GenericStub stub(grpc::CreateCustomChannel(absl::StrCat(link.far_ip(), ":", port),
                                                   grpc::InsecureChannelCredentials(), args));
  std::optional<double> secs;
  {
    BareRead read(&stub);
    secs = read.Wait(total);
  }
  server->Shutdown();
  return secs;
}

// A worker process, stopped (SIGTERM) with the benchmark.
struct Worker {
  pid_t pid = -1;
  std::string address;
  std::string metrics_host;
  int metrics_port = 0;
  ~Worker() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  }
  double Metric(const std::string& name) const {
    return MetricValue(HttpGet(metrics_host, metrics_port, "/metrics"), name).value_or(0.0);
  }
};

// Starts `binary` listening on `ip` (inside the far namespace when `far`)
// and waits until it is SERVING.
bool StartWorker(const std::string& binary, const std::string& ip, const Link& link, bool far,
                 std::vector<std::string> flags, Worker* w) {
  std::pair<int, int> ports;
  std::thread([&] { ports = far && link.EnterFar() ? FreePorts(ip) : FreePorts(ip); }).join();
  w->address = absl::StrCat(ip, ":", ports.first);
  w->metrics_host = ip;
  w->metrics_port = ports.second;
  flags.insert(flags.begin(), {binary, "--grpc-address=" + w->address,
                               absl::StrCat("--metrics-address=", ip, ":", w->metrics_port)});
  // Made before the fork: the child may only make async-signal-safe calls
  // until exec (an allocation could wait forever on a lock another thread held).
  std::vector<char*> argv;
  for (std::string& a : flags) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  w->pid = fork();
  if (w->pid == 0) {
    if (far && !link.EnterFar()) _exit(126);
    if (devnull >= 0) dup2(devnull, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (devnull >= 0) close(devnull);
  auto channel = grpc::CreateChannel(w->address, grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (auto end = Clock::now() + std::chrono::seconds(180); Clock::now() < end;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc::health::v1::HealthCheckResponse r;
    if (health->Check(&ctx, {}, &r).ok() &&
        r.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// A prompt of `n` tokens no earlier prompt of this run shares a block with
// (ids below 500: inside every vocabulary, the synthetic models' included).
std::vector<int32_t> FreshPrompt(int n) {
  static int32_t salt = 0;
  ++salt;
  std::vector<int32_t> p(n);
  for (int t = 0; t < n; ++t) p[t] = 3 + (t * 7 + salt * 131) % 490;
  p[0] = 3 + salt % 490;
  if (n > 1) p[1] = 3 + salt / 490 % 490;
  return p;
}

struct StreamResult {
  bool ok = false;
  int layers = 1;
  size_t bytes = 0;
  size_t max_chunk = 0;
  double transfer_s = 0;  // first chunk to the last message
  std::chrono::steady_clock::time_point first, last;  // of the above
};

// What one Prefill stream's reader saw, message by message, as the decode
// worker checks it (each chunk's checksum verified; only the import into a
// cache is left out).
class StreamTally {
 public:
  // false: stop reading (malformed message or failed checksum).
  bool Add(const absl::StatusOr<ReceivedMessage>& msg) {
    if (!msg.ok()) return false;
    if (msg->chunk.has_value()) {
      const ReceivedChunk& c = *msg->chunk;
      if (result_.bytes == 0) first_ = Clock::now();
      if (!VerifyChunk(c, c.k_bytes / std::max<uint32_t>(1, c.num_tokens)).ok()) return false;
      result_.bytes += c.k_bytes + c.v_bytes;
      result_.max_chunk = std::max(result_.max_chunk, c.k_bytes + c.v_bytes);
    } else if (msg->message.has_header()) {
      result_.layers = static_cast<int>(msg->message.header().fingerprint().num_layers());
      header_ = true;
    } else if (msg->message.has_done()) {
      done_ = true;
      last_ = Clock::now();
    }
    return true;
  }
  StreamResult Result(const grpc::Status& status) const {
    StreamResult r = result_;
    r.transfer_s = Seconds(last_ - first_);
    r.first = first_;
    r.last = last_;
    r.ok = done_ && status.ok();
    return r;
  }
  bool has_header() const { return header_; }

 private:
  StreamResult result_;
  bool done_ = false;
  bool header_ = false;
  Clock::time_point first_, last_;
};

// A Prefill stream's reader: a gRPC callback reactor (`Base`) as in the
// decode worker, tallying what it reads until the stream ends.
template <typename Base>
class TallyingRead : public Base {
 public:
  StreamResult Wait() {
    finished_.WaitForNotification();
    return tally_.Result(status_);
  }
  // Until the stream's header arrived (the request is open on the prefill
  // worker: its other streams may attach) or the stream ended.
  void WaitForHeader() { opened_.WaitForNotification(); }
  void OnDone(const grpc::Status& s) override {
    status_ = s;
    if (!opened_.HasBeenNotified()) opened_.Notify();
    finished_.Notify();
  }

 protected:
  explicit TallyingRead(v1::PrefillRequest request) : request_(std::move(request)) {}
  // Counts a message; false ends the stream.
  void Take(absl::StatusOr<ReceivedMessage> msg) {
    if (!tally_.Add(msg)) return context_.TryCancel();
    if (tally_.has_header() && !opened_.HasBeenNotified()) opened_.Notify();
    this->StartRead(&response_);
  }

  v1::PrefillRequest request_;
  grpc::ClientContext context_;
  typename Base::ResponseType response_;

 private:
  StreamTally tally_;
  grpc::Status status_;
  absl::Notification opened_, finished_;
};

// The two ways to read: "bytes" (the decode worker's: each message's bytes
// parsed where they arrived, ParseReceived) and "protobuf" (each message
// parsed into a PrefillResponse, its rows copied into the message's strings).
struct BytesReactor : grpc::ClientBidiReactor<v1::PrefillRequest, grpc::ByteBuffer> {
  using ResponseType = grpc::ByteBuffer;
};
struct ProtobufReactor : grpc::ClientReadReactor<v1::PrefillResponse> {
  using ResponseType = v1::PrefillResponse;
};

class BytesRead : public TallyingRead<BytesReactor> {
 public:
  BytesRead(RawPrefillStub* stub, v1::PrefillRequest request) : TallyingRead(std::move(request)) {
    stub->PrepareBidiStreamingCall(&context_, kPrefillMethod, grpc::StubOptions(), this);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (ok) Take(ParseReceived(&response_));
  }
};

class ProtobufRead : public TallyingRead<ProtobufReactor> {
 public:
  ProtobufRead(v1::Prefill::Stub* stub, v1::PrefillRequest request)
      : TallyingRead(std::move(request)) {
    stub->async()->Prefill(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    ReceivedMessage msg;
    if (response_.has_chunk()) {
      msg.chunk = ReceivedChunk::Of(std::move(*response_.mutable_chunk()));
    } else {
      msg.message = std::move(response_);
    }
    response_.Clear();
    Take(std::move(msg));
  }
};

// The goodput reader's channels: one per stream of a request, each its own
// connection as the decode worker's (`--kv-streams`, PrefillPool).
struct PrefillStubs {
  std::vector<std::unique_ptr<RawPrefillStub>> bytes;
  std::unique_ptr<v1::Prefill::Stub> protobuf;
};

// One request's KV over stubs.bytes.size() streams (the protobuf reader: one),
// timed from the first chunk on any stream to the last stream's end.
StreamResult PrefillStream(PrefillStubs& stubs, const std::string& reader,
                           const std::vector<int32_t>& prompt, const std::string& id) {
  v1::PrefillRequest req;
  req.set_request_id(id);
  req.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  req.mutable_sampling()->set_max_tokens(1);
  if (reader == "protobuf") {
    ProtobufRead read(stubs.protobuf.get(), std::move(req));
    return read.Wait();
  }
  const int n = static_cast<int>(stubs.bytes.size());
  if (n > 1) req.set_num_streams(static_cast<uint32_t>(n));
  std::vector<std::unique_ptr<BytesRead>> reads;
  reads.push_back(std::make_unique<BytesRead>(stubs.bytes[0].get(), std::move(req)));
  reads[0]->WaitForHeader();
  for (int i = 1; i < n; ++i) {
    v1::PrefillRequest attach;
    attach.set_request_id(id);
    attach.set_stream_index(static_cast<uint32_t>(i));
    attach.set_num_streams(static_cast<uint32_t>(n));
    reads.push_back(std::make_unique<BytesRead>(stubs.bytes[i].get(), std::move(attach)));
  }
  StreamResult all;
  for (size_t i = 0; i < reads.size(); ++i) {
    const StreamResult r = reads[i]->Wait();
    all.ok = (i == 0 || all.ok) && r.ok;
    all.layers = std::max(all.layers, r.layers);
    all.bytes += r.bytes;
    all.max_chunk = std::max(all.max_chunk, r.max_chunk);
    if (r.bytes > 0 && (all.first == Clock::time_point() || r.first < all.first)) all.first = r.first;
    all.last = std::max(all.last, r.last);
  }
  all.transfer_s = Seconds(all.last - all.first);
  return all;
}

// Seconds to the first response of a one-token Generate; nullopt on error.
std::optional<double> Ttft(const std::string& address, const std::vector<int32_t>& prompt,
                           const std::string& id) {
  auto stub = v1::Decode::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::GenerateRequest req;
  req.set_request_id(id);
  req.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  req.mutable_sampling()->set_max_tokens(1);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  const Clock::time_point start = Clock::now();
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse msg;
  std::optional<double> first;
  while (reader->Read(&msg)) {
    if (!first.has_value()) first = Seconds(Clock::now() - start);
  }
  if (!reader->Finish().ok()) return std::nullopt;
  return first;
}

std::string SiblingBinary(const std::string& name) {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string path = n > 0 ? std::string(self, n) : "";
  return path.substr(0, path.rfind('/') + 1) + name;
}

}  // namespace

int RunKvBench(const std::vector<std::string>& args) {
  FlagSet flags("tandem bench kv");
  std::string model = "synthetic:smollm2-135m";
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string prompt_tokens = "512,2048";
  int goodput_tokens = 2048;
  std::string goodput_readers = "bytes";
  int kv_streams = 2;  // the decode worker's default
  int iters = 3;
  int budget = 512;
  std::string link_kind = "loopback";
  std::string link_rate = "10gbit";
  std::string prefill_binary = SiblingBinary("prefill_worker");
  std::string decode_binary = SiblingBinary("decode_worker");
  flags.Add("model", &model, "model of all workers (its KV shape)");
  flags.Add("device", &device,
            "device of all workers: cpu, or cuda (the three workers share one GPU)");
  flags.Add("dtype", &dtype, "storage dtype of all workers (auto: f32 on cpu, bf16 on cuda)");
  flags.Add("prompt-tokens", &prompt_tokens, "prompt lengths whose TTFT overhead is measured");
  flags.Add("goodput-tokens", &goodput_tokens, "prompt length of the goodput measurement");
  flags.Add("iters", &iters, "measurements per figure (median reported)");
  flags.Add("goodput-readers", &goodput_readers,
            "how the goodput's streams are read, in turns: bytes (as the decode worker reads "
            "them), protobuf (parsed into messages)");
  flags.Add("kv-streams", &kv_streams,
            "streams per request, each its own connection: the goodput's (bytes reader) and "
            "the pair's decode worker's --kv-streams (its TTFT)");
  flags.Add("max-num-batched-tokens", &budget,
            "every worker's token budget per step (the prefill worker's default: 512)");
  flags.Add("link", &link_kind, "loopback, or veth (a shaped veth pair into a namespace; root)");
  flags.Add("link-rate", &link_rate, "the veth link's rate, in tc's syntax");
  flags.Add("prefill-binary", &prefill_binary, "prefill_worker to start");
  flags.Add("decode-binary", &decode_binary, "decode_worker to start");
  if (auto code = ParseCommandLine(&flags, args)) return *code;
  if (kv_streams < 1 || kv_streams > 16) {
    return Fail(absl::StrCat("--kv-streams must be in [1, 16] (the decode worker's range), got ",
                             kv_streams));
  }
  auto lengths = ParseIntList(prompt_tokens, "--prompt-tokens");
  if (!lengths.ok()) return Fail(std::string(lengths.status().message()));
  int longest = goodput_tokens;
  for (int n : *lengths) longest = std::max(longest, n);
  const std::vector<std::string> readers = absl::StrSplit(goodput_readers, ',');
  for (const std::string& reader : readers) {
    if (reader != "bytes" && reader != "protobuf") {
      return Fail("--goodput-readers: '" + reader + "' is neither bytes nor protobuf");
    }
  }

  // The readers below stand in for the decode worker: the same allocator
  // thresholds as the workers (RunWorker), for them and for the ceiling lines.
  KeepKvBuffersInHeap();
  Link link;
  if (link_kind == "veth") {
    if (!link.Veth(link_rate)) return Fail("could not make the veth link (root and iproute2?)");
  } else if (link_kind == "loopback") {
    link.Loopback();
  } else {
    return Fail("--link: '" + link_kind + "' is neither loopback nor veth");
  }
  const std::vector<std::string> engine = {
      "--model=" + model,
      "--device=" + device,
      "--dtype=" + dtype,
      absl::StrCat("--max-num-batched-tokens=", budget),
      absl::StrCat("--max-model-len=", longest + 16),
      "--max-num-seqs=1",
      "--kv-cache-mb=1536",
  };
  Worker prefill, pair, aggregated;
  if (!StartWorker(prefill_binary, link.far_ip(), link, /*far=*/true, engine, &prefill)) {
    return Fail("the prefill worker did not become SERVING: " + prefill_binary);
  }
  std::vector<std::string> decode_flags = engine;
  decode_flags.push_back("--http-address=");  // two decode workers: no OpenAI port
  std::vector<std::string> pair_flags = decode_flags;
  pair_flags.push_back("--prefill-address=" + prefill.address);
  pair_flags.push_back("--prefill-fallback=none");
  pair_flags.push_back(absl::StrCat("--kv-streams=", kv_streams));
  if (!StartWorker(decode_binary, link.near_ip(), link, false, pair_flags, &pair) ||
      !StartWorker(decode_binary, link.near_ip(), link, false, decode_flags, &aggregated)) {
    return Fail("a decode worker did not become SERVING: " + decode_binary);
  }
  std::printf("link: %s%s | model %s | device %s (dtype %s) | token budget %d per step\n",
              link.name().c_str(), link_kind == "veth" ? (" at " + link_rate).c_str() : "",
              model.c_str(), device.c_str(), dtype.c_str(), budget);

  // 1. Goodput: the same prompt twice, timed the second time (cached).
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(8 << 20);
  SetKvReceiveWindow(&channel_args);  // as the decode worker's channels
  auto channel = grpc::CreateCustomChannel(prefill.address, grpc::InsecureChannelCredentials(),
                                          channel_args);
  PrefillStubs stubs;
  stubs.protobuf = v1::Prefill::NewStub(channel);
  stubs.bytes.push_back(std::make_unique<RawPrefillStub>(channel));
  for (int i = 1; i < kv_streams; ++i) {
    grpc::ChannelArguments args = channel_args;
    args.SetInt("tandem.kv_stream", i);  // a connection of its own
    stubs.bytes.push_back(std::make_unique<RawPrefillStub>(
        grpc::CreateCustomChannel(prefill.address, grpc::InsecureChannelCredentials(), args)));
  }
  // Each reader times the same cached prompt, in turns whose order flips
  // every iteration, so a comparison of readers sees the same machine. The
  // raw socket and the bare gRPC stream run in the same iterations (before
  // the readers in odd ones, after them in even ones), and each ratio is the
  // median of one iteration's figure over that iteration's raw socket: on a
  // shared VM whose neighbours come and go, timing all the streams first
  // and the sockets afterwards compared different minutes.
  std::vector<std::vector<double>> grpc_gbps(readers.size()), grpc_ratio(readers.size());
  std::vector<double> raw_gbps, bare_gbps, bare_ratio;
  size_t kv_bytes = 0, max_chunk = 0;
  int layers = 1;
  for (int i = 0; i < iters; ++i) {
    const std::vector<int32_t> prompt = FreshPrompt(goodput_tokens);
    StreamResult warm = PrefillStream(stubs, readers[0], prompt, absl::StrCat("warm-", i));
    if (!warm.ok) return Fail("a prefill stream failed");
    kv_bytes = warm.bytes;
    max_chunk = warm.max_chunk;
    double raw = 0, bare = 0;
    const auto sockets = [&]() -> bool {
      raw = kv_bytes / RawSocketSeconds(link, kv_bytes, max_chunk) / 1e9;
      const std::optional<double> bare_s = BareGrpcSeconds(link, kv_bytes, max_chunk);
      if (!bare_s) return false;
      bare = kv_bytes / *bare_s / 1e9;
      return true;
    };
    if (i % 2 == 1 && !sockets()) return Fail("the bare gRPC stream failed");
    std::vector<double> got(readers.size());
    for (size_t j = 0; j < readers.size(); ++j) {
      const size_t which = i % 2 == 0 ? j : readers.size() - 1 - j;
      StreamResult timed =
          PrefillStream(stubs, readers[which], prompt, absl::StrCat("timed-", i, "-", which));
      if (!timed.ok) return Fail("a prefill stream failed");
      kv_bytes = timed.bytes;
      layers = std::max(1, timed.layers);
      max_chunk = timed.max_chunk;
      got[which] = timed.bytes / timed.transfer_s / 1e9;
    }
    if (i % 2 == 0 && !sockets()) return Fail("the bare gRPC stream failed");
    raw_gbps.push_back(raw);
    bare_gbps.push_back(bare);
    bare_ratio.push_back(bare / raw);
    for (size_t j = 0; j < readers.size(); ++j) {
      grpc_gbps[j].push_back(got[j]);
      grpc_ratio[j].push_back(got[j] / raw);
    }
  }
  const double r = Median(raw_gbps);
  std::printf("\ngoodput: %d cached prompt tokens, %.1f MiB of KV in chunks of <= %.2f MiB, "
              "%d stream%s (bytes reader), median of %d (ratio: the median of each "
              "iteration's figure over its raw socket's)\n",
              goodput_tokens, kv_bytes / 1048576.0, max_chunk / 1048576.0, kv_streams,
              kv_streams == 1 ? "" : "s", iters);
  std::printf("  raw TCP socket                   %7.3f GB/s\n", r);
  std::printf("  bare gRPC stream (the ceiling)   %7.3f GB/s  ratio %5.2f\n", Median(bare_gbps),
              Median(bare_ratio));
  for (size_t j = 0; j < readers.size(); ++j) {
    std::printf("  prefill stream, read as %-8s %7.3f GB/s  ratio %5.2f\n", readers[j].c_str(),
                Median(grpc_gbps[j]), Median(grpc_ratio[j]));
  }
  // Each iteration times the aggregated worker and the pair back to back, in
  // an order that flips every iteration, and the overhead is the median of
  // the iterations' own differences: on a shared VM a 2048-token prefill's
  // time moves by several percent from minute to minute, as much as the
  // overhead itself, and a difference of two medians mixed those minutes.
  std::printf("\nTTFT, ms (median of %d; one-token requests, fresh prompts; overhead: the median "
              "of each iteration's pair less its aggregated, timed back to back)\n", iters);
  std::printf("%8s %10s %10s %10s %8s %12s %12s %12s\n", "tokens", "aggregated", "pair",
              "overhead", "of agg", "P compute", "after comp", "1 layer KV");
  for (int n : *lengths) {
    std::vector<double> agg, dis, compute, overhead, ratio, after_compute;
    for (int i = 0; i < iters; ++i) {
      std::optional<double> a, d;
      double compute_s = 0;
      const auto aggregated_ttft = [&] {
        a = Ttft(aggregated.address, FreshPrompt(n), absl::StrCat("agg-", n, "-", i));
      };
      const auto pair_ttft = [&] {
        const double before = prefill.Metric("tandem_prefill_compute_seconds_sum");
        d = Ttft(pair.address, FreshPrompt(n), absl::StrCat("pair-", n, "-", i));
        compute_s = prefill.Metric("tandem_prefill_compute_seconds_sum") - before;
      };
      if (i % 2 == 0) {
        aggregated_ttft();
        pair_ttft();
      } else {
        pair_ttft();
        aggregated_ttft();
      }
      if (!a.has_value() || !d.has_value()) return Fail(absl::StrCat("a request of ", n, " tokens failed"));
      agg.push_back(*a);
      dis.push_back(*d);
      compute.push_back(compute_s);
      overhead.push_back(*d - *a);
      ratio.push_back((*d - *a) / *a);
      after_compute.push_back(*d - compute_s);
    }
    const double kv = static_cast<double>(kv_bytes) / goodput_tokens * n;
    std::printf("%8d %10.1f %10.1f %10.1f %7.1f%% %12.1f %12.1f %12.1f\n", n, Median(agg) * 1e3,
                Median(dis) * 1e3, Median(overhead) * 1e3, 100.0 * Median(ratio),
                Median(compute) * 1e3, Median(after_compute) * 1e3,
                kv / layers / (r * 1e9) * 1e3);
  }
  std::printf("(after comp: the pair's TTFT less the prefill worker's compute: the KV stream's\n"
              " tail, import and hand-off; 1 layer KV: one layer's KV at the raw TCP rate)\n");
  return 0;
}

}  // namespace tandem
