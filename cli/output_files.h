// The files a `headroom` subcommand writes (--out, --trace-out, --svg,
// --graph-out, --write-plan): declared with AddOutputOption, checked before
// any work with CheckOutputFiles, written with WriteTextFile.
//
//   AddOutputOption(*app, "--out", f->out, "Write the plan file here");
//   ...
//   HEADROOM_RETURN_IF_ERROR(CheckOutputFiles({{"--out", f.out}}, {{"--model", f.model}}));
//   HEADROOM_RETURN_IF_ERROR(WriteTextFile(f.out, text, "--out"));
//
// An output never overwrites the command's own input, nor another output of
// the same run, and a file that cannot be written keeps its old contents
// (Note [Output files replaced whole] in common/file_write.h).
#ifndef HEADROOM_CLI_OUTPUT_FILES_H_
#define HEADROOM_CLI_OUTPUT_FILES_H_

#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace headroom::cli {

// A flag and the path it was given; an empty path is a flag not given.
struct FileFlag {
  std::string_view flag;
  std::string path;
};

// Adds a string option naming a file to write; an empty value (`--out ''`),
// which would otherwise read as "not given" and write nothing, is refused.
CLI::Option* AddOutputOption(CLI::App& app, const std::string& flag, std::string& path,
                             const std::string& description);

// InvalidArgument when an output is the same file as an input (both exist and
// std::filesystem::equivalent says so) or as another output (the same path
// once made absolute and normalized); the message names both flags.
absl::Status CheckOutputFiles(const std::vector<FileFlag>& outputs, const std::vector<FileFlag>& inputs);

// Replaces `path`, the value of `flag`, with `text` (common/file_write.h);
// errors are InvalidArgument naming the flag, the path and the reason.
absl::Status WriteTextFile(const std::string& path, std::string_view text, std::string_view flag);

}  // namespace headroom::cli

#endif  // HEADROOM_CLI_OUTPUT_FILES_H_
