// jinja::Template: a Jinja2 interpreter for chat templates, rendering as
// Python's jinja2 3.x does in the environment transformers builds for them
// (ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the
// loopcontrols extension; keep_trailing_newline off; no autoescape).
//
// Supported: {{ }}, {% %} and {# #} with whitespace control (-, +); if /
// elif / else, for (tuple targets, `if` filters, else, loop.*, break,
// continue), set (names, tuples, namespace attributes, blocks), macro (with
// defaults), filter blocks, raw, transformers' generation block; the
// expression grammar of jinja2's parser (conditional expressions, and / or /
// not, comparisons, in, is [not] tests, + - * / // % ** ~, unary -,
// literals, lists, tuples, dicts, attributes, subscripts, slices, calls with
// keyword arguments, filters); the filters, tests, globals and string / dict
// / list methods real chat templates use (see jinja.cc for the lists).
//
// What it cannot do is an error naming the construct: a tag, filter or test
// it does not know fails Parse() (kInvalidArgument, "line N: ..."); a method
// it does not know fails Render() with kUnimplemented. A template's own
// raise_exception() and the use of an undefined value fail Render() with
// kInvalidArgument (the messages do not suit the template).
//
// A parsed Template is immutable: Render() may run on several threads at once.
#ifndef TANDEM_COMMON_CHAT_JINJA_H_
#define TANDEM_COMMON_CHAT_JINJA_H_

#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "common/chat/jinja_value.h"

namespace tandem::jinja {

struct TemplateOptions {
  bool trim_blocks = true;    // drop the newline after a block tag
  bool lstrip_blocks = true;  // drop spaces and tabs before a block tag on its line
  bool keep_trailing_newline = false;
};

// Limits that keep a hostile template from running away.
struct RenderLimits {
  // Statements run and loop iterations: about a second of rendering, far
  // beyond a conversation at any model's context (~30 a message).
  int64_t max_steps = 2'000'000;
  size_t max_output_bytes = 64 << 20;
  // Bytes of strings and lists built along the way (BuildBudget), freed or
  // not: a conversation's few copies of its text fit many times over.
  int64_t max_built_bytes = int64_t{256} << 20;
  int max_call_depth = 200;         // nested macro calls
};

class Template {
 public:
  static absl::StatusOr<Template> Parse(absl::string_view source, TemplateOptions options = {});

  // Renders with `globals` (a dict: messages, add_generation_prompt, ...).
  // The interpreter's own globals (range, namespace, dict, raise_exception,
  // strftime_now) are visible unless `globals` names them too.
  absl::StatusOr<std::string> Render(const Value& globals, RenderLimits limits = {}) const;

  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  ~Template();

  struct Impl;

 private:
  explicit Template(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_JINJA_H_
