// `headroom plan --model GRAPH.nx.json` on any node-link graph with any
// strategy, budget and runner: the input after a 16-byte header is the graph
// file, the header the flags. It runs the path RunPlan (cli/plan_command.cc)
// runs: BuildPlanInput, the store-all baseline, the budget (a share of that
// peak, bytes, or what a catalog GPU leaves), the strategy (one, auto or
// --compare), then for one plan the arena layout, the allocator replay, the
// plan file written and loaded back, and the report as text and JSON.
// Whatever the input:
//  - nothing crashes, and no error is InternalError (a planner disagreeing
//    with EvaluateSchedule, or any other broken invariant, is a bug);
//  - every error is one line of bounded size without a terminal escape
//    (names from the file are quoted: common/quote.h);
//  - the automatic choice fails or falls short only where every strategy does;
//  - a plan's evaluation is EvaluateSchedule's of its schedule, `fits` says
//    whether its peak is within the budget, ValidateSchedule accepts it, and
//    its plan file loads back to the same schedule.
// Graphs are capped at kMaxNodes nodes so that each run, the optimal
// strategy's LP and search included, takes milliseconds; CI runs 20,000.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/quote.h"
#include "estimators/plan_input.h"
#include "hardware/gpu_catalog.h"
#include "layout/arena_layout.h"
#include "models/model_source.h"
#include "models/node_link.h"
#include "planner/plan_json.h"
#include "planner/planner.h"
#include "planner/schedule.h"
#include "report/plan_report.h"

namespace {

using namespace headroom;

constexpr size_t kHeaderBytes = 16;
constexpr size_t kMaxNodes = 64;
// An error is one line; its size is bounded by what it quotes (80
// characters a name) and says about it.
constexpr size_t kMaxErrorBytes = 4096;

void Check(bool invariant) {
  if (!invariant) __builtin_trap();
}

// What the CLI would print for `status` is one clear line, and a bug is not
// dressed up as an input error.
void CheckError(const absl::Status& status) {
  Check(!status.ok());
  Check(status.code() != absl::StatusCode::kInternal);
  const std::string message(status.message());
  Check(message.find('\n') == std::string::npos);
  Check(message.find('\r') == std::string::npos);
  Check(message.find('\x1b') == std::string::npos);
  Check(message.size() <= kMaxErrorBytes);
}

template <typename T>
void CheckResult(const absl::StatusOr<T>& result) {
  if (!result.ok()) CheckError(result.status());
}

// A plan's figures are those of its schedule, and its plan file gives the
// schedule back (what `--out` then `--load` does).
void CheckPlan(const PlanProblem& problem, const PlanResult& plan, std::string_view strategy) {
  const absl::StatusOr<PlanEvaluation> e = EvaluateSchedule(problem, plan.schedule);
  Check(e.ok());
  Check(e->peak_bytes == plan.evaluation.peak_bytes && e->host_peak_bytes == plan.evaluation.host_peak_bytes);
  Check(plan.fits == (plan.evaluation.peak_bytes <= problem.budget));
  PlanProblem structural = problem;
  structural.budget = std::numeric_limits<uint64_t>::max();
  Check(ValidateSchedule(structural, plan.schedule).ok());

  const PlanFile file{.model = "fuzz.nx.json",
                      .strategy = std::string(strategy),
                      .budget_bytes = problem.budget,
                      .step_name = problem.step->name(),
                      .step_ops = problem.step->num_ops(),
                      .step_tensors = problem.step->num_tensors(),
                      .fingerprint = StepFingerprint(*problem.step),
                      .schedule = plan.schedule};
  const absl::StatusOr<PlanFile> back = ParsePlanFile(PlanFileToJson(file).dump(), "fuzz.plan.json");
  Check(back.ok());
  Check(CheckPlanMatchesStep(*back, *problem.step, "fuzz.plan.json").ok());
  Check(back->schedule.entries.size() == plan.schedule.entries.size());
  for (size_t i = 0; i < plan.schedule.entries.size(); ++i) {
    Check(back->schedule.entries[i].action == plan.schedule.entries[i].action &&
          back->schedule.entries[i].target == plan.schedule.entries[i].target);
  }
}

struct Flags {
  enum class Run : uint8_t { kOne, kAuto, kCompare } run = Run::kOne;
  Strategy strategy = Strategy::kHybrid;
  enum class Budget : uint8_t { kShare, kBytes, kGpu } budget = Budget::kShare;
  uint64_t percent = 80;  // of the store-all peak, as --budget N%
  uint64_t bytes = 1;     // as --budget BYTES
  const GpuSpec* gpu = nullptr;
  PlanRunner runner = PlanRunner::kAnySchedule;
  bool training = true;
  int pipeline_parallel = 1;
};

Flags FuzzedFlags(FuzzedDataProvider& in) {
  Flags f;
  const std::vector<Strategy> strategies = AllStrategies();
  // Mostly one strategy; --compare (every strategy) is the dearest, so rarest.
  const auto pick = in.ConsumeIntegralInRange<size_t>(0, strategies.size() + 2);
  if (pick < strategies.size()) {
    f.strategy = strategies[pick];
  } else {
    f.run = pick == strategies.size() + 2 ? Flags::Run::kCompare : Flags::Run::kAuto;
  }
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      f.budget = Flags::Budget::kBytes;
      f.bytes = in.ConsumeIntegralInRange<uint64_t>(0, uint64_t{1} << 40);
      break;
    case 1: {
      f.budget = Flags::Budget::kGpu;
      const std::vector<GpuSpec>& gpus = GpuCatalog::Builtin().gpus();
      f.gpu = &gpus[in.ConsumeIntegralInRange<size_t>(0, gpus.size() - 1)];
      break;
    }
    default:
      f.percent = in.ConsumeIntegralInRange<uint64_t>(1, 200);
  }
  f.runner = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? PlanRunner::kTorchSelectiveCheckpoint
                                                        : PlanRunner::kAnySchedule;
  f.training = in.ConsumeIntegralInRange<int>(0, 15) != 0;
  f.pipeline_parallel = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? 2 : 1;
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const size_t header = std::min(size, kHeaderBytes);
  FuzzedDataProvider in(data, header);
  const Flags flags = FuzzedFlags(in);
  const std::string_view text(reinterpret_cast<const char*>(data) + header, size - header);

  absl::StatusOr<Graph> graph = ImportNodeLink(text, "fuzz.nx.json");
  if (!graph.ok()) {
    CheckError(graph.status());
    return 0;
  }
  if (graph->num_ops() > kMaxNodes) return 0;
  const LoadedModel model{.name = "fuzz.nx.json", .kind = ModelSourceKind::kNodeLinkFile, .graph = *graph};
  JobSpec job;
  job.training = flags.training;
  job.layout.pipeline_parallel = flags.pipeline_parallel;
  job.layout.gpus = flags.pipeline_parallel;
  const Machine machine{.gpu = flags.gpu};
  absl::StatusOr<PlanInput> built = BuildPlanInput(model, job, machine);
  if (!built.ok()) {
    CheckError(built.status());
    return 0;
  }
  built->runner = flags.runner;
  const PlanInput& plan_input = *built;

  const PlanProblem unbounded = plan_input.Problem(std::numeric_limits<uint64_t>::max());
  const absl::StatusOr<PlanEvaluation> store_all = EvaluateSchedule(unbounded, StoreAllSchedule(plan_input.step));
  if (!store_all.ok()) {
    CheckError(store_all.status());
    return 0;
  }
  uint64_t budget = 0;
  switch (flags.budget) {
    case Flags::Budget::kShare:
      budget = static_cast<uint64_t>(static_cast<double>(flags.percent) / 100 *
                                     static_cast<double>(store_all->peak_bytes));
      break;
    case Flags::Budget::kBytes:
      budget = flags.bytes;
      break;
    case Flags::Budget::kGpu: {
      if (!plan_input.gpu_budget) return 0;
      const absl::StatusOr<uint64_t> fitted = BudgetThatReplaysWithinTheGpu(plan_input, Strategy::kHybrid);
      if (!fitted.ok()) {
        CheckError(fitted.status());
        return 0;
      }
      budget = *fitted;
      break;
    }
  }
  if (budget == 0) return 0;  // the CLI refuses it before planning
  const PlanProblem problem = plan_input.Problem(budget);

  PlanReport report{.model = "fuzz.nx.json", .input = &plan_input, .budget = budget,
                    .budget_source = "fuzz", .store_all = *store_all};
  switch (flags.run) {
    case Flags::Run::kOne:
      report.strategies = {flags.strategy};
      report.results.push_back(RunStrategy(problem, flags.strategy));
      break;
    case Flags::Run::kAuto: {
      report.results.push_back(RunAutomaticStrategy(problem));
      report.strategies = {report.results[0].ok() ? report.results[0]->strategy : Strategy::kHybrid};
      const absl::StatusOr<PlanResult>& chosen = report.results[0];
      if (!chosen.ok() || !chosen->fits) {
        // "No plan fits" is never said while any strategy's plan fits.
        for (const absl::StatusOr<PlanResult>& r : CompareStrategies(problem)) Check(!r.ok() || !r->fits);
      }
      break;
    }
    case Flags::Run::kCompare:
      report.strategies = AllStrategies();
      report.results = CompareStrategies(problem);
      break;
  }
  for (size_t i = 0; i < report.results.size(); ++i) {
    const absl::StatusOr<PlanResult>& r = report.results[i];
    if (!r.ok()) {
      CheckError(r.status());
      continue;
    }
    CheckPlan(problem, *r, StrategyName(report.strategies[i]));
  }
  if (report.results.size() == 1 && report.results[0].ok()) {
    // DescribeSchedule's part: the arena and the allocator replay.
    const absl::StatusOr<Graph> scheduled = MaterializeSchedule(plan_input.step, report.results[0]->schedule);
    Check(scheduled.ok());
    absl::StatusOr<ArenaLayout> arena = LayoutActivationArena(*scheduled, {.profile = plan_input.profile});
    CheckResult(arena);
    if (!arena.ok()) return 0;
    report.arena = *std::move(arena);
    absl::StatusOr<PlanReplay> replay = ReplayPlan(plan_input, *scheduled);
    CheckResult(replay);
    if (!replay.ok()) return 0;
    report.replay = *std::move(replay);
  }
  const std::string text_report = PlanText(report);
  const std::string json_report = PlanJson(report).dump(2);
  Check(!text_report.empty() && !json_report.empty());
  return 0;
}
