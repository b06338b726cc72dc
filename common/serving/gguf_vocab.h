// ReadGgufVocab: the tokenizer.ggml.* fields of a GGUF file as a GgufVocab,
// with llama.cpp's defaults where a key is absent.
#ifndef TANDEM_COMMON_SERVING_GGUF_VOCAB_H_
#define TANDEM_COMMON_SERVING_GGUF_VOCAB_H_

#include "absl/status/statusor.h"
#include "common/model/gguf.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// Model "" when the file has no tokenizer. INVALID_ARGUMENT names the file
// and a key of the wrong type.
absl::StatusOr<GgufVocab> ReadGgufVocab(const GgufFile& file);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_GGUF_VOCAB_H_
