#include "executor/demo_models.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "graph/ops.h"

namespace headroom {
namespace {

// splitmix64 over (seed, stream, index): every value independent of the
// order values are drawn in.
uint64_t Mix(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ULL + stream * 0xbf58476d1ce4e5b9ULL + index * 0x94d049bb133111ebULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
// Uniform in [-1, 1).
float Uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<float>(static_cast<double>(Mix(seed, stream, index) >> 11) * 0x1.0p-52 - 1.0);
}

enum Stream : uint64_t { kWeights = 1, kFeatures, kTeacher, kSuccessor, kFirstToken };

absl::Status CheckPositive(std::string_view model, std::initializer_list<std::pair<std::string_view, int64_t>> sizes) {
  for (const auto& [name, value] : sizes) {
    if (value <= 0 || value > (int64_t{1} << 16)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: %s = %d is not in [1, 65536]", model, name, value));
    }
  }
  return absl::OkStatus();
}

// Parameters with their initialization recorded.
class ModelBuilder {
 public:
  ModelBuilder(DemoModel& model, OpEmitter& emit) : model_(model), emit_(emit) {}

  TensorId Weight(const std::string& name, std::vector<int64_t> shape) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(shape.back()));
    return Add(name, std::move(shape), {.kind = ParameterInit::Kind::kUniform, .bound = bound});
  }
  TensorId Table(const std::string& name, std::vector<int64_t> shape) {
    return Add(name, std::move(shape), {.kind = ParameterInit::Kind::kUniform, .bound = 1.0f});
  }
  TensorId Ones(const std::string& name, int64_t n) { return Add(name, {n}, {.kind = ParameterInit::Kind::kOnes}); }
  TensorId Zeros(const std::string& name, int64_t n) { return Add(name, {n}, {.kind = ParameterInit::Kind::kZeros}); }

  // Records attributes for the op just emitted.
  void Attribute(KernelAttributes attributes) {
    model_.attributes.resize(model_.forward.num_ops());
    model_.attributes.back() = attributes;
  }
  void Finish() {
    model_.attributes.resize(model_.forward.num_ops());
    model_.init.resize(model_.forward.num_tensors());
  }

 private:
  TensorId Add(const std::string& name, std::vector<int64_t> shape, ParameterInit init) {
    const TensorId id = emit_.Parameter(name, std::move(shape), DType::kF32);
    model_.init.resize(model_.forward.num_tensors());
    model_.init[static_cast<size_t>(id)] = init;
    return id;
  }

  DemoModel& model_;
  OpEmitter& emit_;
};

TensorId Dense(ModelBuilder& b, OpEmitter& e, const std::string& name, TensorId x, int64_t in, int64_t out) {
  const TensorId w = b.Weight(name + ".weight", {out, in});
  const TensorId bias = b.Zeros(name + ".bias", out);
  return e.Linear(name, x, w, bias);
}

TensorId Norm(ModelBuilder& b, OpEmitter& e, const std::string& name, TensorId x, int64_t n) {
  return e.LayerNorm(name, x, b.Ones(name + ".weight", n), b.Zeros(name + ".bias", n));
}

}  // namespace

DemoBatch DemoModel::MakeBatch(int64_t step) const {
  DemoBatch batch;
  const Tensor& in = forward.tensor(inputs);
  const int64_t rows = in.shape[0];
  const auto index = [](int64_t a, int64_t b) { return static_cast<uint64_t>(a) * 1000003 + static_cast<uint64_t>(b); };
  if (in.dtype == DType::kF32) {  // the MLP
    const int64_t width = in.shape[1];
    batch.features.resize(static_cast<size_t>(rows * width));
    for (int64_t r = 0; r < rows; ++r) {
      float best = -2;
      int64_t label = 0;
      for (int64_t i = 0; i < width; ++i) {
        batch.features[static_cast<size_t>(r * width + i)] = Uniform(seed, kFeatures, index(step * rows + r, i));
      }
      for (int64_t c = 0; c < classes; ++c) {
        float score = 0;
        for (int64_t i = 0; i < width; ++i) {
          score += Uniform(seed, kTeacher, index(c, i)) * batch.features[static_cast<size_t>(r * width + i)];
        }
        if (score > best) {
          best = score;
          label = c;
        }
      }
      batch.labels.push_back(label);
    }
    return batch;
  }
  // The GPT: each token's successor comes from a fixed table.
  const int64_t seq = in.shape[1];
  const auto successor = [&](int64_t token) {
    return static_cast<int64_t>(Mix(seed, kSuccessor, static_cast<uint64_t>(token)) % static_cast<uint64_t>(classes));
  };
  for (int64_t r = 0; r < rows; ++r) {
    int64_t token = static_cast<int64_t>(Mix(seed, kFirstToken, index(step, r)) % static_cast<uint64_t>(classes));
    for (int64_t i = 0; i < seq; ++i) {
      batch.tokens.push_back(token);
      token = successor(token);
      batch.labels.push_back(token);
    }
  }
  return batch;
}

std::vector<float> DemoModel::InitialValues(TensorId parameter) const {
  const Tensor& t = forward.tensor(parameter);
  const ParameterInit& how = init[static_cast<size_t>(parameter)];
  std::vector<float> values(t.elements());
  for (size_t i = 0; i < values.size(); ++i) {
    switch (how.kind) {
      case ParameterInit::Kind::kUniform:
        values[i] = how.bound * Uniform(seed, kWeights, static_cast<uint64_t>(parameter) * (uint64_t{1} << 32) + i);
        break;
      case ParameterInit::Kind::kOnes: values[i] = 1; break;
      case ParameterInit::Kind::kZeros: values[i] = 0; break;
    }
  }
  return values;
}

absl::StatusOr<DemoModel> BuildDemoMlp(const DemoMlpOptions& o) {
  HEADROOM_RETURN_IF_ERROR(CheckPositive("mlp", {{"batch", o.batch}, {"inputs", o.inputs}, {"hidden", o.hidden},
                                                 {"layers", o.layers}, {"classes", o.classes}}));
  DemoModel model{.name = "demo-mlp", .forward = Graph("demo-mlp"), .classes = o.classes, .seed = o.seed};
  OpEmitter e(model.forward, {.compute_dtype = DType::kF32, .training = true});
  ModelBuilder b(model, e);
  model.inputs = e.Input("features", {o.batch, o.inputs}, DType::kF32);
  model.labels = e.Input("labels", {o.batch}, DType::kI64);
  TensorId x = model.inputs;
  int64_t width = o.inputs;
  for (int64_t l = 0; l < o.layers; ++l) {
    e.set_layer(static_cast<int>(l));
    const std::string name = absl::StrFormat("layers.%d", l);
    x = e.Activation(name + ".act", ActivationKind::kGelu, Dense(b, e, name + ".fc", x, width, o.hidden));
    width = o.hidden;
  }
  e.set_layer(-1);
  const TensorId logits = Dense(b, e, "head", x, width, o.classes);
  e.set_phase(Phase::kLoss);
  e.CrossEntropy("loss", logits, model.labels);
  b.Finish();
  return model;
}

absl::StatusOr<DemoModel> BuildDemoGpt(const DemoGptOptions& o) {
  HEADROOM_RETURN_IF_ERROR(CheckPositive("gpt", {{"batch", o.batch}, {"seq", o.seq}, {"vocab", o.vocab},
                                                 {"hidden", o.hidden}, {"heads", o.heads}, {"layers", o.layers}}));
  if (o.hidden % o.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gpt: hidden = %d is not a multiple of heads = %d", o.hidden, o.heads));
  }
  DemoModel model{.name = "demo-gpt", .forward = Graph("demo-gpt"), .classes = o.vocab, .seed = o.seed};
  OpEmitter e(model.forward, {.compute_dtype = DType::kF32, .training = true});
  ModelBuilder b(model, e);
  const int64_t d = o.hidden;
  model.inputs = e.Input("input_ids", {o.batch, o.seq}, DType::kI64);
  model.labels = e.Input("labels", {o.batch * o.seq}, DType::kI64);
  const TensorId wte = b.Table("wte.weight", {o.vocab, d});
  const TensorId wpe = b.Table("wpe.weight", {o.seq, d});
  TensorId h = e.Add("embed", e.Embedding("wte", model.inputs, wte), wpe);
  for (int64_t l = 0; l < o.layers; ++l) {
    e.set_layer(static_cast<int>(l));
    const std::string p = absl::StrFormat("h.%d", l);
    const TensorId a = Norm(b, e, p + ".ln_1", h, d);
    const TensorId q = Dense(b, e, p + ".attn.q_proj", a, d, d);
    const TensorId k = Dense(b, e, p + ".attn.k_proj", a, d, d);
    const TensorId v = Dense(b, e, p + ".attn.v_proj", a, d, d);
    e.set_attention_core(true);
    const TensorId scores = e.AttentionScores(p + ".attn.scores", q, k, o.heads);
    b.Attribute({.heads = o.heads});
    const TensorId masked = e.MaskedScale(p + ".attn.mask", scores);
    b.Attribute({.scale = 1.0f / std::sqrt(static_cast<float>(d / o.heads)), .causal = true});
    const TensorId probs = e.Softmax(p + ".attn.softmax", masked);
    const TensorId context = e.AttentionContext(p + ".attn.context", probs, v);
    b.Attribute({.heads = o.heads});
    e.set_attention_core(false);
    h = e.Add(p + ".attn.residual", h, Dense(b, e, p + ".attn.o_proj", context, d, d));
    const TensorId m = Norm(b, e, p + ".ln_2", h, d);
    const TensorId up = e.Activation(p + ".mlp.act", ActivationKind::kGelu, Dense(b, e, p + ".mlp.fc", m, d, 4 * d));
    h = e.Add(p + ".mlp.residual", h, Dense(b, e, p + ".mlp.proj", up, 4 * d, d));
  }
  e.set_layer(-1);
  const TensorId final_norm = Norm(b, e, "ln_f", h, d);
  const TensorId head = o.tie_head ? wte : b.Weight("lm_head.weight", {o.vocab, d});
  const TensorId logits = e.Linear("lm_head", final_norm, head);
  e.set_phase(Phase::kLoss);
  e.CrossEntropy("loss", e.View("logits.flat", logits, {o.batch * o.seq, o.vocab}), model.labels);
  b.Finish();
  return model;
}

absl::StatusOr<DemoModel> BuildDemoModel(std::string_view name) {
  if (name == "mlp") return BuildDemoMlp({});
  if (name == "gpt") return BuildDemoGpt({});
  return absl::NotFoundError(
      absl::StrFormat("demo model %s: the executor trains 'mlp' or 'gpt'", QuoteForError(name)));
}

}  // namespace headroom
