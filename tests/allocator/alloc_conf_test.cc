#include "allocator/alloc_conf.h"

#include "common/quote.h"
#include "common/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

std::string Error(std::string_view conf) {
  auto r = ParseAllocConf(conf);
  EXPECT_FALSE(r.ok()) << conf;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(AllocConf, EmptyIsPyTorchDefault) {
  auto o = ParseAllocConf("");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->max_split_size, kUnlimitedSplitSize);
  EXPECT_FALSE(o->expandable_segments);
  EXPECT_EQ(FormatAllocConf(*o), "");
}

TEST(AllocConf, PyTorchKeys) {
  auto o = ParseAllocConf(
      " max_split_size_mb:512, roundup_power2_divisions:4,garbage_collection_threshold:0.6,"
      "expandable_segments:True,backend:native");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_split_size, 512 * kMiB);
  EXPECT_EQ(o->rounding.power2_divisions, 4u);
  EXPECT_DOUBLE_EQ(o->garbage_collection_threshold, 0.6);
  EXPECT_TRUE(o->expandable_segments);
}

TEST(AllocConf, HeadroomKeys) {
  auto o = ParseAllocConf("memory_fraction:0.5,hard_limit_mb:1024,cross_stream_reuse:True,history_entries:100");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_DOUBLE_EQ(o->memory_fraction, 0.5);
  EXPECT_EQ(o->hard_limit_bytes, kGiB);
  EXPECT_TRUE(o->cross_stream_reuse);
  EXPECT_EQ(o->history_entries, 100u);
}

TEST(AllocConf, DivisionList) {
  auto o = ParseAllocConf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8],expandable_segments:False");
  ASSERT_TRUE(o.ok()) << o.status();
  const RoundingOptions& r = o->rounding;
  EXPECT_EQ(r.DivisionsFor(3 * kMiB), 1u);
  EXPECT_EQ(r.DivisionsFor(300 * kMiB), 1u);
  EXPECT_EQ(r.DivisionsFor(600 * kMiB), 2u);
  EXPECT_EQ(r.DivisionsFor(1500 * kMiB), 4u);
  EXPECT_EQ(r.DivisionsFor(5000 * kMiB), 8u);
  EXPECT_EQ(RoundSize(1500 * kMiB, r), 1536 * kMiB);  // [1, 2) GiB in 4 steps
  EXPECT_EQ(FormatAllocConf(*o), "roundup_power2_divisions:[1:1,512:2,1024:4,2048:8]");
  auto again = ParseAllocConf(FormatAllocConf(*o));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rounding.divisions_by_mib_interval, r.divisions_by_mib_interval);
}

TEST(AllocConf, RoundTrip) {
  const std::string conf =
      "max_split_size_mb:256,roundup_power2_divisions:8,garbage_collection_threshold:0.75,expandable_segments:True,"
      "memory_fraction:0.9,hard_limit_mb:2048,cross_stream_reuse:True,history_entries:10,expandable_page_mb:64,"
      "move_free_pages:True,move_threshold:1.25,move_threshold_max:1.5,unified_pool:True,reuse_layout_mb:8,"
      "align_growth:True,stitch_pages:True";
  auto o = ParseAllocConf(conf);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(FormatAllocConf(*o), conf);
}

// Fractions next to their defaults must not format as the default (and vanish from the string).
TEST(AllocConf, RoundTripKeepsEveryDigitOfAFraction) {
  for (const char* conf :
       {"memory_fraction:0.9999999999",
        "expandable_segments:True,move_free_pages:True,move_threshold:1.0000000001,move_threshold_max:1.0000000001",
        "garbage_collection_threshold:0.123456789"}) {
    auto o = ParseAllocConf(conf);
    ASSERT_TRUE(o.ok()) << o.status();
    auto again = ParseAllocConf(FormatAllocConf(*o));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->memory_fraction, o->memory_fraction) << conf;
    EXPECT_EQ(again->move_threshold, o->move_threshold) << conf;
    EXPECT_EQ(again->move_threshold_max, o->move_threshold_max) << conf;
    EXPECT_EQ(again->garbage_collection_threshold, o->garbage_collection_threshold) << conf;
  }
}

TEST(AllocConf, ErrorsNameKeyAndValue) {
  EXPECT_THAT(Error("max_split_size_mb:10"), HasSubstr("max_split_size_mb:10: expected more than 20"));
  EXPECT_THAT(Error("max_split_size_mb:abc"), HasSubstr("non-negative integer"));
  EXPECT_THAT(Error("expandable_segments:yes"), HasSubstr("True or False"));
  EXPECT_THAT(Error("garbage_collection_threshold:1.0"), HasSubstr("strictly between 0 and 1"));
  EXPECT_THAT(Error("roundup_power2_divisions:3"), HasSubstr("power of two"));
  EXPECT_THAT(Error("roundup_power2_divisions:[256:1,128:2]"), HasSubstr("increasing order"));
  EXPECT_THAT(Error("roundup_power2_divisions:[300:1]"), HasSubstr("power-of-two interval"));
  EXPECT_THAT(Error("roundup_power2_divisions:[256:1"), HasSubstr("unbalanced"));
  EXPECT_THAT(Error("backend:cudaMallocAsync"), HasSubstr("native"));
  EXPECT_THAT(Error("expandable_segment:True"), HasSubstr("unknown key 'expandable_segment'"));
  EXPECT_THAT(Error("pinned_use_cuda_host_register:True"), HasSubstr("does not have"));
  EXPECT_THAT(Error("expandable_segments"), HasSubstr("not key:value"));
  EXPECT_THAT(Error("memory_fraction:0"), HasSubstr("(0, 1]"));
  EXPECT_THAT(Error("expandable_segments:True,expandable_segments:False"), HasSubstr("given twice"));
  EXPECT_THAT(Error("move_threshold:0.9"), HasSubstr("move_threshold:0.9: expected a ratio"));
  EXPECT_THAT(Error("move_threshold:nan"), HasSubstr("move_threshold"));
  EXPECT_THAT(Error("move_threshold_max:101"), HasSubstr("move_threshold_max:101: expected a ratio"));
  EXPECT_THAT(Error("unified_pool:yes"), HasSubstr("True or False"));
  EXPECT_THAT(Error("reuse_layout_mb:2"), HasSubstr("reuse_layout_mb:2: expected more than 2 (MiB)"));
  EXPECT_THAT(Error("reuse_layout_mb:0"), HasSubstr("more than 2"));
  EXPECT_THAT(Error("reuse_layout_mb:-8"), HasSubstr("non-negative integer"));
  EXPECT_THAT(Error("align_growth:16"), HasSubstr("align_growth:16: expected True or False"));
  EXPECT_THAT(Error("stitch_pages:on"), HasSubstr("stitch_pages:on: expected True or False"));
}

// Keys and items come from HEADROOM_ALLOC_CONF, --alloc-conf and fixture
// files: errors quote them escaped and cut (common/quote.h).
TEST(AllocConf, ErrorsQuoteWhatTheyEcho) {
  for (const char* conf : {"\x1b[31mkey\n:1", "expandable_segments:True,\x1b[31mkey\n:1",
                           "max_split_size_mb:\x1b[31m\n", "\x1b[31m\n", "[\x1b[31m\n"}) {
    const std::string message(ParseAllocConf(conf).status().message());
    EXPECT_FALSE(message.empty()) << conf;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
    EXPECT_THAT(message, HasSubstr(R"(\x1b[31m)")) << message;
  }
  const std::string long_key = std::string(1 << 20, 'k') + ":1";
  const std::string message(ParseAllocConf(long_key).status().message());
  EXPECT_THAT(message, HasSubstr("unknown key '" + std::string(80, 'k') + "...' (1048576 bytes)"));
  EXPECT_LT(message.size(), 1000u);
  EXPECT_THAT(ParseAllocConf("max_split_size_mb:1\x07\x1b").status().message(),
              HasSubstr(R"(max_split_size_mb:1\x07\x1b: expected)"));
}

TEST(AllocConf, Presets) {
  EXPECT_EQ(ResolveAllocConfPreset("expandable"), "expandable_segments:True");
  EXPECT_EQ(ResolveAllocConfPreset("pytorch-default"), "");
  EXPECT_EQ(ResolveAllocConfPreset("headroom"),
            "expandable_segments:True,expandable_page_mb:2,unified_pool:True,cross_stream_reuse:True,"
            "move_free_pages:True,move_threshold:1.03,move_threshold_max:1.05,reuse_layout_mb:8,align_growth:True,"
            "stitch_pages:True");
  EXPECT_EQ(ResolveAllocConfPreset("max_split_size_mb:100"), "max_split_size_mb:100");
  for (const AllocConfPreset& preset : AllocConfPresets()) {
    EXPECT_TRUE(ParseAllocConf(preset.conf).ok()) << preset.name;
  }
}

// The one resolver every user-facing reader calls: a preset (alone or leading keys) or keys; its error quotes
// the input, gives the parser's reason and names the presets, for the caller to put its source in front.
TEST(AllocConf, ResolveAllocConfReadsPresetsAndNamesTheInput) {
  absl::StatusOr<AllocatorOptions> headroom = ResolveAllocConf("headroom,history_entries:4");
  ASSERT_TRUE(headroom.ok()) << headroom.status();
  EXPECT_EQ(FormatAllocConf(*headroom), FormatAllocConf(*ParseAllocConf(
                                            ResolveAllocConfPreset("headroom") + ",history_entries:4")));
  absl::StatusOr<AllocatorOptions> bad = ResolveAllocConf("best-fit");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "'best-fit': 'best-fit' is not key:value "
            "(or a preset: pytorch-default, expandable, max-split-512, power2-4, gc-0.8, headroom)");
  EXPECT_THAT(ResolveAllocConf("expandable_segments:True\n\x1b[2J").status().message(),
              HasSubstr("'expandable_segments:True\\n\\x1b[2J': "));
  EXPECT_THAT(ResolveAllocConf("headroom,unified_pool:False").status().message(),
              HasSubstr("'headroom,unified_pool:False': key 'unified_pool' given twice"));
}

}  // namespace
}  // namespace headroom
