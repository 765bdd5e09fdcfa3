// PyTorch memory snapshot device_traces (see allocation_trace.h).
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "allocator/allocation_trace.h"
#include "common/json_fields.h"
#include "common/status_macros.h"

namespace headroom {

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
      return (path / "action").Error(absl::StrFormat("unknown action '%s'", action));
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
  return trace;
}

}  // namespace headroom
