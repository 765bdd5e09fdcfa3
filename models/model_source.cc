#include "models/model_source.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/edit_distance.h"
#include "common/json_fields.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "models/graph_json.h"
#include "models/node_link.h"

namespace headroom {
namespace internal {
const std::map<std::string, std::string_view>& EmbeddedModelFiles();
}  // namespace internal

namespace {

std::string NormalizePresetName(std::string_view name) {
  std::string out = absl::AsciiStrToLower(std::string(name));
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}


std::vector<std::string> ClosePresetNames(const std::string& query) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const std::string& name : PresetNames()) {
    size_t distance = EditDistance(query, name);
    if (!query.empty() && name.find(query) != std::string::npos) distance = 1;
    if (distance <= std::max<size_t>(3, query.size() / 3)) scored.emplace_back(distance, name);
  }
  std::stable_sort(scored.begin(), scored.end());
  std::vector<std::string> names;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) names.push_back(scored[i].second);
  return names;
}

// A model document, already parsed as `doc` from `text`, recognized by its
// keys (see the resolution order in model_source.h); errors name `origin`.
absl::StatusOr<LoadedModel> LoadDocument(std::string_view text, const nlohmann::json& doc, std::string name,
                                         std::string_view origin) {
  LoadedModel model{.name = std::move(name)};
  if (doc.is_object() && doc.contains("headroom_graph_version")) {
    model.kind = ModelSourceKind::kGraphFile;
    HEADROOM_ASSIGN_OR_RETURN(model.graph, LoadGraphJson(text, origin));
  } else if (doc.is_object() && doc.contains("nodes") && doc.contains("links")) {
    model.kind = ModelSourceKind::kNodeLinkFile;
    HEADROOM_ASSIGN_OR_RETURN(model.graph, ImportNodeLink(text, origin));
  } else {
    model.kind = ModelSourceKind::kConfigFile;
    HEADROOM_ASSIGN_OR_RETURN(model.config, ParseHfConfig(text, origin));
  }
  return model;
}

absl::StatusOr<LoadedModel> LoadFile(const std::string& path) {
  std::filesystem::path file(path);
  std::error_code error;
  if (std::filesystem::is_directory(file, error)) file /= "config.json";  // an HF snapshot
  // Note [Model file bound] in model_source.h.
  HEADROOM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(file.string(), kModelFile));
  HEADROOM_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJsonDocument(text, file.string()));
  return LoadDocument(text, doc, path, file.string());
}

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const auto& [file, text] : internal::EmbeddedModelFiles()) {
    names.push_back(file.substr(0, file.rfind(".json")));
  }
  for (std::string& cnn : CnnNames()) names.push_back(std::move(cnn));
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<ModelConfig> LoadPresetConfig(std::string_view name) {
  const std::string key = NormalizePresetName(name);
  for (const std::string& cnn : CnnNames()) {
    if (cnn == key) return CnnConfig(cnn);
  }
  const auto& files = internal::EmbeddedModelFiles();
  auto it = files.find(key + ".json");
  if (it == files.end()) {
    std::vector<std::string> close = ClosePresetNames(key);
    std::string hint = close.empty()
                           ? absl::StrFormat("presets: %s", absl::StrJoin(PresetNames(), ", "))
                           : absl::StrFormat("did you mean: %s?", absl::StrJoin(close, ", "));
    return absl::NotFoundError(absl::StrFormat(
        "unknown model %s (not a preset, and no such file); %s", QuoteForError(name), hint));
  }
  return ParseHfConfig(it->second, absl::StrFormat("preset %s", key));
}

absl::StatusOr<LoadedModel> LoadModelDocument(const nlohmann::json& document, std::string_view origin) {
  // The format parsers read text, so the document is written back out; a
  // model document is a few KiB.
  return LoadDocument(document.dump(), document, std::string(origin), origin);
}

absl::StatusOr<LoadedModel> LoadModel(std::string_view spec) {
  const std::string path(spec);
  std::error_code error;
  if (!path.empty() && std::filesystem::exists(path, error)) return LoadFile(path);
  if (path.find('/') != std::string::npos || path.ends_with(".json")) {
    return absl::NotFoundError(absl::StrFormat("model file %s does not exist", QuoteForError(spec)));
  }
  LoadedModel model{.name = NormalizePresetName(spec), .kind = ModelSourceKind::kPreset};
  HEADROOM_ASSIGN_OR_RETURN(model.config, LoadPresetConfig(spec));
  return model;
}

}  // namespace headroom
