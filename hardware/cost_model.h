// Roofline time of ops and steps on a catalog GPU, and the time prices of
// the memory-saving fixes the estimators rank (recomputation, offload).
//
//   const GpuSpec* h100 = *GpuCatalog::Builtin().Find("H100-80GB");
//   OpCost c = EstimateOpTime(step.op(7), *h100);       // c.seconds, c.compute_bound
//   double t = EstimateStepTime(step, *h100);            // seconds for the whole step
//   double r = RecomputeSeconds(step, *h100);            // the share spent replaying forward
//   double o = OffloadSeconds(12 * kGiB, 12 * kGiB, *h100);
//
// Note [Roofline]
// An op takes max(flops / peak, (bytes_read + bytes_written) / bandwidth)
// plus a fixed launch latency (Williams, Waterman and Patterson, "Roofline:
// an insightful visual performance model", CACM 2009). The peak is the
// catalog's dense peak for the op's math mode: GEMM-like ops (kinds in the
// kGemm and kFlashAttention families of graph/autograd.h, forward, backward
// or recomputed) run on Tensor Cores at MathModeFor(compute_dtype,
// allow_tf32); every other op, optimizer steps included, runs on the CUDA
// cores at the fp32 rate. A GPU without a unit for the mode (bf16 on a V100)
// falls back to its fp32 rate, as emulated kernels do at best. Both peaks are
// scaled by an efficiency below 1 because no real kernel reaches the data
// sheet: the defaults are assumptions to override with measurements.
// launch_latency_s (default 5 us) stands for kernel launch plus framework
// dispatch per op; it dominates only for tiny ops. The model ignores overlap
// between ops and streams, so a step's time is the sum of its ops'.
#ifndef HEADROOM_HARDWARE_COST_MODEL_H_
#define HEADROOM_HARDWARE_COST_MODEL_H_

#include <cstdint>
#include <map>

#include "hardware/gpu_catalog.h"
#include "graph/graph.h"

namespace headroom {

// The math mode a matmul in this dtype runs in (f32 -> kFp32 unless tf32 is on).
MathMode MathModeFor(DType dtype, bool allow_tf32 = false);

struct CostModelOptions {
  double launch_latency_s = 5e-6;
  bool allow_tf32 = false;         // f32 GEMMs on Tensor Cores (torch.backends.cuda.matmul.allow_tf32)
  double compute_efficiency = 0.7;   // fraction of the data sheet's peak FLOP/s reached
  double bandwidth_efficiency = 0.8; // fraction of the data sheet's memory bandwidth reached
  double host_link_efficiency = 0.8; // fraction of the host link's bandwidth reached by copies
};

struct OpCost {
  double seconds = 0;          // max(compute, memory) + launch latency
  double compute_seconds = 0;  // flops / effective peak
  double memory_seconds = 0;   // bytes / effective bandwidth
  bool compute_bound = false;  // compute_seconds > memory_seconds
};

// Whether `op` runs on Tensor Cores (GEMM-like forward, backward or recompute).
bool RunsOnTensorCores(const Op& op);

OpCost EstimateOpTime(const Op& op, const GpuSpec& gpu, const CostModelOptions& options = {});

struct StepTime {
  double seconds = 0;
  std::map<Phase, double> seconds_by_phase;
  double recompute_seconds = 0;  // ops with Op::recompute (part of kBackward)
};
StepTime EstimateStepTimeBreakdown(const Graph& step, const GpuSpec& gpu,
                                   const CostModelOptions& options = {});
double EstimateStepTime(const Graph& step, const GpuSpec& gpu, const CostModelOptions& options = {});

// Time spent replaying forward ops (checkpointing) in `step`: the time price
// of a checkpoint mode is RecomputeSeconds of the step built with it.
double RecomputeSeconds(const Graph& step, const GpuSpec& gpu, const CostModelOptions& options = {});

// Time to copy `to_host` bytes to host memory and `to_device` bytes back over
// the GPU's host link, one direction after the other at the link's
// one-direction bandwidth (catalog host_link) times host_link_efficiency,
// without overlap with compute: the upper bound of offloading's price.
double OffloadSeconds(uint64_t to_host, uint64_t to_device, const GpuSpec& gpu,
                      const CostModelOptions& options = {});

}  // namespace headroom

#endif  // HEADROOM_HARDWARE_COST_MODEL_H_
