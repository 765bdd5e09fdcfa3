// Runs the built `headroom` binary in a subprocess and captures what it says.
#ifndef HEADROOM_TESTS_CLI_RUN_COMMAND_H_
#define HEADROOM_TESTS_CLI_RUN_COMMAND_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace headroom::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

struct RunOptions {
  // RLIMIT_FSIZE for the child, with SIGXFSZ ignored: a write past it fails
  // with EFBIG, which stands in for a full disk (root is not exempt).
  std::optional<uint64_t> file_size_limit;
  // RLIMIT_AS for the child, in bytes: its allocations past it fail, as
  // under a container's or a job scheduler's memory limit. It is set by a
  // shell that then runs the binary, so this process's limit never changes.
  std::optional<uint64_t> address_space_limit;
};

// Runs HEADROOM_BINARY with `args` (no shell involved).
CommandResult RunHeadroom(const std::vector<std::string>& args, const RunOptions& options = {});

// Writes `contents` to a fresh file under the test's temporary directory.
std::string WriteTempFile(const std::string& name, const std::string& contents);

}  // namespace headroom::testing

#endif  // HEADROOM_TESTS_CLI_RUN_COMMAND_H_
