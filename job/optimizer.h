// Which optimizer a job trains with, and how its step runs.
//
//   absl::StatusOr<Optimizer> o = ParseOptimizer("adamw");
//   OptimizerName(Optimizer::kAdam8bit)            -> "adam8bit"
//   ParseOptimizerImpl("fused")                    -> OptimizerImpl::kFused
//
// The bytes of state each optimizer keeps are the estimators' business
// (estimators/optimizer_state.h).
#ifndef HEADROOM_JOB_OPTIMIZER_H_
#define HEADROOM_JOB_OPTIMIZER_H_

#include <string_view>

#include "absl/status/statusor.h"

namespace headroom {

enum class Optimizer { kAdamW, kAdam8bit, kSgdMomentum, kSgd, kAdafactor, kLion };

std::string_view OptimizerName(Optimizer optimizer);
// Accepts "adamw", "adam", "adam8bit" ("adamw-8bit"), "sgd-momentum", "sgd", "adafactor", "lion".
absl::StatusOr<Optimizer> ParseOptimizer(std::string_view name);

// Note [Optimizer step transients]
// torch.optim's multi-tensor ("foreach") AdamW, the CUDA default since
// PyTorch 2.0, computes sqrt(exp_avg_sq) for the whole parameter group into a
// new tensor list (torch/optim/adamw.py, _multi_tensor_adamw:
// torch._foreach_sqrt): one state-sized fp32 copy of the trainable
// parameters lives during the step. The single-tensor loop (and
// transformers' old AdamW) allocates that per parameter: the largest
// parameter's worth. Fused kernels (fused=True, DeepSpeed FusedAdam, apex)
// allocate nothing. Momentum-free optimizers and 8-bit ones are charged the
// same way on their state dtype. The step's peak is the larger of the
// forward/backward peak and the optimizer step (all gradients live plus this
// transient).
enum class OptimizerImpl { kForeach, kForLoop, kFused };
std::string_view OptimizerImplName(OptimizerImpl impl);  // "foreach", "for-loop", "fused"
// Also accepts "single-tensor" and "loop" for kForLoop.
absl::StatusOr<OptimizerImpl> ParseOptimizerImpl(std::string_view name);

// Note [EMA weights]
// An exponential moving average of the weights, updated after each
// optimizer step (torch_ema, diffusers' EMAModel, timm's ModelEmaV2), is
// counted as one more copy of the trainable parameters, as the first two
// keep it (ModelEmaV2 copies the whole state dict, frozen weights and
// buffers too, so for it this is a floor). It is kept in the precision the
// weights are trained in: fp32 under mixed precision (the masters' dtype),
// else the weight dtype. Like optimizer state it is sharded with the
// optimizer's shards under ZeRO and FSDP (each rank averages what it
// updates). It lives on the GPU, or in host memory (kCpu), where the update
// runs on the CPU from the weights copied out each step.
enum class EmaPlacement { kOff, kGpu, kCpu };
std::string_view EmaPlacementName(EmaPlacement placement);  // "none", "gpu", "cpu"
absl::StatusOr<EmaPlacement> ParseEmaPlacement(std::string_view name);

}  // namespace headroom

#endif  // HEADROOM_JOB_OPTIMIZER_H_
