#include "common/json_document.h"

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

}  // namespace
}  // namespace headroom
