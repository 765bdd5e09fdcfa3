#include "hardware/cost_model.h"

#include <algorithm>
#include <optional>

#include "graph/autograd.h"

namespace headroom {

MathMode MathModeFor(DType dtype, bool allow_tf32) {
  switch (dtype) {
    case DType::kF64: return MathMode::kFp64;
    case DType::kF32: return allow_tf32 ? MathMode::kTf32 : MathMode::kFp32;
    case DType::kBF16: return MathMode::kBf16;
    case DType::kF16: return MathMode::kFp16;
    case DType::kF8E4M3:
    case DType::kF8E5M2: return MathMode::kFp8;
    case DType::kI8:
    case DType::kU8: return MathMode::kInt8;
    // NF4 weights are dequantized to the 16-bit compute dtype before the GEMM.
    case DType::kNF4: return MathMode::kBf16;
    default: return MathMode::kFp32;
  }
}
namespace {

// Note [Roofline] in the header: Tensor Core rate for GEMM-like ops, the
// fp32 CUDA-core rate for the rest, fp32 when the GPU lacks the mode.
double EffectivePeakFlops(const Op& op, const GpuSpec& gpu, const CostModelOptions& options) {
  std::optional<double> peak;
  if (RunsOnTensorCores(op)) peak = gpu.PeakFlops(MathModeFor(op.compute_dtype, options.allow_tf32));
  if (!peak) peak = gpu.PeakFlops(MathMode::kFp32);
  return peak.value_or(0) * options.compute_efficiency;
}

}  // namespace

bool RunsOnTensorCores(const Op& op) {
  return op.phase != Phase::kOptimizer && (IsGemmKind(op.kind) || IsFlashAttentionKind(op.kind));
}

OpCost EstimateOpTime(const Op& op, const GpuSpec& gpu, const CostModelOptions& options) {
  OpCost cost;
  const double peak = EffectivePeakFlops(op, gpu, options);
  if (peak > 0) cost.compute_seconds = op.flops / peak;
  const double bandwidth = gpu.memory_bandwidth_bytes_per_s * options.bandwidth_efficiency;
  if (bandwidth > 0) {
    cost.memory_seconds = static_cast<double>(op.bytes_read + op.bytes_written) / bandwidth;
  }
  cost.compute_bound = cost.compute_seconds > cost.memory_seconds;
  cost.seconds = std::max(cost.compute_seconds, cost.memory_seconds) + options.launch_latency_s;
  return cost;
}

StepTime EstimateStepTimeBreakdown(const Graph& step, const GpuSpec& gpu,
                                   const CostModelOptions& options) {
  StepTime time;
  for (const Op& op : step.ops()) {
    const double seconds = EstimateOpTime(op, gpu, options).seconds;
    time.seconds += seconds;
    time.seconds_by_phase[op.phase] += seconds;
    if (op.recompute) time.recompute_seconds += seconds;
  }
  return time;
}

double EstimateStepTime(const Graph& step, const GpuSpec& gpu, const CostModelOptions& options) {
  return EstimateStepTimeBreakdown(step, gpu, options).seconds;
}

double RecomputeSeconds(const Graph& step, const GpuSpec& gpu, const CostModelOptions& options) {
  double seconds = 0;
  for (const Op& op : step.ops()) {
    if (op.recompute) seconds += EstimateOpTime(op, gpu, options).seconds;
  }
  return seconds;
}

double OffloadSeconds(uint64_t to_host, uint64_t to_device, const GpuSpec& gpu,
                      const CostModelOptions& options) {
  const double bandwidth = gpu.host_link.bandwidth_bytes_per_s * options.host_link_efficiency;
  if (bandwidth <= 0) return 0;
  return static_cast<double>(to_host) / bandwidth + static_cast<double>(to_device) / bandwidth;
}

}  // namespace headroom
