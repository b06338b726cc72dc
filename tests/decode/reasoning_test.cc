// Reasoning split from the answer as vLLM's qwen3 / deepseek_r1 parsers do,
// and the same however a streamed reply is cut into pieces.
#include "decode_worker/reasoning.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

using Parts = ReasoningSplitter::Parts;

Parts Whole(const std::string& text, bool thinking = true,
            ReasoningParser parser = ReasoningParser::kQwen3) {
  return ReasoningSplitter::Split(parser, thinking, text);
}

// The reply streamed in the given pieces, each piece's parts appended.
Parts Streamed(const std::vector<std::string>& pieces, bool thinking = true) {
  ReasoningSplitter s(ReasoningParser::kQwen3, thinking);
  Parts all;
  for (const std::string& p : pieces) {
    Parts got = s.Add(p);
    all.reasoning += got.reasoning;
    all.content += got.content;
  }
  Parts rest = s.Finish();
  all.reasoning += rest.reasoning;
  all.content += rest.content;
  return all;
}

TEST(ReasoningTest, ThinkingBeforeTheCloseTagIsReasoning) {
  // The model opens its thinking itself (Qwen3's first templates).
  Parts p = Whole("<think>\nFrance's capital.\n</think>\n\nParis.");
  EXPECT_EQ(p.reasoning, "\nFrance's capital.\n");
  EXPECT_EQ(p.content, "\n\nParis.");
  // The template opened it in the prompt (Qwen3.5, DeepSeek-R1 distills).
  p = Whole("France's capital.</think>Paris.", true, ReasoningParser::kDeepSeekR1);
  EXPECT_EQ(p.reasoning, "France's capital.");
  EXPECT_EQ(p.content, "Paris.");
  // Only the first close tag ends the reasoning; the answer keeps the rest.
  p = Whole("a</think>b</think>c");
  EXPECT_EQ(p.reasoning, "a");
  EXPECT_EQ(p.content, "b</think>c");
}

TEST(ReasoningTest, UnclosedThinkingIsReasoningUnlessThinkingIsOff) {
  Parts p = Whole("<think>still thinking when max_tokens came");
  EXPECT_EQ(p.reasoning, "still thinking when max_tokens came");
  EXPECT_EQ(p.content, "");
  // enable_thinking = false: no reasoning at all, tags or not.
  p = Whole("Paris.", /*thinking=*/false);
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "Paris.");
  p = Whole("<think>x</think>y", /*thinking=*/false);
  EXPECT_EQ(p.content, "<think>x</think>y");
  // No parser: every reply is all content.
  p = Whole("<think>x</think>y", true, ReasoningParser::kNone);
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "<think>x</think>y");
}

TEST(ReasoningTest, AStreamedReplyGivesTheSamePartsWhereverItIsCut) {
  const std::vector<std::string> replies = {
      "<think>\nLet me see: <b> is bold.\n</think>\n\nParis is the capital.",
      "No open tag here.</think>Answer </thi and more",
      "<think>never closed <",
      "</think>",
      "<thi",
      "plain",
  };
  for (const std::string& reply : replies) {
    for (bool thinking : {true, false}) {
      SCOPED_TRACE(reply + (thinking ? " (thinking)" : " (not thinking)"));
      const Parts whole = Whole(reply, thinking);
      // Every cut into two and three pieces, and byte by byte.
      for (size_t i = 0; i <= reply.size(); ++i) {
        for (size_t j = i; j <= reply.size(); ++j) {
          const Parts got =
              Streamed({reply.substr(0, i), reply.substr(i, j - i), reply.substr(j)}, thinking);
          ASSERT_EQ(got.reasoning, whole.reasoning) << i << " " << j;
          ASSERT_EQ(got.content, whole.content) << i << " " << j;
        }
      }
      std::vector<std::string> bytes;
      for (char c : reply) bytes.emplace_back(1, c);
      const Parts got = Streamed(bytes, thinking);
      EXPECT_EQ(got.reasoning, whole.reasoning);
      EXPECT_EQ(got.content, whole.content);
    }
  }
}

TEST(ReasoningTest, APieceThatMayEndInATagIsHeldBack) {
  ReasoningSplitter s(ReasoningParser::kQwen3, true);
  EXPECT_EQ(s.Add("I think</th").reasoning, "I think");
  const Parts next = s.Add("ink>Paris");
  EXPECT_EQ(next.reasoning, "");
  EXPECT_EQ(next.content, "Paris");
  // After the answer began nothing is held.
  EXPECT_EQ(s.Add("</thi").content, "</thi");
}

TEST(ReasoningTest, ParsersByVllmName) {
  EXPECT_EQ(*ReasoningParserByName(""), ReasoningParser::kNone);
  EXPECT_EQ(*ReasoningParserByName("qwen3"), ReasoningParser::kQwen3);
  EXPECT_EQ(*ReasoningParserByName("deepseek_r1"), ReasoningParser::kDeepSeekR1);
  const auto bad = ReasoningParserByName("granite");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "--reasoning-parser='granite': expected qwen3, deepseek_r1 or empty (none)");
}

}  // namespace
}  // namespace tandem
