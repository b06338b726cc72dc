// Regex structured outputs on outside bytes: the input is a pattern, then a
// NUL, then a reply; the pattern is compiled (or refused) and the reply's
// bytes are fed one at a time, with the token mask over a small vocabulary
// (ASCII, multi-byte UTF-8 and pieces of it) at each. Nothing may crash,
// hang or leak, and the mask must allow exactly what Accept() takes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/structured/json_grammar.h"
#include "fuzz/mask_check.h"

namespace {

const tandem::TokenVocabulary& Pieces() {
  static const tandem::TokenVocabulary& v = tandem::FuzzVocabulary(
      {"a", "b", "ab", "ba", "0", "9", "12", "-", ".", " ", "\n", "_", "Z", "\xc3\xa9",
       "\xe2\x9c\x93", "\xc3", "\xa9", "\xf0\x9f\x98\x80", "a\n", "{", "}", "\"", "\\"});
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string pattern = input.substr(0, nul);
  const std::string reply = nul == std::string::npos ? "" : input.substr(nul + 1);
  auto g = tandem::JsonGrammar::FromRegex(pattern);
  if (!g.ok()) return 0;
  tandem::CheckMaskAlong(*g, Pieces(), reply);
  return 0;
}
