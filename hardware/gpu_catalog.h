// The GPU catalog: what each supported GPU offers to a training step.
//
// The catalog is a JSON data file (data/gpus.json, embedded into the library
// at build time) with, per GPU: memory, bandwidth, peak dense FLOP/s by math
// mode, SM count, compute capability, host link, the cuBLAS workspace that
// each stream needs, and the total memory the CUDA runtime reports. The
// estimators read memory and workspace; the roofline cost model reads
// bandwidth and peaks.
//
//   const GpuCatalog& catalog = GpuCatalog::Builtin();
//   absl::StatusOr<const GpuSpec*> h100 = catalog.Find("H100-80GB");
//   if (!h100.ok()) ...;  // "unknown GPU 'H100-80G'; did you mean: H100-SXM-80GB (h100-80gb)?"
//   double bf16 = *(*h100)->PeakFlops(MathMode::kBf16);
//
// Names match case-insensitively and ignore punctuation and a leading
// "NVIDIA", so "h100-sxm", "H100 SXM" and nvidia-smi's "NVIDIA H100 80GB"
// style names resolve. Invariants kept by Parse(): every required field
// present and positive, names and aliases unique after normalization, and
// a cuda_total_memory_bytes, where given, positive, no larger than
// memory_bytes and paired with its cuda_total_memory_source.
//
// Note [Runtime total memory]
// memory_bytes is the data sheet's capacity. The CUDA runtime reports less:
// cudaMemGetInfo's total (= cudaDeviceProp::totalGlobalMem,
// torch.cuda.get_device_properties(i).total_memory, the "total capacity" of
// PyTorch's out-of-memory message, vLLM's total_gpu_memory) leaves out what
// the driver keeps for itself and, on GDDR cards with ECC on, the 1/16 that
// ECC takes. nvidia-smi's MiB total is a third figure, between the two
// (RTX 6000 Ada with ECC on: 46068 MiB in nvidia-smi, 44.43 GiB = 45496 MiB
// in PyTorch, DINGYANB/MTVCrafter#21), so it is not used here. The runtime
// total also moves by tens of MiB with the driver version, so each catalog
// figure is one cited observation (cuda_total_memory_source), not a
// constant of the card. Where no observation was found the field is absent
// and RuntimeTotalBytes() falls back to a share of memory_bytes below every
// observation of its memory type: 98% of HBM (the observed HBM cards keep
// 98.0-99.1%), 91.5% of GDDR (ECC on, as data-center cards ship, takes 1/16:
// the observed ECC-on cards keep 91.6-93.7%, GeForce cards without ECC
// 98.0-98.5%). An estimate made with it errs towards too little room, and
// says that the total is not an observation (the serving report does).
#ifndef HEADROOM_HARDWARE_GPU_CATALOG_H_
#define HEADROOM_HARDWARE_GPU_CATALOG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/input_file.h"
#include "nlohmann/json.hpp"

namespace headroom {

// A catalog file's bound (Note [Input bounds] in common/input_file.h).
inline constexpr InputFileKind kCatalogFile{.noun = "a GPU catalog", .max_bytes = kMaxSmallFileBytes};

// The arithmetic a kernel runs in, as data sheets list peaks. fp32 is the
// plain (non-Tensor-Core) rate; the others are Tensor Core rates.
enum class MathMode { kFp64, kFp32, kTf32, kBf16, kFp16, kFp8, kInt8 };

std::string_view MathModeName(MathMode mode);
absl::StatusOr<MathMode> ParseMathMode(std::string_view name);
inline constexpr MathMode kAllMathModes[] = {MathMode::kFp64, MathMode::kFp32, MathMode::kTf32,
                                             MathMode::kBf16, MathMode::kFp16, MathMode::kFp8,
                                             MathMode::kInt8};

struct HostLink {
  std::string kind;              // "pcie" or "nvlink-c2c"
  int pcie_generation = 0;       // 0 when the link is not PCIe
  double bandwidth_bytes_per_s;  // one direction
};

struct GpuSpec {
  std::string name;
  std::vector<std::string> aliases;
  std::string architecture;        // "volta", "ampere", "hopper", ...
  std::string compute_capability;  // "9.0"
  int sm_count = 0;
  uint64_t memory_bytes = 0;
  std::string memory_type;  // "HBM3", "GDDR6X", ...
  double memory_bandwidth_bytes_per_s = 0;
  std::map<MathMode, double> peak_dense_flops;  // absent: no unit for that mode
  HostLink host_link;
  uint64_t cublas_workspace_bytes = 0;
  std::string source;  // the data sheet the figures come from
  // Note [Runtime total memory]: cudaMemGetInfo's total as observed on this
  // card, and where that observation was published; absent when none was
  // found (then cuda_total_memory_source is empty too).
  std::optional<uint64_t> cuda_total_memory_bytes;
  std::string cuda_total_memory_source;

  // Peak dense FLOP/s in `mode`, or nullopt when the GPU has no such unit.
  std::optional<double> PeakFlops(MathMode mode) const;
  // The total the CUDA runtime reports: cuda_total_memory_bytes where the
  // catalog has it, else RuntimeTotalFallbackBytes(memory_bytes, memory_type).
  uint64_t RuntimeTotalBytes() const;
  int compute_capability_major() const;
};

class GpuCatalog {
 public:
  // Validates a catalog document; `origin` names it in errors.
  static absl::StatusOr<GpuCatalog> Parse(std::string_view json_text, std::string_view origin);
  static absl::StatusOr<GpuCatalog> LoadFile(const std::string& path);
  // The catalog shipped inside the library (data/gpus.json at build time).
  static const GpuCatalog& Builtin();

  // Exact match on a normalized name or alias. On failure the NotFound
  // message lists the closest names.
  absl::StatusOr<const GpuSpec*> Find(std::string_view name) const;
  // Up to `limit` catalog names closest to `name`, best first.
  std::vector<std::string> CloseMatches(std::string_view name, size_t limit = 3) const;

  const std::vector<GpuSpec>& gpus() const { return gpus_; }

 private:
  std::vector<GpuSpec> gpus_;
  std::map<std::string, size_t> index_;  // normalized name or alias -> gpus_ index
};

// The fallback of Note [Runtime total memory], in whole MiB.
uint64_t RuntimeTotalFallbackBytes(uint64_t memory_bytes, std::string_view memory_type);

// The entry in the catalog file's own schema (round-trips through Parse).
nlohmann::json GpuSpecToJson(const GpuSpec& gpu);

// Lower-case letters and digits only, without a leading "nvidia"/"tesla"/"geforce".
std::string NormalizeGpuName(std::string_view name);

}  // namespace headroom

#endif  // HEADROOM_HARDWARE_GPU_CATALOG_H_
