// Runs a sweep plan point by point: each point is measured, turned into a record and handed to the
// sink at once, so a crash or Ctrl-C loses nothing measured before it. Failures of one point
// (oom, skipped, check failed) are recorded and the sweep goes on.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/repeats.h"
#include "harness/scaling.h"
#include "harness/workload.h"
#include "results/record.h"

namespace ab::harness {

struct PlanEntry {
  Workload* workload = nullptr;
  Point point;
  OptionValues options;  // every option the workload declares (resolve_options)
};

// Expands workload + overrides for a device kind, with the options given (the rest at their
// defaults); throws UsageError for bad axes, options or values.
std::vector<PlanEntry> plan_for(Workload& workload, const std::string& device_kind,
                                const std::vector<AxisOverride>& overrides, const OptionValues& options = {});

struct Ceiling {
  double value = 0;
  std::string unit, source;
};

struct RunnerHooks {
  // Ceilings not measured in this run: the newest in the store for this device, if any.
  std::function<std::optional<Ceiling>(const std::string& key)> find_stored_ceiling;
  // Telemetry summary of a measured window [t0_s, t1_s] that processed `samples`; null if none.
  std::function<nlohmann::json(double t0_s, double t1_s, double samples)> telemetry;
  // Every record, serialised, as soon as it exists.
  std::function<void(const nlohmann::json& record)> sink;
  // The run's hardware-counter session (--counters); null when the run reads none.
  counters::CounterSession* counters = nullptr;
  // The run folder: a point that writes files gets <artifact_dir>/artifacts/<seq>; empty = no files.
  std::filesystem::path artifact_dir;
};

struct RunTotals {
  std::map<std::string, int> by_status;
  std::vector<results::Record> records;  // without samples and context, for the summary table
  bool interrupted = false;
};

class Runner {
 public:
  Runner(backend::Backend& backend, measure::Settings settings, nlohmann::json context, std::string run_id,
         RunnerHooks hooks, std::ostream* progress);
  RunTotals run(const std::vector<PlanEntry>& plan, const std::atomic<bool>& cancel);

 private:
  results::Record measure_point(const PlanEntry& entry, const std::atomic<bool>& cancel);
  void add_rates(results::Record& record, const State& state);
  std::optional<Ceiling> ceiling_for(const std::string& key, results::Record& record, bool& stored);
  void add_datasheet(results::Record& record, const std::string& key, double measured, const std::string& unit);
  void add_scenario(results::Record& record, const State& state);

  backend::Backend& backend_;
  measure::Settings settings_;
  nlohmann::json context_;
  std::string run_id_;
  RunnerHooks hooks_;
  std::ostream* progress_;
  std::map<std::string, Ceiling> ceilings_;  // measured in this run: the best point of each
  std::set<std::string> missing_ceilings_;   // keys divided by nothing: none measured here or stored
  ScalingTracker scaling_;
  RepeatTracker repeats_;
  int seq_ = 0;
};

}  // namespace ab::harness
