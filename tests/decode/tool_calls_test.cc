// Tool calls found in generated replies, as the OpenAI API returns them.
#include "decode_worker/tool_calls.h"

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

}  // namespace
}  // namespace tandem
