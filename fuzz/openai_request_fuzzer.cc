// The OpenAI HTTP API's request bodies on outside bytes: the first byte picks
// the route (chat, completions, tokenize, detokenize, responses), the rest is the body,
// parsed with a real tokenizer and a chat template that renders tools and
// tool calls. The same bytes are read as a model's reply for tool calls,
// whole (typed by a schema) and streamed. No
// input may throw (libFuzzer reports an uncaught exception as a crash),
// crash, overflow the stack or leak; an answer is an error, a reply, or a
// request.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "decode_worker/openai_request.h"
#include "decode_worker/tool_calls.h"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/" + path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

struct Fixture {
  std::unique_ptr<tandem::Tokenizer> tokenizer;
  std::unique_ptr<tandem::ChatTemplate> chat_template;
  tandem::OpenAiContext context;

  Fixture() {
    auto t = tandem::Tokenizer::FromHuggingFaceJson(ReadFile("tests/fixtures/tiny_qwen3/tokenizer.json"),
                                                    "tiny_qwen3");
    if (!t.ok()) __builtin_trap();
    tokenizer = std::move(*t);
    const auto templates = nlohmann::ordered_json::parse(ReadFile("tests/fixtures/chat_templates.json"));
    auto c = tandem::ChatTemplate::Create(templates["templates"]["qwen_style"], "qwen_style", "",
                                          "<|im_end|>");
    if (!c.ok()) __builtin_trap();
    chat_template = std::make_unique<tandem::ChatTemplate>(std::move(*c));
    context = {"tiny", 256, tokenizer.get(), chat_template.get()};
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Fixture fixture;
  if (size == 0) return 0;
  const auto route = static_cast<tandem::OpenAiRoute>(data[0] % 5);
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const tandem::OpenAiRequest r = tandem::ParseOpenAiRequest(route, body, fixture.context);
  const int answers = r.error.has_value() + r.reply.has_value();
  if (answers > 1) __builtin_trap();
  if (r.error.has_value() && (r.error->status < 400 || r.error->message.empty())) __builtin_trap();
  std::string rest;
  static const auto kProperties = nlohmann::ordered_json::parse(
      R"({"f": {"n": {"type": "integer"}, "x": {"type": "number"}, "b": {"type": "boolean"},
                "o": {"type": "object"}, "s": {"type": "string"}, "t": {"type": ["string", "null"]}}})");
  // The first byte's top bit reads the reply as tool_choice "required"'s list.
  const bool list = (data[0] & 0x80) != 0;
  const auto id = [] { return std::string("call_0"); };
  const nlohmann::ordered_json calls =
      list ? tandem::ParseToolCallList(body, id) : tandem::ParseToolCalls(body, &rest, id, kProperties);
  // The reply streamed in pieces of the first byte's size: what goes out and
  // what is held make the reply, nothing from a call's opening on goes out as
  // text, the calls' pieces come in order (a call's first names it), and
  // with the end's pieces every call of the whole reply's parse has gone
  // out whole under some index.
  tandem::ToolCallStream stream([] { return std::string("call_1"); }, kProperties, list);
  const size_t piece = 1 + data[0] % 13;
  std::string out;
  std::vector<tandem::ToolCallPiece> streamed;
  auto apply = [&streamed](const std::vector<tandem::ToolCallPiece>& pieces) {
    for (const tandem::ToolCallPiece& p : pieces) {
      if (!p.id.empty()) {
        if (p.index != streamed.size()) __builtin_trap();
        streamed.push_back(p);
      } else {
        if (p.index >= streamed.size()) __builtin_trap();
        streamed[p.index].arguments += p.arguments;
      }
    }
  };
  for (size_t at = 0; at < body.size(); at += piece) {
    tandem::ToolCallStream::Out o = stream.Add(body.substr(at, piece));
    out += o.content;
    apply(o.calls);
  }
  if (out != stream.released() || out + std::string(stream.held()) != body) __builtin_trap();
  if (list && !out.empty()) __builtin_trap();
  if (out.find("<tool_call>") != std::string::npos || out.find("<function=") != std::string::npos ||
      out.find("[TOOL_CALLS]") != std::string::npos) {
    __builtin_trap();
  }
  apply(stream.Finish(calls));
  for (const auto& call : calls) {
    const auto same = [&call](const tandem::ToolCallPiece& p) {
      return p.name == call["function"]["name"] && p.arguments == call["function"]["arguments"];
    };
    if (std::none_of(streamed.begin(), streamed.end(), same)) __builtin_trap();
  }
  return 0;
}
