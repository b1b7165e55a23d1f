#include "harness/runner.h"

#include <chrono>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "measure/timer.h"
#include "results/results.h"

namespace ab::harness {
namespace {

std::string format_duration(double s) {
  std::ostringstream o;
  if (s < 60) o << static_cast<int>(std::lround(s)) << "s";
  else o << static_cast<int>(s / 60) << "m" << std::setw(2) << std::setfill('0') << static_cast<int>(std::fmod(s, 60)) << "s";
  return o.str();
}

std::string format_time(double s) {
  std::ostringstream o;
  o << std::setprecision(4);
  if (s < 1e-3) o << s * 1e6 << " us";
  else if (s < 1) o << s * 1e3 << " ms";
  else o << s << " s";
  return o.str();
}

nlohmann::json time_json(const measure::Result& r, measure::TimingMode mode) {
  const auto& s = r.summary;
  return {{"mode", std::string(measure::to_string(mode))},
          {"converged", r.converged},
          {"stop_reason", r.stop_reason},
          {"iterations_per_sample", r.iterations_per_sample},
          {"total_iterations", r.total_iterations},
          {"measured_s", r.measured_s},
          {"window_start_s", r.window_start_s}, {"window_end_s", r.window_end_s},  // monotonic clock of the telemetry trace
          {"count", s.count},
          {"median_s", s.median}, {"mean_s", s.mean}, {"min_s", s.min}, {"max_s", s.max},
          {"p90_s", s.p90}, {"p99_s", s.p99}, {"q1_s", s.q1}, {"q3_s", s.q3}, {"iqr_s", s.iqr},
          {"stddev_s", s.stddev}, {"rel_spread", s.rel_spread},
          {"samples_s", r.iteration_s}};
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

void Runner::add_rates(nlohmann::json& record, const State& state) {
  const Counts& c = state.counts();
  const double median = state.result()->summary.median;
  if (median <= 0) return;
  nlohmann::json rates = nlohmann::json::object();
  if (c.samples > 0) rates["samples_per_s"] = c.samples / median;
  if (c.flops > 0) rates["tflops"] = c.flops / median / 1e12;
  if (c.bytes > 0) rates["gbps"] = c.bytes / median / 1e9;
  const bool is_memory = state.ceiling_key().rfind("memory.", 0) == 0;
  const double achieved = is_memory ? rates.value("gbps", 0.0) : rates.value("tflops", 0.0);
  const std::string unit = is_memory ? "GB/s" : (c.ops_unit == "OP" ? "TOP/s" : "TFLOP/s");

  if (!state.ceiling_key().empty() && state.publishes_ceiling().empty()) {
    std::optional<Ceiling> ceiling;
    if (auto it = ceilings_.find(state.ceiling_key()); it != ceilings_.end()) ceiling = it->second;
    else if (hooks_.find_stored_ceiling) ceiling = hooks_.find_stored_ceiling(state.ceiling_key());
    if (ceiling && ceiling->value > 0) {
      rates["pct_of_ceiling"] = 100.0 * achieved / ceiling->value;
      rates["ceiling"] = {{"key", state.ceiling_key()}, {"value", ceiling->value}, {"unit", ceiling->unit},
                          {"source", ceiling->source}};
    }
  }
  if (!state.publishes_ceiling().empty() && achieved > 0) {
    ceilings_[state.publishes_ceiling()] = {achieved, unit, "run " + run_id_ + " seq " + std::to_string(seq_)};
    rates["ceiling"] = {{"key", state.publishes_ceiling()}, {"value", achieved}, {"unit", unit}, {"source", "this point"}};
  }
  // The rate the device is judged by: bandwidth for memory-bound points, arithmetic otherwise.
  rates["primary"] = is_memory || !rates.contains("tflops") ? "gbps" : "tflops";
  record["rates"] = rates;
}

// A scenario run: its block as measured, rates from its throughput, telemetry over its window.
void Runner::add_scenario(nlohmann::json& record, const State& state) {
  const ScenarioReport& s = *state.scenario_result();
  record["scenario"] = s.summary;
  if (record["status"] == "ok" && s.samples_per_s > 0) {
    nlohmann::json rates = {{"samples_per_s", s.samples_per_s}, {"primary", "samples_per_s"}};
    if (state.counts().flops > 0) rates["tflops"] = state.counts().flops * s.samples_per_s / 1e12;
    record["rates"] = rates;
  }
  if (hooks_.telemetry && s.window_end_s > s.window_start_s) {
    nlohmann::json t = hooks_.telemetry(s.window_start_s, s.window_end_s, s.samples);
    if (!t.is_null()) record["telemetry"] = t;
  }
}

nlohmann::json Runner::measure_point(const PlanEntry& entry, const std::atomic<bool>& cancel) {
  // Numbers stay numbers in the record so queries and charts need no parsing.
  nlohmann::json params = nlohmann::json::object();
  const auto axes = entry.workload->axes(backend_.info().kind);
  for (const auto& [name, value] : entry.point.values) {
    AxisKind kind = AxisKind::text;
    for (const auto& a : axes)
      if (a.name == name) kind = a.kind;
    if (kind == AxisKind::integer) params[name] = std::stoll(value);
    else if (kind == AxisKind::real) params[name] = std::stod(value);
    else params[name] = value;
  }
  // The workload's options as run, typed alike (an entry built by hand may hold none: the defaults).
  const OptionValues run_options = resolve_options(entry.workload->name(), entry.workload->options(), entry.options);
  nlohmann::json options = nlohmann::json::object();
  for (const OptionSpec& o : entry.workload->options()) {
    const std::string& value = run_options.at(o.name);
    if (o.kind == AxisKind::integer) options[o.name] = std::stoll(value);
    else if (o.kind == AxisKind::real) options[o.name] = std::stod(value);
    else options[o.name] = value;
  }
  nlohmann::json record = {{"schema_version", 1},          {"run_id", run_id_},
                           {"seq", seq_},                  {"workload", entry.workload->name()},
                           {"device", backend_.info().id}, {"device_name", backend_.info().name},
                           {"params", params},             {"started_at", results::utc_now_iso8601()}};
  if (!options.empty()) record["options"] = options;
  const double start = measure::monotonic_seconds();
  measure::Settings settings = settings_;
  State state(entry.point, backend_, settings, &cancel, run_options);
  if (!hooks_.artifact_dir.empty()) state.set_artifact_dir(hooks_.artifact_dir / "artifacts" / std::to_string(seq_));
  std::string status = "ok", reason;
  try {
    entry.workload->run(state);
    if (!state.result() && !state.scenario_result()) {
      status = "error";
      reason = "workload measured nothing";
    } else if (state.scenario_result() && state.scenario_result()->interrupted) {
      status = "invalid";
      reason = "interrupted before the scenario run ended";
    } else if (state.result() && state.result()->stop_reason == "cancelled") {
      status = "invalid";
      reason = "interrupted before the stopping rule ended the point";
    }
  } catch (const SkipPoint& e) {  // the family's subclasses before ab::Error and std::exception
    status = "skipped", reason = e.what();
  } catch (const CheckFailed& e) {
    status = "error", reason = e.what();
  } catch (const Diverged& e) {
    status = "diverged", reason = e.what();
  } catch (const OutOfMemory& e) {
    status = "oom", reason = e.what();
  } catch (const Unsupported& e) {
    status = "skipped", reason = e.what();
  } catch (const UsageError& e) {
    status = "invalid", reason = e.what();
  } catch (const std::exception& e) {
    status = "error", reason = e.what();
  }
  try {
    backend_.synchronize();  // a failed point must not leave work in flight for the next one
  } catch (const std::exception& e) {
    if (status == "ok") status = "error";
    reason += std::string(reason.empty() ? "" : "; ") + "device error after the point: " + e.what();
  }
  record["status"] = status;
  if (!reason.empty()) record["reason"] = reason;
  record["wall_s"] = measure::monotonic_seconds() - start;
  const Counts& c = state.counts();
  if (c.samples > 0 || c.flops > 0 || c.bytes > 0)
    record["counts"] = {{"samples", c.samples}, {"flops", c.flops}, {"bytes", c.bytes}, {"ops_unit", c.ops_unit}};
  if (!state.check_json().empty()) record["check"] = state.check_json();
  if (!state.metrics().empty()) record["metrics"] = state.metrics();
  if (state.scenario_result()) add_scenario(record, state);
  if (state.result() && state.result()->summary.count > 0) {
    record["time"] = time_json(*state.result(), settings.mode);
    if (status == "ok") add_rates(record, state);
    scaling_.add(*entry.workload, entry.point, run_options, record);
    if (hooks_.telemetry) {
      const auto& r = *state.result();
      nlohmann::json t = hooks_.telemetry(r.window_start_s, r.window_end_s,
                                          c.samples * static_cast<double>(r.total_iterations));
      if (!t.is_null()) record["telemetry"] = t;
    }
  }
  record["context"] = context_;
  return record;
}

RunTotals Runner::run(const std::vector<PlanEntry>& plan, const std::atomic<bool>& cancel) {
  RunTotals totals;
  const double start = measure::monotonic_seconds();
  for (std::size_t i = 0; i < plan.size(); ++i) {
    if (cancel.load()) {
      totals.interrupted = true;
      break;
    }
    const double elapsed = measure::monotonic_seconds() - start;
    if (progress_ != nullptr) {
      *progress_ << "[" << i + 1 << "/" << plan.size() << "] " << plan[i].workload->name() << " "
                 << plan[i].point.label();
      if (i > 0) *progress_ << "  (elapsed " << format_duration(elapsed) << ", ETA "
                            << format_duration(elapsed / static_cast<double>(i) * static_cast<double>(plan.size() - i)) << ")";
      *progress_ << std::endl;
    }
    nlohmann::json record = measure_point(plan[i], cancel);
    if (hooks_.sink) hooks_.sink(record);
    ++seq_;
    const std::string status = record["status"];
    ++totals.by_status[status];
    if (progress_ != nullptr) {
      *progress_ << "    " << status;
      if (record.contains("reason")) *progress_ << ": " << record["reason"].get<std::string>();
      if (record.contains("time")) *progress_ << "  median " << format_time(record["time"]["median_s"]);
      if (record.contains("scenario")) {
        const auto& sc = record["scenario"];
        std::ostringstream line;
        line << "  " << sc.value("result", "") << "  " << std::setprecision(4) << sc.value("completed_samples_per_s", 0.0)
             << " samples/s, p99 " << format_time(sc["latency_s"].value("p99", 0.0));
        *progress_ << line.str();
        if (sc.value("lost_queries", 0) > 0) *progress_ << ", " << sc["lost_queries"].get<std::uint64_t>() << " queries lost";
        if (!sc.value("valid", true)) *progress_ << " (failed: " << sc["failed_constraints"].dump() << ")";
      }
      *progress_ << std::endl;
    }
    if (record.contains("time")) record["time"].erase("samples_s");
    record.erase("context");
    totals.records.push_back(std::move(record));
    if (cancel.load() && status == "invalid") {
      totals.interrupted = true;
      break;
    }
  }
  if (cancel.load()) totals.interrupted = true;
  return totals;
}

void print_summary(std::ostream& out, const std::vector<nlohmann::json>& records) {
  out << std::left << std::setw(12) << "workload" << std::setw(44) << "point" << std::setw(9) << "status"
      << std::right << std::setw(12) << "median" << std::setw(16) << "rate" << std::setw(10) << "% ceil"
      << std::setw(8) << "noise" << '\n';
  for (const auto& r : records) {
    // Text axes (precision, op, target) say most about a point: they come first.
    std::string text_part, number_part;
    for (const auto& [k, v] : r["params"].items()) {
      std::string& part = v.is_string() ? text_part : number_part;
      part += (part.empty() ? "" : " ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    }
    std::string point = text_part + (text_part.empty() || number_part.empty() ? "" : " ") + number_part;
    if (point.size() > 43) point = point.substr(0, 40) + "...";
    out << std::left << std::setw(12) << r["workload"].get<std::string>() << std::setw(44) << point << std::setw(9)
        << r["status"].get<std::string>() << std::right;
    if (r.contains("scenario") && r["scenario"].is_object()) {
      // Scenario runs: the headline latency (server and offline: p99), the throughput, the verdict.
      const auto& sc = r["scenario"];
      const double latency = sc.value("name", "") == "single-stream" || sc.value("name", "") == "multi-stream"
                                 ? sc["metric"].value("value", 0.0)
                                 : sc["latency_s"].value("p99", 0.0);
      std::ostringstream rate;
      rate << std::setprecision(4) << sc.value("completed_samples_per_s", 0.0) << " /s";
      out << std::setw(12) << format_time(latency) << std::setw(16) << rate.str() << std::setw(10) << ""
          << std::setw(8) << sc.value("result", "") << '\n';
      continue;
    }
    if (!r.contains("time")) {
      out << '\n';
      continue;
    }
    out << std::setw(12) << format_time(r["time"]["median_s"]);
    std::ostringstream rate;
    rate << std::setprecision(4);
    const auto& rates = r.contains("rates") ? r["rates"] : nlohmann::json::object();
    if (rates.value("primary", "") == "tflops") {
      const double t = rates["tflops"].get<double>();
      const std::string unit = r["counts"]["ops_unit"] == "OP" ? "OP/s" : "FLOP/s";
      if (t >= 1) rate << t << " T" << unit;
      else rate << t * 1e3 << " G" << unit;
    } else if (rates.contains("gbps")) {
      rate << rates["gbps"].get<double>() << " GB/s";
    }
    out << std::setw(16) << rate.str();
    std::ostringstream pct, noise;
    pct << std::fixed << std::setprecision(1);
    if (rates.contains("pct_of_ceiling")) pct << rates["pct_of_ceiling"].get<double>() << "%";
    noise << std::fixed << std::setprecision(1) << r["time"]["rel_spread"].get<double>() * 100 << "%"
          << (r["time"]["converged"].get<bool>() ? "" : "!");
    out << std::setw(10) << pct.str() << std::setw(8) << noise.str() << '\n';
  }
}

}  // namespace ab::harness
