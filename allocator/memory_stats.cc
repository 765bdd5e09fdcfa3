#include "allocator/memory_stats.h"

#include <cstdio>

#include "absl/strings/str_format.h"
#include "common/text_table.h"
#include "common/units.h"

namespace headroom {
namespace {

constexpr std::array<const char*, kStatIndexCount> kPoolNames = {"all", "small_pool", "large_pool"};

void AddStat(nlohmann::json& out, const std::string& prefix, const Stat& stat) {
  out[prefix + ".current"] = stat.current;
  out[prefix + ".peak"] = stat.peak;
  out[prefix + ".allocated"] = stat.allocated;
  out[prefix + ".freed"] = stat.freed;
}

void AddArray(nlohmann::json& out, const std::string& name, const StatArray& array) {
  for (size_t i = 0; i < kStatIndexCount; ++i) AddStat(out, name + "." + kPoolNames[i], array[i]);
}

std::string Bytes(int64_t value) { return value < 0 ? FormatSignedBytes(value) : FormatBytes(static_cast<uint64_t>(value)); }

}  // namespace

nlohmann::json MemoryStatsToJson(const MemoryStats& stats) {
  nlohmann::json out = nlohmann::json::object();
  AddArray(out, "allocation", stats.allocation);
  AddArray(out, "segment", stats.segment);
  AddArray(out, "active", stats.active);
  AddArray(out, "inactive_split", stats.inactive_split);
  AddArray(out, "allocated_bytes", stats.allocated_bytes);
  AddArray(out, "reserved_bytes", stats.reserved_bytes);
  AddArray(out, "active_bytes", stats.active_bytes);
  AddArray(out, "inactive_split_bytes", stats.inactive_split_bytes);
  AddArray(out, "requested_bytes", stats.requested_bytes);
  AddStat(out, "oversize_allocations", stats.oversize_allocations);
  AddStat(out, "oversize_segments", stats.oversize_segments);
  out["num_alloc_retries"] = stats.num_alloc_retries;
  out["num_ooms"] = stats.num_ooms;
  out["num_sync_all_streams"] = stats.num_sync_all_streams;
  out["num_device_alloc"] = stats.num_device_alloc;
  out["num_device_free"] = stats.num_device_free;
  out["num_pages_mapped"] = stats.num_pages_mapped;
  out["num_pages_unmapped"] = stats.num_pages_unmapped;
  out["num_stitched_blocks"] = stats.num_stitched_blocks;
  out["num_planned_allocs"] = stats.num_planned_allocs;
  out["max_split_size"] = stats.max_split_size;
  out["largest_free_block_bytes"] = stats.largest_free_block_bytes;
  out["total_free_bytes"] = stats.total_free_bytes;
  out["external_fragmentation"] = stats.external_fragmentation;
  out["reserved_bytes_at_peak_allocated"] = stats.reserved_bytes_at_peak_allocated;
  out["reserved_to_allocated_at_peak"] = stats.reserved_to_allocated_at_peak;
  return out;
}

std::string MemorySummary(const MemoryStats& stats) {
  TextTable table({"metric", "pool", "current", "peak", "allocated", "freed"},
                  {Align::kLeft, Align::kLeft, Align::kRight, Align::kRight, Align::kRight, Align::kRight});
  auto bytes_rows = [&](const char* name, const StatArray& array) {
    for (size_t i = 0; i < kStatIndexCount; ++i) {
      const Stat& s = array[i];
      table.AddRow({i == 0 ? name : "", kPoolNames[i], Bytes(s.current), Bytes(s.peak), Bytes(s.allocated),
                    Bytes(s.freed)});
    }
    table.AddSeparator();
  };
  auto count_rows = [&](const char* name, const StatArray& array) {
    for (size_t i = 0; i < kStatIndexCount; ++i) {
      const Stat& s = array[i];
      table.AddRow({i == 0 ? name : "", kPoolNames[i], absl::StrFormat("%d", s.current),
                    absl::StrFormat("%d", s.peak), absl::StrFormat("%d", s.allocated),
                    absl::StrFormat("%d", s.freed)});
    }
    table.AddSeparator();
  };
  bytes_rows("allocated memory", stats.allocated_bytes);
  bytes_rows("active memory", stats.active_bytes);
  bytes_rows("requested memory", stats.requested_bytes);
  bytes_rows("reserved memory", stats.reserved_bytes);
  bytes_rows("non-releasable memory", stats.inactive_split_bytes);
  count_rows("allocations", stats.allocation);
  count_rows("active allocs", stats.active);
  count_rows("reserved segments", stats.segment);
  count_rows("non-releasable allocs", stats.inactive_split);
  std::string out = table.Render();
  out += absl::StrFormat(
      "device allocs: %d  device frees: %d  alloc retries: %d  OOMs: %d  cache flushes: %d\n"
      "largest free block: %s  free in cache: %s  external fragmentation: %.3f\n"
      "reserved at peak allocated: %s (%.3fx the peak)\n",
      stats.num_device_alloc, stats.num_device_free, stats.num_alloc_retries, stats.num_ooms,
      stats.num_sync_all_streams, FormatBytes(stats.largest_free_block_bytes), FormatBytes(stats.total_free_bytes),
      stats.external_fragmentation, Bytes(stats.reserved_bytes_at_peak_allocated),
      stats.reserved_to_allocated_at_peak);
  return out;
}

}  // namespace headroom
