#include "common/json_fields.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

TEST(JsonFields, ErrorsNameTheDocumentAndPath) {
  const json doc = json::parse(R"({"gpus": [{"memory_bytes": "lots", "sm": -3, "ok": 7}]})");
  const JsonPath item = JsonPath("cat.json") / "gpus" / 0;
  EXPECT_EQ(RequireUint(doc["gpus"][0], "memory_bytes", item).status().message(),
            "cat.json: gpus[0].memory_bytes: expected a non-negative integer, got string");
  EXPECT_THAT(RequireUint(doc["gpus"][0], "sm", item).status().message(),
              HasSubstr("gpus[0].sm: expected a non-negative integer, got -3"));
  EXPECT_THAT(RequireString(doc["gpus"][0], "name", item).status().message(),
              HasSubstr("gpus[0].name: required field is missing"));
  EXPECT_EQ(*RequireUint(doc["gpus"][0], "ok", item), 7u);
  EXPECT_THAT(RequireField(doc["gpus"], "x", JsonPath("cat.json") / "gpus").status().message(),
              HasSubstr("expected an object, got array"));
}

TEST(JsonFields, NumbersAreCheckedForRangeAndIntegrality) {
  const json doc = json::parse(R"({"a": 1e9, "b": 1.5, "c": -2, "d": 18446744073709551615, "e": true})");
  const JsonPath root("d");
  EXPECT_EQ(*RequireUint(doc, "a", root), 1'000'000'000u);
  EXPECT_FALSE(RequireUint(doc, "b", root).ok());
  EXPECT_EQ(*RequireInt(doc, "c", root), -2);
  EXPECT_FALSE(RequireInt(doc, "d", root).ok());
  EXPECT_EQ(*RequireUint(doc, "d", root), UINT64_MAX);
  EXPECT_DOUBLE_EQ(*RequireNumber(doc, "b", root), 1.5);
  EXPECT_TRUE(*RequireBool(doc, "e", root));
  EXPECT_FALSE(RequireNumber(doc, "e", root).ok());
}

TEST(JsonFields, SyntaxErrorsGiveTheByteOffset) {
  absl::StatusOr<json> parsed = ParseJsonDocument("{\"a\": [1, 2,, 3]}", "broken.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("broken.json: not valid JSON at byte 13"));
  EXPECT_TRUE(ParseJsonDocument("[]", "x").ok());
}

// Found by fuzz_hf_config: nlohmann reports a number beyond double's range
// as out_of_range, not parse_error.
TEST(JsonFields, NumberOverflowIsAnErrorNotAnException) {
  absl::StatusOr<json> parsed = ParseJsonDocument("{\"rope_theta\": 1e88888}", "config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("config.json: not valid JSON"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("number overflow"));
}

// Note [Integers as written]: an integer literal beyond 64 bits is refused
// as written, with its path, not read as the double it would become.
TEST(JsonFields, IntegersBeyond64BitsAreRefusedAsWritten) {
  const absl::StatusOr<json> big =
      ParseJsonDocument(R"({"steps": [{"x": 1}, {"end": 18446744073709551616}]})", "s.json");
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(big.status().message(),
              HasSubstr("s.json: steps[1].end: 18446744073709551616 is too large an integer (the range is "
                        "-9223372036854775808 to 18446744073709551615)"));
  const absl::StatusOr<json> negative = ParseJsonDocument("[1, [2], -9223372036854775809]", "n.json");
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.status().message(), HasSubstr("n.json: [2]: -9223372036854775809 is too large an integer"));
  // Within range, and floats of any size, parse as before.
  EXPECT_TRUE(ParseJsonDocument(R"({"a": 18446744073709551615, "b": -9223372036854775808, "c": 1e300,
                                    "d": 12345678901234567890123.5})",
                                "ok.json")
                  .ok());
}

// Keys come from the file: in a path they are escaped and cut like values.
TEST(JsonFields, KeysInPathsAreEscaped) {
  EXPECT_EQ((JsonPath("c.json") / "a\nb\x1b" / 2).ToString(), R"(c.json: a\nb\x1b[2])");
  EXPECT_EQ((JsonPath("c.json") / std::string(100, 'k')).ToString(),
            "c.json: " + std::string(80, 'k') + "... (100 bytes)");
}

TEST(JsonFields, MissingFileIsNamed) {
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
