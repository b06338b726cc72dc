#include "common/serving/in_flight_ids.h"

#include "absl/strings/str_cat.h"
#include "common/serving/request_id.h"

namespace tandem {

absl::Status InFlightIds::Claim(const std::string& id) {
  MutexLock lock(&mu_);
  if (!ids_.insert(id).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id '", EchoClientText(id), "' is already in flight"));
  }
  return absl::OkStatus();
}

void InFlightIds::Release(const std::string& id) {
  MutexLock lock(&mu_);
  ids_.erase(id);
}

}  // namespace tandem
