#include "common/base/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_CPU_RELAX() _mm_pause()
#else
#define TANDEM_CPU_RELAX() std::this_thread::yield()
#endif

namespace tandem {
namespace {

// How long a worker waits for the next job before it sleeps, and how many
// of its first polls only pause the core; later polls yield it, so that when
// there are more runnable threads than cores (two workers on one machine,
// say) a waiting thread hands its core to the one that is late.
constexpr auto kSpin = std::chrono::microseconds(200);
constexpr int kPauses = 64;

}  // namespace

int ThreadPool::AvailableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < std::max(num_threads, 1); ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

namespace {
thread_local int current_thread = 0;
}  // namespace

int ThreadPool::CurrentThread() { return current_thread; }

void ThreadPool::RunChunk(int index) {
  if (index >= chunks_) return;
  const int64_t begin = n_ * index / chunks_, end = n_ * (index + 1) / chunks_;
  if (begin < end) (*fn_)(begin, end);
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk, const RangeFn& fn) {
  if (n <= 0) return;
  const int64_t chunks = std::min<int64_t>(num_threads(), n / std::max<int64_t>(min_chunk, 1));
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  fn_ = &fn;
  n_ = n;
  chunks_ = static_cast<int>(chunks);
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
    if (sleeping_ > 0) cv_.notify_all();
  }
  RunChunk(0);
  // Wait for the workers; yield now and then in case one of them waits for
  // this very core (more runnable threads than cores).
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kPauses) {
      TANDEM_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  current_thread = index;
  uint64_t seen = 0;
  while (true) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    for (int spins = 0; g == seen; ++spins) {
      if (stop_.load(std::memory_order_relaxed)) return;
      if (spins >= kPauses && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mu_);
        ++sleeping_;
        cv_.wait(lock, [&] {
          return stop_.load() || generation_.load(std::memory_order_acquire) != seen;
        });
        --sleeping_;
        if (stop_.load()) return;
      } else if (spins < kPauses) {
        TANDEM_CPU_RELAX();
      } else {
        std::this_thread::yield();  // let a thread that waits for this core run
      }
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    RunChunk(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace tandem
