// Template source -> syntax tree, following jinja2's lexer (whitespace
// control, trim_blocks, lstrip_blocks, raw) and parser (its precedence
// climbing: condexpr > or > and > not > compare > + - > ~ > * / // % > ** >
// unary > primary with postfix, filters and tests).
#include <cctype>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/jinja_ast.h"

namespace tandem::jinja {
namespace {

constexpr int kMaxNesting = 128;  // expression and block depth

absl::Status SyntaxError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

// ---- Template lexer: text and tags ----

enum class TagKind { kVariable, kBlock };
struct Segment {
  bool is_text;
  TagKind tag = TagKind::kBlock;
  std::string text;  // the text, or the tag's inside without delimiters and signs
  int line;
};

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int CountLines(absl::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Finds the end of a tag's inside from `pos`, skipping string literals and
// what brackets enclose (as jinja2's lexer balances them: `{{ {}|x }}`);
// returns the position of `close` ("}}" or "%}") or npos.
size_t FindTagEnd(absl::string_view src, size_t pos, absl::string_view close) {
  char quote = 0;
  int depth = 0;
  for (size_t i = pos; i < src.size(); ++i) {
    const char c = src[i];
    if (quote != 0) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (depth == 0 && src.compare(i, close.size(), close) == 0) {
      return i;
    } else if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if ((c == ')' || c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return absl::string_view::npos;
}

absl::string_view TrimView(absl::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

absl::StatusOr<std::vector<Segment>> Lex(absl::string_view raw_source, const TemplateOptions& opt) {
  // jinja2 normalizes newlines first, then drops one trailing newline.
  std::string source;
  source.reserve(raw_source.size());
  for (size_t i = 0; i < raw_source.size(); ++i) {
    if (raw_source[i] == '\r') {
      source += '\n';
      if (i + 1 < raw_source.size() && raw_source[i + 1] == '\n') ++i;
    } else {
      source += raw_source[i];
    }
  }
  if (!opt.keep_trailing_newline && !source.empty() && source.back() == '\n') source.pop_back();
  const absl::string_view src = source;

  std::vector<Segment> out;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;
  auto emit_text = [&](std::string text, int at) {
    if (!text.empty()) out.push_back({true, TagKind::kBlock, std::move(text), at});
  };
  while (pos <= src.size()) {
    size_t open = absl::string_view::npos;
    for (size_t i = pos; i + 1 < src.size(); ++i) {
      if (src[i] == '{' && (src[i + 1] == '{' || src[i + 1] == '%' || src[i + 1] == '#')) {
        open = i;
        break;
      }
    }
    if (open == absl::string_view::npos) {
      emit_text(std::string(src.substr(pos)), line);
      break;
    }
    std::string text(src.substr(pos, open - pos));
    const int text_line = line;
    line += CountLines(text);
    const char type = src[open + 1];
    size_t inner = open + 2;
    char open_sign = 0;
    if (inner < src.size() && (src[inner] == '-' || src[inner] == '+')) open_sign = src[inner++];
    if (open_sign == '-') {
      while (!text.empty() && IsSpace(text.back())) text.pop_back();
    } else if (open_sign != '+' && opt.lstrip_blocks && type != '{') {
      const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if (l_pos > 0 || line_starting) {
        bool all_space = l_pos < text.size();
        for (size_t i = l_pos; i < text.size(); ++i) all_space = all_space && IsSpace(text[i]);
        if (all_space) text.resize(l_pos);
      }
    }
    emit_text(std::move(text), text_line);

    const int tag_line = line;
    size_t close;
    if (type == '#') {
      close = src.find("#}", inner);
    } else {
      close = FindTagEnd(src, inner, type == '{' ? "}}" : "%}");
    }
    if (close == absl::string_view::npos) {
      return SyntaxError(tag_line, type == '#'   ? "a comment is never closed (#})"
                                   : type == '{' ? "a {{ is never closed (}})"
                                                 : "a {% is never closed (%})");
    }
    size_t inner_end = close;
    char close_sign = 0;
    if (inner_end > inner && (src[inner_end - 1] == '-' || src[inner_end - 1] == '+')) {
      close_sign = src[inner_end - 1];
      --inner_end;
    }
    absl::string_view body = src.substr(inner, inner_end - inner);
    line += CountLines(src.substr(open, close + 2 - open));
    pos = close + 2;

    // {% raw %}: everything up to {% endraw %} is text.
    if (type == '%' && TrimView(body) == "raw") {
      size_t search = pos;
      size_t end_open = absl::string_view::npos, end_close = 0;
      char end_open_sign = 0, end_close_sign = 0;
      while ((end_open = src.find("{%", search)) != absl::string_view::npos) {
        size_t i = end_open + 2;
        char sign = 0;
        if (i < src.size() && (src[i] == '-' || src[i] == '+')) sign = src[i++];
        while (i < src.size() && IsSpace(src[i])) ++i;
        if (src.compare(i, 6, "endraw") == 0) {
          i += 6;
          while (i < src.size() && IsSpace(src[i])) ++i;
          char csign = 0;
          if (i < src.size() && (src[i] == '-' || src[i] == '+')) csign = src[i++];
          if (src.compare(i, 2, "%}") == 0) {
            end_open_sign = sign;
            end_close_sign = csign;
            end_close = i + 2;
            break;
          }
        }
        search = end_open + 2;
      }
      if (end_open == absl::string_view::npos) return SyntaxError(tag_line, "{% raw %} without {% endraw %}");
      std::string raw(src.substr(pos, end_open - pos));
      if (close_sign == '-') {
        size_t k = 0;
        while (k < raw.size() && IsSpace(raw[k])) ++k;
        raw.erase(0, k);
      }
      if (end_open_sign == '-') {
        while (!raw.empty() && IsSpace(raw.back())) raw.pop_back();
      }
      emit_text(raw, line);
      line += CountLines(src.substr(pos, end_close - pos));
      pos = end_close;
      close_sign = end_close_sign;
    } else if (type != '#') {
      out.push_back({false, type == '{' ? TagKind::kVariable : TagKind::kBlock, std::string(body),
                     tag_line});
    }

    line_starting = false;
    if (close_sign == '-') {
      const size_t start = pos;
      while (pos < src.size() && IsSpace(src[pos])) ++pos;
      line_starting = pos > start && src[pos - 1] == '\n';
      line += CountLines(src.substr(start, pos - start));
    } else if (close_sign != '+' && opt.trim_blocks && type != '{' && pos < src.size() &&
               src[pos] == '\n') {
      ++pos;
      ++line;
      line_starting = true;
    }
    if (pos >= src.size()) break;
  }
  return out;
}

// ---- Expression tokens ----

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd };
  Kind kind;
  std::string text;  // name, operator, or the string's value
  int64_t int_value = 0;
  double float_value = 0;
};

absl::StatusOr<std::string> Unescape(absl::string_view s, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    auto append_code_point = [&](uint32_t cp) {
      if (cp < 0x80) {
        out += static_cast<char>(cp);
      } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      }
    };
    auto hex = [&](int digits) -> absl::Status {
      if (i + digits >= s.size()) {
        return SyntaxError(line, "a truncated \\x, \\u or \\U escape in a string");
      }
      std::string h(s.substr(i + 1, digits));
      for (char d : h) {
        if (!std::isxdigit(static_cast<unsigned char>(d))) {
          return SyntaxError(line, "a truncated \\x, \\u or \\U escape in a string");
        }
      }
      const uint32_t cp = static_cast<uint32_t>(std::strtoul(h.c_str(), nullptr, 16));
      if (cp > 0x10FFFF) return SyntaxError(line, "an escape past U+10FFFF in a string");
      append_code_point(cp);
      i += digits;
      return absl::OkStatus();
    };
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\n': break;  // a line continuation
      case 'x': RETURN_IF_ERROR(hex(2)); break;
      case 'u': RETURN_IF_ERROR(hex(4)); break;
      case 'U': RETURN_IF_ERROR(hex(8)); break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = 0;
          int n = 0;
          --i;
          while (n < 3 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7') {
            v = v * 8 + (s[++i] - '0');
            ++n;
          }
          append_code_point(v);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view s, int line) {
  static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
                               "~",  "<",  ">",  "=",  "(",  ")", "[", "]", "{", "}", ",",
                               ".",  ":",  "|"};
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (IsSpace(c)) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::Kind::kName, std::string(s.substr(i, j - i))});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      std::string digits;
      auto take_digits = [&] {
        while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) {
          if (s[j] != '_') digits += s[j];
          ++j;
        }
      };
      take_digits();
      bool is_float = false;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        digits += s[j++];
        take_digits();
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          digits += 'e';
          digits += std::string(s.substr(j + 1, k - j - 1));
          j = k;
          take_digits();
        }
      }
      Token t{is_float ? Token::Kind::kFloat : Token::Kind::kInt, digits};
      if (is_float) {
        t.float_value = std::strtod(digits.c_str(), nullptr);
      } else {
        errno = 0;
        t.int_value = std::strtoll(digits.c_str(), nullptr, 10);
        if (errno == ERANGE) return SyntaxError(line, absl::StrCat("integer ", digits, " is too large"));
      }
      out.push_back(std::move(t));
      i = j;
    } else if (c == '\'' || c == '"') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != c) j += s[j] == '\\' ? 2 : 1;
      if (j >= s.size()) return SyntaxError(line, "a string literal is never closed");
      ASSIGN_OR_RETURN(std::string value, Unescape(s.substr(i + 1, j - i - 1), line));
      // Adjacent literals join, as in Python.
      if (!out.empty() && out.back().kind == Token::Kind::kString) {
        out.back().text += value;
      } else {
        out.push_back({Token::Kind::kString, std::move(value)});
      }
      i = j + 1;
    } else {
      bool matched = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (s.compare(i, n, op) == 0) {
          out.push_back({Token::Kind::kOp, op});
          i += n;
          matched = true;
          break;
        }
      }
      if (!matched) return SyntaxError(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
  }
  out.push_back({Token::Kind::kEnd, ""});
  return out;
}

// ---- Expression parser ----

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  bool AtEnd() const { return t_[p_].kind == Token::Kind::kEnd; }
  bool IsOp(absl::string_view op) const { return t_[p_].kind == Token::Kind::kOp && t_[p_].text == op; }
  bool IsName(absl::string_view n) const { return t_[p_].kind == Token::Kind::kName && t_[p_].text == n; }
  bool SkipOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    ++p_;
    return true;
  }
  bool SkipName(absl::string_view n) {
    if (!IsName(n)) return false;
    ++p_;
    return true;
  }
  absl::Status Expect(absl::string_view op) {
    if (SkipOp(op)) return absl::OkStatus();
    return Error(absl::StrCat("expected '", op, "'"));
  }
  absl::StatusOr<std::string> ExpectName() {
    if (t_[p_].kind != Token::Kind::kName) return Error("expected a name");
    return t_[p_++].text;
  }
  absl::Status ExpectEnd() {
    if (AtEnd()) return absl::OkStatus();
    return Error("unexpected text after the statement");
  }
  absl::Status Error(absl::string_view what) const {
    const Token& t = t_[p_];
    return SyntaxError(line_, absl::StrCat(what, t.kind == Token::Kind::kEnd
                                                     ? " at the end of the tag"
                                                     : absl::StrCat(" near '", t.text, "'")));
  }

  absl::StatusOr<ExprPtr> Expression() { return CondExpr(); }

  // An `or` expression, or a bare tuple of them (a for's iterable).
  absl::StatusOr<ExprPtr> OrTuple() {
    ASSIGN_OR_RETURN(ExprPtr first, Or());
    if (!IsOp(",")) return first;
    auto tuple = Make(Expr::Kind::kTuple);
    tuple->args.push_back(std::move(first));
    while (SkipOp(",")) {
      if (AtEnd() || IsName("if")) break;
      ASSIGN_OR_RETURN(ExprPtr e, Or());
      tuple->args.push_back(std::move(e));
    }
    return tuple;
  }

  // "a, b" targets of for / set.
  absl::StatusOr<std::vector<std::string>> Targets() {
    std::vector<std::string> names;
    const bool paren = SkipOp("(");
    do {
      ASSIGN_OR_RETURN(std::string n, ExpectName());
      names.push_back(std::move(n));
    } while (SkipOp(","));
    if (paren) RETURN_IF_ERROR(Expect(")"));
    return names;
  }

  // An expression, or a bare tuple "a, b" (set x = 1, 2).
  absl::StatusOr<ExprPtr> TupleOrExpression() {
    ASSIGN_OR_RETURN(ExprPtr first, Expression());
    if (!IsOp(",")) return first;
    auto tuple = Make(Expr::Kind::kTuple);
    tuple->args.push_back(std::move(first));
    while (SkipOp(",")) {
      if (AtEnd()) break;
      ASSIGN_OR_RETURN(ExprPtr e, Expression());
      tuple->args.push_back(std::move(e));
    }
    return tuple;
  }

  // For filter blocks: "name(args) | name2" applied to a null operand.
  absl::StatusOr<ExprPtr> FilterChain() {
    ExprPtr node;
    do {
      ASSIGN_OR_RETURN(node, Filter(std::move(node)));
    } while (SkipOp("|"));
    return node;
  }

  // Macro parameters: "(a, b='x')".
  absl::Status Params(Stmt* macro) {
    RETURN_IF_ERROR(Expect("("));
    while (!SkipOp(")")) {
      if (!macro->params.empty()) RETURN_IF_ERROR(Expect(","));
      if (SkipOp(")")) break;
      ASSIGN_OR_RETURN(std::string n, ExpectName());
      macro->params.push_back(std::move(n));
      ExprPtr def;
      if (SkipOp("=")) {
        ASSIGN_OR_RETURN(def, Expression());
      }
      macro->defaults.push_back(std::move(def));
    }
    return absl::OkStatus();
  }

 private:
  ExprPtr Make(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    return e;
  }
  struct DepthGuard {
    explicit DepthGuard(int* d) : d(d) { ++*d; }
    ~DepthGuard() { --*d; }
    int* d;
  };

  absl::StatusOr<ExprPtr> CondExpr() {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxNesting) return Error("expression nested too deeply");
    ASSIGN_OR_RETURN(ExprPtr expr, Or());
    while (SkipName("if")) {
      auto cond = Make(Expr::Kind::kCond);
      ASSIGN_OR_RETURN(ExprPtr test, Or());
      ExprPtr otherwise;
      if (SkipName("else")) {
        ASSIGN_OR_RETURN(otherwise, CondExpr());
      }
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(expr));
      cond->args.push_back(std::move(otherwise));
      expr = std::move(cond);
    }
    return expr;
  }
  absl::StatusOr<ExprPtr> Or() {
    ASSIGN_OR_RETURN(ExprPtr left, And());
    while (SkipName("or")) {
      ASSIGN_OR_RETURN(ExprPtr right, And());
      auto e = Make(Expr::Kind::kOr);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }
  absl::StatusOr<ExprPtr> And() {
    ASSIGN_OR_RETURN(ExprPtr left, Not());
    while (SkipName("and")) {
      ASSIGN_OR_RETURN(ExprPtr right, Not());
      auto e = Make(Expr::Kind::kAnd);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }
  absl::StatusOr<ExprPtr> Not() {
    if (SkipName("not")) {
      DepthGuard guard(&depth_);
      if (depth_ > kMaxNesting) return Error("expression nested too deeply");
      ASSIGN_OR_RETURN(ExprPtr x, Not());
      auto e = Make(Expr::Kind::kUnary);
      e->name = "not";
      e->args.push_back(std::move(x));
      return e;
    }
    return Compare();
  }
  absl::StatusOr<ExprPtr> Compare() {
    ASSIGN_OR_RETURN(ExprPtr left, Math1());
    while (true) {
      std::string op;
      if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp("<=") || IsOp(">") || IsOp(">=")) {
        op = t_[p_++].text;
      } else if (SkipName("in")) {
        op = "in";
      } else if (IsName("not") && t_[p_ + 1].kind == Token::Kind::kName && t_[p_ + 1].text == "in") {
        p_ += 2;
        op = "not in";
      } else {
        return left;
      }
      ASSIGN_OR_RETURN(ExprPtr right, Math1());
      left = Binary(op, std::move(left), std::move(right));
    }
  }
  ExprPtr Binary(const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = Make(Expr::Kind::kBinary);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }
  absl::StatusOr<ExprPtr> Math1() {
    ASSIGN_OR_RETURN(ExprPtr left, Concat());
    while (IsOp("+") || IsOp("-")) {
      const std::string op = t_[p_++].text;
      ASSIGN_OR_RETURN(ExprPtr right, Concat());
      left = Binary(op, std::move(left), std::move(right));
    }
    return left;
  }
  absl::StatusOr<ExprPtr> Concat() {
    ASSIGN_OR_RETURN(ExprPtr left, Math2());
    while (SkipOp("~")) {
      ASSIGN_OR_RETURN(ExprPtr right, Math2());
      left = Binary("~", std::move(left), std::move(right));
    }
    return left;
  }
  absl::StatusOr<ExprPtr> Math2() {
    ASSIGN_OR_RETURN(ExprPtr left, Pow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = t_[p_++].text;
      ASSIGN_OR_RETURN(ExprPtr right, Pow());
      left = Binary(op, std::move(left), std::move(right));
    }
    return left;
  }
  absl::StatusOr<ExprPtr> Pow() {
    ASSIGN_OR_RETURN(ExprPtr left, Unary(true));
    while (SkipOp("**")) {
      ASSIGN_OR_RETURN(ExprPtr right, Unary(true));
      left = Binary("**", std::move(left), std::move(right));
    }
    return left;
  }
  absl::StatusOr<ExprPtr> Unary(bool with_filter) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxNesting) return Error("expression nested too deeply");
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const std::string op = t_[p_++].text;
      ASSIGN_OR_RETURN(ExprPtr x, Unary(false));
      node = Make(Expr::Kind::kUnary);
      node->name = op;
      node->args.push_back(std::move(x));
    } else {
      ASSIGN_OR_RETURN(node, Primary());
    }
    ASSIGN_OR_RETURN(node, Postfix(std::move(node)));
    if (with_filter) {
      while (true) {
        if (SkipOp("|")) {
          ASSIGN_OR_RETURN(node, Filter(std::move(node)));
        } else if (SkipName("is")) {
          ASSIGN_OR_RETURN(node, Test(std::move(node)));
        } else if (IsOp("(")) {
          ASSIGN_OR_RETURN(node, Call(std::move(node)));
        } else {
          break;
        }
      }
    }
    return node;
  }
  absl::StatusOr<ExprPtr> Primary() {
    const Token& t = t_[p_];
    switch (t.kind) {
      case Token::Kind::kName: {
        ++p_;
        auto e = Make(Expr::Kind::kLiteral);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case Token::Kind::kString: {
        ++p_;
        auto e = Make(Expr::Kind::kLiteral);
        e->literal = Value::String(t.text);
        return e;
      }
      case Token::Kind::kInt: {
        ++p_;
        auto e = Make(Expr::Kind::kLiteral);
        e->literal = Value::Int(t.int_value);
        return e;
      }
      case Token::Kind::kFloat: {
        ++p_;
        auto e = Make(Expr::Kind::kLiteral);
        e->literal = Value::Float(t.float_value);
        return e;
      }
      case Token::Kind::kOp:
        if (SkipOp("(")) {
          if (SkipOp(")")) return Make(Expr::Kind::kTuple);
          ASSIGN_OR_RETURN(ExprPtr first, Expression());
          if (SkipOp(")")) return first;  // parenthesized
          auto tuple = Make(Expr::Kind::kTuple);
          tuple->args.push_back(std::move(first));
          while (SkipOp(",")) {
            if (IsOp(")")) break;
            ASSIGN_OR_RETURN(ExprPtr e, Expression());
            tuple->args.push_back(std::move(e));
          }
          RETURN_IF_ERROR(Expect(")"));
          return tuple;
        }
        if (SkipOp("[")) {
          auto list = Make(Expr::Kind::kList);
          while (!SkipOp("]")) {
            if (!list->args.empty()) RETURN_IF_ERROR(Expect(","));
            if (SkipOp("]")) break;
            ASSIGN_OR_RETURN(ExprPtr e, Expression());
            list->args.push_back(std::move(e));
          }
          return list;
        }
        if (SkipOp("{")) {
          auto dict = Make(Expr::Kind::kDict);
          while (!SkipOp("}")) {
            if (!dict->args.empty()) RETURN_IF_ERROR(Expect(","));
            if (SkipOp("}")) break;
            ASSIGN_OR_RETURN(ExprPtr k, Expression());
            RETURN_IF_ERROR(Expect(":"));
            ASSIGN_OR_RETURN(ExprPtr v, Expression());
            dict->args.push_back(std::move(k));
            dict->args.push_back(std::move(v));
          }
          return dict;
        }
        break;
      default:
        break;
    }
    return Error("expected an expression");
  }
  absl::StatusOr<ExprPtr> Postfix(ExprPtr node) {
    while (true) {
      if (SkipOp(".")) {
        auto e = Make(Expr::Kind::kAttr);
        if (t_[p_].kind == Token::Kind::kInt) {  // foo.0 is foo[0]
          e->kind = Expr::Kind::kItem;
          auto idx = Make(Expr::Kind::kLiteral);
          idx->literal = Value::Int(t_[p_++].int_value);
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(idx));
        } else {
          ASSIGN_OR_RETURN(e->name, ExpectName());
          e->args.push_back(std::move(node));
        }
        node = std::move(e);
      } else if (SkipOp("[")) {
        ExprPtr parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            ASSIGN_OR_RETURN(parts[k], Expression());
          }
          if (k < 2 && SkipOp(":")) {
            is_slice = true;
          } else {
            break;
          }
        }
        RETURN_IF_ERROR(Expect("]"));
        if (is_slice) {
          auto e = Make(Expr::Kind::kSlice);
          e->args.push_back(std::move(node));
          for (auto& part : parts) e->args.push_back(std::move(part));
          node = std::move(e);
        } else {
          if (parts[0] == nullptr) return Error("expected a subscript");
          auto e = Make(Expr::Kind::kItem);
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(parts[0]));
          node = std::move(e);
        }
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, Call(std::move(node)));
      } else {
        return node;
      }
    }
  }
  // "(a, b, k=v)" appended to `e`'s args (after whatever it holds).
  absl::Status CallArgs(Expr* e) {
    RETURN_IF_ERROR(Expect("("));
    bool first = true;
    while (!SkipOp(")")) {
      if (!first) RETURN_IF_ERROR(Expect(","));
      first = false;
      if (SkipOp(")")) break;
      if (t_[p_].kind == Token::Kind::kName && t_[p_ + 1].kind == Token::Kind::kOp &&
          t_[p_ + 1].text == "=") {
        e->kwnames.push_back(t_[p_].text);
        p_ += 2;
        ASSIGN_OR_RETURN(ExprPtr v, Expression());
        e->args.push_back(std::move(v));
      } else {
        if (!e->kwnames.empty()) return Error("a positional argument after a keyword argument");
        if (IsOp("*")) return Error("*args and **kwargs are not supported");
        ASSIGN_OR_RETURN(ExprPtr v, Expression());
        e->args.push_back(std::move(v));
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<ExprPtr> Call(ExprPtr callee) {
    auto e = Make(Expr::Kind::kCall);
    e->args.push_back(std::move(callee));
    RETURN_IF_ERROR(CallArgs(e.get()));
    return e;
  }
  absl::StatusOr<ExprPtr> Filter(ExprPtr operand) {
    auto e = Make(Expr::Kind::kFilter);
    ASSIGN_OR_RETURN(e->name, ExpectName());
    while (SkipOp(".")) {  // dotted filter names: jinja joins them
      ASSIGN_OR_RETURN(std::string part, ExpectName());
      absl::StrAppend(&e->name, ".", part);
    }
    if (!IsKnownFilter(e->name)) {
      return SyntaxError(line_, absl::StrCat("unknown filter '", e->name, "'"));
    }
    e->args.push_back(std::move(operand));
    if (IsOp("(")) RETURN_IF_ERROR(CallArgs(e.get()));
    return e;
  }
  absl::StatusOr<ExprPtr> Test(ExprPtr operand) {
    auto e = Make(Expr::Kind::kTest);
    e->negated = SkipName("not");
    if (t_[p_].kind == Token::Kind::kName) {
      e->name = t_[p_++].text;
    } else if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp("<=") || IsOp(">") || IsOp(">=")) {
      e->name = t_[p_++].text;
    } else {
      return Error("expected a test name after 'is'");
    }
    if (!IsKnownTest(e->name)) return SyntaxError(line_, absl::StrCat("unknown test '", e->name, "'"));
    e->args.push_back(std::move(operand));
    if (IsOp("(")) {
      RETURN_IF_ERROR(CallArgs(e.get()));
    } else {
      // One bare argument: `is divisibleby 3`, `is sameas none`.
      const Token& t = t_[p_];
      const bool starts_arg =
          t.kind == Token::Kind::kString || t.kind == Token::Kind::kInt ||
          t.kind == Token::Kind::kFloat || (t.kind == Token::Kind::kOp && (t.text == "[" || t.text == "{")) ||
          (t.kind == Token::Kind::kName && t.text != "else" && t.text != "or" && t.text != "and" &&
           t.text != "if" && t.text != "not" && t.text != "in" && t.text != "is");
      if (starts_arg) {
        ASSIGN_OR_RETURN(ExprPtr arg, Primary());
        ASSIGN_OR_RETURN(arg, Postfix(std::move(arg)));
        e->args.push_back(std::move(arg));
      }
    }
    return e;
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;
};

// ---- Statement parser ----

class Parser {
 public:
  Parser(std::vector<Segment> segments) : s_(std::move(segments)) {}

  absl::StatusOr<Body> Parse() {
    Body body;
    std::string end;
    RETURN_IF_ERROR(ParseBody({}, &body, &end, nullptr));
    return body;
  }

 private:
  // Parses statements until a block tag whose first word is in `ends`
  // (returned in *end, its parser in *tail for the rest of the tag).
  absl::Status ParseBody(const std::set<std::string>& ends, Body* body, std::string* end,
                         std::unique_ptr<ExprParser>* tail) {
    if (++depth_ > kMaxNesting) return SyntaxError(Line(), "blocks nested too deeply");
    while (i_ < s_.size()) {
      const Segment& seg = s_[i_++];
      if (seg.is_text) {
        Stmt st;
        st.kind = Stmt::Kind::kText;
        st.line = seg.line;
        st.text = seg.text;
        body->push_back(std::move(st));
        continue;
      }
      ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(seg.text, seg.line));
      auto p = std::make_unique<ExprParser>(std::move(tokens), seg.line);
      if (seg.tag == TagKind::kVariable) {
        Stmt st;
        st.kind = Stmt::Kind::kOutput;
        st.line = seg.line;
        ASSIGN_OR_RETURN(st.expr, p->Expression());
        RETURN_IF_ERROR(p->ExpectEnd());
        body->push_back(std::move(st));
        continue;
      }
      ASSIGN_OR_RETURN(std::string word, p->ExpectName());
      if (ends.count(word) > 0) {
        *end = word;
        if (tail != nullptr) *tail = std::move(p);
        --depth_;
        return absl::OkStatus();
      }
      Stmt st;
      st.line = seg.line;
      RETURN_IF_ERROR(Statement(word, p.get(), &st));
      body->push_back(std::move(st));
    }
    if (!ends.empty()) {
      return SyntaxError(Line(), absl::StrCat("the template ends inside a block: expected {% ",
                                              *ends.rbegin(), " %}"));
    }
    --depth_;
    return absl::OkStatus();
  }

  int Line() const { return i_ > 0 ? s_[i_ - 1].line : 1; }

  absl::Status Statement(const std::string& word, ExprParser* p, Stmt* st) {
    std::string end;
    std::unique_ptr<ExprParser> tail;
    if (word == "if") {
      st->kind = Stmt::Kind::kIf;
      ASSIGN_OR_RETURN(ExprPtr cond, p->Expression());
      RETURN_IF_ERROR(p->ExpectEnd());
      st->conds.push_back(std::move(cond));
      while (true) {
        Body b;
        RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &b, &end, &tail));
        st->bodies.push_back(std::move(b));
        if (end == "elif") {
          ASSIGN_OR_RETURN(ExprPtr c, tail->Expression());
          RETURN_IF_ERROR(tail->ExpectEnd());
          st->conds.push_back(std::move(c));
        } else if (end == "else") {
          RETURN_IF_ERROR(tail->ExpectEnd());
          Body e;
          RETURN_IF_ERROR(ParseBody({"endif"}, &e, &end, &tail));
          RETURN_IF_ERROR(tail->ExpectEnd());
          st->bodies.push_back(std::move(e));
          return absl::OkStatus();
        } else {
          return tail->ExpectEnd();
        }
      }
    }
    if (word == "for") {
      st->kind = Stmt::Kind::kFor;
      ASSIGN_OR_RETURN(st->targets, p->Targets());
      if (!p->SkipName("in")) return p->Error("expected 'in'");
      // The iterable stops before a filtering `if` (jinja parses it without condexpr).
      ASSIGN_OR_RETURN(st->expr, ForIterable(p));
      if (p->SkipName("if")) {
        ASSIGN_OR_RETURN(st->cond, p->Expression());
      }
      if (p->SkipName("recursive")) return p->Error("recursive loops are not supported");
      RETURN_IF_ERROR(p->ExpectEnd());
      RETURN_IF_ERROR(ParseBody({"else", "endfor"}, &st->body, &end, &tail));
      RETURN_IF_ERROR(tail->ExpectEnd());
      if (end == "else") {
        RETURN_IF_ERROR(ParseBody({"endfor"}, &st->else_body, &end, &tail));
        RETURN_IF_ERROR(tail->ExpectEnd());
      }
      return absl::OkStatus();
    }
    if (word == "set") {
      ASSIGN_OR_RETURN(std::string first, p->ExpectName());
      st->targets.push_back(first);
      if (p->SkipOp(".")) {
        ASSIGN_OR_RETURN(st->attr, p->ExpectName());
      } else {
        while (p->SkipOp(",")) {
          ASSIGN_OR_RETURN(std::string n, p->ExpectName());
          st->targets.push_back(std::move(n));
        }
      }
      if (p->SkipOp("=")) {
        st->kind = Stmt::Kind::kSet;
        ASSIGN_OR_RETURN(st->expr, p->TupleOrExpression());
        return p->ExpectEnd();
      }
      if (!st->attr.empty() || st->targets.size() != 1) return p->Error("expected '='");
      st->kind = Stmt::Kind::kSetBlock;
      if (p->SkipOp("|")) {
        ASSIGN_OR_RETURN(st->filter, p->FilterChain());
      }
      RETURN_IF_ERROR(p->ExpectEnd());
      RETURN_IF_ERROR(ParseBody({"endset"}, &st->body, &end, &tail));
      return tail->ExpectEnd();
    }
    if (word == "macro") {
      st->kind = Stmt::Kind::kMacro;
      ASSIGN_OR_RETURN(st->name, p->ExpectName());
      RETURN_IF_ERROR(p->Params(st));
      RETURN_IF_ERROR(p->ExpectEnd());
      RETURN_IF_ERROR(ParseBody({"endmacro"}, &st->body, &end, &tail));
      tail->SkipName(st->name);
      return tail->ExpectEnd();
    }
    if (word == "filter") {
      st->kind = Stmt::Kind::kFilterBlock;
      ASSIGN_OR_RETURN(st->filter, p->FilterChain());
      RETURN_IF_ERROR(p->ExpectEnd());
      RETURN_IF_ERROR(ParseBody({"endfilter"}, &st->body, &end, &tail));
      return tail->ExpectEnd();
    }
    if (word == "generation") {
      st->kind = Stmt::Kind::kBlock;
      RETURN_IF_ERROR(p->ExpectEnd());
      RETURN_IF_ERROR(ParseBody({"endgeneration"}, &st->body, &end, &tail));
      return tail->ExpectEnd();
    }
    if (word == "break" || word == "continue") {
      st->kind = word == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      return p->ExpectEnd();
    }
    return SyntaxError(st->line, absl::StrCat("unsupported tag '", word, "'"));
  }

  // The iterable of a for: jinja2 parses it without conditional
  // expressions, so a trailing `if` filters the loop.
  absl::StatusOr<ExprPtr> ForIterable(ExprParser* p) { return p->OrTuple(); }

  std::vector<Segment> s_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(absl::string_view source, const TemplateOptions& options) {
  ASSIGN_OR_RETURN(std::vector<Segment> segments, Lex(source, options));
  return Parser(std::move(segments)).Parse();
}

}  // namespace tandem::jinja
