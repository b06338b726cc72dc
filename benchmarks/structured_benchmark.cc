// Structured outputs' cost per decode step: the token mask (GrammarMatcher::
// FillMask) over SmolLM2's 49,152 tokens (from its GGUF; TANDEM_SMOLLM2_GGUF
// or the fetch script's cache) at each point of a JSON reply, and the
// vocabulary's one-off indexing at start-up.
//
//   build/bin/structured_benchmark --benchmark_repetitions=3
#include <cstdlib>
#include <memory>
#include <string>

#include "benchmark/benchmark.h"
#include "common/serving/tokenizer_loader.h"
#include "common/structured/json_grammar.h"

namespace tandem {
namespace {

const Tokenizer& SmolLm2() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    const char* env = std::getenv("TANDEM_SMOLLM2_GGUF");
    auto t = LoadTokenizer(env != nullptr ? env : TANDEM_SMOLLM2_GGUF);
    if (!t.ok() || *t == nullptr) std::abort();
    return std::move(*t);
  }();
  return *tok;
}

const char* kSchema = R"({"type": "object", "properties": {"name": {"type": "string"},
    "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
    "city": {"enum": ["Paris", "Lyon", "Nice"]}}, "required": ["name", "age"]})";
const char* kReply = R"({"name": "Ana Lima", "age": 31, "tags": ["pilot", "chess"], "city": "Lyon"})";
const char* kRegex = R"re(\{"name": "[A-Z][a-z]+( [A-Z][a-z]+)?", "age": \d{1,3}, "tags": \[("[a-z]+"(, )?)*\], "city": "(Paris|Lyon|Nice)"\})re";
const char* kCounted = R"(.{0,80}x)";
// A string bounded in length (each count a state of its own).
const char* kBounded = R"({"type": "object", "properties": {"story": {"type": "string", "maxLength": 200}}})";
const char* kStory = R"({"story": "Ana Lima flew her small plane over the hills at dawn, counting the villages below and the rivers that ran between them, until the fog rolled in from the sea."})";
// Any JSON object, as a GBNF grammar (the shape of llama.cpp's json.gbnf).
const char* kJsonGbnf = R"g(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws (string ":" ws value ("," ws string ":" ws value)*)? "}"
array  ::= "[" ws (value ("," ws value)*)? "]"
string ::= "\"" ([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\""
number ::= "-"? ([0-9] | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws     ::= [ \t\n]{0,20})g";

void BM_VocabularyIndex(benchmark::State& state) {
  const Tokenizer& tok = SmolLm2();
  for (auto _ : state) benchmark::DoNotOptimize(TokenVocabularyOf(tok));
}
BENCHMARK(BM_VocabularyIndex)->Unit(benchmark::kMillisecond);

// One mask per byte of the reply (a decode step is one token, a few bytes):
// the mean over every point of the reply, structure and strings alike.
// First arg 0: the JSON schema; 1: a regex (its DFA) for a reply of the same
// shape; 2: a counted regex whose NFA would hold up to 80 states at once; 3: a
// GBNF grammar of any JSON object, for the schema's reply; 4: a schema whose
// string has a maxLength, along a 150-character story. Second arg 0: each
// reply a new grammar (compiled untimed: a request whose grammar no recent
// request had, its automaton built as it goes); 1: every reply the same
// grammar (a later request with a recent request's grammar: FromProto's cache
// hands it the automaton the earlier replies built).
void BM_MaskAlongAReply(benchmark::State& state) {
  const auto vocab = TokenVocabularyOf(SmolLm2());
  const auto compile = [&] {
    auto g = state.range(0) == 0   ? JsonGrammar::FromSchema(kSchema)
             : state.range(0) == 1 ? JsonGrammar::FromRegex(kRegex)
             : state.range(0) == 2 ? JsonGrammar::FromRegex(kCounted)
             : state.range(0) == 3 ? JsonGrammar::FromEbnf(kJsonGbnf)
                                   : JsonGrammar::FromSchema(kBounded);
    if (!g.ok()) std::abort();
    return *g;
  };
  const bool shared = state.range(1) == 1;
  std::shared_ptr<const JsonGrammar> g = compile();
  const std::string reply = state.range(0) == 2 ? std::string(70, 'a') + "x"
                            : state.range(0) == 4 ? kStory
                                                  : kReply;
  std::vector<uint8_t> allowed(vocab->size());
  for (auto _ : state) {
    if (!shared) {
      state.PauseTiming();
      g = compile();
      state.ResumeTiming();
    }
    GrammarMatcher m(g);
    for (char c : reply) {
      m.FillMask(*vocab, {2}, &allowed);
      m.Accept(std::string(1, c));
    }
  }
  state.counters["masks"] = benchmark::Counter(static_cast<double>(reply.size()) * state.iterations(),
                                               benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_MaskAlongAReply)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {0, 1}})
    ->ArgNames({"grammar", "shared"})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
