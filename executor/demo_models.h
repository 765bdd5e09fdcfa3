// The models the executor trains: an MLP classifier and a small GPT-style
// transformer (token and position embeddings, pre-norm blocks of causal
// multi-head attention and a GELU MLP, a final layer norm, an untied head,
// cross-entropy), each as a forward graph built with graph/ops.h, so the
// planner, `headroom plan` and the estimators see them like any other model,
// plus what the kernels need that a graph does not say (the attention's
// heads and mask) and a synthetic task whose loss training can drive down.
//
//   HEADROOM_ASSIGN_OR_RETURN(DemoModel gpt, BuildDemoGpt({.layers = 4}));
//   DemoBatch batch = gpt.MakeBatch(step);
//   WriteGraphJson(gpt.forward)   // for `headroom plan demo.json ...`
//
// Tasks (deterministic in the step index):
//  - MLP: points uniform in [-1, 1]^inputs, labelled by the argmax of a fixed
//    random linear map (a teacher).
//  - GPT: sequences that follow a fixed random successor table over the
//    vocabulary from a random first token; the labels are the next tokens,
//    so a model that learns the table reaches a loss near zero.
#ifndef HEADROOM_EXECUTOR_DEMO_MODELS_H_
#define HEADROOM_EXECUTOR_DEMO_MODELS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace headroom {

// What a kernel needs beyond the op's kind and shapes.
struct KernelAttributes {
  int64_t heads = 0;    // attention_scores, attention_context
  float scale = 1.0f;   // masked_scale
  bool causal = false;  // masked_scale
};

struct DemoBatch {
  std::vector<float> features;  // the MLP's inputs [batch, inputs]
  std::vector<int64_t> tokens;  // the GPT's input ids [batch, seq]
  std::vector<int64_t> labels;  // [rows]: a class, or the next token
};

struct ParameterInit {
  enum class Kind : uint8_t { kUniform, kOnes, kZeros } kind = Kind::kZeros;
  float bound = 0;  // kUniform: values in [-bound, bound]
};

struct DemoModel {
  std::string name;
  Graph forward;
  std::vector<KernelAttributes> attributes;  // by forward OpId
  TensorId inputs = kNone;                   // features or token ids
  TensorId labels = kNone;
  std::vector<ParameterInit> init;  // by TensorId (parameters only)
  int64_t classes = 0;  // or the vocabulary
  uint64_t seed = 0;

  DemoBatch MakeBatch(int64_t step) const;
  // Deterministic initial values of a parameter, in the spirit of a fresh
  // PyTorch module: layer-norm weights 1, biases 0, other weights uniform in
  // +-1/sqrt(fan_in).
  std::vector<float> InitialValues(TensorId parameter) const;
};

struct DemoMlpOptions {
  int64_t batch = 512;
  int64_t inputs = 32;
  int64_t hidden = 128;
  int64_t layers = 3;  // hidden layers
  int64_t classes = 10;
  uint64_t seed = 1;
};
absl::StatusOr<DemoModel> BuildDemoMlp(const DemoMlpOptions& options);

struct DemoGptOptions {
  int64_t batch = 4;
  int64_t seq = 32;
  int64_t vocab = 64;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t layers = 4;
  uint64_t seed = 1;
  // The head reads the token embedding table (GPT-2's tied embeddings), whose
  // gradient then sums two contributions (Note [Gradient accumulation]).
  bool tie_head = false;
};
absl::StatusOr<DemoModel> BuildDemoGpt(const DemoGptOptions& options);

// "mlp" or "gpt" with default options; NotFound otherwise.
absl::StatusOr<DemoModel> BuildDemoModel(std::string_view name);

}  // namespace headroom

#endif  // HEADROOM_EXECUTOR_DEMO_MODELS_H_
