// Tests for src/results: JSON Lines and SQLite round trips, run status, crash tolerance, error
// wording at the boundaries, the ceiling lookup, CSV, and concurrent writers.
#include <sqlite3.h>  // only to make foreign and future-version databases
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "results/fields.h"
#include "results/output.h"
#include "results/results.h"
#include "test_support.h"

namespace ab::results {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ResultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("ab_results_test_" + std::string(info->name()) + "_" +
                                        std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  RunInfo run_info(const std::string& id, const std::string& started_at = "2026-11-29T13:55:01.123Z") const {
    return RunInfo{id, started_at, "accelbench run gemm --axis precision=bf16",
                   json{{"host", {{"hostname", "node17"}, {"cpu_cores", 64}}}}};
  }

  fs::path db() const { return dir_ / "runs" / "accelbench.db"; }

  fs::path dir_;
};

json make_record(const std::string& run_id, int seq, const std::string& workload = "gemm",
                 const std::string& status = "ok", const std::string& device_name = "NVIDIA H200",
                 json params = {{"precision", "bf16"}, {"m", 8192}, {"n", 8192}, {"k", 8192}, {"trans", "NN"}},
                 const std::string& started_at = "2026-11-29T13:55:02.000Z") {
  json r = {{"schema_version", kSchemaVersion},
            {"run_id", run_id},
            {"seq", seq},
            {"workload", workload},
            {"device", "cuda:0"},
            {"device_name", device_name},
            {"params", std::move(params)},
            {"status", status},
            {"started_at", started_at},
            {"wall_s", 3.25}};
  if (status != "ok") {
    r["reason"] = "precision not supported";
    return r;
  }
  r["counts"] = {{"samples", 1}, {"flops", 1.1e12}, {"bytes", 4.0e8}, {"ops_unit", "FLOP"}};
  r["time"] = {{"mode", "batch"},       {"converged", true},  {"stop_reason", "noise below target"},
               {"count", 4},            {"median_s", 0.0015}, {"mean_s", 0.00151},
               {"min_s", 0.00149},      {"max_s", 0.0016},    {"p90_s", 0.00158},
               {"p99_s", 0.0016},       {"rel_spread", 0.004}, {"samples_s", {0.0015, 0.00149, 0.0016, 0.0015}}};
  r["rates"] = {{"samples_per_s", 666.7},
                {"tflops", 733.3},
                {"gbps", 266.7},
                {"pct_of_ceiling", 94.0},
                {"ceiling", {{"key", "gemm.bf16"}, {"value", 780.0}, {"unit", "TFLOP/s"}, {"source", "run x seq 0"}}}};
  r["check"] = {{"rel_error", 1e-3}, {"tolerance", 2e-2}, {"passed", true}, {"what", "vs ref on 256^3"}};
  return r;
}

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

TEST(ResultsRunId, FormatsSortAndDiffer) {
  const std::string t = utc_now_iso8601();
  EXPECT_TRUE(std::regex_match(t, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)"))) << t;
  const std::string a = new_run_id(), b = new_run_id();
  EXPECT_TRUE(std::regex_match(a, std::regex(R"(\d{8}-\d{6}-[0-9a-f]{6})"))) << a;
  EXPECT_NE(a, b);
  // The date part of the id is the same UTC time as the timestamp (unless a midnight passed).
  EXPECT_EQ(a.substr(0, 4), t.substr(0, 4));
}

TEST(ResultsRunId, TypedAsLatestOrAUniquePrefix) {
  std::vector<RunRow> runs(3);  // newest first, as list_runs gives them
  runs[0].run_id = "20261130-090000-aaaaaa";
  runs[1].run_id = "20261129-135501-3f9a1c";
  runs[2].run_id = "20261129-135501-3f0000";
  EXPECT_EQ(resolve_run_id(runs, "latest"), runs[0].run_id);
  EXPECT_EQ(resolve_run_id(runs, "20261130"), runs[0].run_id);
  EXPECT_EQ(resolve_run_id(runs, "20261129-135501-3f9"), runs[1].run_id);
  EXPECT_EQ(resolve_run_id(runs, runs[2].run_id), runs[2].run_id);
  EXPECT_EQ(resolve_run_id(runs, "2025"), std::nullopt);  // maybe a folder or a system name
  EXPECT_EQ(resolve_run_id(runs, ""), std::nullopt);
  const std::string ambiguous = ab::test::usage_error([&] { (void)resolve_run_id(runs, "20261129"); });
  EXPECT_NE(ambiguous.find("matches 2 runs (20261129-135501-3f9a1c, 20261129-135501-3f0000)"), std::string::npos)
      << ambiguous;
  EXPECT_NE(ab::test::usage_error([] { (void)resolve_run_id({}, "latest"); }).find("no runs"), std::string::npos);
}

TEST_F(ResultsTest, RecordsRoundTripThroughJsonlAndSqlite) {
  const std::string id = "20261129-135501-aaaaaa";
  std::vector<json> records = {make_record(id, 0), make_record(id, 1, "gemm", "skipped"),
                               make_record(id, 2, "stream")};
  records[2]["metrics"] = {{"note", "multi\nline, \"quoted\" ünïcødé"}};
  {
    ResultStore store(dir_, run_info(id));
    EXPECT_EQ(store.run_dir(), dir_ / "runs" / id);
    EXPECT_EQ(store.points_path(), dir_ / "runs" / id / "points.jsonl");
    EXPECT_EQ(store.db_path(), db());
    const json started = read_json_file(store.run_dir() / "run.json");
    EXPECT_EQ(started["status"], "running");
    EXPECT_EQ(started["run_id"], id);
    EXPECT_EQ(started["context"]["host"]["hostname"], "node17");
    for (const auto& r : records) store.append(r);

    // Readable while the run goes on: each append is complete when it returns.
    const JsonlRead mid = read_jsonl(store.points_path());
    EXPECT_EQ(mid.records, records);
    EXPECT_EQ(mid.bad_lines, 0u);
    store.finish("complete");
  }
  EXPECT_EQ(read_jsonl(dir_ / "runs" / id / "points.jsonl").records, records);
  EXPECT_EQ(load_points(db(), id), records);

  const json ended = read_json_file(dir_ / "runs" / id / "run.json");
  EXPECT_EQ(ended["status"], "complete");
  EXPECT_EQ(ended["points"], 3);
  EXPECT_EQ(ended["ok_points"], 2);
  EXPECT_TRUE(ended.contains("ended_at"));
  EXPECT_EQ(ended["command_line"], "accelbench run gemm --axis precision=bf16");
}

// Rows of a query on the store, cells as text ("" for NULL), as `sqlite3 accelbench.db 'select ...'` shows them.
std::vector<std::vector<std::string>> query(const fs::path& db, const std::string& sql) {
  sqlite3* h = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sqlite3_errmsg(h) << ": " << sql;
  std::vector<std::vector<std::string>> rows;
  while (st != nullptr && sqlite3_step(st) == SQLITE_ROW) {
    rows.emplace_back();
    for (int i = 0; i < sqlite3_column_count(st); ++i) {
      const auto* t = sqlite3_column_text(st, i);
      rows.back().push_back(t != nullptr ? reinterpret_cast<const char*>(t) : "");
    }
  }
  sqlite3_finalize(st);
  sqlite3_close(h);
  return rows;
}

TEST_F(ResultsTest, ViewsGiveFlatColumnsWithoutJsonPaths) {
  const std::string id = "20261129-135501-bbbbbb";
  {
    ResultStore store(dir_, run_info(id));
    json gemm = make_record(id, 0);
    gemm["rates"]["primary"] = "tflops";  // as derived.cpp sets it
    store.append(gemm);
    store.append(make_record(id, 1, "gemm", "skipped"));
    json train = make_record(id, 2, "train", "ok", "NVIDIA H200", {{"batch", 32}, {"model", "resnet50"}});
    store.append(train);
    // A later point with an axis the view lacks re-creates it with the new column.
    store.append(make_record(id, 3, "train", "ok", "NVIDIA H200", {{"batch", 64}, {"model", "resnet50"}, {"gpus", 2}}));
    store.finish("complete");
  }
  const auto gemm = query(db(),
                          "select run_id, m, precision, trans, status, median_s, rate, unit, pct_of_ceiling, host "
                          "from results_gemm order by seq");
  ASSERT_EQ(gemm.size(), 2u);
  EXPECT_EQ(gemm[0],
            (std::vector<std::string>{id, "8192", "bf16", "NN", "ok", "0.0015", "733.3", "TFLOP/s", "94.0", "node17"}));
  EXPECT_EQ(gemm[1][4], "skipped");
  EXPECT_EQ(gemm[1][6], "");  // a skipped point has no rate
  // Where the workload has a batch axis, the rate is samples/s (the report's rule).
  const auto train = query(db(), "select batch, gpus, model, rate, unit from results_train order by seq");
  ASSERT_EQ(train.size(), 2u);
  EXPECT_EQ(train[0], (std::vector<std::string>{"32", "", "resnet50", "666.7", "samples/s"}));
  EXPECT_EQ(train[1], (std::vector<std::string>{"64", "2", "resnet50", "666.7", "samples/s"}));
  // Every point in one view, its axes as text; and one row per axis value.
  const auto all = query(db(), "select workload, axes, status from results where seq = 3 and run_id = '" + id + "'");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], (std::vector<std::string>{"train", "batch=64 gpus=2 model=resnet50", "ok"}));
  const auto axes = query(db(), "select axis, value from result_axes where seq = 0 order by axis");
  ASSERT_EQ(axes.size(), 5u);
  EXPECT_EQ(axes[0], (std::vector<std::string>{"k", "8192"}));
  // The store still opens for reading and writing with its views in it.
  EXPECT_EQ(load_points(db(), id).size(), 4u);
  ResultStore again(dir_, run_info("20261129-135502-cccccc"));
  again.append(make_record("20261129-135502-cccccc", 0));
  again.finish("complete");
  EXPECT_EQ(query(db(), "select count(*) from results_gemm")[0][0], "3");
}

TEST_F(ResultsTest, ListRunsNewestFirstWithStatusAndCounts) {
  {
    ResultStore older(dir_, run_info("run-a", "2026-11-29T10:00:00.000Z"));
    older.append(make_record("run-a", 0));
    older.append(make_record("run-a", 1, "gemm", "oom"));
    older.finish("failed");
  }
  {
    RunInfo info = run_info("run-b", "2026-11-29T11:00:00.000Z");
    info.context = json::object();  // no host block: host is empty
    ResultStore newer(dir_, info);
    newer.append(make_record("run-b", 0));
    newer.finish("complete");
  }
  const auto rows = list_runs(db());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].run_id, "run-b");
  EXPECT_EQ(rows[0].status, "complete");
  EXPECT_EQ(rows[0].points, 1);
  EXPECT_EQ(rows[0].ok_points, 1);
  EXPECT_EQ(rows[0].host, "");
  EXPECT_FALSE(rows[0].ended_at.empty());
  EXPECT_EQ(rows[1].run_id, "run-a");
  EXPECT_EQ(rows[1].status, "failed");
  EXPECT_EQ(rows[1].started_at, "2026-11-29T10:00:00.000Z");
  EXPECT_EQ(rows[1].points, 2);
  EXPECT_EQ(rows[1].ok_points, 1);
  EXPECT_EQ(rows[1].host, "node17");
  EXPECT_EQ(rows[1].command_line, "accelbench run gemm --axis precision=bf16");
}

TEST_F(ResultsTest, RunningRunIsListedAndFinishRejectsUnknownStatus) {
  ResultStore store(dir_, run_info("run-r"));
  const auto rows = list_runs(db());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].status, "running");
  EXPECT_EQ(rows[0].ended_at, "");
  EXPECT_THROW(store.finish("done"), Error);
  store.finish("complete");
  EXPECT_THROW(store.append(make_record("run-r", 0)), Error);  // nothing after the end
}

TEST_F(ResultsTest, StoreDestroyedWithoutFinishIsInterrupted) {
  {
    ResultStore store(dir_, run_info("run-i"));
    store.append(make_record("run-i", 0));
  }
  const auto rows = list_runs(db());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].status, "interrupted");
  EXPECT_EQ(rows[0].points, 1);
  EXPECT_EQ(read_json_file(dir_ / "runs" / "run-i" / "run.json")["status"], "interrupted");
}

TEST_F(ResultsTest, KilledRunKeepsEveryAppendedPoint) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ResultStore store(dir_, run_info("run-k"));
    for (int i = 0; i < 3; ++i) store.append(make_record("run-k", i));
    ::kill(::getpid(), SIGKILL);  // no destructor, no finish: as if the node died
    ::_exit(3);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus));
  EXPECT_EQ(read_jsonl(dir_ / "runs" / "run-k" / "points.jsonl").records.size(), 3u);
  EXPECT_EQ(load_points(db(), "run-k").size(), 3u);
  EXPECT_EQ(list_runs(db())[0].status, "running");  // nobody was left to say otherwise
}

TEST_F(ResultsTest, ARunWhoseOwnerIsGoneOrWhoseHeartbeatIsStaleIsShownIncomplete) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    RunInfo info = run_info("run-dead");
    info.planned_points = 8;
    ResultStore store(dir_, info);
    for (int i = 0; i < 3; ++i) store.append(make_record("run-dead", i));
    ::kill(::getpid(), SIGKILL);
    ::_exit(3);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  const auto rows = list_runs(db());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].status, "running");
  EXPECT_EQ(rows[0].shown_status, "incomplete (3 of 8 points)");

  // Alive (this process owns it) and beating: running. A stale heartbeat: incomplete.
  RunInfo info = run_info("run-live");
  info.planned_points = 4;
  info.stale_after_s = 3600;
  ResultStore live(dir_, info);
  live.append(make_record("run-live", 0));
  const fs::path run_dir = dir_ / "runs" / "run-live";
  EXPECT_EQ(displayed_run_status(run_dir, "running", 1), "running");
  json beat = read_json_file(run_dir / "run.json");
  EXPECT_EQ(beat["planned_points"], 4);
  EXPECT_EQ(beat["owner"]["pid"], static_cast<std::int64_t>(::getpid()));
  beat["heartbeat_unix_s"] = beat["heartbeat_unix_s"].get<double>() - 7200;
  write_text(run_dir / "run.json", beat.dump());
  EXPECT_EQ(displayed_run_status(run_dir, "running", 1), "incomplete (1 of 4 points)");
  // Finished short of its plan, or in full.
  EXPECT_EQ(displayed_run_status(run_dir, "interrupted", 1), "incomplete (1 of 4 points)");
  EXPECT_EQ(displayed_run_status(run_dir, "complete", 4), "complete");
  EXPECT_EQ(displayed_run_status(dir_ / "no-such-run", "running", 0), "running");
}

TEST_F(ResultsTest, AWholeRunIsStoredInOneTransactionOrNotAtAll) {
  const std::vector<json> records{make_record("run-w", 0), make_record("run-w", 1)};
  store_whole_run(dir_, run_info("run-w"), records, "external");
  auto rows = list_runs(db());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].status, "external");
  EXPECT_EQ(rows[0].points, 2);
  EXPECT_EQ(rows[0].host, "node17");
  EXPECT_EQ(read_jsonl(dir_ / "runs" / "run-w" / "points.jsonl").records.size(), 2u);
  EXPECT_EQ(read_json_file(dir_ / "runs" / "run-w" / "run.json")["status"], "external");

  // A run id already in the database (its folder gone): refused after the files were built, and
  // nothing of the second attempt stays, neither rows nor folders.
  fs::remove_all(dir_ / "runs" / "run-w");
  EXPECT_THROW(store_whole_run(dir_, run_info("run-w"), records, "external"), Error);
  rows = list_runs(db());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(load_points(db(), "run-w").size(), 2u);
  for (const auto& e : fs::directory_iterator(dir_ / "runs"))
    EXPECT_FALSE(e.is_directory()) << "left behind: " << e.path();
}

TEST_F(ResultsTest, MovedStoreKeepsOneOwner) {
  std::optional<ResultStore> target;
  {
    ResultStore a(dir_, run_info("run-m1", "2026-11-29T10:00:00.000Z"));
    target.emplace(std::move(a));
  }  // the moved-from store must not mark anything
  EXPECT_EQ(list_runs(db())[0].status, "running");
  target->append(make_record("run-m1", 0));
  // Move-assigning over a live store ends the old run as interrupted.
  *target = ResultStore(dir_, run_info("run-m2", "2026-11-29T11:00:00.000Z"));
  target->finish("complete");
  const auto rows = list_runs(db());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].run_id, "run-m2");
  EXPECT_EQ(rows[0].status, "complete");
  EXPECT_EQ(rows[1].status, "interrupted");
  EXPECT_EQ(rows[1].points, 1);
}

TEST_F(ResultsTest, AppendChecksTheRecordAndDefaultsSeq) {
  ResultStore store(dir_, run_info("run-s"));
  json no_seq = make_record("run-s", 0);
  no_seq.erase("seq");
  store.append(make_record("run-s", 4));
  store.append(no_seq);  // takes seq 5
  EXPECT_THROW(store.append(json::array()), Error);
  EXPECT_THROW(store.append(json{{"workload", "gemm"}}), Error);       // no status
  EXPECT_THROW(store.append(make_record("other-run", 9)), Error);      // wrong run
  EXPECT_THROW(store.append(make_record("run-s", 4)), Error);          // seq taken
  const auto points = load_points(db(), "run-s");
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(read_jsonl(store.points_path()).records.size(), 2u);  // rejected records wrote nothing
  EXPECT_EQ(points[0]["seq"], 4);
  EXPECT_EQ(points[1], no_seq);
}

TEST_F(ResultsTest, ReadJsonlToleratesTruncatedLastLine) {
  const fs::path f = dir_ / "points.jsonl";
  const std::string full = make_record("r", 1).dump();
  write_text(f, make_record("r", 0).dump() + "\n" + full + "\n" + full.substr(0, full.size() / 2));
  const JsonlRead read = read_jsonl(f);
  ASSERT_EQ(read.records.size(), 2u);
  EXPECT_EQ(read.records[1], make_record("r", 1));
  EXPECT_EQ(read.bad_lines, 1u);
  EXPECT_THROW(read_jsonl(dir_ / "missing.jsonl"), Error);
}

TEST_F(ResultsTest, UnwritableOutDirThrowsBeforeWritingAnything) {
  const fs::path file = dir_ / "a-file";
  write_text(file, "not a directory\n");
  const fs::path out = file / "results";  // parent is a regular file: fails even for root
  try {
    ResultStore store(out, run_info("run-u"));
    FAIL() << "expected ab::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Not a directory"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_regular_file(file));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);

  // The database path taken by a directory: the run directory is not left behind.
  fs::create_directories(db());
  EXPECT_THROW([&] { ResultStore store(dir_, run_info("run-v")); }(), Error);
  EXPECT_FALSE(fs::exists(dir_ / "runs" / "run-v"));
}

TEST_F(ResultsTest, ForeignFileAsDatabaseIsRejected) {
  fs::create_directories(db().parent_path());
  write_text(db(), "run_id,seq\nnot,sqlite\n");
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { ResultStore store(dir_, run_info("run-f")); }, [&] { list_runs(db()); },
           [&] { load_points(db(), "x"); }, [&] { latest_point(db(), "gemm", "NVIDIA H200", json::object()); }}) {
    try {
      call();
      ADD_FAILURE() << "expected ab::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(db().string() + " is not an accelbench results database"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(dir_ / "runs" / "run-f"));
}

TEST_F(ResultsTest, SqliteDatabaseWithoutOurTablesIsRejected) {
  fs::create_directories(db().parent_path());
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db().c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h, "CREATE TABLE songs(title TEXT)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(h);
  try {
    ResultStore store(dir_, run_info("run-g"));
    FAIL() << "expected ab::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not an accelbench results database"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("songs"), std::string::npos) << e.what();
  }
  EXPECT_THROW(list_runs(db()), Error);
}

TEST_F(ResultsTest, NewerSchemaVersionIsRejected) {
  { ResultStore store(dir_, run_info("run-n")); }
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db().c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h, "PRAGMA user_version=2", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(h);
  try {
    list_runs(db());
    FAIL() << "expected ab::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("schema version 2"), std::string::npos) << e.what();
  }
}

TEST_F(ResultsTest, MissingDatabaseNamesTheFile) {
  try {
    list_runs(db());
    FAIL() << "expected ab::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(db().string()), std::string::npos) << e.what();
  }
}

TEST_F(ResultsTest, LoadPointsOfUnknownRunIsUsageErrorListingKnownRuns) {
  {
    ResultStore store(dir_, run_info("run-known"));
    store.append(make_record("run-known", 0));
    store.finish("complete");
  }
  try {
    load_points(db(), "run-unknown");
    FAIL() << "expected ab::UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("run-unknown"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("run-known"), std::string::npos) << e.what();
  }
}

TEST_F(ResultsTest, LatestPointPicksNewestMatchingOkPoint) {
  const json bf16 = {{"precision", "bf16"}, {"m", 8192}, {"n", 8192}, {"k", 8192}};
  const json fp16 = {{"precision", "fp16"}, {"m", 8192}, {"n", 8192}, {"k", 8192}};
  {
    ResultStore r1(dir_, run_info("run-1", "2026-11-01T00:00:00.000Z"));
    r1.append(make_record("run-1", 0, "gemm", "ok", "NVIDIA H200", bf16, "2026-11-01T00:00:01.000Z"));
    r1.finish("complete");
  }
  {
    ResultStore r2(dir_, run_info("run-2", "2026-11-02T00:00:00.000Z"));
    json wanted = make_record("run-2", 0, "gemm", "ok", "NVIDIA H200", bf16, "2026-11-02T00:00:01.000Z");
    wanted["rates"]["tflops"] = 777.0;
    r2.append(wanted);
    // Newer, but each fails one condition.
    r2.append(make_record("run-2", 1, "gemm", "error", "NVIDIA H200", bf16, "2026-11-02T00:00:02.000Z"));
    r2.append(make_record("run-2", 2, "gemm", "ok", "NVIDIA A100", bf16, "2026-11-02T00:00:03.000Z"));
    r2.append(make_record("run-2", 3, "gemm", "ok", "NVIDIA H200", fp16, "2026-11-02T00:00:04.000Z"));
    r2.append(make_record("run-2", 4, "conv", "ok", "NVIDIA H200", bf16, "2026-11-02T00:00:05.000Z"));
    r2.finish("complete");
  }
  const auto p = latest_point(db(), "gemm", "NVIDIA H200", {{"precision", "bf16"}, {"m", 8192.0}});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ((*p)["run_id"], "run-2");
  EXPECT_EQ((*p)["seq"], 0);
  EXPECT_EQ((*p)["rates"]["tflops"], 777.0);

  const auto any = latest_point(db(), "gemm", "NVIDIA H200", json::object());
  ASSERT_TRUE(any.has_value());
  EXPECT_EQ((*any)["seq"], 3);  // the fp16 one is the newest ok gemm on the H200
  EXPECT_FALSE(latest_point(db(), "gemm", "NVIDIA H200", {{"precision", "fp8"}}).has_value());
  EXPECT_FALSE(latest_point(db(), "gemm", "NVIDIA H200", {{"batch", 1}}).has_value());
  EXPECT_FALSE(latest_point(db(), "stream", "NVIDIA H200", json::object()).has_value());
}

TEST(ResultsCsv, QuotesAndUnitesColumns) {
  std::vector<json> points = {
      {{"run_id", "r"}, {"seq", 0}, {"workload", "gemm"}, {"device", "cuda:0"}, {"device_name", "NVIDIA H200"},
       {"status", "ok"}, {"params", {{"m", 64}, {"precision", "bf16"}}},
       {"time", {{"median_s", 0.5}, {"count", 10}, {"converged", true}}}, {"rates", {{"tflops", 1.5}}}},
      {{"run_id", "r"}, {"seq", 1}, {"workload", "gemm"}, {"status", "error"},
       {"reason", "bad, \"very\" bad\nreally"}, {"params", {{"batch", 8}, {"m", 128}}}},
  };
  std::ostringstream out;
  write_csv(out, points);
  const std::string header =
      "run_id,seq,workload,device,device_name,status,reason,params.batch,params.m,params.precision,"
      "time.median_s,time.mean_s,time.min_s,time.max_s,time.p90_s,time.p99_s,time.rel_spread,time.count,"
      "time.converged,rates.samples_per_s,rates.tflops,rates.gbps,rates.pct_of_ceiling\n";
  const std::string row0 = "r,0,gemm,cuda:0,NVIDIA H200,ok,,,64,bf16,0.5,,,,,,,10,true,,1.5,,\n";
  const std::string row1 = "r,1,gemm,,,error,\"bad, \"\"very\"\" bad\nreally\",8,128,,,,,,,,,,,,,,\n";
  EXPECT_EQ(out.str(), header + row0 + row1);

  // Telemetry columns appear once any point has them.
  points[1]["telemetry"] = {{"mean_power_w", 650.5}, {"energy_j", 1300.0}};
  std::ostringstream with_power;
  write_csv(with_power, points);
  const std::string text = with_power.str();
  const std::string first_line = text.substr(0, text.find('\n'));
  EXPECT_NE(first_line.find(",rates.pct_of_ceiling,telemetry.mean_power_w,telemetry.energy_j"), std::string::npos);
  EXPECT_EQ(first_line.find("samples_per_j"), std::string::npos);
  EXPECT_NE(text.find(",650.5,1300.0\n"), std::string::npos) << text;
}

// A load generator point carries its verdict and latency percentiles in columns of their own.
TEST(ResultsCsv, LoadgenVerdictAndPercentilesHaveColumns) {
  const std::vector<json> points = {
      {{"run_id", "r"},
       {"seq", 0},
       {"workload", "loadgen"},
       {"status", "ok"},
       {"params", {{"scenario", "server"}}},
       {"scenario",
        {{"name", "server"},
         {"result", "INVALID"},
         {"metric", {{"name", "completed_samples_per_s"}, {"value", 812.5}}},
         {"latency_s",
          {{"p50", 0.002},
           {"p90", 0.003},
           {"p95", 0.004},
           {"p97", 0.0045},
           {"p99", 0.009},
           {"p99_9", 0.02},
           {"max", 0.05}}}}}},
      {{"run_id", "r"}, {"seq", 1}, {"workload", "gemm"}, {"status", "ok"}, {"params", {{"m", 64}}}}};
  std::ostringstream out;
  write_csv(out, points);
  const std::string text = out.str();
  const std::string header = text.substr(0, text.find('\n'));
  EXPECT_NE(
      header.find(",scenario.name,scenario.result,scenario.metric.name,scenario.metric.value,scenario.latency_s.p50,"
                  "scenario.latency_s.p90,scenario.latency_s.p95,scenario.latency_s.p97,scenario.latency_s.p99,"
                  "scenario.latency_s.p99_9,scenario.latency_s.max"),
      std::string::npos)
      << header;
  EXPECT_NE(text.find(",server,INVALID,completed_samples_per_s,812.5,0.002,0.003,0.004,0.0045,0.009,0.02,0.05\n"),
            std::string::npos)
      << text;
  // The gemm row leaves them empty; without a loadgen point there are no such columns.
  EXPECT_NE(text.find("r,1,gemm,"), std::string::npos);
  std::ostringstream gemm_only;
  write_csv(gemm_only, {points[1]});
  EXPECT_EQ(gemm_only.str().find("scenario."), std::string::npos);
}

TEST_F(ResultsTest, ConcurrentAppendsFromTwoStoresBothLand) {
  constexpr int kPoints = 40;
  auto writer = [&](const std::string& id) {
    ResultStore store(dir_, run_info(id));
    for (int i = 0; i < kPoints; ++i) store.append(make_record(id, i));
    store.finish("complete");
  };
  std::thread a(writer, "run-t1"), b(writer, "run-t2");
  a.join();
  b.join();
  for (const char* id : {"run-t1", "run-t2"}) {
    EXPECT_EQ(load_points(db(), id).size(), static_cast<std::size_t>(kPoints)) << id;
    EXPECT_EQ(read_jsonl(dir_ / "runs" / id / "points.jsonl").records.size(), static_cast<std::size_t>(kPoints));
  }
}

TEST_F(ResultsTest, ConcurrentAppendsFromTwoProcessesBothLand) {
  constexpr int kPoints = 40;
  std::vector<pid_t> children;
  for (const char* id : {"run-p1", "run-p2"}) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        ResultStore store(dir_, run_info(id));
        for (int i = 0; i < kPoints; ++i) store.append(make_record(id, i));
        store.finish("complete");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %s: %s\n", id, e.what());
        rc = 1;
      }
      ::_exit(rc);  // skip gtest's teardown in the child
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  }
  const auto rows = list_runs(db());
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    EXPECT_EQ(r.status, "complete");
    EXPECT_EQ(r.points, kPoints) << r.run_id;
  }
}

// --fields: dotted paths into the record's JSON, list indices included.
TEST_F(ResultsTest, ReadJsonlNamesEachUnreadableLine) {
  const fs::path f = dir_ / "points.jsonl";
  write_text(f, make_record("r", 0).dump() + "\n{garbled\n\n" + make_record("r", 1).dump() + "\n[1,2]\n");
  const JsonlRead read = read_jsonl(f);
  EXPECT_EQ(read.records.size(), 2u);
  EXPECT_EQ(read.bad_lines, 2u);
  EXPECT_EQ(read.bad_line_numbers, (std::vector<std::size_t>{2, 5}));
}

TEST(ResultsCsv, FormulaCellsAreNeutralisedAndNumbersKept) {
  std::vector<json> points = {make_record("r", 0)};
  points[0]["reason"] = "=HYPERLINK(\"http://x\")";
  points[0]["params"]["precision"] = "@SUM(A1)";
  points[0]["params"]["trans"] = "-1.5";  // a number written as text stays a number
  points[0]["params"]["m"] = -3;
  std::ostringstream csv;
  write_csv(csv, points);
  EXPECT_NE(csv.str().find(",\"'=HYPERLINK(\"\"http://x\"\")\","), std::string::npos) << csv.str();
  EXPECT_NE(csv.str().find(",'@SUM(A1),"), std::string::npos) << csv.str();
  EXPECT_NE(csv.str().find(",-1.5"), std::string::npos) << csv.str();
  EXPECT_EQ(csv.str().find("'-"), std::string::npos) << csv.str();
  EXPECT_EQ(spreadsheet_safe("+cmd|' /C calc'!A0"), "'+cmd|' /C calc'!A0");
  EXPECT_EQ(spreadsheet_safe("-"), "'-");
  EXPECT_EQ(spreadsheet_safe("1e-3"), "1e-3");
  EXPECT_EQ(spreadsheet_safe("\tx"), "'\tx");
  std::ostringstream fields;
  write_fields(fields, points, {"reason", "params.m"}, /*csv=*/true);
  EXPECT_NE(fields.str().find("\"'=HYPERLINK"), std::string::npos) << fields.str();
  EXPECT_NE(fields.str().find(",-3"), std::string::npos) << fields.str();
}

TEST(ResultsText, ControlCharactersAreEscapedForTheTerminal) {
  EXPECT_EQ(terminal_safe("ok\x1b[2J\x1b]0;pwned\x07 done\r\n\t"), "ok\\x1b[2J\\x1b]0;pwned\\x07 done\\x0d\\n\\t");
  EXPECT_EQ(terminal_safe("\x7f"), "\\x7f");
  EXPECT_EQ(terminal_safe("\xc2\x9b" "31m"), "\\u009b31m");  // C1 CSI
  EXPECT_EQ(terminal_safe("\xff" "a"), "\\xffa");             // not UTF-8
  EXPECT_EQ(terminal_safe("H200 \xc2\xb5s \xe2\x89\xa0"), "H200 \xc2\xb5s \xe2\x89\xa0");  // text is kept
  std::ostringstream table;
  write_fields(table, {json{{"reason", "a\x1b[31mred"}}}, {"reason"}, /*csv=*/false);
  EXPECT_EQ(table.str().find('\x1b'), std::string::npos) << table.str();
}

TEST(ResultsText, QuotedCommandLineRoundTripsThroughSh) {
  const std::vector<std::string> args = {"accelbench", "run", "gemm", "--axis", "m,n,k=64:128", "k=*2", "it's", "",
                                         "a b", "$HOME", "`id`", "semi;colon", "new\nline", "*", "back\\slash"};
  const std::string line = shell_quoted_command(args);
  EXPECT_EQ(line.substr(0, 47), "accelbench run gemm --axis m,n,k=64:128 'k=*2' ");  // plain words stay plain
  FILE* p = ::popen(("printf '%s\\0' " + line).c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[256];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0);
  std::vector<std::string> back;
  for (std::size_t start = 0, end; (end = out.find('\0', start)) != std::string::npos; start = end + 1)
    back.push_back(out.substr(start, end - start));
  EXPECT_EQ(back, args);
}

TEST_F(ResultsTest, OutputPathsOfTheStoreAreRefused) {
  {
    ResultStore store(dir_, run_info("r1"));
    store.append(make_record("r1", 0));
    store.finish("complete");
  }
  const fs::path points = dir_ / "runs" / "r1" / "points.jsonl";
  fs::create_directories(dir_ / "sub");
  fs::create_symlink(db(), dir_ / "link.csv");
  fs::create_hard_link(points, dir_ / "hard.csv");
  const auto db_bytes = fs::file_size(db());
  for (const fs::path& p : {db(), dir_ / "sub" / ".." / "runs" / "accelbench.db", fs::path(dir_ / "link.csv"),
                            fs::path(dir_ / "hard.csv"), points, dir_ / "runs" / "r1" / "run.json"}) {
    EXPECT_THROW(check_output_path(p, dir_), UsageError) << p;
    EXPECT_THROW(write_output_file(p, dir_, "x"), UsageError) << p;
  }
  EXPECT_EQ(fs::file_size(db()), db_bytes);
  EXPECT_EQ(read_jsonl(points).records.size(), 1u);
  EXPECT_NO_THROW(check_output_path(dir_ / "out.csv", dir_));
}

TEST_F(ResultsTest, OutputFileIsReplacedWholeThroughItsSymlink) {
  const fs::path real = dir_ / "real.csv", link = dir_ / "link.csv";
  write_text(real, "old");
  fs::create_symlink(real, link);
  write_output_file(link, dir_, "new contents");
  EXPECT_TRUE(fs::is_symlink(link));
  std::ifstream in(real);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "new contents");
  for (const auto& e : fs::directory_iterator(dir_))  // no temporary left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(ResultsFields, DottedPathsReachNestedKeysAndListItems) {
  const nlohmann::json record = nlohmann::json::parse(R"({"params": {"batch": 8, "precision": "bf16"},
      "telemetry": {"gpus": [{"mean_sm_clock_mhz": 1980.5}, {"mean_sm_clock_mhz": 1950}]},
      "metrics": {"fusion": {"fused_shapes": 9}}, "status": "ok", "nothing": null})");
  ASSERT_NE(find_field(record, "params.batch"), nullptr);
  EXPECT_EQ(*find_field(record, "params.batch"), 8);
  EXPECT_EQ(*find_field(record, "telemetry.gpus.0.mean_sm_clock_mhz"), 1980.5);
  EXPECT_EQ(*find_field(record, "telemetry.gpus.1.mean_sm_clock_mhz"), 1950);
  EXPECT_EQ(*find_field(record, "status"), "ok");
  EXPECT_TRUE(find_field(record, "nothing")->is_null());
  EXPECT_EQ(find_field(record, "telemetry.gpus.2.mean_sm_clock_mhz"), nullptr);  // past the list's end
  EXPECT_EQ(find_field(record, "params.batch.x"), nullptr);                      // into a number
  EXPECT_EQ(find_field(record, "params.0"), nullptr);                            // an index into an object
  EXPECT_EQ(find_field(record, "metrics.fusion.unfused_shapes"), nullptr);
}

TEST(ResultsFields, FieldListSplitsAtCommasAndRefusesEmptyPaths) {
  EXPECT_EQ(split_field_list("params.batch,rates.samples_per_s"),
            (std::vector<std::string>{"params.batch", "rates.samples_per_s"}));
  EXPECT_EQ(split_field_list("status"), std::vector<std::string>{"status"});
  for (const char* bad : {"", "a,,b", "a.b,", ".a", "a.", "a..b"})
    EXPECT_THROW(split_field_list(bad), UsageError) << bad;
}

TEST(ResultsFields, TableLeavesMissingCellsEmptyAndRefusesAPathNoRecordHas) {
  const std::vector<nlohmann::json> records = {
      nlohmann::json::parse(R"({"params": {"batch": 1}, "rates": {"samples_per_s": 1715.2512}, "status": "ok"})"),
      nlohmann::json::parse(R"({"params": {"batch": 2}, "status": "skipped", "reason": "no GPU, \"cuda\""})")};
  std::ostringstream text;
  write_fields(text, records, {"params.batch", "rates.samples_per_s", "status"}, false);
  EXPECT_EQ(text.str(),
            "params.batch  rates.samples_per_s  status\n"
            "1             1715.25              ok\n"
            "2                                  skipped\n");
  std::ostringstream csv;
  write_fields(csv, records, {"params.batch", "rates.samples_per_s", "reason"}, true);  // every digit kept
  EXPECT_EQ(csv.str(), "params.batch,rates.samples_per_s,reason\n1,1715.2512,\n2,,\"no GPU, \"\"cuda\"\"\"\n");

  std::ostringstream refused;
  try {
    write_fields(refused, records, {"params.batch", "rates.sample_per_s", "metrics.x"}, false);
    ADD_FAILURE() << "a path no record has was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("rates.sample_per_s, metrics.x"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(refused.str().empty()) << "nothing is written when a path is refused";
}

}  // namespace
}  // namespace ab::results
