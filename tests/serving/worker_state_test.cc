#include "common/serving/worker_state.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace tandem {
namespace {

class FakeHealth : public grpc::HealthCheckServiceInterface {
 public:
  void SetServingStatus(const std::string&, bool serving) override { SetServingStatus(serving); }
  void SetServingStatus(bool serving) override {
    ++calls;
    last = serving;
  }
  std::atomic<int> calls{0};
  std::atomic<bool> last{false};
};

// The health follows the state until the service is cleared; from then on
// UpdateHealth reaches nothing, even from a thread that was inside it, so
// the service may be destroyed at once (RunWorker clears it before its
// server goes, while the decode worker's endpoint watcher still runs).
TEST(WorkerStateTest, HealthIsReportedUntilTheServiceIsCleared) {
  WorkerState state;
  auto health = std::make_unique<FakeHealth>();
  state.UpdateHealth();  // none yet: nothing to reach
  state.SetHealthService(health.get());
  state.UpdateHealth();
  EXPECT_EQ(health->calls.load(), 1);
  EXPECT_FALSE(health->last.load());  // not ready
  state.ready = true;
  state.UpdateHealth();
  EXPECT_TRUE(health->last.load());
  state.upstream_usable = false;
  state.UpdateHealth();
  EXPECT_FALSE(health->last.load());
  state.upstream_usable = true;

  std::atomic<bool> stop{false};
  std::thread watcher([&] {
    while (!stop.load()) state.UpdateHealth();
  });
  while (health->calls.load() < 100) std::this_thread::yield();
  state.SetHealthService(nullptr);
  const int calls = health->calls.load();
  health.reset();  // the watcher goes on updating: it must not reach it
  for (int i = 0; i < 1000; ++i) std::this_thread::yield();
  stop = true;
  watcher.join();
  EXPECT_GE(calls, 100);
}

}  // namespace
}  // namespace tandem
