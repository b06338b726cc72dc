// JSON from outside bytes, parsed with a bound on nesting: a value nested
// deeper than kMaxJsonDepth is refused as it is parsed (nlohmann's parser
// itself does not recurse), so that nothing after it (copies, dump(),
// recursive walks of a schema or a template's data) recurses without bound.
#ifndef TANDEM_COMMON_BASE_JSON_H_
#define TANDEM_COMMON_BASE_JSON_H_

#include <string>

#include "nlohmann/json.hpp"

namespace tandem {

// Far deeper than any request body or JSON schema clients send (a message
// list with tool calls is 6 levels), and shallow enough that recursion over
// the value costs a few KB of stack.
inline constexpr int kMaxJsonDepth = 128;

// `text` as JSON, or a discarded value (is_discarded()) when it is not JSON
// or nests arrays and objects deeper than kMaxJsonDepth.
// With `why`, a discarded value's reason: the nesting, or where the syntax
// broke (the parser's message: a byte offset and at most ~80 bytes read).
inline nlohmann::ordered_json ParseJsonBounded(const std::string& text, std::string* why = nullptr) {
  using Json = nlohmann::ordered_json;
  bool too_deep = false;
  Json::parser_callback_t limit = [&too_deep](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth) too_deep = true;
    return !too_deep;  // a value too deep is dropped, not built
  };
  Json j = Json::parse(text, limit, /*allow_exceptions=*/false);
  if (too_deep) j = Json(Json::value_t::discarded);
  if (j.is_discarded() && why != nullptr) {
    if (too_deep) {
      *why = "arrays and objects nest more than " + std::to_string(kMaxJsonDepth) + " deep";
    } else {
      // Parsed again for the message: only a body that already failed pays.
      try {
        const Json again = Json::parse(text, limit);  // throws where the syntax broke
        (void)again;
        *why = "unparseable";
      } catch (const Json::exception& e) {
        *why = e.what();
        if (why->size() > 160) *why = why->substr(0, 160) + "...";
      }
    }
  }
  return j;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_JSON_H_
