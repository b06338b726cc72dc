#include "common/serving/kv_transfer.h"

#include <cstring>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// Export from one engine, import into another with a different block size:
// the KV rows arrive intact; a flipped bit is DATA_LOSS.
TEST(KvTransferTest, RoundTripAcrossBlockSizes) {
  EngineConfig a, b;
  a.block_size = 4;
  b.block_size = 32;
  for (EngineConfig* c : {&a, &b}) {
    c->runner.graph.requested_mode = CudaGraphMode::kNone;
    c->runner.max_num_batched_tokens = 256;
    c->runner.max_num_seqs = 4;
    c->runner.max_model_len = 512;
  }
  auto src = LlmEngine::Create(a).value();
  auto dst = LlmEngine::Create(b).value();
  std::vector<int32_t> prompt(37);
  for (int i = 0; i < 37; ++i) prompt[i] = 5 + i;
  SamplingParams p;
  p.max_tokens = 1;
  ASSERT_TRUE(src->AddRequest("x", prompt, p, RequestKind::kPrefillOnly).ok());
  while (src->HasWork()) ASSERT_TRUE(src->Step().ok());
  auto messages = ExportKv(*src, "x", 37);
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 1u + 4u);  // header + one chunk per layer
  EXPECT_TRUE(CheckFingerprint((*messages)[0].header().fingerprint(),
                               MakeFingerprint(dst->model_config(), DType::kF32)).ok());
  // The decode side: blocks reserved, then WAITING_FOR_REMOTE_KV.
  p.max_tokens = 4;
  ASSERT_TRUE(dst->AddRequest("x", prompt, p, RequestKind::kRemotePrefill).ok());
  auto outs = dst->Step();
  ASSERT_TRUE(outs.ok());
  ASSERT_EQ(outs->size(), 1u);
  EXPECT_TRUE((*outs)[0].kv_needed);
  EXPECT_EQ((*outs)[0].kv_tokens, 37);
  EXPECT_EQ((*outs)[0].cached_tokens, 0);
  EXPECT_EQ(dst->num_waiting_for_remote_kv(), 1u);
  const int64_t w = src->kv_cache().slot_width();
  const size_t row = src->kv_cache().slot_bytes();
  for (size_t i = 1; i < messages->size(); ++i) {
    const v1::KvChunk& chunk = (*messages)[i].chunk();
    ASSERT_TRUE(VerifyChunk(chunk, row).ok());
    ASSERT_TRUE(dst->ImportKv("x", static_cast<int>(chunk.layer()), chunk.first_token(),
                              chunk.num_tokens(), chunk.k().data(), chunk.v().data())
                    .ok());
  }
  // Rows past the request's tokens are refused, naming the range.
  const v1::KvChunk& last = messages->back().chunk();
  absl::Status outside = dst->ImportKv("x", 0, 37, 1, last.k().data(), last.v().data());
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outside.message().find("[0, 37)"), std::string::npos) << outside;
  for (int layer = 0; layer < 4; ++layer) {
    std::vector<float> k1(37 * w), v1(37 * w), k2(37 * w), v2(37 * w);
    ASSERT_TRUE(src->ReadKv("x", layer, 0, 37, k1.data(), v1.data()).ok());
    ASSERT_TRUE(dst->ReadKv("x", layer, 0, 37, k2.data(), v2.data()).ok());
    EXPECT_EQ(k1, k2);
    EXPECT_EQ(v1, v2);
  }
  v1::KvChunk bad = (*messages)[1].chunk();
  bad.mutable_k()->at(7) ^= 0x10;
  EXPECT_EQ(VerifyChunk(bad, row).code(), absl::StatusCode::kDataLoss);
  bad.mutable_k()->pop_back();
  EXPECT_EQ(VerifyChunk(bad, row).code(), absl::StatusCode::kInvalidArgument);
  v1::ModelFingerprint other = MakeFingerprint(dst->model_config(), DType::kF32);
  other.set_num_layers(99);
  absl::Status mismatch = CheckFingerprint(other, MakeFingerprint(dst->model_config(), DType::kF32));
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.message().find("num_layers=99"), std::string::npos);
  // A bf16 prefill worker cannot feed an f32 decode worker.
  absl::Status dtype_mismatch =
      CheckFingerprint(MakeFingerprint(dst->model_config(), DType::kBF16),
                       MakeFingerprint(dst->model_config(), DType::kF32));
  EXPECT_EQ(dtype_mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(dtype_mismatch.message().find("dtype=bf16"), std::string::npos);
  // The first token joins the batch; the rest is decoded here.
  ASSERT_TRUE(dst->RemoteKvArrived("x", 7).ok());
  EXPECT_EQ(dst->ImportKv("x", 0, 0, 1, last.k().data(), last.v().data()).code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<int32_t> tokens;
  while (dst->HasWork()) {
    auto o = dst->Step();
    ASSERT_TRUE(o.ok());
    for (const RequestOutput& x : *o) tokens.insert(tokens.end(), x.new_tokens.begin(), x.new_tokens.end());
  }
  ASSERT_EQ(tokens.size(), 4u);
  EXPECT_EQ(tokens[0], 7);
  ASSERT_TRUE(src->Abort("x").ok());
  EXPECT_EQ(dst->Abort("x").code(), absl::StatusCode::kNotFound);  // finished and gone
  EXPECT_EQ(src->kv_cache().pool().num_used(), 0);
  EXPECT_EQ(dst->kv_cache().pool().num_used(), 0);
}

TEST(KvTransferTest, ChunksStayUnderOneMebibyte) {
  // smollm2-135m: 3 KV heads x 64 dims: 1536 bytes of K and V per token.
  const int per = TokensPerChunk(3 * 64 * sizeof(float));
  EXPECT_LE(static_cast<size_t>(per) * 3 * 64 * 4 * 2, kMaxChunkBytes);
  EXPECT_GT(static_cast<size_t>(per + 1) * 3 * 64 * 4 * 2, kMaxChunkBytes);
}

}  // namespace
}  // namespace tandem
