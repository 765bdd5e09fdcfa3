// `headroom plan`: a plan that fits, the comparison table, plan files that
// round-trip, and the error paths (one line naming the input).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "common/quote.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/run_command.h"

namespace headroom {
namespace {

using ::headroom::testing::RunHeadroom;
using ::headroom::testing::WriteTempFile;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(PlanCli, Gpt2FitsEightyPercentOfItsPeak) {
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--strategy", "chen-greedy"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("(80% of the store-all peak)"));
  EXPECT_THAT(r.out, HasSubstr("strategy:    chen-greedy"));
  EXPECT_THAT(r.out, HasSubstr(": fits"));
  EXPECT_THAT(r.out, HasSubstr("replays"));
}

// Note [Remat work limits]: GPT-2's bound LP is over the column limit, so
// the optimal strategy plans without it and says so, with the knapsack bound.
TEST(PlanCli, OptimalSaysWhenItsLpIsTooLarge) {
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--strategy", "optimal"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(": fits"));
  EXPECT_THAT(r.out, HasSubstr("no LP bound: the LP's"));
  EXPECT_THAT(r.out, HasSubstr("columns are over the 200000 it solves in seconds; knapsack bound"));
}

TEST(PlanCli, CompareListsEveryStrategyInJson) {
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--budget", "90%", "--compare", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_GE(j["plans"].size(), 4u);
  EXPECT_EQ(j["plans"][0]["strategy"], "store-all");
  EXPECT_EQ(j["plans"][0]["evaluation"]["peak_bytes"], j["store_all"]["peak_bytes"]);
  EXPECT_EQ(j["plans"][0]["fits"], false);  // 90% of its own peak
  EXPECT_GT(j["budget_bytes"].get<uint64_t>(), 0u);
}

// A plan as the allocator sees it: the trace --trace-out writes is the
// sequence behind the report's allocator figures (resident state, then the
// plan's tensors), so `headroom replay` of it gives them back; the SVG is a
// drawing of the same step, and the report lays out the arena no smaller
// than its lower bound.
TEST(PlanCli, TraceAndTimelineOfOnePlan) {
  const std::string trace = WriteTempFile("gpt2.plan.rmm.csv", "");
  const std::string svg = WriteTempFile("gpt2.plan.svg", "");
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--strategy", "hybrid", "--json",
                        "--trace-out", trace, "--svg", svg});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const uint64_t peak = j["plans"][0]["evaluation"]["peak_bytes"];
  EXPECT_GE(j["arena"]["bytes"].get<uint64_t>(), j["arena"]["lower_bound_bytes"].get<uint64_t>());
  EXPECT_GE(j["arena"]["lower_bound_bytes"].get<uint64_t>(), peak);  // sizes rounded up to 512 bytes
  EXPECT_GT(j["arena"]["naive_bytes"].get<uint64_t>(), j["arena"]["bytes"].get<uint64_t>());

  auto replay = RunHeadroom({"replay", trace, "--json"});
  ASSERT_EQ(replay.exit_code, 0) << replay.err;
  const nlohmann::json replayed = nlohmann::json::parse(replay.out)["runs"][0];
  EXPECT_EQ(replayed["peak_live_bytes"].get<uint64_t>(), j["allocator"]["requested_bytes"].get<uint64_t>());
  EXPECT_EQ(replayed["peak_reserved_bytes"].get<uint64_t>(), j["allocator"]["reserved_bytes"].get<uint64_t>());
  EXPECT_GT(j["allocator"]["requested_bytes"].get<uint64_t>(), peak);  // the weights and optimizer state too

  std::ifstream in(svg);
  const std::string drawing((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(drawing.rfind("<svg", 0), 0u);
  EXPECT_THAT(drawing, HasSubstr("gpt2: hybrid plan"));
  EXPECT_THAT(drawing, HasSubstr("budget"));
  EXPECT_THAT(drawing, HasSubstr("offload / prefetch"));

  auto compare = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--compare", "--svg", svg});
  EXPECT_EQ(compare.exit_code, 2);
  EXPECT_THAT(compare.err, HasSubstr("drop --compare"));
}

// An EMA copy on the GPU is fixed state that shrinks the --gpu budget; on
// the CPU it is host state and the budget is as without it.
TEST(PlanCli, EmaCopyIsFixedStateOrHostState) {
  struct Budget {
    int64_t bytes, fixed, host;
  };
  auto budget = [](const std::string& ema) {
    auto r = RunHeadroom({"plan", "--model", "gpt2", "--gpu", "t4", "--ema", ema, "--strategy", "store-all", "--json"});
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    return Budget{j["budget_bytes"].get<int64_t>(), j["fixed_bytes"]["optimizer_state"].get<int64_t>(),
                  j["host_state_bytes"].get<int64_t>()};
  };
  const Budget none = budget("none"), gpu = budget("gpu"), cpu = budget("cpu");
  const int64_t gpt2_fp32_copy = 4 * 124439808;  // GPT-2's parameters, tied head counted once
  EXPECT_EQ(none.host, 0);
  EXPECT_EQ(cpu.bytes, none.bytes);
  EXPECT_EQ(cpu.fixed, none.fixed);
  EXPECT_EQ(cpu.host, gpt2_fp32_copy);
  EXPECT_EQ(gpu.host, 0);
  EXPECT_EQ(gpu.fixed - none.fixed, gpt2_fp32_copy);
  // Its bytes and what the allocator reserves for them (Note [Plan budget]).
  EXPECT_LE(gpu.bytes, none.bytes - gpt2_fp32_copy);
}

// --pp: the fullest stage's step, half of GPT-2's layers renumbered from 0,
// with two micro-batches in flight, planned to fit; Megatron's flags then
// count the stage's layers.
TEST(PlanCli, PipelineStageWithMicroBatchesInFlight) {
  auto whole = RunHeadroom({"plan", "--model", "gpt2", "--budget", "90%", "--strategy", "store-all", "--json"});
  ASSERT_TRUE(whole.exit_code == 0 || whole.exit_code == 1) << whole.err;
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--pp", "2", "--gpus", "2", "--grad-accum", "4", "--budget",
                        "90%", "--strategy", "chain-dp", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["pipeline"]["in_flight"], 2);
  EXPECT_EQ(j["pipeline"]["stage"], 0);
  EXPECT_LT(j["ops"].get<int>(), nlohmann::json::parse(whole.out)["ops"].get<int>() * 6 / 10);
  EXPECT_EQ(j["plans"][0]["fits"], true);
  EXPECT_GT(j["plans"][0]["evaluation"]["held_after_forward_bytes"].get<uint64_t>(), 0u);
  auto megatron = RunHeadroom({"plan", "--model", "gpt2", "--pp", "2", "--gpus", "2", "--grad-accum", "4",
                               "--budget", "90%", "--strategy", "chain-dp", "--emit", "megatron"});
  ASSERT_EQ(megatron.exit_code, 0) << megatron.err;
  EXPECT_THAT(megatron.out, HasSubstr("6 layers"));
  // More stages than layers is refused, naming the flag.
  auto too_many = RunHeadroom({"plan", "--model", "gpt2", "--pp", "16", "--gpus", "16", "--budget", "90%"});
  EXPECT_EQ(too_many.exit_code, 2);
  EXPECT_THAT(too_many.err, HasSubstr("--pp"));
}

TEST(PlanCli, PlanFileRoundTrips) {
  const std::string path = WriteTempFile("gpt2.plan.json", "");
  auto planned = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--strategy", "sqrt-n", "--out", path});
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  auto loaded = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--load", path});
  ASSERT_EQ(loaded.exit_code, 0) << loaded.err;
  EXPECT_THAT(loaded.out, HasSubstr("strategy:    sqrt-n (loaded from"));
  // Same schedule, same peak line.
  auto peak_line = [](const std::string& text) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("peak:", 0) == 0) return line;
    }
    return std::string();
  };
  EXPECT_EQ(peak_line(planned.out), peak_line(loaded.out));
  // The file's tensors: their lives give the plan's peak, and tensors alive
  // at the same entry never share arena bytes.
  std::ifstream in(path);
  const nlohmann::json file = nlohmann::json::parse(in);
  const size_t entries = file["schedule"].size();
  std::vector<uint64_t> live(entries, 0);
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(entries);
  for (const nlohmann::json& t : file["tensors"]) {
    const uint64_t bytes = t[1];
    const size_t first = t[2];
    const size_t last = t[3];
    const uint64_t offset = t[4];
    ASSERT_LE(first, last);
    ASSERT_LT(last, entries);
    for (size_t i = first; i <= last; ++i) {
      live[i] += bytes;
      if (bytes > 0) ranges[i].push_back({offset, offset + bytes});
    }
  }
  EXPECT_EQ(*std::max_element(live.begin(), live.end()),
            nlohmann::json::parse(RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--load", path, "--json"})
                                      .out)["plans"][0]["evaluation"]["peak_bytes"]
                .get<uint64_t>());
  for (std::vector<std::pair<uint64_t, uint64_t>>& at : ranges) {
    std::sort(at.begin(), at.end());
    for (size_t k = 1; k < at.size(); ++k) ASSERT_LE(at[k - 1].second, at[k].first);
  }
  // A plan for another step is refused, naming the file.
  auto other = RunHeadroom({"plan", "--model", "gpt2", "--seq", "512", "--budget", "80%", "--load", path});
  EXPECT_EQ(other.exit_code, 2);
  EXPECT_THAT(other.err, HasSubstr(path + ": the plan is for a step of"));
}

TEST(PlanCli, NodeLinkGraphAtNinetyPercent) {
  const std::string graph = std::string(HEADROOM_SOURCE_DIR) + "/../shared/data/checkmate_vgg16_b256_train.nx.json";
  if (!std::filesystem::exists(graph)) GTEST_SKIP() << graph << " is not here";
  auto r = RunHeadroom({"plan", "--model", graph, "--budget", "90%", "--compare"});
  EXPECT_THAT(r.out, HasSubstr("costs from the graph's measured costs"));
  EXPECT_THAT(r.out, HasSubstr("units"));
}

// MOCCASIN's random_layered DAGs: no loss, no `backward`, numbers for names.
// The DAG is the whole computation and any node may be replayed (Note
// [Node-link graphs without backward] in models/node_link.h): every strategy
// plans it, and the plan it reports fits its budget; chain-dp, which plans
// layer stacks, says that a graph without layers has no chain (as
// Strategies.ChainDpNeedsLayers has it). Below store-all's peak only
// replays between forward ops help, which optimal (and so auto) finds.
std::string RandomLayeredDag() {
  return std::string(HEADROOM_SOURCE_DIR) + "/tests/fuzz/corpus/node_link/random_layered.nx.json";
}

void ExpectFits(const std::vector<std::string>& args) {
  auto r = RunHeadroom(args);
  ASSERT_EQ(r.exit_code, 0) << args.back() << ": " << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["plans"].size(), 1u);
  const nlohmann::json& plan = j["plans"][0];
  EXPECT_EQ(plan["fits"], true) << plan["strategy"];
  EXPECT_LE(plan["evaluation"]["peak_bytes"].get<uint64_t>(), j["budget_bytes"].get<uint64_t>()) << plan["strategy"];
}

TEST(PlanCli, RandomLayeredDagPlansWithEveryStrategy) {
  const std::string dag = RandomLayeredDag();
  for (const char* strategy :
       {"auto", "store-all", "sqrt-n", "sqrt-n-linear", "chen-greedy", "optimal", "offload", "hybrid"}) {
    ExpectFits({"plan", "--model", dag, "--budget", "100%", "--json", "--strategy", strategy});
  }
  auto chain = RunHeadroom({"plan", "--model", dag, "--budget", "100%", "--strategy", "chain-dp"});
  EXPECT_EQ(chain.exit_code, 2);
  EXPECT_THAT(chain.err, HasSubstr("has no layers"));

  auto r = RunHeadroom({"plan", "--model", dag, "--budget", "80%", "--strategy", "optimal"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Plan for " + dag + ": 19 ops, costs from the graph's measured costs"));
  EXPECT_THAT(r.out, HasSubstr(": fits"));
  EXPECT_THAT(r.out, Not(HasSubstr(" 0 replays")));
  for (const char* strategy : {"optimal", "auto"}) {
    ExpectFits({"plan", "--model", dag, "--budget", "80%", "--json", "--strategy", strategy});
  }
}

// cost_cpu in any unit up to 1e30 plans (the LP sees costs scaled to 1, Note
// [Remat cost scale] in planner/remat_lp.cc; CLP asserts on 1e25 unscaled);
// beyond that, or negative, it is refused in one line naming the node.
TEST(PlanCli, NodeLinkCostsAreScaledOrRefused) {
  // The random_layered DAG with node 2's cost_cpu replaced.
  auto dag = [](const std::string& name, const std::string& cost) {
    std::ifstream in(RandomLayeredDag());
    nlohmann::json graph = nlohmann::json::parse(in);
    graph["nodes"][2]["cost_cpu"] = nlohmann::json::parse(cost);
    return WriteTempFile(name, graph.dump());
  };
  for (const char* cost : {"1e25", "1e29"}) {
    const std::string graph = dag(std::string("cost") + cost + ".nx.json", cost);
    ExpectFits({"plan", "--model", graph, "--budget", "80%", "--json", "--strategy", "optimal"});
    auto r = RunHeadroom({"plan", "--model", graph, "--budget", "80%", "--compare"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, Not(HasSubstr("nan")));
  }
  for (const auto& [cost, message] : {std::pair<std::string, std::string>{"1e308", "1e+308 (node '2') is not a cost"},
                                      {"-4", "-4 (node '2') is not a cost"}}) {
    const std::string graph = dag("bad_cost.nx.json", cost);
    auto r = RunHeadroom({"plan", "--model", graph, "--budget", "80%"});
    EXPECT_EQ(r.exit_code, 2) << cost;
    EXPECT_THAT(r.err, HasSubstr(graph + ": nodes[2].cost_cpu: " + message));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// A node-link graph's name and node names are the file's: errors quote them
// (escaped to one line, no terminal escapes, cut), as every strategy
// reports them. Each of these printed a 100 KB line with the escape in it.
TEST(PlanCli, NamesFromGraphFilesAreQuotedInErrors) {
  const std::string evil = "\x1b[31mred\nheadroom: ok" + std::string(100000, 'x');
  nlohmann::json graph = {{"directed", true}, {"multigraph", false}, {"graph", {{"name", evil + "graph"}}}};
  graph["nodes"] = nlohmann::json::array();
  const char* names[] = {"conv", "relu", "relu_grad", "conv_grad"};
  for (int i = 0; i < 4; ++i) {
    graph["nodes"].push_back(
        {{"id", i}, {"name", evil + names[i]}, {"backward", i >= 2}, {"cost_cpu", 1 + i}, {"cost_ram", 100}});
  }
  graph["links"] = nlohmann::json::array();
  for (auto [source, target] : {std::pair{0, 1}, {1, 2}, {0, 3}, {2, 3}}) {
    graph["links"].push_back({{"source", source}, {"target", target}});
  }
  const std::string file = WriteTempFile("evil_names.nx.json", graph.dump());
  for (const char* strategy : {"auto", "optimal", "chen-greedy", "offload", "hybrid", "chain-dp"}) {
    auto r = RunHeadroom({"plan", "--model", file, "--budget", "1", "--strategy", strategy});
    EXPECT_NE(r.exit_code, 0) << strategy;
    EXPECT_THAT(r.err, HasSubstr(R"('\x1b[31mred\nheadroom: ok)")) << strategy << ": " << r.err.substr(0, 300);
    EXPECT_THAT(r.err, HasSubstr("...' (1000")) << strategy;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << strategy;
    EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << strategy;
    EXPECT_LT(r.err.size(), 2000u) << strategy;
  }
}

TEST(PlanCli, BadInputIsOneLineNamingIt) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"plan", "--model", "gpt2", "--budget", "80%", "--strategy", "magic"}, "--strategy: unknown strategy 'magic'"},
      {{"plan", "--model", "gpt2"}, "--budget or --gpu"},
      {{"plan", "--model", "gpt2", "--budget", "-5%"}, "--budget: '-5%' is not a percentage"},
      {{"plan", "--model", "gpt2", "--budget", "lots"}, "--budget:"},
      {{"plan", "--model", "gpt2", "--budget", "1GiB", "--inference"}, "nothing to plan"},
      {{"plan", "--model", "gpt2", "--budget", "1GiB", "--checkpoint", "full"}, "--checkpoint: the planner chooses"},
      {{"plan", "--model", "llama-2-70b", "--gpu", "T4"}, "already fills"},
      {{"plan", "--model", "gpt2", "--budget", "1GiB", "--load", "/nonexistent/plan.json"}, "/nonexistent/plan.json"},
  };
  for (const Case& c : cases) {
    auto r = RunHeadroom(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.message << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  const std::string bad = WriteTempFile("bad.plan.json", R"({"format": "headroom-plan", "version": 9})");
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--budget", "1GiB", "--load", bad});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("version 9 is not one this Headroom reads"));
}

// Note [JSON nesting bound]: a plan file of 100,000 '[' is refused at level
// 129, at once and in one line, where it took memory in proportion to its
// depth before (a 50 MB one: 3 GB) and aborted under a memory limit.
TEST(PlanCli, LoadRefusesDeepNestingInOneLine) {
  const std::string deep = WriteTempFile("deep.plan.json", std::string(100'000, '['));
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--load", deep});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "headroom plan: " + deep +
                       ": arrays and objects nested 129 deep at byte 129, more than the 128 levels an input may "
                       "have\n");
}

// Note [Input bounds]: a plan file is at most 256 MiB; a larger one (sparse
// here: no disk blocks) is refused before it is read.
TEST(PlanCli, LoadRefusesAPlanFileBeyondItsBound) {
  const std::string huge = WriteTempFile("huge.plan.json", "{}");
  std::filesystem::resize_file(huge, (uint64_t{256} << 20) + 1);
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--load", huge});
  std::filesystem::remove(huge);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "headroom plan: " + huge + ": 268435457 bytes is more than the 256.00 MiB a plan file may have\n");
}

// Under a memory limit a plan file too large for it is one line naming it
// (exit 1: the input is valid, the machine is short), not SIGABRT (Note
// [Operator new that throws] in cli/operator_new.cc). 24 MB of `[{},...]`
// takes about 650 MB parsed; the limit is 384 MiB of address space, which
// `headroom` fits in up to the parse (it does with 200 MB).
// Sanitizer builds report running out of memory their own way.
#include "common/sanitizer_build.h"
#ifndef HEADROOM_SANITIZER_NEW
TEST(PlanCli, LoadOutOfMemoryIsOneLineNamingTheFile) {
  std::string objects = "[{}";
  for (int i = 0; i < 8'000'000; ++i) objects += ",{}";
  objects += "]";
  const std::string flat = WriteTempFile("flat.plan.json", objects);
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--load", flat},
                       {.address_space_limit = uint64_t{384} << 20});
  std::filesystem::remove(flat);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("headroom plan: " + flat + ": out of memory parsing its 22.89 MiB of JSON"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}
#endif

TEST(PlanCli, ImpossibleBudgetStatesTheSmallestReachable) {
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--budget", "5%"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("the smallest peak any strategy reaches is"));
}

// A plan that does not look at the budget names itself and its peak: "no
// plan fits 1.33 GiB; the smallest peak any strategy reaches is 870.36 MiB"
// contradicted itself (issue [13]).
TEST(PlanCli, APlanBlindToTheBudgetSaysItsOwnPeak) {
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--strategy", "store-all"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("headroom plan: the store-all plan peaks at 1.66 GiB, over the budget of 1.33 GiB; "
                               "the smallest peak any strategy reaches is 870.36 MiB (sqrt-n)"));
  EXPECT_THAT(r.err, Not(HasSubstr("no plan fits")));
  auto all = RunHeadroom({"plan", "--model", "gpt2", "--budget", "5%", "--compare"});
  EXPECT_EQ(all.exit_code, 1);
  EXPECT_THAT(all.err, HasSubstr("headroom plan: no plan fits the budget of 85.14 MiB; the smallest peak any"));
}

}  // namespace
}  // namespace headroom
