// PyTorch memory snapshot device_traces (see allocation_trace.h).
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "replay/allocation_trace.h"
#include "common/json_fields.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

// The blocks of `device` still allocated when the snapshot was taken, as
// (address, bytes the client asked for) in snapshot order. Older PyTorch
// omits a block's address: blocks tile their segment from its start.
absl::StatusOr<std::vector<std::pair<uint64_t, uint64_t>>> ActiveBlocks(const nlohmann::json& doc,
                                                                       const JsonPath& root, size_t device) {
  std::vector<std::pair<uint64_t, uint64_t>> active;
  auto segments = doc.find("segments");
  if (segments == doc.end()) return active;
  const JsonPath segments_path = root / "segments";
  if (!segments->is_array()) return segments_path.Error("expected an array of segments");
  for (size_t s = 0; s < segments->size(); ++s) {
    const nlohmann::json& segment = (*segments)[s];
    const JsonPath path = segments_path / s;
    if (!segment.is_object()) return path.Error("expected an object");
    if (segment.contains("device")) {
      HEADROOM_ASSIGN_OR_RETURN(int64_t d, RequireInt(segment, "device", path));
      if (d != static_cast<int64_t>(device)) continue;
    }
    HEADROOM_ASSIGN_OR_RETURN(uint64_t address, RequireUint(segment, "address", path));
    HEADROOM_ASSIGN_OR_RETURN(const nlohmann::json* blocks, RequireField(segment, "blocks", path));
    if (!blocks->is_array()) return (path / "blocks").Error("expected an array of blocks");
    for (size_t b = 0; b < blocks->size(); ++b) {
      const nlohmann::json& block = (*blocks)[b];
      const JsonPath block_path = path / "blocks" / b;
      HEADROOM_ASSIGN_OR_RETURN(uint64_t size, RequireUint(block, "size", block_path));
      HEADROOM_ASSIGN_OR_RETURN(std::string state, RequireString(block, "state", block_path));
      uint64_t block_address = address;
      if (block.contains("address")) {
        HEADROOM_ASSIGN_OR_RETURN(block_address, RequireUint(block, "address", block_path));
      }
      if (state == "active_allocated" || state == "active_pending_free") {
        uint64_t requested = size;
        if (block.contains("requested_size")) {
          HEADROOM_ASSIGN_OR_RETURN(requested, RequireUint(block, "requested_size", block_path));
        }
        active.emplace_back(block_address, requested);
      }
      address = block_address + size;
    }
  }
  return active;
}

// Prepends an allocation for every block the process held before the
// recorded history began (see allocation_trace.h).
void RestoreAllocationsBeforeHistory(AllocationTrace& trace,
                                     const std::vector<std::pair<uint64_t, uint64_t>>& active_at_end) {
  absl::flat_hash_set<uint64_t> seen;  // pointers the history mentions
  absl::flat_hash_set<uint64_t> live;
  std::vector<TraceEvent> before;
  for (const TraceEvent& event : trace.events) {
    if (event.op == TraceOp::kAllocate) {
      live.insert(event.pointer);
    } else if (event.op == TraceOp::kFree && live.erase(event.pointer) == 0 && !seen.contains(event.pointer)) {
      before.push_back({.op = TraceOp::kAllocate, .pointer = event.pointer, .size = event.size,
                        .stream = event.stream, .line = event.line});
    }
    if (event.op != TraceOp::kAllocateFailure) seen.insert(event.pointer);
  }
  for (const auto& [address, size] : active_at_end) {
    if (!seen.contains(address)) before.push_back({.op = TraceOp::kAllocate, .pointer = address, .size = size});
  }
  if (before.empty()) return;
  before.insert(before.end(), trace.events.begin(), trace.events.end());
  trace.events = std::move(before);
}

}  // namespace

absl::StatusOr<AllocationTrace> ParsePyTorchSnapshot(std::string_view text, std::string_view source,
                                                     std::optional<int> device) {
  HEADROOM_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJsonDocument(text, source));
  const JsonPath root(source);
  if (!doc.is_object()) return root.Error("expected a PyTorch memory snapshot object");
  HEADROOM_ASSIGN_OR_RETURN(const nlohmann::json* traces, RequireField(doc, "device_traces", root));
  const JsonPath traces_path = root / "device_traces";
  if (!traces->is_array()) return traces_path.Error("expected an array (one trace per device)");
  size_t chosen = 0;
  if (device.has_value()) {
    if (*device < 0 || static_cast<size_t>(*device) >= traces->size()) {
      return traces_path.Error(absl::StrFormat("no trace for device %d (the snapshot has %d)", *device,
                                               traces->size()));
    }
    chosen = static_cast<size_t>(*device);
  } else {
    for (size_t d = 0; d < traces->size(); ++d) {
      if ((*traces)[d].is_array() && (*traces)[d].size() > (*traces)[chosen].size()) chosen = d;
    }
  }
  AllocationTrace trace{.source = std::string(source), .format = "pytorch-snapshot", .events = {}};
  if (traces->empty()) return trace;
  const nlohmann::json& entries = (*traces)[chosen];
  const JsonPath device_path = traces_path / chosen;
  if (!entries.is_array()) return device_path.Error("expected an array of trace entries");
  absl::flat_hash_set<uint64_t> free_requested;
  for (size_t i = 0; i < entries.size(); ++i) {
    const nlohmann::json& entry = entries[i];
    const JsonPath path = device_path / i;
    if (!entry.is_object()) return path.Error("expected an object");
    HEADROOM_ASSIGN_OR_RETURN(std::string action, RequireString(entry, "action", path));
    TraceEvent event{.line = i};
    if (action == "alloc") {
      event.op = TraceOp::kAllocate;
    } else if (action == "free_requested") {
      event.op = TraceOp::kFree;
    } else if (action == "free_completed") {
      event.op = TraceOp::kFree;
    } else if (action == "oom") {
      event.op = TraceOp::kAllocateFailure;
    } else if (action == "segment_alloc" || action == "segment_free" || action == "segment_map" ||
               action == "segment_unmap" || action == "snapshot") {
      continue;
    } else {
      return (path / "action").Error(absl::StrCat("unknown action ", QuoteForError(action)));
    }
    HEADROOM_ASSIGN_OR_RETURN(event.size, RequireUint(entry, "size", path));
    if (event.op != TraceOp::kAllocateFailure) {
      HEADROOM_ASSIGN_OR_RETURN(event.pointer, RequireUint(entry, "addr", path));
    }
    if (entry.contains("stream")) {
      HEADROOM_ASSIGN_OR_RETURN(int64_t stream, RequireInt(entry, "stream", path));
      event.stream = static_cast<uint64_t>(stream);
    }
    if (entry.contains("time_us")) {
      HEADROOM_ASSIGN_OR_RETURN(uint64_t us, RequireUint(entry, "time_us", path));
      event.time_ns = us * 1000;
    }
    if (action == "free_requested") free_requested.insert(event.pointer);
    if (action == "free_completed") {
      // The client freed at free_requested; free_completed only says when the
      // old allocator could reuse the block.
      if (free_requested.erase(event.pointer) > 0) continue;
    }
    if (action == "alloc") free_requested.erase(event.pointer);
    trace.events.push_back(event);
  }
  HEADROOM_ASSIGN_OR_RETURN(auto active_at_end, ActiveBlocks(doc, root, chosen));
  RestoreAllocationsBeforeHistory(trace, active_at_end);
  return trace;
}

}  // namespace headroom
