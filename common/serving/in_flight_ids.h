// InFlightIds: the request ids a service has in flight, so that a second
// request with the id of a running one is refused (both services keep one).
//
// Thread-safe.
#ifndef TANDEM_COMMON_SERVING_IN_FLIGHT_IDS_H_
#define TANDEM_COMMON_SERVING_IN_FLIGHT_IDS_H_

#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/base/mutex.h"

namespace tandem {

class InFlightIds {
 public:
  // ALREADY_EXISTS (quoting at most the id's first bytes) when `id` is in
  // flight; else records it.
  absl::Status Claim(const std::string& id);
  // Forgets `id`: a new request may use it. Call once per successful Claim.
  void Release(const std::string& id);

 private:
  Mutex mu_;
  absl::flat_hash_set<std::string> ids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_IN_FLIGHT_IDS_H_
