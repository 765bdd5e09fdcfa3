#include "report/memory_timeline_svg.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {
namespace {

constexpr uint64_t kMaxFixedBytes = uint64_t{1} << 60;     // with a graph's < 2^61, sums stay below 2^63
constexpr std::string_view kOffloadCopy = "offload_copy";  // planner/schedule.h, Note [Schedule semantics]
constexpr std::string_view kPrefetchCopy = "prefetch_copy";

// Bottom to top; colours from Tableau 10, told apart by most colour-blind readers.
constexpr std::array<std::string_view, kNumTimelineSeries> kSeriesName = {
    "weights", "optimizer state", "inputs", "gradients", "activations", "temporaries"};
constexpr std::array<std::string_view, kNumTimelineSeries> kSeriesId = {"weights",   "optimizer-state", "inputs",
                                                                        "gradients", "activations",     "temporaries"};
constexpr std::array<std::string_view, kNumTimelineSeries> kSeriesColor = {"#4e79a7", "#9c755f", "#bab0ac",
                                                                           "#f28e2b", "#59a14f", "#e15759"};
constexpr std::string_view kRecomputeColor = "#b07aa1";
constexpr std::string_view kCopyColor = "#76b7b2";
// A white outline under labels drawn over the areas, so they stay legible.
constexpr std::string_view kHalo =
    " stroke=\"#ffffff\" stroke-width=\"3\" stroke-opacity=\"0.85\" paint-order=\"stroke\"";

TimelineSeries SeriesOf(TensorRole role) {
  switch (role) {
    case TensorRole::kParameter:
    case TensorRole::kBuffer:
      return TimelineSeries::kWeights;
    case TensorRole::kOptimizerState:
      return TimelineSeries::kOptimizerState;
    case TensorRole::kInput:
      return TimelineSeries::kInputs;
    case TensorRole::kGradient:
      return TimelineSeries::kGradients;
    case TensorRole::kActivation:
      return TimelineSeries::kActivations;
    case TensorRole::kTemporary:
      return TimelineSeries::kTemporaries;
  }
  return TimelineSeries::kActivations;
}

size_t Index(TimelineSeries s) { return static_cast<size_t>(s); }

// String building over std::string_view, which this Abseil's StrCat does not take.
void Put(std::string&) {}
template <typename... Rest>
void Put(std::string& out, std::string_view first, const Rest&... rest) {
  out.append(first);
  Put(out, rest...);
}
template <typename... Parts>
std::string Cat(const Parts&... parts) {
  std::string out;
  Put(out, parts...);
  return out;
}

void AddRun(std::vector<std::pair<OpId, OpId>>& runs, OpId op) {
  if (!runs.empty() && runs.back().second == op - 1) {
    runs.back().second = op;
  } else {
    runs.emplace_back(op, op);
  }
}

std::string Escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The smallest of 1, 2, 2.5, 5 times a power of ten that is at least `raw`.
double NiceStep(double raw) {
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * power >= raw * (1 - 1e-9)) return m * power;
  }
  return 10 * power;
}

// An axis tick in `unit`: "0", "2.5 GiB", "40 GiB".
std::string TickLabel(double value, uint64_t unit, std::string_view unit_name) {
  if (value == 0) return "0";
  std::string number = absl::StrFormat("%.2f", value / static_cast<double>(unit));
  while (number.back() == '0') number.pop_back();
  if (number.back() == '.') number.pop_back();
  return Cat(number, " ", unit_name);
}

// Pixel coordinates with one decimal: enough for any screen, and short.
std::string Px(double v) { return absl::StrFormat("%.1f", std::round(v * 10) / 10); }

}  // namespace

std::string_view TimelineSeriesName(TimelineSeries series) { return kSeriesName[Index(series)]; }

uint64_t TimelineColumn::total() const {
  uint64_t sum = 0;
  for (uint64_t b : bytes) sum += b;
  return sum;
}

absl::StatusOr<MemoryTimeline> BuildMemoryTimeline(const Graph& step, const MemoryTimelineOptions& options,
                                                   size_t max_columns) {
  HEADROOM_RETURN_IF_ERROR(step.CheckBounds());
  if (max_columns == 0) return absl::InvalidArgumentError("max_columns must be at least 1");
  const std::pair<std::string_view, uint64_t> bounded[] = {{"fixed.weights", options.fixed.weights},
                                                           {"fixed.optimizer_state", options.fixed.optimizer_state},
                                                           {"fixed.gradients", options.fixed.gradients},
                                                           {"budget_bytes", options.budget_bytes}};
  for (const auto& [field, bytes] : bounded) {
    if (bytes > kMaxFixedBytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s is %d bytes; at most %d (1 EiB)", field, bytes, kMaxFixedBytes));
    }
  }
  MemoryTimeline timeline;
  const size_t num_ops = step.num_ops();
  if (num_ops == 0) return timeline;

  // Per-series live bytes as difference arrays, as ProfileMemory does.
  std::array<uint64_t, kNumTimelineSeries> fixed{};
  fixed[Index(TimelineSeries::kWeights)] = options.fixed.weights;
  fixed[Index(TimelineSeries::kOptimizerState)] = options.fixed.optimizer_state;
  fixed[Index(TimelineSeries::kGradients)] = options.fixed.gradients;
  std::vector<std::array<uint64_t, kNumTimelineSeries>> delta(num_ops + 1);
  delta[0] = fixed;
  const std::vector<TensorLifetime> life = ComputeLifetimes(step, options.profile);
  for (const Tensor& t : step.tensors()) {
    const TensorLifetime& l = life[static_cast<size_t>(t.id)];
    if (l.first > l.last) continue;
    const size_t s = Index(SeriesOf(t.role));
    delta[static_cast<size_t>(l.first)][s] += t.bytes();
    delta[static_cast<size_t>(l.last) + 1][s] -= t.bytes();  // wraps, and the sum wraps back
  }

  // Note [Timeline columns].
  const size_t columns = std::min(max_columns, num_ops);
  timeline.columns.reserve(columns);
  std::array<uint64_t, kNumTimelineSeries> live{};
  size_t op = 0;
  for (size_t c = 0; c < columns; ++c) {
    const size_t end = (c + 1) * num_ops / columns;  // exclusive; every column gets an op
    TimelineColumn column{.first_op = static_cast<OpId>(op), .last_op = static_cast<OpId>(end - 1)};
    uint64_t best = 0;
    for (; op < end; ++op) {
      uint64_t total = 0;
      for (size_t s = 0; s < kNumTimelineSeries; ++s) {
        live[s] += delta[op][s];
        total += live[s];
        timeline.present[s] = timeline.present[s] || live[s] > 0;
      }
      if (op == static_cast<size_t>(column.first_op) || total > best) {
        best = total;
        column.op = static_cast<OpId>(op);
        column.bytes = live;
      }
      const Op& o = step.op(static_cast<OpId>(op));
      if (o.recompute) AddRun(timeline.recompute_runs, o.id);
      if (o.kind == kOffloadCopy || o.kind == kPrefetchCopy) AddRun(timeline.copy_runs, o.id);
    }
    if (timeline.peak_op == kNone || best > timeline.peak_bytes) {
      timeline.peak_bytes = best;
      timeline.peak_op = column.op;
      timeline.bytes_at_peak = column.bytes;
    }
    timeline.columns.push_back(column);
  }
  return timeline;
}

namespace {

// Where things go, in pixels.
struct Frame {
  double left, right, top, bottom;  // the plot area
  size_t num_ops;
  double y_max;  // bytes at the top of the plot

  double X(size_t op_boundary) const {
    return left + (right - left) * static_cast<double>(op_boundary) / static_cast<double>(num_ops);
  }
  double Y(double bytes) const { return bottom - (bottom - top) * bytes / y_max; }
};

// One series as a closed path of steps: along the top of its band left to
// right, then back along the bottom (Note [Timeline columns]).
std::string AreaPath(const MemoryTimeline& t, const Frame& f, size_t series) {
  std::vector<double> lower(t.columns.size()), upper(t.columns.size());
  for (size_t c = 0; c < t.columns.size(); ++c) {
    uint64_t below = 0;
    for (size_t s = 0; s < series; ++s) below += t.columns[c].bytes[s];
    lower[c] = std::round(f.Y(static_cast<double>(below)) * 10) / 10;
    upper[c] = std::round(f.Y(static_cast<double>(below + t.columns[c].bytes[series])) * 10) / 10;
  }
  auto x = [&](size_t c) { return Px(f.X(static_cast<size_t>(t.columns[c].first_op))); };
  const size_t last = t.columns.size() - 1;
  std::string d = Cat("M", x(0), " ", Px(upper[0]));
  for (size_t c = 1; c <= last; ++c) {
    if (upper[c] != upper[c - 1]) Put(d, "H", x(c), "V", Px(upper[c]));
  }
  Put(d, "H", Px(f.right), "V", Px(lower[last]));
  for (size_t c = last; c >= 1; --c) {
    if (lower[c] != lower[c - 1]) Put(d, "H", x(c), "V", Px(lower[c - 1]));
  }
  Put(d, "H", x(0), "Z");
  return d;
}

// Bands over op runs, merged where they would touch on screen: a light
// tint over the plot to follow them up the stack, and a solid rug on the
// axis to see them on a full one.
void Bands(std::string& svg, const std::vector<std::pair<OpId, OpId>>& runs, const Frame& f, std::string_view kind,
           std::string_view color) {
  double from = -1, to = -1;
  auto flush = [&] {
    if (from < 0) return;
    const std::string x = Px(from), width = Px(std::max(to - from, 1.0));
    svg += absl::StrFormat(
        "<rect class=\"band %s\" x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"%s\" fill-opacity=\"0.2\"/>"
        "<rect class=\"rug %s\" x=\"%s\" y=\"%s\" width=\"%s\" height=\"6\" fill=\"%s\"/>\n",
        kind, x, Px(f.top), width, Px(f.bottom - f.top), color, kind, x, Px(f.bottom - 6), width, color);
  };
  for (const auto& [first, last] : runs) {
    const double x0 = f.X(static_cast<size_t>(first));
    const double x1 = std::max(f.X(static_cast<size_t>(last) + 1), x0 + 1);
    if (from >= 0 && x0 <= to + 1) {
      to = std::max(to, x1);
      continue;
    }
    flush();
    from = x0;
    to = x1;
  }
  flush();
}

size_t RunOps(const std::vector<std::pair<OpId, OpId>>& runs) {
  size_t ops = 0;
  for (const auto& [first, last] : runs) ops += static_cast<size_t>(last - first + 1);
  return ops;
}

}  // namespace

absl::StatusOr<std::string> RenderMemoryTimelineSvg(const Graph& step, const MemoryTimelineOptions& options) {
  for (const auto& [field, value] :
       {std::pair<std::string_view, int>{"width", options.width}, {"height", options.height}}) {
    if (value < 400 || value > 20000) {
      return absl::InvalidArgumentError(absl::StrFormat("%s is %d pixels; expected 400 to 20000", field, value));
    }
  }
  const double width = options.width, height = options.height;
  Frame f{.left = 88, .right = width - 230, .top = 76, .bottom = height - 58, .num_ops = step.num_ops(), .y_max = 1};
  HEADROOM_ASSIGN_OR_RETURN(MemoryTimeline t,
                            BuildMemoryTimeline(step, options, static_cast<size_t>(std::max(1.0, f.right - f.left))));

  // The y axis: round steps of one IEC unit, with room above the peak and the budget.
  const double top_bytes = static_cast<double>(std::max({t.peak_bytes, options.budget_bytes, kKiB}));
  static constexpr std::pair<std::string_view, uint64_t> kUnits[] = {
      {"TiB", kTiB}, {"GiB", kGiB}, {"MiB", kMiB}, {"KiB", kKiB}, {"B", 1}};
  std::pair<std::string_view, uint64_t> unit = kUnits[4];
  for (const auto& u : kUnits) {
    if (top_bytes >= static_cast<double>(u.second)) {
      unit = u;
      break;
    }
  }
  const double unit_bytes = static_cast<double>(unit.second);
  const double y_step = NiceStep(top_bytes * 1.08 / unit_bytes / 6) * unit_bytes;
  f.y_max = std::ceil(top_bytes * 1.08 / y_step) * y_step;

  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
      options.width, options.height, options.width, options.height);
  const std::string title = options.title.empty() ? Cat("Memory timeline: ", step.name()) : options.title;
  Put(svg, "<title>", Escape(title), "</title>\n");
  Put(svg, "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
  Put(svg, "<text id=\"title\" x=\"", Px(f.left), "\" y=\"30\" font-size=\"18\" font-weight=\"bold\">", Escape(title),
      "</text>\n");
  std::string subtitle = "no ops";
  if (t.peak_op != kNone) {
    subtitle = absl::StrFormat("peak %s at entry %d (%s) of %d", FormatBytes(t.peak_bytes), t.peak_op,
                               step.op(t.peak_op).name, step.num_ops());
    if (options.budget_bytes > 0) {
      Put(subtitle,
          t.peak_bytes <= options.budget_bytes
              ? absl::StrFormat("; fits the %s %s with %s spare", options.budget_label,
                                FormatBytes(options.budget_bytes), FormatBytes(options.budget_bytes - t.peak_bytes))
              : absl::StrFormat("; %s over the %s %s", FormatBytes(t.peak_bytes - options.budget_bytes),
                                options.budget_label, FormatBytes(options.budget_bytes)));
    }
  }
  Put(svg, "<text id=\"subtitle\" x=\"", Px(f.left), "\" y=\"52\" fill=\"#555555\">", Escape(subtitle), "</text>\n");

  // Grid and y axis.
  Put(svg, "<g id=\"y-axis\" fill=\"#333333\" text-anchor=\"end\">\n");
  for (double v = 0; v <= f.y_max * (1 + 1e-9); v += y_step) {
    const std::string y = Px(f.Y(v));
    Put(svg, "<line x1=\"", Px(f.left), "\" x2=\"", Px(f.right), "\" y1=\"", y, "\" y2=\"", y,
        "\" stroke=\"#e6e6e6\"/>\n");
    Put(svg, "<text x=\"", Px(f.left - 8), "\" y=\"", Px(f.Y(v) + 4), "\">", TickLabel(v, unit.second, unit.first),
        "</text>\n");
  }
  Put(svg, "<text transform=\"translate(18 ", Px((f.top + f.bottom) / 2),
      ") rotate(-90)\" text-anchor=\"middle\">device memory</text>\n</g>\n");

  if (t.peak_op != kNone) {
    // Stacked areas, bottom series first.
    for (size_t s = 0; s < kNumTimelineSeries; ++s) {
      if (!t.present[s]) continue;
      Put(svg, "<path class=\"area\" id=\"area-", kSeriesId[s], "\" fill=\"", kSeriesColor[s], "\" d=\"",
          AreaPath(t, f, s), "\"><title>", kSeriesName[s], ": ", FormatBytes(t.bytes_at_peak[s]),
          " at the peak</title></path>\n");
    }
    Bands(svg, t.recompute_runs, f, "recompute", kRecomputeColor);
    Bands(svg, t.copy_runs, f, "copy", kCopyColor);

    // Where backward and the optimizer step begin (their first ops; a copy
    // or replay placed earlier in another phase does not move the line).
    for (Phase phase : {Phase::kBackward, Phase::kOptimizer}) {
      const auto it =
          std::find_if(step.ops().begin(), step.ops().end(), [phase](const Op& op) { return op.phase == phase; });
      if (it == step.ops().end() || it->id == 0) continue;
      const double x = f.X(static_cast<size_t>(it->id));
      Put(svg, "<g class=\"phase\"><line x1=\"", Px(x), "\" x2=\"", Px(x), "\" y1=\"", Px(f.top), "\" y2=\"",
          Px(f.bottom), "\" stroke=\"#666666\" stroke-dasharray=\"2 3\"/><text x=\"", Px(x + 4), "\" y=\"",
          Px(f.top + 14), "\" fill=\"#555555\" font-size=\"11\"", kHalo, ">", PhaseName(phase), "</text></g>\n");
    }

    // The peak.
    const auto& peak_column =
        *std::find_if(t.columns.begin(), t.columns.end(), [&](const TimelineColumn& c) { return c.op == t.peak_op; });
    const double peak_x =
        (f.X(static_cast<size_t>(peak_column.first_op)) + f.X(static_cast<size_t>(peak_column.last_op) + 1)) / 2;
    const double peak_y = std::round(f.Y(static_cast<double>(t.peak_bytes)) * 10) / 10;
    const bool label_left = peak_x > (f.left + f.right) / 2;
    Put(svg, "<g id=\"peak\"><circle cx=\"", Px(peak_x), "\" cy=\"", Px(peak_y),
        "\" r=\"3.5\" fill=\"#222222\"/><text x=\"", Px(peak_x + (label_left ? -7 : 7)), "\" y=\"", Px(peak_y - 7),
        "\" text-anchor=\"", label_left ? "end" : "start", "\" font-weight=\"bold\"", kHalo, ">peak ",
        FormatBytes(t.peak_bytes), "</text></g>\n");
  }

  if (options.budget_bytes > 0) {
    const std::string y = Px(f.Y(static_cast<double>(options.budget_bytes)));
    Put(svg, "<line id=\"budget\" x1=\"", Px(f.left), "\" x2=\"", Px(f.right), "\" y1=\"", y, "\" y2=\"", y,
        "\" stroke=\"#222222\" stroke-width=\"1.5\" stroke-dasharray=\"7 4\"/>\n");
    Put(svg, "<text id=\"budget-label\" x=\"", Px(f.right - 4), "\" y=\"",
        Px(f.Y(static_cast<double>(options.budget_bytes)) - 5), "\" text-anchor=\"end\" fill=\"#222222\"", kHalo, ">",
        Escape(options.budget_label), " ", FormatBytes(options.budget_bytes), "</text>\n");
  }

  // The x axis: schedule entries.
  Put(svg, "<g id=\"x-axis\" fill=\"#333333\" text-anchor=\"middle\">\n<line x1=\"", Px(f.left), "\" x2=\"",
      Px(f.right), "\" y1=\"", Px(f.bottom), "\" y2=\"", Px(f.bottom), "\" stroke=\"#333333\"/>\n");
  if (f.num_ops > 0) {
    const auto x_step = static_cast<size_t>(std::max(1.0, NiceStep(static_cast<double>(f.num_ops) / 8)));
    for (size_t op = 0; op <= f.num_ops; op += x_step) {
      const std::string x = Px(f.X(op));
      Put(svg, "<line x1=\"", x, "\" x2=\"", x, "\" y1=\"", Px(f.bottom), "\" y2=\"", Px(f.bottom + 5),
          "\" stroke=\"#333333\"/><text x=\"", x, "\" y=\"", Px(f.bottom + 19), "\">", std::to_string(op), "</text>\n");
    }
  }
  Put(svg, "<text x=\"", Px((f.left + f.right) / 2), "\" y=\"", Px(height - 12),
      "\">schedule entry (op index)</text>\n</g>\n");

  // The legend, top to bottom as the stack reads.
  const double lx = f.right + 24;
  double ly = f.top;
  Put(svg, "<g id=\"legend\">\n<text x=\"", Px(lx), "\" y=\"", Px(ly), "\" fill=\"#555555\">",
      t.peak_op == kNone ? std::string("no ops") : absl::StrFormat("at the peak (entry %d)", t.peak_op), "</text>\n");
  ly += 14;
  auto entry = [&](std::string_view swatch, std::string_view label, std::string_view detail) {
    Put(svg, "<g class=\"legend-entry\">", swatch, "<text x=\"", Px(lx + 24), "\" y=\"", Px(ly + 11), "\">",
        Escape(label), "</text>");
    if (!detail.empty()) {
      Put(svg, "<text x=\"", Px(lx + 24), "\" y=\"", Px(ly + 25), "\" fill=\"#555555\" font-size=\"11\">",
          Escape(detail), "</text>");
    }
    Put(svg, "</g>\n");
    ly += detail.empty() ? 22 : 36;
  };
  auto box = [&](std::string_view color, std::string_view opacity) {
    return Cat("<rect x=\"", Px(lx), "\" y=\"", Px(ly), "\" width=\"16\" height=\"14\" fill=\"", color,
               "\" fill-opacity=\"", opacity, "\"/>");
  };
  for (size_t s = kNumTimelineSeries; s-- > 0;) {
    if (t.present[s]) entry(box(kSeriesColor[s], "1"), kSeriesName[s], FormatBytes(t.bytes_at_peak[s]));
  }
  ly += 6;
  if (options.budget_bytes > 0) {
    entry(Cat("<line x1=\"", Px(lx), "\" x2=\"", Px(lx + 16), "\" y1=\"", Px(ly + 7), "\" y2=\"", Px(ly + 7),
              "\" stroke=\"#222222\" stroke-width=\"1.5\" stroke-dasharray=\"4 2\"/>"),
          options.budget_label, FormatBytes(options.budget_bytes));
  }
  if (!t.recompute_runs.empty()) {
    entry(box(kRecomputeColor, "0.6"), "recompute", absl::StrFormat("%d ops replayed", RunOps(t.recompute_runs)));
  }
  if (!t.copy_runs.empty()) {
    entry(box(kCopyColor, "0.6"), "offload / prefetch", absl::StrFormat("%d copies", RunOps(t.copy_runs)));
  }
  Put(svg, "</g>\n</svg>\n");
  return svg;
}

}  // namespace headroom
