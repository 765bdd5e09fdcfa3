// Which layers of a chain keep their activations when the rest recompute.
//
// Chen et al. 2016 ("Training Deep Nets with Sublinear Memory Cost") keep one
// boundary every ~sqrt(n) layers of an n-layer chain, so that at most
// O(sqrt(n)) boundaries plus one segment's activations are live at a time.
//
//   EveryKLayers(8, 3)      -> {0, 3, 6}
//   SqrtCheckpoints(16)     -> {0, 4, 8, 12}
//
// The result lists the layers whose *inputs* are stored; every other layer's
// activations are recomputed from the preceding stored input during backward.
#ifndef HEADROOM_PLANNER_CHECKPOINT_SETS_H_
#define HEADROOM_PLANNER_CHECKPOINT_SETS_H_

#include <vector>

#include "absl/status/statusor.h"

namespace headroom {

// Layers 0, k, 2k, ... below num_layers. k must be >= 1 and num_layers >= 0.
absl::StatusOr<std::vector<int>> EveryKLayers(int num_layers, int k);

// EveryKLayers with k = ceil(sqrt(num_layers)), the segment length that
// balances stored boundaries against one segment's recomputed activations.
std::vector<int> SqrtCheckpoints(int num_layers);

}  // namespace headroom

#endif  // HEADROOM_PLANNER_CHECKPOINT_SETS_H_
