// Tables that are no chart's: the load generator's results in MLPerf's terms, and the settings of
// the runs a system name merged.
#include <algorithm>
#include <map>
#include <set>

#include "report/charts.h"

namespace ab::report::detail {
using nlohmann::json;

namespace {

Cell latency_cell(const json& latency, const char* key) {
  const auto v = num(latency, key);
  Cell c = text_cell(v ? fmt_time(*v) : "—");
  c.numeric = true;
  return c;
}

// "latency_p90_early_stopping_s" is a time; the rest are rates in samples/s.
Cell metric_cell(const json& scenario) {
  const std::string name = str(scenario, "metric.name").value_or("");
  const auto value = num(scenario, "metric.value");
  const bool time =
      name.size() > 2 && name.compare(name.size() - 2, 2, "_s") == 0 && name.find("per_s") == std::string::npos;
  Cell c = text_cell(!value ? "—" : time ? fmt_time(*value) : fmt(*value) + " samples/s");
  c.numeric = true;
  return c;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Every setting as "dotted.path" -> text, for telling runs apart; start times differ by nature, and
// the command line has a row of its own.
void flatten(const json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      const std::string path = prefix.empty() ? k : prefix + "." + k;
      if (ends_with(k, "_at") || path == "command_line") continue;
      flatten(v, path, out);
    }
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) flatten(j[i], prefix + "." + std::to_string(i), out);
  } else {
    out[prefix] = fmt_param(j);
  }
}

}  // namespace

std::optional<Table> loadgen_table(const std::vector<Point>& points, const AxisPlan& plan, bool multi_run) {
  Table t;
  t.caption =
      "results in MLPerf's terms: the scenario's metric and LoadGen's verdict (docs/METHODOLOGY.md, Load generator)";
  t.columns = point_columns(plan, multi_run);
  for (const char* c :
       {"MLPerf scenario", "metric", "value", "result", "p50", "p90", "p99", "p99.9", "constraints not met"})
    t.columns.push_back(c);
  for (const auto& p : points) {
    const json& sc = p.typed().scenario;
    if (!sc.is_object() || !sc.contains("result")) continue;
    auto row = point_cells(p, plan, multi_run);
    // Multi-stream is judged per query (8 samples), the others per sample.
    const json* latency = at_path(sc, sc.contains("query_latency_s") ? "query_latency_s" : "latency_s");
    const json none = json::object();
    const json& lat = latency ? *latency : none;
    std::string failed;
    if (const json* f = at_path(sc, "failed_constraints"); f && f->is_array())
      for (const auto& c : *f) failed += (failed.empty() ? "" : ", ") + fmt_param(c);
    const std::string verdict = str(sc, "result").value_or("?");
    row.push_back(text_cell(str(sc, "mlperf_name").value_or(str(sc, "name").value_or("?"))));
    row.push_back(text_cell(str(sc, "metric.name").value_or("—")));
    row.push_back(metric_cell(sc));
    row.push_back(Cell{"", {verdict}, failed, false});
    for (const char* k : {"p50", "p90", "p99", "p99_9"}) row.push_back(latency_cell(lat, k));
    row.push_back(text_cell(failed.empty() ? "—" : failed));
    t.rows.push_back(std::move(row));
  }
  if (t.rows.empty()) return std::nullopt;
  return t;
}

std::optional<Table> merged_runs_table(const Run& run) {
  if (run.merged.size() < 2) return std::nullopt;
  Table t;
  t.caption = run.label + ": the runs merged, and every setting in which they differ";
  t.columns.push_back("");
  for (const auto& part : run.merged) t.columns.push_back(part.id);
  auto row = [&t](const std::string& name, const std::vector<std::string>& values) {
    std::vector<Cell> cells{text_cell(name)};
    for (const auto& v : values) cells.push_back(text_cell(v.empty() ? "—" : v));
    t.rows.push_back(std::move(cells));
  };
  std::vector<std::string> started, status, kept;
  std::vector<std::map<std::string, std::string>> settings;
  std::set<std::string> keys;
  for (const auto& part : run.merged) {
    started.push_back(part.started_at);
    status.push_back(part.status);
    kept.push_back(std::to_string(part.points_kept));
    settings.emplace_back();
    settings.back()["command line"] = part.command_line;
    flatten(part.context, "", settings.back());
    for (const auto& [k, v] : settings.back()) keys.insert(k);
  }
  row("started (UTC)", started);
  row("status", status);
  row("points kept (newest per workload and axes)", kept);
  int same = 0;
  for (const auto& k : keys) {
    std::vector<std::string> values;
    for (const auto& s : settings) values.push_back(s.count(k) ? s.at(k) : "");
    if (std::all_of(values.begin(), values.end(), [&values](const std::string& v) { return v == values.front(); })) {
      ++same;
      continue;
    }
    row(k, values);
  }
  t.caption += " (" + std::to_string(same) + " other settings are the same in all of them)";
  return t;
}

}  // namespace ab::report::detail
