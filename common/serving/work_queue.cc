#include "common/serving/work_queue.h"

#include <utility>

#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/base/thread_pool.h"

namespace tandem {

WorkQueue::WorkQueue(int threads, int max_waiting, std::string name, Priority priority)
    : max_waiting_(max_waiting < 1 ? 1 : max_waiting), name_(std::move(name)) {
  for (int i = 0; i < (threads < 1 ? 1 : threads); ++i) {
    threads_.emplace_back([this, priority] {
#ifdef __linux__
      pthread_setname_np(pthread_self(), "tandem-work");
      // Both apply to the calling thread alone on Linux. A failure leaves
      // the default, which costs other clients latency, not correctness.
      if (priority == Priority::kIdle) {
        sched_param none{};
        (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &none);
      } else if (priority == Priority::kLow) {
        (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
      }
#endif
      Run();
    });
  }
}

WorkQueue::~WorkQueue() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

absl::Status WorkQueue::Post(std::function<void()> task) {
  MutexLock lock(&mu_);
  if (static_cast<int>(tasks_.size()) >= max_waiting_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server is busy: ", tasks_.size(), " requests already wait to be parsed (", name_,
        "=", max_waiting_, "); retry shortly"));
  }
  tasks_.push_back(std::move(task));
  return absl::OkStatus();
}

int WorkQueue::waiting() const {
  MutexLock lock(&mu_);
  return static_cast<int>(tasks_.size());
}

void WorkQueue::Run() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      // The analysis cannot see that the lambda runs under mu_ (Await holds it).
      const std::function<bool()> ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stopping_ || !tasks_.empty();
      };
      while (!mu_.AwaitWithTimeout(ready, absl::Seconds(3600))) {
      }
      if (tasks_.empty()) return;  // stopping, nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    // Its threads give their cores up to it at once (ThreadPool::BackgroundWork).
    const ThreadPool::BackgroundWork background;
    task();
  }
}

}  // namespace tandem
