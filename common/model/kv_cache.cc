#include "common/model/kv_cache.h"

#include <algorithm>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

BlockPool::BlockPool(int num_blocks, int block_size, bool enable_caching)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      caching_(enable_caching),
      blocks_(num_blocks),
      tokens_(enable_caching ? static_cast<size_t>(num_blocks) * block_size : 0) {
  for (int32_t b = 0; b < num_blocks; ++b) blocks_[b].free_pos = free_.insert(free_.end(), b);
}

void BlockPool::Uncache(int32_t block) {
  Block& b = blocks_[block];
  if (!b.cached) return;
  auto it = cached_.find(b.hash);
  if (it != cached_.end() && it->second == block) cached_.erase(it);
  b.cached = false;
  if (record_events_) {
    if (events_.empty() || events_.back().kind != KvCacheEvent::Kind::kRemoved) {
      events_.push_back({.kind = KvCacheEvent::Kind::kRemoved});
    }
    events_.back().hashes.push_back(b.hash);
  }
}

void BlockPool::RecordEvents(bool on) {
  if (on && !record_events_ && cached_.empty()) {
    events_.push_back({.kind = KvCacheEvent::Kind::kCleared});
  }
  record_events_ = on;
  if (!on) events_.clear();
}

std::vector<uint64_t> BlockPool::CachedHashes() const {
  std::vector<uint64_t> hashes;
  hashes.reserve(cached_.size());
  for (const auto& [hash, block] : cached_) hashes.push_back(hash);
  return hashes;
}

absl::Status BlockPool::Allocate(int count, std::vector<int32_t>* blocks) {
  if (count > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache: need ", count, " blocks, ", num_free(), " of ", num_blocks_, " free"));
  }
  for (int i = 0; i < count; ++i) {
    const int32_t id = free_.front();
    free_.pop_front();
    Uncache(id);  // evicted: its KV is about to be overwritten
    blocks_[id].refs = 1;
    blocks->push_back(id);
  }
  return absl::OkStatus();
}

void BlockPool::Free(const std::vector<int32_t>& blocks) {
  // Tail first: a request's last blocks are the least likely to be shared,
  // so they are evicted before its prefix.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    Block& b = blocks_[*it];
    if (--b.refs == 0) b.free_pos = free_.insert(free_.end(), *it);
  }
}

uint64_t BlockPool::Hash(uint64_t parent_hash, absl::Span<const int32_t> tokens) {
  return absl::HashOf(parent_hash, tokens);
}

int32_t BlockPool::Lookup(uint64_t hash, uint64_t parent_hash,
                          absl::Span<const int32_t> tokens) const {
  if (!caching_) return -1;
  auto it = cached_.find(hash);
  if (it == cached_.end()) return -1;
  const int32_t id = it->second;
  const Block& b = blocks_[id];
  if (b.parent_hash != parent_hash ||
      !std::equal(tokens.begin(), tokens.end(), tokens_.begin() + int64_t{id} * block_size_)) {
    return -1;  // a hash collision
  }
  return id;
}

void BlockPool::Ref(int32_t block) {
  Block& b = blocks_[block];
  if (b.refs++ == 0) free_.erase(b.free_pos);
}

void BlockPool::Cache(int32_t block, uint64_t hash, uint64_t parent_hash,
                      absl::Span<const int32_t> tokens, bool first) {
  Block& b = blocks_[block];
  if (!caching_ || b.cached || !cached_.emplace(hash, block).second) return;
  b.cached = true;
  b.hash = hash;
  b.parent_hash = parent_hash;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + int64_t{block} * block_size_);
  if (!record_events_) return;
  // Extends the last event when this block continues its run.
  if (events_.empty() || events_.back().kind != KvCacheEvent::Kind::kStored || first ||
      events_.back().hashes.back() != parent_hash) {
    KvCacheEvent e{.kind = KvCacheEvent::Kind::kStored};
    if (!first) e.parent = parent_hash;
    events_.push_back(std::move(e));
  }
  events_.back().hashes.push_back(hash);
  events_.back().token_ids.insert(events_.back().token_ids.end(), tokens.begin(), tokens.end());
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(Device* device, DType dtype,
                                                         int num_layers, int num_blocks,
                                                         int block_size, int num_kv_heads,
                                                         int head_dim,
                                                         bool enable_prefix_caching) {
  if (num_blocks < 1 || block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache: num_kv_blocks (", num_blocks, ") and block_size (", block_size,
        ") must be >= 1"));
  }
  std::unique_ptr<KvCache> cache(new KvCache(num_blocks, block_size, enable_prefix_caching));
  cache->slot_width_ = int64_t{num_kv_heads} * head_dim;
  cache->dtype_ = dtype;
  auto place = [&](Arena* arena) -> absl::Status {
    cache->layers_.clear();
    for (int l = 0; l < num_layers; ++l) {
      KvLayer layer;
      ASSIGN_OR_RETURN(layer.k,
                       arena->Allocate(dtype, {num_blocks, block_size, num_kv_heads, head_dim}));
      ASSIGN_OR_RETURN(layer.v,
                       arena->Allocate(dtype, {num_blocks, block_size, num_kv_heads, head_dim}));
      cache->layers_.push_back(layer);
    }
    return absl::OkStatus();
  };
  std::unique_ptr<Arena> measure = Arena::Measure("kv-cache");
  RETURN_IF_ERROR(place(measure.get()));
  ASSIGN_OR_RETURN(cache->arena_, Arena::Create(device, measure->used(), "kv-cache"));
  RETURN_IF_ERROR(place(cache->arena_.get()));
  return cache;
}

int64_t KvCache::TakeCachedPrefix(const std::string& id, absl::Span<const int32_t> tokens,
                                  int64_t max_tokens, uint64_t root) {
  if (!pool_.caching()) return 0;
  Table& table = tables_[id];
  const int64_t max_blocks = std::min<int64_t>(max_tokens, tokens.size()) / block_size_;
  uint64_t parent = root;
  for (int64_t i = static_cast<int64_t>(table.blocks.size()); i < max_blocks; ++i) {
    const absl::Span<const int32_t> ids = tokens.subspan(i * block_size_, block_size_);
    const uint64_t hash = BlockPool::Hash(parent, ids);
    const int32_t block = pool_.Lookup(hash, parent, ids);
    if (block < 0) break;
    pool_.Ref(block);
    table.blocks.push_back(block);
    table.hashes.push_back(hash);
    parent = hash;
  }
  const int64_t hit = static_cast<int64_t>(table.blocks.size()) * block_size_;
  if (table.blocks.empty()) tables_.erase(id);
  return hit;
}

absl::Status KvCache::EnsureCapacity(const std::string& id, int64_t num_tokens) {
  Table& table = tables_[id];
  const int64_t needed = (num_tokens + block_size_ - 1) / block_size_;
  const int64_t missing = needed - static_cast<int64_t>(table.blocks.size());
  if (missing <= 0) return absl::OkStatus();
  absl::Status s = pool_.Allocate(static_cast<int>(missing), &table.blocks);
  if (!s.ok() && table.blocks.empty()) tables_.erase(id);
  return s;
}

void KvCache::CacheComputed(const std::string& id, absl::Span<const int32_t> tokens,
                            int64_t num_computed, uint64_t root) {
  if (!pool_.caching()) return;
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  Table& table = it->second;
  const int64_t full = std::min<int64_t>(std::min<int64_t>(num_computed, tokens.size()) /
                                             block_size_,
                                         table.blocks.size());
  for (int64_t i = static_cast<int64_t>(table.hashes.size()); i < full; ++i) {
    const uint64_t parent = i == 0 ? root : table.hashes[i - 1];
    const absl::Span<const int32_t> ids = tokens.subspan(i * block_size_, block_size_);
    const uint64_t hash = BlockPool::Hash(parent, ids);
    pool_.Cache(table.blocks[i], hash, parent, ids, /*first=*/i == 0);
    table.hashes.push_back(hash);
  }
}

void KvCache::Free(const std::string& id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  pool_.Free(it->second.blocks);
  tables_.erase(it);
}

const std::vector<int32_t>* KvCache::BlockTable(const std::string& id) const {
  auto it = tables_.find(id);
  return it == tables_.end() ? nullptr : &it->second.blocks;
}

}  // namespace tandem
