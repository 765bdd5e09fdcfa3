#include "planner/remat_solver.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "graph/liveness.h"
#include "planner/remat_lp.h"
#include "planner/remat_model.h"

namespace headroom {
namespace {

using remat::LpOutcome;
using remat::Model;
using remat::Retention;
using remat::Simulation;
using remat::Step;

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

absl::StatusOr<Model> CheckedModel(const PlanProblem& problem) {
  HEADROOM_RETURN_IF_ERROR(ValidateProblem(problem));
  if (problem.step->num_ops() > kMaxRematOps) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan problem for %s: %d ops, more than the %d the rematerialization solvers take",
        QuoteForError(problem.step->name()), problem.step->num_ops(), kMaxRematOps));
  }
  return remat::BuildModel(problem);
}

std::string Percent(uint64_t bytes, uint64_t of) {
  return of == 0 ? "" : absl::StrFormat(" (%.1f%% of the store-all peak)", 100.0 * static_cast<double>(bytes) /
                                                                             static_cast<double>(of));
}

// Note [Remat work limits]: the LPs of one call, solved within the
// iterations they share, and what stopped one that did not finish.
class LpWork {
 public:
  explicit LpWork(const RematOptions& options)
      : options_(options),
        own_iterations_left_(options.lp_iterations),
        iterations_left_(options.shared_lp_iterations_left != nullptr ? *options.shared_lp_iterations_left
                                                                       : own_iterations_left_) {}

  absl::StatusOr<LpOutcome> Solve(const Model& model, uint64_t budget) {
    if (iterations_left_ <= 0) {
      stopped_by_iterations_ = true;
      return LpOutcome{};  // kStopped
    }
    HEADROOM_ASSIGN_OR_RETURN(LpOutcome lp,
                              remat::SolveBoundLp(model, budget,
                                                  {.time_limit_s = options_.lp_time_limit_s,
                                                   .max_iterations = iterations_left_,
                                                   .max_columns = options_.lp_max_columns}));
    iterations_left_ -= lp.iterations;
    if (lp.too_large) {
      too_large_columns_ = lp.columns;
    } else if (lp.status == LpOutcome::Status::kStopped) {
      (iterations_left_ <= 0 ? stopped_by_iterations_ : stopped_by_time_) = true;
    }
    return lp;
  }

  // Why an LP was not solved, in a few words; empty when none was stopped.
  std::string WhyStopped() const {
    if (too_large_columns_ > 0) {
      return absl::StrFormat("the LP's %d columns are over the %d it solves in seconds", too_large_columns_,
                             options_.lp_max_columns);
    }
    if (stopped_by_iterations_) {
      return absl::StrFormat("the LP stopped at its work limit of %d simplex iterations%s", options_.lp_iterations,
                             options_.shared_lp_iterations_left != nullptr ? ", shared with its replans" : "");
    }
    if (stopped_by_time_) return absl::StrFormat("the LP stopped at its time limit of %g s", options_.lp_time_limit_s);
    return "";
  }

 private:
  const RematOptions& options_;
  int64_t own_iterations_left_;
  int64_t& iterations_left_;  // own_iterations_left_ or the shared counter
  int too_large_columns_ = 0;
  bool stopped_by_iterations_ = false;
  bool stopped_by_time_ = false;
};

// Note [Remat search]
// A point of the search is a retention pattern (Note [Lazy derivation] in
// remat_model.h); its schedule and peak come from DeriveSteps and Simulate.
// The moves act on gaps: a gap of forward op i is a pair of consecutive
// stages a < b at which the schedule touches i (makes or reads a copy) with
// no touch between. A gap is either held (the copy from stage a is kept
// through it) or replayed (stage b replays i). Moves:
//  - fill a replayed gap: hold the copy through it, which removes that
//    replay and the replays of i's inputs done only for it (less compute,
//    more memory);
//  - drop across a gap at stage s (a < s <= b): drop the copy after stage a
//    and replay i in stage s, holding it from there to b. s = b replays
//    where the copy is needed; s just after the gap's highest stage frees
//    the copy across that stage only, where i's inputs may still be at hand.
//    On a replayed gap this moves the replay earlier.
// The search:
//  - repair: while the peak is over budget, take a drop across the peak's
//    stage or a fill of a gap replayed in it (a replay chain can be what
//    peaks): the cheapest that fits, else the one that takes the most bytes
//    off the peak per unit of compute it adds;
//  - descent: while within budget, fill the replayed gap that saves the
//    most compute and stays within budget;
//  - swap: when no fill helps, make one drop and then fills, or one fill
//    over budget and then the repair and fills, keeping the result if the
//    compute falls.
// Each candidate is simulated in full (O(entries * inputs)); an evaluation
// budget, split between the seeds and the kicks, bounds the search.
struct Gap {
  int32_t op;
  int32_t from;  // stage of the earlier touch
  int32_t to;    // stage of the later touch
  bool replayed;
};

struct Point {
  Retention keep;
  std::vector<Step> steps;
  Simulation sim;
};

class Search {
 public:
  Search(const Model& model, uint64_t budget, int64_t max_evaluations)
      : model_(model), budget_(budget), evaluations_left_(max_evaluations), viewers_(static_cast<size_t>(model.n)) {
    for (int32_t v = 0; v < model.n; ++v) {
      for (int32_t base : model.aliases[static_cast<size_t>(v)]) viewers_[static_cast<size_t>(base)].push_back(v);
    }
  }

  bool Exhausted() const { return evaluations_left_ <= 0; }
  // Sets how many more schedules the search may simulate.
  void Allow(int64_t evaluations) { evaluations_left_ = evaluations; }
  bool Fits(const Point& p) const { return p.sim.ok && p.sim.peak <= budget_; }

  // Simulates `keep`. Each evaluation costs its steps over twice the op
  // count (a schedule with one replay per op costs 1), so that points far
  // from store-all, with thousands of replays, spend the budget as fast as
  // they spend time.
  Point Evaluate(Retention keep) {
    Point p{.keep = std::move(keep)};
    p.steps = remat::DeriveSteps(model_, p.keep);
    p.sim = remat::Simulate(model_, p.steps);
    evaluations_left_ -= std::max<int64_t>(
        1, static_cast<int64_t>(p.steps.size()) / std::max<int64_t>(1, 2 * static_cast<int64_t>(model_.n)));
    return p;
  }

  // Better: within budget first, then less compute, then a lower peak.
  bool Better(const Point& a, const Point& b) const {
    if (Fits(a) != Fits(b)) return Fits(a);
    if (!Fits(a)) return a.sim.peak < b.sim.peak || (a.sim.peak == b.sim.peak && a.sim.extra < b.sim.extra);
    if (a.sim.extra != b.sim.extra) return a.sim.extra < b.sim.extra;
    return a.sim.peak < b.sim.peak;
  }

  std::vector<Gap> Gaps(const std::vector<Step>& steps) const {
    std::vector<Gap> gaps;
    std::vector<int32_t> last(static_cast<size_t>(model_.n), -1);
    int32_t stage = 0;
    auto touch = [&](int32_t op, bool replay) {
      if (!model_.recomputable[static_cast<size_t>(op)]) return;
      int32_t& l = last[static_cast<size_t>(op)];
      if (l >= 0 && stage > l) gaps.push_back({op, l, stage, replay});
      l = stage;
    };
    for (const Step& s : steps) {
      for (int32_t d : model_.deps[static_cast<size_t>(s.op)]) touch(d, false);
      touch(s.op, s.recompute);
      if (!s.recompute) ++stage;
    }
    return gaps;
  }

  // Highest live bytes in each stage.
  std::vector<uint64_t> StagePeaks(const Point& p) const {
    std::vector<uint64_t> peaks(static_cast<size_t>(model_.n), 0);
    int32_t stage = 0;
    for (size_t e = 0; e < p.steps.size() && p.sim.ok; ++e) {
      uint64_t& peak = peaks[static_cast<size_t>(stage)];
      peak = std::max(peak, p.sim.live[e]);
      if (!p.steps[e].recompute) ++stage;
    }
    return peaks;
  }

  // The stages at which a drop across `g` may replay: where the copy is
  // needed, and right after the gap's highest stage.
  static std::vector<int32_t> ReplayStages(const Gap& g, const std::vector<uint64_t>& stage_peaks) {
    std::vector<int32_t> at;
    if (!g.replayed) at.push_back(g.to);
    int32_t highest = -1;
    for (int32_t s = g.from + 1; s < g.to; ++s) {
      if (highest < 0 || stage_peaks[static_cast<size_t>(s)] > stage_peaks[static_cast<size_t>(highest)]) {
        highest = s;
      }
    }
    if (highest >= 0 && highest + 1 < g.to) at.push_back(highest + 1);
    return at;
  }

  // Holds op g.op's copy through gap `g`, or with `to_end` through every
  // later gap of the op too (keep it until its last use).
  Point Fill(const Point& p, const Gap& g, bool to_end = false) {
    Retention keep = p.keep;
    std::vector<uint8_t>& row = keep[static_cast<size_t>(g.op)];
    row[static_cast<size_t>(g.from)] = std::max<uint8_t>(row[static_cast<size_t>(g.from)], remat::kHold);
    const size_t end = to_end ? row.size() : static_cast<size_t>(g.to);
    for (size_t s = static_cast<size_t>(g.from) + 1; s < end; ++s) row[s] = remat::kHold;
    return Evaluate(std::move(keep));
  }

  // Drops op g.op's copy after stage g.from, replaying it at `at`. Ops
  // whose outputs view it are dropped over the gap too: a held view keeps
  // the copy it views alive, so dropping one without the other frees
  // nothing. They replay where needed (views cost next to nothing).
  Point Drop(const Point& p, const Gap& g, int32_t at) {
    Retention keep = p.keep;
    std::vector<uint8_t>& row = keep[static_cast<size_t>(g.op)];
    for (int32_t s = g.from; s < at; ++s) row[static_cast<size_t>(s)] = remat::kDrop;
    if (at < g.to) {
      row[static_cast<size_t>(at)] = remat::kReplay;
      for (int32_t s = at + 1; s < g.to; ++s) row[static_cast<size_t>(s)] = remat::kHold;
    }
    for (int32_t v : viewers_[static_cast<size_t>(g.op)]) {
      if (!model_.recomputable[static_cast<size_t>(v)]) continue;
      std::vector<uint8_t>& view_row = keep[static_cast<size_t>(v)];
      for (int32_t s = std::max(g.from, v); s < g.to; ++s) view_row[static_cast<size_t>(s)] = remat::kDrop;
    }
    return Evaluate(std::move(keep));
  }

  // The stage in which step `entry` runs.
  static int32_t StageOf(const std::vector<Step>& steps, int32_t entry) {
    for (size_t e = static_cast<size_t>(entry); e < steps.size(); ++e) {
      if (!steps[e].recompute) return steps[e].op;
    }
    return -1;
  }

  // Note [Remat search], repair.
  Point Repair(Point p) {
    while (p.sim.ok && !Fits(p) && !Exhausted()) {
      const int32_t stage = StageOf(p.steps, p.sim.peak_entry);
      // A candidate that fits, the cheapest; else the most bytes off the
      // peak per unit of compute added.
      std::optional<Point> best;
      auto rate = [&](const Point& q) {
        const double added = std::max(q.sim.extra - p.sim.extra, 1e-9 * (1 + p.sim.extra));
        return static_cast<double>(p.sim.peak - q.sim.peak) / added;
      };
      auto consider = [&](Point q) {
        if (!q.sim.ok || q.sim.peak >= p.sim.peak) return;
        if (!best || (Fits(q) != Fits(*best) ? Fits(q)
                      : Fits(q)              ? Better(q, *best)
                                             : rate(q) > rate(*best))) {
          best = std::move(q);
        }
      };
      for (const Gap& g : Gaps(p.steps)) {
        if (Exhausted()) break;
        if (g.replayed && g.to == stage) consider(Fill(p, g));
        if (g.replayed || g.from > stage || g.to <= stage) continue;
        consider(Drop(p, g, g.to));
        if (stage + 1 < g.to) consider(Drop(p, g, stage + 1));
      }
      if (!best) break;
      p = std::move(*best);
    }
    return p;
  }

  // The best fill of `p` that fits, if it saves compute.
  std::optional<Point> BestFill(const Point& p) {
    std::optional<Point> best;
    std::vector<uint8_t> later_gap(static_cast<size_t>(model_.n), 0);  // op has a replayed gap after this one
    const std::vector<Gap> gaps = Gaps(p.steps);
    for (size_t k = gaps.size(); k-- > 0;) {
      const Gap& g = gaps[k];
      if (!g.replayed || Exhausted()) continue;
      for (bool to_end : {false, true}) {
        if (to_end && !later_gap[static_cast<size_t>(g.op)]) continue;
        Point q = Fill(p, g, to_end);
        if (Fits(q) && q.sim.extra < p.sim.extra && (!best || Better(q, *best))) best = std::move(q);
      }
      later_gap[static_cast<size_t>(g.op)] = 1;
    }
    return best;
  }

  // Fills while they save compute and fit.
  Point Fills(Point p) {
    while (Fits(p) && !Exhausted()) {
      std::optional<Point> fill = BestFill(p);
      if (!fill) break;
      p = std::move(*fill);
    }
    return p;
  }

  // Note [Remat search], descent and swaps, from a point within budget.
  Point Descend(Point p) {
    p = Fills(std::move(p));
    while (Fits(p) && !Exhausted()) {
      std::optional<Point> best;
      const std::vector<uint64_t> stage_peaks = StagePeaks(p);
      for (const Gap& g : Gaps(p.steps)) {
        for (int32_t at : ReplayStages(g, stage_peaks)) {
          if (Exhausted()) break;
          Point dropped = Drop(p, g, at);
          if (!Fits(dropped)) continue;
          Point swapped = Fills(std::move(dropped));
          if (swapped.sim.extra < p.sim.extra && (!best || Better(swapped, *best))) best = std::move(swapped);
        }
        // The other way round: hold through a replayed gap beyond the
        // budget, then repair.
        if (g.replayed && !Exhausted()) {
          Point filled = Fill(p, g);
          if (filled.sim.extra >= p.sim.extra) continue;
          Point swapped = Fills(Repair(std::move(filled)));
          if (Fits(swapped) && swapped.sim.extra < p.sim.extra && (!best || Better(swapped, *best))) {
            best = std::move(swapped);
          }
        }
      }
      if (!best) break;
      p = Fills(std::move(*best));
    }
    return p;
  }

  // Iterated local search: kick the best point (one or two random drops,
  // or a random fill), repair and fill, and keep what is better; then
  // descend with swaps from the best. Seeded, so the result is reproducible.
  Point Perturb(Point best, int kicks) {
    std::mt19937 rng(0x5eed);
    for (int k = 0; k < kicks && !Exhausted(); ++k) {
      Point q = best;
      std::vector<Gap> gaps = Gaps(q.steps);
      if (gaps.empty()) break;
      if (k % 2 == 1) {
        std::erase_if(gaps, [](const Gap& g) { return !g.replayed; });
        if (gaps.empty()) continue;
        q = Fill(q, gaps[rng() % gaps.size()], rng() % 2 == 0);
      } else {
        const int drops = 1 + static_cast<int>(rng() % 2);
        for (int d = 0; d < drops; ++d) {
          if (d > 0) gaps = Gaps(q.steps);
          if (gaps.empty()) break;
          const Gap& g = gaps[rng() % gaps.size()];
          const std::vector<int32_t> at = ReplayStages(g, StagePeaks(q));
          if (at.empty()) continue;
          q = Drop(q, g, at[rng() % at.size()]);
        }
      }
      q = Fills(Repair(std::move(q)));
      if (Better(q, best)) best = std::move(q);
    }
    return Descend(std::move(best));
  }

  Point Improve(Point p) {
    p = Repair(std::move(p));
    if (Fits(p)) p = Descend(std::move(p));
    return p;
  }

 private:
  const Model& model_;
  uint64_t budget_;
  int64_t evaluations_left_;
  std::vector<std::vector<int32_t>> viewers_;  // by op: the ops whose outputs view its outputs
};

Retention Round(const Model& model, const LpOutcome& lp, double threshold) {
  const auto n = static_cast<size_t>(model.n);
  Retention keep(n, std::vector<uint8_t>(n, 0));
  for (size_t i = 0; i < n; ++i) {
    for (size_t t = i; t < n; ++t) keep[i][t] = lp.carry[i][t] > threshold ? remat::kHold : remat::kDrop;
  }
  return keep;
}

Retention Uniform(const Model& model, uint8_t value) {
  const auto n = static_cast<size_t>(model.n);
  return Retention(n, std::vector<uint8_t>(n, value));
}

struct Found {
  std::vector<Step> steps;
  Simulation sim;
  bool fits = false;
  std::string how;
};

// Note [Remat strategies], PlanRemat's search at `budget` (model bytes).
// `descend`: reduce compute once within budget (else stop there).
Found SearchSchedule(const Model& model, uint64_t budget, const LpOutcome* lp, const RematOptions& options,
                     bool descend = true) {
  Search search(model, budget, options.search_evaluations);
  // Seeds: the LP rounded at several thresholds, keeping everything, and
  // replaying everything (the least memory, far from any cheap schedule,
  // yet on small graphs a start that the others miss; its schedules are
  // long, so its share of evaluations runs out fast on large ones).
  struct Seed {
    Point point;
    std::string how;
  };
  std::vector<Seed> seeds;
  const bool have_lp = lp != nullptr && lp->status == LpOutcome::Status::kOptimal;
  if (have_lp) {
    for (double threshold : {0.5, 0.25, 0.75, 0.1, 0.9, 0.01, 0.99}) {
      seeds.push_back({search.Evaluate(Round(model, *lp, threshold)),
                       absl::StrFormat("LP rounded at %g", threshold)});
    }
  }
  seeds.push_back({search.Evaluate(Uniform(model, remat::kHold)), "store-all"});
  seeds.push_back({search.Evaluate(Uniform(model, remat::kDrop)), "replay-all"});
  for (const auto& [name, schedule] : options.starts) {
    seeds.push_back({search.Evaluate(remat::RetentionOf(model, schedule)), name});
  }
  std::stable_sort(seeds.begin(), seeds.end(),
                   [&](const Seed& a, const Seed& b) { return search.Better(a.point, b.point); });
  // Thresholds often round to the same schedule; improve each one once, on
  // an equal share of the evaluations (a share for the kicks too).
  std::vector<std::vector<Step>> distinct;
  for (const Seed& seed : seeds) {
    if (std::find(distinct.begin(), distinct.end(), seed.point.steps) == distinct.end()) {
      distinct.push_back(seed.point.steps);
    }
  }
  const int64_t share = options.search_evaluations / static_cast<int64_t>(distinct.size() + (descend ? 1 : 0));
  distinct.clear();
  std::optional<Seed> best;
  for (Seed& seed : seeds) {
    if (std::find(distinct.begin(), distinct.end(), seed.point.steps) != distinct.end()) continue;
    distinct.push_back(seed.point.steps);
    search.Allow(share);
    Seed s{descend ? search.Improve(std::move(seed.point)) : search.Repair(std::move(seed.point)),
           std::move(seed.how)};
    if (!best || search.Better(s.point, best->point)) best = std::move(s);
  }
  if (descend && search.Fits(best->point)) {
    search.Allow(share);
    best->point = search.Perturb(std::move(best->point), options.search_kicks);
  }
  Found f{.fits = search.Fits(best->point), .how = best->how};
  f.steps = std::move(best->point.steps);
  f.sim = std::move(best->point.sim);
  return f;
}

// The least budget at which the bound LP is feasible, within [lo, hi] and
// to relative precision 1e-3, as a proof: no schedule peaks below the
// returned value. The LP is infeasible at `lo` and feasible at `hi`.
// Each LP takes its iterations from `work`; one that stops ends the search.
uint64_t LpFloor(const Model& model, uint64_t lo, uint64_t hi, LpWork& work) {
  while (hi - lo > std::max<uint64_t>(1, hi / 1000)) {
    const uint64_t mid = lo + (hi - lo) / 2;
    absl::StatusOr<LpOutcome> lp = work.Solve(model, mid);
    if (!lp.ok() || lp->status == LpOutcome::Status::kStopped) break;  // unproven: keep what is proven
    (lp->status == LpOutcome::Status::kInfeasible ? lo : hi) = mid;
  }
  return lo + 1;
}

absl::StatusOr<ReachableBudget> Reachable(const PlanProblem& problem, const Model& model,
                                          const RematOptions& options, LpWork& work) {
  ReachableBudget out;
  // A start that peaks at the op floor reaches the least any schedule can.
  for (const auto& [name, schedule] : options.starts) {
    absl::StatusOr<PlanEvaluation> e = EvaluateSchedule(problem, schedule);
    if (e.ok() && e->peak_bytes <= model.floor) return ReachableBudget{e->peak_bytes, e->peak_bytes, schedule};
  }
  const uint64_t store_all = ProfileMemory(*problem.step, problem.profile).peak_bytes;
  // Aim at the op floor: the search's repair lowers the peak until it gets
  // there (then it is the least possible) or stalls. Where the bound LP is
  // feasible at the floor, its solution seeds the search.
  absl::StatusOr<LpOutcome> lp = work.Solve(model, model.floor);
  const bool lp_feasible = lp.ok() && lp->status == LpOutcome::Status::kOptimal;
  Found found = SearchSchedule(model, model.floor, lp_feasible ? &*lp : nullptr, options, /*descend=*/false);
  out.schedule = remat::ToSchedule(found.steps);
  HEADROOM_ASSIGN_OR_RETURN(PlanEvaluation e, EvaluateSchedule(problem, out.schedule));
  out.reached = e.peak_bytes;
  if (out.reached > store_all) {
    out.schedule = StoreAllSchedule(*problem.step);
    out.reached = store_all;
  }
  out.floor = std::min(model.floor, out.reached);
  // Above the op floor, the LP may prove a higher one.
  if (out.reached > out.floor && lp.ok() && lp->status == LpOutcome::Status::kInfeasible) {
    out.floor = std::min(LpFloor(model, model.floor, out.reached, work), out.reached);
  }
  return out;
}

absl::Status OverBudget(const PlanProblem& problem, const Model& model, const ReachableBudget& r,
                        std::string_view what, const LpWork& work) {
  const Graph& step = *problem.step;
  const uint64_t store_all = ProfileMemory(step, problem.profile).peak_bytes;
  size_t floor_op = 0;
  for (size_t i = 0; i < model.floor_at.size(); ++i) {
    if (model.floor_at[i] > model.floor_at[floor_op]) floor_op = i;
  }
  std::string floor_reason =
      r.floor == model.floor && !model.floor_at.empty()
          ? absl::StrFormat("op %s needs that much: its inputs and outputs, and what no replay can restore "
                            "live across it",
                            QuoteForError(step.op(static_cast<OpId>(floor_op)).name))
          : "the LP relaxation is infeasible below it";
  if (const std::string why = work.WhyStopped(); !why.empty()) {
    absl::StrAppend(&floor_reason, "; ", why, ", so it may prove no higher floor");
  }
  if (problem.budget < r.floor) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "plan problem for %s: no schedule in program order fits the budget of %d bytes: none peaks below %d "
        "bytes%s (%s); the smallest budget reachable is %d bytes%s",
        QuoteForError(step.name()), problem.budget, r.floor, Percent(r.floor, store_all), floor_reason, r.reached,
        Percent(r.reached, store_all)));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "plan problem for %s: %s found no schedule within the budget of %d bytes; the smallest budget reached "
      "is %d bytes%s, and no schedule in program order peaks below %d bytes%s",
      QuoteForError(step.name()), what, problem.budget, r.reached, Percent(r.reached, store_all), r.floor,
      Percent(r.floor, store_all)));
}

}  // namespace

absl::StatusOr<RematBound> RematLowerBound(const PlanProblem& problem, const RematOptions& options) {
  HEADROOM_ASSIGN_OR_RETURN(Model model, CheckedModel(problem));
  LpWork work(options);
  HEADROOM_ASSIGN_OR_RETURN(LpOutcome lp, work.Solve(model, problem.budget));
  RematBound b{.seconds = lp.seconds};
  b.feasible = lp.status != LpOutcome::Status::kInfeasible && problem.budget >= model.floor;
  b.solved = lp.status == LpOutcome::Status::kOptimal;
  if (b.solved) b.extra_cost = lp.objective;
  return b;
}

absl::StatusOr<RematBound> ReplayKnapsackBound(const PlanProblem& problem) {
  const absl::Time start = absl::Now();
  HEADROOM_ASSIGN_OR_RETURN(const Model model, remat::BuildModel(problem));
  const auto n = static_cast<size_t>(model.n);
  const size_t num_values = model.value_producer.size();
  const std::vector<int32_t>& last_reader = model.value_last_reader;
  auto producer = [&](size_t v) { return static_cast<size_t>(model.value_producer[v]); };
  // Bytes store-all holds over budget while each op runs, from each
  // value's store-all life: its producer to its last reader.
  std::vector<int64_t> live_delta(n + 1, 0);
  for (size_t v = 0; v < num_values; ++v) {
    const size_t end = std::max<size_t>(producer(v), static_cast<size_t>(std::max(last_reader[v], 0)));
    live_delta[producer(v)] += static_cast<int64_t>(model.value_bytes[v]);
    live_delta[end + 1] -= static_cast<int64_t>(model.value_bytes[v]);
  }
  std::vector<uint64_t> need(n, 0);
  int64_t live = 0;
  for (size_t t = 0; t < n; ++t) {
    live += live_delta[t];
    const uint64_t held = model.fixed_bytes + static_cast<uint64_t>(live);
    if (held > problem.budget) need[t] = held - problem.budget;
  }
  // A value a pass may drop at op t: made by a replayable op before t and
  // read after t, so held across t from op producer + 1 to its last reader.
  auto spans = [&](size_t v, size_t t) {
    return model.recomputable[producer(v)] && producer(v) < t && last_reader[v] > static_cast<int32_t>(t);
  };
  std::vector<std::vector<int32_t>> entering(n), leaving(n);
  for (size_t v = 0; v < num_values; ++v) {
    if (!spans(v, producer(v) + 1)) continue;
    entering[producer(v) + 1].push_back(static_cast<int32_t>(v));
    leaving[static_cast<size_t>(last_reader[v])].push_back(static_cast<int32_t>(v));
  }
  // Per producer, the bytes of its values held across the op in hand that
  // the op does not read: what replaying it frees there. The sweep runs
  // twice (Note [Replay knapsack bound]): first to list every such state
  // in the order it arises, then to keep them in cheapest-per-byte order.
  std::vector<uint64_t> droppable(n, 0);
  auto sweep = [&](auto&& set_droppable, auto&& knapsack) {
    std::fill(droppable.begin(), droppable.end(), 0);
    auto change = [&](size_t v, bool add) {
      const size_t p = producer(v);
      const uint64_t bytes = add ? droppable[p] + model.value_bytes[v] : droppable[p] - model.value_bytes[v];
      set_droppable(p, bytes);
      droppable[p] = bytes;
    };
    for (size_t t = 0; t < n; ++t) {
      for (int32_t v : leaving[t]) change(static_cast<size_t>(v), false);
      for (int32_t v : entering[t]) change(static_cast<size_t>(v), true);
      if (need[t] == 0) continue;
      // What t reads it holds while it runs: no replay frees it there.
      for (int32_t v : model.reads[t]) {
        if (spans(static_cast<size_t>(v), t)) change(static_cast<size_t>(v), false);
      }
      knapsack(t);
      for (int32_t v : model.reads[t]) {
        if (spans(static_cast<size_t>(v), t)) change(static_cast<size_t>(v), true);
      }
    }
  };
  struct State {
    double per_byte;
    size_t producer;
    uint64_t bytes;
  };
  std::vector<State> states;
  // A state of 0 bytes is never in force; its rank only has to be well ordered.
  sweep(
      [&](size_t p, uint64_t bytes) {
        const double per_byte =
            bytes == 0 ? std::numeric_limits<double>::infinity() : model.cost[p] / static_cast<double>(bytes);
        states.push_back({per_byte, p, bytes});
      },
      [](size_t) {});
  // Each state's rank, cheapest per byte first; ties in any fixed order.
  std::vector<uint32_t> by_rank(states.size());
  std::iota(by_rank.begin(), by_rank.end(), 0);
  std::ranges::sort(by_rank, [&](uint32_t a, uint32_t b) {
    return std::tie(states[a].per_byte, states[a].producer, a) < std::tie(states[b].per_byte, states[b].producer, b);
  });
  std::vector<uint32_t> rank(states.size());
  for (uint32_t r = 0; r < by_rank.size(); ++r) rank[by_rank[r]] = r;

  // A Fenwick tree over the ranks, summing the bytes and costs of the
  // states in force, answers each op's fractional knapsack in log time.
  std::vector<uint64_t> tree_bytes(states.size() + 1, 0);
  std::vector<double> tree_cost(states.size() + 1, 0);
  auto add = [&](uint32_t r, bool insert) {
    const State& s = states[by_rank[r]];
    const double cost = model.cost[s.producer];
    for (size_t i = r + 1; i < tree_bytes.size(); i += i & (~i + 1)) {
      tree_bytes[i] += insert ? s.bytes : ~s.bytes + 1;  // wraps back exactly on removal
      tree_cost[i] += insert ? cost : -cost;
    }
  };
  constexpr uint32_t kNoState = std::numeric_limits<uint32_t>::max();
  std::vector<uint32_t> in_force(n, kNoState);  // per producer, its state's rank
  uint64_t total = 0;
  size_t next_state = 0;
  size_t top = 1;
  while (top * 2 < tree_bytes.size()) top *= 2;
  RematBound out{.solved = true};
  sweep(
      [&](size_t p, uint64_t bytes) {
        if (in_force[p] != kNoState) add(in_force[p], false);
        total -= droppable[p];
        const uint32_t r = rank[next_state++];
        in_force[p] = bytes == 0 ? kNoState : r;
        if (bytes != 0) add(r, true);
        total += bytes;
      },
      [&](size_t t) {
        if (total < need[t]) out.feasible = false;  // dropping all it can still leaves too much
        const uint64_t target = std::min(need[t], total);
        // The longest prefix of whole states short of the target, then part of the next.
        size_t at = 0;
        uint64_t bytes = 0;
        double cost = 0;
        for (size_t step = top; step > 0; step /= 2) {
          if (at + step < tree_bytes.size() && bytes + tree_bytes[at + step] < target) {
            at += step;
            bytes += tree_bytes[at];
            cost += tree_cost[at];
          }
        }
        if (bytes < target) cost += states[by_rank[at]].per_byte * static_cast<double>(target - bytes);
        out.extra_cost = std::max(out.extra_cost, std::max(cost, 0.0));
      });
  out.seconds = SecondsSince(start);
  return out;
}

absl::StatusOr<ReachableBudget> SmallestReachableBudget(const PlanProblem& problem, const RematOptions& options) {
  HEADROOM_ASSIGN_OR_RETURN(Model model, CheckedModel(problem));
  LpWork work(options);
  return Reachable(problem, model, options, work);
}

absl::StatusOr<RematPlan> PlanRemat(const PlanProblem& problem, const RematOptions& options) {
  const absl::Time start = absl::Now();
  HEADROOM_ASSIGN_OR_RETURN(Model model, CheckedModel(problem));
  LpWork work(options);
  auto over_budget = [&]() -> absl::Status {
    HEADROOM_ASSIGN_OR_RETURN(ReachableBudget r, Reachable(problem, model, options, work));
    return OverBudget(problem, model, r, "the rematerialization search", work);
  };
  if (problem.budget < model.floor) return over_budget();
  if (ProfileMemory(*problem.step, problem.profile).peak_bytes <= problem.budget) {
    // Nothing to replay, and no plan replays less than nothing.
    RematPlan plan{.schedule = StoreAllSchedule(*problem.step), .lower_bound_solved = true};
    HEADROOM_ASSIGN_OR_RETURN(plan.evaluation, EvaluateSchedule(problem, plan.schedule));
    plan.seconds = SecondsSince(start);
    plan.detail = "the store-all step fits";
    return plan;
  }
  HEADROOM_ASSIGN_OR_RETURN(LpOutcome lp, work.Solve(model, problem.budget));
  if (lp.status == LpOutcome::Status::kInfeasible) return over_budget();
  // How the bound came out, for the detail.
  auto bound_detail = [&](double bound) {
    return lp.status == LpOutcome::Status::kOptimal ? absl::StrFormat("LP bound %.6g", bound)
                                                    : absl::StrCat("no LP bound: ", work.WhyStopped());
  };

  // The model agrees with EvaluateSchedule except around views (Note [Remat
  // model]); where the measured peak overshoots, search again under a
  // budget lowered by the overshoot.
  uint64_t target = problem.budget;
  for (int attempt = 0; attempt < 4; ++attempt) {
    Found found = SearchSchedule(model, target, &lp, options);
    if (!found.fits) break;
    RematPlan plan;
    plan.schedule = remat::ToSchedule(found.steps);
    HEADROOM_ASSIGN_OR_RETURN(plan.evaluation, EvaluateSchedule(problem, plan.schedule));
    if (plan.evaluation.peak_bytes > problem.budget) {
      const uint64_t over = plan.evaluation.peak_bytes - problem.budget;
      if (over >= target) break;
      target -= over;
      continue;
    }
    std::string how = absl::StrCat("from ", found.how);
    // A start the search could not improve on as derived (its lazy replays
    // may differ) may still be the cheapest plan as it stands.
    for (const auto& [name, schedule] : options.starts) {
      absl::StatusOr<PlanEvaluation> e = EvaluateSchedule(problem, schedule);
      if (e.ok() && e->peak_bytes <= problem.budget && e->extra_cost < plan.evaluation.extra_cost) {
        plan.schedule = schedule;
        plan.evaluation = *std::move(e);
        how = absl::StrCat("as ", name, " planned it");
      }
    }
    plan.lower_bound_solved = lp.status == LpOutcome::Status::kOptimal;
    plan.lower_bound = plan.lower_bound_solved ? std::min(lp.objective, plan.evaluation.extra_cost) : 0;
    plan.seconds = SecondsSince(start);
    plan.detail = absl::StrFormat("%d replays %s; %s", plan.evaluation.recomputed_ops, how,
                                  bound_detail(plan.lower_bound));
    return plan;
  }
  // The search found nothing within budget; a start may still fit.
  std::optional<RematPlan> best;
  for (const auto& [name, schedule] : options.starts) {
    absl::StatusOr<PlanEvaluation> e = EvaluateSchedule(problem, schedule);
    if (!e.ok() || e->peak_bytes > problem.budget) continue;
    if (best && best->evaluation.extra_cost <= e->extra_cost) continue;
    best = RematPlan{.schedule = schedule, .evaluation = *std::move(e)};
    best->detail = absl::StrFormat("%d replays as %s planned it", best->evaluation.recomputed_ops, name);
  }
  if (!best) return over_budget();
  best->lower_bound_solved = lp.status == LpOutcome::Status::kOptimal;
  best->lower_bound = best->lower_bound_solved ? std::min(lp.objective, best->evaluation.extra_cost) : 0;
  absl::StrAppend(&best->detail, "; ", bound_detail(best->lower_bound));
  best->seconds = SecondsSince(start);
  return *std::move(best);
}

absl::StatusOr<RematPlan> SolveRematMilp(const PlanProblem& problem, const RematOptions& options) {
  const absl::Time start = absl::Now();
  HEADROOM_ASSIGN_OR_RETURN(Model model, CheckedModel(problem));
  LpWork work(options);
  auto over_budget = [&]() -> absl::Status {
    HEADROOM_ASSIGN_OR_RETURN(ReachableBudget r, Reachable(problem, model, options, work));
    return OverBudget(problem, model, r, "Checkmate's MILP", work);
  };
  if (problem.budget < model.floor) return over_budget();
  HEADROOM_ASSIGN_OR_RETURN(LpOutcome lp, work.Solve(model, problem.budget));
  if (lp.status == LpOutcome::Status::kInfeasible) return over_budget();
  // The solver's tolerance can let a solution overshoot the budget by a
  // hair, and views can part the MILP's memory from ProfileMemory's (Note
  // [Remat model]): where the measured peak is over, solve again under a
  // budget lowered by the overshoot, in the time left.
  uint64_t target = problem.budget;
  remat::MilpOutcome milp;
  RematPlan plan;
  int attempt = 0;
  double first_bound = 0;  // a retry's bound is for its lowered budget, not ours
  for (;; ++attempt) {
    const double left = options.milp_time_limit_s - SecondsSince(start);
    HEADROOM_ASSIGN_OR_RETURN(milp, remat::SolveCheckmateMilp(model, target, std::max(left, 0.01)));
    if (!milp.has_solution) {
      if (milp.proven_infeasible) return over_budget();
      return absl::ResourceExhaustedError(absl::StrFormat(
          "plan problem for %s: Checkmate's MILP found no schedule within the budget of %d bytes in %.0f s "
          "(%d columns, %d rows); raise the time limit or use the fast strategy",
          QuoteForError(problem.step->name()), problem.budget, SecondsSince(start), milp.columns, milp.rows));
    }
    if (attempt == 0) first_bound = milp.best_bound;
    plan.schedule = remat::ToSchedule(remat::PruneSteps(model, milp.steps));
    HEADROOM_ASSIGN_OR_RETURN(plan.evaluation, EvaluateSchedule(problem, plan.schedule));
    if (plan.evaluation.peak_bytes <= problem.budget) break;
    const uint64_t over = plan.evaluation.peak_bytes - problem.budget;
    if (attempt == 3 || over >= target) {
      return absl::InternalError(absl::StrFormat(
          "plan problem for %s: the MILP's schedule peaks at %d bytes, over the budget of %d bytes, after %d "
          "attempts (the step's views are where the MILP's memory model and ProfileMemory part)",
          QuoteForError(problem.step->name()), plan.evaluation.peak_bytes, problem.budget, attempt + 1));
    }
    target -= over;
  }
  plan.lower_bound_solved = lp.status == LpOutcome::Status::kOptimal;
  plan.lower_bound = plan.lower_bound_solved ? std::min(lp.objective, plan.evaluation.extra_cost) : 0;
  plan.proven_optimal = milp.proven_optimal && attempt == 0;
  plan.hit_time_limit = milp.hit_time_limit;
  plan.milp_bound = std::min(first_bound, plan.evaluation.extra_cost);
  plan.seconds = SecondsSince(start);
  plan.detail = absl::StrFormat("Checkmate MILP, %d columns and %d rows, %s after %.1f s", milp.columns, milp.rows,
                                milp.proven_optimal ? "optimal" : "stopped", milp.seconds);
  return plan;
}

}  // namespace headroom
