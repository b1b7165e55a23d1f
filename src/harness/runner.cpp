#include "harness/runner.h"

#include <chrono>
#include <cmath>
#include <iomanip>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "measure/timer.h"
#include "results/results.h"
#include "results/text.h"

namespace ab::harness {
namespace {

std::string format_duration(double s) {
  std::ostringstream o;
  if (s < 60) o << static_cast<int>(std::lround(s)) << "s";
  else o << static_cast<int>(s / 60) << "m" << std::setw(2) << std::setfill('0') << static_cast<int>(std::fmod(s, 60)) << "s";
  return o.str();
}

results::TimeStats time_stats(const measure::Result& r, measure::TimingMode mode) {
  const auto& s = r.summary;
  results::TimeStats t;
  t.mode = std::string(measure::to_string(mode));
  t.converged = r.converged;
  t.stop_reason = r.stop_reason;
  t.iterations_per_sample = static_cast<std::int64_t>(r.iterations_per_sample);
  t.total_iterations = static_cast<std::int64_t>(r.total_iterations);
  t.measured_s = r.measured_s;
  t.window_start_s = r.window_start_s, t.window_end_s = r.window_end_s;  // monotonic clock of the telemetry trace
  t.count = static_cast<std::int64_t>(s.count);
  t.median_s = s.median, t.mean_s = s.mean, t.min_s = s.min, t.max_s = s.max;
  t.p90_s = s.p90, t.p99_s = s.p99, t.q1_s = s.q1, t.q3_s = s.q3, t.iqr_s = s.iqr;
  t.stddev_s = s.stddev, t.rel_spread = s.rel_spread;
  t.samples_s = r.iteration_s;
  return t;
}

// The point's axis values; numbers stay numbers in the record so queries and charts need no parsing.
nlohmann::json params_json(const PlanEntry& entry, const std::string& device_kind) {
  nlohmann::json params = nlohmann::json::object();
  const auto axes = entry.workload->axes(device_kind);
  for (const auto& [name, value] : entry.point.values) {
    AxisKind kind = AxisKind::text;
    for (const auto& a : axes)
      if (a.name == name) kind = a.kind;
    if (kind == AxisKind::integer) params[name] = std::stoll(value);
    else if (kind == AxisKind::real) params[name] = std::stod(value);
    else params[name] = value;
  }
  return params;
}

// The workload's options as run, typed as its axes are (numbers stay numbers).
nlohmann::json options_json(const Workload& workload, const OptionValues& values) {
  nlohmann::json options = nlohmann::json::object();
  for (const OptionSpec& o : workload.options()) {
    const std::string& value = values.at(o.name);
    if (o.kind == AxisKind::integer) options[o.name] = std::stoll(value);
    else if (o.kind == AxisKind::real) options[o.name] = std::stod(value);
    else options[o.name] = value;
  }
  return options;
}

}  // namespace

std::vector<PlanEntry> plan_for(Workload& workload, const std::string& device_kind,
                                const std::vector<AxisOverride>& overrides, const OptionValues& options) {
  const OptionValues resolved = resolve_options(workload.name(), workload.options(), options);
  std::vector<PlanEntry> plan;
  for (auto& p : build_sweep(workload.axes(device_kind), workload.zip_groups(), overrides))
    plan.push_back({&workload, std::move(p), resolved});
  return plan;
}

Runner::Runner(backend::Backend& backend, measure::Settings settings, nlohmann::json context, std::string run_id,
               RunnerHooks hooks, std::ostream* progress)
    : backend_(backend), settings_(settings), context_(std::move(context)), run_id_(std::move(run_id)),
      hooks_(std::move(hooks)), progress_(progress) {}

// The ceiling `key` divides by: this run's (measured earlier in it), else the newest stored one;
// nullopt when neither is plausible (metrics.ceiling_not_used says why).
std::optional<Ceiling> Runner::ceiling_for(const std::string& key, results::Record& record, bool& stored) {
  stored = false;
  if (key.empty()) return std::nullopt;
  if (auto it = ceilings_.find(key); it != ceilings_.end()) return it->second;
  std::optional<Ceiling> ceiling = hooks_.find_stored_ceiling ? hooks_.find_stored_ceiling(key) : std::nullopt;
  if (!ceiling) {
    missing_ceilings_.insert(key);
    return std::nullopt;
  }
  stored = true;
  const std::string why =
      results::implausible_ceiling(ceiling->value, results::physical_limit(backend_.info().name, key));
  if (why.empty()) return ceiling;
  record.metrics["ceiling_not_used"] = key + " from " + ceiling->source + ": " + why;
  return std::nullopt;
}

void Runner::add_rates(results::Record& record, const State& state) {
  const Counts& c = state.counts();
  const std::string& key = state.ceiling_key();
  auto rates = results::rates_from_counts({c.samples, c.flops, c.bytes, c.ops_unit, c.tokens},
                                          state.result()->summary.median, key);
  if (!rates) return;
  // A point whose bytes fit in the device's cache is not bounded by DRAM bandwidth (nor by a
  // bandwidth ceiling measured from DRAM).
  const auto& device = backend_.info();
  const auto cache_bytes = static_cast<double>(device.l2_bytes);
  const bool cache_resident = results::is_memory_ceiling(key) && device.l2_bytes > 0 && c.bytes <= 2.0 * cache_bytes;
  const std::string& publishes = state.publishes_ceiling();
  bool stored = false;
  const std::optional<Ceiling> ceiling = publishes.empty() ? ceiling_for(key, record, stored) : std::nullopt;
  const double achieved = results::achieved_rate(*rates, key);
  const std::string unit = results::ceiling_unit(key, c.ops_unit);
  std::string impossible =
      results::impossible_rate(achieved, unit, results::physical_limit(device.name, key, cache_resident),
                               ceiling && !cache_resident ? std::optional<double>(ceiling->value) : std::nullopt);
  // Bandwidth of a point judged by arithmetic (or by nothing) is still held to what any device can move.
  if (impossible.empty() && rates->gbps && !results::is_memory_ceiling(key))
    impossible = results::impossible_rate(*rates->gbps, "GB/s", results::physical_limit("", "memory.", true), std::nullopt);
  if (!impossible.empty()) {
    record.status = results::Status::error;
    record.reason = impossible;
    return;  // no rates: nothing may be divided by, or ranked on, an impossible figure
  }
  // A ceiling is the best figure measured for it: the highest of the ceilings workload's points,
  // and in a run that measured it, of every later point measuring the same thing (a GEMM of any
  // shape, a STREAM kernel on DRAM). A stored ceiling is only divided by: its run is not this one.
  const std::string source = "run " + run_id_ + " seq " + std::to_string(seq_);
  if (!publishes.empty() && achieved > 0) {
    if (const auto best = ceilings_.find(publishes); best != ceilings_.end() && best->second.value >= achieved) {
      results::divide_by_ceiling(*rates, {publishes, best->second.unit, best->second.source, best->second.value});
    } else {
      ceilings_[publishes] = {achieved, unit, source};
      rates->ceiling = results::CeilingRef{publishes, unit, "this point", achieved};
      add_datasheet(record, publishes, achieved, unit);
    }
  } else if (ceiling && !stored && achieved > ceiling->value && results::measures_ceiling(key, c.bytes, cache_bytes)) {
    ceilings_[key] = {achieved, unit, source};
    rates->ceiling = results::CeilingRef{key, unit, "this point", achieved};
    rates->pct_of_ceiling = 100.0;
    add_datasheet(record, key, achieved, unit);
  } else if (ceiling) {
    results::divide_by_ceiling(*rates, {key, ceiling->unit, ceiling->source, ceiling->value});
    const std::string why = results::above_ceiling_cause(key, *rates->pct_of_ceiling, c.bytes, cache_bytes, stored);
    if (!why.empty()) record.metrics["above_ceiling"] = why;
  }
  record.rates = std::move(rates);
}

// Beside a measured ceiling, the datasheet's peak for it (HPL's Rpeak beside Rmax), where the device has one.
void Runner::add_datasheet(results::Record& record, const std::string& key, double measured, const std::string& unit) {
  const results::DatasheetPeaks* row = results::datasheet_peaks(backend_.info().name);
  const double peak = row != nullptr ? results::datasheet_value(*row, key) : 0.0;
  if (peak <= 0) return;
  record.metrics["datasheet"] = {
      {"part", std::string(row->part)}, {"value", peak}, {"unit", unit}, {"pct_of_datasheet", 100.0 * measured / peak}};
}

// A scenario run: its block as measured, rates from its throughput, telemetry over its window.
void Runner::add_scenario(results::Record& record, const State& state) {
  const ScenarioReport& s = *state.scenario_result();
  record.scenario = s.summary;
  if (record.ok() && s.samples_per_s > 0) record.rates = results::scenario_rates(s.samples_per_s, state.counts().flops);
  if (hooks_.telemetry && s.window_end_s > s.window_start_s) {
    nlohmann::json t = hooks_.telemetry(s.window_start_s, s.window_end_s, s.samples);
    if (!t.is_null()) record.telemetry = t;
  }
}

results::Record Runner::measure_point(const PlanEntry& entry, const std::atomic<bool>& cancel) {
  // The workload's options as run (an entry built by hand may hold none: the defaults).
  const OptionValues run_options = resolve_options(entry.workload->name(), entry.workload->options(), entry.options);
  results::Record record;
  record.run_id = run_id_;
  record.seq = seq_;
  record.workload = entry.workload->name();
  record.device = backend_.info().id;
  record.device_name = backend_.info().name;
  record.params = params_json(entry, backend_.info().kind);
  record.options = options_json(*entry.workload, run_options);
  record.started_at = results::utc_now_iso8601();
  const double start = measure::monotonic_seconds();
  measure::Settings settings = settings_;
  State state(entry.point, backend_, settings, &cancel, run_options);
  const bool counter_pass = hooks_.counters != nullptr && entry.workload->has_counter_pass();
  if (counter_pass) state.set_counter_session(hooks_.counters);
  if (!hooks_.artifact_dir.empty()) state.set_artifact_dir(hooks_.artifact_dir / "artifacts" / std::to_string(seq_));
  std::string status = "ok", reason;
  try {
    entry.workload->run(state);
    if (!state.result() && !state.scenario_result()) {
      status = "error";
      reason = "workload measured nothing";
    } else if (state.scenario_result() && state.scenario_result()->interrupted) {
      status = "interrupted";
      reason = "interrupted before the scenario run ended";
    } else if (state.result() && state.result()->stop_reason == "cancelled") {
      status = "interrupted";
      reason = "interrupted before the stopping rule ended the point";
    } else if (state.result() && state.result()->timed_out) {
      status = "timeout";
      reason = state.result()->stop_reason;
    }
  } catch (const SkipPoint& e) {  // the family's subclasses before ab::Error and std::exception
    status = "skipped", reason = e.what();
  } catch (const CheckFailed& e) {
    status = "error", reason = e.what();
  } catch (const Diverged& e) {
    status = "diverged", reason = e.what();
  } catch (const NotConverged& e) {
    status = "not_converged", reason = e.what();
  } catch (const OutOfMemory& e) {
    status = "oom", reason = e.what();
  } catch (const Unsupported& e) {
    status = "skipped", reason = e.what();
  } catch (const UsageError& e) {
    status = "invalid", reason = e.what();
  } catch (const std::bad_alloc&) {  // a host buffer the workload did not bound itself
    status = "oom", reason = "host memory exhausted: an allocation of this point failed";
  } catch (const std::length_error&) {  // std::vector's max_size(): a size no host can hold
    status = "invalid", reason = "a size of this point is larger than host memory can address";
  } catch (const std::exception& e) {
    status = "error", reason = e.what();
  }
  try {
    backend_.synchronize();  // a failed point must not leave work in flight for the next one
  } catch (const std::exception& e) {
    if (status == "ok") status = "error";
    reason += std::string(reason.empty() ? "" : "; ") + "device error after the point: " + e.what();
  }
  record.status = results::parse_status(status);
  record.reason = reason;
  record.wall_s = measure::monotonic_seconds() - start;
  const Counts& c = state.counts();
  if (c.samples > 0 || c.flops > 0 || c.bytes > 0)
    record.counts = results::Counts{c.samples, c.flops, c.bytes, c.ops_unit, c.tokens};
  if (!state.check_json().empty()) record.check = state.check_json();
  if (!state.metrics().empty()) record.metrics = state.metrics();
  if (hooks_.counters != nullptr && !counter_pass && record.ok())
    record.metrics["counters"] = counters::unavailable_json(
        hooks_.counters->set(), entry.workload->name() + " has no counter pass (its work is not replayable in ranges)");
  if (state.scenario_result()) add_scenario(record, state);
  if (state.result() && state.result()->summary.count > 0) {
    record.time = time_stats(*state.result(), settings.mode);
    if (record.ok()) add_rates(record, state);
    scaling_.add(*entry.workload, entry.point, run_options, record);
    if (hooks_.telemetry) {
      const auto& r = *state.result();
      const auto iterations = static_cast<double>(r.total_iterations);
      nlohmann::json t = hooks_.telemetry(r.window_start_s, r.window_end_s, c.samples * iterations);
      // A language model's energy per token, beside the samples per joule the sampler derives.
      if (c.tokens > 0 && t.is_object() && t.contains("energy_j") && t["energy_j"].get<double>() > 0)
        t["tokens_per_j"] = c.tokens * iterations / t["energy_j"].get<double>();
      if (!t.is_null()) record.telemetry = t;
    }
  }
  repeats_.add(*entry.workload, entry.point, run_options, record);
  record.context = context_;
  return record;
}

// One line under the point's progress line: its status, median time, and a scenario's verdict.
static void print_outcome(std::ostream& out, const results::Record& record) {
  out << "    " << results::to_string(record.status);
  if (!record.reason.empty()) out << ": " << record.reason;
  if (record.time && record.time->median_s) out << "  median " << results::format_seconds(*record.time->median_s);
  if (!record.scenario.is_null()) {
    const auto& sc = record.scenario;
    std::ostringstream line;
    line << "  " << sc.value("result", "") << "  " << std::setprecision(4) << sc.value("completed_samples_per_s", 0.0)
         << " samples/s, p99 " << results::format_seconds(sc["latency_s"].value("p99", 0.0));
    out << line.str();
    if (sc.value("lost_queries", 0) > 0) out << ", " << sc["lost_queries"].get<std::uint64_t>() << " queries lost";
    if (!sc.value("valid", true)) out << " (failed: " << sc["failed_constraints"].dump() << ")";
  }
  out << std::endl;
}

namespace {
// The progress lines: a header before each point, its outcome after. Points skipped one after
// another by the same workload for the same reason (a step that does not apply to the device)
// print once; the next such points' headers wait until their outcome is known (a skip takes no
// time) and fold into one line, so a user sees one line per reason, not one per point.
class ProgressPrinter {
 public:
  ProgressPrinter(std::ostream& out, std::size_t total) : out_(out), total_(total) {}
  void before(std::size_t i, const PlanEntry& entry, double elapsed_s) {
    std::ostringstream h;
    h << "[" << i + 1 << "/" << total_ << "] " << entry.workload->name() << " " << entry.point.label();
    if (i > 0)
      h << "  (elapsed " << format_duration(elapsed_s) << ", ETA "
        << format_duration(elapsed_s / static_cast<double>(i) * static_cast<double>(total_ - i)) << ")";
    header_ = h.str();
    deferred_ = entry.workload->name() == skip_workload_ && !skip_reason_.empty();
    if (deferred_) return;
    flush();
    out_ << header_ << std::endl;
  }
  void after(std::size_t i, const results::Record& record) {
    const bool skipped = record.status == results::Status::skipped;
    if (deferred_ && skipped && record.reason == skip_reason_) {
      if (folded_ == 0) first_folded_ = i;
      ++folded_;
      return;
    }
    flush();
    if (deferred_) out_ << header_ << std::endl;
    print_outcome(out_, record);
    skip_workload_ = skipped ? record.workload : std::string();
    skip_reason_ = skipped ? record.reason : std::string();
  }
  void flush() {
    if (folded_ == 0) return;
    out_ << "    ";
    if (folded_ == 1) out_ << "point " << first_folded_ + 1;
    else out_ << "points " << first_folded_ + 1 << "-" << first_folded_ + folded_;
    out_ << " (" << skip_workload_ << ") skipped for the same reason" << std::endl;
    folded_ = 0;
  }

 private:
  std::ostream& out_;
  std::size_t total_;
  std::string header_, skip_workload_, skip_reason_;
  bool deferred_ = false;
  std::size_t folded_ = 0, first_folded_ = 0;
};
}  // namespace

RunTotals Runner::run(const std::vector<PlanEntry>& plan, const std::atomic<bool>& cancel) {
  RunTotals totals;
  const double start = measure::monotonic_seconds();
  std::optional<ProgressPrinter> printer;
  if (progress_ != nullptr) printer.emplace(*progress_, plan.size());
  for (std::size_t i = 0; i < plan.size(); ++i) {
    if (cancel.load()) {
      totals.interrupted = true;
      break;
    }
    if (printer) printer->before(i, plan[i], measure::monotonic_seconds() - start);
    results::Record record = measure_point(plan[i], cancel);
    if (hooks_.sink) hooks_.sink(results::to_json(record));
    ++seq_;
    const std::string status(results::to_string(record.status));
    ++totals.by_status[status];
    if (printer) printer->after(i, record);
    if (record.time) record.time->samples_s.reset();
    record.context = nullptr;
    totals.records.push_back(std::move(record));
    if (cancel.load() && status == "interrupted") {
      totals.interrupted = true;
      break;
    }
  }
  if (printer) printer->flush();
  if (cancel.load()) totals.interrupted = true;
  if (progress_ != nullptr) {
    for (const auto& [key, ceiling] : ceilings_)
      *progress_ << results::ceiling_line(backend_.info().name, key, ceiling.value, ceiling.unit) << '\n';
    if (!missing_ceilings_.empty()) *progress_ << results::missing_ceilings_line(missing_ceilings_) << '\n';
  }
  return totals;
}

}  // namespace ab::harness
