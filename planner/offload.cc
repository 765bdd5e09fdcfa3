#include "planner/offload.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "graph/liveness.h"
#include "planner/checkpoint_mode_plan.h"
#include "planner/chen.h"

namespace headroom {
namespace {

constexpr OpId kNever = std::numeric_limits<OpId>::max();  // a use that never comes

enum class Choice : uint8_t { kKeep, kOffload, kRecompute };

bool IsForwardSide(Phase phase) { return phase == Phase::kForward || phase == Phase::kLoss; }

bool WholeStep(TensorRole role) {  // as graph/liveness.cc's rule states
  return role == TensorRole::kParameter || role == TensorRole::kBuffer || role == TensorRole::kInput ||
         role == TensorRole::kOptimizerState;
}

template <typename T>
T& At(std::vector<T>& v, int32_t i) {
  return v[static_cast<size_t>(i)];
}
template <typename T>
const T& At(const std::vector<T>& v, int32_t i) {
  return v[static_cast<size_t>(i)];
}

// What no decision changes: uses of each storage around the end of the
// forward side (Note [Saved tensors]) and the simulation's starting state.
struct StepFacts {
  const PlanProblem* problem = nullptr;
  const Graph* step = nullptr;
  OpId num_ops = 0;
  OpId forward_end = 0;                    // first op after the forward side
  std::vector<TensorId> storage;           // by tensor: itself, or the base of a view
  std::vector<TensorId> view_of;           // by tensor (flat copies of the graph's fields: the
  std::vector<uint64_t> bytes;             //   simulator reads them for every edge of every trial)
  std::vector<OpId> producer;              // by tensor
  std::vector<uint64_t> counted;           // by tensor: bytes towards the budget (0 for views)
  std::vector<uint8_t> whole_step;         // by tensor
  std::vector<OpId> last_forward_use;      // by storage: last forward-side op touching it, or kNone
  std::vector<OpId> first_later_use;       // by storage: first later op touching it, or kNever
  std::vector<OpId> first_later_read;      // by tensor: first later op reading it as an input, or kNever
  std::vector<std::vector<TensorId>> views_of;  // by storage
  std::vector<std::vector<OpId>> readers;       // by tensor: ops reading it as an input
  std::vector<TensorId> saved;             // saved tensors in id order
  std::vector<int32_t> initial_latest;     // simulation: record of each tensor before the first entry
  std::vector<TensorId> initial_records;
  double base_cost = 0;

  double CopyTime(TensorId t) const {
    return static_cast<double>(At(bytes, t)) / problem->copy_bytes_per_cost;
  }
};

StepFacts MakeFacts(const PlanProblem& problem) {
  const Graph& step = *problem.step;
  StepFacts f;
  f.problem = &problem;
  f.step = &step;
  f.num_ops = static_cast<OpId>(step.num_ops());
  f.forward_end = f.num_ops;
  for (const Op& op : step.ops()) {
    if (!IsForwardSide(op.phase)) {
      f.forward_end = op.id;
      break;
    }
  }
  const size_t tensors = step.num_tensors();
  std::array<bool, 8> counted_role{};
  for (TensorRole role : problem.profile.counted_roles) counted_role[static_cast<size_t>(role)] = true;
  f.storage.resize(tensors);
  f.view_of.resize(tensors);
  f.bytes.resize(tensors);
  f.producer.resize(tensors);
  f.counted.assign(tensors, 0);
  f.whole_step.assign(tensors, 0);
  f.views_of.resize(tensors);
  for (const Tensor& t : step.tensors()) {
    At(f.storage, t.id) = t.view_of == kNone ? t.id : t.view_of;
    At(f.view_of, t.id) = t.view_of;
    At(f.bytes, t.id) = t.bytes();
    At(f.producer, t.id) = step.producer(t.id);
    At(f.whole_step, t.id) = WholeStep(t.role) ? 1 : 0;
    if (t.view_of != kNone) {
      At(f.views_of, t.view_of).push_back(t.id);
      continue;
    }
    if (counted_role[static_cast<size_t>(t.role)] &&
        (problem.profile.count_parameter_gradients || !IsParameterGradient(step, t))) {
      At(f.counted, t.id) = t.bytes();
    }
  }
  f.last_forward_use.assign(tensors, kNone);
  f.first_later_use.assign(tensors, kNever);
  f.first_later_read.assign(tensors, kNever);
  f.readers.resize(tensors);
  // A storage a later hold reads (IsHoldOp: the loop's outputs) keeps its
  // GPU copy whatever the plan, so offloading it would free nothing.
  std::vector<uint8_t> held_later(tensors, 0);
  for (const Op& op : step.ops()) {
    const bool later = op.id >= f.forward_end;
    if (later && IsHoldOp(op)) {
      for (TensorId in : op.inputs) At(held_later, At(f.storage, in)) = 1;
    }
    auto touch = [&](TensorId t) {
      const TensorId s = At(f.storage, t);
      if (!later) {
        At(f.last_forward_use, s) = op.id;
      } else if (At(f.first_later_use, s) == kNever) {
        At(f.first_later_use, s) = op.id;
      }
    };
    for (TensorId in : op.inputs) {
      touch(in);
      At(f.readers, in).push_back(op.id);
      if (later && At(f.first_later_read, in) == kNever) At(f.first_later_read, in) = op.id;
    }
    for (TensorId out : op.outputs) touch(out);
  }
  for (const Tensor& t : step.tensors()) {
    const OpId producer = step.producer(t.id);
    const OpId last = At(f.last_forward_use, t.id);
    const OpId next = At(f.first_later_use, t.id);
    if (t.view_of != kNone || producer == kNone || producer >= f.forward_end || At(f.counted, t.id) == 0 ||
        At(f.whole_step, t.id) || At(held_later, t.id) || next == kNever || last == kNone || next - last < 2) {
      continue;
    }
    f.saved.push_back(t.id);
  }
  // As ValidateSchedule starts: what no op produces exists from the start.
  f.initial_latest.assign(tensors, -1);
  for (const Tensor& t : step.tensors()) {
    if (step.producer(t.id) != kNone || t.view_of != kNone) continue;
    At(f.initial_latest, t.id) = static_cast<int32_t>(f.initial_records.size());
    f.initial_records.push_back(t.id);
  }
  for (const Tensor& t : step.tensors()) {
    if (step.producer(t.id) == kNone && t.view_of != kNone) {
      At(f.initial_latest, t.id) = At(f.initial_latest, t.view_of);
    }
  }
  for (double c : problem.op_cost) f.base_cost += c;
  return f;
}

struct SimResult {
  uint64_t peak = 0;
  double excess = 0;  // bytes over budget summed over entries (offloads aside: Greedy::LivePerOp)
  size_t peak_entry = 0;
  double step_cost = 0;
  uint64_t host_peak = 0;
  std::vector<uint64_t> live;     // by entry
  std::vector<double> read_wait;  // by tensor: compute stalled on its prefetched copy
};

// Note [Planner simulation]
// The greedy prices thousands of candidate schedules; materializing each as
// a Graph (MaterializeSchedule copies every op and tensor, names included)
// would take about a millisecond apiece for a 32-layer step. The simulator
// replays a schedule over copy records as ValidateSchedule does (one record
// per compute, replay or prefetch of a storage; views share their base's
// record) and prices it as Note [Plan costs] says, with flat vectors reused
// between runs. It must agree with EvaluateSchedule: the planners check
// their result with EvaluateSchedule, and the tests compare the two.
class Simulator {
 public:
  explicit Simulator(const StepFacts& facts) : f_(facts) {}

  void Run(const Schedule& schedule, SimResult& out) {
    const Graph& step = *f_.step;
    const PlanProblem& problem = *f_.problem;
    latest_ = f_.initial_latest;
    records_.clear();
    for (TensorId t : f_.initial_records) records_.push_back({.tensor = t});
    offload_done_.assign(step.num_tensors(), 0);
    out.read_wait.assign(step.num_tensors(), 0);
    auto copy_time = [&](uint64_t bytes) { return static_cast<double>(bytes) / problem.copy_bytes_per_cost; };
    double now = 0, d2h_free = 0, h2d_free = 0, extra = 0, waits = 0;
    uint64_t host = 0;
    out.host_peak = 0;
    for (size_t i = 0; i < schedule.entries.size(); ++i) {
      const ScheduleEntry& entry = schedule.entries[i];
      const auto at = static_cast<int32_t>(i);
      switch (entry.action) {
        case ScheduleAction::kCompute:
        case ScheduleAction::kRecompute: {
          const Op& op = step.op(entry.target);
          double start = now;
          int32_t waited_on = -1;
          for (TensorId in : op.inputs) {
            const int32_t r = At(latest_, in);
            if (At(records_, r).ready > start) {
              start = At(records_, r).ready;
              waited_on = r;
            }
          }
          if (waited_on >= 0) At(out.read_wait, At(records_, waited_on).tensor) += start - now;
          waits += start - now;
          const double cost = At(problem.op_cost, entry.target);
          now = start + cost;
          if (entry.action == ScheduleAction::kRecompute) extra += cost;
          for (TensorId in : op.inputs) Touch(At(latest_, in), at, now);
          for (TensorId o : op.outputs) {
            const TensorId base = At(f_.view_of, o);
            if (base != kNone) {
              At(latest_, o) = At(latest_, base);
              Touch(At(latest_, base), at, now);
            } else {
              At(latest_, o) = static_cast<int32_t>(records_.size());
              AddRecord(o, at, now, 0);
            }
          }
          break;
        }
        case ScheduleAction::kOffload: {
          Record& r = At(records_, At(latest_, entry.target));
          r.last = at;
          const uint64_t bytes = At(f_.bytes, entry.target);
          const double done = std::max(r.touch, d2h_free) + copy_time(bytes);
          d2h_free = done;
          At(offload_done_, entry.target) = done;
          if (done > now) {
            waits += done - now;
            now = done;
          }
          host += bytes;
          out.host_peak = std::max(out.host_peak, host);
          break;
        }
        case ScheduleAction::kPrefetch: {
          const uint64_t bytes = At(f_.bytes, entry.target);
          const double done = std::max({now, h2d_free, At(offload_done_, entry.target)}) + copy_time(bytes);
          h2d_free = done;
          const auto r = static_cast<int32_t>(records_.size());
          AddRecord(entry.target, at, 0, done);
          At(latest_, entry.target) = r;
          for (TensorId v : At(f_.views_of, entry.target)) {
            if (At(latest_, v) >= 0) At(latest_, v) = r;
          }
          host -= std::min(host, bytes);
          break;
        }
      }
    }
    const size_t n = schedule.entries.size();
    delta_.assign(n + 1, 0);
    for (const Record& r : records_) {
      const uint64_t bytes = At(f_.counted, r.tensor);
      if (bytes == 0 || n == 0) continue;
      const bool whole = At(f_.whole_step, r.tensor) != 0;
      if (!whole && At(f_.producer, r.tensor) == kNone) continue;  // never allocated
      delta_[whole ? 0 : static_cast<size_t>(r.first)] += static_cast<int64_t>(bytes);
      delta_[whole ? n : static_cast<size_t>(r.last) + 1] -= static_cast<int64_t>(bytes);
    }
    out.live.resize(n);
    out.peak = 0;
    out.peak_entry = 0;
    out.excess = 0;
    int64_t live = 0;
    for (size_t i = 0; i < n; ++i) {
      live += delta_[i];
      out.live[i] = static_cast<uint64_t>(live);
      if (out.live[i] > problem.budget && schedule.entries[i].action != ScheduleAction::kOffload) {
        out.excess += static_cast<double>(out.live[i] - problem.budget);
      }
      if (out.live[i] > out.peak) {
        out.peak = out.live[i];
        out.peak_entry = i;
      }
    }
    out.step_cost = f_.base_cost + extra + waits;
  }

 private:
  struct Record {
    TensorId tensor = kNone;
    int32_t first = 0;  // entry that makes it
    int32_t last = 0;   // last entry that touches it
    double touch = 0;   // when its last toucher ended (an offload's copy starts then)
    double ready = 0;   // when a prefetched copy lands
  };

  // Field by field: a braced temporary is built on the stack and copied with
  // wider loads than its stores, which stalls this hottest line.
  void AddRecord(TensorId tensor, int32_t at, double touch, double ready) {
    Record& r = records_.emplace_back();
    r.tensor = tensor;
    r.first = at;
    r.last = at;
    r.touch = touch;
    r.ready = ready;
  }

  void Touch(int32_t record, int32_t at, double now) {
    Record& r = At(records_, record);
    r.last = at;
    r.touch = now;
  }

  const StepFacts& f_;
  std::vector<int32_t> latest_;
  std::vector<Record> records_;
  std::vector<double> offload_done_;
  std::vector<int64_t> delta_;
};

// The planner's decisions, by tensor (only saved tensors change).
struct Decisions {
  std::vector<Choice> choice;
  std::vector<OpId> offload_by;       // the kOffload entry comes after this op at the latest
  std::vector<OpId> prefetch_from;    // the kPrefetch entry comes before this op at the earliest
  std::vector<double> prefetch_lead;  // issue the prefetch this much sooner than just in time
  std::vector<TensorId> order;        // tensors given offload or recompute, in the order chosen
  bool chain_prefetches = true;       // place prefetches through the H2D queue (Build)

  explicit Decisions(size_t tensors)
      : choice(tensors, Choice::kKeep),
        offload_by(tensors, kNever),
        prefetch_from(tensors, 0),
        prefetch_lead(tensors, 0) {}
};

// A schedule written out from decisions, with where each thing went.
struct Built {
  Schedule schedule;
  std::vector<size_t> compute_entry;  // by op: its kCompute entry
  std::vector<uint8_t> replayed;      // by op
  std::vector<Choice> mode;           // by tensor: what the schedule does with each saved tensor
  std::vector<OpId> deadline;         // by tensor: first use after the forward side, replays included
  std::vector<OpId> offload_after;    // by tensor: the op its kOffload entry follows
  std::vector<OpId> prefetch_at;      // by tensor: the op its kPrefetch entry precedes
  std::vector<double> slot_start;     // by op, and one past: when the entries before it start, without waits
};

// Adds `first` to the replayed ops and then what its replay needs (Note
// [Hybrid planning]): producers of inputs not resident when it runs, and
// producers of views of replayed outputs that later ops or replays read.
// Appends what it adds to `added`.
void AddReplay(const StepFacts& f, const std::vector<Choice>& choice, OpId first, std::vector<uint8_t>& replayed,
               std::vector<OpId>& added) {
  const Graph& step = *f.step;
  size_t next = added.size();
  auto add = [&](OpId op) {
    if (op == kNone || op >= f.forward_end || At(replayed, op) || !IsRecomputable(step.op(op))) return;
    At(replayed, op) = 1;
    added.push_back(op);
  };
  add(first);
  while (next < added.size()) {
    const Op& op = step.op(added[next++]);
    for (TensorId o : op.outputs) {
      if (At(f.view_of, o) != kNone) continue;
      for (TensorId v : At(f.views_of, o)) {
        bool read = At(f.first_later_read, v) != kNever;
        for (OpId r : At(f.readers, v)) read = read || At(replayed, r);
        if (read) add(step.producer(v));
      }
    }
    for (TensorId in : op.inputs) {
      const TensorId s = At(f.storage, in);
      const OpId producer = step.producer(s);
      if (producer == kNone) continue;
      // Kept and offloaded tensors are on the device when read later; the
      // rest (not saved, or recomputed) must be replayed too.
      const bool resident =
          At(f.first_later_use, s) != kNever && At(choice, s) != Choice::kRecompute && !At(replayed, producer);
      if (resident) continue;
      add(producer);
      if (in != s) add(step.producer(in));
    }
  }
}

// Note [Offload planning]: writes `d` out as a schedule.
Built Build(const StepFacts& f, const Decisions& d) {
  const Graph& step = *f.step;
  const PlanProblem& problem = *f.problem;
  const auto ops = static_cast<size_t>(f.num_ops);
  Built b;
  b.replayed.assign(ops, 0);
  std::vector<OpId> added;
  for (TensorId s : f.saved) {
    if (At(d.choice, s) == Choice::kRecompute) AddReplay(f, d.choice, step.producer(s), b.replayed, added);
  }
  // Each replay runs right before the first later op or replay reading one
  // of its outputs; consumers come later in program order, so one backward
  // sweep settles every slot.
  std::vector<OpId> replay_at(ops, kNever);
  for (OpId y = f.forward_end - 1; y >= 0; --y) {
    if (!At(b.replayed, y)) continue;
    OpId at = At(replay_at, y);
    for (TensorId o : step.op(y).outputs) at = std::min(at, At(f.first_later_read, o));
    if (at == kNever) {  // nobody reads what it would make
      At(b.replayed, y) = 0;
      continue;
    }
    At(replay_at, y) = at;
    for (TensorId in : step.op(y).inputs) {
      const OpId producer = step.producer(in);
      if (producer != kNone && At(b.replayed, producer)) At(replay_at, producer) = std::min(At(replay_at, producer), at);
    }
  }
  const size_t tensors = step.num_tensors();
  b.mode.assign(tensors, Choice::kKeep);
  b.deadline.assign(tensors, kNever);
  b.offload_after.assign(tensors, kNever);
  b.prefetch_at.assign(tensors, kNever);
  for (TensorId s : f.saved) {
    At(b.deadline, s) = At(f.first_later_use, s);
    if (At(b.replayed, step.producer(s))) {
      At(b.mode, s) = Choice::kRecompute;
    } else if (At(d.choice, s) == Choice::kOffload) {
      At(b.mode, s) = Choice::kOffload;
    }
  }
  std::vector<double> replay_cost(ops, 0);
  for (OpId y = 0; y < f.forward_end; ++y) {
    if (!At(b.replayed, y)) continue;
    At(replay_cost, At(replay_at, y)) += At(problem.op_cost, y);
    for (TensorId in : step.op(y).inputs) {
      const TensorId s = At(f.storage, in);
      At(b.deadline, s) = std::min(At(b.deadline, s), At(replay_at, y));
    }
  }
  b.slot_start.assign(ops + 1, 0);
  for (size_t i = 0; i < ops; ++i) b.slot_start[i + 1] = b.slot_start[i] + replay_cost[i] + problem.op_cost[i];

  std::vector<TensorId> offloaded;
  for (TensorId s : f.saved) {
    if (At(b.mode, s) == Choice::kOffload) offloaded.push_back(s);
  }
  // Prefetches just in time through the H2D queue (first in, first out):
  // latest deadline first, each lands before its first reader and before
  // the next one issues. Without chain_prefetches, each as if it had the
  // engine to itself: less device memory held, more waits.
  if (d.chain_prefetches) {
    std::sort(offloaded.begin(), offloaded.end(), [&b](TensorId x, TensorId y) {
      return At(b.deadline, x) != At(b.deadline, y) ? At(b.deadline, x) > At(b.deadline, y) : x > y;
    });
  }
  double next_issue = std::numeric_limits<double>::infinity();
  for (TensorId s : offloaded) {
    const OpId deadline = At(b.deadline, s);
    double land = At(b.slot_start, deadline);
    if (d.chain_prefetches) land = std::min(land, next_issue);
    const double start = land - f.CopyTime(s) - At(d.prefetch_lead, s);
    const OpId lo = std::min(std::max(At(d.prefetch_from, s), At(f.last_forward_use, s) + 1), deadline);
    const auto first = b.slot_start.begin() + lo;
    const auto last = b.slot_start.begin() + deadline + 1;
    const auto slot = static_cast<OpId>(std::upper_bound(first, last, start) - b.slot_start.begin()) - 1;
    At(b.prefetch_at, s) = std::max(slot, lo);
    next_issue = At(b.slot_start, At(b.prefetch_at, s));
  }
  // Offloads through the D2H queue in order of last forward use: each entry
  // follows the first op that ends after its copy completes, or the op the
  // plan needs it gone after, waiting for it (and for the copies ahead of it).
  std::sort(offloaded.begin(), offloaded.end(), [&f](TensorId x, TensorId y) {
    return At(f.last_forward_use, x) != At(f.last_forward_use, y) ? At(f.last_forward_use, x) < At(f.last_forward_use, y)
                                                                  : x < y;
  });
  std::vector<int64_t> force_upto(ops, -1);  // by op: queue position that must be done after it
  for (size_t k = 0; k < offloaded.size(); ++k) {
    const TensorId s = offloaded[k];
    const OpId limit = std::min(At(d.offload_by, s), At(b.prefetch_at, s) - 1);
    At(force_upto, limit) = std::max(At(force_upto, limit), static_cast<int64_t>(k));
  }
  std::vector<double> done(offloaded.size(), 0);
  double now = 0, d2h_free = 0;
  size_t issued = 0, emitted = 0;
  int64_t must = -1;
  for (OpId i = 0; i < f.num_ops; ++i) {
    now += At(replay_cost, i) + At(problem.op_cost, i);
    for (; issued < offloaded.size() && At(f.last_forward_use, offloaded[issued]) == i; ++issued) {
      done[issued] = std::max(now, d2h_free) + f.CopyTime(offloaded[issued]);
      d2h_free = done[issued];
    }
    must = std::max(must, At(force_upto, i));
    for (; emitted < issued && (static_cast<int64_t>(emitted) <= must || done[emitted] <= now); ++emitted) {
      now = std::max(now, done[emitted]);
      At(b.offload_after, offloaded[emitted]) = i;
    }
  }

  struct Item {
    OpId slot;     // the entry goes before this op's compute (num_ops: after the last)
    int rank;      // offloads, then prefetches, then replays
    int64_t key;   // order within the rank
    ScheduleEntry entry;
  };
  std::vector<Item> items;
  for (size_t k = 0; k < offloaded.size(); ++k) {
    const TensorId s = offloaded[k];
    items.push_back({At(b.offload_after, s) + 1, 0, static_cast<int64_t>(k), {ScheduleAction::kOffload, s}});
    items.push_back({At(b.prefetch_at, s), 1, int64_t{At(b.deadline, s)} * static_cast<int64_t>(tensors) + s,
                     {ScheduleAction::kPrefetch, s}});
  }
  for (OpId y = 0; y < f.forward_end; ++y) {
    if (At(b.replayed, y)) items.push_back({At(replay_at, y), 2, y, {ScheduleAction::kRecompute, y}});
  }
  std::sort(items.begin(), items.end(), [](const Item& x, const Item& y) {
    return std::tie(x.slot, x.rank, x.key) < std::tie(y.slot, y.rank, y.key);
  });
  b.schedule.entries.reserve(ops + items.size());
  b.compute_entry.resize(ops);
  size_t next = 0;
  for (OpId i = 0; i <= f.num_ops; ++i) {
    for (; next < items.size() && items[next].slot == i; ++next) b.schedule.entries.push_back(items[next].entry);
    if (i == f.num_ops) break;
    At(b.compute_entry, i) = b.schedule.entries.size();
    b.schedule.entries.push_back({ScheduleAction::kCompute, i});
  }
  return b;
}

// The op whose entries (replays, prefetches, itself) include `entry`: the
// first one computed at or after it. An offload never holds a peak alone (it
// frees what the op before it held), so this is where a peak is.
OpId ComputeAtOrAfter(const Schedule& schedule, size_t entry) {
  for (size_t i = entry; i < schedule.entries.size(); ++i) {
    if (schedule.entries[i].action == ScheduleAction::kCompute) return schedule.entries[i].target;
  }
  for (size_t i = schedule.entries.size(); i-- > 0;) {
    if (schedule.entries[i].action == ScheduleAction::kCompute) return schedule.entries[i].target;
  }
  return kNone;
}

struct PlanState {
  Decisions decisions;
  Built built;
  SimResult sim;
};

enum class MoveKind : uint8_t { kOffload, kRecompute, kHoldOff };

struct Move {
  MoveKind kind;
  TensorId tensor;
  OpId gone;     // off the device from this op
  OpId back;     // until this op (offload and hold-off)
  double score;  // estimated bytes x ops freed per unit of added cost; higher is tried first
};

// Note [Offload planning] and Note [Hybrid planning]: the greedy.
class Greedy {
 public:
  // `work`, when given: the schedule entries the greedy may still simulate,
  // shared with other searches (Note [Smallest offload peak work]).
  Greedy(const StepFacts& facts, bool offload, bool recompute, int64_t* work = nullptr)
      : f_(facts),
        offload_(offload && facts.problem->copy_bytes_per_cost > 0),
        recompute_(recompute),
        sim_(facts),
        state_{Decisions(facts.step->num_tensors()), {}, {}},
        work_(work) {
    Evaluate(state_);
    tolerance_ = std::max(1e-9 * f_.base_cost, 1e-30);
  }

  // Chooses decisions until the peak is within budget, then trims them.
  // Returns whether the plan fits.
  bool Run() {
    const uint64_t budget = f_.problem->budget;
    Remember(state_);
    // Every step adds a decision or tightens one, so the greedy ends on its
    // own; the bound caps a long tail of small tightenings.
    const size_t limit = 4 * f_.saved.size() + 64;
    for (size_t step = 0; step < limit && state_.sim.peak > budget && !OutOfWork(); ++step) {
      if (!Improve()) break;
      Remember(state_);
    }
    if (state_.sim.peak > budget) return false;
    // Note [Hybrid work]: trimming stops with the work, leaving a plan that fits.
    DropUnneeded();
    Relax();
    OtherPrefetchPlacement();
    PrefetchSooner();
    return true;
  }

  const PlanState& state() const { return state_; }
  bool out_of_work() const { return OutOfWork(); }
  uint64_t smallest_peak() const { return smallest_peak_; }
  OpId smallest_peak_op() const { return smallest_peak_op_; }

 private:
  void Evaluate(PlanState& s) {
    s.built = Build(f_, s.decisions);
    sim_.Run(s.built.schedule, s.sim);
    if (work_ != nullptr) *work_ -= static_cast<int64_t>(s.built.schedule.entries.size());
  }

  bool OutOfWork() const { return work_ != nullptr && *work_ <= 0; }

  OpId PeakOp(const PlanState& s) const { return ComputeAtOrAfter(s.built.schedule, s.sim.peak_entry); }

  // The most bytes live while each op's entries run (replays, prefetches,
  // itself). Offloads that precede them belong with the op before: the copy
  // completed after it.
  std::vector<uint64_t> LivePerOp(const PlanState& s) const {
    std::vector<uint64_t> live(static_cast<size_t>(f_.num_ops), 0);
    size_t begin = 0;
    for (OpId c = 0; c < f_.num_ops; ++c) {
      const size_t end = At(s.built.compute_entry, c);
      for (size_t i = begin; i <= end; ++i) {
        if (s.built.schedule.entries[i].action != ScheduleAction::kOffload) At(live, c) = std::max(At(live, c), s.sim.live[i]);
      }
      begin = end + 1;
    }
    return live;
  }

  void Remember(const PlanState& s) {
    if (s.sim.peak < smallest_peak_) {
      smallest_peak_ = s.sim.peak;
      smallest_peak_op_ = PeakOp(s);
    }
  }

  // The saved tensors resident at peak op c that could be off the device
  // over the window [lo, hi] of ops around it that are over budget, with the
  // estimate that orders their trials: the bytes times ops they would free
  // there, per unit of estimated added cost.
  std::vector<Move> Moves(const PlanState& s, OpId c, OpId lo, OpId hi) {
    const Graph& step = *f_.step;
    const Built& b = s.built;
    std::vector<Move> offloads, replays, holds;
    std::vector<uint8_t>& replayed = scratch_replayed_;
    replayed = b.replayed;
    // Each trial marks one tensor and puts it back, so the decisions are
    // copied once per call, not once per tensor (a 40k-op chain has 20k
    // tensors live at its peak: issue [13]).
    std::vector<Choice>& choice = scratch_choice_;
    choice = s.decisions.choice;
    auto window_of = [&](TensorId t, OpId deadline) {
      return std::make_pair(std::max(lo, At(f_.last_forward_use, t) + 1), std::min(hi + 1, deadline));
    };
    for (TensorId t : f_.saved) {
      const OpId last = At(f_.last_forward_use, t);
      const OpId deadline = At(b.deadline, t);
      if (!(last < c && c < deadline)) continue;
      const auto bytes = static_cast<double>(At(f_.counted, t));
      const auto [gone, back] = window_of(t, deadline);
      if (At(b.mode, t) == Choice::kOffload) {
        const OpId more = std::max(0, At(b.offload_after, t) - gone + 1) + std::max(0, back - At(b.prefetch_at, t));
        if (more > 0) holds.push_back({MoveKind::kHoldOff, t, gone, back, bytes * more});
        continue;
      }
      if (At(b.mode, t) != Choice::kKeep || At(s.decisions.choice, t) != Choice::kKeep) continue;
      const auto area = bytes * (back - gone);
      if (offload_) {
        // Time for the copy out before the window and back after it, from
        // the timeline alone (queue contention shows up in the trial).
        const double copy = f_.CopyTime(t);
        const double out = At(b.slot_start, gone) - At(b.slot_start, last + 1);
        const double in = At(b.slot_start, deadline) - At(b.slot_start, back);
        const double wait = std::max(0.0, copy - out) + std::max(0.0, copy - in);
        offloads.push_back({MoveKind::kOffload, t, gone, back, area / (wait + tolerance_)});
      }
      if (recompute_ && IsRecomputable(step.op(step.producer(t)))) {
        // What replaying t's producer (and its chain) would add and free.
        added_.clear();
        At(choice, t) = Choice::kRecompute;
        AddReplay(f_, choice, step.producer(t), replayed, added_);
        At(choice, t) = Choice::kKeep;
        double cost = 0, freed = 0;
        for (OpId y : added_) {
          cost += At(f_.problem->op_cost, y);
          for (TensorId o : step.op(y).outputs) {
            if (o != At(f_.storage, o) || At(b.mode, o) == Choice::kRecompute) continue;
            if (!(At(f_.last_forward_use, o) < c && c < At(b.deadline, o))) continue;
            const auto [from, to] = window_of(o, At(b.deadline, o));
            freed += static_cast<double>(At(f_.counted, o)) * (to - from);
          }
        }
        for (OpId y : added_) At(replayed, y) = 0;
        if (freed > 0) replays.push_back({MoveKind::kRecompute, t, gone, back, freed / (cost + tolerance_)});
      }
    }
    auto best = [](std::vector<Move>& moves, size_t n) {
      const auto keep = static_cast<ptrdiff_t>(std::min(n, moves.size()));
      std::partial_sort(moves.begin(), moves.begin() + keep, moves.end(), [](const Move& x, const Move& y) {
        return x.score != y.score ? x.score > y.score : x.tensor < y.tensor;
      });
      moves.resize(static_cast<size_t>(keep));
    };
    best(offloads, kTrials);
    best(replays, kTrials);
    best(holds, kTrials / 2);
    std::vector<Move> moves = std::move(offloads);
    moves.insert(moves.end(), replays.begin(), replays.end());
    moves.insert(moves.end(), holds.begin(), holds.end());
    return moves;
  }

  static Decisions Apply(const Decisions& d, const Move& m) {
    Decisions next = d;
    if (m.kind == MoveKind::kRecompute) {
      At(next.choice, m.tensor) = Choice::kRecompute;
      next.order.push_back(m.tensor);
      return next;
    }
    if (m.kind == MoveKind::kOffload) {
      At(next.choice, m.tensor) = Choice::kOffload;
      next.order.push_back(m.tensor);
    }
    // Off the device over the window: gone before it, back after it.
    At(next.offload_by, m.tensor) = std::min(At(next.offload_by, m.tensor), m.gone - 1);
    At(next.prefetch_from, m.tensor) = std::max(At(next.prefetch_from, m.tensor), m.back);
    return next;
  }

  // One greedy step at the current peak: of the moves tried, the one that
  // removes the most bytes x ops over budget per unit of added step cost,
  // without raising the peak. False when none removes any.
  bool Improve() {
    const OpId c = PeakOp(state_);
    const std::vector<uint64_t> live = LivePerOp(state_);
    const uint64_t budget = f_.problem->budget;
    OpId lo = c, hi = c;
    while (lo > 0 && At(live, lo - 1) > budget) --lo;
    while (hi + 1 < f_.num_ops && At(live, hi + 1) > budget) ++hi;
    const std::vector<Move> moves = Moves(state_, c, lo, hi);
    std::optional<PlanState> chosen;
    double chosen_ratio = 0;
    for (const Move& m : moves) {
      PlanState trial{Apply(state_.decisions, m), {}, {}};
      Evaluate(trial);
      if (trial.sim.peak > state_.sim.peak || trial.sim.excess >= state_.sim.excess) continue;
      const double removed = state_.sim.excess - trial.sim.excess;
      const double added = std::max(0.0, trial.sim.step_cost - state_.sim.step_cost);
      const double ratio = removed / (added + tolerance_);
      if (!chosen || ratio > chosen_ratio) {
        chosen_ratio = ratio;
        chosen = std::move(trial);
      }
    }
    if (!chosen) return false;
    state_ = *std::move(chosen);
    return true;
  }

  bool Better(const PlanState& trial) const {
    return trial.sim.peak <= f_.problem->budget && trial.sim.step_cost <= state_.sim.step_cost + tolerance_;
  }

  // Lets offloads complete and prefetches start where the queues put them
  // again, where a constraint an earlier peak set is no longer needed.
  void Relax() {
    for (TensorId t : f_.saved) {
      if (OutOfWork()) return;
      if (At(state_.built.mode, t) != Choice::kOffload) continue;
      if (At(state_.decisions.offload_by, t) == kNever && At(state_.decisions.prefetch_from, t) == 0) continue;
      PlanState trial{state_.decisions, {}, {}};
      At(trial.decisions.offload_by, t) = kNever;
      At(trial.decisions.prefetch_from, t) = 0;
      Evaluate(trial);
      if (Better(trial) && trial.sim.step_cost < state_.sim.step_cost - tolerance_) state_ = std::move(trial);
    }
  }

  // Tries the other prefetch placement (Build): unchained prefetches hold
  // less memory, chained ones wait less.
  void OtherPrefetchPlacement() {
    if (OutOfWork()) return;
    PlanState trial{state_.decisions, {}, {}};
    trial.decisions.chain_prefetches = !trial.decisions.chain_prefetches;
    Evaluate(trial);
    if (Better(trial) && trial.sim.step_cost < state_.sim.step_cost - tolerance_) state_ = std::move(trial);
  }

  // Undoes, latest first, the decisions the plan no longer needs.
  void DropUnneeded() {
    const std::vector<TensorId> order = state_.decisions.order;
    for (auto it = order.rbegin(); it != order.rend() && !OutOfWork(); ++it) {
      const TensorId t = *it;
      if (At(state_.decisions.choice, t) == Choice::kKeep) continue;
      PlanState trial{state_.decisions, {}, {}};
      At(trial.decisions.choice, t) = Choice::kKeep;
      At(trial.decisions.offload_by, t) = kNever;
      At(trial.decisions.prefetch_from, t) = 0;
      At(trial.decisions.prefetch_lead, t) = 0;
      Evaluate(trial);
      if (Better(trial)) state_ = std::move(trial);
    }
  }

  // Issues sooner the prefetches that compute waited for, first needed
  // first (an early one late in the H2D queue delays the rest).
  void PrefetchSooner() {
    for (int round = 0; round < 3; ++round) {
      std::vector<TensorId> waited;
      for (TensorId t : f_.saved) {
        if (At(state_.built.mode, t) == Choice::kOffload && At(state_.sim.read_wait, t) > tolerance_) waited.push_back(t);
      }
      if (waited.empty()) return;
      std::sort(waited.begin(), waited.end(), [this](TensorId x, TensorId y) {
        const OpId dx = At(state_.built.deadline, x), dy = At(state_.built.deadline, y);
        return dx != dy ? dx < dy : x < y;
      });
      for (TensorId t : waited) {
        if (OutOfWork()) return;
        const double wait = At(state_.sim.read_wait, t);
        if (wait <= tolerance_) continue;  // an earlier move took care of it
        PlanState trial{state_.decisions, {}, {}};
        At(trial.decisions.prefetch_lead, t) += wait;
        Evaluate(trial);
        if (Better(trial) && trial.sim.step_cost < state_.sim.step_cost - tolerance_) state_ = std::move(trial);
      }
    }
  }

  static constexpr size_t kTrials = 4;  // per kind and peak

  const StepFacts& f_;
  const bool offload_;
  const bool recompute_;
  Simulator sim_;
  PlanState state_;
  double tolerance_ = 0;  // costs closer than this are equal
  uint64_t smallest_peak_ = std::numeric_limits<uint64_t>::max();
  OpId smallest_peak_op_ = kNone;
  std::vector<uint8_t> scratch_replayed_;
  std::vector<Choice> scratch_choice_;
  std::vector<OpId> added_;
  int64_t* work_ = nullptr;
};

// Prunes what the plan does not need and checks it with EvaluateSchedule:
// the simulator and the greedy vouch for nothing on their own.
absl::StatusOr<Schedule> Finish(const StepFacts& f, const Schedule& schedule, std::string_view planner) {
  const PlanProblem& problem = *f.problem;
  HEADROOM_ASSIGN_OR_RETURN(Schedule pruned, PruneSchedule(*problem.step, schedule));
  HEADROOM_ASSIGN_OR_RETURN(PlanEvaluation e, EvaluateSchedule(problem, pruned));
  if (e.peak_bytes > problem.budget) {
    return absl::InternalError(absl::StrFormat(
        "%s planned step %s within %d bytes, but EvaluateSchedule finds a peak of %d bytes at entry %d", planner,
        QuoteForError(problem.step->name()), problem.budget, e.peak_bytes, e.peak_entry));
  }
  // Note [Planner simulation]: a disagreement means the plan was chosen on
  // wrong figures.
  Simulator sim(f);
  SimResult r;
  sim.Run(pruned, r);
  const bool same_cost = std::abs(r.step_cost - e.step_cost) <= 1e-9 * std::max(1.0, std::abs(e.step_cost));
  if (r.peak != e.peak_bytes || r.host_peak != e.host_peak_bytes || !same_cost) {
    return absl::InternalError(absl::StrFormat(
        "%s: the planner's simulation of step %s (peak %d bytes, host %d bytes, cost %g) disagrees with "
        "EvaluateSchedule (peak %d bytes, host %d bytes, cost %g)",
        planner, QuoteForError(problem.step->name()), r.peak, r.host_peak, r.step_cost, e.peak_bytes,
        e.host_peak_bytes, e.step_cost));
  }
  return pruned;
}

uint64_t StoreAllPeak(const StepFacts& f) {
  Simulator sim(f);
  SimResult r;
  sim.Run(StoreAllSchedule(*f.step), r);
  return r.peak;
}

absl::Status Unreachable(const StepFacts& f, std::string_view what, uint64_t peak, OpId at) {
  const Graph& step = *f.step;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s cannot fit step %s in the budget of %d bytes: the smallest peak reached is %d bytes, at op %s", what,
      QuoteForError(step.name()), f.problem->budget, peak,
      at == kNone ? std::string("(none)") : QuoteForError(step.op(at).name)));
}

}  // namespace

absl::StatusOr<Schedule> PlanOffload(const PlanProblem& problem) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  const StepFacts f = MakeFacts(problem);
  const uint64_t store_all = StoreAllPeak(f);
  if (store_all <= problem.budget) return StoreAllSchedule(*problem.step);
  if (problem.copy_bytes_per_cost <= 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "step %s peaks at %d bytes, over the budget of %d bytes, and the plan problem's copy_bytes_per_cost is 0, "
        "so nothing can be offloaded",
        QuoteForError(problem.step->name()), store_all, problem.budget));
  }
  Greedy greedy(f, /*offload=*/true, /*recompute=*/false);
  if (!greedy.Run()) return Unreachable(f, "offload", greedy.smallest_peak(), greedy.smallest_peak_op());
  return Finish(f, greedy.state().built.schedule, "PlanOffload");
}

namespace {

// Budgets SmallestOffloadPeak tries: the least peak to within
// 2^-10 of the store-all peak.
constexpr int kSmallestPeakRounds = 10;

// Note [Smallest offload peak work]
// Each round of SmallestOffloadPeak runs the greedy (three greedies and the
// checkpoint modes for hybrid), and a greedy under a budget it cannot meet
// runs until no move lowers the peak: on Gemma-3-1B's 4,225-op step the ten
// rounds took 37 s of CPU, all of it on the error path of a budget no plan
// meets (issue [13]). So the rounds share a work limit, counted in schedule
// entries simulated (the greedy's cost is its simulations): when it is
// spent the greedy in hand stops, the bisection ends, and the least peak
// reached so far is returned. It counts work, not time, so the figure is
// the same on every machine; it is a peak some plan reached, as before, only
// perhaps further above the least. Steps of up to about a thousand ops
// finish all ten rounds within it.
constexpr int64_t kSmallestPeakWork = 40'000'000;

// Note [Hybrid work]
// PlanHybrid's greedies cost one simulation of the whole schedule per trial
// and a few trials per decision, and a long step needs decisions in
// proportion to its length: a 40,001-op node-link chain at 50% took 76 s of
// CPU, a failing plan for Gemma-3-1B's step 3 s (issue [13]). So the
// greedies of one PlanHybrid call share a work limit, counted as
// SmallestOffloadPeak's is, in schedule entries simulated (the same on every
// machine). When it is spent the greedy in hand stops: if its plan already
// fits, trimming it (dropping decisions it no longer needs, moving copies)
// stops there; if not, it is not a candidate, and chen-greedy's and sqrt-n's
// plans join the checkpoint modes as candidates, so that the answer is still
// the cheapest of those that fit. The plan's detail says the limit was
// reached. Every preset's plans at 80% and 45% finish within it, and so
// does a 10,001-op chain at 50% (97M entries); a 40,001-op one does not
// (150M took 7-10 s of CPU there, on a loaded machine, CLI included).
// The replans of one RunStrategy (Note [Pipeline budgets] in planner.cc)
// share one such limit.

// Every hybrid candidate (Note [Hybrid planning]) within the budget, and the
// smallest peak any of them reached.
struct HybridSearch {
  struct Candidate {
    Schedule schedule;
    SimResult sim;
    std::string_view name;  // what made it
  };
  std::vector<Candidate> candidates;
  uint64_t smallest = std::numeric_limits<uint64_t>::max();
  OpId smallest_at = kNone;
  bool out_of_work = false;  // a greedy stopped at the work limit (Note [Hybrid work])
};

HybridSearch SearchHybrid(const StepFacts& f, int64_t* work = nullptr) {
  const PlanProblem& problem = *f.problem;
  const Graph& step = *problem.step;
  HybridSearch out;
  const bool offload = problem.copy_bytes_per_cost > 0;
  const std::vector<std::pair<bool, bool>> kinds =
      offload ? std::vector<std::pair<bool, bool>>{{true, true}, {true, false}, {false, true}}
              : std::vector<std::pair<bool, bool>>{{false, true}};
  for (const auto& [may_offload, may_recompute] : kinds) {
    Greedy greedy(f, may_offload, may_recompute, work);
    const bool fits = greedy.Run();
    if (greedy.smallest_peak() < out.smallest) {
      out.smallest = greedy.smallest_peak();
      out.smallest_at = greedy.smallest_peak_op();
    }
    if (fits) out.candidates.push_back({greedy.state().built.schedule, greedy.state().sim, "the greedy's"});
    out.out_of_work = out.out_of_work || greedy.out_of_work();
  }
  // Checkpoint modes over the step's own layers (PlanForMode reads only
  // forward ops, which keep their ids in the step).
  Simulator sim(f);
  auto add = [&](Schedule schedule, std::string_view name) {
    HybridSearch::Candidate c{std::move(schedule), {}, name};
    sim.Run(c.schedule, c.sim);
    if (c.sim.peak < out.smallest) {
      out.smallest = c.sim.peak;
      out.smallest_at = ComputeAtOrAfter(c.schedule, c.sim.peak_entry);
    }
    if (c.sim.peak <= problem.budget) out.candidates.push_back(std::move(c));
  };
  const std::vector<std::pair<CheckpointMode, int>> modes = {
      {CheckpointMode::kFull, 1}, {CheckpointMode::kEveryK, 2}, {CheckpointMode::kSqrtN, 1},
      {CheckpointMode::kSelective, 1}};
  for (const auto& [mode, every] : modes) {
    absl::StatusOr<CheckpointPlan> plan = PlanForMode(step, mode, every);
    if (!plan.ok() || plan->empty()) continue;
    absl::StatusOr<Schedule> segments = SegmentSchedule(step, *plan);
    if (!segments.ok()) continue;  // a step whose layers do not form segments
    add(*std::move(segments), "a checkpoint mode's");
  }
  if (out.out_of_work) {
    // Note [Hybrid work]: plans that need no search, as stand-ins.
    const ForwardCuts cuts = FindForwardCuts(step);
    absl::StatusOr<Schedule> chen = ChenGreedySchedule(problem, cuts);
    if (chen.ok()) add(*std::move(chen), "chen-greedy's");
    absl::StatusOr<Schedule> sqrt_n = SegmentSchedule(step, SqrtNPlan(step, cuts));
    if (sqrt_n.ok()) add(*std::move(sqrt_n), "sqrt-n's");
  }
  return out;
}

}  // namespace

absl::StatusOr<Schedule> PlanHybrid(const PlanProblem& problem) {
  HEADROOM_ASSIGN_OR_RETURN(HybridPlan plan, PlanHybridWithNote(problem));
  return std::move(plan.schedule);
}

absl::StatusOr<HybridPlan> PlanHybridWithNote(const PlanProblem& problem, int64_t* shared_work) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  const StepFacts f = MakeFacts(problem);
  if (StoreAllPeak(f) <= problem.budget) return HybridPlan{.schedule = StoreAllSchedule(*problem.step)};
  int64_t own_work = kHybridWork;
  int64_t& work = shared_work != nullptr ? *shared_work : own_work;
  HybridSearch search = SearchHybrid(f, &work);
  const std::string limit =
      absl::StrFormat("its search stopped at its work limit of %d simulated schedule entries%s", kHybridWork,
                      shared_work != nullptr ? ", shared with its replans" : "");
  if (search.candidates.empty()) {
    absl::Status error = Unreachable(f, "keeping, recomputing and offloading", search.smallest, search.smallest_at);
    if (!search.out_of_work) return error;
    return absl::Status(error.code(), absl::StrCat(error.message(), " (", limit, ")"));
  }
  const auto best = std::min_element(
      search.candidates.begin(), search.candidates.end(),
      [](const HybridSearch::Candidate& x, const HybridSearch::Candidate& y) {
        return x.sim.step_cost != y.sim.step_cost ? x.sim.step_cost < y.sim.step_cost
                                                  : x.sim.host_peak < y.sim.host_peak;
      });
  HEADROOM_ASSIGN_OR_RETURN(Schedule schedule, Finish(f, best->schedule, "PlanHybrid"));
  HybridPlan plan{.schedule = std::move(schedule)};
  if (search.out_of_work) plan.note = absl::StrFormat("%s: %s plan, the cheapest that fits", limit, best->name);
  return plan;
}

absl::StatusOr<uint64_t> SmallestOffloadPeak(const PlanProblem& problem, bool hybrid) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  const uint64_t store_all = StoreAllPeak(MakeFacts(problem));
  if (!hybrid && problem.copy_bytes_per_cost <= 0) return store_all;
  // The greedy aims at the ops over its budget, so with no budget at all it
  // has nothing to aim at: search over budgets instead, keeping the least
  // peak reached, fitted or not (Note [Offload planning]).
  uint64_t smallest = store_all;
  uint64_t lo = 0;  // no plan found at or below
  uint64_t hi = store_all;
  int64_t work = kSmallestPeakWork;  // Note [Smallest offload peak work]
  for (int round = 0; round < kSmallestPeakRounds && hi - lo > 1 && work > 0; ++round) {
    PlanProblem at = problem;
    at.budget = lo + (hi - lo) / 2;
    const StepFacts f = MakeFacts(at);
    bool fits = false;
    if (hybrid) {
      const HybridSearch search = SearchHybrid(f, &work);
      smallest = std::min(smallest, search.smallest);
      fits = !search.candidates.empty();
    } else {
      Greedy greedy(f, /*offload=*/true, /*recompute=*/false, &work);
      fits = greedy.Run();
      smallest = std::min(smallest, fits ? greedy.state().sim.peak : greedy.smallest_peak());
    }
    if (fits) {
      hi = std::min(at.budget, smallest);
    } else {
      lo = at.budget;
    }
  }
  return smallest;
}

}  // namespace headroom
