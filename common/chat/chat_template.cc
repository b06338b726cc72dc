#include "common/chat/chat_template.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<ChatTemplate> ChatTemplate::Create(std::string source, std::string origin,
                                                  std::string bos_token, std::string eos_token) {
  // transformers' environment: trim_blocks and lstrip_blocks on.
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(source);
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", t.status().message()));
  }
  return ChatTemplate(*std::move(t), std::move(source), std::move(origin), std::move(bos_token),
                      std::move(eos_token));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                                 const nlohmann::ordered_json& tools,
                                                 bool add_generation_prompt,
                                                 const nlohmann::ordered_json& kwargs) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be an array");
  jinja::Value globals = jinja::Value::Dict();
  jinja::ValueDict& g = globals.dict();
  g.Set("messages", jinja::Value::FromJson(messages));
  g.Set("tools", tools.is_array() ? jinja::Value::FromJson(tools) : jinja::Value::None());
  g.Set("documents", jinja::Value::None());
  g.Set("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
  g.Set("bos_token", jinja::Value::String(bos_));
  g.Set("eos_token", jinja::Value::String(eos_));
  if (kwargs.is_object()) {
    for (const auto& [k, v] : kwargs.items()) g.Set(k, jinja::Value::FromJson(v));
  }
  return template_.Render(globals);
}

}  // namespace tandem
