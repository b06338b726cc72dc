// The CPU ops against plain double-precision loops, at 1, 2 and 3 threads:
// the AVX-512 small-batch matmul and the sgemm path on both sides of their
// threshold, odd sizes (vector tails), paged attention over a mixed batch
// (a prefill chunk after cached context, a decode, a fresh prompt, padding),
// and the row-wise ops. Also the pool they all run on.
#include <cstdio>
#include <atomic>
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <thread>
#include <random>
#include <vector>

#include "common/base/thread_pool.h"
#include "common/kernels/backend.h"
#include "common/kernels/cpu/cpu_kernels.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsOnceWhateverTheSplit) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1001}) {
      for (int64_t min_chunk : {1, 4, 100}) {
        std::vector<std::atomic<int>> hits(n);
        pool.ParallelFor(n, min_chunk, [&](int64_t b, int64_t e) {
          EXPECT_LE(0, b);
          EXPECT_LT(b, e);
          EXPECT_LE(e, n);
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
      }
    }
  }
}

TEST(ThreadPoolTest, ManyShortJobsBackToBackAndAfterSleeping) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int round = 0; round < 20000; ++round) {
    pool.ParallelFor(6, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
  }
  EXPECT_EQ(sum.load(), 6 * 20000);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // workers go to sleep
  pool.ParallelFor(6, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
  EXPECT_EQ(sum.load(), 6 * 20001);
  EXPECT_GE(ThreadPool::AvailableCpus(), 1);
}

// A cgroup CPU limit caps the threads (--threads=0, the loader's pool): a
// container's quota over its period rounded up, the lowest from the
// process's cgroup up to the root, in cgroup v2 and v1; none without one.
// While background work runs (the HTTP front door parsing a large body),
// waiting pool threads sleep briefly instead of yielding: jobs still run
// every index once, with threads late and more threads than cores (the
// waits that give way), and with a background thread busy beside them.
TEST(ThreadPoolTest, JobsRunWhileBackgroundWorkRuns) {
  std::atomic<bool> stop{false};
  std::thread background([&] {
    const ThreadPool::BackgroundWork work;
    volatile uint64_t x = 0;
    while (!stop.load()) x = x + 1;
  });
  {
    const ThreadPool::BackgroundWork nested;  // several at once, in any thread
    ThreadPool pool(4);
    std::atomic<int64_t> sum{0};
    for (int round = 0; round < 2000; ++round) {
      pool.ParallelFor(8, 1, [&](int64_t b, int64_t e) {
        if (round % 100 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // a late chunk
        sum.fetch_add(e - b);
      });
    }
    EXPECT_EQ(sum.load(), 8 * 2000);
  }
  stop = true;
  background.join();
}

TEST(ThreadPoolTest, CgroupCpuLimitIsTheLowestQuotaOnTheWayUp) {
  std::map<std::string, std::string> files;
  const auto read = [&](const std::string& path) {
    const auto it = files.find(path);
    return it == files.end() ? std::string() : it->second;
  };
  EXPECT_EQ(CgroupCpuLimit(read), 0);  // nothing to read
  files["/proc/self/cgroup"] = "0::/kubepods/pod1/c1\n";
  files["/sys/fs/cgroup/kubepods/pod1/c1/cpu.max"] = "max 100000\n";
  EXPECT_EQ(CgroupCpuLimit(read), 0);
  files["/sys/fs/cgroup/kubepods/pod1/cpu.max"] = "250000 100000\n";  // 2.5 CPUs
  EXPECT_EQ(CgroupCpuLimit(read), 3);
  files["/sys/fs/cgroup/kubepods/cpu.max"] = "100000 100000\n";
  EXPECT_EQ(CgroupCpuLimit(read), 1);
  files.clear();  // a container's own cgroup namespace: its cgroup is the mount
  files["/proc/self/cgroup"] = "0::/\n";
  files["/sys/fs/cgroup/cpu.max"] = "400000 100000";
  EXPECT_EQ(CgroupCpuLimit(read), 4);
  files.clear();  // cgroup v1
  files["/proc/self/cgroup"] = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n";
  files["/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us"] = "-1\n";
  files["/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us"] = "100000\n";
  EXPECT_EQ(CgroupCpuLimit(read), 0);
  files["/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us"] = "150000\n";
  files["/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_period_us"] = "100000\n";
  EXPECT_EQ(CgroupCpuLimit(read), 2);
}

TEST(CpuKernelsTest, ExpWithinTwoUlpOfLibm) {
  for (float x = -110.f; x < 89.f; x += 0.0137f) {
    const float want = std::exp(x), got = cpu::ExpForTest(x);
    if (std::isinf(want)) {
      EXPECT_TRUE(std::isinf(got)) << x;
      continue;
    }
    if (want < 1e-37f) {  // near or below the smallest normal: tiny, never negative
      EXPECT_GE(got, 0.f) << x;
      EXPECT_LE(got, 1.1e-37f) << x;
      continue;
    }
    ASSERT_LE(std::fabs(got - want), 2.5e-7f * want) << "exp(" << x << ")";
  }
  EXPECT_EQ(cpu::ExpForTest(-1000.f), 0.f);
}

TEST(CpuKernelsTest, SoftmaxAndSiluOddLengths) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-30, 30);
  for (int n : {1, 15, 16, 17, 100}) {
    std::vector<float> x(n), gate(n), up(n), out(n);
    for (int i = 0; i < n; ++i) x[i] = d(rng), gate[i] = d(rng), up[i] = d(rng);
    std::vector<float> p = x;
    cpu::Softmax(p.data(), n);
    double mx = *std::max_element(x.begin(), x.end()), sum = 0;
    for (float v : x) sum += std::exp(double(v) - mx);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(p[i], std::exp(double(x[i]) - mx) / sum, 1e-6) << n;
    cpu::SiluMul(gate.data(), up.data(), out.data(), n);
    for (int i = 0; i < n; ++i) {
      const double want = gate[i] / (1 + std::exp(-double(gate[i]))) * up[i];
      EXPECT_NEAR(out[i], want, 1e-5 * (1 + std::fabs(want))) << n;
    }
  }
}

class CpuOpsTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    BackendOptions o;
    o.device = "cpu";
    o.threads = GetParam();
    backend_ = CreateBackend(o).value();
    arena_ = Arena::Create(backend_->device.get(), size_t{64} << 20, "test").value();
  }
  Ops& ops() { return *backend_->ops; }
  Tensor Random(std::initializer_list<int64_t> dims, float lo = -1, float hi = 1) {
    Tensor t = arena_->Allocate(DType::kF32, dims).value();
    std::uniform_real_distribution<float> d(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = d(rng_);
    return t;
  }
  // Random values stored in `dt` (f32, bf16 or q8_0).
  Tensor RandomAs(DType dt, std::initializer_list<int64_t> dims) {
    Tensor f = Random(dims);
    if (dt == DType::kF32) return f;
    Tensor t = arena_->Allocate(dt, dims).value();
    ConvertFromF32(f.f32(), dt, t.data, f.numel());
    return t;
  }
  static std::vector<float> AsF32(const Tensor& t) {
    std::vector<float> out(t.numel());
    ConvertToF32(t.data, t.dtype, out.data(), t.numel());
    return out;
  }
  Tensor Ints(std::initializer_list<int64_t> dims, const std::vector<int32_t>& v) {
    Tensor t = arena_->Allocate(DType::kI32, dims).value();
    EXPECT_EQ(t.numel(), static_cast<int64_t>(v.size()));
    std::copy(v.begin(), v.end(), t.i32());
    return t;
  }
  // |got - want| <= tol * (1 + scale) (+ slack, where given) for each element.
  static void ExpectNear(const float* got, const std::vector<double>& want,
                         const std::vector<double>& scale, double tol, const std::string& what,
                         const std::vector<double>& slack = {}) {
    int bad = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double allowed = tol * (1 + scale[i]) + (slack.empty() ? 0.0 : slack[i]);
      if (!(std::fabs(got[i] - want[i]) <= allowed)) {
        if (++bad <= 3) ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i];
      }
    }
    EXPECT_EQ(bad, 0) << what;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Arena> arena_;
  std::mt19937 rng_{42};
};

// On every Highway target this CPU runs (the ops choose by target: tiles or
// OpenBLAS's sgemm for prefill-sized products).
TEST_P(CpuOpsTest, MatmulAllRowCountsAndOddSizes) {
  for (const std::string& target : cpu::Targets())
  for (auto [big_n, k] : std::vector<std::pair<int64_t, int64_t>>{{37, 19}, {64, 576}, {100, 33}}) {
    ASSERT_TRUE(cpu::UseTarget(target));
    for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 70}) {
      Tensor x = Random({n, k}), w = Random({big_n, k});
      Tensor out = arena_->Allocate(DType::kF32, {n, big_n}).value();
      ops().Matmul(x, w, out);
      std::vector<double> want(n * big_n), scale(n * big_n);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < big_n; ++j) {
          double s = 0, a = 0;
          for (int64_t d = 0; d < k; ++d) {
            s += double(x.f32()[i * k + d]) * w.f32()[j * k + d];
            a += std::fabs(double(x.f32()[i * k + d]) * w.f32()[j * k + d]);
          }
          want[i * big_n + j] = s;
          scale[i * big_n + j] = a;
        }
      }
      ExpectNear(out.f32(), want, scale, 1e-6,
                 target + " matmul n=" + std::to_string(n) + " N=" + std::to_string(big_n) +
                     " K=" + std::to_string(k));
    }
  }
  ASSERT_TRUE(cpu::UseTarget(""));
}

// MoeMlp against a double-precision loop: each real row's top-k experts of
// the router's softmax (renormalized or not), the shared expert gated by a
// sigmoid where there is one, in f32 and in Q8_0 weights (within the int16
// rounding of x); rows past query_start_loc[num_reqs] (a graph's padding)
// come out zero.
TEST_P(CpuOpsTest, MoeMlpRoutesRealRowsToTheirTopExperts) {
  const int64_t h = 64, inter = 32, shared_inter = 64, experts = 6, rows = 9, real = 7;
  for (const DType dt : {DType::kF32, DType::kQ8_0})
  for (const bool renormalize : {false, true})
  for (const bool with_shared : {false, true}) {
    SCOPED_TRACE(std::string(DTypeName(dt)) + (renormalize ? " renormalized" : "") +
                 (with_shared ? " shared" : ""));
    MoeWeights w;
    w.router = Random({experts, h}, -2, 2);
    w.gate_up = RandomAs(dt, {experts * 2 * inter, h});
    w.down = RandomAs(dt, {experts * h, inter});
    w.top_k = 2;
    w.renormalize = renormalize;
    if (with_shared) {
      w.shared_gate_up = RandomAs(dt, {2 * shared_inter, h});
      w.shared_down = RandomAs(dt, {h, shared_inter});
      w.shared_gate = Random({1, h});
    }
    const int64_t wide = with_shared ? shared_inter : inter;
    MoeBuffers b;
    b.router_logits = arena_->Allocate(DType::kF32, {rows, experts}).value();
    b.x = arena_->Allocate(DType::kF32, {rows, h}).value();
    b.gate_up = arena_->Allocate(DType::kF32, {rows, 2 * wide}).value();
    b.act = arena_->Allocate(DType::kF32, {rows, wide}).value();
    b.y = arena_->Allocate(DType::kF32, {rows, h}).value();
    AttentionMetadata meta;
    meta.num_reqs = Ints({1}, {2});
    meta.query_start_loc = Ints({3}, {0, 4, static_cast<int32_t>(real)});
    Tensor x = Random({rows, h});
    Tensor out = Random({rows, h});  // stale values: every row is written
    ops().MoeMlp(x, w, b, meta, out);

    const std::vector<float> gate_up = AsF32(w.gate_up), down = AsF32(w.down);
    const std::vector<float> shared_gate_up = with_shared ? AsF32(w.shared_gate_up)
                                                          : std::vector<float>();
    const std::vector<float> shared_down = with_shared ? AsF32(w.shared_down)
                                                       : std::vector<float>();
    // One SwiGLU MLP of row i (gate rows, then up rows, from `gu`).
    auto mlp = [&](int64_t i, const float* gu, const float* dn, int64_t width,
                   std::vector<double>* y, std::vector<double>* scale) {
      std::vector<double> act(width);
      for (int64_t j = 0; j < width; ++j) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < h; ++d) {
          g += double(x.f32()[i * h + d]) * gu[j * h + d];
          u += double(x.f32()[i * h + d]) * gu[(width + j) * h + d];
        }
        act[j] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t c = 0; c < h; ++c) {
        double s = 0, a = 0;
        for (int64_t j = 0; j < width; ++j) {
          s += act[j] * dn[c * width + j];
          a += std::fabs(act[j] * dn[c * width + j]);
        }
        (*y)[c] = s;
        (*scale)[c] = a;
      }
    };
    std::vector<double> want(rows * h, 0.0), scale(rows * h, 0.0);
    for (int64_t i = 0; i < real; ++i) {
      std::vector<double> p(experts);
      double top = -1e30, sum = 0;
      for (int64_t e = 0; e < experts; ++e) {
        for (int64_t d = 0; d < h; ++d) p[e] += double(x.f32()[i * h + d]) * w.router.f32()[e * h + d];
        top = std::max(top, p[e]);
      }
      for (double& v : p) sum += (v = std::exp(v - top));
      for (double& v : p) v /= sum;
      std::vector<int64_t> order(experts);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return p[a] > p[c]; });
      const double chosen = p[order[0]] + p[order[1]];
      std::vector<double> y(h), s(h);
      for (int k = 0; k < 2; ++k) {
        const int64_t e = order[k];
        mlp(i, gate_up.data() + e * 2 * inter * h, down.data() + e * h * inter, inter, &y, &s);
        const double weight = renormalize ? p[e] / chosen : p[e];
        for (int64_t c = 0; c < h; ++c) {
          want[i * h + c] += weight * y[c];
          scale[i * h + c] += weight * s[c];
        }
      }
      if (!with_shared) continue;
      mlp(i, shared_gate_up.data(), shared_down.data(), shared_inter, &y, &s);
      double g = 0;
      for (int64_t d = 0; d < h; ++d) g += double(x.f32()[i * h + d]) * w.shared_gate.f32()[d];
      const double weight = 1 / (1 + std::exp(-g));
      for (int64_t c = 0; c < h; ++c) {
        want[i * h + c] += weight * y[c];
        scale[i * h + c] += weight * s[c];
      }
    }
    ExpectNear(out.f32(), want, scale, dt == DType::kF32 ? 1e-5 : 1e-3, "moe");
  }
}

// Narrow weights (q8_0 by --weight-dtype, bf16 by --dtype): the small-batch
// kernels and the widen-then-sgemm path against double loops over the widened
// weights (what the kernels must compute exactly, up to f32 rounding), and
// the embedding of a narrow table.
TEST_P(CpuOpsTest, NarrowWeightsMatchTheWidenedWeights) {
  struct Case {
    DType dt;
    std::vector<std::pair<int64_t, int64_t>> shapes;  // {N, K}
  };
  for (const Case& tc : {Case{DType::kQ8_0, {{37, 32}, {64, 576}, {100, 96}}},
                         Case{DType::kQ4_0, {{37, 32}, {64, 576}}},
                         Case{DType::kQ4_1, {{37, 32}, {100, 96}}},
                         Case{DType::kBF16, {{37, 19}, {64, 576}, {100, 33}}}}) {
    BackendOptions o;
    o.threads = GetParam();
    if (tc.dt == DType::kBF16) o.dtype = "bf16";
    if (tc.dt == DType::kQ8_0) o.weight_dtype = "q8_0";
    if (tc.dt == DType::kQ4_0 || tc.dt == DType::kQ4_1) o.weight_dtype = "gguf";
    auto narrow = CreateBackend(o).value();
    if (o.weight_dtype != "gguf") {
      EXPECT_EQ(narrow->ops->weight_dtype(), tc.dt);
    }
    // A file's blocks are kept by default (auto) and by gguf; q8_0 requantizes.
    EXPECT_EQ(narrow->ops->keeps_file_blocks(), o.weight_dtype != "q8_0");
    for (auto [big_n, k] : tc.shapes) {
      const std::string what = std::string(DTypeName(tc.dt)) + " N=" + std::to_string(big_n) +
                               " K=" + std::to_string(k);
      Tensor wf = Random({big_n, k});
      Tensor wq = arena_->Allocate(tc.dt, {big_n, k}).value();
      ConvertFromF32(wf.f32(), tc.dt, wq.data, wf.numel());
      ASSERT_EQ(wq.nbytes(), tc.dt == DType::kBF16 ? static_cast<size_t>(big_n * k * 2)
                                                   : big_n * k / 32 * BlockBytes(tc.dt));
      const std::vector<float> deq = AsF32(wq);
      for (int64_t i = 0; i < wf.numel(); ++i) {
        // Within half a step of the original (|w| <= 1): q8_0 (d <= 1/127),
        // q4_1 (d <= 2/15); q4_0 within a step (d <= 1/8; the top is
        // clamped); bf16 (8 significant bits).
        const float tol = tc.dt == DType::kQ8_0   ? 0.5f / 127 + 1e-3f
                          : tc.dt == DType::kQ4_1 ? 1.f / 15 + 1e-3f
                          : tc.dt == DType::kQ4_0 ? 1.f / 8 + 1e-3f
                                                  : std::fabs(wf.f32()[i]) / 256 + 1e-30f;
        ASSERT_LE(std::fabs(deq[i] - wf.f32()[i]), tol) << what << " " << i;
      }
      for (int64_t n : {1, 2, 3, 5, 8, 9, 32, 33, 70}) {
        Tensor x = Random({n, k});
        Tensor out = arena_->Allocate(DType::kF32, {n, big_n}).value();
        narrow->ops->Matmul(x, wq, out);
        // Prefill-sized batches over bf16 weights take bf16 dot products
        // where the CPU has them: x is rounded to bf16 first.
        std::vector<float> xs(x.f32(), x.f32() + x.numel());
        if (tc.dt == DType::kBF16 && n > cpu::kSmallMatmulMaxRows && cpu::PreferDpBf16()) {
          std::vector<uint16_t> bits(xs.size());
          ConvertFromF32(xs.data(), DType::kBF16, bits.data(), x.numel());
          ConvertToF32(bits.data(), DType::kBF16, xs.data(), x.numel());
        }
        // The portable kernels multiply block types by x rounded to int16
        // per 32 elements (each off by at most its block's max|x| / 65534):
        // at every row count on x86 from AVX2 up, up to kSmallMatmulMaxRows
        // elsewhere (sgemm over widened weights above).
        const bool int16_x = IsBlockType(tc.dt) &&
                             (n <= cpu::kSmallMatmulMaxRows || cpu::BlocksAtEveryRowCount());
        std::vector<double> want(n * big_n), scale(n * big_n), slack(n * big_n);
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < big_n; ++j) {
            double sum = 0, a = 0, r = 0;
            for (int64_t d = 0; d < k; ++d) {
              sum += double(xs[i * k + d]) * deq[j * k + d];
              a += std::fabs(double(xs[i * k + d]) * deq[j * k + d]);
              if (int16_x) {
                const float* block = &xs[i * k + d / 32 * 32];
                float amax = 0.f;
                for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(block[e]));
                r += std::fabs(deq[j * k + d]) * amax / 65534.0;
              }
            }
            want[i * big_n + j] = sum;
            scale[i * big_n + j] = a;
            slack[i * big_n + j] = r;
          }
        }
        ExpectNear(out.f32(), want, scale, 1e-6, "matmul n=" + std::to_string(n) + " " + what,
                   slack);
      }
      Tensor ids = Ints({3}, {0, static_cast<int32_t>(big_n) - 1, 5});
      Tensor emb = arena_->Allocate(DType::kF32, {3, k}).value();
      narrow->ops->Embedding(ids, wq, emb);
      for (int r = 0; r < 3; ++r) {
        const int64_t row = ids.i32()[r];
        for (int64_t d = 0; d < k; ++d) ASSERT_EQ(emb.f32()[r * k + d], deq[row * k + d]);
      }
    }
  }
  // Only where it is implemented, and only by name.
  BackendOptions o;
  o.weight_dtype = "q8_0";
  o.device = "cuda";
  EXPECT_EQ(CreateBackend(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.device = "cpu";
  o.weight_dtype = "q4";
  EXPECT_NE(CreateBackend(o).status().message().find(
                "weight_dtype must be auto, dense, q8_0 or gguf, got 'q4'"),
            std::string::npos);
  o.weight_dtype = "auto";
  o.dtype = "f16";
  EXPECT_NE(CreateBackend(o).status().message().find("dtype=f16 is not supported by device=cpu"),
            std::string::npos);
}

// TANDEM_CPU_TARGET picks the Highway target by name; a name the CPU cannot
// run is refused, naming the value and the choices.
TEST(CpuBackendTest, CpuTargetIsChosenByTheEnvironment) {
  const std::vector<std::string> targets = cpu::Targets();
  BackendOptions o;
  setenv("TANDEM_CPU_TARGET", targets.back().c_str(), 1);
  ASSERT_TRUE(CreateBackend(o).ok());
  EXPECT_EQ(cpu::Target(), targets.back());
  setenv("TANDEM_CPU_TARGET", "NO_SUCH_TARGET", 1);
  const absl::Status bad = CreateBackend(o).status();
  unsetenv("TANDEM_CPU_TARGET");
  ASSERT_TRUE(cpu::UseTarget(""));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("TANDEM_CPU_TARGET=NO_SUCH_TARGET is not a target this CPU runs (one "
                               "of: " + targets.front()),
            std::string::npos)
      << bad;
}

TEST_P(CpuOpsTest, RowOpsMatchPlainLoops) {
  for (int64_t n : {1, 37}) {
    const int64_t h = 40;
    Tensor x = Random({n, h}), res = Random({n, h}), w = Random({h}, 0.5f, 1.5f);
    std::vector<float> res0(res.f32(), res.f32() + n * h);
    Tensor out = arena_->Allocate(DType::kF32, {n, h}).value();
    Tensor out2 = arena_->Allocate(DType::kF32, {n, h}).value();
    ops().RmsNorm(x, w, 1e-5f, out);
    ops().AddRmsNorm(x, res, w, 1e-5f, out2);
    std::vector<double> want(n * h), want2(n * h), ones(n * h, 1.0);
    for (int64_t i = 0; i < n; ++i) {
      double ss = 0, ss2 = 0;
      for (int64_t j = 0; j < h; ++j) {
        ss += double(x.f32()[i * h + j]) * x.f32()[i * h + j];
        const double r = double(x.f32()[i * h + j]) + res0[i * h + j];
        ss2 += r * r;
      }
      for (int64_t j = 0; j < h; ++j) {
        want[i * h + j] = x.f32()[i * h + j] / std::sqrt(ss / h + 1e-5) * w.f32()[j];
        const double r = double(x.f32()[i * h + j]) + res0[i * h + j];
        want2[i * h + j] = r / std::sqrt(ss2 / h + 1e-5) * w.f32()[j];
        EXPECT_NEAR(res.f32()[i * h + j], r, 1e-6);  // the residual carries the sum
      }
    }
    ExpectNear(out.f32(), want, ones, 1e-5, "rmsnorm");
    ExpectNear(out2.f32(), want2, ones, 1e-5, "add_rmsnorm");

    const int64_t inter = 24;
    Tensor gu = Random({n, 2 * inter}, -4, 4);
    Tensor act = arena_->Allocate(DType::kF32, {n, inter}).value();
    ops().SiluMul(gu, act);
    std::vector<double> want_act(n * inter), ones_act(n * inter, 1.0);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < inter; ++j) {
        const double g = gu.f32()[i * 2 * inter + j], u = gu.f32()[i * 2 * inter + inter + j];
        want_act[i * inter + j] = g / (1 + std::exp(-g)) * u;
      }
    }
    ExpectNear(act.f32(), want_act, ones_act, 1e-5, "silu_mul");

    AttentionShape shape{2, 1, 8, 1.f};
    const int64_t row = (2 + 2 * 1) * 8;
    Tensor qkv = Random({n, row});
    std::vector<float> before(qkv.f32(), qkv.f32() + n * row);
    std::vector<int32_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i * 97 % 5000);
    Tensor positions = Ints({n}, pos);
    Tensor inv_freq = arena_->Allocate(DType::kF32, {4}).value();
    for (int f = 0; f < 4; ++f) inv_freq.f32()[f] = std::pow(10000.f, -2.f * f / 8);
    ops().Rope(positions, qkv, inv_freq, shape);
    std::vector<double> want_rope(before.begin(), before.end()), ones_rope(n * row, 1.0);
    for (int64_t i = 0; i < n; ++i) {
      for (int head = 0; head < 3; ++head) {  // 2 q heads, 1 k head; v untouched
        for (int f = 0; f < 4; ++f) {
          const double angle = double(pos[i]) * inv_freq.f32()[f];
          const double a = before[i * row + head * 8 + f], b = before[i * row + head * 8 + f + 4];
          want_rope[i * row + head * 8 + f] = a * std::cos(angle) - b * std::sin(angle);
          want_rope[i * row + head * 8 + f + 4] = b * std::cos(angle) + a * std::sin(angle);
        }
      }
    }
    ExpectNear(qkv.f32(), want_rope, ones_rope, 2e-3, "rope");  // f32 angles up to 5000 rad
  }
}

// With an f32 cache and with a bf16 one (--dtype=bf16 on the CPU): the new
// tokens' k and v are rounded to bf16 in their slots, and attention reads the
// cache as it is stored. On every Highway target this CPU runs (prefill
// chunks' products by the tiles or by OpenBLAS's sgemm, as the target says).
// With a sliding window too: of 1 key (the query's own), of 7 (shorter than
// a tile's queries), of 64 (a tile's first rows see keys its last do not).
TEST_P(CpuOpsTest, PagedAttentionMixedBatch) {
  for (const std::string& target : cpu::Targets())
  for (DType kv : {DType::kF32, DType::kBF16})
  for (int hd : {24, 64, 128}) {
    ASSERT_TRUE(cpu::UseTarget(target));
    BackendOptions o;
    o.threads = GetParam();
    o.dtype = std::string(DTypeName(kv));
    auto backend = CreateBackend(o).value();
    ASSERT_EQ(backend->ops->kv_dtype(), kv);
    ASSERT_EQ(backend->ops->dtype(), DType::kF32);
    const int nh = 4, nkv = 2, bs = 4, num_blocks = 100, max_seqs = 5, width = 48;
    AttentionShape shape{nh, nkv, hd, 1.f / std::sqrt(static_cast<float>(hd))};
    // r0: a 140-token prefill chunk after 13 cached (tiled path, three query
    // tiles, run out of order); r1: 1 decode token after 40; r2: 3 tokens of
    // a fresh prompt; r3: 9 of another (tiled path); then 2 padding rows.
    const std::vector<int32_t> q_len = {140, 1, 3, 9}, cached = {13, 40, 0, 0};
    const int num_real = 4;
    const int64_t n = 140 + 1 + 3 + 9 + 2, row = (nh + 2 * nkv) * hd, kv_row = nkv * hd;
    std::vector<int32_t> blocks(num_blocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng_);
    std::vector<int32_t> tables(max_seqs * width, 0), qsl(max_seqs + 1, 153), seq(max_seqs, 0),
        slots(n, -1);
    int used = 0;
    qsl[0] = 0;
    for (int r = 0; r < num_real; ++r) {
      seq[r] = cached[r] + q_len[r];
      for (int b = 0; b * bs < seq[r]; ++b) tables[r * width + b] = blocks[used++];
      qsl[r + 1] = qsl[r] + q_len[r];
      for (int t = 0; t < q_len[r]; ++t) {
        const int pos = cached[r] + t;
        slots[qsl[r] + t] = tables[r * width + pos / bs] * bs + pos % bs;
      }
    }
    AttentionMetadata meta;
    meta.num_reqs = Ints({1}, {num_real});
    meta.query_start_loc = Ints({max_seqs + 1}, qsl);
    meta.seq_lens = Ints({max_seqs}, seq);
    meta.block_tables = Ints({max_seqs, width}, tables);
    meta.slot_mapping = Ints({n}, slots);
    meta.block_size = bs;
    KvLayer cache{RandomAs(kv, {num_blocks, bs, nkv, hd}), RandomAs(kv, {num_blocks, bs, nkv, hd})};
    Tensor qkv = Random({n, row});
    for (int window : {0, 1, 7, 64}) {
      shape.sliding_window = window;
      Tensor out = Random({n, nh * hd});  // garbage that must be overwritten
      backend->ops->PagedAttention(qkv, cache, meta, shape, out);

      // The new tokens' k and v are in their slots, rounded to the cache's dtype.
      const std::vector<float> kf = AsF32(cache.k), vf = AsF32(cache.v);
      std::vector<float> stored(kv_row);
      for (int64_t i = 0; i < 153; ++i) {
        for (int part = 0; part < 2; ++part) {
          const float* src = qkv.f32() + i * row + nh * hd + part * kv_row;
          std::vector<uint16_t> bits(kv_row);
          if (kv == DType::kBF16) {
            ConvertFromF32(src, kv, bits.data(), kv_row);
            ConvertToF32(bits.data(), kv, stored.data(), kv_row);
          } else {
            stored.assign(src, src + kv_row);
          }
          const std::vector<float>& c = part == 0 ? kf : vf;
          for (int64_t d = 0; d < kv_row; ++d) ASSERT_EQ(c[slots[i] * kv_row + d], stored[d]);
        }
      }
      std::vector<double> want(n * nh * hd, 0.0), ones(n * nh * hd, 1.0);
      for (int r = 0; r < num_real; ++r) {
        for (int t = 0; t < q_len[r]; ++t) {
          const int64_t tok = qsl[r] + t;
          const int ctx = cached[r] + t + 1;
          const int first = window > 0 ? std::max(0, ctx - window) : 0;  // the window's first key
          for (int h = 0; h < nh; ++h) {
            const float* q = qkv.f32() + tok * row + h * hd;
            const int kvh = h / (nh / nkv);
            std::vector<double> p(ctx);
            double mx = -1e300, sum = 0;
            for (int j = first; j < ctx; ++j) {
              const int64_t slot = int64_t(tables[r * width + j / bs]) * bs + j % bs;
              double dot = 0;
              for (int d = 0; d < hd; ++d) dot += double(q[d]) * kf[slot * kv_row + kvh * hd + d];
              p[j] = dot * shape.scale;
              mx = std::max(mx, p[j]);
            }
            for (int j = first; j < ctx; ++j) sum += (p[j] = std::exp(p[j] - mx));
            for (int j = first; j < ctx; ++j) {
              const int64_t slot = int64_t(tables[r * width + j / bs]) * bs + j % bs;
              for (int d = 0; d < hd; ++d) {
                want[tok * nh * hd + h * hd + d] +=
                    p[j] / sum * vf[slot * kv_row + kvh * hd + d];
              }
            }
          }
        }
      }
      ExpectNear(out.f32(), want, ones, 1e-5,
                 target + " attention hd=" + std::to_string(hd) + " kv " +
                     std::string(DTypeName(kv)) + " window " + std::to_string(window));
    }
  }
  ASSERT_TRUE(cpu::UseTarget(""));
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuOpsTest, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "t" + std::to_string(info.param); });

}  // namespace
}  // namespace tandem
