// Bytes of optimizer state that each trainable parameter carries.
//
//   OptimizerStateBytesPerParam(Optimizer::kAdamW)   -> 8  (fp32 exp_avg + exp_avg_sq)
//   OptimizerStateBytesPerParam(Optimizer::kAdam8bit) -> 2 (two 8-bit moments; block
//                                                          quantization constants are
//                                                          counted separately)
// Adafactor factors its second moment per matrix, so its state is not a
// per-parameter constant: AdafactorStateBytes() takes the matrix shape.
#ifndef HEADROOM_ESTIMATORS_OPTIMIZER_STATE_H_
#define HEADROOM_ESTIMATORS_OPTIMIZER_STATE_H_

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "job/optimizer.h"

namespace headroom {

// State bytes per trainable parameter for optimizers whose state is
// elementwise; Adafactor answers with its factored cost for a vector (4 bytes).
uint64_t OptimizerStateBytesPerParam(Optimizer optimizer);

// Adafactor without momentum keeps fp32 row and column statistics of the
// squared gradient for a matrix (rows + cols floats) and a full fp32 second
// moment for vectors (Shazeer & Stern 2018, Algorithm 4/5).
uint64_t AdafactorStateBytes(uint64_t rows, uint64_t cols);

// bitsandbytes' 8-bit optimizers quantize each state in blocks of 256 values
// with one fp32 absmax per block, and keep fp32 state for tensors under
// 4096 elements (bitsandbytes optim/optimizer.py, Optimizer2State.init_state
// and the min_8bit_size default).
inline constexpr uint64_t kAdam8bitBlock = 256;
inline constexpr uint64_t kAdam8bitMinElements = 4096;

// Optimizer state bytes for one trainable tensor of `shape` whose full-size
// states are kept in `state_dtype` (fp32 unless the setup is pure 16-bit).
// AdamW: two moments; 8-bit Adam: two uint8 moments plus block absmax;
// SGD with momentum and Lion: one moment; SGD: none; Adafactor: factored
// row/column second moments for tensors of rank >= 2 (over the last two
// dimensions, as transformers' Adafactor does), a full one for vectors.
uint64_t OptimizerStateBytes(Optimizer optimizer, std::span<const int64_t> shape,
                             DType state_dtype);

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_OPTIMIZER_STATE_H_
