#include "executor/train_demo.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/text_table.h"
#include "common/units.h"

namespace headroom {
namespace {

// Mean seconds per step after the first (which grows the allocator's cache).
double SteadySeconds(const std::vector<double>& seconds) {
  if (seconds.empty()) return 0;
  const size_t skip = seconds.size() > 1 ? 1 : 0;
  return std::accumulate(seconds.begin() + static_cast<std::ptrdiff_t>(skip), seconds.end(), 0.0) /
         static_cast<double>(seconds.size() - skip);
}

std::string Describe(const DemoModel& model) {
  uint64_t layers = 0;
  for (const Op& op : model.forward.ops()) layers = std::max<uint64_t>(layers, static_cast<uint64_t>(op.layer + 1));
  return absl::StrFormat("%d layers, inputs [%s], %d parameters, fp32, SGD with momentum", layers,
                         absl::StrJoin(model.forward.tensor(model.inputs).shape, " x "),
                         model.forward.ParameterCount());
}

struct Trained {
  std::vector<float> losses;
  std::vector<double> seconds;
  StepResult last;  // its statistics cover the whole run
};

absl::StatusOr<Trained> Train(const DemoModel& model, const PlanInput& in, const Schedule& schedule,
                              const TrainDemoOptions& options) {
  HEADROOM_ASSIGN_OR_RETURN(std::unique_ptr<PlanExecutor> executor,
                            PlanExecutor::Create(model, in, schedule, options.executor));
  Trained t;
  for (int s = 0; s < options.steps; ++s) {
    HEADROOM_ASSIGN_OR_RETURN(const StepResult r, executor->RunStep(model.MakeBatch(s)));
    t.last = r;
    t.losses.push_back(r.loss);
    t.seconds.push_back(r.seconds);
  }
  return t;
}

}  // namespace

absl::StatusOr<TrainDemoReport> RunTrainDemo(const DemoModel& model, const TrainDemoOptions& options) {
  if (options.steps < 1 || options.steps > 100000) {
    return absl::InvalidArgumentError(absl::StrFormat("steps: %d is not in [1, 100000]", options.steps));
  }
  HEADROOM_ASSIGN_OR_RETURN(const PlanInput in, DemoPlanInput(model, options.job, options.executor.device_bytes));
  const Schedule store_all = StoreAllSchedule(in.step);
  HEADROOM_ASSIGN_OR_RETURN(const PlanEvaluation unplanned,
                            EvaluateSchedule(in.Problem(std::numeric_limits<uint64_t>::max()), store_all));
  TrainDemoReport report{.model = model.name, .description = Describe(model)};
  for (const ResidentBlock& b : in.resident) report.resident_bytes += b.bytes;
  if (unplanned.peak_bytes + report.resident_bytes > kMaxDemoStepBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: a step needs %s (%s at the store-all peak, %s of weights and optimizer state); the CPU reference "
        "holds at most %s in host memory: choose smaller --batch, --seq, --hidden, --vocab or --layers",
        model.name, FormatBytes(unplanned.peak_bytes + report.resident_bytes), FormatBytes(unplanned.peak_bytes),
        FormatBytes(report.resident_bytes), FormatBytes(kMaxDemoStepBytes)));
  }
  report.store_all_peak_bytes = unplanned.peak_bytes;
  report.budget_bytes = options.budget_bytes.value_or(
      static_cast<uint64_t>(options.budget_fraction * static_cast<double>(unplanned.peak_bytes)));
  const PlanProblem problem = in.Problem(report.budget_bytes);
  PlanResult plan;
  if (options.plan_file) {
    HEADROOM_RETURN_IF_ERROR(CheckPlanMatchesStep(*options.plan_file, in.step, options.plan_source));
    plan.schedule = options.plan_file->schedule;
    PlanProblem structural = problem;  // the file is checked as `headroom plan --load` checks it
    structural.budget = std::numeric_limits<uint64_t>::max();
    if (absl::Status valid = ValidateSchedule(structural, plan.schedule); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(options.plan_source, ": ", valid.message()));
    }
    absl::StatusOr<PlanEvaluation> evaluation = EvaluateSchedule(problem, plan.schedule);
    if (!evaluation.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(options.plan_source, ": ", evaluation.status().message()));
    }
    plan.evaluation = *evaluation;
    report.strategy = absl::StrFormat("%s from %s", options.plan_file->strategy, options.plan_source);
  } else {
    HEADROOM_ASSIGN_OR_RETURN(plan, RunStrategy(problem, options.strategy));
    report.strategy = std::string(StrategyName(options.strategy));
    report.plan_detail = plan.detail;
  }
  report.plan_peak_bytes = plan.evaluation.peak_bytes;
  report.replays = plan.schedule.CountOf(ScheduleAction::kRecompute);
  report.offloads = plan.schedule.CountOf(ScheduleAction::kOffload);
  report.predicted_overhead = plan.evaluation.step_cost / unplanned.step_cost - 1;

  HEADROOM_ASSIGN_OR_RETURN(const Graph scheduled, MaterializeSchedule(in.step, plan.schedule));
  HEADROOM_ASSIGN_OR_RETURN(const PlanReplay replay, ReplayPlan(in, scheduled));
  report.predicted = {.requested_bytes = replay.requested_bytes,
                      .allocated_bytes = replay.allocator.peak_allocated_bytes,
                      .reserved_bytes = replay.allocator.peak_reserved_bytes,
                      .host_bytes = plan.evaluation.host_peak_bytes};

  HEADROOM_ASSIGN_OR_RETURN(const Trained planned, Train(model, in, plan.schedule, options));
  HEADROOM_ASSIGN_OR_RETURN(const Trained baseline, Train(model, in, store_all, options));
  report.measured = {.requested_bytes = planned.last.peak_requested_bytes,
                     .allocated_bytes = planned.last.peak_allocated_bytes,
                     .reserved_bytes = planned.last.peak_reserved_bytes,
                     .host_bytes = planned.last.host_peak_bytes};
  report.losses = planned.losses;
  report.seconds = planned.seconds;
  report.store_all_seconds = baseline.seconds;
  report.losses_match_store_all = planned.losses == baseline.losses;
  return report;
}

std::string FormatTrainDemo(const TrainDemoReport& r) {
  std::string out = absl::StrFormat("%s: %s\n", r.model, r.description);
  absl::StrAppend(&out, absl::StrFormat("plan:   %s%s for a budget of %s (store-all needs %s): %d replays, "
                                        "%d offloads, peak %s %s\n",
                                        r.strategy, r.plan_detail.empty() ? "" : " (" + r.plan_detail + ")",
                                        FormatBytes(r.budget_bytes), FormatBytes(r.store_all_peak_bytes), r.replays,
                                        r.offloads, FormatBytes(r.plan_peak_bytes),
                                        r.plan_peak_bytes <= r.budget_bytes ? "(within the budget)"
                                                                            : "(OVER the budget)"));
  out += "\n";
  TextTable steps({"step", "loss", "time"});
  for (size_t i = 0; i < r.losses.size(); ++i) {
    const bool shown = r.losses.size() <= 12 || i < 5 || i + 5 >= r.losses.size();
    if (!shown) {
      if (i == 5) steps.AddRow({"...", "", ""});
      continue;
    }
    steps.AddRow({absl::StrCat(i + 1), absl::StrFormat("%.4f", r.losses[i]),
                  absl::StrFormat("%.1f ms", r.seconds[i] * 1e3)});
  }
  out += steps.Render();
  absl::StrAppend(&out, absl::StrFormat("loss %.4f -> %.4f; the same steps without a plan give %s losses\n\n",
                                        r.losses.front(), r.losses.back(),
                                        r.losses_match_store_all ? "bitwise the same" : "DIFFERENT"));
  TextTable memory({"memory", "predicted", "measured", ""});
  const auto row = [&](const std::string& what, uint64_t predicted, uint64_t measured) {
    memory.AddRow({what, FormatBytes(predicted), FormatBytes(measured), predicted == measured ? "equal" : "DIFFER"});
  };
  row("requested peak (device)", r.predicted.requested_bytes, r.measured.requested_bytes);
  row("allocated peak (device)", r.predicted.allocated_bytes, r.measured.allocated_bytes);
  row("reserved peak (device)", r.predicted.reserved_bytes, r.measured.reserved_bytes);
  row("host pool peak", r.predicted.host_bytes, r.measured.host_bytes);
  out += memory.Render();
  absl::StrAppend(&out, absl::StrFormat("planned tensors at the peak: %s of the %s budget (the rest is %s of weights "
                                        "and optimizer state)\n",
                                        FormatBytes(r.measured.requested_bytes - r.resident_bytes),
                                        FormatBytes(r.budget_bytes), FormatBytes(r.resident_bytes)));
  const double plan = SteadySeconds(r.seconds);
  const double base = SteadySeconds(r.store_all_seconds);
  absl::StrAppend(&out, absl::StrFormat("time:   %.1f ms per step under the plan, %.1f ms without: %+.1f%% on the "
                                        "CPU reference (the planner's cost model predicts %+.1f%% on its GPU)\n",
                                        plan * 1e3, base * 1e3, base > 0 ? (plan / base - 1) * 100 : 0.0,
                                        r.predicted_overhead * 100));
  return out;
}

nlohmann::json TrainDemoJson(const TrainDemoReport& r) {
  const auto memory = [](const MemoryCheck& m) {
    return nlohmann::json{{"requested_bytes", m.requested_bytes},
                          {"allocated_bytes", m.allocated_bytes},
                          {"reserved_bytes", m.reserved_bytes},
                          {"host_bytes", m.host_bytes}};
  };
  return {{"model", r.model},
          {"strategy", r.strategy},
          {"budget_bytes", r.budget_bytes},
          {"store_all_peak_bytes", r.store_all_peak_bytes},
          {"plan_peak_bytes", r.plan_peak_bytes},
          {"replays", r.replays},
          {"offloads", r.offloads},
          {"resident_bytes", r.resident_bytes},
          {"predicted", memory(r.predicted)},
          {"measured", memory(r.measured)},
          {"losses", r.losses},
          {"losses_match_store_all", r.losses_match_store_all},
          {"seconds", r.seconds},
          {"store_all_seconds", r.store_all_seconds},
          {"predicted_overhead", r.predicted_overhead}};
}

}  // namespace headroom
