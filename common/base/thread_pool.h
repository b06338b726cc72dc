// ThreadPool: the fork-join pool every CPU kernel runs on.
//
// ParallelFor(n, min_chunk, fn) splits [0, n) into one contiguous chunk per
// thread (the calling thread runs the first) and returns once every chunk is
// done; a range too small to split runs inline on the caller. Workers spin
// for a short while between calls - a decode step issues hundreds of small
// ops back to back, and waking a sleeping thread costs more than such an op -
// then sleep until the next call, so an idle worker burns no CPU.
//
// One caller thread at a time (the engine thread); not reentrant. A CPU graph
// replay calls it from its closures like an eager step does.
#ifndef TANDEM_COMMON_BASE_THREAD_POOL_H_
#define TANDEM_COMMON_BASE_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tandem {

// The CPUs a cgroup CPU limit gives this process: the quota over the period
// (cgroup v2's cpu.max, v1's cpu.cfs_quota_us and cpu.cfs_period_us) rounded
// up, the lowest on the way from its cgroup to the root; 0 when none is set
// or none can be read. `read(path)` gives a file's text, "" when there is
// none: /proc/self/cgroup, then the files under /sys/fs/cgroup. (A pool as
// wide as the host's cores under a smaller quota spends its time throttled:
// every worker spins and waits for the others, which the kernel has parked.)
int CgroupCpuLimit(const std::function<std::string(const std::string&)>& read);

class ThreadPool {
 public:
  // `num_threads` >= 1 counts the caller: num_threads - 1 workers start.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  using RangeFn = std::function<void(int64_t begin, int64_t end)>;
  // Runs fn over [0, n) in at most num_threads() chunks of at least
  // `min_chunk` items each.
  void ParallelFor(int64_t n, int64_t min_chunk, const RangeFn& fn);

  // The calling thread's index in the pool running it: 0 for the caller of
  // ParallelFor (and any thread outside a pool), 1.. for the workers. For
  // per-thread scratch buffers.
  static int CurrentThread();

  // The number of threads the machine offers this process: its CPU affinity
  // mask (`taskset`, a cgroup's cpuset), capped by a cgroup CPU limit (a
  // container's `--cpus`, Kubernetes' limits.cpu: CgroupCpuLimit), at least 1.
  static int AvailableCpus();

  // While one of these lives anywhere in the process (background work for
  // a client: the HTTP front door's parsing), a pool thread that has
  // spun for a while waits by sleeping a few microseconds instead of
  // yielding its core: a yielded core goes to whatever else is runnable, a
  // background thread included, until the scheduler's next tick (4 ms),
  // op after op, while a short sleep ends in a wake-up that takes the core
  // back at once (docs/benchmarks.md, "A large request beside other
  // clients"). Without background work, waits yield as before.
  class BackgroundWork {
   public:
    BackgroundWork();
    ~BackgroundWork();
    BackgroundWork(const BackgroundWork&) = delete;
    BackgroundWork& operator=(const BackgroundWork&) = delete;
  };

 private:
  void WorkerLoop(int index);
  void RunChunk(int index);

  std::vector<std::thread> workers_;
  // The current job: written by the caller before bumping generation_.
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  int chunks_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // workers still running the current job
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // sleeping workers wait on cv_ under it
  std::condition_variable cv_;
  int sleeping_ = 0;  // guarded by mu_
};

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_THREAD_POOL_H_
