// ByteRegex against Python's re.fullmatch (re.ASCII), text by text, on the
// corpus tests/fixtures/make_regex_fixtures.py writes; and the constructs it
// refuses, by name and offset.
#include "common/structured/byte_regex.h"

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

nlohmann::json Fixture() {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/regex_cases.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

// Whether the whole of `text` takes the automaton from a start state to
// the accepting one.
bool FullMatch(const ByteRegex& re, const std::string& text) {
  int32_t state = re.start();
  for (char c : text) {
    state = re.Step(state, static_cast<uint8_t>(c));
    if (state < 0) return false;
  }
  return re.Accepting(state);
}

TEST(ByteRegexTest, FullMatchesAsPythonsRe) {
  const nlohmann::json fixture = Fixture();
  std::map<std::string, ByteRegex> compiled;
  int matches = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string pattern = c["pattern"], text = c["text"];
    auto it = compiled.find(pattern);
    if (it == compiled.end()) {
      auto re = ByteRegex::Compile(pattern);
      ASSERT_TRUE(re.ok()) << pattern << ": " << re.status();
      it = compiled.emplace(pattern, *std::move(re)).first;
    }
    const bool want = c["match"];
    EXPECT_EQ(FullMatch(it->second, text), want) << "/" << pattern << "/ on \"" << text << "\"";
    matches += want;
  }
  EXPECT_GT(compiled.size(), 30u);
  EXPECT_GT(matches, 150);
}

TEST(ByteRegexTest, WhatItCannotMatchIsRefusedByName) {
  const nlohmann::json fixture = Fixture();  // alive through the loop
  for (const auto& e : fixture["errors"]) {
    const std::string pattern = e["pattern"], message = e["message"];
    auto re = ByteRegex::Compile(pattern);
    ASSERT_FALSE(re.ok()) << pattern;
    EXPECT_EQ(re.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(re.status().message()).find(message), std::string::npos)
        << pattern << ": " << re.status();
  }
  // Counted repetitions copy states; past the limit it is refused.
  auto big = ByteRegex::Compile("(.{1000}){1000}");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(std::string(big.status().message()).find("more than 100000"), std::string::npos) << big.status();
  // So would a DFA that blows up (the 21st byte from the end decides).
  auto exponential = ByteRegex::Compile("(a|b)*a(a|b){20}");
  ASSERT_FALSE(exponential.ok());
  // A string of up to 1000 characters but one: 19,001 states.
  auto counted = ByteRegex::Compile("[^\"]{0,1000}");
  ASSERT_TRUE(counted.ok()) << counted.status();
}

// A class that holds no character ([^\D\w]: every digit is a word
// character) leaves branches no text can finish: no step leads into one,
// so every state a step gives can still end a match; a pattern with no
// other branch matches nothing and is refused.
TEST(ByteRegexTest, NoStepLeadsWhereNoMatchCanEnd) {
  auto re = ByteRegex::Compile(R"(ab[^\D\w]|ac|.[^\D\w])");
  ASSERT_TRUE(re.ok()) << re.status();
  const int32_t a = re->Step(re->start(), 'a');
  ASSERT_GE(a, 0);
  EXPECT_EQ(re->Step(a, 'b'), -1);
  ASSERT_GE(re->Step(a, 'c'), 0);
  EXPECT_TRUE(re->Accepting(re->Step(a, 'c')));
  EXPECT_EQ(re->Step(re->start(), 'x'), -1);
  EXPECT_EQ(re->Step(re->start(), 0xC3), -1);  // the first byte of a 2-byte '.'
  EXPECT_TRUE(FullMatch(*re, "ac"));
  EXPECT_FALSE(FullMatch(*re, "ab"));
  for (const char* nothing : {R"([^\D\w])", R"(.[^\D\w])", R"((a|b)[^\D\w]*c[^\W\d\D])"}) {
    auto refused = ByteRegex::Compile(nothing);
    ASSERT_FALSE(refused.ok()) << nothing;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(refused.status().message()).find("matches no text"), std::string::npos)
        << refused.status();
  }
  // A class with nothing in it, repeated zero or more times, still matches.
  EXPECT_TRUE(ByteRegex::Compile(R"(a[^\D\w]*)").ok());
}

}  // namespace
}  // namespace tandem
