// HEADROOM_ALLOC_CONF: allocator options as a string, in the syntax of
// PyTorch's PYTORCH_CUDA_ALLOC_CONF, so that a tuned PyTorch setting carries
// over unchanged.
//
//   absl::StatusOr<AllocatorOptions> options =
//       ParseAllocConf("expandable_segments:True,max_split_size_mb:512");
//
// Syntax: comma-separated `key:value` pairs; spaces around tokens ignored.
// Keys (PyTorch's unless marked):
//   max_split_size_mb:N             MiB, > 20; blocks this large are never split
//   roundup_power2_divisions:N      N a power of two, or a list
//                                   [256:1,512:2,>:8] (MiB interval start:
//                                   divisions; ">" = every larger interval)
//   garbage_collection_threshold:F  0 < F < 1
//   expandable_segments:True|False
//   backend:native                  (cudaMallocAsync is not supported)
//   memory_fraction:F               Headroom: 0 < F <= 1
//   hard_limit_mb:N                 Headroom: cap on reserved MiB
//   cross_stream_reuse:True|False   Headroom: Note [Cross-stream reuse]
//   history_entries:N               Headroom: trace ring buffer size
//   expandable_page_mb:N            Headroom: large-pool page of expandable
//                                   segments (default 20; small pool: 2)
//   move_free_pages:True|False      Headroom: Note [Moving free pages]
//   move_threshold:R                Headroom: 1 <= R <= 100, growth's room
//   move_threshold_max:R            Headroom: what moves may widen it to
//   unified_pool:True|False         Headroom: Note [One pool]
//   reuse_layout_mb:N               Headroom: N > 2; Note [Reusing a step's
//                                   layout]
//   align_growth:True|False         Headroom: Note [Page-aligned growth]
//   stitch_pages:True|False         Headroom: Note [Stitched blocks]
//   layout_plan:PATH                Headroom: a layout plan file to follow
//                                   (Note [Following a layout plan]); the
//                                   allocator reads it when created. The
//                                   path may not hold a comma.
// An unknown key, a repeated key or a bad value is an InvalidArgument error
// naming the key and the value. The parser is a pure function: only the C ABI
// and the CLI read the environment.
//
// Presets name common settings for `headroom replay --compare`:
//   pytorch-default  (empty string), expandable, max-split-512, power2-4,
//   gc-0.8, and headroom (Headroom's own policy).
//
// Where a user gives the configuration (--alloc-conf, replay's --conf and
// --compare, the C ABI's HEADROOM_ALLOC_CONF), ResolveAllocConf reads it, a
// preset or keys, and its error is the one wording all of them print after
// the name of where the text came from:
//
//   absl::StatusOr<AllocatorOptions> options = ResolveAllocConf(flag_value);
//   if (!options.ok()) {
//     return absl::InvalidArgumentError(absl::StrCat("--alloc-conf ", options.status().message()));
//   }
//   // --alloc-conf 'best-fit': 'best-fit' is not key:value (or a preset: pytorch-default, ...)
#ifndef HEADROOM_ALLOCATOR_ALLOC_CONF_H_
#define HEADROOM_ALLOCATOR_ALLOC_CONF_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/allocator_options.h"

namespace headroom {

absl::StatusOr<AllocatorOptions> ParseAllocConf(std::string_view conf);

// The canonical string for `options` (keys that differ from the defaults, in
// the order listed above); ParseAllocConf(FormatAllocConf(o)) == o.
std::string FormatAllocConf(const AllocatorOptions& options);

struct AllocConfPreset {
  std::string name;
  std::string conf;
};
const std::vector<AllocConfPreset>& AllocConfPresets();

// A preset's conf string if `text` names one, else `text` itself. A preset
// name may lead a list of keys, which follow its own:
// "headroom,layout_plan:t5.plan.json" is the headroom preset with a plan (a
// key the preset sets again is an error, as any repeated key).
std::string ResolveAllocConfPreset(std::string_view text);

// ParseAllocConf(ResolveAllocConfPreset(text_or_preset)). Its error starts
// with the input quoted (QuoteForError), then the parser's reason and the
// presets' names, so that a caller puts only where the text came from in
// front: "'expandable:maybe': unknown key 'expandable' (known: ...) (or a
// preset: pytorch-default, expandable, ...)".
absl::StatusOr<AllocatorOptions> ResolveAllocConf(std::string_view text_or_preset);

}  // namespace headroom

#endif  // HEADROOM_ALLOCATOR_ALLOC_CONF_H_
