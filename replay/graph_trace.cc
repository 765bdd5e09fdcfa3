#include "replay/graph_trace.h"

#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

uint64_t AlignUp(uint64_t bytes, uint64_t alignment) { return (bytes + alignment - 1) / alignment * alignment; }

std::string_view ActionName(TraceOp op) {
  switch (op) {
    case TraceOp::kAllocate:
      return "allocate";
    case TraceOp::kFree:
      return "free";
    case TraceOp::kAllocateFailure:
      return "allocate failure";
  }
  return "allocate";
}

}  // namespace

GraphEventOrder::GraphEventOrder(const Graph& step, std::span<const TensorLifetime> lifetimes)
    : begin_at_(step.num_ops() + 1, 0), end_at_(step.num_ops() + 1, 0) {
  // Counting sort: two passes over the tensors.
  const size_t num_ops = step.num_ops();
  for (const Tensor& t : step.tensors()) {
    const TensorLifetime& l = lifetimes[static_cast<size_t>(t.id)];
    if (l.first > l.last) continue;
    ++begin_at_[static_cast<size_t>(l.first) + 1];
    ++end_at_[static_cast<size_t>(l.last) + 1];
  }
  for (size_t i = 0; i < num_ops; ++i) {
    begin_at_[i + 1] += begin_at_[i];
    end_at_[i + 1] += end_at_[i];
  }
  beginning_.resize(begin_at_[num_ops]);
  ending_.resize(end_at_[num_ops]);
  std::vector<uint32_t> b(begin_at_.begin(), begin_at_.end() - 1), e(end_at_.begin(), end_at_.end() - 1);
  for (const Tensor& t : step.tensors()) {
    const TensorLifetime& l = lifetimes[static_cast<size_t>(t.id)];
    if (l.first > l.last) continue;
    beginning_[b[static_cast<size_t>(l.first)]++] = t.id;
    ending_[e[static_cast<size_t>(l.last)]++] = t.id;
  }
}

absl::StatusOr<AllocationTrace> PlanAllocationTrace(const Graph& step, const ProfileOptions& options) {
  HEADROOM_RETURN_IF_ERROR(step.CheckBounds());
  AllocationTrace trace{.source = step.name(), .format = "rmm-csv", .events = {}};
  const std::vector<TensorLifetime> life = ComputeLifetimes(step, options);
  const GraphEventOrder order(step, life);
  std::vector<uint64_t> pointer(step.num_tensors(), 0);
  uint64_t next = kPlanTraceBaseAddress;  // Note [Size bounds]: cannot wrap
  for (const Tensor& t : step.tensors()) {
    const TensorLifetime& l = life[static_cast<size_t>(t.id)];
    const uint64_t bytes = t.bytes();
    if (l.first > l.last || bytes == 0) continue;  // a 0-byte tensor: the null pointer
    pointer[static_cast<size_t>(t.id)] = next;
    next += AlignUp(bytes, 512);
  }
  // Note [Plan trace order]: at each op, its allocations, then its frees.
  trace.events.reserve(2 * order.num_allocations());
  auto add = [&](TraceOp op, TensorId id, size_t time) {
    trace.events.push_back({.op = op,
                            .pointer = pointer[static_cast<size_t>(id)],
                            .size = step.tensor(id).bytes(),
                            .stream = 0,
                            .time_ns = time,
                            .line = trace.events.size() + 2});  // the CSV line, after the header
  };
  for (size_t i = 0; i < step.num_ops(); ++i) {
    const auto op = static_cast<OpId>(i);
    for (TensorId id : order.Beginning(op)) add(TraceOp::kAllocate, id, i);
    for (TensorId id : order.Ending(op)) add(TraceOp::kFree, id, i);
  }
  return trace;
}

std::string FormatRmmLog(const AllocationTrace& trace) {
  std::string out = "Thread,Time,Action,Pointer,Size,Stream\n";
  out.reserve(out.size() + 48 * trace.events.size());
  for (const TraceEvent& e : trace.events) {
    absl::StrAppendFormat(&out, "1,%d.%09d,%s,0x%x,%d,0x%x\n", e.time_ns / 1'000'000'000, e.time_ns % 1'000'000'000,
                          ActionName(e.op), e.pointer, e.size, e.stream);
  }
  return out;
}

}  // namespace headroom
