// Helpers of the model workload tests: planning and running train or infer points in process on a
// backend, and reading a point's MLPerf log.
#pragma once

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "harness/runner.h"
#include "test_support.h"
#include "workloads/models/mllog.h"
#include "workloads/registry.h"

namespace ab::test {

// `args` are "name=values": a name the workload declares as an option sets it (one value, as
// --option does), any other overrides an axis (as --axis does).
inline std::vector<harness::PlanEntry> plan_of(const std::string& workload, const std::vector<std::string>& args,
                                               const std::string& device_kind = "cpu") {
  using namespace ab::harness;
  Workload& w = workloads::find_workload(workload);
  std::vector<AxisOverride> overrides;
  OptionValues options;
  for (const auto& a : args) {
    const auto [name, value] = parse_option_argument(a);
    const auto specs = w.options();
    if (std::any_of(specs.begin(), specs.end(), [&](const OptionSpec& o) { return o.name == name; }))
      options[name] = value;
    else overrides.push_back(parse_axis_argument(a));
  }
  return plan_for(w, device_kind, overrides, options);
}

inline std::vector<nlohmann::json> run_points(const std::string& workload, const std::vector<std::string>& args,
                                              const std::filesystem::path& artifacts = {},
                                              const std::string& device = "cpu") {
  using namespace ab::harness;
  auto be = backend::make_backend(device);
  std::vector<nlohmann::json> records;
  RunnerHooks hooks;
  hooks.sink = [&records](const nlohmann::json& r) { records.push_back(r); };
  hooks.artifact_dir = artifacts;
  Runner runner(*be, record_settings(), nlohmann::json::object(), "run-tta", hooks, nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(plan_of(workload, args, be->info().kind), cancel);
  return records;
}

inline std::vector<nlohmann::json> mllog_of(const std::filesystem::path& artifacts, const nlohmann::json& record) {
  return workloads::zoo::read_mllog(artifacts / "artifacts" / std::to_string(record["seq"].get<int>()) / "mllog.txt");
}

// One figure of every evaluation in a time-to-train record's curve ("accuracy", "loss").
inline std::vector<double> curve_of(const nlohmann::json& record, const std::string& figure) {
  std::vector<double> v;
  for (const auto& e : record["metrics"]["time_to_train"]["curve"]) v.push_back(e[figure].get<double>());
  return v;
}

inline std::vector<std::string> keys_of(const std::vector<nlohmann::json>& log) {
  std::vector<std::string> keys;
  for (const auto& l : log) keys.push_back(l["key"].get<std::string>());
  return keys;
}

inline std::ptrdiff_t position(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) - keys.begin();
}

}  // namespace ab::test
