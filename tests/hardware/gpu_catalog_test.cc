#include "hardware/gpu_catalog.h"

#include <set>
#include <utility>

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
                           "H200-SXM-141GB", "B200", "GH200-96GB", "RTX-A5000", "RTX-A6000",
                           "RTX-6000-Ada", "RTX-PRO-6000-Blackwell", "RTX-4060", "RTX-4060-Ti-16GB",
                           "RTX-4070", "RTX-4080", "RTX-5090", "RTX-5080", "L20", "H20", "A10G", "A30",
                           "A40"}) {
    EXPECT_TRUE(catalog.Find(name).ok()) << name;
  }
  EXPECT_EQ(catalog.gpus().size(), 32u);
}

// The names nvidia-smi and torch.cuda.get_device_name() print for each card.
TEST(GpuCatalog, CardsResolveByTheirNvidiaSmiNames) {
  const GpuCatalog& catalog = GpuCatalog::Builtin();
  const std::pair<const char*, const char*> cases[] = {
      {"NVIDIA RTX A5000", "RTX-A5000"},
      {"NVIDIA RTX A6000", "RTX-A6000"},
      {"NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"},
      {"NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000-Blackwell"},
      {"NVIDIA GeForce RTX 4060", "RTX-4060"},
      {"NVIDIA GeForce RTX 4070", "RTX-4070"},
      {"NVIDIA GeForce RTX 4080", "RTX-4080"},
      {"NVIDIA GeForce RTX 5090", "RTX-5090"},
      {"NVIDIA GeForce RTX 5080", "RTX-5080"},
      {"NVIDIA GeForce RTX 4090", "RTX-4090"},
      {"NVIDIA GeForce RTX 3090", "RTX-3090"},
      {"NVIDIA L20", "L20"},
      {"NVIDIA H20", "H20"},
      {"NVIDIA A10G", "A10G"},
      {"NVIDIA A30", "A30"},
      {"NVIDIA A40", "A40"},
  };
  for (const auto& [smi_name, name] : cases) {
    absl::StatusOr<const GpuSpec*> gpu = catalog.Find(smi_name);
    ASSERT_TRUE(gpu.ok()) << smi_name << ": " << gpu.status();
    EXPECT_EQ((*gpu)->name, name) << smi_name;
  }
  // nvidia-smi names the 8 GB and 16 GB RTX 4060 Ti alike; the catalog has
  // only the 16 GB card, so the bare name must not claim 16 GB for both.
  absl::StatusOr<const GpuSpec*> ti = catalog.Find("NVIDIA GeForce RTX 4060 Ti");
  ASSERT_FALSE(ti.ok());
  EXPECT_THAT(ti.status().message(), HasSubstr("did you mean: RTX-4060-Ti-16GB"));
}

// Note [Runtime total memory] in hardware/gpu_catalog.h.
TEST(GpuCatalog, RuntimeTotalIsBelowTheMarketingSize) {
  for (const GpuSpec& gpu : GpuCatalog::Builtin().gpus()) {
    SCOPED_TRACE(gpu.name);
    EXPECT_GT(gpu.RuntimeTotalBytes(), 0u);
    EXPECT_LT(gpu.RuntimeTotalBytes(), gpu.memory_bytes);
    EXPECT_EQ(gpu.cuda_total_memory_bytes.has_value(), !gpu.cuda_total_memory_source.empty());
    if (gpu.cuda_total_memory_bytes) {
      EXPECT_EQ(gpu.RuntimeTotalBytes(), *gpu.cuda_total_memory_bytes);
      // The fallback stays below every observed figure, so it never promises
      // more room than a card has.
      EXPECT_LE(RuntimeTotalFallbackBytes(gpu.memory_bytes, gpu.memory_type), *gpu.cuda_total_memory_bytes);
    } else {
      EXPECT_EQ(gpu.RuntimeTotalBytes(), RuntimeTotalFallbackBytes(gpu.memory_bytes, gpu.memory_type));
    }
  }
}

TEST(GpuCatalog, RuntimeTotalSpotChecks) {
  const GpuCatalog& catalog = GpuCatalog::Builtin();
  // deviceQuery's exact bytes (bottlerocket-os/bottlerocket#3873).
  EXPECT_EQ((**catalog.Find("A100-SXM4-40GB")).RuntimeTotalBytes(), 42298834944u);
  // vLLM's "79.22 GiB", kept as whole MiB.
  EXPECT_EQ((**catalog.Find("h100")).RuntimeTotalBytes(), 81121ull << 20);
  // No observation for the V100 16 GB (HBM2): 98% of 16 GiB, in whole MiB.
  const GpuSpec& v100 = **catalog.Find("v100");
  EXPECT_FALSE(v100.cuda_total_memory_bytes.has_value());
  EXPECT_EQ(v100.RuntimeTotalBytes(), 16056ull << 20);
  // GDDR: 91.5%.
  EXPECT_EQ(RuntimeTotalFallbackBytes(24ull << 30, "GDDR6"), 22487ull << 20);
}

TEST(GpuCatalog, EveryEntryHasEveryField) {
  for (const GpuSpec& gpu : GpuCatalog::Builtin().gpus()) {
    SCOPED_TRACE(gpu.name);
    EXPECT_FALSE(gpu.aliases.empty());
    EXPECT_FALSE(gpu.architecture.empty());
    EXPECT_GE(gpu.compute_capability_major(), 7);
    EXPECT_GT(gpu.sm_count, 0);
    EXPECT_GE(gpu.memory_bytes, 8 * (uint64_t{1} << 30));  // RTX 4060
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
  ASSERT_EQ(again->gpus().size(), GpuCatalog::Builtin().gpus().size());
  for (size_t i = 0; i < again->gpus().size(); ++i) {
    EXPECT_EQ(GpuSpecToJson(again->gpus()[i]), GpuSpecToJson(GpuCatalog::Builtin().gpus()[i]));
  }
  // An entry without a runtime total writes none, rather than the fallback.
  EXPECT_FALSE(GpuSpecToJson(**GpuCatalog::Builtin().Find("v100")).contains("cuda_total_memory_bytes"));
  EXPECT_EQ(GpuSpecToJson(**GpuCatalog::Builtin().Find("t4"))["cuda_total_memory_bytes"], 15104ull << 20);
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

TEST(GpuCatalog, RuntimeTotalIsCheckedAgainstMemoryBytes) {
  auto with_total = [](auto mutate) {
    nlohmann::json doc = MinimalCatalog();
    doc["gpus"][0]["cuda_total_memory_bytes"] = 1000000000;
    doc["gpus"][0]["cuda_total_memory_source"] = "test log";
    mutate(doc);
    return ParseError(doc);
  };
  EXPECT_EQ(with_total([](auto&) {}), "OK");
  EXPECT_EQ(with_total([](auto& d) { d["gpus"][0]["cuda_total_memory_bytes"] = 1073741824; }), "OK");
  EXPECT_THAT(with_total([](auto& d) { d["gpus"][0]["cuda_total_memory_bytes"] = 0; }),
              HasSubstr("test.json: gpus[0].cuda_total_memory_bytes: must be positive"));
  EXPECT_THAT(with_total([](auto& d) { d["gpus"][0]["cuda_total_memory_bytes"] = 1073741825; }),
              HasSubstr("test.json: gpus[0].cuda_total_memory_bytes: 1073741825 exceeds memory_bytes (1073741824)"));
  EXPECT_THAT(with_total([](auto& d) { d["gpus"][0]["cuda_total_memory_bytes"] = "80GiB"; }),
              HasSubstr("gpus[0].cuda_total_memory_bytes: expected a non-negative integer"));
  EXPECT_THAT(with_total([](auto& d) { d["gpus"][0].erase("cuda_total_memory_source"); }),
              HasSubstr("gpus[0].cuda_total_memory_source: required field is missing"));
  EXPECT_THAT(with_total([](auto& d) { d["gpus"][0]["cuda_total_memory_source"] = ""; }),
              HasSubstr("gpus[0].cuda_total_memory_source: a runtime total names where it was observed"));
  EXPECT_THAT(with_total([](auto& d) { d["gpus"][0].erase("cuda_total_memory_bytes"); }),
              HasSubstr("gpus[0].cuda_total_memory_bytes: required with cuda_total_memory_source"));

  absl::StatusOr<GpuCatalog> catalog = GpuCatalog::Parse(MinimalCatalog().dump(), "test.json");
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  // Absent: the fallback, 98% of its 1 GiB of HBM in whole MiB.
  EXPECT_EQ(catalog->gpus()[0].RuntimeTotalBytes(), 1003ull << 20);
}

}  // namespace
}  // namespace headroom
