// EngineLoop: tasks from many threads run on the one loop thread, in each
// poster's order; output callbacks see every token and are dropped after the
// finished output; Stop() ends the loop. Run under TSan in CI.
#include "common/serving/engine_loop.h"

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

}  // namespace
}  // namespace tandem
