#include "report/plan_trace.h"

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

absl::StatusOr<AllocationTrace> PlanAllocationTrace(const Graph& step, const ProfileOptions& options) {
  HEADROOM_RETURN_IF_ERROR(step.CheckBounds());
  AllocationTrace trace{.source = step.name(), .format = "rmm-csv", .events = {}};
  const std::vector<TensorLifetime> life = ComputeLifetimes(step, options);
  // Tensors by the op where their life begins and ends, in TensorId order
  // (counting sort: two passes over the tensors).
  const size_t num_ops = step.num_ops();
  std::vector<uint32_t> begin_at(num_ops + 1, 0), end_at(num_ops + 1, 0);
  std::vector<uint64_t> pointer(step.num_tensors(), 0);
  uint64_t next = kPlanTraceBaseAddress;  // Note [Size bounds]: cannot wrap
  for (const Tensor& t : step.tensors()) {
    const TensorLifetime& l = life[static_cast<size_t>(t.id)];
    if (l.first > l.last) continue;
    ++begin_at[static_cast<size_t>(l.first) + 1];
    ++end_at[static_cast<size_t>(l.last) + 1];
    const uint64_t bytes = t.bytes();
    if (bytes == 0) continue;  // the null pointer
    pointer[static_cast<size_t>(t.id)] = next;
    next += AlignUp(bytes, 512);
  }
  for (size_t i = 0; i < num_ops; ++i) {
    begin_at[i + 1] += begin_at[i];
    end_at[i + 1] += end_at[i];
  }
  std::vector<TensorId> beginning(begin_at[num_ops]), ending(end_at[num_ops]);
  {
    std::vector<uint32_t> b(begin_at.begin(), begin_at.end() - 1), e(end_at.begin(), end_at.end() - 1);
    for (const Tensor& t : step.tensors()) {
      const TensorLifetime& l = life[static_cast<size_t>(t.id)];
      if (l.first > l.last) continue;
      beginning[b[static_cast<size_t>(l.first)]++] = t.id;
      ending[e[static_cast<size_t>(l.last)]++] = t.id;
    }
  }
  // Note [Plan trace order]: at each op, its allocations, then its frees.
  trace.events.reserve(2 * beginning.size());
  auto add = [&](TraceOp op, TensorId id, size_t time) {
    trace.events.push_back({.op = op,
                            .pointer = pointer[static_cast<size_t>(id)],
                            .size = step.tensor(id).bytes(),
                            .stream = 0,
                            .time_ns = time,
                            .line = trace.events.size() + 2});  // the CSV line, after the header
  };
  for (size_t i = 0; i < num_ops; ++i) {
    for (uint32_t k = begin_at[i]; k < begin_at[i + 1]; ++k) add(TraceOp::kAllocate, beginning[k], i);
    for (uint32_t k = end_at[i]; k < end_at[i + 1]; ++k) add(TraceOp::kFree, ending[k], i);
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
