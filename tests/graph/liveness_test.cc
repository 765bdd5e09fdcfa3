// Liveness on hand-built graphs: views, in-place ops, roles, largest tensors.
#include "graph/liveness.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

// A chain of u8 tensors so that elements are bytes.
TEST(Liveness, ChainPeakRolesAndLargestTensors) {
  Graph g("chain");
  TensorId in = g.AddTensor({.name = "in", .shape = {100}, .dtype = DType::kU8, .role = TensorRole::kInput});
  TensorId w = g.AddTensor({.name = "w", .shape = {7000}, .dtype = DType::kU8, .role = TensorRole::kParameter});
  TensorId t0 = g.AddTensor({.name = "t0", .shape = {1000}, .dtype = DType::kU8});
  TensorId t1 = g.AddTensor({.name = "t1", .shape = {2000}, .dtype = DType::kU8});
  TensorId ws = g.AddTensor({.name = "ws", .shape = {300}, .dtype = DType::kU8, .role = TensorRole::kTemporary});
  TensorId t2 = g.AddTensor({.name = "t2", .shape = {500}, .dtype = DType::kU8});
  g.AddOp({.kind = "a", .name = "op0", .inputs = {in, w}, .outputs = {t0}});
  g.AddOp({.kind = "b", .name = "op1", .inputs = {t0}, .outputs = {t1, ws}});
  g.AddOp({.kind = "c", .name = "op2", .inputs = {t1}, .outputs = {t2}});
  ASSERT_TRUE(g.Validate().ok());
  // op0: in + t0 = 1100; op1: in + t0 + t1 + ws = 3400; op2: in + t1 + t2 = 2600.
  MemoryProfile p = ProfileMemory(g);
  EXPECT_EQ(p.live_bytes, (std::vector<uint64_t>{1100, 3400, 2600}));
  EXPECT_EQ(p.peak_bytes, 3400u);
  EXPECT_EQ(p.peak_op, 1);
  EXPECT_EQ(p.bytes_by_role_at_peak.at(TensorRole::kTemporary), 300u);
  EXPECT_EQ(p.bytes_by_role_at_peak.at(TensorRole::kActivation), 3000u);
  EXPECT_EQ(p.bytes_by_role_at_peak.count(TensorRole::kParameter), 0u);
  EXPECT_EQ(p.live_at_peak, (std::vector<TensorId>{t1, t0, ws, in}));
  // Parameters count when asked, for the whole step.
  p = ProfileMemory(g, {.counted_roles = {TensorRole::kParameter, TensorRole::kActivation},
                        .max_live_at_peak = 1});
  EXPECT_EQ(p.live_bytes, (std::vector<uint64_t>{8000, 10000, 9500}));
  EXPECT_EQ(p.live_at_peak, (std::vector<TensorId>{w}));
  const std::vector<TensorLifetime> life = ComputeLifetimes(g);
  EXPECT_EQ(life[t0].first, 0);
  EXPECT_EQ(life[t0].last, 1);
  EXPECT_EQ(life[ws].first, 1);
  EXPECT_EQ(life[ws].last, 1);
  EXPECT_GT(life[w].first, life[w].last);  // parameters are not counted by default
}

TEST(Liveness, ViewsAndInPlaceOpsExtendTheirBase) {
  Graph g("views");
  TensorId in = g.AddTensor({.name = "in", .shape = {10}, .dtype = DType::kU8, .role = TensorRole::kInput});
  TensorId a = g.AddTensor({.name = "a", .shape = {1000}, .dtype = DType::kU8});
  TensorId v = g.AddTensor({.name = "a.view", .shape = {10, 100}, .dtype = DType::kU8, .view_of = a});
  TensorId r = g.AddTensor({.name = "a.relu_", .shape = {1000}, .dtype = DType::kU8, .view_of = a});
  TensorId b = g.AddTensor({.name = "b", .shape = {50}, .dtype = DType::kU8});
  TensorId c = g.AddTensor({.name = "c", .shape = {20}, .dtype = DType::kU8});
  g.AddOp({.kind = "make", .name = "op0", .inputs = {in}, .outputs = {a}});
  g.AddOp({.kind = "view", .name = "op1", .inputs = {a}, .outputs = {v}});
  g.AddOp({.kind = "other", .name = "op2", .inputs = {in}, .outputs = {b}});
  g.AddOp({.kind = "relu", .name = "op3", .inputs = {v}, .outputs = {r}, .inplace = true});
  g.AddOp({.kind = "sum", .name = "op4", .inputs = {r, b}, .outputs = {c}});
  ASSERT_TRUE(g.Validate().ok()) << g.Validate();
  // a lives [0, 4] through its views; views add nothing.
  const MemoryProfile p = ProfileMemory(g);
  EXPECT_EQ(p.live_bytes, (std::vector<uint64_t>{1010, 1010, 1060, 1060, 1080}));
  EXPECT_EQ(p.peak_op, 4);
}

TEST(Liveness, EmptyGraph) {
  const MemoryProfile p = ProfileMemory(Graph("empty"));
  EXPECT_EQ(p.peak_bytes, 0u);
  EXPECT_EQ(p.peak_op, kNone);
}

}  // namespace
}  // namespace headroom
