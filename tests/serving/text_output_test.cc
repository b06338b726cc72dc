// TextOutput: stop strings over a real byte-level BPE tokenizer, token by
// token, as the decode worker feeds it: where the output ends, whether the
// stop string is kept, and min_tokens' window.
#include "common/serving/text_output.h"

#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace tandem {
namespace {

std::unique_ptr<Tokenizer> ByteLevel() {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizers/bytelevel.json");
  std::stringstream s;
  s << in.rdbuf();
  auto tok = Tokenizer::FromHuggingFaceJson(s.str(), "bytelevel.json");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

// Feeds `ids` one call at a time; returns the text and how many were kept.
std::string Feed(TextOutput& out, const std::vector<int32_t>& ids, size_t* kept = nullptr) {
  std::string text;
  const size_t n = out.AddUntilStop(ids, &text);
  if (kept != nullptr) *kept = n;
  return text + out.Finish();
}

constexpr char kText[] = "The cat sat on the mat. The cat ran.";

TEST(TextOutputTest, StopStringsEndTheTextBeforeOrWithThem) {
  auto tok = ByteLevel();
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = tok->Encode(kText, /*add_special_tokens=*/false);
  ASSERT_EQ(tok->Decode(ids), kText);
  TextOutput plain(tok.get(), true, {});
  EXPECT_EQ(Feed(plain, ids), kText);
  TextOutput before(tok.get(), true, {"cat", "never"});
  size_t kept = 0;
  EXPECT_EQ(Feed(before, ids, &kept), "The ");
  EXPECT_EQ(before.matched_stop(), "cat");
  EXPECT_LT(kept, ids.size());
  TextOutput with(tok.get(), true, {"cat"}, /*include_stop=*/true);
  EXPECT_EQ(Feed(with, ids), "The cat");
  TextOutput across(tok.get(), true, {"at on th"});  // spans several tokens
  EXPECT_EQ(Feed(across, ids), "The cat s");
}

// The stop token that ended a request (EOS or a stop_token_ids id) is kept as
// a token but has no text, even with special tokens' text kept, unless stop
// strings are included (vLLM's detokenizer); a stop string before it ends
// the output first.
TEST(TextOutputTest, AStopTokensTextIsLeftOut) {
  auto tok = ByteLevel();
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> ids = tok->Encode(kText, false);
  ids.push_back(1);  // <|end_of_text|>, special
  for (const std::vector<std::string>& stop : {std::vector<std::string>{}, {"never"}}) {
    TextOutput kept(tok.get(), /*skip_special_tokens=*/false, stop);
    std::string text;
    EXPECT_EQ(kept.AddUntilStop(ids, &text, /*stop_token=*/true), ids.size());
    EXPECT_EQ(text + kept.Finish(), kText);
    TextOutput shown(tok.get(), false, stop);
    text.clear();
    EXPECT_EQ(shown.AddUntilStop(ids, &text), ids.size());
    EXPECT_EQ(text + shown.Finish(), std::string(kText) + "<|end_of_text|>");
    TextOutput included(tok.get(), false, stop, /*include_stop=*/true);
    text.clear();
    included.AddUntilStop(ids, &text, true);
    EXPECT_EQ(text + included.Finish(), std::string(kText) + "<|end_of_text|>");
  }
  TextOutput before(tok.get(), false, {"mat"});
  std::string text;
  EXPECT_LT(before.AddUntilStop(ids, &text, true), ids.size() - 1);
  EXPECT_EQ(text + before.Finish(), "The cat sat on the ");
}

// vLLM's detokenizer: the text of the first min_tokens tokens is not looked
// at for stop strings; later text is, with the few bytes before it that a
// match across the point needs.
TEST(TextOutputTest, MinTokensHidesTheFirstTokensTextFromStopStrings) {
  auto tok = ByteLevel();
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = tok->Encode(kText, false);
  uint32_t first_cat = 0;  // tokens up to the end of the first "cat"
  while (tok->Decode({ids.begin(), ids.begin() + first_cat}).find("cat") == std::string::npos) {
    ++first_cat;
  }
  TextOutput past(tok.get(), true, {"cat"}, false, /*min_tokens=*/first_cat);
  EXPECT_EQ(Feed(past, ids), "The cat sat on the mat. The ");
  TextOutput short_of_it(tok.get(), true, {"cat"}, false, first_cat - 1);
  EXPECT_EQ(Feed(short_of_it, ids), "The ");
  // A stop string that starts in the hidden text and ends after it is found.
  uint32_t through_sat = first_cat;
  while (tok->Decode({ids.begin(), ids.begin() + through_sat}).find("sat") == std::string::npos) {
    ++through_sat;
  }
  TextOutput straddle(tok.get(), true, {"cat sat"}, false, through_sat - 1);
  EXPECT_EQ(Feed(straddle, ids), "The ");
}

}  // namespace
}  // namespace tandem
