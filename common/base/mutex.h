// Mutex / MutexLock: the project's lock, with Abseil's thread-safety
// annotations (clang's -Wthread-safety checks every ABSL_GUARDED_BY field).
//
// It is absl::Mutex, except under ThreadSanitizer: Debian's Abseil is not
// built with TSan, so its hand-offs are invisible to it and real races could
// not be told from false ones. There it is std::mutex with a condition
// variable, which TSan understands.
#ifndef TANDEM_COMMON_BASE_MUTEX_H_
#define TANDEM_COMMON_BASE_MUTEX_H_

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

#if defined(__SANITIZE_THREAD__)
#define TANDEM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TANDEM_TSAN 1
#endif
#endif

#ifdef TANDEM_TSAN
#include <chrono>
#include <condition_variable>
#include <mutex>
#else
#include "absl/synchronization/mutex.h"
#endif

namespace tandem {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
#ifdef TANDEM_TSAN
    m_.lock();
#else
    m_.Lock();
#endif
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
#ifdef TANDEM_TSAN
    // Await() re-checks its condition on every release. Notify while holding
    // the lock: a waiter woken by the release could otherwise return and
    // destroy this Mutex while notify_all() still runs.
    cv_.notify_all();
    m_.unlock();
#else
    m_.Unlock();
#endif
  }
  // With the lock held: waits until `condition` is true or `timeout` passes
  // (the lock is released while waiting). Returns the condition's value.
  bool AwaitWithTimeout(const std::function<bool()>& condition, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
#ifdef TANDEM_TSAN
    std::unique_lock<std::mutex> lock(m_, std::adopt_lock);
    const bool r = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), condition);
    lock.release();
    return r;
#else
    return m_.AwaitWithTimeout(
        absl::Condition(+[](const std::function<bool()>* c) { return (*c)(); }, &condition),
        timeout);
#endif
  }

 private:
#ifdef TANDEM_TSAN
  std::mutex m_;
  std::condition_variable cv_;
#else
  absl::Mutex m_;
#endif
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_MUTEX_H_
