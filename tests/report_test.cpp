// Tests for src/report: charts and tables from synthetic records (flagged points shown, never
// dropped), escaping of hostile strings, the compare rule, CSV import, loading corrupt files,
// Markdown. The browser end-to-end test is in report_e2e_test.cpp.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "harness/runner.h"
#include "harness/suite.h"
#include "report/report.h"
#include "results/results.h"
#include "test_support.h"
#include "workloads/registry.h"

namespace ab::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json rec(int seq, const std::string& workload, json params, const std::string& status = "ok", double median_s = 1e-3,
         json rates = json::object(), json extra = json::object()) {
  json r = {{"schema_version", 1}, {"run_id", "R1"}, {"seq", seq}, {"workload", workload}, {"device", "cuda:0"},
            {"device_name", "Dev"}, {"params", std::move(params)}, {"status", status}};
  if (status != "ok") {
    r["reason"] = "because " + status;
  } else {
    r["time"] = {{"median_s", median_s}, {"p90_s", median_s * 1.1}, {"p99_s", median_s * 1.2}, {"converged", true},
                 {"rel_spread", 0.004}, {"count", 20}, {"samples_s", json::array()}};
    r["rates"] = std::move(rates);
  }
  for (const auto& [k, v] : extra.items()) r[k] = v;
  return r;
}

ab::report::Run make_run(std::vector<json> points, const std::string& id = "R1") {
  ab::report::Run r;
  r.id = r.label = id;
  r.origin = "test";
  r.info = {{"run_id", id}, {"status", "complete"}};
  r.context = {{"host", {{"hostname", "node1"}}}, {"measurement", {{"max_noise_pct", 1.0}}}};
  r.points = std::move(points);
  for (auto& p : r.points) p["run_id"] = id;
  return r;
}

// A training-like sweep: batch x precision, with a skipped, an oom, an unconverged and a noisy point.
ab::report::Run training_run() {
  std::vector<json> pts;
  int seq = 0;
  for (const std::string prec : {"fp32", "bf16"}) {
    for (int batch : {1, 2, 4, 8}) {
      const double sps = batch * 100.0 * (prec == "bf16" ? 2 : 1);
      json rates = {{"samples_per_s", sps}, {"tflops", sps / 1000}, {"primary", "tflops"}};
      json extra = {{"counts", {{"samples", batch}, {"flops", batch * 1e9}, {"bytes", batch * 1e7}}},
                    {"telemetry", {{"samples_per_j", sps / 300}, {"mean_power_w", 300.0}}}};
      if (prec == "bf16" && batch == 8) pts.push_back(rec(seq++, "train", {{"batch", batch}, {"precision", prec}}, "oom"));
      else pts.push_back(rec(seq++, "train", {{"batch", batch}, {"precision", prec}}, "ok", batch / sps, rates, extra));
    }
  }
  pts.push_back(rec(seq++, "train", {{"batch", 16}, {"precision", "fp8"}}, "skipped"));
  pts[1]["time"]["converged"] = false;
  pts[1]["time"]["stop_reason"] = "timeout before the noise target";
  pts[2]["time"]["rel_spread"] = 0.05;
  return make_run(pts);
}

const Chart* find_chart(const Document& d, const std::string& title_part) {
  for (const auto& s : d.sections)
    for (const auto& b : s.blocks)
      if (const auto* c = std::get_if<Chart>(&b); c && c->title.find(title_part) != std::string::npos) return c;
  return nullptr;
}

const Section* find_section(const Document& d, const std::string& title_part) {
  for (const auto& s : d.sections)
    if (s.title.find(title_part) != std::string::npos) return &s;
  return nullptr;
}

bool table_has(const Table& t, const std::string& text) {
  for (const auto& row : t.rows)
    for (const auto& c : row) {
      if (c.text.find(text) != std::string::npos) return true;
      for (const auto& b : c.badges)
        if (b == text) return true;
    }
  return false;
}

TEST(ReportCharts, ThroughputVsBatchOnLog2WithEveryPointInTheTable) {
  const ab::report::Run run = training_run();
  const Document doc = build_report({run});
  const Chart* c = find_chart(doc, "samples/s vs batch");
  ASSERT_NE(c, nullptr);
  const std::string spec = c->spec.dump();
  EXPECT_NE(spec.find(R"("scale":{"base":2,"type":"log"})"), std::string::npos) << spec;
  // Every point of the workload is a row: 8 measured or oom, 1 skipped.
  EXPECT_EQ(c->table.rows.size(), 9u);
  EXPECT_TRUE(table_has(c->table, "oom"));
  EXPECT_TRUE(table_has(c->table, "skipped"));
  EXPECT_TRUE(table_has(c->table, "unconverged"));
  EXPECT_TRUE(table_has(c->table, "noisy"));
  // The oom point is drawn as a cross with its status; the unconverged one keeps its value, shaped.
  EXPECT_NE(spec.find(R"("shape":"cross")"), std::string::npos);
  EXPECT_NE(spec.find(R"("status":"oom")"), std::string::npos);
  EXPECT_NE(spec.find(R"("quality":"unconverged")"), std::string::npos);
  EXPECT_NE(spec.find(R"("quality":"noisy")"), std::string::npos);
  EXPECT_NE(c->note.find("1 oom"), std::string::npos) << c->note;
  EXPECT_NE(c->note.find("1 skipped"), std::string::npos) << c->note;
}

TEST(ReportCharts, LatencyEnergyPrecisionAndRooflineCharts) {
  const Document doc = build_report({training_run()});
  const Chart* lat = find_chart(doc, "Latency percentiles");
  ASSERT_NE(lat, nullptr);
  EXPECT_EQ(lat->table.columns[lat->table.columns.size() - 4], "median");
  EXPECT_NE(lat->spec.dump().find(R"("percentile":"p99")"), std::string::npos);
  ASSERT_NE(find_chart(doc, "samples/J"), nullptr);

  const Chart* prec = find_chart(doc, "Precision speed-up");
  ASSERT_NE(prec, nullptr);
  ASSERT_EQ(prec->table.rows.size(), 5u);  // the 4 bf16 points and the fp8 one
  EXPECT_EQ(prec->table.rows[0].back().text, "2");  // bf16 runs at twice the fp32 rate
  EXPECT_TRUE(table_has(prec->table, "oom"));
  EXPECT_TRUE(table_has(prec->table, "no fp32 point"));

  const Chart* roof = find_chart(doc, "Roofline");
  ASSERT_NE(roof, nullptr);
  EXPECT_TRUE(table_has(roof->table, "100"));  // FLOP/byte = 1e9 / 1e7
  EXPECT_NE(roof->note.find("No ceilings were measured"), std::string::npos);
}

TEST(ReportCharts, RooflineDrawsMeasuredCeilings) {
  ab::report::Run run = training_run();
  run.points.push_back(rec(20, "ceilings", {{"target", "gemm.fp32"}}, "ok", 1e-3,
                           {{"ceiling", {{"key", "gemm.fp32"}, {"value", 10.0}, {"unit", "TFLOP/s"}, {"source", "this point"}}}}));
  run.points.push_back(rec(21, "ceilings", {{"target", "memory.bandwidth"}}, "ok", 1e-3,
                           {{"ceiling", {{"key", "memory.bandwidth"}, {"value", 100.0}, {"unit", "GB/s"}, {"source", "this point"}}}}));
  run.points.push_back(rec(22, "ceilings", {{"target", "gemm.bf16"}}, "skipped"));
  const Document doc = build_report({run});
  const Section* ceil = find_section(doc, "Measured ceilings");
  ASSERT_NE(ceil, nullptr);
  const auto& t = std::get<Table>(ceil->blocks[1]);
  EXPECT_EQ(t.rows.size(), 3u);
  EXPECT_TRUE(table_has(t, "skipped"));
  const Chart* roof = find_chart(doc, "Roofline");
  ASSERT_NE(roof, nullptr);
  const std::string spec = roof->spec.dump();
  // Ridge of gemm.fp32 at 10 TFLOP/s over 100 GB/s: 100 FLOP/byte.
  EXPECT_NE(spec.find(R"("order":1,"roof":"gemm.fp32","x":100.0,"y":10.0)"), std::string::npos) << spec;
  EXPECT_NE(roof->note.find("Roofs (measured)"), std::string::npos);
  EXPECT_EQ(find_section(doc, "Workload: ceilings"), nullptr);  // ceilings have their own section
}

TEST(ReportCharts, ScalingEfficiencyAndPerPointFallback) {
  std::vector<json> pts;
  const double rates[] = {100, 190, 360};
  int i = 0;
  for (int g : {1, 2, 4}) pts.push_back(rec(i, "allreduce", {{"gpus", g}}, "ok", 1e-3, {{"samples_per_s", rates[i]}})), ++i;
  // The first GPU's clocks: at 2 GPUs 2.5% below the 1-GPU point's, power-capped throughout; 4 GPUs without telemetry.
  pts[0]["telemetry"] = {{"gpus", {{{"mean_sm_clock_mhz", 1980.0}, {"throttle_fraction", {{"sw_power_cap", 0.25}}}}}}};
  pts[1]["telemetry"] = {{"gpus", {{{"mean_sm_clock_mhz", 1930.5}, {"throttle_fraction", {{"sw_power_cap", 1.0}}}}}}};
  pts.push_back(rec(3, "infer", {{"model", "resnet50"}}, "ok", 1e-3, {{"samples_per_s", 900.0}}));
  pts.push_back(rec(4, "infer", {{"model", "bert"}}, "invalid"));
  const Document doc = build_report({make_run(pts)});
  const Chart* sc = find_chart(doc, "Scaling efficiency");
  ASSERT_NE(sc, nullptr);
  ASSERT_EQ(sc->table.rows.size(), 3u);
  const auto col = [&](const std::string& name) {
    return static_cast<std::size_t>(std::find(sc->table.columns.begin(), sc->table.columns.end(), name) - sc->table.columns.begin());
  };
  ASSERT_LT(col("power-capped readings"), sc->table.columns.size());
  EXPECT_EQ(sc->table.rows[1][col("efficiency")].text, "0.95");
  EXPECT_EQ(sc->table.rows[2][col("efficiency")].text, "0.9");
  EXPECT_EQ(sc->table.rows[0][col("SM clock / 1-GPU's")].text, "1");
  EXPECT_EQ(sc->table.rows[1][col("SM clock / 1-GPU's")].text, "0.975");
  EXPECT_EQ(sc->table.rows[0][col("power-capped readings")].text, "25%");
  EXPECT_EQ(sc->table.rows[1][col("power-capped readings")].text, "100%");
  EXPECT_EQ(sc->table.rows[2][col("power-capped readings")].text, "—");
  EXPECT_NE(sc->note.find("At 1 multi-GPU point(s) that clock was more than 1% below"), std::string::npos) << sc->note;
  const Chart* bars = find_chart(doc, "per point");
  ASSERT_NE(bars, nullptr);
  EXPECT_TRUE(table_has(bars->table, "invalid"));
  EXPECT_NE(bars->spec.dump().find(R"("status":"invalid")"), std::string::npos);
}

TEST(ReportSummary, AttentionTableListsEveryFlaggedPoint) {
  const Document doc = build_report({training_run()});
  const Section* s = find_section(doc, "Summary");
  ASSERT_NE(s, nullptr);
  const auto& t = std::get<Table>(s->blocks[1]);
  EXPECT_EQ(t.rows.size(), 4u);  // unconverged, noisy, oom, skipped
  EXPECT_NE(std::get<Paragraph>(s->blocks[0]).text.find("1 did not converge"), std::string::npos);
}

TEST(ReportLoad, UnreadableLinesAreCountedNamedAndNeverCalledFine) {
  ab::test::TempDir dir;
  const fs::path points = dir.path() / "points.jsonl";
  {
    std::ofstream out(points, std::ios::binary);
    out << rec(0, "gemm", {{"m", 64}}).dump() << "\n{\"run_id\": \"R1\", garbled\n"
        << rec(1, "gemm", {{"m", 128}}).dump() << "\n" << rec(2, "gemm", {{"m", 256}}).dump().substr(0, 40) << "\n";
  }
  const ab::report::Run run = load_run(dir.path().string(), dir.path().string());
  EXPECT_EQ(run.points.size(), 2u);
  EXPECT_EQ(run.unreadable_lines, 2u);
  const std::string md = render_markdown(build_report({run}));
  EXPECT_NE(md.find(points.string() + ":2"), std::string::npos) << md;
  EXPECT_NE(md.find(points.string() + ":4"), std::string::npos) << md;
  EXPECT_NE(md.find("2 line(s) of the points files could not be read"), std::string::npos) << md;
  EXPECT_EQ(md.find("every point is ok"), std::string::npos) << md;
}

TEST(ReportEscaping, MarkupInRecordsIsInert) {
  const std::string evil = "<script>alert(1)</script>\"'&";
  std::vector<json> pts = {rec(0, evil, {{"batch", 1}, {"model", evil}}, "ok", 1e-3, {{"samples_per_s", 5.0}}),
                           rec(1, evil, {{"batch", 2}, {"model", evil}}, "error", 0, {}, {{"reason", evil}}),
                           rec(2, evil, {{"batch", 4}, {"model", evil}}, "ok", 1e-3, {{"samples_per_s", 9.0}})};
  ab::report::Run run = make_run(pts, "R1");
  run.context["host"]["hostname"] = evil;
  run.context["command_line"] = evil;
  const Document doc = build_report({run});
  const std::string md = render_markdown(doc);
  EXPECT_EQ(md.find("<script>"), std::string::npos);
  EXPECT_NE(md.find("\\<script\\>alert(1)\\</script\\>"), std::string::npos);
  std::string why;
  if (!html_available(&why)) AB_SKIP_OR_REQUIRE("charts", "HTML: " << why);
  const std::string html = render_html(doc);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_EQ(html.find("</script>\"'&"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;"), std::string::npos);
  EXPECT_NE(html.find("\\u003cscript\\u003ealert(1)\\u003c/script\\u003e"), std::string::npos);
  // Our scripts only: the capture, the three libraries, the drawing code, and one JSON spec per chart.
  std::size_t scripts = 0;
  for (std::size_t at = 0; (at = html.find("<script", at)) != std::string::npos; ++at) ++scripts;
  EXPECT_EQ(scripts, 5 + doc.chart_count());
}

TEST(ReportEscaping, JsonForScriptCannotCloseTheElement) {
  const json j = {{"a", "</script><!-- & \xE2\x80\xA8"}};
  const std::string s = json_for_script(j);
  EXPECT_EQ(s.find('<'), std::string::npos);
  EXPECT_EQ(s.find('>'), std::string::npos);
  EXPECT_EQ(s.find('&'), std::string::npos);
  EXPECT_EQ(s.find("\xE2\x80\xA8"), std::string::npos);
  EXPECT_EQ(json::parse(s), j);  // still the same JSON
  EXPECT_EQ(escape_html("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
}

TEST(ReportMarkdown, SameContentAsTables) {
  const std::string md = render_markdown(build_report({training_run()}));
  EXPECT_NE(md.find("## Workload: train"), std::string::npos);
  EXPECT_NE(md.find("#### samples/s vs batch"), std::string::npos);
  EXPECT_NE(md.find("| batch | precision | status | samples/s |"), std::string::npos) << md;
  EXPECT_NE(md.find("| oom: because oom |"), std::string::npos);
  EXPECT_NE(md.find("ok · unconverged: did not converge: timeout before the noise target"), std::string::npos);
}

// Deterministic samples around `median` with relative noise `rel`.
std::vector<double> samples(double median, double rel, int n, unsigned seed) {
  std::vector<double> v;
  unsigned x = seed * 2654435761u + 1;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    const double u = (x >> 8) / double(1u << 24) - 0.5;  // [-0.5, 0.5)
    v.push_back(median * (1 + 2 * rel * u));
  }
  return v;
}

TEST(CompareRule, MannWhitneyNormalApproximation) {
  // U = 0 for fully separated samples of 5: z = (12.5 - 0.5) / sqrt(25 * 11 / 12), p = 0.01218.
  EXPECT_NEAR(mann_whitney_p({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}), 0.01218, 1e-4);
  EXPECT_DOUBLE_EQ(mann_whitney_p({1, 1, 1}, {1, 1, 1}), 1.0);  // all tied
  EXPECT_DOUBLE_EQ(mann_whitney_p({}, {1.0}), 1.0);
  EXPECT_GT(mann_whitney_p({1, 3, 5, 7, 9}, {2, 4, 6, 8, 10}), 0.5);
}

TEST(CompareRule, FasterSlowerSameUnsure) {
  const auto a = samples(1.0, 0.01, 50, 1);
  auto c = compare_times(a, samples(0.8, 0.01, 50, 2));
  EXPECT_EQ(c.verdict, Verdict::faster) << c.why;
  EXPECT_NEAR(c.ratio, 1.25, 0.01);
  EXPECT_EQ(compare_times(a, samples(1.3, 0.01, 50, 3)).verdict, Verdict::slower);
  c = compare_times(a, samples(1.002, 0.001, 50, 4));
  EXPECT_EQ(c.verdict, Verdict::same) << c.why;
  c = compare_times(samples(1.0, 0.4, 8, 5), samples(1.05, 0.4, 8, 6));
  EXPECT_EQ(c.verdict, Verdict::unsure) << c.why;
  EXPECT_NE(c.why.find("noisy"), std::string::npos);
  c = compare_times({1, 1, 1}, {2, 2, 2});
  EXPECT_EQ(c.verdict, Verdict::unsure);
  EXPECT_NE(c.why.find("too few samples"), std::string::npos);
  // A single published figure is exact; the measured one brings its interval.
  EXPECT_EQ(compare_rates(100, 0, 101, 0).verdict, Verdict::same);
  EXPECT_EQ(compare_rates(100, 0, 150, 0).verdict, Verdict::faster);
  EXPECT_EQ(compare_rates(100, 0.01, 80, 0).verdict, Verdict::slower);
  EXPECT_EQ(compare_rates(100, 0.1, 105, 0).verdict, Verdict::unsure);
}

TEST(CompareRule, RunsMatchedByWorkloadAndAxes) {
  auto with_samples = [](json r, const std::vector<double>& s) {
    r["time"]["samples_s"] = s;
    return r;
  };
  ab::report::Run a = make_run({with_samples(rec(0, "gemm", {{"m", 1024}}), samples(1.0, 0.01, 30, 1)),
                    with_samples(rec(1, "gemm", {{"m", 2048}}), samples(1.0, 0.01, 30, 2)),
                    rec(2, "gemm", {{"m", 4096}}, "oom"), rec(3, "gemm", {{"m", 8}})},
                   "A");
  ab::report::Run b = make_run({with_samples(rec(0, "gemm", {{"m", 1024.0}}), samples(0.5, 0.01, 30, 3)),
                    with_samples(rec(1, "gemm", {{"m", 2048}}), samples(1.0, 0.01, 30, 4)),
                    with_samples(rec(2, "gemm", {{"m", 4096}}), samples(1.0, 0.01, 30, 5)), rec(3, "gemm", {{"m", 16}})},
                   "B");
  const Document doc = build_comparison({a, b});
  const Section* s = find_section(doc, "B (B) vs A (A)");
  ASSERT_NE(s, nullptr);
  // The matched points are a chart of B/A per point, coloured by verdict, over the table of them.
  const auto* chart = std::get_if<Chart>(&s->blocks[1]);
  ASSERT_NE(chart, nullptr);
  const json& bars = chart->spec["layer"][1]["data"]["values"];
  ASSERT_EQ(bars.size(), 2u);  // the pair with an oom side has no ratio to draw
  EXPECT_EQ(bars[0]["point"], "gemm m=1024");
  EXPECT_NEAR(bars[0]["ratio"].get<double>(), 2.0, 0.1);
  EXPECT_EQ(bars[0]["verdict"], "faster");
  EXPECT_EQ(bars[1]["verdict"], "same");
  EXPECT_EQ(chart->spec["layer"][1]["encoding"]["color"]["field"], "verdict");
  const auto& t = chart->table;
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.rows[0][5].badges[0], "faster");
  EXPECT_EQ(t.rows[1][5].badges[0], "same");
  EXPECT_EQ(t.rows[2][5].badges[0], "unsure");
  EXPECT_NE(t.rows[2][8].text.find("A is oom"), std::string::npos);
  const auto& only = std::get<Table>(s->blocks[2]);
  EXPECT_EQ(only.rows.size(), 2u);  // m=8 only in A, m=16 only in B
  EXPECT_NE(render_text(doc).find("faster"), std::string::npos);
}

// ---- The studies (suites/precision-study.yaml, batch-study.yaml, c2-inference.yaml) ----

const Table* first_table(const Section& s) {
  for (const auto& b : s.blocks)
    if (const auto* t = std::get_if<Table>(&b)) return t;
  return nullptr;
}

std::size_t column(const Table& t, const std::string& name) {
  const auto it = std::find(t.columns.begin(), t.columns.end(), name);
  EXPECT_NE(it, t.columns.end()) << name;
  return static_cast<std::size_t>(it - t.columns.begin());
}

json model_rec(int seq, const std::string& workload, const std::string& model, const std::string& prec, int batch,
               double samples_per_s, const std::string& status = "ok") {
  json params = {{"model", model}, {"batch", batch}, {"precision", prec}, {"image_size", 224}, {"layout", "nhwc"}, {"graph", "on"}};
  if (status != "ok") return rec(seq, workload, params, status);
  return rec(seq, workload, params, "ok", batch / samples_per_s, {{"samples_per_s", samples_per_s}, {"primary", "tflops"}},
             {{"telemetry", {{"samples_per_j", samples_per_s / 400}, {"mean_power_w", 400.0}}}});
}

TEST(ReportStudies, PrecisionSpeedUpOverFp32AtTheSameBatch) {
  const std::map<std::string, double> speedup = {{"fp32", 1}, {"tf32", 1.5}, {"bf16", 2}, {"fp16", 2.5}};
  std::vector<json> pts;
  int seq = 0;
  for (const auto& [prec, x] : speedup) pts.push_back(model_rec(seq++, "train", "resnet50", prec, 128, 1000 * x));
  for (int batch : {8, 128})
    for (const auto& [prec, x] : speedup)
      pts.push_back(batch == 8 && prec == "fp16" ? model_rec(seq++, "infer", "resnet50", prec, batch, 0, "oom")
                                                 : model_rec(seq++, "infer", "resnet50", prec, batch, 100.0 * batch * x));
  // Two precisions at a batch with no fp32 point: no speed-up to show, the note counts it.
  pts.push_back(model_rec(seq++, "infer", "resnet50", "bf16", 64, 9000));
  pts.push_back(model_rec(seq++, "infer", "resnet50", "fp16", 64, 9900));
  const Document doc = build_report({make_run(pts)});
  const Section* s = find_section(doc, "Precision study");
  ASSERT_NE(s, nullptr);
  EXPECT_NE(std::get<Paragraph>(s->blocks[0]).text.find("1 group(s)"), std::string::npos);
  const Table* t = first_table(*s);
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->rows.size(), 3u);  // train 128, infer 8, infer 128
  const auto mode = column(*t, "mode"), batch = column(*t, "batch"), base = column(*t, "fp32 samples/s");
  const auto tf32 = column(*t, "tf32 ×"), bf16 = column(*t, "bf16 ×"), fp16 = column(*t, "fp16 ×");
  EXPECT_LT(tf32, bf16);  // columns from the widest precision down
  EXPECT_LT(bf16, fp16);
  EXPECT_EQ(t->rows[0][mode].text, "train");
  EXPECT_EQ(t->rows[0][base].text, "1000");
  EXPECT_EQ(t->rows[0][tf32].text, "1.5");
  EXPECT_EQ(t->rows[0][bf16].text, "2");
  EXPECT_EQ(t->rows[0][fp16].text, "2.5");
  EXPECT_EQ(t->rows[1][mode].text, "infer");
  EXPECT_EQ(t->rows[1][batch].text, "8");
  EXPECT_EQ(t->rows[1][base].text, "800");
  EXPECT_EQ(t->rows[1][bf16].text, "2");
  EXPECT_EQ(t->rows[1][fp16].text, "—");  // oom: no speed-up, and says why
  ASSERT_FALSE(t->rows[1][fp16].badges.empty());
  EXPECT_EQ(t->rows[1][fp16].badges[0], "oom");
  EXPECT_EQ(t->rows[2][batch].text, "128");
  EXPECT_EQ(t->rows[2][fp16].text, "2.5");
  // The same numbers in Markdown.
  EXPECT_NE(render_markdown(doc).find("## Precision study"), std::string::npos);
}

// Infer records carry what the precision cost (metrics.accuracy: image 0's logits against float64;
// metrics.fp8 for fp8): the precision study shows it in the cell; records without it render as before.
json with_cost(json r, double rel_error, bool top1_agrees) {
  r["metrics"]["accuracy"] = {{"logits_rel_error_vs_f64", rel_error}, {"top1_agrees_f64", top1_agrees}};
  return r;
}

TEST(ReportStudies, PrecisionStudyShowsWhatEachInferPrecisionCost) {
  std::vector<json> pts;
  int seq = 0;
  // Training and an older inference run's batch: no metrics.
  pts.push_back(model_rec(seq++, "train", "resnet50", "fp32", 128, 1000));
  pts.push_back(model_rec(seq++, "train", "resnet50", "bf16", 128, 2000));
  for (const auto& [prec, x] : std::map<std::string, double>{{"fp32", 1}, {"bf16", 2}, {"fp16", 2.5}})
    pts.push_back(model_rec(seq++, "infer", "resnet50", prec, 128, 12800 * x));
  // fp8 at batch 128 failed its logits check: no speed-up, but the record says by how much.
  pts.push_back(with_cost(model_rec(seq++, "infer", "resnet50", "fp8", 128, 0, "error"), 0.31, false));
  // Batch 8: every precision with its cost; fp8 lost the top-1 class and 3 convolutions fell back.
  pts.push_back(with_cost(model_rec(seq++, "infer", "resnet50", "fp32", 8, 800), 3.1e-7, true));
  pts.push_back(with_cost(model_rec(seq++, "infer", "resnet50", "bf16", 8, 1600), 6.2e-3, true));
  pts.push_back(with_cost(model_rec(seq++, "infer", "resnet50", "fp16", 8, 2000), 1.04e-3, true));
  json fp8 = with_cost(model_rec(seq++, "infer", "resnet50", "fp8", 8, 2400), 0.0623, false);
  fp8["metrics"]["fp8"] = {{"layers", 50},
                           {"fallback_layers", 3},
                           {"fallback_slower_layers", 2},
                           {"fallback_reasons", {"channels not a multiple of 16"}}};
  pts.push_back(fp8);
  const Document doc = build_report({make_run(pts)});
  const Section* s = find_section(doc, "Precision study");
  ASSERT_NE(s, nullptr);
  EXPECT_NE(std::get<Paragraph>(s->blocks[0]).text.find("float64"), std::string::npos);
  const Table* t = first_table(*s);
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->rows.size(), 3u);  // train 128, infer 8, infer 128
  const auto base = column(*t, "fp32 samples/s"), bf16 = column(*t, "bf16 ×"), fp16 = column(*t, "fp16 ×"),
             fp8x = column(*t, "fp8 ×");
  // Without metrics: exactly the speed-up, as before.
  EXPECT_EQ(t->rows[0][base].text, "1000");
  EXPECT_EQ(t->rows[0][bf16].text, "2");
  EXPECT_EQ(t->rows[0][fp8x].text, "—");  // training has no fp8
  EXPECT_EQ(t->rows[2][base].text, "12800");
  EXPECT_EQ(t->rows[2][bf16].text, "2");
  EXPECT_EQ(t->rows[2][fp16].text, "2.5");
  EXPECT_TRUE(t->rows[2][bf16].title.empty());
  // With metrics: the speed-up, then the logits' error vs float64, the marker only where top-1 differs.
  EXPECT_EQ(t->rows[1][base].text, "800 · err 3.1e-07");
  EXPECT_EQ(t->rows[1][bf16].text, "2 · err 6.2e-03");
  EXPECT_EQ(t->rows[1][fp16].text, "2.5 · err 1.0e-03");
  EXPECT_EQ(t->rows[1][fp8x].text, "3 · err 6.2e-02 · top-1 ≠ f64 · 50 fp8 / 3 fell back");
  EXPECT_NE(t->rows[1][fp8x].title.find("channels not a multiple of 16"), std::string::npos);
  EXPECT_NE(t->rows[1][fp8x].title.find("3 fell back to f16 (2 of them because fp8 timed no faster there)"),
            std::string::npos)
      << t->rows[1][fp8x].title;
  EXPECT_EQ(t->rows[2][fp8x].text, "— · err 3.1e-01 · top-1 ≠ f64");
  ASSERT_FALSE(t->rows[2][fp8x].badges.empty());
  EXPECT_EQ(t->rows[2][fp8x].badges[0], "error");
  // The same in Markdown and HTML.
  const std::string md = render_markdown(doc);
  EXPECT_NE(md.find("| 3 · err 6.2e-02 · top-1 ≠ f64 · 50 fp8 / 3 fell back |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 2.5 · err 1.0e-03 |"), std::string::npos) << md;
  if (html_available()) {
    const std::string html = render_html(doc);
    EXPECT_NE(html.find("3 · err 6.2e-02 · top-1 ≠ f64 · 50 fp8 / 3 fell back"), std::string::npos);
  }

  // The same records without their metrics: the table and the note as before any of this.
  for (auto& p : pts) p.erase("metrics");
  const Document old = build_report({make_run(pts)});
  const Section* os = find_section(old, "Precision study");
  ASSERT_NE(os, nullptr);
  EXPECT_EQ(std::get<Paragraph>(os->blocks[0]).text.find("float64"), std::string::npos);
  const Table* ot = first_table(*os);
  ASSERT_NE(ot, nullptr);
  ASSERT_EQ(ot->rows.size(), 3u);
  EXPECT_EQ(ot->rows[1][base].text, "800");
  EXPECT_EQ(ot->rows[1][fp8x].text, "3");
  EXPECT_TRUE(ot->rows[1][fp8x].title.empty());
  EXPECT_EQ(ot->rows[2][fp8x].text, "—");
  EXPECT_EQ(render_markdown(old).find("err "), std::string::npos);
}

TEST(ReportStudies, BatchSizeStudyPerModel) {
  std::vector<json> pts;
  int seq = 0;
  for (int batch : {1, 2, 4, 8}) pts.push_back(model_rec(seq++, "infer", "resnet50", "fp16", batch, 500.0 * batch));
  pts.push_back(model_rec(seq++, "infer", "resnet50", "fp16", 16, 0, "oom"));
  // Two batch sizes are not a sweep; a training sweep is not the batch-size study.
  for (int batch : {2, 12}) pts.push_back(model_rec(seq++, "infer", "resnext101_32x4d", "fp16", batch, 100.0 * batch));
  for (int batch : {64, 128, 256}) pts.push_back(model_rec(seq++, "train", "resnet50", "bf16", batch, 10.0 * batch));
  const Document doc = build_report({make_run(pts)});
  ASSERT_NE(find_section(doc, "Batch-size study"), nullptr);
  const Section* s = find_section(doc, "Batch-size study: resnet50");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->level, 3);
  EXPECT_EQ(find_section(doc, "Batch-size study: resnext101_32x4d"), nullptr);
  EXPECT_EQ(find_section(doc, "Precision study"), nullptr);  // one precision per batch: nothing to compare
  const Table* t = first_table(*s);
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->rows.size(), 5u);
  const auto batch = column(*t, "batch"), rate = column(*t, "samples/s"), p50 = column(*t, "p50 latency"),
             p99 = column(*t, "p99 latency"), spj = column(*t, "samples/J"), status = column(*t, "status");
  // Rows in batch order; batch 4: 2000 img/s, 2 ms per batch (p99 = 1.2 x median in rec()), 5 img/J.
  EXPECT_EQ(t->rows[2][batch].text, "4");
  EXPECT_EQ(t->rows[2][rate].text, "2000");
  EXPECT_EQ(t->rows[2][p50].text, "2 ms");
  EXPECT_EQ(t->rows[2][p99].text, "2.4 ms");
  EXPECT_EQ(t->rows[2][spj].text, "5");
  EXPECT_EQ(t->rows[4][batch].text, "16");
  EXPECT_EQ(t->rows[4][status].badges[0], "oom");
  EXPECT_EQ(t->rows[4][rate].text, "—");
  // The model's own charts, titled with the model.
  const Chart* lat = find_chart(doc, "resnet50: Latency percentiles");
  ASSERT_NE(lat, nullptr);
  EXPECT_EQ(lat->table.rows.size(), 5u);
  EXPECT_NE(find_chart(doc, "resnet50: Energy efficiency"), nullptr);
  EXPECT_NE(find_chart(doc, "resnet50: samples/s vs batch"), nullptr);
}

TEST(ReportStudies, NoStudySectionsWithoutTheirPoints) {
  const Document doc = build_report({make_run({rec(0, "gemm", {{"m", 1024}}, "ok", 1e-3, {{"tflops", 1.0}}),
                                               rec(1, "gemm", {{"m", 2048}}, "ok", 1e-3, {{"tflops", 2.0}})})});
  EXPECT_EQ(find_section(doc, "Precision study"), nullptr);
  EXPECT_EQ(find_section(doc, "Batch-size study"), nullptr);
}

// Pipeline points (two decoders, a skipped nvjpeg point among them) and two training models: one
// chart of the pipeline's lines and a rule per model, with the threads that keep up with each.
TEST(ReportFeed, PipelineLinesBesideEachTrainingModel) {
  std::vector<json> pts;
  int seq = 0;
  const std::map<int, double> cpu_rate = {{1, 800.0}, {2, 1500.0}, {4, 2900.0}, {8, 5200.0}};
  for (const auto& [threads, rate] : cpu_rate)
    pts.push_back(rec(seq++, "pipeline", {{"decoder", "cpu"}, {"threads", threads}, {"image_px", 224}}, "ok", 64 / rate,
                      {{"samples_per_s", rate}}));
  pts.push_back(rec(seq++, "pipeline", {{"decoder", "nvjpeg"}, {"threads", 1}, {"image_px", 224}}, "ok", 64 / 9000.0,
                    {{"samples_per_s", 9000.0}}));
  pts.push_back(rec(seq++, "pipeline", {{"decoder", "nvjpeg"}, {"threads", 2}, {"image_px", 224}}, "skipped"));
  pts.push_back(rec(seq++, "train", {{"model", "resnet50"}, {"batch", 256}, {"precision", "bf16"}}, "ok", 0.1,
                    {{"samples_per_s", 2560.0}}));
  pts.push_back(rec(seq++, "train", {{"model", "resnet50"}, {"batch", 64}, {"precision", "fp32"}}, "ok", 0.1,
                    {{"samples_per_s", 640.0}}));
  // Two GPUs at 12,000 images/s: 6,000 per GPU, more than any thread count measured.
  pts.push_back(rec(seq++, "train", {{"model", "resnet18"}, {"batch", 256}, {"gpus", 2}}, "ok", 0.1,
                    {{"samples_per_s", 12000.0}}));
  const Document doc = build_report({make_run(pts)});
  const Section* s = find_section(doc, "Input pipeline against training");
  ASSERT_NE(s, nullptr);
  const Chart* c = find_chart(doc, "Input pipeline images/s by threads");
  ASSERT_NE(c, nullptr);
  const json& layers = c->spec["layer"];
  ASSERT_EQ(layers.size(), 4u);
  EXPECT_EQ(layers[0]["data"]["values"].size(), 4u) << "the cpu line's four points";
  const json& rules = layers[2]["data"]["values"];
  ASSERT_EQ(rules.size(), 3u) << "nvjpeg, measured at one thread count, and the two models";
  std::map<std::string, double> rule_y;
  for (const auto& r : rules) rule_y[r["series"].get<std::string>()] = r["y"].get<double>();
  EXPECT_EQ(rule_y["pipeline nvjpeg"], 9000.0);
  EXPECT_EQ(rule_y["train resnet50 images/s"], 2560.0) << "the model's fastest point";
  EXPECT_EQ(rule_y["train resnet18 images/s"], 6000.0) << "per GPU";
  ASSERT_EQ(c->table.rows.size(), 2u);
  ASSERT_EQ(c->table.columns.size(), 5u);
  EXPECT_EQ(c->table.columns[3], "pipeline cpu: threads that keep up");
  for (const auto& row : c->table.rows) {
    if (row[0].text == "train resnet50 images/s") {
      EXPECT_EQ(row[3].text, "4 threads");
      EXPECT_EQ(row[4].text, "1 thread");
    } else {
      EXPECT_EQ(row[0].text, "train resnet18 images/s");
      EXPECT_TRUE(row[3].text.find("none measured (at most 5200") != std::string::npos) << row[3].text;
      EXPECT_EQ(row[4].text, "1 thread");
    }
  }
}

TEST(ReportFeed, NoSectionWithoutPipelineOrTrainingPoints) {
  const json train = rec(0, "train", {{"model", "resnet50"}, {"batch", 8}}, "ok", 0.1, {{"samples_per_s", 80.0}});
  const json pipe = rec(1, "pipeline", {{"threads", 1}}, "ok", 0.1, {{"samples_per_s", 640.0}});
  const json skipped = rec(2, "pipeline", {{"threads", 2}, {"decoder", "nvjpeg"}}, "skipped");
  EXPECT_EQ(find_section(build_report({make_run({train, skipped})}), "Input pipeline against training"), nullptr);
  EXPECT_EQ(find_section(build_report({make_run({pipe})}), "Input pipeline against training"), nullptr);
  const Document both = build_report({make_run({train, pipe, skipped})});
  ASSERT_NE(find_section(both, "Input pipeline against training"), nullptr);
  const Chart* c = find_chart(both, "Input pipeline images/s by threads");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->spec["layer"][2]["data"]["values"][0]["series"], "pipeline cpu") << "records before the decoder axis";
}

// The study suites load, validate for both device kinds and expand to the points the studies need.
std::vector<harness::PlanEntry> suite_plan(const std::string& file, const std::string& workload, int step_index) {
  const auto s = harness::load_suite(fs::path(AB_SOURCE_DIR) / "suites" / file, workloads::registry());
  int seen = 0;
  for (const auto& st : s.steps)
    if (st.workload == workload && seen++ == step_index)
      return harness::plan_for(workloads::find_workload(st.workload), "cuda", st.overrides);
  ADD_FAILURE() << file << " has no step " << step_index << " of " << workload;
  return {};
}

std::set<std::string> values_of(const std::vector<harness::PlanEntry>& plan, const std::string& axis) {
  std::set<std::string> v;
  for (const auto& e : plan) v.insert(e.point.at(axis));
  return v;
}

TEST(ReportStudies, StudySuitesExpand) {
  const auto batch = suite_plan("batch-study.yaml", "infer", 0);
  EXPECT_EQ(batch.size(), 27u);  // 3 models x 9 batch sizes
  EXPECT_EQ(values_of(batch, "model"), (std::set<std::string>{"resnet50", "resnext101_32x4d", "resnext101_32x8d"}));
  EXPECT_EQ(values_of(batch, "precision"), std::set<std::string>{"fp16"});
  EXPECT_EQ(values_of(batch, "batch"), (std::set<std::string>{"1", "2", "4", "8", "16", "32", "64", "128", "256"}));

  const auto train = suite_plan("precision-study.yaml", "train", 0);
  const auto infer = suite_plan("precision-study.yaml", "infer", 0);
  EXPECT_EQ(train.size(), 12u);  // 3 models x 4 precisions
  EXPECT_EQ(infer.size(), 30u);  // 3 models x 5 precisions x 2 batch sizes
  const std::set<std::string> precisions = {"fp32", "tf32", "bf16", "fp16"};
  EXPECT_EQ(values_of(train, "precision"), precisions);
  std::set<std::string> with_fp8 = precisions;  // fp8 is inference only
  with_fp8.insert("fp8");
  EXPECT_EQ(values_of(infer, "precision"), with_fp8);

  // The transformers: BERT-large inference across the batch sizes, GPT-2 and BERT training per precision.
  const auto bert = suite_plan("batch-study.yaml", "infer", 1);
  EXPECT_EQ(bert.size(), 9u);
  EXPECT_EQ(values_of(bert, "model"), std::set<std::string>{"bert_large"});
  EXPECT_EQ(values_of(bert, "seq"), std::set<std::string>{"384"});
  const auto language = suite_plan("precision-study.yaml", "train", 1);
  EXPECT_EQ(language.size(), 8u);  // 2 models x 4 precisions
  EXPECT_EQ(values_of(language, "model"), (std::set<std::string>{"gpt2_124m", "bert_base"}));
  EXPECT_EQ(values_of(language, "precision"), precisions);

  const auto c2 = suite_plan("c2-inference.yaml", "infer", 0);
  ASSERT_EQ(c2.size(), 11u);  // batch 2 to 12
  EXPECT_EQ(values_of(c2, "model"), std::set<std::string>{"resnext101_32x4d"});
  EXPECT_EQ(values_of(c2, "precision"), std::set<std::string>{"fp16"});
  EXPECT_EQ(c2.front().point.at("batch"), "2");
  EXPECT_EQ(c2.back().point.at("batch"), "12");
  // Every step also expands on a CPU build's host device.
  for (const char* f : {"batch-study.yaml", "precision-study.yaml", "c2-inference.yaml"})
    for (const auto& st : harness::load_suite(fs::path(AB_SOURCE_DIR) / "suites" / f, workloads::registry()).steps)
      EXPECT_FALSE(harness::plan_for(workloads::find_workload(st.workload), "cpu", st.overrides).empty()) << f;
}

}  // namespace
}  // namespace ab::report
