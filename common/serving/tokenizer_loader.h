// LoadTokenizer: the tokenizer that goes with a --model spec, from the same
// files: tokenizer.json in a Hugging Face directory, or the tokenizer.ggml.*
// vocabulary of a GGUF file. Synthetic models have none.
#ifndef TANDEM_COMMON_SERVING_TOKENIZER_LOADER_H_
#define TANDEM_COMMON_SERVING_TOKENIZER_LOADER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "common/structured/json_grammar.h"
#include "common/serving/gguf_vocab.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// nullptr (and OK) when the model has no tokenizer: a synthetic preset, a
// directory without tokenizer.json, a GGUF without tokenizer.ggml.model.
// INVALID_ARGUMENT names the file and what the tokenizer does not implement.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_spec);

// Each token's bytes (special tokens never allowed), for structured outputs'
// masks (EngineConfig::vocabulary).
std::shared_ptr<const TokenVocabulary> TokenVocabularyOf(const Tokenizer& tokenizer);

// The chat template that goes with a --model spec: the file `override_path`
// when given (vLLM's --chat-template), else the GGUF's
// tokenizer.chat_template, or a Hugging Face directory's chat_template.jinja
// or tokenizer_config.json "chat_template" (a list: the one named
// "default"). Null when the model has none. bos_token / eos_token are the
// model's. INVALID_ARGUMENT names the source, the line and the construct
// the interpreter cannot handle; a template that fails on a plain
// conversation for want of a feature is refused here, at start-up.
absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadChatTemplate(const std::string& model_spec,
                                                               const std::string& override_path);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_TOKENIZER_LOADER_H_
