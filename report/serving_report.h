// `headroom estimate --engine vllm|sglang`: what the engine would hold on each
// GPU and whether it starts (serving/serving_estimate.h), as text and as
// JSON (exact bytes; the fields README's Serving section lists).
#ifndef HEADROOM_REPORT_SERVING_REPORT_H_
#define HEADROOM_REPORT_SERVING_REPORT_H_

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "serving/serving_estimate.h"

namespace headroom {

std::string ServingText(const ServingEstimate& e, const std::vector<ServingFix>& fixes, int64_t wanted_concurrency);
nlohmann::json ServingJson(const ServingEstimate& e, const std::vector<ServingFix>& fixes);

}  // namespace headroom

#endif  // HEADROOM_REPORT_SERVING_REPORT_H_
