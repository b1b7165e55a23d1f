// Tests for what comes into a report: CSV import (good and malformed files, nothing stored on
// error), loading runs by id, folder and system name, and refusing corrupt or foreign files.
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

// A published figure names the axes it knows; the rest take the workload's defaults, so it matches
// the point a plain `accelbench run infer --axis batch=8` measures.
TEST_F(ReportIo, ImportFillsTheAxesARowLeavesOutWithTheWorkloadsDefaults) {
  const auto csv = write("pub.csv",
                         "workload,params,metric,value,unit,source\n"
                         "infer,batch=8;graph=off,samples_per_s,900,images/s,paper\n"
                         "other,batch=8,samples_per_s,10,images/s,paper\n");
  const results::AxisDefaults defaults = [](const std::string& workload) {
    return workload == "infer" ? json{{"graph", "on"}, {"fold", "fused"}, {"fp8_layers", "all"}} : json(nullptr);
  };
  const auto r = results::import_csv(csv, "Pub", dir_, "import", defaults);
  const auto pts = results::load_points(db(), r.run_id);
  ASSERT_EQ(pts.size(), 2u);
  // The row's own value wins; the axes it left out are the defaults, and the record says which.
  EXPECT_EQ(pts[0]["params"], (json{{"batch", 8}, {"graph", "off"}, {"fold", "fused"}, {"fp8_layers", "all"}}));
  EXPECT_EQ(pts[0]["metrics"]["defaulted_axes"], (json{"fold", "fp8_layers"}));
  EXPECT_EQ(pts[1]["params"], (json{{"batch", 8}}));  // a workload without defaults keeps what the row gave
  EXPECT_FALSE(pts[1].contains("metrics"));

  // Matched against a measured point with every axis: compared, not "without a partner".
  ab::report::Run measured;
  measured.id = measured.label = "M";
  measured.points = {{{"schema_version", 1},
                      {"run_id", "M"},
                      {"seq", 0},
                      {"workload", "infer"},
                      {"status", "ok"},
                      {"params", {{"batch", 8}, {"graph", "off"}, {"fold", "fused"}, {"fp8_layers", "all"}}},
                      {"rates", {{"samples_per_s", 1000.0}}},
                      {"time", {{"median_s", 0.008}, {"rel_spread", 0.001}}}}};
  const Document doc = build_comparison({load_run(r.run_id, dir_), measured});
  EXPECT_NE(render_text(doc).find("1 matched point(s)"), std::string::npos) << render_text(doc);
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

// The terminal summary: one table per workload, the constant axes said once above it, the ones
// that vary as columns in declaration order, uncut.
TEST(ReportTerminalSummary, VaryingAxesAreColumnsAndConstantOnesAreSaidOnce) {
  std::vector<json> records;
  for (const char* model : {"gpt2_124m", "bert_base"})
    records.push_back(
        {{"schema_version", 1},
         {"run_id", "r"},
         {"workload", "train"},
         {"device", "cpu"},
         {"params", {{"comm_dtype", "grad"}, {"comm_engine", "auto"}, {"fuse", "auto"}, {"model", model}}},
         {"status", model == std::string("gpt2_124m") ? "oom" : "skipped"},
         {"reason", model == std::string("gpt2_124m") ? "out of memory" : "x"}});
  std::ostringstream table;
  print_summary(table, records, {{"train", {"model", "fuse", "comm_dtype", "comm_engine"}}});
  const std::string t = table.str();
  EXPECT_EQ(t.rfind("train: fuse=auto comm_dtype=grad comm_engine=auto\n", 0), 0u) << t;
  EXPECT_NE(t.find("   gpt2_124m  oom "), std::string::npos) << t;
  EXPECT_NE(t.find("   bert_base  skipped "), std::string::npos) << t;
  EXPECT_NE(t.find("out of memory\n"), std::string::npos) << t;  // each point's reason, in the stop column
  EXPECT_EQ(t.find("model="), std::string::npos) << t;           // a varying axis is a column, not text
}

// Byte for byte: kernels (a ceiling, integer ops, bandwidth, a skipped point), the load
// generator's scenarios under their metrics, collectives nccl-tests style, a workload whose every
// point was skipped (one line), copy sizes in numeric order, inference in images/s, the legend.
TEST(ReportTerminalSummary, TableIsByteForByte) {
  const std::vector<std::string> lines =
      {
          R"({"schema_version":1,"run_id":"r","seq":0,"workload":"gemm","device":"cpu","params":{"precision":"bf16","m":8192,"n":8192,"k":8192,"trans":"NN"},"status":"ok","counts":{"samples":1.0,"flops":1.1e12,"bytes":4e8,"ops_unit":"FLOP"},"time":{"median_s":0.0015,"rel_spread":0.004,"converged":true,"stop_reason":"noise below target"},"rates":{"tflops":733.3,"gbps":266.6,"samples_per_s":666.6,"pct_of_ceiling":81.53,"primary":"tflops"}})",
          R"({"schema_version":1,"run_id":"r","seq":1,"workload":"gemm","device":"cpu","params":{"precision":"int8","m":64,"n":64,"k":64,"trans":"NN"},"status":"ok","counts":{"samples":1.0,"flops":1.1e6,"bytes":4e3,"ops_unit":"OP"},"time":{"median_s":0.00000123,"rel_spread":0.0234,"converged":false,"stop_reason":"timeout before the noise target"},"rates":{"tflops":0.8943,"gbps":3.2,"primary":"tflops"}})",
          R"({"schema_version":1,"run_id":"r","seq":2,"workload":"stream","device":"cpu","params":{"op":"triad","bytes":1073741824},"status":"ok","counts":{"samples":0.0,"flops":0.0,"bytes":3e9,"ops_unit":"FLOP"},"time":{"median_s":2.5,"rel_spread":0.0,"converged":true},"rates":{"gbps":1.2e3,"primary":"gbps"}})",
          R"({"schema_version":1,"run_id":"r","seq":3,"workload":"gemm","device":"cpu","params":{"precision":"fp8","m":64,"n":64,"k":64,"trans":"NN"},"status":"skipped","reason":"no fp8"})",
          R"({"schema_version":1,"run_id":"r","seq":4,"workload":"loadgen","device":"cpu","params":{"scenario":"server","model":"a-very-long-model-name-that-is-long","batch":4},"status":"ok","scenario":{"name":"server","metric":{"name":"completed_samples_per_s","value":812.34},"latency_s":{"p50":0.004,"p99":0.0123},"completed_samples_per_s":812.34,"result":"VALID"},"rates":{"samples_per_s":812.34,"primary":"samples_per_s"}})",
          R"({"schema_version":1,"run_id":"r","seq":5,"workload":"loadgen","device":"cpu","params":{"scenario":"single-stream","model":"a-very-long-model-name-that-is-long","batch":1},"status":"invalid","reason":"x","scenario":{"name":"single-stream","metric":{"name":"latency_p90_early_stopping_s","value":0.00042},"latency_s":{"p50":0.0003,"p99":0.001},"completed_samples_per_s":2000,"result":"INVALID"}})",
          R"({"schema_version":1,"run_id":"r","seq":6,"workload":"copy","device":"cpu","params":{"bytes":67108864},"status":"ok","counts":{"samples":1.0,"flops":0.0,"bytes":67108864.0,"ops_unit":"FLOP"},"time":{"median_s":0.5,"rel_spread":0.012,"converged":true,"stop_reason":"noise below target"},"rates":{"samples_per_s":2.0,"gbps":0.1342,"primary":"gbps"}})",
          R"({"schema_version":1,"run_id":"r","seq":7,"workload":"copy","device":"cpu","params":{"bytes":1048576},"status":"ok","counts":{"samples":1.0,"flops":0.0,"bytes":1048576.0,"ops_unit":"FLOP"},"time":{"median_s":0.001,"rel_spread":0.02,"converged":true,"stop_reason":"noise below target"},"rates":{"samples_per_s":1000.0,"gbps":1.049,"primary":"gbps"}})",
          R"({"schema_version":1,"run_id":"r","seq":8,"workload":"infer","device":"cpu","params":{"model":"resnet50","batch":8},"status":"ok","time":{"median_s":0.02,"p99_s":0.025,"rel_spread":0.002,"converged":true,"stop_reason":"noise below target"},"rates":{"samples_per_s":400.0,"tflops":0.1648,"primary":"samples_per_s"}})",
          R"({"schema_version":1,"run_id":"r","seq":9,"workload":"p2p","device":"cpu","params":{"bytes":1024},"status":"skipped","reason":"needs two GPUs"})",
          R"({"schema_version":1,"run_id":"r","seq":10,"workload":"p2p","device":"cpu","params":{"bytes":2048},"status":"skipped","reason":"needs two GPUs"})",
          R"({"schema_version":1,"run_id":"r","seq":11,"workload":"collectives","device":"cuda:0","params":{"op":"all_reduce","bytes":8388608,"gpus":2},"status":"ok","check":{"what":"wrong elements","rel_error":0,"passed":true},"metrics":{"algbw_gbps":120.5,"busbw_gbps":120.5},"time":{"median_s":0.0000696,"rel_spread":0.001,"converged":true,"stop_reason":"noise below target"}})",
      };
  std::vector<json> records;
  for (const auto& l : lines) records.push_back(json::parse(l));
  const AxisOrder order = {{"gemm", {"precision", "m", "n", "k", "trans"}},
                           {"loadgen", {"scenario", "model", "batch"}},
                           {"infer", {"model", "batch"}},
                           {"stream", {"op", "bytes"}},
                           {"collectives", {"op", "bytes", "gpus"}}};
  const std::string expected =
      "gemm: trans=NN\n"
      "   precision     m     n     k  status    median           rate  % ceil  noise  stop\n"
      "   bf16       8192  8192  8192  ok        1.5 ms  733.3 TFLOP/s   81.5%   0.4%  noise below target\n"
      "   int8         64    64    64  ok       1.23 us    894.3 GOP/s          2.3%!  timeout before the noise "
      "target\n"
      "   fp8          64    64    64  skipped                                         no fp8\n"
      "\n"
      "stream: op=triad bytes=1073741824\n"
      "   status  median       rate  % ceil  noise  stop\n"
      "   ok       2.5 s  1200 GB/s           0.0%\n"
      "\n"
      "loadgen: scenario=server model=a-very-long-model-name-that-is-long batch=4\n"
      "   status  completed samples/s   p50      p99  result  stop\n"
      "   ok                    812.3  4 ms  12.3 ms  VALID\n"
      "\n"
      "loadgen: scenario=single-stream model=a-very-long-model-name-that-is-long batch=1\n"
      "   status   latency p90 early stopping     p50   p99  samples/s  result   stop\n"
      "   invalid                      420 us  300 us  1 ms       2000  INVALID  x\n"
      "\n"
      "copy\n"
      "      bytes  status  median         rate  % ceil  noise  stop\n"
      "    1048576  ok        1 ms   1.049 GB/s           2.0%  noise below target\n"
      "   67108864  ok      500 ms  0.1342 GB/s           1.2%  noise below target\n"
      "\n"
      "infer: model=resnet50 batch=8\n"
      "   status  images/s    p50    p99  TFLOP/s  noise  stop\n"
      "   ok           400  20 ms  25 ms   0.1648   0.2%  noise below target\n"
      "\n"
      "p2p: 2 points skipped: needs two GPUs\n"
      "\n"
      "collectives: op=all_reduce bytes=8388608 gpus=2\n"
      "   status     time  algbw GB/s  busbw GB/s  #wrong  noise  stop\n"
      "   ok      69.6 us       120.5       120.5       0   0.1%  noise below target\n"
      "\n"
      "! = did not converge: the noise stayed above the target (--max-noise) until the reason in `stop` ended the "
      "point\n";
  std::ostringstream from_json, from_records;
  print_summary(from_json, records, order);
  EXPECT_EQ(from_json.str(), expected);
  std::vector<results::Record> typed;
  for (const auto& r : records) typed.push_back(results::from_json(r));
  print_summary(from_records, typed, order);
  EXPECT_EQ(from_records.str(), expected);
  EXPECT_THROW(print_summary(from_json, std::vector<json>{{{"workload", "gemm"}}}), Error);  // not a record
}

// Without a declared order (a workload this build does not know), the axes come by name; a run
// whose every point converged has no legend.
TEST(ReportTerminalSummary, UnknownWorkloadsTakeTheirAxesByNameAndConvergedRunsHaveNoLegend) {
  std::vector<json> records;
  for (const int size : {256, 16, 64})
    records.push_back({{"schema_version", 1},
                       {"run_id", "r"},
                       {"workload", "w"},
                       {"status", "ok"},
                       {"params", {{"z", "same"}, {"size", size}, {"alpha", size == 16 ? "b" : "a"}}},
                       {"time", {{"median_s", 0.001}, {"rel_spread", 0.001}, {"converged", true}}}});
  std::ostringstream table;
  print_summary(table, records);
  const std::string t = table.str();
  EXPECT_EQ(t.rfind("w: z=same\n   alpha  size  status", 0), 0u) << t;
  // Rows by alpha (words in the order they came: a, then b), then size numerically.
  const auto a64 = t.find("   a        64"), a256 = t.find("   a       256"), b16 = t.find("   b        16");
  ASSERT_NE(a64, std::string::npos) << t;
  ASSERT_NE(a256, std::string::npos) << t;
  ASSERT_NE(b16, std::string::npos) << t;
  EXPECT_LT(a64, a256) << t;
  EXPECT_LT(a256, b16) << t;
  EXPECT_EQ(t.find("did not converge"), std::string::npos) << t;
}

}  // namespace
}  // namespace ab::report
