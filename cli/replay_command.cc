// `headroom replay TRACE --capacity 80GiB [--conf CONF] [--compare CONF]...
//  [--strict] [--json] [--summary] [--smallest] [--device N]
//  [--write-plan PLAN --steps STEPS]`: replays an RMM log or a PyTorch
// memory snapshot through the caching allocator on a simulated device and
// reports what each allocator configuration would reserve (and with
// --smallest, on how small a device it runs, beside a layout planned with
// every lifetime known: layout/trace_layout.h); with --write-plan, writes
// the layout plan of the trace's repeating steps for the allocator to
// follow (Note [Following a layout plan] in allocator/sources/planned_range.h).
// This file holds the flags, their checks and the dispatch; the report is
// report/replay_report.h.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/alloc_conf.h"
#include "allocator/layout_plan.h"
#include "allocator/simulated/simulated_backend.h"
#include "cli/command.h"
#include "cli/output_files.h"
#include "common/json_fields.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "layout/trace_layout.h"
#include "replay/allocation_trace.h"
#include "replay/recorded_run.h"
#include "replay/trace_replay.h"
#include "report/replay_report.h"

namespace headroom::cli {
namespace {

struct ReplayCommandOptions {
  std::string trace_path;
  std::string capacity = "80GiB";
  std::string conf;
  bool conf_given = false;
  std::vector<std::string> compare;
  bool strict = false;
  bool json = false;
  bool summary = false;
  bool smallest = false;
  std::optional<int> device;  // --device, for snapshots only
  std::string write_plan;     // --write-plan PLAN
  std::string steps;          // --steps STEPS.json, which --write-plan needs
};

std::string Label(const std::string& text) { return text.empty() ? "pytorch-default" : text; }

absl::Status RunReplay(const ReplayCommandOptions& options, std::ostream& out) {
  HEADROOM_ASSIGN_OR_RETURN(uint64_t capacity, ParseBytes(options.capacity));
  if (capacity == 0) return absl::InvalidArgumentError("--capacity must be more than 0 bytes");
  if (capacity > kMaxSimulatedCapacity) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--capacity %s is %d bytes, more than the simulated device's limit of %d bytes (64 PiB)",
                        options.capacity, capacity, kMaxSimulatedCapacity));
  }
  HEADROOM_RETURN_IF_ERROR(CheckOutputFiles({{"--write-plan", options.write_plan}},
                                            {{"TRACE", options.trace_path}, {"--steps", options.steps}}));
  if (options.device.has_value() && *options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--device %d: a device index is 0 or more", *options.device));
  }
  HEADROOM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(options.trace_path, kTraceFile));
  AllocationTrace trace;
  if (options.device.has_value()) {
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos || text[first] != '{') {
      return absl::InvalidArgumentError("--device applies to PyTorch snapshots only");
    }
    HEADROOM_ASSIGN_OR_RETURN(trace, ParsePyTorchSnapshot(text, options.trace_path, *options.device));
  } else {
    HEADROOM_ASSIGN_OR_RETURN(trace, ParseAllocationTrace(text, options.trace_path));
  }

  if (options.write_plan.empty() != options.steps.empty()) {
    return absl::InvalidArgumentError("--write-plan and --steps go together: a plan is made of the trace's steps");
  }
  ReplayReportOptions report{.summary = options.summary};
  if (!options.write_plan.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(std::string steps_text, ReadTextFile(options.steps, kStepsFile));
    HEADROOM_ASSIGN_OR_RETURN(std::vector<uint64_t> step_ends, ParseStepEnds(steps_text, options.steps, &trace));
    const absl::Status one_stream = CheckPlanFollowsOneStream(trace);
    if (!one_stream.ok()) return absl::InvalidArgumentError(absl::StrCat("--write-plan: ", one_stream.message()));
    HEADROOM_ASSIGN_OR_RETURN(RepeatingStepsLayout steps, LayoutRepeatingStepsEitherOrder(trace, step_ends));
    LayoutPlan plan = ToLayoutPlan(steps);
    HEADROOM_RETURN_IF_ERROR(WriteTextFile(options.write_plan, LayoutPlanJson(plan), "--write-plan"));
    report.written_plan = {options.write_plan, std::move(steps), std::move(plan)};
  }

  std::vector<std::string> labels;
  if (options.conf_given || options.compare.empty()) labels.push_back(options.conf);
  labels.insert(labels.end(), options.compare.begin(), options.compare.end());

  std::vector<ReplayRun> runs;
  for (const std::string& label : labels) {
    absl::StatusOr<AllocatorOptions> allocator = ResolveAllocConf(label);
    if (!allocator.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("configuration ", allocator.status().message()));
    }
    if (!allocator->layout_plan_file.empty()) {  // read once here, not by each replay's allocator
      absl::StatusOr<LayoutPlan> plan = ReadLayoutPlanFile(allocator->layout_plan_file);
      if (!plan.ok()) {
        return absl::Status(plan.status().code(), absl::StrFormat("configuration %s: layout_plan: %s",
                                                                  QuoteForError(label), plan.status().message()));
      }
      allocator->layout_plan = std::make_shared<const LayoutPlan>(*std::move(plan));
    }
    const ReplayOptions replay{.capacity_bytes = capacity, .allocator = *allocator, .strict = options.strict};
    const auto start = std::chrono::steady_clock::now();
    HEADROOM_ASSIGN_OR_RETURN(ReplayResult result, ReplayTrace(trace, replay));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    runs.push_back({Label(label), FormatAllocConf(*allocator), std::move(result), seconds});
    if (options.smallest) {
      absl::StatusOr<uint64_t> smallest = SmallestDevice(trace, replay);
      if (!smallest.ok() && !absl::IsNotFound(smallest.status())) return smallest.status();
      runs.back().smallest_device_bytes = smallest.value_or(0);
      if (smallest.ok() && *smallest > kSmallestDeviceStep) {
        ReplayOptions below = replay;
        below.capacity_bytes = *smallest - kSmallestDeviceStep;
        below.stop_at_first_oom = true;
        HEADROOM_ASSIGN_OR_RETURN(const ReplayResult failed, ReplayTrace(trace, below));
        runs.back().below_smallest = failed.first_oom;
      }
    }
  }

  if (options.smallest) {
    absl::StatusOr<TraceLayout> planned = LayoutTrace(trace, kSmallestDeviceStep);
    // A trace too long for a layout still gets its replays; any other error is the trace's.
    if (!planned.ok() && !absl::IsOutOfRange(planned.status())) return planned.status();
    report.planned = std::move(planned);
  }
  if (options.json) {
    out << ReplayReportToJson(trace, capacity, runs, report).dump(2) << "\n";
  } else {
    out << RenderReplayReport(trace, capacity, runs, report);
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand AddReplayCommand(CLI::App& root) {
  auto options = std::make_shared<ReplayCommandOptions>();
  CLI::App* app = root.add_subcommand(
      "replay", "Replay an allocation trace (RMM CSV log or PyTorch memory snapshot) through the caching allocator");
  app->add_option("trace", options->trace_path, "RMM logging_resource_adaptor CSV or PyTorch _snapshot() JSON")
      ->required();
  app->add_option("--capacity", options->capacity, "Simulated device memory, e.g. 80GiB (default 80GiB)");
  app->add_option("--conf", options->conf, "HEADROOM_ALLOC_CONF string or preset name for the first run")
      ->each([options](const std::string&) { options->conf_given = true; });
  app->add_option("--compare", options->compare,
                  "Another configuration to compare (repeatable): a conf string or a preset: pytorch-default, "
                  "expandable, max-split-512, power2-4, gc-0.8, headroom");
  app->add_flag("--strict", options->strict, "Fail on frees of unknown pointers and other trace anomalies");
  app->add_flag("--json", options->json, "Print exact figures as JSON");
  app->add_flag("--summary", options->summary, "Also print each run's memory_summary()-style statistics table");
  app->add_flag("--smallest", options->smallest,
                "Also find, for each configuration, the smallest device that runs the trace (replays it ~15 times), "
                "and the device a layout planned with every lifetime known needs");
  app->add_option("--device", options->device, "Which device's trace to take from a PyTorch snapshot");
  AddOutputOption(*app, "--write-plan", options->write_plan,
                  "Write the layout plan of the trace's steps, up to the first one every later step repeats, to this "
                  "file (follow it with --conf headroom,layout_plan:FILE)");
  app->add_option("--steps", options->steps,
                  "Where the trace's steps end, for --write-plan: a steps.json as validation/record-trace writes");
  return {app, [options](std::ostream& out) { return RunReplay(*options, out); }};
}

}  // namespace headroom::cli
