// GenerateCall: one Generate() stream of the decode worker and what it holds.
//
// Who owns what (the threading contract):
//  - set in Generate() before the call is shared, immutable after: id,
//    prompt, params, local_reason, writer, client_deadline, queued_at;
//  - the engine loop thread only: the fields under "engine thread" (they are
//    touched only from the request's output callback);
//  - any thread: `done` (atomic) and `prefill_context` (under `mu`);
//  - a PrefillClient gets copies of what it needs when the engine thread
//    starts it, keeps its own transfer state, and reaches the engine only
//    through the EngineClient; it never writes these fields.
#ifndef TANDEM_DECODE_WORKER_GENERATE_CALL_H_
#define TANDEM_DECODE_WORKER_GENERATE_CALL_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/base/mutex.h"
#include "common/engine/sampling.h"
#include "common/serving/stream_writer.h"
#include "common/serving/text_output.h"
#include "decode_worker/prefill_pool.h"
#include "grpcpp/grpcpp.h"
#include "proto/tandem/v1/tandem.pb.h"

namespace tandem {

struct GenerateCall {
  // Immutable after Generate().
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
  // Why this worker prefills the prompt itself ("aggregated",
  // "short_prompt", "prompt_logprobs"), or null when a prefill worker does.
  const char* local_reason = nullptr;
  // The prefill worker a gateway chose for this request (the
  // x-prefiller-host-port header), or null: the pool's rotation. Held: a
  // named endpoint stays open while the request uses it.
  std::shared_ptr<PrefillPool::Endpoint> prefill_endpoint;
  std::shared_ptr<StreamWriter<v1::GenerateResponse>> writer;
  std::chrono::system_clock::time_point client_deadline;
  absl::Time queued_at;  // Generate() arrival

  // Engine thread.
  std::vector<int32_t> generated;      // every token streamed so far
  std::unique_ptr<TextOutput> text;    // null without a tokenizer
  absl::Time last_token;
  int prefills = 0;                    // remote prefills started (1 + re-prefills)
  int cached_tokens = -1;              // from the prefix cache at the first admission (-1: not yet)
  // Prompt logprobs computed so far, sent with the first token.
  std::vector<TokenLogprobs> prompt_logprobs;

  // Any thread.
  std::atomic<bool> done{false};  // ended: later outputs are ignored
  Mutex mu;
  grpc::ClientContext* prefill_context ABSL_GUARDED_BY(mu) = nullptr;
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_GENERATE_CALL_H_
