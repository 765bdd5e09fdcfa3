// What `headroom gpus` prints: the catalog as a table (one line per GPU),
// one GPU in full with its aliases and sources, or either as JSON in the
// catalog file's own schema.
//
//   std::cout << GpuTableText(GpuCatalog::Builtin());
//   std::cout << GpuText(**GpuCatalog::Builtin().Find("h100"));
//   std::cout << GpuCatalogJson(GpuCatalog::Builtin()).dump(2) << "\n";
#ifndef HEADROOM_REPORT_GPU_REPORT_H_
#define HEADROOM_REPORT_GPU_REPORT_H_

#include <string>

#include "hardware/gpu_catalog.h"
#include "nlohmann/json.hpp"

namespace headroom {

std::string GpuTableText(const GpuCatalog& catalog);
std::string GpuText(const GpuSpec& gpu);
// {"schema_version": 1, "gpus": [...]}; one GPU alone is GpuSpecToJson(gpu).
nlohmann::json GpuCatalogJson(const GpuCatalog& catalog);

}  // namespace headroom

#endif  // HEADROOM_REPORT_GPU_REPORT_H_
