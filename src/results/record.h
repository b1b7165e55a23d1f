// The result record as a type: every writer builds one and every reader reads one, so the schema
// (docs/RESULTS.md) lives here once. to_json / from_json round-trip today's JSON exactly; blocks and
// fields a record does not carry stay absent (std::optional, empty strings, null JSON).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ab::results {

// Version of the record (schema_version field) and of the database (PRAGMA user_version).
constexpr int kSchemaVersion = 1;

// interrupted: the point in progress at a Ctrl-C/SIGTERM/SIGHUP; timeout: the point ran out of its
// --timeout with fewer samples than the stopping rule's minimum (what was measured is kept).
enum class Status { ok, skipped, oom, diverged, invalid, error, interrupted, timeout, not_converged };
std::string_view to_string(Status s);
// Throws ab::Error naming the valid statuses for any other word.
Status parse_status(std::string_view s);

// What one iteration does.
struct Counts {
  double samples = 0, flops = 0, bytes = 0;
  std::string ops_unit = "FLOP";  // "OP" for integer arithmetic
  double tokens = 0;              // per iteration, for language models (written only when > 0)
};

// Timing statistics of one iteration, in seconds. Every field is optional because imported
// (published) figures carry only the few they were given; a measured point carries all of them.
// A non-finite number, stored as null, reads back as NaN.
struct TimeStats {
  std::optional<std::string> mode, stop_reason;
  std::optional<bool> converged;
  std::optional<std::int64_t> iterations_per_sample, total_iterations, count;
  std::optional<double> measured_s, window_start_s, window_end_s;
  std::optional<double> median_s, mean_s, min_s, max_s, p90_s, p99_s, q1_s, q3_s, iqr_s, stddev_s, rel_spread;
  std::optional<std::vector<double>> samples_s;  // every sample's per-iteration time; absent on the console
};

// The ceiling a point was divided by, or the one it publishes (source "this point").
struct CeilingRef {
  std::string key, unit, source;
  double value = 0;
};

// Rates derived from counts and the median time (results/derived.h computes them).
struct Rates {
  std::optional<double> samples_per_s, tflops, gbps, pct_of_ceiling;
  std::optional<double> tokens_per_s;  // language models
  std::optional<CeilingRef> ceiling;
  std::string primary;  // "tflops", "gbps" or "samples_per_s"; "" = absent
  // The primary rate's value, if the record has it.
  std::optional<double> primary_value() const;
};

struct Record {
  int schema_version = kSchemaVersion;
  std::string run_id;
  std::optional<std::int64_t> seq;  // absent: the store numbers it
  std::string workload, device, device_name, started_at;  // "" = absent
  nlohmann::json params = nlohmann::json::object();       // axis values by name
  nlohmann::json options;  // a workload's tuning options; written only when a non-empty object
  Status status = Status::ok;
  std::string reason;  // why not ok; "" = absent
  std::optional<double> wall_s;
  std::optional<Counts> counts;
  nlohmann::json check;  // free-form blocks: null = absent
  nlohmann::json metrics;
  std::optional<TimeStats> time;
  std::optional<Rates> rates;
  nlohmann::json scenario, telemetry, context;
  // Imported published figures (`accelbench import`): the system and the sources they came from.
  bool external = false;
  std::string system, source;
  nlohmann::json extra = nlohmann::json::object();  // any other top-level field, kept as read

  bool ok() const { return status == Status::ok; }
  // A time statistic or a rate where the record has it and it is finite:
  // rec.time_of(&TimeStats::median_s), rec.rate_of(&Rates::gbps).
  std::optional<double> time_of(std::optional<double> TimeStats::*field) const;
  std::optional<double> rate_of(std::optional<double> Rates::*field) const;
  // A number of the free-form blocks by dotted path ("gpus.0.mean_sm_clock_mhz"); finite only.
  std::optional<double> metric(std::string_view dotted) const;
  std::optional<double> telemetry_number(std::string_view dotted) const;
  // metrics.scaling_efficiency = rate(n) / (n × rate(1)), where the workload measured it.
  std::optional<double> scaling_efficiency() const { return metric("scaling_efficiency"); }
};

nlohmann::json to_json(const Record& r);
// Throws ab::Error "<what is wrong>" for a record that is not an object, lacks workload or status,
// has a status outside the valid ones, a field of the wrong type, or a newer schema_version.
Record from_json(const nlohmann::json& j);

// Dotted lookup in JSON (a number indexes an array); nullptr where absent.
const nlohmann::json* find_path(const nlohmann::json& j, std::string_view dotted);

}  // namespace ab::results
