// Memory a job needs beyond its tensors: the CUDA context, cuBLAS
// workspaces, the caching allocator's rounding, and a named fragmentation
// allowance.
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
// lazily. No per-generation measurement with lazy loading was found for
// Volta, Turing, Ampere, Hopper or Blackwell, so they share that figure until
// one is; --cuda-context overrides it (use 1343MiB to reproduce the 2022
// Hugging Face V100 numbers).
//
// Note [Allocator rounding]
// PyTorch's caching allocator rounds every request up to a multiple of 512
// bytes (kMinBlockSize); the estimator adds that rounding for the tensors
// live at the peak. Fragmentation (reserved but unusable memory between
// blocks) depends on the allocation order and is predicted by replaying the
// schedule through the allocator (issue [5]); until then it is reported as a
// separate, named allowance: a fraction of the peak's dynamic bytes
// (activations, activation gradients, temporaries). The default 25% is an empirical figure, not a derivation: in
// Hugging Face's four bert-large V100 measurements (tests/estimators/
// memory_estimate_test.cc) nvidia-smi exceeded everything else this
// estimator counts by 27% (fp32, batch 4), 32% (batch 1) and 46% (fp16
// autocast) of those bytes; 25% keeps all four within 10% without
// overshooting. --fragmentation overrides it.
#ifndef HEADROOM_ESTIMATORS_OVERHEADS_H_
#define HEADROOM_ESTIMATORS_OVERHEADS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "hardware/gpu_catalog.h"
#include "job/job_spec.h"

namespace headroom {

inline constexpr uint64_t kAllocatorRounding = 512;  // Note [Allocator rounding]

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
  uint64_t allocator_rounding = 0;   // filled by the caller from the live tensors
  uint64_t fragmentation_allowance = 0;

  uint64_t total() const {
    return cuda_context + cublas_workspace + allocator_rounding + fragmentation_allowance;
  }
};

// Context and workspaces; rounding and fragmentation depend on the tensors
// and are filled in by the estimate (estimators/memory_estimate.h).
Overheads EstimateOverheads(const GpuSpec& gpu, const OverheadOptions& options);

// Bytes lost to rounding `bytes` up to the allocator's 512-byte blocks.
inline uint64_t RoundingWaste(uint64_t bytes) {
  return bytes == 0 ? 0 : (kAllocatorRounding - bytes % kAllocatorRounding) % kAllocatorRounding;
}

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_OVERHEADS_H_
