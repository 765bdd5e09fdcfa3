#include "planner/plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "graph/liveness.h"

namespace headroom {

// Far above any pipeline's micro-batches in flight (stages), low enough that
// times a step's bytes stays far from 2^64.
constexpr int kMaxInFlight = 1 << 16;
namespace {

// Prices a materialized schedule (entry i made op i of `scheduled`) on one
// compute stream and two copy engines (Note [Plan costs]).
void PriceSchedule(const PlanProblem& problem, const Schedule& schedule, const Graph& scheduled,
                   PlanEvaluation& e) {
  std::vector<double> last_touch(scheduled.num_tensors(), 0);  // by storage: when its last reader ended
  std::vector<double> ready(scheduled.num_tensors(), 0);       // by tensor: when its prefetch lands
  double now = 0;
  double d2h_free = 0;
  double h2d_free = 0;
  std::vector<double> offload_done(problem.step->num_tensors(), 0);  // by step tensor
  uint64_t host = 0;
  auto copy_time = [&problem](uint64_t bytes) { return static_cast<double>(bytes) / problem.copy_bytes_per_cost; };
  for (size_t i = 0; i < schedule.entries.size(); ++i) {
    const ScheduleEntry& entry = schedule.entries[i];
    const Op& op = scheduled.op(static_cast<OpId>(i));
    switch (entry.action) {
      case ScheduleAction::kOffload: {
        const TensorId storage = scheduled.storage(op.inputs[0]);
        const uint64_t bytes = scheduled.tensor(storage).bytes();
        const double done = std::max(last_touch[static_cast<size_t>(storage)], d2h_free) + copy_time(bytes);
        d2h_free = done;
        offload_done[static_cast<size_t>(entry.target)] = done;
        if (done > now) {  // the storage is freed here, so compute waits for the copy
          e.wait_cost += done - now;
          now = done;
        }
        host += bytes;
        e.offloaded_bytes += bytes;
        e.host_peak_bytes = std::max(e.host_peak_bytes, host);
        break;
      }
      case ScheduleAction::kPrefetch: {
        const uint64_t bytes = scheduled.tensor(op.outputs[0]).bytes();
        const double issue = std::max({now, h2d_free, offload_done[static_cast<size_t>(entry.target)]});
        const double done = issue + copy_time(bytes);
        h2d_free = done;
        for (TensorId out : op.outputs) ready[static_cast<size_t>(out)] = done;
        host -= std::min(host, bytes);  // the host copy is released once it is back
        break;
      }
      case ScheduleAction::kCompute:
      case ScheduleAction::kRecompute: {
        double start = now;
        for (TensorId in : op.inputs) start = std::max(start, ready[static_cast<size_t>(in)]);
        e.wait_cost += start - now;
        const double cost = problem.op_cost[static_cast<size_t>(entry.target)];
        now = start + cost;
        if (entry.action == ScheduleAction::kRecompute) {
          e.extra_cost += cost;
          ++e.recomputed_ops;
        }
        for (TensorId in : op.inputs) last_touch[static_cast<size_t>(scheduled.storage(in))] = now;
        for (TensorId out : op.outputs) last_touch[static_cast<size_t>(scheduled.storage(out))] = now;
        break;
      }
    }
  }
}

}  // namespace

absl::Status ValidateProblem(const PlanProblem& problem) {
  if (problem.step == nullptr) return absl::InvalidArgumentError("plan problem: no step graph");
  const Graph& step = *problem.step;
  if (problem.op_cost.size() != step.num_ops()) {
    return absl::InvalidArgumentError(absl::StrFormat("plan problem for %s: %d op costs for %d ops",
                                                      QuoteForError(step.name()), problem.op_cost.size(),
                                                      step.num_ops()));
  }
  for (const Op& op : step.ops()) {
    const double c = problem.op_cost[static_cast<size_t>(op.id)];
    if (!std::isfinite(c) || c < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("plan problem for %s: op %s costs %g; costs must be finite and >= 0",
                          QuoteForError(step.name()), QuoteForError(op.name), c));
    }
  }
  if (problem.in_flight < 1 || problem.in_flight > kMaxInFlight) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan problem for %s: %d micro-batches in flight; expected 1 to %d", QuoteForError(step.name()),
        problem.in_flight, kMaxInFlight));
  }
  if (problem.budget == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plan problem for %s: the budget is 0 bytes", QuoteForError(step.name())));
  }
  if (!std::isfinite(problem.copy_bytes_per_cost) || problem.copy_bytes_per_cost < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan problem for %s: copy speed %g bytes per cost unit must be finite and >= 0", QuoteForError(step.name()),
        problem.copy_bytes_per_cost));
  }
  return absl::OkStatus();
}


namespace {

// Note [Pipeline in-flight], on the materialized schedule: tensors that
// compute entries of forward-side ops make (not replays: those run in
// backward; not gradients: the buffers a step with gradient accumulation
// allocates first are shared by every micro-batch), live at the last such
// entry.
uint64_t HeldAfterForward(const Graph& scheduled, const ProfileOptions& profile) {
  OpId last_forward = kNone;
  for (const Op& op : scheduled.ops()) {
    if (IsForwardPhase(op.phase) && !op.recompute) last_forward = op.id;
  }
  if (last_forward == kNone) return 0;
  const std::vector<TensorLifetime> lives = ComputeLifetimes(scheduled, profile);
  uint64_t held = 0;
  for (const Tensor& t : scheduled.tensors()) {
    const TensorLifetime& life = lives[static_cast<size_t>(t.id)];
    const OpId producer = scheduled.producer(t.id);
    if (producer == kNone || t.role == TensorRole::kGradient) continue;
    if (life.first > last_forward || life.last < last_forward) continue;
    const Op& op = scheduled.op(producer);
    if (IsForwardPhase(op.phase) && !op.recompute) held += t.bytes();
  }
  return held;
}

}  // namespace

absl::StatusOr<PlanEvaluation> EvaluateSchedule(const PlanProblem& problem, const Schedule& schedule) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  const Graph& step = *problem.step;
  const size_t copies = schedule.CountOf(ScheduleAction::kOffload) + schedule.CountOf(ScheduleAction::kPrefetch);
  if (copies > 0 && problem.copy_bytes_per_cost <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "schedule of %s copies tensors to host memory, but the problem has no host-link speed",
        QuoteForError(step.name())));
  }
  HEADROOM_ASSIGN_OR_RETURN(Graph scheduled, MaterializeSchedule(step, schedule));
  MemoryProfile profile = ProfileMemory(scheduled, problem.profile);
  PlanEvaluation e;
  e.peak_bytes = profile.peak_bytes;
  e.peak_entry = profile.peak_op;
  e.live_bytes = std::move(profile.live_bytes);
  if (problem.in_flight > 1) {
    e.held_after_forward = HeldAfterForward(scheduled, problem.profile);
    const uint64_t others = static_cast<uint64_t>(problem.in_flight - 1) * e.held_after_forward;
    e.peak_bytes = 0;
    for (size_t i = 0; i < e.live_bytes.size(); ++i) {
      e.live_bytes[i] += others;
      if (e.live_bytes[i] > e.peak_bytes) {
        e.peak_bytes = e.live_bytes[i];
        e.peak_entry = static_cast<OpId>(i);
      }
    }
  }
  for (double c : problem.op_cost) e.base_cost += c;
  PriceSchedule(problem, schedule, scheduled, e);
  e.step_cost = e.base_cost + e.extra_cost + e.wait_cost;
  return e;
}

// Note [Independent validator]
// ValidateSchedule shares no code with MaterializeSchedule or
// graph/liveness.cc: it replays the schedule over its own records of tensor
// copies (one per production: compute, replay or prefetch), charges each
// counted copy's bytes from the entry that makes it to the last entry that
// touches it, and checks the peak. If either implementation drifts, the
// property tests that run both disagree.
absl::Status ValidateSchedule(const PlanProblem& problem, const Schedule& schedule) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  const Graph& step = *problem.step;
  auto fail = [&](size_t i, const std::string& why) {
    const ScheduleEntry& e = schedule.entries[i];
    return absl::FailedPreconditionError(absl::StrFormat("schedule of %s, entry %d (%s %d): %s",
                                                         QuoteForError(step.name()), i,
                                                         ScheduleActionName(e.action), e.target, why));
  };
  std::array<bool, 8> counted{};
  for (TensorRole role : problem.profile.counted_roles) counted[static_cast<size_t>(role)] = true;
  auto counts = [&](const Tensor& t) {
    if (!counted[static_cast<size_t>(t.role)] || t.view_of != kNone) return false;
    return problem.profile.count_parameter_gradients || !IsParameterGradient(step, t);
  };

  struct Copy {
    TensorId tensor;
    int64_t first;  // entry that makes it
    int64_t last;   // last entry that touches it
  };
  std::vector<Copy> copies;
  std::vector<int64_t> latest(step.num_tensors(), -1);  // copy index, by step tensor
  std::vector<bool> host(step.num_tensors(), false);
  std::vector<bool> computed(step.num_ops(), false);
  const auto n = static_cast<int64_t>(schedule.entries.size());
  auto whole_step = [](const Tensor& t) {  // as graph/liveness.cc's rule states
    return t.role == TensorRole::kParameter || t.role == TensorRole::kBuffer || t.role == TensorRole::kInput ||
           t.role == TensorRole::kOptimizerState;
  };
  for (const Tensor& t : step.tensors()) {  // what no op produces exists from the start
    if (step.producer(t.id) != kNone || t.view_of != kNone) continue;
    latest[static_cast<size_t>(t.id)] = static_cast<int64_t>(copies.size());
    copies.push_back({t.id, 0, 0});
  }
  for (const Tensor& t : step.tensors()) {
    if (step.producer(t.id) == kNone && t.view_of != kNone) latest[static_cast<size_t>(t.id)] = latest[static_cast<size_t>(t.view_of)];
  }
  std::vector<std::vector<TensorId>> views_of(step.num_tensors());
  for (const Tensor& t : step.tensors()) {
    if (t.view_of != kNone) views_of[static_cast<size_t>(t.view_of)].push_back(t.id);
  }
  OpId next = 0;
  for (size_t i = 0; i < schedule.entries.size(); ++i) {
    const ScheduleEntry& e = schedule.entries[i];
    const auto at = static_cast<int64_t>(i);
    const bool op_entry = e.action == ScheduleAction::kCompute || e.action == ScheduleAction::kRecompute;
    const size_t limit = op_entry ? step.num_ops() : step.num_tensors();
    if (e.target < 0 || static_cast<size_t>(e.target) >= limit) return fail(i, "no such op or tensor");
    if (op_entry) {
      const Op& op = step.op(e.target);
      if (e.action == ScheduleAction::kCompute) {
        if (e.target != next) return fail(i, absl::StrFormat("computes out of program order (op %d is next)", next));
        ++next;
      } else if (op.phase != Phase::kForward || !computed[static_cast<size_t>(e.target)]) {
        return fail(i, "replays an op that is not a forward op already computed");
      }
      for (TensorId in : op.inputs) {
        // A view's record is its base copy at the time the view was made.
        const int64_t c = latest[static_cast<size_t>(in)];
        if (c < 0) {
          return fail(i, absl::StrFormat("reads %s, which is not resident", QuoteForError(step.tensor(in).name)));
        }
        copies[static_cast<size_t>(c)].last = std::max(copies[static_cast<size_t>(c)].last, at);
      }
      for (TensorId out : op.outputs) {
        const TensorId base = step.tensor(out).view_of;
        if (base != kNone) {
          if (latest[static_cast<size_t>(base)] < 0) return fail(i, "makes a view of a missing tensor");
          latest[static_cast<size_t>(out)] = latest[static_cast<size_t>(base)];
          copies[static_cast<size_t>(latest[static_cast<size_t>(base)])].last =
              std::max(copies[static_cast<size_t>(latest[static_cast<size_t>(base)])].last, at);
          continue;
        }
        latest[static_cast<size_t>(out)] = static_cast<int64_t>(copies.size());
        copies.push_back({out, at, at});
      }
      computed[static_cast<size_t>(e.target)] = true;
      continue;
    }
    const Tensor& t = step.tensor(e.target);
    if (t.view_of != kNone) return fail(i, "copies a view");
    const int64_t c = latest[static_cast<size_t>(t.id)];
    if (e.action == ScheduleAction::kOffload) {
      if (c < 0 || host[static_cast<size_t>(t.id)]) return fail(i, "offloads a tensor not on the device");
      copies[static_cast<size_t>(c)].last = std::max(copies[static_cast<size_t>(c)].last, at);
      host[static_cast<size_t>(t.id)] = true;
    } else {
      if (!host[static_cast<size_t>(t.id)]) return fail(i, "prefetches a tensor that was not offloaded");
      host[static_cast<size_t>(t.id)] = false;
      latest[static_cast<size_t>(t.id)] = static_cast<int64_t>(copies.size());
      copies.push_back({t.id, at, at});
      for (TensorId view : views_of[static_cast<size_t>(t.id)]) {
        if (latest[static_cast<size_t>(view)] >= 0) latest[static_cast<size_t>(view)] = latest[static_cast<size_t>(t.id)];
      }
    }
  }
  if (next != static_cast<OpId>(step.num_ops())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "schedule of %s never computes op %d (%s), so its gradients are missing", QuoteForError(step.name()), next,
        QuoteForError(step.op(next).name)));
  }
  // Note [Pipeline in-flight]: copies that compute entries of forward-side
  // ops make, live at the last such entry.
  int64_t last_forward = -1;
  for (size_t i = 0; i < schedule.entries.size(); ++i) {
    const ScheduleEntry& e = schedule.entries[i];
    if (e.action == ScheduleAction::kCompute && IsForwardPhase(step.op(e.target).phase)) {
      last_forward = static_cast<int64_t>(i);
    }
  }
  int64_t held_after_forward = 0;
  for (const Copy& c : copies) {
    const Tensor& t = step.tensor(c.tensor);
    const OpId producer = step.producer(t.id);
    if (!counts(t) || whole_step(t) || t.role == TensorRole::kGradient || producer == kNone ||
        !IsForwardPhase(step.op(producer).phase)) {
      continue;
    }
    const ScheduleEntry& made_by = schedule.entries[static_cast<size_t>(c.first)];
    if (made_by.action != ScheduleAction::kCompute) continue;  // a replay or a prefetch
    if (c.first <= last_forward && last_forward <= c.last) held_after_forward += static_cast<int64_t>(t.bytes());
  }
  std::vector<int64_t> delta(schedule.entries.size() + 1, 0);
  for (const Copy& c : copies) {
    const Tensor& t = step.tensor(c.tensor);
    if (!counts(t)) continue;
    const bool unused = step.producer(t.id) == kNone && !whole_step(t);  // never allocated
    const int64_t first = whole_step(t) ? 0 : c.first;
    const int64_t last = whole_step(t) ? n - 1 : c.last;
    if (unused || n == 0) continue;
    delta[static_cast<size_t>(first)] += static_cast<int64_t>(t.bytes());
    delta[static_cast<size_t>(last) + 1] -= static_cast<int64_t>(t.bytes());
  }
  int64_t live = (problem.in_flight - 1) * held_after_forward;
  for (size_t i = 0; i < schedule.entries.size(); ++i) {
    live += delta[i];
    if (static_cast<uint64_t>(live) > problem.budget) {
      return fail(i, absl::StrFormat("%d bytes live, over the budget of %d", live, problem.budget));
    }
  }
  return absl::OkStatus();
}

}  // namespace headroom
