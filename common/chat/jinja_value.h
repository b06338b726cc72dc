// jinja::Value: the values a chat template computes with, with Python's
// semantics as Jinja2 exposes them (truthiness, str(), repr(), ==, <, the
// JSON of transformers' `tojson`). Lists and dicts are shared by reference,
// as in Python; dicts keep insertion order and have string keys (JSON's).
//
// Not thread-safe for mutation; a Value built once (a request's messages)
// may be read from several threads.
#ifndef TANDEM_COMMON_CHAT_JINJA_VALUE_H_
#define TANDEM_COMMON_CHAT_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem::jinja {

class Value;
using ValueList = std::vector<Value>;

// A dict in insertion order. Chat-template dicts hold a handful of keys, so
// lookups are linear.
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): the one thing `set x.y = ...` may change

  const Value* Find(const std::string& key) const;
  void Set(const std::string& key, Value value);
};

// Arguments of a call: positional, then keyword in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<absl::StatusOr<Value>(CallArgs&)>;

// What the strings and lists one render builds may add up to: each
// Value::String and Value::List charges its bytes (a list: its direct
// items, strings counted whole) to the calling thread's budget while a
// render holds one (BuildBudgetScope); the renderer refuses at its next
// step once it is spent, so that a template doubling or multiplying values
// fails its request before memory runs out. Thread-local: renders on
// several threads each charge their own.
struct BuildBudget {
  int64_t left = 0;
  bool spent = false;
};
class BuildBudgetScope {
 public:
  explicit BuildBudgetScope(BuildBudget* budget);
  ~BuildBudgetScope();
  BuildBudgetScope(const BuildBudgetScope&) = delete;
  BuildBudgetScope& operator=(const BuildBudgetScope&) = delete;

 private:
  BuildBudget* previous_;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  // Undefined, with what an error about using it says ("'foo' is undefined").
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(ValueList items = {});
  // A list that prints as a tuple: "(1, 2)" (dict items, tuple literals).
  static Value Tuple(ValueList items);
  static Value Dict();
  static Value Namespace();
  static Value Callable(Function fn);
  // JSON -> Value: objects become dicts (in the order given: parse requests
  // as ordered_json, as Python keeps a dict's order), arrays lists.
  static Value FromJson(const nlohmann::ordered_json& json);
  static Value FromJson(const nlohmann::json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return is_bool() ? (b_ ? 1 : 0) : i_; }
  double as_double() const { return is_float() ? f_ : static_cast<double>(as_int()); }
  const std::string& as_string() const { return s_; }
  const std::string& undefined_hint() const { return s_; }
  ValueList& list() const { return *list_; }
  ValueDict& dict() const { return *dict_; }
  const Function& function() const { return *fn_; }

  // Python's bool(x); undefined is false.
  bool Truthy() const;
  // Python's str(x) (undefined: ""), and repr(x).
  std::string Str() const;
  std::string Repr() const;
  // The type's name as Python's errors say it: "str", "int", "NoneType"...
  std::string TypeName() const;
  // json.dumps(x, ensure_ascii=False, indent=indent, separators=..., sort_keys=...):
  // transformers' tojson. indent < 0 means None. Fails on undefined and functions.
  absl::StatusOr<std::string> ToJson(int indent = -1, bool sort_keys = false) const;
  // Python's ==. Numbers compare by value (True == 1), lists and dicts deeply.
  bool Equals(const Value& other) const;
  // Python's <: numbers, strings (by code point), lists; else an error naming both types.
  absl::StatusOr<bool> Less(const Value& other) const;

 private:
  void DumpJson(std::string* out, int indent, bool sort_keys, int depth, absl::Status* status) const;

  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Function> fn_;
};

// Python's repr(float): the shortest digits that round-trip, "1.0", "1e-05",
// "1e+16", "inf", "nan".
std::string FormatPythonFloat(double d);
// Code points of UTF-8 `s` (invalid bytes count one each), for len() and slicing.
std::vector<std::string> SplitCodePoints(const std::string& s);

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_JINJA_VALUE_H_
