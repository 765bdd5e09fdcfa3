#include "estimators/optimizer_state.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace headroom {
uint64_t OptimizerStateBytesPerParam(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kAdamW: return 8;
    case Optimizer::kAdam8bit: return 2;
    case Optimizer::kSgdMomentum: return 4;
    case Optimizer::kSgd: return 0;
    case Optimizer::kAdafactor: return 4;
    case Optimizer::kLion: return 4;
  }
  return 0;
}

uint64_t AdafactorStateBytes(uint64_t rows, uint64_t cols) {
  if (rows <= 1 || cols <= 1) return 4 * rows * cols;
  return 4 * (rows + cols);
}

uint64_t OptimizerStateBytes(Optimizer optimizer, std::span<const int64_t> shape,
                             DType state_dtype) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  switch (optimizer) {
    case Optimizer::kAdamW: return 2 * DTypeBytes(state_dtype, n);
    case Optimizer::kAdam8bit: {
      if (n < kAdam8bitMinElements) return 2 * DTypeBytes(DType::kF32, n);
      const uint64_t blocks = (n + kAdam8bitBlock - 1) / kAdam8bitBlock;
      return 2 * n + 2 * 4 * blocks;
    }
    case Optimizer::kSgdMomentum:
    case Optimizer::kLion: return DTypeBytes(state_dtype, n);
    case Optimizer::kSgd: return 0;
    case Optimizer::kAdafactor: {
      if (shape.size() < 2) return DTypeBytes(state_dtype, n);
      const auto cols = static_cast<uint64_t>(shape.back());
      const uint64_t rows = n / std::max<uint64_t>(cols, 1);          // shape[:-1]
      const uint64_t col_stats = n / std::max<uint64_t>(static_cast<uint64_t>(shape[shape.size() - 2]), 1);  // shape[:-2] + shape[-1:]
      return DTypeBytes(state_dtype, rows) + DTypeBytes(state_dtype, col_stats);
    }
  }
  return 0;
}

}  // namespace headroom
