// Building the allocator (the options' checks) and tearing it down.
#include <algorithm>
#include <atomic>
#include <bit>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {
namespace {

std::atomic<uint64_t> next_allocator_id{1};

}  // namespace

absl::StatusOr<std::unique_ptr<CachingAllocator>> CachingAllocator::Create(DeviceBackend* backend,
                                                                          AllocatorOptions options) {
  if (backend == nullptr) return absl::InvalidArgumentError("caching allocator: no device backend");
  if (!(options.memory_fraction > 0.0 && options.memory_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("caching allocator: memory_fraction %g is not in (0, 1]", options.memory_fraction));
  }
  if (!(options.garbage_collection_threshold >= 0.0 && options.garbage_collection_threshold < 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "caching allocator: garbage_collection_threshold %g is not in [0, 1)", options.garbage_collection_threshold));
  }
  if (options.max_split_size != kUnlimitedSplitSize && options.max_split_size <= kLargeBuffer) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "caching allocator: max_split_size %s must be larger than %s", FormatBytes(options.max_split_size),
        FormatBytes(kLargeBuffer)));
  }
  std::vector<uint32_t> all_divisions = options.rounding.divisions_by_mib_interval;
  all_divisions.push_back(options.rounding.power2_divisions);
  for (uint32_t divisions : all_divisions) {
    if (divisions > 1 && !std::has_single_bit(divisions)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("caching allocator: power2 divisions %d is not a power of two", divisions));
    }
  }
  if (options.expandable_small_page_bytes == 0 || options.expandable_large_page_bytes == 0) {
    return absl::InvalidArgumentError("caching allocator: expandable segment pages must not be empty");
  }
  const DeviceProperties& props = backend->properties();
  // The options that act on expandable segments, and what each does there.
  for (const auto& [set, name, what] :
       {std::tuple{options.move_free_pages, "move_free_pages", "moves pages of expandable segments"},
        std::tuple{options.unified_pool, "unified_pool", "serves small requests from the large pool's expandable "
                                                         "segment"},
        std::tuple{options.align_growth, "align_growth", "aligns the growth of expandable segments"},
        std::tuple{options.stitch_pages, "stitch_pages", "maps pages of expandable segments again"}}) {
    if (set && !options.expandable_segments) {
      return absl::InvalidArgumentError(
          absl::StrFormat("caching allocator: %s %s; set expandable_segments too", name, what));
    }
  }
  if (options.move_threshold != 1.0 && !options.move_free_pages) {
    return absl::InvalidArgumentError("caching allocator: move_threshold bounds move_free_pages; set it too");
  }
  if (options.move_threshold_max != 1.0 && !options.move_free_pages) {
    return absl::InvalidArgumentError("caching allocator: move_threshold_max bounds move_free_pages; set it too");
  }
  if (options.move_threshold_max != 1.0 && !(options.move_threshold_max >= options.move_threshold)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "caching allocator: move_threshold_max %g is below move_threshold %g (the room only widens)",
        options.move_threshold_max, options.move_threshold));
  }
  if (!(options.move_threshold >= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("caching allocator: move_threshold %g is below 1 (reserved bytes never go below allocated "
                        "ones)", options.move_threshold));
  }
  static_assert(kReuseLayoutAbove >= BlockPool::kBinnedMax, "a remembered range is searched among unbinned blocks");
  if (options.reuse_layout_min_bytes != 0 && options.reuse_layout_min_bytes <= kReuseLayoutAbove) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "caching allocator: reuse_layout_min_bytes %s must be 0 or above %s",
        FormatBytes(options.reuse_layout_min_bytes), FormatBytes(kReuseLayoutAbove)));
  }
  if (options.layout_plan == nullptr && !options.layout_plan_file.empty()) {
    absl::StatusOr<LayoutPlan> plan = ReadLayoutPlanFile(options.layout_plan_file);
    if (!plan.ok()) {
      return absl::Status(plan.status().code(),
                          absl::StrCat("caching allocator: layout_plan: ", plan.status().message()));
    }
    options.layout_plan = std::make_shared<const LayoutPlan>(*std::move(plan));
  }
  if (options.layout_plan != nullptr) {
    HEADROOM_RETURN_IF_ERROR(CheckLayoutPlan(*options.layout_plan, "caching allocator: layout_plan"));
    if (!props.supports_virtual_memory) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "caching allocator: a layout plan maps pages with the virtual memory API, which device '%s' lacks",
          props.name));
    }
  }
  if (options.expandable_segments && !props.supports_virtual_memory) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "caching allocator: expandable_segments needs the virtual memory API, which device '%s' lacks", props.name));
  }
  if (props.total_bytes == 0 || props.map_granularity == 0 || props.map_granularity % kMinBlockSize != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("caching allocator: device '%s' reports no memory or a bad granularity", props.name));
  }
  return std::unique_ptr<CachingAllocator>(new CachingAllocator(backend, options));
}

CachingAllocator::CachingAllocator(DeviceBackend* backend, AllocatorOptions options)
    : device_(backend),
      limits_(backend, {.memory_fraction = options.memory_fraction, .hard_limit_bytes = options.hard_limit_bytes}),
      backend_(&limits_),
      options_(options),
      granularity_(backend->properties().map_granularity),
      total_bytes_(backend->properties().total_bytes),
      id_(next_allocator_id.fetch_add(1)),
      following_plan_(options.layout_plan != nullptr),
      history_(options.history_entries),
      classic_(MakeSourceContext()),
      expandable_(MakeSourceContext()),
      stitched_(MakeSourceContext(), &expandable_),
      planned_(MakeSourceContext()) {}

internal::SourceContext CachingAllocator::MakeSourceContext() {
  return {.host = this,
          .backend = backend_,
          .limits = &limits_,
          .options = &options_,
          .stats = &stats_,
          .granularity = granularity_,
          .total_bytes = total_bytes_};
}

CachingAllocator::~CachingAllocator() {
  internal::MutexLock lock(&mu_);
  for (StreamShard* shard : shard_list_) {
    shard->small_pool.Clear();  // the pools link blocks deleted below
    shard->large_pool.Clear();
  }
  // Teardown: best effort, errors have nowhere to go. Second mappings first, so that their pages can be released.
  stitched_.UnmapAll();
  for (const PendingFree& pending : pending_frees_) free_events_.push_back(pending.event);
  for (EventHandle event : free_events_) (void)backend_->DestroyEvent(event);
  for (const UnreleasedPage& page : unreleased_pages_) (void)backend_->ReleasePhysical(page.handle);
  for (Segment* segment : SegmentsByAddress()) {
    if (segment->expandable) {
      expandable_.Teardown(segment);
    } else {
      classic_.Teardown(segment);
    }
  }
  planned_.Teardown();  // Note [Following a layout plan]
  for (StreamShard* shard : shard_list_) delete shard;
}

std::vector<CachingAllocator::Segment*> CachingAllocator::SegmentsByAddress() const {
  std::vector<Segment*> segments;
  classic_.ForEachSegment([&](Segment* segment) { segments.push_back(segment); });
  const auto classic = static_cast<std::ptrdiff_t>(segments.size());
  expandable_.ForEachSegment([&](Segment* segment) { segments.push_back(segment); });
  std::inplace_merge(segments.begin(), segments.begin() + classic, segments.end(),
                     [](const Segment* a, const Segment* b) { return a->address < b->address; });
  return segments;
}

}  // namespace headroom
