// Golden outputs: what users see from `headroom estimate`, `replay` and
// `gpus` on the README's examples stays byte-identical unless a change means
// it to differ. tests/golden/cases.txt lists the commands (run from the
// repository root); tests/golden/<name>.txt holds each one's standard output.
// HEADROOM_UPDATE_GOLDEN=1 rewrites the .txt files instead of comparing.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <ostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/cli/run_command.h"

namespace headroom {
namespace {

struct GoldenCase {
  std::string name;
  std::vector<std::string> args;
};

void PrintTo(const GoldenCase& c, std::ostream* out) { *out << c.name; }

// Wall-clock figures differ from run to run; the golden files hold a mark.
std::string MaskTimes(const std::string& out) {
  static const std::regex kSeconds(R"("replay_seconds": [0-9.e+-]+)");
  return std::regex_replace(out, kSeconds, R"re("replay_seconds": "(time)")re");
}

std::string GoldenDir() { return std::string(HEADROOM_SOURCE_DIR) + "/tests/golden"; }

std::vector<GoldenCase> ReadCases() {
  std::vector<GoldenCase> cases;
  std::ifstream in(GoldenDir() + "/cases.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::pair<std::string, std::string> name_args = absl::StrSplit(line, absl::MaxSplits(": ", 1));
    cases.push_back({name_args.first, absl::StrSplit(name_args.second, ' ', absl::SkipEmpty())});
  }
  return cases;
}

class GoldenOutput : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenOutput, MatchesTheRecordedOutput) {
  const GoldenCase& c = GetParam();
  ASSERT_EQ(chdir(HEADROOM_SOURCE_DIR), 0);
  const testing::CommandResult r = testing::RunHeadroom(c.args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string out = MaskTimes(r.out);
  const std::string path = GoldenDir() + "/" + c.name + ".txt";
  if (std::getenv("HEADROOM_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(path) << out;
    return;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing golden file " << path;
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(out, expected.str()) << "output of `headroom " << absl::StrJoin(c.args, " ")
                                   << "` differs from " << path;
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenOutput, ::testing::ValuesIn(ReadCases()),
                         [](const ::testing::TestParamInfo<GoldenCase>& c) { return c.param.name; });

}  // namespace
}  // namespace headroom
