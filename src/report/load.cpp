// Loading runs for report and compare: by run id from the store, from a run folder or its
// points.jsonl, or by system name; a corrupt or foreign file is refused with the reason.
#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "report/model.h"
#include "report/report.h"
#include "results/results.h"

namespace ab::report {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_prefix(const fs::path& p, std::size_t n) {
  std::ifstream in(p, std::ios::binary);
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<std::size_t>(in.gcount()));
  return s;
}

json parse_json_file(const fs::path& p, const std::string& what) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error("cannot read " + p.string());
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(p.string() + ": not valid JSON, so not " + what);
  return j;
}

// A trace that cannot be read costs the power chart, never the report.
void attach_trace(Run& run, const fs::path& dir) {
  const fs::path p = dir / "telemetry.json";
  if (!fs::exists(p)) return;
  try {
    json t = parse_json_file(p, "a telemetry trace");
    if (!t.is_object() || (!t.contains("gpus") && !t.contains("host")))
      throw Error(p.string() + ": JSON, but not a telemetry trace (no \"gpus\" or \"host\")");
    run.telemetry_trace = std::move(t);
  } catch (const std::exception& e) {
    run.notes.push_back(std::string(e.what()) + "; the charts over time are left out");
  }
}

void finish_run(Run& run) {
  if (run.context.is_null() || !run.context.is_object()) {
    run.context = json::object();
    for (const auto& p : run.points)
      if (p.contains("context") && p["context"].is_object()) {
        run.context = p["context"];
        break;
      }
  }
  run.external = run.context.value("external", false) == true;
  const auto system = detail::str(run.context, "system");
  run.label = run.external && system ? *system : (run.id.empty() ? run.origin : run.id);
}

Run load_folder(const fs::path& dir, const fs::path& points_file) {
  Run run;
  run.origin = dir.string();
  const fs::path run_json = dir / "run.json";
  if (fs::exists(run_json)) {
    json info = parse_json_file(run_json, "an accelbench run.json");
    if (!info.is_object() || !info.contains("run_id") || !info["run_id"].is_string() || !info.contains("schema_version"))
      throw Error(run_json.string() + ": JSON, but not an accelbench run.json (no run_id or schema_version)");
    if (info["schema_version"].is_number_integer() && info["schema_version"].get<int>() > results::kSchemaVersion)
      throw Error(run_json.string() + ": written by a newer accelbench (schema " + info["schema_version"].dump() + " > " +
                  std::to_string(results::kSchemaVersion) + ")");
    run.id = info["run_id"].get<std::string>();
    if (info.contains("context")) run.context = info["context"];
    info.erase("context");
    run.info = std::move(info);
  }
  if (!fs::exists(points_file)) throw Error(dir.string() + " holds no points.jsonl: not an accelbench run folder");
  auto read = results::read_jsonl(points_file);
  if (read.records.empty() && read.bad_lines > 0)
    throw Error(points_file.string() + ": not an accelbench points file: none of its " + std::to_string(read.bad_lines) +
                " line(s) is a JSON record");
  if (read.records.empty() && !fs::exists(run_json))
    throw Error(points_file.string() + ": holds no records and has no run.json beside it: nothing to report");
  check_records(read.records, points_file.string());
  if (read.bad_lines > 0) {
    constexpr std::size_t kNamed = 10;
    std::string where;
    for (std::size_t i = 0; i < read.bad_line_numbers.size() && i < kNamed; ++i)
      where += (i ? ", " : "") + points_file.string() + ":" + std::to_string(read.bad_line_numbers[i]);
    if (read.bad_line_numbers.size() > kNamed) where += ", ...";
    run.unreadable_lines = read.bad_lines;
    run.notes.push_back(std::to_string(read.bad_lines) + " unparsable line(s) were skipped, not reported: " + where +
                        " (a run killed mid-write leaves one as its last line)");
  }
  run.points = std::move(read.records);
  if (run.info.is_object() && run.info.contains("status") && run.info["status"].is_string())
    run.info["status"] =
        results::displayed_run_status(dir, run.info["status"].get<std::string>(), static_cast<int>(run.points.size()));
  if (run.id.empty() && !run.points.empty()) run.id = detail::str(run.points.front(), "run_id").value_or("");
  if (run.info.is_null()) run.info = {{"run_id", run.id}, {"status", "unknown (no run.json)"}};
  attach_trace(run, dir);
  finish_run(run);
  return run;
}

Run load_from_store(const fs::path& db, const results::RunRow& row, const fs::path& out_dir) {
  Run run;
  run.id = row.run_id;
  run.origin = "store " + db.string();
  run.info = {{"run_id", row.run_id},
              {"started_at", row.started_at},
              {"status", row.shown_status},
              {"command_line", row.command_line}};
  if (!row.ended_at.empty()) run.info["ended_at"] = row.ended_at;
  run.points = results::load_points(db, row.run_id);
  check_records(run.points, db.string() + " run " + row.run_id);
  const fs::path dir = out_dir / "runs" / row.run_id;
  if (fs::exists(dir / "run.json")) {
    try {
      const json info = parse_json_file(dir / "run.json", "an accelbench run.json");
      if (info.is_object() && info.contains("context")) run.context = info["context"];
    } catch (const std::exception& e) {
      run.notes.push_back(e.what());
    }
  }
  attach_trace(run, dir);
  finish_run(run);
  return run;
}

// Normalised point key: 8192 and 8192.0 are the same axis value.
json canonical(const json& v) {
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d == static_cast<double>(static_cast<std::int64_t>(d))) return static_cast<std::int64_t>(d);
  }
  if (v.is_object()) {
    json o = json::object();
    for (const auto& [k, x] : v.items()) o[k] = canonical(x);
    return o;
  }
  return v;
}

}  // namespace

namespace detail {
std::string point_key(const json& rec) {
  return str(rec, "workload").value_or("") + '\n' + canonical(rec.value("params", json::object())).dump();
}
}  // namespace detail

void check_records(const std::vector<json>& records, const std::string& where) {
  for (std::size_t i = 0; i < records.size(); ++i) {
    try {
      results::from_json(records[i]);  // the record type's rules: docs/RESULTS.md, "The record"
    } catch (const Error& e) {
      throw Error(where + ": record " + std::to_string(i + 1) + ": " + e.what());
    }
  }
}

Run load_run(const std::string& what, const fs::path& out_dir) {
  const fs::path p(what);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    if (!fs::exists(p / "points.jsonl") && fs::exists(p / "runs" / "accelbench.db"))
      throw UsageError(what + " is an output folder, not a run folder: pass a run id with --out " + what);
    return load_folder(p, p / "points.jsonl");
  }
  if (fs::is_regular_file(p, ec)) {
    if (read_prefix(p, 16) == std::string("SQLite format 3\0", 16))
      throw UsageError(what + " is a database: pass the folder above its runs/ folder with --out and a run id");
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    if (p.filename() == "run.json") return load_folder(dir, dir / "points.jsonl");
    // Any other file is read as JSON Lines; a foreign one fails the record check with the reason.
    Run run = load_folder(dir, p);
    run.origin = p.string();
    return run;
  }

  const fs::path db = out_dir / "runs" / "accelbench.db";
  if (!fs::exists(db))
    throw UsageError("'" + what + "' is not a run folder or file, and there is no results store at " + db.string() +
                     " to look it up in (pass --out)");
  const auto rows = results::list_runs(db);
  for (const auto& row : rows)
    if (row.run_id == what) return load_from_store(db, row, out_dir);

  // A system name: every run of that host (or imported system), newest point per workload and axes.
  std::vector<const results::RunRow*> mine;
  for (const auto& row : rows)
    if (!row.host.empty() && row.host == what) mine.push_back(&row);
  if (mine.empty()) {
    std::string ids, systems;
    std::set<std::string> hosts;
    for (std::size_t i = 0; i < rows.size() && i < 5; ++i) ids += (ids.empty() ? "" : ", ") + rows[i].run_id;
    for (const auto& row : rows)
      if (!row.host.empty()) hosts.insert(row.host);
    for (const auto& h : hosts) systems += (systems.empty() ? "" : ", ") + h;
    throw UsageError("no run or system '" + what + "' in " + db.string() +
                     (rows.empty() ? "; it holds no runs" : "; newest runs: " + ids + (rows.size() > 5 ? ", ..." : "") +
                                                                (systems.empty() ? "" : "; systems: " + systems)));
  }
  if (mine.size() == 1) return load_from_store(db, *mine.front(), out_dir);
  Run merged;
  merged.id = "system:" + what;
  merged.origin = "store " + db.string();
  std::set<std::string> seen;
  std::vector<std::string> ids;
  for (const auto* row : mine) {  // newest run first
    Run r = load_from_store(db, *row, out_dir);
    ids.push_back(r.id);
    if (merged.context.is_null()) merged.context = r.context;
    Run::Part part{r.id, row->started_at, row->shown_status, row->command_line, r.context, 0};
    for (auto it = r.points.rbegin(); it != r.points.rend(); ++it)
      if (seen.insert(detail::point_key(*it)).second) merged.points.push_back(std::move(*it)), ++part.points_kept;
    merged.merged.push_back(std::move(part));
  }
  std::reverse(merged.points.begin(), merged.points.end());
  std::string list;
  for (const auto& id : ids) list += (list.empty() ? "" : ", ") + id;
  merged.info = {{"status", "merged"}, {"command_line", ""}};
  merged.notes.push_back("system " + what + ": " + std::to_string(ids.size()) + " runs merged (" + list +
                         "), the newest point kept for each workload and set of axis values");
  finish_run(merged);
  merged.label = what;
  return merged;
}

}  // namespace ab::report
