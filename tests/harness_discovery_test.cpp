// What makes the harness easy to find one's way in: size suffixes in axis values, "did you mean"
// for a mistyped name, and the bundled suites found by name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "harness/axes.h"
#include "harness/suggest.h"
#include "harness/suite.h"
#include "test_support.h"

namespace {

using namespace ab::harness;
using Strings = std::vector<std::string>;

std::vector<AxisSpec> sized_axes() {
  return {{"bytes", AxisKind::integer, {"1024"}, {}, "bytes moved"},
          {"batch", AxisKind::integer, {"1"}, {}, ""},
          {"m", AxisKind::integer, {"128"}, {}, ""},
          {"n", AxisKind::integer, {"128"}, {}, ""},
          {"precision", AxisKind::text, {"fp32"}, {"fp32", "bf16", "fp16"}, ""}};
}
std::vector<ZipGroup> sized_groups() { return {{{"m", "n"}, {}}}; }

Strings values_of(const std::string& axis, const std::string& arg) {
  Strings out;
  for (const auto& p : build_sweep(sized_axes(), sized_groups(), {parse_axis_argument(arg)})) out.push_back(p.at(axis));
  return out;
}

TEST(AxisSizes, SiSuffixesArePowersOf1000AndIecOnesOf1024) {
  EXPECT_EQ(values_of("bytes", "bytes=1k,8G,2M,1T"), (Strings{"1000", "8000000000", "2000000", "1000000000000"}));
  EXPECT_EQ(values_of("bytes", "bytes=64MiB,1Ki,8Gi,1TiB"),
            (Strings{"67108864", "1024", "8589934592", "1099511627776"}));
  EXPECT_EQ(values_of("bytes", "bytes=1kB,1KB,1K,64B,7"), (Strings{"1000", "1000", "1000", "64", "7"}));
  EXPECT_EQ(values_of("bytes", "bytes=1Ki:4KiB:pow2"), (Strings{"1024", "2048", "4096"}));
  EXPECT_EQ(values_of("batch", "batch=1k"), (Strings{"1000"}));
  EXPECT_EQ(values_of("m", "m,n=4Kix2k"), (Strings{"4096"}));
  EXPECT_EQ(values_of("n", "m,n=4Kix2k"), (Strings{"2000"}));
  EXPECT_EQ(values_of("n", "n=1Ki"), (Strings{"1024"}));  // one column of a group
}

TEST(AxisSizes, MalformedOrOverflowingSizesAreRefused) {
  for (const char* bad : {"bytes=8X", "bytes=1.5k", "bytes=k", "bytes=8Gib", "bytes=-1k", "bytes=8iB", "bytes=1PiB"}) {
    const std::string msg = ab::test::usage_error([&] { values_of("bytes", bad); });
    EXPECT_NE(msg.find("powers of 1024"), std::string::npos) << bad << ": " << msg;
  }
  const std::string big = ab::test::usage_error([] { values_of("bytes", "bytes=10000000T"); });
  EXPECT_NE(big.find("too large"), std::string::npos) << big;
  // A text axis keeps its words: no suffix is read into them.
  EXPECT_NE(ab::test::usage_error([] { values_of("precision", "precision=1k"); }).find("unknown precision"),
            std::string::npos);
}

TEST(Suggest, TheNearestNameIsOfferedOnlyWhenClose) {
  const Strings workloads = {"ceilings", "gemm", "stream", "copy", "loadgen", "collectives", "p2p", "train", "infer"};
  EXPECT_EQ(closest_name("gem", workloads), "gemm");
  EXPECT_EQ(closest_name("gmem", workloads), "gemm");  // a swap of neighbours is one edit
  EXPECT_EQ(closest_name("collective", workloads), "collectives");
  EXPECT_EQ(closest_name("stram", workloads), "stream");
  EXPECT_EQ(closest_name("frobnicate", workloads), std::nullopt);
  EXPECT_EQ(closest_name("gemm", workloads), std::nullopt);  // nothing to correct
  EXPECT_EQ(closest_name("", workloads), std::nullopt);
  EXPECT_EQ(closest_name("lo", workloads), "loadgen");    // the one name it begins
  EXPECT_EQ(closest_name("c", workloads), std::nullopt);  // begins three
  EXPECT_EQ(did_you_mean("trian", workloads), "; did you mean 'train'?");
  EXPECT_EQ(did_you_mean("zzz", workloads), "");
}

TEST(Suggest, UnknownAxesValuesAndOptionsSayWhatWasMeant) {
  const std::string axis = ab::test::usage_error([] { values_of("bytes", "byte=1"); });
  EXPECT_NE(axis.find("unknown axis 'byte'; valid: bytes, batch, m, n, precision; did you mean 'bytes'?"),
            std::string::npos)
      << axis;
  const std::string choice = ab::test::usage_error([] { values_of("precision", "precision=bf61"); });
  EXPECT_NE(choice.find("valid: fp32, bf16, fp16; did you mean 'bf16'?"), std::string::npos) << choice;
  const std::vector<OptionSpec> specs = {{"trajectory_steps", AxisKind::integer, "0", {}, ""}};
  const std::string option = ab::test::usage_error([&] {
    resolve_options("train", specs, {{"trajectory_step", "1"}});
  });
  EXPECT_NE(option.find("valid: trajectory_steps; did you mean 'trajectory_steps'?"), std::string::npos) << option;
}

// ACCELBENCH_SUITES comes first: its suites are found by name and by file name, and hide the
// bundled ones of the same name; the source tree's suites (this build's) are found after it.
TEST(BundledSuites, FoundByNameInTheOverrideFolderThenTheSourceTree) {
  ab::test::TempDir dir;
  dir.write("quick.yaml", "name: quick\ndescription: my own quick\nsteps:\n  - workload: gemm\n");
  dir.write("mine.yml", "description: mine\nsteps:\n  - workload: stream\n");
  dir.write("notes.txt", "not a suite\n");
  ASSERT_EQ(setenv("ACCELBENCH_SUITES", dir.path().c_str(), 1), 0);
  const auto suites = bundled_suites();
  const auto dirs = suite_dirs();
  unsetenv("ACCELBENCH_SUITES");
  ASSERT_FALSE(dirs.empty());
  EXPECT_EQ(dirs.front(), std::filesystem::canonical(dir.path()));
  const auto named = [&](const std::string& name) -> const BundledSuite* {
    for (const auto& s : suites)
      if (s.name == name) return &s;
    return nullptr;
  };
  ASSERT_NE(named("quick"), nullptr);
  EXPECT_EQ(named("quick")->description, "my own quick");  // the override hides the source tree's
  ASSERT_NE(named("mine"), nullptr);
  EXPECT_EQ(named("mine")->description, "mine");
  EXPECT_EQ(named("notes"), nullptr);
  ASSERT_NE(named("gemm-deepbench"), nullptr);  // from the source tree: AB_SOURCE_DIR/suites
  const auto source_suites = std::filesystem::canonical(std::filesystem::path(AB_SOURCE_DIR) / "suites");
  EXPECT_EQ(named("gemm-deepbench")->path, source_suites / "gemm-deepbench.yaml");

  const auto quick = find_bundled_suite("quick.yaml");
  ASSERT_TRUE(quick);
  EXPECT_EQ(*quick, source_suites / "quick.yaml");  // the override unset again
  EXPECT_FALSE(find_bundled_suite("no-such-suite"));
  EXPECT_FALSE(find_bundled_suite("suites/quick.yaml"));  // a path is a path, never a bundled name
}

}  // namespace
