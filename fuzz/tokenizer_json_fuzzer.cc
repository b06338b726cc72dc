// The tokenizers on outside bytes: the input is parsed as a tokenizer.json
// (and used when it loads), and encoded as text, and read as ids to decode,
// with the committed byte-level and SentencePiece fixtures.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace {

std::unique_ptr<tandem::Tokenizer> Fixture(const char* name) {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizers/" + name);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto t = tandem::Tokenizer::FromHuggingFaceJson(text, name);
  if (!t.ok()) __builtin_trap();
  return std::move(*t);
}

void Exercise(const tandem::Tokenizer& tok, const std::string& text) {
  const std::vector<int32_t> ids = tok.Encode(text);
  (void)tok.Decode(ids, true);
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 1 < text.size(); i += 2) {
    raw.push_back((static_cast<uint8_t>(text[i]) << 8 | static_cast<uint8_t>(text[i + 1])) %
                  (tok.vocab_size() + 8));
  }
  tandem::IncrementalDetokenizer d(&tok, false);
  for (int32_t id : raw) (void)d.Add({id});
  (void)d.Finish();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto byte_level = Fixture("bytelevel.json");
  static const auto spm = Fixture("spm.json");
  const std::string text(reinterpret_cast<const char*>(data), size);
  Exercise(*byte_level, text);
  Exercise(*spm, text);
  auto parsed = tandem::Tokenizer::FromHuggingFaceJson(text, "fuzz.json");
  if (parsed.ok()) Exercise(**parsed, "Hello world 123");
  return 0;
}
