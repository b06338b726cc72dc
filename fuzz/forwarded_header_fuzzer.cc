// The headers the decode worker's HTTP front door forwards: X-Request-Id
// (into every call and reply) and x-prefiller-host-port (into gRPC metadata,
// then, if trusted, a channel's target). A byte gRPC refuses in metadata
// once aborted the process. For any bytes: what CheckHeaderValue passes is
// what gRPC takes (printable ASCII, 0x20-0x7E); a prefiller name that parses
// is HOST:PORT within its bounds; the trust check ends in OK or
// PERMISSION_DENIED, never anything else. The first byte picks the trust.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/serving/request_id.h"
#include "decode_worker/prefiller_trust.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  tandem::PrefillerTrust trust;
  switch (data[0] % 3) {
    case 0: break;  // the default: nothing beyond --prefill-address
    case 1: trust.any = true; break;
    default: trust.allow = {"127.0.0.0/8", "fd00::/8", "prefill-0.prefill:50061", "10.0.0.1:1"};
  }
  if (!tandem::CheckPrefillerTrust(trust).ok()) abort();
  const std::string value(reinterpret_cast<const char*>(data) + 1, size - 1);
  for (const char* header : {"X-Request-Id", "x-prefiller-host-port"}) {
    if (!tandem::CheckHeaderValue(header, value).ok()) continue;
    if (value.size() > tandem::kMaxRequestIdBytes) abort();
    for (char c : value) {
      if (c < 0x20 || c > 0x7e) abort();  // gRPC would refuse it in metadata
    }
  }
  auto host = tandem::ParsePrefillerName(value);
  if (!host.ok()) {
    if (host.status().code() != absl::StatusCode::kInvalidArgument) abort();
    return 0;
  }
  if (host->empty() || value.size() > 255 || value.find(':') == std::string::npos) abort();
  const int port = std::atoi(value.c_str() + value.rfind(':') + 1);
  if (port < 0 || port > 99999) abort();
  const absl::Status trusted = tandem::CheckPrefillerTrusted(trust, *host, value);
  if (!trusted.ok() && trusted.code() != absl::StatusCode::kPermissionDenied) abort();
  if (trust.any && !trusted.ok()) abort();
  return 0;
}
