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

// The request id to use: `id`, or a fresh one ("req-" + 16 hex digits) when
// empty. INVALID_ARGUMENT when longer than `max_bytes`.
absl::StatusOr<std::string> ResolveRequestId(const std::string& id,
                                             size_t max_bytes = kMaxRequestIdBytes);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_REQUEST_ID_H_
