#include "report/layer_plan.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/name_table.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

constexpr NameTable<LayerTreatment, 4> kTreatmentNames("layer treatment", {{
    {"keep", LayerTreatment::kKeep},
    {"selective", LayerTreatment::kSelective},
    {"full", LayerTreatment::kFull},
    {"offload", LayerTreatment::kOffload},
}});

// Which copies of a storage exist or were read, as bits.
enum CopyBits : uint8_t { kOriginalCopy = 1, kReplayCopy = 2, kPrefetchCopy = 4 };

enum class Fate : uint8_t { kKept, kRecomputed, kOffloaded };

// Note [Layer classification]: a read of the original after the forward side
// keeps it on the device, whatever else is read later.
Fate FateOf(uint8_t reads_after_forward) {
  if ((reads_after_forward & kOriginalCopy) != 0 || reads_after_forward == 0) return Fate::kKept;
  if ((reads_after_forward & kPrefetchCopy) != 0) return Fate::kOffloaded;
  return Fate::kRecomputed;
}

void Add(SavedBytes& to, Fate fate, uint64_t bytes) {
  switch (fate) {
    case Fate::kKept: to.kept += bytes; break;
    case Fate::kRecomputed: to.recomputed += bytes; break;
    case Fate::kOffloaded: to.offloaded += bytes; break;
  }
}

// "model.layers.7.mlp.up_proj" -> "model.layers.7" for layer 7; where no
// dotted component after the first is the layer's index, the path up to the
// first numbered one ("decoder.block.0" for T5's layer 4); else "".
std::string ModuleOf(std::string_view op_name, int layer) {
  const std::string index = std::to_string(layer);
  std::string first_numbered;  // a stack after another counts its layers on (T5's decoder.block.0 is layer 4)
  size_t start = 0;
  while (start < op_name.size()) {
    size_t end = op_name.find('.', start);
    if (end == std::string_view::npos) end = op_name.size();
    const std::string_view part = op_name.substr(start, end - start);
    if (start > 0 && part == index) return std::string(op_name.substr(0, end));
    const bool numbered =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (start > 0 && numbered && first_numbered.empty()) first_numbered = op_name.substr(0, end);
    start = end + 1;
  }
  return first_numbered;
}

// Note [Layer classification], given the layer's byte sums.
void ChooseTreatment(LayerPlan& l) {
  const SavedBytes& own = l.own;
  if (own.recomputed == 0 && own.offloaded == 0) {
    l.treatment = LayerTreatment::kKeep;
    l.exact = true;
  } else if (own.offloaded == 0) {
    const bool core_only = own.recomputed == l.core.recomputed;
    if (core_only && l.core.total() > 0) {
      l.treatment = LayerTreatment::kSelective;
      l.exact = l.core.kept == 0;
    } else {
      l.treatment = LayerTreatment::kFull;
      l.exact = own.kept == 0;
    }
  } else if (own.recomputed == 0) {
    l.treatment = LayerTreatment::kOffload;
    l.exact = own.kept == 0;
  } else {
    l.treatment = own.recomputed >= own.offloaded ? LayerTreatment::kFull : LayerTreatment::kOffload;
    l.exact = false;
  }
}

}  // namespace

std::string_view LayerTreatmentName(LayerTreatment treatment) { return kTreatmentNames.Name(treatment); }

std::vector<int> StackPlan::LayersWith(LayerTreatment treatment) const {
  std::vector<int> out;
  for (const LayerPlan& l : layers) {
    if (l.treatment == treatment) out.push_back(l.layer);
  }
  return out;
}

bool StackPlan::UniformFull() const {
  if (layers.empty() || segments.size() != layers.size()) return false;
  uint64_t own_recomputed = 0;
  for (const LayerPlan& l : layers) {
    if (l.treatment != LayerTreatment::kFull || !l.exact || l.input == InputFate::kOffloaded) return false;
    own_recomputed += l.own.recomputed;
  }
  return all.offloaded == 0 && all.recomputed == own_recomputed && outside_replayed_ops == 0;
}

absl::Status StackPlan::Validate() const {
  auto fail = [](int layer, std::string_view what) {
    return absl::InternalError(absl::StrFormat("stack plan: layer %d: %s", layer, std::string(what)));
  };
  uint64_t per_layer = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerPlan& l = layers[i];
    if (i > 0 && l.layer <= layers[i - 1].layer) return fail(l.layer, "layers are not ascending and distinct");
    if (l.core.kept > l.own.kept || l.core.recomputed > l.own.recomputed || l.core.offloaded > l.own.offloaded) {
      return fail(l.layer, "its attention core holds more than the layer");
    }
    per_layer += l.own.total() + l.input_bytes;
  }
  if (per_layer + outside.total() > all.total()) return fail(-1, "layers and outside hold more than the step saves");
  size_t next = 0;  // the next kFull layer a segment must start at or continue with
  std::vector<int> full = LayersWith(LayerTreatment::kFull);
  for (const CheckpointSegment& s : segments) {
    if (s.num_layers < 1) return fail(s.first_layer, "an empty segment");
    for (int k = 0; k < s.num_layers; ++k, ++next) {
      if (next >= full.size() || full[next] != s.first_layer + k) {
        return fail(s.first_layer + k, "a segment's layers are not consecutive fully checkpointed layers");
      }
    }
  }
  if (next != full.size()) return fail(full[next], "a fully checkpointed layer is in no segment");
  return absl::OkStatus();
}

absl::StatusOr<StackPlan> ClassifyStack(const Graph& step, const Schedule& schedule) {
  HEADROOM_RETURN_IF_ERROR(MaterializeSchedule(step, schedule).status());
  OpId first_later = static_cast<OpId>(step.num_ops());
  for (const Op& op : step.ops()) {
    if (!IsForwardPhase(op.phase)) {
      first_later = op.id;
      break;
    }
  }
  std::map<int, LayerPlan> by_layer;
  for (const Op& op : step.ops()) {
    if (op.id >= first_later || op.layer < 0) continue;
    LayerPlan& l = by_layer[op.layer];
    l.layer = op.layer;
    if (l.module.empty()) l.module = ModuleOf(op.name, op.layer);
  }
  if (by_layer.empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("graph %s has no layers (no forward op has a layer index)", QuoteForError(step.name())));
  }
  const int first_layer = by_layer.begin()->first;
  auto layer_made = [&step](TensorId storage) {
    const OpId p = step.producer(storage);
    return p == kNone ? -1 : step.op(p).layer;
  };

  // Saved tensors, and the ones a forward op of another layer reads: the
  // next layer's input, or another cross-layer output (Note [Layer classification]).
  const size_t n = step.num_tensors();
  std::vector<bool> saved(n, false), cross_layer(n, false), core_output(n, false);
  std::vector<int> input_of(n, kNone);
  for (const Op& op : step.ops()) {
    for (TensorId in : op.inputs) {
      const TensorId s = step.storage(in);
      const OpId p = step.producer(s);
      if (p == kNone || p >= first_later) continue;
      if (op.id >= first_later) {
        saved[static_cast<size_t>(s)] = true;
        continue;
      }
      if (step.op(p).attention_core && !op.attention_core) core_output[static_cast<size_t>(s)] = true;
      const int made = step.op(p).layer;
      if (made == op.layer) continue;
      cross_layer[static_cast<size_t>(s)] = true;
      const bool next_layer = op.layer >= 0 && (made == op.layer - 1 || (made < 0 && op.layer == first_layer));
      if (next_layer) input_of[static_cast<size_t>(s)] = op.layer;
    }
  }

  // Which copy every read after the forward side gets.
  std::vector<uint8_t> latest(n, 0), reads(n, 0);
  bool after_forward = false;
  size_t outside_replays = 0;
  for (const ScheduleEntry& e : schedule.entries) {
    if (e.action == ScheduleAction::kPrefetch) latest[static_cast<size_t>(e.target)] = kPrefetchCopy;
    if (e.action != ScheduleAction::kCompute && e.action != ScheduleAction::kRecompute) continue;
    const Op& op = step.op(e.target);
    const bool replay = e.action == ScheduleAction::kRecompute;
    if (!replay && op.id == first_later) after_forward = true;
    if (after_forward) {
      for (TensorId in : op.inputs) {
        const auto s = static_cast<size_t>(step.storage(in));
        reads[s] |= latest[s];
      }
    }
    for (TensorId out : op.outputs) {
      if (step.tensor(out).view_of == kNone) latest[static_cast<size_t>(out)] = replay ? kReplayCopy : kOriginalCopy;
    }
    if (!replay) continue;
    if (op.layer >= 0 && by_layer.contains(op.layer)) {
      ++by_layer[op.layer].replayed_ops;
    } else {
      ++outside_replays;
    }
  }

  StackPlan plan;
  plan.outside_replayed_ops = outside_replays;
  std::map<int, std::vector<Fate>> input_fates;
  for (TensorId s = 0; static_cast<size_t>(s) < n; ++s) {
    if (!saved[static_cast<size_t>(s)]) continue;
    const Fate fate = FateOf(reads[static_cast<size_t>(s)]);
    const uint64_t bytes = step.tensor(s).bytes();
    Add(plan.all, fate, bytes);
    const int made = layer_made(s);
    const int input_layer = input_of[static_cast<size_t>(s)];
    if (input_layer != kNone && by_layer.contains(input_layer)) {
      by_layer[input_layer].input_bytes += bytes;
      input_fates[input_layer].push_back(fate);
    } else if (cross_layer[static_cast<size_t>(s)]) {
      continue;  // a cross-layer output that is no layer's input: counted in `all` only
    } else if (made < 0 || !by_layer.contains(made)) {
      Add(plan.outside, fate, bytes);
    } else {
      LayerPlan& l = by_layer[made];
      Add(l.own, fate, bytes);
      if (step.op(step.producer(s)).attention_core && !core_output[static_cast<size_t>(s)]) Add(l.core, fate, bytes);
    }
  }

  for (auto& [index, l] : by_layer) {
    const std::vector<Fate>& fates = input_fates[index];
    auto any = [&fates](Fate f) { return std::find(fates.begin(), fates.end(), f) != fates.end(); };
    if (fates.empty()) {
      l.input = InputFate::kNoInput;
    } else if (any(Fate::kKept)) {
      l.input = InputFate::kKept;
    } else if (any(Fate::kOffloaded)) {
      l.input = InputFate::kOffloaded;
    } else {
      l.input = InputFate::kRecomputed;
    }
    ChooseTreatment(l);
    const bool full = l.treatment == LayerTreatment::kFull;
    const bool continues = full && !plan.layers.empty() && plan.layers.back().treatment == LayerTreatment::kFull &&
                           plan.layers.back().layer == index - 1 && l.input == InputFate::kRecomputed;
    if (continues) {
      ++plan.segments.back().num_layers;
    } else if (full) {
      plan.segments.push_back(
          {.first_layer = index, .num_layers = 1, .input_offloaded = l.input == InputFate::kOffloaded});
    }
    plan.layers.push_back(std::move(l));
  }
  HEADROOM_RETURN_IF_ERROR(plan.Validate());
  return plan;
}

std::string LayerRanges(const std::vector<int>& layers) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(layers[i]) : absl::StrCat(layers[i], "-", layers[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace headroom
