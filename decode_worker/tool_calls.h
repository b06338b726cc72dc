// Tool calls in a generated reply, for the OpenAI API's `tool_calls`:
// Hermes / Qwen style `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
// blocks, Qwen3-Coder's XML calls, a reply made of bare JSON calls (Llama
// 3.x style, "parameters" or "arguments", several joined by ';'), a reply
// that is a JSON list of them (Mistral's before tokenizer v11), or Mistral's
// `[TOOL_CALLS]NAME[ARGS]{...}` calls (v11 on, the token's text kept).
#ifndef TANDEM_DECODE_WORKER_TOOL_CALLS_H_
#define TANDEM_DECODE_WORKER_TOOL_CALLS_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"

namespace tandem {

// The calls in OpenAI's shape ({"id", "type": "function", "function":
// {"name", "arguments": a JSON string}}), ids from `new_id`, and in *rest
// the text outside them. A block holds a JSON call, or Qwen3-Coder's
// <function=NAME><parameter=P>\nVALUE\n</parameter></function> (also without
// the block, as vLLM's qwen3_coder parser takes it: the rest is the text
// before it), its values typed by `tool_properties` (tool name -> its
// parameters' "properties"). A JSON call's arguments are the model's own
// JSON text without the blanks between its tokens (JsonCallScanner), an XML
// call's its typed values as a compact JSON object. A reply that is a JSON
// list of calls (Mistral's) is all calls. After each [TOOL_CALLS] (Mistral's
// token, in the text when tools are offered) comes such a list or
// NAME[ARGS]{...}, whose arguments are the object's text without blanks
// (as far as it came: vLLM keeps a call whose arguments are cut short); the
// text before the first, after a call's object and of a part that is no
// call is the rest. No calls (an empty
// array, *rest = text) when the reply holds none, or a block that is not a
// call (or nests deeper than kMaxJsonDepth).
nlohmann::ordered_json ParseToolCalls(const std::string& text, std::string* rest,
                                      const std::function<std::string()>& new_id,
                                      const nlohmann::ordered_json& tool_properties = nullptr);

// The calls of tool_choice "required": a reply held to a JSON list of
// {"name", "parameters"}, in ParseToolCalls' shape, arguments as a JSON
// call's; those before the first element that is not a call (none when the
// text is not a list).
nlohmann::ordered_json ParseToolCallList(const std::string& text, const std::function<std::string()>& new_id);

// A JSON object's text as it arrives, without the blanks outside its
// strings (a call's arguments: a JSON call's, a Mistral v11 call's): only the
// nesting is checked.
class JsonCompactor {
 public:
  // `text`: the object from its '{' on; each call's text begins with the
  // previous call's.
  void Scan(std::string_view text);
  bool failed() const { return failed_; }  // not an object, or too deep
  bool done() const { return done_; }      // the object closed
  size_t end() const { return pos_; }      // past what was read (its '}' once done)
  const std::string& text() const { return text_; }

 private:
  size_t pos_ = 0;
  int depth_ = 0;
  bool in_string_ = false, escape_ = false, done_ = false, failed_ = false;
  std::string text_;
};

// Reads one JSON call, {"name": ..., "arguments" or "parameters": {...}}, as
// its text arrives: its name once whole, its arguments object as far as it
// has come (compact: blanks outside strings left out), and where it ends.
// Only the structure is checked; ParseToolCalls checks the whole object.
class JsonCallScanner {
 public:
  // `text`: the call from its first character on; each call's text begins
  // with the previous call's.
  void Scan(std::string_view text);
  bool failed() const { return failed_; }  // not a JSON object, or too deep
  bool done() const { return done_; }      // the object closed
  size_t end() const { return pos_; }      // past what was read (its '}' once done)
  const std::optional<std::string>& name() const { return name_; }
  // Whether an object under "arguments"/"parameters" has begun, and its text.
  bool has_arguments() const { return args_begun_; }
  const std::string& arguments() const { return args_.text(); }

 private:
  enum class Expect { kObject, kKey, kColon, kValue, kPrimitive, kAfterValue };
  void Fail() { failed_ = true; }
  void EndArguments();  // its arguments object closed: back in the call's
  size_t pos_ = 0;
  Expect expect_ = Expect::kObject;
  int depth_ = 0;  // of the containers open, the call's object included
  bool in_string_ = false, escape_ = false;
  size_t token_begin_ = 0;  // the depth-1 key or string value being read
  std::string key_;         // the depth-1 key whose value is being read
  bool in_args_ = false, args_begun_ = false;
  size_t args_begin_ = 0;  // the arguments object's '{'
  JsonCompactor args_;
  std::optional<std::string> name_;
  bool failed_ = false, done_ = false;
};

// A piece of a streamed tool call, as OpenAI's chunks carry them: a call's
// first piece has its id and name, the later ones more of its arguments.
struct ToolCallPiece {
  size_t index = 0;
  std::string id, name;
  std::string arguments;
};

// Whole calls (ParseToolCalls') as pieces, the first numbered `first_index`.
std::vector<ToolCallPiece> WholeCallPieces(const nlohmann::ordered_json& calls, size_t first_index = 0);

// The JSON of `pieces` for a chunk's `tool_calls`: each with its `index`
// first, as OpenAI's and vLLM's chunks carry them.
nlohmann::ordered_json ToolCallPiecesJson(const std::vector<ToolCallPiece>& pieces);

// A streamed answer when tools were offered (tool_choice auto). The text
// that can no longer be part of a call goes out as it comes; from the first
// `<tool_call>`, `<function=` or `[TOOL_CALLS]`, or a reply whose first non-blank character
// is `{` (a Llama 3.x call) or that begins `[{` (a Mistral list), the text is held, and the calls found there go
// out as they are generated: each call's id and name once its name is
// whole (a JSON call's once its arguments have begun), then its arguments
// piece by piece (JSON: as written, blanks between tokens left out; XML: a
// parameter at a time, typed). The end of the text that may begin a call is
// held until the next piece tells, and so are blanks that a call right
// after them would trim. Text after the calls is held until the end.
class ToolCallStream {
 public:
  struct Out {
    std::string content;
    std::vector<ToolCallPiece> calls;
  };

  // `list`: the reply is tool_choice "required"'s list of calls
  // (ParseToolCallList): none of it is content.
  explicit ToolCallStream(std::function<std::string()> new_id,
                          nlohmann::ordered_json tool_properties = nullptr, bool list = false)
      : new_id_(std::move(new_id)), tool_properties_(std::move(tool_properties)), list_(list) {}

  // Takes the answer's next piece; returns what may go out now.
  Out Add(std::string_view piece);
  // At the answer's end, given `calls` (ParseToolCalls' or
  // ParseToolCallList's of the whole answer): what of them has not gone out. A call that went out in part
  // gets the rest of its arguments; if a call's streamed arguments do not
  // begin its final ones (a reply that was not the call it began as), what
  // went out stands and nothing is added to it.
  std::vector<ToolCallPiece> Finish(const nlohmann::ordered_json& calls) const;

  // What went out as content so far, and the text held.
  std::string_view released() const { return std::string_view(text_).substr(0, released_); }
  std::string_view held() const { return std::string_view(text_).substr(released_); }
  // The calls that went out (in part), in order.
  struct Begun {
    std::string id, name, arguments;
  };
  const std::vector<Begun>& begun() const { return begun_; }

 private:
  enum class Expect { kText, kCall, kJson, kXml, kMistralName, kMistralArgs, kNone };
  void ReadCalls(Out* out);
  bool ReadXml(Out* out);  // false: waits for more text
  void Begin(Out* out, const std::string& name);
  // The call being read has `arguments` so far: what is new goes out.
  void Emit(Out* out, const std::string& arguments);

  std::function<std::string()> new_id_;
  nlohmann::ordered_json tool_properties_;
  bool list_;  // calls are in a JSON list: '[', ',' and ']' come between them
  std::string text_;  // the answer so far
  size_t released_ = 0;
  Expect expect_ = Expect::kText;
  size_t scan_ = 0;  // where the calls are read up to
  JsonCallScanner json_;
  JsonCompactor mistral_args_;  // a Mistral v11 call's arguments, from call_begin_
  size_t call_begin_ = 0;
  std::string xml_name_, xml_args_;  // the XML call being read
  bool xml_named_ = false;
  std::vector<Begun> begun_;
  bool call_open_ = false;  // the last of begun_ is still being read
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_TOOL_CALLS_H_
