#include "common/graph/cudagraph_wrapper.h"

#include <map>
#include <string>
#include <vector>

#include "common/backend/cpu/cpu_stream.h"
#include "common/graph/forward_context.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using M = CudaGraphMode;

// A runnable that issues `out[i] = in[i] * 2` on the stream and counts how
// often its host code runs.
struct Doubler {
  CpuStream* stream;
  std::vector<float>* in;
  std::vector<float>* out;
  int host_calls = 0;
  absl::Status operator()() {
    ++host_calls;
    float* src = in->data();
    float* dst = out->data();
    size_t n = in->size();
    stream->Launch("copy", [src, dst, n] {
      for (size_t i = 0; i < n; ++i) dst[i] = src[i] * 2;
    });
    return absl::OkStatus();
  }
};

TEST(CpuStreamTest, ReplayReadsNewBufferContentsWithoutHostCode) {
  CpuStream stream;
  std::vector<float> in = {1, 2, 3}, out(3);
  Doubler doubler{&stream, &in, &out};
  ASSERT_TRUE(stream.BeginCapture().ok());
  ASSERT_TRUE(doubler().ok());
  EXPECT_EQ(out, std::vector<float>(3, 0.f));  // recorded, not run
  auto graph = stream.EndCapture();
  ASSERT_TRUE(graph.ok());
  EXPECT_EQ((*graph)->num_nodes(), 1u);
  in = {5, 6, 7};
  const int64_t launched = stream.ops_launched();
  ASSERT_TRUE((*graph)->Replay().ok());
  EXPECT_EQ(out, (std::vector<float>{10, 12, 14}));
  EXPECT_EQ(doubler.host_calls, 1);
  EXPECT_EQ(stream.ops_launched(), launched);
  EXPECT_EQ(stream.ops_executed(), 1);
}

TEST(CpuStreamTest, CaptureStateErrors) {
  CpuStream stream;
  EXPECT_EQ(stream.EndCapture().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(stream.BeginCapture().ok());
  EXPECT_EQ(stream.BeginCapture().code(), absl::StatusCode::kFailedPrecondition);
}

// A start-up capture pass records the graph without running it (its output
// is never read); a later call with the same key replays it.
TEST(CudaGraphWrapperTest, CaptureOnlyPassRecordsWithoutRunning) {
  CpuStream stream;
  std::vector<float> in = {1, 2}, out(2);
  Doubler doubler{&stream, &in, &out};
  CudaGraphWrapper w("piece", M::kPiecewise, &stream, std::ref(doubler));
  const BatchDescriptor key(2);
  {
    ForwardContextScope scope(M::kPiecewise, key, /*capture_only=*/true);
    ASSERT_TRUE(w.Run().ok());
  }
  EXPECT_EQ(w.captures(), 1);
  EXPECT_EQ(stream.ops_executed(), 0);
  EXPECT_EQ(out, std::vector<float>(2, 0.f));
  {
    ForwardContextScope scope(M::kPiecewise, key);
    ASSERT_TRUE(w.Run().ok());
  }
  EXPECT_EQ(w.replays(), 1);
  EXPECT_EQ(out, (std::vector<float>{2, 4}));
  EXPECT_EQ(doubler.host_calls, 1);
}

TEST(CudaGraphWrapperTest, PassThroughCaptureReplay) {
  CpuStream stream;
  std::vector<float> in = {1, 2}, out(2);
  Doubler doubler{&stream, &in, &out};
  CudaGraphWrapper w("doubler", M::kFull, &stream, std::ref(doubler));

  ASSERT_TRUE(w.Run().ok());  // no context: pass-through
  {
    ForwardContextScope none(M::kNone, BatchDescriptor(2));
    ASSERT_TRUE(w.Run().ok());
  }
  {
    ForwardContextScope pw(M::kPiecewise, BatchDescriptor(2));
    ASSERT_TRUE(w.Run().ok());  // not its mode: pass-through
  }
  EXPECT_EQ(w.passthroughs(), 3);
  EXPECT_EQ(doubler.host_calls, 3);

  const BatchDescriptor key(2, 2, true, false);
  {
    ForwardContextScope full(M::kFull, key);
    in = {3, 4};
    ASSERT_TRUE(w.Run().ok());  // capture, and the real output
    EXPECT_EQ(out, (std::vector<float>{6, 8}));
    EXPECT_EQ(w.captures(), 1);
    EXPECT_EQ(doubler.host_calls, 4);
    in = {10, 20};
    ASSERT_TRUE(w.Run().ok());  // replay: no host code
    EXPECT_EQ(out, (std::vector<float>{20, 40}));
    EXPECT_EQ(w.replays(), 1);
    EXPECT_EQ(doubler.host_calls, 4);
  }
  {
    ForwardContextScope other(M::kFull, BatchDescriptor(2, 1, false, false));
    ASSERT_TRUE(w.Run().ok());  // a new key: a second graph
  }
  EXPECT_EQ(w.captures(), 2);
  EXPECT_EQ(w.num_graphs(), 2u);
}

// One FULL wrapper around the whole forward, a PIECEWISE wrapper around each
// piece, and an eager "attention" between the pieces.
struct NestedModel {
  CpuStream stream;
  std::vector<float> x{1.f}, h{0.f}, y{0.f};
  int attention_host_calls = 0;
  std::unique_ptr<CudaGraphWrapper> piece1, piece2, full;

  NestedModel() {
    piece1 = std::make_unique<CudaGraphWrapper>("piece1", M::kPiecewise, &stream, [this] {
      float* a = x.data();
      float* b = h.data();
      stream.Launch("add", [a, b] { b[0] = a[0] + 1; });
      return absl::OkStatus();
    });
    piece2 = std::make_unique<CudaGraphWrapper>("piece2", M::kPiecewise, &stream, [this] {
      float* a = h.data();
      float* b = y.data();
      stream.Launch("scale", [a, b] { b[0] = a[0] * 10; });
      return absl::OkStatus();
    });
    full = std::make_unique<CudaGraphWrapper>("full", M::kFull, &stream, [this] {
      if (auto s = piece1->Run(); !s.ok()) return s;
      ++attention_host_calls;  // attention: eager in PIECEWISE, captured in FULL
      float* a = h.data();
      stream.Launch("attention", [a] { a[0] = a[0] * 2; });
      return piece2->Run();
    });
  }
};

// The stream's op profile: off by default; on, every run of a closure counts
// for its kind, eager or replayed from a graph.
TEST(CpuStreamTest, ProfileCountsEagerAndReplayedRunsByKind) {
  NestedModel m;
  {
    ForwardContextScope s(M::kNone, BatchDescriptor(1));
    ASSERT_TRUE(m.full->Run().ok());
  }
  EXPECT_TRUE(m.stream.op_times().empty());
  m.stream.set_profiling(true);
  {
    ForwardContextScope s(M::kNone, BatchDescriptor(1));
    ASSERT_TRUE(m.full->Run().ok());
  }
  for (int i = 0; i < 3; ++i) {  // capture once, then replays
    ForwardContextScope s(M::kFull, BatchDescriptor(1));
    ASSERT_TRUE(m.full->Run().ok());
  }
  std::map<std::string, int64_t> runs;
  for (const CpuStream::OpTime& t : m.stream.op_times()) {
    runs[t.kind] = t.runs;
    EXPECT_GE(t.seconds, 0.0);
  }
  // 1 eager run + the capture run + 2 replays: the capture itself runs
  // nothing; its first run is a replay.
  const std::map<std::string, int64_t> want = {{"add", 1 + 3}, {"attention", 1 + 3}, {"scale", 1 + 3}};
  EXPECT_EQ(runs, want);
  m.stream.ClearOpTimes();
  EXPECT_TRUE(m.stream.op_times().empty());
}

TEST(CudaGraphWrapperTest, NestedWrappersFireOnlyForTheirMode) {
  NestedModel m;
  {
    ForwardContextScope s(M::kPiecewise, BatchDescriptor(1));
    ASSERT_TRUE(m.full->Run().ok());
    EXPECT_EQ(m.y[0], 40);  // ((1 + 1) * 2) * 10
    m.x[0] = 2;
    ASSERT_TRUE(m.full->Run().ok());
    EXPECT_EQ(m.y[0], 60);
  }
  EXPECT_EQ(m.full->captures(), 0);
  EXPECT_EQ(m.full->passthroughs(), 2);
  EXPECT_EQ(m.piece1->captures(), 1);
  EXPECT_EQ(m.piece1->replays(), 1);
  EXPECT_EQ(m.piece2->replays(), 1);
  EXPECT_EQ(m.attention_host_calls, 2);  // attention stayed eager

  {
    ForwardContextScope s(M::kFull, BatchDescriptor(1, 1, true, false));
    m.x[0] = 3;
    ASSERT_TRUE(m.full->Run().ok());
    EXPECT_EQ(m.y[0], 80);
    m.x[0] = 4;
    ASSERT_TRUE(m.full->Run().ok());
    EXPECT_EQ(m.y[0], 100);
  }
  EXPECT_EQ(m.full->captures(), 1);
  EXPECT_EQ(m.full->replays(), 1);
  // Inside the FULL capture the pieces passed through; during replay nothing ran.
  EXPECT_EQ(m.piece1->captures(), 1);
  EXPECT_EQ(m.piece1->passthroughs(), 1);
  EXPECT_EQ(m.attention_host_calls, 3);
}

TEST(CudaGraphWrapperTest, MovedInputIsAnErrorNamingAddresses) {
  CpuStream stream;
  std::vector<float> a = {1}, b = {2}, out(1);
  std::vector<float>* current = &a;
  CudaGraphWrapper w(
      "moved", M::kPiecewise, &stream,
      [&] {
        float* src = current->data();
        float* dst = out.data();
        stream.Launch("test", [src, dst] { dst[0] = src[0]; });
        return absl::OkStatus();
      },
      [&] { return std::vector<const void*>{current->data()}; }, {true});
  ForwardContextScope s(M::kPiecewise, BatchDescriptor(1));
  ASSERT_TRUE(w.Run().ok());
  ASSERT_TRUE(w.Run().ok());
  current = &b;
  absl::Status st = w.Run();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  char expected[32], actual[32];
  std::snprintf(expected, sizeof(expected), "%p", static_cast<const void*>(a.data()));
  std::snprintf(actual, sizeof(actual), "%p", static_cast<const void*>(b.data()));
  EXPECT_NE(st.message().find(expected), std::string::npos) << st;
  EXPECT_NE(st.message().find(actual), std::string::npos) << st;
}

}  // namespace
}  // namespace tandem
