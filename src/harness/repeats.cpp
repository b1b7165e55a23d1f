#include "harness/repeats.h"

#include <algorithm>
#include <limits>

#include "results/derived.h"

namespace ab::harness {

void RepeatTracker::add(const Workload& workload, const Point& point, const OptionValues& options,
                        results::Record& record) {
  const bool seeded =
      std::any_of(point.values.begin(), point.values.end(), [](const auto& v) { return v.first == "seed"; });
  if (!seeded || !record.metrics.is_object() || !record.metrics.contains("time_to_train")) return;
  const nlohmann::json& t = record.metrics["time_to_train"];
  double time_s = std::numeric_limits<double>::infinity();
  if (record.status == results::Status::ok && t.contains("time_to_train_s"))
    time_s = t["time_to_train_s"].get<double>();
  else if (record.status != results::Status::not_converged && record.status != results::Status::diverged) return;
  std::string key = workload.name();
  for (const auto& [name, value] : point.values)
    if (name != "seed") key += " " + name + "=" + value;
  for (const auto& [name, value] : options) key += " " + name + "=" + value;
  std::vector<double>& times = times_s_[key];
  times.push_back(time_s);
  if (times.size() < 3) return;
  const results::OlympicMean m = results::olympic_mean(times);
  nlohmann::json out = {{"runs", times.size()}, {"converged", m.converged}, {"rule", results::kOlympicMeanRule}};
  out["olympic_mean_s"] = m.mean_s ? nlohmann::json(*m.mean_s) : nlohmann::json(nullptr);
  if (!m.mean_s) out["why_none"] = m.why_none;
  record.metrics["time_to_train_olympic"] = out;
}

}  // namespace ab::harness
