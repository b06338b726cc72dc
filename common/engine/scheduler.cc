#include "common/engine/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem {

void Scheduler::Preempt(Request* r, std::vector<Request*>* returned) {
  kv_->Free(r->id);
  r->num_computed = 0;
  ++r->preemptions;
  ++preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), r));
  if (r->return_on_preemption) {
    returned->push_back(r);
  } else {
    waiting_.push_front(r);
  }
  TANDEM_LOG(DEBUG) << "preempted request " << r->id << " (KV cache full)";
}

void Scheduler::Remove(Request* r, bool keep_kv) {
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  if (!keep_kv) kv_->Free(r->id);
}

std::vector<ScheduledChunk> Scheduler::Schedule(std::vector<Request*>* failed,
                                                std::vector<Request*>* returned) {
  std::vector<ScheduledChunk> out;
  int budget = budget_;
  bool preempted = false;
  // 1. Running requests, oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    const int n = static_cast<int>(std::min<int64_t>(r->num_tokens() - r->num_computed, budget));
    if (n <= 0) {
      ++i;
      continue;
    }
    if (kv_->EnsureCapacity(r->id, r->num_computed + n).ok()) {
      out.push_back({r, r->num_computed, n, r->num_computed + n == r->num_tokens()});
      budget -= n;
      ++i;
      continue;
    }
    // No block: preempt the latest admitted request that is not yet scheduled.
    Request* victim = running_.back();
    Preempt(victim, returned);
    preempted = true;
    if (victim == r) break;
  }
  // 2. Admit waiting requests that fit, in order. One that does not fit yet
  // does not block the ones behind it: a request whose KV was transferred in
  // already holds its blocks, and holding it back behind a request waiting
  // for those very blocks would deadlock.
  for (auto it = waiting_.begin();
       !preempted && budget > 0 && it != waiting_.end() &&
       static_cast<int>(running_.size()) < max_seqs_;) {
    Request* r = *it;
    const int n = static_cast<int>(std::min<int64_t>(r->num_tokens() - r->num_computed, budget));
    absl::Status s = kv_->EnsureCapacity(r->id, r->num_computed + n);
    if (!s.ok()) {
      const int64_t needed = (r->num_computed + n + kv_->block_size() - 1) / kv_->block_size();
      if (running_.empty() && needed > kv_->allocator().num_blocks()) {
        it = waiting_.erase(it);
        r->finish = FinishReason::kError;
        r->error = absl::ResourceExhaustedError(absl::StrCat(
            "request ", r->id, " needs ", needed, " KV blocks; the cache has ",
            kv_->allocator().num_blocks()));
        failed->push_back(r);
        continue;
      }
      ++it;  // wait for blocks to free up
      continue;
    }
    it = waiting_.erase(it);
    running_.push_back(r);
    out.push_back({r, r->num_computed, n, r->num_computed + n == r->num_tokens()});
    budget -= n;
  }
  return out;
}

}  // namespace tandem
