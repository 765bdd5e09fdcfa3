// Plans as PyTorch's selective activation checkpointing runs them (Note
// [Selective checkpoint semantics] in planner/selective_checkpoint.h), on
// small steps built by hand so that each rule shows: where the replay goes
// and where it stops, what is cached, write groups, random ops, regions that
// cannot be checkpointed, and what is dropped. Whole models are checked
// against PyTorch by validation/apply-plans (its fixtures: `headroom
// validate validation/fixtures/plans`).
#include "planner/selective_checkpoint.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "gmock/gmock.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"
#include "planner/plan.h"
#include "planner/planner.h"
#include "planner/schedule.h"

namespace headroom {
namespace {

// A forward graph written op by op: each op in a layer, with what it saves.
class ForwardBuilder {
 public:
  ForwardBuilder() : g_("layers") {
    x_ = Tensor("x", TensorRole::kInput);
  }

  TensorId Tensor(const std::string& name, TensorRole role = TensorRole::kActivation, TensorId view_of = kNone) {
    return g_.AddTensor({.name = name, .shape = {1024}, .dtype = DType::kF32, .role = role, .view_of = view_of});
  }
  TensorId Weight(const std::string& name) { return Tensor(name, TensorRole::kParameter); }

  // An op of `layer` reading `inputs`, making one output (a view of the
  // first input when `inplace`), and saving `saved` (kSavesOutput: its own output).
  static constexpr TensorId kSavesOutput = -10;
  TensorId Op(int layer, const std::string& kind, std::vector<TensorId> inputs, std::vector<TensorId> saved,
              bool inplace = false) {
    const std::string name = absl::StrCat(layer >= 0 ? absl::StrCat("layers.", layer, ".") : "", kind, ops_++);
    const TensorId out = Tensor(name + ".out", TensorRole::kActivation, inplace ? g_.storage(inputs[0]) : kNone);
    for (TensorId& s : saved) s = s == kSavesOutput ? out : s;
    g_.AddOp({.kind = kind, .name = name, .inputs = std::move(inputs), .outputs = {out}, .saved = std::move(saved),
              .flops = 1e6, .bytes_read = 4096, .bytes_written = 4096, .layer = layer, .inplace = inplace});
    return out;
  }

  // The loss over `y`, then the step with its backward.
  Graph Step(TensorId y) {
    g_.AddOp({.kind = "sum", .name = "loss", .inputs = {y}, .outputs = {Tensor("loss")}, .phase = Phase::kLoss});
    absl::StatusOr<Graph> step = BuildTrainingStep(g_, {});
    EXPECT_TRUE(step.ok()) << step.status();
    return step.ok() ? *std::move(step) : Graph();
  }

  TensorId x() const { return x_; }
  const Graph& forward() const { return g_; }

 private:
  Graph g_;
  TensorId x_ = kNone;
  int ops_ = 0;
};

constexpr TensorId kOut = ForwardBuilder::kSavesOutput;

OpId OpNamed(const Graph& g, const std::string& prefix) {
  for (const Op& op : g.ops()) {
    if (op.name.starts_with(prefix) && IsForwardPhase(op.phase)) return op.id;
  }
  ADD_FAILURE() << "no op " << prefix;
  return kNone;
}

// The step's program order with `replayed` ops replayed right before the
// first backward op of their layer (a plan any strategy could make).
Schedule Replaying(const Graph& step, const std::vector<OpId>& replayed) {
  Schedule s;
  std::vector<bool> done(replayed.size(), false);
  for (const Op& op : step.ops()) {
    for (size_t i = 0; i < replayed.size(); ++i) {
      if (done[i] || op.phase != Phase::kBackward || step.op(op.forward_of).layer != step.op(replayed[i]).layer) {
        continue;
      }
      s.entries.push_back({ScheduleAction::kRecompute, replayed[i]});
      done[i] = true;
    }
    s.entries.push_back({ScheduleAction::kCompute, op.id});
  }
  return s;
}

std::vector<OpId> ReplayedOps(const Schedule& s) {
  std::vector<OpId> out;
  for (const ScheduleEntry& e : s.entries) {
    if (e.action == ScheduleAction::kRecompute) out.push_back(e.target);
  }
  return out;
}

std::string Policy(const CheckpointRegion& r) {
  std::string out;
  for (bool save : r.save) out.push_back(save ? 's' : 'r');
  return out;
}

// Layer 0: fc (a GEMM, saves its input), relu (saves its output), exp
// (saves its output), a residual add (saves nothing); layer 1 the same.
struct TwoLayers {
  ForwardBuilder b;
  Graph step;
  TwoLayers() {
    TensorId h = b.x();
    for (int layer = 0; layer < 2; ++layer) {
      const TensorId w = b.Weight(absl::StrCat("w", layer));
      const TensorId fc = b.Op(layer, "linear", {h, w}, {h, w});
      const TensorId relu = b.Op(layer, "relu", {fc}, {kOut});
      const TensorId exp = b.Op(layer, "exp", {relu}, {kOut});
      h = b.Op(layer, "add", {exp, h}, {});
    }
    step = b.Step(h);
  }
};

TEST(SelectiveCheckpoint, ReplaysTheBlockUpToItsLastSaveRightBeforeItsBackward) {
  TwoLayers t;
  const Graph& step = t.step;
  const OpId fc = OpNamed(step, "layers.0.linear"), relu = OpNamed(step, "layers.0.relu");
  const OpId exp = OpNamed(step, "layers.0.exp"), add = OpNamed(step, "layers.0.add");
  absl::StatusOr<SelectiveCheckpoint> sc = RealizeSelectiveCheckpoint(step, Replaying(step, {fc, relu, exp, add}));
  ASSERT_TRUE(sc.ok()) << sc.status();
  ASSERT_EQ(sc->regions.size(), 1u);
  const CheckpointRegion& r = sc->regions[0];
  EXPECT_EQ(r.layer, 0);
  EXPECT_EQ(r.first, fc);
  EXPECT_EQ(r.last, add);
  EXPECT_EQ(r.last_saving, exp);  // the add saves nothing: the replay stops before it
  EXPECT_EQ(Policy(r), "rrrr");
  EXPECT_EQ(ReplayedOps(sc->schedule), (std::vector<OpId>{fc, relu, exp}));
  // The replays come right before the first backward op that reads a tensor the block saved.
  const Op& first_reader = step.op(r.replay_before);
  EXPECT_EQ(first_reader.phase, Phase::kBackward);
  EXPECT_EQ(first_reader.forward_of, exp);
  const std::vector<ScheduleEntry>& entries = sc->schedule.entries;
  const auto first_replay = std::find_if(entries.begin(), entries.end(), [](const ScheduleEntry& e) {
    return e.action == ScheduleAction::kRecompute;
  });
  ASSERT_LE(first_replay + 4, entries.end());
  EXPECT_EQ(first_replay[3], (ScheduleEntry{ScheduleAction::kCompute, r.replay_before}));
  EXPECT_TRUE(ValidateSchedule({.step = &step, .op_cost = std::vector<double>(step.num_ops(), 1.0),
                                .budget = ~uint64_t{0}},
                               sc->schedule)
                  .ok());
}

TEST(SelectiveCheckpoint, CachesWhatTheReplayAndBackwardReadAndReplaysTheRest) {
  // Only exp is replayed by the plan. Its input (relu's output, which relu's
  // backward reads too) is cached; fc's output is read by nothing after the
  // forward once relu is cached, so fc is replayed rather than cached, as a
  // cache nothing reads back would be held for nothing.
  TwoLayers t;
  const Graph& step = t.step;
  const OpId fc = OpNamed(step, "layers.0.linear"), exp = OpNamed(step, "layers.0.exp");
  absl::StatusOr<SelectiveCheckpoint> sc = RealizeSelectiveCheckpoint(step, Replaying(step, {exp}));
  ASSERT_TRUE(sc.ok()) << sc.status();
  ASSERT_EQ(sc->regions.size(), 1u);
  EXPECT_EQ(Policy(sc->regions[0]), "rsrr");
  EXPECT_EQ(ReplayedOps(sc->schedule), (std::vector<OpId>{fc, exp}));
}

TEST(SelectiveCheckpoint, AWrittenStorageIsReplayedWithItsMakerAndWriters) {
  // Dropout on a CPU: empty_like, bernoulli_ and div_ write the mask; mul saves it.
  ForwardBuilder b;
  const TensorId w = b.Weight("w");
  const TensorId fc = b.Op(0, "linear", {b.x(), w}, {b.x(), w});
  const TensorId mask = b.Op(0, "empty_like", {fc}, {});
  const TensorId drawn = b.Op(0, "bernoulli_", {mask}, {}, /*inplace=*/true);
  const TensorId scaled = b.Op(0, "div_", {drawn}, {}, /*inplace=*/true);
  const TensorId dropped = b.Op(0, "mul", {fc, scaled}, {scaled});
  const TensorId relu = b.Op(0, "relu", {dropped}, {kOut});
  const Graph step = b.Step(relu);
  // The plan replays relu only: the mask group is cached whole (it is read
  // back by mul's backward), no write replays.
  absl::StatusOr<SelectiveCheckpoint> cached =
      RealizeSelectiveCheckpoint(step, Replaying(step, {OpNamed(step, "layers.0.relu")}));
  ASSERT_TRUE(cached.ok()) << cached.status();
  ASSERT_EQ(cached->regions.size(), 1u);
  EXPECT_EQ(Policy(cached->regions[0]), "rssssr");  // fc's output is read back by nothing: replayed
  // The plan replays bernoulli_ only: its maker and every writer replay with it.
  absl::StatusOr<SelectiveCheckpoint> replayed =
      RealizeSelectiveCheckpoint(step, Replaying(step, {OpNamed(step, "layers.0.bernoulli_")}));
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  ASSERT_EQ(replayed->regions.size(), 1u);
  EXPECT_EQ(Policy(replayed->regions[0]), "srrrrs");  // and mul, whose output only relu reads
}

TEST(SelectiveCheckpoint, RandomOpsReplayInTheOrderTheyFirstDrew) {
  // Two independent draws; replaying the second alone would hand it the
  // first one's numbers (the RNG is reset to the block's start), so the
  // first replays too.
  ForwardBuilder b;
  const TensorId first = b.Op(0, "rand_like", {b.x()}, {});
  const TensorId second = b.Op(0, "rand_like", {b.x()}, {});
  const TensorId w = b.Weight("w");
  const TensorId fc = b.Op(0, "linear", {b.x(), w}, {b.x(), w});
  const TensorId a = b.Op(0, "mul", {fc, first}, {first});
  const TensorId c = b.Op(0, "mul", {a, second}, {second});
  const Graph step = b.Step(c);
  absl::StatusOr<SelectiveCheckpoint> sc =
      RealizeSelectiveCheckpoint(step, Replaying(step, {OpNamed(step, "layers.0.rand_like1")}));
  ASSERT_TRUE(sc.ok()) << sc.status();
  ASSERT_EQ(sc->regions.size(), 1u);
  EXPECT_EQ(Policy(sc->regions[0]).substr(0, 2), "rr");
}

TEST(SelectiveCheckpoint, ABlockThatWritesIntoItsInputIsNotCheckpointed) {
  ForwardBuilder b;
  const TensorId w = b.Weight("w");
  const TensorId before = b.Op(-1, "linear", {b.x(), w}, {b.x(), w});
  const TensorId written = b.Op(0, "add_", {before, b.x()}, {}, /*inplace=*/true);
  const TensorId relu = b.Op(0, "relu", {written}, {kOut});
  const Graph step = b.Step(relu);
  const Schedule plan = Replaying(step, {OpNamed(step, "layers.0.relu")});
  absl::StatusOr<SelectiveCheckpoint> sc = RealizeSelectiveCheckpoint(step, plan);
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_TRUE(sc->regions.empty());
  EXPECT_EQ(sc->schedule, StoreAllSchedule(step));  // the replay is dropped: the tensor stays
}

TEST(SelectiveCheckpoint, ReplaysOutsideTheBlocksAreDropped) {
  ForwardBuilder b;
  const TensorId w = b.Weight("w");
  const TensorId head = b.Op(-1, "linear", {b.x(), w}, {b.x(), w});
  const TensorId relu = b.Op(-1, "relu", {head}, {kOut});
  const Graph step = b.Step(relu);
  Schedule plan;
  for (const Op& op : step.ops()) {
    const bool relu_backward = op.phase == Phase::kBackward && op.forward_of == OpNamed(step, "relu");
    if (relu_backward && plan.CountOf(ScheduleAction::kRecompute) == 0) {
      plan.entries.push_back({ScheduleAction::kRecompute, OpNamed(step, "relu")});
    }
    plan.entries.push_back({ScheduleAction::kCompute, op.id});
  }
  absl::StatusOr<SelectiveCheckpoint> sc = RealizeSelectiveCheckpoint(step, plan);
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_TRUE(sc->regions.empty());
  EXPECT_EQ(sc->schedule, StoreAllSchedule(step));
  // A schedule that does not materialize is refused with its reason.
  Schedule broken = StoreAllSchedule(step);
  broken.entries.pop_back();
  EXPECT_THAT(RealizeSelectiveCheckpoint(step, broken).status().message(),
              ::testing::HasSubstr("every op must be computed once"));
}

// The step in program order, with `offloaded` copied out right after its
// last forward reader and back right before `back_before`, and `replayed`
// ops replayed as Replaying does.
Schedule Offloading(const Graph& step, TensorId offloaded, OpId back_before, const std::vector<OpId>& replayed = {}) {
  OpId last_forward_reader = step.producer(offloaded);
  for (const Op& op : step.ops()) {
    const bool reads = std::find(op.inputs.begin(), op.inputs.end(), offloaded) != op.inputs.end();
    if (reads && IsForwardPhase(op.phase)) last_forward_reader = op.id;
  }
  Schedule s;
  for (const ScheduleEntry& e : Replaying(step, replayed).entries) {
    if (e.action == ScheduleAction::kCompute && e.target == back_before) {
      s.entries.push_back({ScheduleAction::kPrefetch, offloaded});
    }
    s.entries.push_back(e);
    if (e.action == ScheduleAction::kCompute && e.target == last_forward_reader) {
      s.entries.push_back({ScheduleAction::kOffload, offloaded});
    }
  }
  return s;
}

// The first backward op derived from `forward_op`: where PyTorch unpacks what it saved.
OpId BackwardStart(const Graph& step, OpId forward_op) {
  for (const Op& op : step.ops()) {
    if (op.phase == Phase::kBackward && op.forward_of == forward_op) return op.id;
  }
  return kNone;
}

OpId EntryOf(const Schedule& s, ScheduleAction action, int32_t target) {
  for (size_t i = 0; i < s.entries.size(); ++i) {
    if (s.entries[i].action == action && s.entries[i].target == target) return static_cast<OpId>(i);
  }
  return kNone;
}

OpId NextCompute(const Schedule& s, OpId entry) {
  for (size_t i = static_cast<size_t>(entry); i < s.entries.size(); ++i) {
    if (s.entries[i].action == ScheduleAction::kCompute) return s.entries[i].target;
  }
  return kNone;
}

TEST(SelectiveCheckpoint, SavedTensorHooksCarryAnOffloadOutsideTheBlocks) {
  TwoLayers t;
  const Graph& step = t.step;
  const OpId relu0 = OpNamed(step, "layers.0.relu");
  const TensorId relu0_out = step.op(relu0).outputs[0];
  // Brought back right before its own first unpack: the relu's backward.
  const OpId unpacks = BackwardStart(step, relu0);
  absl::StatusOr<SelectiveCheckpoint> sc = RealizeSelectiveCheckpoint(step, Offloading(step, relu0_out, unpacks));
  ASSERT_TRUE(sc.ok()) << sc.status();
  ASSERT_EQ(sc->offloads.size(), 1u);
  EXPECT_EQ(sc->offloads[0].tensor, relu0_out);
  EXPECT_EQ(sc->offloads[0].prefetch_on_unpack_of, kNone);  // its own unpack brings it back
  EXPECT_EQ(NextCompute(sc->schedule, EntryOf(sc->schedule, ScheduleAction::kPrefetch, relu0_out)), unpacks);
  // Freed after its last forward reader, the exp.
  const OpId offload = EntryOf(sc->schedule, ScheduleAction::kOffload, relu0_out);
  ASSERT_NE(offload, kNone);
  EXPECT_EQ(sc->schedule.entries[static_cast<size_t>(offload) - 1].target, OpNamed(step, "layers.0.exp"));
  EXPECT_TRUE(sc->regions.empty());

  // A prefetch the plan issues earlier goes to the first unpack the hooks
  // see at or after it: layer 1's backward, where its exp's output is unpacked.
  const OpId exp1 = OpNamed(step, "layers.1.exp");
  absl::StatusOr<SelectiveCheckpoint> early =
      RealizeSelectiveCheckpoint(step, Offloading(step, relu0_out, BackwardStart(step, exp1)));
  ASSERT_TRUE(early.ok()) << early.status();
  ASSERT_EQ(early->offloads.size(), 1u);
  EXPECT_EQ(early->offloads[0].prefetch_on_unpack_of, step.op(exp1).outputs[0]);
  EXPECT_EQ(NextCompute(early->schedule, EntryOf(early->schedule, ScheduleAction::kPrefetch, relu0_out)),
            BackwardStart(step, exp1));
  // What runs is what is realized: realizing it again changes nothing.
  absl::StatusOr<SelectiveCheckpoint> again = RealizeSelectiveCheckpoint(step, early->schedule);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->schedule, early->schedule);
}

TEST(SelectiveCheckpoint, AnOffloadInsideACheckpointedBlockIsDropped) {
  // Layer 0 is checkpointed (its exp replayed): the checkpoint's own hooks
  // take what its ops save, so the relu's output stays on the device.
  TwoLayers t;
  const Graph& step = t.step;
  const OpId relu0 = OpNamed(step, "layers.0.relu");
  const TensorId relu0_out = step.op(relu0).outputs[0];
  absl::StatusOr<SelectiveCheckpoint> sc = RealizeSelectiveCheckpoint(
      step, Offloading(step, relu0_out, BackwardStart(step, relu0), {OpNamed(step, "layers.0.exp")}));
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_EQ(sc->regions.size(), 1u);
  EXPECT_TRUE(sc->offloads.empty());
  EXPECT_EQ(sc->schedule.CountOf(ScheduleAction::kOffload), 0u);
}

TEST(SelectiveCheckpoint, PlansThatOffloadAreEvaluatedAsTheHooksRunThem) {
  TwoLayers t;
  const Graph& step = t.step;
  PlanProblem problem{.step = &step, .op_cost = std::vector<double>(step.num_ops(), 1.0),
                      .profile = {.count_parameter_gradients = false}, .budget = ~uint64_t{0},
                      .copy_bytes_per_cost = 1e9, .runner = PlanRunner::kTorchSelectiveCheckpoint};
  const PlanEvaluation store_all = *EvaluateSchedule(problem, StoreAllSchedule(step));
  problem.budget = store_all.peak_bytes * 7 / 10;
  absl::StatusOr<PlanResult> r = RunStrategy(problem, Strategy::kOffload);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->fits);
  EXPECT_FALSE(r->offloads.empty());
  EXPECT_GT(r->evaluation.host_peak_bytes, 0u);
  EXPECT_EQ(r->schedule.CountOf(ScheduleAction::kOffload), r->offloads.size());
  absl::StatusOr<SelectiveCheckpoint> again = RealizeSelectiveCheckpoint(step, r->schedule);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->schedule, r->schedule);
  EXPECT_TRUE(ValidateSchedule(problem, r->schedule).ok());
}

TEST(SelectiveCheckpoint, FullCheckpointsReplayEachRegionUpToItsLastSave) {
  // What torch.utils.checkpoint around layer 0, and around both layers as one, runs.
  TwoLayers t;
  const Graph& step = t.step;
  const std::vector<CheckpointRegion> layers = LayerRegions(step);
  ASSERT_EQ(layers.size(), 2u);
  absl::StatusOr<SelectiveCheckpoint> one = RealizeFullCheckpoints(step, {layers[0]});
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->regions.size(), 1u);
  EXPECT_EQ(Policy(one->regions[0]), "rrrr");
  EXPECT_EQ(ReplayedOps(one->schedule).size(), 3u);  // not the add after the last save
  const CheckpointRegion both{.layer = 0, .first = layers[0].first, .last = layers[1].last};
  absl::StatusOr<SelectiveCheckpoint> joined = RealizeFullCheckpoints(step, {both});
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(ReplayedOps(joined->schedule).size(), 7u);  // both layers up to the second's last save
  // Regions out of order, or holding a backward op, are refused by name.
  EXPECT_THAT(RealizeFullCheckpoints(step, {layers[1], layers[0]}).status().message(),
              ::testing::HasSubstr("must be ascending"));
  const CheckpointRegion into_backward{.first = layers[1].first, .last = static_cast<OpId>(step.num_ops() - 1)};
  EXPECT_THAT(RealizeFullCheckpoints(step, {into_backward}).status().message(),
              ::testing::HasSubstr("is not a forward op"));
}

TEST(SelectiveCheckpoint, WhatPyTorchRunsIsWhatThePlannerEvaluatesAndItFits) {
  // Every strategy under the torch runner: the schedule reported is the
  // realized one (its replays are whole block prefixes), and it fits.
  TwoLayers t;
  const Graph& step = t.step;
  // Parameter gradients left out, as with a GPU's budget: the layers' activations make the peak.
  PlanProblem problem{.step = &step, .op_cost = std::vector<double>(step.num_ops(), 1.0),
                      .profile = {.count_parameter_gradients = false}, .budget = ~uint64_t{0},
                      .runner = PlanRunner::kTorchSelectiveCheckpoint};
  const PlanEvaluation store_all = *EvaluateSchedule(problem, StoreAllSchedule(step));
  problem.budget = store_all.peak_bytes * 8 / 10;
  for (Strategy strategy : AllStrategies()) {
    absl::StatusOr<PlanResult> r = RunStrategy(problem, strategy);
    if (!r.ok()) continue;
    absl::StatusOr<SelectiveCheckpoint> again = RealizeSelectiveCheckpoint(step, r->schedule);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->schedule, r->schedule) << StrategyName(strategy) << ": realizing what runs changes nothing";
    if (r->fits) {
      EXPECT_TRUE(ValidateSchedule(problem, r->schedule).ok()) << StrategyName(strategy);
    }
  }
  absl::StatusOr<PlanResult> automatic = RunAutomaticStrategy(problem);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_TRUE(automatic->fits);
  EXPECT_THAT(automatic->detail, ::testing::HasSubstr("the fastest of"));
}

}  // namespace
}  // namespace headroom
