// `accelbench import`: published figures from a CSV file (schema in docs/RESULTS.md, "External
// results") become one run of records marked external, so reports and comparisons can show them
// beside measurements. The whole file is checked before anything is stored.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "results/results.h"

namespace ab::results {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::uintmax_t kMaxBytes = 64ull << 20;
const char* const kHeader[] = {"workload", "params", "metric", "value", "unit", "source"};

// Where a metric goes in the record and the units it may be given in (with the factor to ours).
struct MetricSpec {
  const char* name;
  const char* section;  // rates, time, telemetry
  const char* key;
  std::vector<std::pair<std::string, double>> units;
};

const std::vector<MetricSpec>& metrics() {
  static const std::vector<MetricSpec> m = {
      {"samples_per_s", "rates", "samples_per_s",
       {{"samples/s", 1}, {"images/s", 1}, {"sequences/s", 1}, {"tokens/s", 1}, {"queries/s", 1}, {"items/s", 1}}},
      {"tflops", "rates", "tflops", {{"TFLOP/s", 1}, {"TFLOPS", 1}, {"TOP/s", 1}, {"TOPS", 1}, {"GFLOP/s", 1e-3}, {"GFLOPS", 1e-3}}},
      {"gbps", "rates", "gbps", {{"GB/s", 1}, {"TB/s", 1e3}, {"MB/s", 1e-3}}},
      {"samples_per_j", "telemetry", "samples_per_j", {{"samples/J", 1}, {"images/J", 1}, {"sequences/J", 1}, {"tokens/J", 1}}},
      {"mean_power_w", "telemetry", "mean_power_w", {{"W", 1}}},
      {"median_s", "time", "median_s", {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"µs", 1e-6}}},
      {"p90_s", "time", "p90_s", {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"µs", 1e-6}}},
      {"p99_s", "time", "p99_s", {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"µs", 1e-6}}},
  };
  return m;
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

struct Row {
  std::size_t line = 0;  // 1-based line where the record starts
  std::vector<std::string> fields;
};

// RFC 4180 records: quoted fields may hold commas, doubled quotes and line breaks.
std::vector<Row> parse_csv(const std::string& text, const std::string& file) {
  std::vector<Row> rows;
  Row row;
  std::string field;
  bool quoted = false, was_quoted = false;
  std::size_t line = 1;
  row.line = 1;
  auto end_field = [&] {
    row.fields.push_back(was_quoted ? field : trim(field));
    field.clear();
    was_quoted = false;
  };
  auto end_row = [&] {
    end_field();
    const bool blank = row.fields.size() == 1 && row.fields[0].empty() && !was_quoted;
    const bool comment = !row.fields.empty() && !row.fields[0].empty() && row.fields[0][0] == '#';
    if (!blank && !comment) rows.push_back(std::move(row));
    row = Row{};
    row.line = line;
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') field += '"', ++i;
      else if (c == '"') quoted = false;
      else {
        if (c == '\n') ++line;
        field += c;
      }
      continue;
    }
    if (c == '"' && trim(field).empty()) quoted = true, was_quoted = true, field.clear();
    else if (c == '"') throw UsageError(file + ":" + std::to_string(line) + ": a quote inside an unquoted field (quote the whole field)");
    else if (c == ',') end_field();
    else if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') continue;
    else if (c == '\n') ++line, end_row();
    else field += c;
  }
  if (quoted) throw UsageError(file + ":" + std::to_string(row.line) + ": a quoted field is never closed");
  if (!field.empty() || !row.fields.empty()) end_row();
  return rows;
}

json parse_value(const std::string& v) {
  char* end = nullptr;
  if (v.find_first_not_of("-0123456789") == std::string::npos && v != "-") {
    errno = 0;
    const long long i = std::strtoll(v.c_str(), &end, 10);
    if (errno == 0 && *end == '\0') return i;
  }
  if (v.find_first_not_of("-+.0123456789eE") == std::string::npos) {
    const double d = std::strtod(v.c_str(), &end);
    if (*end == '\0' && std::isfinite(d)) return d;
  }
  return v;
}

json parse_params(const std::string& text, const std::string& at) {
  json params = json::object();
  if (text.empty()) return params;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ';')) {
    part = trim(part);
    if (part.empty()) continue;
    const auto eq = part.find('=');
    if (eq == std::string::npos) throw UsageError(at + "params '" + part + "' is not name=value (params are name=value;name=value)");
    const std::string k = trim(part.substr(0, eq)), v = trim(part.substr(eq + 1));
    if (k.empty() || k.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != std::string::npos)
      throw UsageError(at + "axis name '" + k + "' must be letters, digits, '_', '.' or '-'");
    if (v.empty()) throw UsageError(at + "axis '" + k + "' has no value");
    if (params.contains(k)) throw UsageError(at + "axis '" + k + "' is given twice");
    params[k] = parse_value(v);
  }
  return params;
}

bool printable(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  return true;
}

}  // namespace

ImportResult import_csv(const fs::path& csv, const std::string& system, const fs::path& out_dir,
                        const std::string& command_line, const AxisDefaults& defaults) {
  const std::string file = csv.string();
  if (system.empty() || system.size() > 128 || !printable(system) || !valid_utf8(system))
    throw UsageError("--system must be 1-128 printable characters");
  std::error_code ec;
  if (!fs::is_regular_file(csv, ec)) throw UsageError(file + ": no such file");
  if (fs::file_size(csv, ec) > kMaxBytes) throw UsageError(file + ": larger than 64 MiB; not an import table");
  std::ifstream in(csv, std::ios::binary);
  if (!in) throw Error("cannot read " + file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (const auto nul = text.find('\0'); nul != std::string::npos)
    throw UsageError(file + ": binary data (a NUL byte at offset " + std::to_string(nul) + "): not a CSV file");
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  {
    std::size_t line = 1, start = 0;
    for (std::size_t i = 0; i <= text.size(); ++i)
      if (i == text.size() || text[i] == '\n') {
        if (!valid_utf8(text.substr(start, i - start))) throw UsageError(file + ":" + std::to_string(line) + ": not UTF-8 text");
        ++line, start = i + 1;
      }
  }
  const auto rows = parse_csv(text, file);
  if (rows.empty()) throw UsageError(file + ": empty; the first line must be the header workload,params,metric,value,unit,source");
  {
    const auto& h = rows.front();
    bool ok = h.fields.size() == 6;
    for (std::size_t i = 0; ok && i < 6; ++i) {
      std::string f = h.fields[i];
      for (auto& ch : f) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      ok = f == kHeader[i];
    }
    if (!ok)
      throw UsageError(file + ":" + std::to_string(h.line) + ": the header must be workload,params,metric,value,unit,source (see docs/RESULTS.md)");
  }
  if (rows.size() == 1) throw UsageError(file + ": a header and no rows; nothing to import");

  struct Point {
    std::string workload;
    json params, record = json::object();
    std::map<std::string, std::size_t> metric_line;
    std::vector<std::string> sources;
  };
  std::vector<Point> points;
  std::map<std::string, std::size_t> index;
  for (std::size_t r = 1; r < rows.size(); ++r) {
    const Row& row = rows[r];
    const std::string at = file + ":" + std::to_string(row.line) + ": ";
    if (row.fields.size() != 6)
      throw UsageError(at + "expected 6 fields (workload,params,metric,value,unit,source), found " + std::to_string(row.fields.size()));
    const std::string &workload = row.fields[0], &metric = row.fields[2], &value_text = row.fields[3], &unit = row.fields[4],
                      &source = row.fields[5];
    if (workload.empty() || workload.size() > 128 || !printable(workload)) throw UsageError(at + "workload must be 1-128 printable characters");
    if (source.empty()) throw UsageError(at + "source is empty: every published figure needs its source (paper, table, URL)");
    if (!printable(source)) throw UsageError(at + "source has control characters");
    json params = parse_params(row.fields[1], at);
    std::vector<std::string> defaulted;  // axes the row left out, at the workload's single default
    if (defaults) {
      const json d = defaults(workload);
      if (d.is_object())
        for (const auto& [k, v] : d.items())
          if (!params.contains(k)) params[k] = v, defaulted.push_back(k);
    }
    const MetricSpec* spec = nullptr;
    for (const auto& m : metrics())
      if (metric == m.name) spec = &m;
    if (!spec) {
      std::string valid;
      for (const auto& m : metrics()) valid += (valid.empty() ? "" : ", ") + std::string(m.name);
      throw UsageError(at + "unknown metric '" + metric + "'; valid: " + valid);
    }
    double factor = 0;
    std::string units;
    for (const auto& [u, f] : spec->units) {
      units += (units.empty() ? "" : ", ") + u;
      if (unit == u) factor = f;
    }
    if (factor == 0) throw UsageError(at + "unit '" + unit + "' does not fit metric " + metric + "; valid: " + units);
    char* end = nullptr;
    const double value = std::strtod(value_text.c_str(), &end);
    if (value_text.empty() || *end != '\0' || !std::isfinite(value)) throw UsageError(at + "value '" + value_text + "' is not a number");
    if (value <= 0) throw UsageError(at + "value " + value_text + " must be positive");

    const std::string key = workload + '\n' + params.dump();
    auto [it, added] = index.emplace(key, points.size());
    if (added) points.push_back({workload, params, json::object(), {}, {}});
    if (added && !defaulted.empty()) points.back().record["metrics"]["defaulted_axes"] = defaulted;
    Point& p = points[it->second];
    if (const auto seen = p.metric_line.find(metric); seen != p.metric_line.end())
      throw UsageError(at + "metric " + metric + " of this point was already given on line " + std::to_string(seen->second));
    p.metric_line[metric] = row.line;
    p.record[spec->section][spec->key] = value * factor;
    p.record["units"][metric] = unit;
    p.record["sources"][metric] = source;
    if (std::find(p.sources.begin(), p.sources.end(), source) == p.sources.end()) p.sources.push_back(source);
  }

  const json context = {{"system", system}, {"external", true}, {"host", {{"hostname", system}}},
                        {"source_file", csv.filename().string()}, {"command_line", command_line}};
  ImportResult result;
  result.run_id = new_run_id();
  result.rows = rows.size() - 1;
  std::vector<json> records;
  for (auto& p : points) {
    json rec = {{"schema_version", kSchemaVersion}, {"run_id", result.run_id}, {"workload", p.workload}, {"device", "external"},
                {"system", system}, {"params", p.params}, {"status", "ok"}, {"external", true}};
    std::string src;
    for (const auto& s : p.sources) src += (src.empty() ? "" : "; ") + s;
    rec["source"] = src;
    for (const auto& [k, v] : p.record.items()) rec[k] = v;
    if (rec.contains("rates")) {
      if (rec["rates"].contains("tflops")) rec["rates"]["primary"] = "tflops";
      else if (rec["rates"].contains("gbps")) rec["rates"]["primary"] = "gbps";
    }
    rec["context"] = context;
    records.push_back(std::move(rec));
  }
  store_whole_run(out_dir, RunInfo{result.run_id, utc_now_iso8601(), command_line, context}, records, "external");
  result.points = records.size();
  return result;
}

}  // namespace ab::results
