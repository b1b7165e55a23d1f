#include "core/error.h"
#include "workloads/loadgen.h"
#include "workloads/micro/micro.h"
#include "workloads/models/models.h"
#include "workloads/workload.h"

namespace ab::workloads {

const std::vector<std::unique_ptr<Workload>>& registry() {
  static const std::vector<std::unique_ptr<Workload>> all = [] {
    std::vector<std::unique_ptr<Workload>> v;
    v.push_back(micro::make_ceilings());
    v.push_back(micro::make_gemm());
    v.push_back(micro::make_stream());
    v.push_back(micro::make_copy());
    v.push_back(make_loadgen());
    v.push_back(micro::make_collectives());
    v.push_back(micro::make_p2p());
    v.push_back(zoo::make_train());
    v.push_back(zoo::make_infer());
    return v;
  }();
  return all;
}

Workload& find_workload(const std::string& name) {
  std::string valid;
  for (const auto& w : registry()) {
    if (w->name() == name) return *w;
    valid += (valid.empty() ? "" : ", ") + w->name();
  }
  throw UsageError("unknown workload '" + name + "'; valid: " + valid);
}

}  // namespace ab::workloads
