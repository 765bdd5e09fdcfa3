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
// The step's own temporaries, read from torch.optim (2.x and 1.13) and
// checked against measured steps (validation/):
//  - the single-tensor loop (AdamW foreach=False, and transformers' old AdamW)
//    computes `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`
//    per parameter: sqrt(v) and its quotient coexist, two state-sized
//    temporaries (two blocks) of the largest parameter;
//  - the multi-tensor ("foreach") AdamW, the CUDA default since PyTorch 2.0,
//    computes torch._foreach_sqrt over the whole parameter group: one
//    state-sized copy of the trainable parameters (two before 2.0, Note
//    [Runtime differences] in graph/torch_runtime.h);
//  - transformers' Adafactor builds `grad**2 + eps` and then the factored
//    second-moment estimate while the first is referenced: two of the largest
//    parameter, in fp32; lion-pytorch's `exp_avg.clone().mul_(b1).add(...)`
//    likewise two;
//  - SGD (with or without momentum) updates in place; fused kernels
//    (fused=True, DeepSpeed FusedAdam, apex) allocate nothing.
// 8-bit optimizers are charged like AdamW on their state dtype. The step's
// peak is the larger of the forward/backward peak and the optimizer step
// (all gradients live plus these temporaries, plus what the training loop
// holds).
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
