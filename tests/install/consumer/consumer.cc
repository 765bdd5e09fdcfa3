// Uses one public entry point of each installed library; exits non-zero if
// any answer is wrong.
#include <cstdio>

#include "allocator/size_rounding.h"
#include "estimators/optimizer_state.h"
#include "hardware/gpu_catalog.h"
#include "job/checkpoint_mode.h"
#include "models/model_source.h"
#include "planner/checkpoint_sets.h"
#include "replay/allocation_trace.h"
#include "report/emit_config.h"

int main() {
  auto gpu = headroom::GpuCatalog::Builtin().Find("h100");
  if (!gpu.ok() || (*gpu)->memory_bytes != 80ull << 30) return 1;
  if (headroom::RoundSize(1, {}) != 512) return 2;
  if (headroom::OptimizerStateBytesPerParam(headroom::Optimizer::kAdamW) != 8) return 3;
  if (headroom::SqrtCheckpoints(16).size() != 4) return 4;
  if (!headroom::LoadModel("gpt2").ok()) return 5;
  if (headroom::ParseCheckpointMode("sqrt-n").value_or(headroom::CheckpointMode::kOff) !=
      headroom::CheckpointMode::kSqrtN) {
    return 6;
  }
  if (!headroom::ParseRmmLog("Thread,Time,Action,Pointer,Size,Stream\n", "consumer").ok()) return 7;
  if (!headroom::ParseConfigFormat("deepspeed").ok()) return 8;
  std::printf("consumer: %s has %llu bytes\n", (*gpu)->name.c_str(),
              static_cast<unsigned long long>((*gpu)->memory_bytes));
  return 0;
}
