// The structured-output fuzzers' check: `reply` fed to a matcher of `g` a
// byte at a time (at most 256), the token mask over `vocab` (its last id
// EOS) before each byte, which must allow exactly what Accept() takes.
#ifndef TANDEM_FUZZ_MASK_CHECK_H_
#define TANDEM_FUZZ_MASK_CHECK_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common/structured/json_grammar.h"

namespace tandem {

// A vocabulary of `pieces` and, last, EOS (no bytes); made once, kept.
inline const TokenVocabulary& FuzzVocabulary(std::initializer_list<const char*> pieces) {
  std::vector<std::string> bytes(pieces.begin(), pieces.end());
  bytes.push_back("");
  return *new TokenVocabulary(bytes, std::vector<bool>(bytes.size(), false));
}

inline void CheckMaskAlong(const std::shared_ptr<const JsonGrammar>& g, const TokenVocabulary& vocab,
                           const std::string& reply) {
  const int32_t eos = vocab.size() - 1;
  GrammarMatcher m(g);
  std::vector<uint8_t> allowed(vocab.size());
  for (size_t i = 0; i < reply.size() && i < 256; ++i) {
    m.FillMask(vocab, {eos}, &allowed);
    for (int32_t id = 0; id < eos; ++id) {
      GrammarMatcher copy = m;
      if (copy.Accept(vocab.bytes(id)) != (allowed[id] == 1)) __builtin_trap();
    }
    if (!m.Accept(reply.substr(i, 1))) break;
  }
}

}  // namespace tandem

#endif  // TANDEM_FUZZ_MASK_CHECK_H_
