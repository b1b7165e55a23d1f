// Tests for src/workloads: value lists and ranges, sweeps (cartesian and zipped), suite files and
// their error positions, the runner's statuses, records, rates and ceilings, and the real gemm and
// stream workloads on the CPU backend.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.h"
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "harness/axes.h"
#include "harness/runner.h"
#include "harness/suite.h"
#include "harness/workload.h"
#include "measure/measure.h"
#include "report/report.h"
#include "results/derived.h"
#include "workloads/registry.h"

namespace ab::workloads {
using namespace ab::harness;
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Strings = std::vector<std::string>;


bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------
// Value lists and ranges

TEST(ExpandValues, Lists) {
  EXPECT_EQ(expand_values("1,2,8", AxisKind::integer), (Strings{"1", "2", "8"}));
  EXPECT_EQ(expand_values(" 1 , 2 ", AxisKind::integer), (Strings{"1", "2"}));
  EXPECT_EQ(expand_values("42", AxisKind::integer), (Strings{"42"}));
  EXPECT_EQ(expand_values("fp32,bf16", AxisKind::text), (Strings{"fp32", "bf16"}));
  EXPECT_EQ(expand_values("0.5,1e-3", AxisKind::real), (Strings{"0.5", "1e-3"}));
  // Only integer axes have ranges; a colon in text is just text.
  EXPECT_EQ(expand_values("a:b", AxisKind::text), (Strings{"a:b"}));
}

TEST(ExpandValues, Ranges) {
  EXPECT_EQ(expand_values("1:256:pow2", AxisKind::integer),
            (Strings{"1", "2", "4", "8", "16", "32", "64", "128", "256"}));
  EXPECT_EQ(expand_values("1:200:pow2", AxisKind::integer),
            (Strings{"1", "2", "4", "8", "16", "32", "64", "128"}));
  EXPECT_EQ(expand_values("1:10", AxisKind::integer),
            (Strings{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10"}));
  EXPECT_EQ(expand_values("0:100:+25", AxisKind::integer), (Strings{"0", "25", "50", "75", "100"}));
  EXPECT_EQ(expand_values("0:99:+25", AxisKind::integer), (Strings{"0", "25", "50", "75"}));
  EXPECT_EQ(expand_values("0:10:3", AxisKind::integer), (Strings{"0", "3", "6", "9"}));
  EXPECT_EQ(expand_values("3:100:*3", AxisKind::integer), (Strings{"3", "9", "27", "81"}));
  EXPECT_EQ(expand_values("2:16:x2", AxisKind::integer), (Strings{"2", "4", "8", "16"}));
  EXPECT_EQ(expand_values("-4:4:+4", AxisKind::integer), (Strings{"-4", "0", "4"}));
  EXPECT_EQ(expand_values("5:5", AxisKind::integer), (Strings{"5"}));
  EXPECT_EQ(expand_values("1,4:16:pow2,100", AxisKind::integer), (Strings{"1", "4", "8", "16", "100"}));
}

TEST(ExpandValues, RangesNearTheLimitsTerminate) {
  const auto pow2 = expand_values("1:9223372036854775807:pow2", AxisKind::integer);
  ASSERT_EQ(pow2.size(), 63u);
  EXPECT_EQ(pow2.back(), "4611686018427387904");
  EXPECT_EQ(expand_values("9223372036854775806:9223372036854775807", AxisKind::integer),
            (Strings{"9223372036854775806", "9223372036854775807"}));
  EXPECT_TRUE(contains(ab::test::usage_error([] { expand_values("1:1000000", AxisKind::integer); }), "too many"));
}

TEST(ExpandValues, MalformedAndEmptyRanges) {
  for (const char* bad : {"1:2:3:4", "a:10", "1:b", "1:", ":5", "1:10:+0", "1:10:0", "1:10:-1", "1:10:*1",
                          "0:10:pow2", "1:10:foo", "1:10:*", "1:10:+", "1.5:4"}) {
    const std::string msg = ab::test::usage_error([&] { expand_values(bad, AxisKind::integer); });
    EXPECT_FALSE(msg.empty()) << bad;
  }
  EXPECT_TRUE(contains(ab::test::usage_error([] { expand_values("10:1", AxisKind::integer); }), "10:1"));
  EXPECT_TRUE(contains(ab::test::usage_error([] { expand_values("256:1:pow2", AxisKind::integer); }), "empty range"));
  for (const char* empty : {"1,,2", "1,", ",1", " ", " , "})
    EXPECT_FALSE(ab::test::usage_error([&] { expand_values(empty, AxisKind::integer); }).empty()) << "'" << empty << "'";
}

TEST(ParseAxisArgument, NamesAndValues) {
  const AxisOverride z = parse_axis_argument("m,n,k=4096");
  EXPECT_EQ(z.names, (Strings{"m", "n", "k"}));
  EXPECT_EQ(z.values, "4096");
  const AxisOverride b = parse_axis_argument("batch=1:256:pow2");
  EXPECT_EQ(b.names, (Strings{"batch"}));
  EXPECT_EQ(b.values, "1:256:pow2");
  const AxisOverride t = parse_axis_argument(" m , n =1x2");
  EXPECT_EQ(t.names, (Strings{"m", "n"}));
  EXPECT_EQ(t.values, "1x2");
  EXPECT_EQ(parse_axis_argument("a=b=c").values, "b=c");
  for (const char* bad : {"batch", "=5", "batch=", "m,,n=3", ",m=3", "m,=3"})
    EXPECT_FALSE(ab::test::usage_error([&] { parse_axis_argument(bad); }).empty()) << bad;
  EXPECT_TRUE(contains(ab::test::usage_error([] { parse_axis_argument("batch"); }), "name=values"));
}

// ---------------------------------------------------------------------------------------------
// Sweeps

std::vector<AxisSpec> test_axes() {
  return {{"precision", AxisKind::text, {"fp32", "bf16"}, {"fp32", "bf16", "fp16"}, "operand type"},
          {"m", AxisKind::integer, {"128", "256"}, {}, ""},
          {"n", AxisKind::integer, {"128", "256"}, {}, ""},
          {"k", AxisKind::integer, {"64", "512"}, {}, ""},
          {"trans", AxisKind::text, {"auto", "NT"}, {"auto", "NN", "NT", "TN", "TT"}, ""},
          {"batch", AxisKind::integer, {"1", "2", "4"}, {}, ""},
          {"alpha", AxisKind::real, {"0.5"}, {}, ""}};
}

std::vector<ZipGroup> test_groups() {
  return {{{"m", "n", "k", "trans"}, {{"small", {{"1", "2", "3", "TN"}, {"4", "5", "6", "NT"}}}}}};
}

std::vector<Point> sweep(const std::vector<std::string>& args) {
  std::vector<AxisOverride> overrides;
  for (const auto& a : args) overrides.push_back(parse_axis_argument(a));
  return build_sweep(test_axes(), test_groups(), overrides);
}

// The zipped m, n, k, trans of each point, as "MxNxKxT".
Strings mnkt(const std::vector<Point>& points) {
  Strings out;
  for (const auto& p : points) out.push_back(p.at("m") + "x" + p.at("n") + "x" + p.at("k") + "x" + p.at("trans"));
  return out;
}

TEST(BuildSweep, DefaultsAreTheCartesianProductLastAxisFastest) {
  const auto points = sweep({});
  // precision (2) x zipped m,n,k,trans (2 rows) x batch (3) x alpha (1)
  ASSERT_EQ(points.size(), 12u);
  const Strings precisions{"fp32", "bf16"};
  const Strings rows{"128x128x64xauto", "256x256x512xNT"};
  const Strings batches{"1", "2", "4"};
  for (std::size_t i = 0; i < points.size(); ++i) {
    SCOPED_TRACE(points[i].label());
    EXPECT_EQ(points[i].at("precision"), precisions[i / 6]);
    EXPECT_EQ(mnkt({points[i]})[0], rows[(i / 3) % 2]);
    EXPECT_EQ(points[i].at("batch"), batches[i % 3]);
    EXPECT_EQ(points[i].at("alpha"), "0.5");
    // Values keep the declaration order.
    ASSERT_EQ(points[i].values.size(), 7u);
    const Strings order{"precision", "m", "n", "k", "trans", "batch", "alpha"};
    for (std::size_t j = 0; j < order.size(); ++j) EXPECT_EQ(points[i].values[j].first, order[j]);
  }
  EXPECT_EQ(points[0].label(), "precision=fp32 m=128 n=128 k=64 trans=auto batch=1 alpha=0.5");
}

TEST(BuildSweep, OverridesReplaceValues) {
  const auto points = sweep({"precision=fp16", "batch=8,16"});
  ASSERT_EQ(points.size(), 4u);  // 1 x 2 x 2
  EXPECT_EQ(points[0].at("precision"), "fp16");
  EXPECT_EQ(points[0].at("batch"), "8");
  EXPECT_EQ(points[1].at("batch"), "16");
  EXPECT_EQ(points[2].at("m"), "256");
  EXPECT_EQ(sweep({"batch=1:64:pow2"}).size(), 2u * 2u * 7u);
  // A later override of the same axis wins.
  const auto twice = sweep({"batch=1,2", "batch=32"});
  ASSERT_EQ(twice.size(), 4u);
  for (const auto& p : twice) EXPECT_EQ(p.at("batch"), "32");
}

TEST(BuildSweep, ZippedGroupWithOneValue) {
  const auto points = sweep({"m,n,k=4096", "precision=fp32", "batch=1"});
  ASSERT_EQ(points.size(), 1u);
  // trans was not named: it takes its first default.
  EXPECT_EQ(mnkt(points), (Strings{"4096x4096x4096xauto"}));
}

TEST(BuildSweep, ZippedGroupRowsJoinedByX) {
  const auto points = sweep({"m,n,k=1024x512x256,4096", "precision=bf16", "batch=2"});
  EXPECT_EQ(mnkt(points), (Strings{"1024x512x256xauto", "4096x4096x4096xauto"}));
  EXPECT_EQ(mnkt(sweep({"m,n,k,trans=64x32x16xTT", "precision=bf16", "batch=2"})), (Strings{"64x32x16xTT"}));
  // Names in any order: values follow the names given, not the group's order.
  EXPECT_EQ(mnkt(sweep({"n,m=10x20", "precision=bf16", "batch=2"})), (Strings{"20x10x64xauto"}));
}

TEST(BuildSweep, ZippedGroupFromTable) {
  EXPECT_EQ(mnkt(sweep({"m,n,k=@small", "precision=bf16", "batch=2"})), (Strings{"1x2x3xTN", "4x5x6xNT"}));
  EXPECT_EQ(mnkt(sweep({"m,n,k=@small,32", "precision=bf16", "batch=2"})),
            (Strings{"1x2x3xTN", "4x5x6xNT", "32x32x32xauto"}));
  const std::string msg = ab::test::usage_error([] { sweep({"m,n,k=@nope"}); });
  EXPECT_TRUE(contains(msg, "@nope")) << msg;
  EXPECT_TRUE(contains(msg, "@small")) << msg;
}

TEST(BuildSweep, SingleColumnOfAGroup) {
  // Replaces that column in every default row; product over the values.
  EXPECT_EQ(mnkt(sweep({"m=8,16", "precision=bf16", "batch=2"})),
            (Strings{"8x128x64xauto", "8x256x512xNT", "16x128x64xauto", "16x256x512xNT"}));
  EXPECT_EQ(sweep({"m=1:4:pow2", "precision=bf16", "batch=2"}).size(), 6u);
  // Every range step works on a single column, "x2" included (its 'x' is not a row separator).
  EXPECT_EQ(mnkt(sweep({"m,n=7", "k=16:32:x2", "precision=bf16", "batch=2"})), (Strings{"7x7x16xauto", "7x7x32xauto"}));
  EXPECT_FALSE(ab::test::usage_error([] { sweep({"m=4x5"}); }).empty());
  EXPECT_EQ(mnkt(sweep({"trans=TT", "precision=bf16", "batch=2"})), (Strings{"128x128x64xTT", "256x256x512xTT"}));
  // After a zipped override, a column override applies to the new rows.
  EXPECT_EQ(mnkt(sweep({"m,n,k=4096", "trans=NN,TN", "precision=bf16", "batch=2"})),
            (Strings{"4096x4096x4096xNN", "4096x4096x4096xTN"}));
}

TEST(BuildSweep, UnknownAxisListsValidNames) {
  const std::string msg = ab::test::usage_error([] { sweep({"foo=1"}); });
  EXPECT_TRUE(contains(msg, "'foo'")) << msg;
  EXPECT_TRUE(contains(msg, "precision, m, n, k, trans, batch, alpha")) << msg;
  EXPECT_TRUE(contains(ab::test::usage_error([] { sweep({"m,q,k=1"}); }), "'q'"));
}

TEST(BuildSweep, BadChoiceListsChoices) {
  const std::string msg = ab::test::usage_error([] { sweep({"precision=fp64"}); });
  EXPECT_TRUE(contains(msg, "fp64")) << msg;
  EXPECT_TRUE(contains(msg, "fp32, bf16, fp16")) << msg;
  const std::string t = ab::test::usage_error([] { sweep({"m,n,k,trans=1x2x3xXY"}); });
  EXPECT_TRUE(contains(t, "auto, NN, NT, TN, TT")) << t;
}

TEST(BuildSweep, MalformedNumbers) {
  EXPECT_TRUE(contains(ab::test::usage_error([] { sweep({"batch=abc"}); }), "abc"));
  EXPECT_FALSE(ab::test::usage_error([] { sweep({"batch=1.5"}); }).empty());
  EXPECT_FALSE(ab::test::usage_error([] { sweep({"m,n,k=12.5"}); }).empty());
  EXPECT_FALSE(ab::test::usage_error([] { sweep({"m,n,k=1x2"}); }).empty());  // two fields for three names
  EXPECT_FALSE(ab::test::usage_error([] { sweep({"alpha=abc"}); }).empty());
  EXPECT_FALSE(ab::test::usage_error([] { sweep({"alpha=inf"}); }).empty());
  EXPECT_EQ(sweep({"alpha=0.25,1e-3"}).size(), 2u * 2u * 3u * 2u);
}

TEST(BuildSweep, EmptyValueListIsAnError) {
  EXPECT_TRUE(contains(ab::test::usage_error([] { build_sweep(test_axes(), test_groups(), {{{"batch"}, ""}}); }), "batch"));
  EXPECT_FALSE(ab::test::usage_error([] { build_sweep(test_axes(), test_groups(), {{{"m", "n"}, ""}}); }).empty());
}

TEST(BuildSweep, OnlyDeclaredGroupsZip) {
  EXPECT_FALSE(ab::test::usage_error([] { sweep({"precision,batch=1"}); }).empty());
  EXPECT_FALSE(ab::test::usage_error([] { sweep({"m,batch=1x2"}); }).empty());
}

TEST(BuildSweep, PointAccess) {
  const auto points = sweep({});
  EXPECT_THROW((void)points[0].at("nope"), Error);
}

// ---------------------------------------------------------------------------------------------
// Suite files

class SuiteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("ab_workloads_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path write(const std::string& name, const std::string& text) const {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }
  // Loads `text` as a suite and expects a UsageError at `line` whose message holds every `parts`.
  void expect_error_at(const std::string& text, int line, const Strings& parts) const {
    const fs::path p = write("bad.yaml", text);
    const std::string msg = ab::test::usage_error([&] { load_suite(p, registry()); });
    const std::string where = p.string() + ":" + std::to_string(line) + ":";
    EXPECT_EQ(msg.rfind(where, 0), 0u) << "expected '" << where << "' at the start of: " << msg;
    for (const auto& part : parts) EXPECT_TRUE(contains(msg, part)) << "'" << part << "' missing from: " << msg;
  }
  fs::path dir_;
};

TEST_F(SuiteTest, ValidSuite) {
  const fs::path p = write("mini.yaml",
                           "# a test suite\n"                 // 1
                           "name: mini\n"                     // 2
                           "description: a small suite\n"     // 3
                           "settings:\n"                      // 4
                           "  min_time: 0.2\n"                // 5
                           "  max_noise: 2\n"                 // 6
                           "  timeout: 30\n"                  // 7
                           "  mode: cold\n"                   // 8
                           "  warmup: 2\n"                    // 9
                           "steps:\n"                         // 10
                           "  - workload: gemm\n"             // 11
                           "    axes:\n"                      // 12
                           "      precision: fp32\n"          // 13
                           "      m,n,k: [256, 512x256x128]\n"  // 14
                           "  - workload: stream\n"           // 15
                           "    axes:\n"                      // 16
                           "      op: [copy, triad]\n"        // 17
                           "      array_bytes: 1048576\n"     // 18
                           "  - workload: ceilings\n");       // 19
  const Suite s = load_suite(p, registry());
  EXPECT_EQ(s.name, "mini");
  EXPECT_EQ(s.description, "a small suite");
  ASSERT_TRUE(s.min_time_s && s.max_noise_pct && s.timeout_s && s.warmup_s && s.mode);
  EXPECT_DOUBLE_EQ(*s.min_time_s, 0.2);
  EXPECT_DOUBLE_EQ(*s.max_noise_pct, 2.0);
  EXPECT_DOUBLE_EQ(*s.timeout_s, 30.0);
  EXPECT_DOUBLE_EQ(*s.warmup_s, 2.0);
  EXPECT_EQ(*s.mode, "cold");
  ASSERT_EQ(s.steps.size(), 3u);
  EXPECT_EQ(s.steps[0].workload, "gemm");
  EXPECT_EQ(s.steps[0].line, 11);
  ASSERT_EQ(s.steps[0].overrides.size(), 2u);
  EXPECT_EQ(s.steps[0].overrides[0].names, (Strings{"precision"}));
  EXPECT_EQ(s.steps[0].overrides[0].values, "fp32");
  EXPECT_EQ(s.steps[0].overrides[1].names, (Strings{"m", "n", "k"}));
  EXPECT_EQ(s.steps[0].overrides[1].values, "256,512x256x128");
  EXPECT_EQ(s.steps[1].workload, "stream");
  EXPECT_EQ(s.steps[1].line, 15);
  ASSERT_EQ(s.steps[1].overrides.size(), 2u);
  EXPECT_EQ(s.steps[1].overrides[0].values, "copy,triad");
  EXPECT_EQ(s.steps[1].overrides[1].names, (Strings{"array_bytes"}));
  EXPECT_EQ(s.steps[1].overrides[1].values, "1048576");
  EXPECT_EQ(s.steps[2].workload, "ceilings");
  EXPECT_TRUE(s.steps[2].overrides.empty());
  // The overrides build the sweep the suite asks for.
  const auto plan = plan_for(find_workload("gemm"), "cpu", s.steps[0].overrides);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[1].point.at("n"), "256");
}

TEST_F(SuiteTest, NameDefaultsToTheFileStemAndSettingsAreOptional) {
  const Suite s = load_suite(write("nightly.yml", "steps:\n  - workload: stream\n"), registry());
  EXPECT_EQ(s.name, "nightly");
  EXPECT_FALSE(s.min_time_s.has_value());
  EXPECT_FALSE(s.mode.has_value());
  ASSERT_EQ(s.steps.size(), 1u);
  EXPECT_EQ(s.steps[0].line, 2);
}

TEST_F(SuiteTest, MalformedYamlNamesFileAndLine) {
  expect_error_at("name: x\n"
                  "steps:\n"
                  "  - workload: gemm\n"
                  "   bad: indent\n",
                  4, {});
  expect_error_at("name: x\n"
                  "settings:\n"
                  "  min_time: 1\n"
                  "    timeout: 2\n"
                  "steps: []\n",
                  4, {});
  expect_error_at("name: x\n\tsteps:\n", 2, {"tab"});
}

TEST_F(SuiteTest, UnknownWorkloadNamesLineAndListsWorkloads) {
  expect_error_at("name: x\n"
                  "steps:\n"
                  "  - workload: gemm\n"
                  "  - workload: stream\n"
                  "  - workload: nope\n",
                  5, {"unknown workload 'nope'", "gemm", "stream", "copy", "ceilings"});
}

TEST_F(SuiteTest, UnknownAxis) {
  expect_error_at("name: x\n"
                  "steps:\n"
                  "  - workload: gemm\n"
                  "    axes:\n"
                  "      precision: fp32\n"
                  "      bogus: 3\n",
                  6, {"unknown axis 'bogus'", "precision, m, n, k, trans"});
}

TEST_F(SuiteTest, BadAxisValues) {
  expect_error_at("steps:\n"
                  "  - workload: gemm\n"
                  "    axes:\n"
                  "      precision: [fp32, fp64]\n",
                  4, {"fp64", "bf16"});
  expect_error_at("steps:\n"
                  "  - workload: stream\n"
                  "    axes:\n"
                  "      op: copy\n"
                  "      array_bytes: lots\n",
                  5, {"lots"});
  expect_error_at("steps:\n"
                  "  - workload: gemm\n"
                  "    axes:\n"
                  "      m,n,k: 1:4:wrong\n",
                  4, {"1:4:wrong"});
}

TEST_F(SuiteTest, UnknownKeys) {
  expect_error_at("name: x\n"
                  "stepz: []\n"
                  "steps:\n"
                  "  - workload: gemm\n",
                  2, {"unknown key 'stepz'", "name, description, settings, steps"});
  expect_error_at("name: x\n"
                  "settings:\n"
                  "  min_time: 1\n"
                  "  min_tim: 1\n"
                  "steps:\n"
                  "  - workload: gemm\n",
                  4, {"unknown setting 'min_tim'", "min_time"});
  expect_error_at("name: x\n"
                  "steps:\n"
                  "  - workload: gemm\n"
                  "    axis:\n"
                  "      m: 1\n",
                  4, {"unknown step key 'axis'"});
}

// A step's `options:` block: one value per option, checked against the workload's declarations
// when the suite loads, errors at the option's line.
TEST_F(SuiteTest, StepOptionsAreCheckedAtTheirLine) {
  const Suite s = load_suite(write("opts.yaml",
                                   "steps:\n"                        // 1
                                   "  - workload: train\n"           // 2
                                   "    options:\n"                  // 3
                                   "      trajectory_steps: 3\n"     // 4
                                   "      comm_mean: kernel\n"),     // 5
                             registry());
  ASSERT_EQ(s.steps.size(), 1u);
  EXPECT_EQ(s.steps[0].options, (OptionValues{{"comm_mean", "kernel"}, {"trajectory_steps", "3"}}));
  expect_error_at("steps:\n"
                  "  - workload: train\n"
                  "    options:\n"
                  "      trajectory_steps: 3\n"
                  "      comm_ctas: 8\n",
                  5, {"train has no option 'comm_ctas'", "valid: lr, trajectory_steps"});
  expect_error_at("steps:\n"
                  "  - workload: train\n"
                  "    options:\n"
                  "      trajectory_steps: three\n",
                  4, {"'three' is not an integer (option trajectory_steps)"});
  expect_error_at("steps:\n"
                  "  - workload: train\n"
                  "    options:\n"
                  "      lr: [0.1, 0.2]\n",
                  4, {"option 'lr' takes one value"});
  expect_error_at("steps:\n"
                  "  - workload: gemm\n"
                  "    options: {trajectory_steps: 3}\n",
                  3, {"gemm has no option 'trajectory_steps'", "valid: none"});
  expect_error_at("steps:\n"
                  "  - workload: train\n"
                  "    options: [trajectory_steps]\n",
                  3, {"'options' must be a mapping"});
}

TEST_F(SuiteTest, StructuralErrors) {
  expect_error_at("name: x\n"
                  "settings:\n"
                  "  timeout: soon\n"
                  "steps:\n"
                  "  - workload: gemm\n",
                  3, {"timeout", "number"});
  expect_error_at("name: x\nsteps: []\n", 1, {"steps"});
  expect_error_at("name: x\n"
                  "steps:\n"
                  "  - axes: {m: 1}\n",
                  3, {"workload"});
  expect_error_at("- just\n- a list\n", 1, {"mapping"});
  const std::string msg = ab::test::usage_error([&] { load_suite(dir_ / "missing.yaml", registry()); });
  EXPECT_TRUE(contains(msg, "missing.yaml")) << msg;
}

TEST_F(SuiteTest, LooksLikeSuite) {
  EXPECT_TRUE(looks_like_suite("quick.yaml"));
  EXPECT_TRUE(looks_like_suite("dir/quick.yml"));
  EXPECT_FALSE(looks_like_suite("gemm"));
  EXPECT_FALSE(looks_like_suite("quick.yaml.bak"));
}

TEST(RepoSuites, LoadAndPlanOnBothDeviceKinds) {
  const fs::path dir = fs::path(AB_SOURCE_DIR) / "suites";
  std::vector<fs::path> files;
  if (fs::is_directory(dir))
    for (const auto& e : fs::recursive_directory_iterator(dir))  // experiments/ included
      if (looks_like_suite(e.path().string())) files.push_back(e.path());
  if (files.empty()) GTEST_SKIP() << "no suites in " << dir;
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    Suite s;
    ASSERT_NO_THROW(s = load_suite(f, registry()));
    EXPECT_FALSE(s.name.empty());
    ASSERT_FALSE(s.steps.empty());
    for (const auto& step : s.steps) {
      EXPECT_GT(step.line, 0);
      for (const char* kind : {"cpu", "cuda"})
        EXPECT_FALSE(plan_for(find_workload(step.workload), kind, step.overrides).empty()) << step.workload;
    }
    if (s.mode) {
      EXPECT_NO_THROW(measure::parse_timing_mode(*s.mode));
    }
    if (s.warmup_s) {  // `run` refuses a warm-up of half the timeout or more
      EXPECT_LT(*s.warmup_s, s.timeout_s.value_or(measure::Settings{}.timeout_s) * measure::kMaxWarmupShare);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Registry

TEST(Registry, FindWorkload) {
  for (const char* n : {"gemm", "stream", "copy", "ceilings"}) EXPECT_EQ(find_workload(n).name(), n);
  const std::string msg = ab::test::usage_error([] { find_workload("gemmm"); });
  EXPECT_TRUE(contains(msg, "gemmm")) << msg;
  EXPECT_TRUE(contains(msg, "gemm, stream") || contains(msg, "stream")) << msg;
  for (const auto& w : registry().all()) {
    EXPECT_FALSE(w->description().empty()) << w->name();
    for (const char* kind : {"cpu", "cuda"}) EXPECT_FALSE(plan_for(*w, kind, {}).empty()) << w->name();
  }
}

// ---------------------------------------------------------------------------------------------
// Runner

// An IterationTimer that reports `*per_iteration_s` for every iteration and runs the body once.
class ScriptedTimer final : public measure::IterationTimer {
 public:
  explicit ScriptedTimer(const double* per_iteration_s) : per_iteration_s_(per_iteration_s) {}
  double time_batch(const std::function<void()>& iteration, std::int64_t count) override {
    iteration();
    return *per_iteration_s_ * static_cast<double>(count);
  }
  double time_cold(const std::function<void()>& iteration) override {
    iteration();
    return *per_iteration_s_;
  }

 private:
  const double* per_iteration_s_;
};

// The CPU backend with a scripted clock, so rates and ceilings are exact.
class ScriptedClockBackend final : public backend::Backend {
 public:
  ScriptedClockBackend() : cpu_(backend::make_backend("cpu")) {}
  const backend::DeviceInfo& info() const override { return device ? *device : cpu_->info(); }
  std::unique_ptr<measure::IterationTimer> make_timer() override {
    return std::make_unique<ScriptedTimer>(&per_iteration_s);
  }
  void synchronize() override { cpu_->synchronize(); }
  std::unique_ptr<backend::GemmPlan> make_gemm(const backend::GemmDesc& d) override { return cpu_->make_gemm(d); }
  std::unique_ptr<backend::StreamPlan> make_stream(backend::StreamOp op, std::int64_t n) override {
    return cpu_->make_stream(op, n);
  }
  std::unique_ptr<backend::CopyPlan> make_copy(backend::CopyKind k, backend::HostMemory h, std::int64_t b) override {
    return cpu_->make_copy(k, h, b);
  }
  double per_iteration_s = 0x1.0p-10;
  std::optional<backend::DeviceInfo> device;  // another device's identity (its datasheet limits)

 private:
  std::unique_ptr<backend::Backend> cpu_;
};

// A workload that is not in the registry: each value of `case` exercises one outcome.
class FakeWorkload final : public Workload {
 public:
  std::string name() const override { return "fake"; }
  std::string description() const override { return "test double"; }
  std::vector<AxisSpec> axes(const std::string&) const override {
    const Strings all{"skip", "oom", "bad_check", "unsupported", "ok", "nothing", "usage", "throw", "cancel"};
    return {{"case", AxisKind::text, {"skip", "oom", "bad_check", "unsupported", "ok"}, all, "outcome"},
            {"size", AxisKind::integer, {"3"}, {}, "an integer axis"}};
  }
  void run(State& state) override {
    const std::string c = state.get_text("case");
    seen.push_back(c);
    if (c == "skip") state.skip("not for this point");
    if (c == "oom") throw OutOfMemory("device full");
    if (c == "bad_check") state.check(0.5, 1e-3, "fake check");
    if (c == "unsupported") throw Unsupported("no such precision here");
    if (c == "usage") throw UsageError("bad size for fake");
    if (c == "throw") throw std::runtime_error("something broke");
    if (c == "nothing") return;
    if (c == "cancel" && cancel != nullptr) *cancel = true;
    // ok (and cancel): a real, checked, measured point.
    state.set_counts({4.0, 1e6, 2e6});
    state.check(1e-9, 1e-6, "fake result");
    state.add_metric("size_seen", state.get_int("size"));
    state.exec([this] {
      double s = 0;
      for (int i = 1; i < 500; ++i) s += std::sqrt(static_cast<double>(i));
      sink = s;
      ++iterations;
    });
  }
  Strings seen;
  std::atomic<bool>* cancel = nullptr;
  volatile double sink = 0;
  std::int64_t iterations = 0;
};

measure::Settings fast_settings() {
  measure::Settings s;
  s.min_time_s = 0.01;
  s.warmup_s = 0;
  s.timeout_s = 2;
  s.max_noise_pct = 5;
  s.target_sample_s = 1e-3;
  return s;
}

struct Captured {
  std::vector<json> records;
  RunnerHooks hooks() {
    RunnerHooks h;
    h.sink = [this](const json& r) { records.push_back(r); };
    return h;
  }
};

TEST(Runner, StatusesReasonsAndRecordsInOrder) {
  auto be = backend::make_backend("cpu");
  FakeWorkload fake;
  Captured cap;
  std::ostringstream progress;
  Runner runner(*be, fast_settings(), json{{"host", "testhost"}}, "run-1", cap.hooks(), &progress);
  const auto plan = plan_for(fake, "cpu", {});
  ASSERT_EQ(plan.size(), 5u);
  const std::atomic<bool> cancel{false};
  const RunTotals totals = runner.run(plan, cancel);

  EXPECT_FALSE(totals.interrupted);
  EXPECT_EQ(fake.seen, (Strings{"skip", "oom", "bad_check", "unsupported", "ok"})) << "the sweep goes on";
  ASSERT_EQ(cap.records.size(), 5u);
  const Strings statuses{"skipped", "oom", "error", "skipped", "ok"};
  for (std::size_t i = 0; i < cap.records.size(); ++i) {
    const json& r = cap.records[i];
    SCOPED_TRACE(r.dump());
    EXPECT_EQ(r["seq"], static_cast<int>(i));
    EXPECT_EQ(r["status"], statuses[i]);
    EXPECT_EQ(r["run_id"], "run-1");
    EXPECT_EQ(r["workload"], "fake");
    EXPECT_EQ(r["device"], "cpu");
    EXPECT_EQ(r["schema_version"], 1);
    EXPECT_EQ(r["context"], (json{{"host", "testhost"}}));
    EXPECT_TRUE(r.contains("started_at"));
    EXPECT_GE(r["wall_s"].get<double>(), 0.0);
    // Numbers stay numbers.
    EXPECT_TRUE(r["params"]["size"].is_number_integer());
    EXPECT_EQ(r["params"]["size"], 3);
    EXPECT_EQ(r["params"]["case"], fake.seen[i]);
  }
  EXPECT_EQ(cap.records[0]["reason"], "not for this point");
  EXPECT_TRUE(contains(cap.records[1]["reason"], "device full"));
  EXPECT_TRUE(contains(cap.records[2]["reason"], "fake check"));
  EXPECT_EQ(cap.records[2]["check"]["passed"], false);
  EXPECT_DOUBLE_EQ(cap.records[2]["check"]["rel_error"].get<double>(), 0.5);
  EXPECT_TRUE(contains(cap.records[3]["reason"], "no such precision here"));
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_FALSE(cap.records[i].contains("time")) << i;
    EXPECT_FALSE(cap.records[i].contains("rates")) << i;
  }

  const json& ok = cap.records[4];
  EXPECT_FALSE(ok.contains("reason"));
  EXPECT_EQ(ok["check"]["passed"], true);
  EXPECT_EQ(ok["metrics"]["size_seen"], 3);
  EXPECT_EQ(ok["counts"]["samples"], 4.0);
  EXPECT_EQ(ok["counts"]["flops"], 1e6);
  ASSERT_TRUE(ok.contains("time"));
  const json& t = ok["time"];
  const double median = t["median_s"];
  EXPECT_GT(median, 0.0);
  for (const char* key : {"mean_s", "min_s", "max_s", "p90_s", "p99_s", "q1_s", "q3_s", "iqr_s", "stddev_s",
                          "rel_spread", "measured_s", "iterations_per_sample", "total_iterations", "converged",
                          "stop_reason", "mode", "count"})
    EXPECT_TRUE(t.contains(key)) << key;
  EXPECT_EQ(t["mode"], "batch");
  EXPECT_LE(t["min_s"].get<double>(), median);
  EXPECT_GE(t["max_s"].get<double>(), median);
  ASSERT_TRUE(t["samples_s"].is_array());
  EXPECT_EQ(t["samples_s"].size(), t["count"].get<std::size_t>());
  EXPECT_GE(t["count"].get<std::size_t>(), 10u);
  EXPECT_GE(fake.iterations, t["total_iterations"].get<std::int64_t>());
  ASSERT_TRUE(ok.contains("rates"));
  const json& rates = ok["rates"];
  EXPECT_NEAR(rates["samples_per_s"].get<double>(), 4.0 / median, 1e-9 * 4.0 / median);
  EXPECT_NEAR(rates["tflops"].get<double>(), 1e6 / median / 1e12, 1e-9 * 1e6 / median / 1e12);
  EXPECT_NEAR(rates["gbps"].get<double>(), 2e6 / median / 1e9, 1e-9 * 2e6 / median / 1e9);
  EXPECT_EQ(rates["primary"], "tflops");
  EXPECT_FALSE(rates.contains("pct_of_ceiling"));

  // Totals: statuses counted; records without samples and context.
  EXPECT_EQ(totals.by_status.at("skipped"), 2);
  EXPECT_EQ(totals.by_status.at("oom"), 1);
  EXPECT_EQ(totals.by_status.at("error"), 1);
  EXPECT_EQ(totals.by_status.at("ok"), 1);
  ASSERT_EQ(totals.records.size(), 5u);
  EXPECT_FALSE(ab::results::to_json(totals.records[4])["time"].contains("samples_s"));
  EXPECT_TRUE(ab::results::to_json(totals.records[4])["time"].contains("median_s"));
  EXPECT_FALSE(ab::results::to_json(totals.records[0]).contains("context"));

  const std::string log = progress.str();
  EXPECT_TRUE(contains(log, "[1/5]")) << log;
  EXPECT_TRUE(contains(log, "[5/5]")) << log;
  EXPECT_TRUE(contains(log, "oom: device full")) << log;
  std::ostringstream table;
  ab::report::print_summary(table, totals.records);
  EXPECT_TRUE(contains(table.str(), "fake")) << table.str();
  EXPECT_TRUE(contains(table.str(), "FLOP/s")) << table.str();
}

TEST(Runner, OtherFailuresAreRecorded) {
  auto be = backend::make_backend("cpu");
  FakeWorkload fake;
  Captured cap;
  Runner runner(*be, fast_settings(), json::object(), "run-2", cap.hooks(), nullptr);
  const std::atomic<bool> cancel{false};
  const RunTotals totals = runner.run(plan_for(fake, "cpu", {{{"case"}, "nothing,usage,throw,ok"}}), cancel);
  ASSERT_EQ(cap.records.size(), 4u);
  EXPECT_EQ(cap.records[0]["status"], "error");
  EXPECT_TRUE(contains(cap.records[0]["reason"], "measured nothing"));
  EXPECT_EQ(cap.records[1]["status"], "invalid");
  EXPECT_TRUE(contains(cap.records[1]["reason"], "bad size for fake"));
  EXPECT_EQ(cap.records[2]["status"], "error");
  EXPECT_TRUE(contains(cap.records[2]["reason"], "something broke"));
  EXPECT_EQ(cap.records[3]["status"], "ok");
  EXPECT_EQ(totals.by_status.at("error"), 2);
}

// A run of points skipped for the same reason prints one header and one folded line; every
// point is still recorded.
TEST(Runner, SkippedPointsFoldInTheProgressLines) {
  auto be = backend::make_backend("cpu");
  FakeWorkload fake;
  Captured cap;
  std::ostringstream progress;
  Runner runner(*be, fast_settings(), json::object(), "run-fold", cap.hooks(), &progress);
  const std::atomic<bool> cancel{false};
  const auto plan = plan_for(fake, "cpu", {{{"case"}, "skip,ok"}, {{"size"}, "1,2,3,4"}});
  ASSERT_EQ(plan.size(), 8u);
  runner.run(plan, cancel);
  ASSERT_EQ(cap.records.size(), 8u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(cap.records[i]["status"], "skipped") << i;
  const std::string log = progress.str();
  EXPECT_TRUE(contains(log, "[1/8]")) << log;
  for (const char* hidden : {"[2/8]", "[3/8]", "[4/8]"}) EXPECT_FALSE(contains(log, hidden)) << log;
  EXPECT_TRUE(contains(log, "points 2-4 (fake) skipped for the same reason")) << log;
  EXPECT_LT(log.find("points 2-4"), log.find("[5/8]")) << "the folded line closes the run before the next point";
  for (const char* shown : {"[5/8]", "[6/8]", "[7/8]", "[8/8]"}) EXPECT_TRUE(contains(log, shown)) << log;
}

// Scales over `gpus` (its declared scaling axis): an iteration processes 8 x gpus samples and takes
// 2^-10 s x (1 + gpus / 8) on the scripted clock, so each rate is exact. Its option `knob` is
// echoed into the record by the runner and read back through State::option_int.
class ScalingWorkload final : public Workload {
 public:
  explicit ScalingWorkload(ScriptedClockBackend& be) : be_(be) {}
  std::string name() const override { return "scaler"; }
  std::string description() const override { return "test double"; }
  std::vector<AxisSpec> axes(const std::string&) const override {
    return {{"model", AxisKind::text, {"a"}, {}, "any"}, {"gpus", AxisKind::integer, {"1", "2", "4"}, {}, "devices"}};
  }
  std::vector<OptionSpec> options() const override {
    return {{"knob", AxisKind::integer, "7", {}, "a tuning knob"}, {"mode", AxisKind::text, "x", {"x", "y"}, "a choice"}};
  }
  std::string scaling_axis() const override { return "gpus"; }
  void run(State& state) override {
    const auto gpus = static_cast<double>(state.get_int("gpus"));
    state.add_metric("knob_seen", state.option_int("knob"));
    state.set_counts({8.0 * gpus, 0.0, 0.0});
    be_.per_iteration_s = 0x1.0p-10 * (1.0 + gpus / 8.0);
    state.exec([] {});
  }

 private:
  ScriptedClockBackend& be_;
};

TEST(Runner, ScalingEfficiencyIsDerivedAgainstTheOneDeviceTwin) {
  ScriptedClockBackend be;
  ScalingWorkload w(be);
  Captured cap;
  Runner runner(be, fast_settings(), json::object(), "run-scaling", cap.hooks(), nullptr);
  const std::atomic<bool> cancel{false};
  auto plan = plan_for(w, "cpu", {{{"model"}, "a"}}, {{"knob", "3"}});
  const auto other = plan_for(w, "cpu", {{{"model"}, "b"}, {{"gpus"}, "2"}});  // no gpus=1 twin
  plan.insert(plan.end(), other.begin(), other.end());
  runner.run(plan, cancel);
  ASSERT_EQ(cap.records.size(), 4u);
  const auto rate = [](double gpus) { return 8.0 * gpus / (0x1.0p-10 * (1.0 + gpus / 8.0)); };
  EXPECT_FALSE(cap.records[0]["metrics"].contains("scaling_efficiency"));
  for (std::size_t i = 1; i < 3; ++i) {
    const json& r = cap.records[i];
    ASSERT_EQ(r["status"], "ok") << r.dump();
    const double k = r["params"]["gpus"].get<double>();
    EXPECT_DOUBLE_EQ(r["metrics"]["scaling_efficiency"].get<double>(), rate(k) / (k * rate(1))) << r.dump();
    EXPECT_DOUBLE_EQ(r["metrics"]["single_gpu_samples_per_s"].get<double>(), rate(1));
  }
  EXPECT_FALSE(cap.records[3]["metrics"].contains("scaling_efficiency")) << cap.records[3].dump();
  // The options as run: the one given and the defaults, typed as declared.
  EXPECT_EQ(cap.records[0]["options"], (json{{"knob", 3}, {"mode", "x"}}));
  EXPECT_EQ(cap.records[0]["metrics"]["knob_seen"], 3);
  EXPECT_EQ(cap.records[3]["options"]["knob"], 7);
  // Unknown names and values outside a text option's choices are refused when the plan is built.
  const std::string unknown = ab::test::usage_error([&] { plan_for(w, "cpu", {}, {{"nob", "1"}}); });
  EXPECT_TRUE(contains(unknown, "scaler has no option 'nob'; valid: knob, mode")) << unknown;
  const std::string choice = ab::test::usage_error([&] { plan_for(w, "cpu", {}, {{"mode", "z"}}); });
  EXPECT_TRUE(contains(choice, "unknown mode 'z'; valid: x, y")) << choice;
  EXPECT_EQ(parse_option_argument("a=b=c"), (std::pair<std::string, std::string>{"a", "b=c"}));
  EXPECT_THROW(parse_option_argument("=1"), UsageError);
}

// Publishes a ceiling, uses it, or uses a stored one: per-iteration time set through the backend.
class CeilingWorkload final : public Workload {
 public:
  explicit CeilingWorkload(ScriptedClockBackend& be) : be_(be) {}
  std::string name() const override { return "ceil"; }
  std::string description() const override { return "test double for ceilings"; }
  std::vector<AxisSpec> axes(const std::string&) const override {
    return {{"role", AxisKind::text, {"publish", "use", "stored"}, {"publish", "use", "stored"}, ""}};
  }
  void run(State& state) override {
    const std::string role = state.get_text("role");
    if (role == "publish") {
      be_.per_iteration_s = 0x1.0p-10;
      state.set_counts({1.0, 2e9, 0.0});  // 2.048 TFLOP/s
      state.set_ceiling_key("gemm.fake");
      state.set_publishes_ceiling("gemm.fake");
    } else if (role == "use") {
      be_.per_iteration_s = 0x1.0p-9;
      state.set_counts({1.0, 2e9, 0.0});  // 1.024 TFLOP/s: 50% of the published ceiling
      state.set_ceiling_key("gemm.fake");
    } else {
      be_.per_iteration_s = 0x1.0p-10;
      state.set_counts({1.0, 0.0, 1e9});  // 1024 GB/s
      state.set_ceiling_key("memory.fake");
    }
    state.exec([] {});
  }

 private:
  ScriptedClockBackend& be_;
};

TEST(Runner, CeilingPublishedInRunIsUsedLater) {
  ScriptedClockBackend be;
  CeilingWorkload w(be);
  Captured cap;
  RunnerHooks hooks = cap.hooks();
  Strings asked;
  hooks.find_stored_ceiling = [&asked](const std::string& key) -> std::optional<Ceiling> {
    asked.push_back(key);
    if (key == "memory.fake") return Ceiling{4096.0, "GB/s", "run old-run seq 3"};
    if (key == "gemm.fake") return Ceiling{1000.0, "TFLOP/s", "stale"};
    return std::nullopt;
  };
  Runner runner(be, fast_settings(), json::object(), "run-c", hooks, nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(plan_for(w, "cpu", {}), cancel);
  ASSERT_EQ(cap.records.size(), 3u);
  for (const auto& r : cap.records) {
    ASSERT_EQ(r["status"], "ok") << r.dump();
    EXPECT_EQ(r["time"]["rel_spread"], 0.0);
    EXPECT_EQ(r["time"]["converged"], true);
  }

  const json& pub = cap.records[0]["rates"];
  EXPECT_NEAR(pub["tflops"].get<double>(), 2.048, 1e-12);
  EXPECT_FALSE(pub.contains("pct_of_ceiling")) << "a point is not compared with itself";
  EXPECT_EQ(pub["ceiling"]["key"], "gemm.fake");
  EXPECT_NEAR(pub["ceiling"]["value"].get<double>(), 2.048, 1e-12);
  EXPECT_EQ(pub["ceiling"]["unit"], "TFLOP/s");

  const json& use = cap.records[1]["rates"];
  EXPECT_NEAR(use["tflops"].get<double>(), 1.024, 1e-12);
  ASSERT_TRUE(use.contains("pct_of_ceiling")) << use.dump();
  EXPECT_NEAR(use["pct_of_ceiling"].get<double>(), 50.0, 1e-9);
  EXPECT_EQ(use["ceiling"]["key"], "gemm.fake");
  EXPECT_NEAR(use["ceiling"]["value"].get<double>(), 2.048, 1e-12);
  EXPECT_TRUE(contains(use["ceiling"]["source"], "run-c")) << use.dump();
  EXPECT_EQ(use["primary"], "tflops");

  // Not measured in this run: the stored ceiling, and GB/s for a memory ceiling.
  const json& stored = cap.records[2]["rates"];
  EXPECT_NEAR(stored["gbps"].get<double>(), 1024.0, 1e-9);
  ASSERT_TRUE(stored.contains("pct_of_ceiling")) << stored.dump();
  EXPECT_NEAR(stored["pct_of_ceiling"].get<double>(), 25.0, 1e-9);
  EXPECT_EQ(stored["ceiling"]["source"], "run old-run seq 3");
  EXPECT_EQ(stored["ceiling"]["unit"], "GB/s");
  EXPECT_EQ(stored["primary"], "gbps");
  // The in-run gemm ceiling was preferred over the stale stored one (which would give 0.1%): once it
  // exists the store is not asked for it again.
  EXPECT_EQ(std::count(asked.begin(), asked.end(), "memory.fake"), 1);
  EXPECT_LE(std::count(asked.begin(), asked.end(), "gemm.fake"), 1);
}

TEST(Runner, NoCeilingNoPercentage) {
  ScriptedClockBackend be;
  CeilingWorkload w(be);
  Captured cap;
  Runner runner(be, fast_settings(), json::object(), "run-d", cap.hooks(), nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(plan_for(w, "cpu", {{{"role"}, "use,stored"}}), cancel);
  ASSERT_EQ(cap.records.size(), 2u);
  for (const auto& r : cap.records) {
    EXPECT_EQ(r["status"], "ok");
    EXPECT_FALSE(r["rates"].contains("pct_of_ceiling")) << r.dump();
    EXPECT_FALSE(r["rates"].contains("ceiling")) << r.dump();
  }
}

TEST(Runner, TelemetryHookGetsTheMeasuredWindow) {
  ScriptedClockBackend be;
  FakeWorkload fake;
  Captured cap;
  RunnerHooks hooks = cap.hooks();
  std::vector<std::array<double, 3>> calls;
  hooks.telemetry = [&calls](double t0, double t1, double samples) -> json {
    calls.push_back({t0, t1, samples});
    return json{{"mean_power_w", 123.0}};
  };
  Runner runner(be, fast_settings(), json::object(), "run-t", hooks, nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(plan_for(fake, "cpu", {{{"case"}, "skip,ok"}}), cancel);
  ASSERT_EQ(cap.records.size(), 2u);
  ASSERT_EQ(calls.size(), 1u) << "only measured points have a window";
  EXPECT_LE(calls[0][0], calls[0][1]);
  const double total_iterations = cap.records[1]["time"]["total_iterations"];
  EXPECT_DOUBLE_EQ(calls[0][2], 4.0 * total_iterations);
  EXPECT_EQ(cap.records[1]["telemetry"]["mean_power_w"], 123.0);
  EXPECT_FALSE(cap.records[0].contains("telemetry"));
}

TEST(Runner, CancelledBeforeRunRecordsNothing) {
  auto be = backend::make_backend("cpu");
  FakeWorkload fake;
  Captured cap;
  Runner runner(*be, fast_settings(), json::object(), "run-x", cap.hooks(), nullptr);
  const std::atomic<bool> cancel{true};
  const RunTotals totals = runner.run(plan_for(fake, "cpu", {}), cancel);
  EXPECT_TRUE(totals.interrupted);
  EXPECT_TRUE(totals.records.empty());
  EXPECT_TRUE(cap.records.empty());
  EXPECT_TRUE(fake.seen.empty());
}

TEST(Runner, CancelledDuringAPointEndsTheRun) {
  ScriptedClockBackend be;
  FakeWorkload fake;
  std::atomic<bool> cancel{false};
  fake.cancel = &cancel;
  Captured cap;
  Runner runner(be, fast_settings(), json::object(), "run-y", cap.hooks(), nullptr);
  const RunTotals totals = runner.run(plan_for(fake, "cpu", {{{"case"}, "ok,cancel,ok"}}), cancel);
  EXPECT_TRUE(totals.interrupted);
  ASSERT_EQ(cap.records.size(), 2u);
  EXPECT_EQ(cap.records[0]["status"], "ok");
  EXPECT_EQ(cap.records[1]["status"], "interrupted");
  EXPECT_TRUE(contains(cap.records[1]["reason"], "interrupted"));
  EXPECT_EQ(fake.seen, (Strings{"ok", "cancel"}));
}

// ---------------------------------------------------------------------------------------------
// The real workloads on the CPU backend

std::vector<json> run_real(const std::string& workload, const std::vector<std::string>& axis_args) {
  auto be = backend::make_backend("cpu");
  std::vector<AxisOverride> overrides;
  for (const auto& a : axis_args) overrides.push_back(parse_axis_argument(a));
  const std::vector<PlanEntry> plan = plan_for(find_workload(workload), "cpu", overrides);
  Captured cap;
  Runner runner(*be, fast_settings(), json::object(), "run-real", cap.hooks(), nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(plan, cancel);
  return cap.records;
}

TEST(RealWorkloads, GemmFp32OnCpu) {
  const auto records = run_real("gemm", {"precision=fp32", "m,n,k=64"});
  ASSERT_EQ(records.size(), 1u);
  const json& r = records[0];
  ASSERT_EQ(r["status"], "ok") << r.dump();
  EXPECT_EQ(r["params"]["m"], 64);
  EXPECT_EQ(r["params"]["trans"], "auto");
  EXPECT_EQ(r["check"]["passed"], true);
  EXPECT_LE(r["check"]["rel_error"].get<double>(), r["check"]["tolerance"].get<double>());
  EXPECT_EQ(r["counts"]["flops"], 2.0 * 64 * 64 * 64);
  EXPECT_GT(r["rates"]["tflops"].get<double>(), 0.0);
  EXPECT_GT(r["rates"]["samples_per_s"].get<double>(), 0.0);
  EXPECT_EQ(r["rates"]["primary"], "tflops");
  EXPECT_TRUE(r["metrics"].contains("algorithm"));
  EXPECT_GT(r["time"]["median_s"].get<double>(), 0.0);
}

TEST(RealWorkloads, StreamOnCpu) {
  const auto records = run_real("stream", {"array_bytes=1048576"});
  ASSERT_EQ(records.size(), 4u);
  const Strings ops{"copy", "scale", "add", "triad"};
  for (std::size_t i = 0; i < records.size(); ++i) {
    const json& r = records[i];
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    EXPECT_EQ(r["params"]["op"], ops[i]);
    EXPECT_EQ(r["params"]["array_bytes"], 1048576);
    EXPECT_EQ(r["check"]["passed"], true);
    EXPECT_EQ(r["counts"]["bytes"], (i < 2 ? 2.0 : 3.0) * 1048576.0);
    EXPECT_GT(r["rates"]["gbps"].get<double>(), 0.0);
    EXPECT_GT(r["rates"]["samples_per_s"].get<double>(), 0.0);
    EXPECT_EQ(r["rates"]["primary"], "gbps");
  }
}

TEST(RealWorkloads, MeasuredBandwidthCeilingIsUsedByStream) {
  auto be = backend::make_backend("cpu");
  auto plan = plan_for(find_workload("ceilings"), "cpu",
                       {parse_axis_argument("target=memory.bandwidth"), parse_axis_argument("array_bytes=1048576")});
  const auto stream = plan_for(find_workload("stream"), "cpu",
                               {parse_axis_argument("op=triad"), parse_axis_argument("array_bytes=1048576")});
  plan.insert(plan.end(), stream.begin(), stream.end());
  ASSERT_EQ(plan.size(), 2u);
  Captured cap;
  Runner runner(*be, fast_settings(), json::object(), "run-ceil", cap.hooks(), nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(plan, cancel);
  ASSERT_EQ(cap.records.size(), 2u);
  ASSERT_EQ(cap.records[0]["status"], "ok") << cap.records[0].dump();
  ASSERT_EQ(cap.records[1]["status"], "ok") << cap.records[1].dump();
  EXPECT_EQ(cap.records[0]["rates"]["ceiling"]["key"], "memory.bandwidth");
  const json& rates = cap.records[1]["rates"];
  ASSERT_TRUE(rates.contains("pct_of_ceiling")) << rates.dump();
  EXPECT_GT(rates["pct_of_ceiling"].get<double>(), 0.0);
  EXPECT_NEAR(rates["pct_of_ceiling"].get<double>(),
              100.0 * rates["gbps"].get<double>() / cap.records[0]["rates"]["gbps"].get<double>(), 1e-9);
}


// ---------------------------------------------------------------------------------------------
// No impossible result is recorded ok

// Sizes whose bytes or FLOPs overflow 64 bits, or whose operands exceed the device's memory, are
// refused before anything is allocated: `invalid` with the quantity named, never a BLAS call.
TEST(ImpossibleSizes, GemmOverflowAndMemoryAreInvalid) {
  const struct { std::string size, says; } cases[] = {
      {"4294967296", "overflows 64 bits"},           // m x k = 2^64
      {"9223372036854775807", "overflows 64 bits"},  // INT64_MAX
      {"1048576", "bytes of memory of cpu"},         // 2^40 elements per operand: fits int64, not the host
  };
  for (const auto& c : cases) {
    const auto records = run_real("gemm", {"precision=fp32", "m,n,k=" + c.size});
    ASSERT_EQ(records.size(), 1u);
    const json& r = records[0];
    EXPECT_EQ(r["status"], "invalid") << r.dump();
    EXPECT_TRUE(contains(r.value("reason", ""), c.says)) << r.dump();
    EXPECT_FALSE(r.contains("rates")) << r.dump();
  }
}

TEST(ImpossibleSizes, StreamAndCopyOverflowAndMemoryAreInvalid) {
  const auto huge = run_real("stream", {"op=copy", "array_bytes=4611686018427387904"});  // 2^62: 3 arrays overflow
  ASSERT_EQ(huge.size(), 1u);
  EXPECT_EQ(huge[0]["status"], "invalid") << huge[0].dump();
  EXPECT_TRUE(contains(huge[0].value("reason", ""), "overflows 64 bits")) << huge[0].dump();
  const auto big = run_real("stream", {"op=copy", "array_bytes=576460752303423488"});  // 2^59
  ASSERT_EQ(big.size(), 1u);
  EXPECT_EQ(big[0]["status"], "invalid") << big[0].dump();
  EXPECT_TRUE(contains(big[0].value("reason", ""), "bytes of memory of cpu")) << big[0].dump();
}

TEST(ImpossibleSizes, ModelBatchTimesImageOverflowIsInvalid) {
  for (const std::string workload : {"train", "infer"}) {
    const auto records = run_real(workload, {"batch=1099511627776", "image_size=4294967296"});
    ASSERT_FALSE(records.empty());
    for (const json& r : records) {
      EXPECT_EQ(r["status"], "invalid") << r.dump();
      EXPECT_TRUE(contains(r.value("reason", ""), "overflows 64 bits")) << r.dump();
    }
  }
}

// A GEMM whose timed kernel does nothing (the small checked copy runs): the sample of the timed C
// against float64 from the timed A and B fails it.
class LazyGemmPlan final : public backend::GemmPlan {
 public:
  explicit LazyGemmPlan(std::unique_ptr<backend::GemmPlan> real) : real_(std::move(real)) {}
  void run() override {}
  std::string algorithm() const override { return "nothing"; }
  std::vector<double> a_values() override { return real_->a_values(); }
  std::vector<double> b_values() override { return real_->b_values(); }
  std::vector<double> c_values() override { return real_->c_values(); }
  std::vector<double> values_at(backend::GemmOperand w, const std::vector<std::int64_t>& at) override {
    return real_->values_at(w, at);
  }

 private:
  std::unique_ptr<backend::GemmPlan> real_;
};

class LazyGemmBackend final : public backend::Backend {
 public:
  LazyGemmBackend() : cpu_(backend::make_backend("cpu")) {}
  const backend::DeviceInfo& info() const override { return cpu_->info(); }
  std::unique_ptr<measure::IterationTimer> make_timer() override { return cpu_->make_timer(); }
  void synchronize() override {}
  std::unique_ptr<backend::GemmPlan> make_gemm(const backend::GemmDesc& d) override {
    auto real = cpu_->make_gemm(d);
    if (d.m <= 96 && d.n <= 96 && d.k <= 96) return real;  // the small full check is honest
    return std::make_unique<LazyGemmPlan>(std::move(real));
  }
  std::unique_ptr<backend::StreamPlan> make_stream(backend::StreamOp op, std::int64_t n) override {
    return cpu_->make_stream(op, n);
  }
  std::unique_ptr<backend::CopyPlan> make_copy(backend::CopyKind k, backend::HostMemory h, std::int64_t b) override {
    return cpu_->make_copy(k, h, b);
  }

 private:
  std::unique_ptr<backend::Backend> cpu_;
};

TEST(ImpossibleResults, GemmWhoseTimedKernelDidNotRunFailsItsCheck) {
  LazyGemmBackend be;
  Captured cap;
  Runner runner(be, fast_settings(), json::object(), "run-lazy", cap.hooks(), nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(plan_for(find_workload("gemm"), "cpu", {parse_axis_argument("m,n,k=128")}), cancel);
  ASSERT_EQ(cap.records.size(), 1u);
  const json& r = cap.records[0];
  EXPECT_EQ(r["status"], "error") << r.dump();
  EXPECT_TRUE(contains(r.value("reason", ""), "sampled entries of the timed C")) << r.dump();
}

TEST(ImpossibleResults, TimedGemmSampleIsCheckedOnAPassingPoint) {
  // Both layouts of each operand: the sampled rows and columns are gathered through op().
  const auto records = run_real("gemm", {"precision=fp32", "m,n,k,trans=130x97x101xNN,130x97x101xTT"});
  ASSERT_EQ(records.size(), 2u);
  for (const json& r : records) {
    ASSERT_EQ(r["status"], "ok") << r.dump();
    EXPECT_TRUE(contains(r["check"]["what"].get<std::string>(), "9 sampled entries of the timed C")) << r.dump();
    EXPECT_EQ(r["check"]["passed"], true);
    EXPECT_LE(r["check"]["rel_error"].get<double>(), r["check"]["tolerance"].get<double>());
  }
}

// Publishes or measures a rate chosen by the test (through the scripted clock).
class RateWorkload final : public Workload {
 public:
  explicit RateWorkload(ScriptedClockBackend& be) : be_(be) {}
  std::string name() const override { return "rate"; }
  std::string description() const override { return "test double for plausible rates"; }
  std::vector<AxisSpec> axes(const std::string&) const override {
    return {{"key", AxisKind::text, {"gemm.bf16"}, {"gemm.bf16", "memory.bandwidth"}, ""},
            {"rate", AxisKind::real, {"1"}, {}, "TFLOP/s or GB/s"},
            {"bytes", AxisKind::real, {"1e12"}, {}, "bytes per iteration of a memory point"},
            {"publish", AxisKind::integer, {"0"}, {}, "1: the rate becomes the ceiling"},
            {"throw", AxisKind::text, {"none"}, {"none", "bad_alloc", "length_error"}, ""}};
  }
  std::vector<ZipGroup> zip_groups() const override { return {{{"rate", "publish"}, {}}}; }
  void run(State& state) override {
    const std::string thrown = state.get_text("throw");
    if (thrown == "bad_alloc") throw std::bad_alloc();
    if (thrown == "length_error") throw std::length_error("cannot create std::vector larger than max_size()");
    const std::string key = state.get_text("key");
    const double rate = state.get_real("rate"), bytes = state.get_real("bytes");
    if (results::is_memory_ceiling(key)) {
      be_.per_iteration_s = bytes / (rate * 1e9);
      state.set_counts({1.0, 0.0, bytes});
    } else {
      be_.per_iteration_s = 0x1.0p-10;
      state.set_counts({1.0, rate * 1e12 * be_.per_iteration_s, 0.0});
    }
    state.set_ceiling_key(key);
    if (state.get_int("publish") == 1) state.set_publishes_ceiling(key);
    state.exec([] {});
  }

 private:
  ScriptedClockBackend& be_;
};

backend::DeviceInfo h200() {
  backend::DeviceInfo d = backend::make_backend("cpu")->info();
  d.name = "NVIDIA H200";
  d.l2_bytes = 50 << 20;
  return d;
}

std::vector<json> run_rates(ScriptedClockBackend& be, const std::vector<std::string>& axis_args,
                            const std::optional<Ceiling>& stored = std::nullopt) {
  RateWorkload w(be);
  Captured cap;
  RunnerHooks hooks = cap.hooks();
  hooks.find_stored_ceiling = [&stored](const std::string&) { return stored; };
  Runner runner(be, fast_settings(), json::object(), "run-rate", hooks, nullptr);
  std::vector<AxisOverride> overrides;
  for (const auto& a : axis_args) overrides.push_back(parse_axis_argument(a));
  const std::atomic<bool> cancel{false};
  runner.run(plan_for(w, "cpu", overrides), cancel);
  return cap.records;
}

TEST(ImpossibleResults, RateAboveTheDatasheetOrTheCeilingIsAnError) {
  ScriptedClockBackend be;
  be.device = h200();
  // 2000 TFLOP/s of bf16 on an H200 (989.4 dense on its datasheet), with no ceiling to compare.
  auto r = run_rates(be, {"rate=2000"});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0]["status"], "error") << r[0].dump();
  EXPECT_TRUE(contains(r[0].value("reason", ""), "above the physical limit 989.4")) << r[0].dump();
  EXPECT_TRUE(contains(r[0].value("reason", ""), "datasheet: NVIDIA H200")) << r[0].dump();
  EXPECT_FALSE(r[0].contains("rates"));
  // Published at 500, then 800 measured: below the datasheet but 1.6x the ceiling.
  r = run_rates(be, {"rate,publish=500x1,800x0"});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0]["status"], "ok") << r[0].dump();
  EXPECT_EQ(r[1]["status"], "error") << r[1].dump();
  EXPECT_TRUE(contains(r[1].value("reason", ""), "1.5x the measured ceiling 500")) << r[1].dump();
  // A device without a datasheet (a host CPU, loaded or not by others): its measured ceiling
  // bounds nothing, the bound for any device still does.
  be.device = backend::make_backend("cpu")->info();
  r = run_rates(be, {"rate,publish=500x1,800x0,6000x0,200000x0"});
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[1]["status"], "ok") << r[1].dump();
  EXPECT_EQ(r[2]["status"], "ok") << r[2].dump();
  EXPECT_EQ(r[3]["status"], "error") << r[3].dump();
  EXPECT_TRUE(contains(r[3].value("reason", ""), "the bound for any device")) << r[3].dump();
  be.device = h200();
  // 6000 GB/s from DRAM (4800 on the datasheet) is impossible; from a 1 MB working set in L2 it is not.
  r = run_rates(be, {"key=memory.bandwidth", "rate=6000", "bytes=1e12,1e6"});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0]["status"], "error") << r[0].dump();
  EXPECT_TRUE(contains(r[0].value("reason", ""), "physical limit 4800")) << r[0].dump();
  EXPECT_EQ(r[1]["status"], "ok") << r[1].dump();
  // An impossible ceiling point is an error and publishes nothing: the next point has no percentage.
  r = run_rates(be, {"rate,publish=5000x1,400x0"});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0]["status"], "error") << r[0].dump();
  EXPECT_EQ(r[1]["status"], "ok") << r[1].dump();
  EXPECT_FALSE(r[1]["rates"].contains("pct_of_ceiling")) << r[1].dump();
}

TEST(ImpossibleResults, CorruptStoredCeilingIsNotDividedBy) {
  ScriptedClockBackend be;  // the CPU: no datasheet row, the bound for any device
  for (const double corrupt : {std::nan(""), -1.0, 0.0, 1e30}) {
    const auto r = run_rates(be, {"rate=1"}, Ceiling{corrupt, "TFLOP/s", "run old seq 1"});
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0]["status"], "ok") << r[0].dump();
    EXPECT_FALSE(r[0]["rates"].contains("pct_of_ceiling")) << r[0].dump();
    EXPECT_TRUE(contains(r[0]["metrics"].value("ceiling_not_used", ""), "run old seq 1")) << r[0].dump();
  }
  const auto plausible = run_rates(be, {"rate=1"}, Ceiling{4.0, "TFLOP/s", "run old seq 1"});
  ASSERT_EQ(plausible.size(), 1u);
  EXPECT_NEAR(plausible[0]["rates"]["pct_of_ceiling"].get<double>(), 25.0, 1e-9) << plausible[0].dump();
}

TEST(ImpossibleResults, LibraryErrorsBecomeOomOrInvalidWithAClearReason) {
  ScriptedClockBackend be;
  const auto r = run_rates(be, {"throw=bad_alloc,length_error"});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0]["status"], "oom") << r[0].dump();
  EXPECT_TRUE(contains(r[0].value("reason", ""), "host memory exhausted")) << r[0].dump();
  EXPECT_EQ(r[1]["status"], "invalid") << r[1].dump();
  EXPECT_FALSE(contains(r[1].value("reason", ""), "max_size")) << r[1].dump();
}

// ---------------------------------------------------------------------------------------------
// A ceiling is the best figure measured for it

TEST(Ceilings, TheBestPublishedPointIsTheCeiling) {
  ScriptedClockBackend be;
  be.device = h200();
  const auto r = run_rates(be, {"rate,publish=500x1,700x1,600x1,350x0"});
  ASSERT_EQ(r.size(), 4u);
  for (const json& p : r) ASSERT_EQ(p["status"], "ok") << p.dump();
  EXPECT_NEAR(r[3]["rates"]["pct_of_ceiling"].get<double>(), 50.0, 1e-6) << r[3].dump();  // 350 of 700, not of 600
  // A ceilings point below the best so far is divided by it and sets nothing.
  EXPECT_NEAR(r[2]["rates"]["pct_of_ceiling"].get<double>(), 100.0 * 600 / 700, 1e-6) << r[2].dump();
  EXPECT_EQ(r[2]["rates"]["ceiling"]["source"], "run run-rate seq 1") << r[2].dump();
  EXPECT_FALSE(r[2].value("metrics", json::object()).contains("datasheet")) << r[2].dump();
  // Beside each measured ceiling, the datasheet's (989.4 dense bf16 on an H200).
  EXPECT_NEAR(r[1]["metrics"]["datasheet"]["pct_of_datasheet"].get<double>(), 100.0 * 700 / 989.4, 1e-6) << r[1].dump();
  EXPECT_TRUE(contains(r[1]["metrics"]["datasheet"].value("part", ""), "H200")) << r[1].dump();
}

TEST(Ceilings, ALaterPointOfTheRunThatBeatsItRaisesIt) {
  ScriptedClockBackend be;
  be.device = h200();
  const auto r = run_rates(be, {"rate,publish=500x1,600x0,450x0"});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[1]["rates"]["ceiling"]["source"], "this point") << r[1].dump();
  EXPECT_NEAR(r[1]["rates"]["pct_of_ceiling"].get<double>(), 100.0, 1e-9) << r[1].dump();
  EXPECT_NEAR(r[2]["rates"]["pct_of_ceiling"].get<double>(), 75.0, 1e-6) << r[2].dump();  // 450 of 600
  EXPECT_TRUE(contains(r[2]["rates"]["ceiling"].value("source", ""), "run-rate seq 1")) << r[2].dump();
}

TEST(Ceilings, AboveAStoredCeilingOrFromTheCacheIsFlaggedWithItsCause) {
  ScriptedClockBackend be;
  backend::DeviceInfo cpu = backend::make_backend("cpu")->info();
  cpu.l2_bytes = 32 << 20;
  be.device = cpu;
  // A stored ceiling is divided by, not raised: a faster point says the ceiling is stale.
  auto r = run_rates(be, {"rate=6"}, Ceiling{4.0, "TFLOP/s", "run old seq 1"});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NEAR(r[0]["rates"]["pct_of_ceiling"].get<double>(), 150.0, 1e-6) << r[0].dump();
  EXPECT_TRUE(contains(r[0]["metrics"].value("above_ceiling", ""), "earlier run")) << r[0].dump();
  // 2000 GB/s against a 100 GB/s DRAM ceiling: from a 1 MB working set the cache's, from 1 TB stale.
  r = run_rates(be, {"key=memory.bandwidth", "rate=2000", "bytes=1e6,1e12"}, Ceiling{100.0, "GB/s", "run old seq 2"});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_NEAR(r[0]["rates"]["pct_of_ceiling"].get<double>(), 2000.0, 1e-6) << r[0].dump();
  EXPECT_EQ(r[0]["metrics"].value("above_ceiling", "").rfind("cache-resident working set", 0), 0u) << r[0].dump();
  EXPECT_TRUE(contains(r[1]["metrics"].value("above_ceiling", ""), "earlier run")) << r[1].dump();
  // Below the ceiling nothing is flagged.
  r = run_rates(be, {"rate=2"}, Ceiling{4.0, "TFLOP/s", "run old seq 1"});
  EXPECT_FALSE(r[0].value("metrics", json::object()).contains("above_ceiling")) << r[0].dump();
}

TEST(Ceilings, ACachedWorkingSetNeverRaisesTheBandwidthCeiling) {
  ScriptedClockBackend be;
  backend::DeviceInfo cpu = backend::make_backend("cpu")->info();
  cpu.l2_bytes = 32 << 20;
  be.device = cpu;
  RateWorkload w(be);
  Captured cap;
  Runner runner(be, fast_settings(), json::object(), "run-cache", cap.hooks(), nullptr);
  const std::atomic<bool> cancel{false};
  auto plan =
      plan_for(w, "cpu", {parse_axis_argument("key=memory.bandwidth"), parse_axis_argument("rate,publish=100x1")});
  const auto cached = plan_for(w, "cpu",
                               {parse_axis_argument("key=memory.bandwidth"), parse_axis_argument("rate=2000"),
                                parse_axis_argument("bytes=1e6")});
  const auto dram = plan_for(w, "cpu", {parse_axis_argument("key=memory.bandwidth"), parse_axis_argument("rate=50")});
  plan.insert(plan.end(), cached.begin(), cached.end());
  plan.insert(plan.end(), dram.begin(), dram.end());
  runner.run(plan, cancel);
  ASSERT_EQ(cap.records.size(), 3u);
  EXPECT_NEAR(cap.records[1]["rates"]["pct_of_ceiling"].get<double>(), 2000.0, 1e-6) << cap.records[1].dump();
  EXPECT_NEAR(cap.records[2]["rates"]["pct_of_ceiling"].get<double>(), 50.0, 1e-6) << cap.records[2].dump();
}

TEST(Ceilings, ARunWithoutOneSaysHowToMeasureIt) {
  ScriptedClockBackend be;
  RateWorkload w(be);
  Captured cap;
  std::ostringstream progress;
  Runner runner(be, fast_settings(), json::object(), "run-none", cap.hooks(), &progress);
  const std::atomic<bool> cancel{false};
  runner.run(plan_for(w, "cpu", {parse_axis_argument("rate=1,2")}), cancel);
  const std::string out = progress.str();
  EXPECT_EQ(std::count(out.begin(), out.end(), '`'), 2) << out;  // once, not per point
  EXPECT_TRUE(contains(out, "no gemm.bf16 ceiling measured on this device; `accelbench run ceilings`")) << out;
  // A run that measures it prints the measured figure instead.
  std::ostringstream measured;
  Runner runner2(be, fast_settings(), json::object(), "run-some", cap.hooks(), &measured);
  runner2.run(plan_for(w, "cpu", {parse_axis_argument("rate,publish=3x1")}), cancel);
  EXPECT_TRUE(contains(measured.str(), "ceiling gemm.bf16: 3 TFLOP/s measured")) << measured.str();
  EXPECT_FALSE(contains(measured.str(), "accelbench run ceilings")) << measured.str();
}

}  // namespace
}  // namespace ab::workloads
