#include "estimators/fit_search.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "estimators/estimate_stages.h"
#include "hardware/cost_model.h"

namespace headroom {
namespace {

constexpr int64_t kMaxMicroBatchSearched = 1024;
constexpr int64_t kSeqStep = 64;

// One probe of a limit search: whether the job fits, and the bytes it needs when the estimate has a figure to
// steer by (none past the size bounds or where the allocator ran out of memory).
struct Probe {
  bool fits = false;
  std::optional<double> bytes;
};

absl::StatusOr<Probe> Measure(const LoadedModel& model, const JobSpec& job, const Machine& machine) {
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(model, job, machine);
  if (!e.ok()) {
    // A probe beyond the size bounds (graph/graph.h, Note [Size bounds];
    // OutOfRange) does not fit any GPU. Any other error is a probe the search
    // should not have made, and surfaces.
    if (e.status().code() == absl::StatusCode::kOutOfRange) return Probe{};
    return e.status();
  }
  if (e->allocator_out_of_memory) return Probe{};
  return Probe{.fits = e->fits(), .bytes = static_cast<double>(e->total_bytes())};
}

// The largest value in [lo, hi] that fits: hi itself, or the largest multiple of `step` below it (Note [Fit
// search]); nullopt when lo does not fit. The bool says the search stopped at hi.
template <typename MeasureFn>
absl::StatusOr<std::optional<std::pair<int64_t, bool>>> Largest(int64_t lo, int64_t hi, int64_t step,
                                                                double capacity, MeasureFn measure) {
  HEADROOM_ASSIGN_OR_RETURN(Probe first, measure(lo));
  if (!first.fits) return std::nullopt;
  if (hi <= lo) return std::pair{lo, true};
  HEADROOM_ASSIGN_OR_RETURN(Probe top, measure(hi));
  if (top.fits) return std::pair{hi, true};
  // good fits, bad does not; their bytes steer the next probe where both have them.
  int64_t good = lo, bad = hi;
  std::optional<double> good_bytes = first.bytes, bad_bytes = top.bytes;
  const auto floor_to_step = [&](int64_t v) { return v / step * step; };
  bool bisect = false;
  while (floor_to_step(bad - 1) > good) {
    const int64_t first_candidate = floor_to_step(good) + step, last_candidate = floor_to_step(bad - 1);
    int64_t v = good + (bad - good) / 2;
    if (!bisect && good_bytes && bad_bytes && *bad_bytes > *good_bytes) {
      // Bytes grow about linearly with the micro-batch and the sequence: aim at where the line crosses the
      // capacity, as the largest value below it.
      const double crossing = static_cast<double>(good) + (capacity - *good_bytes) / (*bad_bytes - *good_bytes) *
                                                             static_cast<double>(bad - good);
      v = static_cast<int64_t>(std::min(crossing, static_cast<double>(bad)));
    }
    v = std::clamp(floor_to_step(v), first_candidate, last_candidate);
    const int64_t width = bad - good;
    HEADROOM_ASSIGN_OR_RETURN(Probe p, measure(v));
    if (p.fits) {
      good = v;
      good_bytes = p.bytes;
    } else {
      bad = v;
      bad_bytes = p.bytes;
    }
    // A line that aimed badly (the interval kept more than half its width) is followed by a halving, so the
    // search never takes more than twice bisection's probes.
    bisect = !bisect && 2 * (bad - good) > width;
  }
  return std::pair{good, false};
}

int64_t SamplesPerStep(const JobSpec& job) {
  return job.micro_batch * job.grad_accum * job.layout.data_parallel();
}

// Bytes an offloading setup moves over the host link per step and GPU.
double OffloadTime(const JobSpec& job, const MemoryEstimate& e, const GpuSpec& gpu) {
  const bool offload_states = job.layout.offload_optimizer || job.layout.offload_params;
  const bool ema_on_host = job.ema == EmaPlacement::kCpu;
  if (!offload_states && !ema_on_host) return 0;
  const uint64_t p16 = e.parameters * 2 / static_cast<uint64_t>(std::max(1, job.layout.data_parallel()));
  // 16-bit gradients out, updated 16-bit parameters back; offloaded
  // parameters are also fetched for forward and backward.
  uint64_t to_host = offload_states ? p16 : 0;
  const uint64_t to_device = offload_states ? p16 + (job.layout.offload_params ? 2 * p16 : 0) : 0;
  // An EMA in host memory reads the updated weights each step: 16-bit ones
  // when the optimizer runs on the host too (it has them there already).
  if (ema_on_host && !job.layout.offload_optimizer) to_host += e.trainable_parameters * 2;
  return OffloadSeconds(to_host, to_device, gpu);
}


// Note [Fix applicability]
// Each candidate fix comes from a generator that first says whether it
// applies to the job, and why not when it does not (checkpointing that is
// already on, LoRA on a model that is not a transformer, ZeRO without data
// parallelism, ...). A candidate that applies is estimated, and any error
// from that estimate is returned: the generator promised a valid job, so an
// error is a bug to surface, not a fix to skip silently. Each candidate's
// `job` is the whole changed job: the command line derives the flags that
// select the fix from it (cli/job_flags.h, FlagsForChange).
struct Applicability {
  bool applies = true;
  std::string reason;  // why not, when it does not apply
};

Applicability Applies() { return {}; }
Applicability DoesNotApply(std::string reason) { return {.applies = false, .reason = std::move(reason)}; }

bool IsTransformer(const LoadedModel& model) {
  return model.config &&
         (model.config->family == ModelFamily::kDecoder || model.config->family == ModelFamily::kEncoder ||
          model.config->family == ModelFamily::kEncoderDecoder);
}

// Transformers and the vision transformers (ViT, CLIP, SigLIP, LLaVA's tower), which have attention and Linears to
// adapt but no tensor-parallel builder.
bool HasAttention(const LoadedModel& model) {
  return IsTransformer(model) || (model.config && (model.config->family == ModelFamily::kVision ||
                                                   model.config->family == ModelFamily::kContrastive ||
                                                   model.config->family == ModelFamily::kVisionLanguage));
}

Fix Candidate(std::string change, FixKind kind, JobSpec job, std::string note = "") {
  return {.change = std::move(change), .kind = kind, .job = std::move(job),
          .note = std::move(note)};
}

// A sharding change replaces the layout's sharding (and DeepSpeed's stage 0).
// torch.distributed has ZeRO stage 1 (ZeroRedundancyOptimizer) and FSDP for the rest (ParallelLayout::
// torch_parallel): a ZeRO-2 or ZeRO-3 fix is FSDP's full sharding there.
JobSpec WithSharding(JobSpec job, Sharding sharding) {
  if (job.layout.torch_parallel && (sharding == Sharding::kZero2 || sharding == Sharding::kZero3)) {
    sharding = Sharding::kFsdpFull;
  }
  job.layout.sharding = sharding;
  job.layout.deepspeed_stage0 = false;
  return job;
}

struct FixGenerator {
  std::string_view name;
  Applicability (*applies)(const LoadedModel& model, const JobSpec& job);
  std::vector<Fix> (*make)(const JobSpec& job);
};

Applicability HalfBatchApplies(const LoadedModel&, const JobSpec& job) {
  return job.micro_batch > 1 ? Applies() : DoesNotApply("the batch is already 1");
}
std::vector<Fix> HalfBatch(const JobSpec& job) {
  JobSpec j = job;
  j.micro_batch = std::max<int64_t>(1, job.micro_batch / 2);
  return {Candidate(absl::StrFormat("batch %d instead of %d", j.micro_batch, job.micro_batch), FixKind::kExact,
                    j)};
}

Applicability Fp8KvCacheApplies(const LoadedModel&, const JobSpec& job) {
  return job.context > 0 ? Applies() : DoesNotApply("no KV cache (--context 0)");
}
std::vector<Fix> Fp8KvCache(const JobSpec& job) {
  JobSpec j = job;
  j.kv_dtype = DType::kF8E4M3;
  return {Candidate("fp8 KV cache", FixKind::kApproximate, j)};
}

Applicability SelectiveApplies(const LoadedModel&, const JobSpec& job) {
  if (job.attention != AttentionImpl::kEager) return DoesNotApply("flash attention keeps no attention core to drop");
  if (job.checkpoint != CheckpointMode::kOff) return DoesNotApply("checkpointing is already on");
  return Applies();
}
std::vector<Fix> Selective(const JobSpec& job) {
  JobSpec j = job;
  j.checkpoint = CheckpointMode::kSelective;
  return {Candidate("selective activation recomputation (attention core)", FixKind::kExact, j)};
}

Applicability FlashApplies(const LoadedModel& model, const JobSpec& job) {
  if (job.attention != AttentionImpl::kEager) return DoesNotApply("flash attention is already on");
  if (!HasAttention(model)) return DoesNotApply("the model has no attention");
  if (!HasFlashAttentionPath(*model.config)) return DoesNotApply("the model has no flash attention path");
  return Applies();
}
std::vector<Fix> Flash(const JobSpec& job) {
  JobSpec j = job;
  j.attention = AttentionImpl::kFlash;
  return {Candidate("flash attention (SDPA)", FixKind::kExact, j)};
}

Applicability FullCheckpointApplies(const LoadedModel&, const JobSpec& job) {
  return job.checkpoint != CheckpointMode::kFull ? Applies() : DoesNotApply("full checkpointing is already on");
}
std::vector<Fix> FullCheckpoint(const JobSpec& job) {
  JobSpec j = job;
  j.checkpoint = CheckpointMode::kFull;
  return {Candidate("full activation checkpointing (every layer)", FixKind::kExact, j)};
}

Applicability AccumulateApplies(const LoadedModel&, const JobSpec& job) {
  return job.micro_batch > 1 ? Applies() : DoesNotApply("the micro-batch is already 1");
}
std::vector<Fix> Accumulate(const JobSpec& job) {
  JobSpec j = job;
  j.micro_batch = 1;
  j.grad_accum = job.grad_accum * job.micro_batch;
  return {Candidate(absl::StrFormat("micro-batch 1 with gradient accumulation %d (same global batch)", j.grad_accum),
                    FixKind::kExact, j)};
}

Applicability Adam8bitApplies(const LoadedModel&, const JobSpec& job) {
  return job.optimizer == Optimizer::kAdamW ? Applies() : DoesNotApply("the optimizer is not AdamW");
}
std::vector<Fix> Adam8bit(const JobSpec& job) {
  JobSpec j = job;
  j.optimizer = Optimizer::kAdam8bit;
  return {Candidate("8-bit AdamW (bitsandbytes)", FixKind::kApproximate, j)};
}

Applicability ShardingApplies(const LoadedModel&, const JobSpec& job) {
  return job.layout.data_parallel() > 1 ? Applies() : DoesNotApply("no data parallelism to shard over");
}
// The ZeRO stages and FSDP beyond the current sharding; offload is dropped
// (each sharding alone).
std::vector<Fix> Shardings(const JobSpec& job) {
  const ParallelLayout& layout = job.layout;
  const bool sharded = layout.sharding != Sharding::kReplicated;
  std::vector<Fix> out;
  for (Sharding s : {Sharding::kZero1, Sharding::kZero2, Sharding::kZero3, Sharding::kFsdpFull}) {
    if (static_cast<int>(s) <= static_cast<int>(layout.sharding) && sharded) continue;
    JobSpec j = WithSharding(job, s);
    if (j.layout.sharding != s) continue;  // FSDP's own candidate comes last
    j.layout.offload_optimizer = j.layout.offload_params = false;
    const std::string name = IsFsdp(s)                ? "FSDP full sharding"
                             : layout.torch_parallel ? "ZeroRedundancyOptimizer (ZeRO-1)"
                                                      : absl::StrFormat("DeepSpeed ZeRO-%d", static_cast<int>(s));
    out.push_back(Candidate(name, FixKind::kExact, j));
  }
  return out;
}

Applicability OffloadOptimizerApplies(const LoadedModel&, const JobSpec& job) {
  return !job.layout.offload_optimizer ? Applies() : DoesNotApply("the optimizer is already offloaded");
}
std::vector<Fix> OffloadOptimizer(const JobSpec& job) {
  const bool keep_sharding = IsFsdp(job.layout.sharding) || job.layout.sharding == Sharding::kZero3;
  JobSpec j = keep_sharding ? job : WithSharding(job, Sharding::kZero2);
  j.layout.offload_optimizer = true;
  return {Candidate(absl::StrFormat("optimizer state offloaded to CPU (%s)",
                                    IsFsdp(j.layout.sharding) ? "FSDP CPUOffload" : "DeepSpeed ZeRO-Offload"),
                    FixKind::kExact, j, "CPU Adam time not included")};
}

Applicability OffloadAllApplies(const LoadedModel&, const JobSpec& job) {
  return !job.layout.offload_params ? Applies() : DoesNotApply("the parameters are already offloaded");
}
std::vector<Fix> OffloadAll(const JobSpec& job) {
  JobSpec j = IsFsdp(job.layout.sharding) ? job : WithSharding(job, Sharding::kZero3);
  j.layout.offload_optimizer = j.layout.offload_params = true;
  return {Candidate(IsFsdp(j.layout.sharding) ? "parameters and optimizer offloaded to CPU (FSDP CPUOffload)"
                                               : "parameters and optimizer offloaded to CPU (ZeRO-3 Offload)",
                    FixKind::kExact, j,
                    "CPU Adam time not included")};
}

Applicability EmaToHostApplies(const LoadedModel&, const JobSpec& job) {
  return job.ema == EmaPlacement::kGpu ? Applies() : DoesNotApply("no EMA copy on the GPU");
}
std::vector<Fix> EmaToHost(const JobSpec& job) {
  JobSpec j = job;
  j.ema = EmaPlacement::kCpu;
  return {Candidate("EMA copy of the weights in host memory", FixKind::kExact, j,
                    "CPU update of the average not included")};
}

Applicability LoraApplies(const LoadedModel& model, const JobSpec& job) {
  if (job.lora.enabled()) return DoesNotApply("LoRA is already on");
  // The builders put adapters on transformer Linears only (models/builders.h).
  if (!HasAttention(model)) return DoesNotApply("LoRA adapters are built for transformers only");
  return Applies();
}
std::vector<Fix> Lora(const JobSpec& job) {
  JobSpec j = job;
  j.lora.rank = 16;
  j.lora.alpha = 32;  // the CLI's default, 2 x rank
  JobSpec q = j;
  q.lora.quantize_base_nf4 = true;
  return {Candidate("LoRA rank 16 on the attention query/value projections", FixKind::kDifferentJob, j,
                    "trains adapters, not the full model"),
          Candidate("QLoRA: rank-16 LoRA over NF4 base weights", FixKind::kDifferentJob, q,
                    "trains adapters over a 4-bit base")};
}

// In the order they were always listed; ranking sorts them afterwards.
constexpr FixGenerator kInferenceFixes[] = {
    {"half batch", HalfBatchApplies, HalfBatch},
    {"fp8 KV cache", Fp8KvCacheApplies, Fp8KvCache},
};
constexpr FixGenerator kTrainingFixes[] = {
    {"selective checkpointing", SelectiveApplies, Selective},
    {"flash attention", FlashApplies, Flash},
    {"full checkpointing", FullCheckpointApplies, FullCheckpoint},
    {"gradient accumulation", AccumulateApplies, Accumulate},
    {"8-bit AdamW", Adam8bitApplies, Adam8bit},
    {"ZeRO/FSDP sharding", ShardingApplies, Shardings},
    {"optimizer offload", OffloadOptimizerApplies, OffloadOptimizer},
    {"parameter offload", OffloadAllApplies, OffloadAll},
    {"EMA in host memory", EmaToHostApplies, EmaToHost},
    {"LoRA/QLoRA", LoraApplies, Lora},
};

// Whether `job` (with more GPUs) is a layout the model can take: the
// layout's own rules, the model's divisibility by tensor parallelism and
// CheckJobAgainstModel. The reason names what does not divide.
Applicability LayoutApplies(const LoadedModel& model, const JobSpec& job) {
  if (absl::Status valid = job.layout.Validate(); !valid.ok()) return DoesNotApply(std::string(valid.message()));
  const int t = job.layout.tensor_parallel;
  if (t > 1) {
    if (!IsTransformer(model)) return DoesNotApply("tensor parallelism needs a transformer");
    const ModelConfig& c = *model.config;
    for (const auto& [value, field] : {std::pair{c.num_heads, "num_attention_heads"},
                                       {c.num_kv_heads, "num_key_value_heads"},
                                       {c.intermediate_size, "intermediate_size"}}) {
      if (value % t != 0) return DoesNotApply(absl::StrFormat("tensor_parallel %d does not divide %s (%d)", t, field, value));
    }
    const int64_t seq = ResolveSeqLen(model, job);
    if (job.layout.sequence_parallel && seq % t != 0) {
      return DoesNotApply(absl::StrFormat("tensor_parallel %d does not divide seq_len %d (sequence parallel)", t, seq));
    }
  }
  if (absl::Status fits_model = CheckJobAgainstModel(model, job); !fits_model.ok()) {
    return DoesNotApply(std::string(fits_model.message()));
  }
  return Applies();
}

// More GPUs: the fewest that fit with FSDP full sharding (or more tensor
// parallel ranks for inference), doubling up to 1024, while the layout
// applies to the model.
absl::StatusOr<std::optional<Fix>> FewestMoreGpusThatFit(const LoadedModel& model, const JobSpec& job,
                                                          const Machine& machine) {
  const ParallelLayout& layout = job.layout;
  for (int gpus = layout.gpus * 2; gpus <= 1024; gpus *= 2) {
    JobSpec j = job;
    j.layout.gpus = gpus;
    if (job.training) {
      if (layout.sharding == Sharding::kReplicated) j = WithSharding(j, Sharding::kFsdpFull);
    } else {
      j.layout.tensor_parallel = layout.tensor_parallel * gpus / layout.gpus;
    }
    // More GPUs only add ranks: once the layout stops applying (heads no
    // longer divide), larger counts do not apply either.
    if (!LayoutApplies(model, j).applies) return std::nullopt;
    HEADROOM_ASSIGN_OR_RETURN(MemoryEstimate e, EstimateMemory(model, j, machine));
    if (!e.fits()) continue;
    return Fix{.change = absl::StrFormat("%d GPUs instead of %d", gpus, layout.gpus),
               .kind = FixKind::kMoreGpus,
               .job = j,
               .estimate = std::move(e),
               .note = "interconnect time not included"};
  }
  return std::nullopt;
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
  if (!model.config) {
    // A graph file is one batch and one sequence length: --micro-batch and --seq do not reshape it.
    out.fixed_shape = true;
    return out;
  }
  const double capacity = static_cast<double>(machine.capacity());
  HEADROOM_ASSIGN_OR_RETURN(auto batch, Largest(1, kMaxMicroBatchSearched, 1, capacity, [&](int64_t b) {
                              JobSpec j = job;
                              j.micro_batch = b;
                              return Measure(model, j, machine);
                            }));
  if (batch) std::tie(out.max_micro_batch, out.micro_batch_capped) = *batch;

  const int64_t seq = ResolveSeqLen(model, job);
  // A vision transformer's sequence is fixed by its image; a two-tower model's is its text tower's.
  out.has_sequence = seq > 0 && model.config->family != ModelFamily::kVision;
  if (!out.has_sequence) return out;
  const ModelConfig& text = model.config->family == ModelFamily::kContrastive ||
                                    model.config->family == ModelFamily::kVisionLanguage
                                ? model.config->text_tower()
                                : *model.config;
  const int64_t max_pos = text.max_position_embeddings > 0 ? text.max_position_embeddings : 131072;
  // Sequence parallelism splits the sequence over the tensor-parallel ranks:
  // probe only lengths they divide.
  const int64_t t = job.layout.sequence_parallel ? job.layout.tensor_parallel : 1;
  const int64_t seq_step = std::lcm(kSeqStep, t);
  const int64_t longest_probed = t > 1 ? max_pos / seq_step * seq_step : max_pos;
  // LLaVA's sequence holds its images' tokens (Note [LLaVA] in models/builders/vision.cc): shorter ones are no job.
  const int64_t image_tokens = model.config->family == ModelFamily::kVisionLanguage
                                   ? job.images * model.config->image_feature_tokens()
                                   : 0;
  const int64_t shortest = std::max<int64_t>(seq_step, (image_tokens + seq_step - 1) / seq_step * seq_step);
  if (longest_probed < 1 || longest_probed < image_tokens) return out;
  // Whisper's sequence is its decoder's tokens, however the job named them (Note [Whisper] in
  // models/builders/encoder_decoder.cc).
  const bool whisper = model.config->model_type == "whisper";
  HEADROOM_ASSIGN_OR_RETURN(auto longest, Largest(std::min<int64_t>(shortest, longest_probed), longest_probed,
                                                  seq_step, capacity, [&](int64_t s) {
                                                    JobSpec j = job;
                                                    j.seq_len = s;
                                                    if (whisper) j.target_seq_len = 0;
                                                    return Measure(model, j, machine);
                                                  }));
  if (!longest) return out;
  std::tie(out.max_seq_len, out.seq_len_capped) = *longest;
  return out;
}

absl::StatusOr<std::vector<Fix>> RankFixes(const LoadedModel& model, const JobSpec& job,
                                           const Machine& machine, const MemoryEstimate& base) {
  std::vector<Fix> fits;
  for (const FixGenerator& generator : job.training ? std::span<const FixGenerator>(kTrainingFixes)
                                                                    : std::span<const FixGenerator>(kInferenceFixes)) {
    // Note [Fix applicability]: a generator that does not apply is skipped
    // for its stated reason; an error estimating one that does is a bug.
    if (!generator.applies(model, job).applies) continue;
    for (Fix& fix : generator.make(job)) {
      HEADROOM_ASSIGN_OR_RETURN(MemoryEstimate e, EstimateMemory(model, fix.job, machine));
      if (!e.fits()) continue;
      fix.estimate = std::move(e);
      fits.push_back(std::move(fix));
    }
  }
  HEADROOM_ASSIGN_OR_RETURN(std::optional<Fix> more_gpus, FewestMoreGpusThatFit(model, job, machine));
  if (more_gpus) fits.push_back(*std::move(more_gpus));

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
