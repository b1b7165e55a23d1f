// End to end through the real binary: a small real run, its report opened in headless Chromium
// with networking off (every chart drawn, no error or warning on the console, a screenshot kept
// under test-output/report_e2e/), hostile names inert in the browser, and the CLI's exit codes.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "report/report.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;

using ab::test::accelbench;
using ab::test::quote;
using ab::test::Ran;
const fs::path kOutput = fs::path(AB_TEST_BINARY_DIR) / "test-output" / "report_e2e";

// `cmd` under sh, stdout and stderr together.
Ran shell(const std::string& cmd) { return ab::test::shell(cmd + " 2>&1"); }

std::string find_chromium() {
  if (const char* env = std::getenv("AB_CHROMIUM"); env && *env) return env;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const auto o = shell(std::string("command -v ") + name);
    if (o.code == 0 && !o.output.empty()) return o.output.substr(0, o.output.find('\n'));
  }
  return {};
}

// Headless, sandbox off (containers), and no network: every host resolves to nothing and every
// request goes to a closed local port.
std::string chromium(const std::string& browser, const fs::path& profile, const std::string& action, const fs::path& page) {
  return quote(browser) + " --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update"
         " --disable-sync --no-first-run --disable-extensions --proxy-server=127.0.0.1:9"
         " --host-resolver-rules='MAP * ~NOTFOUND' --user-data-dir=" + quote(profile.string()) +
         " --virtual-time-budget=15000 " + action + " " + quote("file://" + page.string());
}

struct PageStatus {
  int charts = -1, rendered = -1, errors = -1, warnings = -1, done = 0;
  std::string text;
};

PageStatus page_status(const std::string& dom) {
  PageStatus s;
  std::smatch m;
  const std::regex div(R"re(<div id="ab-status"([^>]*)>([^<]*))re");
  if (!std::regex_search(dom, m, div)) return s;
  const std::string attrs = m[1];
  s.text = m[2];
  auto attr = [&attrs](const std::string& name) {
    std::smatch a;
    return std::regex_search(attrs, a, std::regex("data-" + name + "=\"(\\d+)\"")) ? std::stoi(a[1]) : -1;
  };
  s.charts = attr("charts"), s.rendered = attr("rendered"), s.errors = attr("errors"), s.warnings = attr("warnings");
  s.done = attr("done");
  return s;
}

std::string run_id_of(const std::string& output) {
  std::smatch m;
  return std::regex_search(output, m, std::regex(R"(run (\d{8}-\d{6}-[0-9a-f]{6}):)")) ? std::string(m[1]) : std::string();
}

class ReportE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    browser_ = find_chromium();
    if (browser_.empty())
      AB_SKIP_OR_REQUIRE("browser", "chromium is not installed (apt-get install chromium; scripts/install-deps.sh does)");
    std::string why;
    if (!ab::report::html_available(&why)) AB_SKIP_OR_REQUIRE("charts", "no HTML reports in this build: " << why);
    fs::create_directories(kOutput);
  }
  std::string browser_;
};

TEST_F(ReportE2E, RealRunRendersEveryChartOffline) {
  const fs::path dir = kOutput / "real";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // What the report draws, not how steady the machine is: each point stops after its minimum time
  // whatever its spread (under the 1% rule the 16 points ran to their timeout on a loaded CI machine).
  const auto run = accelbench({"run", "stream", "--device", "cpu", "--axis", "array_bytes=1048576:8388608:x2",
                               "--min-time", "0.05", "--max-noise", "100", "--timeout", "60", "--telemetry-trace",
                               "--quiet", "--out", (dir / "store").string()});
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string id = run_id_of(run.output);
  ASSERT_FALSE(id.empty()) << run.output;
  const fs::path html = kOutput / "report.html";
  const auto rep = accelbench({"report", id, "-o", html.string(), "--out", (dir / "store").string()});
  ASSERT_EQ(rep.code, 0) << rep.output;
  const auto md = accelbench({"report", id, "--format", "md", "--out", (dir / "store").string()});
  ASSERT_EQ(md.code, 0) << md.output;
  EXPECT_NE(md.output.find("## Workload: stream"), std::string::npos);

  const auto dom = shell(chromium(browser_, dir / "profile", "--dump-dom", html));
  const PageStatus st = page_status(dom.output);
  EXPECT_EQ(st.done, 1) << "the page never finished drawing: " << st.text;
  EXPECT_GE(st.charts, 3) << "throughput, roofline and host CPU over time";
  EXPECT_EQ(st.rendered, st.charts) << st.text;
  EXPECT_EQ(st.errors, 0) << st.text;
  EXPECT_EQ(st.warnings, 0) << st.text;
  EXPECT_EQ(dom.output.find("class=\"vis failed\""), std::string::npos);

  const fs::path png = kOutput / "report.png";
  fs::remove(png);
  const auto shot = shell(chromium(browser_, dir / "profile", "--hide-scrollbars --window-size=1400,2400 --screenshot=" + quote(png.string()), html));
  ASSERT_TRUE(fs::exists(png)) << shot.output;
  EXPECT_GT(fs::file_size(png), 20000u);
}

TEST_F(ReportE2E, HostileNamesStayInertInTheBrowser) {
  const fs::path dir = kOutput / "hostile";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string csv = (dir / "evil.csv").string();
  std::ofstream(csv) << "workload,params,metric,value,unit,source\n"
                        "\"<img src=x onerror=alert(1)>\",batch=1;model=<script>alert(3)</script>,samples_per_s,10,samples/s,\"<script>alert(2)</script>\"\n"
                        "\"<img src=x onerror=alert(1)>\",batch=2;model=<script>alert(3)</script>,samples_per_s,19,samples/s,\"<script>alert(2)</script>\"\n"
                        "\"<img src=x onerror=alert(1)>\",batch=4;model=<script>alert(3)</script>,samples_per_s,35,samples/s,\"<script>alert(2)</script>\"\n";
  const std::string system = "<b>sys</b>\"'&<svg onload=alert(4)>";
  const auto imp = accelbench({"import", csv, "--system", system, "--out", (dir / "store").string()});
  ASSERT_EQ(imp.code, 0) << imp.output;
  const fs::path html = dir / "hostile.html";
  const auto rep = accelbench({"report", system, "-o", html.string(), "--out", (dir / "store").string()});
  ASSERT_EQ(rep.code, 0) << rep.output;
  const auto dom = shell(chromium(browser_, dir / "profile", "--dump-dom", html));
  const PageStatus st = page_status(dom.output);
  EXPECT_EQ(st.done, 1) << st.text;
  EXPECT_GE(st.charts, 1);
  EXPECT_EQ(st.rendered, st.charts) << st.text;
  EXPECT_EQ(st.errors, 0) << st.text;  // an alert() that ran would be counted here
  EXPECT_EQ(dom.output.find("<img src=\"x\""), std::string::npos);
  EXPECT_EQ(dom.output.find("<b>sys</b>"), std::string::npos);
  EXPECT_EQ(dom.output.find("<svg onload"), std::string::npos);
  EXPECT_NE(dom.output.find("&lt;img src=x onerror=alert(1)&gt;"), std::string::npos);
}

// Bar charts (no numeric sweep) and a comparison's ratio chart draw with no warning from the charting
// library, which the page counts in data-warnings and never shows the reader.
TEST_F(ReportE2E, BarAndCompareChartsDrawWithoutWarnings) {
  const fs::path dir = kOutput / "bars";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string store = (dir / "store").string();
  for (const auto& [sys, scale] : {std::pair<std::string, int>{"A", 1}, {"B", 2}}) {
    std::ofstream(dir / (sys + ".csv")) << "workload,params,metric,value,unit,source\n"
                                        << "w,model=a,samples_per_s," << 10 * scale << ",samples/s,s\n"
                                        << "w,model=b,samples_per_s," << 20 * scale << ",samples/s,s\n"
                                        << "w,model=c,samples_per_s,30,samples/s,s\n";
    ASSERT_EQ(accelbench({"import", (dir / (sys + ".csv")).string(), "--system", sys, "--out", store}).code, 0);
  }
  const fs::path report = dir / "bars.html", cmp = dir / "compare.html";
  ASSERT_EQ(accelbench({"report", "A", "B", "-o", report.string(), "--out", store}).code, 0);
  const auto c = accelbench({"compare", "A", "B", "--format", "html", "-o", cmp.string(), "--out", store});
  ASSERT_EQ(c.code, 0) << c.output;
  for (const fs::path& page : {report, cmp}) {
    SCOPED_TRACE(page.string());
    const auto dom = shell(chromium(browser_, dir / "profile", "--dump-dom", page));
    const PageStatus st = page_status(dom.output);
    EXPECT_EQ(st.done, 1) << st.text;
    EXPECT_GE(st.charts, 1);
    EXPECT_EQ(st.rendered, st.charts) << st.text;
    EXPECT_EQ(st.errors, 0) << st.text;
    std::smatch m;
    std::regex_search(dom.output, m, std::regex("data-warning-text=\"([^\"]*)\""));
    EXPECT_EQ(st.warnings, 0) << m[1];
    EXPECT_EQ(st.text.find("WARN"), std::string::npos) << st.text;
  }
}

// The input pipeline's chart beside training (lines, a single-count rule, a model's rule) draws with
// no warning.
TEST_F(ReportE2E, FeedChartDrawsWithoutWarnings) {
  const fs::path dir = kOutput / "feed";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string store = (dir / "store").string();
  std::ofstream(dir / "feed.csv") << "workload,params,metric,value,unit,source\n"
                                  << "pipeline,threads=1;decoder=cpu,samples_per_s,800,samples/s,s\n"
                                  << "pipeline,threads=2;decoder=cpu,samples_per_s,1500,samples/s,s\n"
                                  << "pipeline,threads=4;decoder=cpu,samples_per_s,2900,samples/s,s\n"
                                  << "pipeline,threads=1;decoder=nvjpeg,samples_per_s,9000,samples/s,s\n"
                                  << "train,model=resnet50;batch=256,samples_per_s,2560,samples/s,s\n";
  ASSERT_EQ(accelbench({"import", (dir / "feed.csv").string(), "--system", "F", "--out", store}).code, 0);
  const fs::path page = dir / "feed.html";
  ASSERT_EQ(accelbench({"report", "F", "-o", page.string(), "--out", store}).code, 0);
  const auto dom = shell(chromium(browser_, dir / "profile", "--dump-dom", page));
  const PageStatus st = page_status(dom.output);
  EXPECT_EQ(st.done, 1) << st.text;
  EXPECT_EQ(st.charts, 3) << "the two workloads' charts and the feed chart";
  EXPECT_EQ(st.rendered, st.charts) << st.text;
  EXPECT_EQ(st.errors, 0) << st.text;
  EXPECT_EQ(st.warnings, 0) << st.text;
  EXPECT_NE(dom.output.find("Input pipeline against training"), std::string::npos);
}

TEST(ReportCli, ExitCodesAndMessages) {
  const fs::path dir = kOutput / "cli";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string store = (dir / "store").string();
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    const auto r =
        accelbench({"run", "stream", "--device", "cpu", "--axis", "array_bytes=1048576", "--axis", "op=copy",
                    "--min-time", "0.02", "--max-noise", "100", "--timeout", "60", "--quiet", "--out", store});
    ASSERT_EQ(r.code, 0) << r.output;
    ids.push_back(run_id_of(r.output));
  }
  auto o = accelbench({"report", "nope", "--format", "md", "--out", store});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("newest runs: "), std::string::npos) << o.output;
  EXPECT_NE(o.output.find(ids[1]), std::string::npos) << o.output;

  std::ofstream(dir / "foreign.bin", std::ios::binary) << std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10);
  o = accelbench({"report", (dir / "foreign.bin").string(), "--format", "md"});
  EXPECT_EQ(o.code, 1) << o.output;
  EXPECT_NE(o.output.find("not an accelbench points file"), std::string::npos) << o.output;

  std::ofstream(dir / "bad.csv") << "workload,params,metric,value,unit,source\nw,batch=1,tflops,lots,TFLOP/s,paper\n";
  o = accelbench({"import", (dir / "bad.csv").string(), "--system", "X", "--out", store});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("bad.csv:2: value 'lots' is not a number"), std::string::npos) << o.output;

  o = accelbench({"compare", ids[0], "--out", store});
  EXPECT_EQ(o.code, 2) << o.output;
  o = accelbench({"compare", ids[0], ids[1], "--out", store});
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_NE(o.output.find("1 matched point(s)"), std::string::npos) << o.output;
  EXPECT_TRUE(std::regex_search(o.output, std::regex("stream +array_bytes=1048576 op=copy .*(faster|slower|same|unsure)"))) << o.output;
  o = accelbench({"compare", ids[0], ids[1], "--format", "md", "--out", store});
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_NE(o.output.find("| workload | point | A | B | B/A | verdict |"), std::string::npos) << o.output;
  o = accelbench({"compare", ids[0], ids[1], "--fail-on", "nonsense", "--out", store});
  EXPECT_EQ(o.code, 2) << o.output;

  // `results --json`: the run list and one run's records, no JSON paths to learn.
  o = ab::test::shell(quote(ab::test::accelbench_path()) + " results --json --out " + quote(store));
  ASSERT_EQ(o.code, 0) << o.output;
  const auto list = nlohmann::json::parse(o.output);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0]["run_id"], ids[1]);
  EXPECT_EQ(list[0]["points"], 1);
  o = ab::test::shell(quote(ab::test::accelbench_path()) + " results " + ids[0] + " --json --out " + quote(store));
  ASSERT_EQ(o.code, 0) << o.output;
  const auto one = nlohmann::json::parse(o.output);
  EXPECT_EQ(one["run"]["run_id"], ids[0]);
  ASSERT_EQ(one["points"].size(), 1u);
  EXPECT_EQ(one["points"][0]["workload"], "stream");
  EXPECT_EQ(accelbench({"results", "--json", "--csv", "--out", store}).code, 2);
}

// For CI: a regression against the baseline fails the job, with what regressed on standard error.
TEST(ReportCli, CompareFailOnSlowerGatesARegression) {
  const fs::path dir = kOutput / "fail_on";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string store = (dir / "store").string();
  std::ofstream(dir / "base.csv")
      << "workload,params,metric,value,unit,source\nw,batch=1,samples_per_s,100,samples/s,a\n"
         "w,batch=2,samples_per_s,200,samples/s,a\n";
  std::ofstream(dir / "new.csv") << "workload,params,metric,value,unit,source\nw,batch=1,samples_per_s,80,samples/s,b\n"
                                    "w,batch=2,samples_per_s,200,samples/s,b\n";
  ASSERT_EQ(accelbench({"import", (dir / "base.csv").string(), "--system", "base", "--out", store}).code, 0);
  ASSERT_EQ(accelbench({"import", (dir / "new.csv").string(), "--system", "new", "--out", store}).code, 0);
  auto o = accelbench({"compare", "base", "new", "--out", store});
  EXPECT_EQ(o.code, 0) << o.output;  // without --fail-on the verdicts are information
  o = accelbench({"compare", "base", "new", "--fail-on", "slower", "--out", store});
  EXPECT_EQ(o.code, 3) << o.output;
  EXPECT_NE(o.output.find("1 slower matched point(s) against the baseline (--fail-on)"), std::string::npos) << o.output;
  o = accelbench({"compare", "new", "base", "--fail-on", "slower", "--out", store});  // the other way round: faster
  EXPECT_EQ(o.code, 0) << o.output;
}

// A published figure that names only some axes matches the point the workload measures by default.
TEST(ReportCli, ImportTakesTheWorkloadsDefaultsForAxesARowLeavesOut) {
  const fs::path dir = kOutput / "import_defaults";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string store = (dir / "store").string();
  std::ofstream(dir / "pub.csv")
      << "workload,params,metric,value,unit,source\ninfer,model=resnet50;batch=8,samples_per_s,900,images/s,paper\n";
  auto o = accelbench({"import", (dir / "pub.csv").string(), "--system", "Pub", "--out", store});
  ASSERT_EQ(o.code, 0) << o.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(o.output, m, std::regex(R"(: run (\d{8}-\d{6}-[0-9a-f]{6}) in )"))) << o.output;
  o = ab::test::shell(quote(ab::test::accelbench_path()) + " results " + std::string(m[1]) + " --json --out " +
                      quote(store));
  ASSERT_EQ(o.code, 0) << o.output;
  const auto rec = nlohmann::json::parse(o.output)["points"][0];
  EXPECT_EQ(rec["params"]["model"], "resnet50");
  EXPECT_EQ(rec["params"]["batch"], 8);
  for (const char* axis : {"fold", "graph", "precision"}) {
    EXPECT_TRUE(rec["params"].contains(axis)) << axis << " in " << rec.dump();
    EXPECT_NE(std::find(rec["metrics"]["defaulted_axes"].begin(), rec["metrics"]["defaulted_axes"].end(), axis),
              rec["metrics"]["defaulted_axes"].end())
        << axis;
  }
}

}  // namespace
