// The decode worker's completeness check: every (layer, token) row of the
// announced range exactly once, before any of it is used.
#include "common/serving/kv_stream_checker.h"

#include "common/base/crc32c.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr size_t kSlot = 8;  // bytes of one token's K (and V) in one layer

v1::ModelFingerprint Fingerprint() {
  v1::ModelFingerprint f;
  f.set_config_hash(7);
  f.set_dtype("f32");
  f.set_num_layers(3);
  f.set_num_kv_heads(1);
  f.set_head_dim(2);
  return f;
}

v1::KvHeader Header(int first, int num_tokens) {
  v1::KvHeader h;
  *h.mutable_fingerprint() = Fingerprint();
  h.set_first_token(first);
  h.set_num_tokens(num_tokens);
  return h;
}

ReceivedChunk Chunk(int layer, int first, int n) {
  v1::KvChunk c;
  c.set_layer(layer);
  c.set_first_token(first);
  c.set_num_tokens(n);
  c.set_k(std::string(n * kSlot, static_cast<char>(layer)));
  c.set_v(std::string(n * kSlot, static_cast<char>(first)));
  c.set_crc32c(Crc32c(Crc32c(0, c.k().data(), c.k().size()), c.v().data(), c.v().size()));
  return ReceivedChunk::Of(std::move(c));
}

// Tokens [4, 20) of 3 layers, in chunks of 8 tokens.
KvStreamChecker Checker() { return KvStreamChecker(Fingerprint(), kSlot, 4, 20); }

TEST(KvStreamCheckerTest, CompleteStreamInAnyOrderIsAccepted) {
  KvStreamChecker c = Checker();
  ASSERT_TRUE(c.Header(Header(4, 20)).ok());
  for (int layer : {2, 0, 1}) {
    ASSERT_TRUE(c.Chunk(Chunk(layer, 12, 8)).ok());
    ASSERT_TRUE(c.Chunk(Chunk(layer, 4, 8)).ok());
  }
  EXPECT_TRUE(c.Done().ok());
  EXPECT_EQ(c.bytes(), 3u * 16 * 2 * kSlot);
}

// The defect: a stream with header and done but no chunk of layers >= 1
// was accepted.
TEST(KvStreamCheckerTest, MissingLayersAreDataLossNamingLayerAndTokens) {
  KvStreamChecker c = Checker();
  ASSERT_TRUE(c.Header(Header(4, 20)).ok());
  ASSERT_TRUE(c.Chunk(Chunk(0, 4, 8)).ok());
  ASSERT_TRUE(c.Chunk(Chunk(0, 12, 8)).ok());
  absl::Status s = c.Done();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("layer 1 is missing tokens [4, 20)"), std::string::npos) << s;
  EXPECT_EQ(c.failure(), KvStreamChecker::Failure::kIncomplete);
}

TEST(KvStreamCheckerTest, AGapInsideALayerIsNamed) {
  KvStreamChecker c = Checker();
  ASSERT_TRUE(c.Header(Header(4, 20)).ok());
  for (int layer = 0; layer < 3; ++layer) {
    ASSERT_TRUE(c.Chunk(Chunk(layer, 4, 4)).ok());
    if (layer != 1) {
      ASSERT_TRUE(c.Chunk(Chunk(layer, 8, 4)).ok());
    }
    ASSERT_TRUE(c.Chunk(Chunk(layer, 12, 8)).ok());
  }
  absl::Status s = c.Done();
  EXPECT_NE(s.message().find("layer 1 is missing tokens [8, 12)"), std::string::npos) << s;
}

TEST(KvStreamCheckerTest, DuplicatesAndOverlapsAreDataLoss) {
  for (const ReceivedChunk& again : {Chunk(0, 4, 8), Chunk(0, 8, 2), Chunk(0, 2, 4)}) {
    KvStreamChecker c = Checker();
    ASSERT_TRUE(c.Header(Header(4, 20)).ok());
    ASSERT_TRUE(c.Chunk(Chunk(0, 4, 8)).ok());
    absl::Status s = c.Chunk(again);
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_EQ(c.failure(), KvStreamChecker::Failure::kIncomplete);
  }
}

TEST(KvStreamCheckerTest, RowsOutsideTheRangeOrLayersAreRefused) {
  for (const ReceivedChunk& bad : {Chunk(3, 4, 8), Chunk(0, 16, 8), Chunk(0, 0, 2), Chunk(0, 4, 0)}) {
    KvStreamChecker c = Checker();
    ASSERT_TRUE(c.Header(Header(4, 20)).ok());
    EXPECT_TRUE(absl::IsDataLoss(c.Chunk(bad)));
  }
}

TEST(KvStreamCheckerTest, OrderAndHeaderAreChecked) {
  KvStreamChecker c = Checker();
  EXPECT_FALSE(c.Chunk(Chunk(0, 4, 8)).ok());  // before the header
  KvStreamChecker d = Checker();
  EXPECT_FALSE(d.Done().ok());  // no header at all
  KvStreamChecker e = Checker();
  EXPECT_EQ(e.Header(Header(0, 20)).code(), absl::StatusCode::kInternal);  // another range
  KvStreamChecker f = Checker();
  v1::KvHeader other = Header(4, 20);
  other.mutable_fingerprint()->set_num_layers(4);
  EXPECT_EQ(f.Header(other).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.failure(), KvStreamChecker::Failure::kFingerprintMismatch);
}

// Stream 1 of 2 of a request: its header must say so; it is complete with
// layer 1's rows (of layers 0-2); layer 0 or 2 on it is refused.
TEST(KvStreamCheckerTest, OneStreamOfSeveralChecksItsShareOfTheLayers) {
  KvStreamChecker c(Fingerprint(), kSlot, 4, 20, /*stream_index=*/1, /*num_streams=*/2);
  v1::KvHeader header = Header(4, 20);
  header.set_num_streams(2);
  header.set_stream_index(1);
  ASSERT_TRUE(c.Header(header).ok());
  ASSERT_TRUE(c.Chunk(Chunk(1, 4, 16)).ok());
  EXPECT_TRUE(c.Done().ok());
  KvStreamChecker other(Fingerprint(), kSlot, 4, 20, 1, 2);
  ASSERT_TRUE(other.Header(header).ok());
  absl::Status s = other.Chunk(Chunk(2, 4, 16));
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("l % 2 == 1"), std::string::npos) << s;
  KvStreamChecker wrong(Fingerprint(), kSlot, 4, 20, 1, 2);
  header.set_stream_index(0);
  EXPECT_FALSE(wrong.Header(header).ok());
  KvStreamChecker missing(Fingerprint(), kSlot, 4, 20, 1, 2);
  header.set_stream_index(1);
  ASSERT_TRUE(missing.Header(header).ok());
  s = missing.Done();
  EXPECT_NE(s.message().find("layer 1 is missing"), std::string::npos) << s;
}

TEST(KvStreamCheckerTest, CorruptChunkIsDataLossWorthARetry) {
  KvStreamChecker c = Checker();
  ASSERT_TRUE(c.Header(Header(4, 20)).ok());
  ReceivedChunk bad = Chunk(0, 4, 8);
  bad.crc32c ^= 1;
  EXPECT_TRUE(absl::IsDataLoss(c.Chunk(bad)));
  EXPECT_EQ(c.failure(), KvStreamChecker::Failure::kDataLoss);
}

}  // namespace
}  // namespace tandem
