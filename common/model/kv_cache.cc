#include "common/model/kv_cache.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

BlockAllocator::BlockAllocator(int num_blocks) : num_blocks_(num_blocks) {
  free_.reserve(num_blocks);
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

absl::Status BlockAllocator::Allocate(int count, std::vector<int32_t>* blocks) {
  if (count > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache: need ", count, " blocks, ", num_free(), " of ", num_blocks_, " free"));
  }
  for (int i = 0; i < count; ++i) {
    blocks->push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

void BlockAllocator::Free(const std::vector<int32_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) free_.push_back(*it);
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(Device* device, DType dtype,
                                                         int num_layers, int num_blocks,
                                                         int block_size, int num_kv_heads,
                                                         int head_dim) {
  if (num_blocks < 1 || block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache: num_kv_blocks (", num_blocks, ") and block_size (", block_size,
        ") must be >= 1"));
  }
  std::unique_ptr<KvCache> cache(new KvCache(num_blocks, block_size));
  cache->slot_width_ = int64_t{num_kv_heads} * head_dim;
  cache->dtype_ = dtype;
  const size_t per_tensor = static_cast<size_t>(num_blocks) * block_size * cache->slot_bytes();
  ASSIGN_OR_RETURN(cache->arena_,
                   Arena::Create(device, (per_tensor + 256) * 2 * num_layers, "kv-cache"));
  for (int l = 0; l < num_layers; ++l) {
    KvLayer layer;
    ASSIGN_OR_RETURN(layer.k, cache->arena_->Allocate(
                                  dtype, {num_blocks, block_size, num_kv_heads, head_dim}));
    ASSIGN_OR_RETURN(layer.v, cache->arena_->Allocate(
                                  dtype, {num_blocks, block_size, num_kv_heads, head_dim}));
    cache->layers_.push_back(layer);
  }
  return cache;
}

absl::Status KvCache::EnsureCapacity(const std::string& id, int64_t num_tokens) {
  std::vector<int32_t>& table = tables_[id];
  const int64_t needed = (num_tokens + block_size_ - 1) / block_size_;
  const int64_t missing = needed - static_cast<int64_t>(table.size());
  if (missing <= 0) return absl::OkStatus();
  absl::Status s = allocator_.Allocate(static_cast<int>(missing), &table);
  if (!s.ok() && table.empty()) tables_.erase(id);
  return s;
}

void KvCache::Free(const std::string& id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  allocator_.Free(it->second);
  tables_.erase(it);
}

const std::vector<int32_t>* KvCache::BlockTable(const std::string& id) const {
  auto it = tables_.find(id);
  return it == tables_.end() ? nullptr : &it->second;
}

}  // namespace tandem
