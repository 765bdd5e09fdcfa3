#include "common/units.h"

#include <string>

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

// README's own example `--budget 1.2MiB` is 1258291.2 bytes: a fraction of a
// unit rounds to the nearest byte; a fraction of a byte is still refused.
TEST(ParseBytes, RoundsAFractionOfAUnitToTheNearestByte) {
  EXPECT_EQ(*ParseBytes("1.2MiB"), 1258291u);
  EXPECT_EQ(*ParseBytes("0.0005K"), 1u);  // 0.512 bytes
  EXPECT_EQ(*ParseBytes("0.0004K"), 0u);  // 0.4096 bytes; callers that need a positive size say so
  EXPECT_EQ(*ParseBytes("1.1GB"), 1'100'000'000u);
  for (const char* bad : {"1.5", "1.5B", "0.5 b", "16777216.5TiB", "nan", "-1.2MiB", "inf GiB"}) {
    absl::StatusOr<uint64_t> parsed = ParseBytes(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr(absl::StrCat("'", bad, "'")));
  }
}

TEST(ParseBytes, RejectsGarbageNamingTheInput) {
  for (const char* bad : {"", "GiB", "-1", "12 parsecs", "0.3", "1.2.3", "99999999999999999999",
                          "20000000TiB", "1e400"}) {
    absl::StatusOr<uint64_t> parsed = ParseBytes(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr(absl::StrCat("'", bad, "'")));
  }
}

// Sizes come from flags and from fixture files' flags: the text is quoted,
// escaped and cut in the error (common/quote.h), not echoed as it was.
TEST(ParseBytes, QuotesWhatItEchoes) {
  const std::string escape = "12\x1b[2J\nGiB";
  EXPECT_EQ(ParseBytes(escape).status().message(),
            R"('12\x1b[2J\nGiB' has an unknown unit '\x1b[2j\ngib' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB))");
  const std::string long_text = "1" + std::string(1 << 20, 'x');
  const std::string message(ParseBytes(long_text).status().message());
  EXPECT_THAT(message, HasSubstr("...' (1048577 bytes) has an unknown unit"));
  EXPECT_LT(message.size(), 400u);
}

}  // namespace
}  // namespace headroom
