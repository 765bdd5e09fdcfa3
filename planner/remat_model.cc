#include "planner/remat_model.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "graph/liveness.h"

namespace headroom::remat {
namespace {

// Roles that graph/liveness.h keeps for the whole step.
bool WholeStep(TensorRole role) {
  return role == TensorRole::kParameter || role == TensorRole::kBuffer || role == TensorRole::kInput ||
         role == TensorRole::kOptimizerState;
}

void InsertSorted(std::vector<int32_t>& v, int32_t x) {
  auto it = std::lower_bound(v.begin(), v.end(), x);
  if (it == v.end() || *it != x) v.insert(it, x);
}

}  // namespace

absl::StatusOr<Model> BuildModel(const PlanProblem& problem) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  const Graph& g = *problem.step;
  std::array<bool, 8> counted_role{};
  for (TensorRole role : problem.profile.counted_roles) counted_role[static_cast<size_t>(role)] = true;
  auto counted = [&](const Tensor& t) {
    if (!counted_role[static_cast<size_t>(t.role)] || t.view_of != kNone) return false;
    if (problem.profile.count_parameter_gradients) return true;
    return !IsParameterGradient(g, t);
  };
  auto storage = [&g](TensorId t) {
    const TensorId base = g.tensor(t).view_of;
    return base == kNone ? t : base;
  };

  Model m;
  m.n = static_cast<int32_t>(g.num_ops());
  const auto n = static_cast<size_t>(m.n);
  m.cost = problem.op_cost;
  m.bytes.assign(n, 0);
  m.recomputable.assign(n, 0);
  m.deps.resize(n);
  m.users.resize(n);
  m.aliases.resize(n);
  m.reads.resize(n);
  m.writes.resize(n);

  std::vector<int32_t> value_of(g.num_tensors(), -1);
  for (const Tensor& t : g.tensors()) {
    if (!counted(t)) continue;
    if (WholeStep(t.role)) {
      m.fixed_bytes += t.bytes();
    } else if (g.producer(t.id) != kNone && t.bytes() > 0) {
      value_of[static_cast<size_t>(t.id)] = static_cast<int32_t>(m.value_producer.size());
      m.value_producer.push_back(g.producer(t.id));
      m.value_bytes.push_back(t.bytes());
    }
  }

  for (const Op& op : g.ops()) {
    const auto i = static_cast<size_t>(op.id);
    m.recomputable[i] = IsRecomputable(op) ? 1 : 0;
    for (TensorId out : op.outputs) {
      const Tensor& t = g.tensor(out);
      if (const int32_t v = value_of[static_cast<size_t>(out)]; v >= 0) {
        m.bytes[i] += t.bytes();
        InsertSorted(m.writes[i], v);
      }
      if (t.view_of != kNone) {
        const OpId base_producer = g.producer(t.view_of);
        if (base_producer != kNone && base_producer != op.id) InsertSorted(m.aliases[i], base_producer);
      }
    }
    for (TensorId in : op.inputs) {
      for (TensorId t : {in, storage(in)}) {
        const OpId p = g.producer(t);
        if (p == kNone) continue;
        if (p >= op.id) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "op %d (%s) reads tensor %s made by op %d, not an earlier one: the step is not in program order",
              op.id, QuoteForError(op.name), QuoteForError(g.tensor(t).name), p));
        }
        InsertSorted(m.deps[i], p);
      }
      if (const int32_t v = value_of[static_cast<size_t>(storage(in))]; v >= 0) InsertSorted(m.reads[i], v);
    }
    for (int32_t a : m.aliases[i]) InsertSorted(m.deps[i], a);
    for (int32_t d : m.deps[i]) m.users[static_cast<size_t>(d)].push_back(op.id);
  }

  // What the training loop or autocast's cache holds (IsHoldOp) is the real
  // tensor, read once more when the hold ends: replaying its producer for
  // that read would only make a second copy, so it is kept.
  for (const Op& op : g.ops()) {
    if (!IsHoldOp(op)) continue;
    for (int32_t d : m.deps[static_cast<size_t>(op.id)]) m.recomputable[static_cast<size_t>(d)] = 0;
  }

  // Floors: a value made by a non-recomputable op has one copy, live from
  // its producer to its last reader; it spans every op strictly between.
  const size_t num_values = m.value_producer.size();
  m.value_last_reader.assign(num_values, -1);
  for (size_t i = 0; i < n; ++i) {
    for (int32_t v : m.reads[i]) m.value_last_reader[static_cast<size_t>(v)] = static_cast<int32_t>(i);
  }
  const std::vector<int32_t>& last_reader = m.value_last_reader;
  std::vector<int64_t> span_delta(n + 1, 0);
  for (size_t v = 0; v < num_values; ++v) {
    const int32_t p = m.value_producer[v];
    if (m.recomputable[static_cast<size_t>(p)] || last_reader[v] <= p + 1) continue;
    span_delta[static_cast<size_t>(p) + 1] += static_cast<int64_t>(m.value_bytes[v]);
    span_delta[static_cast<size_t>(last_reader[v])] -= static_cast<int64_t>(m.value_bytes[v]);
  }
  m.floor_at.assign(n, 0);
  int64_t spanning = 0;
  for (size_t i = 0; i < n; ++i) {
    spanning += span_delta[i];
    uint64_t io = 0;
    int64_t overlap = 0;  // spanning values that i reads, counted in io already
    for (int32_t v : m.reads[i]) {
      io += m.value_bytes[static_cast<size_t>(v)];
      const int32_t p = m.value_producer[static_cast<size_t>(v)];
      if (!m.recomputable[static_cast<size_t>(p)] && p < static_cast<int32_t>(i) &&
          static_cast<int32_t>(i) < last_reader[static_cast<size_t>(v)]) {
        overlap += static_cast<int64_t>(m.value_bytes[static_cast<size_t>(v)]);
      }
    }
    for (int32_t v : m.writes[i]) io += m.value_bytes[static_cast<size_t>(v)];
    m.floor_at[i] = m.fixed_bytes + io + static_cast<uint64_t>(spanning - overlap);
    m.floor = std::max(m.floor, m.floor_at[i]);
  }
  return m;
}

Simulation Simulate(const Model& model, std::span<const Step> steps) {
  Simulation sim;
  struct Copy {
    int32_t op;
    int32_t made;
    int32_t last;
    uint32_t alias_begin;
    uint32_t alias_end;
  };
  std::vector<Copy> copies;
  copies.reserve(steps.size());
  std::vector<int32_t> alias_pool;
  std::vector<int32_t> latest(static_cast<size_t>(model.n), -1);
  int32_t next_compute = 0;
  auto touch = [&](int32_t c, int32_t e) {
    Copy& copy = copies[static_cast<size_t>(c)];
    copy.last = e;
    for (uint32_t a = copy.alias_begin; a < copy.alias_end; ++a) {
      Copy& base = copies[static_cast<size_t>(alias_pool[a])];
      base.last = std::max(base.last, e);
    }
  };
  for (size_t e = 0; e < steps.size(); ++e) {
    const Step& step = steps[e];
    if (step.op < 0 || step.op >= model.n) return sim;
    const auto k = static_cast<size_t>(step.op);
    if (step.recompute) {
      if (!model.recomputable[k] || latest[k] < 0) return sim;
      sim.extra += model.cost[k];
      ++sim.recomputes;
    } else {
      if (step.op != next_compute) return sim;
      ++next_compute;
    }
    for (int32_t d : model.deps[k]) {
      const int32_t c = latest[static_cast<size_t>(d)];
      if (c < 0) return sim;
      touch(c, static_cast<int32_t>(e));
    }
    const auto alias_begin = static_cast<uint32_t>(alias_pool.size());
    for (int32_t a : model.aliases[k]) alias_pool.push_back(latest[static_cast<size_t>(a)]);
    copies.push_back({step.op, static_cast<int32_t>(e), static_cast<int32_t>(e), alias_begin,
                      static_cast<uint32_t>(alias_pool.size())});
    latest[k] = static_cast<int32_t>(copies.size() - 1);
  }
  if (next_compute != model.n) return sim;

  std::vector<int64_t> delta(steps.size() + 1, 0);
  for (const Copy& c : copies) {
    const auto bytes = static_cast<int64_t>(model.bytes[static_cast<size_t>(c.op)]);
    delta[static_cast<size_t>(c.made)] += bytes;
    delta[static_cast<size_t>(c.last) + 1] -= bytes;
  }
  sim.live.resize(steps.size());
  int64_t live = 0;
  for (size_t e = 0; e < steps.size(); ++e) {
    live += delta[e];
    const uint64_t bytes = model.fixed_bytes + static_cast<uint64_t>(live);
    sim.live[e] = bytes;
    if (sim.peak_entry < 0 || bytes > sim.peak) {
      sim.peak = bytes;
      sim.peak_entry = static_cast<int32_t>(e);
    }
  }
  sim.ok = true;
  return sim;
}

std::vector<Step> PruneSteps(const Model& model, std::span<const Step> steps) {
  // Copy ids per step and the copies each step reads.
  std::vector<int32_t> latest(static_cast<size_t>(model.n), -1);
  std::vector<uint32_t> read_begin(steps.size() + 1, 0);
  std::vector<int32_t> read_copy;
  for (size_t e = 0; e < steps.size(); ++e) {
    read_begin[e] = static_cast<uint32_t>(read_copy.size());
    const auto k = static_cast<size_t>(steps[e].op);
    for (int32_t d : model.deps[k]) read_copy.push_back(latest[static_cast<size_t>(d)]);
    latest[k] = static_cast<int32_t>(e);  // copy id = step index
  }
  read_begin[steps.size()] = static_cast<uint32_t>(read_copy.size());
  std::vector<int32_t> readers(steps.size(), 0);
  for (int32_t c : read_copy) {
    if (c >= 0) ++readers[static_cast<size_t>(c)];
  }
  std::vector<uint8_t> keep(steps.size(), 1);
  for (size_t e = steps.size(); e-- > 0;) {
    if (!steps[e].recompute || readers[e] > 0) continue;
    keep[e] = 0;
    for (uint32_t r = read_begin[e]; r < read_begin[e + 1]; ++r) {
      if (read_copy[r] >= 0) --readers[static_cast<size_t>(read_copy[r])];
    }
  }
  std::vector<Step> out;
  out.reserve(steps.size());
  for (size_t e = 0; e < steps.size(); ++e) {
    if (keep[e]) out.push_back(steps[e]);
  }
  return out;
}

std::vector<Step> DeriveSteps(const Model& model, const Retention& keep) {
  const auto n = static_cast<size_t>(model.n);
  std::vector<Step> steps;
  steps.reserve(2 * n);
  // Early replays by stage.
  std::vector<std::vector<int32_t>> early(n);
  for (size_t i = 0; i < n && i < keep.size(); ++i) {
    if (!model.recomputable[i]) continue;
    // Patterns are dense (n * n flags) and early replays rare: memchr
    // skips the rest at memory speed.
    const std::vector<uint8_t>& row = keep[i];
    const size_t end = std::min(row.size(), n);
    for (size_t t = i + 1; t < end;) {
      const void* hit = std::memchr(row.data() + t, kReplay, end - t);
      if (hit == nullptr) break;
      t = static_cast<size_t>(static_cast<const uint8_t*>(hit) - row.data());
      early[t].push_back(static_cast<int32_t>(i));
      ++t;
    }
  }
  std::vector<uint8_t> held(n, 0);
  std::vector<int32_t> mark(n, -1);  // stage that already replays the op
  std::vector<int32_t> replay;
  std::vector<std::pair<int32_t, size_t>> stack;  // (op, next dep to visit)
  // A held copy is dropped at the end of the first stage, from the one
  // that made it, whose flag is kDrop: found once, when the copy is made,
  // rather than by checking every held copy at every stage.
  std::vector<std::vector<int32_t>> drop_at(n);
  std::vector<int32_t> drop_stage(n, -1);
  auto hold = [&](int32_t op, size_t from) {
    held[static_cast<size_t>(op)] = 1;
    if (!model.recomputable[static_cast<size_t>(op)]) return;
    const std::vector<uint8_t>& row = keep[static_cast<size_t>(op)];
    size_t at = from;
    if (from < row.size()) {
      const void* hit = std::memchr(row.data() + from, kDrop, row.size() - from);
      at = hit == nullptr ? n : static_cast<size_t>(static_cast<const uint8_t*>(hit) - row.data());
    }
    drop_stage[static_cast<size_t>(op)] = static_cast<int32_t>(at);
    if (at < n) drop_at[at].push_back(op);
  };
  for (size_t t = 0; t < n; ++t) {
    const auto stage = static_cast<int32_t>(t);
    replay.clear();
    // Depth-first over what no held copy provides, from the compute's
    // inputs and the stage's early replays.
    auto need = [&](int32_t root) {
      if (held[static_cast<size_t>(root)] || mark[static_cast<size_t>(root)] == stage) return;
      mark[static_cast<size_t>(root)] = stage;
      stack.push_back({root, 0});
      while (!stack.empty()) {
        const int32_t op = stack.back().first;
        const std::vector<int32_t>& deps = model.deps[static_cast<size_t>(op)];
        if (stack.back().second < deps.size()) {
          const int32_t d = deps[stack.back().second++];
          if (!held[static_cast<size_t>(d)] && mark[static_cast<size_t>(d)] != stage) {
            mark[static_cast<size_t>(d)] = stage;
            stack.push_back({d, 0});
          }
        } else {
          replay.push_back(op);
          stack.pop_back();
        }
      }
    };
    for (int32_t d : model.deps[t]) need(d);
    for (int32_t i : early[t]) need(i);
    std::sort(replay.begin(), replay.end());
    for (int32_t op : replay) {
      steps.push_back({op, true});
      hold(op, t);
    }
    steps.push_back({stage, false});
    hold(stage, t);
    // Drop what the pattern does not hold past this stage.
    for (int32_t op : drop_at[t]) {
      if (drop_stage[static_cast<size_t>(op)] == stage) held[static_cast<size_t>(op)] = 0;
    }
  }
  return steps;
}

Schedule ToSchedule(std::span<const Step> steps) {
  Schedule s;
  s.entries.reserve(steps.size());
  for (const Step& step : steps) {
    s.entries.push_back({step.recompute ? ScheduleAction::kRecompute : ScheduleAction::kCompute, step.op});
  }
  return s;
}

Retention RetentionOf(const Model& model, const Schedule& schedule) {
  const auto n = static_cast<size_t>(model.n);
  Retention keep(n, std::vector<uint8_t>(n, kDrop));
  // First pass: the last entry reading each copy (copies named by the entry
  // that made them) under the latest-copy rule.
  std::vector<int64_t> copy_of(n, -1);
  std::vector<int64_t> last_read(schedule.entries.size(), -1);
  for (size_t k = 0; k < schedule.entries.size(); ++k) {
    const ScheduleEntry& e = schedule.entries[k];
    if (e.action != ScheduleAction::kCompute && e.action != ScheduleAction::kRecompute) continue;
    const auto op = static_cast<size_t>(e.target);
    if (op >= n) continue;
    for (int32_t d : model.deps[op]) {
      if (copy_of[static_cast<size_t>(d)] >= 0) last_read[static_cast<size_t>(copy_of[static_cast<size_t>(d)])] =
          static_cast<int64_t>(k);
    }
    copy_of[op] = static_cast<int64_t>(k);
  }
  // Second pass: at the end of each stage (the compute of op t), hold the
  // copies that are read later.
  std::fill(copy_of.begin(), copy_of.end(), -1);
  for (size_t k = 0; k < schedule.entries.size(); ++k) {
    const ScheduleEntry& e = schedule.entries[k];
    if (e.action != ScheduleAction::kCompute && e.action != ScheduleAction::kRecompute) continue;
    const auto op = static_cast<size_t>(e.target);
    if (op >= n) continue;
    copy_of[op] = static_cast<int64_t>(k);
    if (e.action != ScheduleAction::kCompute) continue;
    for (size_t i = 0; i <= op; ++i) {
      const int64_t copy = copy_of[i];
      if (copy >= 0 && last_read[static_cast<size_t>(copy)] > static_cast<int64_t>(k)) keep[i][op] = kHold;
    }
  }
  return keep;
}

}  // namespace headroom::remat
