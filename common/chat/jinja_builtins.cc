// The filters, tests, globals and methods of jinja2 (and Python's str, dict
// and list) that chat templates use, with their Python behaviour.
//
// Filters: abs attr capitalize count d default dictsort e escape first float
//   forceescape format indent int items join last length list lower map max
//   min reject rejectattr replace reverse round safe select selectattr sort
//   string sum title tojson trim unique upper wordcount
// Tests: boolean callable defined divisibleby eq equalto escaped even false
//   float ge greaterthan gt in integer iterable le lessthan lower lt mapping
//   ne none number odd sameas sequence string true undefined upper == != < <= > >=
// Globals: range namespace dict raise_exception strftime_now
// Methods: str: strip lstrip rstrip split rsplit splitlines startswith
//   endswith upper lower title capitalize replace find rfind count join
//   isspace isdigit isalpha isalnum islower isupper; dict: items keys values
//   get; list: index count.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/chat/jinja_ast.h"

namespace tandem::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE
constexpr size_t kMaxStringBytes = 16 << 20;

const std::set<std::string>& Filters() {
  static const auto* names = new std::set<std::string>{
      "abs",    "attr",    "capitalize", "count",      "d",        "default", "dictsort",
      "e",      "escape",  "first",      "float",      "forceescape", "format", "indent",
      "int",    "items",   "join",       "last",       "length",   "list",    "lower",
      "map",    "max",     "min",        "reject",     "rejectattr", "replace", "reverse",
      "round",  "safe",    "select",     "selectattr", "sort",     "string",  "sum",
      "title",  "tojson",  "trim",       "unique",     "upper",    "wordcount"};
  return *names;
}

const std::set<std::string>& Tests() {
  static const auto* names = new std::set<std::string>{
      "boolean", "callable", "defined",  "divisibleby", "eq",     "equalto", "escaped",
      "even",    "false",    "float",    "ge",          "greaterthan", "gt",  "in",
      "integer", "iterable", "le",       "lessthan",    "lower",  "lt",      "mapping",
      "ne",      "none",     "number",   "odd",         "sameas", "sequence", "string",
      "true",    "undefined", "upper",   "==",          "!=",     "<",       "<=",
      ">",       ">="};
  return *names;
}

absl::Status Unsupported(absl::string_view what) { return absl::UnimplementedError(what); }

// Reads a builtin's arguments as Python binds them: position or keyword.
class Args {
 public:
  Args(std::string fn, CallArgs& a) : fn_(std::move(fn)), a_(a) {}
  // The argument at `index` or named `name`; undefined when absent.
  Value Get(size_t index, const char* name) {
    max_index_ = std::max(max_index_, index + 1);
    names_.insert(name);
    if (index < a_.positional.size()) return a_.positional[index];
    for (const auto& [k, v] : a_.keyword) {
      if (k == name) return v;
    }
    return Value();
  }
  // The positional arguments from `index` on (a test's or filter's own).
  std::vector<Value> Rest(size_t index) {
    max_index_ = std::max<size_t>(max_index_, a_.positional.size());
    if (index >= a_.positional.size()) return {};
    return std::vector<Value>(a_.positional.begin() + index, a_.positional.end());
  }
  absl::Status Done() const {
    if (a_.positional.size() > max_index_) {
      return TypeError(absl::StrCat(fn_, "() takes at most ", max_index_, " argument(s), got ",
                                    a_.positional.size()));
    }
    for (const auto& [k, v] : a_.keyword) {
      if (names_.count(k) == 0) {
        return TypeError(absl::StrCat(fn_, "() got an unexpected keyword argument '", k, "'"));
      }
    }
    return absl::OkStatus();
  }

 private:
  std::string fn_;
  CallArgs& a_;
  size_t max_index_ = 0;
  std::set<std::string> names_;
};

absl::StatusOr<int64_t> ToInt(const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  return TypeError(absl::StrCat(what, " must be an integer, got ", v.TypeName()));
}

// Python's int(float): truncation toward zero. Python's ints are unbounded
// and these are 64-bit, so a float beyond them is an error naming it (a cast
// would be undefined behaviour), as NaN and infinity are in Python too.
absl::StatusOr<int64_t> FloatToInt(double d, absl::string_view what) {
  if (std::isnan(d)) return TypeError(absl::StrCat(what, ": cannot convert float NaN to integer"));
  if (std::isinf(d)) {
    return TypeError(absl::StrCat(what, ": cannot convert float infinity to integer"));
  }
  const double t = std::trunc(d);
  if (t < -9223372036854775808.0 || t >= 9223372036854775808.0) {
    return IntegerOverflow(absl::StrCat(what, "(", FormatPythonFloat(d), ")"));
  }
  return static_cast<int64_t>(t);
}

// Python's int(s, base) for a stripped str: the value, or nullopt where
// Python raises ValueError (a base outside 0 and 2-36 included). Digits may
// be separated by single underscores, and one may follow a 0x/0o/0b prefix;
// base 0 takes the base from the prefix and refuses a decimal's leading
// zeros. A value beyond 64 bits sets *overflow (Python's int is unbounded).
// Written here: strtoll knows no underscores and reads 0x without being asked.
std::optional<int64_t> ParsePyInt(absl::string_view s, int64_t base, bool* overflow) {
  *overflow = false;
  if (base != 0 && (base < 2 || base > 36)) return std::nullopt;
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  bool after_prefix = false;
  if (s.size() >= 2 && s[0] == '0') {
    const char p = absl::ascii_tolower(s[1]);
    const int64_t prefix_base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefix_base != 0 && (base == 0 || base == prefix_base)) {
      base = prefix_base;
      s.remove_prefix(2);
      after_prefix = true;
    }
  }
  const bool decimal_of_base0 = base == 0;
  if (base == 0) base = 10;
  uint64_t value = 0;
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  bool digit_before = after_prefix, any = false, over = false;
  for (char c : s) {
    if (c == '_') {
      if (!digit_before) return std::nullopt;
      digit_before = false;
      continue;
    }
    const int64_t d = absl::ascii_isdigit(c)   ? c - '0'
                      : absl::ascii_isalpha(c) ? absl::ascii_tolower(c) - 'a' + 10
                                               : 99;
    if (d >= base) return std::nullopt;
    if (!over && (__builtin_mul_overflow(value, static_cast<uint64_t>(base), &value) ||
                  __builtin_add_overflow(value, static_cast<uint64_t>(d), &value) || value > limit)) {
      over = true;
    }
    digit_before = any = true;
  }
  if (!any || !digit_before) return std::nullopt;  // no digits, or a trailing underscore
  if (decimal_of_base0 && (over || value != 0) && s[0] == '0') return std::nullopt;  // "010"
  if (over) {
    *overflow = true;
    return std::nullopt;
  }
  // -2^63 has no positive int64: negated as unsigned, then converted.
  return negative ? static_cast<int64_t>(~value + 1) : static_cast<int64_t>(value);
}

// Python's float(s) for a stripped str, or nullopt where it raises
// ValueError: decimal digits (single underscores between them), a point, an
// exponent, or inf / infinity / nan in any case, after an optional sign. Not
// strtod alone: it also reads hexadecimal floats and "nan(...)".
std::optional<double> ParsePyFloat(absl::string_view s) {
  absl::string_view body = s;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.remove_prefix(1);
  const bool negative = !s.empty() && s[0] == '-';
  if (absl::EqualsIgnoreCase(body, "inf") || absl::EqualsIgnoreCase(body, "infinity")) {
    return negative ? -HUGE_VAL : HUGE_VAL;
  }
  if (absl::EqualsIgnoreCase(body, "nan")) return std::nan("");
  std::string clean(s.substr(0, s.size() - body.size()));
  size_t i = 0;
  // Digits with single underscores between them, appended to clean; the count.
  auto digits = [&]() {
    size_t n = 0;
    while (i < body.size()) {
      if (absl::ascii_isdigit(body[i])) {
        clean.push_back(body[i++]);
        ++n;
      } else if (body[i] == '_' && n > 0 && i + 1 < body.size() && absl::ascii_isdigit(body[i + 1])) {
        ++i;
      } else {
        break;
      }
    }
    return n;
  };
  size_t mantissa = digits();
  if (i < body.size() && body[i] == '.') {
    clean.push_back(body[i++]);
    mantissa += digits();
  }
  if (mantissa == 0) return std::nullopt;
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    clean.push_back(body[i++]);
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) clean.push_back(body[i++]);
    if (digits() == 0) return std::nullopt;
  }
  if (i != body.size()) return std::nullopt;
  return std::strtod(clean.c_str(), nullptr);
}

absl::StatusOr<std::string> ToStr(const Value& v, const char* what) {
  if (v.is_string()) return v.as_string();
  return TypeError(absl::StrCat(what, " must be a string, got ", v.TypeName()));
}

bool IsPySpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
         (c >= 0x1c && c <= 0x1f);
}

std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto drop = [&](char c) {
    return chars.is_string() ? chars.as_string().find(c) != std::string::npos : IsPySpace(c);
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && drop(s[b])) ++b;
  }
  if (right) {
    while (e > b && drop(s[e - 1])) --e;
  }
  return s.substr(b, e - b);
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string Capitalize(const std::string& s) {
  std::string out = Lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}
// Python's str.title: a letter after a non-letter is upper-cased, others lowered.
std::string PyTitle(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
    if (alpha) {
      c = static_cast<char>(prev_cased ? std::tolower(static_cast<unsigned char>(c))
                                       : std::toupper(static_cast<unsigned char>(c)));
    }
    prev_cased = alpha;
  }
  return out;
}
// jinja2's title filter: words split at runs of [-\s({[<], each capitalized.
std::string JinjaTitle(const std::string& s) {
  auto is_sep = [](char c) {
    return IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    const bool sep = is_sep(s[i]);
    while (j < s.size() && is_sep(s[j]) == sep) ++j;
    std::string item = s.substr(i, j - i);
    out += sep ? item : Capitalize(item);
    i = j;
  }
  return out;
}

std::vector<std::string> PySplit(const std::string& s, const Value& sep, int64_t maxsplit,
                                 bool from_right) {
  std::vector<std::string> parts;
  if (!sep.is_string()) {
    // Runs of whitespace; no empty parts.
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && IsPySpace(s[i])) ++i;
      if (i == s.size()) break;
      size_t j = i;
      while (j < s.size() && !IsPySpace(s[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
      for (auto [b, e] : words) parts.push_back(s.substr(b, e - b));
      return parts;
    }
    if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
      parts.push_back(Strip(s.substr(words[maxsplit].first), Value(), false, true));
    } else {
      const size_t keep = words.size() - static_cast<size_t>(maxsplit);
      parts.push_back(Strip(s.substr(0, words[keep - 1].second), Value(), true, false));
      for (size_t k = keep; k < words.size(); ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
    return parts;
  }
  const std::string& d = sep.as_string();
  if (!from_right) {
    size_t start = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      const size_t at = s.find(d, start);
      if (at == std::string::npos) break;
      parts.push_back(s.substr(start, at - start));
      start = at + d.size();
      ++n;
    }
    parts.push_back(s.substr(start));
    return parts;
  }
  size_t end = s.size();
  int64_t n = 0;
  std::vector<std::string> rev;
  while (maxsplit < 0 || n < maxsplit) {
    if (end < d.size()) break;
    const size_t at = s.rfind(d, end - d.size());
    if (at == std::string::npos) break;
    rev.push_back(s.substr(at + d.size(), end - at - d.size()));
    end = at;
    ++n;
  }
  rev.push_back(s.substr(0, end));
  return std::vector<std::string>(rev.rbegin(), rev.rend());
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character
    const std::vector<std::string> cps = SplitCodePoints(s);
    int64_t n = 0;
    for (const std::string& cp : cps) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += cp;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

int64_t Length(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(SplitCodePoints(v.as_string()).size());
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.dict().items.size());
  return 0;
}

Value Bind(std::function<absl::StatusOr<Value>(Args&)> body, std::string name) {
  return Value::Callable([body = std::move(body), name = std::move(name)](CallArgs& a) -> absl::StatusOr<Value> {
    Args args(name, a);
    ASSIGN_OR_RETURN(Value v, body(args));
    RETURN_IF_ERROR(args.Done());
    return v;
  });
}

// str methods, bound to `s`.
std::optional<Value> StringMethod(const std::string& s, const std::string& name) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return Bind([s, left, right](Args& a) -> absl::StatusOr<Value> {
      return Value::String(Strip(s, a.Get(0, "chars"), left, right));
    }, name);
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return Bind([s, right](Args& a) -> absl::StatusOr<Value> {
      const Value sep = a.Get(0, "sep");
      const Value max = a.Get(1, "maxsplit");
      int64_t maxsplit = -1;
      if (!max.is_undefined()) {
        ASSIGN_OR_RETURN(maxsplit, ToInt(max, "maxsplit"));
      }
      if (sep.is_string() && sep.as_string().empty()) return TypeError("split(): empty separator");
      if (!sep.is_undefined() && !sep.is_none() && !sep.is_string()) {
        return TypeError(absl::StrCat("split(): sep must be a string or None, got ", sep.TypeName()));
      }
      ValueList out;
      for (std::string& p : PySplit(s, sep, maxsplit, right)) out.push_back(Value::String(std::move(p)));
      return Value::List(std::move(out));
    }, name);
  }
  if (name == "splitlines") {
    return Bind([s](Args& a) -> absl::StatusOr<Value> {
      const bool keep = a.Get(0, "keepends").Truthy();
      ValueList out;
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          size_t end = i;
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          out.push_back(Value::String(s.substr(start, (keep ? i + 1 : end) - start)));
          start = i + 1;
        }
      }
      if (start < s.size()) out.push_back(Value::String(s.substr(start)));
      return Value::List(std::move(out));
    }, name);
  }
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return Bind([s, starts](Args& a) -> absl::StatusOr<Value> {
      const Value what = a.Get(0, "prefix");
      std::vector<std::string> options;
      if (what.is_string()) {
        options.push_back(what.as_string());
      } else if (what.is_list()) {
        for (const Value& v : what.list()) {
          ASSIGN_OR_RETURN(std::string o, ToStr(v, "startswith()/endswith() items"));
          options.push_back(std::move(o));
        }
      } else {
        return TypeError(absl::StrCat(starts ? "startswith" : "endswith",
                                      "() takes a string or a tuple of strings, got ", what.TypeName()));
      }
      for (const std::string& o : options) {
        if (o.size() <= s.size() &&
            (starts ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0)) {
          return Value::Bool(true);
        }
      }
      return Value::Bool(false);
    }, name);
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return Bind([s, name](Args&) -> absl::StatusOr<Value> {
      if (name == "upper") return Value::String(Upper(s));
      if (name == "lower") return Value::String(Lower(s));
      if (name == "title") return Value::String(PyTitle(s));
      return Value::String(Capitalize(s));
    }, name);
  }
  if (name == "replace") {
    return Bind([s](Args& a) -> absl::StatusOr<Value> {
      ASSIGN_OR_RETURN(std::string from, ToStr(a.Get(0, "old"), "replace() old"));
      ASSIGN_OR_RETURN(std::string to, ToStr(a.Get(1, "new"), "replace() new"));
      const Value c = a.Get(2, "count");
      int64_t count = -1;
      if (!c.is_undefined()) {
        ASSIGN_OR_RETURN(count, ToInt(c, "replace() count"));
      }
      std::string out = Replace(s, from, to, count);
      if (out.size() > kMaxStringBytes) return TypeError("replace(): the result is too long");
      return Value::String(std::move(out));
    }, name);
  }
  if (name == "find" || name == "rfind" || name == "count") {
    return Bind([s, name](Args& a) -> absl::StatusOr<Value> {
      ASSIGN_OR_RETURN(std::string sub, ToStr(a.Get(0, "sub"), (name + "()").c_str()));
      // Positions are code points, as in Python.
      auto cp_index = [&](size_t byte) {
        return static_cast<int64_t>(SplitCodePoints(s.substr(0, byte)).size());
      };
      if (name == "find") {
        const size_t at = s.find(sub);
        return Value::Int(at == std::string::npos ? -1 : cp_index(at));
      }
      if (name == "rfind") {
        const size_t at = s.rfind(sub);
        return Value::Int(at == std::string::npos ? -1 : cp_index(at));
      }
      if (sub.empty()) return Value::Int(static_cast<int64_t>(SplitCodePoints(s).size()) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value::Int(n);
    }, name);
  }
  if (name == "join") {
    return Bind([s](Args& a) -> absl::StatusOr<Value> {
      ASSIGN_OR_RETURN(ValueList items, Iterate(a.Get(0, "iterable")));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string()) {
          return TypeError(absl::StrCat("join(): sequence item ", i, ": expected str instance, ",
                                        items[i].TypeName(), " found"));
        }
        if (i > 0) out += s;
        out += items[i].as_string();
      }
      return Value::String(std::move(out));
    }, name);
  }
  if (name == "isspace" || name == "isdigit" || name == "isalpha" || name == "isalnum" ||
      name == "islower" || name == "isupper") {
    return Bind([s, name](Args&) -> absl::StatusOr<Value> {
      if (s.empty()) return Value::Bool(false);
      bool any_cased = false, ok = true;
      for (unsigned char c : s) {
        if (name == "isspace") ok = ok && IsPySpace(static_cast<char>(c));
        if (name == "isdigit") ok = ok && std::isdigit(c);
        if (name == "isalpha") ok = ok && std::isalpha(c);
        if (name == "isalnum") ok = ok && std::isalnum(c);
        if (name == "islower") {
          ok = ok && !std::isupper(c);
          any_cased = any_cased || std::islower(c);
        }
        if (name == "isupper") {
          ok = ok && !std::islower(c);
          any_cased = any_cased || std::isupper(c);
        }
      }
      if (name == "islower" || name == "isupper") ok = ok && any_cased;
      return Value::Bool(ok);
    }, name);
  }
  if (name == "format" || name == "format_map") {
    return Value::Callable([name](CallArgs&) -> absl::StatusOr<Value> {
      return Unsupported(absl::StrCat("str.", name, "() is not supported in chat templates here"));
    });
  }
  return std::nullopt;
}

std::optional<Value> DictMethod(const Value& d, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return Bind([d, name](Args&) -> absl::StatusOr<Value> {
      ValueList out;
      for (const auto& [k, v] : d.dict().items) {
        if (name == "items") {
          out.push_back(Value::Tuple({Value::String(k), v}));
        } else {
          out.push_back(name == "keys" ? Value::String(k) : v);
        }
      }
      return Value::List(std::move(out));
    }, name);
  }
  if (name == "get") {
    return Bind([d](Args& a) -> absl::StatusOr<Value> {
      const Value key = a.Get(0, "key");
      Value def = a.Get(1, "default");
      if (key.is_string()) {
        if (const Value* v = d.dict().Find(key.as_string())) return *v;
      }
      return def.is_undefined() ? Value::None() : def;
    }, name);
  }
  if (name == "pop" || name == "update" || name == "setdefault" || name == "clear" ||
      name == "popitem") {
    return Value::Callable([name](CallArgs&) -> absl::StatusOr<Value> {
      return TypeError(absl::StrCat("access to attribute '", name,
                                    "' of 'dict' object is unsafe (the sandbox is immutable)"));
    });
  }
  return std::nullopt;
}

std::optional<Value> ListMethod(const Value& l, const std::string& name) {
  if (name == "index" || name == "count") {
    return Bind([l, name](Args& a) -> absl::StatusOr<Value> {
      const Value x = a.Get(0, "value");
      int64_t n = 0;
      for (size_t i = 0; i < l.list().size(); ++i) {
        if (l.list()[i].Equals(x)) {
          if (name == "index") return Value::Int(static_cast<int64_t>(i));
          ++n;
        }
      }
      if (name == "index") return TypeError(absl::StrCat(x.Repr(), " is not in list"));
      return Value::Int(n);
    }, name);
  }
  if (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
      name == "remove" || name == "sort" || name == "reverse" || name == "clear") {
    return Value::Callable([name](CallArgs&) -> absl::StatusOr<Value> {
      return TypeError(absl::StrCat("access to attribute '", name,
                                    "' of 'list' object is unsafe (the sandbox is immutable)"));
    });
  }
  return std::nullopt;
}

std::string ObjectName(const Value& v) {
  if (v.is_none()) return "'None'";
  return absl::StrCat("'", v.TypeName(), " object'");
}

// Attribute (or item) lookup for filters' attribute= arguments: "a.b" and "0".
absl::StatusOr<Value> AttributePath(const Value& v, const Value& path) {
  if (path.is_int()) return GetItem(v, path);
  ASSIGN_OR_RETURN(std::string p, ToStr(path, "attribute"));
  Value cur = v;
  size_t start = 0;
  while (true) {
    const size_t dot = p.find('.', start);
    const std::string part = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (cur.is_undefined()) return cur;
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) && cur.is_list()) {
      ASSIGN_OR_RETURN(cur, GetItem(cur, Value::Int(std::stoll(part))));
    } else {
      ASSIGN_OR_RETURN(cur, GetItem(cur, Value::String(part)));
    }
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Sort key comparison for sort / dictsort / min / max / unique.
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(Lower(v.as_string()));
  return v;
}

absl::Status SortValues(ValueList* items, bool reverse, bool case_sensitive, const Value& attribute) {
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& v : *items) {
    Value key = v;
    if (!attribute.is_undefined() && !attribute.is_none()) {
      ASSIGN_OR_RETURN(key, AttributePath(v, attribute));
    }
    keyed.emplace_back(SortKey(key, case_sensitive), std::move(v));
  }
  absl::Status status;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    absl::StatusOr<bool> lt = reverse ? b.first.Less(a.first) : a.first.Less(b.first);
    if (!lt.ok()) {
      status = lt.status();
      return false;
    }
    return *lt;
  });
  RETURN_IF_ERROR(status);
  items->clear();
  for (auto& kv : keyed) items->push_back(std::move(kv.second));
  return absl::OkStatus();
}

// What map, select, reject, selectattr and rejectattr visit: nothing for a
// falsy operand (jinja2 guards them with `if value:`, so `none | selectattr(...)`
// is empty, as Llama 3.1 fine-tunes' templates rely on), else Iterate's items.
absl::StatusOr<ValueList> IterateIfTruthy(const Value& operand) {
  if (!operand.Truthy()) return ValueList{};
  return Iterate(operand);
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> SelectOrReject(const Value& operand, Args& a, bool select, bool by_attr) {
  ASSIGN_OR_RETURN(ValueList items, IterateIfTruthy(operand));
  Value attribute;
  size_t next = 0;
  if (by_attr) attribute = a.Get(next++, "attr");
  const Value test = a.Get(next++, "test");
  std::vector<Value> test_args = a.Rest(next);
  ValueList out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attr) {
      ASSIGN_OR_RETURN(subject, AttributePath(item, attribute));
    }
    bool ok;
    if (test.is_undefined()) {
      ok = subject.Truthy();
    } else {
      ASSIGN_OR_RETURN(std::string name, ToStr(test, "the test name"));
      if (!IsKnownTest(name)) return TypeError(absl::StrCat("no test named '", name, "'"));
      CallArgs targs;
      targs.positional = test_args;
      ASSIGN_OR_RETURN(ok, ApplyTest(name, subject, targs));
    }
    if (ok == select) out.push_back(item);
  }
  return Value::List(std::move(out));
}

std::string PercentFormat(const std::string& fmt, const ValueList& args, absl::Status* status) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i == fmt.size()) {
      *status = TypeError("format: incomplete format");
      return out;
    }
    const char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) {
      *status = TypeError("format: not enough arguments for format string");
      return out;
    }
    const Value& v = args[next++];
    if (c == 's') {
      out += v.Str();
    } else if (c == 'r') {
      out += v.Repr();
    } else if ((c == 'd' || c == 'i') && v.is_number()) {
      absl::StatusOr<int64_t> i = v.is_float() ? FloatToInt(v.as_double(), "format: %d") : v.as_int();
      if (!i.ok()) {
        *status = i.status();
        return out;
      }
      out += std::to_string(*i);
    } else {
      *status = Unsupported(absl::StrCat("format: the conversion %", std::string(1, c), " is not supported"));
      return out;
    }
  }
  if (next < args.size()) *status = TypeError("format: not all arguments converted during string formatting");
  return out;
}

}  // namespace

bool IsKnownFilter(const std::string& name) { return Filters().count(name) > 0; }
bool IsKnownTest(const std::string& name) { return Tests().count(name) > 0; }

absl::Status TypeError(absl::string_view what) { return absl::InvalidArgumentError(what); }

absl::Status IntegerOverflow(absl::string_view what) {
  return absl::UnimplementedError(
      absl::StrCat(what, ": the result is beyond the 64-bit integers of this interpreter"));
}

absl::Status UndefinedError(const Value& undefined) {
  return absl::InvalidArgumentError(
      undefined.undefined_hint().empty() ? "a value is undefined" : undefined.undefined_hint());
}

absl::StatusOr<ValueList> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return ValueList{};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      if (v.dict().is_namespace) break;
      ValueList keys;
      for (const auto& kv : v.dict().items) keys.push_back(Value::String(kv.first));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      for (std::string& cp : SplitCodePoints(v.as_string())) chars.push_back(Value::String(std::move(cp)));
      return chars;
    }
    default:
      break;
  }
  return TypeError(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
}

absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return UndefinedError(obj);
  std::optional<Value> method;
  if (obj.is_dict() && !obj.dict().is_namespace) method = DictMethod(obj, name);
  if (obj.is_string()) method = StringMethod(obj.as_string(), name);
  if (obj.is_list()) method = ListMethod(obj, name);
  if (method.has_value()) return *method;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().Find(name)) return *v;
  }
  return Value::Undefined(absl::StrCat(ObjectName(obj), " has no attribute '", name, "'"));
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.dict().Find(key.as_string())) return *v;
    return GetAttr(obj, key.as_string());
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.list()[static_cast<size_t>(i)];
    } else {
      const std::vector<std::string> cps = SplitCodePoints(obj.as_string());
      const int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::String(cps[static_cast<size_t>(i)]);
    }
    return Value::Undefined(absl::StrCat(ObjectName(obj), " has no element ", key.as_int()));
  }
  if (key.is_string()) return GetAttr(obj, key.as_string());
  return Value::Undefined(absl::StrCat(ObjectName(obj), " has no element ", key.Repr()));
}

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& x, CallArgs& call) {
  Args a(name, call);
  auto done = [&](absl::StatusOr<Value> v) -> absl::StatusOr<Value> {
    if (!v.ok()) return v;
    RETURN_IF_ERROR(a.Done());
    return v;
  };
  // Filters that take undefined as it is.
  if (name == "default" || name == "d") {
    const Value def = a.Get(0, "default_value");
    const bool boolean = a.Get(1, "boolean").Truthy();
    const bool use_default = x.is_undefined() || (boolean && !x.Truthy());
    return done(use_default ? (def.is_undefined() ? Value::String("") : def) : x);
  }
  if (name == "length" || name == "count") {
    if (!x.is_undefined() && !x.is_string() && !x.is_list() && !x.is_dict()) {
      return TypeError(absl::StrCat("object of type '", x.TypeName(), "' has no len()"));
    }
    return done(Value::Int(Length(x)));
  }
  if (name == "string") return done(Value::String(x.Str()));
  if (name == "safe") return done(x);
  if (name == "e" || name == "escape" || name == "forceescape") return done(Value::String(Escape(x.Str())));
  if (name == "items") {
    if (x.is_undefined()) return done(Value::List());
    if (!x.is_dict()) return TypeError(absl::StrCat("items: expected a dict, got ", x.TypeName()));
    return done(*DictMethod(x, "items")->function()(call));
  }
  if (name == "list") {
    ASSIGN_OR_RETURN(ValueList items, Iterate(x));
    return done(Value::List(std::move(items)));
  }
  if (name == "tojson") {
    const Value indent = a.Get(0, "indent");
    const Value sort_keys = a.Get(1, "sort_keys");
    a.Get(2, "ensure_ascii");
    a.Get(3, "separators");
    int ind = -1;
    if (!indent.is_undefined() && !indent.is_none()) {
      ASSIGN_OR_RETURN(int64_t i, ToInt(indent, "tojson indent"));
      ind = static_cast<int>(std::clamp<int64_t>(i, 0, 64));
    }
    RETURN_IF_ERROR(a.Done());
    ASSIGN_OR_RETURN(std::string json, x.ToJson(ind, sort_keys.Truthy()));
    return Value::String(std::move(json));
  }
  if (x.is_undefined() && name != "join" && name != "first" && name != "last" &&
      name != "trim" && name != "lower" && name != "upper" && name != "capitalize" &&
      name != "title" && name != "replace" && name != "indent" && name != "wordcount" &&
      name != "reverse" && name != "sort" && name != "unique" && name != "map" &&
      name != "select" && name != "reject" && name != "selectattr" && name != "rejectattr" &&
      name != "sum" && name != "int" && name != "float") {
    return UndefinedError(x);
  }
  if (name == "trim") return done(Value::String(Strip(x.Str(), a.Get(0, "chars"), true, true)));
  if (name == "lower") return done(Value::String(Lower(x.Str())));
  if (name == "upper") return done(Value::String(Upper(x.Str())));
  if (name == "capitalize") return done(Value::String(Capitalize(x.Str())));
  if (name == "title") return done(Value::String(JinjaTitle(x.Str())));
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (unsigned char c : x.Str()) {
      const bool w = std::isalnum(c) || c == '_' || c >= 0x80;
      if (w && !in_word) ++n;
      in_word = w;
    }
    return done(Value::Int(n));
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(std::string from, ToStr(a.Get(0, "old"), "replace old"));
    ASSIGN_OR_RETURN(std::string to, ToStr(a.Get(1, "new"), "replace new"));
    const Value c = a.Get(2, "count");
    int64_t count = -1;
    if (!c.is_undefined() && !c.is_none()) {
      ASSIGN_OR_RETURN(count, ToInt(c, "replace count"));
    }
    std::string out = Replace(x.Str(), from, to, count);
    if (out.size() > kMaxStringBytes) return TypeError("replace: the result is too long");
    return done(Value::String(std::move(out)));
  }
  if (name == "indent") {
    const Value width = a.Get(0, "width");
    const bool first = a.Get(1, "first").Truthy();
    const bool blank = a.Get(2, "blank").Truthy();
    std::string pad = "    ";
    if (width.is_string()) {
      pad = width.as_string();
    } else if (!width.is_undefined()) {
      ASSIGN_OR_RETURN(int64_t w, ToInt(width, "indent width"));
      pad = std::string(static_cast<size_t>(std::clamp<int64_t>(w, 0, 1024)), ' ');
    }
    std::string s = x.Str() + "\n";
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n') {
        lines.push_back(s.substr(start, i - start));
        start = i + 1;
      }
    }
    std::string rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      rv += (blank || !lines[i].empty()) ? pad + lines[i] : lines[i];
    }
    if (first) rv = pad + rv;
    return done(Value::String(std::move(rv)));
  }
  if (name == "first" || name == "last") {
    ASSIGN_OR_RETURN(ValueList items, Iterate(x));
    if (items.empty()) return done(Value::Undefined(absl::StrCat("No ", name, " item, sequence was empty.")));
    return done(name == "first" ? items.front() : items.back());
  }
  if (name == "reverse") {
    if (x.is_string()) {
      std::vector<std::string> cps = SplitCodePoints(x.as_string());
      std::reverse(cps.begin(), cps.end());
      return done(Value::String(absl::StrJoin(cps, "")));
    }
    ASSIGN_OR_RETURN(ValueList items, Iterate(x));
    std::reverse(items.begin(), items.end());
    return done(Value::List(std::move(items)));
  }
  if (name == "join") {
    const Value sep = a.Get(0, "d");
    const Value attribute = a.Get(1, "attribute");
    ASSIGN_OR_RETURN(ValueList items, Iterate(x));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      Value v = items[i];
      if (!attribute.is_undefined() && !attribute.is_none()) {
        ASSIGN_OR_RETURN(v, AttributePath(v, attribute));
      }
      if (i > 0) out += sep.Str();
      out += v.Str();
      if (out.size() > kMaxStringBytes) return TypeError("join: the result is too long");
    }
    return done(Value::String(std::move(out)));
  }
  if (name == "sort") {
    const bool reverse = a.Get(0, "reverse").Truthy();
    const bool case_sensitive = a.Get(1, "case_sensitive").Truthy();
    const Value attribute = a.Get(2, "attribute");
    ASSIGN_OR_RETURN(ValueList items, Iterate(x));
    RETURN_IF_ERROR(SortValues(&items, reverse, case_sensitive, attribute));
    return done(Value::List(std::move(items)));
  }
  if (name == "dictsort") {
    const bool case_sensitive = a.Get(0, "case_sensitive").Truthy();
    const Value by = a.Get(1, "by");
    const bool reverse = a.Get(2, "reverse").Truthy();
    if (!x.is_dict()) return TypeError(absl::StrCat("dictsort: expected a dict, got ", x.TypeName()));
    ValueList items;
    for (const auto& [k, v] : x.dict().items) items.push_back(Value::Tuple({Value::String(k), v}));
    const bool by_value = by.is_string() && by.as_string() == "value";
    RETURN_IF_ERROR(SortValues(&items, reverse, case_sensitive, Value::Int(by_value ? 1 : 0)));
    return done(Value::List(std::move(items)));
  }
  if (name == "unique") {
    const bool case_sensitive = a.Get(0, "case_sensitive").Truthy();
    const Value attribute = a.Get(1, "attribute");
    ASSIGN_OR_RETURN(ValueList items, Iterate(x));
    ValueList out, seen;
    for (const Value& v : items) {
      Value key = v;
      if (!attribute.is_undefined() && !attribute.is_none()) {
        ASSIGN_OR_RETURN(key, AttributePath(v, attribute));
      }
      key = SortKey(key, case_sensitive);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return s.Equals(key); })) {
        seen.push_back(key);
        out.push_back(v);
      }
    }
    return done(Value::List(std::move(out)));
  }
  if (name == "min" || name == "max") {
    const bool case_sensitive = a.Get(0, "case_sensitive").Truthy();
    const Value attribute = a.Get(1, "attribute");
    ASSIGN_OR_RETURN(ValueList items, Iterate(x));
    if (items.empty()) return done(Value::Undefined(absl::StrCat("No aggregated item, sequence was empty.")));
    RETURN_IF_ERROR(SortValues(&items, false, case_sensitive, attribute));
    return done(name == "min" ? items.front() : items.back());
  }
  if (name == "sum") {
    const Value attribute = a.Get(0, "attribute");
    const Value start = a.Get(1, "start");
    ASSIGN_OR_RETURN(ValueList items, Iterate(x));
    Value total = start.is_undefined() ? Value::Int(0) : start;
    for (Value v : items) {
      if (!attribute.is_undefined() && !attribute.is_none()) {
        ASSIGN_OR_RETURN(v, AttributePath(v, attribute));
      }
      if (!v.is_number() || !total.is_number()) {
        return TypeError(absl::StrCat("sum: unsupported operand type(s) for +: '", total.TypeName(),
                                      "' and '", v.TypeName(), "'"));
      }
      total = total.is_float() || v.is_float() ? Value::Float(total.as_double() + v.as_double())
                                               : Value::Int(total.as_int() + v.as_int());
    }
    return done(total);
  }
  if (name == "map") {
    ASSIGN_OR_RETURN(ValueList items, IterateIfTruthy(x));
    const bool by_attribute = std::any_of(call.keyword.begin(), call.keyword.end(),
                                          [](const auto& kv) { return kv.first == "attribute"; });
    ValueList out;
    if (by_attribute) {
      const Value attribute = a.Get(99, "attribute");
      const Value def = a.Get(99, "default");
      for (const Value& v : items) {
        ASSIGN_OR_RETURN(Value got, AttributePath(v, attribute));
        out.push_back(got.is_undefined() && !def.is_undefined() ? def : got);
      }
      return done(Value::List(std::move(out)));
    }
    ASSIGN_OR_RETURN(std::string filter, ToStr(a.Get(0, "filter"), "map's filter name"));
    if (!IsKnownFilter(filter)) return TypeError(absl::StrCat("map: no filter named '", filter, "'"));
    std::vector<Value> rest = a.Rest(1);
    for (const Value& v : items) {
      CallArgs fargs;
      fargs.positional = rest;
      ASSIGN_OR_RETURN(Value mapped, ApplyFilter(filter, v, fargs));
      out.push_back(std::move(mapped));
    }
    return done(Value::List(std::move(out)));
  }
  if (name == "select" || name == "reject") return done(SelectOrReject(x, a, name == "select", false));
  if (name == "selectattr" || name == "rejectattr") {
    return done(SelectOrReject(x, a, name == "selectattr", true));
  }
  if (name == "attr") {
    ASSIGN_OR_RETURN(std::string attr, ToStr(a.Get(0, "name"), "attr name"));
    return done(GetAttr(x, attr));
  }
  if (name == "abs") {
    if (x.is_float()) return done(Value::Float(std::fabs(x.as_double())));
    if (x.is_number()) {
      if (x.as_int() == std::numeric_limits<int64_t>::min()) {
        return IntegerOverflow("abs()");
      }
      return done(Value::Int(std::llabs(x.as_int())));
    }
    return TypeError(absl::StrCat("bad operand type for abs(): '", x.TypeName(), "'"));
  }
  if (name == "int" || name == "float") {
    // jinja2's do_int: int(value) (a str: int(value, base)); where that
    // raises ValueError or TypeError, int(float(value)); where that raises
    // too, the default. So NaN, and a string of infinity, give the default,
    // while a float infinity fails (int() raises OverflowError, which the
    // first step does not catch). do_float: float(value), else the default.
    const bool to_int = name == "int";
    Value def = a.Get(0, "default");
    if (def.is_undefined()) def = to_int ? Value::Int(0) : Value::Float(0);
    const Value base = to_int ? a.Get(1, "base") : Value();
    RETURN_IF_ERROR(a.Done());
    if (x.is_number()) {
      if (!to_int) return Value::Float(x.as_double());
      if (!x.is_float()) return Value::Int(x.as_int());
      if (std::isnan(x.as_double())) return def;
      ASSIGN_OR_RETURN(const int64_t i, FloatToInt(x.as_double(), "int"));
      return Value::Int(i);
    }
    if (x.is_string()) {
      const std::string s = Strip(x.as_string(), Value(), true, true);
      if (to_int && (base.is_undefined() || base.is_int())) {
        bool overflow = false;
        if (auto i = ParsePyInt(s, base.is_undefined() ? 10 : base.as_int(), &overflow)) {
          return Value::Int(*i);
        }
        if (overflow) return IntegerOverflow(absl::StrCat("int('", s, "')"));
      }
      const std::optional<double> d = ParsePyFloat(s);
      if (!d.has_value()) return def;
      if (!to_int) return Value::Float(*d);
      if (std::isnan(*d) || std::isinf(*d)) return def;
      ASSIGN_OR_RETURN(const int64_t i, FloatToInt(*d, "int"));
      return Value::Int(i);
    }
    return def;
  }
  if (name == "round") {
    const Value precision = a.Get(0, "precision");
    const Value method = a.Get(1, "method");
    if (!x.is_number()) return TypeError(absl::StrCat("round: expected a number, got ", x.TypeName()));
    int64_t p = 0;
    if (!precision.is_undefined()) {
      ASSIGN_OR_RETURN(p, ToInt(precision, "round precision"));
    }
    const double scale = std::pow(10.0, static_cast<double>(p));
    const std::string m = method.is_string() ? method.as_string() : "common";
    double v = x.as_double() * scale;
    if (m == "common") {
      v = std::nearbyint(v);  // Python's round(): half to even
    } else if (m == "ceil") {
      v = std::ceil(v);
    } else if (m == "floor") {
      v = std::floor(v);
    } else {
      return TypeError("round: method must be common, ceil or floor");
    }
    return done(Value::Float(v / scale));
  }
  if (name == "format") {
    absl::Status status;
    std::string out = PercentFormat(x.Str(), a.Rest(0), &status);
    RETURN_IF_ERROR(status);
    return Value::String(std::move(out));
  }
  return Unsupported(absl::StrCat("the filter '", name, "' is not supported"));
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& x, CallArgs& call) {
  Args a(name, call);
  bool r = false;
  if (name == "defined") {
    r = !x.is_undefined();
  } else if (name == "undefined") {
    r = x.is_undefined();
  } else if (name == "none") {
    r = x.is_none();
  } else if (name == "boolean") {
    r = x.is_bool();
  } else if (name == "true") {
    r = x.is_bool() && x.as_bool();
  } else if (name == "false") {
    r = x.is_bool() && !x.as_bool();
  } else if (name == "integer") {
    r = x.is_int();
  } else if (name == "float") {
    r = x.is_float();
  } else if (name == "number") {
    r = x.is_number();
  } else if (name == "string") {
    r = x.is_string();
  } else if (name == "mapping") {
    r = x.is_dict() && !x.dict().is_namespace;
  } else if (name == "iterable") {
    r = x.is_undefined() || x.is_string() || x.is_list() || (x.is_dict() && !x.dict().is_namespace);
  } else if (name == "sequence") {
    r = x.is_undefined() || x.is_string() || x.is_list() || (x.is_dict() && !x.dict().is_namespace);
  } else if (name == "callable") {
    r = x.is_function();
  } else if (name == "escaped") {
    r = false;
  } else if (name == "lower" || name == "upper") {
    const std::string s = x.Str();
    r = name == "lower" ? s == Lower(s) : s == Upper(s);
  } else if (name == "even" || name == "odd" || name == "divisibleby") {
    if (!x.is_number()) return TypeError(absl::StrCat(name, ": expected a number, got ", x.TypeName()));
    int64_t d = 2;
    if (name == "divisibleby") {
      ASSIGN_OR_RETURN(d, ToInt(a.Get(0, "num"), "divisibleby's argument"));
      if (d == 0) return TypeError("divisibleby: division by zero");
    }
    int64_t v = x.as_int();
    if (x.is_float()) {
      ASSIGN_OR_RETURN(v, FloatToInt(x.as_double(), name));
    }
    r = name == "odd" ? v % 2 != 0 : v % d == 0;
  } else if (name == "in") {
    const Value seq = a.Get(0, "seq");
    if (seq.is_string() && x.is_string()) {
      r = seq.as_string().find(x.as_string()) != std::string::npos;
    } else if (seq.is_dict() && x.is_string()) {
      r = seq.dict().Find(x.as_string()) != nullptr;
    } else if (seq.is_list()) {
      r = std::any_of(seq.list().begin(), seq.list().end(), [&](const Value& v) { return v.Equals(x); });
    } else {
      return TypeError(absl::StrCat("argument of type '", seq.TypeName(), "' is not iterable"));
    }
  } else if (name == "sameas") {
    const Value other = a.Get(0, "other");
    r = (x.is_none() && other.is_none()) || (x.is_bool() && other.is_bool() && x.as_bool() == other.as_bool()) ||
        (x.is_list() && other.is_list() && &x.list() == &other.list()) ||
        (x.is_dict() && other.is_dict() && &x.dict() == &other.dict());
  } else {
    const Value other = a.Get(0, "other");
    if (name == "eq" || name == "equalto" || name == "==") {
      r = x.Equals(other);
    } else if (name == "ne" || name == "!=") {
      r = !x.Equals(other);
    } else if (name == "lt" || name == "lessthan" || name == "<") {
      ASSIGN_OR_RETURN(r, x.Less(other));
    } else if (name == "gt" || name == "greaterthan" || name == ">") {
      ASSIGN_OR_RETURN(r, other.Less(x));
    } else if (name == "le" || name == "<=") {
      ASSIGN_OR_RETURN(bool gt, other.Less(x));
      r = !gt;
    } else if (name == "ge" || name == ">=") {
      ASSIGN_OR_RETURN(bool lt, x.Less(other));
      r = !lt;
    } else {
      return Unsupported(absl::StrCat("the test '", name, "' is not supported"));
    }
  }
  RETURN_IF_ERROR(a.Done());
  return r;
}

Value BuiltinGlobals() {
  Value g = Value::Dict();
  g.dict().Set("range", Bind([](Args& a) -> absl::StatusOr<Value> {
    const Value a0 = a.Get(0, "start"), a1 = a.Get(1, "stop"), a2 = a.Get(2, "step");
    int64_t start = 0, stop, step = 1;
    if (a1.is_undefined()) {
      ASSIGN_OR_RETURN(stop, ToInt(a0, "range() stop"));
    } else {
      ASSIGN_OR_RETURN(start, ToInt(a0, "range() start"));
      ASSIGN_OR_RETURN(stop, ToInt(a1, "range() stop"));
      if (!a2.is_undefined()) {
        ASSIGN_OR_RETURN(step, ToInt(a2, "range() step"));
      }
    }
    if (step == 0) return TypeError("range() arg 3 must not be zero");
    const double n = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
    if (n > kMaxRange) {
      return TypeError(absl::StrCat("Range too big. The sandbox blocks ranges larger than MAX_RANGE (",
                                    kMaxRange, ")."));
    }
    ValueList out;
    // The last step may pass the 64-bit limit: the loop ends there.
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      out.push_back(Value::Int(i));
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    return Value::List(std::move(out));
  }, "range"));
  auto make_dict = [](bool ns) {
    return Value::Callable([ns](CallArgs& a) -> absl::StatusOr<Value> {
      Value d = ns ? Value::Namespace() : Value::Dict();
      if (a.positional.size() > 1) return TypeError("expected at most 1 positional argument");
      if (!a.positional.empty()) {
        if (!a.positional[0].is_dict()) return TypeError("expected a dict as the positional argument");
        for (const auto& [k, v] : a.positional[0].dict().items) d.dict().Set(k, v);
      }
      for (const auto& [k, v] : a.keyword) d.dict().Set(k, v);
      return d;
    });
  };
  g.dict().Set("namespace", make_dict(true));
  g.dict().Set("dict", make_dict(false));
  g.dict().Set("raise_exception", Bind([](Args& a) -> absl::StatusOr<Value> {
    return absl::InvalidArgumentError(absl::StrCat("the chat template refused the messages: ",
                                                   a.Get(0, "message").Str()));
  }, "raise_exception"));
  g.dict().Set("strftime_now", Bind([](Args& a) -> absl::StatusOr<Value> {
    ASSIGN_OR_RETURN(std::string fmt, ToStr(a.Get(0, "format"), "strftime_now format"));
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
    return Value::String(std::string(buf, n));
  }, "strftime_now"));
  return g;
}

}  // namespace tandem::jinja
