// The binary as a new user meets it: mistyped commands and names answered with the nearest valid
// one, bundled suites found by name, one workload's help, $ACCELBENCH_OUT, run ids typed short or
// as `latest`, and the context a record keeps of the environment, the suite and the host's load.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "results/results.h"
#include "test_support.h"

namespace fs = std::filesystem;
namespace {

using ab::test::Ran;
using ab::test::TempDir;
using nlohmann::json;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// accelbench with `env` ("NAME=value ...", already quoted) before it, stdout and stderr together.
Ran run_with(const std::string& env, const std::vector<std::string>& args) {
  std::string cmd = env + " " + ab::test::quote(ab::test::accelbench_path());
  for (const auto& a : args) cmd += " " + ab::test::quote(a);
  return ab::test::shell(cmd + " 2>&1");
}

TEST(CliDiscovery, AMistypedCommandNamesTheNearestOne) {
  const Ran unknown = ab::test::accelbench({"frobnicate"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_TRUE(has(unknown.output, "unknown command 'frobnicate'; commands: sysinfo, list, run,")) << unknown.output;
  const Ran typo = ab::test::accelbench({"lsit"});
  EXPECT_EQ(typo.code, 2);
  EXPECT_TRUE(has(typo.output, "unknown command 'lsit'; commands: ")) << typo.output;
  EXPECT_TRUE(has(typo.output, "; did you mean 'list'?\n")) << typo.output;
  const Ran workload = ab::test::accelbench({"run", "gemn", "--device", "cpu"});
  EXPECT_EQ(workload.code, 2);
  EXPECT_TRUE(has(workload.output, "unknown workload or suite 'gemn'; valid: ceilings, gemm,")) << workload.output;
  EXPECT_TRUE(has(workload.output, "; did you mean 'gemm'?\n")) << workload.output;
  const Ran suite = ab::test::accelbench({"run", "quik"});
  EXPECT_EQ(suite.code, 2);
  EXPECT_TRUE(has(suite.output, "or a suite: ")) << suite.output;
  EXPECT_TRUE(has(suite.output, "; did you mean 'quick'?\n")) << suite.output;
  const Ran flag = ab::test::accelbench({"run", "gemm", "--max-nosie", "3"});
  EXPECT_EQ(flag.code, 2);
  EXPECT_TRUE(has(flag.output, "accelbench run: unknown option '--max-nosie'; did you mean '--max-noise'?"))
      << flag.output;
  const Ran axis = ab::test::accelbench({"run", "stream", "--device", "cpu", "--axis", "array_byte=1k"});
  EXPECT_EQ(axis.code, 2);
  EXPECT_TRUE(has(axis.output, "; did you mean 'array_bytes'?")) << axis.output;
}

TEST(CliDiscovery, ListShowsTheSuitesOrOneWorkload) {
  const Ran suites = ab::test::accelbench({"list", "suites"});
  ASSERT_EQ(suites.code, 0) << suites.output;
  EXPECT_TRUE(has(suites.output, "quick ")) << suites.output;
  EXPECT_TRUE(has(suites.output, "gemm-deepbench")) << suites.output;
  EXPECT_TRUE(has(suites.output, "`accelbench run train.yaml`: `train` is a workload")) << suites.output;
  const Ran suites_json = ab::test::accelbench({"list", "suites", "--json"});
  ASSERT_EQ(suites_json.code, 0);
  const json listed = json::parse(suites_json.output);
  ASSERT_TRUE(listed.is_array());
  EXPECT_TRUE(std::any_of(listed.begin(), listed.end(), [](const json& s) {
    return s["name"] == "quick" && fs::exists(s["path"].get<std::string>());
  })) << listed;

  const Ran gemm = ab::test::accelbench({"list", "gemm"});
  ASSERT_EQ(gemm.code, 0) << gemm.output;
  EXPECT_EQ(gemm.output.rfind("gemm\n", 0), 0u) << gemm.output;
  EXPECT_TRUE(has(gemm.output, "--axis precision")) << gemm.output;
  EXPECT_TRUE(has(gemm.output, "default ")) << gemm.output;
  EXPECT_FALSE(has(gemm.output, "\nstream\n")) << gemm.output;  // that workload alone
  const Ran gemm_json = ab::test::accelbench({"list", "gemm", "--json"});
  ASSERT_EQ(gemm_json.code, 0);
  EXPECT_EQ(json::parse(gemm_json.output)["name"], "gemm");
  const Ran typo = ab::test::accelbench({"list", "stram"});
  EXPECT_EQ(typo.code, 2);
  EXPECT_TRUE(has(typo.output, "; did you mean 'stream'?")) << typo.output;
}

// A suite in $ACCELBENCH_SUITES runs by name; $ACCELBENCH_OUT is where its records go; the record
// carries the suite's text, the result-changing environment and the host's load; a size suffix is
// stored as its number; the run is found again as `latest` and by a prefix of its id.
TEST(CliDiscovery, ASuiteRunsByNameIntoAccelbenchOutAndIsFoundAgainShort) {
  TempDir suites, out;
  const std::string suite_text =
      "name: tiny\n"
      "settings:\n  min_time: 0.02\n  max_noise: 50\n  timeout: 20\n"
      "steps:\n  - workload: stream\n    axes:\n      array_bytes: [64KiB, 16k]\n      op: triad\n";
  suites.write("tiny.yaml", suite_text);
  const std::string env = "ACCELBENCH_SUITES=" + ab::test::quote(suites.path().string()) +
                          " ACCELBENCH_OUT=" + ab::test::quote(out.path().string()) +
                          " OMP_SCHEDULE=static NCCL_ALGO=Ring UNRELATED_VARIABLE=1";
  const Ran ran = run_with(env, {"run", "tiny", "--device", "cpu"});
  ASSERT_EQ(ran.code, 0) << ran.output;
  // The summary: one table, the constant axis above it, the sizes in numeric order.
  EXPECT_TRUE(has(ran.output, "stream: op=triad\n")) << ran.output;
  const auto small = ran.output.find("   16000  ok"), large = ran.output.find("   65536  ok");
  ASSERT_NE(small, std::string::npos) << ran.output;
  ASSERT_NE(large, std::string::npos) << ran.output;
  EXPECT_LT(small, large) << ran.output;

  const auto runs = ab::results::list_runs(out.path() / "runs" / "accelbench.db");
  ASSERT_EQ(runs.size(), 1u);
  const auto read = ab::results::read_jsonl(out.path() / "runs" / runs[0].run_id / "points.jsonl");
  ASSERT_EQ(read.records.size(), 2u);
  const json& context = read.records[0]["context"];
  EXPECT_EQ(context["suite_file"]["text"], suite_text);
  EXPECT_EQ(fs::path(context["suite_file"]["path"].get<std::string>()).filename(), "tiny.yaml");
  EXPECT_EQ(context["environment"]["OMP_SCHEDULE"], "static");
  EXPECT_EQ(context["environment"]["NCCL_ALGO"], "Ring");
  EXPECT_FALSE(context["environment"].contains("UNRELATED_VARIABLE"));
  EXPECT_FALSE(context["environment"].contains("ACCELBENCH_OUT"));
  ASSERT_TRUE(context.contains("host_load")) << context;
  EXPECT_GT(context["host_load"]["cores"].get<int>(), 0);
  EXPECT_TRUE(context["host_load"]["busy"].is_boolean());
  // A shared host is said once, as a warning, exactly when the record says so.
  const bool shared = context["host_load"].contains("note");
  EXPECT_EQ(has(ran.output, "accelbench warning: the host is shared"), shared) << ran.output;
  EXPECT_EQ(read.records[0]["params"]["array_bytes"], 65536);  // 64KiB, stored as its number
  EXPECT_EQ(read.records[1]["params"]["array_bytes"], 16000);  // 16k: SI

  const std::string out_env = "ACCELBENCH_OUT=" + ab::test::quote(out.path().string());
  const Ran latest = run_with(out_env, {"results", "latest"});
  ASSERT_EQ(latest.code, 0) << latest.output;
  EXPECT_TRUE(has(latest.output, "stream: op=triad\n")) << latest.output;
  const Ran prefix = run_with(out_env, {"results", runs[0].run_id.substr(0, 10)});
  ASSERT_EQ(prefix.code, 0) << prefix.output;
  EXPECT_EQ(prefix.output, latest.output);
  const Ran md = run_with(out_env, {"report", "latest", "--format", "md"});
  EXPECT_EQ(md.code, 0) << md.output;
  EXPECT_TRUE(has(md.output, runs[0].run_id)) << md.output;
  const Ran by_file_name = run_with(out_env + " ACCELBENCH_SUITES=" + ab::test::quote(suites.path().string()),
                                    {"run", "tiny.yaml", "--device", "cpu", "--quiet"});
  EXPECT_EQ(by_file_name.code, 0) << by_file_name.output;
  const Ran ambiguous = run_with(out_env, {"results", runs[0].run_id.substr(0, 4)});
  EXPECT_EQ(ambiguous.code, 2);
  EXPECT_TRUE(has(ambiguous.output, "matches 2 runs")) << ambiguous.output;
}

}  // namespace
