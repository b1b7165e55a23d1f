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

const json* find(const json& record, const Column& c) {
  const json* obj = &record;
  if (!c.section.empty()) {
    const auto s = record.find(c.section);
    if (s == record.end() || !s->is_object()) return nullptr;
    obj = &*s;
  }
  const auto it = obj->find(c.key);
  return it == obj->end() ? nullptr : &*it;
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
  for (const char* k : kTelemetry) {
    const Column c{"telemetry", k};
    for (const auto& p : points) {
      if (find(p, c) != nullptr) {
        cols.push_back(c);
        break;
      }
    }
  }

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

}  // namespace ab::results
