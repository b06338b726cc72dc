// KV integrity and the prefill lifecycle, against real workers: a damaged KV
// stream (through a fault-injecting proxy) never yields a token with status
// OK or a prefix-cache entry; a stuck prefill worker is routed around; a
// stalled or vanished reader never holds the prefill worker's blocks.
#include <signal.h>

#include <map>
#include <thread>
#include <tuple>

#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/fault_proxy.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

// Greedy tokens of the synthetic model, computed in this process.
std::vector<int32_t> LocalTokens(const std::vector<int32_t>& prompt, int max_tokens) {
  EngineConfig config;
  config.runner.graph.requested_mode = CudaGraphMode::kNone;
  config.num_kv_blocks = 512;  // 8,192 tokens: quick to set up under sanitizers
  auto engine = LlmEngine::Create(config).value();
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  EXPECT_TRUE(engine->AddRequest("local", prompt, p).ok());
  std::vector<int32_t> out;
  while (engine->HasWork()) {
    const std::vector<RequestOutput> outputs = engine->Step().value();
    for (const RequestOutput& o : outputs) {
      out.insert(out.end(), o.new_tokens.begin(), o.new_tokens.end());
    }
  }
  return out;
}

v1::GenerateRequest Request(const std::string& id, const std::vector<int32_t>& prompt, int n) {
  v1::GenerateRequest r = MakeRequest(id, prompt, n);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

// A Prefill call for `prompt`, its layers over `num_streams` streams (0: one).
v1::PrefillRequest PrefillOf(const std::string& id, const std::vector<int32_t>& prompt,
                             int num_streams = 0) {
  v1::PrefillRequest r;
  r.set_request_id(id);
  r.set_num_streams(num_streams);
  r.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  return r;
}

double Failures(const Worker& w, const std::string& reason) {
  return w.Metric("tandem_kv_transfer_failures_total", {{"reason", reason}});
}

// The defect: a stream missing every chunk of layers >= 1 ended OK with wrong
// tokens, and its blocks entered the decode worker's prefix cache, so the
// next request with that prefix, through a healthy prefill worker, was wrong
// too.
TEST(KvIntegrityTest, IncompleteStreamIsDataLossAndNeverEntersThePrefixCache) {
  Worker prefill = StartWorker("prefill_worker", {});
  FaultProxy proxy(prefill.address());
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + proxy.address()});
  const std::vector<int32_t> prompt = TestPrompt(64, 11);
  const std::vector<int32_t> expected = LocalTokens(prompt, 8);

  proxy.Inject(Fault::kDropLayersAboveZero);
  GenerateResult bad = Generate(decode.address(), Request("drop", prompt, 8));
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::DATA_LOSS) << bad.status.error_message();
  EXPECT_NE(bad.status.error_message().find("layer 1 is missing tokens [0, 64)"),
            std::string::npos)
      << bad.status.error_message();
  EXPECT_TRUE(bad.tokens.empty());
  EXPECT_EQ(Failures(decode, "incomplete"), 1);
  ExpectBlocksFreed(prefill, decode);
  EXPECT_EQ(decode.Metric("tandem_kv_cache_blocks_cached"), 0);

  proxy.Inject(Fault::kNone);
  GenerateResult good = Generate(decode.address(), Request("healthy", prompt, 8));
  ASSERT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_EQ(good.tokens, expected);
  EXPECT_EQ(decode.Metric("tandem_prefix_cache_hits_total"), 0);
  ExpectBlocksFreed(prefill, decode);
  StopWorker(decode);
  StopWorker(prefill);
}

// The decode worker answers from a stream's `done` message; the stream's end
// (its status) may come later. A worker stopped in between cancels that
// stream and waits for it before its engine and channels go: it used to free
// them under the stream, and gRPC aborted the exiting process ("assertion
// failed: prior > 0") or it touched freed memory.
TEST(KvIntegrityTest, StoppingWithAPrefillStreamStillOpenExitsCleanly) {
  Worker prefill = StartWorker("prefill_worker", {});
  FaultProxy proxy(prefill.address());
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + proxy.address()});
  const std::vector<int32_t> prompt = TestPrompt(40, 12);
  proxy.Inject(Fault::kHoldAfterDone);
  GenerateResult r = Generate(decode.address(), Request("held-open", prompt, 1));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, LocalTokens(prompt, 1));
  StopWorker(decode);  // exits 0
  EXPECT_NE(decode.process->Log().find("cancelling 1 prefill stream(s) still open"),
            std::string::npos)
      << decode.process->Log();
  StopWorker(prefill);
}

// Every damaged stream ends with the right status and no token; a reordered
// but complete one is accepted; stalls end at the prefill budget; with
// --prefill-fallback=local each is computed locally instead, with the right
// tokens. Never a wrong token with status OK; no block left in use.
TEST(KvIntegrityTest, EveryDamagedStreamFailsOrFallsBackWithTheRightTokens) {
  Worker prefill = StartWorker("prefill_worker", {});
  FaultProxy proxy(prefill.address());
  const std::vector<std::string> budget = {"--prefill-address=" + proxy.address(),
                                           "--prefill-timeout-seconds=3",
                                           "--prefill-timeout-per-token-ms=0"};
  Worker strict = StartWorker("decode_worker", budget);
  std::vector<std::string> fallback_flags = budget;
  fallback_flags.push_back("--prefill-fallback=local");
  Worker fallback = StartWorker("decode_worker", fallback_flags);
  struct Case {
    Fault fault;
    grpc::StatusCode strict_code;
    const char* reason;  // counted by the decode worker
  };
  const std::vector<Case> cases = {
      {Fault::kDuplicateChunk, grpc::StatusCode::DATA_LOSS, "incomplete"},
      {Fault::kDropLastChunk, grpc::StatusCode::DATA_LOSS, "incomplete"},
      {Fault::kEndWithoutDone, grpc::StatusCode::DATA_LOSS, "incomplete"},
      {Fault::kReorder, grpc::StatusCode::OK, nullptr},
      {Fault::kStallAfterHeader, grpc::StatusCode::DEADLINE_EXCEEDED, "deadline"},
      {Fault::kStallMidStream, grpc::StatusCode::DEADLINE_EXCEEDED, "deadline"},
  };
  int seed = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.fault));
    // 300 tokens: two chunks per layer, so reordering and dropping the last
    // one leave the others in place.
    const std::vector<int32_t> prompt = TestPrompt(300, ++seed);
    const std::vector<int32_t> expected = LocalTokens(prompt, 6);
    for (Worker* decode : {&strict, &fallback}) {
      const double before = c.reason ? Failures(*decode, c.reason) : 0;
      proxy.Inject(c.fault);
      GenerateResult r = Generate(decode->address(), Request("f" + std::to_string(seed), prompt, 6),
                                  std::chrono::seconds(30));
      const bool falls_back = decode == &fallback;
      const grpc::StatusCode want = falls_back ? grpc::StatusCode::OK : c.strict_code;
      EXPECT_EQ(r.status.error_code(), want) << r.status.error_message();
      if (r.status.ok()) {
        EXPECT_EQ(r.tokens, expected);
      } else {
        EXPECT_TRUE(r.tokens.empty());
      }
      if (c.reason) {
        EXPECT_EQ(Failures(*decode, c.reason), before + 1);
      }
      ExpectBlocksFreed(prefill, *decode);
    }
  }
  EXPECT_EQ(fallback.Metric("tandem_prefill_local_total", {{"reason", "fallback"}}), 5);
  proxy.Inject(Fault::kNone);
  StopWorker(strict);
  StopWorker(fallback);
  StopWorker(prefill);
}

// The defect: with one of two prefill workers frozen (SIGSTOP) every second
// request waited the whole prefill budget and failed, while the decode
// worker reported SERVING. Now the frozen one leaves the rotation, through
// whichever notices first: a call with no first message within 1 s (retried
// on the other worker, the endpoint set aside) or the keepalive (the
// connection fails within ~4 s, the call retried). Every request completes;
// the usable-endpoint gauge says 1 of 2.
TEST(KvIntegrityTest, FrozenPrefillWorkerIsRoutedAround) {
  Worker a = StartWorker("prefill_worker", {});
  Worker b = StartWorker("prefill_worker", {});
  Worker decode = StartWorker("decode_worker",
                              {"--prefill-address=ipv4:" + a.address() + "," + b.address(),
                               "--prefill-first-message-timeout-seconds=1"});
  EXPECT_EQ(AwaitMetric(decode, "tandem_prefill_endpoints", 2), 2);
  for (int i = 0; i < 4; ++i) {  // connect to both
    ASSERT_TRUE(Generate(decode.address(), Request("warm" + std::to_string(i), {1, 2, 3}, 2)).status.ok());
  }
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(TestPrompt(20, 200 + i));
    expected.push_back(LocalTokens(prompts.back(), 4));
  }
  a.process->Signal(SIGSTOP);
  for (int i = 0; i < 8; ++i) {
    GenerateResult r = Generate(decode.address(), Request("fz" + std::to_string(i), prompts[i], 4),
                                std::chrono::seconds(30));
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
    EXPECT_EQ(r.tokens, expected[i]);
  }
  // Round robin alone would send every second request to the frozen worker
  // (4 failed attempts); out of the rotation after its first, it gets few or
  // none (none when the keepalive noticed before any call reached it).
  EXPECT_LE(Failures(decode, "stalled") + Failures(decode, "unavailable"), 2);
  EXPECT_EQ(AwaitMetric(decode, "tandem_prefill_endpoints_usable", 1), 1);
  EXPECT_TRUE(WaitForServing(decode.address(), std::chrono::seconds(2)));
  a.process->Signal(SIGCONT);
  StopWorker(decode);
  StopWorker(a);
  StopWorker(b);
}

// The first-message timeout alone: a peer whose connection stays healthy
// (keepalive answered) but that sends nothing. The first call to it is
// retried on the other endpoint within the timeout and the endpoint is set
// aside, so of eight requests at most two meet it.
TEST(KvIntegrityTest, SilentPrefillEndpointIsSetAsideAfterOneStall) {
  Worker prefill = StartWorker("prefill_worker", {});
  FaultProxy silent(prefill.address());
  silent.Inject(Fault::kStallBeforeHeader);
  Worker decode = StartWorker("decode_worker",
                              {"--prefill-address=ipv4:" + silent.address() + "," +
                                   prefill.address(),
                               "--prefill-first-message-timeout-seconds=1"});
  EXPECT_EQ(AwaitMetric(decode, "tandem_prefill_endpoints", 2), 2);
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(TestPrompt(20, 300 + i));
    expected.push_back(LocalTokens(prompts.back(), 4));
  }
  for (int i = 0; i < 8; ++i) {
    GenerateResult r = Generate(decode.address(), Request("s" + std::to_string(i), prompts[i], 4),
                                std::chrono::seconds(30));
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
    EXPECT_EQ(r.tokens, expected[i]);
  }
  // Round robin reaches the silent endpoint by the second request at the
  // latest; set aside for 10 s, it is met again only on a slow machine.
  EXPECT_GE(Failures(decode, "stalled"), 1);
  EXPECT_LE(Failures(decode, "stalled"), 2);
  EXPECT_LE(silent.calls(), 2);
  EXPECT_EQ(AwaitMetric(decode, "tandem_prefill_endpoints_usable", 1), 1);
  ExpectBlocksFreed(prefill, decode);
  silent.Inject(Fault::kNone);
  StopWorker(decode);
  StopWorker(prefill);
}

// With its only prefill worker gone and no fallback, the decode worker
// reports NOT_SERVING (it cannot serve); with --prefill-fallback=local it
// stays SERVING.
TEST(KvIntegrityTest, HealthFollowsUsablePrefillEndpoints) {
  Worker prefill = StartWorker("prefill_worker", {});
  Worker strict = StartWorker("decode_worker", {"--prefill-address=" + prefill.address()});
  Worker fallback = StartWorker("decode_worker", {"--prefill-address=" + prefill.address(),
                                                  "--prefill-fallback=local"});
  for (Worker* d : {&strict, &fallback}) {
    ASSERT_TRUE(Generate(d->address(), Request("h", {1, 2, 3}, 2)).status.ok());
  }
  StopWorker(prefill);
  for (Worker* d : {&strict, &fallback}) {  // a call notices the connection is gone
    Generate(d->address(), Request("h2", {1, 2, 3}, 2), std::chrono::seconds(10));
  }
  EXPECT_EQ(AwaitMetric(strict, "tandem_prefill_endpoints_usable", 0, std::chrono::seconds(10)), 0);
  auto health = [](const Worker& w) {
    auto stub = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(w.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::health::v1::HealthCheckResponse resp;
    EXPECT_TRUE(stub->Check(&ctx, {}, &resp).ok());
    return resp.status();
  };
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < end &&
         health(strict) != grpc::health::v1::HealthCheckResponse::NOT_SERVING) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(health(strict), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(health(fallback), grpc::health::v1::HealthCheckResponse::SERVING);
  GenerateResult local = Generate(fallback.address(), Request("h3", {1, 2, 3}, 2));
  EXPECT_TRUE(local.status.ok()) << local.status.error_message();
  StopWorker(strict);
  StopWorker(fallback);
}

// A prompt prefilled in chunks of the token budget streams its KV as each
// chunk is computed: run by run (every layer of a run of tokens before the
// next run), not layer by layer over the whole prompt after its last chunk.
// Through the pair the tokens are the local ones and no block is left held;
// a reader that cancels while the prompt is still being computed leaves
// nothing held either, and the worker serves on.
//
// Each streaming test runs twice: with the CPU's KV reads (done when made)
// and with reads that complete after the engine has gone on, as a GPU's
// copies do (--debug-async-kv-reads): layers' reads issued from inside the
// step, chunks made as their reads land, reads still in flight when a
// stream is cancelled.
class KvStreamingTest : public ::testing::TestWithParam<bool> {
 protected:
  // The prefill worker's flags, with this run's kind of reads.
  static std::vector<std::string> PrefillFlags(std::vector<std::string> flags) {
    if (GetParam()) flags.push_back("--debug-async-kv-reads");
    return flags;
  }
};

INSTANTIATE_TEST_SUITE_P(Reads, KvStreamingTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "CompletingLater" : "DoneWhenMade";
                         });

TEST_P(KvStreamingTest, KvStreamsWhileThePromptIsComputed) {
  Worker prefill = StartWorker("prefill_worker", PrefillFlags({"--max-num-batched-tokens=64"}));
  auto stub = v1::Prefill::NewStub(
      grpc::CreateChannel(prefill.address(), grpc::InsecureChannelCredentials()));
  const std::vector<int32_t> prompt = TestPrompt(200, 21);
  {
    const v1::PrefillRequest req = PrefillOf("streamed", prompt);
    grpc::ClientContext ctx;
    auto reader = stub->Prefill(&ctx, req);
    v1::PrefillResponse msg;
    std::vector<std::pair<uint32_t, uint32_t>> chunks;  // (layer, first token)
    uint32_t max_layer = 0;
    bool done = false;
    while (reader->Read(&msg)) {
      if (msg.has_chunk()) {
        chunks.emplace_back(msg.chunk().layer(), msg.chunk().first_token());
        max_layer = std::max(max_layer, msg.chunk().layer());
      }
      done = done || msg.has_done();
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_TRUE(done);
    // Runs start at the budget's multiples; within a run, layers ascend.
    std::vector<uint32_t> run_starts;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (i == 0 || chunks[i].first < chunks[i - 1].first) {
        EXPECT_EQ(chunks[i].first, 0u) << "chunk " << i;  // each run's layer 0 comes first
        run_starts.push_back(chunks[i].second);
      }
    }
    EXPECT_EQ(run_starts, (std::vector<uint32_t>{0, 64, 128, 192}));
    EXPECT_EQ(chunks.size(), 4 * (max_layer + 1));
  }
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address()});
  GenerateResult r = Generate(decode.address(), Request("through-pair", prompt, 6));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, LocalTokens(prompt, 6));
  ExpectBlocksFreed(prefill, decode);
  {
    // 1,500 tokens: 24 steps of 64; cancelled once its first run is out.
    const v1::PrefillRequest req = PrefillOf("cancelled-mid-prompt", TestPrompt(1500, 22));
    grpc::ClientContext ctx;
    auto reader = stub->Prefill(&ctx, req);
    v1::PrefillResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    ASSERT_TRUE(msg.has_header());
    ASSERT_TRUE(reader->Read(&msg));
    ASSERT_TRUE(msg.has_chunk());
    EXPECT_EQ(msg.chunk().first_token(), 0u);
    ctx.TryCancel();
    while (reader->Read(&msg)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_EQ(AwaitMetric(prefill, "tandem_kv_cache_blocks_in_use", 0), 0);
  }
  GenerateResult after = Generate(decode.address(), Request("after-cancel", prompt, 6));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, r.tokens);
  ExpectBlocksFreed(prefill, decode);
  StopWorker(decode);
  StopWorker(prefill);
}

// A reader that stops reading keeps the prefill worker's blocks only for
// the export lease, however far its deadline.
TEST(KvIntegrityTest, StalledReaderLosesItsLease) {
  Worker prefill = StartWorker("prefill_worker", {"--max-num-batched-tokens=4096",
                                                  "--kv-export-timeout-seconds=2"});
  auto stub = SlowReaderPrefillStub(prefill.address());
  const v1::PrefillRequest req = PrefillOf("stalled-reader", TestPrompt(3000, 7));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub->Prefill(&ctx, req);
  v1::PrefillResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_TRUE(msg.has_header());
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < end && Failures(prefill, "expired") < 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Failures(prefill, "expired"), 1);
  EXPECT_EQ(AwaitMetric(prefill, "tandem_kv_cache_blocks_in_use", 0), 0);
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  reader->Finish();
  StopWorker(prefill);
}

// A decode worker frozen (SIGSTOP) or killed while KV streams to it: the
// prefill worker frees the request's blocks (the export lease, or the
// broken connection). The frozen one, resumed, ends its request with an
// error, never a wrong token, and holds no block. The signal comes while
// the prompt is still being computed (64 tokens a step, its KV streamed
// chunk by chunk), and the decode worker's receive window is HTTP/2's
// smallest, so the rest of the prompt's 4 MiB of KV cannot be in flight
// when it stops reading. (Signalled once the prefill worker held all 250
// blocks, with the default 16 MiB window, the whole stream had left before
// any poll saw them, and neither signal found a transfer to break.)
TEST(KvIntegrityTest, FrozenOrKilledDecodeWorkerFreesPrefillBlocks) {
  Worker prefill = StartWorker("prefill_worker", {"--max-num-batched-tokens=64",
                                                  "--kv-export-timeout-seconds=2"});
  for (int sig : {SIGSTOP, SIGKILL}) {
    SCOPED_TRACE(sig);
    Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address(),
                                                  "--kv-receive-window-bytes=65536"});
    // 4,000 tokens: 250 blocks, 4 MiB of KV, 63 prefill steps.
    const std::vector<int32_t> prompt = TestPrompt(4000, sig);
    const double expired = Failures(prefill, "expired");
    const double cancelled = Failures(prefill, "cancelled");
    GenerateResult r;
    std::thread client([&] {
      r = Generate(decode.address(), Request("big", prompt, 2), std::chrono::seconds(60));
    });
    // Freeze or kill it once the prefill worker holds the first steps' KV.
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    double held = 0;
    while (std::chrono::steady_clock::now() < end &&
           (held = prefill.Metric("tandem_kv_cache_blocks_in_use")) < 16) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    decode.process->Signal(sig);
    ASSERT_GE(held, 16) << "the prefill worker never held the prompt's KV";
    ASSERT_LT(held, 250) << "the prompt was computed before the signal: nothing to break";
    EXPECT_EQ(AwaitMetric(prefill, "tandem_kv_cache_blocks_in_use", 0, std::chrono::seconds(20)), 0);
    if (sig == SIGSTOP) {
      // The frozen reader loses its blocks to the lease.
      EXPECT_EQ(Failures(prefill, "expired"), expired + 1);
      decode.process->Signal(SIGCONT);
      client.join();
      EXPECT_FALSE(r.status.ok()) << "frozen mid-stream, yet served";
      EXPECT_EQ(AwaitMetric(decode, "tandem_kv_cache_blocks_in_use", 0, std::chrono::seconds(15)),
                0);
      StopWorker(decode);
    } else {
      client.join();
      EXPECT_FALSE(r.status.ok()) << "killed, yet served";
      EXPECT_EQ(Failures(prefill, "cancelled"), cancelled + 1);
    }
  }
  StopWorker(prefill);
}

// The layers of one request split over three streams, each on a connection
// of its own: stream i gets the layers l % 3 == i, every stream ends with the
// same first token, and together they carry every row once, streamed while
// the prompt is computed. Attaching wrongly is refused by name; the pair with
// --kv-streams=3 gives the local tokens and frees every block; a stream
// cancelled mid-prompt ends the others and frees the request's blocks, and
// a stream that never attaches holds them only for the export lease.
TEST_P(KvStreamingTest, LayersSplitOverSeveralStreams) {
  Worker prefill = StartWorker("prefill_worker", PrefillFlags({"--max-num-batched-tokens=64",
                                                               "--kv-export-timeout-seconds=2"}));
  auto channel = [&](int i) {
    grpc::ChannelArguments args;
    args.SetInt("tandem.kv_stream", i);
    return v1::Prefill::NewStub(
        grpc::CreateCustomChannel(prefill.address(), grpc::InsecureChannelCredentials(), args));
  };
  std::vector<std::unique_ptr<v1::Prefill::Stub>> stubs;
  for (int i = 0; i < 3; ++i) stubs.push_back(channel(i));
  auto attach_request = [](const std::string& id, int index, int n) {
    v1::PrefillRequest r;
    r.set_request_id(id);
    r.set_num_streams(n);
    r.set_stream_index(index);
    return r;
  };
  const std::vector<int32_t> prompt = TestPrompt(200, 31);
  {
    const v1::PrefillRequest req = PrefillOf("split", prompt, 3);
    grpc::ClientContext first_ctx;
    auto first = stubs[0]->Prefill(&first_ctx, req);
    v1::PrefillResponse header;
    ASSERT_TRUE(first->Read(&header));
    ASSERT_TRUE(header.has_header());
    EXPECT_EQ(header.header().num_streams(), 3u);
    EXPECT_EQ(header.header().stream_index(), 0u);
    // Refused: an index past num_streams, an unknown request, an index twice.
    for (const auto& [bad, code] :
         std::vector<std::pair<v1::PrefillRequest, grpc::StatusCode>>{
             {attach_request("split", 3, 3), grpc::StatusCode::INVALID_ARGUMENT},
             {attach_request("split", 1, 2), grpc::StatusCode::INVALID_ARGUMENT},
             {attach_request("nobody", 1, 3), grpc::StatusCode::NOT_FOUND}}) {
      grpc::ClientContext ctx;
      auto reader = stubs[1]->Prefill(&ctx, bad);
      v1::PrefillResponse msg;
      while (reader->Read(&msg)) {
      }
      grpc::Status st = reader->Finish();
      EXPECT_EQ(st.error_code(), code) << st.error_message();
      EXPECT_NE(st.error_message().find("stream_index"), std::string::npos) << st.error_message();
    }
    // (layer, first token, tokens) per stream, and each stream's first token.
    std::vector<std::vector<std::tuple<uint32_t, uint32_t, uint32_t>>> chunks(3);
    std::vector<int32_t> first_tokens(3, -1);
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<std::unique_ptr<grpc::ClientReader<v1::PrefillResponse>>> readers;
    auto attach = [&](int i) {
      contexts.push_back(std::make_unique<grpc::ClientContext>());
      readers.push_back(stubs[i]->Prefill(contexts.back().get(), attach_request("split", i, 3)));
    };
    attach(1);
    {
      // Stream 1 is open once its header has come: attaching it again is
      // refused. (The request stays open until stream 2 attaches.)
      v1::PrefillResponse msg;
      ASSERT_TRUE(readers[0]->Read(&msg));
      ASSERT_TRUE(msg.has_header());
      EXPECT_EQ(msg.header().stream_index(), 1u);
      grpc::ClientContext ctx;
      auto again = stubs[1]->Prefill(&ctx, attach_request("split", 1, 3));
      while (again->Read(&msg)) {
      }
      grpc::Status st = again->Finish();
      EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS) << st.error_message();
    }
    attach(2);
    auto read_all = [&](grpc::ClientReader<v1::PrefillResponse>* reader, int i) {
      v1::PrefillResponse msg;
      while (reader->Read(&msg)) {
        if (msg.has_header()) {
          EXPECT_EQ(msg.header().stream_index(), static_cast<uint32_t>(i));
        }
        if (msg.has_chunk()) {
          chunks[i].emplace_back(msg.chunk().layer(), msg.chunk().first_token(),
                                 msg.chunk().num_tokens());
        }
        if (msg.has_done()) first_tokens[i] = msg.done().first_token();
      }
      EXPECT_TRUE(reader->Finish().ok()) << "stream " << i;
    };
    std::thread t1([&] { read_all(readers[0].get(), 1); });
    std::thread t2([&] { read_all(readers[1].get(), 2); });
    read_all(first.get(), 0);
    t1.join();
    t2.join();
    std::map<uint32_t, int> rows;  // layer -> tokens received
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(first_tokens[i], first_tokens[0]);
      std::vector<uint32_t> run_starts;
      for (const auto& [layer, begin, n] : chunks[i]) {
        EXPECT_EQ(layer % 3, static_cast<uint32_t>(i));
        rows[layer] += n;
        if (run_starts.empty() || begin != run_starts.back()) run_starts.push_back(begin);
      }
      // Streamed as each 64-token step ran, not after the prompt; a stream
      // that attached after some steps gets what they computed as one run.
      if (i == 0) {
        EXPECT_EQ(run_starts, (std::vector<uint32_t>{0, 64, 128, 192}));
      }
      ASSERT_FALSE(run_starts.empty());
      EXPECT_EQ(run_starts.front(), 0u);
      for (uint32_t start : run_starts) EXPECT_EQ(start % 64, 0u) << "stream " << i;
    }
    EXPECT_EQ(rows, (std::map<uint32_t, int>{{0, 200}, {1, 200}, {2, 200}, {3, 200}}));
    EXPECT_EQ(AwaitMetric(prefill, "tandem_kv_cache_blocks_in_use", 0), 0);
  }
  // The test model's KV: 1,024 bytes a token (4 layers, K and V of 2 heads x
  // 16 f32), 204,800 for these 200 tokens: one stream, and one more per whole
  // 100,000 bytes, is three (by default, 8 MiB a stream, it would be one).
  Worker decode = StartWorker("decode_worker", {"--prefill-address=" + prefill.address(),
                                                "--kv-streams=3", "--kv-bytes-per-stream=100000"});
  const double streams_before = prefill.Metric("tandem_kv_transfer_seconds_count");
  GenerateResult r = Generate(decode.address(), Request("through-three", prompt, 6));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(AwaitMetric(prefill, "tandem_kv_transfer_seconds_count", streams_before + 3),
            streams_before + 3);
  EXPECT_EQ(r.tokens, LocalTokens(prompt, 6));
  ExpectBlocksFreed(prefill, decode);
  {
    // 3,000 tokens: 47 steps of 64 (3 MiB a stream, past the flow-control
    // windows); stream 1 cancelled after its first chunk.
    const v1::PrefillRequest req = PrefillOf("cancel-one", TestPrompt(3000, 32), 2);
    grpc::ClientContext first_ctx, second_ctx;
    auto first = stubs[0]->Prefill(&first_ctx, req);
    v1::PrefillResponse msg;
    ASSERT_TRUE(first->Read(&msg));
    ASSERT_TRUE(msg.has_header());
    auto second = stubs[1]->Prefill(&second_ctx, attach_request("cancel-one", 1, 2));
    ASSERT_TRUE(second->Read(&msg));
    ASSERT_TRUE(msg.has_header());
    ASSERT_TRUE(second->Read(&msg));
    ASSERT_TRUE(msg.has_chunk());
    second_ctx.TryCancel();
    while (second->Read(&msg)) {
    }
    EXPECT_EQ(second->Finish().error_code(), grpc::StatusCode::CANCELLED);
    while (first->Read(&msg)) {
    }
    grpc::Status st = first->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
    EXPECT_EQ(AwaitMetric(prefill, "tandem_kv_cache_blocks_in_use", 0), 0);
  }
  {
    // Stream 1 never attaches: the first stream's share goes out, and the
    // blocks are freed when the lease (2 s) runs out.
    const v1::PrefillRequest req = PrefillOf("never-attached", TestPrompt(100, 33), 2);
    grpc::ClientContext ctx;
    auto first = stubs[0]->Prefill(&ctx, req);
    v1::PrefillResponse msg;
    bool done = false;
    while (first->Read(&msg)) done = done || msg.has_done();
    EXPECT_TRUE(first->Finish().ok());
    EXPECT_TRUE(done);
    EXPECT_EQ(AwaitMetric(prefill, "tandem_kv_cache_blocks_in_use", 0, std::chrono::seconds(10)),
              0);
    EXPECT_GE(Failures(prefill, "expired"), 1);
  }
  // A pair request cancelled by its client mid-prefill frees every block on
  // both sides.
  {
    const std::vector<int32_t> long_prompt = TestPrompt(1500, 34);
    auto stub = DecodeStub(decode.address());
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, Request("pair-cancel", long_prompt, 4));
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < end &&
           decode.Metric("tandem_kv_cache_blocks_in_use") <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ctx.TryCancel();
    v1::GenerateResponse out;
    while (reader->Read(&out)) {
    }
    reader->Finish();
    ExpectBlocksFreed(prefill, decode);
  }
  GenerateResult after = Generate(decode.address(), Request("after", prompt, 6));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, r.tokens);
  ExpectBlocksFreed(prefill, decode);
  StopWorker(decode);
  StopWorker(prefill);
}

// The defect: a cancel's release ran twice (the cancel, then a queued
// export step), so a client reusing its request_id right after a cancel
// could have its new request aborted. Each stream is released once.
TEST(KvIntegrityTest, ReusedRequestIdIsNeverHitByAStaleCancel) {
  Worker prefill = StartWorker("prefill_worker", {"--max-num-batched-tokens=4096"});
  auto stub = v1::Prefill::NewStub(
      grpc::CreateChannel(prefill.address(), grpc::InsecureChannelCredentials()));
  const v1::PrefillRequest req = PrefillOf("reused", TestPrompt(2500, 9));
  for (int i = 0; i < 5; ++i) {
    {
      grpc::ClientContext ctx;
      auto reader = stub->Prefill(&ctx, req);
      v1::PrefillResponse msg;
      ASSERT_TRUE(reader->Read(&msg));  // header
      ASSERT_TRUE(reader->Read(&msg));  // the first chunk: the export is under way
      ctx.TryCancel();
      while (reader->Read(&msg)) {
      }
      reader->Finish();
    }
    // Reuse the id at once (retrying while the cancel is still in flight).
    grpc::Status status;
    int chunks = 0;
    bool done = false;
    for (int attempt = 0; attempt < 50; ++attempt) {
      grpc::ClientContext ctx;
      auto reader = stub->Prefill(&ctx, req);
      v1::PrefillResponse msg;
      chunks = 0;
      done = false;
      while (reader->Read(&msg)) {
        chunks += msg.has_chunk();
        done = done || msg.has_done();
      }
      status = reader->Finish();
      if (status.error_code() != grpc::StatusCode::ALREADY_EXISTS) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(status.ok()) << i << ": " << status.error_message();
    EXPECT_TRUE(done);
    EXPECT_EQ(chunks, 4);  // 4 layers, 2500 tokens of 256 KV bytes in one 1 MiB chunk each
  }
  EXPECT_EQ(AwaitMetric(prefill, "tandem_kv_cache_blocks_in_use", 0), 0);
  StopWorker(prefill);
}

}  // namespace
}  // namespace tandem::testing
