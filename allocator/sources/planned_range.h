// The planned range: the address range of a layout plan, where request n
// goes at the plan's offset for n (Note [Following a layout plan];
// layout_plan.h). Its pages are mapped as live planned blocks touch them and
// kept for the next step.
//
//   PlannedRange planned(context);   // context.options->layout_plan set
//   HEADROOM_ASSIGN_OR_RETURN(Block* block, planned.Allocate(size, stream));
//   if (block == nullptr) ...  // the request departs from the plan, which is over: planned.departure() says why
//   ...  // when its free completes:
//   planned.Release(block);
//
// Invariants (Validate): the live planned blocks lie apart in the range, in
// mapped pages, and count the users of each page; mapped_bytes counts the
// mapped pages, and the page table ends within the pages the plan touched
// (Note [Expandable page table]).
//
// Note [Following a layout plan]
// A training loop of static shapes allocates the same sequence, with the
// same lifetimes, every step after its first few and in every run of the
// job (bench/RESULTS.md), so where each block should go can be worked out
// offline from a recorded run, with every lifetime known
// (LayoutRepeatingSteps in layout/trace_layout.h), and followed at run
// time (Sekiyama et al., "Profile-guided memory optimization for deep
// neural networks", arXiv:1804.10001, 2018, did this for Chainer). With
// AllocatorOptions::layout_plan, the allocator counts the requests of at
// least one byte, and request n goes at the plan's offset for n
// (layout_plan.h) in an address range of the plan's own, reserved at the first
// request, whose pages are mapped when a live planned block first touches
// them; no best fit, split or coalescing. The plan is a hint checked at
// every request: the request must be on the stream of the first one, its
// size rounded to 512 bytes must be the planned size, and the planned range
// must hold no live or pending planned block (a block freed later than in
// the recorded run). The first request that fails a check, or finds no
// address range for the plan (or one past twice the device), ends the plan for good ("departs",
// PlanDeparture() says why): it and every later
// request go to the policy of the other options, and the planned blocks
// still live are freed as usual. So a job that differs from its recording
// (an MoE whose expert batches follow the data, a new batch size) costs a
// few planned blocks, never a wrong one.
//   Pages: a page no live planned block touches stays mapped for the next
// step, which touches it again, so a steady loop maps nothing after its
// first steps and the range holds the plan's extent at most (move_threshold's
// room does not apply: moving pages within a known extent would only map
// them back and forth each step). Where the
// device refuses a new page, one such unused page of the range is unmapped
// (after synchronizing the plan's stream) and mapped where it is needed,
// and failing that the out-of-memory flush (which also releases them)
// runs; so the smallest device the plan runs on is the most pages its live
// blocks touch at once. Requests take the exclusive lock while the plan is
// followed, as does the free of a planned block: a planned loop trades the
// fast path of Note [Stream shards] for memory.
#ifndef HEADROOM_ALLOCATOR_SOURCES_PLANNED_RANGE_H_
#define HEADROOM_ALLOCATOR_SOURCES_PLANNED_RANGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/snapshot.h"
#include "allocator/sources/memory_source.h"

namespace headroom::internal {

class PlannedRange : MemorySource {
 public:
  explicit PlannedRange(const SourceContext& context) : MemorySource(context) {}
  PlannedRange(const PlannedRange&) = delete;
  PlannedRange& operator=(const PlannedRange&) = delete;

  // The planned block for the next request, handed out, or nullptr where the
  // request departs from the plan (which ends it: departure() says why); an
  // error where the device has no memory for its pages.
  absl::StatusOr<Block*> Allocate(uint64_t size, StreamHandle stream);
  // When the free of a planned block completes: its range is no longer used.
  void Release(Block* block);
  // Unmaps and releases the range's pages that no live block touches.
  absl::Status ReleaseUnusedPages();
  // Returns the range's reservation once nothing lives or is mapped in it
  // (EmptyCache, after a departure).
  absl::Status ReleaseIdleRange();

  // Why the job left its plan, at which request; empty while it follows one.
  const std::string& departure() const { return departure_; }
  // Whether the range holds `address`.
  bool Contains(DeviceAddress address) const;
  // One snapshot segment per run of mapped pages, as for expandable segments.
  void AddToSnapshot(AllocatorSnapshot& snapshot) const;
  // The largest run of mapped bytes of the range no live block uses.
  uint64_t LargestFreeRun() const;
  absl::Status Validate(Recount& recount) const;
  // Unmaps and releases the range and deletes the live blocks (teardown).
  void Teardown();

 private:
  // Ends the plan for `reason`; returns nullptr for Allocate.
  Block* Depart(std::string reason);
  // Reserves the plan's range of `bytes` (its extent in whole pages) for `stream`'s requests.
  absl::Status ReserveRange(StreamHandle stream, uint64_t bytes);
  // Maps page `page` of the range for a request of pages [first, last]: a
  // new page, else an unused one of the range (outside those) moved there;
  // ResourceExhausted when neither is to be had.
  absl::Status MapPage(uint64_t page, uint64_t first, uint64_t last);
  // A new physical page counted in reserved bytes (within the memory limit:
  // the LimitingBackend refuses one past it).
  absl::StatusOr<PhysicalHandle> CreatePage();
  // Unmaps the mapped page `page`, which no live planned block touches,
  // first synchronizing the plan's stream unless `synchronized`; returns its
  // handle, still counted in reserved bytes.
  absl::StatusOr<PhysicalHandle> UnmapPage(uint64_t page, bool synchronized = false);
  // The first and last page of the range that [address, address + size) touches.
  std::pair<uint64_t, uint64_t> PagesOf(DeviceAddress address, uint64_t size) const;

  // Reserved at the first planned request, for the plan's extent; pages as
  // in an expandable segment (its table up to the highest page mapped), the
  // stream the plan's. In no segment map.
  std::unique_ptr<Segment> segment_;
  std::vector<uint32_t> users_;                  // live planned blocks touching each page, up to the highest touched
  absl::btree_map<DeviceAddress, Block*> live_;  // allocated or pending planned blocks
  uint64_t requests_ = 0;                        // requests the plan served
  std::string departure_;                        // empty while the plan is followed
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_SOURCES_PLANNED_RANGE_H_
