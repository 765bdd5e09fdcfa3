#include "planner/selective_checkpoint.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

// An op whose outputs are all views of its inputs: free to replay, and
// caching one would keep its base's storage alive.
bool IsViewOp(const Graph& step, const Op& op) {
  if (op.inplace || op.outputs.empty()) return false;
  return std::all_of(op.outputs.begin(), op.outputs.end(),
                     [&step](TensorId t) { return step.tensor(t).view_of != kNone; });
}


// Decides the policy of one region (Note [Selective checkpoint semantics]);
// false when the region cannot be checkpointed or has nothing to replay.
class RegionPolicy {
 public:
  RegionPolicy(const Graph& step, const std::vector<bool>& read_after_forward, CheckpointRegion& region)
      : step_(step), read_after_forward_(read_after_forward), r_(region) {}

  bool Decide(const std::vector<bool>& wanted) {
    for (OpId o = r_.first; o <= r_.last; ++o) {
      const Op& op = step_.op(o);
      if (!op.saved.empty()) r_.last_saving = o;
      if (!op.inplace) continue;
      // A write into a storage made outside the region would be made twice.
      const TensorId storage = step_.storage(op.inputs[0]);
      if (!InRegion(step_.producer(storage))) return false;
      WriteGroup& group = groups_[storage];
      if (group.members.empty()) group.members.push_back(step_.producer(storage));
      group.members.push_back(o);
    }
    if (r_.last_saving == kNone) return false;
    for (auto& [storage, group] : groups_) group.intermediate_readers = IntermediateReaders(storage, group);
    r_.save.assign(static_cast<size_t>(r_.last - r_.first + 1), false);
    for (OpId o = r_.first; o <= r_.last_saving; ++o) {
      const Op& op = step_.op(o);
      Save(o) = !wanted[static_cast<size_t>(o)] && !IsViewOp(step_, op) && !op.outputs.empty();
    }
    // Caches that nothing reads back are replayed instead. A replay makes
    // its inputs needed, so consumers are decided before their producers
    // (backwards), and the whole is repeated until the rules above and this
    // one agree.
    for (bool changed = true; changed;) {
      changed = CloseOverWritesAndRandomness();
      std::vector<bool> needed = NeededStorages();
      for (OpId o = r_.last_saving; o >= r_.first; --o) {
        if (!Save(o)) continue;
        const Op& op = step_.op(o);
        const bool read = std::any_of(op.outputs.begin(), op.outputs.end(), [&](TensorId t) {
          return needed[static_cast<size_t>(step_.storage(t))];
        });
        if (read) continue;
        Save(o) = false;
        changed = true;
        for (TensorId in : op.inputs) needed[static_cast<size_t>(step_.storage(in))] = true;
      }
    }
    for (OpId o = r_.first; o <= r_.last_saving; ++o) r_.replayed_ops += Save(o) ? 0 : 1;
    return r_.replayed_ops > 0;
  }

 private:
  // A storage written in place inside the region: the op that makes it and
  // the ops that write into it, in program order, and the other ops that
  // read it before its last write (they see a state the cache does not hold).
  struct WriteGroup {
    std::vector<OpId> members;
    std::vector<OpId> intermediate_readers;
  };

  bool InRegion(OpId o) const { return o != kNone && o >= r_.first && o <= r_.last; }
  std::vector<bool>::reference Save(OpId o) { return r_.save[static_cast<size_t>(o - r_.first)]; }
  bool Replayed(OpId o) const { return o <= r_.last_saving && !r_.save[static_cast<size_t>(o - r_.first)]; }

  std::vector<OpId> IntermediateReaders(TensorId storage, const WriteGroup& group) const {
    std::vector<OpId> readers;
    for (OpId o = group.members.front() + 1; o < group.members.back(); ++o) {
      if (std::find(group.members.begin(), group.members.end(), o) != group.members.end()) continue;
      const Op& op = step_.op(o);
      const bool reads = std::any_of(op.inputs.begin(), op.inputs.end(),
                                     [&](TensorId in) { return step_.storage(in) == storage; });
      if (reads) readers.push_back(o);
    }
    return readers;
  }

  // Storages that backward, or a replayed op of the region that is not a
  // view, reads (a replayed view reads whatever copy of its base there is).
  std::vector<bool> NeededStorages() {
    std::vector<bool> needed = read_after_forward_;
    for (OpId o = r_.first; o <= r_.last_saving; ++o) {
      const Op& op = step_.op(o);
      if (!Replayed(o) || IsViewOp(step_, op)) continue;
      for (TensorId in : op.inputs) needed[static_cast<size_t>(step_.storage(in))] = true;
    }
    return needed;
  }

  // A write group is replayed whole, or cached whole (a cache holds the
  // storage's last state, so no replayed op may read an earlier one); every
  // random op before a replayed one is replayed. True if anything changed.
  bool CloseOverWritesAndRandomness() {
    bool changed = false;
    auto replay = [&](OpId o) {
      if (o <= r_.last_saving && Save(o)) Save(o) = false, changed = true;
    };
    auto any_replayed = [&](const std::vector<OpId>& ops) {
      return std::any_of(ops.begin(), ops.end(), [&](OpId o) { return Replayed(o); });
    };
    for (int pass = 0; pass < 2; ++pass) {  // randomness can replay a group, and a group a random op
      for (const auto& [storage, group] : groups_) {
        if (any_replayed(group.members) || any_replayed(group.intermediate_readers)) {
          for (OpId o : group.members) replay(o);
        }
      }
      OpId last_random_replay = kNone;
      for (OpId o = r_.first; o <= r_.last_saving; ++o) {
        if (IsRandomKind(step_.op(o).kind) && Replayed(o)) last_random_replay = o;
      }
      for (OpId o = r_.first; o < last_random_replay; ++o) {
        if (IsRandomKind(step_.op(o).kind)) replay(o);
      }
    }
    return changed;
  }

  const Graph& step_;
  const std::vector<bool>& read_after_forward_;
  CheckpointRegion& r_;
  std::map<TensorId, WriteGroup> groups_;
};

// For each region, the first backward op that unpacks a tensor saved by one
// of its ops: the backward of a region op reading one of that op's saved
// tensors (kNone where none does).
std::vector<OpId> FirstUnpacks(const Graph& step, const std::vector<int32_t>& region_of_op, size_t regions) {
  std::vector<OpId> first(regions, kNone);
  for (const Op& op : step.ops()) {
    if (IsForwardPhase(op.phase) || op.forward_of == kNone) continue;
    const int32_t r = region_of_op[static_cast<size_t>(op.forward_of)];
    if (r == kNone || first[static_cast<size_t>(r)] != kNone) continue;
    const std::vector<TensorId>& saved = step.op(op.forward_of).saved;
    const bool unpacks = std::any_of(op.inputs.begin(), op.inputs.end(), [&](TensorId in) {
      return std::any_of(saved.begin(), saved.end(),
                         [&](TensorId s) { return step.storage(s) == step.storage(in); });
    });
    if (unpacks) first[static_cast<size_t>(r)] = op.id;
  }
  return first;
}

// Where the hooks carry the plan's offloads (Note [Offload through
// saved-tensor hooks]): by op, the offloads complete right after it and the
// prefetches issued right before it.
struct OffloadPlacement {
  std::vector<HookedOffload> offloads;
  std::vector<std::vector<TensorId>> offload_after;
  std::vector<std::vector<TensorId>> prefetch_before;
};

OffloadPlacement PlaceOffloads(const Graph& step, const Schedule& plan, const std::vector<CheckpointRegion>& regions) {
  const size_t num_tensors = step.num_tensors();
  OffloadPlacement out{.offload_after = std::vector<std::vector<TensorId>>(step.num_ops()),
                       .prefetch_before = std::vector<std::vector<TensorId>>(step.num_ops())};
  // The plan's offloads, and the op each prefetch is issued before.
  std::vector<TensorId> offloaded;
  std::vector<OpId> planned_prefetch(num_tensors, kNone);
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const ScheduleEntry& e = plan.entries[i];
    if (e.action == ScheduleAction::kOffload &&
        std::find(offloaded.begin(), offloaded.end(), e.target) == offloaded.end()) {
      offloaded.push_back(e.target);
    }
    if (e.action != ScheduleAction::kPrefetch || planned_prefetch[static_cast<size_t>(e.target)] != kNone) continue;
    for (size_t j = i + 1; j < plan.entries.size(); ++j) {
      if (plan.entries[j].action != ScheduleAction::kCompute) continue;
      planned_prefetch[static_cast<size_t>(e.target)] = plan.entries[j].target;
      break;
    }
  }
  if (offloaded.empty()) return out;
  std::vector<bool> in_region(step.num_ops(), false);
  for (const CheckpointRegion& r : regions) {
    for (OpId o = r.first; o <= r.last; ++o) in_region[static_cast<size_t>(o)] = true;
  }
  // By storage: the forward ops outside the regions that save it, and
  // whether only such ops do (the hooks see it whenever it is saved).
  std::vector<std::vector<OpId>> savers(num_tensors);
  std::vector<bool> hooked(num_tensors, true);
  for (const Op& op : step.ops()) {
    for (TensorId s : op.saved) {
      const auto st = static_cast<size_t>(step.storage(s));
      if (op.phase != Phase::kForward || in_region[static_cast<size_t>(op.id)]) {
        hooked[st] = false;
      } else if (savers[st].empty() || savers[st].back() != op.id) {
        savers[st].push_back(op.id);
      }
    }
  }
  std::vector<OpId> backward_start(step.num_ops(), kNone);  // by forward op: where backward unpacks what it saved
  for (const Op& op : step.ops()) {
    if (op.phase != Phase::kBackward || op.forward_of == kNone) continue;
    OpId& start = backward_start[static_cast<size_t>(op.forward_of)];
    if (start == kNone) start = op.id;
  }
  std::vector<OpId> first_unpack(num_tensors, kNone);
  std::vector<std::pair<OpId, TensorId>> unpack_events;  // (first unpack, storage), ascending
  for (size_t st = 0; st < num_tensors; ++st) {
    if (!hooked[st]) continue;
    for (OpId saver : savers[st]) {
      const OpId start = backward_start[static_cast<size_t>(saver)];
      if (start != kNone && (first_unpack[st] == kNone || start < first_unpack[st])) first_unpack[st] = start;
    }
    if (first_unpack[st] != kNone) unpack_events.emplace_back(first_unpack[st], static_cast<TensorId>(st));
  }
  std::sort(unpack_events.begin(), unpack_events.end());
  // By storage: its last reader before backward, and whether anything but
  // autograd's unpacking reads it later or a region holds it.
  std::vector<OpId> last_forward_use(num_tensors, kNone);
  std::vector<bool> carried(num_tensors, true);
  for (const Op& op : step.ops()) {
    const auto o = static_cast<size_t>(op.id);
    for (TensorId in : op.inputs) {
      const auto st = static_cast<size_t>(step.storage(in));
      if (IsForwardPhase(op.phase)) {
        last_forward_use[st] = op.id;
        if (in_region[o]) carried[st] = false;
      } else if (op.phase != Phase::kBackward || op.forward_of == kNone ||
                 std::find(savers[st].begin(), savers[st].end(), op.forward_of) == savers[st].end()) {
        carried[st] = false;
      }
    }
    for (TensorId t : op.outputs) {
      const auto st = static_cast<size_t>(step.storage(t));
      if (in_region[o]) carried[st] = false;
      if (IsForwardPhase(op.phase)) last_forward_use[st] = op.id;
    }
  }
  for (TensorId t : offloaded) {
    const auto st = static_cast<size_t>(t);
    if (step.storage(t) != t || !hooked[st] || !carried[st] || first_unpack[st] == kNone ||
        last_forward_use[st] == kNone) {
      continue;
    }
    HookedOffload offload{.tensor = t};
    OpId back_at = first_unpack[st];
    const OpId wanted = planned_prefetch[st] == kNone ? back_at : planned_prefetch[st];
    auto event = std::lower_bound(unpack_events.begin(), unpack_events.end(), std::make_pair(wanted, TensorId{0}));
    if (event != unpack_events.end() && event->first < back_at) {
      back_at = event->first;
      offload.prefetch_on_unpack_of = event->second;
    }
    out.offload_after[static_cast<size_t>(last_forward_use[st])].push_back(t);
    out.prefetch_before[static_cast<size_t>(back_at)].push_back(t);
    out.offloads.push_back(offload);
  }
  return out;
}

}  // namespace

bool IsRandomKind(std::string_view kind) {
  for (std::string_view random : {"dropout", "native_dropout", "bernoulli", "bernoulli_", "rand", "rand_like",
                                  "randn", "randn_like", "randint", "randint_like", "randperm", "normal", "normal_",
                                  "uniform_", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_",
                                  "multinomial"}) {
    if (kind == random) return true;
  }
  return false;
}

namespace {

// The schedule PyTorch runs when the ops `wanted` are replayed and
// `candidates` (contiguous runs of forward ops, in program order) are the
// regions that may be checkpointed; only those with a replay are.
absl::StatusOr<SelectiveCheckpoint> Realize(const Graph& step, const std::vector<bool>& wanted,
                                            std::vector<CheckpointRegion> candidates, const Schedule& plan) {
  std::vector<bool> read_after_forward(step.num_tensors(), false);
  for (const Op& op : step.ops()) {
    if (IsForwardPhase(op.phase)) continue;
    for (TensorId in : op.inputs) read_after_forward[static_cast<size_t>(step.storage(in))] = true;
  }
  std::vector<CheckpointRegion> regions;
  for (CheckpointRegion& region : candidates) {
    const bool any_wanted = std::any_of(wanted.begin() + region.first, wanted.begin() + region.last + 1,
                                        [](bool w) { return w; });
    if (any_wanted && RegionPolicy(step, read_after_forward, region).Decide(wanted)) {
      regions.push_back(std::move(region));
    }
  }
  std::vector<int32_t> region_of_op(step.num_ops(), kNone);
  for (size_t r = 0; r < regions.size(); ++r) {
    for (OpId o = regions[r].first; o <= regions[r].last; ++o) {
      region_of_op[static_cast<size_t>(o)] = static_cast<int32_t>(r);
    }
  }
  const std::vector<OpId> first_unpack = FirstUnpacks(step, region_of_op, regions.size());
  SelectiveCheckpoint out;
  std::vector<std::vector<size_t>> replays_at(step.num_ops());
  for (size_t r = 0; r < regions.size(); ++r) {
    if (first_unpack[r] == kNone) continue;  // nothing it saved is ever read back
    regions[r].replay_before = first_unpack[r];
    replays_at[static_cast<size_t>(first_unpack[r])].push_back(out.regions.size());
    out.regions.push_back(std::move(regions[r]));
  }
  // Every op computed in program order; the regions' replays stand in for
  // any the plan had, and the hooks carry what they can of its copies.
  OffloadPlacement copies = PlaceOffloads(step, plan, out.regions);
  out.offloads = std::move(copies.offloads);
  for (const Op& op : step.ops()) {
    for (TensorId t : copies.prefetch_before[static_cast<size_t>(op.id)]) {
      out.schedule.entries.push_back({ScheduleAction::kPrefetch, t});
    }
    for (size_t r : replays_at[static_cast<size_t>(op.id)]) {
      const CheckpointRegion& region = out.regions[r];
      for (OpId o = region.first; o <= region.last_saving; ++o) {
        if (!region.save[static_cast<size_t>(o - region.first)]) {
          out.schedule.entries.push_back({ScheduleAction::kRecompute, o});
        }
      }
    }
    out.schedule.entries.push_back({ScheduleAction::kCompute, op.id});
    for (TensorId t : copies.offload_after[static_cast<size_t>(op.id)]) {
      out.schedule.entries.push_back({ScheduleAction::kOffload, t});
    }
  }
  HEADROOM_RETURN_IF_ERROR(MaterializeSchedule(step, out.schedule).status());
  return out;
}

}  // namespace

std::vector<CheckpointRegion> LayerRegions(const Graph& step) {
  std::map<int, int> runs_of_layer;
  std::vector<CheckpointRegion> runs;
  for (const Op& op : step.ops()) {
    const bool in_layer = IsRecomputable(op) && op.layer >= 0;
    if (in_layer && !runs.empty() && runs.back().layer == op.layer && runs.back().last == op.id - 1) {
      runs.back().last = op.id;
      continue;
    }
    if (!in_layer) continue;
    runs.push_back({.layer = op.layer, .first = op.id, .last = op.id});
    ++runs_of_layer[op.layer];
  }
  std::erase_if(runs, [&runs_of_layer](const CheckpointRegion& r) { return runs_of_layer[r.layer] > 1; });
  return runs;
}

absl::StatusOr<SelectiveCheckpoint> RealizeSelectiveCheckpoint(const Graph& step, const Schedule& plan) {
  HEADROOM_RETURN_IF_ERROR(MaterializeSchedule(step, plan).status());
  std::vector<bool> wanted(step.num_ops(), false);
  for (const ScheduleEntry& e : plan.entries) {
    if (e.action == ScheduleAction::kRecompute) wanted[static_cast<size_t>(e.target)] = true;
  }
  return Realize(step, wanted, LayerRegions(step), plan);
}

absl::StatusOr<SelectiveCheckpoint> RealizeFullCheckpoints(const Graph& step,
                                                           std::vector<CheckpointRegion> regions) {
  std::vector<bool> wanted(step.num_ops(), false);
  OpId previous = kNone;
  for (const CheckpointRegion& r : regions) {
    if (r.first <= previous || r.last < r.first || static_cast<size_t>(r.last) >= step.num_ops()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "checkpoint region of ops %d-%d: regions must be ascending, apart and within the step's %d ops", r.first,
          r.last, step.num_ops()));
    }
    for (OpId o = r.first; o <= r.last; ++o) {
      if (!IsRecomputable(step.op(o))) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "checkpoint region of ops %d-%d: op %s is not a forward op", r.first, r.last,
            QuoteForError(step.op(o).name)));
      }
      wanted[static_cast<size_t>(o)] = true;
    }
    previous = r.last;
  }
  return Realize(step, wanted, std::move(regions), Schedule{});
}

}  // namespace headroom
