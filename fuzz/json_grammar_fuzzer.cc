// Structured outputs' grammars on outside bytes: the input is a JSON schema,
// then a NUL, then a reply; the schema is compiled (or refused) and the
// reply's bytes are fed one at a time, with the token mask over a small
// vocabulary of JSON pieces at each. Nothing may crash, hang, recurse
// without bound or leak, and the mask must allow what Accept() takes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/structured/json_grammar.h"
#include "fuzz/mask_check.h"

namespace {

const tandem::TokenVocabulary& Pieces() {
  static const tandem::TokenVocabulary& v = tandem::FuzzVocabulary(
      {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "1", "-", ".", "e", "a",
       "\\", "u", "0", "true", "false", "null", "\"a\"", "{\"", "\":", "\", \""});
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string schema = input.substr(0, nul);
  const std::string reply = nul == std::string::npos ? "" : input.substr(nul + 1);
  auto g = tandem::JsonGrammar::FromSchema(schema);
  if (!g.ok()) return 0;
  tandem::CheckMaskAlong(*g, Pieces(), reply);
  return 0;
}
