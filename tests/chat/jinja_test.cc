// The Jinja2 interpreter against Python's jinja2, byte for byte, on the
// corpus tests/fixtures/make_chat_template_fixtures.py renders (SmolLM2's
// template, templates in the style of Qwen2.5, Llama 3.1, Mistral and Gemma,
// and one template per construct, over fixed and random conversations);
// plus the errors and limits a hostile or unsupported template meets.
#include <cmath>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/chat/chat_template.h"
#include "common/chat/jinja.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

nlohmann::ordered_json LoadFixture() {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/chat_templates.json");
  EXPECT_TRUE(in.good());
  return nlohmann::ordered_json::parse(in);
}

TEST(JinjaTest, MatchesPythonJinja2OnTheCorpus) {
  const nlohmann::ordered_json fixture = LoadFixture();
  int rendered = 0, errors = 0;
  std::set<std::string> templates_seen;
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string name = c["template"];
    templates_seen.insert(name);
    const nlohmann::ordered_json kwargs = c["kwargs"];
    auto t = ChatTemplate::Create(fixture["templates"][name], name,
                                  kwargs.value("bos_token", std::string()),
                                  kwargs.value("eos_token", std::string()));
    if (c.value("parse_error", false)) {
      EXPECT_FALSE(t.ok()) << "jinja2: " << c["error"];
      ++errors;
      continue;
    }
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) continue;
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
    for (const auto& [k, v] : kwargs.items()) {
      if (k != "bos_token" && k != "eos_token") extra[k] = v;
    }
    auto out = t->Render(fixture["conversations"][c["conversation"].get<int>()],
                         c["tools"].get<bool>() ? fixture["tools"] : nlohmann::ordered_json(nullptr),
                         c["add_generation_prompt"].get<bool>(), extra);
    if (c.contains("error")) {
      EXPECT_FALSE(out.ok()) << "jinja2 failed (" << c["error"] << ") but we rendered:\n" << *out;
      if (!out.ok()) {
        EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
      }
      ++errors;
    } else {
      EXPECT_TRUE(out.ok()) << out.status();
      if (out.ok()) {
        EXPECT_EQ(*out, c["expected"].get<std::string>());
      }
      ++rendered;
    }
  }
  EXPECT_EQ(templates_seen.size(), fixture["templates"].size());
  EXPECT_GT(rendered, 200);
  EXPECT_GT(errors, 20);
}

TEST(JinjaTest, RaiseExceptionAndUndefinedSayWhatWentWrong) {
  const nlohmann::ordered_json fixture = LoadFixture();
  auto mistral = ChatTemplate::Create(fixture["templates"]["mistral_style"], "mistral", "<s>", "</s>");
  ASSERT_TRUE(mistral.ok());
  auto out = mistral->Render(nlohmann::ordered_json::parse(R"([{"role": "assistant", "content": "x"}])"),
                             nullptr, true);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("Conversation roles must alternate"), std::string::npos)
      << out.status();

  auto t = jinja::Template::Parse("line one\n{{ messages[0].nope.deeper }}");
  ASSERT_TRUE(t.ok());
  jinja::Value g = jinja::Value::Dict();
  g.dict().Set("messages", jinja::Value::FromJson(nlohmann::ordered_json::parse(R"([{"role": "user"}])")));
  auto r = t->Render(g);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("'dict object' has no attribute 'nope'"), std::string::npos)
      << r.status();
}

TEST(JinjaTest, WhatItCannotDoIsAnErrorNamingTheConstruct) {
  struct Case {
    const char* source;
    const char* needle;
  };
  for (const Case& c : {Case{"x\n{{ a|nosuch }}", "line 2: unknown filter 'nosuch'"},
                        Case{"{% include 'other.j2' %}", "unsupported tag 'include'"},
                        Case{"{% if a is frobbed %}{% endif %}", "unknown test 'frobbed'"},
                        Case{"{% for x in y recursive %}{% endfor %}", "recursive loops"},
                        Case{"{% if true %}open", "expected {% endif %}"},
                        Case{"{{ 'unterminated }}", "never closed"},
                        Case{"{{ f(*args) }}", "*args"}}) {
    auto t = jinja::Template::Parse(c.source);
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.needle), std::string::npos)
        << c.source << " -> " << t.status();
  }
  // A method it does not implement fails when met, as UNIMPLEMENTED.
  auto t = jinja::Template::Parse("{{ '{}'.format(1) }}");
  ASSERT_TRUE(t.ok());
  auto r = t->Render(jinja::Value::Dict());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_NE(r.status().message().find("format"), std::string::npos);
}

TEST(JinjaTest, HostileTemplatesStopAtTheLimits) {
  jinja::RenderLimits limits;
  limits.max_steps = 100000;
  limits.max_output_bytes = 1 << 20;
  for (const char* source :
       {"{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        // Empty bodies: each iteration is a step of its own (these ran for
        // minutes), and a string doubled in a loop stops at a bound (this
        // one ended the process with std::bad_alloc).
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% set ns = namespace(s='a') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{% set ns = namespace(s='a') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
        // Copies kept alive, each within every per-value bound: the budget
        // of bytes built stops it.
        "{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = ns.l + ['x' * 1000000] %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "{{ range(1000000) }}",
        "{{ 'ab' * 100000000 }}"}) {
    auto t = jinja::Template::Parse(source);
    ASSERT_TRUE(t.ok()) << source;
    auto r = t->Render(jinja::Value::Dict(), limits);
    EXPECT_FALSE(r.ok()) << source;
  }
  {
    auto t = jinja::Template::Parse(
        "{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = ns.l + ['x' * 1000000] %}{% endfor %}");
    ASSERT_TRUE(t.ok());
    auto r = t->Render(jinja::Value::Dict(), limits);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(r.status().message().find("bytes of strings and lists"), std::string::npos) << r.status();
  }
  // Deep nesting is refused at parse time, not by overflowing the stack.
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_FALSE(jinja::Template::Parse(deep).ok());
  std::string blocks;
  for (int i = 0; i < 500; ++i) blocks += "{% if true %}";
  EXPECT_FALSE(jinja::Template::Parse(blocks).ok());
}

// A namespace holding itself renders as jinja2 does and is freed with the
// render (the ASan build's leak check sees a cycle left behind).
TEST(JinjaTest, NamespaceCyclesRenderAndAreFreed) {
  for (const char* source :
       {"{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns.me.me.a }}",
        "{% set ns = namespace(a=1) %}{% set ns.l = [ns, {'k': ns}] %}{{ ns.l[1].k.a }}",
        "{% set ns = namespace(a=1) %}{% set ns.get = ns.items %}{{ ns.a }}",
        "{% set x = namespace(a=1) %}{% set y = namespace(x=x) %}{% set x.y = y %}{{ x.y.x.a }}"}) {
    auto t = jinja::Template::Parse(source);
    ASSERT_TRUE(t.ok()) << source;
    auto r = t->Render(jinja::Value::Dict());
    ASSERT_TRUE(r.ok()) << source << ": " << r.status();
    EXPECT_EQ(*r, "1") << source;
  }
}

// A macro kept in a namespace past the loop body that defined it: an error
// naming the macro, not a read of the body's ended scope.
TEST(JinjaTest, MacroCalledAfterItsScopeEndedIsAnError) {
  auto t = jinja::Template::Parse(
      "{% set ns = namespace() %}{% for i in [1, 2] %}{% macro m() %}[{{ i }}]{% endmacro %}"
      "{% set ns.m = m %}{{ ns.m() }}{% endfor %}{{ ns.m() }}");
  ASSERT_TRUE(t.ok());
  auto r = t->Render(jinja::Value::Dict());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("macro 'm' called after the scope that defined it ended"),
            std::string::npos)
      << r.status();
}

// Integers are 64-bit here (Python's are unbounded): a result beyond them,
// and NaN or infinity made an int, is an error naming the operation, never
// a wrapped value or undefined behaviour (UBSan checks this in CI).
TEST(JinjaTest, IntegersBeyond64BitsAreAnError) {
  for (const char* source :
       {"{{ 7.7e26|int }}", "{{ '7.7e26'|int }}", "{{ (1e308 * 10)|int }}", "{{ '%d'|format(7.7e26) }}",
        "{{ 7.7e26 is even }}", "{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
        "{{ 9223372036854775807 * 2 }}", "{{ (-9223372036854775807 - 1) // -1 }}",
        "{{ -(-9223372036854775807 - 1) }}", "{{ (-9223372036854775807 - 1)|abs }}"}) {
    auto t = jinja::Template::Parse(source);
    ASSERT_TRUE(t.ok()) << source << ": " << t.status();
    auto r = t->Render(jinja::Value::Dict());
    EXPECT_FALSE(r.ok()) << source << " rendered " << *r;
  }
  // In range, Python's answers.
  for (const auto& [source, want] : std::vector<std::pair<const char*, const char*>>{
           {"{{ 2.9|int }}{{ -2.9|int }}", "2-2"},
           {"{{ (-9223372036854775807 - 1) % -1 }}", "0"},
           {"{{ 9223372036854775806 + 1 }}", "9223372036854775807"},
           {"{{ range(9223372036854775800, 9223372036854775807, 4)|list }}",
            "[9223372036854775800, 9223372036854775804]"},
           {"{{ range(9223372036854775800, 9223372036854775807, 5)|list }}",  // the next would overflow
            "[9223372036854775800, 9223372036854775805]"}}) {
    auto t = jinja::Template::Parse(source);
    ASSERT_TRUE(t.ok()) << source;
    auto r = t->Render(jinja::Value::Dict());
    ASSERT_TRUE(r.ok()) << source << ": " << r.status();
    EXPECT_EQ(*r, want) << source;
  }
}

// The int and float filters read strings as Python's int(s, base) and
// float(s) do (underscores between digits, prefixes with a base, no
// hexadecimal floats), and fall back as jinja2's filters do: NaN, and a
// string of infinity, give the default. Answers from Python's jinja2 3.1.
TEST(JinjaTest, IntAndFloatFiltersReadStringsAsPython) {
  for (const auto& [source, want] : std::vector<std::pair<const char*, const char*>>{
           {"{{ x|int }}", "0"},
           {"{{ 'nan'|int }}", "0"},
           {"{{ 'NaN'|int(7) }}", "7"},
           {"{{ 'inf'|int }}", "0"},
           {"{{ '-Infinity'|int(3) }}", "3"},
           {"{{ '0x10'|int }}", "0"},
           {"{{ '0x10'|int(base=16) }}", "16"},
           {"{{ '0x_1f'|int(0, 16) }}", "31"},
           {"{{ '1f'|int(base=16) }}", "31"},
           {"{{ '0b101'|int(base=0) }}", "5"},
           {"{{ '010'|int(base=0) }}", "10"},
           {"{{ '00'|int(base=0) }}", "0"},
           {"{{ '0o17'|int(base=8) }}", "15"},
           {"{{ '12'|int(base=99) }}", "12"},
           {"{{ 'z'|int(base=36) }}", "35"},
           {"{{ '1_000'|int }}", "1000"},
           {"{{ '1_000.5'|int }}", "1000"},
           {"{{ '1__0'|int }}", "0"},
           {"{{ '_1'|int }}", "0"},
           {"{{ '1_'|int }}", "0"},
           {"{{ 'nan(1)'|int }}", "0"},
           {"{{ ' -12 '|int }}", "-12"},
           {"{{ '+5'|int }}", "5"},
           {"{{ '1e3'|int }}", "1000"},
           {"{{ '.5e1'|int }}", "5"},
           {"{{ '5.'|int }}", "5"},
           {"{{ '.'|int }}", "0"},
           {"{{ '1e'|int }}", "0"},
           {"{{ '0_7'|int }}", "7"},
           {"{{ '07'|int }}", "7"},
           {"{{ '-9223372036854775808'|int }}", "-9223372036854775808"},
           {"{{ '99999999999999999999x'|int }}", "0"},
           {"{{ none|int }}", "0"},
           {"{{ [1]|int(4) }}", "4"},
           {"{{ '0x1p3'|float }}", "0.0"},
           {"{{ '1_0.5'|float }}", "10.5"},
           {"{{ '1._5'|float }}", "0.0"},
           {"{{ '1.5_'|float }}", "0.0"},
           {"{{ 'infinity'|float }}", "inf"},
           {"{{ '-NAN'|float }}", "nan"},
           {"{{ '1e1_0'|float }}", "10000000000.0"},
           {"{{ 'abc'|float(2.5) }}", "2.5"}}) {
    auto t = jinja::Template::Parse(source);
    ASSERT_TRUE(t.ok()) << source << ": " << t.status();
    jinja::Value g = jinja::Value::Dict();
    g.dict().Set("x", jinja::Value::Float(std::nan("")));
    auto r = t->Render(g);
    ASSERT_TRUE(r.ok()) << source << ": " << r.status();
    EXPECT_EQ(*r, want) << source;
  }
  // Beyond 64 bits: Python's int is unbounded, these are an error.
  for (const char* source : {"{{ '9223372036854775808'|int }}", "{{ '1.5e300'|int }}"}) {
    auto t = jinja::Template::Parse(source);
    ASSERT_TRUE(t.ok()) << source;
    EXPECT_FALSE(t->Render(jinja::Value::Dict()).ok()) << source;
  }
}

TEST(JinjaTest, PythonFloatRepr) {
  for (auto [d, s] : std::vector<std::pair<double, const char*>>{
           {1.0, "1.0"}, {0.1, "0.1"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"},
           {1.5e-5, "1.5e-05"}, {0.0001, "0.0001"}, {-2.5, "-2.5"}, {123456.789, "123456.789"}}) {
    EXPECT_EQ(jinja::FormatPythonFloat(d), s);
  }
}

}  // namespace
}  // namespace tandem
