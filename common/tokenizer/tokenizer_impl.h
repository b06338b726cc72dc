// The tokenizer's machinery, private to common/tokenizer: the pipeline's
// steps and Tokenizer::Impl, shared by its three parts (tokenizer.cc: the
// pipeline, Encode and Decode; tokenizer_json.cc: tokenizer.json;
// tokenizer_gguf.cc: a GGUF vocabulary).
#ifndef TANDEM_COMMON_TOKENIZER_TOKENIZER_IMPL_H_
#define TANDEM_COMMON_TOKENIZER_TOKENIZER_IMPL_H_

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/base/mutex.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace tokenizer_internal {

using Json = nlohmann::json;

// The split patterns `tokenizers` and llama.cpp use by name.
constexpr char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr char kLlama3Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr char kQwen2Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Mistral's Tekken (Nemo, Small 3): words split at case changes.
constexpr char kTekkenPattern[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr char kMetaspaceChar[] = "\xE2\x96\x81";  // U+2581 "▁"

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct NormStep {
  enum Kind { kPrepend, kReplace, kNfc, kNfd, kNfkc, kNfkd, kLowercase } kind;
  std::string a, b;
};

struct PreStep {
  enum Kind { kSplit, kByteLevel, kMetaspace } kind;
  std::shared_ptr<icu::RegexPattern> regex;  // kSplit, kByteLevel with use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  std::string replacement = kMetaspaceChar;  // kMetaspace
  std::string prepend_scheme = "always";
  bool split = true;
};

struct DecStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string a = {}, b = {};
  int start = 0, stop = 0;
  std::string prepend_scheme = "always";
};

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

struct Piece {
  std::string text;
  int32_t added_id = -1;  // >= 0: an added token, already an id
  bool at_start = false;  // begins at offset 0 of the input
};

inline absl::StatusOr<std::shared_ptr<icu::RegexPattern>> CompileRegex(const std::string& pattern,
                                                                const std::string& source) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError pe;
  std::shared_ptr<icu::RegexPattern> re(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, pe, status));
  if (U_FAILURE(status) || re == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": split regex '", pattern,
                                                   "' does not compile (", u_errorName(status),
                                                   " at offset ", pe.offset, ")"));
  }
  return re;
}

// Byte ranges [begin, end) of `text` matched by `re`, in order.
inline std::vector<std::pair<size_t, size_t>> FindAll(const icu::RegexPattern& re,
                                               absl::string_view text) {
  std::vector<std::pair<size_t, size_t>> out;
  UErrorCode status = U_ZERO_ERROR;
  UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
  std::unique_ptr<icu::RegexMatcher> m(re.matcher(status));
  if (U_FAILURE(status) || m == nullptr) {
    utext_close(ut);
    return out;
  }
  m->reset(ut);
  while (m->find(status) && U_SUCCESS(status)) {
    const int64_t b = m->start64(status), e = m->end64(status);
    if (e > b) out.emplace_back(static_cast<size_t>(b), static_cast<size_t>(e));
  }
  utext_close(ut);
  return out;
}

// `tokenizers`' split with a delimiter behaviour.
inline std::vector<std::string> SplitBy(absl::string_view text,
                                 const std::vector<std::pair<size_t, size_t>>& matches,
                                 SplitBehavior behavior, bool invert) {
  struct Seg {
    size_t b, e;
    bool match;
  };
  std::vector<Seg> segs;
  size_t last = 0;
  for (const auto& [b, e] : matches) {
    if (b > last) segs.push_back({last, b, invert});
    segs.push_back({b, e, !invert});
    last = e;
  }
  if (last < text.size()) segs.push_back({last, text.size(), invert});
  std::vector<std::string> out;
  auto sub = [&](const Seg& s) { return std::string(text.substr(s.b, s.e - s.b)); };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Seg& s : segs) out.push_back(sub(s));
      break;
    case SplitBehavior::kRemoved:
      for (const Seg& s : segs) {
        if (!s.match) out.push_back(sub(s));
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const Seg& s : segs) {
        if (s.match && !out.empty() && !prev_match) {
          out.back() += sub(s);
        } else {
          out.push_back(sub(s));
        }
        prev_match = s.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      std::string pending;
      for (const Seg& s : segs) {
        if (s.match) {
          if (!pending.empty()) out.push_back(std::move(pending));
          pending = sub(s);
        } else {
          out.push_back(pending + sub(s));
          pending.clear();
        }
      }
      if (!pending.empty()) out.push_back(std::move(pending));
      break;
    }
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (const Seg& s : segs) {
        if (s.match && prev_match && !out.empty()) {
          out.back() += sub(s);
        } else {
          out.push_back(sub(s));
        }
        prev_match = s.match;
      }
      break;
    }
  }
  return out;
}

inline bool IsWhitespace(uint32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

// The code point ending at / starting at byte `i` of valid UTF-8 `s`.
inline uint32_t CodePointAt(absl::string_view s, size_t i, size_t* len) {
  const uint8_t b = static_cast<uint8_t>(s[i]);
  int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? b : b & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}
inline size_t PrevCharStart(absl::string_view s, size_t i) {
  do { --i; } while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80);
  return i;
}
inline bool IsWordChar(uint32_t cp) { return u_isalnum(static_cast<UChar32>(cp)) || cp == '_'; }

inline absl::StatusOr<SplitBehavior> ParseBehavior(const std::string& s, const std::string& source) {
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat(source, ": split behavior '", s, "' is unknown"));
}

}  // namespace tokenizer_internal

// Private to the tokenizer's own files.
using namespace tokenizer_internal;  // NOLINT(build/namespaces)

struct Tokenizer::Impl {
  std::string source;
  BpeModel bpe;
  std::vector<NormStep> normalizer;
  std::vector<PreStep> pre;
  std::vector<DecStep> decoder;
  std::vector<AddedToken> added;
  absl::flat_hash_map<int32_t, size_t> added_by_id;
  absl::flat_hash_map<std::string, int32_t> added_by_content;
  std::vector<int32_t> prefix, suffix;
  int32_t vocab_size = 0;
  // GGUF tokens of type UNUSED (the converter's [PADn] filling a padded
  // vocabulary): decoded to nothing, as llama.cpp does and as transformers
  // does for ids past its tokenizer's vocabulary.
  absl::flat_hash_set<int32_t> unused_ids;
  bool byte_fallback_decoder = false;  // the decoder has a ByteFallback step

  mutable Mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache ABSL_GUARDED_BY(cache_mu);

  void AddAdded(AddedToken t) {
    added_by_id[t.id] = added.size();
    added_by_content[t.content] = t.id;
    vocab_size = std::max(vocab_size, t.id + 1);
    added.push_back(std::move(t));
  }

  // Splits `text` on the added tokens with `normalized == want_normalized`
  // (leftmost, then longest, as tokenizers' Aho-Corasick).
  void SplitAdded(const Piece& in, bool want_normalized, std::vector<Piece>* out) const {
    const std::string& s = in.text;
    size_t emitted = 0, i = 0;
    while (i < s.size()) {
      const AddedToken* best = nullptr;
      for (const AddedToken& t : added) {
        if (t.normalized != want_normalized || t.content.empty()) continue;
        if (t.content[0] != s[i] || (best && t.content.size() <= best->content.size())) continue;
        if (s.compare(i, t.content.size(), t.content) != 0) continue;
        if (t.single_word) {
          size_t len = 0;
          if (i > 0 && IsWordChar(CodePointAt(s, PrevCharStart(s, i), &len))) continue;
          const size_t e = i + t.content.size();
          if (e < s.size() && IsWordChar(CodePointAt(s, e, &len))) continue;
        }
        best = &t;
      }
      if (best == nullptr) {
        size_t len = 0;
        CodePointAt(s, i, &len);
        i += len;
        continue;
      }
      size_t b = i, e = i + best->content.size();
      if (best->lstrip) {
        while (b > emitted) {
          const size_t p = PrevCharStart(s, b);
          size_t len = 0;
          if (!IsWhitespace(CodePointAt(s, p, &len))) break;
          b = p;
        }
      }
      if (best->rstrip) {
        while (e < s.size()) {
          size_t len = 0;
          if (!IsWhitespace(CodePointAt(s, e, &len))) break;
          e += len;
        }
      }
      if (b > emitted) out->push_back({s.substr(emitted, b - emitted), -1, in.at_start && emitted == 0});
      out->push_back({"", best->id, false});
      emitted = i = e;
    }
    if (emitted < s.size()) out->push_back({s.substr(emitted), -1, in.at_start && emitted == 0});
  }

  std::string Normalize(std::string s) const {
    for (const NormStep& n : normalizer) {
      switch (n.kind) {
        case NormStep::kPrepend:
          if (!s.empty()) s = n.a + s;
          break;
        case NormStep::kReplace:
          s = absl::StrReplaceAll(s, {{n.a, n.b}});
          break;
        case NormStep::kLowercase: {
          icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
          u.toLower();
          s.clear();
          u.toUTF8String(s);
          break;
        }
        default: {
          UErrorCode status = U_ZERO_ERROR;
          const icu::Normalizer2* norm =
              n.kind == NormStep::kNfc    ? icu::Normalizer2::getNFCInstance(status)
              : n.kind == NormStep::kNfd  ? icu::Normalizer2::getNFDInstance(status)
              : n.kind == NormStep::kNfkc ? icu::Normalizer2::getNFKCInstance(status)
                                          : icu::Normalizer2::getNFKDInstance(status);
          icu::UnicodeString u = norm->normalize(icu::UnicodeString::fromUTF8(s), status);
          s.clear();
          u.toUTF8String(s);
        }
      }
    }
    return s;
  }

  // Pre-tokenizes one piece into words ready for the model.
  std::vector<std::string> PreTokenize(const std::string& text, bool at_start) const {
    std::vector<std::string> words = {text};
    for (const PreStep& p : pre) {
      std::vector<std::string> next;
      for (std::string& w : words) {
        switch (p.kind) {
          case PreStep::kSplit:
            for (auto& s : SplitBy(w, FindAll(*p.regex, w), p.behavior, p.invert)) {
              next.push_back(std::move(s));
            }
            break;
          case PreStep::kByteLevel: {
            if (p.add_prefix_space && !absl::StartsWith(w, " ")) w = " " + w;
            std::vector<std::string> parts =
                p.regex ? SplitBy(w, FindAll(*p.regex, w), SplitBehavior::kIsolated, false)
                        : std::vector<std::string>{w};
            for (const auto& s : parts) next.push_back(ByteLevelEncode(s));
            break;
          }
          case PreStep::kMetaspace: {
            std::string r = absl::StrReplaceAll(w, {{" ", p.replacement}});
            const bool prepend = p.prepend_scheme == "always" ||
                                 (p.prepend_scheme == "first" && at_start && &w == &words[0]);
            if (prepend && !absl::StartsWith(r, p.replacement)) r = p.replacement + r;
            if (!p.split) {
              next.push_back(std::move(r));
              break;
            }
            std::vector<std::pair<size_t, size_t>> m;
            for (size_t k = r.find(p.replacement); k != std::string::npos;
                 k = r.find(p.replacement, k + p.replacement.size())) {
              m.emplace_back(k, k + p.replacement.size());
            }
            for (auto& s : SplitBy(r, m, SplitBehavior::kMergedWithNext, false)) {
              next.push_back(std::move(s));
            }
            break;
          }
        }
      }
      words = std::move(next);
    }
    words.erase(std::remove(words.begin(), words.end(), std::string()), words.end());
    return words;
  }

  void TokenizeWord(const std::string& word, std::vector<int32_t>* out) const {
    {
      MutexLock lock(&cache_mu);
      auto it = cache.find(word);
      if (it != cache.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids;
    bpe.Tokenize(word, &ids);
    out->insert(out->end(), ids.begin(), ids.end());
    if (word.size() > 256) return;  // long words are rare; keep the cache small
    MutexLock lock(&cache_mu);
    if (cache.size() > 200000) cache.clear();
    cache.emplace(word, std::move(ids));
  }

  // The bytes a vocabulary token stands for in the middle of a text: the
  // decoder's steps on it alone, with no UTF-8 repair (a byte-level token may
  // hold part of a character) and none of the steps that only trim the ends
  // of a whole text.
  std::string RawBytes(std::string token) const {
    for (const DecStep& d : decoder) {
      switch (d.kind) {
        case DecStep::kByteLevel: {
          std::string mapped;
          for (size_t i = 0; i < token.size();) {
            size_t len = 0;
            const int b = UnicodeToByte(CodePointAt(token, i, &len));
            if (b < 0) return token;
            mapped.push_back(static_cast<char>(b));
            i += len;
          }
          token = std::move(mapped);
          break;
        }
        case DecStep::kReplace:
          token = absl::StrReplaceAll(token, {{d.a, d.b}});
          break;
        case DecStep::kByteFallback:
          if (token.size() == 6 && absl::StartsWith(token, "<0x") && token[5] == '>' &&
              isxdigit(static_cast<unsigned char>(token[3])) &&
              isxdigit(static_cast<unsigned char>(token[4]))) {
            token = std::string(1, static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16)));
          }
          break;
        case DecStep::kMetaspace:
          token = absl::StrReplaceAll(token, {{d.a, " "}});
          break;
        case DecStep::kFuse:
        case DecStep::kStrip:
          break;
      }
    }
    return token;
  }

  std::vector<std::string> Decoded(std::vector<std::string> tokens) const {
    for (const DecStep& d : decoder) {
      std::vector<std::string> next;
      switch (d.kind) {
        case DecStep::kByteLevel: {
          std::string bytes;
          for (const std::string& t : tokens) {
            std::string mapped;
            bool all = true;
            for (size_t i = 0; i < t.size();) {
              size_t len = 0;
              const int b = UnicodeToByte(CodePointAt(t, i, &len));
              if (b < 0) {
                all = false;
                break;
              }
              mapped.push_back(static_cast<char>(b));
              i += len;
            }
            bytes += all ? mapped : t;
          }
          next.push_back(Utf8Lossy(bytes));
          break;
        }
        case DecStep::kReplace:
          for (const std::string& t : tokens) next.push_back(absl::StrReplaceAll(t, {{d.a, d.b}}));
          break;
        case DecStep::kByteFallback: {
          std::string run;
          size_t run_len = 0;
          auto flush = [&] {
            if (run_len == 0) return;
            if (Utf8Lossy(run) == run) {
              next.push_back(run);
            } else {
              for (size_t k = 0; k < run_len; ++k) next.push_back("\xEF\xBF\xBD");
            }
            run.clear();
            run_len = 0;
          };
          for (const std::string& t : tokens) {
            int v = -1;
            if (t.size() == 6 && absl::StartsWith(t, "<0x") && t[5] == '>' &&
                isxdigit(static_cast<unsigned char>(t[3])) &&
                isxdigit(static_cast<unsigned char>(t[4]))) {
              v = std::stoi(t.substr(3, 2), nullptr, 16);
            }
            if (v >= 0) {
              run.push_back(static_cast<char>(v));
              ++run_len;
            } else {
              flush();
              next.push_back(t);
            }
          }
          flush();
          break;
        }
        case DecStep::kFuse:
          next.push_back(absl::StrJoin(tokens, ""));
          break;
        case DecStep::kStrip:
          for (std::string t : tokens) {
            for (int k = 0; k < d.start && absl::StartsWith(t, d.a); ++k) t.erase(0, d.a.size());
            for (int k = 0; k < d.stop && absl::EndsWith(t, d.a); ++k) {
              t.erase(t.size() - d.a.size());
            }
            next.push_back(std::move(t));
          }
          break;
        case DecStep::kMetaspace:
          // As tokenizers: the first token drops every replacement
          // character (not only a leading one) unless prepend_scheme is never.
          for (size_t i = 0; i < tokens.size(); ++i) {
            const bool drop = i == 0 && d.prepend_scheme != "never";
            next.push_back(absl::StrReplaceAll(tokens[i], {{d.a, drop ? "" : " "}}));
          }
          break;
      }
      tokens = std::move(next);
    }
    return tokens;
  }
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_TOKENIZER_IMPL_H_
