#include "estimators/fit_search.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "hardware/cost_model.h"

namespace headroom {
namespace {

constexpr int64_t kMaxMicroBatchSearched = 1024;
constexpr int64_t kSeqStep = 64;

absl::StatusOr<bool> Fits(const LoadedModel& model, const JobSpec& job, const Machine& machine) {
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(model, job, machine);
  if (!e.ok()) {
    // A size the builder rejects (beyond max_position_embeddings) does not fit.
    if (e.status().code() == absl::StatusCode::kInvalidArgument) return false;
    return e.status();
  }
  return e->fits();
}

// Largest value in [lo, hi] for which fits(value) holds, given fits(lo);
// doubling then bisection (Note [Fit search]). `step` is the granularity.
template <typename FitsFn>
absl::StatusOr<std::pair<int64_t, bool>> Largest(int64_t lo, int64_t hi, int64_t step, FitsFn fits) {
  int64_t good = lo;
  int64_t bad = 0;
  for (int64_t v = lo * 2; v <= hi; v *= 2) {
    HEADROOM_ASSIGN_OR_RETURN(bool ok, fits(v));
    if (!ok) {
      bad = v;
      break;
    }
    good = v;
  }
  if (bad == 0) {
    if (good == hi) return std::pair{good, true};
    HEADROOM_ASSIGN_OR_RETURN(bool ok, fits(hi));
    if (ok) return std::pair{hi, true};
    bad = hi;
  }
  while (bad - good > step) {
    const int64_t mid = (good + (bad - good) / 2) / step * step;
    if (mid <= good) break;
    HEADROOM_ASSIGN_OR_RETURN(bool ok, fits(mid));
    (ok ? good : bad) = mid;
  }
  return std::pair{good, false};
}

int64_t SamplesPerStep(const JobSpec& job) {
  return job.micro_batch * job.grad_accum * job.layout.data_parallel();
}

// Bytes an offloading setup moves over the host link per step and GPU.
double OffloadTime(const JobSpec& job, const MemoryEstimate& e, const GpuSpec& gpu) {
  if (!job.layout.offload_optimizer && !job.layout.offload_params) return 0;
  const uint64_t p16 = e.parameters * 2 / static_cast<uint64_t>(std::max(1, job.layout.data_parallel()));
  // 16-bit gradients out, updated 16-bit parameters back; offloaded
  // parameters are also fetched for forward and backward.
  const uint64_t to_host = p16;
  const uint64_t to_device = p16 + (job.layout.offload_params ? 2 * p16 : 0);
  return OffloadSeconds(to_host, to_device, gpu);
}

}  // namespace

std::string_view FixKindName(FixKind kind) {
  switch (kind) {
    case FixKind::kExact: return "exact";
    case FixKind::kApproximate: return "approximate";
    case FixKind::kDifferentJob: return "different job";
    case FixKind::kMoreGpus: return "more GPUs";
  }
  return "exact";
}

absl::StatusOr<FitLimits> FindLimits(const LoadedModel& model, const JobSpec& job,
                                     const Machine& machine) {
  FitLimits out;
  JobSpec probe = job;
  probe.micro_batch = 1;
  HEADROOM_ASSIGN_OR_RETURN(bool one_fits, Fits(model, probe, machine));
  if (one_fits) {
    HEADROOM_ASSIGN_OR_RETURN(auto batch, Largest(1, kMaxMicroBatchSearched, 1, [&](int64_t b) {
                                JobSpec j = job;
                                j.micro_batch = b;
                                return Fits(model, j, machine);
                              }));
    out.max_micro_batch = batch.first;
    out.micro_batch_capped = batch.second;
  }

  const int64_t seq = ResolveSeqLen(model, job);
  out.has_sequence = seq > 0;
  if (!out.has_sequence || !model.config) return out;
  const int64_t max_pos = model.config->max_position_embeddings > 0
                              ? model.config->max_position_embeddings
                              : 131072;
  probe = job;
  probe.seq_len = std::min<int64_t>(kSeqStep, max_pos);
  HEADROOM_ASSIGN_OR_RETURN(bool short_fits, Fits(model, probe, machine));
  if (!short_fits) return out;
  HEADROOM_ASSIGN_OR_RETURN(auto longest, Largest(probe.seq_len, max_pos, kSeqStep, [&](int64_t s) {
                              JobSpec j = job;
                              j.seq_len = s;
                              return Fits(model, j, machine);
                            }));
  out.max_seq_len = longest.first;
  out.seq_len_capped = longest.second;
  return out;
}

absl::StatusOr<std::vector<Fix>> RankFixes(const LoadedModel& model, const JobSpec& job,
                                           const Machine& machine, const MemoryEstimate& base) {
  std::vector<Fix> candidates;
  auto add = [&](std::string change, std::string flags, FixKind kind, JobSpec changed, std::string note = "") {
    candidates.push_back({.change = std::move(change), .flags = std::move(flags), .kind = kind,
                          .job = std::move(changed), .note = std::move(note)});
  };
  const ParallelLayout& layout = job.layout;
  if (!job.training) {
    // Inference: fewer concurrent sequences, a quantized cache, more GPUs (TP).
    if (job.micro_batch > 1) {
      JobSpec j = job;
      j.micro_batch = std::max<int64_t>(1, job.micro_batch / 2);
      add(absl::StrFormat("batch %d instead of %d", j.micro_batch, job.micro_batch),
          absl::StrFormat("--micro-batch %d", j.micro_batch), FixKind::kExact, j);
    }
    if (job.context > 0) {
      JobSpec j = job;
      j.kv_dtype = DType::kF8E4M3;
      add("fp8 KV cache", "--kv-dtype fp8", FixKind::kApproximate, j);
    }
  } else {
    if (job.attention == AttentionImpl::kEager && job.checkpoint == CheckpointMode::kOff) {
      JobSpec j = job;
      j.checkpoint = CheckpointMode::kSelective;
      add("selective activation recomputation (attention core)", "--checkpoint selective",
          FixKind::kExact, j);
    }
    if (job.attention == AttentionImpl::kEager && model.config &&
        model.config->family != ModelFamily::kCnn && model.config->family != ModelFamily::kMlp) {
      JobSpec j = job;
      j.attention = AttentionImpl::kFlash;
      add("flash attention (SDPA)", "--attention flash", FixKind::kExact, j);
    }
    if (job.checkpoint != CheckpointMode::kFull) {
      JobSpec j = job;
      j.checkpoint = CheckpointMode::kFull;
      add("full activation checkpointing (every layer)", "--checkpoint full", FixKind::kExact, j);
    }
    if (job.micro_batch > 1) {
      JobSpec j = job;
      j.micro_batch = 1;
      j.grad_accum = job.grad_accum * job.micro_batch;
      add(absl::StrFormat("micro-batch 1 with gradient accumulation %d (same global batch)", j.grad_accum),
          absl::StrFormat("--micro-batch 1 --grad-accum %d", j.grad_accum), FixKind::kExact, j);
    }
    if (job.optimizer == Optimizer::kAdamW) {
      JobSpec j = job;
      j.optimizer = Optimizer::kAdam8bit;
      add("8-bit AdamW (bitsandbytes)", "--optimizer adam8bit", FixKind::kApproximate, j);
    }
    const bool sharded = layout.sharding != Sharding::kReplicated;
    if (layout.data_parallel() > 1) {
      for (Sharding s : {Sharding::kZero1, Sharding::kZero2, Sharding::kZero3, Sharding::kFsdpFull}) {
        if (static_cast<int>(s) <= static_cast<int>(layout.sharding) && sharded) continue;
        JobSpec j = job;
        j.layout.sharding = s;
        j.layout.offload_optimizer = j.layout.offload_params = false;
        const std::string flag = IsFsdp(s) ? "--fsdp full" : absl::StrFormat("--zero %d", static_cast<int>(s));
        add(IsFsdp(s) ? "FSDP full sharding" : absl::StrFormat("DeepSpeed ZeRO-%d", static_cast<int>(s)),
            flag, FixKind::kExact, j);
      }
    }
    if (!layout.offload_optimizer) {
      JobSpec j = job;
      if (!IsFsdp(layout.sharding) && layout.sharding != Sharding::kZero3) j.layout.sharding = Sharding::kZero2;
      j.layout.offload_optimizer = true;
      add(absl::StrFormat("optimizer state offloaded to CPU (%s)",
                          IsFsdp(j.layout.sharding) ? "FSDP CPUOffload" : "DeepSpeed ZeRO-Offload"),
          IsFsdp(j.layout.sharding) ? "--offload optimizer"
                                    : absl::StrFormat("--zero %d --offload optimizer",
                                                      static_cast<int>(j.layout.sharding)),
          FixKind::kExact, j, "CPU Adam time not included");
    }
    if (!layout.offload_params) {
      JobSpec j = job;
      if (!IsFsdp(layout.sharding)) j.layout.sharding = Sharding::kZero3;
      j.layout.offload_optimizer = j.layout.offload_params = true;
      add("parameters and optimizer offloaded to CPU (ZeRO-3 Offload)",
          IsFsdp(j.layout.sharding) ? "--offload all" : "--zero 3 --offload all", FixKind::kExact, j,
          "CPU Adam time not included");
    }
    if (!job.lora.enabled() && model.config && model.config->family != ModelFamily::kCnn) {
      JobSpec j = job;
      j.lora.rank = 16;
      j.lora.alpha = 32;
      add("LoRA rank 16 on the attention query/value projections", "--lora-rank 16",
          FixKind::kDifferentJob, j, "trains adapters, not the full model");
      JobSpec q = j;
      q.lora.quantize_base_nf4 = true;
      add("QLoRA: rank-16 LoRA over NF4 base weights", "--lora-rank 16 --qlora", FixKind::kDifferentJob, q,
          "trains adapters over a 4-bit base");
    }
  }

  std::vector<Fix> fits;
  for (Fix& fix : candidates) {
    absl::StatusOr<MemoryEstimate> e = EstimateMemory(model, fix.job, machine);
    if (!e.ok()) {
      if (e.status().code() == absl::StatusCode::kInvalidArgument) continue;  // not applicable here
      return e.status();
    }
    if (!e->fits()) continue;
    fix.estimate = *std::move(e);
    fits.push_back(std::move(fix));
  }

  // More GPUs: the fewest that fit with FSDP full sharding (or more tensor
  // parallel ranks for inference), up to 1024.
  for (int gpus = layout.gpus * 2; gpus <= 1024; gpus *= 2) {
    JobSpec j = job;
    j.layout.gpus = gpus;
    std::string flags;
    if (job.training) {
      if (layout.sharding == Sharding::kReplicated) j.layout.sharding = Sharding::kFsdpFull;
      flags = absl::StrFormat("--gpus %d%s", gpus, layout.sharding == Sharding::kReplicated ? " --fsdp full" : "");
    } else {
      j.layout.tensor_parallel = layout.tensor_parallel * gpus / layout.gpus;
      flags = absl::StrFormat("--gpus %d --tp %d", gpus, j.layout.tensor_parallel);
    }
    absl::StatusOr<MemoryEstimate> e = EstimateMemory(model, j, machine);
    if (!e.ok()) {
      if (e.status().code() == absl::StatusCode::kInvalidArgument) break;  // e.g. heads not divisible
      return e.status();
    }
    if (!e->fits()) continue;
    fits.push_back({.change = absl::StrFormat("%d GPUs instead of %d", gpus, layout.gpus),
                    .flags = flags,
                    .kind = FixKind::kMoreGpus,
                    .job = j,
                    .estimate = *std::move(e),
                    .note = "interconnect time not included"});
    break;
  }

  const double base_per_sample =
      base.step_seconds / static_cast<double>(std::max<int64_t>(1, SamplesPerStep(job)));
  for (Fix& fix : fits) {
    fix.step_seconds = fix.estimate.step_seconds;
    if (machine.gpu != nullptr) fix.step_seconds += OffloadTime(fix.job, fix.estimate, *machine.gpu);
    const double per_sample =
        fix.step_seconds / static_cast<double>(std::max<int64_t>(1, SamplesPerStep(fix.job)));
    fix.relative_time = base_per_sample > 0 ? per_sample / base_per_sample : 0;
  }
  std::stable_sort(fits.begin(), fits.end(), [](const Fix& a, const Fix& b) {
    return std::tuple(static_cast<int>(a.kind), a.relative_time, a.estimate.total_bytes()) <
           std::tuple(static_cast<int>(b.kind), b.relative_time, b.estimate.total_bytes());
  });
  return fits;
}

}  // namespace headroom
