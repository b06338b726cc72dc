// Speculative decoding (n-gram): the config as vLLM spells it, the proposer
// against a rescan of the context, the verification rule's output
// distribution against the target's exactly, and the engine's outputs with
// and without speculation (greedy identical in every graph mode; sampled
// equal in distribution; stops and max_tokens inside a draft; no KV leaked).
#include "common/engine/speculative.h"

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "common/engine/engine.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using M = CudaGraphMode;

TEST(SpeculativeConfigTest, ParsesAsVllm) {
  auto off = ParseSpeculativeConfig("");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());
  EXPECT_EQ(off->query_len(), 1);
  auto c = ParseSpeculativeConfig(
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_speculative_tokens, 3);
  EXPECT_EQ(c->prompt_lookup_min, 4);  // the other bound's value
  EXPECT_EQ(c->prompt_lookup_max, 4);
  EXPECT_EQ(c->query_len(), 4);
  auto d = ParseSpeculativeConfig(R"({"method": "ngram", "num_speculative_tokens": 2})");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->prompt_lookup_min, 5);
  EXPECT_EQ(d->prompt_lookup_max, 5);
  EXPECT_TRUE(d->adaptive);
  auto fixed = ParseSpeculativeConfig(
      R"({"method": "ngram", "num_speculative_tokens": 2, "draft_len_policy": "fixed"})");
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_FALSE(fixed->adaptive);
  for (const auto& [json, needle] : std::vector<std::pair<std::string, std::string>>{
           {"ngram", "not a JSON object"},
           {R"({"method": "eagle", "num_speculative_tokens": 2})", "method must be \"ngram\""},
           {R"({"method": "ngram"})", "num_speculative_tokens must be in [1, 32], got nothing"},
           {R"({"method": "ngram", "num_speculative_tokens": 0})", "got 0"},
           {R"({"method": "ngram", "num_speculative_tokens": "3"})", "must be an integer"},
           {R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
               "prompt_lookup_max": 2})",
            "prompt_lookup_min (4) <= prompt_lookup_max (2)"},
           {R"({"method": "ngram", "num_speculative_tokens": 2, "draft_model": "x"})",
            "unknown key 'draft_model'"},
           {R"({"method": "ngram", "num_speculative_tokens": 2, "draft_len_policy": "dynamic"})",
            "draft_len_policy must be \"adaptive\" or \"fixed\", got \"dynamic\""}}) {
    auto s = ParseSpeculativeConfig(json);
    ASSERT_FALSE(s.ok()) << json;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status();
  }
}

// "fixed" drafts k tokens whatever happened; "adaptive" grows by 2 after a
// draft kept whole, shrinks by 1 after one kept in part, drops to 1 after one
// rejected whole, and pauses 1, 2, 4, ... 64 steps after a rejected 1-token
// draft, until a draft is kept again.
TEST(DraftLengthTest, FixedOrAdaptiveToHowDraftsFared) {
  DraftLength fixed(4, /*adaptive=*/false);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(fixed.Next(), 4);
    fixed.Verified(4, 0);
  }
  DraftLength a(4, /*adaptive=*/true);
  EXPECT_EQ(a.Next(), 4);
  a.Verified(4, 4);
  EXPECT_EQ(a.Next(), 4);  // at most k
  a.Verified(4, 2);
  EXPECT_EQ(a.Next(), 3);
  a.Verified(3, 3);
  EXPECT_EQ(a.Next(), 4);
  a.Verified(4, 0);
  EXPECT_EQ(a.Next(), 1);
  a.Verified(1, 1);
  EXPECT_EQ(a.Next(), 3);
  a.Verified(2, 0);  // the scheduler may have trimmed the draft
  EXPECT_EQ(a.Next(), 1);
  // Rejected 1-token drafts: pauses of 1, 2, 4, ..., then 64 at most.
  std::vector<int> pauses;
  for (int round = 0; round < 9; ++round) {
    a.Verified(1, 0);
    int paused = 0;
    while (a.Next() == 0) ++paused;
    pauses.push_back(paused);
  }
  EXPECT_EQ(pauses, (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 64, 64}));
  a.Verified(1, 1);  // kept: no pause, and the next failure pauses 1 step
  EXPECT_EQ(a.Next(), 3);
  a.Verified(3, 0);
  EXPECT_EQ(a.Next(), 1);
  a.Verified(1, 0);
  EXPECT_EQ(a.Next(), 0);
  EXPECT_EQ(a.Next(), 1);
  a.Verified(0, 0);  // nothing drafted: nothing learned
  EXPECT_EQ(a.Next(), 1);
}

// The proposal as the definition says, by rescanning the whole context.
std::vector<int32_t> RescanProposal(const std::vector<int32_t>& t, int min_n, int max_n, int k) {
  const int64_t len = static_cast<int64_t>(t.size());
  for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    for (int64_t end = len - 2; end >= n - 1; --end) {  // latest first
      if (std::equal(t.end() - n, t.end(), t.begin() + end - n + 1)) {
        const int64_t count = std::min<int64_t>(k, len - 1 - end);
        return {t.begin() + end + 1, t.begin() + end + 1 + count};
      }
    }
  }
  return {};
}

TEST(NgramProposerTest, IndexedProposalsEqualARescanAsTheContextGrows) {
  std::mt19937 rng(7);
  int proposals = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int vocab = 2 + trial % 5, min_n = 1 + trial % 3, max_n = min_n + trial % 4;
    const int k = 1 + trial % 5;
    NgramProposer p(min_n, max_n);
    std::vector<int32_t> tokens = {static_cast<int32_t>(rng() % vocab)};
    std::vector<int32_t> drafts;
    for (int step = 0; step < 120; ++step) {
      // Grow by one or several tokens, as accepted drafts do.
      const int grow = 1 + static_cast<int>(rng() % 3);
      for (int g = 0; g < grow; ++g) tokens.push_back(static_cast<int32_t>(rng() % vocab));
      p.Propose(tokens, k, &drafts);
      ASSERT_EQ(drafts, RescanProposal(tokens, min_n, max_n, k))
          << "trial " << trial << " step " << step;
      proposals += !drafts.empty();
    }
  }
  EXPECT_GT(proposals, 1000);
}

TEST(NgramProposerTest, LongestSuffixThenLatestOccurrence) {
  NgramProposer p(1, 3);
  std::vector<int32_t> drafts;
  // "1 2 3 9 | 2 3 7 | 1 2 3": the 3-gram 1 2 3 occurred at the start.
  p.Propose({1, 2, 3, 9, 2, 3, 7, 1, 2, 3}, 2, &drafts);
  EXPECT_EQ(drafts, (std::vector<int32_t>{9, 2}));
  NgramProposer q(1, 3);
  // Only the 2-gram "2 3" recurs; its latest earlier occurrence is followed by 7.
  q.Propose({5, 2, 3, 9, 2, 3, 7, 1, 2, 3}, 3, &drafts);
  EXPECT_EQ(drafts, (std::vector<int32_t>{7, 1, 2}));
  NgramProposer none(2, 2);
  none.Propose({1, 2, 3, 4}, 3, &drafts);
  EXPECT_TRUE(drafts.empty());
}

// A target "model" over a small vocabulary whose logits depend on the
// previous token only, so the exact probability of any output is known.
struct MarkovTarget {
  static constexpr int kVocab = 5;
  float logits[kVocab][kVocab];
  explicit MarkovTarget(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.5f);
    for (auto& row : logits) {
      for (float& l : row) l = n(rng);
    }
  }
};

// Probabilities after temperature, top-k and top-p, as Sampler defines them.
std::vector<double> Probabilities(const float* logits, int vocab, const SamplingParams& p) {
  std::vector<std::pair<float, int>> c;
  for (int i = 0; i < vocab; ++i) c.push_back({logits[i] / p.temperature, i});
  std::sort(c.begin(), c.end(), [](auto a, auto b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  size_t keep = p.top_k > 0 ? std::min<size_t>(p.top_k, c.size()) : c.size();
  double total = 0;
  std::vector<double> w(keep);
  for (size_t i = 0; i < keep; ++i) total += w[i] = std::exp(c[i].first - c[0].first);
  if (p.top_p < 1.f) {
    double cum = 0;
    for (size_t i = 0; i < keep; ++i) {
      cum += w[i] / total;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    w.resize(keep);
    total = 0;
    for (double x : w) total += x;
  }
  std::vector<double> probs(vocab, 0.0);
  for (size_t i = 0; i < keep; ++i) probs[c[i].second] = w[i] / total;
  return probs;
}

// Three tokens after token 0: verified drafts (a fixed guess, right or wrong)
// must come out with the target's joint distribution exactly. Chi-square over
// the 125 outcomes (124 degrees of freedom; 200 is p < 1e-5), the generator
// seeded so the test is deterministic.
TEST(SpeculativeSamplingTest, VerifiedDraftsHaveTheTargetsDistribution) {
  const MarkovTarget target(3);
  constexpr int V = MarkovTarget::kVocab;
  for (const SamplingParams& params : {SamplingParams{16, 1.0f, 1.f, -1},
                                       SamplingParams{16, 0.7f, 1.f, 3},
                                       SamplingParams{16, 1.3f, 0.8f, -1}}) {
    SCOPED_TRACE(params.temperature);
    Sampler sampler;
    std::mt19937_64 rng(11);
    constexpr int kRuns = 30000;
    std::map<std::vector<int32_t>, int> counts;
    for (int run = 0; run < kRuns; ++run) {
      std::vector<int32_t> out;
      int32_t last = 0;
      while (out.size() < 3) {
        // Drafts: a deterministic guess of the next two tokens.
        const int32_t drafts[2] = {static_cast<int32_t>((last + 1) % V),
                                   static_cast<int32_t>((last * 3 + run % 2) % V)};
        int32_t prev = last, token = 0;
        bool all = true;
        for (int32_t d : drafts) {
          if (!sampler.Verify(target.logits[prev], V, params, {}, d, &rng, &token)) {
            out.push_back(token);
            all = false;
            break;
          }
          out.push_back(d);
          prev = d;
        }
        if (all) out.push_back(sampler.Sample(target.logits[prev], V, params, {}, &rng));
        last = out.back();
      }
      out.resize(3);
      ++counts[out];
    }
    double chi2 = 0;
    for (int a = 0; a < V; ++a) {
      for (int b = 0; b < V; ++b) {
        for (int c = 0; c < V; ++c) {
          const double p = Probabilities(target.logits[0], V, params)[a] *
                           Probabilities(target.logits[a], V, params)[b] *
                           Probabilities(target.logits[b], V, params)[c];
          const int n = counts[{a, b, c}];
          if (p == 0) {
            EXPECT_EQ(n, 0) << a << b << c << " is outside top-k/top-p";
            continue;
          }
          const double e = p * kRuns;
          chi2 += (n - e) * (n - e) / e;
        }
      }
    }
    EXPECT_LT(chi2, 200.0);
  }
}

std::unique_ptr<LlmEngine> MakeEngine(M mode, const std::string& spec, int max_num_seqs = 8,
                                      int num_kv_blocks = 0) {
  EngineConfig c;
  c.model = "synthetic";
  c.runner.graph.requested_mode = mode;
  c.runner.max_num_batched_tokens = 64;
  c.runner.max_num_seqs = max_num_seqs;
  c.runner.max_model_len = 256;
  c.num_kv_blocks = num_kv_blocks;
  c.block_size = 8;
  auto parsed = ParseSpeculativeConfig(spec);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  c.speculative = *parsed;
  auto e = LlmEngine::Create(c);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

const char* kSpec = R"({"method": "ngram", "num_speculative_tokens": 3,
                        "prompt_lookup_min": 1, "prompt_lookup_max": 3})";
const char* kSpecFixed = R"({"method": "ngram", "num_speculative_tokens": 3,
                             "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                             "draft_len_policy": "fixed"})";

// Prompts that repeat a pattern, so that drafts are found and (often) kept.
std::vector<int32_t> RepeatingPrompt(int i) {
  std::vector<int32_t> t;
  for (int rep = 0; rep < 4 + i % 3; ++rep) {
    for (int j = 0; j < 3 + i % 4; ++j) t.push_back(3 + (i * 31 + j * 7) % 500);
  }
  return t;
}

using Logprobs = std::map<std::string, std::vector<TokenLogprobs>>;

std::map<std::string, std::vector<int32_t>> RunAll(
    LlmEngine* e, std::map<std::string, FinishReason>* reasons = nullptr,
    Logprobs* logprobs = nullptr) {
  std::map<std::string, std::vector<int32_t>> out;
  for (int guard = 0; e->HasWork() && guard < 10000; ++guard) {
    auto step = e->Step();
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) break;
    std::set<std::string> ids;  // one output per request per step
    for (const auto& o : *step) {
      EXPECT_TRUE(ids.insert(o.id).second) << o.id << " has two outputs in one step";
      EXPECT_TRUE(o.status.ok()) << o.status;
      auto& v = out[o.id];
      v.insert(v.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished && reasons) (*reasons)[o.id] = o.finish_reason;
      if (logprobs != nullptr) {
        EXPECT_EQ(o.logprobs.size(), o.new_tokens.size()) << o.id;
        auto& l = (*logprobs)[o.id];
        l.insert(l.end(), o.logprobs.begin(), o.logprobs.end());
      }
    }
  }
  return out;
}

std::map<std::string, std::vector<int32_t>> Generate(LlmEngine* e, const SamplingParams& p,
                                                     int n, std::map<std::string, FinishReason>* reasons = nullptr,
                                                     Logprobs* logprobs = nullptr) {
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(e->AddRequest("r" + std::to_string(i), RepeatingPrompt(i), p).ok());
  }
  return RunAll(e, reasons, logprobs);
}

TEST(SpeculativeEngineTest, GreedyOutputEqualsPlainDecodingInEveryMode) {
  SamplingParams p;
  p.max_tokens = 40;
  p.ignore_eos = true;
  auto plain = MakeEngine(M::kNone, "");
  const auto reference = Generate(plain.get(), p, 10);
  int64_t rejected_fixed = -1;
  for (M mode : {M::kNone, M::kPiecewise, M::kFull, M::kFullDecodeOnly, M::kFullAndPiecewise}) {
    SCOPED_TRACE(mode.name());
    if (mode == M::kFullDecodeOnly) {  // vLLM's fixed draft length: the same output
      auto fixed = MakeEngine(mode, kSpecFixed);
      EXPECT_EQ(Generate(fixed.get(), p, 10), reference);
      const SpecDecodeStats& s = fixed->spec_decode_stats();
      rejected_fixed = s.num_draft_tokens - s.num_accepted_tokens;
    }
    auto e = MakeEngine(mode, kSpec);
    EXPECT_EQ(Generate(e.get(), p, 10), reference);
    const SpecDecodeStats& s = e->spec_decode_stats();
    if (mode == M::kFullDecodeOnly) {  // adaptive: fewer rejected tokens
      EXPECT_LT(s.num_draft_tokens - s.num_accepted_tokens, rejected_fixed);
    }
    EXPECT_GT(s.num_accepted_tokens, 20) << "drafts were never kept: the test proves nothing";
    EXPECT_LT(s.num_accepted_tokens, s.num_draft_tokens);  // and some rejected
    EXPECT_EQ(s.accepted_per_pos.size(), 3u);
    EXPECT_GE(s.accepted_per_pos[0], s.accepted_per_pos[1]);
    EXPECT_EQ(s.accepted_per_pos[0] + s.accepted_per_pos[1] + s.accepted_per_pos[2],
              s.num_accepted_tokens);
    EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
  }
}

// Penalties at a draft's position count the drafts kept before it: greedy
// output with penalties is plain decoding's with the same penalties.
TEST(SpeculativeEngineTest, PenalizedGreedyOutputEqualsPlainDecoding) {
  SamplingParams p;
  p.max_tokens = 40;
  p.ignore_eos = true;
  p.frequency_penalty = 0.03f;
  p.presence_penalty = 0.01f;
  p.repetition_penalty = 1.01f;
  auto plain = MakeEngine(M::kNone, "");
  const auto reference = Generate(plain.get(), p, 10);
  auto unpenalized = MakeEngine(M::kNone, "");
  SamplingParams neutral = p;
  neutral.frequency_penalty = neutral.presence_penalty = 0;
  neutral.repetition_penalty = 1;
  EXPECT_NE(Generate(unpenalized.get(), neutral, 10), reference) << "the penalties changed nothing";
  auto e = MakeEngine(M::kFullDecodeOnly, kSpec);
  EXPECT_EQ(Generate(e.get(), p, 10), reference);
  // 25 of 59 drafted tokens kept (a draft kept changes the next position's
  // penalty: counting none of them gives other tokens).
  EXPECT_GT(e->spec_decode_stats().num_accepted_tokens, 10) << "too few drafts were kept";
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
}

// Every token of a verification step, kept drafts included, has the
// log-probabilities of its own position: those of plain decoding.
TEST(SpeculativeEngineTest, LogprobsOfKeptDraftsArePlainDecodings) {
  SamplingParams p;
  p.max_tokens = 40;
  p.ignore_eos = true;
  p.logprobs = 2;
  // Each engine's tokens and logprobs; greedy: each token is the most likely.
  auto logprobs = [&](LlmEngine* e) {
    Logprobs out;
    const auto tokens = Generate(e, p, 6, nullptr, &out);
    for (const auto& [id, lps] : out) {
      for (size_t i = 0; i < lps.size() && i < tokens.at(id).size(); ++i) {
        EXPECT_EQ(lps[i].top.at(0).first, tokens.at(id)[i]);
        EXPECT_EQ(lps[i].top.at(0).second, lps[i].logprob);
      }
    }
    return out;
  };
  auto plain = MakeEngine(M::kNone, "");
  auto spec = MakeEngine(M::kFullDecodeOnly, kSpec);
  const auto want = logprobs(plain.get());
  const auto got = logprobs(spec.get());
  EXPECT_GT(spec->spec_decode_stats().num_accepted_tokens, 20);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, lps] : want) {
    ASSERT_EQ(got.at(id).size(), lps.size()) << id;
    for (size_t i = 0; i < lps.size(); ++i) {
      EXPECT_NEAR(got.at(id)[i].logprob, lps[i].logprob, 1e-4) << id << " token " << i;
      EXPECT_NEAR(got.at(id)[i].top.at(1).second, lps[i].top.at(1).second, 1e-4) << id << " token " << i;
    }
  }
}

// A stop id or max_tokens that falls inside a draft ends the output there,
// exactly as without speculation.
TEST(SpeculativeEngineTest, StopsAndMaxTokensInsideADraft) {
  SamplingParams p;
  p.max_tokens = 40;
  p.ignore_eos = true;
  auto plain = MakeEngine(M::kNone, "");
  const auto full = Generate(plain.get(), p, 10);
  auto spec_engine = MakeEngine(M::kFullDecodeOnly, kSpec);
  for (int i = 0; i < 10; ++i) {
    const std::string id = "r" + std::to_string(i);
    const std::vector<int32_t>& ref = full.at(id);
    for (int variant = 0; variant < 2; ++variant) {
      SamplingParams q = p;
      size_t expect_len;
      if (variant == 0) {  // a stop id first seen somewhere in the middle
        const int32_t stop = ref[5 + i % 20];
        q.stop_token_ids = {stop};
        expect_len = std::find(ref.begin(), ref.end(), stop) - ref.begin() + 1;
      } else {
        q.max_tokens = 2 + i * 3;
        expect_len = q.max_tokens;
      }
      const std::vector<int32_t> want(ref.begin(), ref.begin() + expect_len);
      for (LlmEngine* e : {plain.get(), spec_engine.get()}) {
        ASSERT_TRUE(e->AddRequest(id, RepeatingPrompt(i), q).ok());
        std::map<std::string, FinishReason> reasons;
        auto out = RunAll(e, &reasons);
        EXPECT_EQ(out.at(id), want) << id << " variant " << variant;
        EXPECT_EQ(reasons.at(id), variant == 0 ? FinishReason::kStop : FinishReason::kLength);
      }
    }
  }
  EXPECT_GT(spec_engine->spec_decode_stats().num_accepted_tokens, 0);
  EXPECT_EQ(spec_engine->kv_cache().pool().num_used(), 0);
}

TEST(SpeculativeEngineTest, SeededSamplingIsReproducibleAndDistributedAsPlain) {
  SamplingParams p;
  p.max_tokens = 10;
  p.ignore_eos = true;
  p.temperature = 0.5f;
  p.top_k = 2;
  constexpr int kRuns = 480;
  // Token frequencies at each output position, over many seeds.
  // Independent seeds for the plain run: with the same ones, steps without
  // drafts draw the same numbers and the two samples would be correlated.
  auto histogram = [&](const std::string& spec, uint64_t first_seed, int64_t* accepted) {
    auto e = MakeEngine(M::kFullDecodeOnly, spec, 16);
    std::map<std::pair<int, int32_t>, int> h;
    std::map<std::string, std::vector<int32_t>> all;
    for (int batch = 0; batch < kRuns / 16; ++batch) {
      for (int i = 0; i < 16; ++i) {
        SamplingParams q = p;
        q.seed = first_seed + batch * 16 + i;
        EXPECT_TRUE(e->AddRequest("s" + std::to_string(*q.seed), RepeatingPrompt(1), q).ok());
      }
      auto out = RunAll(e.get());
      all.insert(out.begin(), out.end());
    }
    for (const auto& [id, tokens] : all) {
      EXPECT_EQ(tokens.size(), 10u);
      for (size_t pos = 0; pos < tokens.size(); ++pos) ++h[{static_cast<int>(pos), tokens[pos]}];
    }
    if (accepted) *accepted = e->spec_decode_stats().num_accepted_tokens;
    EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
    return std::make_pair(h, all);
  };
  int64_t accepted = 0;
  const auto [plain_h, plain_out] = histogram("", 1000001, nullptr);
  const auto [spec_h, spec_out] = histogram(kSpec, 1, &accepted);
  const auto [again_h, again_out] = histogram(kSpec, 1, nullptr);
  EXPECT_EQ(spec_out, again_out) << "seeded requests must give the same tokens on every run";
  EXPECT_GT(accepted, kRuns / 4) << "drafts were rarely kept: the comparison proves little";
  // A two-sample chi-square test at each output position over the tokens
  // either run produced there. Positions are tested apart: a chance
  // deviation early carries into every later position, so their sum would
  // not follow the chi-square law. Threshold ~p < 1e-5 for the position's
  // degrees of freedom (mean dof, sd sqrt(2 dof)).
  for (int pos = 0; pos < 10; ++pos) {
    std::map<int32_t, std::pair<int, int>> cells;
    for (const auto& [k, n] : plain_h) {
      if (k.first == pos) cells[k.second].first = n;
    }
    for (const auto& [k, n] : spec_h) {
      if (k.first == pos) cells[k.second].second = n;
    }
    double chi2 = 0;
    for (const auto& [token, ab] : cells) {
      const double a = ab.first, b = ab.second;
      chi2 += (a - b) * (a - b) / (a + b);
    }
    const double dof = static_cast<double>(cells.size()) - 1;
    EXPECT_LT(chi2, dof + 5 * std::sqrt(2 * dof) + 5) << "position " << pos << ", dof " << dof;
  }
}

TEST(SpeculativeEngineTest, AbortBetweenStepsLeaksNoBlock) {
  auto e = MakeEngine(M::kFullDecodeOnly, kSpec, 8, /*num_kv_blocks=*/48);
  SamplingParams p;
  p.max_tokens = 60;
  p.ignore_eos = true;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(e->AddRequest("a" + std::to_string(i), RepeatingPrompt(i), p).ok());
  for (int step = 0; step < 12; ++step) ASSERT_TRUE(e->Step().ok());
  EXPECT_GT(e->spec_decode_stats().num_draft_tokens, 0);
  for (int i = 0; i < 6; i += 2) ASSERT_TRUE(e->Abort("a" + std::to_string(i)).ok());
  RunAll(e.get());
  EXPECT_EQ(e->kv_cache().pool().num_used(), 0);
}

// The runner's real verification steps dispatch as vLLM 0.15.1 does for
// q = 1 + k under FULL_DECODE_ONLY: a batch whose every request has q tokens
// is a uniform decode and replays a FULL graph keyed (padded tokens, padded
// tokens / q requests, uniform); any other batch runs eagerly (NONE).
TEST(SpeculativeEngineTest, VerificationStepsDispatchAsVllmForQueryLenOnePlusK) {
  auto e = MakeEngine(M::kFullDecodeOnly, kSpecFixed);
  const int q = 4;
  EXPECT_EQ(e->runner().dispatcher().uniform_decode_query_len(), q);
  for (int size : e->runner().dispatcher().capture_sizes()) EXPECT_EQ(size % q, 0) << size;
  SamplingParams p;
  p.max_tokens = 60;
  p.ignore_eos = true;
  Generate(e.get(), p, 1);  // alone: uniform whenever it has k drafts
  Generate(e.get(), p, 6);
  int uniform_steps = 0;
  for (const StepRecord& r : e->TakeStepRecords()) {
    const bool uniform = r.max_query_len == q && r.num_tokens == q * r.num_reqs;
    if (uniform) {
      ++uniform_steps;
      EXPECT_EQ(r.runtime_mode, M::kFull);
      EXPECT_TRUE(r.descriptor.uniform);
      EXPECT_EQ(r.descriptor.num_tokens % q, 0);
      EXPECT_EQ(r.descriptor.num_reqs, r.descriptor.num_tokens / q);
      EXPECT_EQ(r.padded_tokens, r.descriptor.num_tokens - r.num_tokens);
    } else {
      EXPECT_EQ(r.runtime_mode, M::kNone) << r.num_tokens << " tokens, " << r.num_reqs << " reqs";
    }
  }
  EXPECT_GT(uniform_steps, 0);
  EXPECT_GT(e->runner().stats().replays[M::kFull], 0);
}

}  // namespace
}  // namespace tandem
