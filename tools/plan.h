// `tandem plan`: the graph routing and capture plan for a configuration,
// computed by the same common/graph code the workers run.
#ifndef TANDEM_TOOLS_PLAN_H_
#define TANDEM_TOOLS_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/graph/attention_support.h"
#include "common/graph/cudagraph_mode.h"
#include "common/graph/dispatcher.h"
#include "common/graph/graph_policy.h"

namespace tandem {

// One `--dispatch` query: "N:u" (uniform decode), "N:m" (mixed), optionally
// followed by ":nofull" (disable_full) and/or ":lora" (has_lora).
struct DispatchQuery {
  int num_tokens = 0;
  bool uniform_decode = false;
  bool disable_full = false;
  bool has_lora = false;
};

// Parses a comma-separated list of queries; INVALID_ARGUMENT names the bad item.
absl::StatusOr<std::vector<DispatchQuery>> ParseDispatchSpec(const std::string& spec);

struct PlanRequest {
  GraphPolicyConfig policy;  // requested mode, q, capture sizes
  BatchLimits limits;
  AttentionCgSupport support = AttentionCgSupport::kAlways;
  bool piecewise_split = true;
  std::vector<DispatchQuery> queries;
};

struct PlanAnswer {
  DispatchQuery query;
  DispatchResult result;
};

struct Plan {
  CudaGraphMode requested_mode;
  ModeResolution resolution;
  std::vector<int> capture_sizes;
  std::vector<CaptureGroup> capture_order;  // PIECEWISE then FULL, largest first
  std::vector<PlanAnswer> answers;
};

// Resolves the policy (ResolveGraphPolicy), builds the dispatcher and answers
// the queries. A query the dispatcher refuses (a uniform-decode batch in FULL
// mode padding to a size that is not a multiple of q) is INVALID_ARGUMENT
// naming the query and q.
absl::StatusOr<Plan> BuildPlan(const PlanRequest& request);

// The JSON document described in the README (`tandem plan --format=json`).
std::string PlanToJson(const Plan& plan);
// A human-readable report: routing table, capture plan, dispatch answers.
std::string PlanToText(const Plan& plan);

// Entry point of `tandem plan`; returns the process exit code (2 on a usage
// or configuration error, with one line on stderr).
int RunPlanCommand(const std::vector<std::string>& args);

}  // namespace tandem

#endif  // TANDEM_TOOLS_PLAN_H_
