#include "common/json_document.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

TEST(ParseJsonDocument, SyntaxErrorsGiveTheByteOffset) {
  absl::StatusOr<json> parsed = ParseJsonDocument("{\"a\": [1, 2,, 3]}", "broken.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("broken.json: not valid JSON at byte 13"));
  EXPECT_TRUE(ParseJsonDocument("[]", "x").ok());
}

// Found by fuzz_hf_config: nlohmann reports a number beyond double's range
// as out_of_range, not parse_error.
TEST(ParseJsonDocument, NumberOverflowIsAnErrorNotAnException) {
  absl::StatusOr<json> parsed = ParseJsonDocument("{\"rope_theta\": 1e88888}", "config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("config.json: not valid JSON"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("number overflow"));
}

// Note [Integers as written]: an integer literal beyond 64 bits is refused
// as written, with its path, not read as the double it would become.
TEST(ParseJsonDocument, IntegersBeyond64BitsAreRefusedAsWritten) {
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

// Note [JSON nesting bound]: a document nested beyond kMaxJsonDepth is
// refused as the parse reaches that level, with the byte where it does.
TEST(ParseJsonDocument, NestingBeyondTheBoundIsRefused) {
  const std::string deepest = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  absl::StatusOr<json> ok = ParseJsonDocument(deepest, "ok.json");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->dump(), deepest);

  const std::string too_deep = "{\"a\": \"[[[\", \"b\": " + deepest + "}";
  absl::StatusOr<json> refused = ParseJsonDocument(too_deep, "deep.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  // The brackets in the string "[[[" are not levels: the object is level 1,
  // and the 128th '[' after its 18 bytes {"a": "[[[", "b":  opens level 129.
  EXPECT_EQ(std::string(refused.status().message()),
            "deep.json: arrays and objects nested 129 deep at byte 146, more than the 128 levels an input may have");
}

// 100,000 '[' (and a 50 MB file of them, which took 3 GB before) stop at
// level 129: nothing past it is read or built.
TEST(ParseJsonDocument, AHundredThousandBracketsAreRefusedAtOnce) {
  const std::string brackets(100'000, '[');
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<json> refused = ParseJsonDocument(brackets, "brackets.json");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("brackets.json: arrays and objects nested 129 deep at byte 129"));
  EXPECT_LT(elapsed, std::chrono::seconds(1));
  // Objects count as levels too.
  std::string objects;
  for (int i = 0; i < 100'000; ++i) objects += "{\"k\":";
  EXPECT_THAT(ParseJsonDocument(objects, "objects.json").status().message(),
              HasSubstr("objects.json: arrays and objects nested 129 deep at byte 641,"));
}

// The document built from the parser's events is the one nlohmann's own
// parser builds: repeated keys keep the last value, numbers keep their type.
TEST(ParseJsonDocument, BuildsTheSameDocumentAsNlohmann) {
  const std::string text =
      R"({"b": [1, -2, 3.5, "s", null, true, {"x": [], "y": {}}], "a": {"k": 1, "k": [2]}, "u": 18446744073709551615,
          "e": "\u00e9\n", "nested": [[[{"z": [false]}]]]})";
  absl::StatusOr<json> ours = ParseJsonDocument(text, "same.json");
  ASSERT_TRUE(ours.ok()) << ours.status();
  const json theirs = json::parse(text);
  EXPECT_EQ(*ours, theirs);
  EXPECT_EQ(ours->dump(), theirs.dump());
  EXPECT_TRUE((*ours)["u"].is_number_unsigned());
  EXPECT_TRUE((*ours)["b"][1].is_number_integer());
  EXPECT_EQ((*ours)["a"]["k"], json::array({2}));
  for (const std::string scalar : {"0", "-1", "2.5", "\"s\"", "null", "false"}) {
    EXPECT_EQ(*ParseJsonDocument(scalar, "scalar.json"), json::parse(scalar)) << scalar;
  }
}

// Running out of memory while parsing is an error naming the document, and
// what was built is freed without allocating (Note [Freeing a document
// without memory]): checked in a child process whose address space is
// capped 256 MiB above what it uses, parsing 24 MB of `[{},...]`, which
// takes about 650 MB. Sanitizer builds report running out their own way.
#include "common/sanitizer_build.h"
#ifndef HEADROOM_SANITIZER_NEW
// In the child: 0 when the parse failed as it should, the error on stderr.
int ParseUnderAMemoryCap() {
  std::string objects = "[{}";
  for (int i = 0; i < 8'000'000; ++i) objects += ",{}";
  objects += "]";
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  rlimit limit{};
  limit.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (rlim_t{256} << 20);
  limit.rlim_max = RLIM_INFINITY;
  if (::setrlimit(RLIMIT_AS, &limit) != 0) return 2;
  const absl::StatusOr<json> parsed = ParseJsonDocument(objects, "flat.json");
  std::cerr << parsed.status().message() << "\n";
  return parsed.status().code() == absl::StatusCode::kResourceExhausted ? 0 : 1;
}

TEST(ParseJsonDocument, RunningOutOfMemoryIsAnErrorNamingTheDocument) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(ParseUnderAMemoryCap()), ::testing::ExitedWithCode(0),
              "flat.json: out of memory parsing its 22.89 MiB of JSON \\(24000004 bytes\\)");
}
#endif

}  // namespace
}  // namespace headroom
