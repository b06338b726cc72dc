#include "tools/plan.h"

#include <algorithm>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

TEST(PlanTest, JsonShapeAndAnswers) {
  PlanRequest req;
  req.policy.requested_mode = CudaGraphMode::kFullAndPiecewise;
  req.policy.capture_sizes = {1, 2, 4};
  req.limits.max_num_seqs = 2;
  req.queries = *ParseDispatchSpec("3:u,3:m,2:u:nofull,5:m");
  auto plan = BuildPlan(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto j = nlohmann::json::parse(PlanToJson(*plan));
  EXPECT_EQ(j["requested_mode"], "FULL_AND_PIECEWISE");
  EXPECT_EQ(j["resolved_mode"], "FULL_AND_PIECEWISE");
  EXPECT_EQ(j["resolution_notes"].size(), 0u);
  EXPECT_EQ(j["capture_sizes"], nlohmann::json::parse("[1,2,4]"));
  EXPECT_EQ(j["keys"]["PIECEWISE"].size(), 3u);
  EXPECT_EQ(j["keys"]["FULL"].size(), 2u);  // sizes in [1, 2]
  EXPECT_TRUE(j["keys"]["PIECEWISE"][0]["num_reqs"].is_null());
  ASSERT_EQ(j["capture_order"].size(), 5u);
  EXPECT_EQ(j["capture_order"][0]["mode"], "PIECEWISE");
  EXPECT_EQ(j["capture_order"][0]["descriptor"]["num_tokens"], 4);
  EXPECT_EQ(j["capture_order"][3]["mode"], "FULL");
  EXPECT_EQ(j["capture_order"][3]["descriptor"]["num_tokens"], 2);
  const auto& d = j["dispatch"];
  ASSERT_EQ(d.size(), 4u);
  // 3 uniform pads to 4 > q * max_num_seqs = 2: no FULL key, PIECEWISE.
  EXPECT_EQ(d[0]["runtime_mode"], "PIECEWISE");
  EXPECT_EQ(d[1]["runtime_mode"], "PIECEWISE");
  EXPECT_EQ(d[2]["runtime_mode"], "PIECEWISE");
  EXPECT_EQ(d[2]["disable_full"], true);
  EXPECT_EQ(d[3]["runtime_mode"], "NONE");
  EXPECT_EQ(d[3]["descriptor"]["num_tokens"], 5);
  EXPECT_TRUE(d[3]["descriptor"]["num_reqs"].is_null());
  // The exact key order of the document.
  std::vector<std::string> keys;
  auto ordered = nlohmann::ordered_json::parse(PlanToJson(*plan));
  for (auto& [k, v] : ordered.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"requested_mode", "resolved_mode",
                                            "resolution_notes", "capture_sizes", "keys",
                                            "capture_order", "dispatch"}));
}

// Runs `tandem plan --format=json ARGS` and parses what it prints.
nlohmann::json PlanJson(std::vector<std::string> args, int* exit_code = nullptr) {
  args.push_back("--format=json");
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int rc = RunPlanCommand(args);
  const std::string out = testing::internal::GetCapturedStdout();
  const std::string err = testing::internal::GetCapturedStderr();
  if (exit_code != nullptr) *exit_code = rc;
  if (rc != 0) return nlohmann::json{{"error", err}};
  return nlohmann::json::parse(out);
}

nlohmann::json Sizes(std::initializer_list<int> v) { return nlohmann::json(std::vector<int>(v)); }

// The reproductions of vLLM 0.15.1's behaviour with q > 1 (VllmConfig.
// _set_cudagraph_sizes, then rounding in _check_and_update_cudagraph_mode).
TEST(PlanTest, PiecewiseWithQueryLenKeepsGivenSizes) {
  auto j = PlanJson({"--cudagraph-mode=PIECEWISE", "--uniform-decode-query-len=2",
                     "--capture-sizes=1,3,5,7", "--dispatch=1:m,7:m"});
  EXPECT_EQ(j["capture_sizes"], Sizes({1, 3, 5, 7}));
  EXPECT_EQ(j["dispatch"][0]["runtime_mode"], "PIECEWISE");
  EXPECT_EQ(j["dispatch"][0]["descriptor"]["num_tokens"], 1);
  EXPECT_EQ(j["dispatch"][1]["runtime_mode"], "PIECEWISE");
  EXPECT_EQ(j["dispatch"][1]["descriptor"]["num_tokens"], 7);
}

TEST(PlanTest, FullAndPiecewiseRoundsWithinTheLargestGivenSize) {
  auto j = PlanJson({"--cudagraph-mode=FULL_AND_PIECEWISE", "--max-num-seqs=4",
                     "--uniform-decode-query-len=2", "--capture-sizes=1,3,5,7",
                     "--dispatch=7:m,8:u"});
  EXPECT_EQ(j["capture_sizes"], Sizes({2, 4, 6}));
  EXPECT_EQ(j["dispatch"][0]["runtime_mode"], "NONE");
  EXPECT_EQ(j["dispatch"][1]["runtime_mode"], "NONE");
  ASSERT_EQ(j["resolution_notes"].size(), 1u);
  EXPECT_NE(j["resolution_notes"][0].get<std::string>().find("[1,3,5,7] -> [2,4,6]"),
            std::string::npos);
}

TEST(PlanTest, RoundingFallsBackToQueryLenOrFails) {
  auto j = PlanJson({"--cudagraph-mode=FULL_AND_PIECEWISE", "--uniform-decode-query-len=4",
                     "--capture-sizes=5,7", "--dispatch=4:u,5:m"});
  EXPECT_EQ(j["capture_sizes"], Sizes({4}));
  EXPECT_EQ(j["dispatch"][0]["runtime_mode"], "FULL");
  EXPECT_EQ(j["dispatch"][0]["descriptor"],
            nlohmann::json::parse(
                R"({"num_tokens":4,"num_reqs":1,"uniform":true,"has_lora":false})"));
  EXPECT_EQ(j["dispatch"][1]["runtime_mode"], "NONE");
  int rc = 0;
  auto e = PlanJson({"--cudagraph-mode=FULL_AND_PIECEWISE", "--uniform-decode-query-len=4",
                     "--capture-sizes=3"},
                    &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(e["error"].get<std::string>().find(
                "no valid capture sizes after rounding to a multiple of q"),
            std::string::npos);
}

TEST(PlanTest, DefaultLadderWithQueryLen) {
  auto j = PlanJson({"--uniform-decode-query-len=3", "--max-num-seqs=2"});
  EXPECT_EQ(j["capture_sizes"], Sizes({3, 6}));
}

TEST(PlanTest, CaptureSizesWithMatchingMaximum) {
  auto j = PlanJson({"--capture-sizes=1,2,4,8", "--max-capture-size=8", "--dispatch=3:m"});
  EXPECT_EQ(j["capture_sizes"], Sizes({1, 2, 4, 8}));
  EXPECT_EQ(j["dispatch"][0]["runtime_mode"], "PIECEWISE");
  EXPECT_EQ(j["dispatch"][0]["descriptor"]["num_tokens"], 4);
  int rc = 0;
  auto e = PlanJson({"--capture-sizes=1,2,4,8", "--max-capture-size=16"}, &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(e["error"].get<std::string>().find("max_capture_size 16"), std::string::npos);
}

TEST(PlanTest, RequestedNoneHasNoSizes) {
  auto j = PlanJson({"--cudagraph-mode=NONE", "--dispatch=1:u"});
  EXPECT_EQ(j["capture_sizes"], nlohmann::json::array());
  EXPECT_EQ(j["dispatch"][0]["runtime_mode"], "NONE");
}

TEST(PlanTest, UniformQueryInFullModeNotMultipleOfQueryLenIsAnError) {
  // FULL never rounds, so a uniform-decode query padding to 3 with q = 2 is
  // upstream's assertion: one line naming the query and q, exit 2.
  int rc = 0;
  auto e = PlanJson({"--cudagraph-mode=FULL", "--uniform-decode-query-len=2",
                     "--capture-sizes=1,3,5,7", "--dispatch=2:m,3:u"},
                    &rc);
  EXPECT_EQ(rc, 2);
  const std::string err = e["error"];
  EXPECT_NE(err.find("3:u"), std::string::npos) << err;
  EXPECT_NE(err.find("q = 2"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  // A uniform query whose padded size is a multiple of q is answered.
  auto j = PlanJson({"--cudagraph-mode=FULL", "--uniform-decode-query-len=2",
                     "--capture-sizes=1,4", "--dispatch=3:u"});
  EXPECT_EQ(j["dispatch"][0]["runtime_mode"], "FULL");
  EXPECT_EQ(j["dispatch"][0]["descriptor"]["num_tokens"], 4);
}

TEST(PlanTest, DispatchSpecErrors) {
  EXPECT_FALSE(ParseDispatchSpec("3").ok());
  EXPECT_FALSE(ParseDispatchSpec("x:u").ok());
  EXPECT_FALSE(ParseDispatchSpec("3:q").ok());
  EXPECT_FALSE(ParseDispatchSpec("3:u:fast").ok());
  auto ok = ParseDispatchSpec("7:m:nofull:lora");
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE((*ok)[0].disable_full);
  EXPECT_TRUE((*ok)[0].has_lora);
}

TEST(PlanTest, CommandExitCodes) {
  EXPECT_EQ(RunPlanCommand({"--cudagraph-mode=FULL", "--format=json"}), 0);
  EXPECT_EQ(RunPlanCommand({"--cudagraph-mode=SOMETIMES"}), 2);
  EXPECT_EQ(RunPlanCommand({"--no-such-flag=1"}), 2);
  EXPECT_EQ(RunPlanCommand({"--max-num-seqs=abc"}), 2);
  EXPECT_EQ(RunPlanCommand({"--dispatch=3:z"}), 2);
  EXPECT_EQ(RunPlanCommand({"--format=yaml"}), 2);
  EXPECT_EQ(RunPlanCommand({"--cudagraph-mode=FULL", "--attention-support=NEVER"}), 2);
}

}  // namespace
}  // namespace tandem
