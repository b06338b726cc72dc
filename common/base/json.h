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
inline nlohmann::ordered_json ParseJsonBounded(const std::string& text) {
  using Json = nlohmann::ordered_json;
  bool too_deep = false;
  Json::parser_callback_t limit = [&too_deep](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth) too_deep = true;
    return !too_deep;  // a value too deep is dropped, not built
  };
  Json j = Json::parse(text, limit, /*allow_exceptions=*/false);
  return too_deep ? Json(Json::value_t::discarded) : j;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_JSON_H_
