// The memory timeline: its columns against ProfileMemory, downsampling that
// keeps every peak, and the SVG's structure (well formed, self-contained,
// one area per series, budget, legend, bands, the stack's top at the peak).
#include "report/memory_timeline_svg.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/units.h"
#include "gmock/gmock.h"
#include "graph/liveness.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_source.h"
#include "planner/checkpoint_mode_plan.h"
#include "tests/planner/step_fixtures.h"

namespace headroom {
namespace {

using ::headroom::testing::Gpt2Step;
using ::headroom::testing::OffloadGraph;

using ::testing::HasSubstr;
using ::testing::Not;

constexpr FixedBytes kFixed = {.weights = 250 * kMiB, .optimizer_state = 950 * kMiB, .gradients = 0};
constexpr uint64_t kFixedSum = 1200 * kMiB;

TEST(MemoryTimeline, ColumnsAreProfileMemoryPlusFixedBytes) {
  const Graph step = Gpt2Step(CheckpointMode::kFull);
  const MemoryProfile profile = ProfileMemory(step);
  absl::StatusOr<MemoryTimeline> t = BuildMemoryTimeline(step, {.fixed = kFixed}, step.num_ops());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->columns.size(), step.num_ops());
  for (size_t i = 0; i < step.num_ops(); ++i) {
    const TimelineColumn& c = t->columns[i];
    ASSERT_EQ(c.op, static_cast<OpId>(i));
    ASSERT_EQ(c.total(), profile.live_bytes[i] + kFixedSum) << "op " << i;
    EXPECT_EQ(c.bytes[static_cast<size_t>(TimelineSeries::kWeights)], kFixed.weights);
    EXPECT_EQ(c.bytes[static_cast<size_t>(TimelineSeries::kOptimizerState)], kFixed.optimizer_state);
  }
  EXPECT_EQ(t->peak_bytes, profile.peak_bytes + kFixedSum);
  EXPECT_EQ(t->peak_op, profile.peak_op);
  // The split at the peak is ProfileMemory's by role.
  auto at_peak = [&profile](TensorRole role) {
    auto it = profile.bytes_by_role_at_peak.find(role);
    return it == profile.bytes_by_role_at_peak.end() ? 0 : it->second;
  };
  EXPECT_EQ(t->bytes_at_peak[static_cast<size_t>(TimelineSeries::kActivations)], at_peak(TensorRole::kActivation));
  EXPECT_EQ(t->bytes_at_peak[static_cast<size_t>(TimelineSeries::kGradients)], at_peak(TensorRole::kGradient));
  EXPECT_EQ(t->bytes_at_peak[static_cast<size_t>(TimelineSeries::kTemporaries)], at_peak(TensorRole::kTemporary));
  EXPECT_EQ(t->bytes_at_peak[static_cast<size_t>(TimelineSeries::kInputs)], at_peak(TensorRole::kInput));
  // Full checkpointing replays each of the 12 layers in one run before its backward.
  EXPECT_EQ(t->recompute_runs.size(), 12u);
  EXPECT_TRUE(t->copy_runs.empty());
  for (const auto& [first, last] : t->recompute_runs) {
    for (OpId op = first; op <= last; ++op) EXPECT_TRUE(step.op(op).recompute) << op;
  }
}

TEST(MemoryTimeline, ColumnsKeepEveryPeak) {
  const Graph step = Gpt2Step(CheckpointMode::kOff);
  const MemoryProfile profile = ProfileMemory(step);
  for (size_t max_columns : {1, 37, 500}) {
    absl::StatusOr<MemoryTimeline> t = BuildMemoryTimeline(step, {}, max_columns);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->columns.size(), std::min(max_columns, step.num_ops()));
    OpId next = 0;
    for (const TimelineColumn& c : t->columns) {
      ASSERT_EQ(c.first_op, next);
      ASSERT_LE(c.first_op, c.op);
      ASSERT_LE(c.op, c.last_op);
      next = c.last_op + 1;
      const auto begin = profile.live_bytes.begin();
      const uint64_t highest = *std::max_element(begin + c.first_op, begin + c.last_op + 1);
      EXPECT_EQ(c.total(), highest);
      EXPECT_EQ(c.total(), profile.live_bytes[static_cast<size_t>(c.op)]);
    }
    EXPECT_EQ(next, static_cast<OpId>(step.num_ops()));
    EXPECT_EQ(t->peak_bytes, profile.peak_bytes);
    EXPECT_EQ(t->peak_op, profile.peak_op);
  }
}

// Opening and closing tags balance; comments, declarations and attribute
// values are skipped.
bool WellFormed(std::string_view xml, std::string* error) {
  std::vector<std::string> open;
  size_t i = 0;
  while ((i = xml.find('<', i)) != std::string_view::npos) {
    const size_t end = xml.find('>', i);
    if (end == std::string_view::npos) return *error = "unterminated tag", false;
    std::string_view tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.starts_with('?') || tag.starts_with('!')) continue;
    if (std::count(tag.begin(), tag.end(), '"') % 2 != 0) return *error = "odd quotes in <" + std::string(tag), false;
    if (tag.starts_with('/')) {
      const std::string name(tag.substr(1));
      if (open.empty() || open.back() != name) return *error = "</" + name + "> closes nothing open", false;
      open.pop_back();
    } else if (!tag.ends_with('/')) {
      open.emplace_back(tag.substr(0, tag.find_first_of(" \n")));
    }
  }
  if (!open.empty()) return *error = "<" + open.back() + "> left open", false;
  return true;
}

size_t Count(std::string_view text, std::string_view what) {
  size_t n = 0;
  for (size_t i = text.find(what); i != std::string_view::npos; i = text.find(what, i + 1)) ++n;
  return n;
}

std::string Attribute(std::string_view element, std::string_view name) {
  const std::string key = " " + std::string(name) + "=\"";
  const size_t at = element.find(key);
  if (at == std::string_view::npos) return "";
  const size_t from = at + key.size();
  return std::string(element.substr(from, element.find('"', from) - from));
}

// The element that starts at the first occurrence of `marker`.
std::string_view Element(std::string_view svg, std::string_view marker) {
  const size_t at = svg.find(marker);
  if (at == std::string_view::npos) return {};
  const size_t start = svg.rfind('<', at);
  return svg.substr(start, svg.find('>', at) - start + 1);
}

// The y coordinates a path's outline visits (M x y, V y).
std::vector<double> PathYs(std::string_view d) {
  std::vector<double> ys;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] == 'V') ys.push_back(std::strtod(std::string(d.substr(i + 1, 16)).c_str(), nullptr));
    if (d[i] == 'M') {
      const std::string rest(d.substr(i + 1, 32));
      ys.push_back(std::strtod(rest.c_str() + rest.find(' '), nullptr));
    }
  }
  return ys;
}

TEST(MemoryTimelineSvg, StructureOfACheckpointedStep) {
  const Graph step = Gpt2Step(CheckpointMode::kFull);
  const uint64_t budget = 2 * kGiB;
  const FixedBytes fixed = {.weights = 250 * kMiB};
  absl::StatusOr<std::string> svg =
      RenderMemoryTimelineSvg(step, {.title = "GPT-2, full checkpointing", .fixed = fixed, .budget_bytes = budget});
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::string error;
  EXPECT_TRUE(WellFormed(*svg, &error)) << error;
  EXPECT_TRUE(svg->starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  // Self-contained.
  EXPECT_THAT(*svg, Not(HasSubstr("<script")));
  EXPECT_THAT(*svg, Not(HasSubstr("href")));
  EXPECT_THAT(*svg, Not(HasSubstr("url(")));
  EXPECT_THAT(*svg, HasSubstr(">GPT-2, full checkpointing</text>"));

  // One area per series present; no optimizer state was given.
  const MemoryTimeline t = *BuildMemoryTimeline(step, {.fixed = fixed}, 1);
  const std::vector<std::string> present = {"weights", "inputs", "gradients", "activations", "temporaries"};
  EXPECT_EQ(Count(*svg, "<path class=\"area\""), present.size());
  for (const std::string& id : present) EXPECT_EQ(Count(*svg, "id=\"area-" + id + "\""), 1u) << id;
  EXPECT_EQ(Count(*svg, "id=\"area-optimizer-state\""), 0u);
  EXPECT_FALSE(t.present[static_cast<size_t>(TimelineSeries::kOptimizerState)]);

  // Budget line and label, the legend (the series, budget, recompute).
  EXPECT_EQ(Count(*svg, "<line id=\"budget\""), 1u);
  EXPECT_THAT(*svg, HasSubstr(">budget 2.00 GiB</text>"));
  EXPECT_EQ(Count(*svg, "class=\"legend-entry\""), present.size() + 2);
  for (std::string_view label : {">activations<", ">temporaries<", ">weights<", ">recompute<", ">budget<"}) {
    EXPECT_THAT(*svg, HasSubstr(label));
  }
  // A band per layer's replay (12 runs, apart on screen), no copies.
  EXPECT_EQ(Count(*svg, "class=\"band recompute\""), 12u);
  EXPECT_EQ(Count(*svg, "class=\"band copy\""), 0u);
  // Dotted lines where backward and the optimizer step begin.
  EXPECT_EQ(Count(*svg, "class=\"phase\""), 2u);

  // The stack's top is the peak, where the marker sits; its bottom is the
  // axis' zero line; the budget line is above the peak, which fits.
  double top = 1e9, bottom = 0;
  for (const std::string& id : present) {
    for (double y : PathYs(Attribute(Element(*svg, "id=\"area-" + id + "\""), "d"))) {
      top = std::min(top, y);
      bottom = std::max(bottom, y);
    }
  }
  const std::string_view marker = Element(*svg, "<circle");
  EXPECT_DOUBLE_EQ(top, std::strtod(Attribute(marker, "cy").c_str(), nullptr));
  EXPECT_THAT(*svg, HasSubstr("peak " + FormatBytes(t.peak_bytes) + "</text>"));
  const std::string_view zero_line = Element(Element(*svg, "<g id=\"y-axis\"").data(), "<line");
  EXPECT_DOUBLE_EQ(bottom, std::strtod(Attribute(zero_line, "y1").c_str(), nullptr));
  const double budget_y = std::strtod(Attribute(Element(*svg, "<line id=\"budget\""), "y1").c_str(), nullptr);
  EXPECT_LT(budget_y, top);
  EXPECT_THAT(*svg, HasSubstr("fits the budget 2.00 GiB with " + FormatBytes(budget - t.peak_bytes) + " spare"));
}

TEST(MemoryTimelineSvg, CopiesAndEscapedNames) {
  const Graph g = OffloadGraph("offload <&> \"quoted\"");
  absl::StatusOr<std::string> svg = RenderMemoryTimelineSvg(g, {.budget_bytes = 10000, .budget_label = "HBM <1>"});
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::string error;
  EXPECT_TRUE(WellFormed(*svg, &error)) << error;
  EXPECT_THAT(*svg, HasSubstr("Memory timeline: offload &lt;&amp;&gt; &quot;quoted&quot;"));
  // The offload and the prefetch are two ops apart: two bands.
  EXPECT_EQ(Count(*svg, "class=\"band copy\""), 2u);
  EXPECT_EQ(Count(*svg, "class=\"band recompute\""), 0u);
  EXPECT_THAT(*svg, HasSubstr(">offload / prefetch<"));
  EXPECT_THAT(*svg, HasSubstr(">2 copies<"));
  // x, a and b (13 KiB) during fc2 are over the 10000-byte budget.
  EXPECT_THAT(*svg, HasSubstr("peak 13.00 KiB at entry 1 (fc2) of 6; 3.23 KiB over the HBM &lt;1&gt; 9.77 KiB"));
  EXPECT_THAT(*svg, HasSubstr(">HBM &lt;1&gt; 9.77 KiB</text>"));
}

// A long schedule: paths stay within a few thousand points and the file
// small, whatever the number of ops.
TEST(MemoryTimelineSvg, LongSchedulesStaySmall) {
  Graph g("long");
  TensorId x = g.AddTensor({.name = "x", .shape = {64}, .role = TensorRole::kInput});
  for (int i = 0; i < 60000; ++i) {
    const TensorId y = g.AddTensor({.name = "t" + std::to_string(i), .shape = {64 + (i * 7919) % 4096}});
    g.AddOp({.kind = "op", .name = "op" + std::to_string(i), .inputs = {x}, .outputs = {y}, .recompute = i % 3 == 0});
    x = y;
  }
  absl::StatusOr<std::string> svg = RenderMemoryTimelineSvg(g, {});
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::string error;
  EXPECT_TRUE(WellFormed(*svg, &error)) << error;
  const std::string d = Attribute(Element(*svg, "id=\"area-activations\""), "d");
  EXPECT_LE(Count(d, "V") + Count(d, "H"), 4000u);
  EXPECT_LT(svg->size(), 200'000u);
  // Recompute ops every third op merge into one band on screen.
  EXPECT_EQ(Count(*svg, "class=\"band recompute\""), 1u);
}

TEST(MemoryTimelineSvg, EmptyGraph) {
  absl::StatusOr<std::string> svg = RenderMemoryTimelineSvg(Graph("nothing"), {.budget_bytes = kGiB});
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::string error;
  EXPECT_TRUE(WellFormed(*svg, &error)) << error;
  EXPECT_EQ(Count(*svg, "<path"), 0u);
  EXPECT_THAT(*svg, HasSubstr(">no ops</text>"));
}

TEST(MemoryTimelineSvg, ErrorsNameTheInput) {
  const Graph g = OffloadGraph("offload <&> \"quoted\"");
  EXPECT_THAT(RenderMemoryTimelineSvg(g, {.width = 100}).status().message(),
              HasSubstr("width is 100 pixels; expected 400 to 20000"));
  EXPECT_THAT(RenderMemoryTimelineSvg(g, {.height = 50000}).status().message(), HasSubstr("height is 50000"));
  EXPECT_THAT(RenderMemoryTimelineSvg(g, {.fixed = {.optimizer_state = uint64_t{1} << 61}}).status().message(),
              HasSubstr("fixed.optimizer_state is 2305843009213693952 bytes"));
  EXPECT_THAT(RenderMemoryTimelineSvg(g, {.budget_bytes = ~uint64_t{0}}).status().message(),
              HasSubstr("budget_bytes"));
  EXPECT_THAT(BuildMemoryTimeline(g, {}, 0).status().message(), HasSubstr("max_columns"));
  Graph huge("huge");
  const TensorId x = huge.AddTensor({.name = "huge_input", .shape = {1 << 20, 1 << 20}, .role = TensorRole::kInput});
  const TensorId y = huge.AddTensor({.name = "y", .shape = {4}});
  huge.AddOp({.kind = "sum", .name = "s", .inputs = {x}, .outputs = {y}});
  EXPECT_THAT(RenderMemoryTimelineSvg(huge, {}).status().message(), HasSubstr("huge_input"));
}

}  // namespace
}  // namespace headroom
