// Validation fixtures, of measured steps and of applied plans: any byte
// string is a fixture or an error, never a crash. A parsed fixture keeps the invariants report/validation_fixture.h
// states, and its figures render as text, Markdown and JSON (cells with
// any characters, peers in any number) without a crash.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>

#include "graph/graph.h"
#include "report/validation_fixture.h"
#include "report/validation_report.h"

namespace {

// An applied-plans fixture (report/validation_fixture.h): every run that was
// not refused names its budget and strategy, holds a schedule and a positive
// peak, and says whether its gradients were equal.
void CheckAppliedPlans(const headroom::AppliedPlansFixture& fixture) {
  using namespace headroom;
  if (fixture.name.empty() || fixture.store_all.peak_allocated_bytes == 0) __builtin_trap();
  if (!fixture.model.config && !fixture.model.graph) __builtin_trap();
  for (const AppliedPlanRun& run : fixture.runs) {
    if (run.budget.empty() || run.strategy.empty()) __builtin_trap();
    if (!run.error.empty()) continue;
    if (run.chosen_strategy.empty() || run.measured.peak_allocated_bytes == 0) __builtin_trap();
    if (!run.measured.gradients_bitwise_equal.has_value()) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace headroom;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::variant<ValidationFixture, AppliedPlansFixture>> fixture = ParseFixture(text, "fuzz.json");
  if (!fixture.ok()) return 0;
  if (const auto* plans = std::get_if<AppliedPlansFixture>(&*fixture)) {
    CheckAppliedPlans(*plans);
    return 0;
  }
  const ValidationFixture& f = std::get<ValidationFixture>(*fixture);
  const MeasuredStep& m = f.measured;
  if (f.name.empty() || f.description.empty() || f.device.empty()) __builtin_trap();
  if (m.peak_allocated_bytes == 0) __builtin_trap();
  if (!m.peak_phase.empty() && !ParsePhase(m.peak_phase).ok()) __builtin_trap();
  if (!std::is_sorted(f.peers.begin(), f.peers.end(),
                      [](const PeerFigure& a, const PeerFigure& b) { return a.tool < b.tool; })) {
    __builtin_trap();
  }
  if (!f.model.config && !f.model.graph) __builtin_trap();

  // The comparison without an estimate (fuzz_estimate covers the estimator):
  // the measurement against itself and against its repeat.
  FixtureCheck check{.path = f.path, .name = f.name, .description = f.description, .device = f.device,
                     .measured = m,
                     .estimated = {.allocated_bytes = m.repeat_peak_allocated_bytes,
                                   .reserved_bytes = m.peak_reserved_bytes.value_or(0),
                                   .peak_op = m.peak_op, .peak_phase = m.peak_phase}};
  check.error = RelativeError(check.estimated.allocated_bytes, m.peak_allocated_bytes);
  if (!std::isfinite(check.error)) __builtin_trap();
  check.within_tolerance = std::abs(check.error) <= 0.03;
  if (m.peak_reserved_bytes && *m.peak_reserved_bytes > 0) check.reserved_error = 0;
  for (const PeerFigure& peer : f.peers) {
    check.peers.push_back(
        {.tool = peer.tool, .bytes = peer.bytes, .error = RelativeError(peer.bytes, m.peak_allocated_bytes)});
  }
  ValidationRun run{.checks = {check, check}};
  run.errors.push_back({.path = f.path, .message = f.description});
  if (ValidationText(run).empty() || ValidationMarkdown(run).empty()) __builtin_trap();
  // The parser accepts valid UTF-8 only, so every string writes back out.
  (void)ValidationJson(run).dump();
  return 0;
}
