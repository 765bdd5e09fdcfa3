// What fits: the largest micro-batch and the longest sequence for a job on a
// machine, and when the job does not fit, the changes that make it fit,
// ranked.
//
//   absl::StatusOr<FitLimits> limits = FindLimits(model, job, machine);
//   limits->max_micro_batch;   // 0 when not even one sample fits
//   absl::StatusOr<std::vector<Fix>> fixes = RankFixes(model, job, machine, base);
//
// Note [Fit search]
// Activation bytes grow monotonically with the micro-batch and the sequence
// length, so each limit is the end of an interval: the search estimates the
// smallest value and the cap (1024 samples, the model's
// max_position_embeddings; the limit is reported as capped when the cap
// fits), then narrows the interval. Bytes grow about linearly in both, so
// each probe aims where the line through the interval's two estimates
// crosses the capacity, and a probe that does not halve the interval is
// followed by a bisection: a near-linear job takes four or five full
// estimates, any monotone one at most twice bisection's. Sequences are
// searched in multiples of 64 tokens.
//
// Note [Ranking fixes]
// Each candidate is one change to the job (checkpointing mode, micro-batch
// with gradient accumulation, ZeRO stage, CPU offload, 8-bit optimizer,
// LoRA/QLoRA, more GPUs), estimated in full; those that fit are ranked by
// (1) how much of the job they change: "exact" changes train the same model
// the same way, "approximate" ones change numerics (8-bit optimizer
// states), "different job" ones change what is trained (LoRA, QLoRA),
// "more GPUs" ones change the hardware; then (2) by the roofline step time
// (hardware/cost_model.h) per sample relative to the original setup. Offload
// is priced by the bytes it moves over the host link each step
// (OffloadSeconds), without overlap: an upper bound. Candidates come from a
// table of generators, each of which says first whether it applies to the
// job (Note [Fix applicability] in fit_search.cc); an error estimating a
// candidate that applies is returned, never read as "does not fit".
#ifndef HEADROOM_ESTIMATORS_FIT_SEARCH_H_
#define HEADROOM_ESTIMATORS_FIT_SEARCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "estimators/memory_estimate.h"

namespace headroom {

struct FitLimits {
  int64_t max_micro_batch = 0;  // at the job's sequence length; 0: none fits
  bool micro_batch_capped = false;  // the search stopped at its cap (1024)
  int64_t max_seq_len = 0;      // at the job's micro-batch; 0: none fits or not a sequence model
  bool seq_len_capped = false;  // everything up to max_position_embeddings fits
  bool has_sequence = false;    // the model takes sequences at all
  bool fixed_shape = false;     // a graph file: its batch and sequence are its own, nothing was searched
};

absl::StatusOr<FitLimits> FindLimits(const LoadedModel& model, const JobSpec& job,
                                     const Machine& machine);

enum class FixKind { kExact, kApproximate, kDifferentJob, kMoreGpus };
std::string_view FixKindName(FixKind kind);  // "exact", "approximate", "different job", "more GPUs"

struct Fix {
  std::string change;  // "full activation checkpointing"
  FixKind kind = FixKind::kExact;
  JobSpec job;
  MemoryEstimate estimate;
  double step_seconds = 0;  // per optimizer step, with offload transfers
  // Step time per sample relative to the original setup's (1.0: same speed).
  double relative_time = 0;
  std::string note;
};

// Candidates that fit, best first (Note [Ranking fixes]). `base` is the
// estimate of `job` itself. Each Fix's `job` is the whole changed job.
// FindLimits counts a probe beyond the size bounds (OutOfRange) as not
// fitting; any other error from a probe is returned.
absl::StatusOr<std::vector<Fix>> RankFixes(const LoadedModel& model, const JobSpec& job,
                                           const Machine& machine, const MemoryEstimate& base);

}  // namespace headroom

#endif  // HEADROOM_ESTIMATORS_FIT_SEARCH_H_
