// A run's verdict and figures as JSON: the `scenario` block of a record (docs/RESULTS.md).
#include <cmath>
#include <sstream>

#include "scenarios/scenarios.h"

namespace ab::scenarios {
namespace {

std::string pct_name(double p) {
  std::ostringstream o;
  o << "p" << std::round(p * 1000) / 10;  // 0.9 -> p90, 0.999 -> p99.9
  return o.str();
}

nlohmann::json stats_json(const LatencyStats& s) {
  return {{"count", s.count}, {"min", s.min},   {"mean", s.mean}, {"p50", s.p50},   {"p90", s.p90},
          {"p95", s.p95},     {"p97", s.p97},   {"p99", s.p99},   {"p99_9", s.p999}, {"max", s.max}};
}

nlohmann::json settings_json(const Settings& s) {
  nlohmann::json j = {{"min_duration_s", s.min_duration_s},   {"min_query_count", s.min_query_count},
                      {"timeout_s", s.timeout_s},             {"drain_timeout_s", s.drain_timeout_s},
                      {"target_percentile", s.target_percentile}, {"confidence", s.confidence},
                      {"samples_per_query", s.samples_per_query}, {"schedule_seed", s.schedule_seed},
                      {"sample_seed", s.sample_seed},         {"library_seed", s.library_seed},
                      {"max_samples", s.max_samples}};
  if (s.latency_bound_s > 0) j["latency_bound_s"] = s.latency_bound_s;
  if (s.scenario == Scenario::server)
    j["search"] = {{"min_duration_s", s.search_min_duration_s}, {"min_query_count", s.search_min_query_count},
                   {"precision", s.search_precision}, {"max_runs", s.search_max_runs},
                   {"verify_attempts", s.verify_attempts}};
  return j;
}

}  // namespace

std::vector<std::string> RunResult::failed() const {
  std::vector<std::string> out;
  for (const auto& c : constraints)
    if (!c.met) out.push_back(c.name);
  return out;
}

std::string RunResult::metric_name() const {
  switch (settings.scenario) {
    case Scenario::single_stream: return "latency_" + pct_name(settings.target_percentile) + "_early_stopping_s";
    case Scenario::multi_stream: return "query_latency_" + pct_name(settings.target_percentile) + "_early_stopping_s";
    case Scenario::server: return "completed_samples_per_s";
    case Scenario::offline: return "samples_per_s";
  }
  return "";
}

double RunResult::metric() const {
  switch (settings.scenario) {
    case Scenario::single_stream:
    case Scenario::multi_stream: return early_stopping_met ? early_stopping_latency_s : target_percentile_latency_s;
    case Scenario::server:
    case Scenario::offline: return completed_samples_per_s;
  }
  return 0;
}

nlohmann::json to_json(const RunResult& r) {
  const Settings& s = r.settings;
  nlohmann::json constraints = nlohmann::json::array();
  for (const auto& c : r.constraints) constraints.push_back({{"name", c.name}, {"met", c.met}, {"detail", c.detail}});
  nlohmann::json j = {{"name", std::string(to_string(s.scenario))},
                      {"mlperf_name", std::string(mlperf_name(s.scenario))},
                      {"preset", std::string(to_string(s.preset))},
                      {"result", r.valid ? "VALID" : "INVALID"},
                      {"valid", r.valid},
                      {"failed_constraints", r.failed()},
                      {"constraints", constraints},
                      {"metric", {{"name", r.metric_name()}, {"value", r.metric()}}},
                      {"queries_issued", r.queries_issued},
                      {"samples_issued", r.samples_issued},
                      {"samples_completed", r.samples_completed},
                      {"lost_samples", r.lost_samples},
                      {"lost_queries", r.lost_queries},
                      {"duplicate_completions", r.duplicate_completions},
                      {"unknown_completions", r.unknown_completions},
                      {"duration_s", r.duration_s},
                      {"last_completion_s", r.last_completion_s},
                      {"completed_samples_per_s", r.completed_samples_per_s},
                      {"scheduled_qps", r.scheduled_qps},
                      {"issue_lag_s", {{"mean", r.issue_lag_mean_s}, {"max", r.issue_lag_max_s}}},
                      {"target_percentile", s.target_percentile},
                      {"target_percentile_latency_s", r.target_percentile_latency_s},
                      {"latency_s", stats_json(r.sample_latency)},
                      {"interrupted", r.interrupted},
                      {"settings", settings_json(s)}};
  if (s.scenario == Scenario::multi_stream) j["query_latency_s"] = stats_json(r.query_latency);
  if (s.scenario == Scenario::server) j["target_qps"] = s.target_qps;
  if (s.latency_bound_s > 0) j["latency_bound_s"] = s.latency_bound_s;
  if (s.scenario != Scenario::offline) {
    nlohmann::json es = {{"met", r.early_stopping_met}, {"confidence", s.confidence}, {"percentile", s.target_percentile}};
    if (s.scenario == Scenario::server) {
      es["overlatency_queries"] = r.overlatency_queries;
      es["queries_needed"] = r.queries_needed;
    } else {
      es["min_queries"] = r.queries_needed;
      if (r.early_stopping_met) es["latency_s"] = r.early_stopping_latency_s;
    }
    j["early_stopping"] = es;
  }
  if (!r.sut_failure.empty()) j["sut_failure"] = r.sut_failure;
  if (!r.notes.empty()) j["notes"] = r.notes;
  return j;
}

nlohmann::json to_json(const SearchResult& s) {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& st : s.steps)
    steps.push_back({{"target_qps", st.target_qps}, {"valid", st.valid}, {"p99_s", st.p99_s},
                     {"failed_constraints", st.failed}, {"verification", st.verification}});
  return {{"found", s.found}, {"peak_qps", s.peak_qps}, {"probe_samples_per_s", s.probe_samples_per_s},
          {"stop_reason", s.stop_reason}, {"runs", steps}};
}

}  // namespace ab::scenarios
