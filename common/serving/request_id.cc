#include "common/serving/request_id.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace tandem {

std::string EchoClientText(const std::string& text) {
  if (text.size() <= kMaxEchoBytes) return text;
  size_t cut = kMaxEchoBytes;
  while (cut > 0 && (static_cast<uint8_t>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(text.substr(0, cut), "... (", text.size(), " bytes)");
}

absl::Status CheckHeaderValue(const std::string& header, const std::string& value, size_t max_bytes) {
  if (value.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("header ", header, " has ", value.size(),
                                                   " bytes; the limit is ", max_bytes));
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const auto byte = static_cast<uint8_t>(value[i]);
    if (byte < 0x20 || byte > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "header %s: byte %d is 0x%02x; only printable ASCII (0x20-0x7e) is accepted", header, i, byte));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveRequestId(const std::string& id, size_t max_bytes) {
  if (id.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id has ", id.size(),
                                                   " bytes; the limit is ", max_bytes));
  }
  if (!id.empty()) return id;
  static std::atomic<uint64_t> counter{0};
  // Unique within the process and unlikely to collide across restarts.
  const uint64_t v = absl::ToUnixNanos(absl::Now()) * 6364136223846793005ull + (++counter);
  return absl::StrFormat("req-%016x", v ^ (static_cast<uint64_t>(getpid()) << 40));
}

}  // namespace tandem
