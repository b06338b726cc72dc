// StreamWriter: a server-streaming reactor (gRPC callback API) that any thread
// may feed. Send() queues a message, End() queues the final status; writes go
// out one at a time in order, and Finish() is called exactly once, after the
// last queued message.
//
// Ownership: Create() returns a shared_ptr; the writer also holds itself until
// gRPC calls OnDone(), so engine callbacks may keep a shared_ptr and call
// Send()/End() at any time (calls after End() are ignored). OnDone() drops the
// callbacks too: an OnCancelled() callback that holds the caller's state (which
// holds the writer) must not outlive the call, or both leak.
#ifndef TANDEM_COMMON_SERVING_STREAM_WRITER_H_
#define TANDEM_COMMON_SERVING_STREAM_WRITER_H_

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>

#include "common/base/mutex.h"
#include "grpcpp/grpcpp.h"

namespace tandem {

// A queued message's size on the wire: a protobuf message's serialized
// size, or a raw stream's bytes.
template <typename Msg>
size_t WireBytes(const Msg& msg) {
  return msg.ByteSizeLong();
}
inline size_t WireBytes(const grpc::ByteBuffer& msg) { return msg.Length(); }

template <typename Msg>
class StreamWriter : public grpc::ServerWriteReactor<Msg> {
 public:
  // `on_finish` is called once with the final status (metrics).
  // `deadline`: the call's; a cancel after it ends the stream with
  // DEADLINE_EXCEEDED rather than CANCELLED.
  static std::shared_ptr<StreamWriter> Create(
      std::function<void(const grpc::Status&)> on_finish = nullptr,
      std::chrono::system_clock::time_point deadline =
          std::chrono::system_clock::time_point::max()) {
    std::shared_ptr<StreamWriter> w(new StreamWriter());
    w->self_ = w;
    w->on_finish_ = std::move(on_finish);
    w->deadline_ = deadline;
    return w;
  }

  void Send(Msg msg) {
    {
      MutexLock lock(&mu_);
      if (ended_) return;
      buffered_bytes_ += WireBytes(msg);
      queue_.push_back(std::move(msg));
    }
    Pump();
  }

  void End(const grpc::Status& status) {
    {
      MutexLock lock(&mu_);
      if (ended_) return;
      ended_ = true;
      final_ = status;
    }
    Pump();
  }

  // The status of a call cancelled now whose deadline is `deadline`. A client
  // whose own deadline passes cancels the call; the server's deadline is
  // measured from the request's arrival, so it passes later by however long
  // the request took to be read: a cancel within kDeadlineSlack of the
  // deadline counts as DEADLINE_EXCEEDED, an earlier one as CANCELLED. (1 s
  // was too little: a CI run on 2 busy cores read a request more than 1 s
  // after it was sent, and counted its deadline as a cancel.)
  static constexpr std::chrono::milliseconds kDeadlineSlack{3000};
  static grpc::Status CancelStatus(std::chrono::system_clock::time_point deadline) {
    if (deadline != std::chrono::system_clock::time_point::max() &&
        std::chrono::system_clock::now() + kDeadlineSlack >= deadline) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the call's deadline passed");
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
  }

  // Bytes of the messages queued or being written (flow control).
  size_t buffered_bytes() {
    MutexLock lock(&mu_);
    return buffered_bytes_;
  }

  // Runs `fn` (on a gRPC thread) each time a write completes and leaves at
  // most `low_water` bytes queued: a producer that sends as the reader takes
  // refills here (above zero, before the transport runs dry).
  void OnDrained(std::function<void()> fn, size_t low_water = 0) {
    MutexLock lock(&mu_);
    if (done_) return;
    on_drained_ = std::move(fn);
    low_water_ = low_water;
  }

  // Runs `fn` (on a gRPC thread) with the final status once the last message
  // has been written and the call is finishing: for a sender that times
  // the whole stream.
  void OnFinished(std::function<void(const grpc::Status&)> fn) {
    MutexLock lock(&mu_);
    if (!finished_) on_finished_ = std::move(fn);
  }

  // Runs `fn` when the client cancels (at once if it already has).
  void OnCancelled(std::function<void()> fn) {
    bool now = false;
    {
      MutexLock lock(&mu_);
      if (cancelled_) {
        now = true;
      } else if (!done_) {
        on_cancel_ = std::move(fn);
      }
    }
    if (now) fn();
  }

  bool ended() {
    MutexLock lock(&mu_);
    return ended_;
  }

 private:
  StreamWriter() = default;

  // Starts the next write, or Finish(), if nothing is in flight.
  void Pump() {
    enum { kNothing, kWrite, kFinish } action = kNothing;
    grpc::Status status;
    std::function<void(const grpc::Status&)> finished;
    {
      MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (!queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
        action = kWrite;
      } else if (final_.has_value()) {
        finished_ = true;
        status = *final_;
        finished = std::move(on_finished_);
        on_finished_ = nullptr;
        action = kFinish;
      }
    }
    if (action == kWrite) this->StartWrite(&current_);
    if (action == kFinish) {
      if (on_finish_) on_finish_(status);
      if (finished) finished(status);
      this->Finish(status);
    }
  }

  void OnWriteDone(bool ok) override {
    std::function<void()> drained;
    {
      MutexLock lock(&mu_);
      writing_ = false;
      buffered_bytes_ -= std::min(buffered_bytes_, WireBytes(current_));
      if (!ok) {  // the call is cancelled: drop the rest and finish
        queue_.clear();
        buffered_bytes_ = 0;
        ended_ = true;
        // gRPC may report the failed write before OnCancel(): the status is
        // told apart from the deadline here too.
        if (!final_.has_value()) final_ = CancelStatus(deadline_);
      } else if ((queue_.empty() || buffered_bytes_ <= low_water_) && !ended_) {
        drained = on_drained_;
      }
    }
    Pump();
    if (drained) drained();
  }

  void OnCancel() override {
    std::function<void()> fn;
    {
      MutexLock lock(&mu_);
      cancelled_ = true;
      fn = std::move(on_cancel_);
    }
    if (fn) fn();
    End(CancelStatus(deadline_));
  }

  void OnDone() override {
    std::function<void()> cancel;
    std::function<void(const grpc::Status&)> finish;
    {
      MutexLock lock(&mu_);
      done_ = true;
      cancel = std::move(on_cancel_);
      on_cancel_ = nullptr;
      on_drained_ = nullptr;
      on_finished_ = nullptr;
      finish = std::move(on_finish_);
      on_finish_ = nullptr;
    }
    std::shared_ptr<StreamWriter> self = std::move(self_);
    // Destroying these locals may destroy `this`: no member access below.
  }

  Mutex mu_;
  std::deque<Msg> queue_ ABSL_GUARDED_BY(mu_);
  Msg current_;  // the write in flight; owned by gRPC between StartWrite and OnWriteDone
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // gRPC called OnDone(): callbacks are no longer kept
  std::optional<grpc::Status> final_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_drained_ ABSL_GUARDED_BY(mu_);
  std::function<void(const grpc::Status&)> on_finished_ ABSL_GUARDED_BY(mu_);
  size_t buffered_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t low_water_ ABSL_GUARDED_BY(mu_) = 0;
  // Set in Create(), then read-only.
  std::function<void(const grpc::Status&)> on_finish_;
  std::chrono::system_clock::time_point deadline_;
  std::shared_ptr<StreamWriter> self_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_STREAM_WRITER_H_
