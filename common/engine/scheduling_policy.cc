#include "common/engine/scheduling_policy.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<SchedulingPolicy> ParseSchedulingPolicy(absl::string_view name) {
  if (name == "fcfs") return SchedulingPolicy::kFcfs;
  if (name == "priority") return SchedulingPolicy::kPriority;
  return absl::InvalidArgumentError(
      absl::StrCat("--scheduling-policy=", name, ": expected fcfs or priority"));
}

const char* SchedulingPolicyName(SchedulingPolicy policy) {
  return policy == SchedulingPolicy::kPriority ? "priority" : "fcfs";
}

}  // namespace tandem
