// ChatTemplate: a model's chat template (Jinja2 source from the GGUF's
// tokenizer.chat_template, Hugging Face's tokenizer_config.json or
// chat_template.jinja, or a file the operator names), rendered as
// transformers' apply_chat_template renders it: `messages`, `tools` (None
// when absent), `documents` (None), `add_generation_prompt`, `bos_token`,
// `eos_token`, and the request's chat_template_kwargs on top.
//
// Immutable after Create(): Render() may run on several threads at once.
#ifndef TANDEM_COMMON_CHAT_CHAT_TEMPLATE_H_
#define TANDEM_COMMON_CHAT_CHAT_TEMPLATE_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/chat/jinja.h"
#include "nlohmann/json.hpp"

namespace tandem {

class ChatTemplate {
 public:
  // INVALID_ARGUMENT names `origin` (where the source came from), the line
  // and the construct the interpreter does not support.
  static absl::StatusOr<ChatTemplate> Create(std::string source, std::string origin,
                                             std::string bos_token, std::string eos_token);

  // The prompt for `messages` (a JSON array of {"role", "content", ...});
  // `tools` is null or an array; `kwargs` null or an object. INVALID_ARGUMENT
  // for messages the template refuses (raise_exception) or cannot render
  // (an undefined value used); UNIMPLEMENTED for a construct met only now.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                     bool add_generation_prompt,
                                     const nlohmann::ordered_json& kwargs = nullptr) const;

  const std::string& origin() const { return origin_; }
  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

 private:
  ChatTemplate(jinja::Template t, std::string source, std::string origin, std::string bos,
               std::string eos)
      : template_(std::move(t)),
        source_(std::move(source)),
        origin_(std::move(origin)),
        bos_(std::move(bos)),
        eos_(std::move(eos)) {}

  jinja::Template template_;
  std::string source_, origin_, bos_, eos_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_CHAT_CHAT_TEMPLATE_H_
