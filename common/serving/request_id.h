// Request ids as clients send them: limits, server-assigned ids, and how much
// of any client text an error message quotes.
#ifndef TANDEM_COMMON_SERVING_REQUEST_ID_H_
#define TANDEM_COMMON_SERVING_REQUEST_ID_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

// Limits on request ids (client input).
inline constexpr size_t kMaxRequestIdBytes = 256;
// Error messages quote at most this much of any client input.
inline constexpr size_t kMaxEchoBytes = 64;

// `text` for an error message: as is up to kMaxEchoBytes, else its first
// bytes (whole UTF-8 characters) and "... (N bytes)".
std::string EchoClientText(const std::string& text);

// Whether `value` may pass on as the value of the header (or gRPC
// metadata) `header`: at most `max_bytes` of printable ASCII (0x20-0x7E),
// which gRPC takes in metadata as it is. INVALID_ARGUMENT names the header,
// the first byte outside it and its offset. A header a client sends is
// checked with this before it is forwarded anywhere: gRPC aborts the
// process on a metadata value it cannot send.
absl::Status CheckHeaderValue(const std::string& header, const std::string& value,
                              size_t max_bytes = kMaxRequestIdBytes);

// The request id to use: `id`, or a fresh one ("req-" + 16 hex digits) when
// empty. INVALID_ARGUMENT when longer than `max_bytes`.
absl::StatusOr<std::string> ResolveRequestId(const std::string& id,
                                             size_t max_bytes = kMaxRequestIdBytes);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_REQUEST_ID_H_
