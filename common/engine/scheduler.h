// Scheduler: continuous batching with chunked prefill (vLLM V1's policy).
//
// Each step has a token budget (max_num_batched_tokens) and at most
// max_num_seqs requests. Running requests are served first, in admission
// order (a decode takes one token, an unfinished prefill the next chunk);
// then waiting requests are admitted while budget and sequence slots remain.
// When the KV cache has no block for a running request, the most recently
// admitted running request is preempted (its blocks freed, recomputed later,
// or handed back to the caller when it asked for that);
// a waiting request that does not fit waits without blocking the ones behind
// it that do. A request that cannot fit even in an empty cache fails with
// RESOURCE_EXHAUSTED.
//
// Not thread-safe: owned by the engine thread.
#ifndef TANDEM_COMMON_ENGINE_SCHEDULER_H_
#define TANDEM_COMMON_ENGINE_SCHEDULER_H_

#include <deque>
#include <vector>

#include "common/engine/request.h"
#include "common/model/kv_cache.h"

namespace tandem {

struct ScheduledChunk {
  Request* request;
  int64_t start;      // first token position scheduled
  int num_tokens;     // tokens scheduled
  bool sample;        // reaches the end of the request's tokens
};

class Scheduler {
 public:
  Scheduler(int max_num_batched_tokens, int max_num_seqs, KvCache* kv_cache)
      : budget_(max_num_batched_tokens), max_seqs_(max_num_seqs), kv_(kv_cache) {}

  void AddWaiting(Request* r) { waiting_.push_back(r); }
  // Builds the next step. Requests that can never fit are returned in
  // `*failed` (finished with an error, blocks freed); preempted requests with
  // return_on_preemption in `*returned` (out of the queues, blocks freed).
  std::vector<ScheduledChunk> Schedule(std::vector<Request*>* failed,
                                       std::vector<Request*>* returned);
  // Removes a request from the queues (finished or aborted) and frees its
  // blocks unless `keep_kv`.
  void Remove(Request* r, bool keep_kv);

  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  bool empty() const { return running_.empty() && waiting_.empty(); }
  // Preemptions since start-up.
  int64_t num_preemptions() const { return preemptions_; }

 private:
  void Preempt(Request* r, std::vector<Request*>* returned);

  int budget_;
  int max_seqs_;
  KvCache* kv_;
  std::vector<Request*> running_;  // admission order
  std::deque<Request*> waiting_;
  int64_t preemptions_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_SCHEDULER_H_
