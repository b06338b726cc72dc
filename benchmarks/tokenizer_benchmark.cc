// Encoding 1 MiB of English text on one thread, with SmolLM2's tokenizer
// (from its GGUF; TANDEM_SMOLLM2_GGUF or the fetch script's cache), and
// incremental detokenization of the result.
//
//   build/bin/tokenizer_benchmark --benchmark_repetitions=3
#include <cstdlib>
#include <random>
#include <string>

#include "benchmark/benchmark.h"
#include "common/serving/tokenizer_loader.h"
#include "common/tokenizer/detokenizer.h"

namespace tandem {
namespace {

// Deterministic English-like prose: sentences of common words, punctuation,
// numbers and paragraph breaks.
std::string EnglishText(size_t bytes) {
  static const char* kWords[] = {
      "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on",
      "are", "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one",
      "had", "by", "word", "but", "not", "what", "all", "were", "we", "when", "your", "can",
      "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if",
      "will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some",
      "her", "would", "make", "like", "him", "into", "time", "has", "look", "two", "more",
      "write", "go", "see", "number", "no", "way", "could", "people", "my", "than", "first",
      "water", "been", "call", "who", "oil", "its", "now", "find", "long", "down", "day",
      "did", "get", "come", "made", "may", "part", "serving", "language", "model", "memory",
      "bandwidth", "throughput", "latency", "request", "tokens", "cache", "prefill", "decode"};
  std::mt19937 rng(42);
  std::string text;
  while (text.size() < bytes) {
    const int n = 5 + rng() % 20;
    for (int i = 0; i < n; ++i) {
      std::string w = kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
      if (i == 0) w[0] = static_cast<char>(std::toupper(w[0]));
      text += w;
      if (rng() % 50 == 0) text += " " + std::to_string(rng() % 10000);
      text += i + 1 < n ? (rng() % 12 == 0 ? ", " : " ") : (rng() % 6 == 0 ? "?\n\n" : ". ");
    }
  }
  text.resize(bytes);
  return text;
}

const Tokenizer& SmolLm2() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    const char* env = std::getenv("TANDEM_SMOLLM2_GGUF");
    auto t = LoadTokenizer(env != nullptr ? env : TANDEM_SMOLLM2_GGUF);
    if (!t.ok() || *t == nullptr) {
      std::fprintf(stderr, "no SmolLM2 tokenizer (run scripts/fetch_model.sh)\n");
      std::exit(1);
    }
    return std::move(*t);
  }();
  return *tok;
}

void BM_Encode1MiBEnglish(benchmark::State& state) {
  const std::string text = EnglishText(1 << 20);
  const Tokenizer& tok = SmolLm2();
  size_t tokens = 0;
  for (auto _ : state) {
    std::vector<int32_t> ids = tok.Encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids);
  }
  state.SetBytesProcessed(state.iterations() * text.size());
  state.counters["tokens"] = static_cast<double>(tokens);
}
BENCHMARK(BM_Encode1MiBEnglish)->Unit(benchmark::kMillisecond);

void BM_IncrementalDetokenize(benchmark::State& state) {
  const Tokenizer& tok = SmolLm2();
  const std::vector<int32_t> ids = tok.Encode(EnglishText(16 << 10));
  for (auto _ : state) {
    IncrementalDetokenizer d(&tok, true);
    size_t n = 0;
    for (int32_t id : ids) n += d.Add({id}).size();
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(state.iterations() * ids.size());
}
BENCHMARK(BM_IncrementalDetokenize)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
