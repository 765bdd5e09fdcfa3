#include "allocator/sources/memory_source.h"

namespace headroom::internal {

void Recount::CountActive(const Block& b, size_t pool_stat) {
  if (b.allocated) {
    for (size_t i : {size_t{kAllPools}, pool_stat}) {
      allocation[i].current += 1;
      allocated_bytes[i].current += static_cast<int64_t>(b.size);
      requested[i].current += static_cast<int64_t>(b.requested_size);
    }
  }
  if (b.is_active()) {
    for (size_t i : {size_t{kAllPools}, pool_stat}) {
      active[i].current += 1;
      active_bytes[i].current += static_cast<int64_t>(b.size);
    }
  }
  pending_events += static_cast<size_t>(b.pending_events);
}

void Recount::CountSegment(size_t pool_stat, uint64_t reserved_bytes) {
  for (size_t i : {size_t{kAllPools}, pool_stat}) {
    segments[i].current += 1;
    reserved[i].current += static_cast<int64_t>(reserved_bytes);
  }
}

Segment* NewSegment(SourceHost& host, PoolStats& stats, DeviceAddress address, uint64_t size, PoolKind kind,
                    StreamHandle stream) {
  auto* segment = new Segment();
  segment->address = address;
  segment->size = size;
  segment->stream = stream;
  segment->pool = kind;
  segment->shard = host.ShardFor(stream);
  Block* block = host.NewBlock(stream);
  block->address = address;
  block->size = size;
  block->stream = stream;
  block->pool = kind;
  block->segment = segment;
  segment->first = block;
  stats.segment.Increase(StatOf(kind), 1);
  return segment;
}

void DeleteSegment(Segment* segment) {
  for (Block* b = segment->first; b != nullptr;) {
    Block* next = b->next;
    delete b;
    b = next;
  }
  delete segment;
}

void ReleaseMappedPages(DeviceBackend& backend, const Segment& segment, uint64_t granularity) {
  for (size_t i = 0; i < segment.pages.size(); ++i) {
    if (segment.pages[i].value == 0) continue;
    (void)backend.Unmap(segment.address + i * granularity, granularity);
    (void)backend.ReleasePhysical(segment.pages[i]);
  }
  (void)backend.ReleaseAddressRange(segment.address, segment.size);
}

}  // namespace headroom::internal
