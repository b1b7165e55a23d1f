// One run from request to closed store, in four steps: open (join the launch's processes, merge
// the measurement settings, plan, backend, context block, store on rank 0, telemetry sampler),
// run (the runner with its hooks wired to them), close (trace, store status). The CLI's `run` is
// this object driven in order.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/runner.h"
#include "harness/suite.h"

namespace ab::counters {
class CounterSession;
}
namespace ab::dist {
class Session;
}
namespace ab::results {
class ResultStore;
}
namespace ab::telemetry {
class Sampler;
}

namespace ab::harness {

// What a run is asked for (the command line's settings; the CLI adds its sweep arguments).
struct RunRequest {
  std::string target;  // workload name or suite file
  std::string device;  // empty = best present
  std::optional<double> min_time_s, max_noise_pct, timeout_s, warmup_s;  // none: the suite's or the default
  std::string mode;                                                       // empty: the suite's or the default
  std::string out_dir = ".";
  bool telemetry_trace = false;
  double telemetry_period_ms = 20;  // finite and above 0
  bool no_gpu_telemetry = false;
  bool quiet = false;
  std::string counters;  // hardware counters: off, memory, compute or all; empty: the suite's, else off
  std::string command_line;
};

// The measurement settings of a run: the request's over the suite's over measure::Settings'
// defaults. Throws UsageError, naming the option or the suite's setting, for a value that is not a
// finite number in its range (min_time and warmup at least 0, max_noise and timeout above 0), a
// min_time above the timeout, or a warm-up asked for that is not under half the timeout.
measure::Settings merge_settings(const RunRequest& request, const std::optional<Suite>& suite);

// Builds the plan for the run's device kind ("cpu" | "cuda") and suite (none for one workload).
using Planner =
    std::function<std::vector<PlanEntry>(const std::string& device_kind, const std::optional<Suite>& suite)>;

class RunSession {
 public:
  // Messages and progress go to `err` (progress only on rank 0 and when not quiet).
  RunSession(RunRequest request, std::ostream& err);
  ~RunSession();
  RunSession(const RunSession&) = delete;
  RunSession& operator=(const RunSession&) = delete;

  // Everything that can be wrong with the request is found here, before anything runs, and every
  // rank agrees on it. Returns 0 to go on, else the exit code (2 usage, 1 failure), the reason
  // printed (by rank 0, and by the rank that failed).
  int open(const Registry& registry, const Planner& planner);
  // Runs the plan; every record goes to the store as soon as it exists. nullopt when the run
  // failed: then the error is printed, the store marked failed and the launch ended (other ranks
  // would wait for this one). Never throws.
  std::optional<RunTotals> run(const std::atomic<bool>& cancel);
  // Stops the sampler; rank 0 writes the telemetry trace and marks the store complete or
  // interrupted. Returns 0, or 1 with the reason printed (the points stay where they were written).
  int close(const RunTotals& totals);

  bool leader() const { return leader_; }  // rank 0: the one that writes results
  const std::string& run_id() const { return run_id_; }
  std::filesystem::path points_path() const;  // rank 0's records (empty on the other ranks)

 private:
  int join_launch();
  void prepare(const Registry& registry, const Planner& planner);
  int agree_plan();
  int open_store();
  void start_telemetry();
  void wire_hooks();
  void fail(const std::string& what) noexcept;

  RunRequest request_;
  std::ostream& err_;
  std::unique_ptr<dist::Session> launch_;  // first member: MPI is left after everything else is gone
  bool leader_ = true, quiet_ = true;
  std::string run_id_, started_at_;
  std::optional<Suite> suite_;
  measure::Settings settings_;
  std::vector<PlanEntry> plan_;
  std::unique_ptr<backend::Backend> backend_;
  nlohmann::json context_;
  std::unique_ptr<results::ResultStore> store_;
  bool sample_gpu_ = false, one_cpu_rank_ = false;
  std::unique_ptr<telemetry::Sampler> sampler_;
  std::unique_ptr<counters::CounterSession> counters_;  // null: no counters asked for
  RunnerHooks hooks_;
};

}  // namespace ab::harness
