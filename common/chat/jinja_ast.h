// The syntax tree of a parsed template (private to common/chat): what
// jinja_parse.cc builds and jinja_render.cc walks.
#ifndef TANDEM_COMMON_CHAT_JINJA_AST_H_
#define TANDEM_COMMON_CHAT_JINJA_AST_H_

#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/jinja.h"
#include "common/chat/jinja_value.h"

namespace tandem::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: items
    kTuple,    // args: items
    kDict,     // args: key0, value0, key1, value1, ...
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null: omitted)
    kCall,     // args[0](args[1..]); the last kwnames.size() args are keyword
    kFilter,   // args[0] | name(args[1..]); args[0] null inside a filter block
    kTest,     // args[0] is [not] name(args[1..])
    kUnary,    // name ("-", "+", "not") args[0]
    kBinary,   // args[0] name args[1]: + - * / // % ** ~ == != < <= > >= in "not in"
    kAnd,
    kOr,
    kCond,     // args[1] if args[0] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  int line = 0;
  std::string name;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::string> kwnames;
  bool negated = false;  // kTest: `is not`
};

struct Stmt;
using Body = std::vector<Stmt>;

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conds[i] -> bodies[i]; bodies.back() is the else when bodies > conds
    kFor,          // for targets in expr [if cond]: body [else: else_body]
    kSet,          // targets = expr, or ns.attr = expr (attr non-empty; targets[0] is ns)
    kSetBlock,     // targets[0] = body rendered [| filter]
    kMacro,        // name(params = defaults): body
    kFilterBlock,  // body rendered | filter
    kBreak,
    kContinue,
    kBlock,        // a block rendered as is (transformers' {% generation %})
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;    // kFor: the `if` filter
  ExprPtr filter;  // kSetBlock / kFilterBlock: a kFilter chain whose innermost operand is null
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body, else_body;
  std::vector<std::string> targets;
  std::string attr;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // per param; null: none
};

struct Template::Impl {
  Body body;
};

// Parses `source` into a body (jinja_parse.cc).
absl::StatusOr<Body> ParseTemplate(absl::string_view source, const TemplateOptions& options);

// The builtins (jinja_builtins.cc): whether a filter or test of this name
// exists (Parse checks every name), and applying one.
bool IsKnownFilter(const std::string& name);
bool IsKnownTest(const std::string& name);
absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& operand, CallArgs& args);
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& operand, CallArgs& args);
// jinja2's getattr (obj.name: a method, then an item) and getitem (obj[key]:
// an item, then a method); undefined, with a hint, when neither exists.
// Fails on an undefined `obj`.
absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name);
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// The error for using an undefined value.
absl::Status UndefinedError(const Value& undefined);
// Python's TypeError (and the ValueErrors a template can cause): the
// template's own mistake, InvalidArgument.
absl::Status TypeError(absl::string_view what);
// Integers are 64-bit here, Python's unbounded: `what`'s result beyond them
// is this error, never a wrapped value (signed overflow is undefined behaviour).
absl::Status IntegerOverflow(absl::string_view what);
// range, namespace, dict, raise_exception, strftime_now.
Value BuiltinGlobals();
// The items a for loop visits: a list's items, a dict's keys, a string's
// characters, nothing for undefined; else an error.
absl::StatusOr<ValueList> Iterate(const Value& v);

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_JINJA_AST_H_
