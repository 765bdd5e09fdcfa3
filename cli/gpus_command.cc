// `headroom gpus [NAME] [--json] [--catalog FILE]`: the GPU catalog.
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "common/status_macros.h"
#include "common/text_table.h"
#include "common/units.h"
#include "hardware/gpu_catalog.h"

namespace headroom::cli {
namespace {

struct GpusOptions {
  std::string name;
  std::string catalog_path;
  bool json = false;
};

std::string Tera(const GpuSpec& gpu, MathMode mode) {
  std::optional<double> flops = gpu.PeakFlops(mode);
  return flops ? absl::StrFormat("%.1f", *flops / 1e12) : "-";
}

std::string HostLinkText(const HostLink& link) {
  const std::string kind =
      link.kind == "pcie" ? absl::StrCat("PCIe ", link.pcie_generation) : std::string("NVLink-C2C");
  return absl::StrFormat("%s (%.0f GB/s)", kind, link.bandwidth_bytes_per_s / 1e9);
}

void PrintTable(const GpuCatalog& catalog, std::ostream& out) {
  TextTable table({"GPU", "memory", "bandwidth", "fp32", "tf32", "bf16", "fp8", "SMs", "cc", "host link"},
                  {Align::kLeft, Align::kRight, Align::kRight, Align::kRight, Align::kRight,
                   Align::kRight, Align::kRight, Align::kRight, Align::kRight, Align::kLeft});
  for (const GpuSpec& gpu : catalog.gpus()) {
    table.AddRow({gpu.name, FormatBytes(gpu.memory_bytes),
                  absl::StrFormat("%.0f GB/s", gpu.memory_bandwidth_bytes_per_s / 1e9),
                  Tera(gpu, MathMode::kFp32), Tera(gpu, MathMode::kTf32), Tera(gpu, MathMode::kBf16),
                  Tera(gpu, MathMode::kFp8), absl::StrCat(gpu.sm_count), gpu.compute_capability,
                  HostLinkText(gpu.host_link)});
  }
  out << table.Render() << "Peak dense TFLOP/s per math mode ('-': no such unit). "
      << "'headroom gpus NAME' shows one GPU with its aliases and sources.\n";
}

void PrintOne(const GpuSpec& gpu, std::ostream& out) {
  TextTable table({"field", "value"});
  table.AddRow({"name", gpu.name});
  table.AddRow({"aliases", absl::StrJoin(gpu.aliases, ", ")});
  table.AddRow({"architecture", absl::StrCat(gpu.architecture, " (compute capability ",
                                             gpu.compute_capability, ")")});
  table.AddRow({"SMs", absl::StrCat(gpu.sm_count)});
  table.AddRow({"memory", absl::StrCat(FormatBytes(gpu.memory_bytes), " ", gpu.memory_type, " (",
                                       gpu.memory_bytes, " bytes)")});
  table.AddRow({"memory bandwidth",
                absl::StrFormat("%.0f GB/s", gpu.memory_bandwidth_bytes_per_s / 1e9)});
  for (MathMode mode : kAllMathModes) {
    if (gpu.PeakFlops(mode)) {
      table.AddRow({absl::StrFormat("peak %s", MathModeName(mode)), absl::StrCat(Tera(gpu, mode), " TFLOP/s")});
    }
  }
  table.AddRow({"host link", HostLinkText(gpu.host_link)});
  table.AddRow({"cuBLAS workspace", FormatBytes(gpu.cublas_workspace_bytes)});
  table.AddRow({"source", gpu.source});
  out << table.Render();
}

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
      PrintOne(*gpu, out);
    }
    return absl::OkStatus();
  }
  if (options.json) {
    nlohmann::json all = nlohmann::json::array();
    for (const GpuSpec& gpu : catalog.gpus()) all.push_back(GpuSpecToJson(gpu));
    out << nlohmann::json{{"schema_version", 1}, {"gpus", all}}.dump(2) << "\n";
  } else {
    PrintTable(catalog, out);
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
