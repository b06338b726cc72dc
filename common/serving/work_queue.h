// WorkQueue: a fixed set of threads running posted tasks in order, with a
// bound on the tasks that may wait. The HTTP front door parses requests,
// renders chat templates and tokenizes here, so that one large request
// costs its own client time, never the event loop's (every other client's
// /health, stream and small request).
//
// Thread-safe. The destructor runs what is queued, then joins.
#ifndef TANDEM_COMMON_SERVING_WORK_QUEUE_H_
#define TANDEM_COMMON_SERVING_WORK_QUEUE_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/base/mutex.h"

namespace tandem {

class WorkQueue {
 public:
  // How the workers are scheduled beside the engine (Linux; elsewhere
  // kNormal). The engine's threads wait for each other at every op, so a
  // worker that takes one of their cores for its whole time slice stalls
  // every stream: kIdle (SCHED_IDLE) runs the workers in what the engine
  // leaves (it yields while it waits), kLow at nice 10, kNormal as any.
  enum class Priority { kIdle, kLow, kNormal };

  // `threads` >= 1 workers; at most `max_waiting` >= 1 tasks wait for one.
  // `name` names the queue in errors (the flag that sizes it).
  WorkQueue(int threads, int max_waiting, std::string name, Priority priority = Priority::kNormal);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `task`; RESOURCE_EXHAUSTED (naming the limit) when max_waiting
  // tasks already wait, and `task` is dropped unrun.
  absl::Status Post(std::function<void()> task);
  int waiting() const;

 private:
  void Run();

  const int max_waiting_;
  const std::string name_;
  mutable Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_WORK_QUEUE_H_
