#include "tools/plan.h"

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

Json DescriptorJson(const BatchDescriptor& d) {
  Json j;
  j["num_tokens"] = d.num_tokens;
  j["num_reqs"] = d.num_reqs ? Json(*d.num_reqs) : Json(nullptr);
  j["uniform"] = d.uniform;
  j["has_lora"] = d.has_lora;
  return j;
}

const std::vector<BatchDescriptor>* GroupFor(const Plan& plan, CudaGraphMode mode) {
  for (const auto& g : plan.capture_order) {
    if (g.mode == mode) return &g.descriptors;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::vector<DispatchQuery>> ParseDispatchSpec(const std::string& spec) {
  std::vector<DispatchQuery> queries;
  if (spec.empty()) return queries;
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
    DispatchQuery q;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--dispatch: bad item '", item, "': ", why,
          " (expected N:u or N:m, optionally :nofull and :lora)"));
    };
    if (parts.size() < 2) return bad("missing the batch kind");
    if (!absl::SimpleAtoi(parts[0], &q.num_tokens) || q.num_tokens < 0) {
      return bad("N must be a non-negative integer");
    }
    if (parts[1] == "u") {
      q.uniform_decode = true;
    } else if (parts[1] != "m") {
      return bad(absl::StrCat("kind '", parts[1], "' is neither u nor m"));
    }
    for (size_t i = 2; i < parts.size(); ++i) {
      if (parts[i] == "nofull") {
        q.disable_full = true;
      } else if (parts[i] == "lora") {
        q.has_lora = true;
      } else {
        return bad(absl::StrCat("unknown option '", parts[i], "'"));
      }
    }
    queries.push_back(q);
  }
  return queries;
}

absl::StatusOr<Plan> BuildPlan(const PlanRequest& request) {
  Plan plan;
  plan.requested_mode = request.policy.requested_mode;
  ASSIGN_OR_RETURN(GraphPolicy policy, ResolveGraphPolicy(request.policy, request.limits,
                                                          request.support,
                                                          request.piecewise_split));
  plan.resolution = policy.resolution;
  plan.capture_sizes = policy.dispatcher.capture_sizes;
  CudaGraphDispatcher dispatcher(std::move(policy.dispatcher));
  RETURN_IF_ERROR(dispatcher.InitializeKeys(plan.resolution.mode));
  plan.capture_order = dispatcher.CaptureDescriptors();
  for (const DispatchQuery& q : request.queries) {
    auto r = dispatcher.Dispatch(q.num_tokens, q.uniform_decode, q.has_lora, q.disable_full);
    if (!r.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--dispatch query ", q.num_tokens, q.uniform_decode ? ":u" : ":m", " with q = ",
          dispatcher.uniform_decode_query_len(), ": ", r.status().message()));
    }
    plan.answers.push_back({q, *r});
  }
  return plan;
}

std::string PlanToJson(const Plan& plan) {
  Json j;
  j["requested_mode"] = std::string(plan.requested_mode.name());
  j["resolved_mode"] = std::string(plan.resolution.mode.name());
  j["resolution_notes"] = plan.resolution.notes;
  j["capture_sizes"] = plan.capture_sizes;
  Json keys;
  for (CudaGraphMode m : {CudaGraphMode::kFull, CudaGraphMode::kPiecewise}) {
    Json list = Json::array();
    if (const auto* descs = GroupFor(plan, m)) {
      for (const auto& d : *descs) list.push_back(DescriptorJson(d));
    }
    keys[std::string(m.name())] = list;
  }
  j["keys"] = keys;
  Json order = Json::array();
  for (const auto& g : plan.capture_order) {
    for (const auto& d : g.descriptors) {
      Json e;
      e["mode"] = std::string(g.mode.name());
      e["descriptor"] = DescriptorJson(d);
      order.push_back(e);
    }
  }
  j["capture_order"] = order;
  Json dispatch = Json::array();
  for (const auto& a : plan.answers) {
    Json e;
    e["num_tokens"] = a.query.num_tokens;
    e["uniform_decode"] = a.query.uniform_decode;
    e["disable_full"] = a.query.disable_full;
    e["runtime_mode"] = std::string(a.result.runtime_mode.name());
    e["descriptor"] = DescriptorJson(a.result.descriptor);
    dispatch.push_back(e);
  }
  j["dispatch"] = dispatch;
  return j.dump(2) + "\n";
}

std::string PlanToText(const Plan& plan) {
  const CudaGraphMode m = plan.resolution.mode;
  std::string out = absl::StrCat("requested mode: ", plan.requested_mode.name(),
                                 "\nresolved mode:  ", m.name(), "\n");
  for (const auto& note : plan.resolution.notes) absl::StrAppend(&out, "  note: ", note, "\n");
  absl::StrAppend(&out, "\nrouting (", m.name(), ")\n");
  absl::StrAppendFormat(&out, "  %-14s %-14s %s\n", "decode batch", "mixed batch",
                        "needs piecewise split");
  absl::StrAppendFormat(&out, "  %-14s %-14s %s\n", m.decode_mode().name(),
                        m.mixed_mode().name(),
                        m.requires_piecewise_compilation() ? "yes" : "no");
  absl::StrAppend(&out, "\ncapture sizes (", plan.capture_sizes.size(), "): ",
                  absl::StrJoin(plan.capture_sizes, ","), "\n");
  absl::StrAppend(&out, "\ncapture plan\n");
  if (plan.capture_order.empty()) absl::StrAppend(&out, "  (no graphs)\n");
  for (const auto& g : plan.capture_order) {
    absl::StrAppend(&out, "  ", g.mode.name(), ": ", g.descriptors.size(),
                    " graphs, largest first\n");
    for (const auto& d : g.descriptors) absl::StrAppend(&out, "    ", d.ToString(), "\n");
  }
  if (!plan.answers.empty()) absl::StrAppend(&out, "\ndispatch\n");
  for (const auto& a : plan.answers) {
    absl::StrAppendFormat(&out, "  %6d %-5s%-8s -> %-9s %s\n", a.query.num_tokens,
                          a.query.uniform_decode ? "u" : "m",
                          a.query.disable_full ? " nofull" : "",
                          a.result.runtime_mode.name(), a.result.descriptor.ToString());
  }
  return out;
}

int RunPlanCommand(const std::vector<std::string>& args) {
  std::string mode = "FULL_AND_PIECEWISE";
  std::string support = "ALWAYS";
  std::string capture_sizes;
  int max_capture_size = 0;
  bool piecewise_split = true;
  std::string dispatch;
  std::string format = "text";
  PlanRequest request;
  FlagSet flags("tandem plan");
  flags.Add("cudagraph-mode", &mode, "requested CUDAGraphMode (upstream name)");
  flags.Add("max-num-seqs", &request.limits.max_num_seqs, "scheduler max_num_seqs");
  flags.Add("max-num-batched-tokens", &request.limits.max_num_batched_tokens,
            "scheduler token budget per step");
  flags.Add("capture-sizes", &capture_sizes, "explicit capture sizes, e.g. 1,2,4,8");
  flags.Add("max-capture-size", &max_capture_size,
            "maximum of the default capture ladder (0 = default)");
  flags.Add("uniform-decode-query-len", &request.policy.uniform_decode_query_len,
            "query length of a uniform decode request (1 + speculative tokens)");
  flags.Add("attention-support", &support,
            "ALWAYS, UNIFORM_BATCH, UNIFORM_SINGLE_TOKEN_DECODE or NEVER");
  flags.Add("piecewise-split", &piecewise_split, "the model is split at attention");
  flags.Add("dispatch", &dispatch, "queries N:u|N:m[:nofull][:lora], comma separated");
  flags.Add("format", &format, "text or json");

  auto fail = [](const absl::Status& s) {
    std::cerr << "tandem plan: " << s.message() << std::endl;
    return 2;
  };
  if (auto code = ParseCommandLine(&flags, args)) return *code;
  if (format != "text" && format != "json") {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--format must be text or json, got '", format, "'")));
  }
  auto parsed_mode = CudaGraphMode::Parse(mode);
  if (!parsed_mode.ok()) return fail(parsed_mode.status());
  request.policy.requested_mode = *parsed_mode;
  auto parsed_support = ParseAttentionCgSupport(support);
  if (!parsed_support.ok()) return fail(parsed_support.status());
  request.support = *parsed_support;
  request.piecewise_split = piecewise_split;
  auto sizes = ParseIntList(capture_sizes, "--capture-sizes");
  if (!sizes.ok()) return fail(sizes.status());
  request.policy.capture_sizes = *sizes;
  if (flags.IsSet("max-capture-size")) request.policy.max_capture_size = max_capture_size;
  auto queries = ParseDispatchSpec(dispatch);
  if (!queries.ok()) return fail(queries.status());
  request.queries = *queries;

  auto plan = BuildPlan(request);
  if (!plan.ok()) return fail(plan.status());
  std::cout << (format == "json" ? PlanToJson(*plan) : PlanToText(*plan));
  return 0;
}

}  // namespace tandem
