// Reading an input file (a model, graph, plan, catalog, fixture or trace)
// whole into memory, refusing what is not a regular file or is larger than
// its kind of input may be.
//
//   HEADROOM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, kPlanFile));
//   // error: "big.json: 300000000 bytes is more than the 256.00 MiB a plan file may have"
//
// Each kind is declared beside its parser (kPlanFile in planner/plan_json.h,
// kTraceFile in replay/allocation_trace.h, ...) with one of the bounds below.
#ifndef HEADROOM_COMMON_INPUT_FILE_H_
#define HEADROOM_COMMON_INPUT_FILE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace headroom {

// Note [Input bounds]
// Every input file is read whole into memory and, being JSON but for RMM's
// CSV, parsed into a document that takes more memory than its text. Nesting,
// which costs the most, is refused past kMaxJsonDepth levels (Note [JSON
// nesting bound] in json_document.cc); within it, the costliest document is
// a flat array of empty objects, which takes about 28 times its text (a 50 MB
// file of `[{},{},...]`: 1.37 GB at its peak, the text included). So each
// kind of input has a size bound, set from what its largest real files need
// with ample room, and reading and parsing one takes at most about 28 times
// its kind's bound:
//  - kMaxRecordingFileBytes, 1 GiB: recorded traces (RMM CSV, PyTorch
//    snapshots) and the layout plans made from them, which grow with a run's
//    allocations: a snapshot with stack frames reaches hundreds of MB (the
//    bundled ones are at most 2 MB), and a plan of LayoutPlan::kMaxBlocks
//    blocks up to 772 MB;
//  - kMaxDocumentFileBytes, 256 MiB: model files (config.json, graph JSON,
//    node-link graphs), plan files and validation fixtures: the largest
//    published node-link graphs are a few MiB, a plan file is smaller than
//    the graph of its step (gpt2: 91 KB, its graph 253 KB), and a fixture
//    embeds at most one model document (the bundled ones are at most 2.2 MB);
//  - kMaxSmallFileBytes, 16 MiB: GPU catalogs (the built-in one is 15 KB)
//    and a recorded run's steps files (a few hundred bytes: one number per step).
inline constexpr uint64_t kMaxRecordingFileBytes = uint64_t{1} << 30;
inline constexpr uint64_t kMaxDocumentFileBytes = uint64_t{256} << 20;
inline constexpr uint64_t kMaxSmallFileBytes = uint64_t{16} << 20;

// A kind of input file: what the size error calls it, and its bound.
struct InputFileKind {
  std::string_view noun;  // "a plan file", as in "... the 256.00 MiB a plan file may have"
  uint64_t max_bytes = 0;
};

// Reads a whole regular file of at most `kind.max_bytes`. Errors name the
// path: NotFound when it does not exist or cannot be opened,
// InvalidArgument when it is a directory ("is a directory"), not a regular
// file ("is not a regular file": a FIFO, socket or device, which is never
// opened, so a FIFO with no writer cannot block) or too large (naming the
// kind and its bound), ResourceExhausted when memory for the text ran out.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, const InputFileKind& kind);

}  // namespace headroom

#endif  // HEADROOM_COMMON_INPUT_FILE_H_
