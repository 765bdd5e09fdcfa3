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

// Keys come from the file: in a path they are escaped and cut like values.
TEST(JsonFields, KeysInPathsAreEscaped) {
  EXPECT_EQ((JsonPath("c.json") / "a\nb\x1b" / 2).ToString(), R"(c.json: a\nb\x1b[2])");
  EXPECT_EQ((JsonPath("c.json") / std::string(100, 'k')).ToString(),
            "c.json: " + std::string(80, 'k') + "... (100 bytes)");
}

}  // namespace
}  // namespace headroom
