// A plan read back per transformer layer: for each layer of a step, whether
// the schedule keeps its saved activations, replays its attention core
// (selective recomputation), replays the whole layer (full checkpointing) or
// sends its activations to host memory, and which fully checkpointed layers
// are replayed together. Frameworks set activation checkpointing per layer,
// so this is what report/plan_emit.h turns into their settings.
//
//   HEADROOM_ASSIGN_OR_RETURN(StackPlan stack, ClassifyStack(step, result.schedule));
//   for (const LayerPlan& l : stack.layers) l.treatment;   // kKeep, kSelective, kFull, kOffload
//   stack.segments;                                        // runs of kFull layers replayed as one
//   stack.all.kept / stack.all.total();                    // saved bytes kept on the device
//
// Note [Layer classification]
// Saved tensors are as in planner/offload.h (Note [Saved tensors]): the
// storage a forward-side op makes and an op after the forward side reads,
// directly or through a view. The schedule is simulated once, keeping for
// each storage which copy is the latest (the original, a replay, a
// prefetch); a saved tensor is
//  - kept when an entry after the forward side reads its original copy
//    (the device copy made in forward lives into backward),
//  - else offloaded when one reads a prefetched copy,
//  - else recomputed.
// Each saved tensor belongs to the layer of the op that makes it, except a
// layer's output that the next layer's forward reads (the residual stream):
// that is the next layer's input, a checkpoint boundary whose fate says how
// fully checkpointed layers group into segments (kept or offloaded: a new
// segment starts; recomputed: the layer is replayed with the one before).
// A layer is then
//  - kKeep: none of its own saved tensors is recomputed or offloaded;
//  - kSelective: only tensors the attention core makes (Op::attention_core:
//    QK^T, scale/mask, softmax, dropout on the probabilities, probs @ V) are
//    recomputed, Korthikanti et al. 2022 sec. 4.2;
//  - kFull: tensors beyond the attention core are recomputed, nothing
//    offloaded;
//  - kOffload: tensors are offloaded, nothing recomputed.
// A layer that both recomputes and offloads is kFull or kOffload by which
// frees more bytes. `exact` says whether the framework setting of that name
// frees exactly what the plan frees in the layer (a kFull layer that still
// keeps some of its own tensors, a kSelective one that replays only part of
// the core, a kOffload one that keeps some, or a mixed one are not), so the
// emitters can say where a setting departs from the plan.
#ifndef HEADROOM_REPORT_LAYER_PLAN_H_
#define HEADROOM_REPORT_LAYER_PLAN_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "planner/schedule.h"

namespace headroom {

enum class LayerTreatment : uint8_t { kKeep, kSelective, kFull, kOffload };
std::string_view LayerTreatmentName(LayerTreatment treatment);  // "keep", "selective", "full", "offload"

// Saved-tensor bytes by what the schedule does with them (Note [Layer classification]).
struct SavedBytes {
  uint64_t kept = 0;
  uint64_t recomputed = 0;
  uint64_t offloaded = 0;
  uint64_t total() const { return kept + recomputed + offloaded; }
};

// What happens to a layer's input from the layer before it.
enum class InputFate : uint8_t { kNoInput, kKept, kRecomputed, kOffloaded };

struct LayerPlan {
  int layer = 0;
  // The layer's module path, from its ops' names ("model.layers.7",
  // "transformer.h.7"); empty when the names do not give one.
  std::string module;
  LayerTreatment treatment = LayerTreatment::kKeep;
  bool exact = true;         // Note [Layer classification]
  SavedBytes own;            // saved tensors the layer's forward makes
  // The part of `own` inside its attention core: made by core ops and read
  // in forward by core ops only (the core's output feeds the output
  // projection, which saves it, so selective recomputation keeps it).
  SavedBytes core;
  InputFate input = InputFate::kNoInput;
  uint64_t input_bytes = 0;  // the saved input from the layer before
  size_t replayed_ops = 0;   // recompute entries of the layer's ops
};

// Consecutive kFull layers replayed together, keeping only the first one's input.
struct CheckpointSegment {
  int first_layer = 0;
  int num_layers = 0;
  bool input_offloaded = false;  // the kept input lives in host memory

  friend bool operator==(const CheckpointSegment&, const CheckpointSegment&) = default;
};

struct StackPlan {
  std::vector<LayerPlan> layers;             // ascending layer index
  std::vector<CheckpointSegment> segments;   // in layer order
  SavedBytes outside;  // saved tensors made outside the layers (embeddings, head, loss)
  size_t outside_replayed_ops = 0;
  SavedBytes all;      // every saved tensor of the step

  // The layer indices with `treatment`, ascending.
  std::vector<int> LayersWith(LayerTreatment treatment) const;
  // Every layer fully checkpointed on its own, exactly, and nothing else
  // replayed or offloaded: what one per-layer checkpoint switch expresses.
  bool UniformFull() const;
  // Layer indices ascending and distinct, segments exactly the runs of kFull
  // layers, byte sums consistent; the message names the layer at fault.
  absl::Status Validate() const;
};

// Classifies `schedule`, a schedule of `step` (planner/schedule.h), per
// layer. Errors: the schedule does not materialize (its message); the step
// has no layers (FailedPrecondition, "has no layers").
absl::StatusOr<StackPlan> ClassifyStack(const Graph& step, const Schedule& schedule);

// "0-5, 8, 10-11".
std::string LayerRanges(const std::vector<int>& layers);

}  // namespace headroom

#endif  // HEADROOM_REPORT_LAYER_PLAN_H_
