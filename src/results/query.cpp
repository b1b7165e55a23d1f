#include <string>

#include "core/error.h"
#include "results/db.h"
#include "results/results.h"

namespace ab::results {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json parse_stored(const detail::Db& db, const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(db.path().string() + ": " + what + " is not valid JSON");
  return j;
}

}  // namespace

std::vector<RunRow> list_runs(const fs::path& db_path) {
  detail::Db db(db_path, detail::Db::Mode::existing);
  detail::Stmt q(db,
                 "SELECT r.run_id, r.started_at, r.ended_at, r.status, r.command_line, r.host, "
                 "       COUNT(p.seq), COALESCE(SUM(p.status = 'ok'), 0) "
                 "FROM runs r LEFT JOIN points p ON p.run_id = r.run_id "
                 "GROUP BY r.run_id ORDER BY r.started_at DESC, r.run_id DESC");
  std::vector<RunRow> rows;
  while (q.step()) {
    RunRow r;
    r.run_id = q.text(0);
    r.started_at = q.text(1);
    r.ended_at = q.text(2);
    r.status = q.text(3);
    r.command_line = q.text(4);
    r.host = q.text(5);
    r.points = static_cast<int>(q.int64(6));
    r.ok_points = static_cast<int>(q.int64(7));
    r.shown_status = displayed_run_status(db_path.parent_path() / r.run_id, r.status, r.points);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<json> load_points(const fs::path& db_path, const std::string& run_id) {
  detail::Db db(db_path, detail::Db::Mode::existing);
  {
    detail::Stmt known(db, "SELECT 1 FROM runs WHERE run_id = ?1");
    known.bind_text(1, run_id);
    if (!known.step()) {
      constexpr int kShown = 5;
      detail::Stmt newest(db, "SELECT run_id FROM runs ORDER BY started_at DESC, run_id DESC LIMIT ?1");
      newest.bind_int(1, kShown + 1);
      std::string ids;
      int n = 0;
      while (newest.step()) {
        if (++n > kShown) {
          ids += ", ...";
          break;
        }
        ids += (ids.empty() ? "" : ", ") + newest.text(0);
      }
      throw UsageError("no run '" + run_id + "' in " + db_path.string() +
                       (ids.empty() ? "; it holds no runs" : "; newest runs: " + ids));
    }
  }
  detail::Stmt q(db, "SELECT seq, record_json FROM points WHERE run_id = ?1 ORDER BY seq");
  q.bind_text(1, run_id);
  std::vector<json> points;
  while (q.step())
    points.push_back(parse_stored(db, q.text(1), "record of run " + run_id + " seq " + std::to_string(q.int64(0))));
  return points;
}

std::optional<json> latest_point(const fs::path& db_path, const std::string& workload, const std::string& device_name,
                                 const json& params_subset) {
  if (!params_subset.is_null() && !params_subset.is_object())
    throw Error("latest_point: params_subset must be a JSON object, got " + std::string(params_subset.type_name()));
  detail::Db db(db_path, detail::Db::Mode::existing);
  // Newest by the point's own start time, falling back to its run's; the (workload, device_name)
  // index narrows the scan, and params are matched here because JSON number types (8192 vs
  // 8192.0) compare equal in nlohmann::json but not as SQL text.
  detail::Stmt q(db,
                 "SELECT p.run_id, p.seq, p.params_json, p.record_json FROM points p "
                 "LEFT JOIN runs r ON r.run_id = p.run_id "
                 "WHERE p.workload = ?1 AND p.device_name = ?2 AND p.status = 'ok' "
                 "ORDER BY COALESCE(p.started_at, r.started_at) DESC, p.run_id DESC, p.seq DESC");
  q.bind_text(1, workload).bind_text(2, device_name);
  while (q.step()) {
    const std::string where = "run " + q.text(0) + " seq " + std::to_string(q.int64(1));
    const json params = parse_stored(db, q.text(2), "params of " + where);
    bool match = params.is_object();
    if (match && params_subset.is_object()) {
      for (const auto& [key, value] : params_subset.items()) {
        const auto it = params.find(key);
        if (it == params.end() || *it != value) {
          match = false;
          break;
        }
      }
    }
    if (match) return parse_stored(db, q.text(3), "record of " + where);
  }
  return std::nullopt;
}

namespace {

// Whether a stored record set ceiling `key`: an ok point whose rates.ceiling is itself.
bool sets_ceiling(const json& record, const std::string& key) {
  const json* c = find_path(record, "rates.ceiling");
  return record.value("status", "") == "ok" && c != nullptr && c->is_object() && c->value("key", "") == key &&
         c->value("source", "") == "this point" && c->contains("value") && (*c)["value"].is_number();
}

}  // namespace

std::optional<json> best_stored_ceiling(const fs::path& db_path, const std::string& device_name,
                                        const std::string& key) {
  detail::Db db(db_path, detail::Db::Mode::existing);
  // The newest run whose ceilings workload measured `key` on this device...
  detail::Stmt newest(db,
                      "SELECT p.run_id, p.seq, p.record_json FROM points p LEFT JOIN runs r ON r.run_id = p.run_id "
                      "WHERE p.workload = 'ceilings' AND p.device_name = ?1 AND p.status = 'ok' "
                      "ORDER BY COALESCE(p.started_at, r.started_at) DESC, p.run_id DESC, p.seq DESC");
  newest.bind_text(1, device_name);
  std::string run_id;
  while (run_id.empty() && newest.step())
    if (sets_ceiling(parse_stored(db, newest.text(2), "record of run " + newest.text(0)), key)) run_id = newest.text(0);
  if (run_id.empty()) return std::nullopt;
  // ... and its best point for it: the ceilings workload's and those that raised it later in the run.
  detail::Stmt q(db, "SELECT seq, record_json FROM points WHERE run_id = ?1 AND device_name = ?2 AND status = 'ok'");
  q.bind_text(1, run_id).bind_text(2, device_name);
  std::optional<json> best;
  while (q.step()) {
    json record = parse_stored(db, q.text(1), "record of run " + run_id + " seq " + std::to_string(q.int64(0)));
    if (sets_ceiling(record, key) && (!best || record["rates"]["ceiling"]["value"].get<double>() >
                                                   (*best)["rates"]["ceiling"]["value"].get<double>()))
      best = std::move(record);
  }
  return best;
}

}  // namespace ab::results
