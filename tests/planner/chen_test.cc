// Chen et al.'s segments: cuts at the narrowest points, sqrt(n) segments,
// and the greedy under a budget, each checked by the independent validator.
#include "planner/chen.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/units.h"
#include "gmock/gmock.h"
#include "graph/liveness.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "planner/plan_memo.h"
#include "planner/planner.h"
#include "planner/remat_solver.h"

namespace headroom {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// `layers` layers of fc + act; with `shared`, every fc also reads a tensor
// made once before the first layer (as a causal mask is).
Graph Chain(int layers, bool shared = false) {
  Graph g("chain");
  TensorId x = g.AddTensor({.name = "x", .shape = {64, 64}, .role = TensorRole::kInput});
  TensorId mask = kNone;
  if (shared) {
    mask = g.AddTensor({.name = "mask", .shape = {64, 64}});
    g.AddOp({.kind = "ones", .name = "make_mask", .outputs = {mask}});
  }
  for (int l = 0; l < layers; ++l) {
    const std::string p = "l" + std::to_string(l);
    TensorId w = g.AddTensor({.name = p + ".w", .shape = {64, 64}, .role = TensorRole::kParameter, .layer = l});
    TensorId h = g.AddTensor({.name = p + ".h", .shape = {64, 64}, .layer = l});
    TensorId a = g.AddTensor({.name = p + ".a", .shape = {64, 64}, .layer = l});
    std::vector<TensorId> in = {x, w};
    if (shared) in.push_back(mask);
    g.AddOp({.kind = "linear", .name = p + ".fc", .inputs = in, .outputs = {h}, .saved = {x}, .layer = l});
    g.AddOp({.kind = "gelu", .name = p + ".act", .inputs = {h}, .outputs = {a}, .saved = {h}, .layer = l});
    x = a;
  }
  TensorId loss = g.AddTensor({.name = "loss", .shape = {}});
  g.AddOp({.kind = "sum", .name = "loss", .inputs = {x}, .outputs = {loss}, .phase = Phase::kLoss});
  return *BuildTrainingStep(g, {});
}

PlanProblem ProblemFor(const Graph& step, uint64_t budget) {
  return {.step = &step, .op_cost = std::vector<double>(step.num_ops(), 1.0), .budget = budget};
}

TEST(ForwardCuts, ChainIsCutEverywhere) {
  const Graph step = Chain(4);
  const ForwardCuts cuts = FindForwardCuts(step);
  EXPECT_EQ(cuts.forward_ops.size(), 8u);
  EXPECT_THAT(cuts.positions, ElementsAre(1, 2, 3, 4, 5, 6, 7));
  EXPECT_EQ(cuts.min_crossing, 1u);
}

TEST(ForwardCuts, SharedTensorsAreSetAside) {
  const Graph step = Chain(4, /*shared=*/true);
  const ForwardCuts cuts = FindForwardCuts(step);
  // make_mask, then fc/act per layer: the mask depends on no input, so it
  // is set aside and the cuts are those of the chain.
  EXPECT_EQ(cuts.min_crossing, 1u);
  EXPECT_THAT(cuts.positions, ElementsAre(2, 3, 4, 5, 6, 7, 8));
  EXPECT_EQ(FindForwardCuts(step, /*linearized=*/true).positions.size(), 7u);  // every position after make_mask
}

TEST(SqrtN, SixteenLayersGiveFourSegments) {
  const Graph step = Chain(8);  // 16 forward ops, 15 cuts: 16 pieces
  const CheckpointPlan plan = SqrtNPlan(step, FindForwardCuts(step));
  EXPECT_EQ(plan.num_segments(), 4);
  const Schedule s = *SegmentSchedule(step, plan);
  const PlanEvaluation e = *EvaluateSchedule(ProblemFor(step, 1), s);
  EXPECT_LT(e.peak_bytes, ProfileMemory(step).peak_bytes);
  EXPECT_TRUE(ValidateSchedule(ProblemFor(step, e.peak_bytes), s).ok());
}

Graph Gpt2Step(int layers) {
  ModelConfig config = *LoadPresetConfig("gpt2");
  config.num_layers = layers;
  // Untied: the tied head's gradient sums its two contributions into a third vocabulary-sized tensor at the
  // embedding's backward (Note [Gradient accumulation]), a floor no plan moves that these budgets would sit under.
  config.tie_word_embeddings = false;
  // The step these tests' figures were taken on: GPT-2's own loss, before ForCausalLMLoss.
  return *BuildTrainingStep(*BuildModelGraph(config, {.batch = 2, .seq_len = 256, .param_dtype = DType::kBF16,
                                                      .compute_dtype = DType::kBF16,
                                                      .runtime = {.transformers = {.major = 4, .minor = 46}}}),
                            {});
}

TEST(ChenGreedy, MeetsBudgetsOnATransformer) {
  const Graph step = Gpt2Step(6);
  const uint64_t store_all = ProfileMemory(step).peak_bytes;
  // Below ~75% the LM head's logits, which no segment can drop, dominate.
  for (double fraction : {0.9, 0.8}) {
    const PlanProblem problem = ProblemFor(step, static_cast<uint64_t>(fraction * static_cast<double>(store_all)));
    absl::StatusOr<PlanResult> r = RunStrategy(problem, Strategy::kChenGreedy);
    ASSERT_TRUE(r.ok()) << fraction << ": " << r.status();
    EXPECT_TRUE(r->fits);
    EXPECT_GT(r->evaluation.extra_cost, 0);
    EXPECT_TRUE(ValidateSchedule(problem, r->schedule).ok()) << ValidateSchedule(problem, r->schedule);
  }
  const absl::StatusOr<PlanResult> impossible = RunStrategy(ProblemFor(step, store_all / 20), Strategy::kChenGreedy);
  EXPECT_EQ(impossible.status().code(), absl::StatusCode::kResourceExhausted);
  // The smallest peak it names is SmallestPeak's, and no fitting plan goes lower.
  const uint64_t lowest = *SmallestPeak(ProblemFor(step, store_all), Strategy::kChenGreedy);
  EXPECT_THAT(impossible.status().message(), HasSubstr("smallest peak is " + FormatBytes(lowest)));
  const PlanResult at_lowest = *RunStrategy(ProblemFor(step, lowest), Strategy::kChenGreedy);
  EXPECT_EQ(at_lowest.evaluation.peak_bytes, lowest);
  EXPECT_FALSE(RunStrategy(ProblemFor(step, lowest - 1), Strategy::kChenGreedy).ok());
  EXPECT_EQ(*SmallestPeak(ProblemFor(step, store_all), Strategy::kStoreAll), store_all);
}

TEST(Strategies, EveryStrategyIsValidOnATransformer) {
  const Graph step = Gpt2Step(4);
  const uint64_t store_all = ProfileMemory(step).peak_bytes;
  const PlanProblem problem = ProblemFor(step, store_all);
  for (const absl::StatusOr<PlanResult>& r : CompareStrategies(problem)) {
    ASSERT_TRUE(r.ok()) << r.status();
    SCOPED_TRACE(std::string(StrategyName(r->strategy)));
    EXPECT_LE(r->evaluation.peak_bytes, store_all);
    EXPECT_TRUE(ValidateSchedule(ProblemFor(step, r->evaluation.peak_bytes), r->schedule).ok());
  }
  EXPECT_EQ(*ParseStrategy("chen-greedy"), Strategy::kChenGreedy);
  EXPECT_EQ(*ParseStrategy("chain-dp"), Strategy::kChainDp);
  EXPECT_EQ(*ParseStrategy("hybrid"), Strategy::kHybrid);
  EXPECT_THAT(ParseStrategy("magic").status().message(), HasSubstr("store-all"));
}

// Under a budget that needs a plan, every budget-driven strategy meets it
// with a schedule the independent validator accepts at that budget; optimal,
// which starts from the other replay strategies' plans, replays no more than
// any of them; and each strategy's smallest peak is one it reaches.
TEST(Strategies, BudgetDrivenStrategiesFitAndValidate) {
  const Graph step = Gpt2Step(4);
  const uint64_t store_all = ProfileMemory(step).peak_bytes;
  PlanProblem problem = ProblemFor(step, store_all / 10 * 8);
  problem.copy_bytes_per_cost = 1 << 20;  // a MiB per op's time: copies overlap a few ops
  std::map<Strategy, PlanResult> results;
  for (Strategy s : {Strategy::kChenGreedy, Strategy::kChainDp, Strategy::kOptimal, Strategy::kOffload,
                     Strategy::kHybrid}) {
    SCOPED_TRACE(std::string(StrategyName(s)));
    absl::StatusOr<PlanResult> r = RunStrategy(problem, s);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->fits);
    EXPECT_TRUE(ValidateSchedule(problem, r->schedule).ok()) << ValidateSchedule(problem, r->schedule);
    EXPECT_GT(r->evaluation.step_cost, r->evaluation.base_cost - 1e-9);
    absl::StatusOr<uint64_t> smallest = SmallestPeak(problem, s);
    ASSERT_TRUE(smallest.ok()) << smallest.status();
    EXPECT_LT(*smallest, store_all);
    results.emplace(s, *std::move(r));
  }
  EXPECT_GT(results.at(Strategy::kOffload).evaluation.offloaded_bytes, 0u);
  // SmallestPeaks shares the searches and gives each strategy's own figure.
  const std::vector<Strategy> all = AllStrategies();
  const std::vector<absl::StatusOr<uint64_t>> peaks = SmallestPeaks(problem, all);
  ASSERT_EQ(peaks.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(std::string(StrategyName(all[i])));
    const absl::StatusOr<uint64_t> one = SmallestPeak(problem, all[i]);
    ASSERT_EQ(peaks[i].ok(), one.ok()) << peaks[i].status() << one.status();
    if (one.ok()) {
      EXPECT_EQ(*peaks[i], *one);
    }
  }
  // Alike layers: chain-dp checkpoints leading ones (Note [Block-shaped plans]),
  // so every replay is of a layer before the first kept one.
  const PlanResult& chain = results.at(Strategy::kChainDp);
  EXPECT_THAT(chain.detail, HasSubstr("leading layers"));
  int last_replayed = -1;
  int first_kept = 1 << 30;
  for (const ScheduleEntry& e : chain.schedule.entries) {
    if (e.action == ScheduleAction::kRecompute && step.op(e.target).layer >= 0) {
      last_replayed = std::max(last_replayed, step.op(e.target).layer);
    }
  }
  for (const Op& op : step.ops()) {
    if (op.layer > last_replayed && IsForwardPhase(op.phase)) first_kept = std::min(first_kept, op.layer);
  }
  EXPECT_GE(last_replayed, 0);
  EXPECT_EQ(first_kept, last_replayed + 1);
  EXPECT_EQ(results.at(Strategy::kChainDp).evaluation.offloaded_bytes, 0u);
  ASSERT_TRUE(results.at(Strategy::kOptimal).lower_bound_extra_cost.has_value());
  const double optimal = results.at(Strategy::kOptimal).evaluation.extra_cost;
  EXPECT_LE(optimal, results.at(Strategy::kChenGreedy).evaluation.extra_cost + 1e-9);
  EXPECT_LE(optimal, results.at(Strategy::kChainDp).evaluation.extra_cost + 1e-9);
  EXPECT_LE(*results.at(Strategy::kOptimal).lower_bound_extra_cost, optimal + 1e-9);

  // chain-dp's smallest peak is exact: it fits there and not a byte below.
  const uint64_t least = *SmallestPeak(problem, Strategy::kChainDp);
  EXPECT_TRUE(RunStrategy(ProblemFor(step, least), Strategy::kChainDp)->fits);
  const absl::StatusOr<PlanResult> below = RunStrategy(ProblemFor(step, least - 1), Strategy::kChainDp);
  EXPECT_EQ(below.status().code(), absl::StatusCode::kResourceExhausted) << below.status();
}

// Past the search's size (Note [Optimal beyond the solvers]) optimal is the
// cheapest of the other replay plans with the knapsack bound under it.
TEST(Strategies, OptimalBeyondTheSearchKeepsABound) {
  const Graph step = Gpt2Step(21);
  ASSERT_GT(step.num_ops(), kMaxRematOps);
  const PlanProblem problem = ProblemFor(step, ProfileMemory(step).peak_bytes / 10 * 8);
  absl::StatusOr<PlanResult> optimal = RunStrategy(problem, Strategy::kOptimal);
  ASSERT_TRUE(optimal.ok()) << optimal.status();
  EXPECT_TRUE(optimal->fits);
  EXPECT_THAT(optimal->detail, HasSubstr("over the search's 1024"));
  ASSERT_TRUE(optimal->lower_bound_extra_cost.has_value());
  EXPECT_GT(*optimal->lower_bound_extra_cost, 0);
  EXPECT_LE(*optimal->lower_bound_extra_cost, optimal->evaluation.extra_cost);
  for (Strategy other : {Strategy::kChenGreedy, Strategy::kChainDp, Strategy::kSqrtN}) {
    absl::StatusOr<PlanResult> r = RunStrategy(problem, other);
    if (r.ok() && r->fits) {
      EXPECT_LE(optimal->evaluation.extra_cost, r->evaluation.extra_cost) << StrategyName(other);
    }
  }
  const absl::StatusOr<uint64_t> least = SmallestPeak(problem, Strategy::kOptimal);
  ASSERT_TRUE(least.ok()) << least.status();
  EXPECT_TRUE(RunStrategy(ProblemFor(step, *least), Strategy::kOptimal)->fits);
}

// Note [Pipeline in-flight]: with k micro-batches in flight every entry
// carries k - 1 times what the forward leaves; the evaluation and the
// independent validator agree on it to the byte, for plans that keep,
// replay and offload; and budget-driven strategies plan for it.
TEST(Strategies, InFlightMicroBatchesHoldWhatTheirForwardLeaves) {
  const Graph step = Gpt2Step(4);
  PlanProblem one = ProblemFor(step, ProfileMemory(step).peak_bytes);
  one.copy_bytes_per_cost = 1 << 20;
  PlanProblem three = one;
  three.in_flight = 3;
  std::vector<Schedule> schedules = {StoreAllSchedule(step)};
  for (Strategy s : {Strategy::kSqrtN, Strategy::kOffload}) {
    PlanProblem tight = one;
    tight.budget = one.budget / 10 * 8;
    absl::StatusOr<PlanResult> r = RunStrategy(tight, s);
    ASSERT_TRUE(r.ok()) << r.status();
    schedules.push_back(r->schedule);
  }
  for (const Schedule& schedule : schedules) {
    const PlanEvaluation e1 = *EvaluateSchedule(one, schedule);
    const PlanEvaluation e3 = *EvaluateSchedule(three, schedule);
    EXPECT_EQ(e1.held_after_forward, 0u);
    ASSERT_GT(e3.held_after_forward, 0u);
    EXPECT_LT(e3.held_after_forward, e1.peak_bytes);
    uint64_t expected = 0;
    for (uint64_t live : e1.live_bytes) expected = std::max(expected, live + 2 * e3.held_after_forward);
    EXPECT_EQ(e3.peak_bytes, expected);
    PlanProblem at = three;
    at.budget = e3.peak_bytes;
    EXPECT_TRUE(ValidateSchedule(at, schedule).ok()) << ValidateSchedule(at, schedule);
    at.budget = e3.peak_bytes - 1;
    EXPECT_FALSE(ValidateSchedule(at, schedule).ok());
  }
  // Planning for the pipelined peak: fits, validated, no bound claimed.
  const PlanEvaluation store_all = *EvaluateSchedule(three, StoreAllSchedule(step));
  three.budget = store_all.peak_bytes / 20 * 19;
  for (Strategy s : {Strategy::kChainDp, Strategy::kOptimal, Strategy::kHybrid}) {
    absl::StatusOr<PlanResult> r = RunStrategy(three, s);
    ASSERT_TRUE(r.ok()) << StrategyName(s) << ": " << r.status();
    EXPECT_TRUE(r->fits) << StrategyName(s);
    EXPECT_FALSE(r->lower_bound_extra_cost.has_value()) << StrategyName(s);
    EXPECT_TRUE(ValidateSchedule(three, r->schedule).ok()) << ValidateSchedule(three, r->schedule);
  }
  three.in_flight = 0;
  EXPECT_THAT(ValidateProblem(three).message(), HasSubstr("micro-batches in flight"));
}

// Note [Never worse than its starts]: replanned for micro-batches in
// flight, optimal is never costlier than chen-greedy, chain-dp or sqrt-n
// on the same problem, and fits wherever one of them does.
TEST(Strategies, PipelinedOptimalIsNeverWorseThanItsStarts) {
  const Graph step = Gpt2Step(4);
  PlanProblem four = ProblemFor(step, ProfileMemory(step).peak_bytes);
  four.in_flight = 4;
  const PlanEvaluation store_all = *EvaluateSchedule(four, StoreAllSchedule(step));
  int compared = 0;
  for (int percent : {80, 50, 30}) {
    four.budget = store_all.peak_bytes / 100 * static_cast<uint64_t>(percent);
    absl::StatusOr<PlanResult> optimal = RunStrategy(four, Strategy::kOptimal);
    for (Strategy start : {Strategy::kChenGreedy, Strategy::kChainDp, Strategy::kSqrtN}) {
      absl::StatusOr<PlanResult> r = RunStrategy(four, start);
      if (!r.ok() || !r->fits) continue;
      ++compared;
      ASSERT_TRUE(optimal.ok()) << percent << "%: " << optimal.status();
      EXPECT_TRUE(optimal->fits) << percent << "%";
      EXPECT_LE(optimal->evaluation.step_cost, r->evaluation.step_cost) << percent << "% " << StrategyName(start);
    }
  }
  EXPECT_GT(compared, 0);
}

// Note [Plan memo]: problems sharing a memo get the answers they get
// without one, however they differ (costs, micro-batches in flight, runner,
// budget), and the memo keeps one sweep per difference but the budget.
TEST(Strategies, AMemoChangesNoAnswer) {
  const Graph step = Gpt2Step(2);
  const uint64_t store_all = ProfileMemory(step).peak_bytes;
  PlanProblem base = ProblemFor(step, store_all);
  PlanProblem recosted = base;
  for (size_t i = 0; i < recosted.op_cost.size(); ++i) recosted.op_cost[i] = 1e-3 * static_cast<double>(i % 5 + 1);
  PlanProblem in_flight = base;
  in_flight.in_flight = 2;
  PlanProblem selective = base;
  selective.runner = PlanRunner::kTorchSelectiveCheckpoint;
  auto memo = std::make_shared<PlanMemo>();
  for (const PlanProblem* variant : {&base, &recosted, &in_flight, &selective}) {
    for (int percent : {85, 5}) {
      PlanProblem without = *variant;
      without.budget = store_all / 100 * static_cast<uint64_t>(percent);
      PlanProblem with = without;
      with.memo = memo;
      SCOPED_TRACE(testing::Message() << "variant " << variant - &base << ", " << percent << "%");
      for (Strategy s : {Strategy::kChenGreedy, Strategy::kOptimal}) {
        const absl::StatusOr<PlanResult> a = RunStrategy(without, s);
        const absl::StatusOr<PlanResult> b = RunStrategy(with, s);
        ASSERT_EQ(a.status(), b.status());
        if (a.ok()) {
          EXPECT_EQ(a->schedule, b->schedule) << StrategyName(s);
          EXPECT_EQ(a->evaluation.step_cost, b->evaluation.step_cost);
        }
      }
      EXPECT_EQ(SmallestPeak(without, Strategy::kChenGreedy).value(), SmallestPeak(with, Strategy::kChenGreedy).value());
    }
  }
  // Base, recosted and selective: the pipelined problem plans one micro-batch
  // (Note [Pipeline budgets]), the base one, and so do smallest peaks.
  EXPECT_EQ(memo->chen_sweeps_kept(), 3u);
}

// A graph without layers has no chain: chain-dp says so; the others plan it.
TEST(Strategies, ChainDpNeedsLayers) {
  Graph g("dag");
  TensorId x = g.AddTensor({.name = "x", .shape = {64, 64}, .role = TensorRole::kInput});
  for (int i = 0; i < 4; ++i) {
    const std::string p = "op" + std::to_string(i);
    TensorId w = g.AddTensor({.name = p + ".w", .shape = {64, 64}, .role = TensorRole::kParameter});
    TensorId y = g.AddTensor({.name = p + ".y", .shape = {64, 64}});
    g.AddOp({.kind = "linear", .name = p, .inputs = {x, w}, .outputs = {y}, .saved = {x}});
    x = y;
  }
  TensorId loss = g.AddTensor({.name = "loss", .shape = {}});
  g.AddOp({.kind = "sum", .name = "loss", .inputs = {x}, .outputs = {loss}, .phase = Phase::kLoss});
  const Graph step = *BuildTrainingStep(g, {});
  const absl::StatusOr<PlanResult> r = RunStrategy(ProblemFor(step, ProfileMemory(step).peak_bytes), Strategy::kChainDp);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("layer"));
}

}  // namespace
}  // namespace headroom
