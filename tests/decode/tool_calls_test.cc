// Tool calls found in generated replies, as the OpenAI API returns them.
#include "decode_worker/tool_calls.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
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

// What a ToolCallStream lets out of `pieces` as content, piece by piece.
std::vector<std::string> Released(const std::vector<std::string>& pieces, ToolCallStream* s) {
  std::vector<std::string> out;
  for (const std::string& p : pieces) out.push_back(s->Add(p).content);
  return out;
}

TEST(ToolCallStreamTest, AnAnswerWithoutACallGoesOutAsItComes) {
  ToolCallStream s(Ids());
  EXPECT_EQ(Released({"Hello", " wor", "ld", "!"}, &s),
            (std::vector<std::string>{"Hello", " wor", "ld", "!"}));
  EXPECT_EQ(s.held(), "");
  ToolCallStream blanks(Ids());  // a blank end waits for what follows it
  EXPECT_EQ(Released({"Hi ", "there", "\n"}, &blanks),
            (std::vector<std::string>{"Hi", " there", ""}));
  EXPECT_EQ(blanks.held(), "\n");
  ToolCallStream angle(Ids());  // a '<' that begins no call goes out once that is clear
  EXPECT_EQ(Released({"x <", "= y", " if a<b"}, &angle),
            (std::vector<std::string>{"x", " <= y", " if a<b"}));
  ToolCallStream brace(Ids());  // braces inside a sentence are text
  EXPECT_EQ(Released({"Use {x}", "."}, &brace), (std::vector<std::string>{"Use {x}", "."}));
}

TEST(ToolCallStreamTest, FromWhereACallMayBeginTheRestIsHeld) {
  ToolCallStream s(Ids());
  EXPECT_EQ(Released({"Sure <tool", "_call>{\"name\": \"f\"}", "</tool_call> done"}, &s),
            (std::vector<std::string>{"Sure", "", ""}));
  EXPECT_EQ(s.released(), "Sure");
  EXPECT_EQ(s.held(), " <tool_call>{\"name\": \"f\"}</tool_call> done");
  ToolCallStream llama(Ids());  // a reply that begins with '{' may be one bare JSON call
  EXPECT_EQ(Released({" ", "{\"name\"", ": \"f\"}"}, &llama), (std::vector<std::string>{"", "", ""}));
  EXPECT_EQ(llama.held(), " {\"name\": \"f\"}");
}

// However the text is cut, what goes out and what is held make the text,
// nothing from a call's opening tag on goes out, and a text without one
// holds at most its blank or tag-like end.
TEST(ToolCallStreamTest, AnyCutGivesTheSameSplit) {
  std::mt19937 rng(5);
  for (const std::string& text :
       {std::string("The capital of France is Paris. <tool_call>{\"name\": \"f\"}</tool_call>"),
        std::string("No call here, just a < b and {braces}.  \n"),
        std::string("  {\"name\": \"search\", \"parameters\": {}}")}) {
    for (int trial = 0; trial < 50; ++trial) {
      ToolCallStream s(Ids());
      std::string out;
      for (size_t at = 0; at < text.size();) {
        const size_t n = std::min<size_t>(text.size() - at, 1 + rng() % 7);
        out += s.Add(text.substr(at, n)).content;
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
  const Json deltas = ToolCallPiecesJson(WholeCallPieces(calls));
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
  ToolCallStream s(Ids());
  EXPECT_EQ(Released({"Running it. <func", "tion=run>", "<parameter=cmd>ls"}, &s),
            (std::vector<std::string>{"Running it.", "", ""}));
  EXPECT_EQ(s.held(), " <function=run><parameter=cmd>ls");
}

// Llama 3.x writes several calls as bare JSON objects joined by ';' (vLLM's
// llama3_json parser splits them); a reply with other text after its JSON
// is an answer.
TEST(ToolCallsTest, LlamaCallsJoinedBySemicolons) {
  std::string rest;
  Json calls = ParseToolCalls(
      "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"arguments\": {}} ;", &rest, Ids());
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["function"]["name"], "a");
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"x\":1}");
  EXPECT_EQ(calls[1]["function"]["name"], "b");
  EXPECT_EQ(calls[1]["id"], "call_1");
  EXPECT_EQ(rest, "");
  for (const char* text : {"{\"name\": \"a\", \"parameters\": {}} and then some text",
                           "{\"name\": \"a\", \"parameters\": {}}; {\"answer\": 1}",
                           "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\""}) {
    EXPECT_TRUE(ParseToolCalls(text, &rest, Ids()).empty()) << text;
    EXPECT_EQ(rest, text);
  }
}

// Mistral writes its calls as a JSON list after its [TOOL_CALLS] token
// (left out of the text with the other special tokens); a list that is not
// all calls, or has text after it, is an answer.
TEST(ToolCallsTest, MistralListsOfCalls) {
  std::string rest;
  const Json calls = ParseToolCalls(
      " [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", "
      "\"arguments\": {}}]", &rest, Ids());
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(calls[1]["function"]["name"], "get_time");
  EXPECT_EQ(rest, "");
  for (const char* text : {"[1, 2]", "[]", "[{\"a\": 1}]", "[{\"name\": \"f\", \"arguments\": {}}, 3]",
                           "[{\"name\": \"f\", \"arguments\": {}}] and more", "[1] First point."}) {
    EXPECT_TRUE(ParseToolCalls(text, &rest, Ids()).empty()) << text;
    EXPECT_EQ(rest, text);
  }
  ToolCallStream cite(Ids());  // "[" that does not begin "[{" is text
  EXPECT_EQ(Released({" [", "1] First", " point."}, &cite), (std::vector<std::string>{"", " [1] First", " point."}));
  ToolCallStream list(Ids());
  EXPECT_EQ(Released({"[", " {\"name\""}, &list), (std::vector<std::string>{"", ""}));
}

// Mistral with its [TOOL_CALLS] token in the text: from tokenizer v11 on
// NAME[ARGS]{...} after each (a [CALL_ID] left out of the name; without
// [ARGS] the name ends at the '{', as vLLM reads it), before v11 a list;
// arguments without blanks, cut short ones as far as they came; the text
// before the calls, after an object and of a part that is no call is the rest.
TEST(ToolCallsTest, MistralCallsAfterTheirToken) {
  std::string rest;
  Json calls = ParseToolCalls(
      "Let me check.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris, FR\", \"days\": [1, 2]}"
      "[TOOL_CALLS]get_time[ARGS]{}", &rest, Ids());
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\":\"Paris, FR\",\"days\":[1,2]}");
  EXPECT_EQ(calls[1]["function"]["name"], "get_time");
  EXPECT_EQ(calls[1]["function"]["arguments"], "{}");
  EXPECT_EQ(calls[0]["id"], "call_0");
  EXPECT_EQ(rest, "Let me check.");
  calls = ParseToolCalls("[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{\"x\": 1} Done.", &rest, Ids());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "f");
  EXPECT_EQ(rest, " Done.");
  calls = ParseToolCalls("[TOOL_CALLS] f {\"x\": \"}\"}", &rest, Ids());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "f");
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"x\":\"}\"}");
  calls = ParseToolCalls("[TOOL_CALLS]f[ARGS]{\"x\": [1, 2", &rest, Ids());  // max_tokens cut it
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"x\":[1,2");
  calls = ParseToolCalls("[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": 1}}]", &rest, Ids());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"x\":1}");
  EXPECT_EQ(rest, "");
  calls = ParseToolCalls("[TOOL_CALLS]no call here[TOOL_CALLS]g[ARGS]{}", &rest, Ids());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "g");
  EXPECT_EQ(rest, "no call here");
  for (const char* text : {"[TOOL_CALLS] sorry", "[TOOL_CALLS][ARGS]{}", "[TOOL_CALLS] [1, 2]"}) {
    EXPECT_TRUE(ParseToolCalls(text, &rest, Ids()).empty()) << text;
    EXPECT_EQ(rest, text);
  }
}

// A JSON call's arguments are the model's own JSON text with the blanks
// between its tokens left out: numbers and escapes as written, so that the
// streamed arguments and the whole call's are the same bytes.
TEST(ToolCallsTest, JsonArgumentsAreTheModelsTextWithoutBlanks) {
  std::string rest;
  const Json calls = ParseToolCalls(
      "<tool_call>\n{\"arguments\": {\"n\": 1.50, \"s\": \"caf\\u00e9 \\\"a b\\\"\",\n"
      "  \"list\": [1, {\"k\": null}]}, \"name\": \"f\"}\n</tool_call>",
      &rest, Ids());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "f");
  EXPECT_EQ(calls[0]["function"]["arguments"],
            "{\"n\":1.50,\"s\":\"caf\\u00e9 \\\"a b\\\"\",\"list\":[1,{\"k\":null}]}");
}

TEST(JsonCallScannerTest, ReadsTheCallAsItArrives) {
  const std::string text = " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par} is\"}} tail";
  JsonCallScanner scanner;
  scanner.Scan(std::string_view(text).substr(0, 12));  // inside the name
  EXPECT_FALSE(scanner.name().has_value());
  scanner.Scan(std::string_view(text).substr(0, 42));
  ASSERT_TRUE(scanner.name().has_value());
  EXPECT_EQ(*scanner.name(), "get_weather");
  EXPECT_TRUE(scanner.has_arguments());
  EXPECT_EQ(scanner.arguments(), "{\"ci");
  EXPECT_FALSE(scanner.done());
  scanner.Scan(text);
  EXPECT_TRUE(scanner.done());
  EXPECT_FALSE(scanner.failed());
  EXPECT_EQ(scanner.arguments(), "{\"city\":\"Par} is\"}");
  EXPECT_EQ(text.substr(scanner.end()), " tail");
  for (const char* bad : {"[1]", "{\"a\" 1}", "{\"a\": 1 2}", "{\"a\": }", "x"}) {
    JsonCallScanner s;
    s.Scan(bad);
    EXPECT_TRUE(s.failed()) << bad;
  }
  JsonCallScanner primitive;  // values of every kind, arguments under "parameters"
  primitive.Scan("{\"n\": -1.5e3, \"t\": true, \"x\": [\"]\"], \"name\": \"f\", \"parameters\": {}}");
  EXPECT_TRUE(primitive.done());
  EXPECT_EQ(*primitive.name(), "f");
  EXPECT_EQ(primitive.arguments(), "{}");
}

std::string Trim(const std::string& s) { return std::string(absl::StripAsciiWhitespace(s)); }

// A streamed answer, cut into pieces: its content, and each call's pieces
// put together (a call's first piece carries its id and name).
struct Streamed {
  std::string content;
  std::vector<ToolCallPiece> calls;  // whole, by index
  size_t pieces_before_end = 0;      // call pieces that went out before the answer was whole
};

void Apply(const std::vector<ToolCallPiece>& pieces, Streamed* out) {
  for (const ToolCallPiece& p : pieces) {
    if (!p.id.empty()) {
      ASSERT_EQ(p.index, out->calls.size());
      out->calls.push_back(p);
      continue;
    }
    ASSERT_LT(p.index, out->calls.size());
    out->calls[p.index].arguments += p.arguments;
  }
}

Streamed Stream(const std::string& text, std::mt19937* rng, const Json& properties, bool list = false) {
  ToolCallStream s(Ids(), properties, list);
  Streamed out;
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min<size_t>(text.size() - at, 1 + (*rng)() % 9);
    ToolCallStream::Out o = s.Add(text.substr(at, n));
    at += n;
    out.content += o.content;
    out.pieces_before_end += o.calls.size();
    Apply(o.calls, &out);
  }
  std::string rest;
  Apply(s.Finish(list ? ParseToolCallList(text, Ids()) : ParseToolCalls(text, &rest, Ids(), properties)), &out);
  return out;
}

// However a reply of calls is cut, the calls go out as they are generated
// and, put together, are the whole reply's calls byte for byte.
TEST(ToolCallStreamTest, CallsStreamAsGeneratedAndMakeTheWholeCalls) {
  const Json properties = Json::parse(R"({"edit": {"line": {"type": "integer"}, "path": {"type": "string"}}})");
  std::mt19937 rng(11);
  for (const std::string& text : {
           std::string("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                       "{\"city\": \"Paris\", \"days\": [1, 2], \"note\": \"a \\\"quoted\\\" }\"}}\n</tool_call>\n"
                       "<tool_call>{\"arguments\": {}, \"name\": \"get_time\"}</tool_call>"),
           std::string("{\"name\": \"a\", \"parameters\": {\"q\": \"x y\"}}; {\"name\": \"b\", \"parameters\": "
                       "{\"n\": 2}}"),
           std::string(" [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris, ] FR\"}},\n"
                       "  {\"arguments\": {\"tz\": [1, 2]}, \"name\": \"get_time\"}]"),
           std::string("I'll edit it.\n<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a <b>.py\n"
                       "</parameter>\n<parameter=line>\n12\n</parameter>\n</function>\n</tool_call>"),
           std::string("Sure.\n<function=run>\n<parameter=cmd>\nls -l\n</parameter>\n</function>"),
           std::string("<tool_call><function=edit><parameter=line>3<parameter=path>x</function></tool_call>"),
           std::string("Let me check.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris, } FR\", \"days\": "
                       "[1, {\"a\": \"[TOOL\"}]}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{ }"),
           std::string("[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"),
           std::string("[TOOL_CALLS]f{\"x\": 1}\n[TOOL_CALLS]g[ARGS]{\"y\": [2"),
       }) {
    std::string rest;
    const Json whole = ParseToolCalls(text, &rest, Ids(), properties);
    ASSERT_FALSE(whole.empty()) << text;
    for (int trial = 0; trial < 40; ++trial) {
      const Streamed streamed = Stream(text, &rng, properties);
      ASSERT_EQ(streamed.calls.size(), whole.size()) << text;
      for (size_t i = 0; i < whole.size(); ++i) {
        EXPECT_EQ(streamed.calls[i].name, whole[i]["function"]["name"]) << text;
        EXPECT_EQ(streamed.calls[i].arguments, whole[i]["function"]["arguments"]) << text;
      }
      EXPECT_GT(streamed.pieces_before_end, 0u) << text;
      EXPECT_EQ(Trim(streamed.content), Trim(rest).substr(0, Trim(streamed.content).size())) << text;
    }
  }
}

// tool_choice "required": the reply is a list of calls (held to it by a
// schema); none of it is content, and its calls stream as the others do.
TEST(ToolCallStreamTest, ARequiredListOfCallsStreams) {
  const std::string text = "[{\"name\": \"a\", \"parameters\": {\"q\": \"x, ] y\"}},\n"
                           " {\"parameters\": {}, \"name\": \"b\"}]";
  const Json whole = ParseToolCallList(text, Ids());
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_EQ(whole[0]["function"]["arguments"], "{\"q\":\"x, ] y\"}");
  EXPECT_EQ(whole[1]["function"]["name"], "b");
  EXPECT_TRUE(ParseToolCallList("{\"name\": \"a\", \"parameters\": {}}", Ids()).empty());
  std::mt19937 rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    const Streamed streamed = Stream(text, &rng, nullptr, /*list=*/true);
    EXPECT_EQ(streamed.content, "");
    ASSERT_EQ(streamed.calls.size(), 2u);
    EXPECT_EQ(streamed.calls[0].arguments, whole[0]["function"]["arguments"]);
    EXPECT_EQ(streamed.calls[1].name, "b");
    EXPECT_EQ(streamed.calls[1].arguments, "{}");
    EXPECT_GT(streamed.pieces_before_end, 0u);
  }
}

TEST(ToolCallStreamTest, ACallGoesOutOnceItsNameAndArgumentsBegin) {
  ToolCallStream s(Ids());
  EXPECT_TRUE(s.Add("<tool_call>{\"name\": \"get_").calls.empty());
  EXPECT_TRUE(s.Add("weather\", ").calls.empty());  // a JSON answer may have a "name" too
  ToolCallStream::Out out = s.Add("\"arguments\": {\"ci");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].index, 0u);
  EXPECT_EQ(out.calls[0].id, "call_0");
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, "{\"ci");
  out = s.Add("ty\": \"Paris\"}}</tool_call>");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].id, "");
  EXPECT_EQ(out.calls[0].arguments, "ty\":\"Paris\"}");
  EXPECT_EQ(ToolCallPiecesJson(out.calls)[0].dump(),
            "{\"index\":0,\"function\":{\"arguments\":\"ty\\\":\\\"Paris\\\"}\"}}");
  // An XML call goes out with its name, then a parameter at a time.
  ToolCallStream xml(Ids());
  out = xml.Add("<function=run>\n<parameter=cmd>\nls");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "run");
  EXPECT_EQ(out.calls[0].arguments, "");
  out = xml.Add("\n</parameter>\n");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, "{\"cmd\":\"ls\"");
  EXPECT_EQ(xml.Add("</function>").calls[0].arguments, "}");
}

// A reply that began as a call and was not the call the whole reply's parse
// finds there: what went out stands, and the whole reply's call goes out
// whole under a new index, so none is lost.
TEST(ToolCallStreamTest, ACallThatWasNotWhatItBeganAsGoesOutAgainWhole) {
  ToolCallStream s(Ids());
  const std::string text = "<function=a><parameter=x>1</parameter></function>"
                           "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
  s.Add(text);
  ASSERT_EQ(s.begun().size(), 2u);
  std::string rest;
  const Json calls = ParseToolCalls(text, &rest, Ids());
  ASSERT_EQ(calls.size(), 1u);  // with a block, the calls are in blocks only
  const std::vector<ToolCallPiece> pieces = s.Finish(calls);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].index, 2u);
  EXPECT_EQ(pieces[0].name, "b");
  EXPECT_EQ(pieces[0].arguments, "{}");
}

}  // namespace
}  // namespace tandem
