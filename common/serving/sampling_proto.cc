#include "common/serving/sampling_proto.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/mutex.h"
#include "common/base/status_macros.h"

namespace tandem {

namespace {

// Grammars compiled for earlier requests, by what they were compiled from: a
// request with the same schema, choices, regex or grammar as a recent one
// takes the same JsonGrammar, so it is not compiled again and its replies
// start with the automaton and kept masks earlier replies built (XGrammar's
// compiled-grammar cache, for the same reason). The least recently used goes
// past kEntries: what a grammar holds for masking is bounded (at most 2,048
// states of 1 KiB and 16 masks of a byte a token), so the cache is too.
class GrammarCache {
 public:
  static constexpr size_t kEntries = 16;

  absl::StatusOr<std::shared_ptr<const JsonGrammar>> Get(
      const std::string& key,
      const std::function<absl::StatusOr<std::shared_ptr<const JsonGrammar>>()>& compile) {
    {
      MutexLock lock(&mu_);
      for (Entry& e : entries_) {
        if (e.key == key) {
          e.used = ++clock_;
          return e.grammar;
        }
      }
    }
    // Compiled without the lock (a large schema takes milliseconds); a
    // request that compiled the same meanwhile keeps the one first cached.
    ASSIGN_OR_RETURN(std::shared_ptr<const JsonGrammar> grammar, compile());
    MutexLock lock(&mu_);
    for (Entry& e : entries_) {
      if (e.key == key) return e.grammar;
    }
    if (entries_.size() < kEntries) {
      entries_.push_back({key, grammar, ++clock_});
    } else {
      *std::min_element(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
        return a.used < b.used;
      }) = {key, grammar, ++clock_};
    }
    return grammar;
  }

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const JsonGrammar> grammar;
    uint64_t used = 0;
  };
  Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
};

GrammarCache& Grammars() {
  static GrammarCache* cache = new GrammarCache();  // never destroyed: used until exit
  return *cache;
}

absl::Status EncodeBadWords(const Tokenizer* tokenizer, SamplingParams* s) {
  if (s->bad_words.empty()) return absl::OkStatus();
  if (tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        "sampling.bad_words needs the model's tokenizer, and this worker has none");
  }
  if (s->bad_words.size() > kMaxBadWords) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.bad_words has ", s->bad_words.size(),
                                                   " words; the limit is ", kMaxBadWords));
  }
  for (size_t i = 0; i < s->bad_words.size(); ++i) {
    const std::string& word = s->bad_words[i];
    const absl::string_view bare = absl::StripLeadingAsciiWhitespace(word);
    if (bare.empty() || word.size() > kMaxBadWordBytes) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.bad_words[", i, "] must have 1 to ",
                                                     kMaxBadWordBytes, " bytes besides leading spaces, got ",
                                                     word.size()));
    }
    // vLLM's: the word as it starts a text, and with a space before it where
    // that is another token sequence of the same length (a word mid-text).
    std::vector<int32_t> plain = tokenizer->Encode(bare, /*add_special_tokens=*/false);
    std::vector<int32_t> spaced = tokenizer->Encode(std::string(" ") + std::string(bare), false);
    if (plain.empty()) continue;
    const bool mid_text = !spaced.empty() && spaced[0] != plain[0] && spaced.size() == plain.size();
    s->bad_words_token_ids.push_back(std::move(plain));
    if (mid_text) s->bad_words_token_ids.push_back(std::move(spaced));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SamplingParams> FromProto(const v1::SamplingParams& p, const Tokenizer* tokenizer) {
  SamplingParams s;
  const int structured = !p.structured_json_schema().empty() + (p.structured_choice_size() > 0) +
                         !p.structured_regex().empty() + !p.structured_grammar().empty();
  if (structured > 1) {
    return absl::InvalidArgumentError(
        "sampling.structured_json_schema, structured_choice, structured_regex and structured_grammar: "
        "give one of the four");
  }
  absl::StatusOr<std::shared_ptr<const JsonGrammar>> g = nullptr;
  const char* field = "";
  // The cache's key: the kind, then the text (each choice after its length).
  if (!p.structured_json_schema().empty()) {
    g = Grammars().Get(absl::StrCat("s", p.structured_json_schema()),
                       [&] { return JsonGrammar::FromSchema(p.structured_json_schema()); });
    field = "sampling.structured_json_schema: ";
  } else if (p.structured_choice_size() > 0) {
    std::string key = "c";
    for (const std::string& c : p.structured_choice()) absl::StrAppend(&key, c.size(), ":", c);
    g = Grammars().Get(key, [&] {
      return JsonGrammar::FromChoices({p.structured_choice().begin(), p.structured_choice().end()});
    });
    field = "sampling.structured_";
  } else if (!p.structured_regex().empty()) {
    g = Grammars().Get(absl::StrCat("r", p.structured_regex()),
                       [&] { return JsonGrammar::FromRegex(p.structured_regex()); });
    field = "sampling.structured_regex: ";
  } else if (!p.structured_grammar().empty()) {
    g = Grammars().Get(absl::StrCat("g", p.structured_grammar()),
                       [&] { return JsonGrammar::FromEbnf(p.structured_grammar()); });
    field = "sampling.structured_grammar: ";
  }
  if (!g.ok()) return absl::InvalidArgumentError(absl::StrCat(field, g.status().message()));
  s.grammar = *std::move(g);
  s.max_tokens = p.max_tokens();
  s.temperature = p.temperature();
  s.top_p = p.top_p() == 0.f ? 1.f : p.top_p();
  s.top_k = p.top_k();
  if (p.has_seed()) s.seed = p.seed().value();
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  s.min_p = p.min_p();
  s.repetition_penalty = p.repetition_penalty() == 0.f ? 1.f : p.repetition_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.presence_penalty = p.presence_penalty();
  s.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  s.allowed_token_ids.assign(p.allowed_token_ids().begin(), p.allowed_token_ids().end());
  s.bad_words.assign(p.bad_words().begin(), p.bad_words().end());
  RETURN_IF_ERROR(EncodeBadWords(tokenizer, &s));
  // Sorted: a map's order is unspecified, and the sums must not depend on it.
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
  s.logprobs = p.has_logprobs() ? p.logprobs().value() : -1;
  s.prompt_logprobs = p.has_prompt_logprobs() ? p.prompt_logprobs().value() : -1;
  s.prior_output_tokens = p.prior_output_tokens();
  s.min_tokens = p.min_tokens();
  return s;
}

void FirstTokenSampling(const SamplingParams& s, uint32_t prior_output_tokens,
                        v1::SamplingParams* p) {
  p->set_max_tokens(1);
  p->set_prior_output_tokens(prior_output_tokens);
  p->set_temperature(s.temperature);
  p->set_top_p(s.top_p);
  p->set_top_k(s.top_k);
  if (s.seed.has_value()) p->mutable_seed()->set_value(*s.seed);
  p->set_min_p(s.min_p);
  p->set_repetition_penalty(s.repetition_penalty);
  p->set_frequency_penalty(s.frequency_penalty);
  p->set_presence_penalty(s.presence_penalty);
  for (const auto& [id, bias] : s.logit_bias) (*p->mutable_logit_bias())[id] = bias;
  p->mutable_allowed_token_ids()->Add(s.allowed_token_ids.begin(), s.allowed_token_ids.end());
  p->mutable_bad_words()->Add(s.bad_words.begin(), s.bad_words.end());
  if (s.logprobs >= 0) p->mutable_logprobs()->set_value(s.logprobs);
  if (s.grammar != nullptr) {
    p->set_structured_json_schema(s.grammar->schema());
    p->mutable_structured_choice()->Add(s.grammar->choices().begin(), s.grammar->choices().end());
    p->set_structured_regex(s.grammar->regex());
    p->set_structured_grammar(s.grammar->grammar());
  }
  // A first token that min_tokens keeps from stopping the output: its stop
  // ids are banned there too.
  if (prior_output_tokens < s.min_tokens) {
    p->set_min_tokens(prior_output_tokens + 1);
    p->set_ignore_eos(s.ignore_eos);
    p->mutable_stop_token_ids()->Add(s.stop_token_ids.begin(), s.stop_token_ids.end());
  }
}

void ToProto(const TokenLogprobs& lp, v1::TokenLogprobs* p) {
  p->set_logprob(lp.logprob);
  p->set_rank(lp.rank);
  for (const auto& [id, logprob] : lp.top) {
    p->add_top_token_ids(id);
    p->add_top_logprobs(logprob);
  }
}

TokenLogprobs FromProto(const v1::TokenLogprobs& p) {
  TokenLogprobs lp;
  lp.logprob = p.logprob();
  lp.rank = p.rank();
  const int n = std::min(p.top_token_ids_size(), p.top_logprobs_size());
  for (int i = 0; i < n; ++i) lp.top.emplace_back(p.top_token_ids(i), p.top_logprobs(i));
  return lp;
}

}  // namespace tandem
