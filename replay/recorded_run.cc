#include "replay/recorded_run.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

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

absl::StatusOr<std::vector<uint64_t>> ParseStepEnds(std::string_view text, std::string_view source) {
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
  std::vector<uint64_t> ends;
  ends.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    HEADROOM_ASSIGN_OR_RETURN(const uint64_t end, AsUint(array[i], at / i));
    if (!ends.empty() && end < ends.back()) {
      return (at / i).Error(absl::StrFormat("%d is before the step end before it (%d)", end, ends.back()));
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
  HEADROOM_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(trace_path));
  RecordedRun run;
  HEADROOM_ASSIGN_OR_RETURN(run.trace, ParseAllocationTrace(text, trace_path));
  const std::string steps_path = trace_path.substr(0, trace_path.size() - suffix.size()) + ".steps.json";
  HEADROOM_ASSIGN_OR_RETURN(const std::string steps, ReadTextFile(steps_path));
  HEADROOM_ASSIGN_OR_RETURN(run.step_end_times, ParseStepEnds(steps, steps_path));
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

}  // namespace headroom
