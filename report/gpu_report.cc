#include "report/gpu_report.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/text_table.h"
#include "common/units.h"

namespace headroom {
namespace {

std::string Tera(const GpuSpec& gpu, MathMode mode) {
  std::optional<double> flops = gpu.PeakFlops(mode);
  return flops ? absl::StrFormat("%.1f", *flops / 1e12) : "-";
}

std::string HostLinkText(const HostLink& link) {
  const std::string kind =
      link.kind == "pcie" ? absl::StrCat("PCIe ", link.pcie_generation) : std::string("NVLink-C2C");
  return absl::StrFormat("%s (%.0f GB/s)", kind, link.bandwidth_bytes_per_s / 1e9);
}

}  // namespace

std::string GpuTableText(const GpuCatalog& catalog) {
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
  return table.Render() +
         "Peak dense TFLOP/s per math mode ('-': no such unit). "
         "'headroom gpus NAME' shows one GPU with its aliases and sources.\n";
}

std::string GpuText(const GpuSpec& gpu) {
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
  return table.Render();
}

nlohmann::json GpuCatalogJson(const GpuCatalog& catalog) {
  nlohmann::json all = nlohmann::json::array();
  for (const GpuSpec& gpu : catalog.gpus()) all.push_back(GpuSpecToJson(gpu));
  return {{"schema_version", 1}, {"gpus", all}};
}

}  // namespace headroom
