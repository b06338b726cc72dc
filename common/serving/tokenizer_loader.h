// LoadTokenizer: the tokenizer that goes with a --model spec, from the same
// files: tokenizer.json in a Hugging Face directory, or the tokenizer.ggml.*
// vocabulary of a GGUF file. Synthetic models have none.
#ifndef TANDEM_COMMON_SERVING_TOKENIZER_LOADER_H_
#define TANDEM_COMMON_SERVING_TOKENIZER_LOADER_H_

#include <cstdint>
#include <memory>
#include <optional>
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

// The model's bos_token and eos_token as its tokenizer names them (a GGUF's
// tokenizer.ggml.bos/eos_token_id, a Hugging Face directory's
// tokenizer_config.json): "" where it names none. The eos token is the one
// whose stop is no stop_reason in the OpenAI API (vLLM's request eos).
struct ModelSpecialTokens {
  std::string bos, eos;
};
absl::StatusOr<ModelSpecialTokens> LoadSpecialTokens(const std::string& model_spec);

// The chat template that goes with a --model spec: the file `override_path`
// when given (vLLM's --chat-template), else the GGUF's
// tokenizer.chat_template, or a Hugging Face directory's chat_template.jinja
// or tokenizer_config.json "chat_template" (a list: the one named
// "default"). Null when the model has none. Its bos_token / eos_token are
// `special`, the model's (LoadSpecialTokens, read once by the caller).
// INVALID_ARGUMENT names the source, the line and the construct the
// interpreter cannot handle; a template that fails on a plain conversation
// for want of a feature is refused here, at start-up.
absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadChatTemplate(const std::string& model_spec,
                                                               const std::string& override_path,
                                                               const ModelSpecialTokens& special);

// The model creator's recommended sampling (vLLM's
// ModelConfig.get_diff_sampling_param): what the OpenAI API uses for a field
// a request leaves out, before its own defaults; max_tokens also caps what a
// request asks for (vLLM's get_max_tokens).
struct GenerationDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k, max_tokens;
  bool empty() const;
  // "temperature=0.6 top_p=0.9", or "none".
  std::string ToString() const;
};

// vLLM's --generation-config: "auto", the model's own (a Hugging Face
// directory's generation_config.json; a GGUF's general.sampling.* keys, which
// llama.cpp's converter writes from that file: temp, top_p, top_k, min_p,
// penalty_repeat), "vllm" (none: the API's neutral defaults), or a directory
// holding a generation_config.json. As vLLM reads it through transformers'
// to_diff_dict, a value equal to transformers' own default (temperature 1,
// top_p 1, top_k 50, repetition_penalty 1) is not a recommendation. A model
// without any: none. INVALID_ARGUMENT names the file, the key and the value
// out of range.
absl::StatusOr<GenerationDefaults> LoadGenerationDefaults(const std::string& model_spec,
                                                          const std::string& mode);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_TOKENIZER_LOADER_H_
