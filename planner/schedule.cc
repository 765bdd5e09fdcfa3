#include "planner/schedule.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/name_table.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

constexpr NameTable<ScheduleAction, 4> kActionNames("schedule action", {{
    {"compute", ScheduleAction::kCompute},
    {"recompute", ScheduleAction::kRecompute},
    {"offload", ScheduleAction::kOffload},
    {"prefetch", ScheduleAction::kPrefetch},
}});

std::string EntryName(size_t index, const ScheduleEntry& entry) {
  return absl::StrFormat("schedule entry %d (%s %d)", index, ScheduleActionName(entry.action), entry.target);
}

// Writes a schedule out as a Graph (Note [Schedule semantics]). The step's
// tensors keep their ids; replays and prefetches add fresh copies.
class Materializer {
 public:
  // `entries`: the schedule's length, one op each.
  Materializer(const Graph& step, size_t entries)
      : step_(step),
        out_(step.name()),
        latest_(step.num_tensors()),
        produced_(step.num_tensors(), false),
        on_host_(step.num_tensors(), false),
        computed_(step.num_ops(), false),
        replays_(step.num_ops(), 0),
        prefetches_(step.num_tensors(), 0),
        views_of_(step.num_tensors()) {
    // Replays and copies add tensors too; most schedules are mostly computes.
    // Capped by the step, so that a schedule read from a file that fails
    // early reserves no more than a plan of the step would use.
    const size_t ops = std::min(entries, 2 * step.num_ops());
    out_.Reserve(ops, step.num_tensors() + (ops - std::min(ops, step.num_ops())));
    copy_of_.reserve(step.num_tensors());
    for (const Tensor& t : step.tensors()) {
      out_.AddTensor(t);
      copy_of_.push_back(t.id);
      latest_[static_cast<size_t>(t.id)] = t.id;
      produced_[static_cast<size_t>(t.id)] = step.producer(t.id) == kNone;
      if (t.view_of != kNone) views_of_[static_cast<size_t>(t.view_of)].push_back(t.id);
    }
  }

  absl::Status Add(size_t index, const ScheduleEntry& entry) {
    switch (entry.action) {
      case ScheduleAction::kCompute:
      case ScheduleAction::kRecompute:
        return AddOp(index, entry);
      case ScheduleAction::kOffload:
        return AddOffload(index, entry);
      case ScheduleAction::kPrefetch:
        return AddPrefetch(index, entry);
    }
    return absl::InternalError("unknown schedule action");
  }

  // By tensor of the result: the step tensor it holds (a copy of).
  std::vector<TensorId> TakeCopyOf() { return std::move(copy_of_); }

  absl::StatusOr<Graph> Finish() && {
    if (next_compute_ != static_cast<OpId>(step_.num_ops())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "schedule of %s ends before computing op %d (%s); every op must be computed once",
          QuoteForError(step_.name()), next_compute_, QuoteForError(step_.op(next_compute_).name)));
    }
    return std::move(out_);
  }

 private:
  absl::Status AddOp(size_t index, const ScheduleEntry& entry) {
    const bool replay = entry.action == ScheduleAction::kRecompute;
    if (entry.target < 0 || static_cast<size_t>(entry.target) >= step_.num_ops()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: no op %d in %s", EntryName(index, entry),
                                                        entry.target, QuoteForError(step_.name())));
    }
    const Op& source = step_.op(entry.target);
    if (!replay && entry.target != next_compute_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: computes op %s out of program order (expected op %d next)", EntryName(index, entry),
          QuoteForError(source.name), next_compute_));
    }
    if (replay && !IsRecomputable(source)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: op %s is in phase %s; only forward ops can be replayed", EntryName(index, entry),
          QuoteForError(source.name), PhaseName(source.phase)));
    }
    if (replay && !computed_[static_cast<size_t>(entry.target)]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: replays op %s before it was computed", EntryName(index, entry), QuoteForError(source.name)));
    }
    Op op = source;
    op.id = kNone;
    for (TensorId& in : op.inputs) {
      if (!produced_[static_cast<size_t>(in)]) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: op %s reads %s before it is produced", EntryName(index, entry), QuoteForError(source.name),
            QuoteForError(step_.tensor(in).name)));
      }
      in = latest_[static_cast<size_t>(in)];
    }
    for (TensorId& out : op.outputs) {
      const Tensor& t = step_.tensor(out);
      const bool stale_view = t.view_of != kNone && latest_[static_cast<size_t>(t.view_of)] != t.view_of;
      if (replay || stale_view) {
        out = Fresh(out, replay ? "recompute" : "view", ++replays_[static_cast<size_t>(entry.target)]);
      }
      produced_[static_cast<size_t>(t.id)] = true;
      latest_[static_cast<size_t>(t.id)] = out;
    }
    for (TensorId& saved : op.saved) saved = latest_[static_cast<size_t>(saved)];
    if (replay) {
      op.recompute = true;
      op.phase = Phase::kBackward;
      op.forward_of = entry.target;
    } else {
      computed_[static_cast<size_t>(entry.target)] = true;
      ++next_compute_;
      phase_ = source.phase;
    }
    out_.AddOp(std::move(op));
    return absl::OkStatus();
  }

  absl::Status AddOffload(size_t index, const ScheduleEntry& entry) {
    HEADROOM_RETURN_IF_ERROR(CheckCopiedTensor(index, entry));
    const Tensor& t = step_.tensor(entry.target);
    if (!produced_[static_cast<size_t>(t.id)] || on_host_[static_cast<size_t>(t.id)]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s is %s", EntryName(index, entry), QuoteForError(t.name),
          on_host_[static_cast<size_t>(t.id)] ? "already in host memory" : "not produced yet"));
    }
    on_host_[static_cast<size_t>(t.id)] = true;
    out_.AddOp({.kind = "offload_copy",
                .name = absl::StrFormat("offload %s", t.name),
                .inputs = {latest_[static_cast<size_t>(t.id)]},
                .bytes_read = t.bytes(),
                .phase = phase_,
                .layer = t.layer});
    return absl::OkStatus();
  }

  absl::Status AddPrefetch(size_t index, const ScheduleEntry& entry) {
    HEADROOM_RETURN_IF_ERROR(CheckCopiedTensor(index, entry));
    const Tensor& t = step_.tensor(entry.target);
    if (!on_host_[static_cast<size_t>(t.id)]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %s was not offloaded, so it cannot be prefetched", EntryName(index, entry),
                          QuoteForError(t.name)));
    }
    on_host_[static_cast<size_t>(t.id)] = false;
    const int k = ++prefetches_[static_cast<size_t>(t.id)];
    std::vector<TensorId> outputs = {Fresh(t.id, "prefetch", k)};
    latest_[static_cast<size_t>(t.id)] = outputs[0];
    // Views of the tensor alias the fresh copy from now on.
    for (TensorId view : views_of_[static_cast<size_t>(t.id)]) {
      if (!produced_[static_cast<size_t>(view)]) continue;
      outputs.push_back(Fresh(view, "prefetch", k));
      latest_[static_cast<size_t>(view)] = outputs.back();
    }
    out_.AddOp({.kind = "prefetch_copy",
                .name = absl::StrFormat("prefetch %s", t.name),
                .outputs = std::move(outputs),
                .bytes_written = t.bytes(),
                .phase = phase_,
                .layer = t.layer});
    return absl::OkStatus();
  }

  absl::Status CheckCopiedTensor(size_t index, const ScheduleEntry& entry) const {
    if (entry.target < 0 || static_cast<size_t>(entry.target) >= step_.num_tensors()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: no tensor %d in %s", EntryName(index, entry),
                                                        entry.target, QuoteForError(step_.name())));
    }
    const Tensor& t = step_.tensor(entry.target);
    if (t.view_of != kNone || step_.producer(t.id) == kNone) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s is %s; only tensors that ops produce are copied", EntryName(index, entry), QuoteForError(t.name),
          t.view_of != kNone ? "a view" : "not produced by an op"));
    }
    return absl::OkStatus();
  }

  // A new tensor copying `of`, whose view base (if any) is the base's latest copy.
  TensorId Fresh(TensorId of, std::string_view why, int k) {
    Tensor t = step_.tensor(of);
    t.id = kNone;
    t.name = k == 1 ? absl::StrFormat("%s@%s", t.name, why) : absl::StrFormat("%s@%s%d", t.name, why, k);
    if (t.view_of != kNone) t.view_of = latest_[static_cast<size_t>(t.view_of)];
    copy_of_.push_back(of);
    return out_.AddTensor(std::move(t));
  }

  const Graph& step_;
  Graph out_;
  std::vector<TensorId> copy_of_;  // by TensorId of out_: the step tensor it copies
  std::vector<TensorId> latest_;  // by step TensorId: the copy ops read now
  std::vector<bool> produced_;    // by step TensorId: some copy exists
  std::vector<bool> on_host_;     // by step TensorId: offloaded, not prefetched since
  std::vector<bool> computed_;    // by step OpId
  std::vector<int> replays_;      // by step OpId: fresh copies made so far (names)
  std::vector<int> prefetches_;   // by step TensorId
  std::vector<std::vector<TensorId>> views_of_;
  OpId next_compute_ = 0;
  Phase phase_ = Phase::kForward;  // of the last computed op: copies run in it
};

}  // namespace

std::string_view ScheduleActionName(ScheduleAction action) { return kActionNames.Name(action); }

absl::StatusOr<ScheduleAction> ParseScheduleAction(std::string_view name) { return kActionNames.Parse(name); }

size_t Schedule::CountOf(ScheduleAction action) const {
  return static_cast<size_t>(
      std::count_if(entries.begin(), entries.end(), [action](const ScheduleEntry& e) { return e.action == action; }));
}

bool IsRecomputable(const Op& op) { return op.phase == Phase::kForward && !op.recompute; }

Schedule StoreAllSchedule(const Graph& step) {
  Schedule schedule;
  schedule.entries.reserve(step.num_ops());
  for (const Op& op : step.ops()) schedule.entries.push_back({ScheduleAction::kCompute, op.id});
  return schedule;
}

absl::StatusOr<Schedule> SegmentSchedule(const Graph& step, const CheckpointPlan& plan) {
  HEADROOM_RETURN_IF_ERROR(plan.Validate(step));
  if (plan.empty()) return StoreAllSchedule(step);
  const int32_t segments = plan.num_segments();
  auto segment_of = [&plan](OpId op) { return plan.segment_of_op[static_cast<size_t>(op)]; };

  // A segment's outputs read by forward-side ops outside it are its
  // boundary, kept as the next segment's input; what else it produces is
  // internal, dropped after forward and replayed for its backward.
  std::vector<int32_t> segment_of_tensor(step.num_tensors(), kNone);
  for (const Op& op : step.ops()) {
    if (segment_of(op.id) == kNone) continue;
    for (TensorId out : op.outputs) segment_of_tensor[static_cast<size_t>(out)] = segment_of(op.id);
  }
  std::vector<bool> boundary(step.num_tensors(), false);
  for (const Op& op : step.ops()) {
    if (!IsForwardPhase(op.phase)) continue;
    for (TensorId in : op.inputs) {
      const int32_t s = segment_of_tensor[static_cast<size_t>(in)];
      if (s != kNone && s != segment_of(op.id)) boundary[static_cast<size_t>(in)] = true;
    }
  }
  // Each segment is replayed before the first later op reading one of its internal tensors.
  std::vector<OpId> replay_before(static_cast<size_t>(segments), kNone);
  for (const Op& op : step.ops()) {
    if (IsForwardPhase(op.phase)) continue;
    for (TensorId in : op.inputs) {
      const int32_t s = segment_of_tensor[static_cast<size_t>(in)];
      if (s == kNone || boundary[static_cast<size_t>(in)]) continue;
      if (replay_before[static_cast<size_t>(s)] == kNone) replay_before[static_cast<size_t>(s)] = op.id;
    }
  }
  std::vector<std::vector<int32_t>> replays_at(step.num_ops());
  for (int32_t s = 0; s < segments; ++s) {
    const OpId at = replay_before[static_cast<size_t>(s)];
    if (at != kNone) replays_at[static_cast<size_t>(at)].push_back(s);
  }
  std::vector<std::vector<OpId>> ops_of_segment(static_cast<size_t>(segments));
  for (const Op& op : step.ops()) {
    if (segment_of(op.id) != kNone) ops_of_segment[static_cast<size_t>(segment_of(op.id))].push_back(op.id);
  }

  Schedule schedule;
  for (const Op& op : step.ops()) {
    for (int32_t s : replays_at[static_cast<size_t>(op.id)]) {
      for (OpId replayed : ops_of_segment[static_cast<size_t>(s)]) {
        schedule.entries.push_back({ScheduleAction::kRecompute, replayed});
      }
    }
    schedule.entries.push_back({ScheduleAction::kCompute, op.id});
  }
  return PruneSchedule(step, schedule);
}

absl::StatusOr<Graph> MaterializeSchedule(const Graph& step, const Schedule& schedule,
                                          std::vector<TensorId>* copy_of) {
  Materializer materializer(step, schedule.entries.size());
  for (size_t i = 0; i < schedule.entries.size(); ++i) {
    HEADROOM_RETURN_IF_ERROR(materializer.Add(i, schedule.entries[i]));
  }
  if (copy_of != nullptr) *copy_of = materializer.TakeCopyOf();
  return std::move(materializer).Finish();
}

absl::StatusOr<Schedule> PruneSchedule(const Graph& step, const Schedule& schedule) {
  HEADROOM_ASSIGN_OR_RETURN(Graph out, MaterializeSchedule(step, schedule));
  // Each entry made exactly one op of `out`, in order; walk them backwards.
  std::vector<bool> read(out.num_tensors(), false);
  std::vector<bool> prefetch_pending(step.num_tensors(), false);
  std::vector<bool> keep(schedule.entries.size(), true);
  for (size_t i = schedule.entries.size(); i-- > 0;) {
    const ScheduleEntry& entry = schedule.entries[i];
    const Op& op = out.op(static_cast<OpId>(i));
    const bool any_output_read =
        std::any_of(op.outputs.begin(), op.outputs.end(), [&read](TensorId t) { return read[static_cast<size_t>(t)]; });
    switch (entry.action) {
      case ScheduleAction::kCompute:
        break;
      case ScheduleAction::kRecompute:
        keep[i] = any_output_read;
        break;
      case ScheduleAction::kPrefetch:
        keep[i] = any_output_read;
        if (keep[i]) prefetch_pending[static_cast<size_t>(entry.target)] = true;
        break;
      case ScheduleAction::kOffload:
        keep[i] = prefetch_pending[static_cast<size_t>(entry.target)];
        prefetch_pending[static_cast<size_t>(entry.target)] = false;
        break;
    }
    if (!keep[i]) continue;
    for (TensorId in : op.inputs) read[static_cast<size_t>(in)] = true;
  }
  Schedule pruned;
  for (size_t i = 0; i < schedule.entries.size(); ++i) {
    if (keep[i]) pruned.entries.push_back(schedule.entries[i]);
  }
  return pruned;
}

}  // namespace headroom
