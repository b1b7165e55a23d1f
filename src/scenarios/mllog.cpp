// MLPerf's log files: mlperf_log_summary.txt in LoadGen's own text layout (what people and
// submission checkers read first), and mlperf_log_detail.txt with one ":::MLLOG {json}" line per
// event, LoadGen's keys where one exists and accelbench_* keys for the rest. Written after the run,
// never on the measurement's path.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "scenarios/scenarios.h"

namespace ab::scenarios {
namespace {

std::int64_t ns(double s) { return static_cast<std::int64_t>(std::llround(s * 1e9)); }

std::string percent_key(double p) {  // 0.9 -> "90.00"
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.2f", p * 100);
  return buf;
}

const Constraint* find(const RunResult& r, const char* name) {
  for (const auto& c : r.constraints)
    if (c.name == name) return &c;
  return nullptr;
}

bool met(const RunResult& r, const char* name) {
  const Constraint* c = find(r, name);
  return c == nullptr || c->met;
}

class Lines {
 public:
  void add(std::string_view key, const nlohmann::json& value, double t_ms = 0, bool error = false) {
    lines.push_back(mllog_line(key, value, t_ms, error));
  }
  std::vector<std::string> lines;
};

void add_results(Lines& out, const RunResult& r, double t) {
  const Settings& s = r.settings;
  out.add("result_validity", r.valid ? "VALID" : "INVALID", t);
  out.add("result_perf_constraints_met", met(r, "latency_bound"), t);
  out.add("result_min_duration_met", met(r, "min_duration"), t);
  out.add("result_min_queries_met", met(r, "min_query_count") && met(r, "min_sample_count"), t);
  if (s.scenario != Scenario::offline) {
    out.add("early_stopping_met", r.early_stopping_met, t);
    const Constraint* es = find(r, "early_stopping");
    out.add("early_stopping_result", es != nullptr ? es->detail : "", t);
  }
  out.add("result_query_count", r.queries_issued, t);
  if (s.scenario == Scenario::server) {
    out.add("result_overlatency_query_count", r.overlatency_queries, t);
    out.add("result_scheduled_samples_per_sec", r.scheduled_qps, t);
    out.add("result_completed_samples_per_sec", r.completed_samples_per_s, t);
  } else if (s.scenario == Scenario::offline) {
    out.add("result_samples_per_second", r.completed_samples_per_s, t);
  } else {
    out.add("result_qps_with_loadgen_overhead", r.scheduled_qps, t);
    out.add("result_qps_without_loadgen_overhead",
            r.sample_latency.mean > 0 ? static_cast<double>(s.samples_per_query) / r.sample_latency.mean : 0.0, t);
  }
  const LatencyStats& l = s.scenario == Scenario::multi_stream ? r.query_latency : r.sample_latency;
  out.add("result_min_latency_ns", ns(l.min), t);
  out.add("result_max_latency_ns", ns(l.max), t);
  out.add("result_mean_latency_ns", ns(l.mean), t);
  const std::pair<double, double> pcts[] = {{0.5, l.p50}, {0.9, l.p90}, {0.95, l.p95}, {0.97, l.p97}, {0.99, l.p99}, {0.999, l.p999}};
  for (const auto& [p, v] : pcts) out.add("result_" + percent_key(p) + "_percentile_latency_ns", ns(v), t);
  if (r.early_stopping_met && s.scenario == Scenario::single_stream)
    out.add("early_stopping_latency_ss", ns(r.early_stopping_latency_s), t);
  if (r.early_stopping_met && s.scenario == Scenario::multi_stream)
    out.add("early_stopping_latency_ms", ns(r.early_stopping_latency_s), t);
  out.add("accelbench_failed_constraints", r.failed(), t);
  out.add("accelbench_lost_samples", r.lost_samples, t, r.lost_samples > 0);
  out.add("accelbench_lost_queries", r.lost_queries, t, r.lost_queries > 0);
  out.add("accelbench_metric", {{"name", r.metric_name()}, {"value", r.metric()}}, t);
  const std::uint64_t errors = (r.lost_samples > 0) + (r.duplicate_completions + r.unknown_completions > 0) +
                               !r.sut_failure.empty();
  out.add("num_errors", errors, t);
}

}  // namespace

std::string mllog_line(std::string_view key, const nlohmann::json& value, double time_ms, bool is_error) {
  static const long pid = static_cast<long>(::getpid());
  char t[32];
  std::snprintf(t, sizeof(t), "%.6f", time_ms);
  // The same key order and spacing as LoadGen's lines, so tools that grep them keep working.
  return ":::MLLOG {\"key\": " + nlohmann::json(std::string(key)).dump() + ", \"value\": " +
         value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + ", \"time_ms\": " + t +
         ", \"namespace\": \"mlperf::logging\", \"event_type\": \"POINT_IN_TIME\", \"metadata\": {\"is_error\": " +
         (is_error ? "true" : "false") + ", \"is_warning\": false, \"file\": \"accelbench/scenarios\", \"line_no\": 0, "
         "\"pid\": " + std::to_string(pid) + ", \"tid\": " + std::to_string(pid) + "}}";
}

std::vector<std::string> mllog_summary(const RunResult& r, const LogInfo& info) {
  Lines out;
  const double t = (r.window_end_s - r.window_start_s) * 1e3;
  out.add("loadgen_version", info.version);
  out.add("test_datetime", info.started_at);
  out.add("sut_name", info.sut);
  out.add("effective_scenario", std::string(mlperf_name(r.settings.scenario)));
  out.add("accelbench_preset", std::string(to_string(r.settings.preset)));
  add_results(out, r, t);
  return out.lines;
}

std::vector<std::string> mllog_detail(const RunResult& r, const SearchResult* search, const LogInfo& info) {
  Lines out;
  const Settings& s = r.settings;
  const std::string scenario(mlperf_name(s.scenario));
  const std::string key_prefix = s.scenario == Scenario::single_stream  ? "single_stream"
                                 : s.scenario == Scenario::multi_stream ? "multi_stream"
                                 : s.scenario == Scenario::server       ? "server"
                                                                        : "offline";
  out.add("loadgen_version", info.version);
  out.add("test_datetime", info.started_at);
  out.add("sut_name", info.sut);
  out.add("qsl_name", info.library);
  out.add("qsl_reported_total_count", info.total_samples);
  out.add("qsl_reported_performance_count", info.performance_samples);
  out.add("requested_scenario", scenario);
  out.add("requested_test_mode", search != nullptr ? "FindPeakPerformance" : "PerformanceOnly");
  out.add("accelbench_preset", std::string(to_string(s.preset)));
  out.add("requested_min_duration_ms", s.min_duration_s * 1e3);
  out.add("requested_min_query_count", s.min_query_count);
  out.add("requested_" + key_prefix + "_target_latency_percentile", s.target_percentile);
  if (s.scenario == Scenario::multi_stream) out.add("requested_multi_stream_samples_per_query", s.samples_per_query);
  if (s.latency_bound_s > 0) out.add("requested_" + key_prefix + "_target_latency_ns", ns(s.latency_bound_s));
  if (s.scenario == Scenario::server) out.add("requested_server_target_qps", s.target_qps);
  if (s.scenario == Scenario::offline) out.add("requested_offline_expected_qps", s.target_qps);
  out.add("requested_qsl_rng_seed", s.library_seed);
  out.add("requested_sample_index_rng_seed", s.sample_seed);
  out.add("requested_schedule_rng_seed", s.schedule_seed);
  out.add("accelbench_timeout_ms", s.timeout_s * 1e3);
  out.add("accelbench_drain_timeout_ms", s.drain_timeout_s * 1e3);
  out.add("accelbench_early_stopping_confidence", s.confidence);
  if (search != nullptr) {
    out.add("accelbench_search_probe_samples_per_sec", search->probe_samples_per_s);
    for (const auto& st : search->steps)
      out.add("accelbench_search_run", {{"target_qps", st.target_qps}, {"valid", st.valid}, {"p99_latency_ns", ns(st.p99_s)},
                                        {"failed_constraints", st.failed}, {"verification", st.verification}});
    out.add("accelbench_search_result", {{"found", search->found}, {"peak_qps", search->peak_qps},
                                         {"stop_reason", search->stop_reason}});
  }
  out.add("effective_scenario", scenario);
  out.add("effective_min_duration_ms", s.min_duration_s * 1e3);
  out.add("effective_min_query_count", s.min_query_count);
  out.add("effective_target_latency_percentile", s.target_percentile);
  if (s.latency_bound_s > 0) out.add("effective_target_latency_ns", ns(s.latency_bound_s));
  if (s.scenario == Scenario::server) out.add("effective_target_qps", s.target_qps);
  out.add("effective_samples_per_query", s.samples_per_query);
  out.add("generated_query_count", r.queries_issued);
  out.add("generated_samples_per_query", s.scenario == Scenario::offline ? r.samples_issued : s.samples_per_query);
  for (const auto& note : r.notes) out.add("accelbench_note", note);
  const double t = (r.window_end_s - r.window_start_s) * 1e3;
  out.add("accelbench_issue_lag_ns", {{"mean", ns(r.issue_lag_mean_s)}, {"max", ns(r.issue_lag_max_s)}}, t);
  for (const auto& c : r.constraints)
    out.add("accelbench_constraint", {{"name", c.name}, {"met", c.met}, {"detail", c.detail}}, t, !c.met);
  if (r.lost_samples > 0)
    out.add("error_lost_queries", std::to_string(r.lost_samples) + " samples were never reported", t, true);
  if (!r.sut_failure.empty()) out.add("error_sut_failure", r.sut_failure, t, true);
  add_results(out, r, t);
  return out.lines;
}

namespace {

// LoadGen's "key : value" lines; its DoubleToString prints two decimals.
std::string two_decimals(double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

std::string yes_no(bool v) { return v ? "Yes" : "NO"; }

void latency_block(std::ostream& o, const LatencyStats& l) {
  o << "Min latency (ns)                : " << ns(l.min) << '\n'
    << "Max latency (ns)                : " << ns(l.max) << '\n'
    << "Mean latency (ns)               : " << ns(l.mean) << '\n';
  const std::pair<double, double> pcts[] = {{0.5, l.p50},  {0.9, l.p90},  {0.95, l.p95},
                                            {0.97, l.p97}, {0.99, l.p99}, {0.999, l.p999}};
  for (const auto& [p, v] : pcts) o << percent_key(p) << " percentile latency (ns)   : " << ns(v) << '\n';
}

void headline(std::ostream& o, const RunResult& r) {
  const Settings& s = r.settings;
  const std::string pct = std::to_string(static_cast<int>(std::lround(s.target_percentile * 100)));
  switch (s.scenario) {
    case Scenario::single_stream:
      o << pct << "th percentile latency (ns) : " << ns(r.target_percentile_latency_s) << '\n';
      break;
    case Scenario::multi_stream:
      o << pct << "th percentile latency (ns) : " << ns(r.target_percentile_latency_s) << '\n';
      break;
    case Scenario::server: o << "Scheduled samples per second : " << two_decimals(r.scheduled_qps) << '\n'; break;
    case Scenario::offline: o << "Samples per second: " << r.completed_samples_per_s << '\n'; break;
  }
}

void recommendations(std::ostream& o, const RunResult& r) {
  if (r.valid) return;
  o << "Recommendations:\n";
  for (const auto& c : r.constraints)
    if (!c.met) o << " * " << c.name << (c.detail.empty() ? "" : ": " + c.detail) << '\n';
}

void parameters(std::ostream& o, const RunResult& r, const LogInfo& info) {
  const Settings& s = r.settings;
  o << "samples_per_query : " << s.samples_per_query << '\n';
  if (s.scenario == Scenario::server || s.scenario == Scenario::offline) o << "target_qps : " << s.target_qps << '\n';
  o << "target_latency (ns): " << ns(s.latency_bound_s) << '\n'
    << "min_duration (ms): " << std::llround(s.min_duration_s * 1e3) << '\n'
    << "max_duration (ms): " << std::llround(s.timeout_s * 1e3) << '\n'
    << "min_query_count : " << s.min_query_count << '\n'
    << "qsl_rng_seed : " << s.library_seed << '\n'
    << "sample_index_rng_seed : " << s.sample_seed << '\n'
    << "schedule_rng_seed : " << s.schedule_seed << '\n'
    << "performance_sample_count : " << info.performance_samples << '\n';
}

}  // namespace

std::string loadgen_summary_text(const RunResult& r, const SearchResult* search, const LogInfo& info) {
  const Settings& s = r.settings;
  const char* rule = "================================================\n";
  std::ostringstream o;
  o << rule << "MLPerf Results Summary\n" << rule;
  o << "SUT name : " << info.sut << '\n'
    << "Scenario : " << mlperf_name(s.scenario) << '\n'
    << "Mode     : " << (search != nullptr ? "FindPeakPerformance" : "PerformanceOnly") << '\n';
  headline(o, r);
  o << "Result is : " << (r.valid ? "VALID" : "INVALID") << '\n';
  if (s.scenario == Scenario::server)
    o << "  Performance constraints satisfied : " << yes_no(met(r, "latency_bound")) << '\n';
  o << "  Min duration satisfied : " << yes_no(met(r, "min_duration")) << '\n'
    << "  Min queries satisfied : " << yes_no(met(r, "min_query_count") && met(r, "min_sample_count")) << '\n'
    << "  Early stopping satisfied: " << yes_no(s.scenario == Scenario::offline || r.early_stopping_met) << '\n';
  recommendations(o, r);
  if (s.scenario != Scenario::offline) {
    const Constraint* es = find(r, "early_stopping");
    o << "Early Stopping Result:\n * "
      << (es != nullptr && !es->detail.empty() ? es->detail
          : r.early_stopping_met               ? "Run successful."
                                               : "not met")
      << '\n';
  }
  o << '\n' << rule << "Additional Stats\n" << rule;
  if (s.scenario == Scenario::single_stream) {
    o << "QPS w/ loadgen overhead         : " << two_decimals(r.scheduled_qps) << '\n'
      << "QPS w/o loadgen overhead        : "
      << two_decimals(r.sample_latency.mean > 0 ? 1 / r.sample_latency.mean : 0.0) << "\n\n";
  } else if (s.scenario == Scenario::server) {
    o << "Completed samples per second    : " << two_decimals(r.completed_samples_per_s) << "\n\n";
  } else if (s.scenario == Scenario::multi_stream) {
    o << "Per-query latency:  \n";
    latency_block(o, r.query_latency);
  }
  if (s.scenario != Scenario::multi_stream) latency_block(o, r.sample_latency);
  o << '\n' << rule << "Test Parameters Used\n" << rule;
  parameters(o, r, info);
  const int errors =
      (r.lost_samples > 0) + (r.duplicate_completions + r.unknown_completions > 0) + !r.sut_failure.empty();
  o << '\n'
    << (errors == 0 ? std::string("No errors encountered during test.\n")
                    : std::to_string(errors) + " ERROR(s) encountered. See detailed log.\n");
  return o.str();
}

void write_mllog(const std::filesystem::path& dir, const RunResult& r, const SearchResult* search, const LogInfo& info) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create " + dir.string() + ": " + ec.message());
  std::string detail;
  for (const auto& l : mllog_detail(r, search, info)) detail += l + '\n';
  const std::pair<const char*, std::string> files[] = {
      {"mlperf_log_summary.txt", loadgen_summary_text(r, search, info)}, {"mlperf_log_detail.txt", detail}};
  for (const auto& [name, text] : files) {
    std::ofstream f(dir / name);
    f << text;
    f.flush();
    if (!f) throw Error("cannot write " + (dir / name).string());
  }
}

}  // namespace ab::scenarios
