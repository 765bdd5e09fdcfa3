// How a `headroom` subcommand plugs into the command-line front end.
//
// Each subcommand lives in its own file and exposes one function that declares
// its flags on a CLI11 subcommand and returns the code to run when that
// subcommand was chosen:
//
//   Subcommand AddGpusCommand(CLI::App& root);
//
// The runner writes its report to `out` and returns a Status; main() turns an
// error into one line on stderr and an exit code (ExitCodeFor).
#ifndef HEADROOM_CLI_COMMAND_H_
#define HEADROOM_CLI_COMMAND_H_

#include <functional>
#include <ostream>
#include <string>
#include <string_view>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace headroom::cli {

// Exit codes: 0 success, 1 the job ran and failed (e.g. an allocation trace
// replay hit an error it was told to treat as fatal), 2 the input was at fault
// (usage, flag values, files, names).
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct Subcommand {
  CLI::App* app;
  std::function<absl::Status(std::ostream& out)> run;
};

// 2 for errors caused by the user's input (InvalidArgument, NotFound,
// OutOfRange, FailedPrecondition), 1 otherwise.
int ExitCodeFor(const absl::Status& status);

Subcommand AddGpusCommand(CLI::App& root);
Subcommand AddEstimateCommand(CLI::App& root);
Subcommand AddReplayCommand(CLI::App& root);
Subcommand AddPlanCommand(CLI::App& root);
Subcommand AddValidateCommand(CLI::App& root);
Subcommand AddTrainDemoCommand(CLI::App& root);

}  // namespace headroom::cli

#endif  // HEADROOM_CLI_COMMAND_H_
