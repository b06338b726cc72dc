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

namespace {

const tandem::TokenVocabulary& Pieces() {
  static const tandem::TokenVocabulary* v = [] {
    std::vector<std::string> bytes;
    for (const char* p : {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "1", "-", ".", "e", "a",
                          "\\", "u", "0", "true", "false", "null", "\"a\"", "{\"", "\":", "\", \""}) {
      bytes.push_back(p);
    }
    bytes.push_back("");  // EOS
    return new tandem::TokenVocabulary(bytes, std::vector<bool>(bytes.size(), false));
  }();
  return *v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string schema = input.substr(0, nul);
  const std::string reply = nul == std::string::npos ? "" : input.substr(nul + 1);
  auto g = tandem::JsonGrammar::FromSchema(schema);
  if (!g.ok()) return 0;
  const tandem::TokenVocabulary& vocab = Pieces();
  const int32_t eos = vocab.size() - 1;
  tandem::GrammarMatcher m(*g);
  std::vector<uint8_t> allowed(vocab.size());
  for (size_t i = 0; i < reply.size() && i < 256; ++i) {
    m.FillMask(vocab, {eos}, &allowed);
    for (int32_t id = 0; id < eos; ++id) {
      tandem::GrammarMatcher copy = m;
      if (copy.Accept(vocab.bytes(id)) != (allowed[id] == 1)) __builtin_trap();
    }
    if (!m.Accept(reply.substr(i, 1))) break;
  }
  return 0;
}
