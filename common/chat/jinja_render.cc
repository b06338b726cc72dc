// Walks the syntax tree: jinja2's scoping (a for loop's body and a macro
// call get their own scope, fresh each iteration; `set` elsewhere assigns in
// the current one), Python's operators, and the limits that stop a hostile
// template.
#include <cmath>
#include <memory>
#include <optional>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/jinja_ast.h"

namespace tandem::jinja {
namespace {

class Frame {
 public:
  explicit Frame(const Frame* parent) : parent_(parent) {}
  const Value* Lookup(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent_) {
      auto it = f->vars_.find(name);
      if (it != f->vars_.end()) return &it->second;
    }
    return nullptr;
  }
  void Set(const std::string& name, Value v) { vars_[name] = std::move(v); }
  // Expires when this frame ends: a macro stored in a namespace can outlive
  // the loop body that defined it, and must not read that body's frame then.
  std::weak_ptr<const void> LifeToken() const {
    if (life_ == nullptr) life_ = std::make_shared<char>(0);
    return life_;
  }

 private:
  const Frame* parent_;
  std::unordered_map<std::string, Value> vars_;
  mutable std::shared_ptr<const void> life_;
};

// What one concatenation may build: a template that doubles a string or a
// list in a loop is refused long before memory runs out.
constexpr size_t kMaxConcatBytes = 64 << 20;
constexpr size_t kMaxConcatItems = 1 << 20;

absl::Status BinaryTypeError(const std::string& op, const Value& a, const Value& b) {
  return TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(),
                                "' and '", b.TypeName(), "'"));
}

absl::StatusOr<Value> Repeat(const ValueList* list, const std::string* str, int64_t n) {
  if (n < 0) n = 0;
  const size_t unit = list != nullptr ? list->size() : str->size();
  if (n > 0 && unit > (size_t{16} << 20) / static_cast<size_t>(n)) return TypeError("a repetition too long");
  if (list != nullptr) {
    ValueList out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), list->begin(), list->end());
    return Value::List(std::move(out));
  }
  std::string out;
  for (int64_t i = 0; i < n; ++i) out += *str;
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.as_string().size() + b.as_string().size() > kMaxConcatBytes) {
        return absl::ResourceExhaustedError(absl::StrCat("a string of more than ", kMaxConcatBytes, " bytes"));
      }
      return Value::String(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      if (a.list().size() + b.list().size() > kMaxConcatItems) {
        return absl::ResourceExhaustedError(absl::StrCat("a list of more than ", kMaxConcatItems, " items"));
      }
      ValueList out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(out));
    }
  }
  if (op == "*") {
    if ((a.is_list() || a.is_string()) && (b.is_int() || b.is_bool())) {
      return Repeat(a.is_list() ? &a.list() : nullptr, &a.as_string(), b.as_int());
    }
    if ((b.is_list() || b.is_string()) && (a.is_int() || a.is_bool())) {
      return Repeat(b.is_list() ? &b.list() : nullptr, &b.as_string(), a.as_int());
    }
  }
  if (op == "%" && a.is_string()) {
    return absl::UnimplementedError("'%' string formatting is not supported; use ~ or the format filter");
  }
  if (!a.is_number() || !b.is_number()) return BinaryTypeError(op, a, b);
  const bool floats = a.is_float() || b.is_float();
  if (op == "/") {
    if (b.as_double() == 0) return TypeError("division by zero");
    return Value::Float(a.as_double() / b.as_double());
  }
  if (op == "**") {
    if (!floats && b.as_int() >= 0) {
      const double r = std::pow(a.as_double(), b.as_double());
      if (std::fabs(r) < 9.2e18) return Value::Int(static_cast<int64_t>(std::llround(r)));
    }
    return Value::Float(std::pow(a.as_double(), b.as_double()));
  }
  if (floats) {
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (y == 0) return TypeError("float division by zero");
    if (op == "//") return Value::Float(std::floor(x / y));
    const double m = std::fmod(x, y);  // Python: the sign of the divisor
    return Value::Float(m != 0 && ((m < 0) != (y < 0)) ? m + y : m);
  }
  const int64_t x = a.as_int(), y = b.as_int();
  int64_t r = 0;
  if (op == "+" || op == "-" || op == "*") {
    const bool over = op == "+"   ? __builtin_add_overflow(x, y, &r)
                      : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                  : __builtin_mul_overflow(x, y, &r);
    if (over) return IntegerOverflow(absl::StrCat("integer ", op));
    return Value::Int(r);
  }
  if (y == 0) return TypeError("integer division or modulo by zero");
  if (y == -1) {  // x / -1 overflows for the smallest x (and traps on x86)
    if (op == "%") return Value::Int(0);
    if (__builtin_sub_overflow(int64_t{0}, x, &r)) return IntegerOverflow(absl::StrCat("integer ", op));
    return Value::Int(r);
  }
  int64_t q = x / y, m = x % y;
  if (m != 0 && ((m < 0) != (y < 0))) {
    --q;
    m += y;
  }
  return Value::Int(op == "//" ? q : m);
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  // jinja2's Undefined iterates as empty and defines no __contains__, so
  // `'x' in undefined` is false (Granite's templates test `'citations' in controls`).
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!item.is_string()) {
      return TypeError(absl::StrCat("'in <string>' requires string as left operand, not ", item.TypeName()));
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.list()) {
      if (v.Equals(item)) return true;
    }
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.dict().Find(item.as_string()) != nullptr;
  return TypeError(absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
}

absl::StatusOr<Value> Slice(const Value& obj, const Value& start_v, const Value& stop_v,
                            const Value& step_v) {
  if (obj.is_undefined()) return UndefinedError(obj);
  std::vector<std::string> cps;
  int64_t n;
  if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list().size());
  } else if (obj.is_string()) {
    cps = SplitCodePoints(obj.as_string());
    n = static_cast<int64_t>(cps.size());
  } else {
    return TypeError(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }
  auto bound = [](const Value& v, const char* what) -> absl::StatusOr<std::optional<int64_t>> {
    if (v.is_undefined() || v.is_none()) return std::optional<int64_t>();
    if (!v.is_int() && !v.is_bool()) {
      return TypeError(absl::StrCat("slice ", what, " must be an integer or None, got ", v.TypeName()));
    }
    return std::optional<int64_t>(v.as_int());
  };
  ASSIGN_OR_RETURN(std::optional<int64_t> start, bound(start_v, "start"));
  ASSIGN_OR_RETURN(std::optional<int64_t> stop, bound(stop_v, "stop"));
  ASSIGN_OR_RETURN(std::optional<int64_t> step_o, bound(step_v, "step"));
  const int64_t step = step_o.value_or(1);
  if (step == 0) return TypeError("slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v.has_value()) return def;
    int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t b = adjust(start, step < 0 ? n - 1 : 0);
  const int64_t e = adjust(stop, step < 0 ? -1 : n);
  ValueList items;
  std::string s;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) {
    if (obj.is_list()) {
      items.push_back(obj.list()[static_cast<size_t>(i)]);
    } else {
      s += cps[static_cast<size_t>(i)];
    }
  }
  return obj.is_list() ? Value::List(std::move(items)) : Value::String(std::move(s));
}

class Renderer {
 public:
  explicit Renderer(const RenderLimits& limits) : limits_(limits) { built_.left = limits.max_built_bytes; }
  // A namespace can be made to hold itself (`set ns.me = ns`, or through a
  // list, a dict or a bound method); it lives only as long as the render,
  // so emptying the ones assigned to frees any such cycle.
  ~Renderer() {
    for (auto& [dict, ns] : assigned_namespaces_) dict->items.clear();
  }

  absl::Status Exec(const Body& body, Frame* frame, std::string* out) {
    for (const Stmt& st : body) {
      RETURN_IF_ERROR(Step(st.line));
      RETURN_IF_ERROR(ExecOne(st, frame, out));
      if (flow_ != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  absl::Status Step(int line) {
    if (++steps_ > limits_.max_steps) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "chat template line ", line, ": rendering took more than ", limits_.max_steps, " steps"));
    }
    if (built_.spent) {
      return absl::ResourceExhaustedError(absl::StrCat("chat template line ", line, ": rendering built more than ",
                                                       limits_.max_built_bytes, " bytes of strings and lists"));
    }
    return absl::OkStatus();
  }

 public:
  BuildBudget* built() { return &built_; }

 private:

  absl::Status Append(std::string* out, const std::string& s, int line) {
    if (out->size() + s.size() > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("chat template line ", line, ": output exceeds ",
                                                       limits_.max_output_bytes, " bytes"));
    }
    *out += s;
    return absl::OkStatus();
  }

  static absl::Status AtLine(const absl::Status& s, int line) {
    if (s.ok() || absl::StrContains(s.message(), "chat template line ")) return s;
    return absl::Status(s.code(), absl::StrCat("chat template line ", line, ": ", s.message()));
  }

  absl::Status Assign(const std::vector<std::string>& targets, const Value& v, Frame* frame, int line) {
    if (targets.size() == 1) {
      frame->Set(targets[0], v);
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    if (items.size() != targets.size()) {
      return AtLine(TypeError(absl::StrCat("cannot unpack ", items.size(), " values into ",
                                           targets.size(), " names")), line);
    }
    for (size_t i = 0; i < targets.size(); ++i) frame->Set(targets[i], items[i]);
    return absl::OkStatus();
  }

  absl::StatusOr<Value> ApplyFilterChain(const Expr& f, Value operand, Frame* frame) {
    if (f.args[0] != nullptr) {
      ASSIGN_OR_RETURN(operand, ApplyFilterChain(*f.args[0], std::move(operand), frame));
    }
    ASSIGN_OR_RETURN(CallArgs args, EvalArgs(f, 1, frame));
    return ApplyFilter(f.name, operand, args);
  }

  absl::Status ExecOne(const Stmt& st, Frame* frame, std::string* out) {
    switch (st.kind) {
      case Stmt::Kind::kText:
        return Append(out, st.text, st.line);
      case Stmt::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*st.expr, frame));
        return Append(out, v.Str(), st.line);
      }
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < st.conds.size(); ++i) {
          ASSIGN_OR_RETURN(Value c, Eval(*st.conds[i], frame));
          if (c.Truthy()) return Exec(st.bodies[i], frame, out);
        }
        if (st.bodies.size() > st.conds.size()) return Exec(st.bodies.back(), frame, out);
        return absl::OkStatus();
      case Stmt::Kind::kFor:
        return ExecFor(st, frame, out);
      case Stmt::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*st.expr, frame));
        if (st.attr.empty()) return Assign(st.targets, v, frame, st.line);
        const Value* ns = frame->Lookup(st.targets[0]);
        if (ns == nullptr || !ns->is_dict() || !ns->dict().is_namespace) {
          return AtLine(TypeError(absl::StrCat("cannot assign attribute on non-namespace object '",
                                               st.targets[0], "'")), st.line);
        }
        ns->dict().Set(st.attr, std::move(v));
        assigned_namespaces_.try_emplace(&ns->dict(), *ns);
        return absl::OkStatus();
      }
      case Stmt::Kind::kSetBlock:
      case Stmt::Kind::kFilterBlock: {
        std::string inner;
        Frame scope(frame);
        RETURN_IF_ERROR(Exec(st.body, &scope, &inner));
        Value v = Value::String(std::move(inner));
        if (st.filter != nullptr) {
          auto filtered = ApplyFilterChain(*st.filter, std::move(v), frame);
          if (!filtered.ok()) return AtLine(filtered.status(), st.line);
          v = *std::move(filtered);
        }
        if (st.kind == Stmt::Kind::kFilterBlock) return Append(out, v.Str(), st.line);
        frame->Set(st.targets[0], std::move(v));
        return absl::OkStatus();
      }
      case Stmt::Kind::kMacro:
        frame->Set(st.name, MakeMacro(st, frame));
        return absl::OkStatus();
      case Stmt::Kind::kBreak:
        flow_ = Flow::kBreak;
        return absl::OkStatus();
      case Stmt::Kind::kContinue:
        flow_ = Flow::kContinue;
        return absl::OkStatus();
      case Stmt::Kind::kBlock:
        return Exec(st.body, frame, out);
    }
    return absl::OkStatus();
  }

  absl::Status ExecFor(const Stmt& st, Frame* frame, std::string* out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*st.expr, frame));
    auto listed = Iterate(iterable);
    if (!listed.ok()) return AtLine(listed.status(), st.line);
    ValueList items = *std::move(listed);
    if (st.cond != nullptr) {
      ValueList kept;
      for (Value& item : items) {
        Frame scope(frame);
        RETURN_IF_ERROR(Assign(st.targets, item, &scope, st.line));
        ASSIGN_OR_RETURN(Value c, Eval(*st.cond, &scope));
        if (c.Truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Frame scope(frame);
      return Exec(st.else_body, &scope, out);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      // Each iteration is a step, body or none: nested loops are bounded.
      RETURN_IF_ERROR(Step(st.line));
      Frame scope(frame);
      RETURN_IF_ERROR(Assign(st.targets, items[i], &scope, st.line));
      Value loop = Value::Dict();
      ValueDict& d = loop.dict();
      d.Set("index", Value::Int(i + 1));
      d.Set("index0", Value::Int(i));
      d.Set("revindex", Value::Int(n - i));
      d.Set("revindex0", Value::Int(n - i - 1));
      d.Set("first", Value::Bool(i == 0));
      d.Set("last", Value::Bool(i == n - 1));
      d.Set("length", Value::Int(n));
      d.Set("depth", Value::Int(1));
      d.Set("depth0", Value::Int(0));
      d.Set("previtem", i > 0 ? items[i - 1] : Value::Undefined("there is no previous item"));
      d.Set("nextitem", i + 1 < n ? items[i + 1] : Value::Undefined("there is no next item"));
      d.Set("cycle", Value::Callable([i](CallArgs& a) -> absl::StatusOr<Value> {
        if (a.positional.empty()) return TypeError("no items for cycling given");
        return a.positional[static_cast<size_t>(i) % a.positional.size()];
      }));
      scope.Set("loop", std::move(loop));
      RETURN_IF_ERROR(Exec(st.body, &scope, out));
      if (flow_ == Flow::kBreak) {
        flow_ = Flow::kNormal;
        break;
      }
      flow_ = Flow::kNormal;
    }
    return absl::OkStatus();
  }

  Value MakeMacro(const Stmt& st, const Frame* defined_in) {
    return Value::Callable([this, &st, defined_in, alive = defined_in->LifeToken()](
                               CallArgs& a) -> absl::StatusOr<Value> {
      if (alive.expired()) {
        return TypeError(absl::StrCat("macro '", st.name,
                                      "' called after the scope that defined it ended"));
      }
      if (call_depth_ >= limits_.max_call_depth) {
        return absl::ResourceExhaustedError(absl::StrCat("macro '", st.name, "': calls nested deeper than ",
                                                         limits_.max_call_depth));
      }
      if (a.positional.size() > st.params.size()) {
        return TypeError(absl::StrCat("macro '", st.name, "' takes not more than ", st.params.size(),
                                      " argument(s)"));
      }
      Frame scope(defined_in);
      std::vector<bool> bound(st.params.size(), false);
      for (size_t i = 0; i < a.positional.size(); ++i) {
        scope.Set(st.params[i], a.positional[i]);
        bound[i] = true;
      }
      for (const auto& [k, v] : a.keyword) {
        size_t i = 0;
        while (i < st.params.size() && st.params[i] != k) ++i;
        if (i == st.params.size()) {
          return TypeError(absl::StrCat("macro '", st.name, "' takes no keyword argument '", k, "'"));
        }
        scope.Set(k, v);
        bound[i] = true;
      }
      for (size_t i = 0; i < st.params.size(); ++i) {
        if (bound[i]) continue;
        if (st.defaults[i] != nullptr) {
          ASSIGN_OR_RETURN(Value d, Eval(*st.defaults[i], &scope));
          scope.Set(st.params[i], std::move(d));
        } else {
          scope.Set(st.params[i], Value::Undefined(absl::StrCat("parameter '", st.params[i],
                                                                "' was not provided")));
        }
      }
      std::string out;
      ++call_depth_;
      absl::Status s = Exec(st.body, &scope, &out);
      --call_depth_;
      flow_ = Flow::kNormal;
      RETURN_IF_ERROR(s);
      return Value::String(std::move(out));
    });
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first, Frame* frame) {
    CallArgs args;
    const size_t num_kw = e.kwnames.size();
    const size_t num_pos = e.args.size() - first - num_kw;
    for (size_t i = 0; i < num_pos; ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[first + i], frame));
      args.positional.push_back(std::move(v));
    }
    for (size_t i = 0; i < num_kw; ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[first + num_pos + i], frame));
      args.keyword.emplace_back(e.kwnames[i], std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> Eval(const Expr& e, Frame* frame) {
    RETURN_IF_ERROR(Step(e.line));
    absl::StatusOr<Value> v = EvalInner(e, frame);
    if (!v.ok()) return AtLine(v.status(), e.line);
    return v;
  }

  absl::StatusOr<Value> EvalInner(const Expr& e, Frame* frame) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        const Value* v = frame->Lookup(e.name);
        if (v == nullptr) return Value::Undefined(absl::StrCat("'", e.name, "' is undefined"));
        return *v;
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const ExprPtr& a : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*a, frame));
          items.push_back(std::move(v));
        }
        return e.kind == Expr::Kind::kTuple ? Value::Tuple(std::move(items))
                                            : Value::List(std::move(items));
      }
      case Expr::Kind::kDict: {
        Value d = Value::Dict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.args[i], frame));
          ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1], frame));
          if (!k.is_string()) {
            return absl::UnimplementedError(absl::StrCat("dict keys must be strings here, got ", k.TypeName()));
          }
          d.dict().Set(k.as_string(), std::move(v));
        }
        return d;
      }
      case Expr::Kind::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
        return GetAttr(obj, e.name);
      }
      case Expr::Kind::kItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[1], frame));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
        Value parts[3];
        for (int k = 0; k < 3; ++k) {
          if (e.args[k + 1] != nullptr) {
            ASSIGN_OR_RETURN(parts[k], Eval(*e.args[k + 1], frame));
          }
        }
        return Slice(obj, parts[0], parts[1], parts[2]);
      }
      case Expr::Kind::kCall: {
        ASSIGN_OR_RETURN(Value callee, Eval(*e.args[0], frame));
        if (callee.is_undefined()) return UndefinedError(callee);
        if (!callee.is_function()) {
          return TypeError(absl::StrCat("'", callee.TypeName(), "' object is not callable"));
        }
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, frame));
        return callee.function()(args);
      }
      case Expr::Kind::kFilter: {
        ASSIGN_OR_RETURN(Value operand, Eval(*e.args[0], frame));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, frame));
        return ApplyFilter(e.name, operand, args);
      }
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value operand, Eval(*e.args[0], frame));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, frame));
        ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, operand, args));
        return Value::Bool(r != e.negated);
      }
      case Expr::Kind::kUnary: {
        ASSIGN_OR_RETURN(Value x, Eval(*e.args[0], frame));
        if (e.name == "not") return Value::Bool(!x.Truthy());
        if (x.is_undefined()) return UndefinedError(x);
        if (!x.is_number()) {
          return TypeError(absl::StrCat("bad operand type for unary ", e.name, ": '", x.TypeName(), "'"));
        }
        if (e.name == "+") return x.is_float() ? x : Value::Int(x.as_int());
        if (x.is_float()) return Value::Float(-x.as_double());
        int64_t r = 0;
        if (__builtin_sub_overflow(int64_t{0}, x.as_int(), &r)) return IntegerOverflow(absl::StrCat("integer ", e.name));
        return Value::Int(r);
      }
      case Expr::Kind::kBinary: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], frame));
        ASSIGN_OR_RETURN(Value b, Eval(*e.args[1], frame));
        const std::string& op = e.name;
        if (op == "~") {
          std::string left = a.Str(), right = b.Str();
          if (left.size() + right.size() > kMaxConcatBytes) {
            return absl::ResourceExhaustedError(absl::StrCat("a string of more than ", kMaxConcatBytes, " bytes"));
          }
          return Value::String(left + right);
        }
        if (op == "==") return Value::Bool(a.Equals(b));
        if (op == "!=") return Value::Bool(!a.Equals(b));
        if (op == "in" || op == "not in") {
          ASSIGN_OR_RETURN(bool in, Contains(b, a));
          return Value::Bool(in == (op == "in"));
        }
        if (op == "<" || op == ">" || op == "<=" || op == ">=") {
          if (a.is_undefined()) return UndefinedError(a);
          if (b.is_undefined()) return UndefinedError(b);
          // a > b is b < a; a <= b is not b < a; a >= b is not a < b.
          const bool swap = op == ">" || op == "<=";
          ASSIGN_OR_RETURN(bool less, swap ? b.Less(a) : a.Less(b));
          return Value::Bool(op == "<" || op == ">" ? less : !less);
        }
        return Arithmetic(op, a, b);
      }
      case Expr::Kind::kAnd: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], frame));
        if (!a.Truthy()) return a;
        return Eval(*e.args[1], frame);
      }
      case Expr::Kind::kOr: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], frame));
        if (a.Truthy()) return a;
        return Eval(*e.args[1], frame);
      }
      case Expr::Kind::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.args[0], frame));
        if (c.Truthy()) return Eval(*e.args[1], frame);
        if (e.args[2] == nullptr) return Value::Undefined("the conditional expression has no else");
        return Eval(*e.args[2], frame);
      }
    }
    return absl::InternalError("unknown expression");
  }

  RenderLimits limits_;
  BuildBudget built_;
  Flow flow_ = Flow::kNormal;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  std::unordered_map<ValueDict*, Value> assigned_namespaces_;
};

}  // namespace

Template::Template(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;
Template::~Template() = default;

absl::StatusOr<Template> Template::Parse(absl::string_view source, TemplateOptions options) {
  auto impl = std::make_unique<Impl>();
  ASSIGN_OR_RETURN(impl->body, ParseTemplate(source, options));
  return Template(std::move(impl));
}

absl::StatusOr<std::string> Template::Render(const Value& globals, RenderLimits limits) const {
  Frame builtins(nullptr);
  const Value globals_builtin = BuiltinGlobals();
  for (const auto& [k, v] : globals_builtin.dict().items) builtins.Set(k, v);
  Frame context(&builtins);
  if (globals.is_dict()) {
    for (const auto& [k, v] : globals.dict().items) context.Set(k, v);
  }
  Frame root(&context);
  Renderer renderer(limits);
  BuildBudgetScope budget(renderer.built());
  std::string out;
  RETURN_IF_ERROR(renderer.Exec(impl_->body, &root, &out));
  if (renderer.built()->spent) {
    return absl::ResourceExhaustedError(absl::StrCat("chat template: rendering built more than ",
                                                     limits.max_built_bytes, " bytes of strings and lists"));
  }
  return out;
}

}  // namespace tandem::jinja
