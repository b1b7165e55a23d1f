// Scenario names, the quick and mlperf presets, the refusal of settings that cannot make a valid
// run, and the synthetic sample library.
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "scenarios/scenarios.h"

namespace ab::scenarios {
namespace {

std::string fmt(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

}  // namespace

std::string_view to_string(Scenario s) {
  switch (s) {
    case Scenario::single_stream: return "single-stream";
    case Scenario::multi_stream: return "multi-stream";
    case Scenario::server: return "server";
    case Scenario::offline: return "offline";
  }
  return "?";
}

std::string_view mlperf_name(Scenario s) {
  switch (s) {
    case Scenario::single_stream: return "SingleStream";
    case Scenario::multi_stream: return "MultiStream";
    case Scenario::server: return "Server";
    case Scenario::offline: return "Offline";
  }
  return "?";
}

std::string_view to_string(Preset p) { return p == Preset::quick ? "quick" : "mlperf"; }

Scenario parse_scenario(std::string_view s) {
  for (Scenario v : {Scenario::single_stream, Scenario::multi_stream, Scenario::server, Scenario::offline})
    if (s == to_string(v)) return v;
  throw UsageError("unknown scenario '" + std::string(s) + "'; valid: single-stream, multi-stream, server, offline");
}

Preset parse_preset(std::string_view s) {
  if (s == "quick") return Preset::quick;
  if (s == "mlperf") return Preset::mlperf;
  throw UsageError("unknown preset '" + std::string(s) + "'; valid: quick, mlperf");
}

Settings preset_settings(Preset preset, Scenario scenario) {
  Settings s;
  s.scenario = scenario;
  s.preset = preset;
  const bool official = preset == Preset::mlperf;
  // mlperf: 600 s and the submission checker's minimum query counts (1024; 270,336; 270,336;
  // offline 24,576 samples per query). quick: one second, and counts that still let early
  // stopping decide (64 queries at p90, 662 at p99: docs/METHODOLOGY.md).
  s.min_duration_s = official ? 600.0 : 1.0;
  s.drain_timeout_s = official ? 60.0 : 1.0;
  s.search_min_duration_s = official ? 60.0 : 0.25;
  s.search_min_query_count = official ? 1000 : 500;
  s.search_precision = official ? 0.01 : 0.05;
  switch (scenario) {
    case Scenario::single_stream:
      s.target_percentile = 0.90;
      s.min_query_count = official ? 1024 : 100;
      break;
    case Scenario::multi_stream:
      s.target_percentile = 0.99;
      s.samples_per_query = 8;
      s.min_query_count = official ? 270336 : 662;
      break;
    case Scenario::server:
      s.target_percentile = 0.99;
      s.latency_bound_s = 0.010;  // MLPerf's default server target latency (mlperf.conf: 10 ms)
      s.min_query_count = official ? 270336 : 1000;
      break;
    case Scenario::offline:
      s.target_percentile = 0.90;
      s.min_query_count = official ? 24576 : 1024;
      break;
  }
  return s;
}

void check_settings(const Settings& s) {
  const std::string where = std::string(to_string(s.scenario)) + " (preset " + std::string(to_string(s.preset)) + "): ";
  auto refuse = [&where](const std::string& why) { throw UsageError(where + why); };
  if (!(s.min_duration_s >= 0) || !std::isfinite(s.min_duration_s)) refuse("min_duration must be a finite number >= 0");
  if (!(s.timeout_s > 0)) refuse("the timeout must be positive");
  if (s.timeout_s <= s.min_duration_s)
    refuse("the minimum duration (" + fmt(s.min_duration_s) + " s) does not fit in the run's timeout (" +
           fmt(s.timeout_s) + " s): raise --timeout above " + fmt(s.min_duration_s) + " s");
  if (!(s.drain_timeout_s >= 0)) refuse("the drain timeout must be >= 0");
  if (!(s.target_percentile > 0 && s.target_percentile < 1)) refuse("the target percentile must lie in (0, 1)");
  if (!(s.confidence > 0 && s.confidence < 1)) refuse("the early-stopping confidence must lie in (0, 1)");
  if (!(s.latency_bound_s >= 0) || !std::isfinite(s.latency_bound_s)) refuse("the latency bound must be >= 0");
  if (!(s.target_qps >= 0) || !std::isfinite(s.target_qps)) refuse("target_qps must be a finite number >= 0");
  if (s.samples_per_query < 1) refuse("a query needs at least one sample");
  if (s.scenario != Scenario::multi_stream && s.scenario != Scenario::offline && s.samples_per_query != 1)
    refuse("queries of this scenario hold one sample (got " + std::to_string(s.samples_per_query) + ")");
  if (s.scenario == Scenario::server && s.latency_bound_s <= 0)
    refuse("the server scenario needs a latency bound (latency_bound_ms > 0)");
  const double needed = s.scenario == Scenario::offline ? static_cast<double>(s.min_query_count)
                                                        : static_cast<double>(s.min_query_count * s.samples_per_query);
  if (needed > static_cast<double>(s.max_samples))
    refuse("the minimum query count needs " + fmt(needed) + " samples, above the per-run capacity of " +
           std::to_string(s.max_samples));
  if (s.scenario == Scenario::server && s.target_qps * s.min_duration_s > static_cast<double>(s.max_samples))
    refuse(fmt(s.target_qps) + " QPS for " + fmt(s.min_duration_s) + " s needs more samples than the per-run capacity of " +
           std::to_string(s.max_samples));
  if (s.scenario == Scenario::server && s.target_qps > 0 && s.target_qps * s.timeout_s < 1)
    refuse("at " + fmt(s.target_qps) + " QPS not one query is expected within the timeout");
  if (s.search_precision <= 0 || s.search_max_runs < 1 || s.verify_attempts < 1)
    refuse("the QPS search needs a positive precision, run count and verification attempts");
}

SyntheticLibrary::SyntheticLibrary(std::size_t total, std::size_t performance) : total_(total), performance_(performance) {
  if (total < 1 || performance < 1 || performance > total)
    throw UsageError("a sample library needs 1 <= performance samples (" + std::to_string(performance) +
                     ") <= total samples (" + std::to_string(total) + ")");
}

void SyntheticLibrary::load_samples(std::span<const std::size_t> indices) {
  for (std::size_t i : indices)
    if (i >= total_) throw Error("sample index " + std::to_string(i) + " outside the library of " + std::to_string(total_));
  loaded_ += indices.size();
  ++load_calls_;
}

void SyntheticLibrary::unload_samples(std::span<const std::size_t> indices) {
  loaded_ -= std::min(loaded_, indices.size());
}

}  // namespace ab::scenarios
