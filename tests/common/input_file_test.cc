#include "common/input_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

// A kind of input for these tests, bounded at 16 bytes.
constexpr InputFileKind kTestFile{.noun = "a test file", .max_bytes = 16};

TEST(ReadTextFile, AMissingFileIsNamed) {
  absl::StatusOr<std::string> text = ReadTextFile("/nonexistent/dir/file.json", kTestFile);
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
  absl::StatusOr<std::string> text = ReadTextFile(path, kTestFile);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "{\"a\": 1}\n");
}

TEST(ReadTextFile, ADirectoryIsNamedAsOne) {
  const std::string dir = TempDir("read_dir");
  absl::StatusOr<std::string> text = ReadTextFile(dir, kTestFile);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), dir + ": is a directory, not a file");
}

// Devices and FIFOs are refused before they are opened: /dev/zero would
// be read without end, and opening a FIFO with no writer blocks forever.
TEST(ReadTextFile, DevicesAndFifosAreRefusedUnopened) {
  absl::StatusOr<std::string> zero = ReadTextFile("/dev/zero", kTestFile);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("/dev/zero: is not a regular file"));
  const std::string fifo = TempDir("read_fifo") + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> piped = ReadTextFile(fifo, kTestFile);
  ASSERT_FALSE(piped.ok());
  EXPECT_THAT(piped.status().message(), HasSubstr(fifo + ": is not a regular file"));
}

// Note [Input bounds]: a file up to its kind's bound is read, one byte more
// is refused naming the file, the bound and the kind.
TEST(ReadTextFile, FilesBeyondTheirKindsBoundAreRefused) {
  const std::string dir = TempDir("read_bound");
  std::ofstream(dir + "/at.json") << std::string(16, ' ');
  EXPECT_TRUE(ReadTextFile(dir + "/at.json", kTestFile).ok());
  std::ofstream(dir + "/past.json") << std::string(17, ' ');
  absl::StatusOr<std::string> past = ReadTextFile(dir + "/past.json", kTestFile);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(past.status().message(), dir + "/past.json: 17 bytes is more than the 16 B a test file may have");
}

// The stated bounds, checked on sparse files (the size is there, the disk
// blocks are not), which are refused before any of them is read.
TEST(ReadTextFile, TheStatedBoundsAreRefusedUnread) {
  struct Case {
    uint64_t max_bytes;
    const char* bound;
  };
  for (const Case c : {Case{kMaxRecordingFileBytes, "1.00 GiB"}, Case{kMaxDocumentFileBytes, "256.00 MiB"},
                       Case{kMaxSmallFileBytes, "16.00 MiB"}}) {
    const std::string path = TempDir("read_large") + "/huge.json";
    std::ofstream(path).close();
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(c.max_bytes + 1)), 0);
    absl::StatusOr<std::string> text = ReadTextFile(path, {.noun = "an input", .max_bytes = c.max_bytes});
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(text.status().message(),
              absl::StrCat(path, ": ", c.max_bytes + 1, " bytes is more than the ", c.bound, " an input may have"));
  }
}

}  // namespace
}  // namespace headroom
