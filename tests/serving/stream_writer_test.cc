// StreamWriter over a real in-process gRPC server: messages in order, one
// final status, and nothing kept alive after gRPC is done with the call.
#include "common/serving/stream_writer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {
namespace {

// A Decode service whose Generate() sends `n` messages and ends, holding a
// token object alive through its OnCancelled callback as the decode worker's
// calls do (the callback keeps the call, the call keeps the writer).
class FakeDecode final : public v1::Decode::CallbackService {
 public:
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override {
    if (request->request_id() == "unread") return Unread(context);
    auto writer = StreamWriter<v1::GenerateResponse>::Create();
    auto held = std::make_shared<int>(0);
    held_ = held;
    writer->OnCancelled([writer, held] { writer->End(grpc::Status::CANCELLED); });
    // max_tokens > 0: refills are asked for at that many bytes still queued;
    // the stream ends once they are all written.
    const size_t low_water = request->sampling().max_tokens();
    if (low_water > 0) {
      StreamWriter<v1::GenerateResponse>* w = writer.get();
      writer->OnDrained(
          [this, w] {
            const size_t queued = w->buffered_bytes();
            {
              MutexLock lock(&mu_);
              drained_at_.push_back(queued);
            }
            if (queued == 0 && all_sent_.load()) w->End(grpc::Status::OK);
          },
          low_water);
    }
    const int n = static_cast<int>(request->prompt_token_ids_size());
    for (int i = 0; i < n; ++i) {
      v1::GenerateResponse m;
      m.add_token_ids(i);
      m.set_text(std::string(1000, 'x'));
      writer->Send(std::move(m));
    }
    all_sent_ = true;
    // Ends here unless a write is still to complete (its callback ends it).
    if (low_water == 0 || writer->buffered_bytes() == 0) writer->End(grpc::Status::OK);
    return writer.get();
  }
  // More than the transport's windows hold, never ended: a client that reads
  // none of it leaves a write in flight until its deadline cancels the call.
  // The final status is the writer's own (no OnCancelled callback ends it).
  grpc::ServerWriteReactor<v1::GenerateResponse>* Unread(grpc::CallbackServerContext* context) {
    auto writer = StreamWriter<v1::GenerateResponse>::Create(
        [this](const grpc::Status& s) {
          MutexLock lock(&mu_);
          unread_status_ = s;
        },
        context->deadline());
    for (int i = 0; i < 64; ++i) {
      v1::GenerateResponse m;
      m.set_text(std::string(256 << 10, 'x'));
      writer->Send(std::move(m));
    }
    return writer.get();
  }
  std::optional<grpc::Status> unread_status() {
    MutexLock lock(&mu_);
    return unread_status_;
  }

  std::weak_ptr<int> held_;
  std::atomic<bool> all_sent_{false};
  Mutex mu_;
  std::vector<size_t> drained_at_ ABSL_GUARDED_BY(mu_);  // bytes queued at each refill call
  std::optional<grpc::Status> unread_status_ ABSL_GUARDED_BY(mu_);
};

class StreamWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = v1::Decode::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                    grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  // True once nothing holds the object any more (bounded wait: the reactor's
  // OnDone runs on a gRPC thread after the client has its status).
  static bool ReleasedWithin(const std::weak_ptr<int>& w, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (w.expired()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return w.expired();
  }

  FakeDecode service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Decode::Stub> stub_;
};

TEST_F(StreamWriterTest, SendsInOrderThenStatus) {
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  for (int i = 0; i < 5; ++i) req.add_prompt_token_ids(i);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse m;
  int expected = 0;
  while (reader->Read(&m)) EXPECT_EQ(m.token_ids(0), expected++);
  EXPECT_EQ(expected, 5);
  EXPECT_TRUE(reader->Finish().ok());
}

// A producer is called back before the queue runs dry: as soon as a write
// leaves no more than the low-water mark queued, and never above it.
TEST_F(StreamWriterTest, DrainedFiresAtTheLowWaterMark) {
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  for (int i = 0; i < 8; ++i) req.add_prompt_token_ids(i);
  req.mutable_sampling()->set_max_tokens(3500);  // three and a half messages
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse m;
  int n = 0;
  while (reader->Read(&m)) ++n;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(n, 8);
  MutexLock lock(&service_.mu_);
  ASSERT_FALSE(service_.drained_at_.empty());
  // Called with messages still queued (8 queued in a row, 1 written at a time).
  EXPECT_TRUE(std::any_of(service_.drained_at_.begin(), service_.drained_at_.end(),
                          [](size_t queued) { return queued > 0; }));
  for (size_t queued : service_.drained_at_) EXPECT_LE(queued, 3500u);
}

// Regression: the writer kept its OnCancelled callback after the call ended,
// and the callback kept the call (and so the writer) alive: every finished
// request of the decode worker leaked.
TEST_F(StreamWriterTest, FinishedCallReleasesItsCancelCallback) {
  for (int round = 0; round < 3; ++round) {
    grpc::ClientContext ctx;
    v1::GenerateRequest req;
    req.add_prompt_token_ids(1);
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_TRUE(ReleasedWithin(service_.held_, std::chrono::seconds(5))) << "round " << round;
  }
}

TEST_F(StreamWriterTest, CancelledCallReleasesItsCancelCallback) {
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  auto reader = stub_->Generate(&ctx, req);
  ctx.TryCancel();
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
  }
  (void)reader->Finish();
  EXPECT_TRUE(ReleasedWithin(service_.held_, std::chrono::seconds(5)));
}

// A deadline that passes with a write in flight fails the write and cancels
// the call, in either order: the stream's status was CANCELLED ("stream
// broken") whenever the failed write was reported first, and the decode
// worker counted a passed deadline as a client's cancel.
TEST_F(StreamWriterTest, DeadlineWithAWriteInFlightIsDeadlineExceeded) {
  for (int round = 0; round < 5; ++round) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    v1::GenerateRequest req;
    req.set_request_id("unread");
    auto reader = stub_->Generate(&ctx, req);
    // Nothing is read: Finish() returns once the deadline has cancelled the call.
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    std::optional<grpc::Status> server;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!(server = service_.unread_status()).has_value() &&
           std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(server.has_value()) << "round " << round;
    EXPECT_EQ(server->error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << "round " << round << ": " << server->error_message();
    MutexLock lock(&service_.mu_);
    service_.unread_status_.reset();
  }
}

}  // namespace
}  // namespace tandem
