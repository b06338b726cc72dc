// Which prefill workers a request may name in x-prefiller-host-port (llm-d's
// P/D routing header), and what a name must look like: the decode worker's
// trust in that header, apart from the channels it makes (prefill_pool.h),
// so that a fuzzer can reach it without gRPC.
//
// By default a request may name only the decode worker's own
// --prefill-address endpoints: whoever may send the header could otherwise
// make the worker dial any address (llm-d honours the header behind its own
// sidecar only). Pure functions; thread-safe.
#ifndef TANDEM_DECODE_WORKER_PREFILLER_TRUST_H_
#define TANDEM_DECODE_WORKER_PREFILLER_TRUST_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

struct PrefillerTrust {
  bool any = false;  // --trusted-prefiller-header: every HOST:PORT
  // --prefiller-allow: HOST:PORT as written, or an IP network
  // (10.0.0.0/8, fd00::/8) that an IP literal's host must be in.
  std::vector<std::string> allow;
  absl::Duration idle_close = absl::Seconds(60);  // an unused named channel is closed
};

// INVALID_ARGUMENT names an entry of `allow` that is neither.
absl::Status CheckPrefillerTrust(const PrefillerTrust& trust);

// The host of a header's HOST:PORT ([v6] without its brackets).
// INVALID_ARGUMENT, quoting at most 64 bytes escaped, for what is not
// HOST:PORT of printable ASCII in at most 255 bytes.
absl::StatusOr<std::string> ParsePrefillerName(const std::string& host_port);

// OK when `trust` lets a request name `host_port` (whose host is `host`);
// PERMISSION_DENIED, naming the flags, otherwise.
absl::Status CheckPrefillerTrusted(const PrefillerTrust& trust, const std::string& host,
                                   const std::string& host_port);

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_PREFILLER_TRUST_H_
