// Scheduler: request states, admission with the prefix cache, remote KV,
// preemption and the waiting timeout, on a real KV cache with no model.
#include "common/engine/scheduler.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "common/backend/cpu/cpu_device.h"

namespace tandem {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void Make(int num_blocks, int budget = 64, int max_seqs = 8,
            absl::Duration timeout = absl::InfiniteDuration(),
            SchedulingPolicy policy = SchedulingPolicy::kFcfs) {
    device_ = CreateCpuDevice();
    kv_ = KvCache::Create(device_.get(), DType::kF32, 1, num_blocks, 4, 1, 4,
                          /*enable_prefix_caching=*/true)
              .value();
    sched_ = std::make_unique<Scheduler>(budget, max_seqs, kv_.get(), timeout,
                                         /*max_logit_rows=*/0, policy);
  }
  Request* Add(const std::string& id, int n, int start = 10,
               RequestKind kind = RequestKind::kGenerate, int32_t priority = 0) {
    auto r = std::make_unique<Request>();
    r->id = id;
    r->kind = kind;
    r->arrival = next_arrival_++;  // as LlmEngine::AddRequest numbers them
    r->params.priority = priority;
    for (int i = 0; i < n; ++i) r->tokens.push_back(start + i);
    r->prompt_len = n;
    r->queued_at = absl::Now();
    Request* raw = r.get();
    requests_.push_back(std::move(r));
    sched_->AddWaiting(raw);
    return raw;
  }
  // What the engine does after a step: the chunks are computed, samples
  // append a token.
  void Complete(const SchedulerOutput& out) {
    for (const ScheduledChunk& c : out.chunks) {
      c.request->num_computed = c.start + c.num_tokens;
      kv_->CacheComputed(c.request->id, c.request->tokens, c.request->num_computed);
      if (c.sample) c.request->tokens.push_back(1);
    }
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<Scheduler> sched_;
  std::vector<std::unique_ptr<Request>> requests_;
  uint64_t next_arrival_ = 0;
};

TEST_F(SchedulerTest, WaitingThenRunningWithChunkedPrefill) {
  Make(16, /*budget=*/8);
  Request* a = Add("a", 12);
  EXPECT_EQ(a->state, RequestState::kWaiting);
  SchedulerOutput s1 = sched_->Schedule();
  ASSERT_EQ(s1.chunks.size(), 1u);
  EXPECT_EQ(a->state, RequestState::kRunning);
  EXPECT_EQ(s1.chunks[0].num_tokens, 8);
  EXPECT_FALSE(s1.chunks[0].sample);
  Complete(s1);
  SchedulerOutput s2 = sched_->Schedule();
  ASSERT_EQ(s2.chunks.size(), 1u);
  EXPECT_EQ(s2.chunks[0].start, 8);
  EXPECT_EQ(s2.chunks[0].num_tokens, 4);
  EXPECT_TRUE(s2.chunks[0].sample);
  sched_->Remove(a);
  EXPECT_TRUE(sched_->empty());
  EXPECT_EQ(kv_->pool().num_used(), 0);
}

TEST_F(SchedulerTest, AdmissionTakesTheCachedPrefixAndComputesTheRest) {
  Make(16);
  Request* a = Add("a", 10);
  Complete(sched_->Schedule());
  sched_->Remove(a);  // finished: its two full blocks stay cached
  Request* b = Add("b", 10);  // the same tokens
  SchedulerOutput s = sched_->Schedule();
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(b->num_cached_tokens, 8);
  EXPECT_EQ(s.chunks[0].start, 8);
  EXPECT_EQ(s.chunks[0].num_tokens, 2);
  // A prompt that is all whole cached blocks still computes its last block:
  // the last token must run to be sampled.
  Complete(s);
  sched_->Remove(b);
  Request* c = Add("c", 8);
  SchedulerOutput s3 = sched_->Schedule();
  EXPECT_EQ(c->num_cached_tokens, 4);
  EXPECT_EQ(s3.chunks[0].num_tokens, 4);
  const PrefixCacheStats& st = sched_->prefix_cache_stats();
  EXPECT_EQ(st.queries, 10 + 10 + 8);
  EXPECT_EQ(st.hits, 8 + 4);
}

TEST_F(SchedulerTest, RemoteRequestWaitsForItsKvThenRuns) {
  Make(16);
  Request* a = Add("a", 10, 10, RequestKind::kRemotePrefill);
  SchedulerOutput s1 = sched_->Schedule();
  EXPECT_TRUE(s1.chunks.empty());  // nothing to compute here
  ASSERT_EQ(s1.kv_needed.size(), 1u);
  EXPECT_EQ(a->state, RequestState::kWaitingForRemoteKv);
  EXPECT_EQ(kv_->BlockTable("a")->size(), 3u);  // 10 tokens + the next one's slot
  EXPECT_EQ(sched_->num_waiting_for_remote_kv(), 1u);
  EXPECT_TRUE(sched_->Schedule().kv_needed.empty());  // reported once
  a->num_computed = a->num_tokens();
  a->tokens.push_back(1);  // the first token, sampled remotely
  sched_->RemoteKvArrived(a);
  EXPECT_EQ(a->state, RequestState::kWaiting);
  SchedulerOutput s2 = sched_->Schedule();
  ASSERT_EQ(s2.chunks.size(), 1u);
  EXPECT_EQ(a->state, RequestState::kRunning);
  EXPECT_EQ(s2.chunks[0].start, 10);
  EXPECT_EQ(s2.chunks[0].num_tokens, 1);
  EXPECT_EQ(kv_->BlockTable("a")->size(), 3u);  // no new block
}

TEST_F(SchedulerTest, RemoteRequestFallsBackToLocalKeepingItsPrefix) {
  Make(16);
  Request* a = Add("a", 10);
  Complete(sched_->Schedule());
  sched_->Remove(a);
  Request* b = Add("b", 12, 10, RequestKind::kRemotePrefill);
  SchedulerOutput s1 = sched_->Schedule();
  ASSERT_EQ(s1.kv_needed.size(), 1u);
  EXPECT_EQ(b->num_cached_tokens, 8);  // asks only for tokens [8, 12)
  sched_->ComputeLocally(b);
  EXPECT_EQ(b->kind, RequestKind::kGenerate);
  SchedulerOutput s2 = sched_->Schedule();
  ASSERT_EQ(s2.chunks.size(), 1u);
  EXPECT_EQ(s2.chunks[0].start, 8);
  EXPECT_EQ(s2.chunks[0].num_tokens, 4);
}

TEST_F(SchedulerTest, PreemptionFreesTheNewestAndRecomputesItFirst) {
  Make(5, /*budget=*/64);  // 20 slots
  Request* a = Add("a", 8, 10);
  Request* b = Add("b", 8, 50);
  Complete(sched_->Schedule());  // 2 + 2 blocks; both sampled a token
  EXPECT_EQ(kv_->pool().num_free(), 1);
  // a takes the last free block for token 9; b has none left: preempted.
  SchedulerOutput s = sched_->Schedule();
  EXPECT_EQ(b->state, RequestState::kPreempted);
  EXPECT_EQ(b->num_computed, 0);
  EXPECT_EQ(b->preemptions, 1);
  EXPECT_EQ(sched_->num_preemptions(), 1);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].request, a);
  Complete(s);
  sched_->Remove(a);
  // b is first in line and takes back its cached first two blocks.
  SchedulerOutput s2 = sched_->Schedule();
  ASSERT_EQ(s2.chunks.size(), 1u);
  EXPECT_EQ(s2.chunks[0].request, b);
  EXPECT_EQ(b->state, RequestState::kRunning);
  EXPECT_EQ(b->num_cached_tokens, 8);
  EXPECT_EQ(s2.chunks[0].num_tokens, 1);
}

TEST_F(SchedulerTest, ARemoteRequestPreemptedIsReprefilledRemotely) {
  Make(5);
  Request* a = Add("a", 7, 10);
  Complete(sched_->Schedule());  // a: 2 blocks
  Request* b = Add("b", 7, 50, RequestKind::kRemotePrefill);
  SchedulerOutput s = sched_->Schedule();  // a decodes; b gets 2 blocks
  ASSERT_EQ(s.kv_needed.size(), 1u);
  EXPECT_EQ(b->state, RequestState::kWaitingForRemoteKv);
  Complete(s);
  b->num_computed = 7;
  b->tokens.push_back(1);  // its first token, sampled remotely
  sched_->RemoteKvArrived(b);
  s = sched_->Schedule();  // a takes the last block; b joins the batch
  ASSERT_EQ(s.chunks.size(), 2u);
  EXPECT_EQ(b->state, RequestState::kRunning);
  Complete(s);
  s = sched_->Schedule();  // b needs a third block: the newest is preempted
  EXPECT_EQ(b->state, RequestState::kPreempted);
  EXPECT_TRUE(b->needs_remote_kv);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].request, a);
  sched_->Remove(a);
  s = sched_->Schedule();  // back in line: its KV comes from a prefill worker again
  ASSERT_EQ(s.kv_needed.size(), 1u);
  EXPECT_EQ(s.kv_needed[0], b);
  EXPECT_EQ(b->state, RequestState::kWaitingForRemoteKv);
  EXPECT_EQ(b->num_cached_tokens, 8);  // its two full computed blocks are still cached
  EXPECT_EQ(b->num_tokens(), 9);       // asks for token 8's KV only
}

TEST_F(SchedulerTest, NewRequestsWaitingTooLongFailButHeldOnesDoNot) {
  Make(2, 64, 8, absl::Milliseconds(1));
  Request* a = Add("a", 6);  // both blocks
  Complete(sched_->Schedule());
  Request* b = Add("b", 4);
  b->queued_at -= absl::Seconds(1);
  SchedulerOutput s = sched_->Schedule();
  ASSERT_EQ(s.failed.size(), 1u);
  EXPECT_EQ(s.failed[0], b);
  EXPECT_EQ(b->state, RequestState::kFinishedError);
  EXPECT_EQ(b->error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b->error.message().find("KV cache full"), std::string::npos) << b->error;
  EXPECT_EQ(a->state, RequestState::kRunning);
  // One that can never fit fails at once, whatever the timeout.
  Make(2);
  Request* big = Add("big", 9);
  s = sched_->Schedule();
  ASSERT_EQ(s.failed.size(), 1u);
  EXPECT_NE(big->error.message().find("needs 3 KV blocks of 4 tokens; the cache has 2"),
            std::string::npos)
      << big->error;
  EXPECT_EQ(kv_->pool().num_used(), 0);
}

TEST_F(SchedulerTest, AWaitingRequestThatDoesNotFitGivesItsPrefixBack) {
  Make(4);
  Request* a = Add("a", 8, 10);
  Complete(sched_->Schedule());
  sched_->Remove(a);                      // 2 cached free blocks
  Request* filler = Add("filler", 12, 200);  // takes 3 blocks, evicting one of a's
  Complete(sched_->Schedule());
  Request* b = Add("b", 16, 10);  // needs 4 blocks: waits
  SchedulerOutput s = sched_->Schedule();
  EXPECT_TRUE(s.chunks.size() == 1u && s.chunks[0].request == filler);
  EXPECT_EQ(b->state, RequestState::kWaiting);
  EXPECT_EQ(kv_->BlockTable("b"), nullptr);  // holds nothing while it waits
  EXPECT_EQ(kv_->BlockTable("filler")->size(), 4u);  // its decode took the last block
  EXPECT_EQ(kv_->pool().num_used(), 4);
}

TEST(SchedulingPolicyTest, ParsesVllmsNames) {
  EXPECT_EQ(ParseSchedulingPolicy("fcfs").value(), SchedulingPolicy::kFcfs);
  EXPECT_EQ(ParseSchedulingPolicy("priority").value(), SchedulingPolicy::kPriority);
  const absl::Status bad = ParseSchedulingPolicy("lifo").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "--scheduling-policy=lifo: expected fcfs or priority");
}

TEST_F(SchedulerTest, PriorityServesTheLowestValueFirstThenTheEarliest) {
  Make(16, 64, /*max_seqs=*/1, absl::InfiniteDuration(), SchedulingPolicy::kPriority);
  Request* late = Add("late", 4, 10, RequestKind::kGenerate, 5);
  Request* first = Add("first", 4, 20, RequestKind::kGenerate, 0);
  Request* second = Add("second", 4, 30, RequestKind::kGenerate, 0);
  Request* urgent = Add("urgent", 4, 40, RequestKind::kGenerate, -3);
  for (Request* expected : {urgent, first, second, late}) {
    SchedulerOutput s = sched_->Schedule();
    ASSERT_EQ(s.chunks.size(), 1u);
    EXPECT_EQ(s.chunks[0].request, expected) << s.chunks[0].request->id;
    sched_->Remove(expected);
  }
  EXPECT_TRUE(sched_->empty());
}

TEST_F(SchedulerTest, FcfsIgnoresPriority) {
  Make(16, 64, /*max_seqs=*/1);
  Request* a = Add("a", 4, 10, RequestKind::kGenerate, 5);
  Add("b", 4, 20, RequestKind::kGenerate, 0);
  SchedulerOutput s = sched_->Schedule();
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].request, a);
}

// The same cache pressure under both policies: a low-priority request
// admitted first, a high-priority one after it; both need a block and one
// is left.
class PreemptionPolicyTest : public SchedulerTest {
 protected:
  void Start(SchedulingPolicy policy) {
    Make(5, 64, 8, absl::InfiniteDuration(), policy);  // 20 slots
    low_ = Add("low", 8, 10, RequestKind::kGenerate, 9);
    Complete(sched_->Schedule());  // low: 2 blocks, 9 tokens
    high_ = Add("high", 8, 50, RequestKind::kGenerate, 0);
    Complete(sched_->Schedule());  // low takes a third block; high 2 blocks, 9 tokens
    ASSERT_EQ(kv_->pool().num_free(), 0);
    ASSERT_EQ(sched_->running(), (std::vector<Request*>{low_, high_}));
  }
  Request* low_ = nullptr;
  Request* high_ = nullptr;
};

TEST_F(PreemptionPolicyTest, FcfsPreemptsTheNewest) {
  Start(SchedulingPolicy::kFcfs);
  // low's 10th token fits its third block; high needs a third: high, the
  // newest, is preempted.
  SchedulerOutput s = sched_->Schedule();
  EXPECT_EQ(high_->state, RequestState::kPreempted);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].request, low_);
}

TEST_F(PreemptionPolicyTest, PriorityPreemptsTheLowestEvenOnceScheduled) {
  Start(SchedulingPolicy::kPriority);
  // low was scheduled first, then high finds no block: low, of larger
  // priority value, is preempted, its chunk withdrawn, and high takes a block.
  SchedulerOutput s = sched_->Schedule();
  EXPECT_EQ(low_->state, RequestState::kPreempted);
  EXPECT_EQ(low_->num_computed, 0);
  EXPECT_EQ(sched_->num_preemptions(), 1);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].request, high_);
  EXPECT_EQ(s.chunks[0].num_tokens, 1);
  EXPECT_EQ(sched_->running(), std::vector<Request*>{high_});
  Complete(s);
  sched_->Remove(high_);
  // low is back in line and recomputed, its cached prefix first.
  s = sched_->Schedule();
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].request, low_);
  EXPECT_EQ(low_->num_cached_tokens, 8);
  sched_->Remove(low_);
  EXPECT_EQ(kv_->pool().num_used(), 0);
}

TEST_F(SchedulerTest, PriorityHoldsBackLowerPriorityBehindARequestThatDoesNotFit) {
  for (const SchedulingPolicy policy : {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority}) {
    SCOPED_TRACE(SchedulingPolicyName(policy));
    requests_.clear();
    Make(4, 64, 8, absl::InfiniteDuration(), policy);  // 16 slots
    Request* x = Add("x", 6, 10);
    Complete(sched_->Schedule());  // x: 2 blocks, 7 tokens
    Request* big = Add("big", 12, 20, RequestKind::kGenerate, 1);   // 3 blocks: no
    Request* low = Add("low", 3, 40, RequestKind::kGenerate, 2);    // 1 block
    Request* peer = Add("peer", 3, 50, RequestKind::kGenerate, 1);  // 1 block
    SchedulerOutput s = sched_->Schedule();
    std::vector<Request*> scheduled;
    for (const ScheduledChunk& c : s.chunks) scheduled.push_back(c.request);
    EXPECT_EQ(big->state, RequestState::kWaiting);
    if (policy == SchedulingPolicy::kFcfs) {
      EXPECT_EQ(scheduled, (std::vector<Request*>{x, low, peer}));
    } else {
      // low would take a block big waits for; peer, of big's priority, goes.
      EXPECT_EQ(scheduled, (std::vector<Request*>{x, peer}));
      EXPECT_EQ(low->state, RequestState::kWaiting);
    }
  }
}

}  // namespace
}  // namespace tandem
