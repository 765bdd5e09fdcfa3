// What `headroom estimate` prints: the per-GPU budget by category, the
// verdict, the peak, the limits that fit and the ranked fixes, as text for
// people or as one JSON object with exact bytes for programs (schema in
// README.md, "headroom estimate").
//
//   EstimateReport report{.model = &model, .job = &job, .machine = &machine, .estimate = &e,
//                         .limits = limits, .fixes = fixes, .fix_flags = flags};
//   std::cout << EstimateText(report);
//   std::cout << EstimateJson(report).dump(2) << "\n";
//
// The report knows no command-line syntax of its own: the flags that select
// each fix come from the caller (cli/job_flags.h renders them).
#ifndef HEADROOM_REPORT_ESTIMATE_REPORT_H_
#define HEADROOM_REPORT_ESTIMATE_REPORT_H_

#include <optional>
#include <string>
#include <vector>

#include "estimators/fit_search.h"
#include "estimators/memory_estimate.h"
#include "nlohmann/json.hpp"

namespace headroom {

struct EstimateReport {
  const LoadedModel* model = nullptr;
  const JobSpec* job = nullptr;
  const Machine* machine = nullptr;
  const MemoryEstimate* estimate = nullptr;
  // Absent when the search was skipped.
  std::optional<FitLimits> limits;
  std::vector<Fix> fixes;               // best first
  std::vector<std::string> fix_flags;   // the flags that select fixes[i]
  bool searched = true;                 // limits and fixes were looked for
  bool breakdown = false;               // list the largest tensors live at the peak
};

std::string EstimateText(const EstimateReport& report);
nlohmann::json EstimateJson(const EstimateReport& report);

}  // namespace headroom

#endif  // HEADROOM_REPORT_ESTIMATE_REPORT_H_
