// The chain-dp strategy against brute force on small random chains, its
// errors, and its plans as the step builder's checkpoint plans.
//
// Exactness: RandomChain's byte figures are whole MiB, so the DP at a 1 MiB
// unit rounds nothing and must match BruteForceChainPlan at a 1-byte unit,
// the model in exact bytes. At coarser units both run the same
// discretization (the unit ChainDpOptions resolves to) and must agree too.
#include "planner/chain_dp.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/units.h"
#include "gmock/gmock.h"
#include "graph/liveness.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "planner/checkpoint_mode_plan.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace headroom {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Budgets from below the model's minimum to above keeping everything.
std::vector<uint64_t> BudgetsFor(const Chain& chain) {
  const uint64_t least = *MinimumChainPeak(chain);
  const uint64_t all = UniformChainPlan(chain, StageChoice::kKeepAll).predicted_peak;
  std::vector<uint64_t> budgets = {least - 1, least, all, all + kMiB};
  for (double f : {0.05, 0.2, 0.4, 0.6, 0.8, 0.95}) {
    budgets.push_back(least + static_cast<uint64_t>(f * static_cast<double>(all - least)));
  }
  return budgets;
}

// What the cases compared exercised, so that a weak generator shows.
struct Seen {
  int refused = 0;
  int free = 0;           // nothing replayed
  int selective = 0;      // plans with a selective stage
  int long_segment = 0;   // plans with a segment of two or more stages
};

// Both succeed with plans of the same cost that fit, or both refuse.
void ExpectSameAnswer(const Chain& chain, const ChainDpOptions& dp, const ChainDpOptions& brute,
                      const std::string& context, Seen& seen) {
  absl::StatusOr<ChainPlan> fast = SolveChainDp(chain, dp);
  absl::StatusOr<ChainPlan> slow = BruteForceChainPlan(chain, brute);
  ASSERT_EQ(fast.ok(), slow.ok()) << context << "\nDP: " << fast.status() << "\nbrute force: " << slow.status();
  if (!fast.ok()) {
    EXPECT_THAT(fast.status().message(), HasSubstr("budget")) << context;
    ++seen.refused;
    return;
  }
  seen.free += fast->extra_cost == 0 ? 1 : 0;
  seen.selective += std::count(fast->choice.begin(), fast->choice.end(), StageChoice::kSelective) > 0 ? 1 : 0;
  seen.long_segment += std::any_of(fast->segments.begin(), fast->segments.end(),
                                   [](const ChainSegment& s) { return s.last > s.first; });
  // Integer costs (RandomChain) sum exactly in any order.
  EXPECT_EQ(fast->extra_cost, slow->extra_cost) << context;
  for (const ChainPlan* plan : {&*fast, &*slow}) {
    ASSERT_TRUE(plan->Validate(chain).ok()) << context << plan->Validate(chain);
    EXPECT_LE(plan->predicted_peak, dp.budget) << context;
    absl::StatusOr<ChainPlanCost> exact = EvaluateChainPlan(chain, *plan);
    ASSERT_TRUE(exact.ok()) << exact.status();
    EXPECT_EQ(exact->peak_bytes, plan->predicted_peak) << context;
    EXPECT_EQ(exact->extra_cost, plan->extra_cost) << context;
  }
}

TEST(ChainDp, EqualsBruteForceInExactBytes) {
  Seen seen;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const int stages = 1 + static_cast<int>(seed % 8);
    const Chain chain = RandomChain(stages, seed);
    for (uint64_t budget : BudgetsFor(chain)) {
      ExpectSameAnswer(chain, {.budget = budget, .memory_unit = kMiB}, {.budget = budget, .memory_unit = 1},
                       absl::StrFormat("seed %d, %d stages, budget %d", seed, stages, budget), seen);
    }
  }
  // Ten stages: up to 4^10 plans for the brute force.
  for (uint64_t seed : {99, 98}) {
    const Chain chain = RandomChain(10, seed);
    for (size_t b : {5, 7}) {
      const uint64_t budget = BudgetsFor(chain)[b];
      ExpectSameAnswer(chain, {.budget = budget, .memory_unit = kMiB}, {.budget = budget, .memory_unit = 1},
                       absl::StrFormat("ten stages, seed %d, budget %d", seed, budget), seen);
    }
  }
  EXPECT_EQ(seen.refused, 40);  // each chain's least - 1
  EXPECT_GE(seen.free, 80);     // at and above keeping everything
  EXPECT_GT(seen.selective, 20);
  EXPECT_GT(seen.long_segment, 10);
}

TEST(ChainDp, EqualsBruteForceInTheSameDiscretization) {
  Seen seen;
  for (uint64_t seed = 100; seed < 124; ++seed) {
    const int stages = 1 + static_cast<int>(seed % 7);
    const Chain chain = RandomChain(stages, seed);
    for (int64_t slots : {7, 200}) {
      for (uint64_t budget : BudgetsFor(chain)) {
        const ChainDpOptions options{.budget = budget, .memory_slots = slots};
        ExpectSameAnswer(chain, options, options,
                         absl::StrFormat("seed %d, %d stages, %d slots, budget %d", seed, stages, slots, budget),
                         seen);
      }
    }
  }
  // Seven slots refuse far more budgets than the exact model would.
  EXPECT_GT(seen.refused, 24 * 2);
  EXPECT_GT(seen.long_segment, 10);
}

TEST(ChainDp, AutoMemorySlots) {
  EXPECT_EQ(AutoMemorySlots(1), 4096);
  EXPECT_EQ(AutoMemorySlots(100), 4096);
  EXPECT_EQ(AutoMemorySlots(1000), 8000);
  EXPECT_EQ(AutoMemorySlots(10000), static_cast<int64_t>(kMaxChainDpCells / 10000) - 1);
  const Chain chain = RandomChain(600, 3);
  const uint64_t budget = UniformChainPlan(chain, StageChoice::kKeepAll).predicted_peak / 2;
  absl::StatusOr<ChainPlan> plan = SolveChainDp(chain, {.budget = budget});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->memory_unit, (budget - chain.fixed_bytes + 4799) / 4800);
}

TEST(ChainDp, ReportsTheUnitAndRoundsUp) {
  const Chain chain = RandomChain(6, 5);
  const uint64_t budget = BudgetsFor(chain)[6];
  absl::StatusOr<ChainPlan> plan = SolveChainDp(chain, {.budget = budget, .memory_slots = 100});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->memory_unit, (budget - chain.fixed_bytes + 99) / 100);
  EXPECT_EQ(plan->memory_slots, static_cast<int64_t>((budget - chain.fixed_bytes) / plan->memory_unit));
  // Rounded up, the plan's peak at the unit still fits.
  EXPECT_LE(EvaluateChainPlan(chain, *plan, plan->memory_unit)->peak_bytes, budget);
  absl::StatusOr<ChainPlan> exact = SolveChainDp(chain, {.budget = budget, .memory_unit = kMiB});
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->memory_unit, kMiB);
  EXPECT_LE(exact->extra_cost, plan->extra_cost);  // rounding only removes plans
}

TEST(ChainDp, MoreBudgetNeverCostsMore) {
  const Chain chain = RandomChain(60, 11);
  const uint64_t least = *MinimumChainPeak(chain);
  const uint64_t all = UniformChainPlan(chain, StageChoice::kKeepAll).predicted_peak;
  double previous = -1;
  for (int step = 20; step >= 0; --step) {
    const uint64_t budget = least + (all - least) / 20 * static_cast<uint64_t>(step);
    absl::StatusOr<ChainPlan> plan = SolveChainDp(chain, {.budget = budget, .memory_unit = kMiB});
    ASSERT_TRUE(plan.ok()) << budget << ": " << plan.status();
    EXPECT_GE(plan->extra_cost, previous) << budget;
    previous = plan->extra_cost;
  }
  // With room for everything nothing is replayed; at the minimum, something is.
  absl::StatusOr<ChainPlan> roomy = SolveChainDp(chain, {.budget = all, .memory_unit = kMiB});
  EXPECT_EQ(roomy->extra_cost, 0);
  EXPECT_TRUE(std::all_of(roomy->choice.begin(), roomy->choice.end(),
                          [](StageChoice c) { return c == StageChoice::kKeepAll; }));
  EXPECT_GT(previous, 0);
}

TEST(ChainDp, MinimumPeakIsTheLeastFeasibleBudget) {
  for (uint64_t seed = 200; seed < 215; ++seed) {
    const Chain chain = RandomChain(1 + static_cast<int>(seed % 7), seed);
    const uint64_t least = *MinimumChainPeak(chain);
    EXPECT_TRUE(BruteForceChainPlan(chain, {.budget = least, .memory_unit = 1}).ok()) << seed;
    EXPECT_FALSE(BruteForceChainPlan(chain, {.budget = least - 1, .memory_unit = 1}).ok()) << seed;
    // Rounding up never lowers the minimum.
    EXPECT_GE(*MinimumChainPeak(chain, 3 * kMiB + 1), least);
  }
}

TEST(ChainDp, RefusalsNameTheSmallestBudget) {
  const Chain chain = RandomChain(8, 21);
  const uint64_t least = *MinimumChainPeak(chain);
  absl::Status below = SolveChainDp(chain, {.budget = least - 1}).status();
  EXPECT_EQ(below.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(below.message(), HasSubstr(absl::StrFormat("budget %d bytes", least - 1)));
  EXPECT_THAT(below.message(), HasSubstr(absl::StrFormat("is below %d bytes", least)));
  EXPECT_EQ(BruteForceChainPlan(chain, {.budget = least - 1}).status(), below);
  // Below the fixed bytes, before any discretization.
  EXPECT_THAT(SolveChainDp(chain, {.budget = 1}).status().message(), HasSubstr(absl::StrFormat("is below %d", least)));
  // Feasible in bytes, not at a coarse unit: the message says which budget
  // the unit needs.
  const uint64_t coarse = *MinimumChainPeak(chain, 64 * kMiB + 1);
  ASSERT_GT(coarse, least);
  absl::Status rounded = SolveChainDp(chain, {.budget = least, .memory_unit = 64 * kMiB + 1}).status();
  EXPECT_THAT(rounded.message(), HasSubstr(absl::StrFormat("fits the chain model's smallest peak, %d bytes", least)));
  EXPECT_THAT(rounded.message(), HasSubstr(absl::StrFormat("the smallest peak is %d bytes", coarse)));
  EXPECT_TRUE(SolveChainDp(chain, {.budget = coarse, .memory_unit = 64 * kMiB + 1}).ok());
}

TEST(ChainDp, OptionErrors) {
  const Chain chain = RandomChain(4, 1);
  const uint64_t budget = UniformChainPlan(chain, StageChoice::kKeepAll).predicted_peak;
  EXPECT_THAT(SolveChainDp(chain, {.budget = budget, .memory_slots = -1}).status().message(),
              HasSubstr("memory_slots must be at least 1 (0: AutoMemorySlots), got -1"));
  EXPECT_THAT(SolveChainDp(chain, {.budget = budget, .memory_unit = 1}).status().message(),
              HasSubstr("memory_unit 1 bytes gives"));
  EXPECT_THAT(SolveChainDp(chain, {.budget = budget, .memory_slots = int64_t{1} << 40}).status().message(),
              HasSubstr("lower memory_slots"));
  EXPECT_THAT(BruteForceChainPlan(RandomChain(kMaxBruteForceStages + 1, 1), {.budget = budget}).status().message(),
              HasSubstr("at most 12"));
  EXPECT_THAT(SolveChainDp(Chain{}, {.budget = budget}).status().message(), HasSubstr("no stages"));
}

TEST(ChainDp, PlanValidation) {
  const Chain chain = RandomChain(4, 2);
  auto error = [&chain](ChainPlan plan) { return std::string(plan.Validate(chain).message()); };
  using enum StageChoice;
  EXPECT_THAT(error({.choice = {kKeepAll}}), HasSubstr("1 stage choices, the chain has 4"));
  EXPECT_THAT(error({.choice = {kCheckpoint, kKeepAll, kKeepAll, kKeepAll}}),
              HasSubstr("stage 0 is checkpointed but in no segment"));
  EXPECT_THAT(error({.choice = {kCheckpoint, kKeepAll, kKeepAll, kKeepAll}, .segments = {{0, 1}}}),
              HasSubstr("stage 1 is in segment 0 (stages 0..1) but its choice is all"));
  EXPECT_THAT(error({.choice = {kCheckpoint, kCheckpoint, kKeepAll, kKeepAll}, .segments = {{0, 1}, {1, 1}}}),
              HasSubstr("segment 1 is stages 1..1; segments are ordered, disjoint"));
  EXPECT_THAT(error({.choice = {kCheckpoint, kKeepAll, kKeepAll, kKeepAll}, .segments = {{0, 4}}}),
              HasSubstr("segment 0 is stages 0..4"));
  int no_core = 0;
  while (chain.stages[static_cast<size_t>(no_core)].has_attention_core) ++no_core;
  ChainPlan selective{.choice = {kKeepAll, kKeepAll, kKeepAll, kKeepAll}};
  selective.choice[static_cast<size_t>(no_core)] = kSelective;
  EXPECT_THAT(error(selective), HasSubstr(absl::StrFormat("stage %d is selective but has no attention core", no_core)));
}

// A long chain solves (bench/planner_bench.cc times 1,000 and 10,000
// stages; the sanitizer builds run this one too).
TEST(ChainDp, LongChain) {
  const Chain chain = RandomChain(300, 8);
  const uint64_t all = UniformChainPlan(chain, StageChoice::kKeepAll).predicted_peak;
  absl::StatusOr<ChainPlan> plan = SolveChainDp(chain, {.budget = all / 2});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LE(plan->predicted_peak, all / 2);
  EXPECT_LT(plan->extra_cost, UniformChainPlan(chain, StageChoice::kCheckpoint).extra_cost);
}

// --- Plans over a model's ops -------------------------------------------------

// Batch 4 of 512 tokens: the layers' activations (about 1.4 GB), not the
// parameter gradients (250 MB), make the peak, so the plan matters.
Graph Gpt2() {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig("gpt2");
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> forward =
      BuildModelGraph(*config, {.batch = 4, .seq_len = 512, .param_dtype = DType::kBF16,
                                .compute_dtype = DType::kBF16, .attention = AttentionImpl::kEager});
  EXPECT_TRUE(forward.ok()) << forward.status();
  return *std::move(forward);
}

std::vector<double> FlopCosts(const Graph& g) {
  std::vector<double> cost;
  for (const Op& op : g.ops()) cost.push_back(op.flops);
  return cost;
}

std::vector<int32_t> Converted(const Graph& forward, const ChainPlan& plan) {
  absl::StatusOr<CheckpointPlan> cp = ChainPlanToCheckpointPlan(forward, plan);
  EXPECT_TRUE(cp.ok()) << cp.status();
  return cp.ok() ? cp->segment_of_op : std::vector<int32_t>{};
}

std::vector<int32_t> Named(const Graph& forward, CheckpointMode mode, int every = 1) {
  absl::StatusOr<CheckpointPlan> cp = PlanForMode(forward, mode, every);
  EXPECT_TRUE(cp.ok()) << cp.status();
  return cp->segment_of_op;
}

TEST(ChainPlanToCheckpointPlan, UniformPlansAreTheNamedModes) {
  const Graph forward = Gpt2();
  absl::StatusOr<Chain> chain = ExtractLayerChain(forward, FlopCosts(forward));
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(Converted(forward, UniformChainPlan(*chain, StageChoice::kCheckpoint)),
            Named(forward, CheckpointMode::kFull));
  EXPECT_EQ(Converted(forward, UniformChainPlan(*chain, StageChoice::kSelective)),
            Named(forward, CheckpointMode::kSelective));
  const std::vector<int32_t> none = Converted(forward, UniformChainPlan(*chain, StageChoice::kKeepAll));
  EXPECT_TRUE(std::all_of(none.begin(), none.end(), [](int32_t s) { return s == kNone; }));
  // Segments of three layers are kEveryK with k = 3.
  ChainPlan threes = UniformChainPlan(*chain, StageChoice::kCheckpoint);
  threes.segments = {{0, 2}, {3, 5}, {6, 8}, {9, 11}};
  EXPECT_EQ(Converted(forward, threes), Named(forward, CheckpointMode::kEveryK, 3));
}

TEST(ChainPlanToCheckpointPlan, MixedPlanDrivesTheStep) {
  const Graph forward = Gpt2();
  absl::StatusOr<Chain> chain = ExtractLayerChain(forward, FlopCosts(forward));
  ASSERT_TRUE(chain.ok()) << chain.status();
  using enum StageChoice;
  ChainPlan plan{.choice = {kCheckpoint, kCheckpoint, kSelective, kKeepAll, kCheckpoint, kSelective, kKeepAll,
                            kKeepAll, kKeepAll, kKeepAll, kCheckpoint, kCheckpoint},
                 .segments = {{0, 1}, {4, 4}, {10, 11}}};
  ASSERT_TRUE(plan.Validate(*chain).ok());
  absl::StatusOr<CheckpointPlan> cp = ChainPlanToCheckpointPlan(forward, plan);
  ASSERT_TRUE(cp.ok()) << cp.status();
  // Three layer segments and two attention cores, in program order.
  EXPECT_EQ(cp->num_segments(), 5);
  std::vector<int> layers_of_segment(5, -1);
  for (const Op& op : forward.ops()) {
    const int32_t s = cp->segment_of_op[static_cast<size_t>(op.id)];
    if (s == kNone) continue;
    if (layers_of_segment[static_cast<size_t>(s)] < 0) layers_of_segment[static_cast<size_t>(s)] = op.layer;
    if (plan.choice[static_cast<size_t>(op.layer)] == kSelective) {
      EXPECT_TRUE(op.attention_core) << op.name;
    }
  }
  EXPECT_THAT(layers_of_segment, ElementsAre(0, 2, 4, 5, 10));
  absl::StatusOr<Graph> step = BuildTrainingStep(forward, {.checkpoint = *cp});
  ASSERT_TRUE(step.ok()) << step.status();
  // Note [Chain memory model] reproduces this step's measured peak exactly
  // (DpPlansOnGpt2AreMeasuredAsPredicted says why).
  EXPECT_EQ(EvaluateChainPlan(*chain, plan)->peak_bytes, ProfileMemory(*step).peak_bytes);

  EXPECT_THAT(ChainPlanToCheckpointPlan(forward, {.choice = {kKeepAll}}).status().message(),
              HasSubstr("1 stage choices, the chain has 12 stages"));
}

// The DP's plans, run: the measured peak of the step each drives. GPT-2's
// layers are identical blocks whose every peak falls where the model puts
// it (a layer's forward or backward, the head, the optimizer), so here the
// model's peak is the measured one to the byte, from the cheapest plan at
// the smallest budget to keeping everything. The model promises no such
// thing in general; the driver re-measures.
TEST(ChainPlanToCheckpointPlan, DpPlansOnGpt2AreMeasuredAsPredicted) {
  const Graph forward = Gpt2();
  absl::StatusOr<Chain> chain = ExtractLayerChain(forward, FlopCosts(forward));
  ASSERT_TRUE(chain.ok()) << chain.status();
  const uint64_t all = UniformChainPlan(*chain, StageChoice::kKeepAll).predicted_peak;
  const uint64_t least = *MinimumChainPeak(*chain);
  const double every_layer = UniformChainPlan(*chain, StageChoice::kCheckpoint).extra_cost;
  double previous = every_layer;
  for (int step = 1; step <= 10; ++step) {
    const uint64_t budget = least + (all - least) / 10 * static_cast<uint64_t>(step);
    absl::StatusOr<ChainPlan> plan = SolveChainDp(*chain, {.budget = budget});
    ASSERT_TRUE(plan.ok()) << budget << ": " << plan.status();
    EXPECT_LE(plan->predicted_peak, budget);
    EXPECT_LE(plan->extra_cost, previous) << budget;
    previous = plan->extra_cost;
    absl::StatusOr<CheckpointPlan> cp = ChainPlanToCheckpointPlan(forward, *plan);
    ASSERT_TRUE(cp.ok()) << cp.status();
    absl::StatusOr<Graph> run = BuildTrainingStep(forward, {.checkpoint = *cp});
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(ProfileMemory(*run).peak_bytes, plan->predicted_peak) << budget;
  }
  // The budget of the last step is just below keeping everything: a little is replayed.
  EXPECT_GT(previous, 0);
  EXPECT_LT(previous, every_layer);
}

// The whole chain-dp pipeline on a plan problem (planner/plan.h), as the
// planner's driver runs it: the chain of the problem's step, the DP's plan,
// its segments as a schedule (torch.utils.checkpoint), evaluated and checked
// by the independent validator. Here with gradient accumulation, whose
// "gradient_buffers" op shifts every op id of the step.
TEST(ChainPlanToCheckpointPlan, PlanProblemEndToEnd) {
  absl::StatusOr<Graph> step = BuildTrainingStep(Gpt2(), {.gradients_preexist = true});
  ASSERT_TRUE(step.ok()) << step.status();
  const std::vector<double> cost = FlopCosts(*step);
  absl::StatusOr<Chain> chain = ExtractLayerChain(*step, cost);
  ASSERT_TRUE(chain.ok()) << chain.status();
  // kFull and kSelective over the step itself are the uniform plans.
  EXPECT_EQ(Converted(*step, UniformChainPlan(*chain, StageChoice::kCheckpoint)), Named(*step, CheckpointMode::kFull));
  EXPECT_EQ(Converted(*step, UniformChainPlan(*chain, StageChoice::kSelective)),
            Named(*step, CheckpointMode::kSelective));

  const uint64_t all = UniformChainPlan(*chain, StageChoice::kKeepAll).predicted_peak;
  const uint64_t least = *MinimumChainPeak(*chain);
  for (int tenth : {2, 5, 8}) {
    const uint64_t budget = least + (all - least) / 10 * static_cast<uint64_t>(tenth);
    absl::StatusOr<ChainPlan> plan = SolveChainDp(*chain, {.budget = budget});
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::StatusOr<CheckpointPlan> cp = ChainPlanToCheckpointPlan(*step, *plan);
    ASSERT_TRUE(cp.ok()) << cp.status();
    absl::StatusOr<Schedule> schedule = SegmentSchedule(*step, *cp);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    const PlanProblem problem{.step = &*step, .op_cost = cost, .budget = budget};
    absl::StatusOr<PlanEvaluation> e = EvaluateSchedule(problem, *schedule);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->peak_bytes, plan->predicted_peak) << budget;
    // The model's replay costs are the schedule's (ExtractLayerChain).
    EXPECT_DOUBLE_EQ(e->extra_cost, plan->extra_cost) << budget;
    EXPECT_TRUE(ValidateSchedule(problem, *schedule).ok()) << ValidateSchedule(problem, *schedule);
  }
}

}  // namespace
}  // namespace headroom
