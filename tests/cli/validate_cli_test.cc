// `headroom validate`: fixtures' estimate_args read as `headroom estimate`
// reads its flags, exit codes (0 within tolerance, 1 outside, 2 a fixture
// that cannot be checked), folders, and the three output forms.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/run_command.h"

namespace headroom {
namespace {

using ::headroom::testing::RunHeadroom;
using ::headroom::testing::WriteTempFile;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A real fixture written by the harness in validation/.
nlohmann::json RealFixture() {
  std::ifstream in(std::string(HEADROOM_SOURCE_DIR) + "/tests/report/testdata/llama-mha-fp32-adamw-loop.json");
  return nlohmann::json::parse(in);
}

// ctest runs each test in its own process, in parallel: files are named per test so that none
// reads another's half-written file.
std::string Write(const std::string& name, const nlohmann::json& fixture) {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  return WriteTempFile(test + "_" + name, fixture.dump(1));
}

// What the estimate says for the real fixture's step, as `validate --json` reports it.
uint64_t EstimatedBytes() {
  static const uint64_t bytes = [] {
    auto r = RunHeadroom({"validate", "--json", Write("validate_probe.json", RealFixture())});
    const nlohmann::json j = nlohmann::json::parse(r.out);
    return j["fixtures"][0]["estimated"]["allocated_bytes"].get<uint64_t>();
  }();
  return bytes;
}

// The real fixture with its measured peak set so that the estimate is off by `error`.
nlohmann::json FixtureOffBy(double error, const std::string& name = "llama-mha-fp32-adamw-loop") {
  nlohmann::json fixture = RealFixture();
  fixture["name"] = name;
  fixture["measured"]["peak_allocated_bytes"] =
      static_cast<uint64_t>(static_cast<double>(EstimatedBytes()) / (1 + error));
  return fixture;
}

TEST(ValidateCli, WithinToleranceExitsZero) {
  ASSERT_GT(EstimatedBytes(), 0u);
  auto r = RunHeadroom({"validate", Write("validate_within.json", FixtureOffBy(0.02))});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr("llama-mha-fp32-adamw-loop"));
  EXPECT_THAT(r.out, HasSubstr("Llama (MHA), fp32, AdamW for-loop"));
  EXPECT_THAT(r.out, HasSubstr("+2.0%"));
  EXPECT_THAT(r.out, HasSubstr("backward: _log_softmax_backward_data"));
  EXPECT_THAT(r.out, HasSubstr("1 fixture: 1 within 3% of the measured peak, 0 outside"));
}

TEST(ValidateCli, OutsideToleranceExitsOne) {
  const std::string path = Write("validate_outside.json", FixtureOffBy(-0.062));
  auto r = RunHeadroom({"validate", path});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("-6.2%"));
  EXPECT_THAT(r.out, HasSubstr("outside 3%"));
  EXPECT_THAT(r.err, HasSubstr("headroom validate: 1 of 1 checks are outside the tolerance"));
  // A wider tolerance lets it pass.
  r = RunHeadroom({"validate", path, "--tolerance", "7"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("1 within 7%"));
  r = RunHeadroom({"validate", path, "--tolerance", "-1"});
  EXPECT_EQ(r.exit_code, 2);
}

// Each bad fixture is one line naming the file and the field or flag; exit 2.
TEST(ValidateCli, BadFixturesNameTheFileAndTheField) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--no-such-flag", "1"}, "estimate_args: --no-such-flag: unknown flag (not a `headroom estimate` setup flag)"},
      {{"--micro-batch", "two"}, "estimate_args: Could not convert: --micro-batch = two"},
      {{"--precision", "fp33"}, "estimate_args: --precision: "},
      {{"--gpu", "H100-80GB"},
       "estimate_args: --gpu: not taken here: a CUDA fixture's GPU is its \"device\"; the capacity plays no part"},
      {{"--json"}, "estimate_args: --json: not taken here"},
      {{"--budget=80GiB"}, "estimate_args: --budget: not taken here"},
      {{"--seq", "256", "7"}, "estimate_args: '7': a value no flag takes"},
      // Values are the file's: quoted or escaped, one line, cut.
      {{"--seq", "256", "7\x1b[2J\n"}, R"(estimate_args: '7\x1b[2J\n': a value no flag takes)"},
      {{"--micro-batch", "\x1b[2J\n"}, R"(estimate_args: Could not convert: --micro-batch = \x1b[2J\n)"},
      {{"--\x1b[2J"}, R"(estimate_args: --\x1b[2J: unknown flag)"},
      {{"--seq", "256", std::string(1 << 20, '7')},
       "estimate_args: '" + std::string(80, '7') + "...' (1048576 bytes): a value no flag takes"},
      {{"--cuda-context", "1\x1b[2J"}, R"(estimate_args: --cuda-context: '1\x1b[2J' has an unknown unit)"},
  };
  int n = 0;
  for (const Case& c : cases) {
    nlohmann::json fixture = RealFixture();
    fixture["estimate_args"] = c.args;
    const std::string path = Write("validate_bad_args_" + std::to_string(n++) + ".json", fixture);
    auto r = RunHeadroom({"validate", path});
    EXPECT_EQ(r.exit_code, 2) << c.message << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("headroom validate: " + path + ": " + c.message));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err.substr(0, 300);  // and the summary line
    EXPECT_EQ(r.err.find('\x1b'), std::string::npos);
    EXPECT_LT(r.err.size(), 1000u);
  }

  nlohmann::json fixture = RealFixture();
  fixture["measured"].erase("peak_allocated_bytes");
  const std::string missing = Write("validate_missing.json", fixture);
  auto r = RunHeadroom({"validate", missing});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "headroom validate: " + missing + ": measured.peak_allocated_bytes: required field is missing\n" +
                       "headroom validate: 1 of 1 fixtures could not be checked\n");

  fixture = RealFixture();
  fixture["headroom_fixture_version"] = 7;
  r = RunHeadroom({"validate", Write("validate_version.json", fixture)});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("validate_version.json: headroom_fixture_version: version 7 is not supported"));

  // An estimate the model cannot take is the fixture's fault too, named by its flag.
  fixture = RealFixture();
  fixture["estimate_args"] = {"--gpus", "3", "--tp", "3"};
  r = RunHeadroom({"validate", Write("validate_estimate_error.json", fixture)});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("validate_estimate_error.json: estimate: num_attention_heads (8) is not divisible"));
  EXPECT_THAT(r.out, HasSubstr("no fixture could be checked"));
}

TEST(ValidateCli, FoldersAreScannedInOrderAndBadFixturesDoNotHideTheOthers) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "validate_folder";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "traces");
  std::ofstream(dir / "b.json") << FixtureOffBy(0.01, "second").dump();
  std::ofstream(dir / "a.json") << FixtureOffBy(-0.01, "first").dump();
  std::ofstream(dir / "notes.txt") << "not a fixture";
  std::ofstream(dir / "traces" / "a.rmm.csv") << "Thread,Time,Action,Pointer,Size,Stream\n";
  auto r = RunHeadroom({"validate", dir.string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const size_t first = r.out.find("first"), second = r.out.find("second");
  ASSERT_NE(first, std::string::npos);
  ASSERT_NE(second, std::string::npos);
  EXPECT_LT(first, second);
  EXPECT_THAT(r.out, HasSubstr("2 fixtures: 2 within 3% of the measured peak, 0 outside"));

  std::ofstream(dir / "c.json") << "{\"headroom_fixture_version\": 1";
  r = RunHeadroom({"validate", dir.string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("first"));
  EXPECT_THAT(r.out, HasSubstr("second"));
  EXPECT_THAT(r.out, HasSubstr("; 1 could not be checked"));
  EXPECT_THAT(r.err, HasSubstr((dir / "c.json").string() + ": not valid JSON"));
  EXPECT_THAT(r.err, HasSubstr("1 of 3 fixtures could not be checked"));
  std::filesystem::remove_all(dir);
}

TEST(ValidateCli, PathsAreRequired) {
  auto r = RunHeadroom({"validate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("name a fixture file or a folder of them"));
  r = RunHeadroom({"validate", "/no/such/fixtures"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("/no/such/fixtures: no such fixture file or folder"));
}

TEST(ValidateCli, MarkdownAndJson) {
  nlohmann::json fixture = FixtureOffBy(0.0);
  fixture["peers"] = {{"accelerate", {{"bytes", 1000}, {"what", "model states only"}}}};
  const std::string path = Write("validate_outputs.json", fixture);
  auto r = RunHeadroom({"validate", path, "--markdown"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("| fixture | description | measured | estimated | error | measured peak at | "
                                "estimated peak at | accelerate | verdict |\n| --- | --- | ---: |"));
  EXPECT_THAT(r.out, HasSubstr("| llama-mha-fp32-adamw-loop | Llama (MHA), fp32, AdamW for-loop |"));
  EXPECT_THAT(r.out, HasSubstr("| -100.0% | ok |"));

  r = RunHeadroom({"validate", path, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["fixtures"][0]["path"], path);
  EXPECT_EQ(j["fixtures"][0]["measured"]["peak_allocated_bytes"], fixture["measured"]["peak_allocated_bytes"]);
  EXPECT_EQ(j["fixtures"][0]["peers"]["accelerate"]["bytes"], 1000);
  EXPECT_EQ(j["summary"]["passed"], true);
  EXPECT_THAT(r.out, Not(HasSubstr("reserved_error")));

  r = RunHeadroom({"validate", path, "--json", "--markdown"});
  EXPECT_EQ(r.exit_code, 2);
}

// A real applied-plans fixture written by validation/apply-plans (Note [Applied plans checked]).
nlohmann::json RealPlansFixture() {
  std::ifstream in(std::string(HEADROOM_SOURCE_DIR) + "/validation/fixtures/plans/llama-gqa.json");
  return nlohmann::json::parse(in);
}

// The index of the first plan that ran (the others carry Headroom's reason for making none).
size_t FirstRun(const nlohmann::json& fixture) {
  for (size_t i = 0; i < fixture["plans"].size(); ++i) {
    if (!fixture["plans"][i].contains("error")) return i;
  }
  ADD_FAILURE() << "no plan ran";
  return 0;
}

TEST(ValidateCli, AppliedPlansGiveACheckPerPlanThatRan) {
  const nlohmann::json fixture = RealPlansFixture();
  auto r = RunHeadroom({"validate", "--json", Write("plans.json", fixture)});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  size_t ran = 0;
  for (const nlohmann::json& run : fixture["plans"]) ran += run.contains("error") ? 0 : 1;
  ASSERT_EQ(j["fixtures"].size(), ran + 1);
  EXPECT_EQ(j["fixtures"][0]["name"], "llama-gqa no plan");
  const nlohmann::json& first = fixture["plans"][FirstRun(fixture)];
  EXPECT_EQ(j["fixtures"][1]["name"], "llama-gqa " + first["budget"].get<std::string>() + " " +
                                          first["strategy"].get<std::string>());
  EXPECT_EQ(j["fixtures"][1]["measured"]["gradients_bitwise_equal"], true);
  EXPECT_EQ(j["fixtures"][1]["measured"]["peak_allocated_bytes"], first["measured"]["peak_allocated_bytes"]);
}

TEST(ValidateCli, AnAppliedPlanWhoseGradientsDifferOrWhosePeakIsOffFails) {
  nlohmann::json fixture = RealPlansFixture();
  nlohmann::json& run = fixture["plans"][FirstRun(fixture)];
  run["measured"]["gradients_bitwise_equal"] = false;
  auto r = RunHeadroom({"validate", Write("grads.json", fixture)});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("gradients differ"));
  run["measured"]["gradients_bitwise_equal"] = true;
  run["measured"]["peak_allocated_bytes"] = run["measured"]["peak_allocated_bytes"].get<uint64_t>() * 11 / 10;
  r = RunHeadroom({"validate", Write("peak.json", fixture)});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("outside 3%"));
}

TEST(ValidateCli, AnAppliedPlanThatOffloadsIsCheckedOnHostMemoryToo) {
  nlohmann::json fixture = RealPlansFixture();
  nlohmann::json* offloading = nullptr;
  for (nlohmann::json& run : fixture["plans"]) {
    if (!run.contains("error") && run["measured"].value("host_peak_bytes", uint64_t{0}) > 0) offloading = &run;
  }
  ASSERT_NE(offloading, nullptr) << "the fixture has a plan that offloads";
  auto r = RunHeadroom({"validate", "--json", Write("host.json", fixture)});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"host_error\""));
  nlohmann::json& measured = (*offloading)["measured"];
  measured["host_peak_bytes"] = measured["host_peak_bytes"].get<uint64_t>() * 11 / 10;
  r = RunHeadroom({"validate", Write("host_off.json", fixture)});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("host outside 3%"));
  measured.erase("host_peak_bytes");  // a harness that did not count host memory proves nothing
  r = RunHeadroom({"validate", Write("host_missing.json", fixture)});
  EXPECT_EQ(r.exit_code, 1) << r.err;
}

TEST(ValidateCli, AnAppliedPlanOnSmallerInputsMustStayWithinItsPeak) {
  nlohmann::json fixture = RealPlansFixture();
  nlohmann::json& measured = fixture["plans"][FirstRun(fixture)]["measured"];
  const uint64_t peak = measured["peak_allocated_bytes"].get<uint64_t>();  // within 3% of the plan's
  measured["smaller_inputs"] = {{{"inputs", "input_ids 4x128"}, {"peak_allocated_bytes", peak / 2},
                                 {"gradients_bitwise_equal", true}}};
  auto r = RunHeadroom({"validate", Write("smaller.json", fixture)});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("smaller inputs' peak"));
  measured["smaller_inputs"].push_back(
      {{"inputs", "input_ids 2x256"}, {"peak_allocated_bytes", peak * 11 / 10}, {"gradients_bitwise_equal", true}});
  r = RunHeadroom({"validate", Write("smaller_over.json", fixture)});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("smaller inputs past the peak"));
  measured["smaller_inputs"][1]["peak_allocated_bytes"] = peak / 3;
  measured["smaller_inputs"][1]["gradients_bitwise_equal"] = false;
  r = RunHeadroom({"validate", Write("smaller_grads.json", fixture)});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  measured["smaller_inputs"][1]["gradients_bitwise_equal"] = 1;
  r = RunHeadroom({"validate", Write("smaller_bad.json", fixture)});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("measured.smaller_inputs[1].gradients_bitwise_equal: expected true or false"));
}

TEST(ValidateCli, BadAppliedPlansNameTheFieldAndAStepTheyWereNotMadeFor) {
  auto error_of = [](const std::string& name, const nlohmann::json& fixture) {
    auto r = RunHeadroom({"validate", Write(name, fixture)});
    EXPECT_EQ(r.exit_code, 2) << r.out;
    return r.err;
  };
  const nlohmann::json real = RealPlansFixture();
  const size_t first = FirstRun(real);
  nlohmann::json f = real;
  f.erase("job_args");
  EXPECT_THAT(error_of("no_args.json", f), HasSubstr("job_args: required field is missing"));
  f = real;
  f["kind"] = "plans";
  EXPECT_THAT(error_of("kind.json", f), HasSubstr("kind: unknown fixture kind 'plans'"));
  f = real;
  f["plans"][first]["measured"]["gradients_bitwise_equal"] = "yes";
  EXPECT_THAT(error_of("grads.json", f),
              HasSubstr(absl::StrCat("plans[", first, "].measured.gradients_bitwise_equal: expected true or false")));
  f = real;
  f["job_args"] = {"--grad-accum", "x"};
  EXPECT_THAT(error_of("flag.json", f), HasSubstr("job_args: Could not convert: --grad-accum = x"));
  f = real;
  f["plans"][first]["plan"]["step"]["fingerprint"] = "0000000000000000";
  EXPECT_THAT(error_of("step.json", f), HasSubstr(absl::StrCat("plans[", first, "].plan")));
}

}  // namespace
}  // namespace headroom
