#include "harness/scaling.h"

#include <charconv>

#include "results/derived.h"

namespace ab::harness {

void ScalingTracker::add(const Workload& workload, const Point& point, const OptionValues& options,
                         results::Record& record) {
  const std::string axis = workload.scaling_axis();
  if (axis.empty() || !record.ok() || !record.rates || !record.rates->samples_per_s) return;
  const double rate = *record.rates->samples_per_s;
  if (!(rate > 0)) return;
  std::string key = workload.name(), devices;
  for (const auto& [name, value] : point.values)
    if (name == axis) devices = value;
    else key += " " + name + "=" + value;
  for (const auto& [name, value] : options) key += " " + name + "=" + value;
  long long k = 0;
  const auto [ptr, ec] = std::from_chars(devices.data(), devices.data() + devices.size(), k);
  if (ec != std::errc() || ptr != devices.data() + devices.size() || k < 1) return;
  if (k == 1) {
    single_device_rate_[key] = rate;
    return;
  }
  const auto it = single_device_rate_.find(key);
  if (it == single_device_rate_.end()) return;
  const std::optional<double> efficiency = results::scaling_efficiency(rate, static_cast<double>(k), it->second);
  if (!efficiency) return;
  record.metrics["scaling_efficiency"] = *efficiency;
  record.metrics["single_gpu_samples_per_s"] = it->second;
}

}  // namespace ab::harness
