// Context-free grammar structured outputs on outside bytes: the input is a
// GBNF grammar, then a NUL, then a reply; the grammar is compiled (or
// refused) and the reply's bytes are fed one at a time, with the token mask
// over a small vocabulary (ASCII, multi-byte UTF-8 and pieces of it) at
// each. Nothing may crash, hang, recurse without bound or leak, and the mask
// (made through the matcher's lazily built automaton) must allow exactly
// what Accept() takes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/structured/json_grammar.h"
#include "fuzz/mask_check.h"

namespace {

const tandem::TokenVocabulary& Pieces() {
  static const tandem::TokenVocabulary& v = tandem::FuzzVocabulary(
      {"a", "b", "ab", "ba", "aa", "0", "9", "12", "-", ".", " ", "\n", "(", ")", "x", "\"",
       "\\", "{", "}", ",", "\xc3\xa9", "\xc3", "\xa9", "\xe2\x9c\x93", "a(", ")b"});
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string grammar = input.substr(0, nul);
  const std::string reply = nul == std::string::npos ? "" : input.substr(nul + 1);
  auto g = tandem::JsonGrammar::FromEbnf(grammar);
  if (!g.ok()) return 0;
  tandem::CheckMaskAlong(*g, Pieces(), reply);
  return 0;
}
