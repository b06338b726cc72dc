// Structured outputs: a reply held to a JSON schema, to any JSON object, or
// to one of a list of strings (vLLM's structured_outputs json / json_object
// / choice, OpenAI's response_format). The sampler masks, at each step, the
// tokens whose bytes could not continue the reply within the grammar, and
// allows EOS only once the reply is whole.
//
// The schema subset: type (one or a list), properties, required,
// additionalProperties (false unless given: a schema with properties admits
// no other keys, as OpenAI's strict mode; true or a schema to allow them),
// items, minItems, maxItems, minLength, maxLength, pattern (a full match
// of the string's text, in ByteRegex's subset; such a string's characters
// stand as they are, without escapes), enum, const, anyOf and
// oneOf (both as "one of these matches"), allOf of one schema, $ref to
// "#", "#/$defs/..." or "#/definitions/..." (recursion included), and the
// annotations title, description, default, examples, format, $schema, $id,
// $comment, deprecated, readOnly, writeOnly. A keyword that asserts
// something else (minimum, multipleOf, ...) is refused by name rather than
// ignored. A reply may also be held to a regex (vLLM's structured_outputs
// regex): its text, not a JSON value, fully matches it; or to a context-free
// grammar (structured_outputs grammar, FromEbnf). Keys may come in any order; whitespace between tokens
// is allowed up to kMaxWhitespace bytes in a row, none after the value.
//
// Matching is byte by byte over a set of alternatives (a stack of frames
// each), so unions and keys that share a prefix stay open until a byte
// tells them apart. FillMask numbers the sets it meets and keeps the set each
// byte leads to (a DFA built lazily over the pushdown states, shared by every
// reply held to the same JsonGrammar), so a state met again, by this reply
// or an earlier one, costs table lookups.
#ifndef TANDEM_COMMON_STRUCTURED_JSON_GRAMMAR_H_
#define TANDEM_COMMON_STRUCTURED_JSON_GRAMMAR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "common/structured/byte_regex.h"

namespace tandem {

inline constexpr int kMaxWhitespace = 64;

// The bytes each token stands for in generated text, indexed for FillMask.
class TokenVocabulary {
 public:
  // bytes[id]: the token's bytes in the middle of a text; `never[id]`: a
  // token no grammar allows (special tokens; EOS is allowed by FillMask's
  // own rule).
  TokenVocabulary(std::vector<std::string> bytes, const std::vector<bool>& never);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

 private:
  friend class GrammarMatcher;
  std::vector<std::string> bytes_;
  std::vector<int32_t> order_;    // the ids a grammar may allow, sorted by bytes
  std::vector<uint32_t> lcp_;     // bytes shared with the previous id of order_
  std::vector<uint8_t> plain_;    // every byte may stand as it is inside a JSON string
};

// FillMask's states and their moves (json_grammar.cc).
struct GrammarAutomaton;

class JsonGrammar {
 public:
  // INVALID_ARGUMENT names the keyword and where it is in the schema.
  static absl::StatusOr<std::shared_ptr<const JsonGrammar>> FromSchema(const std::string& schema_json);
  // The reply is exactly one of `choices` (non-empty strings).
  static absl::StatusOr<std::shared_ptr<const JsonGrammar>> FromChoices(std::vector<std::string> choices);
  // The reply's text fully matches `pattern` (ByteRegex's subset).
  static absl::StatusOr<std::shared_ptr<const JsonGrammar>> FromRegex(const std::string& pattern);
  // The reply's text is a sentence of a context-free grammar in GBNF, the
  // EBNF of llama.cpp's `grammar` and XGrammar's (vLLM's
  // structured_outputs.grammar): rules `name ::= ...` (names of letters,
  // digits, _ and -; the reply is the rule `root`), string literals "..."
  // and character classes [...] / [^...] with ranges and the escapes \n \r
  // \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH, `.` (any character), groups
  // ( ), alternatives |, and x* x+ x? x{m} x{m,} x{,n} x{m,n}; # comments to
  // the end of a line; newlines are spaces (a rule ends where the next
  // `name ::=` starts). Refused, with the line and column: left recursion
  // (a rule that can reach itself before a character: write it on the
  // right), a repetition other than ? of something that may be empty,
  // XGrammar's lookahead assertions (= ...), undefined or twice-defined
  // rules. No whitespace is implied anywhere: the grammar says where it goes.
  static absl::StatusOr<std::shared_ptr<const JsonGrammar>> FromEbnf(const std::string& grammar);

  // What it was made from: a schema's text, the choices, the regex or the
  // grammar's text.
  const std::string& schema() const { return schema_; }
  const std::vector<std::string>& choices() const { return choices_; }
  const std::string& regex() const { return regex_; }
  const std::string& grammar() const { return grammar_; }

  struct Node;
  ~JsonGrammar();

 private:
  friend class GrammarMatcher;
  friend class SchemaCompiler;
  friend class EbnfCompiler;
  JsonGrammar();
  std::vector<Node> nodes_;
  std::vector<std::string> texts_;  // literals: keys (quoted), enum values (as JSON), choices
  std::vector<ByteRegex> regexes_;  // patterns of strings, or the reply's regex
  int root_ = 0;
  std::string schema_;
  std::vector<std::string> choices_;
  std::string regex_;
  std::string grammar_;
  // FillMask's automaton, one for every reply held to this grammar (a
  // cache: it depends on the grammar and the vocabulary only), so a request
  // whose grammar another request met before starts with its states built
  // and its first masks kept. The lock: engines on several threads may mask
  // with one grammar (SamplingParams from FromProto share it).
  mutable Mutex automaton_mu_;
  mutable std::unique_ptr<GrammarAutomaton> automaton_ ABSL_GUARDED_BY(automaton_mu_);
};

// A reply's progress through a grammar. Copyable.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const JsonGrammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(const GrammarMatcher&);
  GrammarMatcher& operator=(const GrammarMatcher&);

  // Takes `bytes` if the grammar allows them next (and returns true), else
  // changes nothing and returns false.
  bool Accept(std::string_view bytes);
  // The reply so far is whole: EOS may come now.
  bool CanEnd() const;
  // Nothing but EOS may come.
  bool Done() const;
  // allowed[id] = 1 for each token of `vocab` the grammar allows next, 0
  // otherwise; `eos_ids` are allowed exactly when CanEnd() (and, should no
  // other token fit, regardless: a reply never has nothing to sample).
  // Ids past the vocabulary (up to allowed->size()) are 0.
  void FillMask(const TokenVocabulary& vocab, const std::vector<int32_t>& eos_ids,
                std::vector<uint8_t>* allowed) const;

  struct State;

 private:
  std::shared_ptr<const JsonGrammar> grammar_;
  std::unique_ptr<State> state_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_STRUCTURED_JSON_GRAMMAR_H_
