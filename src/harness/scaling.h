// Scaling efficiency, derived once by the harness for every workload that declares a scaling axis
// (Workload::scaling_axis): efficiency(k) = rate(k) / (k x rate(1)), docs/METHODOLOGY.md.
#pragma once

#include <map>
#include <string>

#include "harness/workload.h"
#include "results/record.h"

namespace ab::harness {

// The rates of the points measured at 1 on their workload's scaling axis, by everything else that
// names the point (workload, the other axes' values, the options). A point at k > 1 whose twin at
// 1 was measured earlier in the run gets metrics.scaling_efficiency and
// metrics.single_gpu_samples_per_s. Rates are the records' rates.samples_per_s of "ok" points:
// weak scaling keeps the per-device batch, strong scaling the global one (the workload's counts say which).
class ScalingTracker {
 public:
  void add(const Workload& workload, const Point& point, const OptionValues& options, results::Record& record);

 private:
  std::map<std::string, double> single_device_rate_;
};

}  // namespace ab::harness
