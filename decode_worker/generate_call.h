// GenerateCall: one Generate() stream of the decode worker and what it holds.
//
// Who owns what (the threading contract):
//  - set in Generate() before the call is shared, immutable after: id,
//    prompt, params, writer, client_deadline, queued_at;
//  - the engine thread only: everything under "engine thread" below (tasks
//    posted to the engine loop, engine output callbacks, step observers);
//  - any thread: `done` (atomic) and `prefill_context` (under `mu`);
//  - a PrefillClient gets copies of what it needs when the engine thread
//    starts it, keeps its own transfer state, and posts back to the engine
//    thread; it never writes these fields.
#ifndef TANDEM_DECODE_WORKER_GENERATE_CALL_H_
#define TANDEM_DECODE_WORKER_GENERATE_CALL_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/base/mutex.h"
#include "absl/time/time.h"
#include "common/engine/sampling.h"
#include "common/serving/stream_writer.h"
#include "common/serving/text_output.h"
#include "grpcpp/grpcpp.h"
#include "proto/tandem/v1/tandem.pb.h"

namespace tandem {

struct GenerateCall {
  // Immutable after Generate().
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::shared_ptr<StreamWriter<v1::GenerateResponse>> writer;
  std::chrono::system_clock::time_point client_deadline;
  absl::Time queued_at;  // Generate() arrival

  // Engine thread.
  std::vector<int32_t> generated;      // every token streamed so far
  std::unique_ptr<TextOutput> text;    // null without a tokenizer
  absl::Time last_token;
  int attempt = 0;                     // prefill attempts of the current KV transfer
  bool awaiting_kv = false;            // counted in the service's waiting_for_kv_
  int preemptions = 0;

  // The tokens a prefill must compute: the prompt, then what was generated
  // before a preemption (engine thread).
  std::vector<int32_t> PrefillTokens() const {
    std::vector<int32_t> t = prompt;
    t.insert(t.end(), generated.begin(), generated.end());
    return t;
  }

  // Any thread.
  std::atomic<bool> done{false};  // ended: later tasks are no-ops
  Mutex mu;
  grpc::ClientContext* prefill_context ABSL_GUARDED_BY(mu) = nullptr;
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_GENERATE_CALL_H_
