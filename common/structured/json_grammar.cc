#include "common/structured/json_grammar.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>

#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/json.h"
#include "common/structured/grammar_node.h"

namespace tandem {

using Json = nlohmann::ordered_json;

namespace {

// Nodes every grammar has.
constexpr int kAnyNode = 0;        // any JSON value
constexpr int kAnyObjectNode = 1;  // any object
constexpr int kAnyArrayNode = 2;   // any array
constexpr int kFreeStringNode = 3; // any string
constexpr int kTrueText = 0, kFalseText = 1, kNullText = 2;

constexpr int kMaxProperties = 64;   // a bit each in a frame
constexpr int kMaxNodes = 100000;
constexpr int kMaxNumberBytes = 64;  // a number runs no longer than this
constexpr int kMaxUnionDepth = 32;   // unions within unions before a byte is taken
constexpr int kMaxNesting = 128;     // objects and arrays within each other in a reply
constexpr int kMaxCompileDepth = 512;  // schemas within schemas, $refs followed included
constexpr size_t kMaxLiterals = 1024;  // values of an enum, choices
constexpr int kMaxRegexStates = 200000;  // over all of a schema's patterns

bool IsWs(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
bool IsHex(uint8_t c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
// May stand as it is inside a JSON string.
bool IsPlain(uint8_t c) { return c >= 0x20 && c != '"' && c != '\\'; }

}  // namespace

// ---------------------------------------------------------------------------
// Schema compilation.

class SchemaCompiler {
 public:
  SchemaCompiler(JsonGrammar* g, const Json& root) : g_(g), root_(root) {}

  absl::StatusOr<int> Compile(const Json& s, const std::string& path) {
    struct Depth {
      int* d;
      explicit Depth(int* x) : d(x) { ++*d; }
      ~Depth() { --*d; }
    } depth(&depth_);
    if (depth_ > kMaxCompileDepth) {
      return Bad(path, absl::StrCat("the schema nests deeper than ", kMaxCompileDepth,
                                    " ($ref chains included)"));
    }
    if (g_->nodes_.size() > kMaxNodes) {
      return absl::InvalidArgumentError(absl::StrCat("the JSON schema is too large (over ", kMaxNodes, " nodes)"));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return kAnyNode;
      return Bad(path, "the schema `false` matches nothing");
    }
    if (!s.is_object()) return Bad(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      static const char* kKnown[] = {
          "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
          "minLength", "maxLength", "pattern", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
          "definitions", "title", "description", "default", "examples", "format", "$schema", "$id",
          "$comment", "deprecated", "readOnly", "writeOnly"};
      if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
        return Bad(path, absl::StrCat("the keyword \"", key, "\" is not supported"));
      }
    }
    if (s.contains("$ref")) return Ref(s["$ref"], path);
    if (s.contains("allOf")) {
      const Json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) return Bad(path, "allOf is supported with one schema only");
      return Compile(all[0], path + "/allOf/0");
    }
    if (s.contains("const")) return Literals({s["const"]});
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) return Bad(path, "enum must be a non-empty list");
      return Literals(std::vector<Json>(s["enum"].begin(), s["enum"].end()));
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const Json& list = s[key];
      if (!list.is_array() || list.empty()) return Bad(path, absl::StrCat(key, " must be a non-empty list"));
      JsonGrammar::Node u;
      u.kind = JsonGrammar::Node::kUnion;
      for (size_t i = 0; i < list.size(); ++i) {
        auto alt = Compile(list[i], absl::StrCat(path, "/", key, "/", i));
        if (!alt.ok()) return alt.status();
        u.alternatives.push_back(*alt);
      }
      return Add(std::move(u));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& one : t) {
          if (!one.is_string()) return Bad(path, "type must be a string or a list of strings");
          types.push_back(one.get<std::string>());
        }
      } else {
        return Bad(path, "type must be a string or a list of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items")) {
      types.push_back("array");
    } else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else {
      return kAnyNode;
    }
    if (types.size() == 1) return Typed(s, types[0], path);
    JsonGrammar::Node u;
    u.kind = JsonGrammar::Node::kUnion;
    for (const std::string& t : types) {
      auto alt = Typed(s, t, path);
      if (!alt.ok()) return alt.status();
      u.alternatives.push_back(*alt);
    }
    return Add(std::move(u));
  }

  int AddText(std::string text) {
    g_->texts_.push_back(std::move(text));
    return static_cast<int>(g_->texts_.size()) - 1;
  }

 private:
  static absl::Status Bad(const std::string& path, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("JSON schema at ", path.empty() ? "#" : "#" + path, ": ", what));
  }

  int Add(JsonGrammar::Node n) {
    g_->nodes_.push_back(std::move(n));
    return static_cast<int>(g_->nodes_.size()) - 1;
  }

  absl::StatusOr<int> Literals(const std::vector<Json>& values) {
    if (values.size() > kMaxLiterals) {
      return absl::InvalidArgumentError(absl::StrCat("an enum has ", values.size(), " values; the limit is ",
                                                     kMaxLiterals));
    }
    JsonGrammar::Node n;
    n.kind = JsonGrammar::Node::kLiteral;
    for (const Json& v : values) n.alternatives.push_back(AddText(v.dump()));
    return Add(std::move(n));
  }

  absl::StatusOr<int> Ref(const Json& ref, const std::string& path) {
    if (!ref.is_string()) return Bad(path, "$ref must be a string");
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    const Json* target = nullptr;
    if (r == "#") {
      target = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        const std::string section = p.substr(2, p.size() - 3);
        if (r.compare(0, p.size(), p) == 0 && root_.contains(section) && root_[section].is_object() &&
            root_[section].contains(r.substr(p.size()))) {
          target = &root_[section][r.substr(p.size())];
        }
      }
    }
    if (target == nullptr) return Bad(path, absl::StrCat("$ref \"", r, "\" names no schema of #/$defs or #/definitions"));
    // A placeholder first, so that a schema that refers to itself ends.
    JsonGrammar::Node placeholder;
    placeholder.kind = JsonGrammar::Node::kUnion;
    const int at = Add(std::move(placeholder));
    refs_[r] = at;
    auto inner = Compile(*target, r.substr(1));
    if (!inner.ok()) return inner.status();
    g_->nodes_[at].alternatives = {*inner};
    return at;
  }

  absl::StatusOr<int> Typed(const Json& s, const std::string& type, const std::string& path) {
    JsonGrammar::Node n;
    auto count = [&](const char* key, int* out) -> absl::Status {
      if (!s.contains(key)) return absl::OkStatus();
      if (!s[key].is_number_unsigned() || s[key].get<uint64_t>() > (1u << 30)) {
        return Bad(path, absl::StrCat(key, " must be a non-negative integer"));
      }
      *out = static_cast<int>(s[key].get<uint64_t>());
      return absl::OkStatus();
    };
    if (type == "object") {
      n.kind = JsonGrammar::Node::kObject;
      if (s.contains("properties")) {
        const Json& props = s["properties"];
        if (!props.is_object()) return Bad(path, "properties must be an object");
        if (props.size() > kMaxProperties) {
          return Bad(path, absl::StrCat("an object may have at most ", kMaxProperties, " properties"));
        }
        for (const auto& [key, value] : props.items()) {
          auto v = Compile(value, absl::StrCat(path, "/properties/", key));
          if (!v.ok()) return v.status();
          n.properties.emplace_back(AddText(Json(key).dump()), *v);
        }
      }
      if (s.contains("required")) {
        if (!s["required"].is_array()) return Bad(path, "required must be a list of property names");
        for (const Json& name : s["required"]) {
          bool found = false;
          for (size_t i = 0; i < n.properties.size(); ++i) {
            if (name.is_string() && g_->texts_[n.properties[i].first] == Json(name).dump()) {
              n.required |= uint64_t{1} << i;
              found = true;
            }
          }
          if (!found) return Bad(path, absl::StrCat("required names ", name.dump(), ", which is not in properties"));
        }
      }
      if (s.contains("additionalProperties")) {
        const Json& extra = s["additionalProperties"];
        if (!(extra.is_boolean() && !extra.get<bool>())) {
          auto v = Compile(extra, path + "/additionalProperties");
          if (!v.ok()) return v.status();
          n.additional = *v;
        }
      } else if (n.properties.empty()) {
        n.additional = kAnyNode;  // {"type": "object"}: any object
      }
    } else if (type == "array") {
      n.kind = JsonGrammar::Node::kArray;
      n.items = kAnyNode;
      if (s.contains("items")) {
        auto v = Compile(s["items"], path + "/items");
        if (!v.ok()) return v.status();
        n.items = *v;
      }
      if (auto st = count("minItems", &n.min_items); !st.ok()) return st;
      if (auto st = count("maxItems", &n.max_items); !st.ok()) return st;
      if (n.max_items >= 0 && n.max_items < n.min_items) return Bad(path, "maxItems is below minItems");
    } else if (type == "string") {
      n.kind = JsonGrammar::Node::kString;
      if (auto st = count("minLength", &n.min_length); !st.ok()) return st;
      if (auto st = count("maxLength", &n.max_length); !st.ok()) return st;
      if (n.max_length >= 0 && n.max_length < n.min_length) return Bad(path, "maxLength is below minLength");
      if (s.contains("pattern")) {
        if (!s["pattern"].is_string()) return Bad(path, "pattern must be a string");
        auto re = ByteRegex::Compile(s["pattern"].get<std::string>());
        if (!re.ok()) return Bad(path + "/pattern", std::string(re.status().message()));
        regex_states_ += re->num_states();
        if (regex_states_ > kMaxRegexStates) {
          return Bad(path + "/pattern", absl::StrCat("the schema's patterns need more than ", kMaxRegexStates,
                                                     " automaton states in all"));
        }
        g_->regexes_.push_back(*std::move(re));
        n.regex = static_cast<int>(g_->regexes_.size()) - 1;
      }
    } else if (type == "number") {
      n.kind = JsonGrammar::Node::kNumber;
    } else if (type == "integer") {
      n.kind = JsonGrammar::Node::kInteger;
    } else if (type == "boolean") {
      n.kind = JsonGrammar::Node::kBoolean;
    } else if (type == "null") {
      n.kind = JsonGrammar::Node::kNull;
    } else {
      return Bad(path, absl::StrCat("type \"", type, "\" is not a JSON schema type"));
    }
    return Add(std::move(n));
  }


 public:
  // INVALID_ARGUMENT, naming the $refs that never end, when no JSON value
  // satisfies the schema at `root`.
  absl::Status CheckProductive(int root) const {
    const std::vector<bool> productive = ProductiveNodes(g_->nodes_);
    if (productive[root]) return absl::OkStatus();
    std::vector<std::string> cycles;
    for (const auto& [ref, node] : refs_) {
      if (!productive[node]) cycles.push_back(absl::StrCat("\"", ref, "\""));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "the JSON schema matches no value: ",
        cycles.empty() ? std::string("it requires itself")
                       : absl::StrCat("$ref ", absl::StrJoin(cycles, ", "),
                                      " only ever lead(s) back to itself (recursion with no way out)")));
  }

 private:
  JsonGrammar* g_;
  const Json& root_;
  std::map<std::string, int> refs_;
  int depth_ = 0;
  int regex_states_ = 0;
};

JsonGrammar::JsonGrammar() {
  Node any;  // kAnyNode
  nodes_.push_back(any);
  Node object;  // kAnyObjectNode
  object.kind = Node::kObject;
  object.additional = kAnyNode;
  nodes_.push_back(object);
  Node array;  // kAnyArrayNode
  array.kind = Node::kArray;
  array.items = kAnyNode;
  nodes_.push_back(array);
  Node string;  // kFreeStringNode
  string.kind = Node::kString;
  nodes_.push_back(string);
  texts_ = {"true", "false", "null"};
}

std::vector<bool> ProductiveNodes(const std::vector<JsonGrammar::Node>& nodes) {
  using Node = JsonGrammar::Node;
  std::vector<bool> productive(nodes.size(), false);
  // Least fixpoint: a node is productive once what it needs is.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (productive[i]) continue;
      const Node& n = nodes[i];
      bool p = false;
      switch (n.kind) {
        case Node::kUnion:
          for (int a : n.alternatives) p = p || productive[a];
          break;
        case Node::kLiteral:
          p = !n.alternatives.empty();
          break;
        case Node::kSequence:
          p = true;
          for (int a : n.alternatives) p = p && productive[a];
          break;
        case Node::kArray:
        case Node::kRepeat:
          p = n.min_items == 0 || productive[n.items];
          break;
        case Node::kObject:
          p = true;  // the required properties' values; the others may be left out
          for (size_t k = 0; k < n.properties.size() && k < 64; ++k) {
            if ((n.required >> k) & 1) p = p && productive[n.properties[k].second];
          }
          break;
        default:  // strings, numbers, booleans, null, any, a one-character regex
          p = true;
      }
      if (p) {
        productive[i] = true;
        changed = true;
      }
    }
  }
  return productive;
}

absl::StatusOr<std::shared_ptr<const JsonGrammar>> JsonGrammar::FromSchema(const std::string& schema_json) {
  const Json schema = ParseJsonBounded(schema_json);
  if (schema.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the JSON schema is not JSON (or nests deeper than ", kMaxJsonDepth, ")"));
  }
  std::shared_ptr<JsonGrammar> g(new JsonGrammar());
  g->schema_ = schema_json;
  SchemaCompiler compiler(g.get(), schema);
  auto root = compiler.Compile(schema, "");
  if (!root.ok()) return root.status();
  g->root_ = *root;
  if (absl::Status s = compiler.CheckProductive(*root); !s.ok()) return s;
  return std::shared_ptr<const JsonGrammar>(std::move(g));
}

absl::StatusOr<std::shared_ptr<const JsonGrammar>> JsonGrammar::FromChoices(std::vector<std::string> choices) {
  if (choices.empty()) return absl::InvalidArgumentError("choice must be a non-empty list of strings");
  if (choices.size() > kMaxLiterals) {
    return absl::InvalidArgumentError(absl::StrCat("choice has ", choices.size(), " strings; the limit is ",
                                                   kMaxLiterals));
  }
  std::shared_ptr<JsonGrammar> g(new JsonGrammar());
  Node n;
  n.kind = Node::kLiteral;
  n.exact = true;
  for (const std::string& c : choices) {
    if (c.empty()) return absl::InvalidArgumentError("choice: a choice is empty");
    g->texts_.push_back(c);
    n.alternatives.push_back(static_cast<int>(g->texts_.size()) - 1);
  }
  g->nodes_.push_back(std::move(n));
  g->root_ = static_cast<int>(g->nodes_.size()) - 1;
  g->choices_ = std::move(choices);
  return std::shared_ptr<const JsonGrammar>(std::move(g));
}

absl::StatusOr<std::shared_ptr<const JsonGrammar>> JsonGrammar::FromRegex(const std::string& pattern) {
  auto re = ByteRegex::Compile(pattern);
  if (!re.ok()) return re.status();
  std::shared_ptr<JsonGrammar> g(new JsonGrammar());
  g->regexes_.push_back(*std::move(re));
  Node n;
  n.kind = Node::kRegex;
  n.exact = true;
  n.regex = 0;
  g->nodes_.push_back(std::move(n));
  g->root_ = static_cast<int>(g->nodes_.size()) - 1;
  g->regex_ = pattern;
  return std::shared_ptr<const JsonGrammar>(std::move(g));
}

// ---------------------------------------------------------------------------
// Matching.

namespace {

enum FrameKind : uint8_t {
  kValue, kObjectFrame, kArrayFrame, kStringFrame, kNumberFrame, kLitFrame, kRegexFrame,
  kSeqFrame,     // a grammar's sequence: element `a` runs above it, or (on top) comes next
  kRepeatFrame,  // a grammar's repetition: `a` repetitions whole
};

// Object phases
enum : uint8_t { kObjStart, kObjNeedKey, kObjInKey, kObjColon, kObjInValue, kObjAfterValue };
// Array phases
enum : uint8_t { kArrStart, kArrInValue, kArrAfterValue, kArrNeedValue };
// Number phases (JSON's number grammar); kNumStart before the first byte
enum : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };
// String phases: normal, after a backslash, then 4..1 hex digits to go
enum : uint8_t { kStrNormal, kStrEscape, kStrHex1, kStrHex2, kStrHex3, kStrHex4 };

struct Frame {
  uint8_t kind = kValue;
  uint8_t phase = 0;
  int32_t node = 0;  // kValue, object, array, string: the schema node; kLit: the text
  int32_t a = 0;     // object: the key's property (-1 another key); array: items; string:
                     // characters; number: bytes; literal: position; regex: its state;
                     // sequence: its element; repetition: the count (capped at min_items
                     // when unbounded: more changes nothing)
  uint64_t seen = 0; // object: properties seen (bit i); string with a pattern: its state

  bool operator==(const Frame& o) const {
    return kind == o.kind && phase == o.phase && node == o.node && a == o.a && seen == o.seen;
  }
  bool operator<(const Frame& o) const {
    return std::tie(kind, phase, node, a, seen) < std::tie(o.kind, o.phase, o.node, o.a, o.seen);
  }
  template <typename H>
  friend H AbslHashValue(H h, const Frame& f) {
    return H::combine(std::move(h), f.kind, f.phase, f.node, f.a, f.seen);
  }
};

struct Thread {
  std::vector<Frame> stack;  // empty: the value is whole
  int32_t ws = 0;            // whitespace bytes in a row

  bool operator==(const Thread& o) const { return ws == o.ws && stack == o.stack; }
  bool operator<(const Thread& o) const {
    return std::tie(ws, stack) < std::tie(o.ws, o.stack);
  }
  template <typename H>
  friend H AbslHashValue(H h, const Thread& t) {
    return H::combine(std::move(h), t.ws, t.stack);
  }
};

bool NumberAccepts(uint8_t phase) { return phase == kNumZero || phase == kNumInt || phase == kNumFrac || phase == kNumExp; }

// A grammar's limits while matching: frames on one alternative's stack
// (nesting that is not at a rule's end: "(" expr ")"; recursion at the end
// replaces its frame), and Feed calls for one byte over all alternatives (an
// ambiguous grammar's ways of starting can multiply: r0 ::= r1 | r1, r1 ::=
// r2 | r2, ...); past either, the alternative ends, so a hostile grammar costs
// bounded work a byte, and FillMask and Accept still agree.
constexpr size_t kMaxGrammarStack = 1024;
constexpr int64_t kMaxGrammarFeeds = 1 << 16;
// Nesting of kValue frames entered without a byte taken for a grammar (its
// left recursion is refused at compile time, so this bounds nothing a
// grammar can reach) against kMaxUnionDepth for a schema's unions.
constexpr int kMaxGrammarDepth = 1 << 20;

class Stepper {
 public:
  Stepper(const std::vector<JsonGrammar::Node>& nodes, const std::vector<std::string>& texts,
          const std::vector<ByteRegex>& regexes, bool grammar)
      : nodes_(nodes), texts_(texts), regexes_(regexes), grammar_(grammar),
        max_depth_(grammar ? kMaxGrammarDepth : kMaxUnionDepth) {}

  // Before each byte: a grammar's Feed calls for it start again.
  void NewByte() const { feeds_ = 0; }

  // The threads `t` becomes after byte `c` (none: `c` cannot come).
  // `depth` counts unions entered without a byte taken: a schema whose
  // alternatives lead back to themselves ($ref "#" in an anyOf) stops there.
  void Feed(Thread t, uint8_t c, std::vector<Thread>* out, int depth = 0) const {
    if (t.stack.empty()) return;  // the value is whole: nothing may follow
    if (grammar_ && (++feeds_ > kMaxGrammarFeeds || t.stack.size() > kMaxGrammarStack)) return;
    Frame& f = t.stack.back();
    switch (f.kind) {
      case kSeqFrame: {
        // Element a starts: on top of the sequence, or in its place when it
        // is the last (the sequence would end with it).
        const JsonGrammar::Node& n = nodes_[f.node];
        Frame e;
        e.kind = kValue;
        e.node = n.alternatives[f.a];
        if (static_cast<size_t>(f.a) + 1 == n.alternatives.size()) {
          f = e;
        } else {
          t.stack.push_back(e);
        }
        return Feed(std::move(t), c, out, depth + 1);
      }
      case kRepeatFrame: {
        const JsonGrammar::Node& n = nodes_[f.node];
        if (f.a >= n.min_items) {  // it may end here: the byte goes to what follows
          Thread done = t;
          Complete(&done);
          Feed(std::move(done), c, out, depth + 1);
        }
        if (n.max_items < 0 || f.a < n.max_items) {  // another repetition
          Frame e;
          e.kind = kValue;
          e.node = n.items;
          if (n.max_items >= 0 && f.a + 1 == n.max_items) {
            t.stack.back() = e;
          } else {
            t.stack.push_back(e);
          }
          Feed(std::move(t), c, out, depth + 1);
        }
        return;
      }
      case kValue: return FeedValue(std::move(t), c, out, depth);
      case kObjectFrame: return FeedObject(std::move(t), c, out);
      case kArrayFrame: return FeedArray(std::move(t), c, out);
      case kStringFrame: return FeedString(std::move(t), c, out);
      case kNumberFrame: return FeedNumber(std::move(t), c, out);
      case kRegexFrame: {
        // The reply's regex: each state the byte leads to; the accepting one
        // ends the reply (it has no moves).
        const ByteRegex& re = regexes_[nodes_[f.node].regex];
        const int32_t s = re.Step(f.a, c);
        if (s < 0) return;
        if (re.Accepting(s)) {
          Thread done = t;
          Complete(&done);
          out->push_back(std::move(done));
        }
        if (re.Live(s)) {
          t.stack.back().a = s;
          out->push_back(std::move(t));
        }
        return;
      }
      case kLitFrame: {
        const std::string& text = texts_[f.node];
        if (static_cast<size_t>(f.a) >= text.size() || static_cast<uint8_t>(text[f.a]) != c) return;
        ++f.a;
        t.ws = 0;
        if (static_cast<size_t>(f.a) == text.size()) Complete(&t);
        out->push_back(std::move(t));
        return;
      }
    }
  }

  // Whitespace between tokens, bounded.
  static bool Whitespace(Thread* t, uint8_t c) {
    if (!IsWs(c) || t->ws >= kMaxWhitespace) return false;
    ++t->ws;
    return true;
  }

 private:
  // The top frame's value is whole: pop it and tell its parent (a
  // grammar's sequence or repetition that this ends is whole in turn).
  void Complete(Thread* t) const {
    while (true) {
      t->stack.pop_back();
      if (t->stack.empty()) return;
      Frame& p = t->stack.back();
      if (p.kind == kObjectFrame) {
        p.phase = p.phase == kObjInKey ? kObjColon : kObjAfterValue;
      } else if (p.kind == kArrayFrame) {
        p.phase = kArrAfterValue;
        ++p.a;
      } else if (p.kind == kSeqFrame) {
        if (static_cast<size_t>(++p.a) == nodes_[p.node].alternatives.size()) continue;
      } else if (p.kind == kRepeatFrame) {
        const JsonGrammar::Node& n = nodes_[p.node];
        ++p.a;
        if (n.max_items >= 0 && p.a >= n.max_items) continue;
        if (n.max_items < 0) p.a = std::min(p.a, n.min_items);
      }
      return;
    }
  }

  void FeedValue(Thread t, uint8_t c, std::vector<Thread>* out, int depth) const {
    if (depth > max_depth_) return;
    const int node = t.stack.back().node;
    const JsonGrammar::Node& n = nodes_[node];
    if (!n.exact && Whitespace(&t, c)) return out->push_back(std::move(t));
    auto become = [&](Frame f) {
      Thread next = t;
      next.stack.back() = f;
      Feed(std::move(next), c, out, depth + 1);
    };
    auto literal = [&](int text) {
      Frame f;
      f.kind = kLitFrame;
      f.node = text;
      become(f);
    };
    switch (n.kind) {
      case JsonGrammar::Node::kAny:
        if (c == '{') return Open(std::move(t), kObjectFrame, kAnyObjectNode, out);
        if (c == '[') return Open(std::move(t), kArrayFrame, kAnyArrayNode, out);
        if (c == '"') return Open(std::move(t), kStringFrame, kFreeStringNode, out);
        if (c == '-' || IsDigit(c)) return become(Number(0));
        if (c == 't') return literal(kTrueText);
        if (c == 'f') return literal(kFalseText);
        if (c == 'n') return literal(kNullText);
        return;
      case JsonGrammar::Node::kObject:
        if (c == '{') Open(std::move(t), kObjectFrame, node, out);
        return;
      case JsonGrammar::Node::kArray:
        if (c == '[') Open(std::move(t), kArrayFrame, node, out);
        return;
      case JsonGrammar::Node::kString:
        if (c != '"') return;
        return Open(std::move(t), kStringFrame, node, out, n.regex < 0 ? 0 : regexes_[n.regex].start());
      case JsonGrammar::Node::kRegex: {
        Frame f;
        f.kind = kRegexFrame;
        f.node = node;
        f.a = regexes_[n.regex].start();
        return become(f);
      }
      case JsonGrammar::Node::kNumber:
      case JsonGrammar::Node::kInteger:
        if (c == '-' || IsDigit(c)) become(Number(n.kind == JsonGrammar::Node::kInteger));
        return;
      case JsonGrammar::Node::kBoolean:
        if (c == 't') literal(kTrueText);
        if (c == 'f') literal(kFalseText);
        return;
      case JsonGrammar::Node::kNull:
        if (c == 'n') literal(kNullText);
        return;
      case JsonGrammar::Node::kUnion:
        for (int alt : n.alternatives) {
          Frame f;
          f.kind = kValue;
          f.node = alt;
          become(f);
        }
        return;
      case JsonGrammar::Node::kLiteral:
        for (int text : n.alternatives) literal(text);
        return;
      case JsonGrammar::Node::kSequence: {
        if (n.alternatives.empty()) {  // the empty text: the byte goes to what follows
          Complete(&t);
          return Feed(std::move(t), c, out, depth + 1);
        }
        Frame f;
        f.kind = kSeqFrame;
        f.node = node;
        t.stack.back() = f;
        return Feed(std::move(t), c, out, depth + 1);
      }
      case JsonGrammar::Node::kRepeat: {
        Frame f;
        f.kind = kRepeatFrame;
        f.node = node;
        t.stack.back() = f;
        return Feed(std::move(t), c, out, depth + 1);
      }
    }
  }

  static Frame Number(bool integer) {
    Frame f;
    f.kind = kNumberFrame;
    f.phase = kNumStart;
    f.node = integer ? 1 : 0;
    return f;
  }

  // The first byte of an object, array or string (already checked);
  // `seen`: a patterned string's first state.
  static void Open(Thread t, uint8_t kind, int node, std::vector<Thread>* out, uint64_t seen = 0) {
    if (kind != kStringFrame && t.stack.size() > kMaxNesting) return;
    Frame f;
    f.kind = kind;
    f.node = node;
    f.seen = seen;
    t.stack.back() = f;
    t.ws = 0;
    out->push_back(std::move(t));
  }

  void FeedNumber(Thread t, uint8_t c, std::vector<Thread>* out) const {
    Frame& f = t.stack.back();
    const bool integer = f.node == 1;
    uint8_t next = 0xff;
    switch (f.phase) {
      case kNumStart: next = c == '-' ? kNumMinus : c == '0' ? kNumZero : IsDigit(c) ? kNumInt : 0xff; break;
      case kNumMinus: next = c == '0' ? kNumZero : IsDigit(c) ? kNumInt : 0xff; break;
      case kNumZero:
      case kNumInt:
        if (f.phase == kNumInt && IsDigit(c)) next = kNumInt;
        else if (!integer && c == '.') next = kNumDot;
        else if (!integer && (c == 'e' || c == 'E')) next = kNumE;
        break;
      case kNumDot: next = IsDigit(c) ? kNumFrac : 0xff; break;
      case kNumFrac:
        if (IsDigit(c)) next = kNumFrac;
        else if (c == 'e' || c == 'E') next = kNumE;
        break;
      case kNumE: next = (c == '+' || c == '-') ? kNumESign : IsDigit(c) ? kNumExp : 0xff; break;
      case kNumESign:
      case kNumExp: next = IsDigit(c) ? kNumExp : 0xff; break;
    }
    if (next != 0xff) {
      if (++f.a > kMaxNumberBytes) return;
      f.phase = next;
      t.ws = 0;
      return out->push_back(std::move(t));
    }
    // Not part of the number: it ends here if it may, and the byte goes on.
    if (!NumberAccepts(f.phase)) return;
    Complete(&t);
    Feed(std::move(t), c, out);
  }

  void FeedString(Thread t, uint8_t c, std::vector<Thread>* out) const {
    Frame& f = t.stack.back();
    const JsonGrammar::Node& n = nodes_[f.node];
    t.ws = 0;
    if (n.regex >= 0) {  // its text matches the pattern: plain bytes only
      const ByteRegex& re = regexes_[n.regex];
      const int32_t state = static_cast<int32_t>(f.seen);
      if (c == '"') {
        if (f.a < n.min_length || !re.Accepting(state)) return;
        Complete(&t);
        return out->push_back(std::move(t));
      }
      if (!IsPlain(c)) return;
      if ((c & 0xC0) != 0x80) {
        if (n.max_length >= 0 && f.a >= n.max_length) return;
        ++f.a;
      }
      const int32_t next = re.Step(state, c);
      if (next < 0) return;
      f.seen = static_cast<uint64_t>(next);
      return out->push_back(std::move(t));
    }
    switch (f.phase) {
      case kStrNormal:
        if (c == '"') {
          if (f.a < n.min_length) return;
          Complete(&t);
          return out->push_back(std::move(t));
        }
        if (c < 0x20) return;
        if (c == '\\') {
          if (n.max_length >= 0 && f.a >= n.max_length) return;
          f.phase = kStrEscape;
          return out->push_back(std::move(t));
        }
        if ((c & 0xC0) != 0x80) {  // a character starts (UTF-8)
          if (n.max_length >= 0 && f.a >= n.max_length) return;
          ++f.a;
        }
        return out->push_back(std::move(t));
      case kStrEscape:
        if (c == 'u') {
          f.phase = kStrHex4;
        } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
                   c == 't') {
          f.phase = kStrNormal;
          ++f.a;
        } else {
          return;
        }
        return out->push_back(std::move(t));
      default:  // hex digits of \uXXXX
        if (!IsHex(c)) return;
        if (f.phase == kStrHex1) {
          f.phase = kStrNormal;
          ++f.a;
        } else {
          --f.phase;
        }
        return out->push_back(std::move(t));
    }
  }

  void FeedObject(Thread t, uint8_t c, std::vector<Thread>* out) const {
    Frame& f = t.stack.back();
    const JsonGrammar::Node& n = nodes_[f.node];
    const uint64_t all = n.properties.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.properties.size()) - 1;
    const bool more_keys = n.additional >= 0 || (f.seen & all) != all;
    switch (f.phase) {
      case kObjStart:
      case kObjNeedKey:
        if (Whitespace(&t, c)) return out->push_back(std::move(t));
        if (c == '}' && f.phase == kObjStart && (f.seen & n.required) == n.required) {
          Complete(&t);
          t.ws = 0;
          return out->push_back(std::move(t));
        }
        if (c != '"') return;
        t.ws = 0;
        for (size_t i = 0; i < n.properties.size(); ++i) {
          if (f.seen & (uint64_t{1} << i)) continue;
          Thread next = t;
          Frame& of = next.stack.back();
          of.phase = kObjInKey;
          of.a = static_cast<int32_t>(i);
          of.seen |= uint64_t{1} << i;
          Frame key;
          key.kind = kLitFrame;
          key.node = n.properties[i].first;
          key.a = 1;  // past the opening quote
          next.stack.push_back(key);
          out->push_back(std::move(next));
        }
        if (n.additional >= 0) {
          Frame& of = t.stack.back();
          of.phase = kObjInKey;
          of.a = -1;
          Frame key;
          key.kind = kStringFrame;
          key.node = kFreeStringNode;
          t.stack.push_back(key);
          out->push_back(std::move(t));
        }
        return;
      case kObjColon: {
        if (Whitespace(&t, c)) return out->push_back(std::move(t));
        if (c != ':') return;
        t.ws = 0;
        f.phase = kObjInValue;
        Frame v;
        v.kind = kValue;
        v.node = f.a >= 0 ? n.properties[f.a].second : n.additional;
        t.stack.push_back(v);
        return out->push_back(std::move(t));
      }
      case kObjAfterValue:
        if (Whitespace(&t, c)) return out->push_back(std::move(t));
        t.ws = 0;
        if (c == ',' && more_keys) {
          f.phase = kObjNeedKey;
          return out->push_back(std::move(t));
        }
        if (c == '}' && (f.seen & n.required) == n.required) {
          Complete(&t);
          return out->push_back(std::move(t));
        }
        return;
      default:
        return;  // a child frame is on top while a key or value is read
    }
  }

  void FeedArray(Thread t, uint8_t c, std::vector<Thread>* out) const {
    Frame& f = t.stack.back();
    const JsonGrammar::Node& n = nodes_[f.node];
    switch (f.phase) {
      case kArrStart:
      case kArrNeedValue: {
        if (Whitespace(&t, c)) return out->push_back(std::move(t));
        if (c == ']' && f.phase == kArrStart && n.min_items == 0) {
          Complete(&t);
          t.ws = 0;
          return out->push_back(std::move(t));
        }
        if (c == ']') return;
        f.phase = kArrInValue;
        Frame v;
        v.kind = kValue;
        v.node = n.items;
        t.stack.push_back(v);
        return Feed(std::move(t), c, out);
      }
      case kArrAfterValue:
        if (Whitespace(&t, c)) return out->push_back(std::move(t));
        t.ws = 0;
        if (c == ',' && (n.max_items < 0 || f.a < n.max_items)) {
          f.phase = kArrNeedValue;
          return out->push_back(std::move(t));
        }
        if (c == ']' && f.a >= n.min_items) {
          Complete(&t);
          return out->push_back(std::move(t));
        }
        return;
      default:
        return;
    }
  }

  const std::vector<JsonGrammar::Node>& nodes_;
  const std::vector<std::string>& texts_;
  const std::vector<ByteRegex>& regexes_;
  const bool grammar_;
  const int max_depth_;
  mutable int64_t feeds_ = 0;
};

void Dedupe(std::vector<Thread>* threads) {
  if (threads->size() < 2) return;
  std::sort(threads->begin(), threads->end());
  threads->erase(std::unique(threads->begin(), threads->end()), threads->end());
}

}  // namespace

struct GrammarMatcher::State {
  std::vector<Thread> threads;
};

namespace {

// The threads after `bytes` from `from` (empty: not allowed).
std::vector<Thread> Advance(const Stepper& s, const std::vector<Thread>& from, std::string_view bytes) {
  std::vector<Thread> cur = from, next;
  for (char ch : bytes) {
    next.clear();
    s.NewByte();
    for (const Thread& t : cur) s.Feed(t, static_cast<uint8_t>(ch), &next);
    Dedupe(&next);
    cur.swap(next);
    if (cur.empty()) break;
  }
  return cur;
}

}  // namespace

// The matcher's states (sets of threads) met while masking, each numbered
// once, with the state each byte leads to filled in as it is first needed:
// a deterministic automaton built lazily over the grammar's pushdown
// states. A mask walks the vocabulary through it, so a state met again
// (inside a string, after every character; in a run of digits) costs table
// lookups, not a thread set fed byte by byte: a GBNF grammar of any JSON
// object along a reply of SmolLM2's tokens took 25 ms a mask fed byte by
// byte (structured_benchmark, docs/benchmarks.md). At most kMaxStates
// states (1 KiB of table each); past them the bytes are followed as threads,
// and the next mask begins the table again. One of its grammar's (JsonGrammar
// owns it), so later replies start where earlier ones left it. 2,048: the
// schema of structured_benchmark's first row meets over 1,024 along one
// reply (whitespace runs, partial keys), and at 1,024 a reply after another
// masked at the speed of the first (0.127 against 0.132 ms a mask) where at
// 2,048 it takes 0.065 ms.
struct GrammarAutomaton {
  static constexpr int32_t kDead = -1, kUnknown = -2, kFull = -3;
  static constexpr size_t kMaxStates = 2048;

  int32_t Intern(const std::vector<Thread>& threads) {
    auto it = ids_.find(threads);
    if (it != ids_.end()) return it->second;
    if (states_.size() >= kMaxStates) return kFull;
    it = ids_.emplace(threads, static_cast<int32_t>(states_.size())).first;
    states_.push_back(&it->first);
    next_.resize(next_.size() + 256, kUnknown);
    return it->second;
  }

  // The state after byte c from state `id`: kDead (c cannot come), or
  // kFull (the state is new and there is no room for it).
  int32_t Step(const Stepper& s, int32_t id, uint8_t c) {
    const size_t at = static_cast<size_t>(id) * 256 + c;
    if (next_[at] != kUnknown) return next_[at];
    const char ch = static_cast<char>(c);
    const std::vector<Thread> after = Advance(s, *states_[id], std::string_view(&ch, 1));
    const int32_t next = after.empty() ? kDead : Intern(after);
    if (next != kFull) next_[at] = next;
    return next;
  }

  const std::vector<Thread>& threads(int32_t id) const { return *states_[id]; }

  // The token mask of a state FillMask made before (its tokens, EOS aside),
  // for the first kMaxMasks states masked: a state met again at a step
  // (inside a string, again and again) is a copy.
  struct Kept {
    bool any = false;              // some token is allowed
    std::vector<uint8_t> allowed;  // FillMask's, before EOS (bytes: a copy is a memcpy)
  };
  const Kept* Mask(int32_t id, int32_t limit) const {
    auto it = masks_.find(id);
    return it == masks_.end() || it->second.allowed.size() != static_cast<size_t>(limit) ? nullptr
                                                                                         : &it->second;
  }
  void KeepMask(int32_t id, const std::vector<uint8_t>& allowed, int32_t limit, bool any) {
    if (masks_.size() >= kMaxMasks || masks_.count(id) != 0) return;
    masks_.emplace(id, Kept{any, std::vector<uint8_t>(allowed.begin(), allowed.begin() + limit)});
  }

  bool full() const { return states_.size() >= kMaxStates; }
  const TokenVocabulary* vocabulary() const { return vocabulary_; }
  void Clear(const TokenVocabulary* vocabulary) {
    ids_.clear();
    states_.clear();
    next_.clear();
    masks_.clear();
    vocabulary_ = vocabulary;
  }

 private:
  static constexpr size_t kMaxMasks = 16;  // 48 KiB each for SmolLM2's 49,152 tokens

  absl::node_hash_map<std::vector<Thread>, int32_t> ids_;  // node: states_ points at its keys
  std::vector<const std::vector<Thread>*> states_;         // id -> its key in ids_
  std::vector<int32_t> next_;                        // [id][byte]
  std::map<int32_t, Kept> masks_;
  const TokenVocabulary* vocabulary_ = nullptr;      // the masks' (and so the states')
};

namespace {

// Every frame, from the top down, may end without another byte: a number
// that has its digits, a grammar's node that may match the empty text, a
// sequence whose elements still to come may, a repetition that has (or with
// the one running will have) its minimum.
bool ThreadCanEnd(const Thread& t, const std::vector<JsonGrammar::Node>& nodes) {
  for (size_t i = t.stack.size(); i-- > 0;) {
    const Frame& f = t.stack[i];
    const bool top = i + 1 == t.stack.size();
    switch (f.kind) {
      case kNumberFrame:
        if (!top || !NumberAccepts(f.phase)) return false;
        break;
      case kValue:
        if (!top || !nodes[f.node].nullable) return false;
        break;
      case kSeqFrame: {
        const JsonGrammar::Node& n = nodes[f.node];
        for (size_t e = f.a + (top ? 0 : 1); e < n.alternatives.size(); ++e) {
          if (!nodes[n.alternatives[e]].nullable) return false;
        }
        break;
      }
      case kRepeatFrame:
        if (f.a + (top ? 0 : 1) < nodes[f.node].min_items) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

// Inside a string of any length: every plain byte leaves the state as it is.
bool InFreeString(const std::vector<Thread>& threads, const std::vector<JsonGrammar::Node>& nodes) {
  for (const Thread& t : threads) {
    if (t.stack.empty()) return false;
    const Frame& f = t.stack.back();
    if (f.kind != kStringFrame || f.phase != kStrNormal) return false;
    const JsonGrammar::Node& n = nodes[f.node];
    if (n.max_length >= 0 || n.min_length > 0 || n.regex >= 0) return false;
  }
  return !threads.empty();
}

}  // namespace

JsonGrammar::~JsonGrammar() = default;  // after GrammarAutomaton's definition

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes, const std::vector<bool>& never)
    : bytes_(std::move(bytes)) {
  plain_.assign(bytes_.size(), 0);
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (bytes_[id].empty() || (id < never.size() && never[id])) continue;
    order_.push_back(static_cast<int32_t>(id));
    plain_[id] = std::all_of(bytes_[id].begin(), bytes_[id].end(),
                             [](char c) { return IsPlain(static_cast<uint8_t>(c)); });
  }
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  lcp_.assign(order_.size(), 0);
  for (size_t i = 1; i < order_.size(); ++i) {
    const std::string& p = bytes_[order_[i - 1]];
    const std::string& q = bytes_[order_[i]];
    uint32_t k = 0;
    while (k < p.size() && k < q.size() && p[k] == q[k]) ++k;
    lcp_[i] = k;
  }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const JsonGrammar> grammar)
    : grammar_(std::move(grammar)), state_(std::make_unique<State>()) {
  Thread t;
  Frame root;
  root.kind = kValue;
  root.node = grammar_->root_;
  t.stack.push_back(root);
  state_->threads.push_back(std::move(t));
  // A reply's regex that matches the empty text: it may end before any byte.
  const JsonGrammar::Node& n = grammar_->nodes_[grammar_->root_];
  if (n.kind == JsonGrammar::Node::kRegex) {
    const ByteRegex& re = grammar_->regexes_[n.regex];
    if (re.Accepting(re.start())) {
      if (!re.Live(re.start())) state_->threads.clear();  // only the empty text
      state_->threads.push_back(Thread());
      Dedupe(&state_->threads);
    }
  }
}

GrammarMatcher::~GrammarMatcher() = default;

GrammarMatcher::GrammarMatcher(const GrammarMatcher& o)
    : grammar_(o.grammar_), state_(std::make_unique<State>(*o.state_)) {}
GrammarMatcher& GrammarMatcher::operator=(const GrammarMatcher& o) {
  grammar_ = o.grammar_;
  state_ = std::make_unique<State>(*o.state_);
  return *this;
}

bool GrammarMatcher::Accept(std::string_view bytes) {
  const Stepper s(grammar_->nodes_, grammar_->texts_, grammar_->regexes_, !grammar_->grammar_.empty());
  std::vector<Thread> next = Advance(s, state_->threads, bytes);
  if (next.empty()) return false;
  state_->threads = std::move(next);
  return true;
}

bool GrammarMatcher::CanEnd() const {
  return std::any_of(state_->threads.begin(), state_->threads.end(),
                     [&](const Thread& t) { return ThreadCanEnd(t, grammar_->nodes_); });
}

bool GrammarMatcher::Done() const {
  return std::all_of(state_->threads.begin(), state_->threads.end(),
                     [](const Thread& t) { return t.stack.empty(); });
}

void GrammarMatcher::FillMask(const TokenVocabulary& vocab, const std::vector<int32_t>& eos_ids,
                              std::vector<uint8_t>* allowed) const {
  std::fill(allowed->begin(), allowed->end(), 0);
  const Stepper s(grammar_->nodes_, grammar_->texts_, grammar_->regexes_, !grammar_->grammar_.empty());
  const std::vector<Thread>& base = state_->threads;
  const int32_t limit = std::min<int32_t>(vocab.size(), static_cast<int32_t>(allowed->size()));
  bool any = false;
  // A reply's regex (one thread in it, and perhaps one already whole): the
  // tokens in byte order over its DFA's states alone, each prefix's state
  // kept for the tokens that share it.
  const Thread* in_regex = nullptr;
  bool pure_regex = !base.empty();
  for (const Thread& t : base) {
    if (t.stack.empty()) continue;
    if (t.stack.size() != 1 || t.stack[0].kind != kRegexFrame || in_regex != nullptr) pure_regex = false;
    in_regex = &t;
  }
  if (!Done() && pure_regex && in_regex != nullptr) {
    const ByteRegex& re = grammar_->regexes_[grammar_->nodes_[in_regex->stack[0].node].regex];
    std::vector<int32_t> at(1, in_regex->stack[0].a);  // at[j]: the state after j bytes
    size_t valid = 0;
    for (size_t i = 0; i < vocab.order_.size(); ++i) {
      const int32_t id = vocab.order_[i];
      const std::string& b = vocab.bytes_[id];
      size_t j = std::min<size_t>(vocab.lcp_[i], valid);
      if (at.size() < b.size() + 1) at.resize(b.size() + 1);
      for (; j < b.size() && at[j] >= 0; ++j) at[j + 1] = re.Step(at[j], static_cast<uint8_t>(b[j]));
      valid = j;  // at[0..j] hold for this token
      if (j == b.size() && at[j] >= 0 && id < limit) {
        (*allowed)[id] = 1;
        any = true;
      }
    }
  } else if (!Done()) {
    if (InFreeString(base, grammar_->nodes_)) {
      // Inside a string most tokens change nothing: only the others are
      // followed byte by byte.
      for (int32_t id : vocab.order_) {
        if (id >= limit) continue;
        if (vocab.plain_[id] || !Advance(s, base, vocab.bytes_[id]).empty()) {
          (*allowed)[id] = 1;
          any = true;
        }
      }
    } else {
      // The ids in byte order over the automaton's states: the state after
      // each prefix of the previous token is kept, so a token costs only the
      // bytes it does not share, a dead prefix rules out every token that
      // starts with it, and a byte already seen in a state is a lookup.
      MutexLock lock(&grammar_->automaton_mu_);
      if (grammar_->automaton_ == nullptr) grammar_->automaton_ = std::make_unique<GrammarAutomaton>();
      GrammarAutomaton& a = *grammar_->automaton_;
      // Full (earlier replies met other states: a schema's whitespace runs
      // and partial keys alone can make a thousand): begun again, so this
      // reply's states are kept, not followed as threads past the table.
      int32_t start = a.full() ? GrammarAutomaton::kFull : a.Intern(base);
      if (start == GrammarAutomaton::kFull || a.vocabulary() != &vocab) {
        a.Clear(&vocab);
        start = a.Intern(base);
      }
      if (const GrammarAutomaton::Kept* kept = a.Mask(start, limit)) {
        std::copy(kept->allowed.begin(), kept->allowed.end(), allowed->begin());
        any = kept->any;
      } else {
        std::vector<int32_t> at(1, start);  // at[j]: the state after j bytes
        size_t valid = 0;                   // at[0..valid] hold for the previous id
        size_t dead_at = SIZE_MAX;          // the previous id died at this byte
        for (size_t i = 0; i < vocab.order_.size(); ++i) {
          const int32_t id = vocab.order_[i];
          const std::string& b = vocab.bytes_[id];
          const size_t shared = vocab.lcp_[i];
          if (dead_at != SIZE_MAX && shared > dead_at) continue;  // starts with a dead prefix
          dead_at = SIZE_MAX;
          size_t j = std::min(shared, valid);
          if (at.size() < b.size() + 1) at.resize(b.size() + 1);
          bool alive = true;
          for (; j < b.size(); ++j) {
            const int32_t next = a.Step(s, at[j], static_cast<uint8_t>(b[j]));
            if (next == GrammarAutomaton::kDead) {
              dead_at = j;
              alive = false;
              break;
            }
            if (next == GrammarAutomaton::kFull) {  // past its states: the rest by threads
              alive = !Advance(s, a.threads(at[j]), std::string_view(b).substr(j)).empty();
              break;
            }
            at[j + 1] = next;
          }
          valid = j;
          if (alive && id < limit) {
            (*allowed)[id] = 1;
            any = true;
          }
        }
        a.KeepMask(start, *allowed, limit, any);
      }
    }
  }
  const bool end = CanEnd() || !any;
  for (int32_t eos : eos_ids) {
    if (eos >= 0 && eos < static_cast<int32_t>(allowed->size())) (*allowed)[eos] = end ? 1 : 0;
  }
}

}  // namespace tandem
