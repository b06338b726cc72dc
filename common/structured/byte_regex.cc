#include "common/structured/byte_regex.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepeat = 1000;  // {n,m} bounds, as a sanity limit before the states'
constexpr int kMaxNfaStates = 100000;
// NFA states visited while the DFA is made: the compile time's bound.
constexpr int64_t kMaxSubsetWork = 100000000;
constexpr int kMaxParseDepth = 200;

// A set of code points: sorted, disjoint, non-adjacent ranges.
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

// Every code point (surrogates excluded: UTF-8 text has none) not in `r`.
Ranges Complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : Normalize(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  Ranges no_surrogates;
  for (const auto& [lo, hi] : out) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      no_surrogates.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) no_surrogates.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) no_surrogates.emplace_back(0xE000, hi);
  }
  return no_surrogates;
}

int Utf8Length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void EncodeUtf8(uint32_t cp, uint8_t* b) {
  switch (Utf8Length(cp)) {
    case 1: b[0] = static_cast<uint8_t>(cp); break;
    case 2:
      b[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      b[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      b[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      b[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      b[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      b[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      b[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  }
}

// A code point range as sequences of byte ranges whose concatenations are
// exactly the range's UTF-8 encodings (the split Rust's regex-syntax and RE2
// make): split where the encoded length changes, then where a lower byte's
// range would not run over all its continuation values.
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  for (uint32_t bound : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= bound && hi > bound) {
      Utf8Sequences(lo, bound, out);
      Utf8Sequences(bound + 1, hi, out);
      return;
    }
  }
  const int n = Utf8Length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  EncodeUtf8(lo, a);
  EncodeUtf8(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out->push_back(std::move(seq));
}

// The parsed expression.
struct Ast {
  enum Kind { kSet, kConcat, kAlt, kRepeat } kind = kConcat;  // no kids: the empty text
  Ranges set;                              // kSet
  std::vector<std::unique_ptr<Ast>> kids;  // kConcat, kAlt, kRepeat (one)
  int min = 0, max = -1;                   // kRepeat; max -1: unbounded
};

}  // namespace

class RegexCompiler {
 public:
  explicit RegexCompiler(std::string_view p) : p_(p) {}

  absl::StatusOr<ByteRegex> Run() {
    size_t begin = 0, end = p_.size();
    if (begin < end && p_[begin] == '^') ++begin;
    // A trailing `$` (not an escaped one) anchors the end, as a full match does.
    if (end > begin && p_[end - 1] == '$') {
      size_t slashes = 0;
      while (end - 1 - slashes > begin && p_[end - 2 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) --end;
    }
    pos_ = begin;
    end_ = end;
    auto ast = Alternation(0);
    if (!ast.ok()) return ast.status();
    if (pos_ < end_) return Bad(p_[pos_] == ')' ? "an unbalanced ')'" : "an unexpected character");
    ByteRegex re;
    re.pattern_ = std::string(p_);
    const int start = NewState();
    const int accept = NewState();
    if (!Build(**ast, start, accept) || !Finish(start, accept, &re)) {
      return absl::InvalidArgumentError(absl::StrCat("the regex needs more than ", ByteRegex::kMaxStates,
                                                     " automaton states (counted repetitions copy theirs)"));
    }
    if (!re.ends_) {
      return absl::InvalidArgumentError(
          "the regex matches no text (a class such as [^\\D\\w] holds no character), so no reply can satisfy it");
    }
    return re;
  }

 private:
  // Thompson construction states: epsilon moves and byte-range moves.
  struct State {
    std::vector<int> eps;
    std::vector<std::pair<std::pair<uint8_t, uint8_t>, int>> bytes;
  };

  absl::Status Bad(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regex ", what, " at offset ", pos_, " is not supported"));
  }

  bool AtEnd() const { return pos_ >= end_; }
  char Peek() const { return p_[pos_]; }

  absl::StatusOr<std::unique_ptr<Ast>> Alternation(int depth) {
    if (depth > kMaxParseDepth) return Bad("nesting deeper than 200 groups");
    auto alt = std::make_unique<Ast>();
    alt->kind = Ast::kAlt;
    while (true) {
      auto c = Concatenation(depth);
      if (!c.ok()) return c.status();
      alt->kids.push_back(*std::move(c));
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    if (alt->kids.size() == 1) return std::move(alt->kids[0]);
    return alt;
  }

  absl::StatusOr<std::unique_ptr<Ast>> Concatenation(int depth) {
    auto cat = std::make_unique<Ast>();
    cat->kind = Ast::kConcat;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      auto atom = Atom(depth);
      if (!atom.ok()) return atom.status();
      std::unique_ptr<Ast> a = *std::move(atom);
      bool repeated = false;
      while (!AtEnd()) {
        int min = 0, max = -1;
        const size_t at = pos_;
        const char c = Peek();
        if (c == '*') {
          ++pos_;
        } else if (c == '+') {
          min = 1;
          ++pos_;
        } else if (c == '?') {
          max = 1;
          ++pos_;
        } else if (c != '{' || !Counted(&min, &max)) {
          break;
        }
        if (repeated) {
          pos_ = at;
          return Bad("a repeat of a repeat");
        }
        if (max >= 0 && min > max) return Bad("a {min,max} with min > max");
        if (min > kMaxRepeat || max > kMaxRepeat) return Bad("a repeat count over 1000");
        // A lazy (?) or possessive (+) form matches the same texts.
        if (!AtEnd() && (Peek() == '?' || Peek() == '+')) ++pos_;
        auto r = std::make_unique<Ast>();
        r->kind = Ast::kRepeat;
        r->min = min;
        r->max = max;
        r->kids.push_back(std::move(a));
        a = std::move(r);
        repeated = true;
      }
      cat->kids.push_back(std::move(a));
    }
    if (cat->kids.size() == 1) return std::move(cat->kids[0]);
    return cat;
  }

  // {n}, {n,}, {,m}, {n,m} at pos_ (a '{'); false (pos_ unchanged) when it is
  // not a quantifier, which Python reads as a literal '{'.
  bool Counted(int* min, int* max) {
    size_t i = pos_ + 1;
    auto number = [&](int* out) {
      const size_t from = i;
      long v = 0;
      while (i < end_ && p_[i] >= '0' && p_[i] <= '9' && v <= 100000) v = v * 10 + (p_[i++] - '0');
      *out = static_cast<int>(v);
      return i > from;
    };
    int lo = 0, hi = -1;
    const bool has_lo = number(&lo);
    if (i < end_ && p_[i] == '}') {
      if (!has_lo) return false;
      *min = *max = lo;
      pos_ = i + 1;
      return true;
    }
    if (i >= end_ || p_[i] != ',') return false;
    ++i;
    const bool has_hi = number(&hi);
    if (i >= end_ || p_[i] != '}') return false;
    *min = has_lo ? lo : 0;
    *max = has_hi ? hi : -1;
    pos_ = i + 1;
    return true;
  }

  static std::unique_ptr<Ast> Set(Ranges r) {
    auto a = std::make_unique<Ast>();
    a->kind = Ast::kSet;
    a->set = Normalize(std::move(r));
    return a;
  }

  // One UTF-8 character of the pattern at pos_.
  absl::StatusOr<uint32_t> Char() {
    const uint8_t b = static_cast<uint8_t>(p_[pos_]);
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > end_) return Bad("invalid UTF-8");
    uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < n; ++k) {
      const uint8_t c = static_cast<uint8_t>(p_[pos_ + k]);
      if ((c & 0xC0) != 0x80) return Bad("invalid UTF-8");
      cp = (cp << 6) | (c & 0x3F);
    }
    pos_ += n;
    return cp;
  }

  absl::StatusOr<std::unique_ptr<Ast>> Atom(int depth) {
    const char c = Peek();
    switch (c) {
      case '(': {
        ++pos_;
        if (!AtEnd() && Peek() == '?') {
          if (pos_ + 1 < end_ && p_[pos_ + 1] == ':') {
            pos_ += 2;
          } else if (pos_ + 2 < end_ && p_[pos_ + 1] == 'P' && p_[pos_ + 2] == '<') {
            const size_t close = p_.find('>', pos_);
            if (close == std::string_view::npos || close >= end_) return Bad("an unclosed group name");
            pos_ = close + 1;
          } else {
            return Bad("a (?...) group other than (?:...) and (?P<name>...)");
          }
        }
        auto inner = Alternation(depth + 1);
        if (!inner.ok()) return inner.status();
        if (AtEnd() || Peek() != ')') return Bad("an unclosed '('");
        ++pos_;
        return inner;
      }
      case '[':
        return Class();
      case '.':
        ++pos_;
        return Set(Complement({{'\n', '\n'}}));
      case '\\': {
        Ranges r;
        RETURN_IF_ERROR(Escape(/*in_class=*/false, &r));
        return Set(std::move(r));
      }
      case '*':
      case '+':
      case '?':
        return Bad("nothing to repeat");
      case '^':
      case '$':
        return Bad(absl::StrCat("'", std::string(1, c), "' (anchors) inside the pattern"));
      default: {
        auto cp = Char();
        if (!cp.ok()) return cp.status();
        return Set({{*cp, *cp}});
      }
    }
  }

  static Ranges Digits() { return {{'0', '9'}}; }
  static Ranges Word() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
  static Ranges Space() { return {{'\t', '\r'}, {' ', ' '}}; }

  // An escape at pos_ (a backslash): its set of code points.
  absl::Status Escape(bool in_class, Ranges* out) {
    ++pos_;
    if (AtEnd()) return Bad("a trailing backslash");
    const char c = Peek();
    auto hex = [&](int digits) -> absl::Status {
      uint32_t v = 0;
      for (int k = 0; k < digits; ++k) {
        if (pos_ >= end_) return Bad("a short \\x, \\u or \\U escape");
        const char h = p_[pos_++];
        const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                     : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return Bad("a \\x, \\u or \\U escape with a non-hex digit");
        v = v * 16 + static_cast<uint32_t>(d);
      }
      if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) return Bad("an escape that is no character");
      out->emplace_back(v, v);
      return absl::OkStatus();
    };
    ++pos_;
    switch (c) {
      case 'd': *out = Digits(); return absl::OkStatus();
      case 'D': *out = Complement(Digits()); return absl::OkStatus();
      case 'w': *out = Word(); return absl::OkStatus();
      case 'W': *out = Complement(Word()); return absl::OkStatus();
      case 's': *out = Space(); return absl::OkStatus();
      case 'S': *out = Complement(Space()); return absl::OkStatus();
      case 't': out->emplace_back('\t', '\t'); return absl::OkStatus();
      case 'n': out->emplace_back('\n', '\n'); return absl::OkStatus();
      case 'r': out->emplace_back('\r', '\r'); return absl::OkStatus();
      case 'f': out->emplace_back('\f', '\f'); return absl::OkStatus();
      case 'v': out->emplace_back('\v', '\v'); return absl::OkStatus();
      case 'a': out->emplace_back(7, 7); return absl::OkStatus();
      case '0': out->emplace_back(0, 0); return absl::OkStatus();
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      case 'b':
        if (in_class) {
          out->emplace_back(8, 8);
          return absl::OkStatus();
        }
        break;
      default:
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) &&
            static_cast<uint8_t>(c) < 0x80) {
          out->emplace_back(static_cast<uint8_t>(c), static_cast<uint8_t>(c));
          return absl::OkStatus();
        }
    }
    pos_ -= 2;
    return Bad(absl::StrCat("the escape \\", std::string(1, c)));
  }

  absl::StatusOr<std::unique_ptr<Ast>> Class() {
    ++pos_;  // '['
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges set;
    bool first = true;
    while (true) {
      if (AtEnd()) return Bad("an unclosed '['");
      if (Peek() == ']' && !first) break;
      first = false;
      // One item: a character (perhaps a range's start) or a class escape.
      Ranges item;
      uint32_t lo;
      if (Peek() == '\\') {
        RETURN_IF_ERROR(Escape(/*in_class=*/true, &item));
        if (item.size() != 1 || item[0].first != item[0].second) {  // \d, \w, ...
          set.insert(set.end(), item.begin(), item.end());
          continue;
        }
        lo = item[0].first;
      } else {
        if (Peek() == '[' && pos_ + 1 < end_ && (p_[pos_ + 1] == ':' || p_[pos_ + 1] == '=' || p_[pos_ + 1] == '.')) {
          return Bad("a POSIX class");
        }
        auto cp = Char();
        if (!cp.ok()) return cp.status();
        lo = *cp;
      }
      uint32_t hi = lo;
      if (pos_ + 1 < end_ && Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        Ranges end_item;
        if (Peek() == '\\') {
          RETURN_IF_ERROR(Escape(true, &end_item));
          if (end_item.size() != 1 || end_item[0].first != end_item[0].second) return Bad("a range ending in a class");
          hi = end_item[0].first;
        } else {
          auto cp = Char();
          if (!cp.ok()) return cp.status();
          hi = *cp;
        }
        if (hi < lo) return Bad("a reversed range");
      }
      set.emplace_back(lo, hi);
    }
    ++pos_;  // ']'
    return Set(negate ? Complement(set) : set);
  }

  int NewState() {
    states_.emplace_back();
    return static_cast<int>(states_.size()) - 1;
  }

  // Adds states and moves so that `from` reaches `to` exactly over `a`'s
  // texts; false past kMaxStates.
  bool Build(const Ast& a, int from, int to) {
    if (states_.size() > static_cast<size_t>(kMaxNfaStates)) return false;
    switch (a.kind) {
      case Ast::kSet: {
        std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
        for (const auto& [lo, hi] : a.set) Utf8Sequences(lo, hi, &seqs);
        for (const auto& seq : seqs) {
          int at = from;
          for (size_t k = 0; k < seq.size(); ++k) {
            const int next = k + 1 == seq.size() ? to : NewState();
            states_[at].bytes.push_back({seq[k], next});
            at = next;
          }
        }
        return true;
      }
      case Ast::kConcat: {
        int at = from;
        for (size_t k = 0; k < a.kids.size(); ++k) {
          const int next = k + 1 == a.kids.size() ? to : NewState();
          if (!Build(*a.kids[k], at, next)) return false;
          at = next;
        }
        if (a.kids.empty()) states_[from].eps.push_back(to);
        return true;
      }
      case Ast::kAlt:
        for (const auto& kid : a.kids) {
          const int s = NewState();
          states_[from].eps.push_back(s);
          if (!Build(*kid, s, to)) return false;
        }
        return true;
      case Ast::kRepeat: {
        const Ast& kid = *a.kids[0];
        int at = from;
        for (int k = 0; k < a.min; ++k) {
          const int next = NewState();
          if (!Build(kid, at, next)) return false;
          at = next;
        }
        if (a.max < 0) {  // then any number more: a loop
          const int loop = NewState();
          states_[at].eps.push_back(loop);
          const int body_end = NewState();
          if (!Build(kid, loop, body_end)) return false;
          states_[body_end].eps.push_back(loop);
          states_[loop].eps.push_back(to);
          return true;
        }
        for (int k = a.min; k < a.max; ++k) {  // each more is optional
          states_[at].eps.push_back(to);
          const int next = k + 1 == a.max ? to : NewState();
          if (!Build(kid, at, next)) return false;
          at = next;
        }
        if (a.min == a.max) states_[at].eps.push_back(to);
        return true;
      }
    }
    return true;
  }

  // The DFA: subsets of NFA states (closed under epsilon moves) over the
  // classes of bytes no move tells apart; false past kMaxStates.
  bool Finish(int start, int accept, ByteRegex* re) {
    const int n = static_cast<int>(states_.size());
    // Byte classes: cut at every move's bounds.
    bool cut[257] = {};
    for (const State& st : states_) {
      for (const auto& [range, target] : st.bytes) {
        cut[range.first] = true;
        cut[range.second + 1] = true;
      }
    }
    int classes = 0;
    uint8_t representative[256];
    for (int b = 0; b < 256; ++b) {
      if (b > 0 && cut[b]) ++classes;
      re->class_of_[b] = static_cast<uint8_t>(classes);
      representative[classes] = static_cast<uint8_t>(b);
    }
    re->num_classes_ = classes + 1;
    std::vector<uint8_t> mark(n, 0);
    auto close = [&](std::vector<int> set) {  // epsilon closure, sorted
      std::vector<int> out, stack = std::move(set);
      while (!stack.empty()) {
        const int x = stack.back();
        stack.pop_back();
        if (mark[x]) continue;
        mark[x] = 1;
        out.push_back(x);
        for (int y : states_[x].eps) stack.push_back(y);
      }
      for (int x : out) mark[x] = 0;
      std::sort(out.begin(), out.end());
      return out;
    };
    std::map<std::vector<int>, int32_t> ids;
    std::vector<std::vector<int>> sets;
    auto id_of = [&](std::vector<int> set) -> int32_t {
      if (set.empty()) return -1;
      auto [it, added] = ids.emplace(set, static_cast<int32_t>(sets.size()));
      if (added) sets.push_back(std::move(set));
      return it->second;
    };
    re->start_ = id_of(close({start}));
    int64_t work = 0;
    for (size_t d = 0; d < sets.size(); ++d) {
      if (sets.size() > static_cast<size_t>(ByteRegex::kMaxStates)) return false;
      work += static_cast<int64_t>(sets[d].size()) * re->num_classes_;
      if (work > kMaxSubsetWork) return false;
      const bool accepting = std::binary_search(sets[d].begin(), sets[d].end(), accept);
      re->accepting_.push_back(accepting);
      bool live = false;
      for (int c = 0; c < re->num_classes_; ++c) {
        const uint8_t byte = representative[c];
        std::vector<int> targets;
        for (int x : sets[d]) {
          for (const auto& [range, target] : states_[x].bytes) {
            if (byte >= range.first && byte <= range.second) targets.push_back(target);
          }
        }
        const int32_t next = id_of(close(std::move(targets)));
        re->next_.push_back(next);
        live |= next >= 0;
      }
      re->live_.push_back(live);
    }
    if (sets.size() > static_cast<size_t>(ByteRegex::kMaxStates)) return false;
    PruneDeadEnds(re);
    return true;
  }

  // A state from which no text reaches the accepting one (a class that
  // holds no character, such as [^\D\w], leaves such ends) is made
  // unreachable: a step into it is -1, so that every state a step gives can
  // still end a match, and a token mask that follows the steps allows only
  // what can complete.
  static void PruneDeadEnds(ByteRegex* re) {
    const int n = static_cast<int>(re->accepting_.size());
    const int k = re->num_classes_;
    std::vector<std::vector<int32_t>> into(n);
    for (int d = 0; d < n; ++d) {
      for (int c = 0; c < k; ++c) {
        const int32_t next = re->next_[static_cast<size_t>(d) * k + c];
        if (next >= 0) into[next].push_back(d);
      }
    }
    std::vector<uint8_t> ends(n, 0);
    std::vector<int32_t> stack;
    for (int d = 0; d < n; ++d) {
      if (re->accepting_[d]) {
        ends[d] = 1;
        stack.push_back(d);
      }
    }
    while (!stack.empty()) {
      const int32_t d = stack.back();
      stack.pop_back();
      for (int32_t from : into[d]) {
        if (!ends[from]) {
          ends[from] = 1;
          stack.push_back(from);
        }
      }
    }
    for (int d = 0; d < n; ++d) {
      bool live = false;
      for (int c = 0; c < k; ++c) {
        int32_t& next = re->next_[static_cast<size_t>(d) * k + c];
        if (next >= 0 && !ends[next]) next = -1;
        live |= next >= 0;
      }
      re->live_[d] = live;
    }
    re->ends_ = ends[re->start_] != 0;
  }

  std::string_view p_;
  size_t pos_ = 0, end_ = 0;
  std::vector<State> states_;
};

absl::StatusOr<ByteRegex> ByteRegex::Compile(std::string_view pattern) {
  return RegexCompiler(pattern).Run();
}

}  // namespace tandem
