// Where a model comes from: a preset name, a config.json path, or a Headroom
// graph JSON path. The CLI's --model flag resolves through LoadModel.
//
//   absl::StatusOr<LoadedModel> model = LoadModel("llama-3-8b");
//   if (!model.ok()) ...;  // "unknown model 'llama-3-7b'; did you mean: llama-3-8b, ...?"
//   if (model->config) {
//     absl::StatusOr<Graph> g = BuildModelGraph(*model->config, options);
//   } else {
//     const Graph& g = *model->graph;  // fixed graph: BuildOptions do not apply
//   }
//
// Resolution order: a spec naming an existing file is read as JSON; a
// document with "headroom_graph_version" is a graph, one with "nodes" and
// "links" is a networkx node-link graph, anything else a config.json.
// Otherwise the spec is a preset name (case-insensitive, '_' == '-'), or a
// torchvision CNN ("resnet50", "vgg16"). Presets are real Hugging Face
// config.json files from data/models/, embedded in the library.
#ifndef HEADROOM_MODELS_MODEL_SOURCE_H_
#define HEADROOM_MODELS_MODEL_SOURCE_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/input_file.h"
#include "graph/graph.h"
#include "models/model_config.h"
#include "nlohmann/json.hpp"

namespace headroom {

// Note [Model file bound]
// A model file is read whole into memory and parsed as JSON, so files are
// bounded: at most kMaxModelFileBytes (256 MiB; the largest published
// node-link graphs are a few MiB, configs a few KiB). A larger file is an
// error naming it, before any of it is read (Note [Input bounds] in
// common/input_file.h).
inline constexpr uint64_t kMaxModelFileBytes = kMaxDocumentFileBytes;
inline constexpr InputFileKind kModelFile{.noun = "a model file", .max_bytes = kMaxModelFileBytes};

enum class ModelSourceKind : uint8_t { kPreset, kConfigFile, kGraphFile, kNodeLinkFile };

struct LoadedModel {
  std::string name;  // preset name, or the file path
  ModelSourceKind kind = ModelSourceKind::kPreset;
  std::optional<ModelConfig> config;  // presets and config.json
  std::optional<Graph> graph;         // graph JSON and node-link files
};

absl::StatusOr<LoadedModel> LoadModel(std::string_view spec);

// A model given as a JSON document already in memory (a config.json object,
// a graph or a node-link graph embedded in a larger file, e.g. a validation
// fixture's "model"), recognized by its keys as a file is. `origin` names
// the document in errors and becomes the model's name:
//   LoadModelDocument(fixture["model"], "fixtures/x.json: model")
//   -> "fixtures/x.json: model: hidden_size: required field is missing"
absl::StatusOr<LoadedModel> LoadModelDocument(const nlohmann::json& document, std::string_view origin);

// A preset's config by name; NotFound listing the closest names otherwise.
absl::StatusOr<ModelConfig> LoadPresetConfig(std::string_view name);

// All preset names (sorted), CNNs included.
std::vector<std::string> PresetNames();

}  // namespace headroom

#endif  // HEADROOM_MODELS_MODEL_SOURCE_H_
