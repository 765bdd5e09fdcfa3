// `headroom replay`: trace formats, comparisons, strictness and errors.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/run_command.h"

namespace headroom {
namespace {

using ::headroom::testing::RunHeadroom;
using ::headroom::testing::WriteTempFile;
using ::testing::HasSubstr;

constexpr char kLog[] =
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "1,0.1,allocate,0x10,4194304,0\n"
    "1,0.2,allocate,0x20,40000000,0x5\n"
    "1,0.3,free,0x10,4194304,0\n"
    "1,0.4,free,0x99,64,0\n"
    "1,0.5,allocate,0x30,3000000,0\n";

TEST(ReplayCli, ComparesConfigurations) {
  const std::string path = WriteTempFile("replay.csv", kLog);
  auto r = RunHeadroom({"replay", path, "--capacity", "1GiB", "--compare", "pytorch-default", "--compare",
                        "expandable_segments:True,expandable_page_mb:2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The header counts the trace's own events, the unknown free included.
  EXPECT_THAT(r.out, HasSubstr("3 allocations, 2 frees"));
  EXPECT_THAT(r.out, HasSubstr("pytorch-default"));
  EXPECT_THAT(r.out, HasSubstr("expandable"));
  EXPECT_THAT(r.out, HasSubstr("60.00 MiB"));  // default: 20 MiB + 40 MiB segments
  EXPECT_THAT(r.out, HasSubstr("44.00 MiB"));  // expandable, 2 MiB pages: mapped pages only
  EXPECT_THAT(r.out, HasSubstr("replay.csv:5: free of 0x99"));
}

TEST(ReplayCli, SummaryPrintsTheStatisticsTable) {
  const std::string path = WriteTempFile("replay_summary.csv", kLog);
  auto r = RunHeadroom({"replay", path, "--summary"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("pytorch-default at the end of the trace:"));
  EXPECT_THAT(r.out, HasSubstr("reserved memory"));
  EXPECT_THAT(r.out, HasSubstr("device allocs: 2"));
}

TEST(ReplayCli, JsonHasExactFigures) {
  const std::string path = WriteTempFile("replay_json.csv", kLog);
  auto r = RunHeadroom({"replay", path, "--conf", "expandable_segments:True,expandable_page_mb:2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["runs"].size(), 1u);
  EXPECT_EQ(j["runs"][0]["conf"], "expandable_segments:True,expandable_page_mb:2");
  EXPECT_EQ(j["runs"][0]["peak_reserved_bytes"], 44u << 20);
  EXPECT_EQ(j["runs"][0]["anomalies"], 1);
  EXPECT_EQ(j["runs"][0]["memory_stats"]["num_ooms"], 0);
  EXPECT_EQ(j["capacity_bytes"], 80ull << 30);
}

TEST(ReplayCli, StrictMakesAnomaliesFatal) {
  const std::string path = WriteTempFile("replay_strict.csv", kLog);
  auto r = RunHeadroom({"replay", path, "--strict"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("replay_strict.csv:5: free of 0x99"));
}

TEST(ReplayCli, ReportsOomsOnASmallDevice) {
  const std::string path = WriteTempFile("replay_oom.csv", kLog);
  auto r = RunHeadroom({"replay", path, "--capacity", "50MiB", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GE(j["runs"][0]["ooms"], 1);
}

// The header and the live peak describe the trace: a run that runs out of
// memory does not change them (its OOMs are in its own row).
TEST(ReplayCli, TraceFiguresDoNotDependOnTheDevice) {
  const std::string path = WriteTempFile("replay_header.csv", kLog);
  auto big = RunHeadroom({"replay", path, "--capacity", "1GiB"});
  auto small = RunHeadroom({"replay", path, "--capacity", "50MiB"});
  ASSERT_EQ(big.exit_code, 0) << big.err;
  ASSERT_EQ(small.exit_code, 0) << small.err;
  auto header = [](const std::string& out) { return out.substr(0, out.find("; device")); };
  EXPECT_EQ(header(big.out), header(small.out));
  EXPECT_THAT(small.out, HasSubstr("peak live 42.15 MiB"));
  auto j = nlohmann::json::parse(RunHeadroom({"replay", path, "--capacity", "50MiB", "--json"}).out);
  EXPECT_GE(j["runs"][0]["ooms"], 1);
  EXPECT_EQ(j["runs"][0]["peak_live_bytes"], 4194304 + 40000000);
}

// The bundled example (scripts/make-example-trace): on a 13 GiB device the
// default cache runs out of memory, expandable segments do not.
// PyTorch's policy needs its 20 MiB and 40 MiB segments at once; 2 MiB
// pages need the 44 MiB they map. Below that, a run does not fit at all.
TEST(ReplayCli, SmallestFindsTheSmallestDeviceOfEachRun) {
  const std::string path = WriteTempFile("replay_smallest.csv", kLog);
  const std::vector<std::string> runs = {"--compare", "pytorch-default", "--compare",
                                         "expandable_segments:True,expandable_page_mb:2", "--smallest"};
  std::vector<std::string> json = {"replay", path, "--json"};
  json.insert(json.end(), runs.begin(), runs.end());
  auto r = RunHeadroom(json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["runs"][0]["smallest_device_bytes"], 60u << 20);
  EXPECT_EQ(j["runs"][1]["smallest_device_bytes"], 44u << 20);
  // Why 2 MiB less fails: PyTorch's policy holds 16 MiB free in the 20 MiB segment of the 4 MiB block when the
  // 40 MB block needs a segment of its own; with 2 MiB pages the two blocks need more than 42 MiB.
  const nlohmann::json& pytorch_below = j["runs"][0]["below_smallest"];
  EXPECT_EQ(pytorch_below["capacity_bytes"], 58u << 20);
  EXPECT_EQ(pytorch_below["location"], path + ":3");
  EXPECT_EQ(pytorch_below["requested_bytes"], 40000000u);
  EXPECT_EQ(pytorch_below["live_bytes"], 4u << 20);
  EXPECT_EQ(pytorch_below["free_cached_bytes"], 16u << 20);
  EXPECT_EQ(pytorch_below["largest_free_block_bytes"], 16u << 20);
  EXPECT_EQ(j["runs"][1]["below_smallest"]["capacity_bytes"], 42u << 20);
  EXPECT_FALSE(j["runs"][0].contains("first_oom"));  // 80 GiB is enough
  // Planned with every lifetime known, the 4 MiB block goes above the 40 MB one, on pages 19-21; the 3 MB block
  // allocated after its free takes its place.
  EXPECT_EQ(j["planned_layout"]["peak_page_bytes"], 44u << 20);
  EXPECT_EQ(j["planned_layout"]["arena_bytes"], 40000000u + (4u << 20));
  EXPECT_EQ(j["planned_layout"]["live_peak_bytes"], 40000000u + (4u << 20));
  std::vector<std::string> text = {"replay", path, "--capacity", "50MiB"};
  text.insert(text.end(), runs.begin(), runs.end());
  r = RunHeadroom(text);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("smallest device"));
  EXPECT_THAT(r.out, HasSubstr("over 50.00 MiB"));  // PyTorch's policy does not fit on the device replayed on
  EXPECT_THAT(r.out, HasSubstr("       44.00 MiB\n"));
  EXPECT_THAT(r.out, HasSubstr("pytorch-default, first out of memory: " + path + ":3: 38.15 MiB requested with 4.00 MiB "
                               "live on a 50.00 MiB device; the allocator held 20.00 MiB, 16.00 MiB of it free in "
                               "blocks of at most 16.00 MiB\n"));
  EXPECT_THAT(r.out, HasSubstr(", 2 MiB less than its smallest device: " + path + ":3: 38.15 MiB requested with "
                               "4.00 MiB live on a 42.00 MiB device; the allocator held 4.00 MiB (the live bytes "
                               "alone do not fit)\n"));
  EXPECT_THAT(r.out, HasSubstr("planned layout (every block's lifetime known in advance, greedy by size): 44.00 MiB "
                               "of 2.00 MiB pages at most (1.044x live), 42.15 MiB as one buffer."));
  r = RunHeadroom({"replay", path, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(nlohmann::json::parse(r.out)["runs"][0].contains("smallest_device_bytes"));  // only when asked
  EXPECT_FALSE(nlohmann::json::parse(r.out).contains("planned_layout"));
}

TEST(ReplayCli, ExampleTraceNeedsExpandableSegmentsOnA13GiBDevice) {
  auto r = RunHeadroom({"replay", HEADROOM_SOURCE_DIR "/examples/traces/gpt2-medium-train.rmm.csv", "--capacity",
                        "13GiB", "--compare", "pytorch-default", "--compare", "expandable", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_GE(j["runs"][0]["ooms"], 1);
  EXPECT_EQ(j["runs"][1]["ooms"], 0);
  EXPECT_LE(j["runs"][1]["reserved_to_live"], 1.05);
}

TEST(ReplayCli, ReadsPyTorchSnapshots) {
  const std::string path = WriteTempFile("snap.json", R"({"segments": [], "device_traces": [[
    {"action": "alloc", "addr": 1000, "size": 3145728, "stream": 0},
    {"action": "free_requested", "addr": 1000, "size": 3145728, "stream": 0},
    {"action": "free_completed", "addr": 1000, "size": 3145728, "stream": 0}]]})");
  auto r = RunHeadroom({"replay", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("pytorch-snapshot"));
  EXPECT_THAT(r.out, HasSubstr("1 allocations, 1 frees"));
}

TEST(ReplayCli, InputErrorsExitTwo) {
  const std::string path = WriteTempFile("replay_err.csv", kLog);
  auto bad_conf = RunHeadroom({"replay", path, "--conf", "expandable_segments:maybe"});
  EXPECT_EQ(bad_conf.exit_code, 2);
  EXPECT_THAT(bad_conf.err, HasSubstr("configuration 'expandable_segments:maybe': expandable_segments:maybe: "
                                      "expected True or False (or a preset: pytorch-default, "));
  auto bad_capacity = RunHeadroom({"replay", path, "--capacity", "lots"});
  EXPECT_EQ(bad_capacity.exit_code, 2);
  auto missing = RunHeadroom({"replay", "/nonexistent/trace.csv"});
  EXPECT_EQ(missing.exit_code, 2);
  const std::string broken = WriteTempFile("broken.csv", "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,grab,0x1,2,0\n");
  auto malformed = RunHeadroom({"replay", broken});
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_THAT(malformed.err, HasSubstr("broken.csv:2: unknown action 'grab'"));
}

// A run of the model built (a 4 MiB block that lives on) and three steps of two blocks each, freed by their end;
// `last_size` is the third step's second block. Times in the CPU recorder's way: event n at n nanoseconds.
std::string StepsLog(const std::string& last_size) {
  const std::vector<std::string> events = {
      "allocate,0x1,4194304",  "allocate,0x2,1048576", "allocate,0x3,2097152", "free,0x2,1048576",
      "free,0x3,2097152",      "allocate,0x4,1048576", "allocate,0x5,2097152", "free,0x4,1048576",
      "free,0x5,2097152",      "allocate,0x6,1048576", "allocate,0x7," + last_size, "free,0x6,1048576",
      "free,0x7," + last_size};
  std::string log = "Thread,Time,Action,Pointer,Size,Stream\n";
  for (size_t i = 0; i < events.size(); ++i) {
    const std::string ns = std::to_string(i + 1);
    log += "1,0." + std::string(9 - ns.size(), '0') + ns + "," + events[i] + ",0\n";
  }
  return log;
}

TEST(ReplayCli, WritesALayoutPlanAndFollowsIt) {
  const std::string trace = WriteTempFile("steps.rmm.csv", StepsLog("2097152"));
  const std::string steps = WriteTempFile("steps.steps.json", R"({"step_end_events": [5, 9, 13]})");
  const std::string plan = ::testing::TempDir() + "/steps.plan.json";
  auto written = RunHeadroom({"replay", trace, "--steps", steps, "--write-plan", plan, "--json"});
  ASSERT_EQ(written.exit_code, 0) << written.err;
  const nlohmann::json report = nlohmann::json::parse(written.out);
  EXPECT_EQ(report["layout_plan"]["path"], plan);
  EXPECT_EQ(report["layout_plan"]["repeating_step"], 2);  // step 1 also builds the model
  EXPECT_EQ(report["layout_plan"]["blocks"], 5);           // up to step 2's end
  EXPECT_EQ(report["layout_plan"]["repeat_from"], 3);
  EXPECT_EQ(report["layout_plan"]["extent_bytes"], 7 * 1048576);

  const std::string conf = "headroom,layout_plan:" + plan;
  auto followed = RunHeadroom({"replay", trace, "--compare", "headroom", "--compare", conf, "--json"});
  ASSERT_EQ(followed.exit_code, 0) << followed.err;
  const nlohmann::json runs = nlohmann::json::parse(followed.out)["runs"];
  EXPECT_FALSE(runs[0].contains("plan_departure"));
  EXPECT_TRUE(runs[1]["plan_departure"].is_null());
  EXPECT_EQ(runs[1]["memory_stats"]["num_planned_allocs"], 7);
  auto text = RunHeadroom({"replay", trace, "--conf", conf});
  EXPECT_THAT(text.out, HasSubstr("7 of 7 allocations where its layout plan put them\n"));

  // A run whose third step differs leaves the plan there, and the policy serves the rest.
  const std::string other = WriteTempFile("other.rmm.csv", StepsLog("3145728"));
  auto departed = RunHeadroom({"replay", other, "--conf", conf});
  ASSERT_EQ(departed.exit_code, 0) << departed.err;
  EXPECT_THAT(departed.out, HasSubstr("6 of 7 allocations where its layout plan put them; it left the plan: "
                                      "request 6 asks for 3145728 bytes; the plan has 2097152 there"));
}

TEST(ReplayCli, LayoutPlanErrorsNameTheirInput) {
  const std::string trace = WriteTempFile("plan_err.rmm.csv", StepsLog("2097152"));
  const std::string steps = WriteTempFile("plan_err.steps.json", R"({"step_end_events": [5, 9, 13]})");
  const std::string plan = ::testing::TempDir() + "/plan_err.plan.json";
  auto no_steps = RunHeadroom({"replay", trace, "--write-plan", plan});
  EXPECT_EQ(no_steps.exit_code, 2);
  EXPECT_THAT(no_steps.err, HasSubstr("--write-plan and --steps go together"));
  const std::string one_step = WriteTempFile("plan_err_one.steps.json", R"({"step_end_events": [13]})");
  auto no_repeat = RunHeadroom({"replay", trace, "--steps", one_step, "--write-plan", plan});
  EXPECT_EQ(no_repeat.exit_code, 2);
  EXPECT_THAT(no_repeat.err, HasSubstr("no step of the 1 recorded is repeated by every later one"));
  auto missing = RunHeadroom({"replay", trace, "--conf", "headroom,layout_plan:/no/such.plan.json"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("configuration 'headroom,layout_plan:/no/such.plan.json': layout_plan: "));
  const std::string bad = WriteTempFile("bad.plan.json", R"({"format": "headroom.layout_plan", "version": 7})");
  auto malformed = RunHeadroom({"replay", trace, "--conf", "headroom,layout_plan:" + bad});
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_THAT(malformed.err, HasSubstr("bad.plan.json: version: this Headroom reads version 1, not 7"));
}

// Each bad input exits 2 with one line that names it.
void ExpectOneLineError(const ::headroom::testing::CommandResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr(needle));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(ReplayCli, CapacityBeyondTheSimulatedDeviceIsAnError) {
  const std::string path = WriteTempFile("replay_capacity.csv", kLog);
  ExpectOneLineError(RunHeadroom({"replay", path, "--capacity", "65537TiB"}),
                     "--capacity 65537TiB is 72058693549555712 bytes, more than the simulated device's limit of "
                     "72057594037927936 bytes (64 PiB)");
}

// The page table of an expandable segment grows with what is mapped, not
// with the capacity: a 16 PiB device replays like an 80 GiB one (it
// allocated 64 GiB of page table up front and aborted before).
TEST(ReplayCli, ExpandableSegmentsOnAHugeDevice) {
  auto r = RunHeadroom({"replay", HEADROOM_SOURCE_DIR "/examples/traces/gpt2-medium-train.rmm.csv", "--capacity",
                        "18014398509481984", "--conf", "expandable", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["capacity_bytes"], 18014398509481984ull);
  EXPECT_EQ(j["runs"][0]["ooms"], 0);
  EXPECT_LE(j["runs"][0]["reserved_to_live"], 1.05);
}

TEST(ReplayCli, NegativeDeviceIsAnError) {
  const std::string path = WriteTempFile("replay_device.csv", kLog);
  ExpectOneLineError(RunHeadroom({"replay", path, "--device", "-1"}), "--device -1: a device index is 0 or more");
  ExpectOneLineError(RunHeadroom({"replay", path, "--device", "0"}), "--device applies to PyTorch snapshots only");
}

TEST(ReplayCli, TraceThatIsNotAFileIsAnError) {
  const std::string path = WriteTempFile("replay_dir_probe.csv", kLog);
  const std::string dir = path.substr(0, path.rfind('/'));
  ExpectOneLineError(RunHeadroom({"replay", dir}), dir + ": is a directory, not a file");
  ExpectOneLineError(RunHeadroom({"replay", "/dev/zero"}), "/dev/zero: is not a regular file");
}

TEST(ReplayCli, SizeBeyondAnyDeviceNamesTheLine) {
  const std::string path = WriteTempFile(
      "replay_huge.csv", "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10,9223372036854775808,0\n");
  ExpectOneLineError(RunHeadroom({"replay", path}),
                     "replay_huge.csv:2: allocation of 9223372036854775808 bytes: allocate: ");
}

TEST(ReplayCli, ZeroByteAllocationsAreNoAnomaly) {
  const std::string path = WriteTempFile("replay_zero.csv",
                                         "Thread,Time,Action,Pointer,Size,Stream\n"
                                         "1,0.1,allocate,0x0,0,0\n"
                                         "1,0.2,allocate,0x10,4096,0\n"
                                         "1,0.3,free,0x0,0,0\n"
                                         "1,0.4,free,0x10,4096,0\n");
  auto r = RunHeadroom({"replay", path, "--strict"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("anomalies")));
}

// A step file that does not fit its trace is the step file's fault: it was
// once accepted (an empty step) or blamed on the trace.
TEST(ReplayCli, StepEndsOutsideTheTraceNameTheStepFile) {
  const std::string trace = WriteTempFile("bad_steps.rmm.csv", StepsLog("2097152"));
  const std::string plan = ::testing::TempDir() + "/bad_steps.plan.json";
  const std::string repeated = WriteTempFile("repeated.steps.json", R"({"step_end_events": [5, 9, 9, 13]})");
  ExpectOneLineError(RunHeadroom({"replay", trace, "--steps", repeated, "--write-plan", plan}),
                     "repeated.steps.json: step_end_events[2]: 9 repeats the step end before it");
  const std::string past = WriteTempFile("past.steps.json", R"({"step_end_events": [5, 9, 13, 17]})");
  ExpectOneLineError(RunHeadroom({"replay", trace, "--steps", past, "--write-plan", plan}),
                     "past.steps.json: step_end_events[3]: 17 is past the last event of " + trace + " (at 13)");
  // As written, not as the double it would be read as.
  const std::string huge = WriteTempFile("huge.steps.json", R"({"step_end_events": [5, 18446744073709551616]})");
  ExpectOneLineError(RunHeadroom({"replay", trace, "--steps", huge, "--write-plan", plan}),
                     "huge.steps.json: step_end_events[1]: 18446744073709551616 is too large an integer");
  EXPECT_FALSE(std::filesystem::exists(plan));
}

// An allocator follows a layout plan on one stream: a plan of a trace on
// two was once written and reported, then left at the first request on the
// second stream.
TEST(ReplayCli, WritePlanRefusesATraceOnTwoStreams) {
  std::string log = StepsLog("2097152");
  const size_t line = log.find("allocate,0x4,1048576,0");
  log.replace(line, std::string("allocate,0x4,1048576,0").size(), "allocate,0x4,1048576,0x7");
  const std::string trace = WriteTempFile("two_streams.rmm.csv", log);
  const std::string steps = WriteTempFile("two_streams.steps.json", R"({"step_end_events": [5, 9, 13]})");
  const std::string plan = ::testing::TempDir() + "/two_streams.plan.json";
  ExpectOneLineError(RunHeadroom({"replay", trace, "--steps", steps, "--write-plan", plan}),
                     "--write-plan: " + trace + ":7 allocates on stream 0x7 after stream 0 (" + trace + ":2)");
  EXPECT_FALSE(std::filesystem::exists(plan));
}

// Fields echoed from a trace are quoted, escaped and cut: one line, no
// terminal escapes, not a 10 MB line.
TEST(ReplayCli, TraceFieldsAreQuotedInErrors) {
  const std::string escape = WriteTempFile(
      "escape.csv", "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,\x1b[2J\x1b[31mallocate\x07,0x10,64,0\n");
  ExpectOneLineError(RunHeadroom({"replay", escape}), R"(escape.csv:2: unknown action '\x1b[2J\x1b[31mallocate\x07')");
  const std::string long_line = WriteTempFile(
      "long.csv", "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10," + std::string(10 << 20, '9') + ",0\n");
  auto r = RunHeadroom({"replay", long_line});
  ExpectOneLineError(r, "long.csv:2: bad size '" + std::string(80, '9') + "...' (10485760 bytes)");
  EXPECT_LT(r.err.size(), 300u);
}

}  // namespace
}  // namespace headroom
