// Offload and hybrid plans: they meet the budget or say how close they got,
// pass the independent validator, never read a tensor that is in host
// memory, report host memory as the schedule holds it, and choose offload
// when the link is fast and recomputation when it is slow.
#include "planner/offload.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "graph/liveness.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "planner/checkpoint_mode_plan.h"
#include "planner/chen.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

// GPT-2 with 4 layers, eager attention, at a sequence long enough and with a
// vocabulary small enough that the layers' activations, not the loss's
// logits-sized tensors (Note [Causal LM loss] in models/builders.cc), make the peak.
Graph Gpt2Forward() {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig("gpt2");
  EXPECT_TRUE(config.ok()) << config.status();
  config->num_layers = 4;
  config->vocab_size = 4096;
  absl::StatusOr<Graph> forward =
      BuildModelGraph(*config, {.batch = 1, .seq_len = 512, .param_dtype = DType::kBF16,
                                .compute_dtype = DType::kBF16, .attention = AttentionImpl::kEager});
  EXPECT_TRUE(forward.ok()) << forward.status();
  return *std::move(forward);
}

const Graph& Forward() {
  static const Graph forward = Gpt2Forward();
  return forward;
}

const Graph& Step() {
  static const Graph step = *BuildTrainingStep(Forward(), {});
  return step;
}

// A different shape of step: Llama (RMSNorm, rotary buffers, SwiGLU) with
// flash attention, 4 layers. Its budgets leave out parameter gradients, as
// the estimators do with a GPU's memory (else they alone would not fit).
const Graph& LlamaStep() {
  static const Graph step = [] {
    absl::StatusOr<ModelConfig> config = LoadPresetConfig("llama-2-7b");
    EXPECT_TRUE(config.ok()) << config.status();
    config->num_layers = 4;
    absl::StatusOr<Graph> forward =
        BuildModelGraph(*config, {.batch = 1, .seq_len = 512, .param_dtype = DType::kBF16,
                                  .compute_dtype = DType::kBF16, .attention = AttentionImpl::kFlash});
    EXPECT_TRUE(forward.ok()) << forward.status();
    return *BuildTrainingStep(*forward, {});
  }();
  return step;
}

// The median size of the activations backward reads (a layer's hidden state).
uint64_t TypicalSavedActivation(const Graph& step) {
  std::vector<uint64_t> sizes;
  for (const Op& op : step.ops()) {
    if (op.phase != Phase::kBackward) continue;
    for (TensorId t : op.inputs) {
      const Tensor& saved = step.tensor(t);
      if (saved.role == TensorRole::kActivation && saved.view_of == kNone) sizes.push_back(saved.bytes());
    }
  }
  std::sort(sizes.begin(), sizes.end());
  return sizes[sizes.size() / 2];
}

// Every op costs 1; a typical saved activation takes `copy_ops` ops' time to
// copy each way.
PlanProblem ProblemFor(const Graph& step, double budget_fraction, double copy_ops = 3, ProfileOptions profile = {}) {
  PlanProblem problem{.step = &step, .op_cost = std::vector<double>(step.num_ops(), 1.0), .budget = 1};
  problem.profile = std::move(profile);
  problem.budget =
      static_cast<uint64_t>(budget_fraction * static_cast<double>(ProfileMemory(step, problem.profile).peak_bytes));
  problem.copy_bytes_per_cost = static_cast<double>(TypicalSavedActivation(step)) / copy_ops;
  return problem;
}

PlanEvaluation Evaluate(const PlanProblem& problem, const Schedule& s) {
  absl::StatusOr<PlanEvaluation> e = EvaluateSchedule(problem, s);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *std::move(e) : PlanEvaluation{};
}

// "Offload never loses a tensor": walking the schedule, no op or replay
// reads a tensor (or a view of it) while its storage is in host memory,
// i.e. after its offload and before its prefetch. Returns the host bytes at
// the worst point of the walk.
uint64_t ExpectNothingLost(const Graph& step, const Schedule& s) {
  std::vector<bool> on_host(step.num_tensors(), false);
  uint64_t host = 0, worst = 0;
  auto storage = [&step](TensorId t) { return step.tensor(t).view_of == kNone ? t : step.tensor(t).view_of; };
  for (size_t i = 0; i < s.entries.size(); ++i) {
    const ScheduleEntry& e = s.entries[i];
    switch (e.action) {
      case ScheduleAction::kOffload:
        EXPECT_FALSE(on_host[static_cast<size_t>(e.target)]) << "entry " << i << " offloads twice";
        on_host[static_cast<size_t>(e.target)] = true;
        host += step.tensor(e.target).bytes();
        worst = std::max(worst, host);
        break;
      case ScheduleAction::kPrefetch:
        EXPECT_TRUE(on_host[static_cast<size_t>(e.target)]) << "entry " << i << " prefetches what is not offloaded";
        on_host[static_cast<size_t>(e.target)] = false;
        host -= step.tensor(e.target).bytes();
        break;
      case ScheduleAction::kCompute:
      case ScheduleAction::kRecompute:
        for (TensorId in : step.op(e.target).inputs) {
          EXPECT_FALSE(on_host[static_cast<size_t>(storage(in))])
              << "entry " << i << " (" << step.op(e.target).name << ") reads '" << step.tensor(in).name
              << "' while it is in host memory";
        }
        break;
    }
  }
  return worst;
}

// The checks every planned schedule passes.
void ExpectSound(const PlanProblem& problem, const Schedule& s) {
  EXPECT_TRUE(ValidateSchedule(problem, s).ok()) << ValidateSchedule(problem, s);
  const PlanEvaluation e = Evaluate(problem, s);
  EXPECT_LE(e.peak_bytes, problem.budget);
  EXPECT_EQ(ExpectNothingLost(*problem.step, s), e.host_peak_bytes);
  EXPECT_EQ(PruneSchedule(*problem.step, s)->entries.size(), s.entries.size()) << "nothing idle left in";
}

TEST(PlanOffload, MeetsBudgetsOrSaysHowClose) {
  const Graph& step = Step();
  const uint64_t store_all = ProfileMemory(step).peak_bytes;
  int fitted = 0;
  for (double fraction : {0.9, 0.8, 0.7}) {
    SCOPED_TRACE(fraction);
    const PlanProblem problem = ProblemFor(step, fraction);
    absl::StatusOr<Schedule> s = PlanOffload(problem);
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted) << s.status();
      EXPECT_THAT(s.status().message(), HasSubstr("the smallest peak reached is"));
      continue;
    }
    ++fitted;
    ExpectSound(problem, *s);
    const PlanEvaluation e = Evaluate(problem, *s);
    EXPECT_LT(e.peak_bytes, store_all);
    EXPECT_GT(s->CountOf(ScheduleAction::kOffload), 0u);
    EXPECT_EQ(s->CountOf(ScheduleAction::kOffload), s->CountOf(ScheduleAction::kPrefetch));
    EXPECT_EQ(s->CountOf(ScheduleAction::kRecompute), 0u);
    EXPECT_GT(e.host_peak_bytes, 0u);
    EXPECT_GE(e.offloaded_bytes, e.host_peak_bytes);
  }
  EXPECT_EQ(fitted, 3) << "GPT-2's 4 layers hold enough to offload 30% of the peak";
}

// What the training loop holds (release_outputs) keeps its GPU copy whatever the plan: offloading it
// would free nothing, so neither offload nor hybrid may pick it.
TEST(PlanOffload, LeavesHeldTensorsAlone) {
  absl::StatusOr<ModelConfig> config = LoadPresetConfig("gpt2");
  ASSERT_TRUE(config.ok()) << config.status();
  config->num_layers = 6;  // GPT-2's 50257-token logits are worth offloading
  absl::StatusOr<Graph> forward = BuildModelGraph(*config, {.batch = 1, .seq_len = 512});
  ASSERT_TRUE(forward.ok()) << forward.status();
  const Graph step = *BuildTrainingStep(*forward, {.hold_model_outputs = true});
  std::vector<TensorId> held;
  for (const Op& op : step.ops()) {
    if (IsHoldOp(op)) held.insert(held.end(), op.inputs.begin(), op.inputs.end());
  }
  ASSERT_FALSE(held.empty());
  int planned = 0;
  for (double fraction : {0.95, 0.9, 0.85, 0.8}) {
    const PlanProblem problem = ProblemFor(step, fraction);
    for (auto plan : {PlanOffload, PlanHybrid}) {
      absl::StatusOr<Schedule> s = plan(problem);
      if (!s.ok()) continue;
      planned += s->CountOf(ScheduleAction::kOffload) > 0 ? 1 : 0;
      for (const ScheduleEntry& e : s->entries) {
        if (e.action != ScheduleAction::kOffload) continue;
        EXPECT_EQ(std::count(held.begin(), held.end(), step.storage(e.target)), 0)
            << fraction << ": " << step.tensor(e.target).name;
      }
    }
  }
  EXPECT_GE(planned, 4);
}

// The peak an out-of-reach error gives.
uint64_t SmallestPeakIn(const absl::Status& status) {
  const std::string message(status.message());
  const std::string before = "the smallest peak reached is ";
  const size_t at = message.find(before);
  EXPECT_NE(at, std::string::npos) << message;
  return at == std::string::npos ? 0 : std::stoull(message.substr(at + before.size()));
}

// A budget below what offload can reach: the error gives the smallest peak
// it reached, which is over the budget and under the store-all peak.
TEST(PlanOffload, SaysTheSmallestPeakItReached) {
  const Graph& step = Step();
  const PlanProblem problem = ProblemFor(step, 0.2);
  absl::StatusOr<Schedule> s = PlanOffload(problem);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("offload cannot fit step"));
  const uint64_t reached = SmallestPeakIn(s.status());
  EXPECT_GT(reached, problem.budget);
  EXPECT_LT(reached, ProfileMemory(step).peak_bytes);
}

// "Offload never loses a tensor": over both steps, budgets and link speeds,
// every tensor read after its offload is prefetched before the read
// (ExpectNothingLost walks the schedule), and what is in host memory at the
// walk's worst point is the evaluation's host_peak_bytes.
TEST(PlanOffload, NeverLosesATensor) {
  const ProfileOptions without_parameter_gradients = {.count_parameter_gradients = false};
  int offloaded = 0;
  for (const Graph* step : {&Step(), &LlamaStep()}) {
    const ProfileOptions profile = step == &LlamaStep() ? without_parameter_gradients : ProfileOptions{};
    for (double copy_ops : {0.5, 3.0, 30.0}) {
      for (double fraction : {0.9, 0.75, 0.6}) {
        SCOPED_TRACE(absl::StrFormat("%s, copies take %g ops, budget %g", step->name(), copy_ops, fraction));
        const PlanProblem problem = ProblemFor(*step, fraction, copy_ops, profile);
        for (const absl::StatusOr<Schedule>& s : {PlanOffload(problem), PlanHybrid(problem)}) {
          if (!s.ok()) continue;
          const uint64_t host = ExpectNothingLost(*step, *s);
          EXPECT_EQ(host, Evaluate(problem, *s).host_peak_bytes);
          offloaded += s->CountOf(ScheduleAction::kOffload) > 0 ? 1 : 0;
        }
      }
    }
  }
  EXPECT_GT(offloaded, 10);
}

TEST(PlanOffload, StoreAllWhenItFits) {
  const Graph& step = Step();
  const PlanProblem problem = ProblemFor(step, 1.0);
  EXPECT_EQ(*PlanOffload(problem), StoreAllSchedule(step));
  EXPECT_EQ(*PlanHybrid(problem), StoreAllSchedule(step));
}

TEST(PlanOffload, RefusesBadProblems) {
  const Graph& step = Step();
  PlanProblem no_link = ProblemFor(step, 0.8);
  no_link.copy_bytes_per_cost = 0;
  EXPECT_EQ(PlanOffload(no_link).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(PlanOffload(no_link).status().message(), HasSubstr("copy_bytes_per_cost is 0"));
  PlanProblem short_costs = ProblemFor(step, 0.8);
  short_costs.op_cost.pop_back();
  EXPECT_THAT(PlanOffload(short_costs).status().message(), HasSubstr("op costs for"));
  EXPECT_THAT(PlanHybrid(short_costs).status().message(), HasSubstr("op costs for"));
}

// With copies that take no time, every copy overlaps with compute.
TEST(PlanOffload, InfinitelyFastLinkCostsNothing) {
  const Graph& step = Step();
  PlanProblem problem = ProblemFor(step, 0.7);
  problem.copy_bytes_per_cost = 1e30;
  absl::StatusOr<Schedule> s = PlanOffload(problem);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectSound(problem, *s);
  const PlanEvaluation e = Evaluate(problem, *s);
  EXPECT_LE(e.wait_cost, 1e-9 * e.base_cost);
  EXPECT_DOUBLE_EQ(e.step_cost, e.base_cost + e.wait_cost);
  // And the hybrid takes the free copies over any replay.
  absl::StatusOr<Schedule> h = PlanHybrid(problem);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_LE(Evaluate(problem, *h).step_cost, e.step_cost + 1e-9 * e.base_cost);
  EXPECT_EQ(h->CountOf(ScheduleAction::kRecompute), 0u);
}

// Copies that take ~1000 ops each way cannot overlap: the hybrid replays.
TEST(PlanHybrid, SlowLinkPrefersRecompute) {
  const Graph& step = Step();
  const PlanProblem problem = ProblemFor(step, 0.7, /*copy_ops=*/1000);
  absl::StatusOr<Schedule> h = PlanHybrid(problem);
  ASSERT_TRUE(h.ok()) << h.status();
  ExpectSound(problem, *h);
  EXPECT_GT(h->CountOf(ScheduleAction::kRecompute), 0u);
  EXPECT_EQ(h->CountOf(ScheduleAction::kOffload), 0u);
  const PlanEvaluation e = Evaluate(problem, *h);
  EXPECT_GT(e.extra_cost, 0);
  EXPECT_EQ(e.offloaded_bytes, 0u);
  EXPECT_EQ(e.wait_cost, 0);
}

// The recompute-only plan the hybrid must beat: torch.utils.checkpoint
// around every layer.
absl::StatusOr<Schedule> PerLayerRecompute(const Graph& step) {
  CheckpointPlan plan = *PlanForMode(Forward(), CheckpointMode::kFull);
  plan.segment_of_op.resize(step.num_ops(), kNone);
  return SegmentSchedule(step, plan);
}

TEST(PlanHybrid, NoSlowerThanOffloadOrRecomputeAlone) {
  const Graph& step = Step();
  const Schedule per_layer = *PerLayerRecompute(step);
  int compared = 0;
  for (double copy_ops : {1.0, 3.0, 20.0}) {
    for (double fraction : {0.9, 0.8, 0.7, 0.6}) {
      SCOPED_TRACE(absl::StrFormat("copies take %g ops, budget %g of the peak", copy_ops, fraction));
      const PlanProblem problem = ProblemFor(step, fraction, copy_ops);
      absl::StatusOr<Schedule> hybrid = PlanHybrid(problem);
      absl::StatusOr<Schedule> offload = PlanOffload(problem);
      const PlanEvaluation recompute = Evaluate(problem, per_layer);
      if (!hybrid.ok()) {
        EXPECT_EQ(hybrid.status().code(), absl::StatusCode::kResourceExhausted) << hybrid.status();
        EXPECT_FALSE(offload.ok());
        EXPECT_GT(recompute.peak_bytes, problem.budget);
        continue;
      }
      ExpectSound(problem, *hybrid);
      const double cost = Evaluate(problem, *hybrid).step_cost;
      if (offload.ok()) {
        EXPECT_LE(cost, Evaluate(problem, *offload).step_cost);
      }
      if (recompute.peak_bytes <= problem.budget) {
        EXPECT_LE(cost, recompute.step_cost);
      }
      compared += offload.ok() && recompute.peak_bytes <= problem.budget ? 1 : 0;
    }
  }
  EXPECT_GT(compared, 0) << "some budget fits both offload and recompute alone";
}

// Random budgets and link speeds on both steps: whatever the planners return
// passes every check, what they refuse they refuse as out of reach, and the
// hybrid is never slower than offload alone.
TEST(PlanOffload, RandomBudgetsProperty) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> fraction(0.3, 1.0);
  std::uniform_real_distribution<double> copy_ops(0.1, 50);
  const ProfileOptions without_parameter_gradients = {.count_parameter_gradients = false};
  int fitted = 0;
  for (const Graph* step : {&Step(), &LlamaStep()}) {
    const ProfileOptions profile = step == &LlamaStep() ? without_parameter_gradients : ProfileOptions{};
    for (int trial = 0; trial < 6; ++trial) {
      const PlanProblem problem = ProblemFor(*step, fraction(rng), copy_ops(rng), profile);
      SCOPED_TRACE(absl::StrFormat("%s: budget %d, %g bytes per op", step->name(), problem.budget,
                                   problem.copy_bytes_per_cost));
      absl::StatusOr<Schedule> offload = PlanOffload(problem);
      absl::StatusOr<Schedule> hybrid = PlanHybrid(problem);
      for (const absl::StatusOr<Schedule>* s : {&offload, &hybrid}) {
        if (s->ok()) {
          ExpectSound(problem, **s);
        } else {
          EXPECT_EQ(s->status().code(), absl::StatusCode::kResourceExhausted) << s->status();
        }
      }
      fitted += offload.ok() ? 1 : 0;
      if (offload.ok()) {
        ASSERT_TRUE(hybrid.ok()) << "the hybrid considers offload alone";
        EXPECT_LE(Evaluate(problem, *hybrid).step_cost, Evaluate(problem, *offload).step_cost);
      }
    }
  }
  EXPECT_GT(fitted, 6) << "most random budgets are within offload's reach";
}

TEST(PlanHybrid, WithoutALinkOnlyRecomputes) {
  const Graph& step = Step();
  PlanProblem problem = ProblemFor(step, 0.7);
  problem.copy_bytes_per_cost = 0;
  absl::StatusOr<Schedule> h = PlanHybrid(problem);
  ASSERT_TRUE(h.ok()) << h.status();
  ExpectSound(problem, *h);
  EXPECT_EQ(h->CountOf(ScheduleAction::kOffload), 0u);
  EXPECT_GT(h->CountOf(ScheduleAction::kRecompute), 0u);
}

// Nothing fits a budget below what the step holds whatever is dropped (its
// logits and their gradient): the error gives the smallest peak reached.
TEST(PlanHybrid, SaysTheSmallestPeakItReached) {
  const Graph& step = Step();
  const PlanProblem problem = ProblemFor(step, 0.2);
  absl::StatusOr<Schedule> h = PlanHybrid(problem);
  ASSERT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted) << h.status();
  EXPECT_THAT(h.status().message(), HasSubstr(absl::StrFormat("budget of %d bytes", problem.budget)));
  EXPECT_GT(SmallestPeakIn(h.status()), problem.budget);
}

// Note [Hybrid work]: a search that runs out of work says so, and returns
// the cheapest that fits of the plans that need no search (chen-greedy's
// among them), never one over budget.
TEST(PlanHybrid, SaysWhenItsWorkLimitStoppedIt) {
  const Graph& step = Step();
  const PlanProblem problem = ProblemFor(step, 0.7, /*copy_ops=*/1000);
  absl::StatusOr<HybridPlan> full = PlanHybridWithNote(problem);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->note, "");
  int64_t work = 1;  // spent by the first simulation
  absl::StatusOr<HybridPlan> limited = PlanHybridWithNote(problem, &work);
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_THAT(limited->note, HasSubstr(absl::StrFormat("work limit of %d simulated schedule entries, shared with its "
                                                       "replans",
                                                       kHybridWork)));
  EXPECT_THAT(limited->note, HasSubstr("plan, the cheapest that fits"));
  ExpectSound(problem, limited->schedule);
  absl::StatusOr<Schedule> chen = ChenGreedySchedule(problem, FindForwardCuts(step));
  ASSERT_TRUE(chen.ok()) << chen.status();
  EXPECT_LE(Evaluate(problem, limited->schedule).step_cost, Evaluate(problem, *chen).step_cost);
  // Without the limit the search does at least as well.
  EXPECT_LE(Evaluate(problem, full->schedule).step_cost, Evaluate(problem, limited->schedule).step_cost);
}

// A budget nothing meets, with the work spent: the error still names the
// smallest peak reached, and the limit.
TEST(PlanHybrid, SaysItsWorkLimitWhenNothingFits) {
  const Graph& step = Step();
  const PlanProblem problem = ProblemFor(step, 0.2);
  int64_t work = 1;
  absl::StatusOr<HybridPlan> h = PlanHybridWithNote(problem, &work);
  ASSERT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted) << h.status();
  EXPECT_GT(SmallestPeakIn(h.status()), problem.budget);
  EXPECT_THAT(h.status().message(), HasSubstr("its search stopped at its work limit"));
}

}  // namespace
}  // namespace headroom
