// The paged KV cache: fixed-size blocks of `block_size` token slots, each
// layer's K and V stored as f32[num_blocks, block_size, kv_heads, head_dim],
// and a block allocator with per-request block tables.
//
// Running out of blocks is RESOURCE_EXHAUSTED, which the scheduler handles
// (the request waits, or a running one is preempted); it never crashes.
//
// Not thread-safe: owned by the engine thread. Metrics read the counters
// through the engine's snapshot.
#ifndef TANDEM_COMMON_MODEL_KV_CACHE_H_
#define TANDEM_COMMON_MODEL_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/backend/device.h"
#include "common/kernels/ops.h"

namespace tandem {

// Free-list allocator of block ids [0, num_blocks).
class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);
  // Appends `count` blocks to `*blocks`; RESOURCE_EXHAUSTED (nothing taken)
  // when fewer than `count` are free.
  absl::Status Allocate(int count, std::vector<int32_t>* blocks);
  void Free(const std::vector<int32_t>& blocks);
  int num_blocks() const { return num_blocks_; }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_used() const { return num_blocks_ - num_free(); }
  // used / total, in [0, 1].
  double usage() const { return num_blocks_ == 0 ? 0.0 : double(num_used()) / num_blocks_; }

 private:
  int num_blocks_;
  std::vector<int32_t> free_;  // LIFO: recently freed blocks are reused first
};

// The cache storage plus the per-request block tables.
class KvCache {
 public:
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(Device* device, DType dtype,
                                                         int num_layers, int num_blocks,
                                                         int block_size, int num_kv_heads,
                                                         int head_dim);

  const KvLayer& layer(int i) const { return layers_[i]; }
  int block_size() const { return block_size_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  // Elements per token slot per layer for K (and for V): kv_heads * head_dim.
  int64_t slot_width() const { return slot_width_; }
  DType dtype() const { return dtype_; }
  // Bytes of one token slot of one layer for K (and for V).
  size_t slot_bytes() const { return static_cast<size_t>(slot_width_) * DTypeSize(dtype_); }
  BlockAllocator& allocator() { return allocator_; }
  const BlockAllocator& allocator() const { return allocator_; }

  // Grows request `id`'s table to cover `num_tokens` token slots.
  // RESOURCE_EXHAUSTED (table unchanged) when blocks run out.
  absl::Status EnsureCapacity(const std::string& id, int64_t num_tokens);
  // Frees every block of request `id` (no-op for an unknown id).
  void Free(const std::string& id);
  // The request's block table, or nullptr.
  const std::vector<int32_t>* BlockTable(const std::string& id) const;
  int64_t SlotOf(const std::vector<int32_t>& table, int64_t position) const {
    return int64_t{table[position / block_size_]} * block_size_ + position % block_size_;
  }
  int num_tables() const { return static_cast<int>(tables_.size()); }

 private:
  KvCache(int num_blocks, int block_size) : block_size_(block_size), allocator_(num_blocks) {}
  int block_size_;
  int64_t slot_width_ = 0;
  DType dtype_ = DType::kF32;
  BlockAllocator allocator_;
  std::unique_ptr<Arena> arena_;
  std::vector<KvLayer> layers_;
  // node_hash_map: BlockTable() pointers stay valid while other tables grow.
  absl::node_hash_map<std::string, std::vector<int32_t>> tables_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_KV_CACHE_H_
