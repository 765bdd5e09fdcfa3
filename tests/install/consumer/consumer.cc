// Uses one public entry point of each installed library; exits non-zero if
// any answer is wrong.
#include <cstdio>

#include "allocator/caching_allocator.h"
#include "allocator/simulated/simulated_backend.h"
#include "allocator/size_rounding.h"
#include "estimators/optimizer_state.h"
#include "hardware/gpu_catalog.h"
#include "job/checkpoint_mode.h"
#include "layout/arena_layout.h"
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
  // Two blocks live at op 1 (512 B, and 1000 B rounded up to 1024 B) share no byte.
  const headroom::ArenaRequest requests[] = {{.id = 0, .first = 0, .last = 1, .bytes = 512},
                                             {.id = 1, .first = 1, .last = 2, .bytes = 1000}};
  const absl::StatusOr<headroom::ArenaLayout> arena = headroom::LayoutArena(requests);
  if (!arena.ok() || arena->arena_bytes != 1536) return 9;
  // The allocator's public header, and everything it includes, is installed.
  auto backend = headroom::SimulatedBackend::Create({.capacity_bytes = 1ull << 30});
  if (!backend.ok()) return 10;
  auto allocator = headroom::CachingAllocator::Create(backend->get(), {});
  if (!allocator.ok()) return 11;
  auto block = (*allocator)->Allocate(1000);
  if (!block.ok() || !(*allocator)->Free(*block).ok()) return 12;
  std::printf("consumer: %s has %llu bytes\n", (*gpu)->name.c_str(),
              static_cast<unsigned long long>((*gpu)->memory_bytes));
  return 0;
}
