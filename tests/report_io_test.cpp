// Tests for what comes into a report: CSV import (good and malformed files, nothing stored on
// error), loading runs by id, folder and system name, and refusing corrupt or foreign files.
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "report/report.h"
#include "results/results.h"

namespace ab::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ReportIo : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() / ("ab_report_io_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return dir_ / name;
  }
  fs::path db() const { return dir_ / "runs" / "accelbench.db"; }
  // The message of the exception `f` throws, and whether it was a usage error.
  template <class F>
  static std::pair<std::string, bool> failure(F&& f) {
    try {
      f();
    } catch (const UsageError& e) {
      return {e.what(), true};
    } catch (const std::exception& e) {
      return {e.what(), false};
    }
    return {"(no exception)", false};
  }
  fs::path dir_;
};

const char* kGoodCsv =
    "\xEF\xBB\xBFworkload,params,metric,value,unit,source\n"
    "# published IPU figures\n"
    "train_resnet50,batch=16;precision=fp16,samples_per_s,2300,images/s,\"Graphcore, MK2 performance results (2021)\"\n"
    "train_resnet50,batch=16;precision=fp16,median_s,7,ms,\"Graphcore, MK2 performance results (2021)\"\n"
    "train_resnet50,batch=32;precision=fp16,samples_per_s,2510.5,images/s,paper table 3\r\n"
    "gemm,m=8192;n=8192;k=8192,tflops,250,TFLOP/s,datasheet\n";

TEST_F(ReportIo, ImportStoresExternalRunAndReportShowsIt) {
  const auto csv = write("ipu.csv", kGoodCsv);
  const auto r = results::import_csv(csv, "IPU-M2000", dir_, "accelbench import ipu.csv --system IPU-M2000");
  EXPECT_EQ(r.rows, 4u);
  EXPECT_EQ(r.points, 3u);  // the two rows of batch 16 are one point
  const auto runs = results::list_runs(db());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, "external");
  EXPECT_EQ(runs[0].host, "IPU-M2000");
  const auto pts = results::load_points(db(), r.run_id);
  ASSERT_EQ(pts.size(), 3u);
  EXPECT_EQ(pts[0]["external"], true);
  EXPECT_EQ(pts[0]["status"], "ok");
  EXPECT_EQ(pts[0]["source"], "Graphcore, MK2 performance results (2021)");
  EXPECT_EQ(pts[0]["params"], (json{{"batch", 16}, {"precision", "fp16"}}));
  EXPECT_DOUBLE_EQ(pts[0]["rates"]["samples_per_s"].get<double>(), 2300);
  EXPECT_DOUBLE_EQ(pts[0]["time"]["median_s"].get<double>(), 0.007);
  EXPECT_EQ(pts[2]["rates"]["primary"], "tflops");
  EXPECT_FALSE(pts[0].contains("device_name"));  // never mistaken for a measured ceiling

  const ab::report::Run run = load_run("IPU-M2000", dir_);  // by system name
  EXPECT_TRUE(run.external);
  EXPECT_EQ(run.label, "IPU-M2000");
  const std::string md = render_markdown(build_report({run}));
  EXPECT_NE(md.find("ok · external: published figure, source: Graphcore, MK2 performance results (2021)"), std::string::npos) << md;
}

TEST_F(ReportIo, MalformedCsvIsRefusedWithLineAndNothingStored) {
  const std::string header = "workload,params,metric,value,unit,source\n";
  struct Case {
    std::string text, expect;
  };
  const Case cases[] = {
      {"name,value\nx,1\n", ":1: the header must be"},
      {header + "w,batch=1,samples_per_s,fast,samples/s,paper\n", ":2: value 'fast' is not a number"},
      {header + "w,batch=1,samples_per_s,12,samples/s,paper\nw,batch=2,samples_per_s,1e3x,samples/s,src\n", ":3: value '1e3x'"},
      {header + "w,batch=1,samples_per_s,12,samples/s,\n", ":2: source is empty"},
      {header + "w,batch=1,speed,12,samples/s,paper\n", ":2: unknown metric 'speed'"},
      {header + "w,batch=1,tflops,12,GB/s,paper\n", ":2: unit 'GB/s' does not fit metric tflops"},
      {header + "w,batch,tflops,12,TFLOP/s,paper\n", ":2: params 'batch' is not name=value"},
      {header + "w,batch=1,tflops,12,TFLOP/s\n", ":2: expected 6 fields"},
      {header + "w,batch=1,tflops,-3,TFLOP/s,paper\n", ":2: value -3 must be positive"},
      {header + "w,batch=1,tflops,3,TFLOP/s,paper\nw,batch=1,tflops,4,TFLOP/s,paper\n", ":3: metric tflops of this point was already given on line 2"},
      {header + "w,batch=1,tflops,3,TFLOP/s,\"unclosed\n", ":2: a quoted field is never closed"},
      {header, "a header and no rows"},
      {"", "empty"},
      {std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16), "a NUL byte"},
      {header + "w,batch=1,tflops,3,TFLOP/s,caf\xE9\n", ":2: not UTF-8"},
  };
  for (const auto& c : cases) {
    const auto csv = write("bad.csv", c.text);
    const auto [msg, usage] = failure([&] { results::import_csv(csv, "X", dir_, "import"); });
    EXPECT_TRUE(usage) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << msg;
    EXPECT_EQ(msg.rfind(csv.string(), 0), 0u) << msg;  // names the file
    EXPECT_FALSE(fs::exists(dir_ / "runs")) << "something was stored for: " << c.expect;
  }
}

TEST_F(ReportIo, CorruptOrForeignFilesAreRefusedWithTheReason) {
  const auto png = write("picture.png", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR\xff\xfe\n", 19));
  auto [msg, usage] = failure([&] { load_run(png.string(), dir_); });
  EXPECT_NE(msg.find("not an accelbench points file"), std::string::npos) << msg;

  const auto arr = write("array.jsonl", "[1,2,3]\n");
  msg = failure([&] { load_run(arr.string(), dir_); }).first;
  EXPECT_NE(msg.find("array.jsonl: not an accelbench points file"), std::string::npos) << msg;

  const auto other = write("other.jsonl", "{\"name\":\"x\"}\n");
  msg = failure([&] { load_run(other.string(), dir_); }).first;
  EXPECT_NE(msg.find("no integer schema_version"), std::string::npos) << msg;

  const auto newer = write("newer.jsonl", R"({"schema_version":99,"workload":"w","status":"ok"})" "\n");
  msg = failure([&] { load_run(newer.string(), dir_); }).first;
  EXPECT_NE(msg.find("newer accelbench (schema 99 > 1)"), std::string::npos) << msg;

  fs::create_directories(dir_ / "empty_folder");
  msg = failure([&] { load_run((dir_ / "empty_folder").string(), dir_); }).first;
  EXPECT_NE(msg.find("not an accelbench run folder"), std::string::npos) << msg;

  std::tie(msg, usage) = failure([&] { load_run("no-such-run", dir_); });
  EXPECT_TRUE(usage);
  EXPECT_NE(msg.find("no results store"), std::string::npos) << msg;

  // A store that exists: an unknown id lists the runs it has.
  results::import_csv(write("ok.csv", kGoodCsv), "IPU", dir_, "import");
  std::tie(msg, usage) = failure([&] { load_run("20990101-000000-abcdef", dir_); });
  EXPECT_TRUE(usage);
  EXPECT_NE(msg.find("newest runs: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("systems: IPU"), std::string::npos) << msg;

  const auto bad_trace_dir = dir_ / "run_with_bad_trace";
  fs::create_directories(bad_trace_dir);
  std::ofstream(bad_trace_dir / "points.jsonl") << R"({"schema_version":1,"run_id":"r","workload":"w","status":"skipped"})" << "\n{\"trunc";
  std::ofstream(bad_trace_dir / "telemetry.json") << "{not json";
  const ab::report::Run r = load_run(bad_trace_dir.string(), dir_);
  ASSERT_EQ(r.points.size(), 1u);
  ASSERT_EQ(r.notes.size(), 2u);
  EXPECT_NE(r.notes[0].find("1 unparsable line(s)"), std::string::npos);
  EXPECT_NE(r.notes[1].find("telemetry.json: not valid JSON"), std::string::npos) << r.notes[1];
}

TEST_F(ReportIo, RunFolderAndStoreGiveTheSameRun) {
  results::RunInfo info{"20261129-000000-aaaaaa", "2026-11-29T00:00:00.000Z", "accelbench run w",
                        {{"host", {{"hostname", "nodeA"}}}, {"measurement", {{"max_noise_pct", 1}}}}};
  {
    results::ResultStore store(dir_, info);
    store.append({{"schema_version", 1}, {"workload", "w"}, {"status", "ok"}, {"params", {{"batch", 1}}}});
    store.append({{"schema_version", 1}, {"workload", "w"}, {"status", "oom"}, {"reason", "out of memory"}, {"params", {{"batch", 2}}}});
    store.finish("complete");
  }
  const ab::report::Run a = load_run(info.run_id, dir_);
  const ab::report::Run b = load_run((dir_ / "runs" / info.run_id).string(), dir_);
  const ab::report::Run c = load_run("nodeA", dir_);
  EXPECT_EQ(a.points, b.points);
  EXPECT_EQ(a.points, c.points);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.context.dump(), b.context.dump());
}

}  // namespace
}  // namespace ab::report
