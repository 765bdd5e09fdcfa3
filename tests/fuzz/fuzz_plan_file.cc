// Plan files: any text is accepted or rejected by ParsePlanFile; what it
// accepts writes back to a file that parses to the same plan. Its schedule,
// run over a small fixed step, is refused or accepted alike by
// MaterializeSchedule and the independent ValidateSchedule, and never
// crashes either.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "graph/training_step.h"
#include "planner/plan.h"
#include "planner/plan_json.h"

namespace {

// Three layers of linear + gelu and a loss, with backward: 14 ops.
const headroom::Graph& Step() {
  static const headroom::Graph* step = [] {
    using namespace headroom;
    Graph g("fuzz");
    TensorId x = g.AddTensor({.name = "x", .shape = {4, 8}, .role = TensorRole::kInput});
    for (int l = 0; l < 3; ++l) {
      TensorId w = g.AddTensor({.name = "w", .shape = {8, 8}, .role = TensorRole::kParameter, .layer = l});
      TensorId h = g.AddTensor({.name = "h", .shape = {4, 8}, .layer = l});
      TensorId a = g.AddTensor({.name = "a", .shape = {4, 8}, .layer = l});
      g.AddOp({.kind = "linear", .name = "fc", .inputs = {x, w}, .outputs = {h}, .saved = {x}, .layer = l});
      g.AddOp({.kind = "gelu", .name = "act", .inputs = {h}, .outputs = {a}, .saved = {h}, .layer = l});
      x = a;
    }
    TensorId loss = g.AddTensor({.name = "loss", .shape = {}});
    g.AddOp({.kind = "sum", .name = "loss", .inputs = {x}, .outputs = {loss}, .phase = Phase::kLoss});
    return new Graph(*BuildTrainingStep(g, {}));
  }();
  return *step;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<headroom::PlanFile> file = headroom::ParsePlanFile(text, "fuzz");
  if (!file.ok()) return 0;
  const std::string written = headroom::PlanFileToJson(*file).dump();
  absl::StatusOr<headroom::PlanFile> again = headroom::ParsePlanFile(written, "fuzz");
  if (!again.ok() || headroom::PlanFileToJson(*again).dump() != written) __builtin_trap();

  const headroom::Graph& step = Step();
  const headroom::PlanProblem problem{.step = &step,
                                      .op_cost = std::vector<double>(step.num_ops(), 1.0),
                                      .budget = std::numeric_limits<uint64_t>::max(),
                                      .copy_bytes_per_cost = 64};
  const bool materializes = headroom::MaterializeSchedule(step, file->schedule).ok();
  const bool valid = headroom::ValidateSchedule(problem, file->schedule).ok();
  if (materializes != valid) __builtin_trap();
  if (valid && !headroom::EvaluateSchedule(problem, file->schedule).ok()) __builtin_trap();
  return 0;
}
