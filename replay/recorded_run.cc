#include "replay/recorded_run.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <optional>
#include <system_error>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "common/json_fields.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

// The suffix of a recorded run's trace that `path` ends with, or an empty view.
std::string_view TraceSuffix(std::string_view path) {
  for (std::string_view suffix : {".rmm.csv", ".snapshot.json"}) {
    if (path.ends_with(suffix)) return suffix;
  }
  return {};
}

}  // namespace

absl::StatusOr<std::vector<uint64_t>> ParseStepEnds(std::string_view text, std::string_view source,
                                                    const AllocationTrace* trace) {
  HEADROOM_ASSIGN_OR_RETURN(const nlohmann::json doc, ParseJsonDocument(text, source));
  const JsonPath root(source);
  if (!doc.is_object()) return root.Error(absl::StrFormat("expected an object, got %s", JsonTypeName(doc)));
  // Note [Step ends]: one of the two, in the trace's own time.
  const bool events = doc.contains("step_end_events");
  const bool times = doc.contains("step_end_time_ns");
  if (events == times) return root.Error("expected exactly one of \"step_end_events\" and \"step_end_time_ns\"");
  const std::string key = events ? "step_end_events" : "step_end_time_ns";
  const nlohmann::json& array = doc.at(key);
  const JsonPath at = root / key;
  if (!array.is_array()) return at.Error(absl::StrFormat("expected an array, got %s", JsonTypeName(array)));
  std::optional<uint64_t> last_event;
  if (trace != nullptr) {
    for (const TraceEvent& e : trace->events) last_event = std::max(last_event.value_or(0), e.time_ns);
  }
  std::vector<uint64_t> ends;
  ends.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    HEADROOM_ASSIGN_OR_RETURN(const uint64_t end, AsUint(array[i], at / i));
    if (!ends.empty() && end < ends.back()) {
      return (at / i).Error(absl::StrFormat("%d is before the step end before it (%d)", end, ends.back()));
    }
    if (!ends.empty() && end == ends.back()) {
      return (at / i).Error(absl::StrFormat("%d repeats the step end before it; a step ends after the one before",
                                            end));
    }
    if (trace != nullptr && end > last_event.value_or(0)) {
      return (at / i).Error(
          last_event ? absl::StrFormat("%d is past the last event of %s (at %d)", end, trace->source, *last_event)
                     : absl::StrFormat("%d: %s has no events", end, trace->source));
    }
    ends.push_back(end);
  }
  return ends;
}

absl::StatusOr<RecordedRun> LoadRecordedRun(const std::string& trace_path) {
  const std::string_view suffix = TraceSuffix(trace_path);
  if (suffix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: a recorded run's trace is named NAME.rmm.csv or NAME.snapshot.json", trace_path));
  }
  HEADROOM_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(trace_path, kTraceFile));
  RecordedRun run;
  HEADROOM_ASSIGN_OR_RETURN(run.trace, ParseAllocationTrace(text, trace_path));
  const std::string steps_path = trace_path.substr(0, trace_path.size() - suffix.size()) + ".steps.json";
  HEADROOM_ASSIGN_OR_RETURN(const std::string steps, ReadTextFile(steps_path, kStepsFile));
  HEADROOM_ASSIGN_OR_RETURN(run.step_end_times, ParseStepEnds(steps, steps_path, &run.trace));
  return run;
}

absl::StatusOr<std::vector<std::string>> RecordedRunTraces(const std::string& directory) {
  std::error_code error;
  std::vector<std::string> traces;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string path = entry.path().string();
    if (!TraceSuffix(path).empty()) traces.push_back(path);
  }
  if (error) return absl::NotFoundError(absl::StrFormat("%s: %s", directory, error.message()));
  std::sort(traces.begin(), traces.end());
  return traces;
}

absl::StatusOr<RecordedRun> RepeatSteps(const RecordedRun& run, size_t first_step, int times) {
  const std::vector<uint64_t>& ends = run.step_end_times;
  if (first_step == 0 || first_step >= ends.size() || times < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: cannot repeat steps %d to %d of %d steps %d times", run.trace.source, first_step + 1, ends.size(),
        ends.size(), times));
  }
  const uint64_t from = ends[first_step - 1];  // the repeated steps' events come after this time
  const uint64_t period = ends.back() - from;
  uint64_t last = ends.back();
  for (const TraceEvent& e : run.trace.events) last = std::max(last, e.time_ns);
  if (period != 0 && static_cast<uint64_t>(times - 1) > (std::numeric_limits<uint64_t>::max() - last) / period) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: repeating steps %d to %d %d times takes the times past 2^64 ns", run.trace.source, first_step + 1,
        ends.size(), times));
  }
  RecordedRun out;
  out.trace.source = run.trace.source;
  out.trace.format = run.trace.format;
  out.step_end_times.assign(ends.begin(), ends.begin() + static_cast<std::ptrdiff_t>(first_step));
  for (int r = 0; r < times; ++r) {
    for (size_t k = first_step; k < ends.size(); ++k) out.step_end_times.push_back(ends[k] + r * period);
  }
  // Every allocation gets a name of its own, so that a repeat's blocks are new ones. A free refers to the
  // pointer's latest allocation; in a repeat, one whose block was allocated before the repeated steps (and freed
  // in the first pass) is dropped.
  absl::flat_hash_map<uint64_t, uint64_t> live_name;
  uint64_t next_name = uint64_t{1} << 63;
  auto emit = [&](TraceEvent event, uint64_t shift, bool repeat) {
    event.time_ns += shift;
    if (event.pointer != 0) {  // null stays null (Note [Zero-byte allocations])
      if (event.op == TraceOp::kAllocate) {
        live_name[event.pointer] = next_name;
        event.pointer = next_name++;
      } else if (event.op == TraceOp::kFree) {
        auto it = live_name.find(event.pointer);
        if (it != live_name.end()) {
          event.pointer = it->second;
          live_name.erase(it);
        } else if (repeat) {
          return;
        }
      }
    }
    out.trace.events.push_back(event);
  };
  auto in_steps = [&](const TraceEvent& e) { return e.time_ns > from && e.time_ns <= ends.back(); };
  for (const TraceEvent& e : run.trace.events) {
    if (e.time_ns <= from) emit(e, 0, false);
  }
  for (int r = 0; r < times; ++r) {
    for (const TraceEvent& e : run.trace.events) {
      if (in_steps(e)) emit(e, r * period, r > 0);
    }
  }
  for (const TraceEvent& e : run.trace.events) {
    if (e.time_ns > ends.back()) emit(e, (times - 1) * period, false);
  }
  return out;
}

}  // namespace headroom
