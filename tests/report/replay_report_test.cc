// The replay report's planned layout: shown when given, and a trace too long
// for one says so instead of failing the replays it was printed beside.
#include "report/replay_report.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ReplayReport, SaysWhyATraceHasNoPlannedLayout) {
  const AllocationTrace trace{.source = "long.csv", .format = "rmm-csv"};
  const std::vector<ReplayRun> runs = {{.label = "headroom", .smallest_device_bytes = uint64_t{4} << 20}};
  ReplayReportOptions options;
  EXPECT_THAT(RenderReplayReport(trace, uint64_t{1} << 30, runs, options), Not(HasSubstr("planned layout")));
  EXPECT_FALSE(ReplayReportToJson(trace, uint64_t{1} << 30, runs, options).contains("planned_layout"));

  options.planned = absl::OutOfRangeError("long.csv: more than 2097152 allocations, the most a planned layout takes");
  EXPECT_THAT(RenderReplayReport(trace, uint64_t{1} << 30, runs, options),
              HasSubstr("planned layout: not made: long.csv: more than 2097152 allocations"));
  EXPECT_THAT(ReplayReportToJson(trace, uint64_t{1} << 30, runs, options)["planned_layout"]["error"].get<std::string>(),
              HasSubstr("more than 2097152 allocations"));
}

}  // namespace
}  // namespace headroom
