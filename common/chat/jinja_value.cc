#include "common/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem::jinja {

const Value* ValueDict::Find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::Set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

Value Value::Undefined(std::string hint) {
  Value v;
  v.s_ = std::move(hint);
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = d;
  return v;
}
namespace {
thread_local BuildBudget* build_budget = nullptr;

void Charge(size_t bytes) {
  if (build_budget == nullptr) return;
  build_budget->left -= static_cast<int64_t>(bytes);
  if (build_budget->left < 0) build_budget->spent = true;
}
}  // namespace

BuildBudgetScope::BuildBudgetScope(BuildBudget* budget) : previous_(build_budget) { build_budget = budget; }
BuildBudgetScope::~BuildBudgetScope() { build_budget = previous_; }

Value Value::String(std::string s) {
  Charge(s.size());
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}
Value Value::List(ValueList items) {
  if (build_budget != nullptr) {
    size_t bytes = items.size() * sizeof(Value);
    for (const Value& item : items) {
      if (item.is_string()) bytes += item.as_string().size();
    }
    Charge(bytes);
  }
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::Tuple(ValueList items) {
  Value v = List(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::Dict() {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>();
  return v;
}
Value Value::Namespace() {
  Value v = Dict();
  v.dict_->is_namespace = true;
  return v;
}
Value Value::Callable(Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

namespace {
template <typename Json>
Value FromAnyJson(const Json& json) {
  switch (json.type()) {
    case Json::value_t::null:
      return Value::None();
    case Json::value_t::boolean:
      return Value::Bool(json.template get<bool>());
    case Json::value_t::number_integer:
      return Value::Int(json.template get<int64_t>());
    case Json::value_t::number_unsigned:
      return Value::Int(static_cast<int64_t>(json.template get<uint64_t>()));
    case Json::value_t::number_float:
      return Value::Float(json.template get<double>());
    case Json::value_t::string:
      return Value::String(json.template get<std::string>());
    case Json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& e : json) items.push_back(FromAnyJson(e));
      return Value::List(std::move(items));
    }
    case Json::value_t::object: {
      Value d = Value::Dict();
      for (const auto& [k, e] : json.items()) d.dict().items.emplace_back(k, FromAnyJson(e));
      return d;
    }
    default:
      return Value();
  }
}
}  // namespace

Value Value::FromJson(const nlohmann::ordered_json& json) { return FromAnyJson(json); }
Value Value::FromJson(const nlohmann::json& json) { return FromAnyJson(json); }

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return dict_->is_namespace || !dict_->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string FormatPythonFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: scientific when the
  // decimal exponent is below -4 or at least 16 (float_repr_style 'short').
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, end);  // "-1.2345e+02"
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + ebuf;
  }
  if (exp < 0) {
    return absl::StrCat(out, "0.", std::string(-exp - 1, '0'), digits);
  }
  const size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) {
    return absl::StrCat(out, digits, std::string(int_len - digits.size(), '0'), ".0");
  }
  return absl::StrCat(out, digits.substr(0, int_len), ".", digits.substr(int_len));
}

std::vector<std::string> SplitCodePoints(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (i + n > s.size()) n = 1;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) {
        n = 1;
        break;
      }
    }
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

namespace {

std::string ReprString(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == quote) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += quote;
  return out;
}

void JsonString(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return FormatPythonFloat(f_);
    case Kind::kString:
      return ReprString(s_);
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*list_)[i].Repr();
      }
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::kDict: {
      if (dict_->is_namespace) return "<Namespace>";
      std::string out = "{";
      for (size_t i = 0; i < dict_->items.size(); ++i) {
        if (i > 0) out += ", ";
        absl::StrAppend(&out, ReprString(dict_->items[i].first), ": ",
                        dict_->items[i].second.Repr());
      }
      return out + "}";
    }
    case Kind::kFunction:
      return "<function>";
  }
  return "";
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return dict_->is_namespace ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "";
}

void Value::DumpJson(std::string* out, int indent, bool sort_keys, int depth,
                     absl::Status* status) const {
  if (!status->ok()) return;
  if (depth > 256) {
    *status = absl::InvalidArgumentError("tojson: nesting deeper than 256");
    return;
  }
  auto newline = [&](int level) {
    if (indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(indent) * level, ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (kind_) {
    case Kind::kNone:
      *out += "null";
      return;
    case Kind::kBool:
      *out += b_ ? "true" : "false";
      return;
    case Kind::kInt:
      *out += std::to_string(i_);
      return;
    case Kind::kFloat:
      if (std::isnan(f_)) {
        *out += "NaN";
      } else if (std::isinf(f_)) {
        *out += f_ < 0 ? "-Infinity" : "Infinity";
      } else {
        *out += FormatPythonFloat(f_);
      }
      return;
    case Kind::kString:
      JsonString(s_, out);
      return;
    case Kind::kList:
      if (list_->empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        (*list_)[i].DumpJson(out, indent, sort_keys, depth + 1, status);
      }
      newline(depth);
      *out += ']';
      return;
    case Kind::kDict: {
      if (dict_->items.empty()) {
        *out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : dict_->items) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        JsonString(items[i]->first, out);
        *out += ": ";
        items[i]->second.DumpJson(out, indent, sort_keys, depth + 1, status);
      }
      newline(depth);
      *out += '}';
      return;
    }
    case Kind::kUndefined:
    case Kind::kFunction:
      *status = absl::InvalidArgumentError(
          absl::StrCat("tojson: Object of type ", TypeName(), " is not JSON serializable"));
      return;
  }
}

absl::StatusOr<std::string> Value::ToJson(int indent, bool sort_keys) const {
  std::string out;
  absl::Status status;
  DumpJson(&out, indent, sort_keys, 0, &status);
  if (!status.ok()) return status;
  return out;
}

bool Value::Equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_float() || other.is_float()) return as_double() == other.as_double();
    return as_int() == other.as_int();
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return s_ == other.s_;
    case Kind::kList:
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*other.list_)[i])) return false;
      }
      return true;
    case Kind::kDict:
      if (dict_ == other.dict_) return true;
      if (dict_->is_namespace || other.dict_->is_namespace) return false;
      if (dict_->items.size() != other.dict_->items.size()) return false;
      for (const auto& [k, v] : dict_->items) {
        const Value* o = other.dict_->Find(k);
        if (o == nullptr || !v.Equals(*o)) return false;
      }
      return true;
    case Kind::kFunction:
      return fn_ == other.fn_;
    default:
      return false;
  }
}

absl::StatusOr<bool> Value::Less(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_float() || other.is_float()) return as_double() < other.as_double();
    return as_int() < other.as_int();
  }
  if (is_string() && other.is_string()) return s_ < other.s_;  // UTF-8 orders as code points
  if (is_list() && other.is_list()) {
    const size_t n = std::min(list_->size(), other.list_->size());
    for (size_t i = 0; i < n; ++i) {
      if ((*list_)[i].Equals((*other.list_)[i])) continue;
      return (*list_)[i].Less((*other.list_)[i]);
    }
    return list_->size() < other.list_->size();
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 TypeName(), "' and '", other.TypeName(), "'"));
}

}  // namespace tandem::jinja
