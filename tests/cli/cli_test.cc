// The `headroom` front end: help, version, the catalog command and the error
// paths every subcommand shares (one line on stderr, exit code 2).
#include <algorithm>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/run_command.h"

namespace headroom {
namespace {

using ::headroom::testing::RunHeadroom;
using ::headroom::testing::WriteTempFile;
using ::testing::HasSubstr;
using ::testing::StartsWith;

size_t Lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

TEST(Cli, HelpOnEveryLevel) {
  auto top = RunHeadroom({"--help"});
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_THAT(top.out, HasSubstr("gpus"));
  auto gpus = RunHeadroom({"gpus", "--help"});
  EXPECT_EQ(gpus.exit_code, 0);
  EXPECT_THAT(gpus.out, HasSubstr("--json"));
}

TEST(Cli, Version) {
  auto r = RunHeadroom({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, StartsWith("headroom 0."));
}

TEST(Cli, NoSubcommandIsAUsageError) {
  auto r = RunHeadroom({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("subcommand"));
}

TEST(Cli, UnknownSubcommandIsNamed) {
  auto r = RunHeadroom({"estimat"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown subcommand 'estimat'"));
  EXPECT_EQ(Lines(r.err), 1u);
  EXPECT_TRUE(r.out.empty());
}

TEST(Cli, UnknownFlagIsNamed) {
  auto r = RunHeadroom({"gpus", "--jsn"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--jsn"));
  EXPECT_EQ(Lines(r.err), 1u);
}

TEST(Cli, MissingValueIsNamed) {
  auto r = RunHeadroom({"gpus", "--catalog"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--catalog"));
  EXPECT_EQ(Lines(r.err), 1u);
}

TEST(Cli, GpusTableListsTheCatalog) {
  auto r = RunHeadroom({"gpus"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"H100-SXM-80GB", "A100-SXM4-80GB", "T4", "RTX-4090", "GH200-96GB"}) {
    EXPECT_THAT(r.out, HasSubstr(name));
  }
  EXPECT_THAT(r.out, HasSubstr("80.00 GiB"));
  EXPECT_THAT(r.out, HasSubstr("989.4"));  // H100 SXM bf16 TFLOP/s
}

TEST(Cli, GpusJsonIsTheCatalogSchema) {
  auto r = RunHeadroom({"gpus", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["gpus"].size(), 32u);
  auto one = nlohmann::json::parse(RunHeadroom({"gpus", "h100", "--json"}).out);
  EXPECT_EQ(one["name"], "H100-SXM-80GB");
  EXPECT_EQ(one["memory_bytes"], 85899345920ull);
}

TEST(Cli, GpusOneShowsAliasesAndSource) {
  auto r = RunHeadroom({"gpus", "H100-80GB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("h100-sxm"));
  EXPECT_THAT(r.out, HasSubstr("datasheet"));
  EXPECT_THAT(r.out, HasSubstr("32.00 MiB"));  // Hopper cuBLAS workspace
}

TEST(Cli, UnknownGpuSuggestsCloseNames) {
  auto r = RunHeadroom({"gpus", "a100-40"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown GPU 'a100-40'; did you mean: A100-PCIE-40GB"));
  EXPECT_EQ(Lines(r.err), 1u);
}

TEST(Cli, BadCatalogFileIsNamed) {
  const std::string path = WriteTempFile("bad_catalog.json", R"({"schema_version": 1, "gpus": [{}]})");
  auto r = RunHeadroom({"gpus", "--catalog", path});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(path + ": gpus[0].name: required field is missing"));
  auto missing = RunHeadroom({"gpus", "--catalog", "/no/such/catalog.json"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("/no/such/catalog.json: cannot open file"));
}

}  // namespace
}  // namespace headroom
