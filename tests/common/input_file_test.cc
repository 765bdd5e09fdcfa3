#include "common/input_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

TEST(ReadTextFile, AMissingFileIsNamed) {
  absl::StatusOr<std::string> text = ReadTextFile("/nonexistent/dir/file.json");
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(text.status().message(), HasSubstr("/nonexistent/dir/file.json"));
}

// A fresh directory under the test's temporary directory.
std::string TempDir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(ReadTextFile, ReadsARegularFileWhole) {
  const std::string path = TempDir("read_regular") + "/config.json";
  std::ofstream(path) << "{\"a\": 1}\n";
  absl::StatusOr<std::string> text = ReadTextFile(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "{\"a\": 1}\n");
}

TEST(ReadTextFile, ADirectoryIsNamedAsOne) {
  const std::string dir = TempDir("read_dir");
  absl::StatusOr<std::string> text = ReadTextFile(dir);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), dir + ": is a directory, not a file");
}

// Devices and FIFOs are refused before they are opened: /dev/zero would
// be read without end, and opening a FIFO with no writer blocks forever.
TEST(ReadTextFile, DevicesAndFifosAreRefusedUnopened) {
  absl::StatusOr<std::string> zero = ReadTextFile("/dev/zero");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("/dev/zero: is not a regular file"));
  const std::string fifo = TempDir("read_fifo") + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> piped = ReadTextFile(fifo);
  ASSERT_FALSE(piped.ok());
  EXPECT_THAT(piped.status().message(), HasSubstr(fifo + ": is not a regular file"));
}

TEST(ReadTextFile, FilesBeyondTheBoundAreRefused) {
  const std::string path = TempDir("read_large") + "/huge.csv";
  std::ofstream(path).close();
  // Sparse: the size is there, the disk blocks are not.
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(kMaxTextFileBytes + 1)), 0);
  absl::StatusOr<std::string> text = ReadTextFile(path);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr(path + ": 1073741825 bytes is more than the 1.00 GiB an input file may have"));
}

}  // namespace
}  // namespace headroom
