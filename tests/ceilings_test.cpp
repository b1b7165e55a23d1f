// Ceilings as the derived figures judge them (which points measure one, why a point stands above
// 100%, the datasheet table beside the measured figure) and where the bundled suites are found.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "results/results.h"
#include "system/paths.h"

namespace ab {
namespace {
namespace fs = std::filesystem;
using namespace ab::results;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Datasheet, EveryShippedPartHasItsPeaks) {
  for (const char* name : {"NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200",
                           "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA B200", "NVIDIA GB200"}) {
    SCOPED_TRACE(name);
    const DatasheetPeaks* row = datasheet_peaks(name);
    ASSERT_NE(row, nullptr);
    for (const char* key : {"gemm.bf16", "gemm.fp16", "gemm.tf32", "memory.bandwidth"})
      EXPECT_GT(datasheet_value(*row, key), 0.0) << key;
    // Tensor-core rates: tf32 below fp16, fp16 below fp8 where the part has fp8.
    EXPECT_LT(datasheet_value(*row, "gemm.tf32"), datasheet_value(*row, "gemm.fp16"));
    if (datasheet_value(*row, "gemm.fp8") > 0) {
      EXPECT_LT(datasheet_value(*row, "gemm.fp16"), datasheet_value(*row, "gemm.fp8"));
    }
  }
  EXPECT_EQ(datasheet_peaks("AMD EPYC 7B13"), nullptr);
  EXPECT_EQ(datasheet_peaks(""), nullptr);
}

TEST(Datasheet, TheSpecificFormMatchesBeforeTheFamily) {
  EXPECT_DOUBLE_EQ(datasheet_value(*datasheet_peaks("NVIDIA H200"), "gemm.bf16"), 989.4);
  EXPECT_DOUBLE_EQ(datasheet_value(*datasheet_peaks("NVIDIA H200"), "memory.bandwidth"), 4800.0);
  EXPECT_DOUBLE_EQ(datasheet_value(*datasheet_peaks("NVIDIA H100 PCIe"), "memory.bandwidth"), 2000.0);
  EXPECT_DOUBLE_EQ(datasheet_value(*datasheet_peaks("NVIDIA H100 80GB HBM3"), "memory.bandwidth"), 3350.0);
  // An H100 whose name tells no form is bounded by the highest of its forms.
  EXPECT_DOUBLE_EQ(datasheet_value(*datasheet_peaks("NVIDIA H100"), "memory.bandwidth"), 3900.0);
  EXPECT_DOUBLE_EQ(datasheet_value(*datasheet_peaks("NVIDIA H100"), "gemm.bf16"), 989.4);
  // GB200 contains "B200": its own row comes first.
  EXPECT_NE(datasheet_peaks("NVIDIA GB200")->part, datasheet_peaks("NVIDIA B200")->part);
  EXPECT_DOUBLE_EQ(datasheet_value(*datasheet_peaks("NVIDIA B200"), "gemm.fp64"), 37.0);
  EXPECT_DOUBLE_EQ(datasheet_value(*datasheet_peaks("NVIDIA A100-SXM4-80GB"), "gemm.fp8"), 0.0);  // none
  // The physical limit is the same table's figure, marked as a datasheet's.
  const PhysicalLimit l40s = physical_limit("NVIDIA L40S", "gemm.fp8");
  EXPECT_DOUBLE_EQ(l40s.value, 733.0);
  EXPECT_TRUE(contains(l40s.source, "datasheet: NVIDIA L40S")) << l40s.source;
}

TEST(Ceilings, WhichPointsMeasureOne) {
  const double llc = 32.0 * 1024 * 1024;
  EXPECT_TRUE(measures_ceiling("gemm.fp32", 1e3, llc));  // a GEMM of any shape
  EXPECT_TRUE(measures_ceiling("memory.bandwidth", kDramWorkingSetFactor * llc, llc));
  EXPECT_FALSE(measures_ceiling("memory.bandwidth", kDramWorkingSetFactor * llc - 1, llc));
  EXPECT_FALSE(measures_ceiling("memory.bandwidth", 2.0 * 1024 * 1024, llc));  // a 1 MiB stream copy
  // A device that reports no cache: only working sets beyond any last-level cache in use.
  EXPECT_FALSE(measures_ceiling("memory.bandwidth", 256.0 * 1024 * 1024, 0));
  EXPECT_TRUE(measures_ceiling("memory.bandwidth", kDramWorkingSetFactor * kUnknownCacheBytes, 0));
  EXPECT_FALSE(measures_ceiling("", 1e12, llc));
}

TEST(Ceilings, APointAboveItsCeilingSaysWhy) {
  const double llc = 32.0 * 1024 * 1024;
  EXPECT_EQ(above_ceiling_cause("memory.bandwidth", 99.9, 1e6, llc, false), "");
  const std::string cache = above_ceiling_cause("memory.bandwidth", 1990.0, 2.0 * 1024 * 1024, llc, false);
  EXPECT_EQ(cache.rfind("cache-resident working set", 0), 0u) << cache;
  EXPECT_TRUE(contains(cache, "2 MiB")) << cache;
  EXPECT_TRUE(contains(cache, "32 MiB last-level cache")) << cache;
  const std::string stored = above_ceiling_cause("gemm.fp32", 131.0, 1e6, llc, true);
  EXPECT_TRUE(contains(stored, "earlier run")) << stored;
  EXPECT_TRUE(contains(stored, "accelbench run ceilings")) << stored;

  Record r;
  r.rates = Rates{};
  r.rates->pct_of_ceiling = 1990.04;
  r.rates->ceiling = CeilingRef{"memory.bandwidth", "GB/s", "run a seq 1", 10.0};
  r.metrics = {{"above_ceiling", cache}};
  EXPECT_EQ(pct_of_ceiling_text(r), "1990.0% cache");
  r.metrics = {{"above_ceiling", stored}};
  EXPECT_EQ(pct_of_ceiling_text(r), "1990.0% stale");
  r.metrics = nullptr;
  r.rates->pct_of_ceiling = 87.04;
  EXPECT_EQ(pct_of_ceiling_text(r), "87.0%");
  r.rates->pct_of_ceiling.reset();
  r.rates->ceiling->source = "this point";
  EXPECT_EQ(pct_of_ceiling_text(r), "=ceiling");
  r.rates->ceiling.reset();
  EXPECT_EQ(pct_of_ceiling_text(r), "");
}

TEST(Ceilings, MeasuredBesideTheDatasheetAndHowToMeasureOne) {
  const std::string h200 = ceiling_line("NVIDIA H200", "gemm.bf16", 800.0, "TFLOP/s");
  EXPECT_TRUE(contains(h200, "800 TFLOP/s measured")) << h200;
  EXPECT_TRUE(contains(h200, "datasheet 989.4 TFLOP/s (NVIDIA H200 SXM)")) << h200;
  EXPECT_TRUE(contains(h200, "80.9% of it")) << h200;
  EXPECT_TRUE(contains(ceiling_line("AMD EPYC 7B13", "gemm.fp32", 1.0, "TFLOP/s"), "no datasheet figure"));
  EXPECT_EQ(missing_ceilings_line({}), "");
  const std::string line = missing_ceilings_line({"gemm.fp32", "memory.bandwidth"});
  EXPECT_TRUE(contains(line, "gemm.fp32, memory.bandwidth")) << line;
  EXPECT_TRUE(contains(line, "`accelbench run ceilings`")) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);  // one line
}

// A scratch install tree: <root>/bin/accelbench and <root>/share/accelbench/suites.
struct ScratchTree {
  fs::path root =
      fs::temp_directory_path() / ("ab-paths-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                   "-" + std::to_string(reinterpret_cast<std::uintptr_t>(this)));
  ScratchTree() { fs::create_directories(root / "bin"); }
  ~ScratchTree() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

TEST(SuitePaths, AnInstalledBinaryUsesTheSuitesBesideIt) {
  ScratchTree t;
  fs::create_directories(t.root / "share" / "accelbench" / "suites");
  const auto dirs = system::suite_search_dirs(t.root / "bin" / "accelbench");
  ASSERT_FALSE(dirs.empty());
  EXPECT_EQ(dirs.front(), fs::weakly_canonical(t.root / "share" / "accelbench" / "suites"));
  // The source tree's suites are not consulted by an installed binary.
  for (const auto& d : dirs) EXPECT_NE(d, fs::weakly_canonical(fs::path(AB_SOURCE_DIR) / "suites"));
  // Behind the launcher: <root>/libexec/accelbench/accelbench.
  fs::create_directories(t.root / "libexec" / "accelbench");
  const auto behind = system::suite_search_dirs(t.root / "libexec" / "accelbench" / "accelbench");
  ASSERT_FALSE(behind.empty());
  EXPECT_EQ(behind.front(), fs::weakly_canonical(t.root / "share" / "accelbench" / "suites"));
}

TEST(SuitePaths, ABuildTreeBinaryUsesTheSourceTreesSuites) {
  ScratchTree t;  // no share/ beside it
  const auto dirs = system::suite_search_dirs(t.root / "bin" / "accelbench");
  ASSERT_FALSE(dirs.empty());
  EXPECT_EQ(dirs.front(), fs::weakly_canonical(fs::path(AB_SOURCE_DIR) / "suites"));
  EXPECT_TRUE(fs::exists(dirs.front() / "quick.yaml"));
  const std::set<fs::path> unique(dirs.begin(), dirs.end());
  EXPECT_EQ(unique.size(), dirs.size());
  // This test binary is in the build tree: the same rule from /proc/self/exe.
  EXPECT_EQ(system::suite_search_dirs().front(), dirs.front());
}

}  // namespace
}  // namespace ab
