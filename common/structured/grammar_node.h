// The node a JsonGrammar is made of: shared by the schema compiler and the
// matcher (json_grammar.cc) and the grammar compiler (ebnf_grammar.cc).
// Internal to common/structured.
#ifndef TANDEM_COMMON_STRUCTURED_GRAMMAR_NODE_H_
#define TANDEM_COMMON_STRUCTURED_GRAMMAR_NODE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "common/structured/json_grammar.h"

namespace tandem {

// A compiled node: of a schema, or of a grammar (its sequences, repetitions,
// unions, literals and one-character regexes).
struct JsonGrammar::Node {
  enum Kind : uint8_t {
    kAny, kObject, kArray, kString, kNumber, kInteger, kBoolean, kNull, kUnion, kLiteral, kRegex,
    kSequence,  // a grammar's: `alternatives` one after another (none: the empty text)
    kRepeat,    // a grammar's: `items` min_items to max_items (-1: any) times
  };
  Kind kind = kAny;
  // kObject: each property's key (a texts_ index, the key as JSON, quoted)
  // and value node; which are required; the node of other keys' values, or
  // -1 when no other key is allowed.
  std::vector<std::pair<int, int>> properties;
  uint64_t required = 0;
  int additional = -1;
  // kArray (and kRepeat: its body and counts)
  int items = 0;
  int min_items = 0, max_items = -1;
  // kString (characters)
  int min_length = 0, max_length = -1;
  // kString: its text's pattern; kRegex: the reply's. A regexes_ index, or -1.
  int regex = -1;
  // kUnion: the alternatives; kLiteral: texts_ indices, one of which is the
  // value; kSequence: its elements
  std::vector<int> alternatives;
  // A choice: the text exactly, no whitespace before it (JSON values may have some).
  bool exact = false;
  // A grammar's node that may match the empty text.
  bool nullable = false;
};

// Which nodes match some text: false for one whose every way leads back to
// itself before it could end (a $ref to itself, `a ::= a "x"`, an object
// that requires one), so that a schema or grammar that cannot be satisfied
// is refused when it is compiled rather than generating until max_tokens.
std::vector<bool> ProductiveNodes(const std::vector<JsonGrammar::Node>& nodes);

}  // namespace tandem

#endif  // TANDEM_COMMON_STRUCTURED_GRAMMAR_NODE_H_
