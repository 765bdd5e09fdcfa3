// A recorded sequence of allocations and frees, as read from the logs that
// people already have, for replay through the caching allocator
// (trace_replay.h).
//
//   HEADROOM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, kTraceFile));
//   HEADROOM_ASSIGN_OR_RETURN(AllocationTrace trace, ParseAllocationTrace(text, path));
//
// Formats:
//  - RMM logging_resource_adaptor CSV: header `Thread,Time,Action,Pointer,
//    Size,Stream`; actions `allocate`, `free` (newer RMM: `deallocate`) and
//    `allocate failure`; Time either seconds (`1634567890.234567`) or
//    `HH:MM:SS.ffffff` / `HH:MM:SS:ffffff`; Pointer and Stream hex (`0x...`)
//    or decimal.
//  - PyTorch memory snapshot JSON (json.dump(torch.cuda.memory._snapshot())):
//    the `device_traces` of one device; `alloc` -> allocate,
//    `free_requested` -> free (`free_completed` only when no free_requested
//    came first), `oom` -> allocate failure; segment events are the old
//    allocator's own doing and are skipped. The history is usually
//    truncated (_record_memory_history(max_entries=...)), so allocations
//    made before it began are restored at the start of the trace: one for
//    each freed pointer the history never allocated (the free carries its
//    size) and one for each block still active in `segments` that the
//    history never mentions.
// A malformed line is an InvalidArgument error naming the document and the
// line number (CSV) or the JSON path (snapshot).
#ifndef HEADROOM_REPLAY_ALLOCATION_TRACE_H_
#define HEADROOM_REPLAY_ALLOCATION_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/input_file.h"

namespace headroom {

// A trace file's bound, RMM CSV or PyTorch snapshot (Note [Input bounds] in
// common/input_file.h).
inline constexpr InputFileKind kTraceFile{.noun = "a recorded trace", .max_bytes = kMaxRecordingFileBytes};

enum class TraceOp { kAllocate, kFree, kAllocateFailure };

struct TraceEvent {
  TraceOp op = TraceOp::kAllocate;
  uint64_t pointer = 0;  // as recorded: identifies the allocation, not reused as an address
  uint64_t size = 0;     // 0 when the format does not record it for frees
  uint64_t stream = 0;   // as recorded; 0 is the default stream
  uint64_t time_ns = 0;
  size_t line = 0;       // CSV line (1-based) or index in device_traces
};

struct AllocationTrace {
  std::string source;  // file name, for messages
  std::string format;  // "rmm-csv" or "pytorch-snapshot"
  std::vector<TraceEvent> events;
};

absl::StatusOr<AllocationTrace> ParseRmmLog(std::string_view text, std::string_view source);
// `device`: which device's trace; nullopt picks the one with most events.
absl::StatusOr<AllocationTrace> ParsePyTorchSnapshot(std::string_view text, std::string_view source,
                                                     std::optional<int> device = std::nullopt);
// JSON (first non-space byte '{') is a snapshot, anything else RMM CSV.
absl::StatusOr<AllocationTrace> ParseAllocationTrace(std::string_view text, std::string_view source);

}  // namespace headroom

#endif  // HEADROOM_REPLAY_ALLOCATION_TRACE_H_
