#include "common/model/kv_cache.h"

#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "common/backend/cpu/cpu_device.h"

namespace tandem {
namespace {

TEST(BlockPoolTest, ExhaustionIsStatusAndTakesNothing) {
  BlockPool a(4, 4, false);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(a.Allocate(3, &blocks).ok());
  EXPECT_EQ(a.num_used(), 3);
  EXPECT_DOUBLE_EQ(a.usage(), 0.75);
  absl::Status s = a.Allocate(2, &blocks);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(blocks.size(), 3u);
  EXPECT_EQ(a.num_free(), 1);
  a.Free(blocks);
  EXPECT_EQ(a.num_used(), 0);
}

TEST(KvCacheTest, TablesGrowAndFree) {
  auto device = CreateCpuDevice();
  auto kv = KvCache::Create(device.get(), DType::kF32, 2, 8, 4, 2, 8);
  ASSERT_TRUE(kv.ok());
  ASSERT_TRUE((*kv)->EnsureCapacity("a", 5).ok());  // 2 blocks
  EXPECT_EQ((*kv)->BlockTable("a")->size(), 2u);
  ASSERT_TRUE((*kv)->EnsureCapacity("a", 8).ok());  // still 2
  EXPECT_EQ((*kv)->BlockTable("a")->size(), 2u);
  ASSERT_TRUE((*kv)->EnsureCapacity("b", 24).ok());  // 6 blocks: cache full
  EXPECT_EQ((*kv)->EnsureCapacity("c", 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*kv)->BlockTable("c"), nullptr);
  const auto& table = *(*kv)->BlockTable("a");
  EXPECT_EQ((*kv)->SlotOf(table, 5), int64_t{table[1]} * 4 + 1);
  (*kv)->Free("a");
  (*kv)->Free("b");
  (*kv)->Free("unknown");
  EXPECT_EQ((*kv)->pool().num_used(), 0);
  EXPECT_EQ((*kv)->num_tables(), 0);
}

std::vector<int32_t> Seq(int n, int start) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = start + i;
  return t;
}

TEST(BlockPoolTest, RefCountsKeepSharedBlocksUntilTheLastUserFrees) {
  BlockPool pool(4, 2, /*enable_caching=*/true);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.Allocate(2, &a).ok());
  pool.Ref(a[0]);  // a second request shares the first block
  EXPECT_EQ(pool.ref_count(a[0]), 2);
  pool.Free(a);
  EXPECT_EQ(pool.num_used(), 1);  // still held by the sharer
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  pool.Free({a[0]});
  EXPECT_EQ(pool.num_used(), 0);
}

TEST(BlockPoolTest, CachedBlocksAreFoundByHashAndEvictedLeastRecentlyFreedFirst) {
  BlockPool pool(3, 2, /*enable_caching=*/true);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.Allocate(1, &a).ok());
  ASSERT_TRUE(pool.Allocate(1, &b).ok());
  const std::vector<int32_t> ta = {5, 6}, tb = {7, 8};
  const uint64_t ha = BlockPool::Hash(0, ta), hb = BlockPool::Hash(0, tb);
  pool.Cache(a[0], ha, 0, ta);
  pool.Cache(b[0], hb, 0, tb);
  EXPECT_EQ(pool.num_cached(), 2);
  pool.Free(a);  // freed first: evicted first
  pool.Free(b);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.Lookup(ha, 0, ta), a[0]);  // free but still cached
  EXPECT_EQ(pool.Lookup(hb, 0, tb), b[0]);
  // The same hash with other tokens (a collision) or another parent misses.
  EXPECT_EQ(pool.Lookup(ha, 0, tb), -1);
  EXPECT_EQ(pool.Lookup(ha, 1, ta), -1);
  std::vector<int32_t> c;
  ASSERT_TRUE(pool.Allocate(2, &c).ok());  // the never-used block, then a's
  EXPECT_EQ(pool.Lookup(ha, 0, ta), -1);   // evicted
  EXPECT_EQ(pool.Lookup(hb, 0, tb), b[0]);
  EXPECT_EQ(pool.num_cached(), 1);
  // Taking a free cached block back removes it from the free queue.
  pool.Ref(b[0]);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.Allocate(1, &c).code(), absl::StatusCode::kResourceExhausted);
}

TEST(BlockPoolTest, WithoutCachingNothingIsFound) {
  BlockPool pool(2, 2, /*enable_caching=*/false);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.Allocate(1, &a).ok());
  const std::vector<int32_t> t = {1, 2};
  pool.Cache(a[0], BlockPool::Hash(0, t), 0, t);
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.Lookup(BlockPool::Hash(0, t), 0, t), -1);
}

TEST(KvCacheTest, PrefixOfFullComputedBlocksIsReused) {
  auto device = CreateCpuDevice();
  auto kv = KvCache::Create(device.get(), DType::kF32, 1, 8, 4, 1, 4, /*prefix_caching=*/true);
  ASSERT_TRUE(kv.ok());
  KvCache& c = **kv;
  const std::vector<int32_t> a = Seq(10, 100);  // blocks [100..103] [104..107] [108 109]
  EXPECT_EQ(c.TakeCachedPrefix("a", a, 9), 0);
  ASSERT_TRUE(c.EnsureCapacity("a", 10).ok());
  c.CacheComputed("a", a, 10);  // two full blocks registered
  EXPECT_EQ(c.pool().num_cached(), 2);
  // Same first 6 tokens: one whole block is shared.
  std::vector<int32_t> b = Seq(6, 100);
  b.push_back(1);
  EXPECT_EQ(c.TakeCachedPrefix("b", b, 6), 4);
  EXPECT_EQ((*c.BlockTable("b"))[0], (*c.BlockTable("a"))[0]);
  EXPECT_EQ(c.pool().ref_count((*c.BlockTable("a"))[0]), 2);
  // At most max_tokens, in whole blocks: 7 of a's tokens allow one block.
  EXPECT_EQ(c.TakeCachedPrefix("c", a, 7), 4);
  // A different first block shares nothing, even with equal later tokens.
  std::vector<int32_t> d = a;
  d[0] = 1;
  EXPECT_EQ(c.TakeCachedPrefix("d", d, 9), 0);
  EXPECT_EQ(c.BlockTable("d"), nullptr);
  c.Free("a");
  c.Free("b");
  c.Free("c");
  EXPECT_EQ(c.pool().num_used(), 0);
  // Freed, the blocks keep their KV: a later request takes both.
  EXPECT_EQ(c.TakeCachedPrefix("e", a, 9), 8);
  c.Free("e");
  EXPECT_EQ(c.num_tables(), 0);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// What a KV event consumer keeps: the cached keys, rebuilt from events only.
struct EventMirror {
  absl::flat_hash_set<uint64_t> held;
  int cleared = 0;
  void Apply(const std::vector<KvCacheEvent>& events, int block_size) {
    for (const KvCacheEvent& e : events) {
      switch (e.kind) {
        case KvCacheEvent::Kind::kStored:
          EXPECT_EQ(e.token_ids.size(), e.hashes.size() * block_size);
          // A run continues a block the consumer holds, or starts a chain.
          if (e.parent.has_value()) EXPECT_TRUE(held.contains(*e.parent));
          for (uint64_t h : e.hashes) EXPECT_TRUE(held.insert(h).second) << "stored twice";
          break;
        case KvCacheEvent::Kind::kRemoved:
          for (uint64_t h : e.hashes) EXPECT_EQ(held.erase(h), 1u) << "removed unknown";
          break;
        case KvCacheEvent::Kind::kCleared:
          held.clear();
          ++cleared;
          break;
      }
    }
  }
};

TEST(KvCacheEventsTest, ConsumerRebuildsTheCachedSetThroughEvictions) {
  auto device = CreateCpuDevice();
  constexpr int kBlock = 4;
  auto kv = KvCache::Create(device.get(), DType::kF32, 1, 24, kBlock, 1, 4,
                            /*enable_prefix_caching=*/true);
  ASSERT_TRUE(kv.ok());
  BlockPool& pool = (*kv)->pool();
  pool.RecordEvents(true);
  EventMirror mirror;
  std::mt19937 rng(7);
  // Prompts share one of three prefixes, so hits, new runs after a hit and
  // evictions of free cached blocks all happen.
  std::vector<std::vector<int32_t>> prefixes(3);
  for (auto& p : prefixes) {
    for (int i = 0; i < 3 * kBlock; ++i) p.push_back(static_cast<int32_t>(rng() % 50));
  }
  int64_t hits = 0;
  for (int r = 0; r < 200; ++r) {
    std::vector<int32_t> tokens = prefixes[rng() % 3];
    const int extra = static_cast<int>(rng() % (3 * kBlock));
    for (int i = 0; i < extra; ++i) tokens.push_back(static_cast<int32_t>(rng() % 50));
    const std::string id = absl::StrCat("r", r);
    const uint64_t root = r % 5 == 0 ? 99 : 0;  // some salted: a chain of their own
    hits += (*kv)->TakeCachedPrefix(id, tokens, static_cast<int64_t>(tokens.size()) - 1, root);
    ASSERT_TRUE((*kv)->EnsureCapacity(id, static_cast<int64_t>(tokens.size())).ok());
    (*kv)->CacheComputed(id, tokens, static_cast<int64_t>(tokens.size()), root);
    (*kv)->Free(id);
    mirror.Apply(pool.TakeEvents(), kBlock);
    std::vector<uint64_t> cached = pool.CachedHashes();
    ASSERT_EQ(absl::flat_hash_set<uint64_t>(cached.begin(), cached.end()), mirror.held)
        << "after request " << r;
  }
  EXPECT_GT(hits, 0);
  EXPECT_EQ(mirror.cleared, 1);  // the announcement that the cache starts empty
}

TEST(KvCacheEventsTest, RunsShareAnEventAndFirstBlocksHaveNoParent) {
  BlockPool pool(8, 2, true);
  pool.RecordEvents(true);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool.Allocate(3, &blocks).ok());
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6};
  const uint64_t h0 = BlockPool::Hash(0, absl::MakeSpan(t).subspan(0, 2));
  const uint64_t h1 = BlockPool::Hash(h0, absl::MakeSpan(t).subspan(2, 2));
  const uint64_t h2 = BlockPool::Hash(h1, absl::MakeSpan(t).subspan(4, 2));
  pool.Cache(blocks[0], h0, 0, absl::MakeSpan(t).subspan(0, 2), /*first=*/true);
  pool.Cache(blocks[1], h1, h0, absl::MakeSpan(t).subspan(2, 2));
  pool.Cache(blocks[2], h2, h1, absl::MakeSpan(t).subspan(4, 2));
  std::vector<KvCacheEvent> events = pool.TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvCacheEvent::Kind::kCleared);
  EXPECT_EQ(events[1].kind, KvCacheEvent::Kind::kStored);
  EXPECT_EQ(events[1].hashes, (std::vector<uint64_t>{h0, h1, h2}));
  EXPECT_FALSE(events[1].parent.has_value());
  EXPECT_EQ(events[1].token_ids, t);
  EXPECT_TRUE(pool.TakeEvents().empty());
  // Freed, then taken by new allocations: evicted in one event.
  pool.Free(blocks);
  std::vector<int32_t> all;
  ASSERT_TRUE(pool.Allocate(8, &all).ok());
  events = pool.TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvCacheEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].hashes.size(), 3u);
}

}  // namespace
}  // namespace tandem
