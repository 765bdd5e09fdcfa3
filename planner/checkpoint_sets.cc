#include "planner/checkpoint_sets.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace headroom {

absl::StatusOr<std::vector<int>> EveryKLayers(int num_layers, int k) {
  if (num_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_layers must be >= 0, got ", num_layers));
  }
  if (k < 1) return absl::InvalidArgumentError(absl::StrCat("checkpoint interval k must be >= 1, got ", k));
  std::vector<int> layers;
  for (int layer = 0; layer < num_layers; layer += k) layers.push_back(layer);
  return layers;
}

std::vector<int> SqrtCheckpoints(int num_layers) {
  if (num_layers <= 0) return {};
  int k = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(num_layers))));
  return *EveryKLayers(num_layers, k);
}

}  // namespace headroom
