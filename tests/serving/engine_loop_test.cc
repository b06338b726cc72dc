// EngineLoop: tasks from many threads run on the one loop thread, in each
// poster's order; output callbacks see every token and are dropped after the
// finished output; Stop() ends the loop. Run under TSan in CI.
#include "common/serving/engine_loop.h"

#include "common/serving/engine_client.h"
#include "common/serving/kv_transfer.h"

#include <atomic>
#include <thread>

#include "common/base/mutex.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// A one-shot event on the project's Mutex, so TSan sees the hand-off
// (Notification is invisible to it with Debian's Abseil).
class Notification {
 public:
  void Notify() {
    MutexLock lock(&mu_);
    notified_ = true;
  }
  bool HasBeenNotified() {
    MutexLock lock(&mu_);
    return notified_;
  }
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return notified_; },
                                timeout);
  }
  void WaitForNotification() { WaitForNotificationWithTimeout(absl::Seconds(60)); }

 private:
  Mutex mu_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

EngineConfig TinyConfig() {
  EngineConfig c;
  c.runner.graph.requested_mode = CudaGraphMode::kFullAndPiecewise;
  c.runner.max_num_seqs = 8;
  c.runner.max_num_batched_tokens = 64;
  c.num_kv_blocks = 64;
  return c;
}

TEST(EngineLoopTest, TasksFromManyThreadsRunOnTheLoopThreadInOrder) {
  Notification ready;
  EngineLoop loop(TinyConfig(), [&](const absl::Status& s, LlmEngine* e) {
    EXPECT_TRUE(s.ok()) << s;
    ready.Notify();
  });
  ready.WaitForNotification();
  constexpr int kThreads = 4, kTasks = 200;
  std::vector<std::vector<int>> seen(kThreads);  // loop thread only
  std::atomic<int> done{0};
  std::thread::id loop_thread;
  std::atomic<bool> one_thread{true};
  std::vector<std::thread> posters;
  for (int t = 0; t < kThreads; ++t) {
    posters.emplace_back([&, t] {
      for (int i = 0; i < kTasks; ++i) {
        loop.Post([&, t, i](LlmEngine&) {
          if (loop_thread == std::thread::id()) loop_thread = std::this_thread::get_id();
          one_thread = one_thread && loop_thread == std::this_thread::get_id();
          seen[t].push_back(i);
          ++done;
        });
      }
    });
  }
  for (auto& p : posters) p.join();
  Notification drained;
  loop.Post([&](LlmEngine&) { drained.Notify(); });
  ASSERT_TRUE(drained.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(done.load(), kThreads * kTasks);
  EXPECT_TRUE(one_thread.load());
  EXPECT_NE(loop_thread, std::this_thread::get_id());
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(seen[t].size(), static_cast<size_t>(kTasks));
    for (int i = 0; i < kTasks; ++i) EXPECT_EQ(seen[t][i], i);
  }
}

TEST(EngineLoopTest, CallbacksSeeEveryTokenThenAreDropped) {
  Notification ready;
  EngineLoop loop(TinyConfig(), [&](const absl::Status&, LlmEngine*) { ready.Notify(); });
  ready.WaitForNotification();
  std::vector<int32_t> tokens;  // loop thread, then read after `finished`
  Notification finished;
  int calls_after_finish = 0;
  loop.Post([&](LlmEngine& engine) {
    SamplingParams p;
    p.max_tokens = 5;
    p.ignore_eos = true;
    ASSERT_TRUE(engine.AddRequest("r", {1, 2, 3}, p).ok());
    loop.SetCallback("r", [&](const RequestOutput& o) {
      if (finished.HasBeenNotified()) ++calls_after_finish;
      tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished) finished.Notify();
    });
  });
  ASSERT_TRUE(finished.WaitForNotificationWithTimeout(absl::Seconds(10)));
  Notification check;
  loop.Post([&](LlmEngine& engine) {
    EXPECT_EQ(tokens.size(), 5u);
    EXPECT_EQ(engine.kv_cache().pool().num_used(), 0);
    check.Notify();
  });
  ASSERT_TRUE(check.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(calls_after_finish, 0);
}

TEST(EngineLoopTest, FailedStartUpReportsAndDropsTasks) {
  EngineConfig bad = TinyConfig();
  bad.runner.max_model_len = 1 << 30;
  Notification reported;
  absl::Status status;
  EngineLoop loop(bad, [&](const absl::Status& s, LlmEngine* e) {
    status = s;
    EXPECT_EQ(e, nullptr);
    reported.Notify();
  });
  ASSERT_TRUE(reported.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(status.ok());
  EXPECT_FALSE(loop.ready());
  loop.Post([](LlmEngine&) { FAIL() << "a task ran without an engine"; });
}

// Collects one request's outputs (loop thread) for the test thread.
struct Collected {
  Mutex mu;
  std::vector<RequestOutput> outputs ABSL_GUARDED_BY(mu);
  Notification finished;
  EngineClient::OutputCallback Callback() {
    return [this](const RequestOutput& o) {
      {
        MutexLock lock(&mu);
        outputs.push_back(o);
      }
      if (o.finished) finished.Notify();
    };
  }
  std::vector<RequestOutput> Take() {
    MutexLock lock(&mu);
    return outputs;
  }
};

// Runs `check` on the loop thread and waits for it.
void OnLoop(EngineLoop& loop, std::function<void(LlmEngine&)> check) {
  Notification done;
  loop.Post([&](LlmEngine& engine) {
    check(engine);
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

EngineClient::Submission Make(const std::string& id, std::vector<int32_t> prompt, uint32_t max_tokens,
                              RequestKind kind = RequestKind::kGenerate) {
  EngineClient::Submission s;
  s.id = id;
  s.prompt = std::move(prompt);
  s.params.max_tokens = max_tokens;
  s.params.ignore_eos = true;
  s.kind = kind;
  return s;
}

TEST(EngineClientTest, OutputsAndErrorsComeBackOnTheRequestsCallback) {
  Notification ready;
  EngineLoop loop(TinyConfig(), [&](const absl::Status&, LlmEngine*) { ready.Notify(); });
  ready.WaitForNotification();
  EngineClient client(&loop);
  EXPECT_EQ(client.fingerprint().num_layers(), static_cast<uint32_t>(loop.model_config().num_hidden_layers));
  Collected ok, empty, dup;
  // The three reach the loop in one batch, before any step: otherwise the
  // first "a" could finish before the second is added (seen in CI under load),
  // and the second would then be a new request, not a duplicate.
  Notification hold;
  loop.Post([&](LlmEngine&) { hold.WaitForNotification(); });
  client.Submit(Make("a", {1, 2, 3}, 5), ok.Callback());
  client.Submit(Make("b", {}, 5), empty.Callback());
  client.Submit(Make("a", {4}, 5), dup.Callback());
  hold.Notify();
  for (Collected* c : {&ok, &empty, &dup}) {
    ASSERT_TRUE(c->finished.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  int tokens = 0;
  for (const RequestOutput& o : ok.Take()) tokens += static_cast<int>(o.new_tokens.size());
  EXPECT_EQ(tokens, 5);
  ASSERT_EQ(empty.Take().size(), 1u);
  EXPECT_EQ(empty.Take()[0].status.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(dup.Take().size(), 1u);
  EXPECT_EQ(dup.Take()[0].status.code(), absl::StatusCode::kAlreadyExists);
  OnLoop(loop, [](LlmEngine& e) { EXPECT_EQ(e.kv_cache().pool().num_used(), 0); });
}

TEST(EngineClientTest, CancelFreesTheBlocksAndEndsTheOutputs) {
  Notification ready;
  EngineLoop loop(TinyConfig(), [&](const absl::Status&, LlmEngine*) { ready.Notify(); });
  ready.WaitForNotification();
  EngineClient client(&loop);
  Collected c;
  Notification first;
  client.Submit(Make("long", {5, 6, 7}, 400), [&](const RequestOutput& o) {
    c.Callback()(o);
    first.Notify();
  });
  ASSERT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(10)));
  client.Cancel("long");
  size_t seen = 0;
  OnLoop(loop, [&](LlmEngine& e) {  // runs after the cancel
    EXPECT_EQ(e.kv_cache().pool().num_used(), 0);
    EXPECT_FALSE(e.HasWork());
    seen = c.Take().size();
  });
  OnLoop(loop, [](LlmEngine&) {});
  EXPECT_EQ(c.Take().size(), seen);  // no output after the cancel
  EXPECT_FALSE(c.finished.HasBeenNotified());
}

TEST(EngineClientTest, QueueLimitAndFailedKvImportFinishTheRequest) {
  Notification ready;
  EngineLoop loop(TinyConfig(), [&](const absl::Status&, LlmEngine*) { ready.Notify(); });
  ready.WaitForNotification();
  EngineClient client(&loop);
  // Submitted from the loop thread, the three run back to back before a step:
  // the second and third find one request waiting.
  Collected r[3];
  OnLoop(loop, [&](LlmEngine&) {
    for (int i = 0; i < 3; ++i) {
      EngineClient::Submission s = Make("q" + std::to_string(i), {1, 2}, 2);
      s.max_waiting = 1;
      client.Submit(std::move(s), r[i].Callback());
    }
  });
  for (Collected& c : r) ASSERT_TRUE(c.finished.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(r[0].Take().back().status.ok());
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(r[i].Take().back().status.code(), absl::StatusCode::kResourceExhausted);
  }
  // A remote-prefill request: its blocks are reserved (kv_needed), then a
  // chunk outside its layers fails it and frees them.
  Collected remote;
  Notification needed;
  client.Submit(Make("remote", {1, 2, 3, 4, 5}, 4, RequestKind::kRemotePrefill),
                [&](const RequestOutput& o) {
                  remote.Callback()(o);
                  if (o.kv_needed) needed.Notify();
                });
  ASSERT_TRUE(needed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(remote.Take()[0].kv_tokens, 5);
  OnLoop(loop, [](LlmEngine& e) {
    EXPECT_GT(e.kv_cache().pool().num_used(), 0);
    EXPECT_EQ(e.num_waiting_for_remote_kv(), 1u);
  });
  v1::KvChunk bad;
  bad.set_layer(99);
  bad.set_num_tokens(1);
  client.ImportKv("remote", ReceivedChunk::Of(bad));
  ASSERT_TRUE(remote.finished.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(remote.Take().back().status.code(), absl::StatusCode::kInvalidArgument);
  OnLoop(loop, [](LlmEngine& e) { EXPECT_EQ(e.kv_cache().pool().num_used(), 0); });
}

// Under priority scheduling a full queue takes a request of higher priority
// (a lower value) in place of the waiting one that would be served last and
// has not started, which fails; an equal or lower priority is refused, as
// under fcfs (SGLang's --max-queued-requests with priority scheduling).
TEST(EngineClientTest, FullPriorityQueueDisplacesTheLastToBeServed) {
  Notification ready;
  EngineConfig config = TinyConfig();
  config.scheduling_policy = SchedulingPolicy::kPriority;
  EngineLoop loop(config, [&](const absl::Status&, LlmEngine*) { ready.Notify(); });
  ready.WaitForNotification();
  EngineClient client(&loop);
  // Submitted from the loop thread, back to back before a step: each finds
  // the ones before it waiting.
  constexpr int kRequests = 5;
  const int32_t priorities[kRequests] = {5, 7, 1, 5, 3};
  Collected r[kRequests];
  OnLoop(loop, [&](LlmEngine&) {
    for (int i = 0; i < kRequests; ++i) {
      EngineClient::Submission s = Make("p" + std::to_string(i), {1, 2}, 2);
      s.params.priority = priorities[i];
      s.max_waiting = 2;
      client.Submit(std::move(s), r[i].Callback());
    }
  });
  for (Collected& c : r) ASSERT_TRUE(c.finished.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // p0 and p1 wait; p2 (1) displaces p1 (7, served last); p3 (5) is refused
  // by the full queue of p2 and p0 (5: not ahead of it); p4 (3) displaces p0.
  std::vector<RequestOutput> out[kRequests];
  for (int i = 0; i < kRequests; ++i) out[i] = r[i].Take();
  EXPECT_TRUE(out[2].back().status.ok()) << out[2].back().status;
  EXPECT_TRUE(out[4].back().status.ok()) << out[4].back().status;
  for (int i : {0, 1, 3}) {
    ASSERT_EQ(out[i].size(), 1u) << i;  // failed before any token
    EXPECT_EQ(out[i].back().status.code(), absl::StatusCode::kResourceExhausted) << i;
  }
  EXPECT_NE(out[1].back().status.message().find("by a request of priority 1, ahead of its 7"),
            std::string::npos)
      << out[1].back().status;
  EXPECT_NE(out[0].back().status.message().find("by a request of priority 3, ahead of its 5"),
            std::string::npos)
      << out[0].back().status;
  EXPECT_NE(out[3].back().status.message().find("2 requests already waiting (limit 2)"),
            std::string::npos)
      << out[3].back().status;
  OnLoop(loop, [](LlmEngine& e) {
    EXPECT_EQ(e.kv_cache().pool().num_used(), 0);
    EXPECT_FALSE(e.HasWork());
  });
}

// The defect: with every request waiting for remote KV the loop stepped
// again at once, each step running nothing: a decode worker spun a core for
// as long as a prompt took to prefill elsewhere (halving the compute of a
// prefill worker on the same host). Now it waits for a task (<= 50 ms), and
// the KV's arrival still wakes it at once.
TEST(EngineClientTest, RequestsWaitingForRemoteKvDoNotSpinTheLoop) {
  Notification ready;
  EngineLoop loop(TinyConfig(), [&](const absl::Status&, LlmEngine*) { ready.Notify(); });
  ready.WaitForNotification();
  std::atomic<int> steps{0};
  OnLoop(loop, [&](LlmEngine&) {
    loop.AddStepObserver([&](LlmEngine&, const std::vector<RequestOutput>&) { ++steps; });
  });
  EngineClient client(&loop);
  Collected remote;
  Notification needed;
  client.Submit(Make("remote", {1, 2, 3}, 3, RequestKind::kRemotePrefill),
                [&](const RequestOutput& o) {
                  remote.Callback()(o);
                  if (o.kv_needed) needed.Notify();
                });
  ASSERT_TRUE(needed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const int before = steps.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // ~10 idle rounds of 50 ms; a spinning loop makes tens of thousands.
  EXPECT_LT(steps.load() - before, 40);
  // Its KV arrives: it decodes and finishes.
  OnLoop(loop, [](LlmEngine& e) {
    const size_t row = e.kv_cache().slot_bytes();
    const std::string zeros(3 * row, '\0');
    const std::vector<absl::string_view> rows = {zeros};
    for (int layer = 0; layer < e.kv_cache().num_layers(); ++layer) {
      ASSERT_TRUE(e.ImportKv("remote", layer, 0, 3, rows, rows).ok());
    }
  });
  client.RemoteKvArrived("remote", 7);
  ASSERT_TRUE(remote.finished.WaitForNotificationWithTimeout(absl::Seconds(10)));
  int tokens = 0;
  for (const RequestOutput& o : remote.Take()) tokens += static_cast<int>(o.new_tokens.size());
  EXPECT_EQ(tokens, 3);
}

// A loop and its engine, once ready.
struct ReadyLoop {
  explicit ReadyLoop(EngineConfig config)
      : loop(std::move(config), [this](const absl::Status&, LlmEngine* e) {
          engine = e;
          ready.Notify();
        }) {
    ready.WaitForNotification();
  }
  Notification ready;  // before loop: the loop's thread notifies it
  LlmEngine* engine = nullptr;
  EngineLoop loop;
};

// The 40-token prompt whose KV the export tests stream.
std::vector<int32_t> ExportedPrompt() {
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[i] = 3 + 5 * i;
  return prompt;
}

// Submits the prefill-only request "p" (ExportedPrompt()) and exports its KV
// in one turn of `loop`, both before its step: `on_chunk` sees each chunk
// made and `on_pause` each time the export waits for more (on the loop
// thread). Returns once the request has finished (`out`).
void ExportWhileComputing(EngineLoop& loop, EngineClient& client,
                          const std::shared_ptr<KvExporter>& exporter, Collected* out,
                          std::function<void(const v1::KvChunk&)> on_chunk,
                          std::function<void()> on_pause) {
  OnLoop(loop, [&](LlmEngine&) {
    client.Submit(Make("p", ExportedPrompt(), 1, RequestKind::kPrefillOnly), out->Callback());
    client.ExportKv(exporter, [exporter, on_chunk, on_pause](const EngineClient::NextChunk& next) {
      while (!exporter->done()) {
        auto msg = next();
        ASSERT_TRUE(msg.ok()) << msg.status();
        if (!msg->has_value()) return on_pause();
        v1::PrefillResponse parsed;
        ASSERT_TRUE(parsed.ParseFromArray((*msg)->data.get(), static_cast<int>((*msg)->size)));
        on_chunk(parsed.chunk());
      }
    });
  });
  ASSERT_TRUE(out->finished.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// A prefill-only request's KV is exported from inside the step computing it:
// the loop runs the export after each layer (EngineLoop::AtNextLayer), so
// every layer's chunk is made before the step ends (the engine's all-layer
// readiness still 0), in layer order.
TEST(EngineClientTest, ExportRunsAfterEachLayerInsideTheStep) {
  ReadyLoop ready(TinyConfig());
  EngineLoop& loop = ready.loop;
  LlmEngine* engine = ready.engine;
  EngineClient client(&loop);
  const int layers = loop.model_config().num_hidden_layers;
  auto exporter = std::make_shared<KvExporter>("p", 0, 40, client.fingerprint(),
                                               client.slot_bytes(), layers);
  Collected out;
  std::vector<std::pair<uint32_t, int64_t>> made;  // (chunk's layer, all-layer readiness)
  ExportWhileComputing(
      loop, client, exporter, &out,
      [&](const v1::KvChunk& chunk) { made.emplace_back(chunk.layer(), engine->KvReadyTokens("p")); },
      [] {});
  OnLoop(loop, [&](LlmEngine& e) {
    EXPECT_TRUE(exporter->done());
    ASSERT_EQ(made.size(), static_cast<size_t>(layers));
    for (int l = 0; l < layers; ++l) {
      EXPECT_EQ(made[l].first, static_cast<uint32_t>(l));
      EXPECT_EQ(made[l].second, 0) << "layer " << l << "'s chunk was made after the step";
    }
    EXPECT_EQ(e.KvReadyTokens("p"), 40);
  });
  client.Cancel("p");
  OnLoop(loop, [](LlmEngine& e) { EXPECT_EQ(e.kv_cache().pool().num_used(), 0); });
}

// As a GPU's: KV reads that complete after the engine has gone on
// (--debug-async-kv-reads). Each layer's read is issued from inside the step
// and its chunk made once the read is done, in layer order; the reads still in
// flight when the step ends are finished by the idle loop, which polls while
// a layer task waits for the device, with no task posted to wake it. Every
// chunk holds the rows the engine has.
TEST(EngineClientTest, AsyncReadsIssuedInsideTheStepFinishOnAnIdleLoop) {
  EngineConfig config = TinyConfig();
  config.backend.debug_async_kv_reads = true;
  ReadyLoop ready(config);
  EngineLoop& loop = ready.loop;
  LlmEngine* engine = ready.engine;
  EngineClient client(&loop);
  ASSERT_TRUE(loop.kv_final_per_layer());
  const int layers = loop.model_config().num_hidden_layers;
  auto exporter = std::make_shared<KvExporter>("p", 0, 40, client.fingerprint(),
                                               client.slot_bytes(), layers);
  Collected out;
  std::vector<v1::KvChunk> made;
  int made_in_step = 0, waits_on_device = 0;
  Notification all_made;
  ExportWhileComputing(
      loop, client, exporter, &out,
      [&](const v1::KvChunk& chunk) {
        made.push_back(chunk);
        made_in_step += engine->stepping();
        if (exporter->done()) all_made.Notify();
      },
      [&] { waits_on_device += exporter->reads_in_flight(); });
  ASSERT_TRUE(all_made.WaitForNotificationWithTimeout(absl::Seconds(10)));
  OnLoop(loop, [&](LlmEngine& e) {
    EXPECT_FALSE(exporter->reads_in_flight());
    EXPECT_GT(waits_on_device, 0);
    EXPECT_GT(made_in_step, 0) << "no read finished while the step ran";
    EXPECT_LT(made_in_step, layers) << "the last layer's read cannot be done inside its step";
    ASSERT_EQ(made.size(), static_cast<size_t>(layers));
    const size_t row = e.kv_cache().slot_bytes();
    for (int l = 0; l < layers; ++l) {
      const v1::KvChunk& chunk = made[l];
      EXPECT_EQ(chunk.layer(), static_cast<uint32_t>(l));
      ASSERT_TRUE(VerifyChunk(ReceivedChunk::Of(chunk), row).ok()) << "layer " << l;
      std::string k(40 * row, '\0'), v(k.size(), '\0');
      ASSERT_TRUE(e.ReadKv("p", l, 0, 40, k.data(), v.data()).ok());
      EXPECT_EQ(chunk.k(), k) << "layer " << l;
      EXPECT_EQ(chunk.v(), v) << "layer " << l;
    }
  });
  client.Cancel("p");
  OnLoop(loop, [](LlmEngine& e) { EXPECT_EQ(e.kv_cache().pool().num_used(), 0); });
}

}  // namespace
}  // namespace tandem
