// Failures while failing, end to end on the accelbench binary: a store locked past the wait for it,
// a disk that fills mid-run, output to a full device. Each must print the first error, leave no
// run `running` where it can be marked, exit non-zero and never abort. Also the exit code of a run
// whose points hit their timeout, and the report of a run killed before its plan was done.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/report.h"
#include "results/results.h"
#include "test_support.h"

extern char** environ;

namespace fs = std::filesystem;
namespace {

using ab::test::Ran;
using ab::test::TempDir;
namespace test = ab::test;

const std::string& kBinary = test::accelbench_path();
Ran run(const std::vector<std::string>& args) { return test::accelbench(args); }

std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// What every failure must avoid: an uncaught exception or an abort from an error handler.
void expect_no_abort(const Ran& o, const std::string& what) {
  EXPECT_NE(o.code, -1) << what << ": killed by a signal";
  EXPECT_NE(o.code, 134) << what << ": aborted";
  EXPECT_EQ(o.output.find("terminate called"), std::string::npos) << what << ": " << o.output;
}

// accelbench in the background with `env` added, stdout and stderr to `log`.
pid_t spawn_logged(const std::vector<std::string>& args, const fs::path& log, const std::vector<std::string>& env) {
  std::vector<std::string> all{kBinary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text(env);
  for (char** e = environ; *e != nullptr; ++e) env_text.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  posix_spawn(&pid, kBinary.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// The exit status of `pid` within `timeout_s` (-1: killed by a signal; nullopt: still running, now killed).
std::optional<int> wait_exit(pid_t pid, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<fs::path> run_dirs(const fs::path& out) {
  std::vector<fs::path> dirs;
  if (!fs::exists(out / "runs")) return dirs;
  for (const auto& e : fs::directory_iterator(out / "runs"))
    if (e.is_directory()) dirs.push_back(e.path());
  return dirs;
}

bool wait_for_points(const fs::path& out, std::size_t n, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto dirs = run_dirs(out);
    if (dirs.size() == 1 && fs::exists(dirs[0] / "points.jsonl") &&
        ab::results::read_jsonl(dirs[0] / "points.jsonl").records.size() >= n)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// 64 small CPU stream points, slow enough to be stopped in the middle.
std::vector<std::string> long_sweep(const fs::path& out) {
  return {"run",        "stream", "--device",    "cpu", "--axis", "array_bytes=65536:1048576:+65536",
          "--min-time", "0.3",    "--max-noise", "50",  "--out",  out.string(),
          "--quiet"};
}

void small_run(const fs::path& out) {
  const Ran o = run({"run", "stream", "--device", "cpu", "--axis", "array_bytes=65536", "--axis", "op=copy",
                     "--min-time", "0.01", "--max-noise", "50", "--out", out.string(), "--quiet"});
  ASSERT_EQ(o.code, 0) << o.output;
}

// The first line of `text` that starts with `prefix` ("" if none).
std::string first_line_with(const std::string& text, const std::string& prefix) {
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    if (text.compare(at, prefix.size(), prefix) == 0) return text.substr(at, end - at);
    at = end + 1;
  }
  return {};
}

// An exclusive lock on an SQLite database, held from another connection until destroyed.
class HeldLock {
 public:
  explicit HeldLock(const fs::path& db) {
    if (sqlite3_open(db.c_str(), &db_) != SQLITE_OK) throw std::runtime_error("cannot open " + db.string());
    sqlite3_busy_timeout(db_, 20000);  // the run may be writing its point: wait for it
    if (sqlite3_exec(db_, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr) != SQLITE_OK)
      throw std::runtime_error(std::string("cannot lock: ") + sqlite3_errmsg(db_));
  }
  ~HeldLock() {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(db_);
  }
  HeldLock(const HeldLock&) = delete;
  HeldLock& operator=(const HeldLock&) = delete;

 private:
  sqlite3* db_ = nullptr;
};

bool is_character_device(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

}  // namespace

// Output to a device or a pipe is written into it, never replaced by a renamed file; a full device
// is a failure with its reason.
TEST(FailingWrites, OutputToAFullDeviceFailsWithTheReasonAndKeepsTheDevice) {
  TempDir dir;
  small_run(dir.path());
  const std::string out = dir.path().string();
  const std::string run_id = run_dirs(dir.path()).at(0).filename().string();
  // A pipe first: were it replaced by a file, the same would happen to /dev/full below.
  const fs::path fifo = dir.path() / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  const Ran piped = run({"results", "--out", out, "--csv", "-o", fifo.string()});
  std::string received(65536, '\0');
  const ssize_t n = ::read(reader, received.data(), received.size());
  ::close(reader);
  EXPECT_EQ(piped.code, 0) << piped.output;
  EXPECT_EQ(fs::status(fifo).type(), fs::file_type::fifo) << "the pipe was replaced";
  ASSERT_GT(n, 0);
  EXPECT_EQ(received.rfind("run_id,seq,", 0), 0u) << received.substr(0, 80);
  if (fs::status(fifo).type() != fs::file_type::fifo) GTEST_FAIL() << "not writing to /dev/full: it would be replaced";

  if (!is_character_device("/dev/full")) GTEST_SKIP() << "no /dev/full device on this machine";
  std::vector<std::vector<std::string>> writers{{"results", "--out", out, "--csv", "-o", "/dev/full"},
                                                {"report", run_id, "--out", out, "--format", "md", "-o", "/dev/full"}};
  if (ab::report::html_available()) writers.push_back({"report", run_id, "--out", out, "-o", "/dev/full"});
  for (const auto& args : writers) {
    const std::string what = args[0] + " " + args.back() + " (" + args[args.size() - 3] + ")";
    const Ran o = run(args);
    expect_no_abort(o, what);
    EXPECT_EQ(o.code, 1) << what << ": " << o.output;
    EXPECT_NE(o.output.find("cannot write /dev/full: No space left on device"), std::string::npos)
        << what << ": " << o.output;
    EXPECT_TRUE(is_character_device("/dev/full")) << what << " replaced /dev/full";
  }
  // Standard output on the full device: the command fails and says so on stderr.
  const std::string bin = test::quote(kBinary), q_out = test::quote(out);
  for (const std::string& args :
       std::vector<std::string>{"results --out " + q_out, "results --out " + q_out + " --csv", "list", "list --json"}) {
    const Ran o = test::shell(bin + " " + args + " 2>&1 >/dev/full");
    expect_no_abort(o, args);
    EXPECT_EQ(o.code, 1) << args << ": " << o.output;
    EXPECT_NE(o.output.find("cannot write to standard output"), std::string::npos) << args << ": " << o.output;
  }
}

// A disk that fills mid-run, on a small tmpfs in a private mount namespace where the machine allows one.
TEST(FailingWrites, ADiskThatFillsMidRunEndsWithTheFirstErrorAndNoRunLeftRunning) {
  TempDir dir;
  const fs::path disk = dir.path() / "disk", log = dir.path() / "run.log";
  fs::create_directories(disk);
  const std::string bin = test::quote(kBinary), d = test::quote(disk.string());
  std::string sweep;
  for (const auto& a : long_sweep(disk)) sweep += " " + test::quote(a);
  const std::string script = "mount -t tmpfs -o size=2m tmpfs " + d + " || exit 99\n" + bin + sweep + " >" +
                             test::quote(log.string()) +
                             " 2>&1 & pid=$!\n"
                             "i=0; while [ $i -lt 3000 ] && ! [ -s " +
                             d +
                             "/runs/*/points.jsonl ]; do sleep 0.02; i=$((i+1)); done\n"
                             "dd if=/dev/zero of=" +
                             d +
                             "/fill bs=4096 2>/dev/null\n"
                             "wait $pid; echo \"exit=$?\"\n" +
                             bin + " results --out " + d + " 2>&1\n";
  const Ran o = test::shell("unshare --user --map-root-user --mount sh -c " + test::quote(script) + " 2>&1");
  if (o.code == 99 || o.output.find("unshare:") != std::string::npos)
    GTEST_SKIP() << "this machine allows no private tmpfs mount (unshare --user --mount): " << o.output;
  const std::string text = file_text(log);
  EXPECT_NE(o.output.find("exit=1\n"), std::string::npos) << o.output << "\nrun's output:\n" << text;
  EXPECT_EQ(text.find("terminate called"), std::string::npos) << text;
  const std::string first = first_line_with(text, "accelbench run: ");
  EXPECT_TRUE(first.find("No space left on device") != std::string::npos ||
              first.find("disk is full") != std::string::npos)
      << "the first error is the full disk: " << text;
  EXPECT_NE(text.find("points.jsonl"), std::string::npos) << "where the measured points are: " << text;
  // The listing (made inside the namespace, the tmpfs still mounted) shows how the run ended.
  EXPECT_NE(o.output.find("of 64 points)"), std::string::npos) << o.output;
  EXPECT_EQ(o.output.find(" running "), std::string::npos) << o.output;
}

// The store locked by another process for longer than a run waits for it (AB_STORE_WAIT_MS, short
// here): the run stops with that error first, is marked failed in run.json, and exits 1.
TEST(LockedStore, ARunWhoseStoreStaysLockedEndsWithTheFirstErrorAndIsMarkedFailed) {
  TempDir dir;
  const fs::path log = dir.path() / "run.log";
  const pid_t pid = spawn_logged(long_sweep(dir.path()), log, {"AB_STORE_WAIT_MS=300"});
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_points(dir.path(), 1, 60)) << file_text(log);
  std::optional<int> code;
  {
    HeldLock lock(dir.path() / "runs" / "accelbench.db");
    code = wait_exit(pid, 60);  // with the lock still held
    const Ran listed = test::shell("AB_STORE_WAIT_MS=300 " + test::quote(kBinary) + " results --out " +
                                   test::quote(dir.path().string()) + " 2>&1");
    expect_no_abort(listed, "results on a locked store");
    EXPECT_EQ(listed.code, 1) << listed.output;
    EXPECT_NE(listed.output.find("database is locked"), std::string::npos) << listed.output;
  }
  const std::string text = file_text(log);
  ASSERT_TRUE(code.has_value()) << "the run did not end while its store was locked: " << text;
  EXPECT_EQ(*code, 1) << text;
  EXPECT_EQ(text.find("terminate called"), std::string::npos) << text;
  const std::string first = first_line_with(text, "accelbench run: ");
  EXPECT_NE(first.find("database is locked (the point is in "), std::string::npos) << "the first error first: " << text;
  EXPECT_NE(text.find("then marking the run failed: "), std::string::npos) << text;
  EXPECT_NE(text.find("the measured points are in "), std::string::npos) << text;
  EXPECT_EQ(text.find("could not mark"), std::string::npos) << "no second marking at exit: " << text;
  const auto dirs = run_dirs(dir.path());
  ASSERT_EQ(dirs.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(file_text(dirs[0] / "run.json"))["status"], "failed");
  const auto runs = ab::results::list_runs(dir.path() / "runs" / "accelbench.db");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, "running") << "the database could not be told";
  EXPECT_NE(runs[0].shown_status, "running");
  EXPECT_EQ(runs[0].shown_status.rfind("incomplete (", 0), 0u) << runs[0].shown_status;
}

TEST(LockedStore, ARunAgainstAStoreLockedFromTheStartIsRefusedAndLeavesNoRun) {
  TempDir dir;
  small_run(dir.path());
  const fs::path log = dir.path() / "run.log";
  std::optional<int> code;
  {
    HeldLock lock(dir.path() / "runs" / "accelbench.db");
    const pid_t pid = spawn_logged(long_sweep(dir.path()), log, {"AB_STORE_WAIT_MS=200"});
    ASSERT_GT(pid, 0);
    code = wait_exit(pid, 60);
  }
  const std::string text = file_text(log);
  ASSERT_TRUE(code.has_value()) << text;
  EXPECT_NE(*code, 0) << text;
  EXPECT_NE(*code, 134) << text;
  EXPECT_EQ(text.find("terminate called"), std::string::npos) << text;
  EXPECT_NE(first_line_with(text, "accelbench run: ").find("database is locked"), std::string::npos) << text;
  EXPECT_EQ(run_dirs(dir.path()).size(), 1u) << "only the earlier run: " << text;
  EXPECT_EQ(ab::results::list_runs(dir.path() / "runs" / "accelbench.db").size(), 1u);
}

// A point stopped by its timeout did not give the answer asked for: the run fails (1), as a failed point does.
TEST(RunExitCode, APointStoppedByItsTimeoutMakesTheRunFail) {
  TempDir dir;
  const Ran o = run({"run", "gemm", "--device", "cpu", "--axis", "m,n,k=64,2560", "--timeout", "0.2", "--warmup", "0",
                     "--min-time", "0.01", "--max-noise", "50", "--out", dir.path().string(), "--quiet"});
  const auto dirs = run_dirs(dir.path());
  ASSERT_EQ(dirs.size(), 1u) << o.output;
  const auto read = ab::results::read_jsonl(dirs[0] / "points.jsonl");
  ASSERT_EQ(read.records.size(), 2u) << o.output;
  EXPECT_EQ(read.records[0]["status"], "ok") << read.records[0].dump();
  EXPECT_EQ(read.records[1]["status"], "timeout") << "ten 2560^3 products on a CPU take longer than 0.2 s";
  EXPECT_EQ(o.code, 1) << o.output;
}

// A run killed mid-way says so in its report, HTML and Markdown: never "No point needs attention".
TEST(ReportOfIncompleteRun, SaysIncompleteNOfMPointsInHtmlAndMarkdown) {
  TempDir dir;
  const pid_t pid = spawn_logged(long_sweep(dir.path()), dir.path() / "run.log", {});
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_points(dir.path(), 2, 60)) << file_text(dir.path() / "run.log");
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  const auto dirs = run_dirs(dir.path());
  ASSERT_EQ(dirs.size(), 1u);
  // The kill may fall between a point's line in points.jsonl and its row in the store: each
  // source counts its own.
  const auto shown = [](std::size_t n) { return "incomplete (" + std::to_string(n) + " of 64 points)"; };
  const std::string in_folder = shown(ab::results::read_jsonl(dirs[0] / "points.jsonl").records.size());
  const auto rows = ab::results::list_runs(dir.path() / "runs" / "accelbench.db");
  ASSERT_EQ(rows.size(), 1u);
  const std::string in_store = shown(static_cast<std::size_t>(rows[0].points));
  const std::string run_id = dirs[0].filename().string(), out = dir.path().string();
  std::vector<std::tuple<std::string, std::string, std::string>> reports;  // format, text, status it must show
  const Ran md = run({"report", run_id, "--out", out, "--format", "md"});
  ASSERT_EQ(md.code, 0) << md.output;
  reports.emplace_back("md", md.output, in_store);
  const Ran md_folder = run({"report", dirs[0].string(), "--format", "md"});  // from the run folder, not the store
  ASSERT_EQ(md_folder.code, 0) << md_folder.output;
  reports.emplace_back("md from the folder", md_folder.output, in_folder);
  if (ab::report::html_available()) {
    const fs::path html = dir.path() / "r.html";
    const Ran h = run({"report", run_id, "--out", out, "-o", html.string()});
    ASSERT_EQ(h.code, 0) << h.output;
    reports.emplace_back("html", file_text(html), in_store);
  }
  for (const auto& [format, text, run_status] : reports) {
    EXPECT_NE(text.find(run_status), std::string::npos) << format << ": " << text.substr(0, 2000);
    EXPECT_EQ(text.find("No point needs attention"), std::string::npos) << format;
    EXPECT_NE(text.find("the unfinished sweep never reached"), std::string::npos) << format;
  }
}
