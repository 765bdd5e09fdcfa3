// Uses one public entry point of each installed library; exits non-zero if
// any answer is wrong.
#include <cstdio>

#include "allocator/size_rounding.h"
#include "estimators/optimizer_state.h"
#include "hardware/gpu_catalog.h"
#include "planner/checkpoint_sets.h"

int main() {
  auto gpu = headroom::GpuCatalog::Builtin().Find("h100");
  if (!gpu.ok() || (*gpu)->memory_bytes != 80ull << 30) return 1;
  if (headroom::RoundSize(1, {}) != 512) return 2;
  if (headroom::OptimizerStateBytesPerParam(headroom::Optimizer::kAdamW) != 8) return 3;
  if (headroom::SqrtCheckpoints(16).size() != 4) return 4;
  std::printf("consumer: %s has %llu bytes\n", (*gpu)->name.c_str(),
              static_cast<unsigned long long>((*gpu)->memory_bytes));
  return 0;
}
