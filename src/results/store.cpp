#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <system_error>
#include <unordered_set>

#include <signal.h>
#include <unistd.h>

#include "core/error.h"
#include "results/db.h"
#include "results/files.h"
#include "results/results.h"

namespace ab::results {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The run id becomes a directory name: keep it to characters that are safe everywhere.
void check_run_id(const std::string& id) {
  const bool ok = !id.empty() && id.size() <= 128 && id.front() != '.' &&
                  id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
                      std::string::npos;
  if (!ok) throw UsageError("run id '" + id + "' must be 1-128 of [A-Za-z0-9._-], not starting with '.'");
}

std::optional<std::string> string_field(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

// Invalid UTF-8 (say, in an error message from a driver) must not cost the point: replace it.
std::string dump_line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// "external": a run of published figures brought in by `accelbench import`, not measured.
bool valid_final_status(const std::string& s) {
  return s == "complete" || s == "interrupted" || s == "failed" || s == "external";
}

// One row of the points table; the caller holds the transaction.
void insert_point(detail::Db& db, const std::string& run_id, std::int64_t seq, const std::string& workload,
                  const std::string& status, const json& record, const std::string& line) {
  detail::Stmt ins(db,
                   "INSERT INTO points(run_id, seq, workload, status, device_name, params_json, record_json, "
                   "started_at) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
  ins.bind_text(1, run_id).bind_int(2, seq).bind_text(3, workload).bind_text(4, status);
  if (const auto dev = string_field(record, "device_name")) {
    ins.bind_text(5, *dev);
  } else {
    ins.bind_null(5);
  }
  const auto params = record.find("params");
  ins.bind_text(6, params != record.end() ? dump_line(*params) : std::string("{}"));
  ins.bind_text(7, line);
  if (const auto started = string_field(record, "started_at")) {
    ins.bind_text(8, *started);
  } else {
    ins.bind_null(8);
  }
  ins.step();
  std::vector<std::string> axes;
  if (params != record.end() && params->is_object())
    for (const auto& [k, v] : params->items()) axes.push_back(k);
  detail::ensure_workload_view(db, workload, axes);
}

// The runs row; `ended_at` "" is NULL (running). A run id already there is refused.
void insert_run_row(detail::Db& db, const RunInfo& run, const std::string& status, const std::string& ended_at) {
  {
    detail::Stmt dup(db, "SELECT 1 FROM runs WHERE run_id = ?1");
    if (dup.bind_text(1, run.run_id).step())
      throw Error("run id " + run.run_id + " is already in " + db.path().string() + "; a run id is used once");
  }
  detail::Stmt ins(db,
                   "INSERT INTO runs(run_id, started_at, ended_at, status, command_line, host, context_json) "
                   "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  ins.bind_text(1, run.run_id).bind_text(2, run.started_at).bind_text(4, status).bind_text(5, run.command_line);
  if (ended_at.empty()) {
    ins.bind_null(3);
  } else {
    ins.bind_text(3, ended_at);
  }
  const json* host = run.context.is_object() && run.context.contains("host") ? &run.context["host"] : nullptr;
  const auto hostname = host != nullptr && host->is_object() ? string_field(*host, "hostname") : std::nullopt;
  if (hostname && !hostname->empty()) {
    ins.bind_text(6, *hostname);
  } else {
    ins.bind_null(6);
  }
  ins.bind_text(7, dump_line(run.context.is_null() ? json::object() : run.context));
  ins.step();
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string this_hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// run.json: a running run also names its owner process and the time of its last point (the heartbeat).
std::string run_json_text(const RunInfo& run, const std::string& status, const std::string& ended_at, int point_count,
                          int ok_count) {
  json j = {{"schema_version", kSchemaVersion},
            {"run_id", run.run_id},
            {"started_at", run.started_at},
            {"status", status},
            {"command_line", run.command_line}};
  if (!ended_at.empty()) {
    j["ended_at"] = ended_at;
    j["points"] = point_count;
    j["ok_points"] = ok_count;
  }
  if (run.planned_points >= 0) j["planned_points"] = run.planned_points;
  if (status == "running") {
    j["owner"] = {{"pid", static_cast<std::int64_t>(getpid())}, {"host", this_hostname()}};
    j["heartbeat_unix_s"] = unix_seconds();
    if (run.stale_after_s > 0) j["stale_after_s"] = run.stale_after_s;
    j["points_so_far"] = point_count;
  }
  j["context"] = run.context;
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

// Whether the process that owns a running run is gone. Only a process of this host can be asked.
bool owner_gone(const json& owner) {
  if (!owner.is_object()) return false;
  const auto pid = owner.find("pid");
  if (pid == owner.end() || !pid->is_number_integer()) return false;
  if (owner.value("host", std::string()) != this_hostname()) return false;
  return kill(static_cast<pid_t>(pid->get<std::int64_t>()), 0) != 0 && errno == ESRCH;
}

std::string incomplete(int points, std::int64_t planned) {
  return "incomplete (" + std::to_string(points) + (planned >= 0 ? " of " + std::to_string(planned) : std::string()) +
         " points)";
}

}  // namespace

struct ResultStore::Impl {
  fs::path runs_dir, run_dir, points_path, db_path;
  RunInfo run;
  std::optional<detail::Db> db;
  std::optional<detail::AppendOnlyFile> points;
  std::int64_t next_seq = 0;
  std::unordered_set<std::int64_t> used_seqs;
  int point_count = 0, ok_count = 0;
  bool finished = false;

  Impl(const fs::path& out_dir, const RunInfo& info);
  ~Impl();
  void write_run_json(const std::string& status, const std::string& ended_at) const;
  void finish(const std::string& status);
};

ResultStore::Impl::Impl(const fs::path& out_dir, const RunInfo& info) : run(info) {
  check_run_id(run.run_id);
  if (run.started_at.empty()) run.started_at = utc_now_iso8601();
  if (run.context.is_null()) run.context = json::object();

  runs_dir = out_dir / "runs";
  run_dir = runs_dir / run.run_id;
  points_path = run_dir / "points.jsonl";
  db_path = runs_dir / "accelbench.db";

  std::error_code ec;
  fs::create_directories(runs_dir, ec);
  if (ec)
    throw UsageError("cannot create results directory " + runs_dir.string() + ": " + ec.message());  // a bad --out
  const bool created = fs::create_directory(run_dir, ec);
  if (ec) throw Error("cannot create run directory " + run_dir.string() + ": " + ec.message());
  if (!created) throw Error("run directory " + run_dir.string() + " already exists; a run id is used once");

  try {
    db.emplace(db_path, detail::Db::Mode::create);
    points.emplace(points_path);
    write_run_json("running", "");  // also syncs run_dir, so points.jsonl's entry is durable
    detail::sync_dir(runs_dir);     // the new run directory's entry
    // The runs row comes last: once it exists, the run is visible and everything it names exists.
    detail::Transaction tx(*db);
    insert_run_row(*db, run, "running", "");
    tx.commit();
  } catch (...) {
    // Leave no half-made run behind: the directory is new and ours.
    points.reset();
    db.reset();
    fs::remove_all(run_dir, ec);
    throw;
  }
}

ResultStore::Impl::~Impl() {
  if (finished) return;
  try {
    finish("interrupted");
  } catch (const std::exception& e) {
    std::cerr << "accelbench: could not mark run " << run.run_id << " interrupted: " << e.what() << '\n';
  } catch (...) {
    std::cerr << "accelbench: could not mark run " << run.run_id << " interrupted\n";
  }
}

void ResultStore::Impl::write_run_json(const std::string& status, const std::string& ended_at) const {
  detail::replace_file_durably(run_dir / "run.json", run_json_text(run, status, ended_at, point_count, ok_count));
}

void ResultStore::Impl::finish(const std::string& status) {
  if (!valid_final_status(status))
    throw Error("run status '" + status + "' is not one of complete, interrupted, failed, external");
  // One attempt: a marking that fails is the caller's to report, never retried at exit under
  // another status (nor after waiting out a lock a second time).
  finished = true;
  const std::string ended_at = utc_now_iso8601();
  std::exception_ptr db_error;
  try {
    detail::Transaction tx(*db);
    detail::Stmt upd(*db, "UPDATE runs SET status = ?1, ended_at = ?2 WHERE run_id = ?3");
    upd.bind_text(1, status).bind_text(2, ended_at).bind_text(3, run.run_id);
    upd.step();
    tx.commit();
  } catch (...) {
    db_error = std::current_exception();
  }
  // run.json records the end even where the database could not (locked, or its disk full):
  // readers believe it over a row still `running`. The database's error is the one reported.
  try {
    write_run_json(status, ended_at);
  } catch (...) {
    if (!db_error) throw;
  }
  if (db_error) std::rethrow_exception(db_error);
}

ResultStore::ResultStore(const fs::path& out_dir, const RunInfo& run) : impl_(std::make_unique<Impl>(out_dir, run)) {}
ResultStore::~ResultStore() = default;  // Impl's destructor does the "interrupted" marking
ResultStore::ResultStore(ResultStore&&) noexcept = default;
ResultStore& ResultStore::operator=(ResultStore&&) noexcept = default;

void ResultStore::append(const json& record) {
  if (!impl_) throw Error("ResultStore used after it was moved from");
  Impl& s = *impl_;
  if (s.finished) throw Error("run " + s.run.run_id + " is finished; nothing more can be appended");
  if (!record.is_object()) throw Error("result record must be a JSON object, got " + std::string(record.type_name()));
  const auto workload = string_field(record, "workload");
  const auto status = string_field(record, "status");
  if (!workload || !status) throw Error("result record needs string fields \"workload\" and \"status\"");
  if (const auto rid = string_field(record, "run_id"); rid && *rid != s.run.run_id)
    throw Error("result record of run " + *rid + " appended to run " + s.run.run_id);
  std::int64_t seq = s.next_seq;
  if (const auto it = record.find("seq"); it != record.end()) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 0)
      throw Error("result record \"seq\" must be a non-negative integer, got " + it->dump());
    seq = it->get<std::int64_t>();
  }
  // Checked here, not left to the primary key, so a clash writes nothing to either file.
  if (!s.used_seqs.insert(seq).second)
    throw Error("run " + s.run.run_id + " already has a point with seq " + std::to_string(seq));

  const std::string line = dump_line(record);
  // The JSON Lines file first: it is the primary record and the simplest write to get right.
  s.points->append_durably(line + "\n");
  ++s.point_count;
  if (*status == "ok") ++s.ok_count;
  s.next_seq = std::max(s.next_seq, seq + 1);

  try {
    detail::Transaction tx(*s.db);
    insert_point(*s.db, s.run.run_id, seq, *workload, *status, record, line);
    tx.commit();
    s.write_run_json("running", "");  // the heartbeat
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (the point is in " + s.points_path.string() + ")");
  }
}

std::string displayed_run_status(const fs::path& run_dir, const std::string& recorded_status, int points) {
  try {
    std::ifstream in(run_dir / "run.json");
    if (!in) return recorded_status;
    const json info = json::parse(in, nullptr, false);
    if (!info.is_object()) return recorded_status;
    const std::int64_t planned = info.value("planned_points", static_cast<std::int64_t>(-1));
    std::string status = recorded_status;
    if (status == "running") {
      // Ended, where the database could not be told (finish writes run.json regardless).
      if (const auto ended = string_field(info, "status"); ended && valid_final_status(*ended)) {
        status = *ended;
      } else {
        const double beat = info.value("heartbeat_unix_s", 0.0), stale_after = info.value("stale_after_s", 0.0);
        const bool stale = beat > 0 && stale_after > 0 && unix_seconds() - beat > stale_after;
        if (stale || owner_gone(info.value("owner", json()))) return incomplete(points, planned);
        return recorded_status;
      }
    }
    if (status != "external" && planned >= 0 && points < planned) return incomplete(points, planned);
    return status;
  } catch (const std::exception&) {
    // An unreadable run.json leaves the recorded status; the report says what it could not read.
  }
  return recorded_status;
}

void ResultStore::finish(const std::string& status) {
  if (!impl_) throw Error("ResultStore used after it was moved from");
  impl_->finish(status);
}

fs::path ResultStore::run_dir() const {
  if (!impl_) throw Error("ResultStore used after it was moved from");
  return impl_->run_dir;
}

fs::path ResultStore::points_path() const {
  if (!impl_) throw Error("ResultStore used after it was moved from");
  return impl_->points_path;
}

fs::path ResultStore::db_path() const {
  if (!impl_) throw Error("ResultStore used after it was moved from");
  return impl_->db_path;
}

void store_whole_run(const fs::path& out_dir, RunInfo run, const std::vector<json>& records,
                     const std::string& status) {
  check_run_id(run.run_id);
  if (!valid_final_status(status))
    throw Error("run status '" + status + "' is not one of complete, interrupted, failed, external");
  if (run.started_at.empty()) run.started_at = utc_now_iso8601();
  std::string lines;
  int ok_count = 0;
  for (const auto& r : records) {
    if (!string_field(r, "workload") || !string_field(r, "status"))
      throw Error("result record needs string fields \"workload\" and \"status\"");
    lines += dump_line(r) + "\n";
    ok_count += string_field(r, "status") == "ok";
  }
  const fs::path runs_dir = out_dir / "runs", run_dir = runs_dir / run.run_id, db_path = runs_dir / "accelbench.db";
  // Built aside under a name no run id can have, so a process killed here leaves no visible run.
  const fs::path partial = runs_dir / ("." + run.run_id + ".partial");
  std::error_code ec;
  fs::create_directories(runs_dir, ec);
  if (ec)
    throw UsageError("cannot create results directory " + runs_dir.string() + ": " + ec.message());  // a bad --out
  if (fs::exists(run_dir, ec))
    throw Error("run directory " + run_dir.string() + " already exists; a run id is used once");
  fs::remove_all(partial, ec);
  fs::create_directory(partial, ec);
  if (ec) throw Error("cannot create run directory " + partial.string() + ": " + ec.message());
  bool moved = false;
  try {
    detail::replace_file_durably(partial / "points.jsonl", lines);
    detail::replace_file_durably(partial / "run.json", run_json_text(run, status, utc_now_iso8601(),
                                                                     static_cast<int>(records.size()), ok_count));
    detail::Db db(db_path, detail::Db::Mode::create);
    // One transaction: the run and all its points appear together or not at all.
    detail::Transaction tx(db);
    insert_run_row(db, run, status, utc_now_iso8601());
    std::int64_t seq = 0;
    for (const auto& r : records) {
      insert_point(db, run.run_id, seq++, *string_field(r, "workload"), *string_field(r, "status"), r, dump_line(r));
    }
    fs::rename(partial, run_dir, ec);
    if (ec) throw Error("cannot move " + partial.string() + " to " + run_dir.string() + ": " + ec.message());
    moved = true;
    detail::sync_dir(runs_dir);
    tx.commit();
  } catch (...) {
    fs::remove_all(moved ? run_dir : partial, ec);
    throw;
  }
}

}  // namespace ab::results
