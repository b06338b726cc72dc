// Scheduler: continuous batching with chunked prefill (vLLM V1's policy),
// and every queue a request can wait in.
//
// Each step has a token budget (max_num_batched_tokens) and at most
// max_num_seqs running requests. Running requests are served first, in
// admission order (a decode takes one token, an unfinished prefill the next
// chunk); then waiting requests are admitted while budget and sequence slots
// remain. A request admitted without blocks first takes the longest cached
// prefix of its tokens (at most all but the last token, which must be
// computed to sample) and computes only the rest.
// A kRemotePrefill request is admitted once blocks for all its tokens plus
// the next one are free: it moves to WAITING_FOR_REMOTE_KV (reported in
// `kv_needed`, using no budget or sequence slot) until RemoteKvArrived().
// When the KV cache has no block for a running request, the most recently
// admitted running request is preempted (PREEMPTED: blocks freed, first in
// line to be recomputed, remotely if that is where its prefill came from).
// A decoding request may carry drafted tokens (Request::drafts, speculative
// decoding): they take budget and KV slots like any token, are cut to what the
// budget leaves, and are dropped (never preempting anyone) when their slots
// are not free.
// A request that asked for prompt logprobs computes its prompt whole (no
// cached prefix) in chunks whose rows of logits fit what the step has left
// of max_logit_rows (the runner's); there is always at least one row left
// for it, since every other request takes at most q of them.
// A waiting request that does not fit waits without blocking the ones behind
// it that do; a new one that waits longer than `waiting_timeout` fails with
// RESOURCE_EXHAUSTED, as does one that cannot fit even in an empty cache.
//
// Policies (vLLM's --scheduling-policy): kFcfs as above. kPriority (vLLM's
// "priority"): requests wait in order of (SamplingParams::priority, arrival),
// a lower value first, a preempted or re-queued request back at its place in
// that order; when a running request has no block, the running request with
// the largest (priority, arrival) is preempted, even one already scheduled
// this step (its chunk is withdrawn, its budget given back), as vLLM's
// scheduler does. Beyond vLLM, a waiting request that does not fit holds back
// the new requests of lower priority behind it (they would otherwise take the
// blocks it waits for); those of its own priority still go ahead, as above.
//
// Not thread-safe: owned by the engine thread.
#ifndef TANDEM_COMMON_ENGINE_SCHEDULER_H_
#define TANDEM_COMMON_ENGINE_SCHEDULER_H_

#include <array>
#include <deque>
#include <vector>

#include "absl/time/time.h"
#include "common/engine/request.h"
#include "common/engine/scheduling_policy.h"
#include "common/model/kv_cache.h"

namespace tandem {

struct ScheduledChunk {
  Request* request;
  int64_t start;      // first token position scheduled
  int num_tokens;     // tokens scheduled (drafts included)
  bool sample;        // reaches the end of the request's tokens
  // Of num_tokens, the request's drafted tokens after its last one (their
  // logits are sampled too, to verify them).
  int num_drafts = 0;
  // Prompt logprobs: the step computes the logits of every token of the
  // chunk (Request::WantsPromptLogits), not only of the last.
  bool all_rows = false;
  // Rows of logits the chunk takes in the step.
  int logit_rows() const { return all_rows ? num_tokens : sample ? 1 + num_drafts : 0; }
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  // Finished with an error (blocks freed), out of the queues.
  std::vector<Request*> failed;
  // Moved to WAITING_FOR_REMOTE_KV this step: their blocks are reserved.
  std::vector<Request*> kv_needed;
};

// Prefix-cache counters since start-up (vLLM's PrefixCacheStats): per
// admission, `queries` tokens looked up and `hits` of them found cached.
struct PrefixCacheStats {
  int64_t queries = 0;
  int64_t hits = 0;
};

class Scheduler {
 public:
  // `waiting_timeout`: how long a new request may wait for admission
  // (absl::InfiniteDuration(): no limit); `max_logit_rows`: rows of logits a
  // step can compute (0: as many as tokens).
  Scheduler(int max_num_batched_tokens, int max_num_seqs, KvCache* kv_cache,
            absl::Duration waiting_timeout = absl::InfiniteDuration(), int max_logit_rows = 0,
            SchedulingPolicy policy = SchedulingPolicy::kFcfs)
      : budget_(max_num_batched_tokens),
        max_seqs_(max_num_seqs),
        max_logit_rows_(max_logit_rows > 0 ? max_logit_rows : max_num_batched_tokens),
        kv_(kv_cache),
        waiting_timeout_(waiting_timeout),
        policy_(policy) {}

  void AddWaiting(Request* r);
  // Builds the next step.
  SchedulerOutput Schedule();
  // A WAITING_FOR_REMOTE_KV request's KV is in: back to WAITING, holding its
  // blocks, to join the batch.
  void RemoteKvArrived(Request* r);
  // A WAITING_FOR_REMOTE_KV request will be computed here instead: first in
  // line, keeping its blocks (and its cached prefix).
  void ComputeLocally(Request* r);
  // Takes a request out of every queue and frees its blocks unless told not
  // to (a finished prefill-only request keeps them for export).
  void Remove(Request* r, bool free_blocks = true);

  size_t num_running() const { return running_.size(); }
  // RUNNING requests, in admission order.
  const std::vector<Request*>& running() const { return running_; }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_waiting_for_remote_kv() const { return remote_.size(); }
  bool empty() const { return running_.empty() && waiting_.empty() && remote_.empty(); }
  // Under kPriority, the waiting request never given blocks that would be
  // served last (the largest (priority, arrival)); nullptr under kFcfs or
  // when every waiting request has run or holds blocks.
  const Request* LastUnstarted() const;
  // Preemptions since start-up.
  int64_t num_preemptions() const { return preemptions_; }
  const PrefixCacheStats& prefix_cache_stats() const { return prefix_stats_; }

 private:
  void Preempt(Request* r);
  // Tries to give a waiting request the blocks for `n` more tokens (taking
  // its cached prefix first when it holds none); true when it now has them.
  bool Admit(Request* r, int budget, int* n);
  static void Erase(std::vector<Request*>* v, Request* r);
  // Puts r in line: at the front (kFcfs, `front`) or the back (kFcfs), or at
  // its (priority, arrival) place (kPriority).
  void Enqueue(Request* r, bool front);
  // The running request to preempt when one has no block: the latest
  // admitted (kFcfs) or the one of largest (priority, arrival) (kPriority).
  Request* Victim() const;

  int budget_;
  int max_seqs_;
  int max_logit_rows_;
  KvCache* kv_;
  absl::Duration waiting_timeout_;
  SchedulingPolicy policy_;
  std::vector<Request*> running_;  // admission order
  std::deque<Request*> waiting_;   // WAITING and PREEMPTED, in line
  std::vector<Request*> remote_;   // WAITING_FOR_REMOTE_KV
  int64_t preemptions_ = 0;
  PrefixCacheStats prefix_stats_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_SCHEDULER_H_
