// Levenshtein distance, for "did you mean" suggestions on unknown names.
//
//   EditDistance("h100-80g", "h100-80gb") -> 1
#ifndef HEADROOM_COMMON_EDIT_DISTANCE_H_
#define HEADROOM_COMMON_EDIT_DISTANCE_H_

#include <cstddef>
#include <string_view>

namespace headroom {

// Insertions, deletions and substitutions that turn `a` into `b`.
size_t EditDistance(std::string_view a, std::string_view b);

}  // namespace headroom

#endif  // HEADROOM_COMMON_EDIT_DISTANCE_H_
