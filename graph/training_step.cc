#include "graph/training_step.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "graph/autograd.h"

namespace headroom {
namespace {


// One checkpointed segment: forward ops [begin, end] of the step (contiguous).
struct Segment {
  OpId begin = 0;
  OpId end = 0;
  bool replayed = false;
};

// Replays segment `seg` before its backward (Note [Checkpoint segments]).
class Recomputer {
 public:
  Recomputer(Graph& step, internal::BackwardPass& pass, std::vector<Segment> segments,
             std::vector<int32_t> segment_of_op)
      : step_(step), pass_(pass), segments_(std::move(segments)),
        segment_of_op_(std::move(segment_of_op)) {}

  absl::Status BeforeBackward(OpId op) {
    const int32_t s = segment_of_op_[static_cast<size_t>(op)];
    if (s == kNone || segments_[static_cast<size_t>(s)].replayed) return absl::OkStatus();
    Segment& seg = segments_[static_cast<size_t>(s)];
    seg.replayed = true;
    Replay(seg, s);
    return absl::OkStatus();
  }

 private:
  bool InSegment(TensorId t, int32_t s) const {
    const OpId p = step_.producer(t);
    return p != kNone && static_cast<size_t>(p) < segment_of_op_.size() &&
           segment_of_op_[static_cast<size_t>(p)] == s;
  }

  void Replay(const Segment& seg, int32_t s) {
    // Which of the segment's tensors backward needs again: those its ops save
    // and read in backward, plus (walking back) every segment tensor a kept
    // replayed op consumes. Ops producing none of them are not replayed.
    needed_.resize(step_.num_tensors(), false);
    std::vector<TensorId> touched;
    auto need = [&](TensorId t) {
      if (!needed_[static_cast<size_t>(t)]) {
        needed_[static_cast<size_t>(t)] = true;
        touched.push_back(t);
      }
    };
    for (OpId o = seg.begin; o <= seg.end; ++o) {
      const Op& op = step_.op(o);
      const bool has_backward = std::any_of(op.inputs.begin(), op.inputs.end(), [&](TensorId in) {
        return pass_.requires_grad[static_cast<size_t>(in)];
      });
      if (!has_backward) continue;
      for (TensorId t : op.saved) {
        if (InSegment(StorageOf(t), s) && BackwardReadsSaved(step_, op, t, pass_.requires_grad)) {
          need(t);
          need(StorageOf(t));
        }
      }
    }
    std::vector<OpId> kept;
    for (OpId o = seg.end; o >= seg.begin; --o) {
      const Op& op = step_.op(o);
      const bool produces_needed = std::any_of(op.outputs.begin(), op.outputs.end(), [&](TensorId t) {
        return needed_[static_cast<size_t>(t)];
      });
      if (!produces_needed) continue;
      kept.push_back(o);
      for (TensorId in : op.inputs) {
        if (InSegment(in, s)) need(in);
        if (InSegment(StorageOf(in), s)) need(StorageOf(in));
      }
    }
    for (TensorId t : touched) needed_[static_cast<size_t>(t)] = false;

    copy_.resize(step_.num_tensors(), kNone);
    std::vector<TensorId> copied;
    auto copy_of = [this](TensorId t) {
      const TensorId c = copy_[static_cast<size_t>(t)];
      return c == kNone ? t : c;
    };
    for (auto it = kept.rbegin(); it != kept.rend(); ++it) {
      const OpId o = *it;
      Op replay = step_.op(o);  // a copy: AddTensor/AddOp may reallocate
      replay.id = kNone;
      replay.recompute = true;
      replay.phase = Phase::kBackward;
      replay.forward_of = o;
      for (TensorId& in : replay.inputs) in = copy_of(in);
      for (TensorId& out : replay.outputs) {
        Tensor t = step_.tensor(out);
        t.id = kNone;
        t.name = absl::StrFormat("%s@recompute", t.name);
        if (t.view_of != kNone) t.view_of = copy_of(t.view_of);
        const TensorId fresh = step_.AddTensor(std::move(t));
        copy_[static_cast<size_t>(out)] = fresh;
        copied.push_back(out);
        out = fresh;
      }
      for (TensorId& sv : replay.saved) sv = copy_of(sv);
      step_.AddOp(std::move(replay));
    }
    pass_.read_as.resize(step_.num_tensors(), kNone);
    pass_.requires_grad.resize(step_.num_tensors(), false);
    for (TensorId from : copied) {
      pass_.read_as[static_cast<size_t>(from)] = copy_[static_cast<size_t>(from)];
      copy_[static_cast<size_t>(from)] = kNone;
    }
  }

  TensorId StorageOf(TensorId t) const { return step_.storage(t); }

  Graph& step_;
  internal::BackwardPass& pass_;
  std::vector<Segment> segments_;
  std::vector<int32_t> segment_of_op_;  // indexed by step OpId
  // Scratch indexed by TensorId, all-false / all-kNone between replays.
  std::vector<bool> needed_;
  std::vector<TensorId> copy_;
};

}  // namespace

absl::StatusOr<Graph> BuildTrainingStep(const Graph& forward, const StepOptions& options) {
  HEADROOM_RETURN_IF_ERROR(forward.Validate());
  HEADROOM_RETURN_IF_ERROR(options.checkpoint.Validate(forward));
  if (!options.training && !options.checkpoint.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "graph %s: a checkpoint plan applies to training; inference keeps nothing for backward",
        QuoteForError(forward.name())));
  }
  OpId last_loss = kNone;
  for (const Op& op : forward.ops()) {
    if (!IsForwardPhase(op.phase)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "graph %s: op %s is already in phase %s; BuildTrainingStep expects a forward graph",
          QuoteForError(forward.name()), QuoteForError(op.name), PhaseName(op.phase)));
    }
    if (op.phase == Phase::kLoss && !IsHoldOp(op)) last_loss = op.id;
  }

  Graph step(forward.name());
  for (const Tensor& t : forward.tensors()) step.AddTensor(t);
  if (!options.training) {
    for (const Op& op : forward.ops()) {
      if (op.phase == Phase::kForward) step.AddOp(op);
    }
    return step;  // the forward graph's ops and tensors, within its bounds
  }
  if (last_loss == kNone) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "graph %s has no loss op (phase loss); a training step needs one (build with training on)",
        QuoteForError(forward.name())));
  }

  const std::vector<bool> requires_grad = RequiresGrad(forward);
  internal::BackwardPass pass{.requires_grad = requires_grad,
                              .read_as = std::vector<TensorId>(forward.num_tensors(), kNone),
                              .gradient = std::vector<TensorId>(forward.num_tensors(), kNone),
                              .parameter_gradient_dtype = options.parameter_gradient_dtype,
                              .softmax_backward_holds_product = options.softmax_backward_holds_product};

  // Note [Gradient accumulation] in autograd.cc: with gradients from earlier
  // micro-batches, every contribution is added into an existing buffer.
  if (options.gradients_preexist) {
    Op buffers{.kind = "gradient_buffers", .name = "gradient_buffers", .phase = Phase::kForward};
    for (const Tensor& p : forward.tensors()) {
      if (p.role != TensorRole::kParameter || !requires_grad[static_cast<size_t>(p.id)]) continue;
      const TensorId g = step.AddTensor({.name = absl::StrFormat("%s.grad", p.name),
                                         .shape = p.shape,
                                         .dtype = options.parameter_gradient_dtype.value_or(p.dtype),
                                         .role = TensorRole::kGradient,
                                         .layer = p.layer,
                                         .grad_of = p.id});
      buffers.outputs.push_back(g);
      pass.gradient[static_cast<size_t>(p.id)] = g;
    }
    step.AddOp(std::move(buffers));
  }
  const auto offset = static_cast<OpId>(step.num_ops());
  for (const Op& op : forward.ops()) {
    Op copy = op;
    if (copy.forward_of != kNone) copy.forward_of += offset;
    step.AddOp(std::move(copy));
    pass.forward_ops.push_back(op.id + offset);
  }
  if (options.autocast_weight_cache) {
    Op exit{.kind = "autocast_exit", .name = "autocast_exit", .phase = Phase::kLoss};
    for (const Op& op : forward.ops()) {
      if (op.kind != "cast" || op.inputs.empty() || op.outputs.empty()) continue;
      const Tensor& from = forward.tensor(op.inputs[0]);
      if (from.role == TensorRole::kParameter && from.dtype == DType::kF32 &&
          requires_grad[static_cast<size_t>(from.id)]) {
        exit.inputs.push_back(op.outputs[0]);
      }
    }
    if (!exit.inputs.empty()) step.AddOp(std::move(exit));
  }
  // The loss is the last loss op's first output (cross_entropy: (loss, log_probs)).
  const Op& loss_op = forward.op(last_loss);
  if (loss_op.outputs.empty() || !requires_grad[static_cast<size_t>(loss_op.outputs[0])]) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "graph %s: loss op %s has no output that depends on a trainable parameter",
        QuoteForError(forward.name()), QuoteForError(loss_op.name)));
  }
  pass.gradient[static_cast<size_t>(loss_op.outputs[0])] = internal::kSeedGradient;

  // Segments in step op ids.
  const std::vector<int32_t>& forward_segments = options.checkpoint.segment_of_op;
  std::vector<int32_t> segment_of_op(step.num_ops(), kNone);
  std::vector<Segment> segments;
  for (const Op& op : forward.ops()) {
    if (forward_segments.empty()) break;
    const int32_t s = forward_segments[static_cast<size_t>(op.id)];
    if (s == kNone) continue;
    const OpId id = op.id + offset;
    segment_of_op[static_cast<size_t>(id)] = s;
    if (static_cast<size_t>(s) == segments.size()) segments.push_back({.begin = id, .end = id});
    segments[static_cast<size_t>(s)].end = id;
  }
  Recomputer recomputer(step, pass, std::move(segments), std::move(segment_of_op));
  pass.before_backward = [&recomputer](OpId op) { return recomputer.BeforeBackward(op); };
  HEADROOM_RETURN_IF_ERROR(internal::AppendBackward(step, pass));

  if (options.optimizer_step) {
    for (const Tensor& p : forward.tensors()) {
      if (p.role != TensorRole::kParameter) continue;
      const TensorId g = pass.gradient[static_cast<size_t>(p.id)];
      if (g < 0) continue;  // frozen, or nothing reached it
      const uint64_t elements = p.elements();
      const uint64_t state = elements * options.optimizer_state_bytes_per_element;
      step.AddOp({.kind = "optimizer_step",
                  .name = absl::StrFormat("%s.step", p.name),
                  .inputs = {p.id, g},
                  .flops = options.optimizer_flops_per_element * static_cast<double>(elements),
                  .bytes_read = p.bytes() + step.tensor(g).bytes() + state,
                  .bytes_written = p.bytes() + state,
                  .compute_dtype = DType::kF32,
                  .phase = Phase::kOptimizer,
                  .layer = p.layer});
    }
  }
  if (options.hold_model_outputs) {
    // The model's outputs: storages of what the loss ops read that forward ops made.
    Op release{.kind = "release_outputs", .name = "release_outputs", .phase = Phase::kOptimizer};
    for (const Op& op : forward.ops()) {
      if (op.phase != Phase::kLoss) continue;
      for (TensorId in : op.inputs) {
        const TensorId base = forward.storage(in);
        const OpId producer = forward.producer(base);
        if (producer == kNone || forward.op(producer).phase != Phase::kForward) continue;
        if (std::find(release.inputs.begin(), release.inputs.end(), base) == release.inputs.end()) {
          release.inputs.push_back(base);
        }
      }
    }
    if (!release.inputs.empty()) step.AddOp(std::move(release));
  }
  // Gradients and replayed tensors add to the forward graph's (Note [Size bounds]).
  HEADROOM_RETURN_IF_ERROR(step.CheckBounds());
  return step;
}

}  // namespace headroom
