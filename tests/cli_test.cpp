// End-to-end tests of the accelbench binary: exit codes, error messages, records on disk, and
// crash safety (a killed or interrupted run keeps every point measured before it).
#include <gtest/gtest.h>

#include "test_support.h"
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/session.h"
#include "harness/workload.h"
#include "results/results.h"
#include "workloads/registry.h"

extern char** environ;

namespace fs = std::filesystem;
namespace {

using ab::test::TempDir;
namespace test = ab::test;

using test::Ran;
const std::string& kBinary = test::accelbench_path();
Ran run(const std::vector<std::string>& args) { return test::accelbench(args); }

// Starts accelbench in the background (output discarded) and returns its pid.
pid_t spawn(const std::vector<std::string>& args) {
  std::vector<std::string> all{kBinary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  posix_spawn(&pid, kBinary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}


std::vector<fs::path> run_dirs(const fs::path& out) {
  std::vector<fs::path> dirs;
  if (!fs::exists(out / "runs")) return dirs;
  for (const auto& e : fs::directory_iterator(out / "runs"))
    if (e.is_directory()) dirs.push_back(e.path());
  return dirs;
}

std::size_t complete_lines(const fs::path& file) {
  return ab::results::read_jsonl(file).records.size();
}

// A sweep of small CPU stream points, slow enough to be killed in the middle.
std::vector<std::string> long_sweep(const fs::path& out) {
  return {"run", "stream", "--device", "cpu", "--axis", "array_bytes=65536:1048576:+65536", "--min-time", "0.3",
          "--max-noise", "50", "--out", out.string(), "--quiet"};
}

bool wait_for_points(const fs::path& out, std::size_t n, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto dirs = run_dirs(out);
    if (!dirs.empty() && fs::exists(dirs[0] / "points.jsonl") && complete_lines(dirs[0] / "points.jsonl") >= n)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace

TEST(Cli, HelpAndUsageErrors) {
  EXPECT_EQ(run({"--help"}).code, 0);
  EXPECT_EQ(run({}).code, 2);
  EXPECT_EQ(run({"frobnicate"}).code, 2);
  EXPECT_EQ(run({"run"}).code, 2);
}

TEST(Cli, ListShowsWorkloadsAndAxes) {
  const Ran o = run({"list"});
  ASSERT_EQ(o.code, 0) << o.output;
  for (const char* w : {"gemm", "stream", "copy", "ceilings", "precision", "@deepbench-train"})
    EXPECT_NE(o.output.find(w), std::string::npos) << w;
  // Options are listed beside the axes, with their defaults.
  EXPECT_NE(o.output.find("--option trajectory_steps"), std::string::npos) << o.output;
  const Ran j = run({"list", "--json"});
  ASSERT_EQ(j.code, 0);
  const auto listed = nlohmann::json::parse(j.output);
  EXPECT_EQ(listed.size(), ab::workloads::registry().all().size());  // every registered workload
  bool train_options = false;
  for (const auto& w : listed)
    if (w["name"] == "train")
      for (const auto& opt : w["options"])
        if (opt["name"] == "steps_per_sample") train_options = opt["default"] == "0" && opt["kind"] == "integer";
  EXPECT_TRUE(train_options) << j.output;
}

// --option name=value: an option no workload of the run declares, or a malformed one, is refused
// before anything runs, listing the valid names.
TEST(Cli, UnknownOptionsAreRefusedListingTheValidOnes) {
  TempDir dir;
  Ran o = run({"run", "train", "--device", "cpu", "--option", "comm_ctas=8", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("valid: lr, trajectory_steps, steps_per_sample"), std::string::npos) << o.output;
  o = run({"run", "train", "--device", "cpu", "--option", "trajectory_steps", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("name=value"), std::string::npos) << o.output;
  const fs::path suite = dir.path() / "s.yaml";
  std::ofstream(suite) << "steps:\n  - workload: stream\n";
  o = run({"run", suite.string(), "--device", "cpu", "--option", "trajectory_steps=2", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("has option 'trajectory_steps'"), std::string::npos) << o.output;
  EXPECT_TRUE(run_dirs(dir.path()).empty()) << "nothing may be written for a refused request";
}

TEST(Cli, SysinfoNamesTheCpu) {
  const Ran o = run({"sysinfo", "--json"});
  ASSERT_EQ(o.code, 0) << o.output;
  const auto j = nlohmann::json::parse(o.output);
  EXPECT_FALSE(j["host"]["cpu_model"].get<std::string>().empty());
  EXPECT_EQ(j["devices"][0]["id"], "cpu");
  EXPECT_FALSE(j["build"]["git_commit"].get<std::string>().empty());
}

TEST(Cli, UnknownNamesListTheValidOnes) {
  TempDir dir;
  Ran o = run({"run", "gemmm", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.output.find("valid: ceilings, gemm, stream, copy"), std::string::npos) << o.output;
  o = run({"run", "gemm", "--device", "cpu", "--axis", "batch=4", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.output.find("valid: precision, m, n, k, trans"), std::string::npos) << o.output;
  o = run({"run", "gemm", "--device", "cpu", "--axis", "precision=fp64", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.output.find("bf16"), std::string::npos) << o.output;
  o = run({"run", "gemm", "--device", "cpu", "--axis", "m=1:x", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2);
  o = run({"run", "gemm", "--device", "tpu:0", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.output.find("cpu, cuda:N"), std::string::npos) << o.output;
  EXPECT_TRUE(run_dirs(dir.path()).empty()) << "nothing may be written for a refused request";
}

TEST(Cli, WarmupIsBoundedByTheTimeoutAndRecorded) {
  TempDir dir;
  // A warm-up of half the timeout or more is refused before anything runs, from the command line or a suite.
  Ran o = run({"run", "stream", "--device", "cpu", "--warmup", "30", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("under half the timeout"), std::string::npos) << o.output;
  EXPECT_EQ(run({"run", "stream", "--device", "cpu", "--warmup", "-1", "--out", dir.path().string()}).code, 2);
  const fs::path suite = dir.path() / "warm.yaml";
  std::ofstream(suite) << "settings:\n  warmup: 5\n  timeout: 8\nsteps:\n  - workload: stream\n";
  o = run({"run", suite.string(), "--device", "cpu", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("under half the timeout"), std::string::npos) << o.output;
  EXPECT_TRUE(run_dirs(dir.path()).empty()) << "nothing may be written for a refused request";
  // Accepted, the warm-up is part of the run's context. The point stops at its noise target; the
  // timeout is only a bound (5 s was too few on a loaded CI host: OpenMP threads oversubscribed).
  o = run({"run", "stream", "--device", "cpu", "--axis", "array_bytes=65536", "--axis", "op=copy", "--warmup", "0.2",
           "--timeout", "60", "--min-time", "0.05", "--max-noise", "50", "--out", dir.path().string(), "-q"});
  ASSERT_EQ(o.code, 0) << o.output;
  const auto dirs = run_dirs(dir.path());
  ASSERT_EQ(dirs.size(), 1u);
  const auto read = ab::results::read_jsonl(dirs[0] / "points.jsonl");
  ASSERT_EQ(read.records.size(), 1u);
  EXPECT_DOUBLE_EQ(read.records[0]["context"]["measurement"]["warmup_s"].get<double>(), 0.2);
}

TEST(Cli, SettingsThatAreNotFiniteOrOutOfRangeAreRefusedBeforeRunning) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::vector<std::string>>> refused{
      {"--min-time", {"nan", "inf", "-1", "-0.5"}},
      {"--timeout", {"nan", "inf", "-1", "0"}},
      {"--max-noise", {"nan", "inf", "-1", "0"}},
      {"--warmup", {"nan", "inf", "-1"}},
      {"--telemetry-period", {"nan", "inf", "-1", "0"}}};
  for (const auto& [option, values] : refused)
    for (const auto& value : values) {
      const Ran o = run({"run", "stream", "--device", "cpu", option, value, "--out", dir.path().string()});
      EXPECT_EQ(o.code, 2) << option << " " << value << ": " << o.output;
      EXPECT_NE(o.output.find("accelbench run: " + option + " must be a finite number"), std::string::npos)
          << option << " " << value << ": " << o.output;
    }
  // A minimum measured time the timeout would cut short.
  Ran o = run({"run", "stream", "--device", "cpu", "--min-time", "5", "--timeout", "3", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("above the timeout"), std::string::npos) << o.output;
  // A suite's settings are held to the same rules, and the message names the setting.
  const fs::path suite = dir.path() / "nan.yaml";
  std::ofstream(suite) << "name: nan\nsettings:\n  min_time: .nan\nsteps:\n  - workload: stream\n";
  o = run({"run", suite.string(), "--device", "cpu", "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("nan.yaml:3: setting 'min_time' must be a finite number"), std::string::npos) << o.output;
  EXPECT_TRUE(run_dirs(dir.path()).empty()) << "nothing may be written for a refused request";
  for (const auto& [option, value] : std::vector<std::pair<std::string, std::string>>{
           {"--interval", "nan"}, {"--interval", "inf"}, {"--interval", "0"}, {"--interval", "-5"},
           {"--duration", "nan"}, {"--duration", "inf"}, {"--duration", "-1"}}) {
    o = run({"monitor", option, value});
    EXPECT_EQ(o.code, 2) << option << " " << value << ": " << o.output;
    EXPECT_NE(o.output.find("accelbench monitor: " + option + " must be a finite number"), std::string::npos)
        << option << " " << value << ": " << o.output;
  }
}

TEST(Cli, UnwritableOutputFailsBeforeRunning) {
  TempDir dir;
  const fs::path file = dir.path() / "a_file";
  std::ofstream(file) << "x";
  const Ran o = run({"run", "stream", "--device", "cpu", "--out", (file / "sub").string()});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_EQ(o.output.find("[1/"), std::string::npos) << "no point may start: " << o.output;
}

TEST(Cli, MalformedSuiteNamesFileAndLine) {
  TempDir dir;
  const fs::path suite = dir.path() / "bad.yaml";
  std::ofstream(suite) << "name: bad\nsteps:\n  - workload: gemm\n    axes:\n      nope: [1]\n";
  Ran o = run({"run", suite.string(), "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.output.find("bad.yaml:5"), std::string::npos) << o.output;
  std::ofstream(suite) << "name: bad\nsteps: [\n";
  o = run({"run", suite.string(), "--out", dir.path().string()});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.output.find("bad.yaml:"), std::string::npos) << o.output;
}

// One small measured run in `out`, for the output tests.
void small_run(const fs::path& out) {
  const Ran o = run({"run", "stream", "--device", "cpu", "--axis", "array_bytes=65536", "--axis", "op=copy",
                     "--min-time", "0.01", "--max-noise", "50", "--out", out.string(), "--quiet"});
  ASSERT_EQ(o.code, 0) << o.output;
}

std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Cli, OutputPathsOfTheStoreAreRefusedByEveryWriter) {
  TempDir dir;
  small_run(dir.path());
  const fs::path db = dir.path() / "runs" / "accelbench.db";
  const auto dirs = run_dirs(dir.path());
  ASSERT_EQ(dirs.size(), 1u);
  const fs::path points = dirs[0] / "points.jsonl";
  const std::string db_before = file_text(db), points_before = file_text(points);
  fs::create_directories(dir.path() / "sub");
  fs::create_symlink(db, dir.path() / "store.csv");
  const std::string out = dir.path().string(), run_id = dirs[0].filename().string();
  for (const std::string& target : std::vector<std::string>{db.string(), (dir.path() / "sub" / ".." / "runs" / "accelbench.db").string(),
                                   (dir.path() / "store.csv").string(), points.string()}) {
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"results", "--out", out, "--csv", "-o", target},
             {"report", run_id, "--out", out, "--format", "md", "-o", target},
             {"compare", run_id, run_id, "--out", out, "-o", target}}) {
      const Ran o = run(args);
      EXPECT_EQ(o.code, 2) << args[0] << " -o " << target << ": " << o.output;
      EXPECT_NE(o.output.find("refusing to write"), std::string::npos) << o.output;
    }
  }
  EXPECT_EQ(file_text(db), db_before);
  EXPECT_EQ(file_text(points), points_before);
}

TEST(Cli, FailedResultsKeepsTheExistingOutputFile) {
  TempDir dir;
  small_run(dir.path());
  const fs::path existing = dir.path() / "existing.csv";
  { std::ofstream(existing) << "keep me\n"; }
  const Ran o = run({"results", "nosuchrun", "--out", dir.path().string(), "--csv", "-o", existing.string()});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_EQ(file_text(existing), "keep me\n");
  const Ran ok = run({"results", "--out", dir.path().string(), "--csv", "-o", existing.string()});
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_EQ(file_text(existing).rfind("run_id,seq,", 0), 0u);
}

TEST(Cli, WritingToAFullDeviceFails) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this machine";
  TempDir dir;
  small_run(dir.path());
  const std::string bin = test::quote(kBinary), out = test::quote(dir.path().string());
  for (const std::string& args : std::vector<std::string>{"results --out " + out, "results --out " + out + " --csv", "list",
                                 "report --out " + out + " --format md"}) {
    const Ran o = test::shell(bin + " " + args + " >/dev/full 2>&1");
    EXPECT_NE(o.code, 0) << args;
    const Ran msg = test::shell(bin + " " + args + " 2>&1 >/dev/full");
    EXPECT_NE(msg.output.find("cannot write to standard output"), std::string::npos) << args << ": " << msg.output;
  }
}

TEST(Cli, RunWithNoOkPointExitsNonZero) {
  TempDir dir;  // bf16 gemm has no CPU kernel: every point is skipped
  const Ran o = run({"run", "gemm", "--device", "cpu", "--axis", "m,n,k=64", "--axis", "precision=bf16", "--out",
                     dir.path().string(), "--quiet"});
  EXPECT_EQ(o.code, 1) << o.output;
  const auto dirs = run_dirs(dir.path());
  ASSERT_EQ(dirs.size(), 1u);
  const auto read = ab::results::read_jsonl(dirs[0] / "points.jsonl");
  ASSERT_EQ(read.records.size(), 1u);
  EXPECT_EQ(read.records[0]["status"], "skipped");
}

TEST(Cli, ListingEscapesStoredControlCharactersAndQuotesTheCommandLine) {
  TempDir dir;  // a folder name with a blank and an escape sequence: legal, and stored in the command line
  const fs::path out = dir.path() / "a b\x1b[2J";
  small_run(out);
  const Ran list = run({"results", "--out", out.string()});
  EXPECT_EQ(list.code, 0) << list.output;
  EXPECT_EQ(list.output.find('\x1b'), std::string::npos) << list.output;
  EXPECT_NE(list.output.find("a b\\x1b[2J"), std::string::npos) << list.output;
  const auto runs = ab::results::list_runs(out / "runs" / "accelbench.db");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_NE(runs.front().command_line.find(" --out " + test::quote(out.string()) + " "), std::string::npos)
      << runs.front().command_line;
}

TEST(Cli, RunWritesRecordsToJsonlAndStore) {
  TempDir dir;
  const Ran o = run({"run", "gemm", "--device", "cpu", "--axis", "m,n,k=64,96", "--axis", "precision=fp32,bf16",
                         "--min-time", "0.05", "--max-noise", "50", "--out", dir.path().string()});
  ASSERT_EQ(o.code, 0) << o.output;
  const auto dirs = run_dirs(dir.path());
  ASSERT_EQ(dirs.size(), 1u);
  const auto read = ab::results::read_jsonl(dirs[0] / "points.jsonl");
  ASSERT_EQ(read.records.size(), 4u);
  EXPECT_EQ(read.bad_lines, 0u);
  int ok = 0, skipped = 0;
  for (const auto& r : read.records) {
    if (r["status"] == "ok") {
      ++ok;
      EXPECT_TRUE(r["check"]["passed"].get<bool>());
      EXPECT_GT(r["rates"]["tflops"].get<double>(), 0);
      EXPECT_FALSE(r["time"]["samples_s"].empty());
      EXPECT_EQ(r["context"]["devices"][0]["id"], "cpu");
    } else {
      ++skipped;
      EXPECT_EQ(r["status"], "skipped");
      EXPECT_NE(r["reason"].get<std::string>().find("bf16"), std::string::npos);
    }
  }
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(skipped, 2);
  const auto runs = ab::results::list_runs(dir.path() / "runs" / "accelbench.db");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, "complete");
  EXPECT_EQ(runs[0].points, 4);

  const Ran list = run({"results", "--out", dir.path().string()});
  EXPECT_EQ(list.code, 0);
  EXPECT_NE(list.output.find(runs[0].run_id), std::string::npos);
  const Ran csv = run({"results", "--csv", "--out", dir.path().string()});
  EXPECT_EQ(csv.code, 0);
  EXPECT_EQ(std::count(csv.output.begin(), csv.output.end(), '\n'), 5) << csv.output;
  EXPECT_EQ(run({"results", "no-such-run", "--out", dir.path().string()}).code, 2);
}

TEST(Cli, CeilingsFromAnEarlierRunGivePercentOfPeak) {
  TempDir dir;
  ASSERT_EQ(run({"run", "ceilings", "--device", "cpu", "--axis", "target=gemm.fp32", "--axis", "size=128",
                 "--min-time", "0.05", "--max-noise", "50", "--out", dir.path().string(), "-q"}).code, 0);
  ASSERT_EQ(run({"run", "gemm", "--device", "cpu", "--axis", "m,n,k=128", "--min-time", "0.05", "--max-noise", "50",
                 "--out", dir.path().string(), "-q"}).code, 0);
  const std::vector<fs::path> dirs = run_dirs(dir.path());
  ASSERT_EQ(dirs.size(), 2u);
  // Run ids sort by second only; two runs in one second are told apart by their records.
  nlohmann::json gemm;
  for (const auto& d : dirs) {
    const auto record = ab::results::read_jsonl(d / "points.jsonl").records.at(0);
    if (record["workload"] == "gemm") gemm = record;
  }
  ASSERT_FALSE(gemm.is_null());
  ASSERT_TRUE(gemm["rates"].contains("pct_of_ceiling")) << gemm.dump();
  // The earlier run's ceiling is attached and the percentage is this point's rate against it. How
  // close the two rates are is a matter of machine load (a busy CI runner), not of correctness.
  const auto& rates = gemm["rates"];
  EXPECT_EQ(rates["ceiling"]["key"], "gemm.fp32");
  EXPECT_NE(rates["ceiling"]["source"].get<std::string>().find("run "), std::string::npos) << rates.dump();
  const double ceiling = rates["ceiling"]["value"].get<double>();
  ASSERT_GT(ceiling, 0.0);
  EXPECT_NEAR(rates["pct_of_ceiling"].get<double>(), 100.0 * rates["tflops"].get<double>() / ceiling, 1e-9 * 100.0)
      << rates.dump();
}

TEST(Cli, KilledRunKeepsEveryMeasuredPoint) {
  TempDir dir;
  const pid_t pid = spawn(long_sweep(dir.path()));
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_points(dir.path(), 2, 60)) << "no points appeared";
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  const auto dirs = run_dirs(dir.path());
  ASSERT_EQ(dirs.size(), 1u);
  const auto read = ab::results::read_jsonl(dirs[0] / "points.jsonl");
  EXPECT_GE(read.records.size(), 2u);
  EXPECT_LT(read.records.size(), 16u) << "the sweep should not have finished";
  for (std::size_t i = 0; i < read.records.size(); ++i) EXPECT_EQ(read.records[i]["seq"], static_cast<int>(i));
  const std::string run_id = read.records[0]["run_id"];
  const auto stored = ab::results::load_points(dir.path() / "runs" / "accelbench.db", run_id);
  // The JSONL line is written first; the kill can land between it and the database row.
  EXPECT_GE(stored.size() + 1, read.records.size());
  EXPECT_LE(stored.size(), read.records.size());
}

TEST(Cli, InterruptedRunExits130AndKeepsPoints) {
  TempDir dir;
  const pid_t pid = spawn(long_sweep(dir.path()));
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_points(dir.path(), 1, 60));
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const auto dirs = run_dirs(dir.path());
  ASSERT_EQ(dirs.size(), 1u);
  const auto read = ab::results::read_jsonl(dirs[0] / "points.jsonl");
  EXPECT_GE(read.records.size(), 1u);
  EXPECT_EQ(read.bad_lines, 0u);
  const auto runs = ab::results::list_runs(dir.path() / "runs" / "accelbench.db");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, "interrupted");
  std::ifstream run_json(dirs[0] / "run.json");
  EXPECT_EQ(nlohmann::json::parse(run_json)["status"], "interrupted");
}

TEST(Cli, KilledRunIsShownIncompleteAgainstItsPlan) {
  TempDir dir;
  const pid_t pid = spawn(long_sweep(dir.path()));
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_points(dir.path(), 2, 60)) << "no points appeared";
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  const auto runs = ab::results::list_runs(dir.path() / "runs" / "accelbench.db");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, "running");  // nothing could mark it: its owner pid tells
  // The sweep plans 16 sizes of each of stream's 4 kernels.
  const std::string shown = "incomplete (" + std::to_string(runs[0].points) + " of 64 points)";
  EXPECT_EQ(runs[0].shown_status, shown);
  const Ran list = run({"results", "--out", dir.path().string()});
  EXPECT_NE(list.output.find(shown), std::string::npos) << list.output;
}

// A hang-up (the terminal closed) and a second Ctrl-C end the run as the first Ctrl-C does.
void expect_signals_end_the_run_interrupted(const std::vector<int>& signals) {
  TempDir dir;
  const pid_t pid = spawn(long_sweep(dir.path()));
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_points(dir.path(), 1, 60));
  for (const int sig : signals) kill(pid, sig);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const auto dirs = run_dirs(dir.path());
  ASSERT_EQ(dirs.size(), 1u);
  const auto read = ab::results::read_jsonl(dirs[0] / "points.jsonl");
  EXPECT_GE(read.records.size(), 1u);
  EXPECT_EQ(read.bad_lines, 0u);
  for (const auto& r : read.records) EXPECT_NE(r["status"], "invalid") << r.dump();
  const auto runs = ab::results::list_runs(dir.path() / "runs" / "accelbench.db");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, "interrupted");
  EXPECT_EQ(static_cast<std::size_t>(runs[0].points), read.records.size());
}

TEST(Cli, HangupEndsTheRunAsInterrupted) { expect_signals_end_the_run_interrupted({SIGHUP}); }

TEST(Cli, ASecondInterruptEndsTheRunAsTheFirstDoes) { expect_signals_end_the_run_interrupted({SIGINT, SIGINT}); }

TEST(Cli, SuiteTypeErrorsAndDuplicateKeysNameFileAndLine) {
  TempDir dir;
  const fs::path suite = dir.path() / "bad.yaml";
  const auto expect_refused = [&](const std::string& text, const std::string& where, const std::string& what) {
    std::ofstream(suite) << text;
    const Ran o = run({"run", suite.string(), "--device", "cpu", "--out", dir.path().string()});
    EXPECT_EQ(o.code, 2) << text << "\n" << o.output;
    EXPECT_NE(o.output.find(where), std::string::npos) << text << "\n" << o.output;
    EXPECT_NE(o.output.find(what), std::string::npos) << text << "\n" << o.output;
    EXPECT_EQ(o.output.find("[1/"), std::string::npos) << "nothing may run: " << o.output;
  };
  expect_refused("name: [a, b]\nsteps:\n  - workload: gemm\n", "bad.yaml:1", "wrong type");
  expect_refused("name: x\nsteps:\n  - workload: {a: 1}\n", "bad.yaml:3", "wrong type");
  expect_refused("name: x\nname: y\nsteps:\n  - workload: gemm\n", "bad.yaml:2", "given twice (first on line 1)");
  expect_refused("name: x\nsteps:\n  - workload: gemm\n    axes:\n      m,n,k: 64\n      m,n,k: 96\n", "bad.yaml:6",
                 "given twice");
  expect_refused("name: x\nsettings:\n  timeout: -1\nsteps:\n  - workload: gemm\n", "bad.yaml:3", "timeout");
  expect_refused("name: x\nsettings:\n  mode: hot\nsteps:\n  - workload: gemm\n", "bad.yaml:3", "timing mode");
  expect_refused("name: x\nsteps:\n  - workload: gemm\n    axes:\n      m: 64\n      m,n,k: 96\n", "bad.yaml:5",
                 "set twice");
}

TEST(Cli, ConflictingAxisOverridesAreRefused) {
  TempDir dir;
  const std::vector<std::string> base{"run", "gemm", "--device", "cpu", "--out", dir.path().string()};
  const auto with = [&](std::vector<std::string> axes) {
    auto args = base;
    for (auto& a : axes) args.insert(args.end(), {"--axis", a});
    return run(args);
  };
  Ran o = with({"m=64", "m=96"});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("axis 'm' is set twice"), std::string::npos) << o.output;
  o = with({"m,n,k=64", "k=96"});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("axis 'k' is set twice"), std::string::npos) << o.output;
  o = with({"m=64", "n=64", "k=64"});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("set one at a time give the point m,n,k,trans=64x64x64x"), std::string::npos) << o.output;
  EXPECT_FALSE(fs::exists(dir.path() / "runs")) << "nothing may be stored";
}

TEST(Cli, AKilledImportLeavesNoRunOrAWholeOne) {
  TempDir dir;
  const fs::path csv = dir.path() / "big.csv";
  {
    std::ofstream out(csv);
    out << "workload,params,metric,value,unit,source\n";
    for (int i = 0; i < 20000; ++i) out << "gemm,m=" << i + 1 << ",tflops,1.5,TFLOP/s,paper\n";
  }
  const fs::path store = dir.path() / "store";
  const pid_t pid = spawn({"import", csv.string(), "--system", "X", "--out", store.string()});
  ASSERT_GT(pid, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!fs::exists(store / "runs" / "accelbench.db")) return;  // killed before the store existed: nothing stored
  for (const auto& r : ab::results::list_runs(store / "runs" / "accelbench.db")) {
    EXPECT_EQ(r.status, "external");
    EXPECT_EQ(r.points, 20000) << "an import is stored whole or not at all";
  }
  for (const auto& d : run_dirs(store)) {
    if (d.filename().string().front() == '.') continue;  // built aside: no run id starts with '.'
    std::ifstream info(d / "run.json");
    ASSERT_TRUE(info) << "a visible run folder is a whole run: " << d;
    EXPECT_EQ(nlohmann::json::parse(info)["status"], "external");
    EXPECT_EQ(ab::results::read_jsonl(d / "points.jsonl").records.size(), 20000u);
  }
}

TEST(Cli, ResultsFieldsPrintsChosenFieldsOfEachPoint) {
  TempDir dir;
  const Ran measured = run({"run", "gemm", "--device", "cpu", "--axis", "m,n,k=64,96", "--min-time", "0.05",
                                "--max-noise", "50", "--out", dir.path().string(), "-q"});
  ASSERT_EQ(measured.code, 0) << measured.output;
  const Ran table = run({"results", "--out", dir.path().string(), "--fields", "params.m,status,metrics.nothing"});
  EXPECT_EQ(table.code, 2) << "a path no record has is refused, naming it";
  EXPECT_NE(table.output.find("metrics.nothing"), std::string::npos) << table.output;
  const Ran csv = run({"results", "--out", dir.path().string(), "--fields", "params.m,status", "--csv"});
  ASSERT_EQ(csv.code, 0) << csv.output;
  EXPECT_EQ(csv.output, "params.m,status\n64,ok\n96,ok\n");
  const Ran text = run({"results", "--out", dir.path().string(), "--fields", "params.m,context.devices.0.id"});
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_EQ(text.output, "params.m  context.devices.0.id\n64        cpu\n96        cpu\n");
}

// ---------------------------------------------------------------------------------------------
// The run session in-process: its steps against a registry of test workloads.

namespace {

using ab::harness::AxisKind;
using ab::harness::RunRequest;
using ab::harness::RunSession;
using ab::harness::State;

// Each value of `outcome` ends the point one way; "ok" measures a trivial loop, "fatal" throws
// what the runner does not turn into a status, after removing the run's folder when asked.
class OutcomeWorkload final : public ab::harness::Workload {
 public:
  std::string name() const override { return "outcomes"; }
  std::string description() const override { return "test double"; }
  std::vector<ab::harness::AxisSpec> axes(const std::string&) const override {
    const std::vector<std::string> all{"ok", "skip", "check", "diverged", "oom", "fatal", "interrupt", "slow"};
    return {{"outcome", AxisKind::text, {"ok", "skip", "check", "diverged", "oom"}, all, "how the point ends"}};
  }
  void run(State& state) override {
    const std::string c = state.get_text("outcome");
    if (c == "skip") state.skip("not here");
    if (c == "check") state.check(0.5, 1e-3, "test check");
    if (c == "diverged") throw ab::Diverged("loss is nan");
    if (c == "oom") throw ab::OutOfMemory("device full");
    if (c == "fatal") {
      if (remove_run_dir) fs::remove_all(state.artifact_dir().parent_path().parent_path());
      throw 42;  // not an exception the runner records: the run itself fails
    }
    state.set_counts({1.0, 0, 64});
    if (c == "interrupt") {
      state.exec([this] {
        sink = sink + 1.0;
        if (cancel_on_run != nullptr) cancel_on_run->store(true);  // a Ctrl-C while the point runs
      });
      return;
    }
    if (c == "slow") {
      state.exec([] { std::this_thread::sleep_for(std::chrono::milliseconds(400)); });
      return;
    }
    state.exec([this] { sink = sink + 1.0; });
  }
  std::atomic<bool>* cancel_on_run = nullptr;
  bool remove_run_dir = false;
  volatile double sink = 0;
};

ab::harness::Registry outcome_registry(OutcomeWorkload** out) {
  auto w = std::make_unique<OutcomeWorkload>();
  *out = w.get();
  std::vector<std::unique_ptr<ab::harness::Workload>> all;
  all.push_back(std::move(w));
  return ab::harness::Registry(std::move(all));
}

RunRequest fast_request(const fs::path& out) {
  RunRequest r;
  r.target = "outcomes";
  r.device = "cpu";
  r.min_time_s = 0.01, r.max_noise_pct = 50, r.timeout_s = 5;
  r.out_dir = out.string();
  r.quiet = true;
  return r;
}

ab::harness::Planner plan_with(std::vector<ab::harness::AxisOverride> overrides, const ab::harness::Registry& reg) {
  return [overrides, &reg](const std::string& kind, const std::optional<ab::harness::Suite>&) {
    return ab::harness::plan_for(reg.find("outcomes"), kind, overrides);
  };
}

}  // namespace

TEST(RunSession, OpensRunsAndClosesIntoTheStoreWithEachOutcomesStatus) {
  TempDir dir;
  OutcomeWorkload* w = nullptr;
  const auto reg = outcome_registry(&w);
  std::ostringstream err;
  RunSession session(fast_request(dir.path()), err);
  ASSERT_EQ(session.open(reg, plan_with({}, reg)), 0) << err.str();
  EXPECT_TRUE(session.leader());
  const std::atomic<bool> cancel{false};
  const auto totals = session.run(cancel);
  ASSERT_TRUE(totals.has_value()) << err.str();
  EXPECT_EQ(session.close(*totals), 0) << err.str();
  EXPECT_EQ(totals->by_status, (std::map<std::string, int>{{"ok", 1}, {"skipped", 1}, {"error", 1}, {"diverged", 1}, {"oom", 1}}));
  const auto read = ab::results::read_jsonl(session.points_path());
  ASSERT_EQ(read.records.size(), 5u);
  EXPECT_EQ(read.records[1]["reason"], "not here");  // the reason is the error's what()
  EXPECT_EQ(read.records[3]["reason"], "loss is nan");
  EXPECT_DOUBLE_EQ(read.records[0]["context"]["measurement"]["min_time_s"].get<double>(), 0.01);
  const auto runs = ab::results::list_runs(dir.path() / "runs" / "accelbench.db");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].run_id, session.run_id());
  EXPECT_EQ(runs[0].status, "complete");
  EXPECT_TRUE(err.str().empty()) << "quiet: " << err.str();
}

TEST(RunSession, ThePointInFlightAtAnInterruptIsRecordedInterrupted) {
  TempDir dir;
  OutcomeWorkload* w = nullptr;
  const auto reg = outcome_registry(&w);
  std::atomic<bool> cancel{false};
  w->cancel_on_run = &cancel;
  std::ostringstream err;
  RunSession session(fast_request(dir.path()), err);
  ASSERT_EQ(session.open(reg, plan_with({{{"outcome"}, "ok,interrupt,ok"}}, reg)), 0) << err.str();
  const auto totals = session.run(cancel);
  ASSERT_TRUE(totals.has_value()) << err.str();
  EXPECT_TRUE(totals->interrupted);
  EXPECT_EQ(session.close(*totals), 0) << err.str();
  const auto read = ab::results::read_jsonl(session.points_path());
  ASSERT_EQ(read.records.size(), 2u);
  EXPECT_EQ(read.records[0]["status"], "ok");
  EXPECT_EQ(read.records[1]["status"], "interrupted") << read.records[1].dump();
  const auto runs = ab::results::list_runs(dir.path() / "runs" / "accelbench.db");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, "interrupted");
  EXPECT_EQ(runs[0].shown_status, "incomplete (2 of 3 points)");
}

TEST(RunSession, APointOutOfTimeEndsAtItsTimeoutAndIsRecordedTimeout) {
  TempDir dir;
  OutcomeWorkload* w = nullptr;
  const auto reg = outcome_registry(&w);
  RunRequest request = fast_request(dir.path());
  request.timeout_s = 1;
  request.warmup_s = 0;  // the first iteration, then one sample: a second would end past the timeout
  std::ostringstream err;
  RunSession session(request, err);
  ASSERT_EQ(session.open(reg, plan_with({{{"outcome"}, "slow"}}, reg)), 0) << err.str();
  const std::atomic<bool> cancel{false};
  const auto t0 = std::chrono::steady_clock::now();
  const auto totals = session.run(cancel);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(totals.has_value()) << err.str();
  EXPECT_EQ(session.close(*totals), 0) << err.str();
  EXPECT_LT(wall_s, 2.0) << "400 ms iterations under a 1 s timeout";
  const auto read = ab::results::read_jsonl(session.points_path());
  ASSERT_EQ(read.records.size(), 1u);
  const auto& r = read.records[0];
  EXPECT_EQ(r["status"], "timeout") << r.dump();
  EXPECT_NE(r["reason"].get<std::string>().find("of at least 10 samples"), std::string::npos) << r.dump();
  ASSERT_TRUE(r.contains("time")) << "what was measured is kept: " << r.dump();
  EXPECT_GE(r["time"]["median_s"].get<double>(), 0.4);
  EXPECT_FALSE(r.contains("rates")) << "no rate from too few samples: " << r.dump();
}

TEST(RunSession, RefusedRequestReturnsTwoAndWritesNothing) {
  TempDir dir;
  OutcomeWorkload* w = nullptr;
  const auto reg = outcome_registry(&w);
  std::ostringstream err;
  RunRequest request = fast_request(dir.path());
  request.target = "nope";
  RunSession session(request, err);
  EXPECT_EQ(session.open(reg, plan_with({}, reg)), 2);
  EXPECT_NE(err.str().find("accelbench run: "), std::string::npos) << err.str();
  EXPECT_NE(err.str().find("outcomes"), std::string::npos) << "the valid names are listed: " << err.str();
  EXPECT_TRUE(run_dirs(dir.path()).empty());
}

TEST(RunSession, AFailedRunIsMarkedFailedAndAFailureToMarkItStillReportsTheFirstError) {
  for (const bool remove_run_dir : {false, true}) {
    TempDir dir;
    OutcomeWorkload* w = nullptr;
    const auto reg = outcome_registry(&w);
    w->remove_run_dir = remove_run_dir;
    std::ostringstream err;
    RunSession session(fast_request(dir.path()), err);
    ASSERT_EQ(session.open(reg, plan_with({{{"outcome"}, "ok,fatal"}}, reg)), 0) << err.str();
    const std::atomic<bool> cancel{false};
    std::optional<ab::harness::RunTotals> totals;
    ASSERT_NO_THROW(totals = session.run(cancel));
    EXPECT_FALSE(totals.has_value());
    const std::string text = err.str();
    EXPECT_EQ(text.find("accelbench run: unknown exception"), 0u) << "the first error comes first: " << text;
    const auto runs = ab::results::list_runs(dir.path() / "runs" / "accelbench.db");
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].points, 1) << "the point measured before the failure is kept";
    if (!remove_run_dir) {
      EXPECT_EQ(runs[0].status, "failed");
      EXPECT_EQ(text.find("then "), std::string::npos) << text;
    } else {  // run.json cannot be rewritten: said beside the first error, with where the points are
      EXPECT_NE(text.find("then marking the run failed: "), std::string::npos) << text;
      EXPECT_NE(text.find("the measured points are in " + session.points_path().string()), std::string::npos) << text;
    }
  }
}

TEST(RunSession, SettingsAreTheRequestsOverTheSuitesOverTheDefaults) {
  const ab::measure::Settings defaults;
  RunRequest request;
  ab::measure::Settings s = ab::harness::merge_settings(request, std::nullopt);
  EXPECT_EQ(s.min_time_s, defaults.min_time_s);
  EXPECT_EQ(s.timeout_s, defaults.timeout_s);
  EXPECT_EQ(s.warmup_s, defaults.warmup_s);
  ab::harness::Suite suite;
  suite.min_time_s = 2.0, suite.timeout_s = 30.0, suite.warmup_s = 1.0, suite.mode = "cold";
  s = ab::harness::merge_settings(request, suite);
  EXPECT_EQ(s.min_time_s, 2.0);
  EXPECT_EQ(s.timeout_s, 30.0);
  EXPECT_EQ(s.warmup_s, 1.0);
  EXPECT_EQ(s.mode, ab::measure::TimingMode::cold);
  EXPECT_EQ(s.max_noise_pct, defaults.max_noise_pct);
  request.min_time_s = 0.25, request.warmup_s = 0.5, request.mode = "batch";
  s = ab::harness::merge_settings(request, suite);
  EXPECT_EQ(s.min_time_s, 0.25);
  EXPECT_EQ(s.timeout_s, 30.0);
  EXPECT_EQ(s.warmup_s, 0.5);
  EXPECT_EQ(s.mode, ab::measure::TimingMode::batch);
  request.timeout_s = 0.8;  // a warm-up of half the timeout or more is refused
  EXPECT_THROW(ab::harness::merge_settings(request, suite), ab::UsageError);
  request.warmup_s = 0.1, request.min_time_s = 0.9;  // a minimum time beyond the timeout is refused
  EXPECT_THROW(ab::harness::merge_settings(request, suite), ab::UsageError);
  request.min_time_s = 0.0;  // 0 is a minimum time (stop on noise alone)
  EXPECT_EQ(ab::harness::merge_settings(request, suite).min_time_s, 0.0);
  request.min_time_s = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(ab::harness::merge_settings(request, suite), ab::UsageError);
}
