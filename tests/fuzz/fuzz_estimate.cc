// The whole estimate pipeline from an arbitrary config and arbitrary flags:
// a config.json (the input after a 32-byte header) and a job and budget (the
// header). Whatever the input, an estimate either fails cleanly or keeps its
// invariants (graph/graph.h, Note [Size bounds]):
//  - the categories sum to total_bytes() without wrapping;
//  - fits() means total_bytes() <= capacity (the allocator's replay within the
//    budget runs short exactly when it is not: estimators/step_replay.h,
//    Note [Replay capacity]);
//  - one more sample per micro-batch never requests fewer bytes (what the
//    allocator reserves for them may shrink, as PyTorch's does);
//  - when it does not fit, every fix RankFixes returns fits, and RankFixes
//    itself fails only on a bug (Note [Fix applicability]).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/checked_math.h"
#include "estimators/fit_search.h"
#include "estimators/memory_estimate.h"

namespace {

using namespace headroom;

constexpr size_t kHeaderBytes = 32;

void Check(bool invariant) {
  if (!invariant) __builtin_trap();
}

// The categories sum to the total, which does not wrap.
void CheckSums(const MemoryEstimate& e) {
  uint64_t sum = 0;
  for (const BudgetRow& row : e.rows()) {
    Check(!__builtin_add_overflow(sum, row.bytes, &sum));
  }
  Check(sum == e.total_bytes());
  Check(e.fits() == (e.total_bytes() <= e.capacity));
  Check(e.allocator_out_of_memory == !e.fits());
}

template <typename T, size_t N>
T Pick(FuzzedDataProvider& in, const T (&choices)[N]) {
  return choices[in.ConsumeIntegralInRange<size_t>(0, N - 1)];
}

JobSpec FuzzedJob(FuzzedDataProvider& in) {
  JobSpec job;
  job.training = in.ConsumeBool();
  // Mostly small sizes, sometimes absurd ones (they must fail cleanly).
  const bool absurd = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  job.micro_batch = absurd ? in.ConsumeIntegralInRange<int64_t>(1, int64_t{1} << 62)
                           : in.ConsumeIntegralInRange<int64_t>(1, 16);
  job.seq_len = absurd ? in.ConsumeIntegralInRange<int64_t>(0, int64_t{1} << 62)
                       : in.ConsumeIntegralInRange<int64_t>(0, 256);
  job.grad_accum = in.ConsumeIntegralInRange<int64_t>(1, 8);
  job.precision = Pick(in, {Precision::kFp32, Precision::kBf16Mixed, Precision::kFp16Mixed, Precision::kBf16,
                            Precision::kFp8});
  job.optimizer = Pick(in, {Optimizer::kAdamW, Optimizer::kAdam8bit, Optimizer::kSgd, Optimizer::kSgdMomentum,
                            Optimizer::kAdafactor, Optimizer::kLion});
  job.optimizer_impl = Pick(in, {OptimizerImpl::kForeach, OptimizerImpl::kForLoop, OptimizerImpl::kFused});
  job.attention = in.ConsumeBool() ? AttentionImpl::kFlash : AttentionImpl::kEager;
  job.checkpoint = Pick(in, {CheckpointMode::kOff, CheckpointMode::kFull, CheckpointMode::kEveryK,
                             CheckpointMode::kSelective});
  job.checkpoint_every = in.ConsumeIntegralInRange<int>(1, 3);
  job.keep_gradients = in.ConsumeBool();
  ParallelLayout& layout = job.layout;
  layout.tensor_parallel = Pick(in, {1, 1, 2, 4});
  layout.pipeline_parallel = Pick(in, {1, 1, 2, 3});
  layout.pipeline_schedule = in.ConsumeBool() ? PipelineSchedule::kGPipe : PipelineSchedule::k1F1B;
  layout.pipeline_stage = in.ConsumeIntegralInRange<int>(-1, layout.pipeline_parallel - 1);
  layout.torch_parallel = in.ConsumeBool();
  layout.gpus = layout.tensor_parallel * layout.pipeline_parallel * Pick(in, {1, 2, 4});
  layout.sequence_parallel = layout.tensor_parallel > 1 && in.ConsumeBool();
  layout.expert_parallel = Pick(in, {1, 1, 2});
  layout.sharding = Pick(in, {Sharding::kReplicated, Sharding::kZero1, Sharding::kZero2, Sharding::kZero3,
                              Sharding::kFsdpFull});
  layout.offload_optimizer = layout.sharding != Sharding::kReplicated && in.ConsumeBool();
  layout.offload_params = layout.offload_optimizer && in.ConsumeBool();
  if (!job.training) {
    job.context = absurd ? in.ConsumeIntegralInRange<int64_t>(0, int64_t{1} << 62)
                         : in.ConsumeIntegralInRange<int64_t>(0, 4096);
    job.kv_block_size = Pick(in, {0, 16});
  }
  // Without the 512 MiB CUDA context small models' budgets leave room for fixes.
  if (in.ConsumeBool()) job.overheads.cuda_context = 0;
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    job.lora.rank = 8;
    job.lora.quantize_base_nf4 = in.ConsumeBool();
  }
  return job;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const size_t header = std::min(size, kHeaderBytes);
  FuzzedDataProvider in(data, header);
  const std::string_view text(reinterpret_cast<const char*>(data) + header, size - header);
  absl::StatusOr<ModelConfig> config = ParseHfConfig(text, "fuzz.json");
  if (!config.ok()) return 0;
  // Keep graphs small enough for the fuzzer's time budget; sizes stay free.
  if (config->num_layers > 4 || config->num_experts > 8) return 0;
  const LoadedModel model{.name = "fuzz.json", .kind = ModelSourceKind::kConfigFile, .config = *config};
  const JobSpec job = FuzzedJob(in);
  // The budget is a fraction of the job's own total (1% to 200%), so that
  // about half the jobs do not fit and RankFixes has work to do.
  const auto percent = in.ConsumeIntegralInRange<uint64_t>(1, 200);
  absl::StatusOr<MemoryEstimate> unbounded = EstimateMemory(model, job, Machine{.budget = uint64_t{1} << 62});
  if (!unbounded.ok()) return 0;
  CheckSums(*unbounded);
  const Machine machine{
      .budget = std::clamp<uint64_t>(unbounded->total_bytes() / 100 * percent, 1, uint64_t{1} << 62)};

  absl::StatusOr<MemoryEstimate> e = EstimateMemory(model, job, machine);
  Check(e.ok() && e->total_bytes() == unbounded->total_bytes());
  CheckSums(*e);

  JobSpec bigger = job;
  bigger.micro_batch += 1;
  absl::StatusOr<MemoryEstimate> more = EstimateMemory(model, bigger, machine);
  if (more.ok()) {
    CheckSums(*more);
    Check(more->requested_bytes() >= e->requested_bytes());
  }

  if (!e->fits() && job.micro_batch <= 16) {
    absl::StatusOr<std::vector<Fix>> fixes = RankFixes(model, job, machine, *e);
    Check(fixes.ok());
    for (const Fix& fix : *fixes) {
      CheckSums(fix.estimate);
      Check(fix.estimate.fits());
    }
  }
  return 0;
}
