// Structured outputs' grammars: what a JSON schema (the supported subset),
// any JSON object, or a list of choices admits byte by byte, and the token
// mask against a brute-force check of every token.
#include "common/structured/json_grammar.h"

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

std::shared_ptr<const JsonGrammar> Schema(const std::string& schema) {
  auto g = JsonGrammar::FromSchema(schema);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

// Whether `text` is a whole reply the grammar admits.
bool Whole(const std::shared_ptr<const JsonGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.Accept(text) && m.CanEnd();
}

// Whether `text` may begin a reply.
bool Prefix(const std::shared_ptr<const JsonGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.Accept(text);
}

TEST(JsonGrammarTest, AnyObject) {
  const auto g = Schema(R"({"type": "object"})");
  EXPECT_TRUE(Whole(g, R"({"a": [1, -2.5e3, "x\u00e9\n", {}], "b": {"c": null, "d": true}})"));
  EXPECT_TRUE(Whole(g, "{}"));
  EXPECT_TRUE(Whole(g, "{\n  \"k\" : \"v\"\n}"));
  EXPECT_FALSE(Prefix(g, "["));
  EXPECT_FALSE(Prefix(g, R"({"a" 1)"));
  EXPECT_FALSE(Prefix(g, "{} "));  // nothing after the value
  EXPECT_FALSE(Prefix(g, R"({"a": tru })"));
  EXPECT_FALSE(Prefix(g, R"({"a": "\x"})"));
  EXPECT_FALSE(Prefix(g, "{\"a\": \"line\nbreak\"}"));  // a raw control character
  EXPECT_FALSE(Whole(g, R"({"a": 1)"));
  GrammarMatcher done(g);
  ASSERT_TRUE(done.Accept("{}"));
  EXPECT_TRUE(done.Done());
}

TEST(JsonGrammarTest, PropertiesRequiredAndNoOtherKeys) {
  const auto g = Schema(R"({"type": "object", "properties": {"name": {"type": "string"},
      "age": {"type": "integer"}, "nick": {"type": "string"}}, "required": ["name"]})");
  EXPECT_TRUE(Whole(g, R"({"name": "Bo", "age": 3})"));
  EXPECT_TRUE(Whole(g, R"({"age": 3, "name": "Bo"})"));  // any order
  EXPECT_TRUE(Whole(g, R"({"name": "Bo"})"));
  EXPECT_FALSE(Whole(g, "{}"));                            // name is required
  EXPECT_FALSE(Prefix(g, R"({"age": 3.5)"));               // an integer
  EXPECT_FALSE(Prefix(g, R"({"name": "x", "other")"));     // no other key
  EXPECT_FALSE(Prefix(g, R"({"name": "a", "name")"));      // no key twice
  EXPECT_TRUE(Prefix(g, R"({"n)"));                        // name or nick: open
  EXPECT_FALSE(Prefix(g, R"({"name": "a", "age": 1, "nick": "b",)"));  // no key left
  // additionalProperties as a schema admits other keys with such values.
  const auto open = Schema(R"({"properties": {"a": {"type": "null"}}, "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(Whole(open, R"({"a": null, "zz": 7})"));
  EXPECT_FALSE(Prefix(open, R"({"zz": "7")"));
}

TEST(JsonGrammarTest, EnumConstUnionsAndTypeLists) {
  const auto color = Schema(R"({"enum": ["red", "green", 3, null]})");
  EXPECT_TRUE(Whole(color, "\"red\""));
  EXPECT_TRUE(Whole(color, "3"));
  EXPECT_TRUE(Whole(color, "null"));
  EXPECT_FALSE(Prefix(color, "\"blue"));
  EXPECT_TRUE(Whole(Schema(R"({"const": {"a": [1]}})"), R"({"a":[1]})"));
  const auto nullable = Schema(R"({"type": ["string", "null"]})");
  EXPECT_TRUE(Whole(nullable, "null"));
  EXPECT_TRUE(Whole(nullable, "\"x\""));
  EXPECT_FALSE(Prefix(nullable, "1"));
  const auto either = Schema(R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
      "required": ["a"]}, {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}]})");
  EXPECT_TRUE(Whole(either, R"({"a": 1})"));
  EXPECT_TRUE(Whole(either, R"({"a": "1"})"));
  EXPECT_FALSE(Prefix(either, R"({"a": true)"));
  const auto boolean = Schema(R"({"type": "boolean"})");
  EXPECT_TRUE(Whole(boolean, "false"));
  EXPECT_FALSE(Prefix(boolean, "n"));
}

TEST(JsonGrammarTest, RefsIncludingRecursion) {
  const auto list = Schema(R"({"$defs": {"node": {"type": "object", "properties": {
      "value": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
      "required": ["value", "next"]}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(Whole(list, R"({"value": 1, "next": {"value": 2, "next": null}})"));
  EXPECT_FALSE(Whole(list, R"({"value": 1, "next": {"value": 2}})"));
  const auto pydantic = Schema(R"({"definitions": {"Pet": {"type": "object", "properties": {"kind":
      {"enum": ["cat", "dog"]}}, "required": ["kind"]}}, "type": "object", "properties": {"pets":
      {"type": "array", "items": {"$ref": "#/definitions/Pet"}}}, "required": ["pets"]})");
  EXPECT_TRUE(Whole(pydantic, R"({"pets": [{"kind": "cat"}, {"kind": "dog"}]})"));
  EXPECT_FALSE(Prefix(pydantic, R"({"pets": [{"kind": "cow")"));
  // A union that leads back to itself matches nothing: refused as it is
  // compiled (SchemasThatMatchNothingAreRefusedByName).
  EXPECT_FALSE(JsonGrammar::FromSchema(R"({"anyOf": [{"$ref": "#"}]})").ok());
}

TEST(JsonGrammarTest, ArrayAndStringBounds) {
  const auto a = Schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2})");
  EXPECT_FALSE(Whole(a, "[]"));
  EXPECT_TRUE(Whole(a, "[1]"));
  EXPECT_TRUE(Whole(a, "[1, 2]"));
  EXPECT_FALSE(Prefix(a, "[1, 2,"));
  const auto s = Schema(R"({"type": "string", "minLength": 1, "maxLength": 2})");
  EXPECT_FALSE(Whole(s, "\"\""));
  EXPECT_TRUE(Whole(s, "\"\xC3\xA9\\n\""));  // two characters: a two-byte one and an escape
  EXPECT_TRUE(Whole(s, "\"\\u00e9\""));
  EXPECT_FALSE(Prefix(s, "\"abc"));
}

TEST(JsonGrammarTest, NumbersAndWhitespace) {
  const auto n = Schema(R"({"type": "number"})");
  for (const char* ok : {"0", "-1", "12.5", "1e5", "-0.25E-3"}) EXPECT_TRUE(Whole(n, ok)) << ok;
  for (const char* bad : {"01", "-", "1.", "1e", ".5", "+1"}) EXPECT_FALSE(Whole(n, bad)) << bad;
  EXPECT_FALSE(Prefix(Schema(R"({"type": "integer"})"), "1."));
  const auto any = Schema("{}");
  EXPECT_TRUE(Prefix(any, std::string(kMaxWhitespace, ' ')));
  EXPECT_FALSE(Prefix(any, std::string(kMaxWhitespace + 1, ' ')));
  EXPECT_TRUE(Whole(any, "[1, [2, {\"x\": \"y\"}], false]"));
  // Replies nest at most 128 deep.
  EXPECT_TRUE(Prefix(any, std::string(128, '[')));
  EXPECT_FALSE(Prefix(any, std::string(129, '[')));
}

TEST(JsonGrammarTest, SchemasTooLargeOrDeepAreRefused) {
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += R"({"type": "array", "items": )";
  deep += "{}" + std::string(200, '}');
  EXPECT_NE(std::string(JsonGrammar::FromSchema(deep).status().message()).find("nests deeper than 128"),
            std::string::npos);
  // A chain of $refs, each to the next: 600 deep.
  std::string defs = R"({"$defs": {)";
  for (int i = 0; i < 600; ++i) defs += absl::StrCat(i ? ", " : "", "\"d", i, "\": {\"$ref\": \"#/$defs/d", i + 1, "\"}");
  defs += R"(, "d600": {"type": "null"}}, "$ref": "#/$defs/d0"})";
  EXPECT_NE(std::string(JsonGrammar::FromSchema(defs).status().message()).find("nests deeper than 512"),
            std::string::npos);
  std::string big_enum = R"({"enum": [)";
  for (int i = 0; i < 1025; ++i) big_enum += absl::StrCat(i ? ", " : "", i);
  big_enum += "]}";
  EXPECT_EQ(JsonGrammar::FromSchema(big_enum).status().message(), "an enum has 1025 values; the limit is 1024");
}

TEST(JsonGrammarTest, Choices) {
  auto g = JsonGrammar::FromChoices({"yes", "no", "not sure"});
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Whole(*g, "yes"));
  EXPECT_TRUE(Whole(*g, "not sure"));
  EXPECT_FALSE(Whole(*g, "n"));
  EXPECT_FALSE(Prefix(*g, "yex"));
  EXPECT_FALSE(Prefix(*g, " yes"));  // exactly the text: no whitespace before it
  EXPECT_FALSE(JsonGrammar::FromChoices({}).ok());
}

TEST(JsonGrammarTest, KeywordsThatAssertMoreAreRefusedByName) {
  struct Case {
    const char* schema;
    const char* message;
  };
  const Case cases[] = {
      {R"j({"type": "object", "properties": {"x": {"type": "string", "pattern": "(?=a)"}}})j",
       "JSON schema at #/properties/x/pattern: regex a (?...) group"},
      {R"({"type": "string", "format": "email", "multipleOf": 2})", "the keyword \"multipleOf\" is not supported"},
      {R"({"type": "integer", "minimum": 0})", "JSON schema at #: the keyword \"minimum\" is not supported"},
      {R"({"type": "thing"})", "JSON schema at #: type \"thing\" is not a JSON schema type"},
      {R"({"$ref": "#/$defs/missing"})", "$ref \"#/$defs/missing\" names no schema"},
      {R"({"properties": {"a": {}}, "required": ["b"]})", "required names \"b\", which is not in properties"},
      {R"(not json)", "the JSON schema is not JSON"},
  };
  for (const Case& c : cases) {
    auto g = JsonGrammar::FromSchema(c.schema);
    ASSERT_FALSE(g.ok()) << c.schema;
    EXPECT_NE(std::string(g.status().message()).find(c.message), std::string::npos) << g.status();
  }
}

// A vocabulary of every 1-3 byte string over JSON's structural bytes and a
// few others, and EOS.
TokenVocabulary TestVocabulary(int32_t* eos) {
  const std::string alphabet = "{}[]\":, a1-.e\\nu0tx";
  std::vector<std::string> bytes;
  for (char a : alphabet) {
    bytes.push_back(std::string(1, a));
    for (char b : alphabet) {
      bytes.push_back(std::string{a, b});
      for (char c : alphabet) bytes.push_back(std::string{a, b, c});
    }
  }
  bytes.push_back("<|special|>");
  bytes.push_back("");  // EOS: no bytes
  *eos = static_cast<int32_t>(bytes.size()) - 1;
  std::vector<bool> never(bytes.size(), false);
  never[bytes.size() - 2] = true;
  return TokenVocabulary(bytes, never);
}

// Feeds `reply` to `m` a byte at a time; before each byte (and after the
// last) the mask must be exactly the tokens Accept() takes (a brute-force
// check of every token; the second-last id is never allowed), EOS exactly
// when the reply may end, and ids past the vocabulary none.
void ExpectMaskAlong(const TokenVocabulary& vocab, int32_t eos, const std::string& reply, GrammarMatcher* m) {
  std::vector<uint8_t> mask(vocab.size() + 5);
  for (size_t i = 0; i <= reply.size(); ++i) {
    SCOPED_TRACE("after " + reply.substr(0, i));
    m->FillMask(vocab, {eos}, &mask);
    for (int32_t id = 0; id < vocab.size(); ++id) {
      if (id == eos) continue;
      GrammarMatcher copy = *m;
      const bool expect = id != vocab.size() - 2 && copy.Accept(vocab.bytes(id));
      ASSERT_EQ(mask[id], expect ? 1 : 0) << "token '" << vocab.bytes(id) << "'";
    }
    EXPECT_EQ(mask[eos], m->CanEnd() ? 1 : 0);
    for (size_t id = vocab.size(); id < mask.size(); ++id) EXPECT_EQ(mask[id], 0);
    if (i < reply.size()) ASSERT_TRUE(m->Accept(reply.substr(i, 1)));
  }
}

TEST(JsonGrammarTest, TheMaskIsEveryTokenThatCanComeNext) {
  int32_t eos = 0;
  const TokenVocabulary vocab = TestVocabulary(&eos);
  const auto g = Schema(R"({"type": "object", "properties": {"a": {"type": "array", "items":
      {"type": "number"}}, "t": {"type": "string"}, "u": {"type": "string", "maxLength": 3}},
      "required": ["a"]})");
  const std::string reply = R"({"a": [1, -0.5e1], "t": "x\n\u00e9 a", "u": "ax"})";
  GrammarMatcher m(g);
  ExpectMaskAlong(vocab, eos, reply, &m);
  EXPECT_TRUE(m.Done());
  // Once whole, only EOS.
  std::vector<uint8_t> mask(vocab.size());
  m.FillMask(vocab, {eos}, &mask);
  int allowed = 0;
  for (uint8_t a : mask) allowed += a;
  EXPECT_EQ(allowed, 1);
  EXPECT_EQ(mask[eos], 1);
}

// JSON schema's pattern: the string's text fully matches it (its
// characters as they are: no escapes), beside minLength / maxLength; a
// schema with a pattern and no type is a string.
TEST(JsonGrammarTest, PatternsHoldAStringsText) {
  const auto g = Schema(R"({"type": "object", "properties": {
      "date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
      "code": {"pattern": "[A-Z]{2,}", "maxLength": 3},
      "any": {"type": ["string", "null"], "pattern": "x+"}}, "required": ["date"]})");
  EXPECT_TRUE(Whole(g, R"({"date": "2024-01-31"})"));
  EXPECT_FALSE(Prefix(g, R"({"date": "2024-1-)"));
  EXPECT_FALSE(Whole(g, R"({"date": "2024-01-3"})"));
  EXPECT_TRUE(Whole(g, R"({"date": "2024-01-31", "code": "ABC"})"));
  EXPECT_FALSE(Prefix(g, R"({"date": "2024-01-31", "code": "ABCD)"));  // maxLength
  EXPECT_FALSE(Whole(g, R"({"date": "2024-01-31", "code": "A"})"));
  EXPECT_FALSE(Prefix(g, R"({"date": "2024-01-31", "code": 5)"));
  EXPECT_TRUE(Whole(g, R"({"any": null, "date": "0000-00-00"})"));
  EXPECT_TRUE(Whole(g, R"({"any": "xx", "date": "0000-00-00"})"));
  EXPECT_FALSE(Prefix(g, R"({"any": "x\)"));
}

// A reply held to a regex (vLLM's structured_outputs regex): its text, no
// JSON around it; it ends once nothing may follow; the empty text is whole
// when the regex matches it.
TEST(JsonGrammarTest, RegexReplies) {
  auto g = JsonGrammar::FromRegex("(yes|no)!?");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->regex(), "(yes|no)!?");
  GrammarMatcher m(*g);
  EXPECT_FALSE(m.CanEnd());
  EXPECT_FALSE(m.Accept(" "));
  ASSERT_TRUE(m.Accept("ye"));
  EXPECT_FALSE(m.CanEnd());
  ASSERT_TRUE(m.Accept("s"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.Done());
  ASSERT_TRUE(m.Accept("!"));
  EXPECT_TRUE(m.Done());
  auto empty = JsonGrammar::FromRegex("a*");
  ASSERT_TRUE(empty.ok());
  GrammarMatcher e(*empty);
  EXPECT_TRUE(e.CanEnd());
  EXPECT_TRUE(e.Accept("aaa") && e.CanEnd() && !e.Done());
  EXPECT_EQ(JsonGrammar::FromRegex("a(").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JsonGrammarTest, TheMaskOfARegexIsEveryTokenThatCanComeNext) {
  int32_t eos = 0;
  const TokenVocabulary vocab = TestVocabulary(&eos);
  auto g = JsonGrammar::FromRegex(R"((\[1(, 1)*\]|a+)\n?)");
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string reply = "[1, 1, 1]\n";
  GrammarMatcher m(*g);
  ExpectMaskAlong(vocab, eos, reply, &m);
  EXPECT_TRUE(m.Done());
}

// The fuzz input that found it: a branch that cannot end (after '.', a class
// with no character) once let the mask allow tokens Accept() refused.
TEST(JsonGrammarTest, TheMaskOfARegexLeavesOutBranchesThatCannotEnd) {
  int32_t eos = 0;
  const TokenVocabulary vocab = TestVocabulary(&eos);
  auto g = JsonGrammar::FromRegex(R"(x|.[^\D\w])");
  ASSERT_TRUE(g.ok()) << g.status();
  GrammarMatcher m(*g);
  ExpectMaskAlong(vocab, eos, "x", &m);
  EXPECT_TRUE(m.Done());
  EXPECT_EQ(JsonGrammar::FromRegex(R"([^)\w*][^\D-z\s)\w{2}])").status().code(),
            absl::StatusCode::kInvalidArgument);
}


// Context-free grammars (GBNF / XGrammar's EBNF: structured_outputs.grammar).

std::shared_ptr<const JsonGrammar> Ebnf(const std::string& text) {
  auto g = JsonGrammar::FromEbnf(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

std::string EbnfError(const std::string& text) {
  auto g = JsonGrammar::FromEbnf(text);
  EXPECT_FALSE(g.ok()) << text;
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(g.status().message());
}

// XGrammar's documented example, rules over several lines and comments.
TEST(EbnfGrammarTest, ArithmeticOverSeveralRules) {
  const auto g = Ebnf(R"g(# equations
root ::= expr ("=" expr)*
expr ::= term ([-+*/] term)*
term ::= num
       | "(" expr ")"   # nested
num  ::= [0-9]+)g");
  for (const char* ok : {"1+2", "(3*4)-5=7", "2=2=2", "((1))", "10/2-3"}) EXPECT_TRUE(Whole(g, ok)) << ok;
  EXPECT_FALSE(Whole(g, "1+"));
  EXPECT_FALSE(Whole(g, "(1"));
  EXPECT_TRUE(Prefix(g, "(1"));
  EXPECT_FALSE(Prefix(g, "a"));
  EXPECT_FALSE(Prefix(g, "1 + 2"));  // no whitespace the grammar does not name
  EXPECT_FALSE(Prefix(g, "1)"));
}

TEST(EbnfGrammarTest, RepetitionRanges) {
  const auto g = Ebnf(R"g(root ::= "a"{2,3} "b"{2} "c"{2,} "d"{,1} "e"?)g");
  EXPECT_TRUE(Whole(g, "aabbcc"));
  EXPECT_TRUE(Whole(g, "aaabbccccde"));
  EXPECT_TRUE(Whole(g, "aabbcce"));
  EXPECT_FALSE(Prefix(g, "aaaa"));
  EXPECT_FALSE(Whole(g, "aabbc"));
  EXPECT_FALSE(Prefix(g, "aabbbc"));
  EXPECT_FALSE(Prefix(g, "aabbccdd"));
  EXPECT_FALSE(Whole(g, "abbcc"));
}

TEST(EbnfGrammarTest, ClassesLiteralsAndAnyCharacter) {
  const auto g = Ebnf(R"g(root ::= "\"" [^"\\]* "\"" " " [a-zA-Z_\-] [α-ω]+ "é\t" . "\x41\u00e9")g");
  EXPECT_TRUE(Whole(g, "\"x y\\\" -\xce\xb1\xce\xb2\xc3\xa9\t\nA\xc3\xa9") == false);  // \ inside
  EXPECT_TRUE(Whole(g, "\"x y\" -\xce\xb1\xce\xb2\xc3\xa9\t\nA\xc3\xa9"));
  EXPECT_TRUE(Whole(g, "\"\" _\xcf\x89\xc3\xa9\t\xe2\x9c\x93" "A\xc3\xa9"));  // . takes any character
  EXPECT_FALSE(Prefix(g, "\"\" 1"));
  EXPECT_TRUE(Prefix(g, "\"\" a\xce"));  // the first byte of a Greek letter
  EXPECT_FALSE(Prefix(g, "\"\" a\xc3"));
  EXPECT_FALSE(Prefix(g, "\"\" ab"));  // Latin after the class, not Greek
}

// Nullable rules, an empty literal, and the end allowed where what is left
// may be empty.
TEST(EbnfGrammarTest, EmptyAlternativesAndTheEnd) {
  const auto g = Ebnf(R"g(root ::= ws item (ws "," ws item)* ws
ws ::= [ \n]*
item ::= "x" | "y" opt
opt ::= "" | "!")g");
  EXPECT_TRUE(Whole(g, "x"));
  EXPECT_TRUE(Whole(g, " x , y! ,y \n"));
  EXPECT_FALSE(Whole(g, "x,"));
  GrammarMatcher m(g);
  EXPECT_FALSE(m.CanEnd());
  ASSERT_TRUE(m.Accept("y"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.Done());
  const auto optional = Ebnf(R"g(root ::= "a"?)g");
  GrammarMatcher o(optional);
  EXPECT_TRUE(o.CanEnd());
  ASSERT_TRUE(o.Accept("a"));
  EXPECT_TRUE(o.Done());
}

// Recursion at a rule's end costs no frame: a list of 5000 items matches;
// nesting in the middle takes one a level, up to the limit.
TEST(EbnfGrammarTest, LongRepliesAndDeepNesting) {
  const auto list = Ebnf(R"g(root ::= "a" ("," root)?)g");
  std::string text = "a";
  for (int i = 0; i < 5000; ++i) text += ",a";
  EXPECT_TRUE(Whole(list, text));
  const auto nest = Ebnf(R"g(root ::= "(" root ")" | "x")g");
  EXPECT_TRUE(Whole(nest, std::string(500, '(') + "x" + std::string(500, ')')));
  EXPECT_FALSE(Prefix(nest, std::string(2000, '(')));
}

// An ambiguous grammar whose ways of starting double with each rule (2^40)
// costs a bounded number of steps a byte.
TEST(EbnfGrammarTest, AmbiguityCostsBoundedWork) {
  std::string text;
  for (int i = 0; i < 40; ++i) absl::StrAppend(&text, "r", i, " ::= r", i + 1, " | r", i + 1, "\n");
  absl::StrAppend(&text, "r40 ::= \"a\"+\nroot ::= r0");
  const auto g = Ebnf(text);
  EXPECT_TRUE(Prefix(g, "a"));
}

TEST(EbnfGrammarTest, TheMaskIsEveryTokenThatCanComeNext) {
  int32_t eos = 0;
  const TokenVocabulary vocab = TestVocabulary(&eos);
  const auto g = Ebnf(R"g(root ::= "{" (pair ("," " "? pair)*)? "}"
pair ::= "\"" [a-z]{1,3} "\":" " "? value
value ::= "-"? [0-9]+ ("." [0-9]+)? ("e" [0-9]+)? | "nut" | "tax" | root)g");
  const std::string reply = R"g({"a": 1.5e10,"tx":nut, "u": {"e": -0}})g";
  GrammarMatcher m(g);
  ExpectMaskAlong(vocab, eos, reply, &m);
  EXPECT_TRUE(m.Done());
}

// Replies held to one grammar share its automaton: a reply along states an
// earlier reply built (and masks it kept) still gets exactly the tokens that
// can come next, for a grammar and for a schema.
TEST(SharedGrammarTest, LaterRepliesMaskExactlyAlongEarlierRepliesStates) {
  int32_t eos = 0;
  const TokenVocabulary vocab = TestVocabulary(&eos);
  const auto g = Ebnf(R"g(root ::= "{" (pair ("," " "? pair)*)? "}"
pair ::= "\"" [a-z]{1,3} "\":" " "? value
value ::= "-"? [0-9]+ ("." [0-9]+)? | "nut" | root)g");
  const auto s = Schema(R"({"type": "object", "properties": {"t": {"type": "string", "maxLength": 4},
      "n": {"type": "number"}}})");
  for (const auto& [grammar, replies] :
       std::vector<std::pair<std::shared_ptr<const JsonGrammar>, std::vector<std::string>>>{
           {g, {R"({"a": 1.5,"tx":nut})", R"({"a": {"e": -10}, "u": nut})", R"({"a": 1.5,"tx":nut})"}},
           {s, {R"({"t": "ax", "n": 1})", R"({"n": -0.5, "t": "a\n"})", R"({"t": "ax", "n": 1})"}}}) {
    for (const std::string& reply : replies) {
      GrammarMatcher m(grammar);
      ExpectMaskAlong(vocab, eos, reply, &m);
      EXPECT_TRUE(m.Done()) << reply;
    }
  }
}

// Engines on two threads masking with one grammar at once (the automaton is
// locked): each reply's masks equal those of a grammar of its own.
TEST(SharedGrammarTest, TwoThreadsMaskWithOneGrammar) {
  int32_t eos = 0;
  const TokenVocabulary vocab = TestVocabulary(&eos);
  const std::string text = R"({"type": "object", "properties": {"t": {"type": "string",
      "maxLength": 6}, "u": {"type": "array", "items": {"type": "integer"}}}})";
  const std::vector<std::string> replies = {R"({"t": "abc", "u": [1, 20]})", R"({"u": [], "t": "x"})"};
  const auto masks = [&](const std::shared_ptr<const JsonGrammar>& grammar, const std::string& reply) {
    std::vector<std::vector<uint8_t>> out;
    GrammarMatcher m(grammar);
    for (size_t i = 0; i <= reply.size(); ++i) {
      out.emplace_back(vocab.size());
      m.FillMask(vocab, {eos}, &out.back());
      if (i < reply.size()) EXPECT_TRUE(m.Accept(reply.substr(i, 1)));
    }
    return out;
  };
  std::vector<std::vector<std::vector<uint8_t>>> expected;
  for (const std::string& reply : replies) expected.push_back(masks(Schema(text), reply));
  const auto shared = Schema(text);
  std::vector<std::vector<std::vector<uint8_t>>> got(replies.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < replies.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) got[t] = masks(shared, replies[t]);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(got, expected);
}

TEST(EbnfGrammarTest, MistakesAreRefusedWithWhereTheyAre) {
  EXPECT_EQ(EbnfError(R"g(start ::= "a")g"), "grammar: no rule is named \"root\"");
  EXPECT_EQ(EbnfError("root ::= \"a\" b\n"), "grammar: line 1 column 14: rule \"b\" is used but not defined");
  EXPECT_EQ(EbnfError("root ::= \"a\"\nroot ::= \"b\""), "grammar: line 2 column 1: rule \"root\" is defined twice");
  EXPECT_NE(EbnfError(R"g(root ::= root "a" | "b")g").find("rule \"root\" is left-recursive"), std::string::npos);
  // Through another rule and an optional prefix.
  EXPECT_NE(EbnfError("root ::= x\nx ::= \"a\"? y\ny ::= root \"b\" | \"c\"").find("left-recursive"),
            std::string::npos);
  EXPECT_NE(EbnfError(R"g(root ::= ("a"?)*)g").find("line 1 column 16: a repetition of something that may "
                                                  "match the empty text"),
            std::string::npos);
  EXPECT_NE(EbnfError(R"g(root ::= (= "a") "a")g").find("lookahead"), std::string::npos);
  EXPECT_NE(EbnfError(R"g(root ::= "a\q")g").find("unknown escape \\q"), std::string::npos);
  EXPECT_NE(EbnfError(R"g(root ::= "a)g").find("not closed"), std::string::npos);
  EXPECT_NE(EbnfError(R"g(root ::= [z-a])g").find("backwards"), std::string::npos);
  EXPECT_NE(EbnfError(R"g(root ::= "a"{3,2})g").find("n is below m"), std::string::npos);
  EXPECT_NE(EbnfError(R"g(root ::= ("a")g").find("not closed"), std::string::npos);
  EXPECT_NE(EbnfError("root ::= \"a\"\n  ::= \"b\"").find("line 2 column 3: unexpected \":\""),
            std::string::npos);
  EXPECT_NE(EbnfError(R"g(root ::= [])g").find("empty character class"), std::string::npos);
}

// A schema or grammar no text satisfies was accepted: the reply was 64
// newlines (whitespace the schema allows before a value that never comes)
// and finish_reason "stop". Refused when compiled, naming what loops.
TEST(JsonGrammarTest, SchemasThatMatchNothingAreRefusedByName) {
  for (const auto& [schema, named] : std::vector<std::pair<std::string, std::string>>{
           {R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", "\"#/$defs/a\""},
           {R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
               "$ref": "#/$defs/a"})", "\"#/$defs/b\""},
           {R"({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]})", "\"#\""},
           {R"({"type": "array", "items": {"$ref": "#"}, "minItems": 1})", "\"#\""}}) {
    auto g = JsonGrammar::FromSchema(schema);
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("matches no value"), std::string::npos) << g.status();
    EXPECT_NE(g.status().message().find(named), std::string::npos) << g.status();
  }
  // Recursion with a way out stays: a tree whose children may be absent.
  auto tree = JsonGrammar::FromSchema(
      R"({"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
          "required": ["v"]})");
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_TRUE(Whole(*tree, R"({"v": 1, "kids": [{"v": 2}]})"));
}

TEST(EbnfGrammarTest, RulesThatNeverEndAreRefusedByName) {
  EXPECT_NE(EbnfError("root ::= \"a\" x\nx ::= \"b\" x").find("rule(s) \"root\", \"x\" never end"),
            std::string::npos)
      << EbnfError("root ::= \"a\" x\nx ::= \"b\" x");
  EXPECT_NE(EbnfError("root ::= \"(\" root \")\"").find("never end"), std::string::npos);
  // With a way out, the same recursion is a grammar.
  auto nested = JsonGrammar::FromEbnf("root ::= \"(\" root \")\" | \"x\"");
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_TRUE(Whole(*nested, "((x))"));
}

}  // namespace
}  // namespace tandem
