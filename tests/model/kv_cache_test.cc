#include "common/model/kv_cache.h"

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace tandem
