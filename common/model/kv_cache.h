// The paged KV cache: fixed-size blocks of `block_size` token slots, each
// layer's K and V stored as [num_blocks, block_size, kv_heads, head_dim], a
// ref-counted block pool, and the per-request block tables.
//
// Prefix caching (vLLM v1's KVCacheManager/BlockPool): a full block whose KV
// is computed is registered under the hash of (its parent block's hash, its
// token ids). A request that starts with the same tokens takes those blocks
// (one more reference each) and computes only the rest. A block nobody
// references goes to the free queue but keeps its KV and its hash until it is
// handed out again: free blocks are reused least recently freed first, and a
// request's blocks are freed tail first, so a shared prefix outlives the
// suffixes behind it. A hit also compares the block's stored token ids, so a
// hash collision costs a miss, never wrong KV.
//
// Running out of blocks is RESOURCE_EXHAUSTED, which the scheduler handles
// (the request waits, or a running one is preempted); it never crashes.
//
// Not thread-safe: owned by the engine thread. Metrics read the counters
// through the engine's snapshot.
#ifndef TANDEM_COMMON_MODEL_KV_CACHE_H_
#define TANDEM_COMMON_MODEL_KV_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/backend/device.h"
#include "common/kernels/ops.h"

namespace tandem {

// A change to the set of cached blocks, as vLLM's KV events describe it
// (BlockStored / BlockRemoved / AllBlocksCleared): what an outside router
// needs to know which prefixes a worker holds.
struct KvCacheEvent {
  enum class Kind { kStored, kRemoved, kCleared };
  Kind kind = Kind::kStored;
  std::vector<uint64_t> hashes;    // kStored, kRemoved: in chain order (stored) or eviction order
  std::optional<uint64_t> parent;  // kStored: the key before hashes[0]; none for a first block
  std::vector<int32_t> token_ids;  // kStored: block_size ids per hash, concatenated
};

// Blocks [0, num_blocks) with reference counts, a free queue in eviction
// order and the hash map of cached full blocks.
class BlockPool {
 public:
  // Without `enable_caching` no block is ever registered, so every lookup
  // misses and freed blocks are plain free blocks.
  BlockPool(int num_blocks, int block_size, bool enable_caching);

  // Appends `count` blocks (one reference each) to `*blocks`, evicting the
  // least recently freed cached blocks; RESOURCE_EXHAUSTED (nothing taken)
  // when fewer than `count` are free.
  absl::Status Allocate(int count, std::vector<int32_t>* blocks);
  // Drops one reference to each block, last first; a block left unreferenced
  // joins the free queue's tail (its cached KV stays until it is reused).
  void Free(const std::vector<int32_t>& blocks);
  // A full block's key: the hash of its parent block's key (0 for the first
  // block) and its token ids.
  static uint64_t Hash(uint64_t parent_hash, absl::Span<const int32_t> tokens);
  // The cached block with key `hash` holding `tokens` (block_size ids) after
  // the block keyed `parent_hash`, or -1.
  int32_t Lookup(uint64_t hash, uint64_t parent_hash, absl::Span<const int32_t> tokens) const;
  // Takes one more reference to a block (a prefix hit).
  void Ref(int32_t block);
  // Registers a full, computed block under `hash`. A block already cached,
  // or a hash already held by another block, leaves the map as it is.
  // `first`: the block starts its chain (`parent_hash` is a root, not a
  // block's key), which its stored event says with no parent.
  void Cache(int32_t block, uint64_t hash, uint64_t parent_hash, absl::Span<const int32_t> tokens,
             bool first = false);

  // With events on, every change to the cached set is recorded, in order, as
  // a KvCacheEvent until TakeEvents() hands them over (runs of blocks stored
  // one after the other, and evictions one after the other, share an event).
  // Turning them on records an AllBlocksCleared first when nothing is cached
  // (a fresh or restarted worker), so a consumer starts from empty.
  void RecordEvents(bool on);
  std::vector<KvCacheEvent> TakeEvents() { return std::exchange(events_, {}); }
  // The keys of every cached block (tests compare a consumer's rebuilt view).
  std::vector<uint64_t> CachedHashes() const;

  int num_blocks() const { return num_blocks_; }
  bool caching() const { return caching_; }
  // Blocks no request references (cached or not): what Allocate() can take.
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_used() const { return num_blocks_ - num_free(); }
  // Blocks registered in the hash map (referenced or free).
  int num_cached() const { return static_cast<int>(cached_.size()); }
  // used / total, in [0, 1].
  double usage() const { return num_blocks_ == 0 ? 0.0 : double(num_used()) / num_blocks_; }
  int ref_count(int32_t block) const { return blocks_[block].refs; }

 private:
  struct Block {
    int refs = 0;
    bool cached = false;
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    std::list<int32_t>::iterator free_pos;  // valid while refs == 0
  };
  void Uncache(int32_t block);

  int num_blocks_;
  int block_size_;
  bool caching_;
  std::vector<Block> blocks_;
  std::vector<int32_t> tokens_;  // [num_blocks, block_size]: ids of each cached block
  std::list<int32_t> free_;      // eviction order: front first
  absl::flat_hash_map<uint64_t, int32_t> cached_;
  bool record_events_ = false;
  std::vector<KvCacheEvent> events_;
};

// The cache storage plus the per-request block tables.
class KvCache {
 public:
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(Device* device, DType dtype,
                                                         int num_layers, int num_blocks,
                                                         int block_size, int num_kv_heads,
                                                         int head_dim,
                                                         bool enable_prefix_caching = false);

  const KvLayer& layer(int i) const { return layers_[i]; }
  int block_size() const { return block_size_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  // Elements per token slot per layer for K (and for V): kv_heads * head_dim.
  int64_t slot_width() const { return slot_width_; }
  DType dtype() const { return dtype_; }
  // Bytes of one token slot of one layer for K (and for V).
  size_t slot_bytes() const { return static_cast<size_t>(slot_width_) * DTypeSize(dtype_); }
  // KV bytes of one token over all layers, K and V.
  size_t token_bytes() const { return 2 * slot_bytes() * layers_.size(); }
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }

  // Starts request `id`'s table (it must have none) with the cached blocks of
  // the longest cached prefix of `tokens`, at most `max_tokens` tokens (whole
  // blocks). Returns the number of tokens whose KV is already there (0 without
  // prefix caching). `root` stands for what the KV depends on besides the
  // tokens, or whom it may be shared with (a LoRA adapter's fingerprint, a
  // request's cache salt; 0: the base model, unsalted): it is the first
  // block's parent, so requests of different roots share no block.
  int64_t TakeCachedPrefix(const std::string& id, absl::Span<const int32_t> tokens,
                           int64_t max_tokens, uint64_t root = 0);
  // Grows request `id`'s table to cover `num_tokens` token slots.
  // RESOURCE_EXHAUSTED (table unchanged) when blocks run out.
  absl::Status EnsureCapacity(const std::string& id, int64_t num_tokens);
  // The first `num_computed` of `tokens` have their KV in request `id`'s
  // blocks: registers the full blocks among them for reuse, under `root`
  // (as TakeCachedPrefix's).
  void CacheComputed(const std::string& id, absl::Span<const int32_t> tokens,
                     int64_t num_computed, uint64_t root = 0);
  // Drops request `id`'s references to its blocks (no-op for an unknown id).
  void Free(const std::string& id);
  // The request's block table, or nullptr.
  const std::vector<int32_t>* BlockTable(const std::string& id) const;
  int64_t SlotOf(const std::vector<int32_t>& table, int64_t position) const {
    return int64_t{table[position / block_size_]} * block_size_ + position % block_size_;
  }
  int num_tables() const { return static_cast<int>(tables_.size()); }

 private:
  struct Table {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> hashes;  // of blocks[0, hashes.size()): registered or hit
  };
  KvCache(int num_blocks, int block_size, bool caching)
      : block_size_(block_size), pool_(num_blocks, block_size, caching) {}
  int block_size_;
  int64_t slot_width_ = 0;
  DType dtype_ = DType::kF32;
  BlockPool pool_;
  std::unique_ptr<Arena> arena_;
  std::vector<KvLayer> layers_;
  // node_hash_map: BlockTable() pointers stay valid while other tables grow.
  absl::node_hash_map<std::string, Table> tables_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_KV_CACHE_H_
