#include "graph/graph.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

TEST(DType, BytesAndNames) {
  EXPECT_EQ(DTypeBytes(DType::kBF16, 10), 20u);
  EXPECT_EQ(DTypeBytes(DType::kNF4, 3), 2u);
  EXPECT_EQ(DTypeBytes(DType::kF32, 0), 0u);
  EXPECT_EQ(*ParseDType("torch.bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("half"), DType::kF16);
  EXPECT_EQ(*ParseDType("F32"), DType::kF32);
  EXPECT_THAT(ParseDType("float128").status().message(), HasSubstr("unknown dtype 'float128'"));
}

TEST(Graph, BuildsAndValidates) {
  Graph g("mlp");
  TensorId x = g.AddTensor({.name = "x", .shape = {8, 1024}, .dtype = DType::kBF16, .role = TensorRole::kInput});
  TensorId w = g.AddTensor({.name = "fc.weight", .shape = {4096, 1024}, .dtype = DType::kBF16,
                            .role = TensorRole::kParameter});
  TensorId y = g.AddTensor({.name = "fc.out", .shape = {8, 4096}, .dtype = DType::kBF16});
  OpId fc = g.AddOp({.kind = "linear", .name = "fc", .inputs = {x, w}, .outputs = {y}, .saved = {x}});
  EXPECT_TRUE(g.Validate().ok()) << g.Validate();
  EXPECT_EQ(g.producer(y), fc);
  EXPECT_EQ(g.producer(w), kNone);
  EXPECT_EQ(g.ParameterCount(), 4096u * 1024);
  EXPECT_EQ(g.tensor(y).bytes(), 8u * 4096 * 2);
}

TEST(Graph, RejectsUseBeforeDefinitionAndForeignSaves) {
  Graph g("bad");
  TensorId a = g.AddTensor({.name = "a", .shape = {4}});
  TensorId b = g.AddTensor({.name = "b", .shape = {4}});
  g.AddOp({.kind = "relu", .name = "r", .inputs = {a}, .outputs = {b}});
  EXPECT_THAT(g.Validate().message(), HasSubstr("op 'r' reads 'a' before any op produces it"));

  Graph h("bad2");
  TensorId x = h.AddTensor({.name = "x", .shape = {4}, .role = TensorRole::kInput});
  TensorId y = h.AddTensor({.name = "y", .shape = {4}});
  TensorId z = h.AddTensor({.name = "z", .shape = {4}});
  h.AddOp({.kind = "relu", .name = "r", .inputs = {x}, .outputs = {y}, .saved = {z}});
  EXPECT_THAT(h.Validate().message(), HasSubstr("saves tensor 2, which is neither"));
}

TEST(Graph, ViewsAllocateNothing) {
  Graph g("v");
  TensorId x = g.AddTensor({.name = "x", .shape = {4, 4}, .role = TensorRole::kInput});
  TensorId v = g.AddTensor({.name = "x.t", .shape = {4, 4}, .view_of = x});
  EXPECT_EQ(g.tensor(v).bytes(), 0u);
  EXPECT_TRUE(g.Validate().ok());
}

}  // namespace
}  // namespace headroom

namespace headroom {
namespace {

// Note [Size bounds]: a shape whose element count wraps 64 bits saturates
// and is reported by name, never seen as small.
TEST(GraphBounds, OversizedTensorIsNamedNotWrapped) {
  Graph g("g");
  g.AddTensor({.name = "x", .shape = {int64_t{1} << 40, int64_t{1} << 30}, .dtype = DType::kBF16,
               .role = TensorRole::kInput});
  EXPECT_EQ(g.tensor(0).elements(), UINT64_MAX);
  EXPECT_EQ(g.tensor(0).bytes(), UINT64_MAX);
  const absl::Status status = g.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(status.message().find("tensor 'x'"), std::string::npos) << status;

  Graph ok("ok");
  ok.AddTensor({.name = "y", .shape = {int64_t{1} << 39}, .dtype = DType::kBF16, .role = TensorRole::kInput});
  EXPECT_TRUE(ok.Validate().ok());
  ok.AddTensor({.name = "z", .shape = {(int64_t{1} << 39) + 1}, .dtype = DType::kBF16, .role = TensorRole::kInput});
  EXPECT_EQ(ok.Validate().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace headroom
