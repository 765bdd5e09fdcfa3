// Memory a job needs beyond its tensors: the CUDA context, cuBLAS
// workspaces, and what the caching allocator holds beyond the bytes
// requested (its rounding and its cache of unused blocks).
//
//   Overheads o = EstimateOverheads(*gpu, {.streams = 1});
//   o.cuda_context      // CudaContextBytes(gpu.architecture) unless overridden
//   o.cublas_workspace  // gpu.cublas_workspace_bytes per stream
//
// Note [CUDA context]
// Creating a CUDA context loads the driver's state and, before CUDA 11.7,
// every kernel of every loaded library: Hugging Face measured 1343 MiB on a
// V100 with CUDA 11.2 ("Efficient training on a single GPU", transformers
// docs, 2022), and PyTorch maintainers report ">1000MB" before lazy loading
// and ~300-400 MiB with it (pytorch/pytorch#107667, #109888; #86509 measured
// 287 MB lazy vs 667 MB eager). PyTorch sets CUDA_MODULE_LOADING=LAZY by
// default since 1.13 (pytorch/pytorch#86509), so the defaults below are
// lazy-loading figures: 426 MiB measured at the first CUDA call on an Ada GPU
// with PyTorch 2.10/CUDA 13 (unslothai/unsloth-zoo#1053), rounded up to
// 512 MiB for the cuBLAS, cuDNN and NCCL kernels a training step loads
// lazily. Hopper's figure is our own measurement: on an H100 with PyTorch
// 2.11 and CUDA 13, NVML counted 518 MiB for the process right after its
// first CUDA call, and 678 MiB (inference) to 760 MiB (training with cuDNN)
// beyond the caching allocator's reserved bytes once a step had run, in
// every one of the 33 CUDA fixtures (driver_used_bytes less
// peak_reserved_bytes); 768 MiB covers them. No measurement with lazy
// loading was found for Volta, Turing, Ampere or Blackwell, so they share
// Ada's figure until one is; --cuda-context overrides it (use 1343MiB to
// reproduce the 2022 Hugging Face V100 numbers).
//
// Note [Allocator rounding and cache]
// The caching allocator hands out blocks, not the bytes requested: it rounds
// every request up (to 512 bytes, small requests to the small pool's
// blocks, large ones within a segment's split rules), and it keeps freed
// blocks in segments it has reserved from the device for later requests.
// Both come from replaying the step's allocation sequence through the
// allocator with the job's configuration (Note [Allocator replay] in
// estimators/step_replay.h): allocator_rounding is the allocated peak less
// the bytes requested at the peak, allocator_cached the reserved peak less
// the allocated one. They replace the fixed fraction of the dynamic bytes
// that stood in for fragmentation before the replay existed (25%, fitted to
// four bert-large measurements).
#ifndef HEADROOM_ESTIMATORS_OVERHEADS_H_
#define HEADROOM_ESTIMATORS_OVERHEADS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "hardware/gpu_catalog.h"
#include "job/job_spec.h"

namespace headroom {

struct CudaContextFigure {
  uint64_t bytes = 0;
  std::string source;
};
// The default context size for a catalog architecture ("volta", "hopper", ...).
CudaContextFigure CudaContextFor(std::string_view architecture);

struct Overheads {
  uint64_t cuda_context = 0;
  std::string cuda_context_source;
  uint64_t cublas_workspace = 0;
  // Note [Allocator rounding and cache]: filled by the estimate from its replay.
  uint64_t allocator_rounding = 0;  // allocated peak - requested bytes at the peak
  uint64_t allocator_cached = 0;    // reserved peak - allocated peak

  uint64_t total() const { return cuda_context + cublas_workspace + allocator_rounding + allocator_cached; }
};

// Context and workspaces; the allocator's rounding and cache depend on the
// allocation sequence and are filled in by the estimate
// (estimators/memory_estimate.h).
Overheads EstimateOverheads(const GpuSpec& gpu, const OverheadOptions& options);

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_OVERHEADS_H_
