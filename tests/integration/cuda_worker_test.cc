// Workers from a CUDA-enabled build: /metrics still serves once cuBLAS is in
// the process (the module is opened late, with dlopen), and --device=cuda
// either serves on a GPU or fails at start-up with the reason.
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "common/kernels/backend.h"
#include "common/serving/metrics.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tandem {
namespace {

using testing::HttpGet;
using testing::Process;
using testing::StartWorker;

[[maybe_unused]] std::string ProcMaps() {
  std::ifstream in("/proc/self/maps");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The DESIGN pitfall: a process that links cuBLAS cannot start the metrics
// HTTP server. Here cuBLAS (and cuBLASLt) come in through the CUDA module,
// as --device=cuda loads them, and the server starts and answers after.
TEST(CudaWorkerTest, MetricsServeWithCublasLoaded) {
#ifndef TANDEM_CUDA_BUILT
  GTEST_SKIP() << "this build has no CUDA backend module";
#else
  EXPECT_EQ(ProcMaps().find("libcublas"), std::string::npos)
      << "cuBLAS must not be loaded before --device=cuda asks for it";
  auto backend = CreateBackend({"cuda"});  // fails without a GPU, after loading the module
  if (!backend.ok()) {
    EXPECT_NE(backend.status().message().find("no usable GPU"), std::string::npos)
        << backend.status();
  }
  const std::string maps = ProcMaps();
  ASSERT_NE(maps.find("libtandem_cuda.so"), std::string::npos);
  ASSERT_NE(maps.find("libcublasLt.so"), std::string::npos);
  WorkerMetrics metrics("prefill");
  auto port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string text = HttpGet(*port, "/metrics");
  EXPECT_NE(text.find("tandem_cudagraph_replay_ratio"), std::string::npos) << text;
#endif
}

TEST(CudaWorkerTest, DeviceCudaServesOrFailsAtStartUp) {
  Process probe({testing::BinDir() + "/prefill_worker", "--device=cuda",
                 "--grpc-address=127.0.0.1:0", "--metrics-address=127.0.0.1:0",
                 "--capture-sizes=8,16,32"},
                ::testing::TempDir() + "cuda_probe.log");
  // SERVING, or exited: poll for up to two minutes (a GPU captures graphs).
  bool serving = false;
  for (int i = 0; i < 1200 && !serving && probe.running(); ++i) {
    serving = probe.Log().find("worker: SERVING") != std::string::npos;
    if (!serving) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!serving) {
    // No GPU here (or no CUDA module): the worker must have exited non-zero
    // saying so.
    const int code = probe.Wait(std::chrono::seconds(30));
    EXPECT_EQ(code, 1) << probe.Log();
    const std::string log = probe.Log();
#ifdef TANDEM_CUDA_BUILT
    EXPECT_NE(log.find("device=cuda: no usable GPU"), std::string::npos) << log;
#else
    EXPECT_NE(log.find("cannot load the CUDA backend module"), std::string::npos) << log;
#endif
    GTEST_SKIP() << "no GPU: the worker refused --device=cuda at start-up as it should";
  }
  // A GPU: the pair serves on it, and its /metrics show the graph modes.
  probe.Signal(SIGTERM);
  EXPECT_EQ(probe.Wait(std::chrono::seconds(30)), 0) << probe.Log();
  auto prefill = StartWorker("prefill_worker", {"--device=cuda", "--capture-sizes=8,16,32"});
  auto decode = StartWorker("decode_worker", {"--device=cuda", "--capture-sizes=1,2,4,8",
                                              "--prefill-address=" + prefill.address()});
  for (int i = 0; i < 3; ++i) {
    auto r = testing::Generate(decode.address(),
                               testing::MakeRequest("g" + std::to_string(i), {1, 2, 3, 4, 5}, 6));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens.size(), 6u);
  }
  EXPECT_EQ(decode.Metric("tandem_cudagraph_replay_ratio", {{"mode", "FULL"}}), 1.0);
  EXPECT_EQ(prefill.Metric("tandem_cudagraph_replay_ratio", {{"mode", "PIECEWISE"}}), 1.0);
  EXPECT_EQ(decode.Metric("tandem_kv_cache_blocks_in_use"), 0.0);
  decode.process->Signal(SIGTERM);
  prefill.process->Signal(SIGTERM);
  EXPECT_EQ(decode.process->Wait(std::chrono::seconds(30)), 0);
  EXPECT_EQ(prefill.process->Wait(std::chrono::seconds(30)), 0);
}

}  // namespace
}  // namespace tandem
