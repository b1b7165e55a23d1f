#include "workloads/registry.h"

#include "workloads/loadgen.h"
#include "workloads/micro/micro.h"
#include "workloads/models/models.h"

namespace ab::workloads {

const harness::Registry& registry() {
  static const harness::Registry all = [] {
    std::vector<std::unique_ptr<Workload>> v;
    v.push_back(micro::make_ceilings());
    v.push_back(micro::make_gemm());
    v.push_back(micro::make_stream());
    v.push_back(micro::make_copy());
    v.push_back(micro::make_conv());
    v.push_back(make_loadgen());
    v.push_back(micro::make_collectives());
    v.push_back(micro::make_p2p());
    v.push_back(micro::make_pipeline());
    v.push_back(zoo::make_train());
    v.push_back(zoo::make_infer());
    return harness::Registry(std::move(v));
  }();
  return all;
}

}  // namespace ab::workloads
