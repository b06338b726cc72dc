// PrefixRouter: which prefill worker of a fleet takes a prompt, so that
// prompts sharing a prefix meet the same worker's prefix cache instead of
// each worker computing every prefix once (round-robin divides the cache by
// the number of workers).
//
// As SGLang's cache-aware router does, it remembers which endpoint it sent
// each prefix to (chained hashes of the prompt's blocks, so a hash stands
// for its whole prefix) and picks the endpoint holding the longest prefix of
// the new prompt; a prompt no endpoint holds goes where rendezvous hashing
// of its first block says, so that concurrent first sightings of one system
// prompt converge too. Loads are bounded, as consistent hashing with bounded
// loads bounds them: an endpoint whose in-flight prompt tokens would pass
// load_factor times the fleet's mean (with this prompt counted; and the mean
// by more than the prompt) is passed over for the next best, so one hot prefix spreads instead of queueing on
// one worker. What it remembers is bounded (capacity_blocks, oldest first
// out): an approximation of the workers' caches, which evict on their own.
//
// Not thread-safe (PrefillPool holds it under its mutex).
#ifndef TANDEM_DECODE_WORKER_PREFIX_ROUTER_H_
#define TANDEM_DECODE_WORKER_PREFIX_ROUTER_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tandem {

class PrefixRouter {
 public:
  struct Options {
    // Prefixes remembered, in blocks, across all endpoints.
    size_t capacity_blocks = size_t{1} << 20;
    // An endpoint that this prompt would take past load_factor x the mean
    // in-flight tokens (this prompt included), and past the mean by more
    // than the prompt itself, is passed over: an idle fleet keeps a prefix
    // where it is, a loaded one spreads it.
    double load_factor = 1.25;
  };
  static constexpr int kMaxEndpoints = 64;

  enum class Reason { kPrefix, kHash, kLoad };
  struct Choice {
    int endpoint = -1;
    int matched_blocks = 0;  // of the chosen endpoint
    Reason reason = Reason::kHash;
  };

  explicit PrefixRouter(Options options) : options_(options) {}

  // The chained hashes of the full blocks of `tokens`, seeded by `salt`
  // (caches are not shared across adapters or cache salts), at most
  // max_blocks of them. The same in every process, so that several decode
  // workers send a prefix none of them has seen to the same endpoint.
  static std::vector<uint64_t> Chain(const int32_t* tokens, size_t n, int block_tokens,
                                     uint64_t salt, size_t max_blocks = 4096);

  // The endpoint for a prompt of `chain` and `tokens` tokens to compute,
  // among `candidates` (indexes below kMaxEndpoints, not empty), given each
  // endpoint's in-flight tokens `loads` and its identity `ids` (a hash of
  // its address: rendezvous hashing then agrees across decode workers
  // whatever order they list the endpoints in), both indexed by endpoint.
  // Records that the chosen endpoint now holds the chain.
  Choice Pick(const std::vector<uint64_t>& chain, int64_t tokens, const std::vector<int>& candidates,
              const std::vector<int64_t>& loads, const std::vector<uint64_t>& ids);

  // A 64-bit mix (splitmix64's finalizer): the hashes above are these, so
  // that every process computes the same ones.
  static uint64_t Mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }

  size_t remembered() const { return holders_.size(); }

 private:
  void Record(const std::vector<uint64_t>& chain, int endpoint);

  Options options_;
  absl::flat_hash_map<uint64_t, uint64_t> holders_;  // chained block hash -> endpoint bits
  std::deque<uint64_t> order_;                         // hashes, oldest first
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_PREFIX_ROUTER_H_
