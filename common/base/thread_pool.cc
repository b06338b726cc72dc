#include "common/base/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#ifdef __linux__
#include <sys/prctl.h>
#endif

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

std::atomic<int> background_work{0};  // ThreadPool::BackgroundWork alive

// A waiting pool thread gives its core up: for a few microseconds while
// background work runs (ThreadPool::BackgroundWork), else by yielding.
void GiveWay() {
  if (background_work.load(std::memory_order_relaxed) == 0) {
    std::this_thread::yield();
    return;
  }
#ifdef __linux__
  // The default 50 us of timer slack would make each wait that long.
  thread_local const bool slack_set = prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0) == 0;
  (void)slack_set;
#endif
  std::this_thread::sleep_for(std::chrono::microseconds(10));
}

}  // namespace

ThreadPool::BackgroundWork::BackgroundWork() { background_work.fetch_add(1, std::memory_order_relaxed); }
ThreadPool::BackgroundWork::~BackgroundWork() { background_work.fetch_sub(1, std::memory_order_relaxed); }

int CgroupCpuLimit(const std::function<std::string(const std::string&)>& read) {
  double lowest = 0;  // CPUs; 0: no limit seen
  auto limit = [&](double quota, double period) {
    if (quota > 0 && period > 0 && (lowest == 0 || quota / period < lowest)) lowest = quota / period;
  };
  std::istringstream lines(read("/proc/self/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    // hierarchy-id:controllers:path; v2's one line is 0::path.
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    bool cpu = false;
    std::istringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');) cpu |= name == "cpu";
    if (!v2 && !cpu) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/" + controllers;
    // From the process's cgroup up to the root (in a container with its own
    // cgroup namespace the path is "/", the mount its cgroup).
    for (std::string path = line.substr(b + 1);;) {
      const std::string dir = root + (path == "/" ? "" : path);
      if (v2) {
        std::istringstream max(read(dir + "/cpu.max"));
        std::string quota;
        double period = 0;
        if (max >> quota >> period && quota != "max") limit(std::atof(quota.c_str()), period);
      } else {
        limit(std::atof(read(dir + "/cpu.cfs_quota_us").c_str()),
              std::atof(read(dir + "/cpu.cfs_period_us").c_str()));
      }
      const size_t slash = path.find_last_of('/');
      if (path.empty() || path == "/" || slash == std::string::npos) break;
      path = slash == 0 ? "/" : path.substr(0, slash);
    }
  }
  return lowest > 0 ? static_cast<int>(std::ceil(lowest - 1e-9)) : 0;
}

int ThreadPool::AvailableCpus() {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  const int limit = CgroupCpuLimit([](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  });
  if (limit > 0) cpus = std::min(cpus, limit);
  return std::max(1, cpus);
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
      GiveWay();
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
        GiveWay();  // let a thread that waits for this core run
      }
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    RunChunk(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace tandem
