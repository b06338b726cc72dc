// The tokenizers against PyPI `tokenizers` on the committed corpus
// (tests/fixtures/make_tokenizer_fixtures.py): encode, decode with and
// without special tokens, decode of random ids (invalid UTF-8 included), and
// incremental detokenization, for a byte-level BPE (Llama 3 shape), a
// SentencePiece BPE with byte fallback (Llama 2 shape, and the Metaspace
// shape), the same SentencePiece vocabulary read as a GGUF `llama`
// tokenizer, and SmolLM2's tokenizer read from its GGUF.
#include "common/tokenizer/tokenizer.h"

#include <cstdlib>
#include <fstream>
#include <random>

#include "common/model/gguf.h"
#include "common/serving/tokenizer_loader.h"
#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/unicode.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::json;
const std::string kDir = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizers/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "missing " << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const Json& Corpus() {
  static const Json j = Json::parse(ReadFile(kDir + "corpus.json"));
  return j;
}
const Json& Expected() {
  static const Json j = Json::parse(ReadFile(kDir + "expected.json"));
  return j;
}

std::string SmolLm2Path() {
  const char* env = std::getenv("TANDEM_SMOLLM2_GGUF");
  return env != nullptr ? env : TANDEM_SMOLLM2_GGUF;
}

// Every corpus string `exp` has cases for (the first ones) and its random id
// sequences against the expectations of tokenizer `name`.
void CheckAgainstTokenizers(const Tokenizer& tok, const std::string& name,
                            const Json& exp) {
  const Json& corpus = Corpus();
  ASSERT_GE(corpus.size(), 2000u);
  ASSERT_LE(exp["cases"].size(), corpus.size());
  int mismatches = 0;
  for (size_t i = 0; i < exp["cases"].size() && mismatches < 10; ++i) {
    const std::string text = corpus[i];
    const Json& c = exp["cases"][i];
    const std::vector<int32_t> want = c["ids"];
    const std::vector<int32_t> got = tok.Encode(text);
    if (got != want) {
      ++mismatches;
      ADD_FAILURE() << name << " case " << i << " encode of '" << text << "': got "
                    << Json(got).dump() << ", want " << Json(want).dump();
      continue;
    }
    const std::string decode = c["decode"].is_null() ? text : c["decode"].get<std::string>();
    const std::string skip = c["decode_skip"].is_null() ? decode : c["decode_skip"].get<std::string>();
    if (tok.Decode(want, false) != decode || tok.Decode(want, true) != skip) {
      ++mismatches;
      ADD_FAILURE() << name << " case " << i << " decode of " << Json(want).dump() << ": got '"
                    << tok.Decode(want, false) << "' / '" << tok.Decode(want, true) << "', want '"
                    << decode << "' / '" << skip << "'";
    }
  }
  for (const Json& r : exp["random_ids"]) {
    const std::vector<int32_t> ids = r["ids"];
    EXPECT_EQ(tok.Decode(ids, false), r["decode"].get<std::string>()) << Json(ids).dump();
    EXPECT_EQ(tok.Decode(ids, true), r["decode_skip"].get<std::string>()) << Json(ids).dump();
  }
  EXPECT_EQ(mismatches, 0);
}

void CheckAgainstTokenizers(const Tokenizer& tok, const std::string& name) {
  CheckAgainstTokenizers(tok, name, Expected().at(name));
}

// Feeding ids one at a time gives, concatenated, Decode() of them all.
void CheckIncremental(const Tokenizer& tok, const std::string& name) {
  const Json& exp = Expected().at(name);
  std::vector<std::vector<int32_t>> seqs;
  for (const Json& c : exp["cases"]) seqs.push_back(c["ids"].get<std::vector<int32_t>>());
  for (const Json& r : exp["random_ids"]) seqs.push_back(r["ids"].get<std::vector<int32_t>>());
  for (bool skip : {false, true}) {
    for (const auto& ids : seqs) {
      IncrementalDetokenizer d(&tok, skip);
      std::string text;
      for (int32_t id : ids) {
        const std::string piece = d.Add({id});
        EXPECT_FALSE(EndsWithIncompleteUtf8(piece)) << Json(ids).dump();
        text += piece;
      }
      text += d.Finish();
      ASSERT_EQ(text, tok.Decode(ids, skip)) << name << " " << Json(ids).dump();
    }
  }
}

std::unique_ptr<Tokenizer> FromJsonFile(const std::string& file) {
  auto tok = Tokenizer::FromHuggingFaceJson(ReadFile(kDir + file), file);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

// The tokenizer of the GGUF `w` writes, read as a model file's is.
std::unique_ptr<Tokenizer> FromGgufWriter(const GgufWriter& w, const std::string& name) {
  const std::string bytes = w.Serialize();
  auto file = ParseGgufBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return nullptr;
  auto vocab = ReadGgufVocab(**file);
  EXPECT_TRUE(vocab.ok()) << vocab.status();
  if (!vocab.ok()) return nullptr;
  auto tok = Tokenizer::FromGgufVocab(*vocab, name + ".gguf");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

std::unique_ptr<Tokenizer> SpmFromGgufVocab() {
  const Json v = Json::parse(ReadFile(kDir + "spm_vocab.json"));
  GgufWriter w;
  w.AddString("tokenizer.ggml.model", "llama");
  w.AddStringArray("tokenizer.ggml.tokens", v["tokens"].get<std::vector<std::string>>());
  w.AddF32Array("tokenizer.ggml.scores", v["scores"].get<std::vector<float>>());
  w.AddI32Array("tokenizer.ggml.token_type", v["token_types"].get<std::vector<int32_t>>());
  w.AddU32("tokenizer.ggml.bos_token_id", 1);
  w.AddU32("tokenizer.ggml.eos_token_id", 2);
  w.AddU32("tokenizer.ggml.unknown_token_id", 0);
  return FromGgufWriter(w, "spm");
}

TEST(TokenizerTest, ByteLevelJsonMatchesTokenizers) {
  auto tok = FromJsonFile("bytelevel.json");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->prefix_ids(), std::vector<int32_t>{0});  // <|begin_of_text|>
  CheckAgainstTokenizers(*tok, "bytelevel");
  CheckIncremental(*tok, "bytelevel");
}

TEST(TokenizerTest, SentencePieceJsonMatchesTokenizers) {
  auto tok = FromJsonFile("spm.json");
  ASSERT_NE(tok, nullptr);
  CheckAgainstTokenizers(*tok, "spm");
  CheckIncremental(*tok, "spm");
}

TEST(TokenizerTest, SentencePieceMetaspaceJsonMatchesTokenizers) {
  auto tok = FromJsonFile("spm_metaspace.json");
  ASSERT_NE(tok, nullptr);
  CheckAgainstTokenizers(*tok, "spm_metaspace");
}

TEST(TokenizerTest, GgufLlamaVocabMatchesTokenizers) {
  auto tok = SpmFromGgufVocab();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->prefix_ids(), std::vector<int32_t>{1});
  CheckAgainstTokenizers(*tok, "spm");
}

TEST(TokenizerTest, SmolLm2GgufMatchesTokenizers) {
  auto tok = LoadTokenizer(SmolLm2Path());
  ASSERT_TRUE(tok.ok()) << tok.status() << " (scripts/fetch_model.sh downloads the model)";
  ASSERT_NE(*tok, nullptr);
  EXPECT_TRUE((*tok)->prefix_ids().empty());  // add_bos_token false
  EXPECT_TRUE((*tok)->IsSpecial(2));          // <|im_end|>
  CheckAgainstTokenizers(**tok, "smollm2");
  CheckIncremental(**tok, "smollm2");
}

// Mistral's Tekken shape (Nemo, Small 3: a split at case changes,
// ignore_merges; tests/fixtures/make_tokenizer_fixtures.py tekken) from its
// tokenizer.json and as a GGUF vocabulary (gpt2, pre-tokenizer "tekken", as
// llama.cpp's converter writes Tekken models) against `tokenizers`.
TEST(TokenizerTest, TekkenMatchesTokenizersFromBothFormats) {
  const Json exp = Json::parse(ReadFile(kDir + "tekken_expected.json"))["tekken"];
  auto json = FromJsonFile("tekken.json");
  ASSERT_NE(json, nullptr);
  CheckAgainstTokenizers(*json, "tekken", exp);
  const Json t = Json::parse(ReadFile(kDir + "tekken.json"));
  std::vector<std::string> tokens(t["model"]["vocab"].size());
  for (const auto& [token, id] : t["model"]["vocab"].items()) tokens[id.get<size_t>()] = token;
  std::vector<std::string> merges;
  for (const Json& m : t["model"]["merges"]) merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  std::vector<int32_t> types(tokens.size(), 1);  // normal
  for (int32_t id : {0, 1, 2}) types[id] = 3;    // <unk>, <s>, </s>: control
  GgufWriter w;
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "tekken");
  w.AddStringArray("tokenizer.ggml.tokens", tokens);
  w.AddStringArray("tokenizer.ggml.merges", merges);
  w.AddI32Array("tokenizer.ggml.token_type", types);
  w.AddU32("tokenizer.ggml.bos_token_id", 1);
  w.AddU32("tokenizer.ggml.eos_token_id", 2);
  w.AddBool("tokenizer.ggml.add_bos_token", false);
  auto gguf = FromGgufWriter(w, "tekken");
  ASSERT_NE(gguf, nullptr);
  CheckAgainstTokenizers(*gguf, "tekken.gguf", exp);
}

// The tiny Qwen fixtures' tokenizer (byte-level BPE with Qwen2's split,
// tests/fixtures/make_family_reference.py) from its tokenizer.json and from
// the GGUF llama.cpp's converter made (pre-tokenizer qwen2, the vocabulary
// padded with UNUSED [PADn] tokens, decoded to nothing) against `tokenizers`
// on the first 600 corpus strings and on random ids into the padding.
TEST(TokenizerTest, QwenFixtureTokenizerMatchesTokenizersFromBothFormats) {
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tiny_qwen2";
  const Json exp = Json::parse(ReadFile(dir + "/tokenizer_expected.json"));
  for (const std::string& spec : {dir, dir + "/model-f32.gguf"}) {
    SCOPED_TRACE(spec);
    auto tok = LoadTokenizer(spec);
    ASSERT_TRUE(tok.ok()) << tok.status();
    ASSERT_NE(*tok, nullptr);
    CheckAgainstTokenizers(**tok, "qwen", exp);
  }
}

// Each token's bytes (for structured outputs' masks), joined, are the text
// the decoder makes of the whole sequence (but for the leading spaces a
// decoder drops at the start of a text), byte-level tokens that split a
// character included.
TEST(TokenizerTest, TokenBytesJoinToTheDecodedText) {
  std::vector<std::unique_ptr<Tokenizer>> toks;
  toks.push_back(FromJsonFile("bytelevel.json"));
  toks.push_back(FromJsonFile("spm.json"));
  toks.push_back(FromJsonFile("spm_metaspace.json"));
  auto smol = LoadTokenizer(SmolLm2Path());
  ASSERT_TRUE(smol.ok()) << smol.status();
  toks.push_back(std::move(*smol));
  const Json& corpus = Corpus();
  for (const auto& tok : toks) {
    ASSERT_NE(tok, nullptr);
    SCOPED_TRACE(tok->source());
    int checked = 0;
    for (size_t i = 0; i < 400; ++i) {
      const std::string text = corpus[i];
      // Added tokens strip spaces around them as the tokenizer says: not a
      // token's bytes.
      if (text.find("<|") != std::string::npos || text.find("<s>") != std::string::npos ||
          text.find("</s>") != std::string::npos) {
        continue;
      }
      const std::vector<int32_t> ids = tok->Encode(text, /*add_special_tokens=*/false);
      std::string joined;
      bool special = false;
      for (int32_t id : ids) {
        special |= tok->IsSpecial(id);
        joined += tok->TokenBytes(id);
      }
      if (special) continue;
      // The decoders' start-of-text rules (Strip, Metaspace's first token)
      // drop leading spaces that a token in the middle of a text keeps.
      std::string decoded = tok->Decode(ids);
      auto ltrim = [](std::string* t) { t->erase(0, t->find_first_not_of(' ')); };
      ltrim(&joined);
      ltrim(&decoded);
      ASSERT_EQ(joined, decoded);
      ++checked;
    }
    EXPECT_GT(checked, 300);
  }
  // A byte-level token that holds part of a character stands for that byte.
  auto tok = FromJsonFile("bytelevel.json");
  const std::vector<int32_t> ids = tok->Encode("\xF0\x9F\x98\x80", false);  // one 4-byte character
  std::string joined;
  for (int32_t id : ids) joined += tok->TokenBytes(id);
  EXPECT_EQ(joined, "\xF0\x9F\x98\x80");
}

TEST(TokenizerTest, UnsupportedComponentsAreNamed) {
  auto bad_model = Tokenizer::FromHuggingFaceJson(R"({"model": {"type": "WordPiece"}})", "t.json");
  EXPECT_NE(bad_model.status().message().find("WordPiece"), std::string::npos);
  auto bad_pre = Tokenizer::FromHuggingFaceJson(
      R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
          "pre_tokenizer": {"type": "BertPreTokenizer"}})", "t.json");
  EXPECT_NE(bad_pre.status().message().find("BertPreTokenizer"), std::string::npos);
  auto bad_regex = Tokenizer::FromHuggingFaceJson(
      R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
          "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}}})", "t.json");
  EXPECT_NE(bad_regex.status().message().find("(unclosed"), std::string::npos);
  GgufVocab v;
  v.model = "bert";
  EXPECT_NE(Tokenizer::FromGgufVocab(v, "x.gguf").status().message().find("bert"),
            std::string::npos);
  v.model = "gpt2";
  v.pre = "deepseek-coder";
  EXPECT_NE(Tokenizer::FromGgufVocab(v, "x.gguf").status().message().find("deepseek-coder"),
            std::string::npos);
  EXPECT_FALSE(Tokenizer::FromHuggingFaceJson("not json", "t.json").ok());
}

TEST(UnicodeTest, LossyMatchesPythonReplace) {
  // bytes.decode("utf-8", "replace") on each case.
  EXPECT_EQ(Utf8Lossy("abc"), "abc");
  EXPECT_EQ(Utf8Lossy("\xE2\x82"), "\xEF\xBF\xBD");                  // truncated 3-byte
  EXPECT_EQ(Utf8Lossy("\xE2\x82" "a"), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(Utf8Lossy("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");       // lone continuations
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");              // truncated 4-byte
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(Utf8Lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");       // overlong
  EXPECT_EQ(Utf8Lossy("\xF4\x90\x80\x80"),  // above U+10FFFF
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(EndsWithIncompleteUtf8("a\xE2\x82"));
  EXPECT_FALSE(EndsWithIncompleteUtf8("a\xE2\x82\xAC"));
  EXPECT_FALSE(EndsWithIncompleteUtf8("a\x80"));
}

}  // namespace
}  // namespace tandem
