// Validation fixtures: the harness's real files parse; each malformed field
// is an error naming the file and the field; folders list their fixtures.
#include "report/validation_fixture.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/json_fields.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace headroom {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kTestData = HEADROOM_REPORT_TESTDATA;

nlohmann::json RealFixture() {
  absl::StatusOr<std::string> text = ReadTextFile(kTestData + "/llama-mha-fp32-adamw-loop.json", kFixtureFile);
  EXPECT_TRUE(text.ok()) << text.status();
  return nlohmann::json::parse(*text);
}

// The error of parsing `doc` as "fixtures/x.json".
std::string ErrorOf(const nlohmann::json& doc) {
  absl::StatusOr<ValidationFixture> fixture = ParseValidationFixture(doc.dump(), "fixtures/x.json");
  if (fixture.ok()) return "(parsed)";
  EXPECT_EQ(fixture.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(fixture.status().message());
}

TEST(ValidationFixture, ReadsTheHarnessFiles) {
  const std::string path = kTestData + "/llama-mha-fp32-adamw-loop.json";
  absl::StatusOr<ValidationFixture> f = LoadValidationFixture(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->path, path);
  EXPECT_EQ(f->name, "llama-mha-fp32-adamw-loop");
  EXPECT_EQ(f->description, "Llama (MHA), fp32, AdamW for-loop");
  EXPECT_EQ(f->device, "cpu");
  EXPECT_FALSE(f->on_cuda());
  ASSERT_TRUE(f->model.config.has_value());
  EXPECT_EQ(f->model.config->architecture, "LlamaForCausalLM");
  EXPECT_EQ(f->model.config->num_layers, 4);
  EXPECT_EQ(f->model.name, path + ": model");
  EXPECT_THAT(f->estimate_args, ElementsAre("--micro-batch", "2", "--seq", "256", "--precision", "fp32",
                                            "--optimizer", "adamw", "--optimizer-impl", "for-loop", "--checkpoint",
                                            "none", "--attention", "eager"));
  EXPECT_EQ(f->measured.baseline_bytes, 88313756u);
  EXPECT_EQ(f->measured.peak_allocated_bytes, 221894596u);
  EXPECT_EQ(f->measured.end_of_forward_bytes, 188475316u);
  EXPECT_EQ(f->measured.saved_for_backward_bytes, 112823316u);
  EXPECT_EQ(f->measured.repeat_peak_allocated_bytes, 221894596u);
  EXPECT_EQ(f->measured.ops, 1569u);
  EXPECT_EQ(f->measured.peak_op, "_log_softmax_backward_data");
  EXPECT_EQ(f->measured.peak_phase, "backward");
  EXPECT_FALSE(f->measured.peak_reserved_bytes.has_value());
  EXPECT_TRUE(f->peers.empty());

  absl::StatusOr<ValidationFixture> gqa = LoadValidationFixture(kTestData + "/llama-gqa-fp32-adamw-foreach.json");
  ASSERT_TRUE(gqa.ok()) << gqa.status();
  EXPECT_LT(gqa->model.config->num_kv_heads, gqa->model.config->num_heads);
}

TEST(ValidationFixture, CudaFiguresPeersAndCnnModels) {
  nlohmann::json doc = RealFixture();
  doc["device"] = "NVIDIA H100 80GB HBM3";
  doc["measured"]["peak_reserved_bytes"] = 260046848;
  doc["measured"]["driver_used_bytes"] = 900000000;
  doc["measured"]["driver_used_before_bytes"] = 500000000;
  doc["peers"] = {{"zeus", {{"bytes", 2}, {"what", "model states"}}}, {"accelerate", {{"bytes", 1}}}};
  doc["model"] = {{"architectures", {"resnet50"}}, {"image_size", 64}, {"num_classes", 100}};
  absl::StatusOr<ValidationFixture> f = ParseValidationFixture(doc.dump(), "x.json");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->on_cuda());
  EXPECT_EQ(f->measured.peak_reserved_bytes, 260046848u);
  EXPECT_EQ(f->measured.driver_used_bytes, 900000000u);
  EXPECT_EQ(f->measured.driver_used_before_bytes, 500000000u);
  ASSERT_EQ(f->peers.size(), 2u);
  EXPECT_EQ(f->peers[0].tool, "accelerate");  // sorted by tool
  EXPECT_EQ(f->peers[0].bytes, 1u);
  EXPECT_EQ(f->peers[0].what, "");
  EXPECT_EQ(f->peers[1].tool, "zeus");
  EXPECT_EQ(f->peers[1].what, "model states");
  EXPECT_EQ(f->model.config->family, ModelFamily::kCnn);
  EXPECT_EQ(f->model.config->image_size, 64);
  EXPECT_EQ(f->model.config->num_classes, 100);
}

// The harness leaves out (or writes null for) what it could not attribute:
// the op count and the peak's op under PyTorch 1.13's full checkpointing.
TEST(ValidationFixture, FiguresTheHarnessMayNotHaveAreOptional) {
  nlohmann::json doc = RealFixture();
  doc["measured"].erase("ops");
  doc["measured"].erase("peak_op");
  doc["measured"].erase("peak_phase");
  doc["measured"]["end_of_forward_bytes"] = nullptr;
  doc.erase("versions");
  doc.erase("setup");
  doc.erase("trace");
  doc.erase("notes");
  absl::StatusOr<ValidationFixture> f = ParseValidationFixture(doc.dump(), "x.json");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->measured.ops.has_value());
  EXPECT_FALSE(f->measured.end_of_forward_bytes.has_value());
  EXPECT_EQ(f->measured.peak_op, "");
  EXPECT_EQ(f->measured.peak_phase, "");
}

TEST(ValidationFixture, MissingFieldsAreNamed) {
  for (const char* field : {"headroom_fixture_version", "name", "description", "device", "model", "estimate_args",
                            "measured"}) {
    nlohmann::json doc = RealFixture();
    doc.erase(field);
    EXPECT_EQ(ErrorOf(doc), absl::StrCat("fixtures/x.json: ", field, ": required field is missing"));
  }
  for (const char* field :
       {"baseline_bytes", "peak_allocated_bytes", "saved_for_backward_bytes", "repeat_peak_allocated_bytes"}) {
    nlohmann::json doc = RealFixture();
    doc["measured"].erase(field);
    EXPECT_EQ(ErrorOf(doc), absl::StrCat("fixtures/x.json: measured.", field, ": required field is missing"));
  }
}

TEST(ValidationFixture, WrongVersionsAndValuesAreNamed) {
  nlohmann::json doc = RealFixture();
  doc["headroom_fixture_version"] = 2;
  EXPECT_EQ(ErrorOf(doc),
            "fixtures/x.json: headroom_fixture_version: version 2 is not supported (this headroom reads version 1)");
  doc = RealFixture();
  doc["headroom_fixture_version"] = "1";
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: headroom_fixture_version: expected an integer, got string");
  doc = RealFixture();
  doc["measured"]["peak_allocated_bytes"] = 0;
  EXPECT_EQ(ErrorOf(doc),
            "fixtures/x.json: measured.peak_allocated_bytes: must be positive (errors are relative to it)");
  doc = RealFixture();
  doc["measured"]["peak_allocated_bytes"] = -5;
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: measured.peak_allocated_bytes: expected a non-negative integer, got -5");
  doc = RealFixture();
  doc["measured"]["peak_phase"] = "warmup";
  EXPECT_THAT(ErrorOf(doc), HasSubstr("fixtures/x.json: measured.peak_phase: "));
  EXPECT_THAT(ErrorOf(doc), HasSubstr("warmup"));
  doc = RealFixture();
  doc["measured"]["peak_reserved_bytes"] = "lots";
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: measured.peak_reserved_bytes: expected a non-negative integer, got string");
  doc = RealFixture();
  doc["measured"] = 3;
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: measured: expected an object, got number");
  doc = RealFixture();
  doc["name"] = "";
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: name: must not be empty");
  EXPECT_EQ(ErrorOf(nlohmann::json::array()), "fixtures/x.json: expected a JSON object, got array");
  EXPECT_THAT(ParseValidationFixture("{\"name\": ", "fixtures/x.json").status().message(),
              HasSubstr("fixtures/x.json: not valid JSON"));
}

TEST(ValidationFixture, EstimateArgsArePlainStrings) {
  nlohmann::json doc = RealFixture();
  doc["estimate_args"] = "--micro-batch 2";
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: estimate_args: expected an array of `headroom estimate` flags, got string");
  doc["estimate_args"] = {"--micro-batch", 2};
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: estimate_args[1]: expected a string, got number");
}

TEST(ValidationFixture, PeersAreChecked) {
  nlohmann::json doc = RealFixture();
  doc["peers"] = {{"accelerate", {{"what", "no bytes"}}}};
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: peers.accelerate.bytes: required field is missing");
  doc["peers"] = {{"accelerate", 5}};
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: peers.accelerate: expected an object, got number");
  doc["peers"] = {1, 2};
  EXPECT_THAT(ErrorOf(doc), HasSubstr("fixtures/x.json: peers: expected an object"));
}

// A step on several ranks: validation/record --distributed's file parses with
// every rank's figures; a malformed rank is named by its index.
TEST(ValidationFixture, RanksOfADistributedStep) {
  absl::StatusOr<ValidationFixture> real =
      LoadValidationFixture(std::string(HEADROOM_VALIDATION_FIXTURES) + "/distributed/gpt2-ddp-2.json");
  ASSERT_TRUE(real.ok()) << real.status();
  ASSERT_EQ(real->ranks.size(), 2u);
  EXPECT_EQ(real->ranks[0].peak_allocated_bytes, real->measured.peak_allocated_bytes);
  EXPECT_EQ(real->ranks[1].peak_phase, "backward");
  EXPECT_GT(real->ranks[1].saved_for_backward_bytes, 0u);

  nlohmann::json doc = RealFixture();
  nlohmann::json rank = {{"baseline_bytes", 10}, {"peak_allocated_bytes", 100}};
  doc["ranks"] = {rank, rank};
  absl::StatusOr<ValidationFixture> two = ParseValidationFixture(doc.dump(), "fixtures/x.json");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->ranks[1].peak_allocated_bytes, 100u);
  EXPECT_TRUE(two->ranks[1].peak_op.empty());
  doc["ranks"] = {rank};
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: ranks: 1 rank(s): a distributed step has two or more");
  doc["ranks"] = rank;
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: ranks: expected an array, got object");
  doc["ranks"] = {rank, {{"baseline_bytes", 10}, {"peak_allocated_bytes", 0}}};
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: ranks[1].peak_allocated_bytes: must be positive (errors are relative to it)");
  doc["ranks"] = {rank, {{"peak_allocated_bytes", 5}}};
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: ranks[1].baseline_bytes: required field is missing");
  doc["ranks"] = {rank, 7};
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: ranks[1]: expected an object, got number");
  nlohmann::json bad_phase = rank;
  bad_phase["peak_phase"] = "sideways";
  doc["ranks"] = {rank, bad_phase};
  EXPECT_THAT(ErrorOf(doc), HasSubstr("fixtures/x.json: ranks[1].peak_phase: "));
}

// Model errors come from the model parsers, named after the fixture's "model".
TEST(ValidationFixture, ModelErrorsNameTheFixture) {
  nlohmann::json doc = RealFixture();
  doc["model"].erase("hidden_size");
  EXPECT_EQ(ErrorOf(doc), "fixtures/x.json: model: hidden_size: required field is missing");
  doc["model"] = {{"architectures", {"AlexNet"}}};
  EXPECT_THAT(ErrorOf(doc), HasSubstr("fixtures/x.json: model: architectures[0]: unsupported architecture 'AlexNet'"));
  doc["model"] = {{"architectures", {"vgg16"}}, {"image_size", 8}};
  EXPECT_THAT(ErrorOf(doc), HasSubstr("fixtures/x.json: model: image_size: must be between 32"));
}

class FixtureFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "traces");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Touch(const std::string& name) { std::ofstream(dir_ / name) << "{}"; }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

TEST_F(FixtureFilesTest, AFolderListsItsJsonFilesSorted) {
  Touch("b.json");
  Touch("a.json");
  Touch("c.json");
  Touch("README.md");
  Touch("a.json.bak");
  Touch("traces/a.json");  // subfolders are not fixtures
  absl::StatusOr<std::vector<std::string>> files = FixtureFiles({dir_.string()});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(Path("a.json"), Path("b.json"), Path("c.json")));
  // Files are taken as given, in the order given, whatever their names.
  Touch("z.txt");
  files = FixtureFiles({Path("z.txt"), dir_.string()});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(Path("z.txt"), Path("a.json"), Path("b.json"), Path("c.json")));
}

TEST_F(FixtureFilesTest, MissingPathsAndEmptyFoldersAreErrors) {
  absl::StatusOr<std::vector<std::string>> files = FixtureFiles({Path("nope")});
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(files.status().message(), Path("nope") + ": no such fixture file or folder");
  Touch("notes.txt");
  files = FixtureFiles({dir_.string()});
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(files.status().message(), dir_.string() + ": the folder holds no *.json fixtures");
}

}  // namespace
}  // namespace headroom
