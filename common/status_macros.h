// Early-return helpers for absl::Status / absl::StatusOr, as used throughout.
//
//   HEADROOM_RETURN_IF_ERROR(Validate(x));
//   HEADROOM_ASSIGN_OR_RETURN(uint64_t bytes, RequireUint(obj, "size", path));
#ifndef HEADROOM_COMMON_STATUS_MACROS_H_
#define HEADROOM_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define HEADROOM_RETURN_IF_ERROR(expr)              \
  do {                                              \
    const ::absl::Status headroom_status_ = (expr); \
    if (!headroom_status_.ok()) return headroom_status_; \
  } while (0)

#define HEADROOM_STATUS_CONCAT_INNER_(a, b) a##b
#define HEADROOM_STATUS_CONCAT_(a, b) HEADROOM_STATUS_CONCAT_INNER_(a, b)

// `lhs` may be a declaration ("auto x") or an existing lvalue ("gpu.name").
#define HEADROOM_ASSIGN_OR_RETURN(lhs, expr) \
  HEADROOM_ASSIGN_OR_RETURN_IMPL_(HEADROOM_STATUS_CONCAT_(headroom_statusor_, __LINE__), lhs, expr)

#define HEADROOM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = *std::move(statusor)

#endif  // HEADROOM_COMMON_STATUS_MACROS_H_
