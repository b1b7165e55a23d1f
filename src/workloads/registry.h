// The built-in workloads: micro benchmarks, the load generator, training and inference.
#pragma once

#include <string>

#include "workloads/workload.h"

namespace ab::workloads {

const harness::Registry& registry();
inline harness::Workload& find_workload(const std::string& name) { return registry().find(name); }

}  // namespace ab::workloads
