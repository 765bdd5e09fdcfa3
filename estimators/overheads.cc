#include "estimators/overheads.h"

#include "common/units.h"

namespace headroom {

CudaContextFigure CudaContextFor(std::string_view architecture) {
  // Note [CUDA context]: one lazy-loading figure until per-generation
  // measurements exist; the entry says which measurement it rests on.
  const std::string shared =
      "lazy module loading (PyTorch >= 1.13): 426 MiB measured on Ada "
      "(unslothai/unsloth-zoo#1053) + kernels loaded during the step, rounded to 512 MiB";
  if (architecture == "ada") {
    return {512 * kMiB, shared};
  }
  if (architecture == "hopper") {
    return {768 * kMiB,
            "measured on an H100 80GB HBM3 with PyTorch 2.11/CUDA 13 (validation/fixtures/cuda): 518 MiB at the "
            "first CUDA call, 678-760 MiB beside the allocator's reserved bytes once a step had loaded its kernels, "
            "rounded up to 768 MiB"};
  }
  // A byte budget instead of a catalog GPU names no architecture.
  if (architecture.empty()) return {512 * kMiB, shared + "; no GPU named, Ada's figure assumed"};
  return {512 * kMiB, std::string(shared) + "; no " + std::string(architecture) +
                          "-specific measurement, Ada's figure assumed"};
}

Overheads EstimateOverheads(const GpuSpec& gpu, const OverheadOptions& options) {
  Overheads out;
  if (options.cuda_context) {
    out.cuda_context = *options.cuda_context;
    out.cuda_context_source = "--cuda-context";
  } else {
    CudaContextFigure figure = CudaContextFor(gpu.architecture);
    out.cuda_context = figure.bytes;
    out.cuda_context_source = figure.source;
  }
  out.cublas_workspace = gpu.cublas_workspace_bytes * static_cast<uint64_t>(options.streams > 0 ? options.streams : 1);
  return out;
}

}  // namespace headroom
