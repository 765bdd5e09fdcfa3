#include "job/optimizer.h"

#include "common/name_table.h"

namespace headroom {
namespace {

constexpr NameTable<Optimizer, 8> kOptimizerNames("optimizer", {{
    {"adamw", Optimizer::kAdamW},
    {"adam8bit", Optimizer::kAdam8bit},
    {"sgd-momentum", Optimizer::kSgdMomentum},
    {"sgd", Optimizer::kSgd},
    {"adafactor", Optimizer::kAdafactor},
    {"lion", Optimizer::kLion},
    {"adam", Optimizer::kAdamW, kAlias},
    {"adamw-8bit", Optimizer::kAdam8bit, kAlias},
}});

constexpr NameTable<OptimizerImpl, 5> kOptimizerImplNames("optimizer implementation", {{
    {"foreach", OptimizerImpl::kForeach},
    {"for-loop", OptimizerImpl::kForLoop},
    {"fused", OptimizerImpl::kFused},
    {"single-tensor", OptimizerImpl::kForLoop, kAlias},
    {"loop", OptimizerImpl::kForLoop, kAlias},
}});

constexpr NameTable<EmaPlacement, 3> kEmaPlacementNames("EMA placement", {{
    {"none", EmaPlacement::kOff},
    {"gpu", EmaPlacement::kGpu},
    {"cpu", EmaPlacement::kCpu},
}});

}  // namespace

std::string_view OptimizerName(Optimizer optimizer) { return kOptimizerNames.Name(optimizer); }
absl::StatusOr<Optimizer> ParseOptimizer(std::string_view name) { return kOptimizerNames.Parse(name); }

std::string_view OptimizerImplName(OptimizerImpl impl) { return kOptimizerImplNames.Name(impl); }
absl::StatusOr<OptimizerImpl> ParseOptimizerImpl(std::string_view name) {
  return kOptimizerImplNames.Parse(name);
}

std::string_view EmaPlacementName(EmaPlacement placement) { return kEmaPlacementNames.Name(placement); }
absl::StatusOr<EmaPlacement> ParseEmaPlacement(std::string_view name) { return kEmaPlacementNames.Parse(name); }

}  // namespace headroom
