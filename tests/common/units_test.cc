#include "common/units.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

TEST(FormatBytes, UsesBinaryUnits) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.50 GiB");
  EXPECT_EQ(FormatBytes(80 * kGiB), "80.00 GiB");
  EXPECT_EQ(FormatBytes(2048 * kTiB), "2048.00 TiB");
  EXPECT_EQ(FormatSignedBytes(-512), "-512 B");
  EXPECT_EQ(FormatSignedBytes(static_cast<int64_t>(kGiB)), "+1.00 GiB");
  EXPECT_EQ(FormatSignedBytes(INT64_MIN), "-8388608.00 TiB");
}

TEST(ParseBytes, AcceptsUnitsAndPlainNumbers) {
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("80GiB"), 80 * kGiB);
  EXPECT_EQ(*ParseBytes(" 16 GB "), 16'000'000'000u);
  EXPECT_EQ(*ParseBytes("1.5GiB"), 3 * kGiB / 2);
  EXPECT_EQ(*ParseBytes("512mib"), 512 * kMiB);
  EXPECT_EQ(*ParseBytes("2K"), 2048u);
  EXPECT_EQ(*ParseBytes("1tb"), 1'000'000'000'000u);
}

TEST(ParseBytes, RejectsGarbageNamingTheInput) {
  for (const char* bad : {"", "GiB", "-1", "12 parsecs", "0.3", "1.2.3", "99999999999999999999",
                          "20000000TiB", "1e400"}) {
    absl::StatusOr<uint64_t> parsed = ParseBytes(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr(absl::StrCat("'", bad, "'")));
  }
}

}  // namespace
}  // namespace headroom
