// `headroom gpus [NAME] [--json] [--catalog FILE]`: the GPU catalog.
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "cli/command.h"
#include "common/status_macros.h"
#include "hardware/gpu_catalog.h"
#include "report/gpu_report.h"

namespace headroom::cli {
namespace {

struct GpusOptions {
  std::string name;
  std::string catalog_path;
  bool json = false;
};

absl::Status RunGpus(const GpusOptions& options, std::ostream& out) {
  std::optional<GpuCatalog> loaded;
  if (!options.catalog_path.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(loaded, GpuCatalog::LoadFile(options.catalog_path));
  }
  const GpuCatalog& catalog = loaded ? *loaded : GpuCatalog::Builtin();

  if (!options.name.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(const GpuSpec* gpu, catalog.Find(options.name));
    if (options.json) {
      out << GpuSpecToJson(*gpu).dump(2) << "\n";
    } else {
      out << GpuText(*gpu);
    }
    return absl::OkStatus();
  }
  if (options.json) {
    out << GpuCatalogJson(catalog).dump(2) << "\n";
  } else {
    out << GpuTableText(catalog);
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand AddGpusCommand(CLI::App& root) {
  auto options = std::make_shared<GpusOptions>();
  CLI::App* app = root.add_subcommand("gpus", "List the GPU catalog, or show one GPU in full");
  app->add_option("name", options->name, "A GPU name or alias, e.g. H100-80GB or a100");
  app->add_flag("--json", options->json, "Print the catalog's own JSON (exact figures)");
  app->add_option("--catalog", options->catalog_path, "Read this catalog file instead of the built-in one");
  return {app, [options](std::ostream& out) { return RunGpus(*options, out); }};
}

}  // namespace headroom::cli
