// Logits of the engine against transformers' LlamaForCausalLM on the tiny
// fixture (tests/fixtures/make_llama_reference.py), in every graph mode.
#include <cmath>
#include <fstream>

#include "common/engine/model_runner.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

const std::string kFixture = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tiny_llama";

class ReferenceTest : public ::testing::TestWithParam<CudaGraphMode::Value> {};

TEST_P(ReferenceTest, LogitsMatchTransformersWithin1e4) {
  std::ifstream in(kFixture + "/reference.json");
  ASSERT_TRUE(in) << "missing fixture " << kFixture;
  nlohmann::json ref = nlohmann::json::parse(in);

  auto device = CreateCpuDevice();
  auto ops = CreateCpuOps(device.get(), 1);
  auto model = LlamaModel::Load(kFixture, ops.get());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().rope_scaling.type, "llama3");
  auto kv = KvCache::Create(device.get(), DType::kF32, 2, 64, /*block_size=*/4, 2, 16);
  ASSERT_TRUE(kv.ok());
  RunnerConfig rc;
  rc.max_num_batched_tokens = 64;
  rc.max_num_seqs = 4;
  rc.graph.requested_mode = GetParam();
  auto runner = ModelRunner::Create(rc, model->get(), kv->get(), ops.get());
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_TRUE((*runner)->CaptureGraphs().ok());

  int case_index = 0;
  double worst = 0;
  for (const auto& c : ref["cases"]) {
    const std::vector<int32_t> tokens = c["tokens"];
    const int prompt_len = c["prompt_len"];
    const std::string id = "case" + std::to_string(case_index++);
    ASSERT_TRUE((*kv)->EnsureCapacity(id, tokens.size()).ok());
    const int vocab = 256;
    for (size_t row = 0; row < c["logits"].size(); ++row) {
      ScheduledSeq s;
      s.block_table = (*kv)->BlockTable(id);
      s.sample = true;
      if (row == 0) {
        s.tokens = tokens.data();
        s.num_tokens = prompt_len;
        s.start_pos = 0;
      } else {
        s.start_pos = prompt_len + row - 1;
        s.tokens = tokens.data() + s.start_pos;
        s.num_tokens = 1;
      }
      auto step = (*runner)->Execute({s});
      ASSERT_TRUE(step.ok()) << step.status();
      const std::vector<float> expected = c["logits"][row];
      for (int v = 0; v < vocab; ++v) {
        const double diff = std::fabs(step->logits[v] - expected[v]);
        worst = std::max(worst, diff);
        ASSERT_LE(diff, 1e-4) << id << " row " << row << " token " << v;
      }
    }
    (*kv)->Free(id);
  }
  RecordProperty("max_abs_diff", std::to_string(worst));
  EXPECT_EQ((*kv)->allocator().num_used(), 0);
}

INSTANTIATE_TEST_SUITE_P(AllModes, ReferenceTest,
                         ::testing::Values(CudaGraphMode::kNone, CudaGraphMode::kPiecewise,
                                           CudaGraphMode::kFull, CudaGraphMode::kFullDecodeOnly,
                                           CudaGraphMode::kFullAndPiecewise));

}  // namespace
}  // namespace tandem
