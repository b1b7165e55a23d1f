// A workload declares its axes and what one iteration does; the harness owns timing, checking
// bookkeeping and output. `State` is the workload's only view of a point (nvbench's shape).
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "counters/counters.h"
#include "dist/lockstep.h"
#include "harness/axes.h"
#include "measure/measure.h"

namespace ab::harness {

// A tuning knob of a workload: one value per run (its default, `--option name=value`, or a suite
// step's `options:`), never swept. What a user compares is an axis; how a measurement is tuned is
// an option (docs/METHODOLOGY.md, "Axes and options").
struct OptionSpec {
  std::string name;
  AxisKind kind = AxisKind::text;
  std::string default_value;
  std::vector<std::string> choices;  // the valid values of a text option; empty = any
  std::string help;
};
// Option values by name, as text; State::option_int / option_real parse them.
using OptionValues = std::map<std::string, std::string>;
// Every option of `specs` at the value given or its default. UsageError for a name `workload`
// does not declare (listing the valid ones), a value not of the option's kind, or one outside
// its choices. A range (batch >= 1...) is the workload's to check: it knows why.
OptionValues resolve_options(const std::string& workload, const std::vector<OptionSpec>& specs,
                             const OptionValues& given);
// "name=value" -> {name, value}; UsageError without a name or '='.
std::pair<std::string, std::string> parse_option_argument(const std::string& arg);

// What one iteration does; every rate in a record comes from these.
struct Counts {
  double samples = 0;  // items processed (images, GEMMs, copies)
  double flops = 0;    // arithmetic operations (a multiply-add is 2)
  double bytes = 0;    // bytes that must move through the memory being measured
  std::string ops_unit = "FLOP";  // "OP" for integer arithmetic
  double tokens = 0;              // tokens processed, for language models (rates.tokens_per_s)
};

// A thrown SkipPoint becomes status "skipped"; CheckFailed becomes "error"; Diverged (a training
// loss that became non-finite) becomes "diverged". They are ab::Error's (core/error.h).
using ab::CheckFailed;
using ab::Diverged;
// A training run to a target quality that ended (epochs, time limit) before reaching it: status
// "not_converged" with the best quality reached. One process's outcome (not an ErrorKind).
class NotConverged : public Error {
 public:
  using Error::Error;
};
using ab::SkipPoint;

// What a workload that drives the load generator (src/scenarios) measures instead of exec()'s
// iteration times: one scenario run, copied into the record as `scenario`.
struct ScenarioReport {
  nlohmann::json summary;     // the record's `scenario` block (docs/RESULTS.md)
  double window_start_s = 0;  // measure::monotonic_seconds() bounds of the measured run, for telemetry
  double window_end_s = 0;
  double samples = 0;         // samples completed in the window
  double samples_per_s = 0;   // the run's throughput: the record's rates.samples_per_s
  bool interrupted = false;   // stopped by Ctrl-C: the point becomes "interrupted"
};

class State {
 public:
  // `options`: the workload's resolved options (resolve_options), every declared name present.
  State(const Point& point, backend::Backend& backend, const measure::Settings& settings,
        const std::atomic<bool>* cancel, OptionValues options = {});

  std::int64_t get_int(const std::string& axis) const;
  double get_real(const std::string& axis) const;
  const std::string& get_text(const std::string& axis) const;
  // The run's value of a declared option (Workload::options); Error for an undeclared name.
  std::int64_t option_int(const std::string& name) const;
  double option_real(const std::string& name) const;
  const std::string& option_text(const std::string& name) const;
  const OptionValues& options() const { return options_; }
  const Point& point() const { return point_; }
  backend::Backend& backend() { return backend_; }
  const backend::Backend& backend() const { return backend_; }
  const measure::Settings& settings() const { return settings_; }

  [[noreturn]] void skip(const std::string& reason) const;
  void set_counts(const Counts& c) { counts_ = c; }
  // The measured ceiling the rates are compared with ("gemm.bf16", "memory.bandwidth").
  void set_ceiling_key(const std::string& key) { ceiling_key_ = key; }
  // For the ceilings workload: this point's rate becomes the ceiling `key`.
  void set_publishes_ceiling(const std::string& key) { publishes_ceiling_ = key; }
  // Records a correctness check; throws CheckFailed when rel_error is above tolerance or not finite.
  void check(double rel_error, double tolerance, const std::string& what);
  void add_metric(const std::string& name, nlohmann::json value) { metrics_[name] = std::move(value); }
  // Measures `iteration` with the run's settings (harness-owned timing). Call once per point.
  // Under a launcher (more than one process) every rank calls it and the ranks are timed in lock
  // step (dist/lockstep.h): each sample is the slowest rank's, and metrics.rank_step_time_s holds
  // the min/avg/max of the first `timed_ranks` ranks' own medians (0: every rank's); idle ranks
  // of the launch pass an iteration that does nothing.
  void exec(const std::function<void()>& iteration, int timed_ranks = 0);
  void exec(const std::function<void()>& iteration, const measure::Settings& settings, int timed_ranks = 0);
  // Measures with another timer than the backend's (a plan that times its own streams: p2p).
  void exec(measure::IterationTimer& timer, const std::function<void()>& iteration);
  // A scenario run measured instead of exec() (the loadgen workload).
  void set_scenario_result(ScenarioReport r) { scenario_ = std::move(r); }
  // A folder of this point's own for files it writes (created by the writer); empty when the run
  // keeps no files. The runner sets it to <run folder>/artifacts/<seq>.
  const std::filesystem::path& artifact_dir() const { return artifact_dir_; }
  void set_artifact_dir(std::filesystem::path dir) { artifact_dir_ = std::move(dir); }
  // The run's hardware-counter pass (counters/counters.h), set by the runner where the run asks for
  // counters and the workload has a pass (Workload::has_counter_pass). The workload calls
  // measure_counters after exec, while its work's buffers live, with one iteration's work: each call
  // records metrics.counters (derived from the point's counts, set_counts first) and returns what
  // was read; nothing runs and nullopt comes back where the run asks for no counters.
  void set_counter_session(counters::CounterSession* session) { counter_session_ = session; }
  bool counters_requested() const { return counter_session_ != nullptr; }
  std::optional<counters::Measurement> measure_counters(const std::vector<counters::Range>& ranges);
  std::optional<counters::Measurement> measure_counters(const std::function<void(counters::RangeMarks&)>& pass,
                                                        std::size_t max_ranges);
  // Records metrics.counters unavailable for `why` where the run asks for counters.
  void counters_unavailable(const std::string& why);
  // Set by Ctrl-C; workloads that run long loops of their own poll it (null: no cancellation).
  const std::atomic<bool>* cancel_flag() const { return cancel_; }

  const Counts& counts() const { return counts_; }
  const std::optional<measure::Result>& result() const { return result_; }
  // Under a launcher, after exec: every rank's own times, in rank order (empty in one process).
  const std::vector<dist::RankTimes>& rank_times() const { return rank_times_; }
  const std::optional<ScenarioReport>& scenario_result() const { return scenario_; }
  const std::string& ceiling_key() const { return ceiling_key_; }
  const std::string& publishes_ceiling() const { return publishes_ceiling_; }
  const nlohmann::json& check_json() const { return check_; }
  const nlohmann::json& metrics() const { return metrics_; }

 private:
  const Point& point_;
  backend::Backend& backend_;
  measure::Settings settings_;
  const std::atomic<bool>* cancel_;
  OptionValues options_;
  Counts counts_;
  std::string ceiling_key_, publishes_ceiling_;
  nlohmann::json check_ = nlohmann::json::object();
  nlohmann::json metrics_ = nlohmann::json::object();
  std::optional<measure::Result> result_;
  std::vector<dist::RankTimes> rank_times_;
  std::optional<ScenarioReport> scenario_;
  std::filesystem::path artifact_dir_;
  counters::CounterSession* counter_session_ = nullptr;
};

class Workload {
 public:
  virtual ~Workload() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  // Axes with defaults suited to the device kind ("cpu" or "cuda").
  virtual std::vector<AxisSpec> axes(const std::string& device_kind) const = 0;
  virtual std::vector<ZipGroup> zip_groups() const { return {}; }
  // Tuning knobs with their defaults (OptionSpec); none by default.
  virtual std::vector<OptionSpec> options() const { return {}; }
  // The integer axis along which the workload scales over devices ("gpus"; "" for none): the
  // runner records each point's scaling efficiency against the point of the run that differs from
  // it only in that axis, at 1 (harness/scaling.h).
  virtual std::string scaling_axis() const { return ""; }
  // Whether run() reads hardware counters when the run asks (State::measure_counters); a point of
  // a workload without a pass records counters as unavailable, saying so.
  virtual bool has_counter_pass() const { return false; }
  virtual void run(State& state) = 0;
};

// The workloads a run can name: `list` and `run NAME` read it; src/workloads fills the built-in one.
class Registry {
 public:
  explicit Registry(std::vector<std::unique_ptr<Workload>> workloads) : workloads_(std::move(workloads)) {}
  const std::vector<std::unique_ptr<Workload>>& all() const { return workloads_; }
  Workload& find(const std::string& name) const;  // throws UsageError listing the valid names

 private:
  std::vector<std::unique_ptr<Workload>> workloads_;
};

}  // namespace ab::harness
