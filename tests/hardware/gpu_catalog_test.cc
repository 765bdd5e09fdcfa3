#include "hardware/gpu_catalog.h"

#include <set>

#include "common/json_fields.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(GpuCatalog, BuiltinHasEveryRequiredGpu) {
  const GpuCatalog& catalog = GpuCatalog::Builtin();
  for (const char* name : {"V100-SXM2-16GB", "V100-SXM2-32GB", "T4", "A10", "A100-PCIE-40GB",
                           "A100-SXM4-40GB", "A100-PCIE-80GB", "A100-SXM4-80GB", "L4", "L40S",
                           "RTX-3090", "RTX-4090", "H100-PCIE-80GB", "H100-SXM-80GB",
                           "H200-SXM-141GB", "B200", "GH200-96GB"}) {
    EXPECT_TRUE(catalog.Find(name).ok()) << name;
  }
  EXPECT_EQ(catalog.gpus().size(), 17u);
}

TEST(GpuCatalog, EveryEntryHasEveryField) {
  for (const GpuSpec& gpu : GpuCatalog::Builtin().gpus()) {
    SCOPED_TRACE(gpu.name);
    EXPECT_FALSE(gpu.aliases.empty());
    EXPECT_FALSE(gpu.architecture.empty());
    EXPECT_GE(gpu.compute_capability_major(), 7);
    EXPECT_GT(gpu.sm_count, 0);
    EXPECT_GE(gpu.memory_bytes, 16 * (uint64_t{1} << 30));
    EXPECT_FALSE(gpu.memory_type.empty());
    EXPECT_GT(gpu.memory_bandwidth_bytes_per_s, 2e11);
    EXPECT_TRUE(gpu.PeakFlops(MathMode::kFp32).has_value());
    EXPECT_TRUE(gpu.PeakFlops(MathMode::kFp64).has_value());
    // Every GPU in the catalog has 16-bit Tensor Cores that outrun its fp32 units.
    ASSERT_TRUE(gpu.PeakFlops(MathMode::kFp16).has_value());
    EXPECT_GT(*gpu.PeakFlops(MathMode::kFp16), *gpu.PeakFlops(MathMode::kFp32));
    EXPECT_GT(gpu.host_link.bandwidth_bytes_per_s, 1e10);
    EXPECT_TRUE(gpu.cublas_workspace_bytes == 4u << 20 || gpu.cublas_workspace_bytes == 32u << 20);
    EXPECT_EQ(gpu.cublas_workspace_bytes == 32u << 20, gpu.compute_capability_major() >= 9);
    EXPECT_THAT(gpu.source, HasSubstr("NVIDIA"));
  }
}

TEST(GpuCatalog, DataSheetFiguresSpotChecks) {
  const GpuCatalog& catalog = GpuCatalog::Builtin();
  const GpuSpec& h100 = **catalog.Find("H100-80GB");
  EXPECT_EQ(h100.name, "H100-SXM-80GB");
  EXPECT_EQ(h100.memory_bytes, 80ull << 30);
  EXPECT_DOUBLE_EQ(h100.memory_bandwidth_bytes_per_s, 3.35e12);
  EXPECT_DOUBLE_EQ(*h100.PeakFlops(MathMode::kBf16), 989.4e12);
  EXPECT_EQ(h100.sm_count, 132);
  EXPECT_EQ(h100.host_link.pcie_generation, 5);
  const GpuSpec& v100 = **catalog.Find("v100");
  EXPECT_FALSE(v100.PeakFlops(MathMode::kBf16).has_value());
  EXPECT_FALSE(v100.PeakFlops(MathMode::kTf32).has_value());
  EXPECT_EQ((**catalog.Find("gh200")).host_link.kind, "nvlink-c2c");
  EXPECT_EQ((**catalog.Find("a100")).name, "A100-SXM4-80GB");
}

TEST(GpuCatalog, AliasesResolveIgnoringCaseAndPunctuation) {
  const GpuCatalog& catalog = GpuCatalog::Builtin();
  for (const char* name : {"h100-sxm", "H100 SXM", "h100_sxm5", "NVIDIA H100-SXM-80GB", "h100"}) {
    absl::StatusOr<const GpuSpec*> gpu = catalog.Find(name);
    ASSERT_TRUE(gpu.ok()) << name;
    EXPECT_EQ((*gpu)->name, "H100-SXM-80GB") << name;
  }
  EXPECT_EQ((**catalog.Find("Tesla T4")).name, "T4");
  EXPECT_EQ((**catalog.Find("GeForce RTX 4090")).name, "RTX-4090");
}

TEST(GpuCatalog, AliasesAreUniqueAcrossEntries) {
  std::set<std::string> seen;
  for (const GpuSpec& gpu : GpuCatalog::Builtin().gpus()) {
    EXPECT_TRUE(seen.insert(NormalizeGpuName(gpu.name)).second) << gpu.name;
    for (const std::string& alias : gpu.aliases) {
      EXPECT_TRUE(seen.insert(NormalizeGpuName(alias)).second) << alias;
    }
  }
}

TEST(GpuCatalog, UnknownNameListsCloseMatches) {
  absl::StatusOr<const GpuSpec*> gpu = GpuCatalog::Builtin().Find("H100-80G");
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gpu.status().message(), HasSubstr("unknown GPU 'H100-80G'"));
  EXPECT_THAT(gpu.status().message(), HasSubstr("did you mean: H100-SXM-80GB"));
  EXPECT_THAT(GpuCatalog::Builtin().CloseMatches("a100-40"),
              ElementsAre("A100-PCIE-40GB", "A100-SXM4-40GB", "A100-SXM4-80GB"));
  absl::StatusOr<const GpuSpec*> nothing = GpuCatalog::Builtin().Find("quantum-zx81");
  ASSERT_FALSE(nothing.ok());
  EXPECT_THAT(nothing.status().message(), HasSubstr("headroom gpus"));
}

TEST(GpuCatalog, ShippedFileMatchesEmbeddedCopy) {
  absl::StatusOr<GpuCatalog> from_file = GpuCatalog::LoadFile(HEADROOM_SOURCE_DIR "/data/gpus.json");
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  ASSERT_EQ(from_file->gpus().size(), GpuCatalog::Builtin().gpus().size());
  for (size_t i = 0; i < from_file->gpus().size(); ++i) {
    EXPECT_EQ(GpuSpecToJson(from_file->gpus()[i]), GpuSpecToJson(GpuCatalog::Builtin().gpus()[i]));
  }
}

TEST(GpuCatalog, JsonRoundTrips) {
  nlohmann::json doc = {{"schema_version", 1}, {"gpus", nlohmann::json::array()}};
  for (const GpuSpec& gpu : GpuCatalog::Builtin().gpus()) doc["gpus"].push_back(GpuSpecToJson(gpu));
  absl::StatusOr<GpuCatalog> again = GpuCatalog::Parse(doc.dump(), "roundtrip");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(GpuSpecToJson(again->gpus()[5]), GpuSpecToJson(GpuCatalog::Builtin().gpus()[5]));
}

// A minimal valid catalog that each malformed case below breaks in one place.
nlohmann::json MinimalCatalog() {
  return nlohmann::json::parse(R"({
    "schema_version": 1,
    "gpus": [{
      "name": "X1", "aliases": ["x-one"], "architecture": "hopper", "compute_capability": "9.0",
      "sm_count": 10, "memory_bytes": 1073741824, "memory_type": "HBM3",
      "memory_bandwidth_bytes_per_s": 1e12, "peak_dense_flops": {"fp32": 1e13, "bf16": 1e14},
      "host_link": {"kind": "pcie", "pcie_generation": 5, "bandwidth_bytes_per_s": 6.3e10},
      "cublas_workspace_bytes": 33554432, "source": "test"
    }]})");
}

std::string ParseError(const nlohmann::json& doc) {
  absl::StatusOr<GpuCatalog> catalog = GpuCatalog::Parse(doc.dump(), "test.json");
  return catalog.ok() ? "OK" : std::string(catalog.status().message());
}

TEST(GpuCatalog, MalformedEntriesNameTheField) {
  EXPECT_EQ(ParseError(MinimalCatalog()), "OK");

  auto broken = [](auto mutate) {
    nlohmann::json doc = MinimalCatalog();
    mutate(doc);
    return ParseError(doc);
  };
  EXPECT_THAT(broken([](auto& d) { d["gpus"][0].erase("memory_bytes"); }),
              HasSubstr("test.json: gpus[0].memory_bytes: required field is missing"));
  EXPECT_THAT(broken([](auto& d) { d["gpus"][0]["memory_bytes"] = 0; }),
              HasSubstr("gpus[0].memory_bytes: must be positive"));
  EXPECT_THAT(broken([](auto& d) { d["gpus"][0]["peak_dense_flops"]["fp4"] = 1; }),
              HasSubstr("peak_dense_flops.fp4: unknown math mode 'fp4'"));
  EXPECT_THAT(broken([](auto& d) { d["gpus"][0]["peak_dense_flops"].erase("fp32"); }),
              HasSubstr("peak_dense_flops.fp32: required field is missing"));
  EXPECT_THAT(broken([](auto& d) { d["gpus"][0]["compute_capability"] = "nine"; }),
              HasSubstr("compute_capability: 'nine' is not MAJOR.MINOR"));
  EXPECT_THAT(broken([](auto& d) { d["gpus"][0]["host_link"]["kind"] = "carrier-pigeon"; }),
              HasSubstr("host_link.kind: unknown host link 'carrier-pigeon'"));
  EXPECT_THAT(broken([](auto& d) { d["gpus"][0]["aliases"] = "x"; }),
              HasSubstr("gpus[0].aliases: expected an array"));
  EXPECT_THAT(broken([](auto& d) { d["gpus"].push_back(d["gpus"][0]); }),
              HasSubstr("gpus[1]: name or alias 'X1' is already used by 'X1'"));
  EXPECT_THAT(broken([](auto& d) { d["schema_version"] = 2; }), HasSubstr("unsupported version 2"));
  EXPECT_THAT(broken([](auto& d) { d["gpus"] = nlohmann::json::array(); }),
              HasSubstr("gpus: expected a non-empty array"));
  EXPECT_THAT(ParseError(nlohmann::json::array()), HasSubstr("expected an object, got array"));
}

}  // namespace
}  // namespace headroom
