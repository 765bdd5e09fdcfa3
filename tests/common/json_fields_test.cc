#include "common/json_fields.h"

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

TEST(JsonFields, MissingFileIsNamed) {
  absl::StatusOr<std::string> text = ReadTextFile("/nonexistent/dir/file.json");
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(text.status().message(), HasSubstr("/nonexistent/dir/file.json"));
}

}  // namespace
}  // namespace headroom
