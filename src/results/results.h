// Result records and where they go: a JSON Lines file per run plus one SQLite database per output
// directory, both appended point by point so a crash loses nothing measured. Schema: docs/RESULTS.md.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "results/derived.h"
#include "results/record.h"

namespace ab::results {

std::string utc_now_iso8601();  // "2026-11-29T13:55:01.123Z"
std::string new_run_id();       // "20261129-135501-3f9a1c": UTC second + 24 random bits; sorts by time

struct RunInfo {
  std::string run_id, started_at, command_line;
  nlohmann::json context;  // host, devices, build; host.hostname feeds the runs table
  std::int64_t planned_points = -1;  // the plan's size; -1: not known (an import)
  double stale_after_s = 0;          // a running run whose heartbeat is older is dead; 0: only the owner pid tells
};

// One per run, used from one thread at a time. Files: <out_dir>/runs/<run_id>/{run.json,points.jsonl}; database:
// <out_dir>/runs/accelbench.db, shared by every run (and process) writing to out_dir.
class ResultStore {
 public:
  // Creates the run directory, the database if needed, points.jsonl and run.json (status
  // "running"), and the runs row. Throws ab::Error naming the path and the reason when anything
  // is not writable, so the CLI can call it before measuring anything.
  ResultStore(const std::filesystem::path& out_dir, const RunInfo& run);
  ~ResultStore();  // never throws; without a finish() the run is marked "interrupted"
  ResultStore(ResultStore&&) noexcept;
  ResultStore& operator=(ResultStore&&) noexcept;
  ResultStore(const ResultStore&) = delete;
  ResultStore& operator=(const ResultStore&) = delete;

  // One line in points.jsonl (written and fsync'ed) and one row in the database (its own
  // transaction), both durable when this returns. The record needs string "workload" and
  // "status"; "seq" defaults to the next number in this run.
  // Each append also renews run.json's heartbeat (owner pid, time, points so far).
  void append(const nlohmann::json& record);
  // "complete" | "interrupted" | "failed" (or "external" for imports): updates the runs row and rewrites run.json.
  void finish(const std::string& status);

  std::filesystem::path run_dir() const;
  std::filesystem::path points_path() const;
  std::filesystem::path db_path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A run written whole (an import): its directory and its runs row with every point, in one
// database transaction, with `status` final. A process killed midway leaves no run behind.
void store_whole_run(const std::filesystem::path& out_dir, RunInfo run, const std::vector<nlohmann::json>& records,
                     const std::string& status);

struct RunRow {
  std::string run_id, started_at, ended_at, status, command_line, host;  // ended_at "" while running
  int points = 0, ok_points = 0;
  std::string shown_status;  // displayed_run_status: the status, or "incomplete (N of M points)"
};

// The status to show for a run: the recorded one, or "incomplete (N of M points)" for a run whose
// end is known to be short of its plan: `running` while its owner process is gone (same host) or
// its heartbeat is stale, or finished with fewer points than planned. Reads <run_dir>/run.json;
// without one the recorded status stands. A `running` row whose run.json holds a final status (the
// end could not be written to a locked or full database) shows run.json's. Never throws.
std::string displayed_run_status(const std::filesystem::path& run_dir, const std::string& recorded_status, int points);

// Newest first. Throws ab::Error naming the file if it is missing or not our database.
std::vector<RunRow> list_runs(const std::filesystem::path& db_path);
// A run id as a user may type it: `latest` (the newest run), a whole id, or a prefix of exactly
// one (20261129-1355). Returns the whole id; nullopt where no run id starts so (the text may
// then be a folder or a system name); throws UsageError naming the matches for an ambiguous prefix.
std::optional<std::string> resolve_run_id(const std::vector<RunRow>& runs, const std::string& typed);

// The run's records in seq order; an unknown run is an ab::UsageError listing a few known ones.
std::vector<nlohmann::json> load_points(const std::filesystem::path& db_path, const std::string& run_id);

struct JsonlRead {
  std::vector<nlohmann::json> records;
  std::size_t bad_lines = 0;  // unparsable lines, e.g. the last one of a run killed mid-write
  std::vector<std::size_t> bad_line_numbers;  // 1-based, in file order
};
JsonlRead read_jsonl(const std::filesystem::path& file);  // throws ab::Error if unreadable

// The newest "ok" point of `workload` on a device named `device_name` whose params contain every
// key/value of `params_subset` (an object). Used to look up measured ceilings.
std::optional<nlohmann::json> latest_point(const std::filesystem::path& db_path, const std::string& workload,
                                           const std::string& device_name, const nlohmann::json& params_subset);

// The best ceiling `key` on a device named `device_name` from the newest run that measured it with
// the ceilings workload: the highest of that run's points that set it (rates.ceiling.source "this
// point": the ceilings workload's and those that raised it later in the run); nullopt if none.
std::optional<nlohmann::json> best_stored_ceiling(const std::filesystem::path& db_path, const std::string& device_name,
                                                  const std::string& key);

// One row per point, RFC 4180 quoting, missing values as empty cells. Columns: run_id, seq,
// workload, device, device_name, status, reason, params.* (union over points, sorted), the time
// and rates summaries, telemetry power/energy columns and the load generator's scenario.name,
// scenario.result (VALID/INVALID), scenario.metric.* and scenario.latency_s.* percentiles when any
// point has them.
void write_csv(std::ostream& out, const std::vector<nlohmann::json>& points);

// `results --json`: the runs (newest first) as an array of objects with the runs table's fields and
// the shown status; one run as {"run": {...}, "points": [records as stored]}. Indented, one document.
void write_json(std::ostream& out, const std::vector<RunRow>& runs);
void write_json(std::ostream& out, const RunRow& run, const std::vector<nlohmann::json>& points);

// Published figures from a CSV file (workload,params,metric,value,unit,source; docs/RESULTS.md,
// "External results") stored as one run of status "external" whose records are marked external
// with their source. The whole file is checked first: a malformed one throws ab::UsageError
// "<file>:<line>: <reason>" and nothing is stored.
struct ImportResult {
  std::string run_id;
  std::size_t rows = 0, points = 0;  // CSV rows read; records written (rows of one point merge)
};
// A workload's single-valued default axis values, typed as records hold them ({"graph": "on", ...});
// null or {} for a workload it does not know. An imported row that leaves such an axis out takes
// its default (listed in the record's metrics.defaulted_axes), so it matches the measured point.
using AxisDefaults = std::function<nlohmann::json(const std::string& workload)>;
ImportResult import_csv(const std::filesystem::path& csv, const std::string& system,
                        const std::filesystem::path& out_dir, const std::string& command_line,
                        const AxisDefaults& defaults = {});

}  // namespace ab::results
