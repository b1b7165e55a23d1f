// Internal to src/counters: the CUPTI range-profiler session (cupti_session.cpp, CUDA builds only).
#pragma once

#include <memory>

#include "counters/counters.h"

namespace ab::counters {

// Counters of device `ordinal` through CUPTI's range profiler: user ranges, user replay.
std::unique_ptr<CounterSession> make_cupti_session(MetricSet set, int ordinal);

}  // namespace ab::counters
