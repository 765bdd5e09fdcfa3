// Numeric precision setups of a training or inference job, and the bytes
// each one keeps per parameter before any sharding.
//
//   absl::StatusOr<Precision> p = ParsePrecision("bf16-mixed");
//   PrecisionSetup setup = SetupFor(*p);
//   setup.weight_dtype   -> kBF16  (the copy the GEMMs read)
//   setup.master_weights -> true   (fp32 copy the optimizer updates)
//   setup.grad_dtype     -> kF32   (gradients accumulate in fp32)
//
// Note [Mixed precision is 18 bytes per parameter]
// With AdamW, mixed precision keeps 2 bytes of 16-bit weights, 4 of fp32
// master weights, 4 of fp32 gradients and 8 of fp32 moments: 18 bytes per
// parameter, as Megatron-LM (Korthikanti et al. 2022, Section 4; Megatron's
// theoretical_memory_usage.py) and Hugging Face's "Model training anatomy"
// count it. PyTorch AMP keeps fp32 parameters and makes the 16-bit copies on
// the fly; Megatron keeps 16-bit parameters and fp32 main_grad/master copies:
// the total is the same, the split between "weights" and "master" differs.
// DeepSpeed's ZeRO optimizer adds a 16-bit gradient buffer next to the fp32
// partition (2 + 18 bytes); see estimators/model_states.h.
//
// Pure bf16 keeps no master copy: weights, gradients and optimizer moments
// all live in bf16 (torch.optim keeps state in the parameter's dtype).
// fp8 (Transformer Engine) is bf16-mixed plus a 1-byte fp8 copy of each GEMM
// weight cached between forward and backward.
#ifndef HEADROOM_JOB_PRECISION_H_
#define HEADROOM_JOB_PRECISION_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace headroom {

enum class Precision { kFp32, kTf32, kFp16Mixed, kBf16Mixed, kBf16, kFp16, kFp8 };

std::string_view PrecisionName(Precision precision);  // "bf16-mixed", ...
// Accepts "fp32", "tf32", "fp16-mixed", "bf16-mixed", "bf16" ("pure-bf16"),
// "fp16" ("pure-fp16"), "fp8"; also "mixed-bf16"/"amp-bf16" style spellings.
absl::StatusOr<Precision> ParsePrecision(std::string_view name);

struct PrecisionSetup {
  Precision precision = Precision::kFp32;
  DType weight_dtype = DType::kF32;   // the parameters the forward pass reads
  DType compute_dtype = DType::kF32;  // activations
  bool master_weights = false;        // an fp32 copy next to 16-bit weights
  DType grad_dtype = DType::kF32;     // the gradient accumulation buffer
  DType optimizer_state_dtype = DType::kF32;
  bool allow_tf32 = false;
  uint64_t fp8_weight_cache_bytes_per_param = 0;  // Transformer Engine's fp8 weight copies
};

PrecisionSetup SetupFor(Precision precision);

}  // namespace headroom

#endif  // HEADROOM_JOB_PRECISION_H_
