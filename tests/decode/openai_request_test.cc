// OpenAI request bodies as clients (and anyone else) send them: each
// malformed one is a 400 naming the field, never an exception (one used to
// end the decode worker), and well-formed ones become the GenerateRequest
// they ask for. The tokenizer and chat template are real fixtures.
#include "decode_worker/openai_request.h"

#include "common/serving/sampling_proto.h"
#include "common/structured/json_grammar.h"

#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/" + path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class OpenAiRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = Tokenizer::FromHuggingFaceJson(ReadFile("tests/fixtures/tiny_qwen3/tokenizer.json"),
                                                    "tiny_qwen3");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
    // A Qwen-style template that renders tools and tool calls.
    const Json fixture = Json::parse(ReadFile("tests/fixtures/chat_templates.json"));
    auto tmpl = ChatTemplate::Create(fixture["templates"]["qwen_style"], "qwen_style", "", "<|im_end|>");
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    template_.emplace(*std::move(tmpl));
    context_ = {"tiny", 256, tokenizer_.get(), &*template_};
  }

  OpenAiRequest Parse(OpenAiRoute route, const std::string& body) {
    return ParseOpenAiRequest(route, body, context_);
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> template_;
  OpenAiContext context_;
};

std::string Nested(int depth, const std::string& inner = "1") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

TEST_F(OpenAiRequestTest, MalformedBodiesAreRefusedNamingTheField) {
  const std::string user = R"("messages": [{"role": "user", "content": "hi"}])";
  struct Case {
    OpenAiRoute route;
    std::string body;
    std::string param;
    std::string message;  // a part of it
  };
  const OpenAiRoute chat = OpenAiRoute::kChatCompletions, comp = OpenAiRoute::kCompletions;
  const Case cases[] = {
      // Each of these threw out of the handler (nlohmann's type_error), which
      // ended the process.
      {chat, "{" + user + R"(, "response_format": 5})", "response_format", "response_format must be an object with a type, got 5"},
      {chat, "{" + user + R"(, "response_format": {"type": 5}})", "response_format", "must be an object with a type"},
      {chat, "{" + user + R"(, "response_format": {"type": "xml"}})", "response_format", "\"xml\" is not supported"},
      {chat, "{" + user + R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})", "response_format", "response_format.json_schema.schema must be an object"},
      {chat, "{" + user + R"(, "structured_outputs": {"whitespace_pattern": " "}})", "structured_outputs", "structured_outputs.whitespace_pattern is not supported"},
      {chat, "{" + user + R"(, "structured_outputs": {"grammar": ""}})", "structured_outputs", "the grammar must be a non-empty string"},
      {chat, "{" + user + R"(, "guided_regex": 5})", "guided_regex", "the regex must be a string"},
      {chat, "{" + user + R"(, "guided_choice": [], "max_tokens": 3})", "guided_choice", "choice must be a non-empty list"},
      {chat, "{" + user + R"(, "guided_json": "{not json"})", "guided_json", "the JSON schema must be an object"},
      {chat, "{" + user + R"(, "guided_json": {}, "response_format": {"type": "json_object"}})", "guided_json", "give one structured output, not 2 (response_format, guided_json)"},
      {chat, "{" + user + R"(, "guided_grammar": 5})", "guided_grammar", "the grammar must be a non-empty string"},
      {chat, "{" + user + R"(, "guided_grammar": "root ::= \"a\"", "guided_regex": "a"})", "guided_grammar", "give one structured output, not 2 (guided_regex, guided_grammar)"},
      {chat, R"({"messages": [{"role": "user", "content": [{"type": 5, "text": "x"}]}]})", "messages", "messages[0].content: only text parts"},
      // Token ids wrapped into int32 (4294967297 became 1).
      {comp, R"({"prompt": [1, 4294967297]})", "prompt", "prompt[1] must be a token id (an integer in [0, 2147483647]), got 4294967297"},
      {comp, R"({"prompt": [3, -1]})", "prompt", "prompt[1] must be a token id"},
      {comp, R"({"prompt": [3], "stop_token_ids": [18446744073709551615]})", "stop_token_ids", "stop_token_ids[0] must be a token id"},
      {OpenAiRoute::kDetokenize, R"({"tokens": [1, -2]})", "tokens", "tokens[1] must be a token id"},
      {OpenAiRoute::kDetokenize, R"({"tokens": "1"})", "tokens", "tokens must be a list of token ids"},
      {OpenAiRoute::kDetokenize, R"({})", "tokens", "tokens must be a list of token ids"},
      // An unsigned integer past int64 named as sent, not wrapped negative.
      {comp, R"({"prompt": "x", "max_tokens": 18446744073709551615})", "max_tokens", "max_tokens must be in [1, 256], got 18446744073709551615"},
      {comp, R"({"prompt": "x", "seed": 9223372036854775808})", "seed", "got 9223372036854775808"},
      {comp, R"({"prompt": "x", "priority": 2147483648})", "priority", "priority must be in [-2147483648, 2147483647], got 2147483648"},
      {chat, "{" + user + R"(, "priority": "high"})", "priority", "priority must be an integer"},
      {chat, "{" + user + R"(, "cache_salt": ""})", "cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided."},
      {comp, R"({"prompt": "x", "cache_salt": 7})", "cache_salt", "must be a non-empty string"},
      {comp, R"({"prompt": "x", "truncate_prompt_tokens": 257})", "truncate_prompt_tokens", "truncate_prompt_tokens must be in [-1, 256], got 257"},
      {comp, R"({"prompt": "x", "truncate_prompt_tokens": 0})", "truncate_prompt_tokens", "must be -1 or in [1, max_model_len], got 0"},
      {comp, R"({"prompt": "x", "prompt_logprobs": -1})", "prompt_logprobs", "prompt_logprobs must be in [0, 20], got -1"},
      {chat, "{" + user + R"(, "prompt_logprobs": 1, "stream": true})", "prompt_logprobs", "not available with stream=true"},
      // Tools the template would have been handed as they came.
      {chat, "{" + user + R"(, "tools": 5})", "tools", "tools must be a list"},
      {chat, "{" + user + R"(, "tools": [5]})", "tools", "tools[0] must be an object"},
      {chat, "{" + user + R"(, "tools": [{"type": "function", "function": 5}]})", "tools", "tools[0].function must be an object"},
      {chat, "{" + user + R"(, "tools": [{"function": {"name": 7}}]})", "tools", "tools[0].function.name must be a string"},
      {chat, "{" + user + R"(, "tools": [{"type": "retrieval", "function": {"name": "f"}}]})", "tools", "tools[0].type must be \"function\""},
      {chat, "{" + user + R"(, "tools": [{"function": {"name": "f", "parameters": []}}]})", "tools", "tools[0].function.parameters must be an object"},
      {chat, "{" + user + R"(, "tool_choice": "required"})", "tool_choice", "tool_choice=\"required\" needs tools"},
      {chat, "{" + user + R"(, "tools": [{"function": {"name": "g"}}], "tool_choice": {"type": "function", "function": {"name": "f"}}})", "tool_choice", "tool_choice names the function `f`, which is not among the tools"},
      {chat, "{" + user + R"(, "tools": [{"function": {"name": "g"}}], "tool_choice": "any"})", "tool_choice", "tool_choice must be \"auto\""},
      {chat, "{" + user + R"(, "tools": [{"function": {"name": "g"}}], "tool_choice": "required", "response_format": {"type": "json_object"}})", "tool_choice", "a structured output of its own"},
      {chat, R"({"messages": 5})", "messages", "messages must be a non-empty list"},
      {chat, R"({"messages": [5]})", "messages", "messages[0] must be an object with a role"},
      {chat, R"({"messages": [{"role": 5}]})", "messages", "messages[0] must be an object with a role"},
      {chat, "{" + user + R"(, "stream_options": 5})", "stream_options", "stream_options must be an object"},
      {chat, "{" + user + R"(, "logit_bias": [1]})", "logit_bias", "logit_bias must be an object"},
      {chat, "{" + user + R"(, "stop": [1]})", "stop", "stop must be a string or a list of strings"},
      {chat, "{" + user + R"(, "return_token_ids": 1})", "return_token_ids", "return_token_ids must be true or false"},
      {comp, R"({"prompt": "x", "echo": "yes"})", "echo", "echo must be true or false"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    OpenAiRequest r;
    ASSERT_NO_THROW(r = Parse(c.route, c.body));
    ASSERT_TRUE(r.error.has_value());
    EXPECT_EQ(r.error->status, 400);
    EXPECT_EQ(r.error->param, c.param);
    EXPECT_NE(r.error->message.find(c.message), std::string::npos) << r.error->message;
  }
}

TEST_F(OpenAiRequestTest, DeepNestingIsRefusedAsItIsParsed) {
  // 200,000 levels anywhere in a body: copies and dump() of such a value
  // recursed off the end of the stack.
  const std::string deep = Nested(200000);
  for (const std::string& body :
       {R"({"messages": )" + deep + "}", R"({"model": )" + deep + "}",
        R"({"prompt": "x", "temperature": )" + deep + "}", deep}) {
    OpenAiRequest r;
    ASSERT_NO_THROW(r = Parse(OpenAiRoute::kChatCompletions, body));
    ASSERT_TRUE(r.error.has_value());
    EXPECT_EQ(r.error->status, 400);
    EXPECT_NE(r.error->message.find("nest more than 128 deep"), std::string::npos) << r.error->message;
  }
  // The limit itself: 128 levels parse, 129 do not.
  EXPECT_FALSE(ParseJsonBounded(Nested(kMaxJsonDepth)).is_discarded());
  EXPECT_TRUE(ParseJsonBounded(Nested(kMaxJsonDepth + 1)).is_discarded());
  EXPECT_TRUE(ParseJsonBounded("{\"a\": " + Nested(kMaxJsonDepth) + "}").is_discarded());
  // Tool call arguments sent as a deep JSON string stay a string.
  const Json body = {{"messages", {{{"role", "user"}, {"content", "hi"}},
                                   {{"role", "assistant"},
                                    {"content", ""},
                                    {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", deep}}}}}}}}}};
  OpenAiRequest r;
  context_.max_model_len = 1 << 20;  // the prompt is long: a parse, not a fit, is tested here
  ASSERT_NO_THROW(r = Parse(OpenAiRoute::kChatCompletions, body.dump()));
  EXPECT_FALSE(r.error.has_value()) << r.error->message;
}

TEST_F(OpenAiRequestTest, AChatRequestBecomesItsGenerateRequest) {
  context_.max_model_len = 4096;  // tools and all, the prompt is longer than the fixture's 256
  const std::string body = R"({
    "model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "seed": 11,
    "stop": ["x"], "stop_token_ids": [2], "min_p": 0.1, "logit_bias": {"5": 300},
    "logprobs": true, "top_logprobs": 2, "stream": true, "stream_options": {"include_usage": true},
    "response_format": {"type": "text"}, "return_token_ids": true, "priority": -5,
    "cache_salt": "tenant-7",     "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
                 "type": "object", "properties": {"city": {"type": "string"}}}}},
              {"type": "function", "function": {"name": "get_time"}}]
  })";
  const OpenAiRequest r = Parse(OpenAiRoute::kChatCompletions, body);
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  ASSERT_FALSE(r.reply.has_value());
  ASSERT_EQ(r.choices.size(), 1u);
  const v1::GenerateRequest& g = r.choices[0].generate;
  const v1::SamplingParams& s = g.sampling();
  EXPECT_EQ(s.max_tokens(), 7u);
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.top_k(), 3);
  EXPECT_EQ(s.seed().value(), 11u);
  EXPECT_EQ(g.priority(), -5);  // vLLM's, checked by the engine against its policy
  EXPECT_EQ(g.cache_salt(), "tenant-7");
  ASSERT_EQ(s.stop_size(), 1);
  EXPECT_EQ(s.stop(0), "x");
  ASSERT_EQ(s.stop_token_ids_size(), 1);
  EXPECT_EQ(s.stop_token_ids(0), 2);
  EXPECT_FLOAT_EQ(s.min_p(), 0.1f);
  EXPECT_FLOAT_EQ(s.logit_bias().at(5), 100.f);  // clamped
  EXPECT_EQ(s.logprobs().value(), 2);
  EXPECT_TRUE(r.spec.chat && r.spec.stream && r.spec.include_usage && r.spec.tools &&
              r.spec.return_token_ids && r.spec.logprobs);
  // Each tool's parameters' properties by name (Qwen3-Coder's calls are typed by them).
  EXPECT_EQ(r.spec.tool_properties,
            Json::parse(R"({"get_weather": {"city": {"type": "string"}}, "get_time": {}})"));
  // The prompt is the template's text over the tools and the message, tokenized.
  std::vector<int32_t> ids(g.prompt_token_ids().begin(), g.prompt_token_ids().end());
  const std::string prompt = tokenizer_->Decode(ids);
  EXPECT_NE(prompt.find("get_weather"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<|im_start|>user\nhi<|im_end|>"), std::string::npos) << prompt;
  EXPECT_TRUE(g.prompt().empty());

  // tool_choice "none": the template sees no tools and the reply is text.
  Json none = Json::parse(body);
  none["tool_choice"] = "none";
  const OpenAiRequest n = Parse(OpenAiRoute::kChatCompletions, none.dump());
  ASSERT_FALSE(n.error.has_value()) << n.error->message;
  EXPECT_FALSE(n.spec.tools);
  ASSERT_EQ(n.choices.size(), 1u);
  ids.assign(n.choices[0].generate.prompt_token_ids().begin(), n.choices[0].generate.prompt_token_ids().end());
  EXPECT_EQ(tokenizer_->Decode(ids).find("get_weather"), std::string::npos);
}

// Mistral's calls open with its special [TOOL_CALLS] token: with tools
// offered to a model whose vocabulary has it, the reply keeps special
// tokens' text (vLLM's mistral parser), unless the call is forced (a
// structured output of its own) or no tools reach the template; other
// vocabularies keep the default (skip them).
TEST_F(OpenAiRequestTest, MistralToolCallTokenIsKeptWhenToolsAreOffered) {
  Json tokenizer_json = Json::parse(ReadFile("tests/fixtures/tiny_qwen3/tokenizer.json"));
  tokenizer_json["added_tokens"].push_back({{"id", 3}, {"content", "[TOOL_CALLS]"}, {"single_word", false},
                                            {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                            {"special", true}});
  auto mistral = Tokenizer::FromHuggingFaceJson(tokenizer_json.dump(), "tiny_mistral");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  ASSERT_TRUE((*mistral)->IsSpecial((*mistral)->TokenToId("[TOOL_CALLS]")));
  OpenAiContext context = context_;
  context.tokenizer = mistral->get();
  const std::string tools = R"("messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "get_time"}}])";
  const auto skip = [&](const OpenAiContext& c, const std::string& fields) -> std::optional<bool> {
    const OpenAiRequest r = ParseOpenAiRequest(OpenAiRoute::kChatCompletions, "{" + fields + "}", c);
    EXPECT_FALSE(r.error.has_value()) << r.error->message;
    if (r.error.has_value() || r.choices.empty()) return std::nullopt;
    const v1::SamplingParams& s = r.choices[0].generate.sampling();
    return s.has_skip_special_tokens() ? std::optional<bool>(s.skip_special_tokens().value()) : std::nullopt;
  };
  EXPECT_EQ(skip(context, tools), std::optional<bool>(false));
  EXPECT_EQ(skip(context, tools + R"(, "tool_choice": "auto", "skip_special_tokens": true)"),
            std::optional<bool>(false));
  EXPECT_EQ(skip(context, tools + R"(, "tool_choice": "none")"), std::optional<bool>(true));
  EXPECT_EQ(skip(context, tools + R"(, "tool_choice": "required")"), std::optional<bool>(true));
  EXPECT_EQ(skip(context, R"("messages": [{"role": "user", "content": "hi"}])"), std::optional<bool>(true));
  EXPECT_EQ(skip(context_, tools), std::optional<bool>(true));  // no [TOOL_CALLS] in this vocabulary
}

TEST_F(OpenAiRequestTest, StructuredOutputsInEachForm) {
  const std::string user = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::string schema = R"({"type": "object", "properties": {"a": {"type": "integer"}}})";
  struct Case {
    std::string fields, schema;
    std::vector<std::string> choices;
    std::string regex = "";
    std::string grammar = "";
  };
  const Case cases[] = {
      {R"("guided_regex": "\\d+")", "", {}, "\\d+"},
      {R"j("structured_outputs": {"regex": "(yes|no)"})j", "", {}, "(yes|no)"},
      {R"("guided_grammar": "root ::= [0-9]+")", "", {}, "", "root ::= [0-9]+"},
      {R"("structured_outputs": {"grammar": "root ::= \"a\" | \"b\""})", "", {}, "", R"(root ::= "a" | "b")"},
      {R"("response_format": {"type": "json_object"})", R"({"type":"object"})", {}},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": )" + schema + "}}",
       Json::parse(schema).dump(), {}},
      {R"("structured_outputs": {"json": )" + schema + "}", Json::parse(schema).dump(), {}},
      {R"("structured_outputs": {"json": )" + Json(schema).dump() + "}", Json::parse(schema).dump(), {}},
      {R"("structured_outputs": {"json_object": true, "regex": null})", R"({"type":"object"})", {}},
      {R"("guided_json": )" + schema, Json::parse(schema).dump(), {}},
      {R"("structured_outputs": {"choice": ["yes", "no"]})", "", {"yes", "no"}},
      {R"("guided_choice": ["a b"])", "", {"a b"}},
      {R"("response_format": {"type": "text"})", "", {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fields);
    const OpenAiRequest r = Parse(OpenAiRoute::kChatCompletions, "{" + user + ", " + c.fields + "}");
    ASSERT_FALSE(r.error.has_value()) << r.error->message;
    const v1::SamplingParams& s = r.choices[0].generate.sampling();
    EXPECT_EQ(s.structured_json_schema(), c.schema);
    EXPECT_EQ(std::vector<std::string>(s.structured_choice().begin(), s.structured_choice().end()), c.choices);
    EXPECT_EQ(s.structured_regex(), c.regex);
    EXPECT_EQ(s.structured_grammar(), c.grammar);
  }
}

// --served-model-name=NAME,ALIAS: either name is served (the spec keeps the
// one given, the reply names it), any other is 404 listing both.
TEST_F(OpenAiRequestTest, ServedNamesAndAliases) {
  OpenAiContext context = context_;
  context.model_aliases = {"alias"};
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}])";
  OpenAiRequest r = ParseOpenAiRequest(OpenAiRoute::kChatCompletions, "{" + messages + R"(, "model": "alias"})",
                                       context);
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_EQ(r.spec.model, "alias");
  r = ParseOpenAiRequest(OpenAiRoute::kChatCompletions, "{" + messages + "}", context);
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_EQ(r.spec.model, context.served_model_name);
  r = ParseOpenAiRequest(OpenAiRoute::kChatCompletions, "{" + messages + R"(, "model": "other"})", context);
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->status, 404);
  EXPECT_EQ(r.error->message, "The model `other` does not exist; this server serves `" +
                                  context.served_model_name + "`, `alias`");
}

// --lora-modules: a request whose model is an adapter's name runs with it
// (every choice's lora_name) and is answered under that name; the served
// name runs the base model; an unknown name's 404 lists the adapters too.
TEST_F(OpenAiRequestTest, ModelNamingAnAdapterRunsIt) {
  OpenAiContext context = context_;
  context.lora_adapters = {"sql", "chat"};
  const std::string prompt = R"("prompt": ["a", "b"], "n": 2)";
  OpenAiRequest r =
      ParseOpenAiRequest(OpenAiRoute::kCompletions, "{" + prompt + R"(, "model": "chat"})", context);
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_EQ(r.spec.model, "chat");
  ASSERT_EQ(r.choices.size(), 4u);
  for (const OpenAiChoice& c : r.choices) EXPECT_EQ(c.generate.lora_name(), "chat");
  r = ParseOpenAiRequest(OpenAiRoute::kCompletions, "{" + prompt + "}", context);
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_EQ(r.choices[0].generate.lora_name(), "");
  r = ParseOpenAiRequest(OpenAiRoute::kCompletions, "{" + prompt + R"(, "model": "other"})", context);
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->status, 404);
  EXPECT_EQ(r.error->message, "The model `other` does not exist; this server serves `" +
                                  context.served_model_name + "`, `sql`, `chat`");
}

TEST_F(OpenAiRequestTest, ForcedToolCallsAreStructuredOutputs) {
  context_.max_model_len = 4096;
  const std::string base = R"("messages": [{"role": "user", "content": "hi"}], "tools": [
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
       "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "now"}}])";
  OpenAiRequest r = Parse(OpenAiRoute::kChatCompletions,
                          "{" + base + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_EQ(r.spec.forced_function, "get_weather");
  EXPECT_EQ(Json::parse(r.choices[0].generate.sampling().structured_json_schema()),
            Json::parse(R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})"));
  r = Parse(OpenAiRoute::kChatCompletions, "{" + base + R"(, "tool_choice": "required"})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_TRUE(r.spec.tool_choice_required);
  const Json schema = Json::parse(r.choices[0].generate.sampling().structured_json_schema());
  EXPECT_EQ(schema["type"], "array");
  EXPECT_EQ(schema["minItems"], 1);
  ASSERT_EQ(schema["items"]["anyOf"].size(), 2u);
  EXPECT_EQ(schema["items"]["anyOf"][1]["properties"]["name"]["enum"][0], "now");
  EXPECT_EQ(schema["items"]["anyOf"][1]["properties"]["parameters"], Json::parse(R"({"type": "object"})"));
  // The schema compiles, and admits a call of each tool.
  auto g = JsonGrammar::FromSchema(schema.dump());
  ASSERT_TRUE(g.ok()) << g.status();
  GrammarMatcher m(*g);
  EXPECT_TRUE(m.Accept(R"([{"name": "now", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Oslo"}}])"));
  EXPECT_TRUE(m.CanEnd());
  // parallel_tool_calls: true unless the request says false (then one call
  // of a reply is kept), through the Responses API too.
  EXPECT_TRUE(r.spec.parallel_tool_calls);
  r = Parse(OpenAiRoute::kChatCompletions, "{" + base + R"(, "parallel_tool_calls": false})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_FALSE(r.spec.parallel_tool_calls);
  r = Parse(OpenAiRoute::kResponses, R"({"input": "hi", "parallel_tool_calls": false,
      "tools": [{"type": "function", "name": "now"}]})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_FALSE(r.spec.parallel_tool_calls);
  r = Parse(OpenAiRoute::kChatCompletions, "{" + base + R"(, "parallel_tool_calls": "no"})");
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->param, "parallel_tool_calls");
  EXPECT_EQ(r.error->message, "parallel_tool_calls must be true or false, got \"no\"");
}

// bad_words reach SamplingParams as strings; the worker encodes them as
// vLLM's update_from_tokenizer does: the word at a text's start, and after
// a space where that is other tokens of the same count.
TEST_F(OpenAiRequestTest, BadWordsAreEncodedAsVllmEncodesThem) {
  OpenAiRequest r = Parse(OpenAiRoute::kCompletions, R"({"prompt": "x", "bad_words": ["  hello", "the is"]})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  const v1::SamplingParams& proto = r.choices[0].generate.sampling();
  ASSERT_EQ(proto.bad_words_size(), 2);
  auto s = FromProto(proto, tokenizer_.get());
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<std::vector<int32_t>> want;
  for (const std::string word : {"hello", "the is"}) {
    const std::vector<int32_t> plain = tokenizer_->Encode(word, false);
    const std::vector<int32_t> spaced = tokenizer_->Encode(" " + word, false);
    want.push_back(plain);
    if (spaced[0] != plain[0] && spaced.size() == plain.size()) want.push_back(spaced);
  }
  EXPECT_EQ(s->bad_words_token_ids, want);
  EXPECT_GT(want.size(), 2u);  // some word also mid-text
  EXPECT_TRUE(s->AdjustsLogits());
  // The prefill worker gets the words to encode alike.
  v1::SamplingParams first;
  FirstTokenSampling(*s, 0, &first);
  EXPECT_EQ(first.bad_words_size(), 2);
  EXPECT_NE(FromProto(proto, nullptr).status().message().find("sampling.bad_words needs the model's tokenizer"),
            std::string::npos);
  v1::SamplingParams blank = proto;
  blank.add_bad_words("   ");
  EXPECT_NE(FromProto(blank, tokenizer_.get()).status().message().find("sampling.bad_words[2] must have 1 to 256 bytes"),
            std::string::npos);
  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": "x", "bad_words": ["a", 5]})");
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->message, "bad_words[1] must be a string");
}

TEST_F(OpenAiRequestTest, CompletionsTokenizeAndDetokenize) {
  OpenAiRequest r = Parse(OpenAiRoute::kCompletions, R"({"prompt": ["hello"], "echo": true})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  ASSERT_EQ(r.choices.size(), 1u);
  // Text is tokenized here, as the decode worker would, to be counted.
  const auto& sent = r.choices[0].generate.prompt_token_ids();
  EXPECT_EQ(std::vector<int32_t>(sent.begin(), sent.end()), tokenizer_->Encode("hello"));
  EXPECT_EQ(r.choices[0].generate.sampling().max_tokens(), 16u);  // OpenAI's default for completions
  EXPECT_EQ(r.choices[0].echo, "hello");

  // echo with logprobs asks for the prompt's too (vLLM's), unless given.
  for (const auto& [body, want] : std::vector<std::pair<std::string, int>>{
           {R"({"prompt": "hi", "echo": true, "logprobs": 2})", 2},
           {R"({"prompt": "hi", "echo": true, "logprobs": 2, "prompt_logprobs": 0})", 0},
           {R"({"prompt": "hi", "prompt_logprobs": 4})", 4}}) {
    SCOPED_TRACE(body);
    r = Parse(OpenAiRoute::kCompletions, body);
    ASSERT_FALSE(r.error.has_value()) << r.error->message;
    EXPECT_EQ(r.choices[0].generate.sampling().prompt_logprobs().value(), want);
    EXPECT_EQ(r.spec.echo_logprobs, body.find("echo") != std::string::npos);
    EXPECT_EQ(r.spec.prompt_logprobs, body.find("prompt_logprobs") != std::string::npos);
  }
  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": "hi", "echo": true})");
  EXPECT_FALSE(r.choices[0].generate.sampling().has_prompt_logprobs());
  EXPECT_FALSE(r.spec.echo_only);
  // max_tokens 0 with echo (vLLM's): the prompt alone, one token generated.
  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": "hi", "echo": true, "max_tokens": 0, "logprobs": 1})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_TRUE(r.spec.echo_only);
  EXPECT_EQ(r.choices[0].generate.sampling().max_tokens(), 1u);
  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": "hi", "max_tokens": 0})");
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->message, "max_tokens must be in [1, 256], got 0");

  // truncate_prompt_tokens keeps each prompt's last k tokens (vLLM's); the
  // echo is what is kept.
  const std::string text = "one two three four five six";
  const std::vector<int32_t> text_ids = tokenizer_->Encode(text);
  ASSERT_GT(text_ids.size(), 3u);
  r = Parse(OpenAiRoute::kCompletions,
            R"({"prompt": [")" + text + R"(", [1, 2]], "truncate_prompt_tokens": 3, "echo": true})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  ASSERT_EQ(r.choices.size(), 2u);
  EXPECT_EQ(std::vector<int32_t>(r.choices[0].generate.prompt_token_ids().begin(),
                                 r.choices[0].generate.prompt_token_ids().end()),
            std::vector<int32_t>(text_ids.end() - 3, text_ids.end()));
  EXPECT_EQ(r.choices[0].echo, tokenizer_->Decode({text_ids.end() - 3, text_ids.end()}));
  EXPECT_EQ(r.choices[1].generate.prompt_token_ids_size(), 2);
  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": [1, 2, 3], "truncate_prompt_tokens": -1})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_EQ(r.choices[0].generate.prompt_token_ids_size(), 3);

  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": [5, 6, 7], "logprobs": 3})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  ASSERT_EQ(r.choices.size(), 1u);
  EXPECT_EQ(r.choices[0].generate.prompt_token_ids_size(), 3);
  EXPECT_EQ(r.choices[0].generate.sampling().logprobs().value(), 3);

  r = Parse(OpenAiRoute::kTokenize, R"({"prompt": "hello", "add_special_tokens": false})");
  ASSERT_TRUE(r.reply.has_value());
  const std::vector<int32_t> ids = (*r.reply)["tokens"];
  EXPECT_EQ(ids, tokenizer_->Encode("hello", false));
  EXPECT_EQ((*r.reply)["max_model_len"], 256);

  r = Parse(OpenAiRoute::kDetokenize, Json{{"tokens", ids}}.dump());
  ASSERT_TRUE(r.reply.has_value());
  EXPECT_EQ((*r.reply)["prompt"], "hello");

  r = Parse(OpenAiRoute::kCompletions, R"({"model": "gpt-4o", "prompt": "x"})");
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->status, 404);
  EXPECT_EQ(r.error->message, "The model `gpt-4o` does not exist; this server serves `tiny`");
}

TEST_F(OpenAiRequestTest, NSamplesOfEachPromptOfABatchAreChoicesInVllmsOrder) {
  // Two prompts (text and ids), three samples each: choice p * 3 + j.
  OpenAiRequest r = Parse(OpenAiRoute::kCompletions,
                          R"({"prompt": ["hello", [5, 6]], "n": 3, "seed": 40, "echo": true})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_EQ(r.n, 3u);
  ASSERT_EQ(r.choices.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    const OpenAiChoice& c = r.choices[i];
    EXPECT_EQ(c.counts_prompt, i % 3 == 0);
    EXPECT_EQ(c.generate.sampling().seed().value(), 40u + i % 3);  // vLLM: seed + sample index
    if (i < 3) {
      EXPECT_EQ(std::vector<int32_t>(c.generate.prompt_token_ids().begin(), c.generate.prompt_token_ids().end()),
                tokenizer_->Encode("hello"));
      EXPECT_EQ(c.echo, "hello");
    } else {
      EXPECT_EQ(c.generate.prompt_token_ids_size(), 2);
      EXPECT_EQ(c.echo, tokenizer_->Decode({5, 6}));
    }
  }
  // Unseeded samples stay unseeded (each draws its own).
  r = Parse(OpenAiRoute::kChatCompletions, R"({"messages": [{"role": "user", "content": "hi"}], "n": 2})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  ASSERT_EQ(r.choices.size(), 2u);
  EXPECT_FALSE(r.choices[1].generate.sampling().has_seed());
  EXPECT_TRUE(r.choices[0].counts_prompt && !r.choices[1].counts_prompt);
  // Seed 0 is a seed (vLLM's is Optional[int]), not "unseeded".
  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": "hi", "n": 2, "seed": 0})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  ASSERT_EQ(r.choices.size(), 2u);
  for (uint64_t j = 0; j < 2; ++j) {
    EXPECT_TRUE(r.choices[j].generate.sampling().has_seed());
    EXPECT_EQ(r.choices[j].generate.sampling().seed().value(), j);
  }

  struct Case {
    OpenAiRoute route;
    std::string body, param, message;
  };
  const Case cases[] = {
      {OpenAiRoute::kCompletions, R"({"prompt": "x", "n": 129})", "n", "n must be in [1, 128], got 129"},
      {OpenAiRoute::kCompletions, R"({"prompt": "x", "n": 0})", "n", "n must be in [1, 128], got 0"},
      {OpenAiRoute::kCompletions, R"({"prompt": ["a", "b", "c"], "n": 50})", "n",
       "n=50 for each of 3 prompts is 150 completions; the limit is 128 a request"},
      {OpenAiRoute::kCompletions, R"({"prompt": ["a", [1, -3]]})", "prompt", "prompt[1][1] must be a token id"},
      {OpenAiRoute::kCompletions, R"({"prompt": ["a", []]})", "prompt", "prompt must be a string, a list of token ids, or a list of either"},
      {OpenAiRoute::kCompletions, R"({"prompt": []})", "prompt", "prompt must be a string"},
      {OpenAiRoute::kTokenize, R"({"prompt": ["a", "b"]})", "prompt", "/tokenize takes one prompt"},
      {OpenAiRoute::kCompletions, R"({"prompt": "x", "best_of": 2})", "best_of", "best_of must be in [1, 1]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    r = Parse(c.route, c.body);
    ASSERT_TRUE(r.error.has_value());
    EXPECT_EQ(r.error->param, c.param);
    EXPECT_NE(r.error->message.find(c.message), std::string::npos) << r.error->message;
  }
  std::string batch = "[";
  for (size_t i = 0; i <= kMaxChoices; ++i) batch += i == 0 ? "\"a\"" : ", \"a\"";
  r = Parse(OpenAiRoute::kCompletions, "{\"prompt\": " + batch + "]}");
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->message, "prompt is a batch of 129 prompts; the limit is 128");
}

// vLLM's continue_final_message: the prompt ends inside the final message,
// which the reply continues (no end of turn, no new generation prompt).
TEST_F(OpenAiRequestTest, ContinueFinalMessageLeavesTheLastMessageOpen) {
  const auto prompt_of = [&](const std::string& body) {
    const OpenAiRequest r = Parse(OpenAiRoute::kChatCompletions, body);
    EXPECT_FALSE(r.error.has_value()) << r.error->message;
    if (r.error.has_value()) return std::string();
    const auto& ids = r.choices[0].generate.prompt_token_ids();
    return tokenizer_->Decode(std::vector<int32_t>(ids.begin(), ids.end()));
  };
  const std::string turns = R"("messages": [{"role": "user", "content": "Capital of France?"},
      {"role": "assistant", "content": "The capital is)";
  std::string p = prompt_of("{" + turns + R"("}], "continue_final_message": true})");
  EXPECT_TRUE(absl::EndsWith(p, "<|im_start|>assistant\nThe capital is")) << p;
  // Its trailing space stays where the template keeps it; with
  // add_generation_prompt false said too, the same.
  p = prompt_of("{" + turns + R"( "}], "continue_final_message": true, "add_generation_prompt": false})");
  EXPECT_TRUE(absl::EndsWith(p, "<|im_start|>assistant\nThe capital is ")) << p;
  // Without it the turn is closed and a new one opened.
  p = prompt_of("{" + turns + R"("}]})");
  EXPECT_TRUE(absl::EndsWith(p, "The capital is<|im_end|>\n<|im_start|>assistant\n")) << p;
  OpenAiRequest r = Parse(OpenAiRoute::kChatCompletions,
                          "{" + turns + R"("}], "continue_final_message": true, "add_generation_prompt": true})");
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->message, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  r = Parse(OpenAiRoute::kChatCompletions,
            R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}],
                "continue_final_message": true})");
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->param, "continue_final_message");
}

// The logprobs fields are bounded by the engine's --max-logprobs (-1: by
// the engine alone, which knows the vocabulary).
TEST_F(OpenAiRequestTest, LogprobsAreBoundedByMaxLogprobs) {
  const std::string chat = R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, )";
  context_.max_logprobs = 50;
  OpenAiRequest r = Parse(OpenAiRoute::kChatCompletions, chat + R"("top_logprobs": 50})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_EQ(r.choices[0].generate.sampling().logprobs().value(), 50);
  r = Parse(OpenAiRoute::kChatCompletions, chat + R"("top_logprobs": 51})");
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->message, "top_logprobs must be in [0, 50], got 51");
  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": "x", "logprobs": 51})");
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->message, "logprobs must be in [0, 50], got 51");
  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": "x", "prompt_logprobs": 51})");
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->param, "prompt_logprobs");
  context_.max_logprobs = -1;
  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": "x", "logprobs": 49152, "prompt_logprobs": 1000})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_EQ(r.choices[0].generate.sampling().logprobs().value(), 49152);
}

// return_tokens_as_token_ids: the request's, else the server's
// (--return-tokens-as-token-ids), on chat and completions alike.
TEST_F(OpenAiRequestTest, TokensAsTokenIdsAreTheRequestsElseTheServers) {
  const std::string chat = R"({"messages": [{"role": "user", "content": "hi"}])";
  const std::string comp = R"({"prompt": "hi")";
  for (bool server : {false, true}) {
    context_.return_tokens_as_token_ids = server;
    for (const auto& [route, body] : {std::pair{OpenAiRoute::kChatCompletions, chat},
                                      std::pair{OpenAiRoute::kCompletions, comp}}) {
      SCOPED_TRACE(absl::StrCat("server ", server, " ", body));
      OpenAiRequest r = Parse(route, body + "}");
      ASSERT_FALSE(r.error.has_value()) << r.error->message;
      EXPECT_EQ(r.spec.tokens_as_ids, server);
      r = Parse(route, body + R"(, "return_tokens_as_token_ids": null})");
      ASSERT_FALSE(r.error.has_value()) << r.error->message;
      EXPECT_EQ(r.spec.tokens_as_ids, server);
      for (bool asked : {false, true}) {
        r = Parse(route, body + absl::StrCat(R"(, "return_tokens_as_token_ids": )", asked ? "true" : "false", "}"));
        ASSERT_FALSE(r.error.has_value()) << r.error->message;
        EXPECT_EQ(r.spec.tokens_as_ids, asked);
      }
      r = Parse(route, body + R"(, "return_tokens_as_token_ids": 1})");
      ASSERT_TRUE(r.error.has_value());
      EXPECT_EQ(r.error->param, "return_tokens_as_token_ids");
    }
  }
}

// The model's recommended sampling (--generation-config) fills the fields a
// request leaves out, never those it sets; its max_tokens caps the request's,
// as vLLM's get_max_tokens.
TEST_F(OpenAiRequestTest, TheModelsGenerationConfigFillsWhatTheRequestLeavesOut) {
  context_.generation_defaults.temperature = 0.6;
  context_.generation_defaults.top_p = 0.9;
  context_.generation_defaults.top_k = 20;
  context_.generation_defaults.min_p = 0.05;
  context_.generation_defaults.repetition_penalty = 1.1;
  context_.generation_defaults.max_tokens = 40;
  const std::string user = R"("messages": [{"role": "user", "content": "hi"}])";
  OpenAiRequest r = Parse(OpenAiRoute::kChatCompletions, "{" + user + "}");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  const v1::SamplingParams* s = &r.choices[0].generate.sampling();
  EXPECT_FLOAT_EQ(s->temperature(), 0.6f);
  EXPECT_FLOAT_EQ(s->top_p(), 0.9f);
  EXPECT_EQ(s->top_k(), 20);
  EXPECT_FLOAT_EQ(s->min_p(), 0.05f);
  EXPECT_FLOAT_EQ(s->repetition_penalty(), 1.1f);
  EXPECT_EQ(s->max_tokens(), 40u);  // not the rest of the context
  r = Parse(OpenAiRoute::kChatCompletions,
            "{" + user + R"(, "temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0,
                "repetition_penalty": 1, "max_tokens": 100})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  s = &r.choices[0].generate.sampling();
  EXPECT_FLOAT_EQ(s->temperature(), 0.f);
  EXPECT_FLOAT_EQ(s->top_p(), 1.f);
  EXPECT_EQ(s->top_k(), -1);
  EXPECT_FLOAT_EQ(s->min_p(), 0.f);
  EXPECT_FLOAT_EQ(s->repetition_penalty(), 1.f);
  EXPECT_EQ(s->max_tokens(), 40u);  // capped
  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": "x", "max_tokens": 8})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_EQ(r.choices[0].generate.sampling().max_tokens(), 8u);
  EXPECT_FLOAT_EQ(r.choices[0].generate.sampling().temperature(), 0.6f);
  // None: the API's own defaults.
  context_.generation_defaults = GenerationDefaults();
  r = Parse(OpenAiRoute::kCompletions, R"({"prompt": "x"})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  s = &r.choices[0].generate.sampling();
  EXPECT_FLOAT_EQ(s->temperature(), 1.f);
  EXPECT_EQ(s->max_tokens(), 16u);
  EXPECT_EQ(s->top_k(), 0);  // unset: off
}

// The Responses API's body is read as the chat completion it asks for:
// instructions first, input items as messages (a turn's calls in one
// assistant message, their outputs as tool messages), function tools and
// tool_choice in chat's shape, text.format as response_format.
TEST_F(OpenAiRequestTest, AResponsesBodyIsTheChatCompletionItAsksFor) {
  const Json body = Json::parse(R"({
    "model": "tiny", "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.5,
    "stream": true,
    "input": [
      {"role": "user", "content": "Weather?"},
      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\": \"Rome\"}"},
      {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Celsius."}]}],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}}})");
  Json chat;
  ASSERT_FALSE(ResponsesToChat(body, &chat).has_value());
  EXPECT_EQ(chat, Json::parse(R"({
    "model": "tiny", "temperature": 0.5, "stream": true,
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "max_tokens": 9,
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
      {"role": "system", "content": [{"type": "text", "text": "Celsius."}]}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}})"))
      << chat.dump(1);
  // Through ParseOpenAiRequest: a chat request marked as a response.
  const OpenAiRequest r =
      Parse(OpenAiRoute::kResponses, R"({"input": "hi", "max_output_tokens": 5, "priority": 3,
                                              "cache_salt": "s"})");
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  ASSERT_EQ(r.choices.size(), 1u);
  EXPECT_TRUE(r.spec.responses && r.spec.chat);
  EXPECT_EQ(r.choices[0].generate.sampling().max_tokens(), 5u);
  EXPECT_EQ(r.choices[0].generate.priority(), 3);
  EXPECT_EQ(r.choices[0].generate.cache_salt(), "s");
}

TEST_F(OpenAiRequestTest, WhatTheResponsesApiCannotServeIsRefusedByField) {
  for (const auto& [body, field, words] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {R"({"input": "hi", "previous_response_id": "resp_1"})", "previous_response_id", "stores no responses"},
           {R"({"input": "hi", "background": true})", "background", "not supported"},
           {R"({"input": 5})", "input", "a string or a list of items"},
           {R"({"input": [{"type": "image_generation_call"}]})", "input", "input[0].type"},
           {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})",
            "input", "only text parts"},
           {R"({"input": "hi", "tools": [{"type": "web_search"}]})", "tools", "built-in tools"},
           {R"({"input": "hi", "max_output_tokens": 0})", "max_output_tokens", "must be in"},
           {R"({"input": "hi", "text": {"format": {"type": "xml"}}})", "text", "text.format.type"}}) {
    const OpenAiRequest r = Parse(OpenAiRoute::kResponses, body);
    ASSERT_TRUE(r.error.has_value()) << body;
    EXPECT_EQ(r.error->status, 400) << body;
    EXPECT_EQ(r.error->param, field) << body;
    EXPECT_NE(r.error->message.find(words), std::string::npos) << body << ": " << r.error->message;
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// The front door under attack (issue: hostile clients): each case here was
// answered wrongly before, as the comment says.

// An assistant turn that only calls tools comes with `content: null` from
// the OpenAI SDK, LangChain and LiteLLM; a template that adds the content
// to a string failed on it ('str' + 'NoneType': 400). vLLM hands it "".
TEST_F(OpenAiRequestTest, ToolRoundTripWithNullContentRenders) {
  auto plain = ChatTemplate::Create(
      "{% for m in messages %}{{ '<' + m.role + '>' + m.content }}{% endfor %}", "plain", "", "");
  ASSERT_TRUE(plain.ok()) << plain.status();
  OpenAiContext context = context_;
  context.chat_template = &*plain;
  const std::string body = R"({"messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
      {"role": "assistant"}],
      "max_tokens": 2})";
  OpenAiRequest r = ParseOpenAiRequest(OpenAiRoute::kChatCompletions, body, context);
  ASSERT_FALSE(r.error) << r.error->message;
  ASSERT_EQ(r.choices.size(), 1u);
  EXPECT_EQ(tokenizer_->Decode({r.choices[0].generate.prompt_token_ids().begin(),
                                r.choices[0].generate.prompt_token_ids().end()}),
            "<user>weather?<assistant><tool>sunny<assistant>");
}

// chat_template_kwargs replaced the checked messages (and could replace the
// tools, the generation prompt and the special tokens).
TEST_F(OpenAiRequestTest, ChatTemplateKwargsCannotReplaceWhatTheServerSets) {
  for (const char* key : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                          "documents", "chat_template"}) {
    const std::string body = absl::StrCat(
        R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {")", key,
        R"(": [{"role": "system", "content": "obey"}]}})");
    OpenAiRequest r = Parse(OpenAiRoute::kChatCompletions, body);
    ASSERT_TRUE(r.error) << key;
    EXPECT_EQ(r.error->status, 400) << key;
    EXPECT_EQ(r.error->param, "chat_template_kwargs") << key;
    EXPECT_TRUE(absl::StrContains(r.error->message, absl::StrCat("chat_template_kwargs.", key)))
        << r.error->message;
  }
  // What a template reads of its own is still passed.
  OpenAiRequest ok = Parse(OpenAiRoute::kChatCompletions,
                           R"({"messages": [{"role": "user", "content": "hi"}],
                               "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_FALSE(ok.error) << ok.error->message;
}

// A request's chat_template was silently ignored; it is vLLM's
// --trust-request-chat-template's to allow.
TEST_F(OpenAiRequestTest, ARequestsChatTemplateIsRefusedUnlessTrusted) {
  const std::string body = R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                               "chat_template": "{{ messages[0].content }}!"})";
  OpenAiRequest refused = Parse(OpenAiRoute::kChatCompletions, body);
  ASSERT_TRUE(refused.error);
  EXPECT_EQ(refused.error->status, 400);
  EXPECT_EQ(refused.error->param, "chat_template");
  EXPECT_TRUE(absl::StrContains(refused.error->message, "--trust-request-chat-template"));
  OpenAiContext trusting = context_;
  trusting.trust_request_chat_template = true;
  OpenAiRequest used = ParseOpenAiRequest(OpenAiRoute::kChatCompletions, body, trusting);
  ASSERT_FALSE(used.error) << used.error->message;
  const auto& ids = used.choices[0].generate.prompt_token_ids();
  EXPECT_EQ(tokenizer_->Decode({ids.begin(), ids.end()}), "hi!");
}

// A prompt over gRPC's message limit came back 429 rate_limit_error (the
// SDK retried it); a prompt too long for the model is 400
// context_length_exceeded, counted before it is sent anywhere.
TEST_F(OpenAiRequestTest, APromptTooLongForTheModelIsContextLengthExceeded) {
  OpenAiContext context = context_;  // max_model_len 256
  context.max_token_bytes = 16;
  for (const auto& [route, body, param] : std::vector<std::tuple<OpenAiRoute, std::string, std::string>>{
           // Past 256 tokens of at most 16 bytes: refused untokenized.
           {OpenAiRoute::kCompletions, Json{{"prompt", std::string(1 << 20, 'a')}}.dump(), "prompt"},
           {OpenAiRoute::kChatCompletions,
            Json{{"messages", {{{"role", "user"}, {"content", std::string(1 << 20, 'a')}}}}}.dump(), "messages"},
           // Within the byte bound, over in tokens.
           {OpenAiRoute::kCompletions, Json{{"prompt", std::string(3000, ' ') + "x"}}.dump(), "prompt"},
           {OpenAiRoute::kCompletions, Json{{"prompt", std::vector<int>(300, 5)}}.dump(), "prompt"}}) {
    OpenAiRequest r = ParseOpenAiRequest(route, body, context);
    ASSERT_TRUE(r.error) << body.substr(0, 40);
    EXPECT_EQ(r.error->status, 400);
    EXPECT_EQ(r.error->code, "context_length_exceeded");
    EXPECT_EQ(r.error->param, param);
    EXPECT_TRUE(absl::StrContains(r.error->message, "maximum context length is 256 tokens")) << r.error->message;
  }
  // A text prompt that fits goes on as the ids the decode worker would make.
  OpenAiRequest fits = ParseOpenAiRequest(OpenAiRoute::kCompletions, R"({"prompt": "hello world"})", context);
  ASSERT_FALSE(fits.error) << fits.error->message;
  const auto& ids = fits.choices[0].generate.prompt_token_ids();
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), tokenizer_->Encode("hello world"));
}

// Every JSON failure got one message; a 404 quoted a 10 KB model name; a
// Responses input_text part without text was "unsupported".
TEST_F(OpenAiRequestTest, ErrorsSayWhatWentWrongAndQuoteLittle) {
  OpenAiRequest truncated = Parse(OpenAiRoute::kChatCompletions, R"({"messages": [)");
  ASSERT_TRUE(truncated.error);
  EXPECT_TRUE(absl::StrContains(truncated.error->message, "not JSON")) << truncated.error->message;
  EXPECT_TRUE(absl::StrContains(truncated.error->message, "column")) << truncated.error->message;
  OpenAiRequest array = Parse(OpenAiRoute::kChatCompletions, "[1]");
  ASSERT_TRUE(array.error);
  EXPECT_TRUE(absl::StrContains(array.error->message, "must be a JSON object, got array")) << array.error->message;
  OpenAiRequest model = Parse(OpenAiRoute::kChatCompletions,
                              Json{{"model", std::string(10000, 'm')},
                                   {"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump());
  ASSERT_TRUE(model.error);
  EXPECT_EQ(model.error->status, 404);
  EXPECT_LT(model.error->message.size(), 300u) << model.error->message.substr(0, 300);
  OpenAiRequest part = Parse(OpenAiRoute::kResponses,
                             R"({"input": [{"role": "user", "content": [{"type": "input_text"}]}]})");
  ASSERT_TRUE(part.error);
  EXPECT_TRUE(absl::StrContains(part.error->message, "an input_text part needs `text`")) << part.error->message;
}

}  // namespace
}  // namespace tandem
