// Files the CLI writes (--out, --trace-out, --svg, --graph-out, --write-plan):
// a failed write names its reason and keeps the previous file, and no output
// overwrites the command's own input (cli/output_files.h).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli/run_command.h"

namespace headroom {
namespace {

using ::headroom::testing::RunHeadroom;
using ::headroom::testing::WriteTempFile;
using ::testing::HasSubstr;

const std::vector<std::string> kPlan = {"plan", "--model", "gpt2", "--budget", "80%", "--strategy", "sqrt-n"};

std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int Lines(const std::string& text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

TEST(OutputFilesCli, AFailedWriteNamesTheReason) {
  auto missing = RunHeadroom(With(kPlan, {"--out", "/nonexistent-headroom-dir/plan.json"}));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err,
              HasSubstr("--out /nonexistent-headroom-dir/plan.json: cannot write: No such file or directory"));
  EXPECT_EQ(Lines(missing.err), 1) << missing.err;
  // A device is written in place, not replaced; /dev/full is a full disk.
  auto full = RunHeadroom(With(kPlan, {"--trace-out", "/dev/full"}));
  EXPECT_EQ(full.exit_code, 2);
  EXPECT_THAT(full.err, HasSubstr("--trace-out /dev/full: cannot write: No space left on device"));
  auto directory = RunHeadroom(With(kPlan, {"--svg", ::testing::TempDir()}));
  EXPECT_EQ(directory.exit_code, 2);
  EXPECT_THAT(directory.err, HasSubstr("is a directory"));
}

// A write that fails half-way (here past RLIMIT_FSIZE, as on a full disk)
// once left the file truncated, its previous contents lost.
TEST(OutputFilesCli, AFailedWriteKeepsThePreviousFile) {
  const std::string dir = ::testing::TempDir() + "/output_files_kept";
  std::filesystem::create_directories(dir);
  const std::string plan = dir + "/plan.json";
  std::ofstream(plan) << "the previous plan\n";
  auto r = RunHeadroom(With(kPlan, {"--out", plan}), {.file_size_limit = 1024});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--out " + plan + ": cannot write: File too large"));
  EXPECT_EQ(Slurp(plan), "the previous plan\n");
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) left.push_back(entry.path().filename());
  EXPECT_THAT(left, ::testing::ElementsAre("plan.json"));  // no temporary file left behind

  auto written = RunHeadroom(With(kPlan, {"--out", plan}));
  ASSERT_EQ(written.exit_code, 0) << written.err;
  EXPECT_THAT(Slurp(plan), HasSubstr("\"schedule\""));
}

TEST(OutputFilesCli, AnOutputNeverOverwritesAnInput) {
  const std::string plan = WriteTempFile("own_input.plan.json", "");
  ASSERT_EQ(RunHeadroom(With(kPlan, {"--out", plan})).exit_code, 0);
  const std::string before = Slurp(plan);
  // Another spelling of the same file.
  const std::string other = ::testing::TempDir() + "/./own_input.plan.json";
  auto r = RunHeadroom({"plan", "--model", "gpt2", "--budget", "80%", "--load", plan, "--trace-out", other});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--trace-out " + other + ": is the --load file this command reads"));
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  EXPECT_EQ(Slurp(plan), before);

  const std::string trace = WriteTempFile("own_input.rmm.csv",
                                          "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10,64,0\n");
  const std::string steps = WriteTempFile("own_input.steps.json", R"({"step_end_events": [0]})");
  for (const std::string& input : {trace, steps}) {
    auto replay = RunHeadroom({"replay", trace, "--steps", steps, "--write-plan", input});
    EXPECT_EQ(replay.exit_code, 2);
    EXPECT_THAT(replay.err, HasSubstr("--write-plan " + input + ": is the"));
  }
  EXPECT_EQ(Lines(Slurp(trace)), 2);

  const std::string graph = WriteTempFile("own_input.graph.json", "");
  ASSERT_EQ(RunHeadroom({"estimate", "--model", "gpt2", "--budget", "80GiB", "--no-search", "--graph-out", graph})
                .exit_code,
            0);
  auto estimate = RunHeadroom({"estimate", "--model", graph, "--budget", "80GiB", "--trace-out", graph});
  EXPECT_EQ(estimate.exit_code, 2);
  EXPECT_THAT(estimate.err, HasSubstr("--trace-out " + graph + ": is the --model file this command reads"));
}

TEST(OutputFilesCli, TwoOutputsOfOneRunAreTwoFiles) {
  const std::string path = ::testing::TempDir() + "/two_outputs.json";
  auto r = RunHeadroom(With(kPlan, {"--out", path, "--svg", path}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--svg " + path + ": is also --out's file"));
}

// `--out ''` once succeeded and wrote nothing: an empty value read as "not given".
TEST(OutputFilesCli, AnEmptyPathIsRefused) {
  for (const char* flag : {"--out", "--trace-out", "--svg"}) {
    auto r = RunHeadroom(With(kPlan, {flag, ""}));
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_THAT(r.err, HasSubstr(flag)) << r.err;
    EXPECT_THAT(r.err, HasSubstr("an empty path names no file")) << r.err;
  }
  auto estimate = RunHeadroom({"estimate", "--model", "gpt2", "--budget", "80GiB", "--graph-out", ""});
  EXPECT_EQ(estimate.exit_code, 2);
  EXPECT_THAT(estimate.err, HasSubstr("an empty path names no file"));
  auto demo = RunHeadroom({"train-demo", "--graph-out", ""});
  EXPECT_EQ(demo.exit_code, 2);
  auto replay = RunHeadroom({"replay", "x.csv", "--steps", "s.json", "--write-plan", ""});
  EXPECT_EQ(replay.exit_code, 2);
  EXPECT_THAT(replay.err, HasSubstr("an empty path names no file"));
}

}  // namespace
}  // namespace headroom
