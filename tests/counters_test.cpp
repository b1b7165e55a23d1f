// The hardware counters without a GPU: the metric table, how ranges combine, the record block and
// its derived figures, its round trip through the store and CSV, the unavailable path (a session
// on a machine without CUPTI, and `accelbench run --counters` on the CPU), a model's per-op ranges
// through a scripted session, suites' counters setting, and the report's counter sections.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "counters/counters.h"
#include "harness/runner.h"
#include "harness/suite.h"
#include "report/report.h"
#include "results/record.h"
#include "results/results.h"
#include "test_support.h"
#include "workloads/registry.h"

namespace ab::counters {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::set<std::string> names_of(MetricSet set) {
  std::set<std::string> out;
  for (const MetricInfo& m : metrics_of(set)) out.insert(std::string(m.name));
  return out;
}

TEST(CounterMetrics, SetsNameTheCuptiMetricsOnce) {
  const std::set<std::string> memory = names_of(MetricSet::memory), compute = names_of(MetricSet::compute);
  EXPECT_EQ(memory, (std::set<std::string>{"dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum",
                                           "gpu__time_duration.sum"}));
  EXPECT_TRUE(compute.count("sm__throughput.avg.pct_of_peak_sustained_elapsed"));
  EXPECT_TRUE(compute.count("sm__warps_active.avg.pct_of_peak_sustained_active"));
  EXPECT_TRUE(compute.count("smsp__inst_executed.sum"));
  EXPECT_TRUE(compute.count("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"));
  std::set<std::string> both = memory;
  both.insert(compute.begin(), compute.end());
  EXPECT_EQ(names_of(MetricSet::all), both);
  EXPECT_TRUE(metrics_of(MetricSet::off).empty());
  EXPECT_EQ(metric_table().size(), both.size());  // no name twice
  for (const MetricInfo& m : metric_table()) {
    EXPECT_FALSE(m.unit.empty()) << m.name;
    EXPECT_FALSE(m.used_by.empty()) << m.name;
    EXPECT_EQ(find_metric(m.name), &m);
    // Only an architecture's own tensor pipe may be missing; the rest every chip since Volta has.
    EXPECT_EQ(m.optional, std::string(m.name).find("tensor_op") != std::string::npos) << m.name;
  }
  EXPECT_EQ(find_metric("no__such.sum"), nullptr);
}

TEST(CounterMetrics, SetNamesParseAndOthersAreRefused) {
  for (const MetricSet s : {MetricSet::off, MetricSet::memory, MetricSet::compute, MetricSet::all})
    EXPECT_EQ(parse_metric_set(to_string(s)), s);
  const std::string why = test::usage_error([] { (void)parse_metric_set("dram"); });
  EXPECT_NE(why.find("valid: off, memory, compute, all"), std::string::npos) << why;
}

Measurement two_ranges() {
  Measurement m;
  m.available = true;
  m.set = MetricSet::all;
  m.passes = 3;
  m.overhead_s = 0.25;
  m.ranges = {{"a",
               {{"dram__bytes_read.sum", 3000},
                {"dram__bytes_write.sum", 1000},
                {"gpu__time_duration.sum", 1000},
                {"sm__throughput.avg.pct_of_peak_sustained_elapsed", 80},
                {"lts__t_bytes.sum", 8000}}},
              {"b",
               {{"dram__bytes_read.sum", 1000},
                {"dram__bytes_write.sum", 3000},
                {"gpu__time_duration.sum", 3000},
                {"sm__throughput.avg.pct_of_peak_sustained_elapsed", 40},
                {"lts__t_bytes.sum", 0}}}};
  return m;
}

TEST(CounterRecord, RangesSumAndPercentagesWeighByDuration) {
  const auto c = combined(two_ranges());
  EXPECT_DOUBLE_EQ(c.at("dram__bytes_read.sum"), 4000);
  EXPECT_DOUBLE_EQ(c.at("gpu__time_duration.sum"), 4000);
  EXPECT_DOUBLE_EQ(c.at("sm__throughput.avg.pct_of_peak_sustained_elapsed"), (80 * 1000 + 40 * 3000) / 4000.0);
  EXPECT_DOUBLE_EQ(dram_bytes(c), 8000);
  EXPECT_DOUBLE_EQ(dram_bytes({{"dram__bytes_read.sum", 5}}), 0);  // half the traffic is no figure
}

TEST(CounterRecord, DerivedFiguresFollowTheirFormulas) {
  const json j = counters_json(two_ranges(), {.flops = 16000, .bytes = 4000});
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["set"], "all");
  EXPECT_EQ(j["passes"], 3);
  EXPECT_EQ(j["ranges"], 2);
  EXPECT_DOUBLE_EQ(j["overhead_s"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j["metrics"]["dram__bytes_write.sum"].get<double>(), 4000);
  const double seconds = 4000e-9, dram = 8000;
  EXPECT_DOUBLE_EQ(j["dram_bytes"].get<double>(), dram);
  EXPECT_DOUBLE_EQ(j["duration_s"].get<double>(), seconds);
  EXPECT_DOUBLE_EQ(j["measured_intensity_flop_per_byte"].get<double>(), 16000 / dram);
  EXPECT_DOUBLE_EQ(j["dram_bytes_per_s"].get<double>(), dram / seconds);
  EXPECT_DOUBLE_EQ(j["dram_sectors_per_s"].get<double>(), dram / 32 / seconds);
  EXPECT_DOUBLE_EQ(j["l2_bytes_per_s"].get<double>(), 8000 / seconds);
  EXPECT_DOUBLE_EQ(j["achieved_tflops"].get<double>(), 16000 / seconds / 1e12);
  EXPECT_DOUBLE_EQ(j["measured_over_modelled_bytes"].get<double>(), 2.0);
  // No FLOPs (a copy): no intensity and no compute rate, the traffic still.
  const json copy = counters_json(two_ranges(), {.flops = 0, .bytes = 8000});
  EXPECT_FALSE(copy.contains("measured_intensity_flop_per_byte"));
  EXPECT_FALSE(copy.contains("achieved_tflops"));
  EXPECT_DOUBLE_EQ(copy["measured_over_modelled_bytes"].get<double>(), 1.0);
}

TEST(CounterRecord, AnUnavailableMeasurementSaysWhy) {
  Measurement m;
  m.set = MetricSet::memory;
  m.reason = "cuptiProfilerInitialize: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES";
  EXPECT_EQ(counters_json(m, {}), json({{"status", "unavailable"}, {"set", "memory"}, {"reason", m.reason}}));
}

TEST(CounterSession, WithoutCuptiOrAGpuEveryMeasurementIsUnavailableAndNothingThrows) {
  // "cpu" has no counters in any build; "cuda:0" here has no CUPTI (cpu preset) or no GPU (cuda preset).
  for (const std::string device : {"cpu", "cuda:0", "cuda:x"}) {
    auto session = open_session(MetricSet::memory, device);
    ASSERT_NE(session, nullptr);
    EXPECT_EQ(session->set(), MetricSet::memory);
    bool threw = false;
    Measurement m;
    try {
      m = session->measure({{"work", [] {}}});
    } catch (...) {
      threw = true;
    }
    EXPECT_FALSE(threw) << device;
    if (device == "cuda:0" && backend::best_device() != "cpu") GTEST_SKIP() << "a GPU answers: the device checks it";
    EXPECT_FALSE(m.available) << device;
    EXPECT_FALSE(m.reason.empty()) << device;
    EXPECT_TRUE(m.ranges.empty());
  }
  EXPECT_NE(open_session(MetricSet::all, "cpu")->measure({}).reason.find("cpu"), std::string::npos);
}

TEST(CounterRecord, TheBlockRoundTripsThroughTheRecordTheStoreAndCsv) {
  test::TempDir dir;
  results::Record r;
  r.run_id = "20261201-000000-cccccc";
  r.seq = 0;
  r.workload = "gemm";
  r.params = {{"m", 4096}};
  r.counts = results::Counts{1, 16000, 4000, "FLOP", 0};
  r.metrics = {{"counters", counters_json(two_ranges(), {16000, 4000})}};
  const json j = results::to_json(r);
  EXPECT_EQ(results::to_json(results::from_json(j)), j);
  EXPECT_EQ(*results::from_json(j).metric("counters.dram_bytes"), 8000);
  {
    results::ResultStore store(dir.path(),
                               {r.run_id, "2026-12-01T00:00:00.000Z", "accelbench run gemm", json::object()});
    store.append(j);
    store.finish("complete");
  }
  const auto back = results::load_points(dir.path() / "runs" / "accelbench.db", r.run_id);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0]["metrics"]["counters"], j["metrics"]["counters"]);
  EXPECT_EQ(results::read_jsonl(dir.path() / "runs" / r.run_id / "points.jsonl").records[0]["metrics"], j["metrics"]);
  std::ostringstream csv;
  results::write_csv(csv, back);
  const std::string text = csv.str(), header = text.substr(0, text.find('\n'));
  EXPECT_NE(header.find("metrics.counters.status"), std::string::npos) << header;
  EXPECT_NE(header.find("metrics.counters.dram_sectors_per_s"), std::string::npos) << header;
  EXPECT_NE(text.find(",ok,all,8000.0,2.0,"), std::string::npos) << text;
  std::ostringstream plain;
  results::write_csv(plain, {results::to_json(results::Record{})});
  EXPECT_EQ(plain.str().find("counters"), std::string::npos);  // no counters anywhere: no columns
}

// A session that runs the pass once and gives every range a fixed reading: what the runner and a
// model's per-op ranges do with a measurement, without a GPU.
class ScriptedSession final : public CounterSession {
 public:
  std::vector<std::string> begun;
  MetricSet set() const override { return MetricSet::memory; }
  Measurement measure_marked(const std::function<void(RangeMarks&)>& pass, std::size_t max_ranges,
                             L2State l2) override {
    struct Marks final : RangeMarks {
      std::vector<std::string>* names;
      void begin(const std::string& n) override { names->push_back(n); }
      void end() override {}
    } marks;
    marks.names = &begun;
    pass(marks);
    EXPECT_LE(begun.size(), max_ranges);
    Measurement m;
    m.available = true;
    m.set = set();
    m.l2 = l2;
    m.passes = 1;
    for (const auto& n : begun)
      m.ranges.push_back(
          {n, {{"dram__bytes_read.sum", 600}, {"dram__bytes_write.sum", 400}, {"gpu__time_duration.sum", 2000}}});
    return m;
  }
};

std::vector<results::Record> run_points(harness::Workload& w, const std::vector<harness::AxisOverride>& axes,
                                        CounterSession* session, const fs::path& artifacts) {
  auto be = backend::make_backend("cpu");
  measure::Settings s;
  s.min_time_s = 0.01, s.max_noise_pct = 90, s.timeout_s = 20, s.warmup_s = 0;
  harness::RunnerHooks hooks;
  hooks.counters = session;
  hooks.artifact_dir = artifacts;
  harness::Runner runner(*be, s, json::object(), "run-c", hooks, nullptr);
  const std::atomic<bool> cancel{false};
  return runner.run(harness::plan_for(w, "cpu", axes), cancel).records;
}

TEST(CounterPass, AModelMarksEachOpsForwardAndBackwardAndTheTableCarriesMeasuredBytes) {
  const harness::Registry& registry = workloads::registry();
  test::TempDir dir;
  ScriptedSession session;
  const auto recs = run_points(registry.find("train"), {harness::parse_axis_argument("batch=2")}, &session, dir.path());
  ASSERT_EQ(recs.size(), 1u);
  ASSERT_TRUE(recs[0].ok()) << recs[0].reason;
  ASSERT_FALSE(session.begun.empty());
  EXPECT_EQ(session.begun.back(), "update");
  const auto forwards = std::count_if(session.begun.begin(), session.begun.end(),
                                      [](const std::string& n) { return n.ends_with(":forward"); });
  EXPECT_EQ(static_cast<std::size_t>(forwards), recs[0].metrics["model"]["ops"].get<std::size_t>());
  const json& c = recs[0].metrics["counters"];
  EXPECT_EQ(c["status"], "ok");
  EXPECT_EQ(c["l2_before_range"], "as_left");  // an op starts from what the op before it left in L2
  EXPECT_EQ(c["ranges"].get<std::size_t>(), session.begun.size());
  EXPECT_DOUBLE_EQ(c["dram_bytes"].get<double>(), 1000.0 * static_cast<double>(session.begun.size()));
  EXPECT_DOUBLE_EQ(c["measured_over_modelled_bytes"].get<double>(),
                   c["dram_bytes"].get<double>() / recs[0].counts->bytes);
  ASSERT_EQ(c["ops"].size(), session.begun.size());
  EXPECT_DOUBLE_EQ(c["ops"][0]["dram_bytes"].get<double>(), 1000);
  EXPECT_GT(c["ops"][0]["flops"].get<double>(), 0);
  std::ifstream csv(dir.path() / "artifacts" / "0" / "ops.csv");
  std::string header, row;
  ASSERT_TRUE(std::getline(csv, header));
  EXPECT_TRUE(header.ends_with(",measured_dram_bytes,measured_over_modelled")) << header;
  ASSERT_TRUE(std::getline(csv, row));
  EXPECT_NE(row.find(",1000.0,"), std::string::npos) << row;
}

TEST(CounterPass, AWorkloadWithoutAPassRecordsCountersUnavailableAndOthersNone) {
  const harness::Registry& registry = workloads::registry();
  test::TempDir dir;
  ScriptedSession session;
  const auto recs = run_points(registry.find("ceilings"), {}, &session, dir.path());
  ASSERT_FALSE(recs.empty());
  EXPECT_TRUE(session.begun.empty());
  for (const auto& r : recs)
    if (r.ok()) {
      EXPECT_EQ(r.metrics["counters"]["status"], "unavailable");
      EXPECT_NE(r.metrics["counters"]["reason"].get<std::string>().find("no counter pass"), std::string::npos);
    }
  const auto off = run_points(registry.find("gemm"), {harness::parse_axis_argument("m,n,k=64")}, nullptr, dir.path());
  ASSERT_EQ(off.size(), 1u);
  EXPECT_FALSE(off[0].metrics.is_object() && off[0].metrics.contains("counters"));
  const auto on = run_points(registry.find("gemm"), {harness::parse_axis_argument("m,n,k=64")}, &session, dir.path());
  ASSERT_EQ(on.size(), 1u);
  EXPECT_EQ(session.begun, std::vector<std::string>{"gemm"});
  EXPECT_EQ(on[0].metrics["counters"]["l2_before_range"], "flushed");  // a micro point: its own bytes, as ncu's
  EXPECT_DOUBLE_EQ(on[0].metrics["counters"]["measured_intensity_flop_per_byte"].get<double>(),
                   on[0].counts->flops / 1000.0);
}

TEST(CounterPass, RunWithCountersOnTheCpuRecordsUnavailableAndTheRunGoesOn) {
  test::TempDir dir;
  const test::Ran o = test::accelbench({"run", "gemm", "--device", "cpu", "--axis", "m,n,k=64", "--counters", "memory",
                                        "--min-time", "0.02", "--max-noise", "50", "--out", dir.path().string()});
  ASSERT_EQ(o.code, 0) << o.output;
  const std::vector<json> records = test::only_run_records(dir.path());
  ASSERT_EQ(records.size(), 1u);
  const json& r = records[0];
  EXPECT_EQ(r["status"], "ok");
  EXPECT_EQ(r["metrics"]["counters"]["status"], "unavailable");
  EXPECT_EQ(r["metrics"]["counters"]["set"], "memory");
  EXPECT_NE(r["metrics"]["counters"]["reason"].get<std::string>().find("cpu"), std::string::npos);
  EXPECT_EQ(r["context"]["measurement"]["counters"], "memory");
  const test::Ran bad =
      test::accelbench({"run", "gemm", "--device", "cpu", "--counters", "dram", "--out", dir.path().string()});
  EXPECT_EQ(bad.code, 2) << bad.output;
}

TEST(CounterSuite, TheSettingIsReadAndABadValueNamesItsLine) {
  const harness::Registry& registry = workloads::registry();
  test::TempDir dir;
  const fs::path good = dir.path() / "good.yaml", bad = dir.path() / "bad.yaml";
  std::ofstream(good) << "name: g\nsettings:\n  counters: all\nsteps:\n  - workload: gemm\n";
  std::ofstream(bad) << "name: b\nsettings:\n  min_time: 0.1\n  counters: dram\nsteps:\n  - workload: gemm\n";
  EXPECT_EQ(harness::load_suite(good, registry).counters, "all");
  const std::string why = test::usage_error([&] { (void)harness::load_suite(bad, registry); });
  EXPECT_NE(why.find("bad.yaml:4"), std::string::npos) << why;
  EXPECT_NE(why.find("valid: off, memory, compute, all"), std::string::npos) << why;
  // The study's suite reads every counter of every step.
  const harness::Suite study =
      harness::load_suite(fs::path(AB_SOURCE_DIR) / "suites" / "characterisation.yaml", registry);
  EXPECT_EQ(study.counters, "all");
  std::set<std::string> workloads;
  for (const auto& step : study.steps) workloads.insert(step.workload);
  for (const char* w : {"gemm", "train", "infer", "stream", "collectives"}) EXPECT_TRUE(workloads.count(w)) << w;
}

json point(int seq, const std::string& workload, json params, double flops, double bytes, json counters) {
  return {{"schema_version", 1},
          {"run_id", "R"},
          {"seq", seq},
          {"workload", workload},
          {"device", "cuda:0"},
          {"device_name", "Dev"},
          {"params", std::move(params)},
          {"status", "ok"},
          {"counts", {{"samples", 1}, {"flops", flops}, {"bytes", bytes}}},
          {"time", {{"median_s", 1e-3}, {"converged", true}, {"rel_spread", 0.001}, {"count", 10}}},
          {"rates", {{"tflops", flops / 1e-3 / 1e12}, {"gbps", bytes / 1e-3 / 1e9}, {"primary", "tflops"}}},
          {"metrics", {{"counters", std::move(counters)}}}};
}

report::Run run_of(std::vector<json> points) {
  report::Run r;
  r.id = r.label = "R";
  r.origin = "test";
  r.info = {{"run_id", "R"}, {"status", "complete"}};
  r.context = {{"measurement", {{"max_noise_pct", 1.0}}}};
  r.points = std::move(points);
  return r;
}

const report::Section* section(const report::Document& d, const std::string& title) {
  for (const auto& s : d.sections)
    if (s.title == title) return &s;
  return nullptr;
}

TEST(CounterReport, MeasuredRooflineAndSuiteCharacterAppearOnlyWithCounters) {
  Measurement train = two_ranges();
  train.ranges[0].name = "conv1:forward";
  json train_block = counters_json(train, {.flops = 2e9, .bytes = 1e6});
  train_block["ops"] = {{{"name", "conv1:forward"},
                         {"flops", 1e9},
                         {"modelled_bytes", 5e5},
                         {"dram_bytes", 4000.0},
                         {"duration_s", 1e-6}}};
  json gemm = point(0, "gemm", {{"m", 4096}}, 1.37e11, 1e8, counters_json(two_ranges(), {1.37e11, 1e8}));
  gemm["rates"]["ceiling"] = {{"key", "gemm.fp32"}, {"unit", "TFLOP/s"}, {"source", "run Q seq 1"}, {"value", 137.0}};
  std::vector<json> with = {
      gemm, point(1, "stream", {{"op", "copy"}}, 0, 8000, counters_json(two_ranges(), {0, 8000})),
      point(2, "train", {{"model", "resnet50"}}, 2e9, 1e6, train_block),
      point(3, "infer", {{"model", "bert_base"}}, 1e9, 1e6, unavailable_json(MetricSet::all, "no CUPTI"))};
  const report::Document doc = report::build_report({run_of(with)});
  const report::Section* roofline = section(doc, "Measured roofline");
  const report::Section* character = section(doc, "Suite character");
  ASSERT_NE(roofline, nullptr);
  ASSERT_NE(character, nullptr);
  const auto& chart = std::get<report::Chart>(roofline->blocks.at(0));
  // gemm, stream (no FLOPs: no measured intensity, a table row still) and train with counters; infer's are unavailable.
  EXPECT_EQ(chart.table.rows.size(), 3u);
  const std::string spec = chart.spec.dump();
  EXPECT_NE(spec.find("\"modelled\""), std::string::npos);
  EXPECT_NE(spec.find("\"op (measured)\""), std::string::npos);
  EXPECT_NE(spec.find("gemm.fp32"), std::string::npos);  // the roof of the measured ceiling
  EXPECT_NE(chart.spec.dump().find(std::to_string(1.37e11 / 8000).substr(0, 6)), std::string::npos);
  const auto& suite = std::get<report::Chart>(character->blocks.at(0));
  EXPECT_EQ(suite.table.rows.size(), 3u);
  const std::string families = suite.spec.dump();
  for (const char* f : {"DeepBench kernels", "STREAM memory", "MLPerf models"})
    EXPECT_NE(families.find(f), std::string::npos) << f;
  // Markdown renders both sections.
  const std::string md = report::render_markdown(doc);
  EXPECT_NE(md.find("Measured roofline"), std::string::npos);
  EXPECT_NE(md.find("Suite character"), std::string::npos);

  // Without counters read anywhere (absent, or unavailable): neither section, no empty chart.
  std::vector<json> without = with;
  for (auto& p : without) p["metrics"]["counters"] = unavailable_json(MetricSet::memory, "no GPU");
  without[0].erase("metrics");
  const report::Document none = report::build_report({run_of(without)});
  EXPECT_EQ(section(none, "Measured roofline"), nullptr);
  EXPECT_EQ(section(none, "Suite character"), nullptr);
}

}  // namespace
}  // namespace ab::counters
