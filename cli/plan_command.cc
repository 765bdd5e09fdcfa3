// `headroom plan --model M [setup flags] --budget BYTES|N% | --gpu NAME
// [--strategy S | --compare]`: which activations to keep, replay or send to
// host memory so that the step fits, at the least extra time
// (planner/planner.h; the problem from estimators/plan_input.h; printed by
// report/plan_report.h). --out writes the plan file, --load reads one back.
// --emit prints the framework settings that realize the plan instead
// (report/plan_emit.h).
#include <algorithm>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/job_flags.h"
#include "cli/output_files.h"
#include "common/json_fields.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "estimators/plan_input.h"
#include "hardware/gpu_catalog.h"
#include "layout/arena_layout.h"
#include "models/model_config.h"
#include "models/model_source.h"
#include "planner/plan_json.h"
#include "planner/planner.h"
#include "replay/graph_trace.h"
#include "report/memory_timeline_svg.h"
#include "report/plan_emit.h"
#include "report/plan_report.h"

namespace headroom::cli {
namespace {

struct PlanFlags {
  std::string model;
  std::string gpu;
  std::string catalog;
  std::string budget;
  std::string strategy = "auto";
  JobFlags job;
  bool compare = false;
  bool json = false;
  std::string out;
  std::string load;
  std::string trace_out;
  std::string svg;
  std::string emit;
  std::string runner = "headroom";
};

// --runner: who carries the plan out (Note [Plan runners] in planner/plan.h).
absl::StatusOr<PlanRunner> ParseRunnerFlag(const std::string& runner) {
  if (runner == "headroom") return PlanRunner::kAnySchedule;
  if (runner == "torch-ops") return PlanRunner::kTorchSelectiveCheckpoint;
  return absl::InvalidArgumentError(
      absl::StrFormat("--runner: unknown runner %s (headroom or torch-ops)", QuoteForError(runner)));
}

// The budget for planned tensors (Note [Plan budget] in estimators/plan_input.h) and how it was set.
absl::StatusOr<std::pair<uint64_t, std::string>> ResolveBudget(const PlanFlags& flags, const PlanInput& in,
                                                               const Machine& machine,
                                                               const PlanEvaluation& store_all,
                                                               std::optional<Strategy> strategy) {
  if (!flags.budget.empty()) {
    if (flags.budget.back() == '%') {
      HEADROOM_ASSIGN_OR_RETURN(const double share, ParseBudgetShareFlag(flags.budget));
      const auto bytes = static_cast<uint64_t>(share * static_cast<double>(store_all.peak_bytes));
      if (bytes == 0) return absl::InvalidArgumentError("--budget: rounds to 0 bytes");
      return std::pair{bytes, absl::StrFormat("%s of the store-all peak", flags.budget)};
    }
    HEADROOM_ASSIGN_OR_RETURN(uint64_t bytes, ParseBudgetFlag(flags.budget));
    return std::pair{bytes, std::string("--budget")};
  }
  if (machine.gpu == nullptr) {
    return absl::InvalidArgumentError("--budget or --gpu: give the bytes for activations, or a GPU to fit");
  }
  if (!in.gpu_budget) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--gpu %s: the step's fixed state (%s: weights, gradients, optimizer state, context) already fills its %s; "
        "no activation plan can help (see 'headroom estimate' for sharding and offload of the states)",
        flags.gpu, FormatBytes(in.fixed.total()), FormatBytes(in.capacity)));
  }
  // --compare and --load: the default strategy's plans set it.
  const Strategy reference = strategy.value_or(Strategy::kHybrid);
  HEADROOM_ASSIGN_OR_RETURN(const uint64_t budget, BudgetThatReplaysWithinTheGpu(in, reference));
  if (budget == 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "--gpu %s: after the fixed state (%s) the allocator's rounding and cache leave nothing of its %s "
        "for activations",
        flags.gpu, FormatBytes(in.fixed.total()), FormatBytes(in.capacity)));
  }
  return std::pair{budget, absl::StrFormat("%s: %s minus fixed state %s, less %s for the allocator's rounding "
                                           "and cache, so that the %s plan replayed through it fits",
                                           machine.gpu->name, FormatBytes(in.capacity),
                                           FormatBytes(in.fixed.total()), FormatBytes(*in.gpu_budget - budget),
                                           StrategyName(reference))};
}

// The smallest peak any strategy reaches, for the error when none fits.
std::string SmallestReachable(const PlanProblem& problem) {
  uint64_t smallest = std::numeric_limits<uint64_t>::max();
  std::string by;
  const std::vector<Strategy> strategies = AllStrategies();
  const std::vector<absl::StatusOr<uint64_t>> peaks = SmallestPeaks(problem, strategies);
  for (size_t i = 0; i < strategies.size(); ++i) {
    if (peaks[i].ok() && *peaks[i] < smallest) {
      smallest = *peaks[i];
      by = std::string(StrategyName(strategies[i]));
    }
  }
  return by.empty() ? "no strategy produced a plan"
                    : absl::StrFormat("the smallest peak any strategy reaches is %s (%s)", FormatBytes(smallest), by);
}

absl::StatusOr<PlanResult> LoadPlan(const std::string& path, const PlanProblem& problem) {
  HEADROOM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, kPlanFile));
  HEADROOM_ASSIGN_OR_RETURN(PlanFile file, ParsePlanFile(text, path));
  HEADROOM_RETURN_IF_ERROR(CheckPlanMatchesStep(file, *problem.step, path));
  absl::StatusOr<Strategy> strategy = ParseStrategy(file.strategy);
  if (!strategy.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": strategy: ", strategy.status().message()));
  }
  PlanProblem structural = problem;  // the budget is checked below, against this run's
  structural.budget = std::numeric_limits<uint64_t>::max();
  absl::Status valid = ValidateSchedule(structural, file.schedule);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", valid.message()));
  HEADROOM_ASSIGN_OR_RETURN(PlanEvaluation e, EvaluateSchedule(problem, file.schedule));
  PlanResult result{.strategy = *strategy, .schedule = std::move(file.schedule), .evaluation = std::move(e),
                    .detail = absl::StrCat("loaded from ", path)};
  result.fits = result.evaluation.peak_bytes <= problem.budget;
  return result;
}

absl::Status WritePlan(const std::string& path, const PlanFlags& flags, const PlanProblem& problem,
                       const PlanResult& result, std::vector<PlanTensor> tensors) {
  const PlanFile file{.model = flags.model,
                      .strategy = std::string(StrategyName(result.strategy)),
                      .budget_bytes = problem.budget,
                      .step_name = problem.step->name(),
                      .step_ops = problem.step->num_ops(),
                      .step_tensors = problem.step->num_tensors(),
                      .fingerprint = StepFingerprint(*problem.step),
                      .schedule = result.schedule,
                      .tensors = std::move(tensors)};
  return WriteTextFile(path, PlanFileToJson(file).dump() + "\n", "--out");
}

// What one plan's schedule looks like from the allocator's side: its static
// arena in the report, its tensors' lives and offsets for the plan file, and
// on request its allocation trace for `headroom replay` and its memory
// timeline.
absl::StatusOr<std::vector<PlanTensor>> DescribeSchedule(const PlanFlags& flags, const PlanInput& in,
                                                         const PlanResult& plan, PlanReport& report) {
  HEADROOM_ASSIGN_OR_RETURN(const Graph scheduled, MaterializeSchedule(in.step, plan.schedule));
  HEADROOM_ASSIGN_OR_RETURN(report.arena, LayoutActivationArena(scheduled, {.profile = in.profile}));
  AllocationTrace sequence;
  HEADROOM_ASSIGN_OR_RETURN(report.replay, ReplayPlan(in, scheduled, flags.trace_out.empty() ? nullptr : &sequence));
  std::vector<PlanTensor> tensors;
  tensors.reserve(report.arena->blocks.size());
  for (const ArenaBlock& b : report.arena->blocks) {
    const Tensor& t = scheduled.tensor(b.id);
    tensors.push_back({.name = t.name, .bytes = t.bytes(), .first = b.first, .last = b.last, .offset = b.offset});
  }
  if (!flags.trace_out.empty()) {
    HEADROOM_RETURN_IF_ERROR(WriteTextFile(flags.trace_out, FormatRmmLog(sequence), "--trace-out"));
  }
  if (!flags.svg.empty()) {
    // The drawn fixed state leaves out the CUDA context and workspaces,
    // which are not tensors; the budget line sits on what is drawn. One
    // micro-batch is drawn, so with others in flight the line is lowered by
    // what they hold.
    const FixedBytes fixed{.weights = in.fixed.weights, .optimizer_state = in.fixed.optimizer_state,
                           .gradients = in.fixed.gradients};
    const uint64_t others = static_cast<uint64_t>(in.in_flight - 1) * plan.evaluation.held_after_forward;
    MemoryTimelineOptions options{
        .title = absl::StrFormat("%s: %s plan", flags.model, StrategyName(plan.strategy)),
        .profile = in.profile,
        .fixed = fixed,
        .budget_bytes = report.budget - std::min(report.budget, others) + fixed.weights + fixed.optimizer_state +
                        fixed.gradients,
        .budget_label = others > 0 ? "budget less in-flight" : "budget"};
    HEADROOM_ASSIGN_OR_RETURN(const std::string svg, RenderMemoryTimelineSvg(scheduled, options));
    HEADROOM_RETURN_IF_ERROR(WriteTextFile(flags.svg, svg, "--svg"));
  }
  return tensors;
}

// --emit: checked before planning, so a bad format fails fast.
absl::StatusOr<std::optional<EmitFormat>> ParseEmitFlags(const PlanFlags& flags) {
  if (flags.emit.empty()) return std::optional<EmitFormat>();
  absl::StatusOr<EmitFormat> format = ParseEmitFormat(flags.emit);
  if (!format.ok()) return absl::InvalidArgumentError(absl::StrCat("--emit: ", format.status().message()));
  if (flags.compare) return absl::InvalidArgumentError("--emit: prints the settings of one plan; drop --compare");
  if (flags.json) return absl::InvalidArgumentError("--emit: prints framework settings, not JSON; drop --json");
  return std::optional<EmitFormat>(*format);
}

// --emit: the settings that realize the one plan of `report`, per layer of a transformer stack.
absl::Status EmitPlanSettings(EmitFormat format, const PlanFlags& flags, const LoadedModel& model,
                              const PlanReport& report, std::ostream& out) {
  const ModelFamily family = model.config ? model.config->family : ModelFamily::kDecoder;
  if (family == ModelFamily::kCnn || family == ModelFamily::kMlp) {
    return absl::InvalidArgumentError(absl::StrFormat("--emit needs a transformer stack; %s is %s", flags.model,
                                                      family == ModelFamily::kCnn ? "a CNN" : "an MLP chain"));
  }
  const PlanResult& plan = *report.results[0];
  const Graph& step = report.input->step;
  absl::StatusOr<StackPlan> stack = ClassifyStack(step, plan.schedule);
  if (stack.status().code() == absl::StatusCode::kFailedPrecondition) {
    return absl::InvalidArgumentError("--emit needs a transformer stack; this graph has no layers");
  }
  HEADROOM_RETURN_IF_ERROR(stack.status());
  // Note [Emitted settings' peak]: the peak of what the settings run, where it is modeled.
  const std::string fits = plan.fits ? "" : " (does not fit)";
  std::string title = absl::StrFormat("%s, %s, peak %s for a budget of %s%s", flags.model,
                                      StrategyName(plan.strategy), FormatBytes(plan.evaluation.peak_bytes),
                                      FormatBytes(report.budget), fits);
  absl::StatusOr<std::vector<CheckpointRegion>> regions = SettingsRegions(format, *stack, step);
  if (!regions.ok() && !flags.out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--out with --emit ", flags.emit,
                                                   ": what these settings run is not modeled: ",
                                                   regions.status().message()));
  }
  if (regions.ok()) {
    HEADROOM_ASSIGN_OR_RETURN(const SelectiveCheckpoint runs, RealizeFullCheckpoints(step, *std::move(regions)));
    const PlanProblem problem = report.input->Problem(report.budget);
    HEADROOM_ASSIGN_OR_RETURN(const PlanEvaluation e, EvaluateSchedule(problem, runs.schedule));
    if (!flags.out.empty()) {
      PlanResult settings = plan;
      settings.schedule = runs.schedule;
      HEADROOM_RETURN_IF_ERROR(WritePlan(flags.out, flags, problem, settings, {}));
    }
    title = absl::StrFormat("%s, %s plan; these settings peak at %s (the plan: %s) for a budget of %s%s", flags.model,
                            StrategyName(plan.strategy), FormatBytes(e.peak_bytes),
                            FormatBytes(plan.evaluation.peak_bytes), FormatBytes(report.budget),
                            e.peak_bytes <= report.budget ? "" : " (they do not fit)");
  } else if (regions.status().code() == absl::StatusCode::kUnimplemented) {
    absl::StrAppend(&title, "; not the peak of these settings: ", regions.status().message());
  } else {
    return regions.status();
  }
  bool random = false;
  for (const Op& op : step.ops()) random = random || (IsForwardPhase(op.phase) && IsRandomKind(op.kind));
  const EmitContext context{.title = std::move(title),
                            .model_type = model.config ? model.config->model_type : "",
                            .has_random_ops = random};
  out << EmitPlan(format, *stack, context);
  return absl::OkStatus();
}

absl::Status RunPlan(const PlanFlags& flags, std::ostream& out) {
  HEADROOM_ASSIGN_OR_RETURN(const std::optional<EmitFormat> emit, ParseEmitFlags(flags));
  HEADROOM_ASSIGN_OR_RETURN(JobSpec job, ToJob(flags.job));
  HEADROOM_RETURN_IF_ERROR(CheckOutputFiles(
      {{"--out", flags.out}, {"--trace-out", flags.trace_out}, {"--svg", flags.svg}},
      {{"--model", flags.model}, {"--catalog", flags.catalog}, {"--load", flags.load}}));
  if (flags.compare && !(flags.out.empty() && flags.trace_out.empty() && flags.svg.empty())) {
    return absl::InvalidArgumentError("--out, --trace-out, --svg: each writes one plan; drop --compare");
  }
  std::optional<GpuCatalog> catalog;
  Machine machine;
  HEADROOM_ASSIGN_OR_RETURN(machine.gpu, FindGpuFlag(flags.gpu, flags.catalog, catalog));
  std::optional<Strategy> strategy;
  const bool automatic = flags.strategy == "auto" && !flags.compare && flags.load.empty();
  if (!flags.compare && flags.load.empty() && !automatic) {
    absl::StatusOr<Strategy> parsed = ParseStrategy(flags.strategy);
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--strategy: ", parsed.status().message()));
    strategy = *parsed;
  }
  HEADROOM_ASSIGN_OR_RETURN(LoadedModel model, LoadModel(flags.model));
  ApplyModelDefaults(flags.job, model, job);
  HEADROOM_ASSIGN_OR_RETURN(const PlanRunner runner, ParseRunnerFlag(flags.runner));
  absl::StatusOr<PlanInput> built = BuildPlanInput(model, job, machine);
  if (!built.ok()) return InFlagTerms(built.status());
  built->runner = runner;
  const PlanInput& in = *built;

  const PlanProblem unbounded = in.Problem(std::numeric_limits<uint64_t>::max());
  HEADROOM_ASSIGN_OR_RETURN(const PlanEvaluation store_all, EvaluateSchedule(unbounded, StoreAllSchedule(in.step)));
  HEADROOM_ASSIGN_OR_RETURN(auto budget, ResolveBudget(flags, in, machine, store_all, strategy));
  const PlanProblem problem = in.Problem(budget.first);

  PlanReport report{.model = flags.model,
                    .model_class = model.config ? ArchitectureChoice(*model.config) : "",
                    .input = &in, .budget = budget.first,
                    .budget_source = std::move(budget.second), .store_all = store_all};
  if (flags.compare) {
    report.strategies = AllStrategies();
    report.results = CompareStrategies(problem);
  } else if (!flags.load.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(PlanResult loaded, LoadPlan(flags.load, problem));
    report.strategies = {loaded.strategy};
    report.results.push_back(std::move(loaded));
  } else if (automatic) {
    report.results.push_back(RunAutomaticStrategy(problem));
    report.strategies = {report.results[0].ok() ? report.results[0]->strategy : Strategy::kHybrid};
    if (!report.results[0].ok()) {
      const absl::Status& error = report.results[0].status();
      if (error.code() != absl::StatusCode::kResourceExhausted) return error;
      return absl::ResourceExhaustedError(absl::StrCat(error.message(), "; ", SmallestReachable(problem)));
    }
  } else {
    report.strategies = {*strategy};
    report.results.push_back(RunStrategy(problem, *strategy));
    if (!report.results[0].ok()) {
      const absl::Status& error = report.results[0].status();
      if (error.code() != absl::StatusCode::kResourceExhausted) return error;
      return absl::ResourceExhaustedError(absl::StrCat(error.message(), "; ", SmallestReachable(problem)));
    }
  }
  if (report.results.size() == 1 && report.results[0].ok()) {
    HEADROOM_ASSIGN_OR_RETURN(std::vector<PlanTensor> tensors,
                              DescribeSchedule(flags, in, *report.results[0], report));
    // With --emit, --out is the schedule the settings run (EmitPlanSettings).
    if (!flags.out.empty() && !emit) {
      HEADROOM_RETURN_IF_ERROR(WritePlan(flags.out, flags, problem, *report.results[0], std::move(tensors)));
    }
  }
  if (emit) {
    HEADROOM_RETURN_IF_ERROR(EmitPlanSettings(*emit, flags, model, report, out));
  } else {
    out << (flags.json ? PlanJson(report).dump(2) + "\n" : PlanText(report));
  }

  bool any_fits = false;
  for (const absl::StatusOr<PlanResult>& r : report.results) any_fits = any_fits || (r.ok() && r->fits);
  if (!any_fits) {
    // "No plan fits" only where every strategy was run: one plan that does
    // not look at the budget (store-all, sqrt-n, a loaded one) says what it
    // peaks at, so that another strategy's smaller peak is no contradiction.
    std::string what = absl::StrFormat("no plan fits the budget of %s", FormatBytes(budget.first));
    if (report.results.size() == 1 && report.results[0].ok()) {
      const PlanResult& one = *report.results[0];
      what = absl::StrFormat("the %s plan%s peaks at %s, over the budget of %s", StrategyName(one.strategy),
                             flags.load.empty() ? "" : absl::StrCat(" loaded from ", QuoteForError(flags.load)),
                             FormatBytes(one.evaluation.peak_bytes), FormatBytes(budget.first));
    }
    return absl::ResourceExhaustedError(absl::StrCat(what, "; ", SmallestReachable(problem)));
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand AddPlanCommand(CLI::App& root) {
  auto f = std::make_shared<PlanFlags>();
  CLI::App* app = root.add_subcommand(
      "plan", "Which activations to keep, replay or offload so the step fits, at the least extra time");
  app->add_option("--model", f->model, "Preset name, config.json, graph JSON or node-link JSON path")->required();
  app->add_option("--gpu", f->gpu, "Fit this catalog GPU: the budget is its memory minus the step's fixed state");
  app->add_option("--catalog", f->catalog, "Find --gpu in this catalog file instead of the built-in one");
  app->add_option("--budget", f->budget, "Bytes for planned tensors (e.g. 20GiB), or N% of the store-all peak");
  app->add_option("--strategy", f->strategy,
                  "auto (hybrid, or the fastest plan that fits of all strategies where hybrid's does not or "
                  "--runner torch-ops realizes them), store-all, sqrt-n, sqrt-n-linear, chen-greedy, chain-dp, "
                  "optimal, offload or hybrid")
      ->default_str("auto");
  app->add_flag("--compare", f->compare, "Run every strategy and print one row each");
  AddJobFlags(*app, f->job);
  app->add_flag("--json", f->json, "Print a JSON object (exact bytes)");
  AddOutputOption(*app, "--out", f->out,
                  "Write the plan file (JSON schedule) here; with --emit, the schedule the printed settings run");
  app->add_option("--load", f->load, "Evaluate a plan file written by --out (same --model and job flags)");
  AddOutputOption(*app, "--trace-out", f->trace_out,
                  "Write the allocations the plan's allocator figures replay (resident state, then the plan's "
                  "tensors) as an RMM CSV trace for 'headroom replay'");
  AddOutputOption(*app, "--svg", f->svg, "Write the plan's memory timeline as an SVG");
  app->add_option("--runner", f->runner,
                  "Who runs the plan: headroom (any schedule) or torch-ops (PyTorch's selective activation "
                  "checkpointing around the model's blocks, as the Python package applies it); figures are those "
                  "of what that runner runs")
      ->default_str("headroom");
  app->add_option("--emit", f->emit,
                  "Print the settings that realize the plan: torch, hf, megatron, deepspeed or torch-budget");
  return {app, [f](std::ostream& out) { return RunPlan(*f, out); }};
}

}  // namespace headroom::cli
