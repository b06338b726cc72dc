// ByteRegex: a regular expression in Python's `re` syntax (the subset
// structured outputs use: vLLM's guided_regex / structured_outputs.regex and
// JSON schema's `pattern`), compiled to an automaton over the bytes of its
// UTF-8 text, for GrammarMatcher to follow byte by byte.
//
// Supported: literals (UTF-8 included), `.` (any character but a newline),
// classes `[...]` with ranges, negation and escapes, \d \w \s and their
// negations (ASCII, as re.ASCII: a Unicode \w would admit most of the
// vocabulary), \t \n \r \f \v \xhh \uhhhh \Uhhhhhhhh and escaped
// punctuation, groups (capturing, (?:...), (?P<name>...)), `|`, the
// quantifiers * + ? {n} {n,} {,m} {n,m} (lazy and possessive forms match
// the same texts), `^` at the start and `$` at the end. Anything else
// (backreferences, lookaround, inline flags, \b, ...) is INVALID_ARGUMENT
// naming it and its offset. A match is a full match (re.fullmatch).
//
// A pattern that matches no text at all ([^\D\w]) is refused.
//
// The automaton is a DFA over byte classes, made from the Thompson NFA by
// subset construction at compile time (a pattern whose DFA would need more
// than kMaxStates states is refused, as RE2 bounds its DFA), so that a step
// costs one lookup whatever the pattern: a regex from outside cannot make
// each token's mask slower. Immutable after Compile().
#ifndef TANDEM_COMMON_STRUCTURED_BYTE_REGEX_H_
#define TANDEM_COMMON_STRUCTURED_BYTE_REGEX_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class ByteRegex {
 public:
  // At most this many automaton states (counted repetitions copy theirs).
  static constexpr int kMaxStates = 100000;

  static absl::StatusOr<ByteRegex> Compile(std::string_view pattern);

  int32_t start() const { return start_; }
  // The state after byte `c`, or -1: `c` cannot come, or no text after it
  // could end the match (every state a step gives can still end one).
  int32_t Step(int32_t state, uint8_t c) const {
    return next_[static_cast<size_t>(state) * num_classes_ + class_of_[c]];
  }
  // The match may end in this state.
  bool Accepting(int32_t state) const { return accepting_[state] != 0; }
  // Some byte may come in this state.
  bool Live(int32_t state) const { return live_[state] != 0; }
  const std::string& pattern() const { return pattern_; }
  int num_states() const { return static_cast<int>(accepting_.size()); }

 private:
  std::string pattern_;
  uint8_t class_of_[256] = {};
  int num_classes_ = 1;
  std::vector<int32_t> next_;  // [state][class]
  std::vector<uint8_t> accepting_, live_;
  int32_t start_ = 0;
  bool ends_ = false;  // some text takes start_ to an accepting state

  friend class RegexCompiler;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_STRUCTURED_BYTE_REGEX_H_
