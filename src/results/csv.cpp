// Exports of stored points for other tools: CSV (spreadsheets) and JSON (`results --json`).
#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <string_view>

#include "results/output.h"
#include "results/results.h"

namespace ab::results {
using nlohmann::json;

namespace {

// A column is a section ("" for top level) and a key in it; its header is "section.key".
struct Column {
  std::string section, key;
  std::string header() const { return section.empty() ? key : section + "." + key; }
};

constexpr std::array<const char*, 7> kFront = {"run_id", "seq", "workload", "device", "device_name", "status", "reason"};
constexpr std::array<const char*, 9> kTime = {"median_s", "mean_s", "min_s",   "max_s",    "p90_s",
                                              "p99_s",    "rel_spread", "count", "converged"};
constexpr std::array<const char*, 4> kRates = {"samples_per_s", "tflops", "gbps", "pct_of_ceiling"};
constexpr std::array<const char*, 3> kTelemetry = {"mean_power_w", "energy_j", "samples_per_j"};
// The load generator's verdict and latency percentiles (docs/RESULTS.md, the scenario block), when
// any point has them: what an MLPerf reader looks for first.
constexpr std::array<const char*, 11> kScenario = {"name",          "result",          "metric.name",   "metric.value",
                                                   "latency_s.p50", "latency_s.p90",   "latency_s.p95", "latency_s.p97",
                                                   "latency_s.p99", "latency_s.p99_9", "latency_s.max"};

// The hardware counters' status and derived figures (docs/RESULTS.md, metrics.counters), when any
// point has them: the characterisation study's columns.
constexpr std::array<const char*, 8> kCounters = {
    "counters.status",           "counters.set",
    "counters.dram_bytes",       "counters.measured_intensity_flop_per_byte",
    "counters.dram_bytes_per_s", "counters.dram_sectors_per_s",
    "counters.achieved_tflops",  "counters.measured_over_modelled_bytes"};

// The key may be dotted (scenario's "latency_s.p99"); params keys are taken whole.
const json* find(const json& record, const Column& c) {
  const json* obj = &record;
  if (!c.section.empty()) {
    const auto s = record.find(c.section);
    if (s == record.end() || !s->is_object()) return nullptr;
    obj = &*s;
  }
  if (c.section == "params") {
    const auto it = obj->find(c.key);
    return it == obj->end() ? nullptr : &*it;
  }
  return find_path(*obj, c.key);
}

std::string cell_text(const json* v) {
  if (v == nullptr || v->is_null()) return {};
  if (v->is_string()) return spreadsheet_safe(v->get<std::string>());
  // Numbers print in nlohmann's shortest round-trip form; objects and arrays as compact JSON.
  return v->dump(-1, ' ', false, json::error_handler_t::replace);
}

// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
void write_field(std::ostream& out, std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) {
    out << s;
    return;
  }
  out << '"';
  for (const char ch : s) {
    if (ch == '"') out << '"';
    out << ch;
  }
  out << '"';
}

void write_row(std::ostream& out, const std::vector<std::string>& fields) {
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) out << ',';
    write_field(out, fields[i]);
  }
  out << '\n';
}

}  // namespace

void write_csv(std::ostream& out, const std::vector<json>& points) {
  std::vector<Column> cols;
  for (const char* k : kFront) cols.push_back({"", k});
  std::set<std::string> param_keys;  // sorted union over all points
  for (const auto& p : points) {
    if (const auto it = p.find("params"); it != p.end() && it->is_object())
      for (const auto& [k, v] : it->items()) param_keys.insert(k);
  }
  for (const auto& k : param_keys) cols.push_back({"params", k});
  for (const char* k : kTime) cols.push_back({"time", k});
  for (const char* k : kRates) cols.push_back({"rates", k});
  auto when_any = [&](const char* section, const auto& keys) {
    for (const char* k : keys) {
      const Column c{section, k};
      if (std::any_of(points.begin(), points.end(),
                      [&c](const json& p) { return p.is_object() && find(p, c) != nullptr; }))
        cols.push_back(c);
    }
  };
  when_any("telemetry", kTelemetry);
  when_any("scenario", kScenario);
  when_any("metrics", kCounters);

  std::vector<std::string> fields;
  fields.reserve(cols.size());
  for (const auto& c : cols) fields.push_back(c.header());
  write_row(out, fields);
  for (const auto& p : points) {
    fields.clear();
    for (const auto& c : cols) fields.push_back(p.is_object() ? cell_text(find(p, c)) : std::string());
    write_row(out, fields);
  }
}

json run_row_json(const RunRow& r) {
  return {{"run_id", r.run_id},
          {"started_at", r.started_at},
          {"ended_at", r.ended_at.empty() ? json(nullptr) : json(r.ended_at)},
          {"status", r.status},
          {"shown_status", r.shown_status},
          {"command_line", r.command_line},
          {"host", r.host.empty() ? json(nullptr) : json(r.host)},
          {"points", r.points},
          {"ok_points", r.ok_points}};
}

void write_json(std::ostream& out, const std::vector<RunRow>& runs) {
  json list = json::array();
  for (const auto& r : runs) list.push_back(run_row_json(r));
  out << list.dump(2, ' ', false, json::error_handler_t::replace) << '\n';
}

void write_json(std::ostream& out, const RunRow& run, const std::vector<json>& points) {
  const json doc = {{"run", run_row_json(run)}, {"points", points}};
  out << doc.dump(2, ' ', false, json::error_handler_t::replace) << '\n';
}

}  // namespace ab::results
