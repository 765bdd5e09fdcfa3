#include "report/validation_report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "common/text_table.h"
#include "common/units.h"
#include "estimators/plan_input.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "hardware/gpu_catalog.h"

namespace headroom {
namespace {

// The estimate is asked with a capacity no step reaches: validation compares
// bytes, not a verdict.
constexpr uint64_t kValidationCapacity = uint64_t{1} << 60;

// "-6.2%", "+0.4%".
std::string SignedPercent(double fraction) { return absl::StrFormat("%+.1f%%", 100.0 * fraction); }

// "3%", "2.5%".
std::string Percent(double fraction) { return absl::StrFormat("%g%%", 100.0 * fraction); }

// "backward: _log_softmax_backward_data"; the harness cannot always name it.
std::string PeakAt(const std::string& phase, const std::string& op) {
  if (op.empty() && phase.empty()) return "not recorded";
  if (phase.empty()) return op;
  if (op.empty()) return phase;
  return absl::StrFormat("%s: %s", phase, op);
}

bool AnySmallerInputs(const ValidationRun& run) {
  for (const FixtureCheck& check : run.checks) {
    if (!check.measured.smaller_inputs.empty()) return true;
  }
  return false;
}

bool AnyHost(const ValidationRun& run) {
  for (const FixtureCheck& check : run.checks) {
    if (check.host_error) return true;
  }
  return false;
}

bool AnyReserved(const ValidationRun& run) {
  for (const FixtureCheck& check : run.checks) {
    if (check.reserved_error) return true;
  }
  return false;
}

std::vector<std::string> PeerTools(const ValidationRun& run) {
  std::set<std::string> tools;
  for (const FixtureCheck& check : run.checks) {
    for (const PeerCheck& peer : check.peers) tools.insert(peer.tool);
  }
  return {tools.begin(), tools.end()};
}

struct Table {
  std::vector<std::string> header;
  std::vector<Align> align;
  std::vector<std::vector<std::string>> rows;
};

// The table both renderings share.
Table BuildTable(const ValidationRun& run) {
  const bool reserved = AnyReserved(run);
  const bool host = AnyHost(run);
  const bool smaller = AnySmallerInputs(run);
  const std::vector<std::string> tools = PeerTools(run);
  Table table;
  auto column = [&](std::string name, Align align) {
    table.header.push_back(std::move(name));
    table.align.push_back(align);
  };
  column("fixture", Align::kLeft);
  column("description", Align::kLeft);
  column("measured", Align::kRight);
  column("estimated", Align::kRight);
  column("error", Align::kRight);
  column("measured peak at", Align::kLeft);
  column("estimated peak at", Align::kLeft);
  if (reserved) {
    column("reserved measured", Align::kRight);
    column("reserved estimated", Align::kRight);
    column("reserved error", Align::kRight);
  }
  if (host) {
    column("host measured", Align::kRight);
    column("host estimated", Align::kRight);
    column("host error", Align::kRight);
  }
  if (smaller) column("smaller inputs' peak", Align::kRight);
  for (const std::string& tool : tools) column(tool, Align::kRight);
  column("verdict", Align::kLeft);

  for (const FixtureCheck& check : run.checks) {
    std::vector<std::string> row = {check.name,
                                    check.description,
                                    FormatBytes(check.measured.peak_allocated_bytes),
                                    FormatBytes(check.estimated.allocated_bytes),
                                    SignedPercent(check.error),
                                    PeakAt(check.measured.peak_phase, check.measured.peak_op),
                                    PeakAt(check.estimated.peak_phase, check.estimated.peak_op)};
    if (reserved) {
      if (check.reserved_error) {
        row.push_back(FormatBytes(*check.measured.peak_reserved_bytes));
        row.push_back(FormatBytes(check.estimated.reserved_bytes));
        row.push_back(SignedPercent(*check.reserved_error));
      } else {
        row.insert(row.end(), 3, "");
      }
    }
    if (host) {
      if (check.host_error) {
        row.push_back(FormatBytes(check.measured.host_peak_bytes.value_or(0)));
        row.push_back(FormatBytes(check.estimated_host_bytes));
        row.push_back(SignedPercent(*check.host_error));
      } else {
        row.insert(row.end(), 3, "");
      }
    }
    if (smaller) {
      uint64_t largest = 0;
      for (const MeasuredStep::SmallerInputs& s : check.measured.smaller_inputs) {
        largest = std::max(largest, s.peak_allocated_bytes);
      }
      row.push_back(check.measured.smaller_inputs.empty()
                        ? ""
                        : absl::StrFormat("%s (%d)", FormatBytes(largest), check.measured.smaller_inputs.size()));
    }
    for (const std::string& tool : tools) {
      std::string cell;
      for (const PeerCheck& peer : check.peers) {
        if (peer.tool == tool) cell = SignedPercent(peer.error);
      }
      row.push_back(std::move(cell));
    }
    if (check.passed()) {
      row.emplace_back("ok");
    } else if (!check.measured.gradients_bitwise_equal.value_or(true)) {
      row.emplace_back("gradients differ");
    } else if (!check.within_tolerance) {
      row.push_back("outside " + Percent(run.tolerance.allocated));
    } else if (!check.host_within_tolerance) {
      row.push_back("host outside " + Percent(run.tolerance.allocated));
    } else if (!check.smaller_inputs_within_peak) {
      row.emplace_back("smaller inputs past the peak or gradients differ");
    } else {
      row.push_back("reserved outside " + Percent(run.tolerance.reserved));
    }
    table.rows.push_back(std::move(row));
  }
  return table;
}

std::string Summary(const ValidationRun& run) {
  size_t within = 0, with_reserved = 0, reserved_within = 0;
  for (const FixtureCheck& check : run.checks) {
    within += check.within_tolerance ? 1 : 0;
    if (check.reserved_error) {
      ++with_reserved;
      reserved_within += check.reserved_within_tolerance ? 1 : 0;
    }
  }
  const size_t n = run.checks.size();
  if (n == 0) return absl::StrFormat("no fixture could be checked (%d errors)", run.errors.size());
  std::string line = absl::StrFormat("%d fixture%s: %d within %s of the measured peak, %d outside", n,
                                     n == 1 ? "" : "s", within, Percent(run.tolerance.allocated), n - within);
  if (const FixtureCheck* worst = run.worst()) {
    absl::StrAppendFormat(&line, "; worst %s (%s)", worst->name, SignedPercent(worst->error));
  }
  if (with_reserved > 0) {
    absl::StrAppendFormat(&line, "; reserved measured on %d: %d within %s", with_reserved, reserved_within,
                          Percent(run.tolerance.reserved));
  }
  if (!run.errors.empty()) {
    absl::StrAppendFormat(&line, "; %d could not be checked", run.errors.size());
  }
  return line;
}

// A Markdown table cell: pipes would end it, newlines the row.
std::string MarkdownCell(const std::string& text) {
  return absl::StrReplaceAll(text, {{"|", "\\|"}, {"\n", " "}});
}

}  // namespace

EstimatedStep EstimatedFigures(const MemoryEstimate& e, bool on_cuda) {
  // Note [Estimated allocated bytes].
  EstimatedStep out{.peak_op = e.peak_op, .peak_phase = e.peak_phase};
  out.allocated_bytes = on_cuda ? e.allocated_bytes() : e.requested_bytes() - e.overheads.cublas_workspace;
  // Note [Estimated reserved bytes].
  out.reserved_bytes = e.reserved_bytes();
  return out;
}

double RelativeError(uint64_t estimated, uint64_t measured) {
  return (static_cast<double>(estimated) - static_cast<double>(measured)) / static_cast<double>(measured);
}

namespace {

// Fills check's measured side, errors and peers from `measured` (the
// fixture's step, or one of its ranks).
void Compare(const ValidationFixture& fixture, const MeasuredStep& measured, const ValidationTolerance& tolerance,
             FixtureCheck& check) {
  check.measured = measured;
  check.error = RelativeError(check.estimated.allocated_bytes, measured.peak_allocated_bytes);
  check.within_tolerance = std::abs(check.error) <= tolerance.allocated;
  check.reserved_error.reset();
  check.reserved_within_tolerance = true;
  check.peers.clear();
  if (fixture.on_cuda() && measured.peak_reserved_bytes && *measured.peak_reserved_bytes > 0) {
    check.reserved_error = RelativeError(check.estimated.reserved_bytes, *measured.peak_reserved_bytes);
    check.reserved_within_tolerance = std::abs(*check.reserved_error) <= tolerance.reserved;
  }
  for (const PeerFigure& peer : fixture.peers) {
    check.peers.push_back(
        {.tool = peer.tool, .bytes = peer.bytes, .error = RelativeError(peer.bytes, measured.peak_allocated_bytes)});
  }
}

}  // namespace

absl::StatusOr<FixtureCheck> CheckFixture(const ValidationFixture& fixture, const JobSpec& job,
                                          const ValidationTolerance& tolerance) {
  Machine machine{.budget = kValidationCapacity};
  if (fixture.on_cuda()) {  // Note [The fixture's GPU]
    absl::StatusOr<const GpuSpec*> gpu = GpuCatalog::Builtin().Find(fixture.device);
    if (!gpu.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("device: ", gpu.status().message()));
    }
    machine.gpu = *gpu;
  }
  HEADROOM_ASSIGN_OR_RETURN(MemoryEstimate estimate, EstimateMemory(fixture.model, job, machine));
  FixtureCheck check{.path = fixture.path,
                     .name = fixture.name,
                     .description = fixture.description,
                     .device = fixture.device,
                     .estimated = EstimatedFigures(estimate, fixture.on_cuda())};
  Compare(fixture, fixture.measured, tolerance, check);
  return check;
}

absl::StatusOr<std::vector<FixtureCheck>> CheckFixtureRanks(const ValidationFixture& fixture, const JobSpec& job,
                                                            const ValidationTolerance& tolerance) {
  if (fixture.ranks.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(FixtureCheck one, CheckFixture(fixture, job, tolerance));
    return std::vector<FixtureCheck>{std::move(one)};
  }
  // Note [Distributed fixtures checked]: one estimate, or under --pp one per stage.
  const int stages = job.layout.pipeline_parallel;
  std::vector<FixtureCheck> estimates;
  if (stages > 1 && job.layout.pipeline_stage < 0) {
    for (int stage = 0; stage < stages; ++stage) {
      JobSpec stage_job = job;
      stage_job.layout.pipeline_stage = stage;
      HEADROOM_ASSIGN_OR_RETURN(FixtureCheck check, CheckFixture(fixture, stage_job, tolerance));
      estimates.push_back(std::move(check));
    }
  } else {
    HEADROOM_ASSIGN_OR_RETURN(FixtureCheck check, CheckFixture(fixture, job, tolerance));
    estimates.push_back(std::move(check));
  }
  const size_t ranks_per_stage = static_cast<size_t>(std::max(1, job.layout.gpus / stages));
  std::vector<FixtureCheck> checks;
  for (size_t rank = 0; rank < fixture.ranks.size(); ++rank) {
    FixtureCheck check = estimates[std::min(rank / ranks_per_stage, estimates.size() - 1)];
    check.name = absl::StrFormat("%s rank %d", fixture.name, rank);
    Compare(fixture, fixture.ranks[rank], tolerance, check);
    checks.push_back(std::move(check));
  }
  return checks;
}

absl::StatusOr<std::vector<FixtureCheck>> CheckAppliedPlans(const AppliedPlansFixture& fixture, const JobSpec& job,
                                                            const ValidationTolerance& tolerance) {
  HEADROOM_ASSIGN_OR_RETURN(const PlanInput in, BuildPlanInput(fixture.model, job, Machine{}));
  const PlanProblem problem = in.Problem(std::numeric_limits<uint64_t>::max());
  auto check_of = [&](std::string name, std::string description, const MeasuredStep& measured,
                      const PlanEvaluation& e, const Graph& scheduled) {
    FixtureCheck check{.path = fixture.path,
                       .name = std::move(name),
                       .description = std::move(description),
                       .device = fixture.device,
                       .measured = measured,
                       .estimated = {.allocated_bytes = e.peak_bytes}};
    if (e.peak_entry != kNone) {
      const Op& op = scheduled.op(e.peak_entry);
      check.estimated.peak_op = op.name;
      check.estimated.peak_phase = std::string(PhaseName(op.phase));
    }
    check.error = RelativeError(e.peak_bytes, measured.peak_allocated_bytes);
    check.within_tolerance = std::abs(check.error) <= tolerance.allocated;
    if (e.host_peak_bytes > 0 || measured.host_peak_bytes.value_or(0) > 0) {
      // A plan that offloads is checked on host memory too; a harness that did not count it fails the check.
      check.estimated_host_bytes = e.host_peak_bytes;
      const uint64_t host = measured.host_peak_bytes.value_or(0);
      check.host_error = host > 0 ? RelativeError(e.host_peak_bytes, host) : 1.0;
      check.host_within_tolerance = std::abs(*check.host_error) <= tolerance.allocated;
    }
    for (const MeasuredStep::SmallerInputs& smaller : measured.smaller_inputs) {
      check.smaller_inputs_within_peak &=
          smaller.peak_allocated_bytes <= e.peak_bytes && smaller.gradients_bitwise_equal;
    }
    return check;
  };
  std::vector<FixtureCheck> checks;
  const Schedule store_all = StoreAllSchedule(in.step);
  HEADROOM_ASSIGN_OR_RETURN(const PlanEvaluation none, EvaluateSchedule(problem, store_all));
  HEADROOM_ASSIGN_OR_RETURN(const Graph step_as_is, MaterializeSchedule(in.step, store_all));
  checks.push_back(check_of(fixture.name + " no plan", fixture.description, fixture.store_all, none, step_as_is));
  for (size_t i = 0; i < fixture.runs.size(); ++i) {
    const AppliedPlanRun& run = fixture.runs[i];
    if (!run.error.empty()) continue;  // no plan was made: nothing ran
    const std::string where = absl::StrFormat("plans[%d].plan", i);
    absl::Status matches = CheckPlanMatchesStep(run.plan, in.step, where);
    if (!matches.ok()) return matches;
    HEADROOM_ASSIGN_OR_RETURN(const PlanEvaluation e, EvaluateSchedule(problem, run.plan.schedule));
    HEADROOM_ASSIGN_OR_RETURN(const Graph scheduled, MaterializeSchedule(in.step, run.plan.schedule));
    const size_t replays = run.plan.schedule.CountOf(ScheduleAction::kRecompute);
    checks.push_back(check_of(absl::StrFormat("%s %s %s", fixture.name, run.budget, run.strategy),
                              absl::StrFormat("%s plan, %d ops replayed", run.chosen_strategy, replays),
                              run.measured, e, scheduled));
  }
  return checks;
}

bool ValidationRun::all_within_tolerance() const {
  for (const FixtureCheck& check : checks) {
    if (!check.passed()) return false;
  }
  return true;
}

const FixtureCheck* ValidationRun::worst() const {
  const FixtureCheck* worst = nullptr;
  for (const FixtureCheck& check : checks) {
    if (worst == nullptr || std::abs(check.error) > std::abs(worst->error)) worst = &check;
  }
  return worst;
}

std::string ValidationText(const ValidationRun& run) {
  std::string out;
  if (!run.checks.empty()) {
    Table table = BuildTable(run);
    TextTable text(std::move(table.header), std::move(table.align));
    for (std::vector<std::string>& row : table.rows) text.AddRow(std::move(row));
    out = text.Render();
  }
  return out + Summary(run) + "\n";
}

std::string ValidationMarkdown(const ValidationRun& run) {
  std::string out;
  if (!run.checks.empty()) {
    const Table table = BuildTable(run);
    auto line = [&](const std::vector<std::string>& cells) {
      out += "|";
      for (const std::string& cell : cells) out += " " + MarkdownCell(cell) + " |";
      out += "\n";
    };
    line(table.header);
    out += "|";
    for (Align align : table.align) out += align == Align::kRight ? " ---: |" : " --- |";
    out += "\n";
    for (const std::vector<std::string>& row : table.rows) line(row);
    out += "\n";
  }
  return out + Summary(run) + ".\n";
}

nlohmann::json ValidationJson(const ValidationRun& run) {
  nlohmann::json fixtures = nlohmann::json::array();
  for (const FixtureCheck& check : run.checks) {
    const MeasuredStep& m = check.measured;
    nlohmann::json measured = {{"peak_allocated_bytes", m.peak_allocated_bytes},
                               {"baseline_bytes", m.baseline_bytes},
                               {"peak_op", m.peak_op},
                               {"peak_phase", m.peak_phase}};
    nlohmann::json estimated = {{"allocated_bytes", check.estimated.allocated_bytes},
                                {"peak_op", check.estimated.peak_op},
                                {"peak_phase", check.estimated.peak_phase}};
    nlohmann::json entry = {{"path", check.path},
                            {"name", check.name},
                            {"description", check.description},
                            {"device", check.device},
                            {"measured", std::move(measured)},
                            {"estimated", std::move(estimated)},
                            {"error", check.error},
                            {"within_tolerance", check.within_tolerance},
                            {"passed", check.passed()}};
    if (m.gradients_bitwise_equal) entry["measured"]["gradients_bitwise_equal"] = *m.gradients_bitwise_equal;
    if (check.reserved_error) {
      entry["measured"]["peak_reserved_bytes"] = *m.peak_reserved_bytes;
      entry["estimated"]["reserved_bytes"] = check.estimated.reserved_bytes;
      entry["reserved_error"] = *check.reserved_error;
      entry["reserved_within_tolerance"] = check.reserved_within_tolerance;
    }
    if (check.host_error) {
      entry["measured"]["host_peak_bytes"] = m.host_peak_bytes.value_or(0);
      entry["estimated"]["host_bytes"] = check.estimated_host_bytes;
      entry["host_error"] = *check.host_error;
      entry["host_within_tolerance"] = check.host_within_tolerance;
    }
    nlohmann::json peers = nlohmann::json::object();
    for (const PeerCheck& peer : check.peers) peers[peer.tool] = {{"bytes", peer.bytes}, {"error", peer.error}};
    entry["peers"] = std::move(peers);
    fixtures.push_back(std::move(entry));
  }
  nlohmann::json errors = nlohmann::json::array();
  for (const FixtureError& error : run.errors) errors.push_back({{"path", error.path}, {"message", error.message}});
  size_t within = 0;
  for (const FixtureCheck& check : run.checks) within += check.within_tolerance ? 1 : 0;
  nlohmann::json summary = {{"fixtures", run.checks.size()},
                            {"within_tolerance", within},
                            {"passed", run.all_within_tolerance() && run.errors.empty()}};
  if (const FixtureCheck* worst = run.worst()) {
    summary["worst_fixture"] = worst->name;
    summary["worst_error"] = worst->error;
  }
  return {{"schema_version", 1},
          {"tolerance", run.tolerance.allocated},
          {"reserved_tolerance", run.tolerance.reserved},
          {"fixtures", std::move(fixtures)},
          {"errors", std::move(errors)},
          {"summary", std::move(summary)}};
}

}  // namespace headroom
