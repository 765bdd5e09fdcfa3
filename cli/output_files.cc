#include "cli/output_files.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_write.h"

namespace headroom::cli {
namespace {

bool SameExistingFile(const std::string& a, const std::string& b) {
  std::error_code error;
  return std::filesystem::equivalent(a, b, error) && !error;
}

// Outputs usually do not exist yet, so equivalent() cannot compare them.
bool SamePath(const std::string& a, const std::string& b) {
  std::error_code error_a, error_b;
  const std::filesystem::path canonical_a = std::filesystem::weakly_canonical(a, error_a);
  const std::filesystem::path canonical_b = std::filesystem::weakly_canonical(b, error_b);
  return !error_a && !error_b && canonical_a == canonical_b;
}

}  // namespace

CLI::Option* AddOutputOption(CLI::App& app, const std::string& flag, std::string& path,
                             const std::string& description) {
  return app.add_option(flag, path, description)
      ->check(CLI::Validator(
          [](std::string& value) { return value.empty() ? std::string("an empty path names no file") : ""; },
          "FILE"));
}

absl::Status CheckOutputFiles(const std::vector<FileFlag>& outputs, const std::vector<FileFlag>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const FileFlag& out = outputs[i];
    if (out.path.empty()) continue;
    for (const FileFlag& in : inputs) {
      if (!in.path.empty() && SameExistingFile(out.path, in.path)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s %s: is the %s file this command reads; writing it would overwrite its input", out.flag, out.path,
            in.flag));
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (!outputs[j].path.empty() && SamePath(out.path, outputs[j].path)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s %s: is also %s's file; give each output its own", out.flag, out.path,
                            outputs[j].flag));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteTextFile(const std::string& path, std::string_view text, std::string_view flag) {
  const absl::Status written = ReplaceFileContents(path, text);
  if (written.ok()) return written;
  return absl::Status(written.code(), absl::StrFormat("%s %s", flag, written.message()));
}

}  // namespace headroom::cli
