// What the model tests share: presets and builds that report their error and
// fall back to an empty value, and lookups in a built graph.
#ifndef HEADROOM_TESTS_MODELS_MODEL_TEST_UTIL_H_
#define HEADROOM_TESTS_MODELS_MODEL_TEST_UTIL_H_

#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "models/builders.h"
#include "models/model_config.h"
#include "models/model_source.h"

namespace headroom::testing {

inline ModelConfig Preset(std::string_view name) {
  absl::StatusOr<ModelConfig> c = LoadPresetConfig(name);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

inline Graph Build(const ModelConfig& c, const BuildOptions& o = {.batch = 1, .seq_len = 8}) {
  absl::StatusOr<Graph> g = BuildModelGraph(c, o);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph{};
}

inline const Tensor* FindTensor(const Graph& g, std::string_view name) {
  for (const Tensor& t : g.tensors()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// The named tensor's shape; empty (and a failure) when there is none.
inline std::vector<int64_t> ShapeOf(const Graph& g, std::string_view name) {
  const Tensor* t = FindTensor(g, name);
  EXPECT_NE(t, nullptr) << name;
  return t != nullptr ? t->shape : std::vector<int64_t>{};
}

inline const Op* FindOp(const Graph& g, std::string_view name) {
  for (const Op& op : g.ops()) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

inline std::set<std::string> TensorNames(const Graph& g) {
  std::set<std::string> names;
  for (const Tensor& t : g.tensors()) names.insert(t.name);
  return names;
}

// Ops of `kind` whose name starts with `prefix`.
inline int CountOps(const Graph& g, std::string_view prefix, std::string_view kind) {
  int n = 0;
  for (const Op& op : g.ops()) n += op.name.starts_with(prefix) && op.kind == kind ? 1 : 0;
  return n;
}

}  // namespace headroom::testing

#endif  // HEADROOM_TESTS_MODELS_MODEL_TEST_UTIL_H_
