#include "common/serving/tokenizer_loader.h"

#include <chrono>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/model/gguf_weights.h"
#include "common/model/llama_model.h"
#include "common/serving/gguf_vocab.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec) {
  if (IsSyntheticSpec(spec)) return nullptr;
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Tokenizer> tok;
  if (IsGgufSpec(spec)) {
    ASSIGN_OR_RETURN(auto file, GgufFile::Open(spec));
    ASSIGN_OR_RETURN(GgufVocab vocab, ReadGgufVocab(*file));
    if (vocab.model.empty()) return nullptr;
    ASSIGN_OR_RETURN(tok, Tokenizer::FromGgufVocab(vocab, spec));
  } else {
    const std::string path = spec + "/tokenizer.json";
    std::ifstream in(path, std::ios::binary);
    if (!in) return nullptr;
    std::string text((std::istreambuf_iterator<char>(in)), {});
    ASSIGN_OR_RETURN(tok, Tokenizer::FromHuggingFaceJson(text, path));
  }
  TANDEM_LOG(INFO) << "tokenizer from " << tok->source() << ": " << tok->vocab_size()
                   << " tokens, loaded in "
                   << absl::StrFormat("%.2f", std::chrono::duration<double>(
                                                  std::chrono::steady_clock::now() - start)
                                                  .count())
                   << " s";
  return tok;
}

}  // namespace tandem
