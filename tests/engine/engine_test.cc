#include "common/engine/engine.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/serving/engine_flags.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using M = CudaGraphMode;

std::unique_ptr<LlmEngine> MakeEngine(M mode, int num_kv_blocks = 0, int max_num_seqs = 16,
                                      int block_size = 16, bool prefix_caching = true,
                                      std::shared_ptr<const TokenVocabulary> vocabulary = nullptr) {
  EngineConfig c;
  c.vocabulary = std::move(vocabulary);
  c.enable_prefix_caching = prefix_caching;
  c.model = "synthetic";
  c.runner.graph.requested_mode = mode;
  c.runner.max_num_batched_tokens = 64;
  c.runner.max_num_seqs = max_num_seqs;
  c.runner.max_model_len = 512;
  c.num_kv_blocks = num_kv_blocks;
  c.block_size = block_size;
  auto e = LlmEngine::Create(c);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

// Runs every request to completion; returns the tokens per id.
std::map<std::string, std::vector<int32_t>> RunAll(LlmEngine* e,
                                                   std::map<std::string, FinishReason>* reasons = nullptr) {
  std::map<std::string, std::vector<int32_t>> out;
  for (int guard = 0; e->HasWork() && guard < 10000; ++guard) {
    auto step = e->Step();
    EXPECT_TRUE(step.ok()) << step.status();
    for (const auto& o : *step) {
      EXPECT_TRUE(o.status.ok()) << o.status;
      auto& v = out[o.id];
      v.insert(v.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished && reasons) (*reasons)[o.id] = o.finish_reason;
    }
  }
  return out;
}

// `max_tokens` tokens whatever they are.
SamplingParams IgnoringEos(uint32_t max_tokens) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (seed * 97 + i * 13) % 509 + 3;
  return t;
}

TEST(EngineTest, GreedyOutputIdenticalInEveryMode) {
  std::map<std::string, std::vector<int32_t>> reference;
  for (M mode : {M::kNone, M::kPiecewise, M::kFull, M::kFullDecodeOnly, M::kFullAndPiecewise}) {
    SCOPED_TRACE(mode.name());
    auto e = MakeEngine(mode);
    SamplingParams p = IgnoringEos(12);
    for (int i = 0; i < 10; ++i) {  // prompts of 1..~100 tokens, some chunked
      ASSERT_TRUE(e->AddRequest("r" + std::to_string(i), Prompt(1 + i * 11, i), p).ok());
    }
    auto out = RunAll(e.get());
    ASSERT_EQ(out.size(), 10u);
    for (auto& [id, tokens] : out) EXPECT_EQ(tokens.size(), 12u) << id;
    if (reference.empty()) {
      reference = out;
    } else {
      EXPECT_EQ(out, reference);
    }
    const RunnerStats& st = e->runner().stats();
    if (mode == M::kFullDecodeOnly || mode == M::kFullAndPiecewise || mode == M::kFull) {
      EXPECT_GT(st.steps[CudaGraphMode::kFull], 0);
    }
    if (mode == M::kPiecewise) {
      EXPECT_EQ(st.steps[CudaGraphMode::kFull], 0);
    }
    EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
  }
}

TEST(EngineTest, StopConditions) {
  auto e = MakeEngine(M::kFullAndPiecewise);
  SamplingParams p = IgnoringEos(30);
  ASSERT_TRUE(e->AddRequest("free", Prompt(5, 1), p).ok());
  std::map<std::string, FinishReason> reasons;
  auto free_run = RunAll(e.get(), &reasons);
  ASSERT_EQ(free_run["free"].size(), 30u);
  EXPECT_EQ(reasons["free"], FinishReason::kLength);
  // Stop at the 5th token the free run produced.
  SamplingParams stop = p;
  stop.stop_token_ids = {free_run["free"][4]};
  ASSERT_TRUE(e->AddRequest("stop", Prompt(5, 1), stop).ok());
  auto stopped = RunAll(e.get(), &reasons);
  const auto first = std::find(free_run["free"].begin(), free_run["free"].end(), free_run["free"][4]);
  EXPECT_EQ(stopped["stop"].size(), static_cast<size_t>(first - free_run["free"].begin() + 1));
  EXPECT_EQ(reasons["stop"], FinishReason::kStop);
}

TEST(EngineTest, ValidationErrors) {
  auto e = MakeEngine(M::kFullAndPiecewise);
  SamplingParams p;
  EXPECT_EQ(e->AddRequest("a", {}, p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e->AddRequest("a", {1, 99999}, p).message().find("prompt_token_ids[1]"), std::string::npos);
  EXPECT_NE(e->AddRequest("a", std::vector<int32_t>(600, 1), p).message().find("limit"), std::string::npos);
  SamplingParams bad = p;
  bad.max_tokens = 0;
  EXPECT_EQ(e->AddRequest("a", {1}, bad).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(e->AddRequest("a", {1, 2}, p).ok());
  EXPECT_EQ(e->AddRequest("a", {1, 2}, p).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(e->Abort("a").ok());
  EXPECT_EQ(e->Abort("a").code(), absl::StatusCode::kNotFound);
}

// --max-logprobs (vLLM's): the most top log-probabilities a request may
// ask for, 20 by default, -1 for the whole vocabulary; as many come back.
TEST(EngineTest, MaxLogprobsBoundsWhatARequestMayAskFor) {
  for (int limit : {kDefaultMaxLogprobs, 64, -1}) {
    SCOPED_TRACE(limit);
    EngineConfig c;
    c.model = "synthetic";
    c.runner.max_num_batched_tokens = 64;
    c.runner.max_model_len = 512;
    c.max_logprobs = limit;
    auto e = LlmEngine::Create(c);
    ASSERT_TRUE(e.ok()) << e.status();
    const int vocab = static_cast<int>((*e)->model_config().vocab_size);
    const int most = limit < 0 ? vocab : limit;
    SamplingParams p = IgnoringEos(2);
    p.logprobs = most + 1;
    absl::Status refused = (*e)->AddRequest("over", {1, 2, 3}, p);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(refused.message(), absl::StrCat("sampling.logprobs must be in [0, ", most,
                                              "] (--max-logprobs) or unset, got ", most + 1));
    p.logprobs = -1;
    p.prompt_logprobs = most + 1;
    EXPECT_NE((*e)->AddRequest("over", {1, 2, 3}, p).message().find("sampling.prompt_logprobs"),
              std::string::npos);
    p.prompt_logprobs = -1;
    p.logprobs = most;
    ASSERT_TRUE((*e)->AddRequest("most", {1, 2, 3}, p).ok());
    size_t entries = 0;
    for (int guard = 0; (*e)->HasWork() && guard < 100; ++guard) {
      auto step = (*e)->Step();
      ASSERT_TRUE(step.ok()) << step.status();
      for (const RequestOutput& o : *step) {
        for (const TokenLogprobs& lp : o.logprobs) {
          EXPECT_EQ(lp.top.size(), static_cast<size_t>(most));
          ++entries;
        }
      }
    }
    EXPECT_EQ(entries, 2u);
  }
  // The flag: -1 or >= 0.
  for (const auto& [arg, ok] : {std::pair{"--max-logprobs=-1", true}, std::pair{"--max-logprobs=0", true},
                                std::pair{"--max-logprobs=-2", false}}) {
    EngineFlags flags("NONE");
    FlagSet set("t");
    flags.Register(&set);
    ASSERT_TRUE(set.Parse(std::vector<std::string>{arg}).ok());
    const absl::StatusOr<EngineConfig> c = flags.ToConfig(set);
    EXPECT_EQ(c.ok(), ok) << arg << ": " << c.status();
    if (!ok) EXPECT_EQ(c.status().message(), "--max-logprobs=-2 must be -1 (the whole vocabulary) or >= 0");
  }
}

// vLLM's priority: refused under fcfs, as vLLM refuses it; under priority a
// request of a lower value runs first though it came later.
TEST(EngineTest, PriorityOrdersRequestsOnlyUnderThePriorityPolicy) {
  auto fcfs = MakeEngine(M::kNone);
  SamplingParams urgent = IgnoringEos(3);
  urgent.priority = -2;
  const absl::Status refused = fcfs->AddRequest("a", Prompt(4, 1), urgent);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("priority is -2, but priority scheduling is not enabled "
                                   "(--scheduling-policy=fcfs"),
            std::string::npos)
      << refused;

  EngineConfig c;
  c.model = "synthetic";
  c.runner.max_num_batched_tokens = 64;
  c.runner.max_num_seqs = 1;
  c.runner.max_model_len = 512;
  c.scheduling_policy = SchedulingPolicy::kPriority;
  auto e = LlmEngine::Create(c);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->AddRequest("first", Prompt(4, 1), IgnoringEos(3)).ok());
  ASSERT_TRUE((*e)->AddRequest("urgent", Prompt(4, 2), urgent).ok());
  std::vector<std::string> finished;
  for (int guard = 0; (*e)->HasWork() && guard < 100; ++guard) {
    auto step = (*e)->Step();
    ASSERT_TRUE(step.ok()) << step.status();
    for (const auto& o : *step) {
      if (o.finished) finished.push_back(o.id);
    }
  }
  EXPECT_EQ(finished, (std::vector<std::string>{"urgent", "first"}));
}

// vLLM's allowed_token_ids: only those tokens come out, greedy or sampled,
// speculated or not, whatever the bias says of others.
TEST(EngineTest, AllowedTokenIdsAreTheOnlyOnesSampled) {
  const std::set<int32_t> allowed = {5, 77, 300};
  for (const char* spec : {"", R"({"method": "ngram", "num_speculative_tokens": 3})"}) {
    SCOPED_TRACE(spec);
    EngineConfig c;
    c.model = "synthetic";
    c.runner.max_num_batched_tokens = 64;
    c.runner.max_model_len = 512;
    auto speculative = ParseSpeculativeConfig(spec);
    ASSERT_TRUE(speculative.ok()) << speculative.status();
    c.speculative = *speculative;
    auto e = LlmEngine::Create(c);
    ASSERT_TRUE(e.ok()) << e.status();
    for (int i = 0; i < 6; ++i) {
      SamplingParams p = IgnoringEos(16);
      p.temperature = i % 2 == 0 ? 0.f : 1.f;
      p.seed = i;
      p.allowed_token_ids.assign(allowed.begin(), allowed.end());
      if (i == 5) p.logit_bias = {{6, 100.f}};  // a bias cannot bring another token in
      ASSERT_TRUE((*e)->AddRequest("r" + std::to_string(i), Prompt(8, i), p).ok());
    }
    for (const auto& [id, tokens] : RunAll(e->get())) {
      EXPECT_EQ(tokens.size(), 16u) << id;
      for (int32_t t : tokens) EXPECT_TRUE(allowed.count(t)) << id << " sampled " << t;
    }
  }
  auto e = MakeEngine(M::kNone);
  SamplingParams bad = IgnoringEos(2);
  bad.allowed_token_ids = {3, 512};
  EXPECT_NE(e->AddRequest("x", Prompt(4, 1), bad).message().find(
                "sampling.allowed_token_ids[1] = 512 is outside the vocabulary [0, 512)"),
            std::string::npos);
}

TEST(EngineTest, LogitBiasAndPenaltiesShapeTheOutput) {
  auto e = MakeEngine(M::kFullAndPiecewise);
  SamplingParams p = IgnoringEos(24);
  ASSERT_TRUE(e->AddRequest("plain", Prompt(9, 4), p).ok());
  SamplingParams biased = p;
  biased.logit_bias = {{7, 100.f}};
  ASSERT_TRUE(e->AddRequest("biased", Prompt(9, 4), biased).ok());
  SamplingParams penalized = p;
  penalized.frequency_penalty = 2.f;
  penalized.repetition_penalty = 2.f;
  ASSERT_TRUE(e->AddRequest("penalized", Prompt(9, 4), penalized).ok());
  auto out = RunAll(e.get());
  EXPECT_EQ(out["biased"], std::vector<int32_t>(24, 7));
  EXPECT_NE(out["penalized"], out["plain"]);
  // Strong penalties against any repeat: more distinct tokens than without.
  auto distinct = [](const std::vector<int32_t>& v) { return std::set<int32_t>(v.begin(), v.end()).size(); };
  EXPECT_GT(distinct(out["penalized"]), distinct(out["plain"]));
  SamplingParams outside = p;
  outside.logit_bias = {{-1, 1.f}};
  EXPECT_NE(e->AddRequest("x", {1}, outside).message().find("logit_bias names token -1"),
            std::string::npos);
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
}

// Runs every request to completion; returns each one's prompt logprobs.
std::map<std::string, std::vector<TokenLogprobs>> RunForPromptLogprobs(
    LlmEngine* e, std::map<std::string, std::vector<int32_t>>* tokens) {
  std::map<std::string, std::vector<TokenLogprobs>> out;
  std::set<std::string> finished;
  for (int guard = 0; e->HasWork() && guard < 10000; ++guard) {
    auto step = e->Step();
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) break;
    for (const RequestOutput& o : *step) {
      EXPECT_TRUE(o.status.ok()) << o.status;
      EXPECT_EQ(finished.count(o.id), 0u) << o.id << ": an output after the finished one";
      if (o.finished) finished.insert(o.id);
      // All of them before or with the first token.
      if (!o.prompt_logprobs.empty()) EXPECT_TRUE((*tokens)[o.id].empty()) << o.id;
      auto& v = out[o.id];
      v.insert(v.end(), o.prompt_logprobs.begin(), o.prompt_logprobs.end());
      auto& t = (*tokens)[o.id];
      t.insert(t.end(), o.new_tokens.begin(), o.new_tokens.end());
    }
  }
  return out;
}

// A prompt's logprobs (vLLM's prompt_logprobs): one per prompt token after
// the first, each the log-softmax of the previous position's logits at that
// token, with its rank and the top-k; computed in chunks no longer than the
// step's rows of logits (4 here, beside 3 decoding requests), whatever the
// prefix cache holds, reported once through a preemption, and the same as
// the logprob of that token sampled after the prompt cut there.
TEST(EngineTest, PromptLogprobsAreEachPromptTokensLogprob) {
  const std::vector<int32_t> prompt = Prompt(37, 8);
  for (int blocks : {0, 14}) {  // 14 blocks of 4: preemptions
    SCOPED_TRACE(blocks);
    auto e = MakeEngine(M::kFullAndPiecewise, blocks, /*max_num_seqs=*/4, /*block_size=*/4);
    ASSERT_EQ(e->runner().max_logit_rows(), 4);
    SamplingParams plain = IgnoringEos(5);
    ASSERT_TRUE(e->AddRequest("warm", prompt, plain).ok());  // its blocks go to the prefix cache
    std::map<std::string, std::vector<int32_t>> tokens;
    RunForPromptLogprobs(e.get(), &tokens);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(e->AddRequest("d" + std::to_string(i), Prompt(5, i), IgnoringEos(20)).ok());
    SamplingParams with = plain;
    with.prompt_logprobs = 3;
    ASSERT_TRUE(e->AddRequest("p", prompt, with).ok());
    SamplingParams one_token = with;  // its first token ends it, in the step that finishes its prompt
    one_token.max_tokens = 1;
    ASSERT_TRUE(e->AddRequest("p1", prompt, one_token).ok());
    tokens.clear();
    const auto got = RunForPromptLogprobs(e.get(), &tokens);
    EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
    EXPECT_EQ(e->num_preemptions() > 0, blocks > 0);
    EXPECT_EQ(tokens["p"].size(), 5u);
    ASSERT_EQ(got.at("p").size(), prompt.size() - 1);
    EXPECT_EQ(tokens["p1"], std::vector<int32_t>{tokens["p"][0]});
    ASSERT_EQ(got.at("p1").size(), prompt.size() - 1);
    EXPECT_TRUE(got.count("d0") == 0 || got.at("d0").empty());
    // The reference: the prompt cut before position L, its next token forced
    // by a bias (logprobs are the raw logits', before the bias).
    auto ref = MakeEngine(M::kNone);
    for (size_t l = 1; l < prompt.size(); ++l) {
      SamplingParams one;
      one.max_tokens = 1;
      one.logprobs = 3;
      one.logit_bias = {{prompt[l], 1000.f}};
      ASSERT_TRUE(ref->AddRequest("l" + std::to_string(l), {prompt.begin(), prompt.begin() + l}, one).ok());
    }
    std::map<std::string, TokenLogprobs> want;
    for (int guard = 0; ref->HasWork() && guard < 1000; ++guard) {
      auto step = ref->Step();
      ASSERT_TRUE(step.ok());
      for (const RequestOutput& o : *step) {
        if (!o.logprobs.empty()) want[o.id] = o.logprobs[0];
      }
    }
    for (size_t l = 1; l < prompt.size(); ++l) {
      SCOPED_TRACE(l);
      const TokenLogprobs& g = got.at("p")[l - 1];
      const TokenLogprobs& w = want.at("l" + std::to_string(l));
      EXPECT_NEAR(g.logprob, w.logprob, 1e-3);
      ASSERT_EQ(g.top.size(), 3u);
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(g.top[k].first, w.top[k].first);
        EXPECT_NEAR(g.top[k].second, w.top[k].second, 1e-3);
      }
      EXPECT_GE(g.rank, 1);
      EXPECT_EQ(g.rank == 1, g.top[0].first == prompt[l]);
      if (g.rank <= 3) EXPECT_EQ(g.top[g.rank - 1].first, prompt[l]);
    }
  }
  // Out of range, and never for a prompt computed elsewhere.
  auto e = MakeEngine(M::kNone);
  SamplingParams bad = IgnoringEos(2);
  bad.prompt_logprobs = 21;
  EXPECT_NE(e->AddRequest("x", Prompt(4, 1), bad).message().find("sampling.prompt_logprobs must be in [0, 20]"),
            std::string::npos);
  bad.prompt_logprobs = 0;
  EXPECT_NE(e->AddRequest("x", Prompt(4, 1), bad, RequestKind::kRemotePrefill)
                .message()
                .find("needs the prompt computed where it is served"),
            std::string::npos);
}

// Seed 0 is a seed like any other (vLLM's seed is Optional[int]): two
// requests with it sample alike; another seed samples otherwise.
TEST(EngineTest, SeedZeroIsASeed) {
  auto e = MakeEngine(M::kFullAndPiecewise);
  SamplingParams p = IgnoringEos(24);
  p.temperature = 1.f;
  for (uint64_t seed : {0, 0, 1}) {
    p.seed = seed;
    const std::string id = "s" + std::to_string(seed) + "_" + std::to_string(e->HasWork());
    ASSERT_TRUE(e->AddRequest(id, Prompt(9, 4), p).ok());
  }
  auto out = RunAll(e.get());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out["s0_0"], out["s0_1"]);
  EXPECT_NE(out["s0_0"], out["s1_1"]);
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
}

// A preempted request prefilled again elsewhere arrives as prompt + output
// so far; prior_output_tokens makes the penalties count that output as
// output, so it goes on as if it had not moved.
TEST(EngineTest, PriorOutputTokensCountAsOutputForPenalties) {
  auto e = MakeEngine(M::kFullAndPiecewise);
  SamplingParams p = IgnoringEos(20);
  p.frequency_penalty = -1.5f;  // repeats favoured: the output so far matters
  p.presence_penalty = -0.5f;
  ASSERT_TRUE(e->AddRequest("whole", Prompt(9, 4), p).ok());
  const std::vector<int32_t> whole = RunAll(e.get())["whole"];
  ASSERT_EQ(whole.size(), 20u);
  std::vector<int32_t> resumed_prompt = Prompt(9, 4);
  resumed_prompt.insert(resumed_prompt.end(), whole.begin(), whole.begin() + 8);
  SamplingParams resumed = p;
  resumed.max_tokens = 12;
  resumed.prior_output_tokens = 8;
  ASSERT_TRUE(e->AddRequest("resumed", resumed_prompt, resumed).ok());
  SamplingParams as_prompt = resumed;
  as_prompt.prior_output_tokens = 0;
  ASSERT_TRUE(e->AddRequest("as-prompt", resumed_prompt, as_prompt).ok());
  auto out = RunAll(e.get());
  EXPECT_EQ(out["resumed"], std::vector<int32_t>(whole.begin() + 8, whole.end()));
  EXPECT_NE(out["as-prompt"], out["resumed"]) << "the penalties did not tell them apart";
  resumed.prior_output_tokens = static_cast<uint32_t>(resumed_prompt.size());
  EXPECT_NE(e->AddRequest("x", resumed_prompt, resumed).message().find("prior_output_tokens"),
            std::string::npos);
}

// vLLM's min_tokens: a stop id is neither sampled nor obeyed before it.
TEST(EngineTest, MinTokensKeepsStopIdsOffTheFirstTokens) {
  auto e = MakeEngine(M::kFullAndPiecewise);
  SamplingParams p = IgnoringEos(30);
  ASSERT_TRUE(e->AddRequest("free", Prompt(5, 1), p).ok());
  const std::vector<int32_t> free_run = RunAll(e.get())["free"];
  SamplingParams stop = p;
  stop.stop_token_ids = {free_run[1]};  // would end the output at its 2nd token
  stop.min_tokens = 6;
  ASSERT_TRUE(e->AddRequest("min", Prompt(5, 1), stop).ok());
  std::map<std::string, FinishReason> reasons;
  const std::vector<int32_t> out = RunAll(e.get(), &reasons)["min"];
  ASSERT_GE(out.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_NE(out[i], free_run[1]) << i;
  if (reasons["min"] == FinishReason::kStop) EXPECT_EQ(out.back(), free_run[1]);
  EXPECT_EQ(out[0], free_run[0]);
  EXPECT_NE(out[1], free_run[1]);
}

TEST(EngineTest, AbortFreesBlocksMidGeneration) {
  auto e = MakeEngine(M::kFullDecodeOnly);
  SamplingParams p = IgnoringEos(100);
  ASSERT_TRUE(e->AddRequest("x", Prompt(40, 3), p).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(e->Step().ok());
  EXPECT_GT(e->kv_cache().pool().num_used(), 0);
  ASSERT_TRUE(e->Abort("x").ok());
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
  EXPECT_FALSE(e->HasWork());
}

// Structured outputs on the synthetic model: a vocabulary of JSON pieces
// (id % 16; EOS is 2) that, as a real one, can spell every byte the
// grammars need one at a time; a grammar; replies that always match it.
std::shared_ptr<const TokenVocabulary> JsonPieces() {
  static const char* kPieces[] = {"{", "}", "", "\"a\"", ":", ",", " ", "1", "2", "[", "]",
                                  "\"", "b", "null", "a", "x"};
  std::vector<std::string> bytes(512);
  for (int id = 0; id < 512; ++id) bytes[id] = kPieces[id % 16];
  return std::make_shared<const TokenVocabulary>(bytes, std::vector<bool>(512, false));
}

std::string Text(const TokenVocabulary& v, const std::vector<int32_t>& ids) {
  std::string t;
  for (int32_t id : ids) t += v.bytes(id);
  return t;
}

TEST(EngineTest, StructuredOutputsHoldEveryReplyToItsGrammar) {
  auto e = MakeEngine(M::kFullAndPiecewise, 0, 16, 16, true, JsonPieces());
  auto schema = JsonGrammar::FromSchema(
      R"({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"},
          "maxItems": 3}}, "required": ["a"]})");
  ASSERT_TRUE(schema.ok()) << schema.status();
  auto choice = JsonGrammar::FromChoices({"bb", "x1x"});
  ASSERT_TRUE(choice.ok());
  for (int i = 0; i < 12; ++i) {
    SamplingParams p;
    p.max_tokens = 60;
    p.temperature = 1.0f;  // a random model, sampled: anything the mask leaves
    p.seed = 100 + i;
    p.grammar = i % 3 == 2 ? *choice : *schema;
    ASSERT_TRUE(e->AddRequest("r" + std::to_string(i), Prompt(6, i), p).ok());
  }
  std::map<std::string, FinishReason> reasons;
  const auto out = RunAll(e.get(), &reasons);
  const auto vocab = JsonPieces();
  int whole = 0;
  for (int i = 0; i < 12; ++i) {
    const std::string id = "r" + std::to_string(i);
    SCOPED_TRACE(id);
    std::vector<int32_t> tokens = out.at(id);
    const bool stopped = reasons[id] == FinishReason::kStop;
    // A reply ends once whole: at its last token when nothing may follow it,
    // else with EOS (a number that could go on).
    if (stopped && tokens.back() == 2) tokens.pop_back();
    GrammarMatcher m(i % 3 == 2 ? *choice : *schema);
    const std::string text = Text(*vocab, tokens);
    ASSERT_TRUE(m.Accept(text)) << text;
    EXPECT_EQ(m.CanEnd(), stopped) << text;
    whole += stopped;
    if (i % 3 == 2) EXPECT_TRUE(text == "bb" || text == "x1x") << text;
  }
  EXPECT_GE(whole, 4);  // the choices end at once; most objects do too
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
  // A reply whole before min_tokens ends whole (min_tokens bans EOS, but
  // nothing else could follow).
  SamplingParams p;
  p.max_tokens = 20;
  p.min_tokens = 10;
  p.grammar = *choice;
  ASSERT_TRUE(e->AddRequest("min", Prompt(4, 9), p).ok());
  const auto min_out = RunAll(e.get(), &reasons);
  const std::string text = Text(*vocab, min_out.at("min"));
  EXPECT_TRUE(text == "bb" || text == "x1x") << text;
  EXPECT_EQ(reasons["min"], FinishReason::kStop);
}

TEST(EngineTest, StructuredOutputResumesAfterPriorOutput) {
  auto e = MakeEngine(M::kFullAndPiecewise, 0, 16, 16, true, JsonPieces());
  auto g = JsonGrammar::FromSchema(R"({"type": "array", "items": {"type": "integer"}})");
  ASSERT_TRUE(g.ok());
  SamplingParams p;
  p.max_tokens = 14;
  p.grammar = *g;  // greedy: the same tokens when resumed
  ASSERT_TRUE(e->AddRequest("whole", Prompt(7, 2), p).ok());
  const std::vector<int32_t> whole = RunAll(e.get())["whole"];
  ASSERT_GE(whole.size(), 4u);
  std::vector<int32_t> resumed_prompt = Prompt(7, 2);
  resumed_prompt.insert(resumed_prompt.end(), whole.begin(), whole.begin() + 3);
  SamplingParams resumed = p;
  resumed.max_tokens = p.max_tokens - 3;
  resumed.prior_output_tokens = 3;
  ASSERT_TRUE(e->AddRequest("resumed", resumed_prompt, resumed).ok());
  EXPECT_EQ(RunAll(e.get())["resumed"], std::vector<int32_t>(whole.begin() + 3, whole.end()));
  // Prior output the grammar cannot have made is refused.
  std::vector<int32_t> wrong = Prompt(7, 2);
  wrong.push_back(1);  // "}"
  resumed.prior_output_tokens = 1;
  const absl::Status refused = e->AddRequest("wrong", wrong, resumed);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("does not match its structured output"), std::string::npos) << refused;
  // Without a vocabulary, structured outputs cannot be served.
  auto plain = MakeEngine(M::kNone);
  const absl::Status none = plain->AddRequest("x", Prompt(3, 1), p);
  EXPECT_NE(none.message().find("structured outputs need the model's tokenizer"), std::string::npos) << none;
}

// A cache too small for all requests at once: requests wait or are preempted
// and recomputed, all finish with the tokens they get with a large cache.
TEST(EngineTest, SmallCachePreemptsAndRecomputes) {
  SamplingParams p = IgnoringEos(24);
  auto big = MakeEngine(M::kFullAndPiecewise, 0, 8, 4);
  auto small = MakeEngine(M::kFullAndPiecewise, /*num_kv_blocks=*/16, 8, 4);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(big->AddRequest("r" + std::to_string(i), Prompt(10 + i, i), p).ok());
    ASSERT_TRUE(small->AddRequest("r" + std::to_string(i), Prompt(10 + i, i), p).ok());
  }
  EXPECT_EQ(RunAll(small.get()), RunAll(big.get()));
  EXPECT_EQ(small->kv_cache().pool().num_used(), 0);
}

TEST(EngineTest, RequestLargerThanCacheFailsCleanly) {
  auto e = MakeEngine(M::kFullAndPiecewise, /*num_kv_blocks=*/2, 8, 4);
  SamplingParams p;
  p.max_tokens = 4;
  absl::Status s = e->AddRequest("huge", Prompt(30, 1), p);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("prompt_token_ids (30) + max_tokens (4) need 9 KV blocks of 4 tokens; "
                             "the whole cache has 2"),
            std::string::npos)
      << s;
  EXPECT_FALSE(e->HasWork());
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
}

// The serving loop takes a remotely sampled first token before the next step
// (it streams without waiting for a decode forward); a first token that ends
// the request finishes it at once and frees its blocks.
TEST(EngineTest, RemoteFirstTokenIsTakenBeforeTheNextStep) {
  auto e = MakeEngine(M::kNone);
  for (int max_tokens : {1, 3}) {
    SCOPED_TRACE(max_tokens);
    SamplingParams p = IgnoringEos(max_tokens);
    ASSERT_TRUE(e->AddRequest("x", Prompt(20, 5), p, RequestKind::kRemotePrefill).ok());
    ASSERT_TRUE(e->Step().ok());
    ASSERT_TRUE(e->RemoteKvArrived("x", 9).ok());
    std::vector<RequestOutput> first = e->TakeOutputs();
    ASSERT_EQ(first.size(), 1u);
    EXPECT_EQ(first[0].new_tokens, std::vector<int32_t>{9});
    EXPECT_EQ(first[0].finished, max_tokens == 1);
    EXPECT_TRUE(e->TakeOutputs().empty());
    std::vector<int32_t> rest;
    for (int guard = 0; e->HasWork() && guard < 10; ++guard) {
      auto o = e->Step();
      ASSERT_TRUE(o.ok());
      for (const RequestOutput& x : *o) rest.insert(rest.end(), x.new_tokens.begin(), x.new_tokens.end());
    }
    EXPECT_EQ(rest.size(), static_cast<size_t>(max_tokens - 1));
    EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
  }
}

TEST(EngineTest, PrefillOnlyKeepsKvUntilReleased) {
  auto e = MakeEngine(M::kPiecewise);
  SamplingParams p;
  p.max_tokens = 1;
  ASSERT_TRUE(e->AddRequest("p", Prompt(20, 2), p, RequestKind::kPrefillOnly).ok());
  auto out = RunAll(e.get());
  EXPECT_EQ(out["p"].size(), 1u);
  EXPECT_NE(e->kv_cache().BlockTable("p"), nullptr);
  EXPECT_TRUE(e->Abort("p").ok());
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
}

// Many prompts sharing a 40-token system prompt, in waves, with and without
// prefix caching, with room for everything and under eviction pressure: the
// greedy tokens are the same, the cached run computes fewer tokens, and no
// block is left held.
TEST(EngineTest, PrefixCachingKeepsOutputsAndSkipsSharedPrefixes) {
  const std::vector<int32_t> system = Prompt(40, 77);
  auto prompt = [&](int i) {
    std::vector<int32_t> p = system;
    const std::vector<int32_t> user = Prompt(3 + (i * 7) % 30, i);
    p.insert(p.end(), user.begin(), user.end());
    return p;
  };
  SamplingParams p = IgnoringEos(6);
  for (M mode : {M::kNone, M::kFullAndPiecewise}) {
    for (int blocks : {0, 12}) {  // 12 blocks of 8: preemption and eviction
      SCOPED_TRACE(absl::StrCat(mode.name(), " blocks=", blocks));
      std::map<std::string, std::vector<int32_t>> out[2];
      int64_t computed[2] = {0, 0};
      for (bool caching : {false, true}) {
        auto e = MakeEngine(mode, blocks, 4, /*block_size=*/8, caching);
        for (int wave = 0; wave < 3; ++wave) {
          for (int i = 0; i < 5; ++i) {
            const int id = wave * 5 + i;
            ASSERT_TRUE(e->AddRequest("r" + std::to_string(id), prompt(id), p).ok());
          }
          for (auto& [id, tokens] : RunAll(e.get())) out[caching][id] = tokens;
          for (const StepRecord& r : e->TakeStepRecords()) computed[caching] += r.num_tokens;
        }
        EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
        const PrefixCacheStats& st = e->prefix_cache_stats();
        if (caching) {
          EXPECT_GT(st.hits, 0);
          EXPECT_GT(e->kv_cache().pool().num_cached(), 0);
        } else {
          EXPECT_EQ(st.hits, 0);
        }
      }
      EXPECT_EQ(out[0], out[1]);
      EXPECT_EQ(out[1].size(), 15u);
      EXPECT_LT(computed[1], computed[0]);  // the graph policy saw fewer new tokens
    }
  }
}

// cache_salt (vLLM's): a request reuses cached blocks only of requests with
// its salt; an unsalted one only of unsalted ones. The output is the same.
TEST(EngineTest, CacheSaltSharesBlocksOnlyWithTheSameSalt) {
  auto e = MakeEngine(M::kNone, 0, 4, /*block_size=*/8);
  const std::vector<int32_t> prompt = Prompt(40, 5);
  // In order: the salt, and the tokens its request finds cached (the
  // prompt's whole blocks short of its last token: 32).
  const std::vector<std::pair<std::string, int>> runs = {
      {"", 0}, {"", 32}, {"tenant-a", 0}, {"tenant-a", 32}, {"tenant-b", 0}, {"", 32},
      {"tenant-b", 32}};
  std::vector<int32_t> first_output;
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("run ", i, " salt '", runs[i].first, "'"));
    SamplingParams p = IgnoringEos(4);
    p.cache_salt = runs[i].first;
    const std::string id = absl::StrCat("r", i);
    ASSERT_TRUE(e->AddRequest(id, prompt, p).ok());
    int cached = -1;
    std::vector<int32_t> output;
    for (int guard = 0; e->HasWork() && guard < 1000; ++guard) {
      auto step = e->Step();
      ASSERT_TRUE(step.ok()) << step.status();
      for (const auto& o : *step) {
        if (cached < 0) cached = o.cached_tokens;
        output.insert(output.end(), o.new_tokens.begin(), o.new_tokens.end());
      }
    }
    EXPECT_EQ(cached, runs[i].second);
    if (i == 0) first_output = output;
    EXPECT_EQ(output, first_output);
  }
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
}

// A request's blocks are freed by the one Abort path in every state.
TEST(EngineTest, AbortFreesBlocksInEveryState) {
  auto e = MakeEngine(M::kNone, /*num_kv_blocks=*/10, 4, /*block_size=*/8);
  SamplingParams p = IgnoringEos(30);
  ASSERT_TRUE(e->AddRequest("run", Prompt(20, 1), p).ok());
  ASSERT_TRUE(e->AddRequest("remote", Prompt(20, 2), p, RequestKind::kRemotePrefill).ok());
  ASSERT_TRUE(e->AddRequest("wait", Prompt(40, 3), p).ok());  // 5 blocks: 4 are left
  auto out = e->Step();
  ASSERT_TRUE(out.ok());
  auto states = e->CountStates();
  EXPECT_EQ(states[static_cast<int>(RequestState::kRunning)], 1);
  EXPECT_EQ(states[static_cast<int>(RequestState::kWaitingForRemoteKv)], 1);
  EXPECT_EQ(states[static_cast<int>(RequestState::kWaiting)], 1);
  EXPECT_GT(e->kv_cache().pool().num_used(), 0);
  for (const char* id : {"run", "remote", "wait"}) EXPECT_TRUE(e->Abort(id).ok()) << id;
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
  EXPECT_FALSE(e->HasWork());
  EXPECT_EQ(e->Abort("run").code(), absl::StatusCode::kNotFound);
}

// A remotely prefilled request's first token is output by the step after it
// arrives, and that step may sample its last token too. Both must reach the
// caller in one finished output: the serving loop drops everything after a
// request's finished output, and a second output for the request lost the
// last token (59 of 60 under preemption in the pair).
TEST(EngineTest, EachStepGivesOneOutputPerRequest) {
  auto e = MakeEngine(M::kNone);
  SamplingParams p = IgnoringEos(2);
  ASSERT_TRUE(e->AddRequest("x", Prompt(20, 4), p, RequestKind::kRemotePrefill).ok());
  auto first = e->Step();
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->size(), 1u);
  ASSERT_TRUE((*first)[0].kv_needed);
  ASSERT_TRUE(e->RemoteKvArrived("x", 7).ok());
  auto last = e->Step();
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(last->size(), 1u);
  const RequestOutput& o = (*last)[0];
  EXPECT_TRUE(o.finished);
  EXPECT_EQ(o.finish_reason, FinishReason::kLength);
  ASSERT_EQ(o.new_tokens.size(), 2u);
  EXPECT_EQ(o.new_tokens[0], 7);
  EXPECT_EQ(o.completion_tokens, 2);
  EXPECT_FALSE(e->HasWork());
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
}

}  // namespace
}  // namespace tandem
