#include "common/model/kv_cache.h"

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
