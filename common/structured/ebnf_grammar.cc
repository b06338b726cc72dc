// JsonGrammar::FromEbnf: a context-free grammar in GBNF / XGrammar's EBNF
// (vLLM's structured_outputs.grammar and guided_grammar, llama.cpp's
// `grammar`), compiled to the matcher's nodes: a rule is a sequence or a
// union of sequences, a string literal a kLiteral, a character class a
// kRegex of one character (ByteRegex holds the UTF-8), `x*` `x+` `x?`
// `x{m,n}` a kRepeat. The matcher then follows it as it follows a schema, a
// stack of frames per alternative, byte by byte.
//
// Written here rather than taken from a library: Debian packages none of
// XGrammar, llguidance or llama.cpp's grammar code, and the matcher, the
// token mask and its limits are the ones JSON schemas already use.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "common/base/utf8.h"
#include "common/structured/grammar_node.h"
#include "common/structured/json_grammar.h"

namespace tandem {

namespace {

constexpr size_t kMaxGrammarBytes = 1 << 20;  // of grammar text
constexpr int kMaxGrammarNodes = 100000;
constexpr int kMaxRepeat = 1 << 20;           // the n of x{m,n}
constexpr int kMaxNesting = 256;              // parentheses within each other
constexpr int kMaxClassStates = 200000;       // over all character classes' automata

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

}  // namespace

class EbnfCompiler {
 public:
  using Node = JsonGrammar::Node;

  EbnfCompiler(JsonGrammar* g, const std::string& text) : g_(g), s_(text) {}

  absl::Status Compile() {
    if (s_.size() > kMaxGrammarBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar: ", s_.size(), " bytes; the limit is ", kMaxGrammarBytes));
    }
    SkipSpace();
    while (pos_ < s_.size()) {
      const size_t at = pos_;
      std::string name = Name();
      if (name.empty()) return Error(at, "expected a rule's name");
      SkipSpace();
      if (s_.compare(pos_, 3, "::=") != 0) return Error(pos_, absl::StrCat("expected ::= after \"", name, "\""));
      pos_ += 3;
      const int rule = RuleNode(name, at);
      if (defined_[rule]) return Error(at, absl::StrCat("rule \"", name, "\" is defined twice"));
      defined_[rule] = true;
      auto body = Alternatives(0);
      if (!body.ok()) return body.status();
      // The rule's node holds a sequence of its body alone: references made
      // before this point name this node, and the body's own may be another
      // rule's.
      Node& n = g_->nodes_[rule];
      n.kind = Node::kSequence;
      n.exact = true;
      n.alternatives = {*body};
      SkipSpace();
    }
    for (const auto& [name, rule] : rules_) {
      if (!defined_[rule]) {
        return Error(used_at_[rule], absl::StrCat("rule \"", name, "\" is used but not defined"));
      }
    }
    auto root = rules_.find("root");
    if (root == rules_.end()) return absl::InvalidArgumentError("grammar: no rule is named \"root\"");
    g_->root_ = root->second;
    const std::vector<bool> productive = ProductiveNodes(g_->nodes_);
    if (!productive[g_->root_]) {
      std::vector<std::string> names;
      for (const auto& [name, rule] : rules_) {
        if (!productive[rule]) names.push_back(absl::StrCat("\"", name, "\""));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "grammar: rule \"root\" matches no text: rule(s) ", absl::StrJoin(names, ", "),
          " never end (every alternative leads back to the rule itself)"));
    }
    return Check();
  }

 private:
  absl::Status Error(size_t at, const std::string& what) const {
    int line = 1, column = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("grammar: line ", line, " column ", column, ": ", what));
  }

  // Spaces, tabs, newlines and comments (# to the end of the line).
  void SkipSpace() {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string Name() {
    const size_t start = pos_;
    while (pos_ < s_.size() && IsNameChar(s_[pos_])) ++pos_;
    return s_.substr(start, pos_ - start);
  }

  // At a rule's start: a name, then ::= (ends the sequence before it).
  bool AtRuleStart() const {
    size_t p = pos_;
    while (p < s_.size() && IsNameChar(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n' || s_[p] == '\r')) ++p;
    return s_.compare(p, 3, "::=") == 0;
  }

  int Add(Node n) {
    n.exact = true;
    g_->nodes_.push_back(std::move(n));
    return static_cast<int>(g_->nodes_.size()) - 1;
  }

  // The node of rule `name` (reserved at its first mention).
  int RuleNode(const std::string& name, size_t at) {
    auto [it, fresh] = rules_.emplace(name, 0);
    if (fresh) {
      it->second = Add(Node());
      defined_[it->second] = false;
      used_at_[it->second] = at;
      rule_names_[it->second] = name;
    }
    return it->second;
  }

  absl::StatusOr<int> Alternatives(int nesting) {
    if (nesting > kMaxNesting) return Error(pos_, absl::StrCat("parentheses nest deeper than ", kMaxNesting));
    std::vector<int> alts;
    while (true) {
      auto seq = Sequence(nesting);
      if (!seq.ok()) return seq.status();
      alts.push_back(*seq);
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    if (alts.size() == 1) return alts[0];
    Node u;
    u.kind = Node::kUnion;
    u.alternatives = std::move(alts);
    return AddChecked(std::move(u));
  }

  absl::StatusOr<int> Sequence(int nesting) {
    std::vector<int> items;
    while (true) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] == '|' || s_[pos_] == ')' || AtRuleStart()) break;
      auto item = Postfix(nesting);
      if (!item.ok()) return item.status();
      items.push_back(*item);
    }
    if (items.size() == 1) return items[0];
    Node seq;  // empty: the empty text
    seq.kind = Node::kSequence;
    seq.alternatives = std::move(items);
    return AddChecked(std::move(seq));
  }

  absl::StatusOr<int> Postfix(int nesting) {
    auto item = Primary(nesting);
    if (!item.ok()) return item;
    int node = *item;
    while (pos_ < s_.size()) {
      const size_t at = pos_;
      int min = 0, max = -1;
      const char c = s_[pos_];
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        ++pos_;
        min = 1;
      } else if (c == '?') {
        ++pos_;
        max = 1;
      } else if (c == '{') {
        ++pos_;
        SkipSpace();
        const bool has_min = pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9';
        if (has_min && !Count(&min)) return Error(at, absl::StrCat("a repetition count above ", kMaxRepeat));
        SkipSpace();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          SkipSpace();
          if (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
            if (!Count(&max)) return Error(at, absl::StrCat("a repetition count above ", kMaxRepeat));
          }
        } else if (has_min) {
          max = min;
        } else {
          return Error(at, "expected {m}, {m,}, {,n} or {m,n}");
        }
        SkipSpace();
        if (pos_ >= s_.size() || s_[pos_] != '}') return Error(at, "expected } to close the repetition");
        ++pos_;
        if (max >= 0 && max < min) return Error(at, absl::StrFormat("repetition {%d,%d}: n is below m", min, max));
      } else {
        break;
      }
      Node r;
      r.kind = Node::kRepeat;
      r.items = node;
      r.min_items = min;
      r.max_items = max;
      auto added = AddChecked(std::move(r));
      if (!added.ok()) return added;
      node = *added;
      repeat_at_[node] = at;
    }
    return node;
  }

  bool Count(int* out) {
    int64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      v = v * 10 + (s_[pos_++] - '0');
      if (v > kMaxRepeat) return false;
    }
    *out = static_cast<int>(v);
    return true;
  }

  absl::StatusOr<int> Primary(int nesting) {
    const size_t at = pos_;
    const char c = s_[pos_];
    if (c == '(') {
      ++pos_;
      SkipSpace();
      if (s_.compare(pos_, 1, "=") == 0) return Error(at, "lookahead assertions (= ...) are not supported");
      auto inner = Alternatives(nesting + 1);
      if (!inner.ok()) return inner;
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ')') return Error(at, "this ( is not closed");
      ++pos_;
      return inner;
    }
    if (c == '"') return Literal();
    if (c == '[') return Class();
    if (c == '.') {
      ++pos_;
      return Regex("[\\x00-\\U0010ffff]", at);
    }
    if (IsNameChar(c)) {
      const std::string name = Name();
      return RuleNode(name, at);
    }
    return Error(at, absl::StrCat("unexpected \"", std::string(1, c), "\""));
  }

  // One character of a literal or class: an escape or a UTF-8 character.
  absl::StatusOr<uint32_t> Char(bool in_class) {
    const size_t at = pos_;
    const uint8_t c = static_cast<uint8_t>(s_[pos_]);
    if (c == '\\') {
      if (pos_ + 1 >= s_.size()) return Error(at, "an escape at the end of the text");
      const char e = s_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case 'n': return uint32_t{'\n'};
        case 'r': return uint32_t{'\r'};
        case 't': return uint32_t{'\t'};
        case 'f': return uint32_t{'\f'};
        case 'v': return uint32_t{'\v'};
        case '0': return uint32_t{0};
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': case '.':
          return static_cast<uint32_t>(e);
        case 'x': case 'u': case 'U': {
          const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (int i = 0; i < digits; ++i, ++pos_) {
            const char h = pos_ < s_.size() ? s_[pos_] : 0;
            const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) return Error(at, absl::StrCat("\\", std::string(1, e), " takes ", digits, " hex digits"));
            v = v * 16 + static_cast<uint32_t>(d);
          }
          if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
            return Error(at, absl::StrFormat("U+%X is not a Unicode scalar value", v));
          }
          return v;
        }
        default:
          return Error(at, absl::StrCat("unknown escape \\", std::string(1, e)));
      }
    }
    if (!in_class && c == '\n') return Error(at, "a string literal runs past the end of its line");
    // UTF-8: the character's bytes as one code point.
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > s_.size()) return Error(at, "invalid UTF-8");
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < len; ++i) {
      const uint8_t b = static_cast<uint8_t>(s_[pos_ + i]);
      if ((b & 0xC0) != 0x80) return Error(at, "invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += len;
    return cp;
  }

  absl::StatusOr<int> Literal() {
    const size_t at = pos_;
    ++pos_;  // "
    std::string text;
    while (true) {
      if (pos_ >= s_.size()) return Error(at, "this string literal is not closed");
      if (s_[pos_] == '"') break;
      auto cp = Char(false);
      if (!cp.ok()) return cp.status();
      AppendUtf8(*cp, &text);
    }
    ++pos_;
    if (text.empty()) {
      Node empty;
      empty.kind = Node::kSequence;
      return AddChecked(std::move(empty));
    }
    g_->texts_.push_back(std::move(text));
    Node n;
    n.kind = Node::kLiteral;
    n.alternatives = {static_cast<int>(g_->texts_.size()) - 1};
    return AddChecked(std::move(n));
  }

  // [...] as a ByteRegex class of code point ranges.
  absl::StatusOr<int> Class() {
    const size_t at = pos_;
    ++pos_;  // [
    std::string pattern = "[";
    if (pos_ < s_.size() && s_[pos_] == '^') {
      pattern += '^';
      ++pos_;
    }
    bool any = false;
    while (true) {
      if (pos_ >= s_.size()) return Error(at, "this character class is not closed");
      if (s_[pos_] == ']') break;
      auto lo = Char(true);
      if (!lo.ok()) return lo.status();
      uint32_t hi = *lo;
      if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        auto h = Char(true);
        if (!h.ok()) return h.status();
        hi = *h;
        if (hi < *lo) return Error(at, absl::StrFormat("range U+%X-U+%X is backwards", *lo, hi));
      }
      absl::StrAppendFormat(&pattern, "\\U%08x-\\U%08x", *lo, hi);
      any = true;
    }
    ++pos_;
    if (!any) return Error(at, "an empty character class matches nothing");
    pattern += ']';
    return Regex(pattern, at);
  }

  absl::StatusOr<int> Regex(const std::string& pattern, size_t at) {
    auto re = ByteRegex::Compile(pattern);
    if (!re.ok()) return Error(at, std::string(re.status().message()));
    class_states_ += re->num_states();
    if (class_states_ > kMaxClassStates) {
      return Error(at, absl::StrCat("the grammar's character classes need more than ", kMaxClassStates,
                                    " automaton states in all"));
    }
    g_->regexes_.push_back(*std::move(re));
    Node n;
    n.kind = Node::kRegex;
    n.regex = static_cast<int>(g_->regexes_.size()) - 1;
    return AddChecked(std::move(n));
  }

  absl::StatusOr<int> AddChecked(Node n) {
    if (g_->nodes_.size() >= static_cast<size_t>(kMaxGrammarNodes)) {
      return absl::InvalidArgumentError(absl::StrCat("grammar: more than ", kMaxGrammarNodes, " nodes"));
    }
    return Add(std::move(n));
  }

  // What the matcher needs to end: nodes that may match the empty text
  // (Node::nullable), no rule that reaches itself before a character
  // (left recursion: the matcher would descend forever), and no repetition
  // (other than ?) of something that may be empty (it would loop in place).
  absl::Status Check() {
    auto& nodes = g_->nodes_;
    for (bool changed = true; changed;) {
      changed = false;
      for (Node& n : nodes) {
        if (n.nullable) continue;
        bool v = false;
        switch (n.kind) {
          case Node::kSequence:
            v = std::all_of(n.alternatives.begin(), n.alternatives.end(),
                            [&](int e) { return nodes[e].nullable; });
            break;
          case Node::kUnion:
            v = std::any_of(n.alternatives.begin(), n.alternatives.end(),
                            [&](int e) { return nodes[e].nullable; });
            break;
          case Node::kRepeat: v = n.min_items == 0 || nodes[n.items].nullable; break;
          default: break;
        }
        if (v) n.nullable = changed = true;
      }
    }
    for (const auto& [node, at] : repeat_at_) {
      const Node& n = nodes[node];
      if (n.max_items != 1 && nodes[n.items].nullable) {
        return Error(at, "a repetition of something that may match the empty text (repeat what it must "
                         "match, e.g. (x+)? for (x*)*)");
      }
    }
    // Depth-first over "may start with" edges; a node on the current path
    // seen again is left recursion. 0 unseen, 1 on the path, 2 done.
    std::vector<uint8_t> mark(nodes.size(), 0);
    std::vector<std::pair<int, size_t>> stack;  // node, next edge
    auto edges = [&](int v, size_t i) -> int {  // the i-th edge of v, or -1
      const Node& n = nodes[v];
      if (n.kind == Node::kRepeat) return i == 0 ? n.items : -1;
      if (n.kind == Node::kUnion) return i < n.alternatives.size() ? n.alternatives[i] : -1;
      if (n.kind == Node::kSequence) {
        if (i >= n.alternatives.size()) return -1;
        for (size_t k = 0; k < i; ++k) {
          if (!nodes[n.alternatives[k]].nullable) return -1;
        }
        return n.alternatives[i];
      }
      return -1;
    };
    for (int start = 0; start < static_cast<int>(nodes.size()); ++start) {
      if (mark[start] != 0) continue;
      stack.emplace_back(start, 0);
      mark[start] = 1;
      while (!stack.empty()) {
        auto& [v, i] = stack.back();
        const int w = edges(v, i++);
        if (w < 0) {
          mark[v] = 2;
          stack.pop_back();
        } else if (mark[w] == 1) {
          std::string name = "?";
          for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
            if (rule_names_.count(it->first)) name = rule_names_[it->first];
            if (it->first == w) break;
          }
          if (rule_names_.count(w)) name = rule_names_[w];
          return absl::InvalidArgumentError(absl::StrCat(
              "grammar: rule \"", name, "\" is left-recursive (it can reach itself before any character); "
              "write the recursion on the right, e.g. list ::= item (\",\" item)*"));
        } else if (mark[w] == 0) {
          mark[w] = 1;
          stack.emplace_back(w, 0);
        }
      }
    }
    return absl::OkStatus();
  }

  JsonGrammar* g_;
  const std::string& s_;
  size_t pos_ = 0;
  std::map<std::string, int> rules_;    // name -> its node
  std::map<int, bool> defined_;         // rule node -> its definition was read
  std::map<int, size_t> used_at_;       // rule node -> its first mention
  std::map<int, std::string> rule_names_;
  std::map<int, size_t> repeat_at_;     // repetition node -> where it is written
  int class_states_ = 0;
};

absl::StatusOr<std::shared_ptr<const JsonGrammar>> JsonGrammar::FromEbnf(const std::string& grammar) {
  std::shared_ptr<JsonGrammar> g(new JsonGrammar());
  g->grammar_ = grammar;
  EbnfCompiler compiler(g.get(), g->grammar_);
  if (absl::Status st = compiler.Compile(); !st.ok()) return st;
  return std::shared_ptr<const JsonGrammar>(std::move(g));
}

}  // namespace tandem
