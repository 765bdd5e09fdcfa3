#include "report/validation_fixture.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/json_fields.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "graph/graph.h"

namespace headroom {
namespace {

using nlohmann::json;

bool Present(const json& object, std::string_view key) {
  auto it = object.find(std::string(key));
  return it != object.end() && !it->is_null();
}

absl::StatusOr<std::string> RequireNonEmptyString(const json& object, std::string_view key, const JsonPath& path) {
  HEADROOM_ASSIGN_OR_RETURN(std::string value, RequireString(object, key, path));
  if (value.empty()) return (path / key).Error("must not be empty");
  return value;
}

// The harness writes a figure it could not take as null or leaves it out.
absl::StatusOr<std::optional<uint64_t>> OptionalUint(const json& object, std::string_view key,
                                                     const JsonPath& path) {
  if (!Present(object, key)) return std::nullopt;
  return RequireUint(object, key, path);
}

absl::StatusOr<std::string> OptionalString(const json& object, std::string_view key, const JsonPath& path) {
  if (!Present(object, key)) return std::string();
  return RequireString(object, key, path);
}

absl::StatusOr<uint64_t> RequirePositive(const json& object, std::string_view key, const JsonPath& path) {
  HEADROOM_ASSIGN_OR_RETURN(uint64_t value, RequireUint(object, key, path));
  if (value == 0) return (path / key).Error("must be positive (errors are relative to it)");
  return value;
}

// An optional "peak_phase": empty, or a phase name (graph/graph.h PhaseName).
absl::StatusOr<std::string> OptionalPhase(const json& object, const JsonPath& path) {
  HEADROOM_ASSIGN_OR_RETURN(std::string phase, OptionalString(object, "peak_phase", path));
  if (!phase.empty()) {
    absl::StatusOr<Phase> parsed = ParsePhase(phase);
    if (!parsed.ok()) return (path / "peak_phase").Error(std::string(parsed.status().message()));
  }
  return phase;
}

absl::StatusOr<MeasuredStep> ParseMeasured(const json& measured, const JsonPath& path) {
  MeasuredStep m;
  HEADROOM_ASSIGN_OR_RETURN(m.baseline_bytes, RequireUint(measured, "baseline_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.peak_allocated_bytes, RequirePositive(measured, "peak_allocated_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.saved_for_backward_bytes, RequireUint(measured, "saved_for_backward_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.repeat_peak_allocated_bytes,
                            RequireUint(measured, "repeat_peak_allocated_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.end_of_forward_bytes, OptionalUint(measured, "end_of_forward_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.ops, OptionalUint(measured, "ops", path));
  HEADROOM_ASSIGN_OR_RETURN(m.peak_op, OptionalString(measured, "peak_op", path));
  HEADROOM_ASSIGN_OR_RETURN(m.peak_phase, OptionalPhase(measured, path));
  HEADROOM_ASSIGN_OR_RETURN(m.peak_reserved_bytes, OptionalUint(measured, "peak_reserved_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.driver_used_bytes, OptionalUint(measured, "driver_used_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.driver_used_before_bytes, OptionalUint(measured, "driver_used_before_bytes", path));
  return m;
}

// One rank of a distributed step: the figures every rank has.
absl::StatusOr<MeasuredStep> ParseRank(const json& rank, const JsonPath& path) {
  if (!rank.is_object()) return path.Error(absl::StrFormat("expected an object, got %s", JsonTypeName(rank)));
  MeasuredStep m;
  HEADROOM_ASSIGN_OR_RETURN(m.baseline_bytes, RequireUint(rank, "baseline_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.peak_allocated_bytes, RequirePositive(rank, "peak_allocated_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(std::optional<uint64_t> saved, OptionalUint(rank, "saved_for_backward_bytes", path));
  m.saved_for_backward_bytes = saved.value_or(0);
  HEADROOM_ASSIGN_OR_RETURN(m.peak_op, OptionalString(rank, "peak_op", path));
  HEADROOM_ASSIGN_OR_RETURN(m.peak_phase, OptionalPhase(rank, path));
  return m;
}

absl::StatusOr<std::vector<MeasuredStep>> ParseRanks(const json& ranks, const JsonPath& path) {
  if (!ranks.is_array()) return path.Error(absl::StrFormat("expected an array, got %s", JsonTypeName(ranks)));
  if (ranks.size() < 2) return path.Error(absl::StrFormat("%d rank(s): a distributed step has two or more",
                                                           ranks.size()));
  std::vector<MeasuredStep> out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    HEADROOM_ASSIGN_OR_RETURN(MeasuredStep rank, ParseRank(ranks[i], path / i));
    out.push_back(std::move(rank));
  }
  return out;
}

absl::StatusOr<std::vector<PeerFigure>> ParsePeers(const json& peers, const JsonPath& path) {
  if (!peers.is_object()) {
    return path.Error(absl::StrFormat("expected an object of {\"bytes\", \"what\"} by tool name, got %s",
                                      JsonTypeName(peers)));
  }
  std::vector<PeerFigure> figures;
  for (const auto& [tool, figure] : peers.items()) {
    const JsonPath at = path / tool;
    if (tool.empty()) return path.Error("a tool name must not be empty");
    if (!figure.is_object()) return at.Error(absl::StrFormat("expected an object, got %s", JsonTypeName(figure)));
    PeerFigure peer{.tool = tool};
    HEADROOM_ASSIGN_OR_RETURN(peer.bytes, RequireUint(figure, "bytes", at));
    HEADROOM_ASSIGN_OR_RETURN(peer.what, OptionalString(figure, "what", at));
    figures.push_back(std::move(peer));
  }
  std::sort(figures.begin(), figures.end(),
            [](const PeerFigure& a, const PeerFigure& b) { return a.tool < b.tool; });
  return figures;
}

// An array of `command` flags.
absl::StatusOr<std::vector<std::string>> StringArray(const json& doc, std::string_view key, std::string_view command,
                                                     const JsonPath& root) {
  HEADROOM_ASSIGN_OR_RETURN(const json* array, RequireField(doc, key, root));
  if (!array->is_array()) {
    return (root / key).Error(absl::StrFormat("expected an array of %s flags, got %s", command, JsonTypeName(*array)));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < array->size(); ++i) {
    HEADROOM_ASSIGN_OR_RETURN(std::string arg, AsString((*array)[i], root / key / i));
    out.push_back(std::move(arg));
  }
  return out;
}

absl::StatusOr<const json*> RequireObject(const json& doc, std::string_view key, const JsonPath& root) {
  HEADROOM_ASSIGN_OR_RETURN(const json* object, RequireField(doc, key, root));
  if (!object->is_object()) {
    return (root / key).Error(absl::StrFormat("expected an object, got %s", JsonTypeName(*object)));
  }
  return object;
}


// The steps an applied plan ran on smaller inputs within its envelope.
absl::StatusOr<std::vector<MeasuredStep::SmallerInputs>> ParseSmallerInputs(const json& array, const JsonPath& path) {
  if (!array.is_array()) return path.Error(absl::StrFormat("expected an array, got %s", JsonTypeName(array)));
  std::vector<MeasuredStep::SmallerInputs> out;
  for (size_t i = 0; i < array.size(); ++i) {
    const json& entry = array[i];
    if (!entry.is_object()) return (path / i).Error(absl::StrFormat("expected an object, got %s", JsonTypeName(entry)));
    MeasuredStep::SmallerInputs step;
    HEADROOM_ASSIGN_OR_RETURN(step.inputs, RequireNonEmptyString(entry, "inputs", path / i));
    HEADROOM_ASSIGN_OR_RETURN(step.peak_allocated_bytes, RequirePositive(entry, "peak_allocated_bytes", path / i));
    HEADROOM_ASSIGN_OR_RETURN(const json* equal, RequireField(entry, "gradients_bitwise_equal", path / i));
    if (!equal->is_boolean()) {
      return (path / i / "gradients_bitwise_equal")
          .Error(absl::StrFormat("expected true or false, got %s", JsonTypeName(*equal)));
    }
    step.gradients_bitwise_equal = equal->get<bool>();
    out.push_back(std::move(step));
  }
  return out;
}

absl::StatusOr<AppliedPlanRun> ParseRun(const json& run, const JsonPath& path) {
  if (!run.is_object()) return path.Error(absl::StrFormat("expected an object, got %s", JsonTypeName(run)));
  AppliedPlanRun out;
  HEADROOM_ASSIGN_OR_RETURN(out.budget, RequireNonEmptyString(run, "budget", path));
  HEADROOM_ASSIGN_OR_RETURN(out.strategy, RequireNonEmptyString(run, "strategy", path));
  if (Present(run, "error")) {
    HEADROOM_ASSIGN_OR_RETURN(out.error, RequireNonEmptyString(run, "error", path));
    return out;
  }
  HEADROOM_ASSIGN_OR_RETURN(out.chosen_strategy, RequireNonEmptyString(run, "chosen_strategy", path));
  HEADROOM_ASSIGN_OR_RETURN(const json* plan, RequireObject(run, "plan", path));
  HEADROOM_ASSIGN_OR_RETURN(out.plan, ParsePlanDocument(*plan, (path / "plan").ToString()));
  HEADROOM_ASSIGN_OR_RETURN(const json* measured, RequireObject(run, "measured", path));
  HEADROOM_ASSIGN_OR_RETURN(out.measured.peak_allocated_bytes,
                            RequirePositive(*measured, "peak_allocated_bytes", path / "measured"));
  HEADROOM_ASSIGN_OR_RETURN(const json* equal, RequireField(*measured, "gradients_bitwise_equal", path / "measured"));
  if (!equal->is_boolean()) {
    return (path / "measured" / "gradients_bitwise_equal")
        .Error(absl::StrFormat("expected true or false, got %s", JsonTypeName(*equal)));
  }
  out.measured.gradients_bitwise_equal = equal->get<bool>();
  HEADROOM_ASSIGN_OR_RETURN(out.measured.host_peak_bytes,
                            OptionalUint(*measured, "host_peak_bytes", path / "measured"));
  if (Present(*measured, "smaller_inputs")) {
    HEADROOM_ASSIGN_OR_RETURN(out.measured.smaller_inputs,
                              ParseSmallerInputs((*measured)["smaller_inputs"], path / "measured" / "smaller_inputs"));
  }
  return out;
}

// The fields every fixture has, and its version.
absl::Status ParseCommon(const json& doc, const JsonPath& root, std::string& name, std::string& description,
                         std::string& device) {
  HEADROOM_ASSIGN_OR_RETURN(int64_t version, RequireInt(doc, "headroom_fixture_version", root));
  if (version != kValidationFixtureVersion) {
    return (root / "headroom_fixture_version")
        .Error(absl::StrFormat("version %d is not supported (this headroom reads version %d)", version,
                               kValidationFixtureVersion));
  }
  HEADROOM_ASSIGN_OR_RETURN(name, RequireNonEmptyString(doc, "name", root));
  HEADROOM_ASSIGN_OR_RETURN(description, RequireNonEmptyString(doc, "description", root));
  HEADROOM_ASSIGN_OR_RETURN(device, RequireNonEmptyString(doc, "device", root));
  return absl::OkStatus();
}

// The fields of a measured step's fixture, from its JSON object.
absl::StatusOr<ValidationFixture> ParseStepDocument(const json& doc, std::string_view path) {
  const JsonPath root(path);
  ValidationFixture fixture{.path = std::string(path)};
  HEADROOM_RETURN_IF_ERROR(ParseCommon(doc, root, fixture.name, fixture.description, fixture.device));

  HEADROOM_ASSIGN_OR_RETURN(fixture.estimate_args, StringArray(doc, "estimate_args", "`headroom estimate`", root));
  HEADROOM_ASSIGN_OR_RETURN(const json* measured, RequireObject(doc, "measured", root));
  HEADROOM_ASSIGN_OR_RETURN(fixture.measured, ParseMeasured(*measured, root / "measured"));
  if (Present(doc, "peers")) {
    HEADROOM_ASSIGN_OR_RETURN(fixture.peers, ParsePeers(doc["peers"], root / "peers"));
  }
  if (Present(doc, "ranks")) {
    HEADROOM_ASSIGN_OR_RETURN(fixture.ranks, ParseRanks(doc["ranks"], root / "ranks"));
  }

  // The model last: its errors come from the model parsers, the fixture's
  // own fields are checked first.
  HEADROOM_ASSIGN_OR_RETURN(const json* model, RequireField(doc, "model", root));
  HEADROOM_ASSIGN_OR_RETURN(fixture.model, LoadModelDocument(*model, (root / "model").ToString()));
  return fixture;
}

// The fields of an applied-plans fixture, from its JSON object.
absl::StatusOr<AppliedPlansFixture> ParseAppliedPlansDocument(const json& doc, std::string_view path) {
  const JsonPath root(path);
  AppliedPlansFixture fixture{.path = std::string(path)};
  HEADROOM_RETURN_IF_ERROR(ParseCommon(doc, root, fixture.name, fixture.description, fixture.device));
  HEADROOM_ASSIGN_OR_RETURN(fixture.job_args, StringArray(doc, "job_args", "`headroom plan`", root));
  HEADROOM_ASSIGN_OR_RETURN(const json* measured, RequireObject(doc, "measured", root));
  HEADROOM_ASSIGN_OR_RETURN(fixture.store_all.baseline_bytes,
                            RequireUint(*measured, "baseline_bytes", root / "measured"));
  HEADROOM_ASSIGN_OR_RETURN(fixture.store_all.peak_allocated_bytes,
                            RequirePositive(*measured, "store_all_peak_allocated_bytes", root / "measured"));
  HEADROOM_ASSIGN_OR_RETURN(const json* plans, RequireField(doc, "plans", root));
  if (!plans->is_array()) {
    return (root / "plans").Error(absl::StrFormat("expected an array of runs, got %s", JsonTypeName(*plans)));
  }
  for (size_t i = 0; i < plans->size(); ++i) {
    HEADROOM_ASSIGN_OR_RETURN(AppliedPlanRun run, ParseRun((*plans)[i], root / "plans" / i));
    fixture.runs.push_back(std::move(run));
  }
  HEADROOM_ASSIGN_OR_RETURN(const json* model, RequireField(doc, "model", root));
  HEADROOM_ASSIGN_OR_RETURN(fixture.model, LoadModelDocument(*model, (root / "model").ToString()));
  return fixture;
}

// A fixture's text as its JSON object.
absl::StatusOr<json> ParseObject(std::string_view text, std::string_view path) {
  HEADROOM_ASSIGN_OR_RETURN(json doc, ParseJsonDocument(text, path));
  if (!doc.is_object()) {
    return JsonPath(path).Error(absl::StrFormat("expected a JSON object, got %s", JsonTypeName(doc)));
  }
  return doc;
}

// The fixture's JSON object, and its "kind": kAppliedPlansKind, or empty for
// a measured step (the kind that has none).
absl::StatusOr<std::pair<json, std::string>> ParseKindAndDocument(std::string_view text, std::string_view path) {
  HEADROOM_ASSIGN_OR_RETURN(json doc, ParseObject(text, path));
  const JsonPath root(path);
  std::string kind;
  if (Present(doc, "kind")) {
    HEADROOM_ASSIGN_OR_RETURN(kind, RequireString(doc, "kind", root));
    if (kind != kAppliedPlansKind) {
      return (root / "kind").Error(absl::StrFormat("unknown fixture kind %s (%s, or none for a measured step)",
                                                   QuoteForError(kind), kAppliedPlansKind));
    }
  }
  return std::make_pair(std::move(doc), std::move(kind));
}

}  // namespace

absl::StatusOr<ValidationFixture> ParseValidationFixture(std::string_view text, std::string_view path) {
  HEADROOM_ASSIGN_OR_RETURN(const json doc, ParseObject(text, path));
  return ParseStepDocument(doc, path);
}

absl::StatusOr<AppliedPlansFixture> ParseAppliedPlansFixture(std::string_view text, std::string_view path) {
  HEADROOM_ASSIGN_OR_RETURN(const json doc, ParseObject(text, path));
  return ParseAppliedPlansDocument(doc, path);
}

absl::StatusOr<std::variant<ValidationFixture, AppliedPlansFixture>> ParseFixture(std::string_view text,
                                                                                  std::string_view path) {
  HEADROOM_ASSIGN_OR_RETURN(auto parsed, ParseKindAndDocument(text, path));
  const auto& [doc, kind] = parsed;
  if (kind == kAppliedPlansKind) {
    HEADROOM_ASSIGN_OR_RETURN(AppliedPlansFixture fixture, ParseAppliedPlansDocument(doc, path));
    return fixture;
  }
  HEADROOM_ASSIGN_OR_RETURN(ValidationFixture fixture, ParseStepDocument(doc, path));
  return fixture;
}

absl::StatusOr<ValidationFixture> LoadValidationFixture(const std::string& path) {
  // Note [Fixture file bound].
  HEADROOM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, kFixtureFile));
  return ParseValidationFixture(text, path);
}

absl::StatusOr<std::vector<std::string>> FixtureFiles(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& path : paths) {
    std::error_code error;
    const std::filesystem::file_status status = std::filesystem::status(path, error);
    if (!std::filesystem::exists(status)) {
      return absl::NotFoundError(absl::StrFormat("%s: no such fixture file or folder", path));
    }
    if (!std::filesystem::is_directory(status)) {
      files.push_back(path);
      continue;
    }
    std::vector<std::string> in_folder;
    for (std::filesystem::directory_iterator it(path, error), end; !error && it != end; it.increment(error)) {
      const std::filesystem::path& file = it->path();
      std::error_code type_error;
      if (file.extension() == ".json" && it->is_regular_file(type_error)) in_folder.push_back(file.string());
    }
    if (error) return absl::NotFoundError(absl::StrFormat("%s: cannot list the folder: %s", path, error.message()));
    if (in_folder.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: the folder holds no *.json fixtures", path));
    }
    std::sort(in_folder.begin(), in_folder.end());
    files.insert(files.end(), in_folder.begin(), in_folder.end());
  }
  return files;
}

}  // namespace headroom
