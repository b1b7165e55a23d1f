// Tests for the report's layout: constant axes said once in a section's header, numbers in numeric
// order, no chart without data, skipped points summarised, the load generator's MLPerf table, the
// settings of merged runs, and chart specs that the charting library draws without warnings.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "report/report.h"

namespace ab::report {
namespace {

using nlohmann::json;

json point(int seq, const std::string& workload, json params, const std::string& status = "ok",
           json rates = json::object()) {
  json r = {{"schema_version", 1},         {"run_id", "R"},      {"seq", seq},
            {"workload", workload},        {"device", "cuda:0"}, {"device_name", "Dev"},
            {"params", std::move(params)}, {"status", status}};
  if (status != "ok") {
    r["reason"] = "not on this device";
    return r;
  }
  r["time"] = {{"median_s", 1e-3},  {"p90_s", 1.1e-3},     {"p99_s", 1.2e-3},
               {"converged", true}, {"rel_spread", 0.004}, {"count", 20}};
  r["rates"] = std::move(rates);
  return r;
}

Run run_of(std::vector<json> points, const std::string& id = "R") {
  Run r;
  r.id = r.label = id;
  r.origin = "test";
  r.info = {{"run_id", id}, {"status", "complete"}};
  r.context = {{"host", {{"hostname", "node1"}}}, {"measurement", {{"max_noise_pct", 1.0}}}};
  r.points = std::move(points);
  return r;
}

const Section* section(const Document& d, const std::string& title) {
  for (const auto& s : d.sections)
    if (s.title == title) return &s;
  return nullptr;
}

const Chart* chart(const Section& s, const std::string& title_part) {
  for (const auto& b : s.blocks)
    if (const auto* c = std::get_if<Chart>(&b); c && c->title.find(title_part) != std::string::npos) return c;
  return nullptr;
}

std::vector<std::string> column(const Table& t, const std::string& name) {
  const auto at = std::find(t.columns.begin(), t.columns.end(), name);
  EXPECT_NE(at, t.columns.end()) << name;
  std::vector<std::string> out;
  if (at == t.columns.end()) return out;
  const auto i = static_cast<std::size_t>(at - t.columns.begin());
  for (const auto& row : t.rows) out.push_back(row[i].text);
  return out;
}

// A train sweep over batch and precision with five axes that never change.
Run train_sweep() {
  std::vector<json> pts;
  int seq = 0;
  for (const std::string prec : {"fp32", "bf16"})
    for (int batch : {8, 16, 32})
      pts.push_back(point(seq++, "train",
                          {{"batch", batch},
                           {"precision", prec},
                           {"model", "resnet50"},
                           {"graph", "on"},
                           {"fold", "fused"},
                           {"layout", "nhwc"},
                           {"gpus", 1}},
                          "ok", {{"samples_per_s", batch * 100.0}, {"primary", "samples_per_s"}}));
  return run_of(pts);
}

TEST(ReportLayout, ConstantAxesAreSaidOnceInTheHeaderNotInEveryRow) {
  const Document doc = build_report({train_sweep()});
  const Section* s = section(doc, "Workload: train");
  ASSERT_NE(s, nullptr);
  const std::string header = std::get<Paragraph>(s->blocks[0]).text;
  EXPECT_NE(header.find("Every point has fold=fused, gpus=1, graph=on, layout=nhwc, model=resnet50"), std::string::npos)
      << header;
  EXPECT_NE(header.find("axes that vary: batch (8, 16, 32); precision (bf16, fp32)"), std::string::npos) << header;
  const Chart* c = chart(*s, "samples/s vs batch");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->table.columns, (std::vector<std::string>{"batch", "precision", "status", "samples/s", "median time",
                                                        "±95% CI", "samples"}));
  // The Markdown for a pull request is as narrow: the rate is the fourth column, not the twenty-fourth.
  const std::string md = render_markdown(doc);
  EXPECT_NE(md.find("| batch | precision | status | samples/s |"), std::string::npos) << md;
  EXPECT_EQ(md.find("| fold |"), std::string::npos);
}

TEST(ReportLayout, NumbersSortAsNumbers) {
  std::vector<json> pts;
  int seq = 0;
  for (int k : {1024, 1216, 128})  // the order a sweep file might give them in
    for (int m : {4096, 512})
      pts.push_back(
          point(seq++, "gemm", {{"m", m}, {"k", k}}, "ok", {{"tflops", m * k * 1e-6}, {"primary", "tflops"}}));
  const Document doc = build_report({run_of(pts)});
  const Chart* c = chart(*section(doc, "Workload: gemm"), "TFLOP/s vs m");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(column(c->table, "k"), (std::vector<std::string>{"128", "128", "1024", "1024", "1216", "1216"}));
  EXPECT_EQ(column(c->table, "m"), (std::vector<std::string>{"512", "4096", "512", "4096", "512", "4096"}));
  // The legend lists the lines in the same order (Vega-Lite would sort the names as text).
  const json& color = c->spec["layer"][0]["encoding"]["color"];
  EXPECT_EQ(color["sort"], json({"k=128", "k=1024", "k=1216"}));
}

TEST(ReportLayout, AChartWithNothingMeasuredIsNotDrawn) {
  ab::report::Run r = train_sweep();
  for (auto& p : r.points)
    if (p["params"]["precision"] == "bf16") p = point(p["seq"], "train", p["params"], "skipped");
  const Document doc = build_report({r});
  const Section* s = section(doc, "Workload: train");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(chart(*s, "speed-up"), nullptr);
  bool said = false;
  for (const auto& b : s->blocks)
    if (const auto* p = std::get_if<Paragraph>(&b))
      said = said || p->text.find("No precision speed-up chart") != std::string::npos;
  EXPECT_TRUE(said);
  // A workload with no measured point gets its table of every point and no empty chart.
  const Document none = build_report(
      {run_of({point(0, "copy", {{"bytes", 1024}}, "skipped"), point(1, "copy", {{"bytes", 2048}}, "skipped")})});
  const Section* copy = section(none, "Workload: copy");
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(none.chart_count(), 0u);
  ASSERT_TRUE(std::holds_alternative<Table>(copy->blocks.back()));
  EXPECT_EQ(std::get<Table>(copy->blocks.back()).rows.size(), 2u);
}

TEST(ReportLayout, SkippedPointsAreOneLineInTheAttentionTable) {
  std::vector<json> pts;
  for (int i = 0; i < 12; ++i)
    pts.push_back(point(i, "copy", {{"bytes", 1 << (10 + i)}, {"direction", "h2d"}}, "skipped"));
  pts.push_back(point(12, "stream", {{"op", "copy"}}, "oom"));
  pts.push_back(point(13, "stream", {{"op", "add"}}, "ok", {{"gbps", 10.0}}));
  const Document doc = build_report({run_of(pts)});
  const Section* s = section(doc, "Summary");
  ASSERT_NE(s, nullptr);
  const Table* t = nullptr;
  for (const auto& b : s->blocks)
    if (const auto* x = std::get_if<Table>(&b)) t = x;
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->rows.size(), 2u);  // the oom point, then the 12 skipped ones in one line
  EXPECT_EQ(t->rows[0][0].text, "stream");
  EXPECT_EQ(t->rows[0][1].text, "op=copy");  // only the axes that vary within its workload
  EXPECT_EQ(t->rows[1][0].text, "copy");
  EXPECT_EQ(t->rows[1][1].text, "12 points skipped");
  EXPECT_EQ(t->rows[1][2].badges, std::vector<std::string>{"skipped"});
  EXPECT_EQ(t->rows[1][2].text, "not on this device");
}

json loadgen(int seq, const std::string& scenario, const std::string& result, double metric,
             const std::string& metric_name) {
  json r = point(seq, "loadgen", {{"scenario", scenario}, {"sut", "null"}}, "ok", {{"samples_per_s", 1000.0}});
  r["scenario"] = {{"name", scenario},
                   {"mlperf_name", scenario == "offline" ? "Offline" : "SingleStream"},
                   {"result", result},
                   {"failed_constraints", result == "VALID" ? json::array() : json::array({"min_duration"})},
                   {"metric", {{"name", metric_name}, {"value", metric}}},
                   {"latency_s", {{"p50", 0.001}, {"p90", 0.002}, {"p99", 0.004}, {"p99_9", 0.008}}}};
  return r;
}

TEST(ReportLayout, LoadgenPointsGetAnMlperfResultsTable) {
  const Document doc =
      build_report({run_of({loadgen(0, "single-stream", "VALID", 0.0021, "latency_p90_early_stopping_s"),
                            loadgen(1, "offline", "INVALID", 45786.8, "samples_per_s")})});
  const Section* s = section(doc, "Workload: loadgen");
  ASSERT_NE(s, nullptr);
  const Table* t = nullptr;
  for (const auto& b : s->blocks)
    if (const auto* x = std::get_if<Table>(&b); x && x->caption.find("MLPerf") != std::string::npos) t = x;
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(column(*t, "MLPerf scenario"), (std::vector<std::string>{"SingleStream", "Offline"}));
  EXPECT_EQ(column(*t, "value"), (std::vector<std::string>{"2.1 ms", "45787 samples/s"}));
  EXPECT_EQ(column(*t, "p99"), (std::vector<std::string>{"4 ms", "4 ms"}));
  EXPECT_EQ(column(*t, "constraints not met"), (std::vector<std::string>{"—", "min_duration"}));
  const auto result =
      static_cast<std::size_t>(std::find(t->columns.begin(), t->columns.end(), "result") - t->columns.begin());
  EXPECT_EQ(t->rows[0][result].badges, std::vector<std::string>{"VALID"});
  EXPECT_EQ(t->rows[1][result].badges, std::vector<std::string>{"INVALID"});
  EXPECT_NE(render_markdown(doc).find("| INVALID |"), std::string::npos);
}

TEST(ReportLayout, AMergedSystemListsEveryRunsDifferingSettings) {
  ab::report::Run r = train_sweep();
  r.label = "node1";
  r.merged = {{"R2", "2026-11-30T10:00:00Z", "complete", "accelbench run train --axis batch=32", {}, 2},
              {"R1", "2026-11-29T10:00:00Z", "complete", "accelbench run train", {}, 4}};
  r.merged[0].context = {{"measurement", {{"max_noise_pct", 1.0}, {"min_time_s", 0.5}}},
                         {"host", {{"hostname", "node1"}}}};
  r.merged[1].context = {{"measurement", {{"max_noise_pct", 5.0}, {"min_time_s", 0.5}}},
                         {"host", {{"hostname", "node1"}}}};
  const Document doc = build_report({r});
  const Section* s = section(doc, "System context");
  ASSERT_NE(s, nullptr);
  const Table* t = nullptr;
  for (const auto& b : s->blocks)
    if (const auto* x = std::get_if<Table>(&b); x && x->caption.find("runs merged") != std::string::npos) t = x;
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->columns, (std::vector<std::string>{"", "R2", "R1"}));
  std::vector<std::string> names;
  for (const auto& row : t->rows) names.push_back(row[0].text);
  EXPECT_NE(std::find(names.begin(), names.end(), "command line"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "measurement.max_noise_pct"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "measurement.min_time_s"), names.end());  // the same in both
  EXPECT_EQ(std::find(names.begin(), names.end(), "host.hostname"), names.end());
  EXPECT_NE(t->caption.find("(2 other settings are the same in all of them)"), std::string::npos) << t->caption;
}

// Vega-Lite warns ("Dropping fit-y") when a step height meets width "container"; bar charts size
// themselves instead. The browser test (report_e2e_test.cpp) checks that no warning is logged.
TEST(ReportLayout, BarChartsHaveAFixedHeight) {
  const Document doc = build_report({run_of({point(0, "infer", {{"model", "a"}}, "ok", {{"samples_per_s", 10.0}}),
                                             point(1, "infer", {{"model", "b"}}, "ok", {{"samples_per_s", 20.0}}),
                                             point(2, "infer", {{"model", "c"}}, "error")})});
  const Chart* c = chart(*section(doc, "Workload: infer"), "per point");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->spec["height"], 60);
  EXPECT_EQ(c->spec["width"], "container");
  const Document cmp =
      build_comparison({run_of({point(0, "infer", {{"model", "a"}}, "ok", {{"samples_per_s", 10.0}})}, "A"),
                        run_of({point(0, "infer", {{"model", "a"}}, "ok", {{"samples_per_s", 12.0}})}, "B")});
  const Chart* ratio = nullptr;
  for (const auto& s : cmp.sections)
    if (const Chart* x = chart(s, "B/A")) ratio = x;
  ASSERT_NE(ratio, nullptr);
  EXPECT_TRUE(ratio->spec["height"].is_number_integer());
  // The page never prints the library's warnings; it counts them for the tests.
  std::string why;
  if (!html_available(&why)) GTEST_SKIP() << why;
  const std::string html = render_html(doc);
  EXPECT_NE(html.find("logger:quietLogger()"), std::string::npos);
  EXPECT_EQ(html.find("'; warnings: '"), std::string::npos);
}

}  // namespace
}  // namespace ab::report
