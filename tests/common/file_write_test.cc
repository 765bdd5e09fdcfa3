#include "common/file_write.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(ReplaceFileContents, ReplacesAndKeepsTheMode) {
  const std::string path = FreshDir("replace_mode") + "/out.txt";
  ASSERT_TRUE(ReplaceFileContents(path, "first").ok());
  EXPECT_EQ(Slurp(path), "first");
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  ASSERT_TRUE(ReplaceFileContents(path, "second").ok());
  EXPECT_EQ(Slurp(path), "second");
  struct stat info {};
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0640u);
}

// The file a link names is replaced; the link stays a link.
TEST(ReplaceFileContents, FollowsASymbolicLink) {
  const std::string dir = FreshDir("replace_link");
  std::ofstream(dir + "/real.txt") << "old";
  std::filesystem::create_symlink("real.txt", dir + "/link.txt");
  ASSERT_TRUE(ReplaceFileContents(dir + "/link.txt", "new").ok());
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/link.txt"));
  EXPECT_EQ(Slurp(dir + "/real.txt"), "new");
}

TEST(ReplaceFileContents, WritesADeviceInPlace) {
  EXPECT_TRUE(ReplaceFileContents("/dev/null", "nothing").ok());
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
  const absl::Status full = ReplaceFileContents("/dev/full", "x");
  EXPECT_THAT(full.message(), HasSubstr("/dev/full: cannot write: No space left on device"));
}

TEST(ReplaceFileContents, NamesTheReason) {
  EXPECT_THAT(ReplaceFileContents("/no-such-headroom-dir/out.txt", "x").message(),
              HasSubstr("/no-such-headroom-dir/out.txt: cannot write: No such file or directory"));
  EXPECT_THAT(ReplaceFileContents(::testing::TempDir(), "x").message(), HasSubstr("is a directory"));
  EXPECT_FALSE(ReplaceFileContents("", "x").ok());
}

}  // namespace
}  // namespace headroom
