#include "tests/cli/run_command.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

extern char** environ;

namespace headroom::testing {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string WriteTempFile(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

CommandResult RunHeadroom(const std::vector<std::string>& args, const RunOptions& options) {
  static int counter = 0;
  const std::string base = ::testing::TempDir() + "/cmd" + std::to_string(getpid()) + "_" +
                           std::to_string(counter++);
  const std::string out_path = base + ".out", err_path = base + ".err";

  std::vector<std::string> argv_storage = {HEADROOM_BINARY};
  if (options.address_space_limit) {
    const std::string kib = std::to_string(*options.address_space_limit / 1024);
    argv_storage = {"/bin/sh", "-c", "ulimit -v " + kib + " && exec \"$0\" \"$@\"", HEADROOM_BINARY};
  }
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  CommandResult result;
  // posix_spawn has no resource limits of its own: the child inherits this
  // process's, and its ignored signals, which are restored right after.
  rlimit saved_limit{};
  getrlimit(RLIMIT_FSIZE, &saved_limit);
  struct sigaction saved_action {};
  if (options.file_size_limit) {
    rlimit limit = saved_limit;
    limit.rlim_cur = static_cast<rlim_t>(*options.file_size_limit);
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &ignore, &saved_action);
  }
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  if (options.file_size_limit) {
    setrlimit(RLIMIT_FSIZE, &saved_limit);
    sigaction(SIGXFSZ, &saved_action, nullptr);
  }
  if (spawned == 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  posix_spawn_file_actions_destroy(&actions);
  result.out = Slurp(out_path);
  result.err = Slurp(err_path);
  return result;
}

}  // namespace headroom::testing
