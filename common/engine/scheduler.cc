#include "common/engine/scheduler.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem {

namespace {
// vLLM's order of a priority queue: a lower priority value first, then the
// earlier arrival.
std::pair<int32_t, uint64_t> Key(const Request* r) { return {r->params.priority, r->arrival}; }
}  // namespace

void Scheduler::Erase(std::vector<Request*>* v, Request* r) {
  v->erase(std::remove(v->begin(), v->end(), r), v->end());
}

void Scheduler::Enqueue(Request* r, bool front) {
  if (policy_ == SchedulingPolicy::kPriority) {
    waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), r,
                                     [](const Request* a, const Request* b) {
                                       return Key(a) < Key(b);
                                     }),
                    r);
  } else if (front) {
    waiting_.push_front(r);
  } else {
    waiting_.push_back(r);
  }
}

Request* Scheduler::Victim() const {
  if (policy_ == SchedulingPolicy::kFcfs) return running_.back();
  return *std::max_element(running_.begin(), running_.end(),
                           [](const Request* a, const Request* b) { return Key(a) < Key(b); });
}

const Request* Scheduler::LastUnstarted() const {
  if (policy_ != SchedulingPolicy::kPriority) return nullptr;
  // In (priority, arrival) order under kPriority (Enqueue).
  for (auto it = waiting_.rbegin(); it != waiting_.rend(); ++it) {
    if ((*it)->state == RequestState::kWaiting && (*it)->admitted_at == absl::InfinitePast()) {
      return *it;
    }
  }
  return nullptr;
}

void Scheduler::AddWaiting(Request* r) {
  r->state = RequestState::kWaiting;
  r->needs_remote_kv = r->kind == RequestKind::kRemotePrefill;
  Enqueue(r, /*front=*/false);
}

void Scheduler::Preempt(Request* r) {
  kv_->Free(r->id);
  r->num_computed = 0;
  r->drafts.clear();
  ++r->preemptions;
  ++preemptions_;
  Erase(&running_, r);
  r->state = RequestState::kPreempted;
  // Recomputed where its prefill was computed (its cached prefix, if still
  // there, is taken back on admission).
  r->needs_remote_kv = r->kind == RequestKind::kRemotePrefill;
  Enqueue(r, /*front=*/true);
  TANDEM_LOG(DEBUG) << "preempted request " << r->id << " (KV cache full)";
}

void Scheduler::RemoteKvArrived(Request* r) {
  Erase(&remote_, r);
  r->needs_remote_kv = false;
  r->state = RequestState::kWaiting;
  Enqueue(r, /*front=*/false);
}

void Scheduler::ComputeLocally(Request* r) {
  Erase(&remote_, r);
  r->kind = RequestKind::kGenerate;
  r->needs_remote_kv = false;
  r->state = RequestState::kWaiting;
  Enqueue(r, /*front=*/true);
}

void Scheduler::Remove(Request* r, bool free_blocks) {
  Erase(&running_, r);
  Erase(&remote_, r);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  if (free_blocks) kv_->Free(r->id);
}

bool Scheduler::Admit(Request* r, int budget, int* n) {
  const bool fresh = kv_->BlockTable(r->id) == nullptr;
  if (fresh) {
    // At most all but the last token: it must be computed to sample. None
    // for prompt logprobs: every position's logits are computed.
    r->num_cached_tokens = r->params.prompt_logprobs >= 0
                               ? 0
                               : kv_->TakeCachedPrefix(r->id, r->tokens, r->num_tokens() - 1,
                                                       r->cache_root);
    r->num_computed = r->num_cached_tokens;
  }
  int64_t need;
  if (r->needs_remote_kv) {
    *n = 0;
    need = r->num_tokens() + 1;  // the KV to come and the next token's slot
  } else {
    *n = static_cast<int>(std::min<int64_t>(r->num_tokens() - r->num_computed, budget));
    need = r->num_computed + *n;
  }
  if (kv_->EnsureCapacity(r->id, need).ok()) {
    if (fresh) {
      if (r->admitted_at == absl::InfinitePast()) r->admitted_at = absl::Now();
      prefix_stats_.queries += r->num_tokens();
      prefix_stats_.hits += r->num_cached_tokens;
    }
    return true;
  }
  if (fresh) {  // give the prefix back until it fits
    kv_->Free(r->id);
    r->num_computed = 0;
    r->num_cached_tokens = 0;
  }
  return false;
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int budget = budget_;
  int rows = max_logit_rows_;  // rows of logits the step has left
  bool preempted = false;
  // 1. Running requests, oldest first. A chunk that wants prompt logits
  // takes a row a token, of what the running requests after it leave (a
  // decode's 1 + drafts each; fewer than max_num_seqs x q in all).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    int n = static_cast<int>(std::min<int64_t>(r->num_tokens() - r->num_computed, budget));
    if (r->WantsPromptLogits(r->num_computed)) {
      int later = 0;
      for (size_t j = i + 1; j < running_.size(); ++j) {
        const Request* o = running_[j];
        if (!o->WantsPromptLogits(o->num_computed)) later += 1 + static_cast<int>(o->drafts.size());
      }
      n = std::min(n, rows - later);
    }
    if (n <= 0) {
      r->drafts.clear();
      ++i;
      continue;
    }
    // Drafts ride on a decode, in what the budget leaves, when their slots
    // are free.
    const bool decode = r->num_tokens() - r->num_computed == 1;
    r->drafts.resize(decode ? std::min<size_t>(r->drafts.size(), budget - n) : 0);
    if (!r->drafts.empty() &&
        !kv_->EnsureCapacity(r->id, r->num_computed + n + r->drafts.size()).ok()) {
      r->drafts.clear();
    }
    if (kv_->EnsureCapacity(r->id, r->num_computed + n).ok()) {
      const int drafts = static_cast<int>(r->drafts.size());
      out.chunks.push_back({r, r->num_computed, n + drafts, r->num_computed + n == r->num_tokens(),
                            drafts, r->WantsPromptLogits(r->num_computed)});
      budget -= n + drafts;
      rows -= out.chunks.back().logit_rows();
      ++i;
      continue;
    }
    // No block: preempt the latest admitted request (kFcfs: one not yet
    // scheduled) or the one of lowest priority (kPriority: perhaps one
    // already scheduled, whose chunk is withdrawn).
    Request* victim = Victim();
    const size_t at = std::find(running_.begin(), running_.end(), victim) - running_.begin();
    if (at < i) {
      const auto c = std::find_if(out.chunks.begin(), out.chunks.end(),
                                  [victim](const ScheduledChunk& c) { return c.request == victim; });
      if (c != out.chunks.end()) {
        budget += c->num_tokens;
        rows += c->logit_rows();
        out.chunks.erase(c);
      }
      --i;
    }
    Preempt(victim);
    preempted = true;
    if (victim == r) break;
  }
  // 2. Admit waiting requests that fit, in order. One that does not fit yet
  // does not block the ones behind it: a request whose KV was transferred in
  // already holds its blocks, and holding it back behind a request waiting
  // for those very blocks would deadlock.
  // kPriority: the priority of the first new request that did not fit; new
  // requests of lower priority (larger values) wait behind it.
  const absl::Time now = absl::Now();
  std::optional<int32_t> held_back_above;
  for (auto it = waiting_.begin(); !preempted && budget > 0 && it != waiting_.end();) {
    Request* r = *it;
    if (!r->needs_remote_kv && static_cast<int>(running_.size()) >= max_seqs_) {
      ++it;
      continue;
    }
    const bool holds_blocks = kv_->BlockTable(r->id) != nullptr;
    if (held_back_above.has_value() && !holds_blocks && r->params.priority > *held_back_above) {
      ++it;
      continue;
    }
    int n = 0;
    // A chunk that samples takes a row, one that wants prompt logits a row
    // a token: none is admitted once the step's rows are spent.
    const int allowed =
        r->needs_remote_kv ? budget : r->WantsPromptLogits(0) ? std::min(budget, rows) : budget;
    if (!r->needs_remote_kv && rows <= 0) {
      ++it;
      continue;
    }
    if (!Admit(r, allowed, &n)) {
      const int64_t tokens = r->num_tokens() + (r->needs_remote_kv ? 1 : 0);
      const int64_t needed = (tokens + kv_->block_size() - 1) / kv_->block_size();
      const bool never = needed > kv_->pool().num_blocks();
      const bool timed_out = r->preemptions == 0 && kv_->BlockTable(r->id) == nullptr &&
                             now - r->queued_at > waiting_timeout_;
      if (!never && !timed_out) {
        if (policy_ == SchedulingPolicy::kPriority && !holds_blocks && !held_back_above) {
          held_back_above = r->params.priority;
        }
        ++it;  // wait for blocks to free up
        continue;
      }
      it = waiting_.erase(it);
      r->finish = FinishReason::kError;
      r->state = RequestState::kFinishedError;
      r->error = absl::ResourceExhaustedError(
          never ? absl::StrCat("request ", r->id, " needs ", needed, " KV blocks of ",
                               kv_->block_size(), " tokens; the cache has ",
                               kv_->pool().num_blocks())
                : absl::StrCat("KV cache full: request ", r->id, " waited ",
                               absl::FormatDuration(waiting_timeout_), " for ", tokens,
                               " token slots (", kv_->pool().num_free(), " of ",
                               kv_->pool().num_blocks(), " blocks free)"));
      out.failed.push_back(r);
      continue;
    }
    it = waiting_.erase(it);
    if (r->needs_remote_kv) {
      r->state = RequestState::kWaitingForRemoteKv;
      remote_.push_back(r);
      out.kv_needed.push_back(r);
      continue;
    }
    r->state = RequestState::kRunning;
    running_.push_back(r);
    out.chunks.push_back({r, r->num_computed, n, r->num_computed + n == r->num_tokens(), 0,
                          r->WantsPromptLogits(r->num_computed)});
    budget -= n;
    rows -= out.chunks.back().logit_rows();
  }
  return out;
}

}  // namespace tandem
