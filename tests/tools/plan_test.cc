#include "tools/plan.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

TEST(PlanTest, JsonShapeAndAnswers) {
  PlanRequest req;
  req.requested_mode = CudaGraphMode::kFullAndPiecewise;
  req.sizes.capture_sizes = {1, 2, 4};
  req.sizes.max_num_seqs = 2;
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
