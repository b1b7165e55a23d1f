// The loadgen workload: MLPerf LoadGen's scenarios (src/scenarios) against a system under test —
// the null SUT, a dense layer per batch behind the dynamic batcher, or a faulty one.
#pragma once

#include <memory>

#include "workloads/workload.h"

namespace ab::workloads {

std::unique_ptr<Workload> make_loadgen();

}  // namespace ab::workloads
