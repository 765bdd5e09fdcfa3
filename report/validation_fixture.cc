#include "report/validation_fixture.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/json_fields.h"
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

absl::StatusOr<MeasuredStep> ParseMeasured(const json& measured, const JsonPath& path) {
  MeasuredStep m;
  HEADROOM_ASSIGN_OR_RETURN(m.baseline_bytes, RequireUint(measured, "baseline_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.peak_allocated_bytes, RequireUint(measured, "peak_allocated_bytes", path));
  if (m.peak_allocated_bytes == 0) {
    return (path / "peak_allocated_bytes").Error("must be positive (errors are relative to it)");
  }
  HEADROOM_ASSIGN_OR_RETURN(m.saved_for_backward_bytes, RequireUint(measured, "saved_for_backward_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.repeat_peak_allocated_bytes,
                            RequireUint(measured, "repeat_peak_allocated_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.end_of_forward_bytes, OptionalUint(measured, "end_of_forward_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.ops, OptionalUint(measured, "ops", path));
  HEADROOM_ASSIGN_OR_RETURN(m.peak_op, OptionalString(measured, "peak_op", path));
  HEADROOM_ASSIGN_OR_RETURN(m.peak_phase, OptionalString(measured, "peak_phase", path));
  if (!m.peak_phase.empty()) {
    absl::StatusOr<Phase> phase = ParsePhase(m.peak_phase);
    if (!phase.ok()) return (path / "peak_phase").Error(std::string(phase.status().message()));
  }
  HEADROOM_ASSIGN_OR_RETURN(m.peak_reserved_bytes, OptionalUint(measured, "peak_reserved_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.driver_used_bytes, OptionalUint(measured, "driver_used_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(m.driver_used_before_bytes, OptionalUint(measured, "driver_used_before_bytes", path));
  return m;
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

}  // namespace

absl::StatusOr<ValidationFixture> ParseValidationFixture(std::string_view text, std::string_view path) {
  HEADROOM_ASSIGN_OR_RETURN(json doc, ParseJsonDocument(text, path));
  const JsonPath root(path);
  if (!doc.is_object()) return root.Error(absl::StrFormat("expected a JSON object, got %s", JsonTypeName(doc)));
  HEADROOM_ASSIGN_OR_RETURN(int64_t version, RequireInt(doc, "headroom_fixture_version", root));
  if (version != kValidationFixtureVersion) {
    return (root / "headroom_fixture_version")
        .Error(absl::StrFormat("version %d is not supported (this headroom reads version %d)", version,
                               kValidationFixtureVersion));
  }
  ValidationFixture fixture{.path = std::string(path)};
  HEADROOM_ASSIGN_OR_RETURN(fixture.name, RequireNonEmptyString(doc, "name", root));
  HEADROOM_ASSIGN_OR_RETURN(fixture.description, RequireNonEmptyString(doc, "description", root));
  HEADROOM_ASSIGN_OR_RETURN(fixture.device, RequireNonEmptyString(doc, "device", root));

  HEADROOM_ASSIGN_OR_RETURN(const json* args, RequireField(doc, "estimate_args", root));
  if (!args->is_array()) {
    return (root / "estimate_args")
        .Error(absl::StrFormat("expected an array of `headroom estimate` flags, got %s", JsonTypeName(*args)));
  }
  for (size_t i = 0; i < args->size(); ++i) {
    HEADROOM_ASSIGN_OR_RETURN(std::string arg, AsString((*args)[i], root / "estimate_args" / i));
    fixture.estimate_args.push_back(std::move(arg));
  }

  HEADROOM_ASSIGN_OR_RETURN(const json* measured, RequireField(doc, "measured", root));
  if (!measured->is_object()) {
    return (root / "measured").Error(absl::StrFormat("expected an object, got %s", JsonTypeName(*measured)));
  }
  HEADROOM_ASSIGN_OR_RETURN(fixture.measured, ParseMeasured(*measured, root / "measured"));
  if (Present(doc, "peers")) {
    HEADROOM_ASSIGN_OR_RETURN(fixture.peers, ParsePeers(doc["peers"], root / "peers"));
  }

  // The model last: its errors come from the model parsers, the fixture's
  // own fields are checked first.
  HEADROOM_ASSIGN_OR_RETURN(const json* model, RequireField(doc, "model", root));
  HEADROOM_ASSIGN_OR_RETURN(fixture.model, LoadModelDocument(*model, (root / "model").ToString()));
  return fixture;
}

absl::StatusOr<ValidationFixture> LoadValidationFixture(const std::string& path) {
  // Note [Fixture file bound].
  HEADROOM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, kMaxFixtureFileBytes));
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
