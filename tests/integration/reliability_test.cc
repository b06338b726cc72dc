// Regression tests for the reliability defects found by abuse testing: a
// busy gRPC port, start-up failure exit codes, request ids, requests that
// can never fit, requests waiting for KV counted nowhere, deadlines counted
// as cancels, and health during drain. Real processes, real gRPC.
#include <signal.h>

#include <thread>

#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

std::vector<int32_t> Prompt(int n, int seed) { return TestPrompt(n, seed); }



// gRPC's default SO_REUSEPORT let a second worker bind a busy port and split
// the connections; now start-up fails, exit 1, naming the address.
TEST(ReliabilityTest, BusyGrpcPortFailsStartUp) {
  Worker first = StartWorker("decode_worker", {"--prefill-address=127.0.0.1:1"});
  const std::string address = first.address();
  Process second({BinDir() + "/decode_worker", "--grpc-address=" + address,
                  "--metrics-address=127.0.0.1:0", "--prefill-address=127.0.0.1:1"},
                 ::testing::TempDir() + "busy_port_" + std::to_string(getpid()) + ".log");
  EXPECT_EQ(second.Wait(std::chrono::seconds(30)), 1) << second.Log();
  EXPECT_NE(second.Log().find("cannot listen on --grpc-address=" + address), std::string::npos)
      << second.Log();
  StopWorker(first);
}

// The HTTP API's port likewise: a busy one fails start-up, exit 1, naming it.
TEST(ReliabilityTest, BusyHttpPortFailsStartUp) {
  Worker first = StartWorker("decode_worker", {"--prefill-address=127.0.0.1:1"});
  const int http_port = PortAfter(first.process->Log(), "OpenAI API on http://");
  ASSERT_GT(http_port, 0) << first.process->Log();
  const std::string http = "127.0.0.1:" + std::to_string(http_port);
  Process second({BinDir() + "/decode_worker", "--grpc-address=127.0.0.1:0",
                  "--metrics-address=127.0.0.1:0", "--http-address=" + http,
                  "--prefill-address=127.0.0.1:1"},
                 ::testing::TempDir() + "busy_http_" + std::to_string(getpid()) + ".log");
  EXPECT_EQ(second.Wait(std::chrono::seconds(30)), 1) << second.Log();
  EXPECT_NE(second.Log().find("cannot listen on --http-address=" + http), std::string::npos)
      << second.Log();
  StopWorker(first);
}

// The failure path raised SIGTERM at the process while gRPC threads had it
// unblocked: exit 1 or 143 at random. Always 1 now, with the reason.
TEST(ReliabilityTest, EngineStartUpFailureExitsOneEveryTime) {
  for (int i = 0; i < 6; ++i) {
    Process p({BinDir() + "/decode_worker", "--grpc-address=127.0.0.1:0",
               "--metrics-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
               "--prefill-address=127.0.0.1:1", "--max-model-len=1000000"},
              ::testing::TempDir() + "fail_start_" + std::to_string(getpid()) + "_" +
                  std::to_string(i) + ".log");
    EXPECT_EQ(p.Wait(std::chrono::seconds(30)), 1) << p.Log();
    EXPECT_NE(p.Log().find("max_model_len"), std::string::npos) << p.Log();
  }
}

class ReliabilityPairTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A model slow enough that a request is still running when the next
    // one arrives; few capture sizes so start-up stays quick.
    const std::vector<std::string> common = {"--model=synthetic:smollm2-135m", "--max-num-seqs=8",
                                             "--max-capture-size=8"};
    std::vector<std::string> prefill_flags = common, decode_flags = common;
    decode_flags.insert(decode_flags.end(), {"--num-kv-blocks=64", "--block-size=16"});
    prefill_ = new Worker(StartWorker("prefill_worker", prefill_flags));
    decode_flags.push_back("--prefill-address=" + prefill_->address());
    decode_ = new Worker(StartWorker("decode_worker", decode_flags));
  }
  static void TearDownTestSuite() {
    for (Worker* w : {decode_, prefill_}) {
      StopWorker(*w);
      delete w;
    }
  }
  static Worker* prefill_;
  static Worker* decode_;
};
Worker* ReliabilityPairTest::prefill_ = nullptr;
Worker* ReliabilityPairTest::decode_ = nullptr;

TEST_F(ReliabilityPairTest, EmptyRequestIdIsAssignedAndReturned) {
  auto stub = v1::Decode::NewStub(
      grpc::CreateChannel(decode_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, MakeRequest("", {1, 2, 3}, 3));
  v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first));
  EXPECT_EQ(first.request_id().rfind("req-", 0), 0u) << first.request_id();
  v1::GenerateResponse more;
  while (reader->Read(&more)) EXPECT_TRUE(more.request_id().empty());
  EXPECT_TRUE(reader->Finish().ok());
  // Two id-less requests get different ids.
  grpc::ClientContext ctx2;
  auto reader2 = stub->Generate(&ctx2, MakeRequest("", {1, 2, 3}, 1));
  v1::GenerateResponse second;
  ASSERT_TRUE(reader2->Read(&second));
  EXPECT_NE(second.request_id(), first.request_id());
  while (reader2->Read(&more)) {
  }
  EXPECT_TRUE(reader2->Finish().ok());
}

TEST_F(ReliabilityPairTest, LongRequestIdsAreRefusedAndNeverEchoedWhole) {
  GenerateResult g = Generate(decode_->address(), MakeRequest(std::string(9000, 'x'), {1}, 1));
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(g.status.error_message().find("request_id has 9000 bytes; the limit is 256"),
            std::string::npos);
  EXPECT_LT(g.status.error_message().size(), 200u);
  // A duplicate of a 256-byte id: the message quotes at most 64 bytes of it.
  const std::string id(256, 'y');
  HeldStream first(decode_->address(), MakeRequest(id, Prompt(100, 1), 800));  // fits 64 x 16
  ASSERT_TRUE(first.started());
  GenerateResult dup = Generate(decode_->address(), MakeRequest(id, {1, 2}, 2));
  first.Cancel();
  EXPECT_EQ(dup.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_NE(dup.status.error_message().find("... (256 bytes)"), std::string::npos)
      << dup.status.error_message();
  EXPECT_LT(dup.status.error_message().size(), 140u);
}

// It waited the whole queue timeout (30 s) before RESOURCE_EXHAUSTED.
TEST_F(ReliabilityPairTest, RequestThatCanNeverFitIsRefusedAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  GenerateResult g = Generate(decode_->address(), MakeRequest("huge", Prompt(100, 2), 1500));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(g.status.error_message().find("need 100 KV blocks"), std::string::npos)
      << g.status.error_message();
  EXPECT_NE(g.status.error_message().find("the whole cache has 64"), std::string::npos);
}

// Deadlines were counted as CANCELLED in tandem_requests_total.
TEST_F(ReliabilityPairTest, DeadlinesAreCountedAsDeadlineExceeded) {
  const std::map<std::string, std::string> deadline = {{"status", "DEADLINE_EXCEEDED"}};
  auto count = [&] {
    return MetricValue(decode_->Metrics(), "tandem_requests_total", deadline).value_or(0);
  };
  const double before = count();
  // Long enough to reach the server even on a loaded machine, far shorter
  // than 800 tokens take.
  GenerateResult g = Generate(decode_->address(), MakeRequest("late", Prompt(50, 3), 800),
                              std::chrono::milliseconds(2000));
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  double after = before;
  while (std::chrono::steady_clock::now() < end && after < before + 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    after = count();
  }
  EXPECT_EQ(after, before + 1) << [&] {
    std::string lines;
    const std::string text = decode_->Metrics();
    size_t at = 0;
    while ((at = text.find("tandem_requests_total{", at)) != std::string::npos) {
      lines += text.substr(at, text.find('\n', at) - at) + "\n";
      ++at;
    }
    return lines;
  }();
}

// With the prefill worker stopped, requests holding KV blocks were counted
// neither running nor waiting.
TEST(ReliabilityTest, RequestsWaitingForKvAreCounted) {
  Worker prefill = StartWorker("prefill_worker", {});
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address(),
                                                "--prefill-timeout-seconds=60"});
  // Connected first, then stopped: the streams hang instead of failing to connect.
  ASSERT_TRUE(Generate(decode.address(), MakeRequest("warm", {1, 2, 3}, 2)).status.ok());
  prefill.process->Signal(SIGSTOP);
  std::vector<std::thread> clients;
  std::vector<GenerateResult> results(3);
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&, i] {
      results[i] = Generate(decode.address(), MakeRequest("kv-" + std::to_string(i), Prompt(40, i), 4));
    });
  }
  double waiting_for_kv = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end && waiting_for_kv < 3) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    waiting_for_kv = decode.Metric("tandem_requests_waiting_for_kv");
  }
  EXPECT_EQ(waiting_for_kv, 3);
  EXPECT_GT(decode.Metric("tandem_kv_cache_blocks_in_use"), 0);
  EXPECT_EQ(decode.Metric("tandem_requests_running") + decode.Metric("tandem_requests_waiting"), 0);
  prefill.process->Signal(SIGCONT);
  for (auto& t : clients) t.join();
  for (const auto& r : results) EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  const auto drained = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < drained &&
         decode.Metric("tandem_requests_waiting_for_kv") != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(decode.Metric("tandem_requests_waiting_for_kv"), 0);
  StopWorker(decode);
  StopWorker(prefill);
}

// A health check on an existing connection got UNAVAILABLE during drain;
// the worker now reports NOT_SERVING while in-flight streams finish.
TEST(ReliabilityTest, HealthIsNotServingDuringDrain) {
  Worker prefill = StartWorker("prefill_worker", {"--model=synthetic:smollm2-135m",
                                                  "--max-capture-size=8"});
  Worker decode = StartWorker("decode_worker", {"--model=synthetic:smollm2-135m",
                                                "--max-capture-size=8", "--drain-seconds=120",
                                                "--prefill-address=" + prefill.address()});
  auto channel = grpc::CreateChannel(decode.address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  // SIGTERM once the stream has its first token, so it is in flight whatever
  // the kernels' speed; 60 tokens keep it running through the checks below
  // (tens of ms each) and end well inside the drain even under TSan.
  constexpr int kTokens = 60;
  auto stub = v1::Decode::NewStub(channel);
  grpc::ClientContext stream_ctx;
  stream_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(110));
  auto reader = stub->Generate(&stream_ctx, MakeRequest("long", Prompt(20, 1), kTokens));
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp)) << reader->Finish().error_message();
  size_t tokens = resp.token_ids_size();
  decode.process->Signal(SIGTERM);
  // Health turns NOT_SERVING as soon as the worker takes the signal.
  grpc::health::v1::HealthCheckResponse::ServingStatus seen =
      grpc::health::v1::HealthCheckResponse::SERVING;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (seen == grpc::health::v1::HealthCheckResponse::SERVING &&
         std::chrono::steady_clock::now() < until) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse hc;
    grpc::Status s = health->Check(&ctx, req, &hc);
    ASSERT_TRUE(s.ok()) << s.error_message();
    seen = hc.status();
    if (seen == grpc::health::v1::HealthCheckResponse::SERVING) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  EXPECT_EQ(seen, grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  // New work is refused; the stream in flight finishes.
  GenerateResult refused = Generate(decode.address(), MakeRequest("new", {1, 2}, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(tokens, static_cast<size_t>(kTokens)) << "the stream ended before the checks";
  while (reader->Read(&resp)) tokens += resp.token_ids_size();
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(tokens, static_cast<size_t>(kTokens));
  EXPECT_EQ(decode.process->Wait(std::chrono::seconds(30)), 0) << decode.process->Log();
  StopWorker(prefill);
}

// Without a connection age a client kept the connections (and so the DNS
// answers) it made first: replicas added later got none of its traffic. Now
// both workers close a connection after --max-connection-age-seconds; calls in
// flight finish on it and the next ones reconnect, losing nothing.
TEST(ReliabilityTest, ConnectionsAgeOutWithoutLosingRequests) {
  const std::string age = "--max-connection-age-seconds=1";
  Worker prefill = StartWorker("prefill_worker", {"--model=synthetic:smollm2-135m", age});
  Worker decode = StartWorker("decode_worker", {"--model=synthetic:smollm2-135m", age,
                                                "--prefill-address=" + prefill.address()});
  auto channel = grpc::CreateChannel(decode.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Decode::NewStub(channel);
  // A stream that outlives several connection ages finishes whole.
  GenerateResult long_stream;
  std::thread t([&] { long_stream = Generate(stub.get(), MakeRequest("long", Prompt(16, 1), 60)); });
  // Requests back to back on the same channel while its connection (and the
  // decode worker's to the prefill worker) is closed every second.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  int n = 0;
  while (std::chrono::steady_clock::now() < until) {
    GenerateResult g = Generate(stub.get(), MakeRequest("r" + std::to_string(n), Prompt(12, n), 4));
    EXPECT_TRUE(g.status.ok()) << "request " << n << ": " << g.status.error_message();
    EXPECT_EQ(g.tokens.size(), 4u);
    ++n;
    if (!g.status.ok()) break;
  }
  t.join();
  EXPECT_TRUE(long_stream.status.ok()) << long_stream.status.error_message();
  EXPECT_EQ(long_stream.tokens.size(), 60u);
  // An idle connection is closed by the server too: the channel goes IDLE
  // (with no age limit keepalives would hold it READY).
  const auto idle_by = std::chrono::system_clock::now() + std::chrono::seconds(5);
  while (channel->GetState(false) == GRPC_CHANNEL_READY &&
         channel->WaitForStateChange(GRPC_CHANNEL_READY, idle_by)) {
  }
  EXPECT_NE(channel->GetState(false), GRPC_CHANNEL_READY);
  ExpectBlocksFreed(prefill, decode);
  StopWorker(decode);
  StopWorker(prefill);
}

// The prefill worker copied a request's whole KV out on the engine thread and
// queued it without bound. Now it makes chunks as the reader takes them: a
// stalled reader leaves the KV in the cache (blocks held, no copy), and the
// blocks are freed once the reader has taken it all.
TEST(ReliabilityTest, PrefillStreamsAreFlowControlled) {
  Worker prefill = StartWorker("prefill_worker", {"--max-num-batched-tokens=4096"});
  auto stub = SlowReaderPrefillStub(prefill.address());
  // 3,000 tokens of the synthetic model: 3 MiB of KV in 4 chunks, more than
  // the stream's window.
  v1::PrefillRequest req;
  req.set_request_id("slow-reader");
  for (int32_t t : Prompt(3000, 7)) req.add_prompt_token_ids(t);
  req.mutable_sampling()->set_max_tokens(1);
  grpc::ClientContext ctx;
  auto reader = stub->Prefill(&ctx, req);
  v1::PrefillResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_TRUE(msg.has_header());  // sent at admission, before the prompt is computed
  // The prompt computed (its blocks show after the step), then a stalled reader.
  const auto computed = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < computed &&
         prefill.Metric("tandem_kv_cache_blocks_in_use") == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_GT(prefill.Metric("tandem_kv_cache_blocks_in_use"), 0);
  int chunks = 0;
  bool done = false;
  while (reader->Read(&msg)) {
    chunks += msg.has_chunk();
    done = done || msg.has_done();
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(chunks, 4);
  EXPECT_TRUE(done);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < end &&
         prefill.Metric("tandem_kv_cache_blocks_in_use") != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(prefill.Metric("tandem_kv_cache_blocks_in_use"), 0);
  StopWorker(prefill);
}

// With the old defaults most prefill steps were above the largest capture
// size (128) and ran eager: the PIECEWISE replay ratio was 0.12. Now prompts
// run in chunks of the token budget and every chunk size has a graph.
TEST(ReliabilityTest, PrefillDefaultsReplayPiecewiseForEveryStep) {
  Worker prefill = StartWorker("prefill_worker", {});
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address()});
  int seed = 0;
  for (int n : {7, 300, 1300}) {  // short, mid-size, and chunked into three steps
    // Distinct seeds: prompts sharing a prefix would reuse its cached KV.
    GenerateResult g =
        Generate(decode.address(), MakeRequest("p" + std::to_string(n), Prompt(n, ++seed), 2));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  }
  const double steps = prefill.Metric("tandem_forward_steps_total", {{"runtime_mode", "PIECEWISE"}}) +
                       prefill.Metric("tandem_forward_steps_total", {{"runtime_mode", "NONE"}}) +
                       prefill.Metric("tandem_forward_steps_total", {{"runtime_mode", "FULL"}});
  EXPECT_GE(steps, 5);  // 1 + 1 + 3 chunks (fewer if batched together)
  EXPECT_EQ(prefill.Metric("tandem_forward_steps_total", {{"runtime_mode", "NONE"}}), 0);
  EXPECT_EQ(prefill.Metric("tandem_cudagraph_replays_total", {{"mode", "PIECEWISE"}}), steps);
  EXPECT_EQ(prefill.Metric("tandem_cudagraph_replay_ratio", {{"mode", "PIECEWISE"}}), 1.0);
  StopWorker(decode);
  StopWorker(prefill);
}

// A request that outgrew the cache mid-decode ended with RESOURCE_EXHAUSTED.
// Now the engine preempts the newest request, the decode worker re-prefills it
// (prompt + tokens so far) on the prefill worker, and it continues: every
// stream completes with the tokens of an unpreempted run. With penalties:
// the prefill worker counts the tokens generated before the preemption as
// output (sampling.prior_output_tokens), not as prompt.
TEST(ReliabilityTest, PreemptedRequestsAreReprefilledAndComplete) {
  Worker prefill = StartWorker("prefill_worker", {});
  // 12 blocks of 16 tokens; each request needs 6 (30 prompt + 60 output).
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address(),
                                                "--num-kv-blocks=12", "--block-size=16",
                                                "--max-num-seqs=8"});
  EngineConfig config;
  config.runner.graph.requested_mode = CudaGraphMode::kNone;
  auto local = LlmEngine::Create(config).value();
  SamplingParams p;
  p.max_tokens = 60;
  p.ignore_eos = true;
  p.frequency_penalty = -1.5f;  // repeats favoured: the output so far matters
  p.presence_penalty = -0.5f;
  constexpr int kRequests = 8;
  std::vector<std::vector<int32_t>> expected(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(local->AddRequest("e" + std::to_string(i), Prompt(30, 40 + i), p).ok());
  }
  while (local->HasWork()) {
    const std::vector<RequestOutput> outputs = local->Step().value();
    for (const RequestOutput& o : outputs) {
      auto& v = expected[std::stoi(o.id.substr(1))];
      v.insert(v.end(), o.new_tokens.begin(), o.new_tokens.end());
    }
  }
  std::vector<GenerateResult> results(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      v1::GenerateRequest r = MakeRequest("pre-" + std::to_string(i), Prompt(30, 40 + i), 60);
      r.mutable_sampling()->set_frequency_penalty(p.frequency_penalty);
      r.mutable_sampling()->set_presence_penalty(p.presence_penalty);
      results[i] = Generate(decode.address(), r);
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, expected[i]) << i;
    EXPECT_EQ(results[i].completion_tokens, 60u);
    EXPECT_EQ(results[i].prompt_tokens, 30u);
  }
  EXPECT_GT(decode.Metric("tandem_preemptions_total"), 0);
  EXPECT_EQ(decode.Metric("tandem_kv_cache_blocks_in_use"), 0);
  EXPECT_EQ(prefill.Metric("tandem_kv_cache_blocks_in_use"), 0);
  StopWorker(decode);
  StopWorker(prefill);
}

}  // namespace
}  // namespace tandem::testing
