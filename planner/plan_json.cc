#include "planner/plan_json.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "common/json_fields.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace headroom {
namespace {

constexpr std::string_view kFormat = "headroom-plan";

// FNV-1a over the bytes of each value.
class Fnv {
 public:
  void Add(std::string_view bytes) {
    for (char c : bytes) {
      hash_ ^= static_cast<uint8_t>(c);
      hash_ *= 1099511628211ULL;
    }
    hash_ ^= 0xff;  // separates consecutive values
    hash_ *= 1099511628211ULL;
  }
  void Add(uint64_t v) { Add(std::string_view(reinterpret_cast<const char*>(&v), sizeof v)); }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 14695981039346656037ULL;
};

}  // namespace

std::string StepFingerprint(const Graph& step) {
  Fnv h;
  for (const Op& op : step.ops()) {
    h.Add(op.kind);
    h.Add(op.name);
    h.Add(static_cast<uint64_t>(op.inputs.size()));
    h.Add(static_cast<uint64_t>(op.outputs.size()));
  }
  for (const Tensor& t : step.tensors()) h.Add(t.bytes());
  return absl::StrFormat("%016x", h.value());
}

nlohmann::json PlanFileToJson(const PlanFile& file) {
  nlohmann::json schedule = nlohmann::json::array();
  for (const ScheduleEntry& e : file.schedule.entries) {
    schedule.push_back(nlohmann::json::array({std::string(ScheduleActionName(e.action)), e.target}));
  }
  nlohmann::json out = {{"format", kFormat},
          {"version", kPlanFileVersion},
          {"model", file.model},
          {"strategy", file.strategy},
          {"budget_bytes", file.budget_bytes},
          {"step",
           {{"name", file.step_name},
            {"ops", file.step_ops},
            {"tensors", file.step_tensors},
            {"fingerprint", file.fingerprint}}},
          {"schedule", std::move(schedule)}};
  if (!file.tensors.empty()) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const PlanTensor& t : file.tensors) {
      tensors.push_back(nlohmann::json::array({t.name, t.bytes, t.first, t.last, t.offset}));
    }
    out["tensors"] = std::move(tensors);
  }
  return out;
}

absl::StatusOr<PlanFile> ParsePlanFile(std::string_view text, std::string_view origin) {
  HEADROOM_ASSIGN_OR_RETURN(const nlohmann::json doc, ParseJsonDocument(text, origin));
  return ParsePlanDocument(doc, origin);
}

absl::StatusOr<PlanFile> ParsePlanDocument(const nlohmann::json& doc, std::string_view origin) {
  const JsonPath root(origin);
  if (!doc.is_object()) return root.Error(absl::StrFormat("expected an object, got %s", JsonTypeName(doc)));
  HEADROOM_ASSIGN_OR_RETURN(std::string format, RequireString(doc, "format", root));
  if (format != kFormat) {
    return (root / "format").Error(absl::StrFormat("expected \"%s\", got %s", kFormat, QuoteForError(format)));
  }
  HEADROOM_ASSIGN_OR_RETURN(int64_t version, RequireInt(doc, "version", root));
  if (version < 1 || version > kPlanFileVersion) {
    return (root / "version")
        .Error(absl::StrFormat("version %d is not one this Headroom reads (1 to %d)", version, kPlanFileVersion));
  }
  PlanFile file;
  HEADROOM_ASSIGN_OR_RETURN(file.model, RequireString(doc, "model", root));
  HEADROOM_ASSIGN_OR_RETURN(file.strategy, RequireString(doc, "strategy", root));
  HEADROOM_ASSIGN_OR_RETURN(file.budget_bytes, RequireUint(doc, "budget_bytes", root));
  HEADROOM_ASSIGN_OR_RETURN(const nlohmann::json* step, RequireField(doc, "step", root));
  const JsonPath step_path = root / "step";
  if (!step->is_object()) return step_path.Error(absl::StrFormat("expected an object, got %s", JsonTypeName(*step)));
  HEADROOM_ASSIGN_OR_RETURN(file.step_name, RequireString(*step, "name", step_path));
  HEADROOM_ASSIGN_OR_RETURN(file.step_ops, RequireUint(*step, "ops", step_path));
  HEADROOM_ASSIGN_OR_RETURN(file.step_tensors, RequireUint(*step, "tensors", step_path));
  HEADROOM_ASSIGN_OR_RETURN(file.fingerprint, RequireString(*step, "fingerprint", step_path));
  HEADROOM_ASSIGN_OR_RETURN(const nlohmann::json* schedule, RequireField(doc, "schedule", root));
  const JsonPath schedule_path = root / "schedule";
  if (!schedule->is_array()) {
    return schedule_path.Error(absl::StrFormat("expected an array, got %s", JsonTypeName(*schedule)));
  }
  file.schedule.entries.reserve(schedule->size());
  for (size_t i = 0; i < schedule->size(); ++i) {
    const nlohmann::json& entry = (*schedule)[i];
    const JsonPath at = schedule_path / i;
    if (!entry.is_array() || entry.size() != 2) {
      return at.Error("expected [action, target]");
    }
    HEADROOM_ASSIGN_OR_RETURN(std::string action_name, AsString(entry[0], at / 0));
    absl::StatusOr<ScheduleAction> action = ParseScheduleAction(action_name);
    if (!action.ok()) return (at / 0).Error(std::string(action.status().message()));
    HEADROOM_ASSIGN_OR_RETURN(int64_t target, AsInt(entry[1], at / 1));
    if (target < 0 || target > INT32_MAX) {
      return (at / 1).Error(absl::StrFormat("target %d is not an op or tensor id", target));
    }
    file.schedule.entries.push_back({*action, static_cast<int32_t>(target)});
  }
  return file;
}

absl::Status CheckPlanMatchesStep(const PlanFile& file, const Graph& step, std::string_view origin) {
  const std::string fingerprint = StepFingerprint(step);
  if (file.step_ops != step.num_ops() || file.step_tensors != step.num_tensors() || file.fingerprint != fingerprint) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the plan is for a step of %d ops and %d tensors (fingerprint %s), but --model and the job flags "
        "give one of %d ops and %d tensors (%s); plan again or pass the flags it was planned with",
        origin, file.step_ops, file.step_tensors, EscapeForError(file.fingerprint), step.num_ops(),
        step.num_tensors(), fingerprint));
  }
  return absl::OkStatus();
}

}  // namespace headroom
