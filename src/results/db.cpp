#include "results/db.h"

#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "results/results.h"

namespace ab::results::detail {
namespace {

// Runs of several processes share one database. A wait only happens between points, so it costs
// no measurement, while giving up would drop a point from the index: wait generously.
constexpr int kBusyTimeoutMs = 30000;

// The wait for a lock another process holds: AB_STORE_WAIT_MS where set (whole milliseconds; the
// tests hold a lock past it), else kBusyTimeoutMs.
int busy_timeout_ms() {
  const char* env = std::getenv("AB_STORE_WAIT_MS");
  if (env == nullptr || *env == '\0') return kBusyTimeoutMs;
  char* end = nullptr;
  errno = 0;
  const long ms = std::strtol(env, &end, 10);
  if (errno != 0 || *end != '\0' || ms < 0 || ms > 3'600'000)
    throw Error(std::string("AB_STORE_WAIT_MS='") + env + "' is not a whole number of milliseconds from 0 to 3600000");
  return static_cast<int>(ms);
}

// Version 1. A later version adds a migration step in check_schema, never edits this text.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE runs(
  run_id       TEXT PRIMARY KEY NOT NULL,
  started_at   TEXT NOT NULL,
  ended_at     TEXT,
  status       TEXT NOT NULL,
  command_line TEXT NOT NULL,
  host         TEXT,
  context_json TEXT NOT NULL
);
CREATE TABLE points(
  run_id      TEXT NOT NULL REFERENCES runs(run_id),
  seq         INTEGER NOT NULL,
  workload    TEXT NOT NULL,
  status      TEXT NOT NULL,
  device_name TEXT,
  params_json TEXT NOT NULL,
  record_json TEXT NOT NULL,
  started_at  TEXT,
  PRIMARY KEY(run_id, seq)
);
CREATE INDEX points_workload_device ON points(workload, device_name);
)sql";

// Flat views over the points, so `sqlite3 runs/accelbench.db 'select ...'` needs no JSON paths.
// The rate is the one the report judges a workload by: tokens/s or samples/s where the point has
// a batch axis, else the record's primary rate, else the first it has of samples/s, TFLOP/s, GB/s
// (docs/RESULTS.md, "SQLite views").
constexpr const char* kRateSql = R"sql(
  CASE WHEN json_type(p.params_json, '$.batch') IS NOT NULL AND json_type(p.record_json, '$.rates.tokens_per_s') IS NOT NULL
         THEN 'tokens_per_s'
       WHEN json_type(p.params_json, '$.batch') IS NOT NULL AND json_type(p.record_json, '$.rates.samples_per_s') IS NOT NULL
         THEN 'samples_per_s'
       WHEN json_type(p.record_json, '$.rates.primary') IS NOT NULL THEN json_extract(p.record_json, '$.rates.primary')
       WHEN json_type(p.record_json, '$.rates.samples_per_s') IS NOT NULL THEN 'samples_per_s'
       WHEN json_type(p.record_json, '$.rates.tflops') IS NOT NULL THEN 'tflops'
       WHEN json_type(p.record_json, '$.rates.gbps') IS NOT NULL THEN 'gbps' END)sql";

std::string view_sql(const std::string& name, const std::string& axis_columns) {
  const std::string rate = std::string("(") + kRateSql + ")";
  return "CREATE VIEW " + name +
         " AS SELECT p.run_id AS run_id, p.seq AS seq, p.started_at AS started_at, r.host AS host, "
         "p.workload AS workload, p.device_name AS device_name, " +
         axis_columns +
         "p.status AS status, json_extract(p.record_json, '$.reason') AS reason, "
         "json_extract(p.record_json, '$.time.median_s') AS median_s, json_extract(p.record_json, '$.time.p90_s') AS "
         "p90_s, "
         "json_extract(p.record_json, '$.time.p99_s') AS p99_s, json_extract(p.record_json, '$.time.rel_spread') AS "
         "rel_spread, "
         "json_extract(p.record_json, '$.time.converged') AS converged, "
         "json_extract(p.record_json, '$.rates.' || " +
         rate +
         ") AS rate, "
         "CASE " +
         rate +
         " WHEN 'tokens_per_s' THEN 'tokens/s' WHEN 'samples_per_s' THEN 'samples/s' "
         "WHEN 'tflops' THEN 'TFLOP/s' WHEN 'gbps' THEN 'GB/s' ELSE " +
         rate +
         " END AS unit, "
         "json_extract(p.record_json, '$.rates.pct_of_ceiling') AS pct_of_ceiling, "
         "json_extract(p.record_json, '$.rates.samples_per_s') AS samples_per_s, "
         "json_extract(p.record_json, '$.rates.tokens_per_s') AS tokens_per_s, "
         "json_extract(p.record_json, '$.rates.tflops') AS tflops, json_extract(p.record_json, '$.rates.gbps') AS "
         "gbps, "
         "json_extract(p.record_json, '$.scenario.result') AS validity, "
         "json_extract(p.record_json, '$.telemetry.mean_power_w') AS mean_power_w, "
         "json_extract(p.record_json, '$.telemetry.energy_j') AS energy_j, "
         "json_extract(p.record_json, '$.telemetry.samples_per_j') AS samples_per_j "
         "FROM points p LEFT JOIN runs r ON r.run_id = p.run_id";
}

// `results`: every point, its axes as one "name=value ..." text; `result_axes`: one row per axis value.
std::string generic_views_sql() {
  return view_sql("results",
                  "(SELECT group_concat(j.key || '=' || j.value, ' ') FROM json_each(p.params_json) j) AS axes, ") +
         ";\nCREATE VIEW result_axes AS SELECT p.run_id AS run_id, p.seq AS seq, p.workload AS workload, j.key AS "
         "axis, "
         "j.value AS value FROM points p, json_each(p.params_json) j;\n";
}

// Names that go into view definitions unquoted: the registry's workload and axis names all are.
bool plain_name(const std::string& s) {
  return !s.empty() && s.size() <= 64 &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isalnum(c) || c == '_'; });
}

std::string sqlite_reason(sqlite3* db, int rc) {
  std::string reason = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  // "unable to open database file" alone does not say why; errno does (e.g. "Not a directory").
  const int sys_errno = db != nullptr ? sqlite3_system_errno(db) : 0;
  if (sys_errno != 0 && (rc & 0xff) != SQLITE_NOTADB && (rc & 0xff) != SQLITE_CONSTRAINT)
    reason += " (" + std::system_category().message(sys_errno) + ")";
  return reason;
}

// Errors quote a statement's start: enough to tell which one, short enough to read.
std::string sql_head(const char* sql) {
  std::string head(sql);
  head.erase(0, head.find_first_not_of(" \n"));
  if (head.size() > 40) head = head.substr(0, 40) + "...";
  return head;
}

}  // namespace

Db::Db(std::filesystem::path path, Mode mode) : path_(std::move(path)) {
  if (mode == Mode::existing) {
    std::error_code ec;
    if (!std::filesystem::exists(path_, ec))
      throw Error("results database " + path_.string() + " does not exist" +
                  (ec ? " (" + ec.message() + ")" : std::string()));
  }
  int flags = SQLITE_OPEN_READWRITE;  // falls back to read-only where the file is write-protected
  if (mode == Mode::create) flags |= SQLITE_OPEN_CREATE;
  const int rc = sqlite3_open_v2(path_.c_str(), &db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    const std::string reason = sqlite_reason(db_, rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error("cannot open results database " + path_.string() + ": " + reason);
  }
  try {
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_busy_timeout(db_, busy_timeout_ms());
    // FULL: every commit is synced (journal and database) before it returns, so an appended
    // point survives power loss. The default rollback journal, not WAL: WAL needs shared memory,
    // which network file systems (where cluster runs often write) do not provide.
    exec("PRAGMA synchronous=FULL");
    exec("PRAGMA foreign_keys=ON");
    if (mode == Mode::create && sqlite3_db_readonly(db_, "main") == 1)
      throw Error("results database " + path_.string() + " is read-only");
    check_schema(mode);
  } catch (...) {
    sqlite3_close(db_);
    throw;
  }
}

Db::~Db() { sqlite3_close(db_); }  // statements are all finalised by their RAII owners

void Db::exec(const char* sql) {
  char* msg = nullptr;
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &msg);
  sqlite3_free(msg);  // sqlite3_errmsg still holds the same text for fail()
  if (rc != SQLITE_OK) fail("executing \"" + sql_head(sql) + "\"", rc);
}

void Db::fail(const std::string& what, int rc) const {
  const std::string reason = sqlite_reason(db_, rc);
  if ((rc & 0xff) == SQLITE_NOTADB)
    throw Error(path_.string() + " is not an accelbench results database: " + reason);
  throw Error(path_.string() + ": " + what + ": " + reason);
}

void Db::check_schema(Mode mode) {
  auto not_ours = [&](const std::string& reason) {
    throw Error(path_.string() + " is not an accelbench results database: " + reason);
  };
  // In create mode hold the write lock while looking, so two processes creating the same new
  // database cannot both decide it is empty.
  std::optional<Transaction> tx;
  if (mode == Mode::create) tx.emplace(*this);

  std::int64_t app_id = 0, version = 0;
  std::vector<std::string> tables;
  {  // statements finalised before any write below
    Stmt app(*this, "PRAGMA application_id");
    if (app.step()) app_id = app.int64(0);
    Stmt ver(*this, "PRAGMA user_version");
    if (ver.step()) version = ver.int64(0);
    Stmt list(*this, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name");
    while (list.step()) tables.push_back(list.text(0));
  }

  if (app_id == 0 && version == 0 && tables.empty()) {
    if (mode == Mode::existing) not_ours("it is empty");
    exec(kSchemaV1);
    exec(generic_views_sql().c_str());
    // Pragmas cannot take bound parameters; these values are our own constants, not data.
    exec(("PRAGMA application_id=" + std::to_string(kApplicationId)).c_str());
    exec(("PRAGMA user_version=" + std::to_string(kSchemaVersion)).c_str());
    tx->commit();
    return;
  }
  if (app_id != kApplicationId) {
    std::string found;
    for (const auto& t : tables) found += (found.empty() ? "" : ", ") + t;
    not_ours(app_id == 0 ? "it has no accelbench tables (tables: " + (found.empty() ? "none" : found) + ")"
                         : "its application_id is " + std::to_string(app_id) + ", not accelbench's " +
                               std::to_string(kApplicationId));
  }
  for (const char* needed : {"points", "runs"}) {
    bool has = false;
    for (const auto& t : tables) has = has || t == needed;
    if (!has) not_ours(std::string("table ") + needed + " is missing");
  }
  if (version != kSchemaVersion)
    throw Error(path_.string() + " holds results schema version " + std::to_string(version) +
                "; this accelbench reads version " + std::to_string(kSchemaVersion));
  if (tx) {
    // Stores written before the views existed get them on their next write; the schema is unchanged.
    bool has_views = false;
    {
      Stmt v(*this, "SELECT 1 FROM sqlite_master WHERE type = 'view' AND name = 'results'");
      has_views = v.step();
    }
    if (!has_views) exec(generic_views_sql().c_str());
    tx->commit();
  }
}

namespace {

const std::set<std::string>& fixed_columns() {
  static const std::set<std::string> names = {
      "run_id",    "seq",    "started_at", "host",           "workload",      "device_name",
      "status",    "reason", "median_s",   "p90_s",          "p99_s",         "rel_spread",
      "converged", "rate",   "unit",       "pct_of_ceiling", "samples_per_s", "tokens_per_s",
      "tflops",    "gbps",   "validity",   "mean_power_w",   "energy_j",      "samples_per_j"};
  return names;
}

std::set<std::string> view_columns(Db& db, const std::string& view) {
  std::set<std::string> present;
  Stmt cols(db, "SELECT name FROM pragma_table_info(?1)");
  cols.bind_text(1, view);
  while (cols.step()) present.insert(cols.text(0));
  return present;
}

bool is_view_axis(const std::string& key) { return plain_name(key) && !fixed_columns().count(key); }

}  // namespace

void ensure_workload_view(Db& db, const std::string& workload, const std::vector<std::string>& axes_of_point) {
  std::string name = "results_" + workload;
  std::replace(name.begin(), name.end(), '-', '_');
  if (!plain_name(name)) return;
  const auto present = view_columns(db, name);
  const bool complete =
      !present.empty() && std::all_of(axes_of_point.begin(), axes_of_point.end(),
                                      [&](const std::string& a) { return !is_view_axis(a) || present.count(a) > 0; });
  if (complete) return;  // the common case: one cheap look at the view's columns
  std::string columns;
  Stmt q(db, "SELECT DISTINCT j.key FROM points p, json_each(p.params_json) j WHERE p.workload = ?1 ORDER BY j.key");
  q.bind_text(1, workload);
  while (q.step())
    if (const std::string k = q.text(0); is_view_axis(k))
      columns += "json_extract(p.params_json, '$." + k + "') AS " + k + ", ";
  db.exec(("DROP VIEW IF EXISTS " + name).c_str());
  // A view's definition cannot take bound parameters: the workload is a plain name (checked above).
  db.exec((view_sql(name, columns) + " WHERE p.workload = '" + workload + "'").c_str());
}

Stmt::Stmt(Db& db, const char* sql) : db_(db), sql_(sql_head(sql)) {
  const int rc = sqlite3_prepare_v2(db_.handle(), sql, -1, &stmt_, nullptr);
  if (rc != SQLITE_OK) db_.fail("preparing \"" + sql_ + "\"", rc);
}

Stmt::~Stmt() { sqlite3_finalize(stmt_); }

Stmt& Stmt::bind_text(int index, const std::string& value) {
  const int rc = sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  if (rc != SQLITE_OK) db_.fail("binding parameter " + std::to_string(index) + " of \"" + sql_ + "\"", rc);
  return *this;
}

Stmt& Stmt::bind_int(int index, std::int64_t value) {
  const int rc = sqlite3_bind_int64(stmt_, index, static_cast<sqlite3_int64>(value));
  if (rc != SQLITE_OK) db_.fail("binding parameter " + std::to_string(index) + " of \"" + sql_ + "\"", rc);
  return *this;
}

Stmt& Stmt::bind_null(int index) {
  const int rc = sqlite3_bind_null(stmt_, index);
  if (rc != SQLITE_OK) db_.fail("binding parameter " + std::to_string(index) + " of \"" + sql_ + "\"", rc);
  return *this;
}

bool Stmt::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  db_.fail("running \"" + sql_ + "\"", rc);
}

std::string Stmt::text(int col) const {
  const auto* p = sqlite3_column_text(stmt_, col);
  if (p == nullptr) return {};
  return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(sqlite3_column_bytes(stmt_, col)));
}

std::int64_t Stmt::int64(int col) const { return static_cast<std::int64_t>(sqlite3_column_int64(stmt_, col)); }

bool Stmt::is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

Transaction::Transaction(Db& db) : db_(db) { db_.exec("BEGIN IMMEDIATE"); }

Transaction::~Transaction() {
  if (open_) sqlite3_exec(db_.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
  db_.exec("COMMIT");
  open_ = false;
}

}  // namespace ab::results::detail
