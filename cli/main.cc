// The `headroom` command: pre-flight GPU memory budgets, plans, allocator
// trace replay and the accuracy check against measured steps. Each
// subcommand is declared in its own *_command.cc.
#include <iostream>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"

namespace headroom::cli {

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return 0;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition: return kExitUsage;
    default: return kExitFailure;
  }
}

namespace {

int Main(int argc, char** argv) {
  CLI::App app{"Headroom: will this GPU job fit, and what is the cheapest way to make it fit?",
               "headroom"};
  app.set_version_flag("--version", std::string("headroom ") + HEADROOM_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);

  std::vector<Subcommand> commands = {AddGpusCommand(app), AddEstimateCommand(app), AddPlanCommand(app),
                                      AddReplayCommand(app), AddValidateCommand(app), AddTrainDemoCommand(app)};

  // CLI11 reports an unknown first word as an unexpected extra argument; name
  // it as what it is.
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const Subcommand& c : commands) names.push_back(c.app->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      std::cerr << "headroom: unknown subcommand '" << argv[1] << "' (expected one of: "
                << absl::StrJoin(names, ", ") << ")\n";
      return kExitUsage;
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "headroom: " << e.what() << "\n";
    return kExitUsage;
  }

  for (const Subcommand& command : commands) {
    if (!command.app->parsed()) continue;
    absl::Status status;
    try {
      status = command.run(std::cout);
    } catch (const std::bad_alloc&) {
      // The readers name the input that did not fit; this is anything else
      // (Note [Operator new that throws] in operator_new.cc).
      status = absl::ResourceExhaustedError("out of host memory");
    }
    if (!status.ok()) {
      std::cerr << "headroom " << command.app->get_name() << ": " << status.message() << "\n";
    }
    return ExitCodeFor(status);
  }
  return kExitUsage;  // unreachable: require_subcommand(1)
}

}  // namespace
}  // namespace headroom::cli

int main(int argc, char** argv) { return headroom::cli::Main(argc, argv); }
