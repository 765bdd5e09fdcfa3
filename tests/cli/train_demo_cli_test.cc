// `headroom train-demo`: the planned run's memory is what `headroom plan`
// predicts for the demo's graph, and what `headroom replay` of the plan's
// trace reserves; a plan file from `headroom plan --out` runs as it is.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json_fields.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner/plan_json.h"
#include "tests/cli/run_command.h"

namespace headroom {
namespace {

using ::headroom::testing::RunHeadroom;
using ::headroom::testing::WriteTempFile;
using ::testing::HasSubstr;
using ::testing::Not;

const std::vector<std::string> kSmallGpt = {"--layers", "2", "--hidden", "32", "--seq", "16", "--steps", "3"};

std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST(TrainDemoCli, PlanPredictsAndReplayReservesWhatTheRunMeasured) {
  const std::string graph = WriteTempFile("demo-gpt.graph.json", "");
  auto demo = RunHeadroom(With({"train-demo", "--strategy", "hybrid", "--budget", "60%", "--graph-out", graph,
                                "--json"},
                               kSmallGpt));
  ASSERT_EQ(demo.exit_code, 0) << demo.err;
  const nlohmann::json d = nlohmann::json::parse(demo.out);
  EXPECT_EQ(d["measured"], d["predicted"]);
  EXPECT_TRUE(d["losses_match_store_all"].get<bool>());
  EXPECT_LE(d["plan_peak_bytes"].get<uint64_t>(), d["budget_bytes"].get<uint64_t>());
  EXPECT_GT(d["offloads"].get<int>() + d["replays"].get<int>(), 0);

  // The same step from the graph file, through the planner and the replay.
  const std::string trace = WriteTempFile("demo-gpt.rmm.csv", "");
  const std::string plan_file = WriteTempFile("demo-gpt.plan.json", "");
  auto plan = RunHeadroom({"plan", "--model", graph, "--precision", "fp32", "--optimizer", "sgd-momentum", "--budget",
                           std::to_string(d["budget_bytes"].get<uint64_t>()), "--strategy", "hybrid", "--json",
                           "--trace-out", trace, "--out", plan_file});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const nlohmann::json p = nlohmann::json::parse(plan.out);
  EXPECT_EQ(p["allocator"]["requested_bytes"], d["measured"]["requested_bytes"]);
  EXPECT_EQ(p["allocator"]["reserved_bytes"], d["measured"]["reserved_bytes"]);
  auto replay = RunHeadroom({"replay", trace, "--json"});
  ASSERT_EQ(replay.exit_code, 0) << replay.err;
  const nlohmann::json r = nlohmann::json::parse(replay.out)["runs"][0];
  EXPECT_EQ(r["peak_reserved_bytes"], d["measured"]["reserved_bytes"]);
  EXPECT_EQ(r["peak_allocated_bytes"], d["measured"]["allocated_bytes"]);

  // The plan file runs as written, for the budget it was made for.
  auto loaded = RunHeadroom(With({"train-demo", "--plan", plan_file, "--json"}, kSmallGpt));
  ASSERT_EQ(loaded.exit_code, 0) << loaded.err;
  const nlohmann::json l = nlohmann::json::parse(loaded.out);
  EXPECT_EQ(l["measured"], d["measured"]);
  EXPECT_EQ(l["budget_bytes"], d["budget_bytes"]);
  EXPECT_THAT(l["strategy"].get<std::string>(), HasSubstr("hybrid from"));

  // A plan file whose schedule was cut short is refused, naming the file.
  const absl::StatusOr<std::string> plan_text = ReadTextFile(plan_file, kPlanFile);
  ASSERT_TRUE(plan_text.ok()) << plan_text.status();
  nlohmann::json broken = nlohmann::json::parse(*plan_text);
  broken["schedule"].erase(broken["schedule"].size() - 1);
  const std::string broken_file = WriteTempFile("demo-gpt.broken.plan.json", broken.dump());
  auto cut = RunHeadroom(With({"train-demo", "--plan", broken_file}, kSmallGpt));
  EXPECT_EQ(cut.exit_code, 2);
  EXPECT_THAT(cut.err, HasSubstr(broken_file));

  // A plan for another step is refused, naming the file.
  auto other = RunHeadroom(With({"train-demo", "--plan", plan_file, "--layers", "3"}, {"--hidden", "32"}));
  EXPECT_EQ(other.exit_code, 2);
  EXPECT_THAT(other.err, HasSubstr(plan_file));
}

TEST(TrainDemoCli, PrintsTheLossGoingDownAndTheChecks) {
  auto r =
      RunHeadroom({"train-demo", "--model", "mlp", "--strategy", "chen-greedy", "--budget", "80%", "--steps", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("demo-mlp"));
  EXPECT_THAT(r.out, HasSubstr("bitwise the same losses"));
  EXPECT_THAT(r.out, HasSubstr("reserved peak (device)"));
  EXPECT_THAT(r.out, Not(HasSubstr("DIFFER")));
  EXPECT_THAT(r.out, HasSubstr("within the budget"));
}

TEST(TrainDemoCli, BadFlagsAreUsageErrors) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"train-demo", "--model", "resnet"},
        std::vector<std::string>{"train-demo", "--strategy", "fastest"},
        std::vector<std::string>{"train-demo", "--budget", "0%"},
        std::vector<std::string>{"train-demo", "--steps", "0"},
        std::vector<std::string>{"train-demo", "--model", "mlp", "--heads", "2"},
        std::vector<std::string>{"train-demo", "--hidden", "30", "--heads", "4"},
        std::vector<std::string>{"train-demo", "--alloc-conf", "expandable:maybe"},
        std::vector<std::string>{"train-demo", "--plan", "/nonexistent/plan.json"},
        std::vector<std::string>{"train-demo", "--lr", "nan"},
        std::vector<std::string>{"train-demo", "--lr", "-1"},
        std::vector<std::string>{"train-demo", "--batch", "4096", "--seq", "4096"},
        std::vector<std::string>{"train-demo", "--layers", "100000"}}) {
    auto r = RunHeadroom(args);
    EXPECT_EQ(r.exit_code, 2) << args.back() << ": " << r.err;
    EXPECT_FALSE(r.err.empty());
  }
}

// A size of 0 was once read as "not given" and trained the default model.
TEST(TrainDemoCli, ZeroSizesAreRefusedNamingTheFlag) {
  for (const char* flag : {"--layers", "--hidden", "--heads", "--seq", "--vocab", "--batch"}) {
    auto r = RunHeadroom({"train-demo", flag, "0", "--steps", "1"});
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.out;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat(flag, " 0: must be 1 or more"))) << flag;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  auto mlp = RunHeadroom({"train-demo", "--model", "mlp", "--layers", "0", "--steps", "1"});
  EXPECT_EQ(mlp.exit_code, 2);
  EXPECT_THAT(mlp.err, HasSubstr("--layers 0: must be 1 or more"));
}

}  // namespace
}  // namespace headroom
