// Tool calls found in generated replies, as the OpenAI API returns them.
#include "decode_worker/tool_calls.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

std::function<std::string()> Ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_" + std::to_string((*n)++); };
}

TEST(ToolCallsTest, HermesBlocksBecomeCallsWithJsonStringArguments) {
  std::string rest;
  const Json calls = ParseToolCalls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>",
      &rest, Ids());
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["id"], "call_0");
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(calls[1]["function"]["name"], "get_time");
  EXPECT_EQ(calls[1]["function"]["arguments"], "{}");
  EXPECT_EQ(rest, "Let me check.\n\n");
}

TEST(ToolCallsTest, ABareJsonCallIsLlamaStyle) {
  std::string rest;
  const Json calls =
      ParseToolCalls(" {\"name\": \"search\", \"parameters\": {\"q\": \"tandem\"}}", &rest, Ids());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "search");
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"q\":\"tandem\"}");
  EXPECT_EQ(rest, "");
}

TEST(ToolCallsTest, TextThatIsNotACallStaysText) {
  for (const char* text : {"Paris is the capital.", "<tool_call>not json</tool_call>",
                           "{\"answer\": 42}", "<tool_call>{\"arguments\": {}}</tool_call>"}) {
    std::string rest;
    EXPECT_TRUE(ParseToolCalls(text, &rest, Ids()).empty()) << text;
    EXPECT_EQ(rest, text);
  }
}

// What a ToolCallStream lets out of `pieces`, piece by piece.
std::vector<std::string> Released(const std::vector<std::string>& pieces, ToolCallStream* s) {
  std::vector<std::string> out;
  for (const std::string& p : pieces) out.push_back(s->Add(p));
  return out;
}

TEST(ToolCallStreamTest, AnAnswerWithoutACallGoesOutAsItComes) {
  ToolCallStream s;
  EXPECT_EQ(Released({"Hello", " wor", "ld", "!"}, &s),
            (std::vector<std::string>{"Hello", " wor", "ld", "!"}));
  EXPECT_EQ(s.held(), "");
  ToolCallStream blanks;  // a blank end waits for what follows it
  EXPECT_EQ(Released({"Hi ", "there", "\n"}, &blanks),
            (std::vector<std::string>{"Hi", " there", ""}));
  EXPECT_EQ(blanks.held(), "\n");
  ToolCallStream angle;  // a '<' that begins no call goes out once that is clear
  EXPECT_EQ(Released({"x <", "= y", " if a<b"}, &angle),
            (std::vector<std::string>{"x", " <= y", " if a<b"}));
  ToolCallStream brace;  // braces inside a sentence are text
  EXPECT_EQ(Released({"Use {x}", "."}, &brace), (std::vector<std::string>{"Use {x}", "."}));
}

TEST(ToolCallStreamTest, FromWhereACallMayBeginTheRestIsHeld) {
  ToolCallStream s;
  EXPECT_EQ(Released({"Sure <tool", "_call>{\"name\": \"f\"}", "</tool_call> done"}, &s),
            (std::vector<std::string>{"Sure", "", ""}));
  EXPECT_EQ(s.released(), "Sure");
  EXPECT_EQ(s.held(), " <tool_call>{\"name\": \"f\"}</tool_call> done");
  ToolCallStream llama;  // a reply that begins with '{' may be one bare JSON call
  EXPECT_EQ(Released({" ", "{\"name\"", ": \"f\"}"}, &llama), (std::vector<std::string>{"", "", ""}));
  EXPECT_EQ(llama.held(), " {\"name\": \"f\"}");
}

// However the text is cut, what goes out and what is held make the text,
// nothing from a call's opening tag on goes out, and a text without one
// holds at most its blank or tag-like end.
TEST(ToolCallStreamTest, AnyCutGivesTheSameSplit) {
  std::mt19937 rng(5);
  for (const std::string text :
       {std::string("The capital of France is Paris. <tool_call>{\"name\": \"f\"}</tool_call>"),
        std::string("No call here, just a < b and {braces}.  \n"),
        std::string("  {\"name\": \"search\", \"parameters\": {}}")}) {
    for (int trial = 0; trial < 50; ++trial) {
      ToolCallStream s;
      std::string out;
      for (size_t at = 0; at < text.size();) {
        const size_t n = std::min<size_t>(text.size() - at, 1 + rng() % 7);
        out += s.Add(text.substr(at, n));
        at += n;
      }
      ASSERT_EQ(out, s.released());
      ASSERT_EQ(out + std::string(s.held()), text);
      EXPECT_EQ(out.find("<tool_call>"), std::string::npos);
      if (text.find("<tool_call>") == std::string::npos && text.find_first_not_of(" ") != text.find('{')) {
        EXPECT_EQ(std::string(s.held()).find_first_not_of(" \n"), std::string::npos) << s.held();
      }
    }
  }
}

TEST(ToolCallsTest, DeltasCarryTheirIndexFirst) {
  std::string rest;
  const Json calls = ParseToolCalls(
      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"
      "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>", &rest, Ids());
  const Json deltas = ToolCallDeltas(calls);
  ASSERT_EQ(deltas.size(), 2u);
  EXPECT_EQ(deltas[1].begin().key(), "index");
  EXPECT_EQ(deltas[1]["index"], 1);
  EXPECT_EQ(deltas[1]["id"], calls[1]["id"]);
  EXPECT_EQ(deltas[1]["function"], calls[1]["function"]);
}

// Qwen3-Coder's XML calls (vLLM's qwen3_coder parser): each parameter's text
// (less the newline after its tag and before its end) typed by the tool's
// schema; undeclared parameters and string types stay text, "null" is null.
TEST(ToolCallsTest, Qwen3CoderXmlCallsAreTypedByTheSchema) {
  const Json properties = Json::parse(R"({"edit": {
      "path": {"type": "string"}, "line": {"type": "integer"}, "ratio": {"type": "number"},
      "whole": {"type": "number"}, "dry_run": {"type": "boolean"}, "opts": {"type": "object"},
      "tags": {"type": "array"}, "note": {"type": "string"}, "count": {"type": "integer"}}})");
  std::string rest;
  const Json calls = ParseToolCalls(
      "I'll edit it.\n<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
      "<parameter=line>\n12\n</parameter>\n<parameter=ratio>\n2.5\n</parameter>\n"
      "<parameter=whole>\n4.0\n</parameter>\n<parameter=dry_run>\nTrue\n</parameter>\n"
      "<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\nnot json\n</parameter>\n"
      "<parameter=note>\nNULL\n</parameter>\n<parameter=count>\nmany\n</parameter>\n"
      "<parameter=code>\ndef f():\n    return 1\n</parameter>\n</function>\n</tool_call>",
      &rest, Ids(), properties);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "edit");
  EXPECT_EQ(Json::parse(calls[0]["function"]["arguments"].get<std::string>()),
            Json::parse(R"({"path": "src/a.py", "line": 12, "ratio": 2.5, "whole": 4,
                            "dry_run": true, "opts": {"a": [1, 2]}, "tags": "not json",
                            "note": null, "count": "many", "code": "def f():\n    return 1"})"));
  EXPECT_EQ(rest, "I'll edit it.\n");
}

TEST(ToolCallsTest, Qwen3CoderCallsWithoutTheirBlockOrLeftOpen) {
  std::string rest;
  Json calls = ParseToolCalls("Sure.\n<function=run>\n<parameter=cmd>\nls -l\n</parameter>\n</function>",
                              &rest, Ids());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"cmd\":\"ls -l\"}");
  EXPECT_EQ(rest, "Sure.\n");
  // Cut by max_tokens: the open parameter and function end with the text;
  // two functions in one block are two calls.
  calls = ParseToolCalls("<tool_call><function=a><parameter=x>1</parameter></function>"
                         "<function=b><parameter=y>\npartial", &rest, Ids());
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1]["function"]["name"], "b");
  EXPECT_EQ(calls[1]["function"]["arguments"], "{\"y\":\"partial\"}");
  // A value's bytes that are not UTF-8 (a reply cut inside a character)
  // become U+FFFD in the arguments' JSON, as the text elsewhere.
  calls = ParseToolCalls("<function=f><parameter=p>caf\xC3</parameter></function>", &rest, Ids());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"p\":\"caf\xEF\xBF\xBD\"}");
  for (const std::string text : {"<tool_call><function=broken</tool_call>",
                                 "<tool_call><function=f><parameter=x</function></tool_call>",
                                 "<tool_call>no function here</tool_call>"}) {
    EXPECT_TRUE(ParseToolCalls(text, &rest, Ids()).empty()) << text;
    EXPECT_EQ(rest, text);
  }
}

TEST(ToolCallStreamTest, AQwen3CoderFunctionIsHeldToo) {
  ToolCallStream s;
  EXPECT_EQ(Released({"Running it. <func", "tion=run>", "<parameter=cmd>ls"}, &s),
            (std::vector<std::string>{"Running it.", "", ""}));
  EXPECT_EQ(s.held(), " <function=run><parameter=cmd>ls");
}

}  // namespace
}  // namespace tandem
