// Chat templates on outside bytes: the input is parsed as a template and,
// when it parses, rendered with a small conversation and tight limits. A
// template may be refused or fail to render; it must never crash, hang or
// leak.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/chat/chat_template.h"
#include "common/chat/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto t = tandem::jinja::Template::Parse(source);
  if (!t.ok()) return 0;
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
           "arguments": {"x": 1}}}]}, {"role": "tool", "content": "1"}])");
  tandem::jinja::Value globals = tandem::jinja::Value::Dict();
  globals.dict().Set("messages", tandem::jinja::Value::FromJson(messages));
  globals.dict().Set("add_generation_prompt", tandem::jinja::Value::Bool(true));
  globals.dict().Set("bos_token", tandem::jinja::Value::String("<s>"));
  tandem::jinja::RenderLimits limits;
  limits.max_steps = 200000;
  limits.max_output_bytes = 1 << 20;
  (void)t->Render(globals, limits);
  return 0;
}
