// Tests for src/backend: the float64 reference GEMM against hand-computed values, rel_error, the
// CPU backend's GEMM and STREAM kernels against the reference, device ids and names, the timer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/ref/ref.h"
#include "core/error.h"
#include "core/rng.h"

namespace ab::backend {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();


GemmDesc desc(std::int64_t m, std::int64_t n, std::int64_t k, bool ta, bool tb,
              Precision p = Precision::fp32) {
  GemmDesc d;
  d.precision = p;
  d.m = m;
  d.n = n;
  d.k = k;
  d.trans_a = ta;
  d.trans_b = tb;
  return d;
}

// ---------------------------------------------------------------------------------------------
// Reference GEMM

// m = 2, n = 3, k = 2:  A = [1 2; 3 4],  B = [5 6 7; 8 9 10],  C = A B = [21 24 27; 47 54 61].
const std::vector<double> kA_NoTrans{1, 3, 2, 4};          // A column-major (m x k)
const std::vector<double> kA_Trans{1, 2, 3, 4};            // A^T stored column-major (k x m)
const std::vector<double> kB_NoTrans{5, 8, 6, 9, 7, 10};   // B column-major (k x n)
const std::vector<double> kB_Trans{5, 6, 7, 8, 9, 10};     // B^T stored column-major (n x k)
const std::vector<double> kC{21, 47, 24, 54, 27, 61};      // C column-major (m x n)

TEST(RefGemm, HandComputed2x3x2AllTransposes) {
  EXPECT_EQ(ref::gemm(desc(2, 3, 2, false, false), kA_NoTrans, kB_NoTrans), kC);
  EXPECT_EQ(ref::gemm(desc(2, 3, 2, true, false), kA_Trans, kB_NoTrans), kC);
  EXPECT_EQ(ref::gemm(desc(2, 3, 2, false, true), kA_NoTrans, kB_Trans), kC);
  EXPECT_EQ(ref::gemm(desc(2, 3, 2, true, true), kA_Trans, kB_Trans), kC);
}

TEST(RefGemm, HandComputedDistinctDims) {
  // m = 3, n = 1, k = 2: A = [1 2; 3 4; 5 6], B = [1; -1] -> C = [-1; -1; -1]; and B = [2; 1].
  const std::vector<double> a{1, 3, 5, 2, 4, 6};
  EXPECT_EQ(ref::gemm(desc(3, 1, 2, false, false), a, {1, -1}), (std::vector<double>{-1, -1, -1}));
  EXPECT_EQ(ref::gemm(desc(3, 1, 2, false, false), a, {2, 1}), (std::vector<double>{4, 10, 16}));
  // Same with A transposed in storage (k x m = 2 x 3 column-major) and B^T (1 x 2).
  const std::vector<double> at{1, 2, 3, 4, 5, 6};
  EXPECT_EQ(ref::gemm(desc(3, 1, 2, true, true), at, {2, 1}), (std::vector<double>{4, 10, 16}));
}

// Stores the m x k column-major matrix `a` transposed (k x m column-major).
std::vector<double> transpose(const std::vector<double>& a, std::int64_t rows, std::int64_t cols) {
  std::vector<double> t(a.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      t[static_cast<std::size_t>(j + i * cols)] = a[static_cast<std::size_t>(i + j * rows)];
  return t;
}

TEST(RefGemm, TransposedStorageGivesTheSameProduct) {
  const std::int64_t m = 5, n = 3, k = 4;
  std::vector<double> a(m * k), b(k * n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = uniform(1, i, -1, 1);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = uniform(2, i, -1, 1);
  const auto c = ref::gemm(desc(m, n, k, false, false), a, b);
  ASSERT_EQ(c.size(), static_cast<std::size_t>(m * n));
  // Element (2, 1) by hand.
  double c21 = 0;
  for (std::int64_t l = 0; l < k; ++l) c21 += a[static_cast<std::size_t>(2 + l * m)] * b[static_cast<std::size_t>(l + 1 * k)];
  EXPECT_DOUBLE_EQ(c[2 + 1 * m], c21);
  const auto at = transpose(a, m, k), bt = transpose(b, k, n);
  EXPECT_EQ(ref::gemm(desc(m, n, k, true, false), at, b), c);
  EXPECT_EQ(ref::gemm(desc(m, n, k, false, true), a, bt), c);
  EXPECT_EQ(ref::gemm(desc(m, n, k, true, true), at, bt), c);
}

// ---------------------------------------------------------------------------------------------
// rel_error

TEST(RelError, Basics) {
  const std::vector<double> want{1.0, -2.0, 3.0};
  EXPECT_EQ(ref::rel_error(want, want), 0.0);
  std::vector<double> scaled = want;
  for (auto& v : scaled) v *= 1.001;
  EXPECT_NEAR(ref::rel_error(scaled, want), 1e-3, 1e-12);
  // |(0, 0, 4) - (0, 0, 3)| / |(1, -2, 3)| = 1 / sqrt(14)
  EXPECT_NEAR(ref::rel_error({1.0, -2.0, 4.0}, want), 1.0 / std::sqrt(14.0), 1e-12);
  EXPECT_EQ(ref::rel_error({}, {}), 0.0);
  EXPECT_EQ(ref::rel_error({0.0, 0.0}, {0.0, 0.0}), 0.0);
  EXPECT_EQ(ref::rel_error({0.0, 1e-30}, {0.0, 0.0}), kInf);
}

TEST(RelError, NonFiniteAndSizeMismatchAreInfinite) {
  const std::vector<double> want{1.0, 2.0, 3.0};
  EXPECT_EQ(ref::rel_error({1.0, std::nan(""), 3.0}, want), kInf);
  EXPECT_EQ(ref::rel_error({1.0, kInf, 3.0}, want), kInf);
  EXPECT_EQ(ref::rel_error({1.0, -kInf, 3.0}, want), kInf);
  EXPECT_EQ(ref::rel_error({1.0, 2.0}, want), kInf);
  EXPECT_EQ(ref::rel_error({1.0, 2.0, 3.0, 4.0}, want), kInf);
  // A broken reference is no better than a broken result.
  EXPECT_EQ(ref::rel_error(want, {1.0, std::nan(""), 3.0}), kInf);
}

TEST(RelError, TolerancesAreOrderedByPrecision) {
  EXPECT_GT(ref::gemm_tolerance(Precision::fp32), 0.0);
  EXPECT_LT(ref::gemm_tolerance(Precision::fp32), ref::gemm_tolerance(Precision::tf32));
  EXPECT_LE(ref::gemm_tolerance(Precision::fp16), ref::gemm_tolerance(Precision::bf16));
  EXPECT_EQ(ref::gemm_tolerance(Precision::int8), 0.0);
}

// ---------------------------------------------------------------------------------------------
// CPU backend

class CpuBackendTest : public ::testing::Test {
 protected:
  void SetUp() override { be_ = make_backend("cpu"); }
  std::unique_ptr<Backend> be_;
};

TEST_F(CpuBackendTest, GemmFp32MatchesReferenceInAllTransposes) {
  const std::int64_t m = 37, n = 29, k = 41;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::string(ta ? "T" : "N") + (tb ? "T" : "N"));
      const GemmDesc d = desc(m, n, k, ta, tb);
      auto plan = be_->make_gemm(d);
      ASSERT_NE(plan, nullptr);
      EXPECT_FALSE(plan->algorithm().empty());
      plan->run();
      be_->synchronize();
      const auto a = plan->a_values(), b = plan->b_values(), c = plan->c_values();
      ASSERT_EQ(a.size(), static_cast<std::size_t>(m * k));
      ASSERT_EQ(b.size(), static_cast<std::size_t>(k * n));
      ASSERT_EQ(c.size(), static_cast<std::size_t>(m * n));
      // Inputs are random in [-1, 1], not constant.
      EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](double v) { return v >= -1 && v <= 1; }));
      EXPECT_NE(*std::min_element(a.begin(), a.end()), *std::max_element(a.begin(), a.end()));
      EXPECT_NE(a, std::vector<double>(a.size(), a[0]));
      EXPECT_TRUE(std::any_of(c.begin(), c.end(), [](double v) { return std::fabs(v) > 1e-3; }))
          << "output is all zero";
      const auto want = ref::gemm(d, a, b);
      const double err = ref::rel_error(c, want);
      EXPECT_LE(err, ref::gemm_tolerance(Precision::fp32));
      // Reading A's storage with the other transpose gives a clearly different product, so the
      // comparison above really tells the layouts apart.
      GemmDesc flipped = d;
      flipped.trans_a = !ta;
      EXPECT_GT(ref::rel_error(c, ref::gemm(flipped, a, b)), 0.1);
    }
  }
}

TEST_F(CpuBackendTest, GemmRunsRepeatedlyAndFreshDataPerPlan) {
  auto p1 = be_->make_gemm(desc(16, 8, 4, false, false));
  auto p2 = be_->make_gemm(desc(16, 8, 4, false, false));
  EXPECT_NE(p1->a_values(), p2->a_values()) << "each plan draws fresh random inputs";
  p1->run();
  const auto c1 = p1->c_values();
  p1->run();
  EXPECT_EQ(p1->c_values(), c1) << "C = A B, not C += A B";
}

TEST_F(CpuBackendTest, GemmOtherPrecisionsAreUnsupported) {
  for (Precision p : {Precision::tf32, Precision::fp16, Precision::bf16, Precision::fp8, Precision::int8}) {
    const std::string msg = ab::test::error_message<Unsupported>([&] { be_->make_gemm(desc(8, 8, 8, false, false, p)); });
    EXPECT_NE(msg.find(std::string(to_string(p))), std::string::npos) << msg;
  }
}

TEST_F(CpuBackendTest, StreamOpsMatchTheHost) {
  for (StreamOp op : {StreamOp::copy, StreamOp::scale, StreamOp::add, StreamOp::triad}) {
    SCOPED_TRACE(stream_op_name(op));
    auto plan = be_->make_stream(op, 10007);
    ASSERT_NE(plan, nullptr);
    plan->run();
    const double err = plan->check();
    EXPECT_GE(err, 0.0);
    EXPECT_LT(err, 1e-12);
  }
}

TEST_F(CpuBackendTest, CopyIsUnsupported) {
  for (CopyKind k : {CopyKind::host_to_device, CopyKind::device_to_host, CopyKind::device_to_device})
    EXPECT_THROW(be_->make_copy(k, HostMemory::pinned, 4096), Unsupported) << copy_kind_name(k);
}

TEST_F(CpuBackendTest, InfoDescribesTheHost) {
  const DeviceInfo& info = be_->info();
  EXPECT_EQ(info.id, "cpu");
  EXPECT_EQ(info.kind, "cpu");
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.memory_bytes, 0);
  EXPECT_GE(info.compute_units, 1);
  EXPECT_TRUE(info.compute_capability.empty());
  EXPECT_TRUE(info.versions.count("openblas")) << "versions name the BLAS";
}

TEST_F(CpuBackendTest, TimerReturnsPositiveElapsedTimes) {
  auto timer = be_->make_timer();
  ASSERT_NE(timer, nullptr);
  int runs = 0;
  volatile double sink = 0;
  const auto work = [&] {
    ++runs;
    double s = 0;
    for (int i = 0; i < 20000; ++i) s += std::sqrt(static_cast<double>(i));
    sink = s;
  };
  const double t10 = timer->time_batch(work, 10);
  EXPECT_EQ(runs, 10);
  EXPECT_GT(t10, 0.0);
  EXPECT_LT(t10, 5.0);
  const double sleep = timer->time_batch([] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }, 2);
  EXPECT_GE(sleep, 4e-3);
  const double cold = timer->time_cold(work);
  EXPECT_EQ(runs, 11);
  EXPECT_GT(cold, 0.0);
  (void)sink;
}

// ---------------------------------------------------------------------------------------------
// Devices and names

TEST(Devices, MakeBackend) {
  auto cpu = make_backend("cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->info().id, "cpu");
  for (const char* bad : {"gpu", "cuda:x", "cuda:", "cuda:-1", "cuda:0x", "cuda: 0", "CPU", "", "cuda0"}) {
    const std::string msg = ab::test::error_message<UsageError>([&] { make_backend(bad); });
    EXPECT_NE(msg.find("cpu"), std::string::npos) << bad << ": " << msg;
  }
}

TEST(Devices, CudaIdInCpuOnlyBuildIsAnErrorNotAUsageError) {
  if (cuda_built()) GTEST_SKIP() << "CUDA build: cuda:0 depends on the machine";
  try {
    make_backend("cuda:0");
    FAIL() << "cuda:0 accepted by a CPU-only build";
  } catch (const UsageError& e) {
    FAIL() << "well-formed id reported as a usage error: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_backend("cuda:7"), Error);
}

TEST(Devices, BestAndListed) {
  const std::vector<DeviceInfo> devices = list_devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices.front().id, "cpu");
  EXPECT_EQ(devices.front().kind, "cpu");
  const std::string best = best_device();
  if (!cuda_built() || devices.size() == 1) {
    EXPECT_EQ(best, "cpu");
  } else {
    EXPECT_EQ(best, "cuda:0");
  }
  // The best device can be made.
  EXPECT_NE(make_backend(best), nullptr);
  EXPECT_EQ(cpu::device_info().id, "cpu");
}

TEST(Names, StreamOps) {
  for (StreamOp op : {StreamOp::copy, StreamOp::scale, StreamOp::add, StreamOp::triad})
    EXPECT_EQ(parse_stream_op(stream_op_name(op)), op);
  EXPECT_EQ(stream_op_name(StreamOp::triad), "triad");
  EXPECT_EQ(stream_arrays_touched(StreamOp::copy), 2);
  EXPECT_EQ(stream_arrays_touched(StreamOp::scale), 2);
  EXPECT_EQ(stream_arrays_touched(StreamOp::add), 3);
  EXPECT_EQ(stream_arrays_touched(StreamOp::triad), 3);
  const std::string msg = ab::test::error_message<UsageError>([] { parse_stream_op("fma"); });
  for (const char* n : {"fma", "copy", "scale", "add", "triad"})
    EXPECT_NE(msg.find(n), std::string::npos) << n << " missing from: " << msg;
  EXPECT_THROW(parse_stream_op("Copy"), UsageError);
}

TEST(Names, CopyKinds) {
  EXPECT_EQ(parse_copy_kind("h2d"), CopyKind::host_to_device);
  EXPECT_EQ(parse_copy_kind("d2h"), CopyKind::device_to_host);
  EXPECT_EQ(parse_copy_kind("d2d"), CopyKind::device_to_device);
  for (CopyKind k : {CopyKind::host_to_device, CopyKind::device_to_host, CopyKind::device_to_device})
    EXPECT_EQ(parse_copy_kind(copy_kind_name(k)), k);
  const std::string msg = ab::test::error_message<UsageError>([] { parse_copy_kind("h2h"); });
  for (const char* n : {"h2h", "h2d", "d2h", "d2d"}) EXPECT_NE(msg.find(n), std::string::npos) << msg;
}

}  // namespace
}  // namespace ab::backend
