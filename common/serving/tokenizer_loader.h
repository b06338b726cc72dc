// LoadTokenizer: the tokenizer that goes with a --model spec, from the same
// files: tokenizer.json in a Hugging Face directory, or the tokenizer.ggml.*
// vocabulary of a GGUF file. Synthetic models have none.
#ifndef TANDEM_COMMON_SERVING_TOKENIZER_LOADER_H_
#define TANDEM_COMMON_SERVING_TOKENIZER_LOADER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/serving/gguf_vocab.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// nullptr (and OK) when the model has no tokenizer: a synthetic preset, a
// directory without tokenizer.json, a GGUF without tokenizer.ggml.model.
// INVALID_ARGUMENT names the file and what the tokenizer does not implement.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_spec);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_TOKENIZER_LOADER_H_
