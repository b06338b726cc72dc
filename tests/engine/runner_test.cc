// ModelRunner under the graph policy: capture counts, replay without host op
// code, bitwise replay == eager, mixed batches, long multi-block sequences.
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/backend/cpu/cpu_stream.h"
#include "common/engine/model_runner.h"
#include "gtest/gtest.h"
#include "common/backend/cpu/cpu_device.h"

namespace tandem {
namespace {

using M = CudaGraphMode;

// A synthetic model, its cache and a runner, on the CPU.
struct Rig {
  std::unique_ptr<Device> device = CreateCpuDevice();
  std::unique_ptr<Ops> ops = CreateCpuOps(device.get(), 1).value();
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<ModelRunner> runner;

  explicit Rig(M mode, int block_size = 16, std::vector<int> sizes = {1, 2, 4, 8, 16, 32},
               int max_num_seqs = 8) {
    model = LlamaModel::Load("synthetic", ops.get()).value();
    const auto& c = model->config();
    kv = KvCache::Create(device.get(), DType::kF32, c.num_hidden_layers, 256, block_size,
                         c.num_key_value_heads, c.head_dim)
             .value();
    RunnerConfig rc;
    rc.max_num_batched_tokens = 128;
    rc.max_num_seqs = max_num_seqs;
    rc.graph.requested_mode = mode;
    rc.graph.capture_sizes = sizes;
    rc.check_input_addresses = true;
    runner = ModelRunner::Create(rc, model.get(), kv.get(), ops.get()).value();
    EXPECT_TRUE(runner->CaptureGraphs().ok());
  }
  CpuStream* stream() { return static_cast<CpuStream*>(device->stream()); }

  // Runs one step of (id, tokens, start) chunks; returns all sampled logits.
  std::vector<float> Step(const std::vector<std::tuple<std::string, std::vector<int32_t>, int>>& seqs,
                          StepResult* result = nullptr) {
    std::vector<ScheduledSeq> batch;
    for (const auto& [id, tokens, start] : seqs) {
      EXPECT_TRUE(kv->EnsureCapacity(id, start + tokens.size()).ok());
      ScheduledSeq s;
      s.tokens = tokens.data();
      s.num_tokens = static_cast<int>(tokens.size());
      s.start_pos = start;
      s.block_table = kv->BlockTable(id);
      s.sample = true;
      batch.push_back(s);
    }
    auto r = runner->Execute(batch);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    if (result) *result = *r;
    const int vocab = static_cast<int>(model->config().vocab_size);
    return std::vector<float>(r->logits, r->logits + r->logit_rows * vocab);
  }
};

std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (seed * 131 + i * 17) % 500 + 3;
  return t;
}

TEST(ModelRunnerTest, GraphCounts) {
  Rig piecewise(M::kPiecewise);
  const int pieces = piecewise.model->num_pieces();  // 4 layers -> 5 pieces
  EXPECT_EQ(pieces, 5);
  EXPECT_EQ(piecewise.runner->stats().captured[CudaGraphMode::kPiecewise], pieces * 6);
  EXPECT_EQ(piecewise.runner->stats().captured[CudaGraphMode::kFull], 0);

  Rig full_decode(M::kFullDecodeOnly);  // FULL keys: sizes <= max_num_seqs (8)
  EXPECT_EQ(full_decode.runner->stats().captured[CudaGraphMode::kFull], 4);
  EXPECT_EQ(full_decode.runner->stats().captured[CudaGraphMode::kPiecewise], 0);

  Rig both(M::kFullAndPiecewise);
  EXPECT_EQ(both.runner->stats().captured[CudaGraphMode::kPiecewise], pieces * 6);
  EXPECT_EQ(both.runner->stats().captured[CudaGraphMode::kFull],
            static_cast<int64_t>(both.runner->dispatcher().keys(M::kFull).size()));

  Rig none(M::kNone);
  EXPECT_EQ(none.runner->stats().captured[CudaGraphMode::kPiecewise] + none.runner->stats().captured[CudaGraphMode::kFull], 0);
}

TEST(ModelRunnerTest, FullReplayRunsNoHostOpCode) {
  Rig rig(M::kFullDecodeOnly);
  rig.Step({{"a", Tokens(5, 1), 0}, {"b", Tokens(3, 2), 0}});  // mixed: NONE
  const int64_t launched = rig.stream()->ops_launched();
  StepResult r;
  rig.Step({{"a", {7}, 5}, {"b", {9}, 3}}, &r);
  EXPECT_EQ(r.runtime_mode, M::kFull);
  EXPECT_EQ(r.descriptor, BatchDescriptor(2, 2, true, false));
  // Only the two logits ops (gather + LM head) were issued by host code.
  EXPECT_EQ(rig.stream()->ops_launched() - launched, 2);
  EXPECT_EQ(rig.runner->stats().replays[CudaGraphMode::kFull], 1);
}

TEST(ModelRunnerTest, PiecewiseReplayRunsOnlyAttentionOnHost) {
  Rig rig(M::kPiecewise);
  const int64_t launched = rig.stream()->ops_launched();
  StepResult r;
  rig.Step({{"a", Tokens(6, 1), 0}, {"b", Tokens(2, 2), 0}}, &r);
  EXPECT_EQ(r.runtime_mode, M::kPiecewise);
  EXPECT_EQ(r.padded_tokens, 0);
  // 4 eager attention ops + 2 logits ops.
  EXPECT_EQ(rig.stream()->ops_launched() - launched, 4 + 2);
  EXPECT_EQ(rig.runner->stats().replays[CudaGraphMode::kPiecewise], 1);
}

// Replay after new inputs were copied in gives, bit for bit, the eager result
// for those inputs at the same (padded) shape.
TEST(ModelRunnerTest, ReplayIsBitwiseEagerAtSamePaddedShape) {
  for (M mode : {M::kFull, M::kPiecewise, M::kFullAndPiecewise, M::kFullDecodeOnly}) {
    SCOPED_TRACE(mode.name());
    Rig graph(mode), eager(M::kNone);
    // Prefill 4 prompts of different lengths, then 3 decode steps of 4 tokens
    // (a capture size: eager runs the same shape).
    std::vector<std::tuple<std::string, std::vector<int32_t>, int>> prefill;
    for (int i = 0; i < 4; ++i) prefill.push_back({"r" + std::to_string(i), Tokens(3 + 5 * i, i), 0});
    EXPECT_EQ(graph.Step(prefill), eager.Step(prefill));
    for (int step = 0; step < 3; ++step) {
      std::vector<std::tuple<std::string, std::vector<int32_t>, int>> decode;
      for (int i = 0; i < 4; ++i) {
        decode.push_back({"r" + std::to_string(i), {100 + 10 * step + i}, 3 + 5 * i + step});
      }
      StepResult gr, er;
      std::vector<float> g = graph.Step(decode, &gr), e = eager.Step(decode, &er);
      EXPECT_NE(gr.runtime_mode, M::kNone);
      EXPECT_EQ(er.runtime_mode, M::kNone);
      ASSERT_EQ(g.size(), e.size());
      EXPECT_EQ(std::memcmp(g.data(), e.data(), g.size() * sizeof(float)), 0);
    }
  }
}

// A mixed batch (prompts at different positions plus decodes) gives each
// request the logits it gets when run alone.
TEST(ModelRunnerTest, MixedBatchMatchesRequestsRunAlone) {
  Rig batched(M::kFullAndPiecewise), alone(M::kNone);
  auto a = Tokens(9, 1), b = Tokens(4, 2), c = Tokens(6, 3);
  // a and b are prefilled first; then a step mixes decodes of a and b, the
  // second chunk of c's prompt (first chunk earlier) and a fresh prompt d.
  batched.Step({{"a", a, 0}, {"b", b, 0}, {"c", {c.begin(), c.begin() + 2}, 0}});
  auto d = Tokens(5, 4);
  StepResult r;
  auto mixed = batched.Step(
      {{"a", {11}, 9}, {"b", {12}, 4}, {"c", {c.begin() + 2, c.end()}, 2}, {"d", d, 0}}, &r);
  EXPECT_EQ(r.runtime_mode, M::kPiecewise);
  EXPECT_EQ(r.num_tokens, 1 + 1 + 4 + 5);
  EXPECT_EQ(r.padded_tokens, 16 - 11);

  std::vector<std::vector<float>> expected;
  auto a2 = a; a2.push_back(11);
  auto b2 = b; b2.push_back(12);
  expected.push_back(alone.Step({{"a", a2, 0}}));
  expected.push_back(alone.Step({{"b", b2, 0}}));
  expected.push_back(alone.Step({{"c", c, 0}}));
  expected.push_back(alone.Step({{"d", d, 0}}));
  const size_t vocab = batched.model->config().vocab_size;
  for (size_t req = 0; req < 4; ++req) {
    for (size_t v = 0; v < vocab; ++v) {
      ASSERT_NEAR(mixed[req * vocab + v], expected[req][v], 1e-4) << "request " << req;
    }
  }
}

TEST(ModelRunnerTest, SequenceSpanningManyBlocks) {
  Rig small_blocks(M::kFullAndPiecewise, /*block_size=*/4), one_block(M::kNone, 128);
  auto prompt = Tokens(41, 5);
  auto got = small_blocks.Step({{"s", prompt, 0}});
  auto want = one_block.Step({{"s", prompt, 0}});
  for (int i = 0; i < 20; ++i) {  // decode past 15 blocks of 4
    const int32_t t = 200 + i;
    got = small_blocks.Step({{"s", {t}, 41 + i}});
    want = one_block.Step({{"s", {t}, 41 + i}});
    ASSERT_EQ(got.size(), want.size());
    for (size_t v = 0; v < got.size(); ++v) ASSERT_NEAR(got[v], want[v], 1e-4) << "step " << i;
  }
  EXPECT_EQ(small_blocks.kv->BlockTable("s")->size(), 16u);  // 61 tokens / 4
}

TEST(ModelRunnerTest, StepLimitsAreErrors) {
  Rig rig(M::kFullAndPiecewise);
  std::vector<int32_t> too_many(200, 5);
  ASSERT_TRUE(rig.kv->EnsureCapacity("x", 200).ok());
  ScheduledSeq s{too_many.data(), 200, 0, rig.kv->BlockTable("x"), true};
  EXPECT_EQ(rig.runner->Execute({s}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.runner->Execute({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelRunnerTest, UnsupportedModeFailsAtStartup) {
  auto device = CreateCpuDevice();
  auto ops = CreateCpuOps(device.get(), 1).value();
  auto model = LlamaModel::Load("synthetic", ops.get()).value();
  auto kv = KvCache::Create(device.get(), DType::kF32, 4, 16, 16, 2, 16).value();
  RunnerConfig rc;
  rc.max_model_len = 1 << 20;  // beyond max_position_embeddings
  auto r = ModelRunner::Create(rc, model.get(), kv.get(), ops.get());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("max_position_embeddings"), std::string::npos);
}

}  // namespace
}  // namespace tandem
