#include "executor/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "graph/autograd.h"

namespace headroom {
namespace {

int64_t Last(const Tensor& t) { return t.shape.empty() ? 1 : t.shape.back(); }
int64_t Rows(const Tensor& t) { return static_cast<int64_t>(t.elements()) / Last(t); }
int64_t Elements(const Tensor& t) { return static_cast<int64_t>(t.elements()); }

// attention_scores (q [b, s, w], k [b, t, w]) or attention_context (probs [b, h, s, t], v [b, t, w]).
AttentionShape AttentionShapeOf(bool scores, const Tensor& first, const Tensor& second, int64_t heads) {
  return {.batch = second.shape[0],
          .queries = scores ? first.shape[1] : first.shape[2],
          .keys = second.shape[1],
          .heads = heads,
          .head_dim = Last(second) / heads};
}

// Unless told a capacity, the pool holds every host copy of the plan at once
// (Note [Host pool size] in host_pool.h): a fixed 256 MiB failed an 8-layer,
// hidden-512 GPT's hybrid plan, on an H100 and on the CPU reference alike.
uint64_t PlanHostPoolBytes(const Graph& step, const Schedule& schedule) {
  std::vector<uint64_t> copies;
  for (const ScheduleEntry& e : schedule.entries) {
    if (e.action == ScheduleAction::kOffload) copies.push_back(step.tensor(e.target).bytes());
  }
  return HostPoolBytesFor(copies);
}

absl::Status Unsupported(const Op& op) {
  return absl::UnimplementedError(
      absl::StrFormat("executor: op '%s' is of kind '%s', which the executor's kernels do not run", op.name, op.kind));
}

}  // namespace

JobSpec DemoJob(const AllocatorOptions& allocator) {
  JobSpec job;
  job.precision = Precision::kFp32;
  job.optimizer = Optimizer::kSgdMomentum;
  job.allocator = allocator;
  return job;
}

absl::StatusOr<PlanInput> DemoPlanInput(const DemoModel& model, const JobSpec& job, uint64_t device_bytes) {
  const LoadedModel loaded{.name = model.name, .kind = ModelSourceKind::kGraphFile, .graph = model.forward};
  return BuildPlanInput(loaded, job, Machine{.budget = device_bytes});
}

PlanExecutor::PlanExecutor(const DemoModel& model, const PlanInput& in, ExecutorOptions options,
                           std::unique_ptr<ComputeDevice> device)
    : model_(model), in_(in), options_(options), device_(std::move(device)), kernels_(device_->kernels()) {}

PlanExecutor::~PlanExecutor() {
  // Copies in flight first, then host copies, then the device.
  DeviceBackend& backend = device_->backend();
  (void)backend.SynchronizeDevice();
  for (auto& [host, event] : host_frees_) (void)host_pool_->Free(host);
  for (void*& p : host_copy_) {
    if (p != nullptr && host_pool_ != nullptr) (void)host_pool_->Free(p);
  }
  for (const std::optional<EventHandle>& e : ready_) {
    if (e) (void)backend.DestroyEvent(*e);
  }
  for (const auto& [host, event] : host_frees_) (void)backend.DestroyEvent(event);
  for (EventHandle e : idle_events_) (void)backend.DestroyEvent(e);
  if (copy_stream_ != kDefaultStream) (void)backend.DestroyStream(copy_stream_);
}

absl::StatusOr<EventHandle> PlanExecutor::RecordOn(StreamHandle stream) {
  EventHandle event;
  if (idle_events_.empty()) {
    HEADROOM_ASSIGN_OR_RETURN(event, device_->backend().CreateEvent());
  } else {
    event = idle_events_.back();
    idle_events_.pop_back();
  }
  HEADROOM_RETURN_IF_ERROR(device_->backend().RecordEvent(event, stream));
  return event;
}

absl::Status PlanExecutor::CopyStreamWaitsForCompute() {
  HEADROOM_ASSIGN_OR_RETURN(const EventHandle computed, RecordOn(kDefaultStream));
  HEADROOM_RETURN_IF_ERROR(device_->backend().StreamWaitEvent(copy_stream_, computed));
  idle_events_.push_back(computed);  // the wait holds what the event marked; it may be recorded again
  return absl::OkStatus();
}

absl::Status PlanExecutor::FreeFinishedHostCopies(bool wait) {
  while (!host_frees_.empty()) {
    auto& [host, event] = host_frees_.front();
    if (wait) {
      HEADROOM_RETURN_IF_ERROR(device_->backend().SynchronizeEvent(event));
    } else {
      HEADROOM_ASSIGN_OR_RETURN(const bool done, device_->backend().QueryEvent(event));
      if (!done) break;
    }
    HEADROOM_RETURN_IF_ERROR(host_pool_->Free(host));
    idle_events_.push_back(event);
    host_frees_.pop_front();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PlanExecutor>> PlanExecutor::Create(const DemoModel& model, const PlanInput& in,
                                                                   const Schedule& schedule, ExecutorOptions options,
                                                                   std::unique_ptr<ComputeDevice> device) {
  if (in.step.num_tensors() < model.forward.num_tensors() || in.in_flight != 1 || in.autocast) {
    return absl::InvalidArgumentError(
        "executor: the plan input is not a single-micro-batch fp32 step of this model (no --pp, no autocast)");
  }
  for (const Tensor& t : in.step.tensors()) {
    const bool ids = model.forward.num_tensors() > static_cast<size_t>(t.id) &&
                     (t.id == model.labels || (t.id == model.inputs && t.dtype == DType::kI64));
    if (t.dtype != DType::kF32 && !ids) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "executor: tensor '%s' is %s; the executor runs fp32 steps (--precision fp32)", t.name,
          DTypeName(t.dtype)));
    }
  }
  if (!(options.learning_rate >= 0 && std::isfinite(options.learning_rate)) ||
      !(options.momentum >= 0 && options.momentum <= 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "executor: learning rate %g and momentum %g: the learning rate must be finite and not negative, the "
        "momentum in [0, 1]",
        options.learning_rate, options.momentum));
  }
  if (std::any_of(in.optimizer_temporaries.bytes.begin(), in.optimizer_temporaries.bytes.end(),
                  [](uint64_t b) { return b > 0; })) {
    return absl::InvalidArgumentError(
        "executor: the optimizer has temporaries; the executor runs SGD with momentum (--optimizer sgd-momentum), "
        "which updates in place");
  }
  if (device == nullptr) {
    HEADROOM_ASSIGN_OR_RETURN(device, CpuComputeDevice::Create(options.device_bytes));
  }
  auto executor = std::unique_ptr<PlanExecutor>(new PlanExecutor(model, in, options, std::move(device)));
  HEADROOM_RETURN_IF_ERROR(executor->Initialize(schedule));
  return executor;
}

absl::Status PlanExecutor::Initialize(const Schedule& schedule) {
  schedule_ = schedule;
  HEADROOM_ASSIGN_OR_RETURN(scheduled_, MaterializeSchedule(in_.step, schedule_, &copy_of_));
  lifetimes_ = ComputeLifetimes(scheduled_, in_.profile);
  order_ = std::make_unique<GraphEventOrder>(scheduled_, lifetimes_);
  requires_grad_ = RequiresGrad(in_.step);

  // Every value an op touches lives in the counted sequence or is resident.
  for (const Op& op : scheduled_.ops()) {
    std::vector<TensorId> touched = op.inputs;
    touched.insert(touched.end(), op.outputs.begin(), op.outputs.end());
    for (TensorId t : touched) {
      const TensorId s = scheduled_.storage(t);
      const TensorLifetime& life = lifetimes_[static_cast<size_t>(s)];
      const Tensor& value = in_.step.tensor(copy_of_[static_cast<size_t>(s)]);
      if (life.first <= life.last || value.role == TensorRole::kParameter) continue;
      return absl::InvalidArgumentError(absl::StrFormat(
          "executor: op '%s' touches '%s' (%s), which neither the plan's sequence nor the resident state holds",
          op.name, value.name, TensorRoleName(value.role)));
    }
  }
  last_prefetch_.assign(in_.step.num_tensors(), schedule_.entries.size());
  for (size_t i = 0; i < schedule_.entries.size(); ++i) {
    const ScheduleEntry& e = schedule_.entries[i];
    if (e.action == ScheduleAction::kPrefetch) last_prefetch_[static_cast<size_t>(e.target)] = i;
  }
  host_copy_.assign(in_.step.num_tensors(), nullptr);
  address_.assign(scheduled_.num_tensors(), 0);
  pointer_.assign(scheduled_.num_tensors(), nullptr);
  live_.assign(scheduled_.num_tensors(), false);
  momentum_.assign(in_.step.num_tensors(), 0);
  momentum_pointer_.assign(in_.step.num_tensors(), nullptr);

  ready_.assign(scheduled_.num_tensors(), std::nullopt);
  HEADROOM_ASSIGN_OR_RETURN(copy_stream_, device_->backend().CreateStream());
  HEADROOM_ASSIGN_OR_RETURN(allocator_, CachingAllocator::Create(&device_->backend(), in_.allocator));
  const uint64_t host_pool_bytes =
      options_.host_pool_bytes > 0 ? options_.host_pool_bytes : PlanHostPoolBytes(in_.step, schedule_);
  HEADROOM_ASSIGN_OR_RETURN(host_pool_, HostPool::Create(host_pool_bytes, device_->HostMemory()));
  return AllocateResident();
}

absl::Status PlanExecutor::AllocateResident() {
  std::vector<TensorId> parameters;
  std::vector<TensorId> trainable;
  for (const Tensor& t : model_.forward.tensors()) {
    if (t.role != TensorRole::kParameter) continue;
    parameters.push_back(t.id);
    if (t.trainable) trainable.push_back(t.id);
  }
  size_t weight = 0, state = 0;
  for (const ResidentBlock& block : in_.resident) {
    if (block.stream != 0) {
      return absl::InvalidArgumentError("executor: the resident state uses several streams; the executor runs one");
    }
    TensorId owner = kNone;
    if (block.from_first_step) {  // Note [Executor allocation order]: the first step creates it
      if (block.category == BudgetCategory::kOptimizerState && state < trainable.size()) owner = trainable[state++];
      if (owner != kNone && block.bytes != model_.forward.tensor(owner).bytes()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "executor: the optimizer-state block for '%s' is %d bytes, the tensor %d; the executor runs SGD with "
            "momentum (one fp32 buffer per parameter)",
            model_.forward.tensor(owner).name, block.bytes, model_.forward.tensor(owner).bytes()));
      }
      state_to_create_.emplace_back(owner, block.bytes);
      continue;
    }
    HEADROOM_ASSIGN_OR_RETURN(const DeviceAddress address, allocator_->Allocate(block.bytes));
    if (block.category == BudgetCategory::kWeights && weight < parameters.size()) {
      owner = parameters[weight++];
      address_[static_cast<size_t>(owner)] = address;
      HEADROOM_ASSIGN_OR_RETURN(pointer_[static_cast<size_t>(owner)], device_->KernelPointer(address, block.bytes));
      live_[static_cast<size_t>(owner)] = true;
    } else if (block.category == BudgetCategory::kOptimizerState && state < trainable.size()) {
      owner = trainable[state++];
      momentum_[static_cast<size_t>(owner)] = address;
    } else {
      unused_resident_.push_back(address);
    }
    if (owner != kNone && block.bytes != model_.forward.tensor(owner).bytes()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "executor: the resident block for '%s' is %d bytes, the tensor %d; the executor runs fp32 weights and "
          "SGD with momentum (one fp32 buffer per parameter)",
          model_.forward.tensor(owner).name, block.bytes, model_.forward.tensor(owner).bytes()));
    }
  }
  if (weight != parameters.size() || state != trainable.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "executor: the resident state holds %d weight and %d optimizer-state blocks for %d parameters; the "
        "executor runs SGD with momentum (--optimizer sgd-momentum) with per-parameter tensors",
        weight, state, parameters.size()));
  }
  for (TensorId p : parameters) {
    const std::vector<float> values = model_.InitialValues(p);
    const uint64_t bytes = values.size() * sizeof(float);
    HEADROOM_RETURN_IF_ERROR(device_->CopyToDevice(pointer_[static_cast<size_t>(p)], values.data(), bytes));
    if (momentum_[static_cast<size_t>(p)] != 0) HEADROOM_RETURN_IF_ERROR(ZeroMomentum(p, bytes));
  }
  return device_->Synchronize();
}

absl::Status PlanExecutor::ZeroMomentum(TensorId p, uint64_t bytes) {
  HEADROOM_ASSIGN_OR_RETURN(momentum_pointer_[static_cast<size_t>(p)],
                            device_->KernelPointer(momentum_[static_cast<size_t>(p)], bytes));
  const std::vector<float> zeros(bytes / sizeof(float), 0.0f);
  return device_->CopyToDevice(momentum_pointer_[static_cast<size_t>(p)], zeros.data(), bytes);
}

absl::Status PlanExecutor::CreateOptimizerState() {
  for (const auto& [owner, bytes] : state_to_create_) {
    HEADROOM_ASSIGN_OR_RETURN(const DeviceAddress address, allocator_->Allocate(bytes));
    if (owner == kNone) {
      unused_resident_.push_back(address);
      continue;
    }
    momentum_[static_cast<size_t>(owner)] = address;
    HEADROOM_RETURN_IF_ERROR(ZeroMomentum(owner, bytes));
  }
  state_to_create_.clear();
  return absl::OkStatus();
}

absl::Status PlanExecutor::AllocateTensor(TensorId t) {
  const uint64_t bytes = scheduled_.tensor(t).bytes();
  if (bytes > 0) {
    absl::StatusOr<DeviceAddress> address = allocator_->Allocate(bytes);
    if (!address.ok()) {
      return absl::Status(address.status().code(), absl::StrFormat("executor: allocating '%s': %s",
                                                                   scheduled_.tensor(t).name,
                                                                   address.status().message()));
    }
    address_[static_cast<size_t>(t)] = *address;
    HEADROOM_ASSIGN_OR_RETURN(pointer_[static_cast<size_t>(t)], device_->KernelPointer(*address, bytes));
  }
  live_[static_cast<size_t>(t)] = true;
  if (options_.validate_allocator) HEADROOM_RETURN_IF_ERROR(allocator_->Validate());
  return absl::OkStatus();
}

absl::Status PlanExecutor::FreeTensor(TensorId t) {
  if (address_[static_cast<size_t>(t)] != 0) {
    HEADROOM_RETURN_IF_ERROR(allocator_->Free(address_[static_cast<size_t>(t)]));
  }
  address_[static_cast<size_t>(t)] = 0;
  pointer_[static_cast<size_t>(t)] = nullptr;
  live_[static_cast<size_t>(t)] = false;
  if (options_.validate_allocator) HEADROOM_RETURN_IF_ERROR(allocator_->Validate());
  return absl::OkStatus();
}

float* PlanExecutor::Data(TensorId t) const {
  return reinterpret_cast<float*>(pointer_[static_cast<size_t>(scheduled_.storage(t))]);
}

absl::Status PlanExecutor::LoadBatch(TensorId t, const DemoBatch& batch) {
  const TensorId value = copy_of_[static_cast<size_t>(t)];
  if (value != model_.inputs && value != model_.labels) return absl::OkStatus();
  const Tensor& tensor = scheduled_.tensor(t);  // CheckBatch saw to the sizes
  const void* source = value == model_.labels      ? static_cast<const void*>(batch.labels.data())
                       : tensor.dtype == DType::kF32 ? static_cast<const void*>(batch.features.data())
                                                     : static_cast<const void*>(batch.tokens.data());
  return device_->CopyToDevice(pointer_[static_cast<size_t>(scheduled_.storage(t))], source, tensor.bytes());
}

int64_t* PlanExecutor::Ids(TensorId t) const { return reinterpret_cast<int64_t*>(Data(t)); }

absl::Status PlanExecutor::CheckBatch(const DemoBatch& batch) const {
  const auto check = [&](const std::vector<int64_t>& values, std::string_view what) -> absl::Status {
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i] < 0 || values[i] >= model_.classes) {
        return absl::InvalidArgumentError(absl::StrFormat("executor: %s %d at position %d is outside [0, %d)", what,
                                                          values[i], i, model_.classes));
      }
    }
    return absl::OkStatus();
  };
  const Tensor& inputs = model_.forward.tensor(model_.inputs);
  const size_t given = inputs.dtype == DType::kF32 ? batch.features.size() : batch.tokens.size();
  if (given != inputs.elements() || batch.labels.size() != model_.forward.tensor(model_.labels).elements()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "executor: the batch gives %d values for '%s' of %d and %d for 'labels' of %d", given, inputs.name,
        inputs.elements(), batch.labels.size(), model_.forward.tensor(model_.labels).elements()));
  }
  HEADROOM_RETURN_IF_ERROR(check(batch.tokens, "token id"));
  return check(batch.labels, "label");
}

absl::StatusOr<StepResult> PlanExecutor::RunStep(const DemoBatch& batch) {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("executor: an earlier step failed midway, leaving its memory as it was: ", broken_.message()));
  }
  HEADROOM_RETURN_IF_ERROR(CheckBatch(batch));
  absl::StatusOr<StepResult> result = RunCheckedStep(batch);
  if (!result.ok()) broken_ = result.status();
  return result;
}

absl::StatusOr<StepResult> PlanExecutor::RunCheckedStep(const DemoBatch& batch) {
  const auto start = std::chrono::steady_clock::now();
  float loss = 0;
  for (size_t i = 0; i < schedule_.entries.size(); ++i) {
    const auto id = static_cast<OpId>(i);
    // The first optimizer op of the first step creates the momentum, before the op's own tensors.
    if (!state_to_create_.empty() && scheduled_.op(id).phase == Phase::kOptimizer) {
      HEADROOM_RETURN_IF_ERROR(CreateOptimizerState());
    }
    for (TensorId t : order_->Beginning(id)) {
      HEADROOM_RETURN_IF_ERROR(AllocateTensor(t));
      HEADROOM_RETURN_IF_ERROR(LoadBatch(t, batch));
    }
    for (TensorId t : scheduled_.op(id).inputs) {
      const TensorId s = scheduled_.storage(t);
      if (!live_[static_cast<size_t>(s)]) {
        return absl::InternalError(absl::StrFormat("executor: entry %d reads '%s', which is not allocated", i,
                                                   scheduled_.tensor(t).name));
      }
      // Note [Executor copies]: the first reader of a prefetched copy waits for it.
      if (std::optional<EventHandle>& copied = ready_[static_cast<size_t>(s)]; copied) {
        HEADROOM_RETURN_IF_ERROR(device_->backend().StreamWaitEvent(kDefaultStream, *copied));
        idle_events_.push_back(*copied);
        copied.reset();
      }
    }
    const ScheduleEntry& entry = schedule_.entries[i];
    const Op& op = scheduled_.op(id);
    switch (entry.action) {
      case ScheduleAction::kCompute:
        if (IsHoldOp(op)) break;
        if (op.phase == Phase::kOptimizer) {
          HEADROOM_RETURN_IF_ERROR(RunOptimizer(op));
        } else if (op.phase == Phase::kBackward) {
          HEADROOM_RETURN_IF_ERROR(RunBackward(op));
        } else {
          HEADROOM_RETURN_IF_ERROR(RunForward(op, entry.target, loss));
        }
        break;
      case ScheduleAction::kRecompute: {
        float ignored = 0;
        HEADROOM_RETURN_IF_ERROR(RunForward(op, entry.target, ignored));
        break;
      }
      case ScheduleAction::kOffload: HEADROOM_RETURN_IF_ERROR(Offload(op)); break;
      case ScheduleAction::kPrefetch: HEADROOM_RETURN_IF_ERROR(Prefetch(i, op)); break;
    }
    for (TensorId t : order_->Ending(id)) HEADROOM_RETURN_IF_ERROR(FreeTensor(t));
    HEADROOM_RETURN_IF_ERROR(FreeFinishedHostCopies(/*wait=*/false));
  }
  HEADROOM_RETURN_IF_ERROR(device_->backend().SynchronizeStream(copy_stream_));
  HEADROOM_RETURN_IF_ERROR(FreeFinishedHostCopies(/*wait=*/true));
  for (void*& p : host_copy_) {  // offloaded and never brought back
    if (p != nullptr) HEADROOM_RETURN_IF_ERROR(host_pool_->Free(std::exchange(p, nullptr)));
  }
  HEADROOM_RETURN_IF_ERROR(device_->Synchronize());
  const MemoryStats stats = allocator_->GetStats();
  StepResult r{.loss = loss,
               .peak_requested_bytes = static_cast<uint64_t>(stats.requested_bytes[kAllPools].peak),
               .peak_allocated_bytes = static_cast<uint64_t>(stats.allocated_bytes[kAllPools].peak),
               .peak_reserved_bytes = static_cast<uint64_t>(stats.reserved_bytes[kAllPools].peak),
               .peak_active_bytes = static_cast<uint64_t>(stats.active_bytes[kAllPools].peak),
               .host_peak_bytes = host_pool_->stats().peak_bytes};
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

absl::Status PlanExecutor::RunForward(const Op& op, OpId step_op, float& loss) {
  const KernelAttributes& attributes = model_.attributes[static_cast<size_t>(step_op)];
  const auto in = [&](size_t i) -> const Tensor& { return scheduled_.tensor(op.inputs[i]); };
  const auto data = [&](TensorId t) { return Data(t); };
  const std::string& kind = op.kind;
  if (kind == "view") return absl::OkStatus();
  if (kind == "embedding") {
    kernels_.Embedding(Ids(op.inputs[0]), Elements(in(0)), data(op.inputs[1]), Last(in(1)), data(op.outputs[0]));
  } else if (kind == "linear") {
    const Tensor& w = in(1);
    if (w.shape.size() != 2 || w.shape[1] != Last(in(0))) return Unsupported(op);
    kernels_.Linear(data(op.inputs[0]), Rows(in(0)), w.shape[1], data(op.inputs[1]),
                    op.inputs.size() > 2 ? data(op.inputs[2]) : nullptr, w.shape[0], data(op.outputs[0]));
  } else if (kind == "attention_scores" || kind == "attention_context") {
    const bool scores = kind == "attention_scores";
    const AttentionShape a = AttentionShapeOf(scores, in(0), in(1), attributes.heads);
    if (scores) {
      kernels_.AttentionScores(a, data(op.inputs[0]), data(op.inputs[1]), data(op.outputs[0]));
    } else {
      kernels_.AttentionContext(a, data(op.inputs[0]), data(op.inputs[1]), data(op.outputs[0]));
    }
  } else if (kind == "masked_scale") {
    const Tensor& x = in(0);
    const int64_t queries = x.shape[x.shape.size() - 2];
    kernels_.MaskedScale(data(op.inputs[0]), Rows(x) / queries, queries, Last(x), attributes.scale, attributes.causal,
                         data(op.outputs[0]));
  } else if (kind == "softmax") {
    kernels_.Softmax(data(op.inputs[0]), Rows(in(0)), Last(in(0)), data(op.outputs[0]));
  } else if (kind == "log_softmax") {
    kernels_.LogSoftmax(data(op.inputs[0]), Rows(in(0)), Last(in(0)), data(op.outputs[0]));
  } else if (kind == "layer_norm") {
    kernels_.LayerNorm(data(op.inputs[0]), Rows(in(0)), Last(in(0)), data(op.inputs[1]),
                       op.inputs.size() > 2 ? data(op.inputs[2]) : nullptr, data(op.outputs[0]), data(op.outputs[1]),
                       data(op.outputs[2]));
  } else if (kind == "gelu") {
    kernels_.Gelu(data(op.inputs[0]), Elements(in(0)), data(op.outputs[0]));
  } else if (kind == "add") {
    if (Elements(in(0)) != Elements(scheduled_.tensor(op.outputs[0]))) return Unsupported(op);
    kernels_.Add(data(op.inputs[0]), Elements(in(0)), data(op.inputs[1]), Elements(in(1)), data(op.outputs[0]));
  } else if (kind == "nll_loss") {
    kernels_.NllLoss(data(op.inputs[0]), Ids(op.inputs[1]), Rows(in(0)), Last(in(0)), data(op.outputs[0]));
    HEADROOM_RETURN_IF_ERROR(device_->CopyToHost(&loss, pointer_[static_cast<size_t>(op.outputs[0])], sizeof(float)));
  } else {
    return Unsupported(op);
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorId> PlanExecutor::Find(const Op& op, TensorId value) const {
  if (in_.step.tensor(value).role == TensorRole::kParameter) return value;
  for (TensorId t : op.inputs) {
    if (copy_of_[static_cast<size_t>(t)] == value) return t;
  }
  return absl::InternalError(absl::StrFormat("executor: '%s' reads '%s', which it was not given", op.name,
                                             in_.step.tensor(value).name));
}

absl::Status PlanExecutor::RunBackward(const Op& op) {
  const Op& fwd = in_.step.op(op.forward_of);
  const KernelAttributes& attributes = model_.attributes[static_cast<size_t>(op.forward_of)];
  const BackwardRule rule = BackwardRuleFor(in_.step, fwd);
  // The gradient flowing in: of the forward op's first output (the loss's is the implicit 1).
  const float* dy = nullptr;
  int64_t dy_elements = 0;
  for (TensorId t : op.inputs) {
    if (scheduled_.tensor(t).grad_of == fwd.outputs[0]) {
      dy = Data(t);
      dy_elements = Elements(scheduled_.tensor(t));
    }
  }
  if (dy == nullptr && fwd.phase != Phase::kLoss) {
    return absl::InternalError(absl::StrFormat("executor: '%s' has no output gradient", op.name));
  }
  const auto value = [&](TensorId t) -> absl::StatusOr<const float*> {
    HEADROOM_ASSIGN_OR_RETURN(const TensorId held, Find(op, t));
    return Data(held);
  };
  const auto shape = [&](size_t i) -> const Tensor& { return in_.step.tensor(fwd.inputs[i]); };

  // The gradient of fwd.inputs[j], written to `out`.
  const auto gradient = [&](size_t j, float* out) -> absl::Status {
    const std::string& kind = fwd.kind;
    if (kind == "linear") {
      const Tensor& x = shape(0);
      const Tensor& w = shape(1);
      if (j == 0) {
        HEADROOM_ASSIGN_OR_RETURN(const float* weight, value(fwd.inputs[1]));
        kernels_.LinearInputGrad(dy, Rows(x), w.shape[0], weight, w.shape[1], out);
      } else if (j == 1) {
        HEADROOM_ASSIGN_OR_RETURN(const float* input, value(fwd.inputs[0]));
        kernels_.LinearWeightGrad(dy, input, Rows(x), w.shape[1], w.shape[0], out);
      } else {
        kernels_.BiasGrad(dy, Rows(x), w.shape[0], out);
      }
    } else if (kind == "attention_scores" || kind == "attention_context") {
      const bool scores = kind == "attention_scores";
      const AttentionShape a = AttentionShapeOf(scores, shape(0), shape(1), attributes.heads);
      HEADROOM_ASSIGN_OR_RETURN(const float* other, value(fwd.inputs[1 - j]));
      if (scores && j == 0) {
        kernels_.AttentionScoresQueryGrad(a, dy, other, out);
      } else if (scores) {
        kernels_.AttentionScoresKeyGrad(a, dy, other, out);
      } else if (j == 0) {
        kernels_.AttentionContextProbsGrad(a, dy, other, out);
      } else {
        kernels_.AttentionContextValueGrad(a, dy, other, out);
      }
    } else if (kind == "masked_scale") {
      const Tensor& x = shape(0);
      const int64_t queries = x.shape[x.shape.size() - 2];
      kernels_.MaskedScaleBackward(dy, Rows(x) / queries, queries, Last(x), attributes.scale, attributes.causal, out);
    } else if (kind == "softmax" || kind == "log_softmax") {
      HEADROOM_ASSIGN_OR_RETURN(const float* y, value(fwd.outputs[0]));
      const Tensor& x = shape(0);
      if (kind == "softmax") {
        kernels_.SoftmaxBackward(y, dy, Rows(x), Last(x), out);
      } else {
        kernels_.LogSoftmaxBackward(y, dy, Rows(x), Last(x), out);
      }
    } else if (kind == "nll_loss") {
      HEADROOM_ASSIGN_OR_RETURN(const float* labels, value(fwd.inputs[1]));
      kernels_.NllLossBackward(reinterpret_cast<const int64_t*>(labels), Rows(shape(0)), Last(shape(0)), out);
    } else if (kind == "layer_norm") {
      const Tensor& x = shape(0);
      HEADROOM_ASSIGN_OR_RETURN(const float* input, value(fwd.inputs[0]));
      HEADROOM_ASSIGN_OR_RETURN(const float* mean, value(fwd.outputs[1]));
      HEADROOM_ASSIGN_OR_RETURN(const float* rstd, value(fwd.outputs[2]));
      if (j == 0) {
        HEADROOM_ASSIGN_OR_RETURN(const float* weight, value(fwd.inputs[1]));
        kernels_.LayerNormInputGrad(input, mean, rstd, weight, dy, Rows(x), Last(x), out);
      } else if (j == 1) {
        kernels_.LayerNormWeightGrad(input, mean, rstd, dy, Rows(x), Last(x), out);
      } else {
        kernels_.BiasGrad(dy, Rows(x), Last(x), out);
      }
    } else if (kind == "gelu") {
      HEADROOM_ASSIGN_OR_RETURN(const float* x, value(fwd.inputs[0]));
      kernels_.GeluBackward(x, dy, Elements(shape(0)), out);
    } else if (kind == "add") {
      kernels_.ReduceBroadcast(dy, dy_elements, Elements(shape(j)), out);
    } else if (kind == "embedding" && j == 1) {
      HEADROOM_ASSIGN_OR_RETURN(const float* ids, value(fwd.inputs[0]));
      kernels_.EmbeddingBackward(reinterpret_cast<const int64_t*>(ids), Elements(shape(0)), dy, Last(shape(1)),
                                 shape(1).shape[0], out);
    } else {
      return Unsupported(fwd);
    }
    return absl::OkStatus();
  };

  // Note [Gradient accumulation] in graph/autograd.cc: a gradient this op
  // creates is written in place (or aliases dy); one that exists already
  // gets this op's contribution added, through a fresh partial tensor
  // unless the contribution is dy itself, and a parameter's into a fresh sum.
  size_t next_partial = 0;
  std::vector<TensorId> partials;
  for (TensorId t : op.outputs) {
    if (scheduled_.tensor(t).grad_of == kNone) partials.push_back(t);
  }
  for (TensorId x : InputsNeedingGrad(fwd, requires_grad_)) {
    const size_t j = static_cast<size_t>(std::find(fwd.inputs.begin(), fwd.inputs.end(), x) - fwd.inputs.begin());
    const auto created = std::find_if(op.outputs.begin(), op.outputs.end(),
                                      [&](TensorId t) { return scheduled_.tensor(t).grad_of == x; });
    const auto existing = std::find_if(op.inputs.begin(), op.inputs.end(),
                                       [&](TensorId t) { return scheduled_.tensor(t).grad_of == x; });
    if (created != op.outputs.end() && existing == op.inputs.end()) {
      if (scheduled_.tensor(*created).view_of != kNone) continue;  // aliases dy
      HEADROOM_RETURN_IF_ERROR(gradient(j, Data(*created)));
      continue;
    }
    if (existing == op.inputs.end()) {
      return absl::InternalError(absl::StrFormat("executor: '%s' finds no gradient of '%s'", op.name,
                                                 in_.step.tensor(x).name));
    }
    const int64_t n = Elements(scheduled_.tensor(*existing));
    if (rule == BackwardRule::kPassThrough && n == dy_elements) {
      kernels_.AddInto(Data(*existing), dy, n);
      continue;
    }
    if (next_partial == partials.size()) {
      return absl::InternalError(absl::StrFormat("executor: '%s' has no partial gradient for '%s'", op.name,
                                                 in_.step.tensor(x).name));
    }
    const TensorId partial = partials[next_partial++];
    HEADROOM_RETURN_IF_ERROR(gradient(j, Data(partial)));
    if (created != op.outputs.end()) {  // a parameter's sum, in a fresh tensor
      kernels_.Add(Data(*existing), n, Data(partial), n, Data(*created));
    } else {
      kernels_.AddInto(Data(*existing), Data(partial), n);
    }
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::RunOptimizer(const Op& op) {
  const TensorId p = op.inputs[0];
  const TensorId g = op.inputs[1];
  const int64_t n = Elements(scheduled_.tensor(p));
  if (options_.record_gradients) {
    gradients_.resize(model_.forward.num_tensors());
    std::vector<float>& copy = gradients_[static_cast<size_t>(p)];
    copy.resize(static_cast<size_t>(n));
    HEADROOM_RETURN_IF_ERROR(device_->CopyToHost(copy.data(), pointer_[static_cast<size_t>(scheduled_.storage(g))],
                                                 copy.size() * sizeof(float)));
  }
  kernels_.SgdMomentum(Data(p), Data(g), reinterpret_cast<float*>(momentum_pointer_[static_cast<size_t>(p)]), n,
                       options_.learning_rate, options_.momentum);
  return absl::OkStatus();
}

// Note [Executor copies]
// Offloads and prefetches run on a copy stream beside compute, as the
// planner prices them (Note [Plan costs] in planner/plan.h). An offload
// waits for the work queued on the compute stream (the tensor's producer),
// copies to the host pool, and marks the device block as used by the copy
// stream, so that the allocator reuses it only once the copy is done (the
// executor frees it right after the offload entry). A prefetch waits for
// compute too (its fresh block may have had another owner), copies into
// the block, and records an event the first reader of the copy makes the
// compute stream wait for. A host copy is freed after its last prefetch has
// completed, polled after every entry and waited for at the step's end.
absl::Status PlanExecutor::Offload(const Op& op) {
  const TensorId t = scheduled_.storage(op.inputs[0]);
  const TensorId value = copy_of_[static_cast<size_t>(t)];
  void*& host = host_copy_[static_cast<size_t>(value)];
  if (host != nullptr) HEADROOM_RETURN_IF_ERROR(host_pool_->Free(std::exchange(host, nullptr)));
  const uint64_t bytes = scheduled_.tensor(t).bytes();
  HEADROOM_ASSIGN_OR_RETURN(host, host_pool_->Allocate(bytes));
  HEADROOM_RETURN_IF_ERROR(CopyStreamWaitsForCompute());
  HEADROOM_RETURN_IF_ERROR(device_->CopyToHostOn(copy_stream_, host, pointer_[static_cast<size_t>(t)], bytes));
  return allocator_->RecordStream(address_[static_cast<size_t>(t)], copy_stream_);
}

absl::Status PlanExecutor::Prefetch(size_t index, const Op& op) {
  const TensorId value = schedule_.entries[index].target;
  const TensorId copy = scheduled_.storage(op.outputs[0]);
  void*& host = host_copy_[static_cast<size_t>(value)];
  if (host == nullptr) {
    return absl::InternalError(absl::StrFormat("executor: prefetch of '%s' finds no host copy",
                                               in_.step.tensor(value).name));
  }
  HEADROOM_RETURN_IF_ERROR(CopyStreamWaitsForCompute());
  HEADROOM_RETURN_IF_ERROR(device_->CopyToDeviceOn(copy_stream_, pointer_[static_cast<size_t>(copy)], host,
                                                   scheduled_.tensor(copy).bytes()));
  HEADROOM_ASSIGN_OR_RETURN(const EventHandle copied, RecordOn(copy_stream_));
  ready_[static_cast<size_t>(copy)] = copied;
  if (last_prefetch_[static_cast<size_t>(value)] == index) {
    HEADROOM_ASSIGN_OR_RETURN(const EventHandle done, RecordOn(copy_stream_));
    host_frees_.emplace_back(std::exchange(host, nullptr), done);
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::CheckParameter(TensorId parameter) const {
  if (parameter < 0 || static_cast<size_t>(parameter) >= model_.forward.num_tensors() ||
      model_.forward.tensor(parameter).role != TensorRole::kParameter) {
    return absl::InvalidArgumentError(absl::StrFormat("executor: tensor %d is not a parameter", parameter));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> PlanExecutor::ParameterValues(TensorId parameter) const {
  HEADROOM_RETURN_IF_ERROR(CheckParameter(parameter));
  std::vector<float> values(model_.forward.tensor(parameter).elements());
  HEADROOM_RETURN_IF_ERROR(
      device_->CopyToHost(values.data(), pointer_[static_cast<size_t>(parameter)], values.size() * sizeof(float)));
  return values;
}

absl::Status PlanExecutor::SetParameterValues(TensorId parameter, std::span<const float> values) {
  HEADROOM_RETURN_IF_ERROR(CheckParameter(parameter));
  const Tensor& t = model_.forward.tensor(parameter);
  if (values.size() != t.elements()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("executor: %d values for '%s' of %d", values.size(), t.name, t.elements()));
  }
  return device_->CopyToDevice(pointer_[static_cast<size_t>(parameter)], values.data(), values.size() * sizeof(float));
}

}  // namespace headroom
