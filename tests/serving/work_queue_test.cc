// WorkQueue: the HTTP front door's parsing threads, and the headers it
// checks before anything is forwarded.
#include "common/serving/work_queue.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "common/serving/request_id.h"
#include "grpc/grpc.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(WorkQueueTest, RunsWhatItTakesAndRefusesPastItsBound) {
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  {
    WorkQueue queue(1, 2, "--api-queue", WorkQueue::Priority::kIdle);
    // The one worker is held by the first task; two more wait; a fourth is refused.
    ASSERT_TRUE(queue.Post([&] {
      while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++ran;
    }).ok());
    while (queue.waiting() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(queue.Post([&] { ++ran; }).ok());
    ASSERT_TRUE(queue.Post([&] { ++ran; }).ok());
    const absl::Status full = queue.Post([&] { ++ran; });
    EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(absl::StrContains(full.message(), "--api-queue=2")) << full;
    release = true;
  }  // the destructor runs what waits
  EXPECT_EQ(ran.load(), 3);
}

// x-prefiller-host-port with a non-ASCII byte reached gRPC metadata, and
// gRPC aborted the process. Every byte value: only what gRPC takes passes.
TEST(HeaderValueTest, EveryByteValueGrpcWouldRefuseIsRefused) {
  for (int b = 0; b < 256; ++b) {
    const std::string value = std::string("127.0.0.1:") + static_cast<char>(b) + "5";
    const absl::Status s = CheckHeaderValue("x-prefiller-host-port", value);
    const grpc_slice slice = grpc_slice_from_copied_buffer(value.data(), value.size());
    const bool grpc_takes = grpc_header_nonbin_value_is_legal(slice) != 0;
    grpc_slice_unref(slice);
    EXPECT_EQ(s.ok(), b >= 0x20 && b <= 0x7e) << b;
    if (s.ok()) EXPECT_TRUE(grpc_takes) << b;  // what passes never reaches gRPC's assertion
    if (!s.ok()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_TRUE(absl::StrContains(s.message(), "x-prefiller-host-port: byte 10")) << s;
    }
  }
  EXPECT_FALSE(CheckHeaderValue("X-Request-Id", std::string(257, 'a')).ok());
  EXPECT_TRUE(CheckHeaderValue("X-Request-Id", "").ok());
}

}  // namespace
}  // namespace tandem
