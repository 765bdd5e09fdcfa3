#include "hardware/gpu_catalog.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/edit_distance.h"
#include "common/json_fields.h"
#include "common/name_table.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace headroom {
namespace internal {
const std::map<std::string, std::string_view>& EmbeddedCatalogFiles();
}  // namespace internal

namespace {

using nlohmann::json;

constexpr NameTable<MathMode, 7> kMathModeNames("math mode", {{
    {"fp64", MathMode::kFp64}, {"fp32", MathMode::kFp32}, {"tf32", MathMode::kTf32},
    {"bf16", MathMode::kBf16}, {"fp16", MathMode::kFp16}, {"fp8", MathMode::kFp8},
    {"int8", MathMode::kInt8},
}});

// The host link kinds the catalog knows; HostLink keeps the name itself.
enum class HostLinkKind { kPcie, kNvlinkC2c };
constexpr NameTable<HostLinkKind, 2> kHostLinkNames("host link", {{
    {"pcie", HostLinkKind::kPcie}, {"nvlink-c2c", HostLinkKind::kNvlinkC2c},
}});


absl::StatusOr<HostLink> ParseHostLink(const json& object, const JsonPath& path) {
  HostLink link;
  HEADROOM_ASSIGN_OR_RETURN(link.kind, RequireString(object, "kind", path));
  if (absl::StatusOr<HostLinkKind> kind = kHostLinkNames.Parse(link.kind); !kind.ok()) {
    return (path / "kind").Error(std::string(kind.status().message()));
  }
  uint64_t generation = 0;
  HEADROOM_ASSIGN_OR_RETURN(generation, RequireUint(object, "pcie_generation", path));
  if (link.kind == "pcie" && (generation < 1 || generation > 7)) {
    return (path / "pcie_generation").Error("expected a PCIe generation between 1 and 7");
  }
  link.pcie_generation = static_cast<int>(generation);
  HEADROOM_ASSIGN_OR_RETURN(link.bandwidth_bytes_per_s, RequireNumber(object, "bandwidth_bytes_per_s", path));
  if (link.bandwidth_bytes_per_s <= 0) {
    return (path / "bandwidth_bytes_per_s").Error("must be positive");
  }
  return link;
}

absl::StatusOr<GpuSpec> ParseGpu(const json& object, const JsonPath& path) {
  GpuSpec gpu;
  HEADROOM_ASSIGN_OR_RETURN(gpu.name, RequireString(object, "name", path));
  if (NormalizeGpuName(gpu.name).empty()) return (path / "name").Error("name is empty");

  const json* aliases = nullptr;
  HEADROOM_ASSIGN_OR_RETURN(aliases, RequireField(object, "aliases", path));
  if (!aliases->is_array()) return (path / "aliases").Error("expected an array of strings");
  for (size_t i = 0; i < aliases->size(); ++i) {
    std::string alias;
    HEADROOM_ASSIGN_OR_RETURN(alias, AsString((*aliases)[i], path / "aliases" / i));
    gpu.aliases.push_back(std::move(alias));
  }

  HEADROOM_ASSIGN_OR_RETURN(gpu.architecture, RequireString(object, "architecture", path));
  HEADROOM_ASSIGN_OR_RETURN(gpu.compute_capability, RequireString(object, "compute_capability", path));
  {
    std::string_view cc = gpu.compute_capability;
    const size_t dot = cc.find('.');
    int major = 0, minor = 0;
    if (dot == std::string_view::npos || !absl::SimpleAtoi(std::string(cc.substr(0, dot)), &major) ||
        !absl::SimpleAtoi(std::string(cc.substr(dot + 1)), &minor) || major < 1 || minor < 0) {
      return (path / "compute_capability").Error(absl::StrCat(QuoteForError(cc), " is not MAJOR.MINOR"));
    }
  }
  uint64_t sms = 0;
  HEADROOM_ASSIGN_OR_RETURN(sms, RequireUint(object, "sm_count", path));
  if (sms == 0 || sms > 10000) return (path / "sm_count").Error("must be between 1 and 10000");
  gpu.sm_count = static_cast<int>(sms);

  HEADROOM_ASSIGN_OR_RETURN(gpu.memory_bytes, RequireUint(object, "memory_bytes", path));
  if (gpu.memory_bytes == 0) return (path / "memory_bytes").Error("must be positive");
  HEADROOM_ASSIGN_OR_RETURN(gpu.memory_type, RequireString(object, "memory_type", path));
  HEADROOM_ASSIGN_OR_RETURN(gpu.memory_bandwidth_bytes_per_s,
                  RequireNumber(object, "memory_bandwidth_bytes_per_s", path));
  if (gpu.memory_bandwidth_bytes_per_s <= 0) {
    return (path / "memory_bandwidth_bytes_per_s").Error("must be positive");
  }

  const json* peaks = nullptr;
  HEADROOM_ASSIGN_OR_RETURN(peaks, RequireField(object, "peak_dense_flops", path));
  const JsonPath peaks_path = path / "peak_dense_flops";
  if (!peaks->is_object()) return peaks_path.Error("expected an object of mode -> FLOP/s");
  for (const auto& [mode_name, value] : peaks->items()) {
    absl::StatusOr<MathMode> mode = ParseMathMode(mode_name);
    if (!mode.ok()) return (peaks_path / mode_name).Error(std::string(mode.status().message()));
    double flops = 0;
    HEADROOM_ASSIGN_OR_RETURN(flops, AsNumber(value, peaks_path / mode_name));
    if (flops <= 0) return (peaks_path / mode_name).Error("must be positive");
    gpu.peak_dense_flops[*mode] = flops;
  }
  if (!gpu.peak_dense_flops.contains(MathMode::kFp32)) {
    return (peaks_path / "fp32").Error("required field is missing");
  }

  const json* link = nullptr;
  HEADROOM_ASSIGN_OR_RETURN(link, RequireField(object, "host_link", path));
  HEADROOM_ASSIGN_OR_RETURN(gpu.host_link, ParseHostLink(*link, path / "host_link"));
  HEADROOM_ASSIGN_OR_RETURN(gpu.cublas_workspace_bytes, RequireUint(object, "cublas_workspace_bytes", path));
  HEADROOM_ASSIGN_OR_RETURN(gpu.source, RequireString(object, "source", path));
  if (gpu.source.empty()) return (path / "source").Error("every entry names its data sheet");

  // Note [Runtime total memory]: optional, but never without its source.
  const bool has_total = object.contains("cuda_total_memory_bytes");
  const bool has_total_source = object.contains("cuda_total_memory_source");
  if (has_total) {
    uint64_t total = 0;
    HEADROOM_ASSIGN_OR_RETURN(total, RequireUint(object, "cuda_total_memory_bytes", path));
    if (total == 0) return (path / "cuda_total_memory_bytes").Error("must be positive");
    if (total > gpu.memory_bytes) {
      return (path / "cuda_total_memory_bytes")
          .Error(absl::StrCat(total, " exceeds memory_bytes (", gpu.memory_bytes, ")"));
    }
    gpu.cuda_total_memory_bytes = total;
    HEADROOM_ASSIGN_OR_RETURN(gpu.cuda_total_memory_source,
                              RequireString(object, "cuda_total_memory_source", path));
    if (gpu.cuda_total_memory_source.empty()) {
      return (path / "cuda_total_memory_source").Error("a runtime total names where it was observed");
    }
  } else if (has_total_source) {
    return (path / "cuda_total_memory_bytes").Error("required with cuda_total_memory_source");
  }
  return gpu;
}

}  // namespace

std::string_view MathModeName(MathMode mode) { return kMathModeNames.Name(mode); }

absl::StatusOr<MathMode> ParseMathMode(std::string_view name) { return kMathModeNames.Parse(name); }

std::optional<double> GpuSpec::PeakFlops(MathMode mode) const {
  auto it = peak_dense_flops.find(mode);
  if (it == peak_dense_flops.end()) return std::nullopt;
  return it->second;
}

uint64_t RuntimeTotalFallbackBytes(uint64_t memory_bytes, std::string_view memory_type) {
  // Whole MiB: 98% of HBM, 91.5% of GDDR (Note [Runtime total memory]).
  const bool hbm = memory_type.substr(0, 3) == "HBM";
  const uint64_t mib = (memory_bytes >> 20) * (hbm ? 980 : 915) / 1000;
  return mib << 20;
}

uint64_t GpuSpec::RuntimeTotalBytes() const {
  return cuda_total_memory_bytes.value_or(RuntimeTotalFallbackBytes(memory_bytes, memory_type));
}

int GpuSpec::compute_capability_major() const {
  int major = 0;
  (void)absl::SimpleAtoi(compute_capability.substr(0, compute_capability.find('.')), &major);
  return major;
}

nlohmann::json GpuSpecToJson(const GpuSpec& gpu) {
  json peaks = json::object();
  for (const auto& [mode, flops] : gpu.peak_dense_flops) peaks[std::string(MathModeName(mode))] = flops;
  json out{{"name", gpu.name},
           {"aliases", gpu.aliases},
           {"architecture", gpu.architecture},
           {"compute_capability", gpu.compute_capability},
           {"sm_count", gpu.sm_count},
           {"memory_bytes", gpu.memory_bytes},
           {"memory_type", gpu.memory_type},
           {"memory_bandwidth_bytes_per_s", gpu.memory_bandwidth_bytes_per_s},
           {"peak_dense_flops", peaks},
           {"host_link",
            {{"kind", gpu.host_link.kind},
             {"pcie_generation", gpu.host_link.pcie_generation},
             {"bandwidth_bytes_per_s", gpu.host_link.bandwidth_bytes_per_s}}},
           {"cublas_workspace_bytes", gpu.cublas_workspace_bytes},
           {"source", gpu.source}};
  if (gpu.cuda_total_memory_bytes) {
    out["cuda_total_memory_bytes"] = *gpu.cuda_total_memory_bytes;
    out["cuda_total_memory_source"] = gpu.cuda_total_memory_source;
  }
  return out;
}

std::string NormalizeGpuName(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (absl::ascii_isalnum(static_cast<unsigned char>(c))) {
      out.push_back(absl::ascii_tolower(static_cast<unsigned char>(c)));
    }
  }
  for (std::string_view prefix : {"nvidia", "tesla", "geforce"}) {
    if (out.starts_with(prefix) && out.size() > prefix.size()) out.erase(0, prefix.size());
  }
  return out;
}

absl::StatusOr<GpuCatalog> GpuCatalog::Parse(std::string_view json_text, std::string_view origin) {
  json document;
  HEADROOM_ASSIGN_OR_RETURN(document, ParseJsonDocument(json_text, origin));
  const JsonPath root(origin);
  uint64_t version = 0;
  HEADROOM_ASSIGN_OR_RETURN(version, RequireUint(document, "schema_version", root));
  if (version != 1) {
    return (root / "schema_version").Error(absl::StrCat("unsupported version ", version, " (this build reads 1)"));
  }
  const json* gpus = nullptr;
  HEADROOM_ASSIGN_OR_RETURN(gpus, RequireField(document, "gpus", root));
  if (!gpus->is_array() || gpus->empty()) return (root / "gpus").Error("expected a non-empty array");

  GpuCatalog catalog;
  for (size_t i = 0; i < gpus->size(); ++i) {
    GpuSpec gpu;
    HEADROOM_ASSIGN_OR_RETURN(gpu, ParseGpu((*gpus)[i], root / "gpus" / i));
    std::vector<std::string> keys = {gpu.name};
    keys.insert(keys.end(), gpu.aliases.begin(), gpu.aliases.end());
    for (const std::string& key : keys) {
      const std::string normalized = NormalizeGpuName(key);
      if (normalized.empty()) return (root / "gpus" / i).Error(absl::StrCat("alias ", QuoteForError(key), " is empty"));
      auto [it, inserted] = catalog.index_.emplace(normalized, catalog.gpus_.size());
      if (!inserted && it->second != catalog.gpus_.size()) {
        return (root / "gpus" / i).Error(absl::StrCat("name or alias ", QuoteForError(key), " is already used by ",
                                                      QuoteForError(catalog.gpus_[it->second].name)));
      }
    }
    catalog.gpus_.push_back(std::move(gpu));
  }
  return catalog;
}

absl::StatusOr<GpuCatalog> GpuCatalog::LoadFile(const std::string& path) {
  std::string text;
  HEADROOM_ASSIGN_OR_RETURN(text, ReadTextFile(path, kCatalogFile));
  return Parse(text, path);
}

const GpuCatalog& GpuCatalog::Builtin() {
  static const GpuCatalog* catalog = [] {
    const auto& files = internal::EmbeddedCatalogFiles();
    absl::StatusOr<GpuCatalog> parsed = Parse(files.at("gpus.json"), "data/gpus.json");
    // The file is validated by the test suite; a broken build artefact is a bug.
    if (!parsed.ok()) {
      fprintf(stderr, "headroom: built-in GPU catalog is invalid: %s\n",
              std::string(parsed.status().message()).c_str());
      std::abort();
    }
    return new GpuCatalog(*std::move(parsed));
  }();
  return *catalog;
}

absl::StatusOr<const GpuSpec*> GpuCatalog::Find(std::string_view name) const {
  auto it = index_.find(NormalizeGpuName(name));
  if (it != index_.end()) return &gpus_[it->second];
  std::vector<std::string> close = CloseMatches(name);
  std::string hint = close.empty() ? "run 'headroom gpus' for the list"
                                   : absl::StrCat("did you mean: ", absl::StrJoin(close, ", "), "?");
  return absl::NotFoundError(absl::StrFormat("unknown GPU %s; %s", QuoteForError(name), hint));
}

std::vector<std::string> GpuCatalog::CloseMatches(std::string_view name, size_t limit) const {
  const std::string query = NormalizeGpuName(name);
  // Score each GPU by its best-matching key; a key that contains the query
  // counts as very close, so a truncated name ("h100-80g") still finds its GPU.
  std::vector<std::pair<size_t, size_t>> scored;  // (distance, gpu index)
  for (size_t i = 0; i < gpus_.size(); ++i) {
    size_t best = SIZE_MAX;
    std::vector<std::string> keys = {gpus_[i].name};
    keys.insert(keys.end(), gpus_[i].aliases.begin(), gpus_[i].aliases.end());
    for (const std::string& key : keys) {
      const std::string normalized = NormalizeGpuName(key);
      size_t distance = EditDistance(query, normalized);
      if (!query.empty() && normalized.find(query) != std::string::npos) {
        distance = std::min<size_t>(distance, 1);
      }
      best = std::min(best, distance);
    }
    const size_t tolerance = std::max<size_t>(2, query.size() / 3);
    if (best <= tolerance) scored.emplace_back(best, i);
  }
  std::stable_sort(scored.begin(), scored.end());
  std::vector<std::string> names;
  for (size_t k = 0; k < scored.size() && names.size() < limit; ++k) {
    names.push_back(gpus_[scored[k].second].name);
  }
  return names;
}

}  // namespace headroom
