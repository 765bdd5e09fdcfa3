// Runs the built `headroom` binary in a subprocess and captures what it says.
#ifndef HEADROOM_TESTS_CLI_RUN_COMMAND_H_
#define HEADROOM_TESTS_CLI_RUN_COMMAND_H_

#include <string>
#include <vector>

namespace headroom::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs HEADROOM_BINARY with `args` (no shell involved).
CommandResult RunHeadroom(const std::vector<std::string>& args);

// Writes `contents` to a fresh file under the test's temporary directory.
std::string WriteTempFile(const std::string& name, const std::string& contents);

}  // namespace headroom::testing

#endif  // HEADROOM_TESTS_CLI_RUN_COMMAND_H_
