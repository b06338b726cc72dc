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
