#include "estimators/optimizer_state.h"

#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace headroom {
namespace {

constexpr std::pair<std::string_view, Optimizer> kNames[] = {
    {"adamw", Optimizer::kAdamW},          {"adam", Optimizer::kAdamW},
    {"adam8bit", Optimizer::kAdam8bit},    {"adamw-8bit", Optimizer::kAdam8bit},
    {"sgd-momentum", Optimizer::kSgdMomentum}, {"sgd", Optimizer::kSgd},
    {"adafactor", Optimizer::kAdafactor},  {"lion", Optimizer::kLion},
};

}  // namespace

std::string_view OptimizerName(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kAdamW: return "adamw";
    case Optimizer::kAdam8bit: return "adam8bit";
    case Optimizer::kSgdMomentum: return "sgd-momentum";
    case Optimizer::kSgd: return "sgd";
    case Optimizer::kAdafactor: return "adafactor";
    case Optimizer::kLion: return "lion";
  }
  return "unknown";
}

absl::StatusOr<Optimizer> ParseOptimizer(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  for (const auto& [n, optimizer] : kNames) {
    if (n == lower) return optimizer;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown optimizer '%s' (expected adamw, adam8bit, sgd-momentum, sgd, adafactor or lion)", name));
}

uint64_t OptimizerStateBytesPerParam(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kAdamW: return 8;
    case Optimizer::kAdam8bit: return 2;
    case Optimizer::kSgdMomentum: return 4;
    case Optimizer::kSgd: return 0;
    case Optimizer::kAdafactor: return 4;
    case Optimizer::kLion: return 4;
  }
  return 0;
}

uint64_t AdafactorStateBytes(uint64_t rows, uint64_t cols) {
  if (rows <= 1 || cols <= 1) return 4 * rows * cols;
  return 4 * (rows + cols);
}

}  // namespace headroom
