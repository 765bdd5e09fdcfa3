#include "report/plan_report.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/text_table.h"
#include "common/units.h"
#include "report/layer_plan.h"

namespace headroom {
namespace {

std::string Cost(double cost, const std::string& unit) {
  return unit == "s" ? absl::StrFormat("%.4g s", cost) : absl::StrFormat("%.6g %s", cost, unit);
}

std::string Percent(double part, double whole) {
  return whole > 0 ? absl::StrFormat("%+.1f%%", 100 * part / whole) : "-";
}

nlohmann::json EvaluationJson(const PlanEvaluation& e) {
  return {{"peak_bytes", e.peak_bytes},       {"base_cost", e.base_cost},
          {"extra_cost", e.extra_cost},       {"wait_cost", e.wait_cost},
          {"step_cost", e.step_cost},         {"host_peak_bytes", e.host_peak_bytes},
          {"offloaded_bytes", e.offloaded_bytes}, {"recomputed_ops", e.recomputed_ops},
          {"held_after_forward_bytes", e.held_after_forward}};
}

// The checkpointed regions of a plan PyTorch runs (Note [Plan runners]):
// per region its layer, the kinds of its ops in order (so that whoever
// applies it can check them against the model it runs) and each op's
// policy, 's' for save and 'r' for recompute.
nlohmann::json RegionsJson(const Graph& step, const std::vector<CheckpointRegion>& regions) {
  nlohmann::json out = nlohmann::json::array();
  for (const CheckpointRegion& region : regions) {
    nlohmann::json kinds = nlohmann::json::array();
    std::string policy;
    for (OpId o = region.first; o <= region.last; ++o) {
      kinds.push_back(step.op(o).kind);
      policy.push_back(region.save[static_cast<size_t>(o - region.first)] ? 's' : 'r');
    }
    out.push_back({{"layer", region.layer},
                   {"first_op", region.first},
                   {"kinds", std::move(kinds)},
                   {"policy", std::move(policy)},
                   {"replayed_ops", region.replayed_ops}});
  }
  return out;
}

// The offloads saved-tensor hooks carry (Note [Offload through saved-tensor
// hooks]): each storage by its base tensor, and the storage whose first
// unpack brings it back (null: its own).
nlohmann::json OffloadsJson(const Graph& step, const std::vector<HookedOffload>& offloads) {
  nlohmann::json out = nlohmann::json::array();
  for (const HookedOffload& o : offloads) {
    const Tensor& t = step.tensor(o.tensor);
    out.push_back({{"tensor", o.tensor},
                   {"name", t.name},
                   {"bytes", t.bytes()},
                   {"prefetch_on_unpack_of", o.prefetch_on_unpack_of == kNone ? nlohmann::json(nullptr)
                                                                              : nlohmann::json(o.prefetch_on_unpack_of)}});
  }
  return out;
}

std::string Header(const PlanReport& r) {
  const PlanInput& in = *r.input;
  std::string out = absl::StrFormat("Plan for %s: %d ops, costs from %s\n", r.model, in.step.num_ops(), in.cost_source);
  if (!r.model_class.empty()) absl::StrAppend(&out, "class:       ", r.model_class, "\n");
  absl::StrAppend(&out, absl::StrFormat("budget:      %s for planned tensors (%s)\n", FormatBytes(r.budget),
                                        r.budget_source));
  if (in.fixed.total() > 0) {
    absl::StrAppend(&out, absl::StrFormat(
                              "fixed state: %s (weights %s, gradients %s, optimizer state %s, context and "
                              "workspaces %s)\n",
                              FormatBytes(in.fixed.total()), FormatBytes(in.fixed.weights),
                              FormatBytes(in.fixed.gradients), FormatBytes(in.fixed.optimizer_state),
                              FormatBytes(in.fixed.other)));
  }
  if (in.step.name().find("(pipeline stage") != std::string::npos) {
    absl::StrAppend(&out, absl::StrFormat("pipeline:    %s (stage %d), %d micro-batch(es) in flight (%s): each "
                                          "other one holds what its forward leaves, in every peak\n",
                                          in.pipeline_stage_asked ? "the stage asked for" : "the fullest stage's step",
                                          in.pipeline_stage, in.in_flight,
                                          PipelineScheduleName(in.pipeline_schedule)));
  }
  if (in.host_bytes > 0) {
    absl::StrAppend(&out, absl::StrFormat("host state:  %s in host memory (offloaded optimizer state, master "
                                          "weights or EMA copy; not in the budget)\n",
                                          FormatBytes(in.host_bytes)));
  }
  absl::StrAppend(&out, absl::StrFormat("store-all:   peak %s, step %s\n", FormatBytes(r.store_all.peak_bytes),
                                        Cost(r.store_all.step_cost, in.cost_unit)));
  return out;
}

std::string OneText(const PlanReport& r, const PlanResult& p) {
  const PlanInput& in = *r.input;
  const PlanEvaluation& e = p.evaluation;
  std::string out = Header(r);
  absl::StrAppend(&out, absl::StrFormat("\nstrategy:    %s (%s)\n", StrategyName(p.strategy), p.detail));
  absl::StrAppend(&out, absl::StrFormat("peak:        %s of %s: %s\n", FormatBytes(e.peak_bytes), FormatBytes(r.budget),
                                        p.fits ? "fits" : "does NOT fit"));
  absl::StrAppend(&out, absl::StrFormat("step:        %s, %s over store-all (replays %s, copy waits %s)\n",
                                        Cost(e.step_cost, in.cost_unit), Percent(e.step_cost - e.base_cost, e.base_cost),
                                        Cost(e.extra_cost, in.cost_unit), Cost(e.wait_cost, in.cost_unit)));
  if (p.lower_bound_extra_cost) {
    const double gap = e.extra_cost - *p.lower_bound_extra_cost;
    absl::StrAppend(&out, absl::StrFormat("lower bound: replays of at least %s; this plan is within %s of it "
                                          "(%.2f%% of the base step)\n",
                                          Cost(*p.lower_bound_extra_cost, in.cost_unit), Cost(gap, in.cost_unit),
                                          e.base_cost > 0 ? 100 * gap / e.base_cost : 0.0));
  }
  absl::StrAppend(&out, absl::StrFormat("host memory: %s at most, %s copied out\n", FormatBytes(e.host_peak_bytes),
                                        FormatBytes(e.offloaded_bytes)));
  if (in.runner == PlanRunner::kTorchSelectiveCheckpoint) {
    std::vector<int> layers;
    size_t replayed = 0;
    for (const CheckpointRegion& region : p.regions) {
      layers.push_back(region.layer);
      replayed += region.replayed_ops;
    }
    absl::StrAppend(&out, absl::StrFormat("pytorch:     selective checkpointing of %d block(s) (layers %s), %d ops "
                                          "replayed; nothing else replayed; %d tensor(s) offloaded by saved-tensor "
                                          "hooks\n",
                                          p.regions.size(), layers.empty() ? "none" : LayerRanges(layers), replayed,
                                          p.offloads.size()));
  }
  if (in.in_flight > 1) {
    absl::StrAppend(&out, absl::StrFormat("in flight:   %d other micro-batch(es) hold %s each after their forward "
                                          "(in the peak)\n",
                                          in.in_flight - 1, FormatBytes(e.held_after_forward)));
  }
  absl::StrAppend(&out, absl::StrFormat("schedule:    %d entries: %d computes, %d replays, %d offloads, %d prefetches\n",
                                        p.schedule.entries.size(), p.schedule.CountOf(ScheduleAction::kCompute),
                                        p.schedule.CountOf(ScheduleAction::kRecompute),
                                        p.schedule.CountOf(ScheduleAction::kOffload),
                                        p.schedule.CountOf(ScheduleAction::kPrefetch)));
  if (r.replay) {
    const PlanReplay& replay = *r.replay;
    absl::StrAppend(&out, absl::StrFormat("allocator:   %s allocated, %s reserved at the peak with the fixed state",
                                          FormatBytes(replay.allocator.peak_allocated_bytes),
                                          FormatBytes(replay.allocator.peak_reserved_bytes)));
    if (in.capacity > 0) {
      absl::StrAppend(&out, absl::StrFormat("; nvidia-smi %s of %s: %s", FormatBytes(replay.total_bytes()),
                                            FormatBytes(in.capacity),
                                            replay.total_bytes() <= in.capacity && !replay.allocator.out_of_memory
                                                ? "fits"
                                                : "does NOT fit"));
    }
    absl::StrAppend(&out, "\n");
  }
  if (r.arena) {
    absl::StrAppend(&out, absl::StrFormat("arena:       %s as one static buffer (greedy by size), at least %s: "
                                          "%s over the bound; %s without reuse%s\n",
                                          FormatBytes(r.arena->arena_bytes), FormatBytes(r.arena->lower_bound_bytes),
                                          FormatBytes(r.arena->gap_bytes()), FormatBytes(r.arena->naive_bytes),
                                          in.in_flight > 1 ? " (one micro-batch)" : ""));
  }
  return out;
}

}  // namespace

std::string PlanText(const PlanReport& r) {
  if (r.results.size() == 1 && r.results[0].ok()) return OneText(r, *r.results[0]);
  std::string out = Header(r);
  // gap: the plan's replays above the lower bound, as a share of the base
  // step, where a bound covers the plan.
  TextTable table({"strategy", "peak", "fits", "step", "overhead", "gap", "host", "detail"},
                  {Align::kLeft, Align::kRight, Align::kLeft, Align::kRight, Align::kRight, Align::kRight,
                   Align::kRight, Align::kLeft});
  for (size_t i = 0; i < r.results.size(); ++i) {
    const absl::StatusOr<PlanResult>& result = r.results[i];
    if (!result.ok()) {
      table.AddRow({std::string(StrategyName(r.strategies[i])), "-", "no", "-", "-", "-", "-",
                    std::string(result.status().message())});
      continue;
    }
    const PlanEvaluation& e = result->evaluation;
    table.AddRow({std::string(StrategyName(result->strategy)), FormatBytes(e.peak_bytes), result->fits ? "yes" : "no",
                  Cost(e.step_cost, r.input->cost_unit), Percent(e.step_cost - e.base_cost, e.base_cost),
                  result->lower_bound_extra_cost ? Percent(e.extra_cost - *result->lower_bound_extra_cost, e.base_cost)
                                                 : "-",
                  FormatBytes(e.host_peak_bytes), result->detail});
  }
  absl::StrAppend(&out, "\n", table.Render());
  return out;
}

nlohmann::json PlanJson(const PlanReport& r) {
  const PlanInput& in = *r.input;
  nlohmann::json plans = nlohmann::json::array();
  for (size_t i = 0; i < r.results.size(); ++i) {
    const absl::StatusOr<PlanResult>& result = r.results[i];
    if (!result.ok()) {
      plans.push_back({{"strategy", StrategyName(r.strategies[i])}, {"error", std::string(result.status().message())}});
      continue;
    }
    nlohmann::json j = {{"strategy", StrategyName(result->strategy)},
                        {"fits", result->fits},
                        {"detail", result->detail},
                        {"evaluation", EvaluationJson(result->evaluation)}};
    if (result->lower_bound_extra_cost) j["lower_bound_extra_cost"] = *result->lower_bound_extra_cost;
    if (in.runner == PlanRunner::kTorchSelectiveCheckpoint) {
      j["regions"] = RegionsJson(in.step, result->regions);
      j["offloads"] = OffloadsJson(in.step, result->offloads);
    }
    plans.push_back(std::move(j));
  }
  nlohmann::json out = {{"model", r.model},
          {"ops", in.step.num_ops()},
          {"cost_unit", in.cost_unit},
          {"cost_source", in.cost_source},
          {"budget_bytes", r.budget},
          {"budget_source", r.budget_source},
          {"fixed_bytes",
           {{"weights", in.fixed.weights},
            {"gradients", in.fixed.gradients},
            {"optimizer_state", in.fixed.optimizer_state},
            {"other", in.fixed.other}}},
          {"host_state_bytes", in.host_bytes},
          {"pipeline", {{"stage", in.pipeline_stage}, {"in_flight", in.in_flight}}},
          {"store_all", EvaluationJson(r.store_all)},
          {"plans", std::move(plans)}};
  if (!r.model_class.empty()) out["model_class"] = r.model_class;
  if (r.arena) {
    out["arena"] = {{"bytes", r.arena->arena_bytes},
                    {"lower_bound_bytes", r.arena->lower_bound_bytes},
                    {"gap_bytes", r.arena->gap_bytes()},
                    {"naive_bytes", r.arena->naive_bytes},
                    {"alignment", r.arena->alignment}};
  }
  if (r.replay) {
    out["allocator"] = {{"requested_bytes", r.replay->requested_bytes},
                        {"allocated_bytes", r.replay->allocator.peak_allocated_bytes},
                        {"reserved_bytes", r.replay->allocator.peak_reserved_bytes},
                        {"total_bytes", r.replay->total_bytes()}};
  }
  return out;
}

}  // namespace headroom
