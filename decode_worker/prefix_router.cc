#include "decode_worker/prefix_router.h"

#include <algorithm>
#include <cmath>


namespace tandem {

std::vector<uint64_t> PrefixRouter::Chain(const int32_t* tokens, size_t n, int block_tokens,
                                          uint64_t salt, size_t max_blocks) {
  std::vector<uint64_t> chain;
  const size_t blocks = std::min(n / static_cast<size_t>(block_tokens), max_blocks);
  chain.reserve(blocks);
  uint64_t h = Mix(salt);
  for (size_t b = 0; b < blocks; ++b) {
    for (int i = 0; i < block_tokens; ++i) {
      h = Mix(h ^ static_cast<uint32_t>(tokens[b * block_tokens + i]));
    }
    chain.push_back(h);
  }
  return chain;
}

PrefixRouter::Choice PrefixRouter::Pick(const std::vector<uint64_t>& chain, int64_t tokens,
                                        const std::vector<int>& candidates,
                                        const std::vector<int64_t>& loads,
                                        const std::vector<uint64_t>& ids) {
  uint64_t allowed = 0;
  for (int e : candidates) allowed |= uint64_t{1} << e;
  // The longest prefix each candidate holds: a hash stands for its whole
  // prefix, so the walk stops where no candidate holds the next block.
  std::vector<int> matched(kMaxEndpoints, 0);
  for (size_t d = 0; d < chain.size(); ++d) {
    auto it = holders_.find(chain[d]);
    const uint64_t have = it == holders_.end() ? 0 : it->second & allowed;
    if (have == 0) break;
    for (int e : candidates) {
      if (have >> e & 1) matched[e] = static_cast<int>(d) + 1;
    }
  }
  // Best first: the longest prefix, then rendezvous hashing of the first
  // block (a stable order per prefix, different across prefixes).
  const uint64_t key = chain.empty() ? 0 : chain[0];
  std::vector<std::pair<int, uint64_t>> order;  // (endpoint, its rendezvous score)
  for (int e : candidates) order.emplace_back(e, Mix(key ^ Mix(ids[e])));
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    if (matched[a.first] != matched[b.first]) return matched[a.first] > matched[b.first];
    return a.second > b.second;
  });
  // Bounded loads: no endpoint past load_factor x the mean, this prompt
  // counted, unless it stays within the mean and this prompt.
  int64_t total = tokens;
  for (int e : candidates) total += loads[e];
  const double mean = static_cast<double>(total) / static_cast<double>(candidates.size());
  const double cap = std::max(options_.load_factor * mean, mean + static_cast<double>(tokens));
  Choice choice;
  for (const auto& [e, score] : order) {
    if (static_cast<double>(loads[e] + tokens) <= cap) {
      choice.endpoint = e;
      break;
    }
  }
  if (choice.endpoint < 0) {  // every one past the cap: the least loaded
    choice.endpoint = *std::min_element(candidates.begin(), candidates.end(),
                                        [&](int a, int b) { return loads[a] < loads[b]; });
  }
  choice.matched_blocks = matched[choice.endpoint];
  choice.reason = choice.endpoint != order.front().first ? Reason::kLoad
                  : choice.matched_blocks > 0             ? Reason::kPrefix
                                                          : Reason::kHash;
  Record(chain, choice.endpoint);
  return choice;
}

void PrefixRouter::Record(const std::vector<uint64_t>& chain, int endpoint) {
  for (uint64_t h : chain) {
    auto [it, fresh] = holders_.try_emplace(h, 0);
    it->second |= uint64_t{1} << endpoint;
    if (fresh) order_.push_back(h);
  }
  while (holders_.size() > options_.capacity_blocks && !order_.empty()) {
    holders_.erase(order_.front());
    order_.pop_front();
  }
}

}  // namespace tandem
