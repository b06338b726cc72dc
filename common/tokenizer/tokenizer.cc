#include "common/tokenizer/tokenizer.h"

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
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

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
  std::string a, b;
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

absl::StatusOr<std::shared_ptr<icu::RegexPattern>> CompileRegex(const std::string& pattern,
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
std::vector<std::pair<size_t, size_t>> FindAll(const icu::RegexPattern& re,
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
std::vector<std::string> SplitBy(absl::string_view text,
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

bool IsWhitespace(uint32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

// The code point ending at / starting at byte `i` of valid UTF-8 `s`.
uint32_t CodePointAt(absl::string_view s, size_t i, size_t* len) {
  const uint8_t b = static_cast<uint8_t>(s[i]);
  int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? b : b & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}
size_t PrevCharStart(absl::string_view s, size_t i) {
  do { --i; } while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80);
  return i;
}
bool IsWordChar(uint32_t cp) { return u_isalnum(static_cast<UChar32>(cp)) || cp == '_'; }

absl::StatusOr<SplitBehavior> ParseBehavior(const std::string& s, const std::string& source) {
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat(source, ": split behavior '", s, "' is unknown"));
}

}  // namespace

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

namespace {

absl::Status ParseNormalizer(const Json& j, const std::string& source,
                             std::vector<NormStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const Json& n : j["normalizers"]) RETURN_IF_ERROR(ParseNormalizer(n, source, out));
  } else if (type == "Prepend") {
    out->push_back({NormStep::kPrepend, j.value("prepend", ""), ""});
  } else if (type == "Replace") {
    if (!j["pattern"].contains("String")) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": Replace normalizer with a regex pattern is not implemented"));
    }
    out->push_back({NormStep::kReplace, j["pattern"]["String"].get<std::string>(),
                    j.value("content", "")});
  } else if (type == "NFC") {
    out->push_back({NormStep::kNfc, "", ""});
  } else if (type == "NFD") {
    out->push_back({NormStep::kNfd, "", ""});
  } else if (type == "NFKC") {
    out->push_back({NormStep::kNfkc, "", ""});
  } else if (type == "NFKD") {
    out->push_back({NormStep::kNfkd, "", ""});
  } else if (type == "Lowercase") {
    out->push_back({NormStep::kLowercase, "", ""});
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": normalizer '", type, "' is not implemented"));
  }
  return absl::OkStatus();
}

absl::Status ParsePreTokenizer(const Json& j, const std::string& source,
                               std::vector<PreStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.value("type", "");
  PreStep p;
  if (type == "Sequence") {
    for (const Json& n : j["pretokenizers"]) RETURN_IF_ERROR(ParsePreTokenizer(n, source, out));
    return absl::OkStatus();
  }
  if (type == "Split") {
    p.kind = PreStep::kSplit;
    std::string pattern;
    if (j["pattern"].contains("Regex")) {
      pattern = j["pattern"]["Regex"].get<std::string>();
    } else {
      // A literal string: escape it for the regex engine.
      const std::string lit = j["pattern"]["String"].get<std::string>();
      pattern = absl::StrCat("\\Q", lit, "\\E");
    }
    ASSIGN_OR_RETURN(p.regex, CompileRegex(pattern, source));
    ASSIGN_OR_RETURN(p.behavior, ParseBehavior(j.value("behavior", "Isolated"), source));
    p.invert = j.value("invert", false);
  } else if (type == "Digits") {
    p.kind = PreStep::kSplit;
    ASSIGN_OR_RETURN(p.regex, CompileRegex("\\p{N}", source));
    p.behavior = j.value("individual_digits", false) ? SplitBehavior::kIsolated
                                                      : SplitBehavior::kContiguous;
  } else if (type == "ByteLevel") {
    p.kind = PreStep::kByteLevel;
    p.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) {
      ASSIGN_OR_RETURN(p.regex, CompileRegex(kGpt2Pattern, source));
    }
  } else if (type == "Metaspace") {
    p.kind = PreStep::kMetaspace;
    p.replacement = j.value("replacement", std::string(kMetaspaceChar));
    p.prepend_scheme = j.value("prepend_scheme",
                               j.value("add_prefix_space", true) ? "always" : "never");
    p.split = j.value("split", true);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": pre-tokenizer '", type, "' is not implemented"));
  }
  out->push_back(std::move(p));
  return absl::OkStatus();
}

absl::Status ParseDecoder(const Json& j, const std::string& source, std::vector<DecStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.value("type", "");
  DecStep d;
  if (type == "Sequence") {
    for (const Json& n : j["decoders"]) RETURN_IF_ERROR(ParseDecoder(n, source, out));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    d.kind = DecStep::kByteLevel;
  } else if (type == "Replace") {
    if (!j["pattern"].contains("String")) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": Replace decoder with a regex pattern is not implemented"));
    }
    d.kind = DecStep::kReplace;
    d.a = j["pattern"]["String"].get<std::string>();
    d.b = j.value("content", "");
  } else if (type == "ByteFallback") {
    d.kind = DecStep::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = DecStep::kFuse;
  } else if (type == "Strip") {
    d.kind = DecStep::kStrip;
    d.a = j.value("content", " ");
    d.start = j.value("start", 0);
    d.stop = j.value("stop", 0);
  } else if (type == "Metaspace") {
    d.kind = DecStep::kMetaspace;
    d.a = j.value("replacement", std::string(kMetaspaceChar));
    d.prepend_scheme = j.value("prepend_scheme",
                               j.value("add_prefix_space", true) ? "always" : "never");
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": decoder '", type, "' is not implemented"));
  }
  out->push_back(std::move(d));
  return absl::OkStatus();
}

// Appends the ids of the special token named `name` from a TemplateProcessing.
absl::Status TemplateIds(const Json& specials, const std::string& name, const std::string& source,
                         std::vector<int32_t>* out) {
  if (!specials.contains(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": post-processor template names unknown token '", name, "'"));
  }
  for (const Json& id : specials[name]["ids"]) out->push_back(id.get<int32_t>());
  return absl::OkStatus();
}

absl::Status ParsePostProcessor(const Json& j, const std::string& source,
                                const Tokenizer::Impl& impl, std::vector<int32_t>* prefix,
                                std::vector<int32_t>* suffix) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const Json& p : j["processors"]) {
      RETURN_IF_ERROR(ParsePostProcessor(p, source, impl, prefix, suffix));
    }
  } else if (type == "ByteLevel") {
    // Offsets only; ids unchanged.
  } else if (type == "TemplateProcessing") {
    bool seen_a = false;
    for (const Json& item : j["single"]) {
      if (item.contains("Sequence")) {
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        RETURN_IF_ERROR(TemplateIds(j["special_tokens"],
                                    item["SpecialToken"]["id"].get<std::string>(), source,
                                    seen_a ? suffix : prefix));
      }
    }
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    prefix->push_back(j["cls"][1].get<int32_t>());
    suffix->push_back(j["sep"][1].get<int32_t>());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": post-processor '", type, "' is not implemented"));
  }
  return absl::OkStatus();
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  for (const DecStep& d : impl_->decoder) {
    impl_->byte_fallback_decoder |= d.kind == DecStep::kByteFallback;
  }
}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHuggingFaceJson(
    absl::string_view json_text, const std::string& source) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("model")) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a tokenizer.json (no 'model')"));
  }
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  const Json& model = j["model"];
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": model type '", type, "' is not implemented (BPE is)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": BPE ", key, " is not implemented"));
    }
  }
  try {
    BpeConfig bc;
    for (auto& [token, id] : model["vocab"].items()) bc.vocab.emplace_back(token, id.get<int32_t>());
    for (const Json& m : model["merges"]) {
      if (m.is_string()) {  // "a b"
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) continue;
        bc.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {  // ["a", "b"]
        bc.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      }
    }
    bc.byte_fallback = model.value("byte_fallback", false);
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      bc.unk_token = model["unk_token"].get<std::string>();
    }
    bc.fuse_unk = model.value("fuse_unk", false);
    bc.ignore_merges = model.value("ignore_merges", false);
    ASSIGN_OR_RETURN(impl->bpe, BpeModel::Create(bc));
    impl->vocab_size = impl->bpe.max_id() + 1;
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const Json& a : j["added_tokens"]) {
        AddedToken t;
        t.id = a["id"].get<int32_t>();
        t.content = a["content"].get<std::string>();
        t.special = a.value("special", false);
        t.lstrip = a.value("lstrip", false);
        t.rstrip = a.value("rstrip", false);
        t.single_word = a.value("single_word", false);
        t.normalized = a.value("normalized", !t.special);
        impl->AddAdded(std::move(t));
      }
    }
    RETURN_IF_ERROR(ParseNormalizer(j.value("normalizer", Json()), source, &impl->normalizer));
    RETURN_IF_ERROR(ParsePreTokenizer(j.value("pre_tokenizer", Json()), source, &impl->pre));
    RETURN_IF_ERROR(ParseDecoder(j.value("decoder", Json()), source, &impl->decoder));
    RETURN_IF_ERROR(ParsePostProcessor(j.value("post_processor", Json()), source, *impl,
                                       &impl->prefix, &impl->suffix));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": malformed tokenizer.json: ", e.what()));
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGgufVocab(const GgufVocab& v,
                                                                    const std::string& source) {
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": tokenizer.ggml.token_type has ", v.token_types.size(), " entries for ",
        v.tokens.size(), " tokens"));
  }
  auto type_of = [&](size_t i) { return v.token_types.empty() ? 1 : v.token_types[i]; };
  BpeConfig bc;
  // Every token is in the model's vocabulary (as in a converted
  // tokenizer.json); unknown, control and user-defined ones are added tokens
  // too, below.
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    bc.vocab.emplace_back(v.tokens[i], static_cast<int32_t>(i));
  }
  if (v.model == "gpt2") {
    for (const std::string& m : v.merges) {
      const size_t sp = m.find(' ', 1);
      if (sp != std::string::npos) bc.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    const std::string pre = v.pre.empty() ? "default" : v.pre;
    PreStep split, byte_level;
    split.kind = PreStep::kSplit;
    byte_level.kind = PreStep::kByteLevel;
    if (pre == "default" || pre == "gpt2" || pre == "gpt-2") {
      ASSIGN_OR_RETURN(byte_level.regex, CompileRegex(kGpt2Pattern, source));
    } else if (pre == "smollm" || pre == "starcoder") {
      ASSIGN_OR_RETURN(split.regex, CompileRegex("\\p{N}", source));
      impl->pre.push_back(split);
      ASSIGN_OR_RETURN(byte_level.regex, CompileRegex(kGpt2Pattern, source));
    } else if (pre == "llama-bpe" || pre == "llama3" || pre == "qwen2") {
      ASSIGN_OR_RETURN(split.regex,
                       CompileRegex(pre == "qwen2" ? kQwen2Pattern : kLlama3Pattern, source));
      impl->pre.push_back(split);
      bc.ignore_merges = pre != "qwen2";
      // Qwen's tokenizer.json normalizes to NFC first; a GGUF keeps no
      // normalizer (llama.cpp skips it), so it is restored here to encode as
      // transformers does.
      if (pre == "qwen2") impl->normalizer.push_back({NormStep::kNfc, "", ""});
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tokenizer.ggml.pre '", pre,
          "' is not implemented (default, gpt2, smollm, starcoder, llama-bpe, qwen2)"));
    }
    impl->pre.push_back(byte_level);
    impl->decoder.push_back({DecStep::kByteLevel});
  } else if (v.model == "llama") {
    // SentencePiece BPE: merges derived from the scores as transformers'
    // SentencePieceExtractor does, so the result equals the tokenizer.json
    // that transformers converts from the same vocabulary.
    if (v.scores.size() != v.tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": tokenizer.ggml.scores has ",
                                                     v.scores.size(), " entries for ",
                                                     v.tokens.size(), " tokens"));
    }
    absl::flat_hash_map<std::string, int32_t> ids;
    for (size_t i = 0; i < v.tokens.size(); ++i) ids.emplace(v.tokens[i], static_cast<int32_t>(i));
    struct Merge {
      int32_t l, r;
      float score;
    };
    std::vector<Merge> merges;
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      const std::string& t = v.tokens[i];
      std::vector<Merge> local;
      size_t pos = 0;
      const std::vector<int> lens = Utf8CharLengths(t);
      for (size_t k = 0; k + 1 < lens.size(); ++k) {
        pos += lens[k];
        auto l = ids.find(t.substr(0, pos)), r = ids.find(t.substr(pos));
        if (l != ids.end() && r != ids.end()) local.push_back({l->second, r->second, v.scores[i]});
      }
      std::sort(local.begin(), local.end(), [](const Merge& a, const Merge& b) {
        return a.l != b.l ? a.l < b.l : a.r < b.r;
      });
      merges.insert(merges.end(), local.begin(), local.end());
    }
    std::stable_sort(merges.begin(), merges.end(),
                     [](const Merge& a, const Merge& b) { return a.score > b.score; });
    for (const Merge& m : merges) bc.merges.emplace_back(v.tokens[m.l], v.tokens[m.r]);
    bc.byte_fallback = true;
    bc.fuse_unk = true;
    if (v.unk_id >= 0 && v.unk_id < static_cast<int32_t>(v.tokens.size())) {
      bc.unk_token = v.tokens[v.unk_id];
    }
    if (v.add_space_prefix) impl->normalizer.push_back({NormStep::kPrepend, kMetaspaceChar, ""});
    impl->normalizer.push_back({NormStep::kReplace, " ", kMetaspaceChar});
    impl->decoder.push_back({DecStep::kReplace, kMetaspaceChar, " "});
    impl->decoder.push_back({DecStep::kByteFallback});
    impl->decoder.push_back({DecStep::kFuse});
    if (v.add_space_prefix) {
      DecStep strip{DecStep::kStrip, " ", ""};
      strip.start = 1;
      impl->decoder.push_back(strip);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": tokenizer.ggml.model '", v.model, "' is not implemented (gpt2, llama)"));
  }
  ASSIGN_OR_RETURN(impl->bpe, BpeModel::Create(bc));
  impl->vocab_size = static_cast<int32_t>(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (type_of(i) == 5) impl->unused_ids.insert(static_cast<int32_t>(i));
    if (type_of(i) != 2 && type_of(i) != 3 && type_of(i) != 4) continue;
    AddedToken t;
    t.id = static_cast<int32_t>(i);
    t.content = v.tokens[i];
    t.special = type_of(i) != 4;
    t.normalized = !t.special;
    impl->AddAdded(std::move(t));
  }
  if (v.add_bos && v.bos_id >= 0) impl->prefix.push_back(v.bos_id);
  if (v.add_eos && v.eos_id >= 0) impl->suffix.push_back(v.eos_id);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int32_t> Tokenizer::Encode(absl::string_view text, bool add_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<Piece> raw_split;
  t.SplitAdded({std::string(text), -1, true}, /*want_normalized=*/false, &raw_split);
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = t.prefix;
  for (Piece& p : raw_split) {
    if (p.added_id >= 0) {
      ids.push_back(p.added_id);
      continue;
    }
    std::vector<Piece> norm_split;
    t.SplitAdded({t.Normalize(std::move(p.text)), -1, p.at_start}, /*want_normalized=*/true,
                 &norm_split);
    for (const Piece& q : norm_split) {
      if (q.added_id >= 0) {
        ids.push_back(q.added_id);
        continue;
      }
      for (const std::string& w : t.PreTokenize(q.text, q.at_start)) t.TokenizeWord(w, &ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), t.suffix.begin(), t.suffix.end());
  return ids;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (t.unused_ids.contains(id)) continue;
    auto a = t.added_by_id.find(id);
    if (a != t.added_by_id.end()) {
      if (!(skip_special_tokens && t.added[a->second].special)) {
        tokens.push_back(t.added[a->second].content);
      }
      continue;
    }
    const std::string& s = t.bpe.IdToToken(id);
    if (!s.empty()) tokens.push_back(s);
  }
  if (t.decoder.empty()) return absl::StrJoin(tokens, " ");
  return absl::StrJoin(t.Decoded(std::move(tokens)), "");
}

std::string Tokenizer::IdToToken(int32_t id) const {
  auto a = impl_->added_by_id.find(id);
  if (a != impl_->added_by_id.end()) return impl_->added[a->second].content;
  return impl_->bpe.IdToToken(id);
}

int32_t Tokenizer::TokenToId(absl::string_view token) const {
  auto a = impl_->added_by_content.find(token);
  if (a != impl_->added_by_content.end()) return a->second;
  return impl_->bpe.TokenToId(token);
}

bool Tokenizer::IsByteFallbackToken(int32_t id) const {
  if (!impl_->byte_fallback_decoder) return false;
  const std::string& t = impl_->bpe.IdToToken(id);
  return t.size() == 6 && absl::StartsWith(t, "<0x") && t[5] == '>';
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto a = impl_->added_by_id.find(id);
  return a != impl_->added_by_id.end() && impl_->added[a->second].special;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
const std::vector<int32_t>& Tokenizer::prefix_ids() const { return impl_->prefix; }
const std::vector<int32_t>& Tokenizer::suffix_ids() const { return impl_->suffix; }
const std::string& Tokenizer::source() const { return impl_->source; }

}  // namespace tandem
