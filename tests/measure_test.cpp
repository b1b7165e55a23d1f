// Tests for src/measure: summary statistics against hand-computed values, the median's confidence
// ranks, the stopping rule on its own, and the measurement loop driven by a scripted fake timer.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/rng.h"
#include "measure/measure.h"
#include "measure/stats.h"
#include "measure/timer.h"

namespace ab::measure {
namespace {

constexpr double kEps = 1e-12;

// ---------------------------------------------------------------------------------------------
// Statistics

TEST(Summarize, OneToTenHandComputed) {
  // Shuffled on purpose: summarize must sort.
  const std::vector<double> data{7, 3, 10, 1, 5, 9, 2, 8, 6, 4};
  const Summary s = summarize(data);
  EXPECT_EQ(s.count, 10u);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 10);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  // Type 7: rank h = (n-1) p / 100 = 9p/100, 0-based.
  EXPECT_NEAR(s.median, 5.5, kEps);  // h = 4.5
  EXPECT_NEAR(s.p90, 9.1, kEps);     // h = 8.1
  EXPECT_NEAR(s.p99, 9.91, kEps);    // h = 8.91
  EXPECT_NEAR(s.q1, 3.25, kEps);     // h = 2.25
  EXPECT_NEAR(s.q3, 7.75, kEps);     // h = 6.75
  EXPECT_NEAR(s.iqr, 4.5, kEps);
  EXPECT_NEAR(s.stddev, std::sqrt(82.5 / 9.0), kEps);  // sample (n-1) stddev = 3.02765...
  // n = 10: the CI ranks clamp to the whole sample, so spread = (10 - 1) / (2 * 5.5).
  EXPECT_NEAR(s.rel_spread, 9.0 / 11.0, kEps);
}

TEST(Summarize, SkewedSetHandComputed) {
  const std::vector<double> data{100, 1, 2, 1, 10, 3, 1, 5, 2, 1};
  const Summary s = summarize(data);
  EXPECT_EQ(s.count, 10u);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 100);
  EXPECT_NEAR(s.mean, 12.6, kEps);
  // sorted: 1 1 1 1 2 2 3 5 10 100
  EXPECT_NEAR(s.median, 2.0, kEps);    // h = 4.5 between 2 and 2
  EXPECT_NEAR(s.p90, 19.0, 1e-9);      // h = 8.1: 10 + 0.1 * 90
  EXPECT_NEAR(s.p99, 91.9, 1e-9);      // h = 8.91: 10 + 0.91 * 90
  EXPECT_NEAR(s.q1, 1.0, kEps);        // h = 2.25 between 1 and 1
  EXPECT_NEAR(s.q3, 4.5, kEps);        // h = 6.75: 3 + 0.75 * 2
  EXPECT_NEAR(s.iqr, 3.5, kEps);
  EXPECT_NEAR(s.stddev, std::sqrt(8558.4 / 9.0), 1e-9);  // 30.8372...
  EXPECT_NEAR(s.rel_spread, 99.0 / 4.0, kEps);
  // The mean is pulled far above the median by the outlier.
  EXPECT_GT(s.mean, 5 * s.median);
}

TEST(Summarize, RelSpreadUsesTheMedianConfidenceRanks) {
  // 1..100: CI ranks (0-based) 39 and 60, i.e. values 40 and 61; median 50.5.
  std::vector<double> data;
  for (int i = 100; i >= 1; --i) data.push_back(i);
  const Summary s = summarize(data);
  EXPECT_NEAR(s.median, 50.5, kEps);
  EXPECT_NEAR(s.rel_spread, (61.0 - 40.0) / (2.0 * 50.5), kEps);
  // Scaling every sample scales nothing relative.
  for (auto& v : data) v *= 1e-6;
  EXPECT_NEAR(summarize(data).rel_spread, (61.0 - 40.0) / (2.0 * 50.5), 1e-9);
}

TEST(Summarize, ConstantDataHasNoSpread) {
  const std::vector<double> data(50, 0.25);
  const Summary s = summarize(data);
  EXPECT_EQ(s.count, 50u);
  EXPECT_DOUBLE_EQ(s.median, 0.25);
  EXPECT_DOUBLE_EQ(s.p99, 0.25);
  EXPECT_DOUBLE_EQ(s.stddev, 0.0);
  EXPECT_DOUBLE_EQ(s.iqr, 0.0);
  EXPECT_DOUBLE_EQ(s.rel_spread, 0.0);
}

TEST(Summarize, SingleSampleAndEmpty) {
  const std::vector<double> one{3.5};
  const Summary s = summarize(one);
  EXPECT_EQ(s.count, 1u);
  EXPECT_DOUBLE_EQ(s.min, 3.5);
  EXPECT_DOUBLE_EQ(s.max, 3.5);
  EXPECT_DOUBLE_EQ(s.median, 3.5);
  EXPECT_DOUBLE_EQ(s.p90, 3.5);
  EXPECT_DOUBLE_EQ(s.stddev, 0.0);  // undefined for n = 1; reported as 0, not NaN
  EXPECT_DOUBLE_EQ(s.rel_spread, 0.0);
  const Summary e = summarize(std::vector<double>{});
  EXPECT_EQ(e.count, 0u);
  EXPECT_DOUBLE_EQ(e.median, 0.0);
}

TEST(Percentile, EdgeCases) {
  const std::vector<double> one{42.0};
  for (double p : {0.0, 1.0, 50.0, 99.0, 100.0}) EXPECT_DOUBLE_EQ(percentile_sorted(one, p), 42.0) << p;
  const std::vector<double> four{1.0, 2.0, 4.0, 8.0};
  EXPECT_DOUBLE_EQ(percentile_sorted(four, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile_sorted(four, 100), 8.0);
  EXPECT_DOUBLE_EQ(percentile_sorted(four, 50), 3.0);                  // h = 1.5
  EXPECT_NEAR(percentile_sorted(four, 90), 4.0 + 0.7 * 4.0, kEps);     // h = 2.7
  EXPECT_NEAR(percentile_sorted(four, 100.0 / 3.0), 2.0, kEps);        // h = 1 exactly
  const std::vector<double> two{10.0, 20.0};
  EXPECT_DOUBLE_EQ(percentile_sorted(two, 50), 15.0);
  EXPECT_DOUBLE_EQ(percentile_sorted(two, 25), 12.5);
  // Monotone in p.
  double prev = -1;
  for (int p = 0; p <= 100; ++p) {
    const double v = percentile_sorted(four, p);
    EXPECT_GE(v, prev);
    prev = v;
  }
}

TEST(MedianCiRanks, SmallN) {
  const RankInterval r1 = median_ci_ranks(1);
  EXPECT_EQ(r1.lo, 0u);
  EXPECT_EQ(r1.hi, 0u);
  const RankInterval r5 = median_ci_ranks(5);
  EXPECT_EQ(r5.lo, 0u);
  EXPECT_EQ(r5.hi, 4u);
  const RankInterval r10 = median_ci_ranks(10);
  EXPECT_EQ(r10.lo, 0u);
  EXPECT_EQ(r10.hi, 9u);
  for (std::size_t n = 1; n < 20; ++n) {
    const RankInterval r = median_ci_ranks(n);
    EXPECT_LE(r.lo, r.hi) << n;
    EXPECT_LT(r.hi, n) << n;
  }
}

TEST(MedianCiRanks, TextbookValues) {
  // Conover's normal approximation, 1-based: floor(n/2 - 0.98 sqrt n) .. ceil(n/2 + 0.98 sqrt n) + 1.
  const RankInterval r100 = median_ci_ranks(100);
  EXPECT_EQ(r100.lo, 39u);  // 1-based 40
  EXPECT_EQ(r100.hi, 60u);  // 1-based 61
  const RankInterval r1000 = median_ci_ranks(1000);
  EXPECT_EQ(r1000.lo, 468u);
  EXPECT_EQ(r1000.hi, 531u);
  const RankInterval r101 = median_ci_ranks(101);
  EXPECT_EQ(r101.lo, 39u);
  EXPECT_EQ(r101.hi, 61u);
}

TEST(MedianCiRanks, SymmetricBoundedAndWidthGrowsLikeSqrtN) {
  for (std::size_t n = 1; n <= 20000; n += (n < 200 ? 1 : 97)) {
    const RankInterval r = median_ci_ranks(n);
    ASSERT_LE(r.lo, r.hi) << n;
    ASSERT_LT(r.hi, n) << n;
    // The median's rank (n - 1) / 2 lies inside.
    ASSERT_LE(2 * r.lo, n - 1) << n;
    ASSERT_GE(2 * r.hi, n - 1) << n;
    if (r.lo > 0) {
      // Unclamped: symmetric around the median, lo + hi = n - 1.
      ASSERT_EQ(r.lo + r.hi, n - 1) << n;
      const double width = static_cast<double>(r.hi - r.lo);
      const double expected = 1.96 * std::sqrt(static_cast<double>(n));
      ASSERT_GE(width, expected - 0.5) << n;
      ASSERT_LE(width, expected + 3.0) << n;
    }
  }
  // Large n: the interval is a small fraction of the sample.
  const RankInterval big = median_ci_ranks(1000000);
  EXPECT_NEAR(static_cast<double>(big.hi - big.lo), 1960.0, 3.0);
  EXPECT_EQ(big.lo + big.hi, 999999u);
}

// ---------------------------------------------------------------------------------------------
// Stopping rule

Settings rule_settings() {
  Settings s;
  s.min_samples = 10;
  s.min_time_s = 1.0;
  s.max_samples = 100;
  s.timeout_s = 10.0;
  s.max_noise_pct = 1.0;
  s.min_window_s = 0.0;
  return s;
}

std::vector<double> noisy(std::size_t n) {
  std::vector<double> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(uniform(11, i, 1e-3, 1e-1));
  return v;
}

TEST(ShouldStop, WaitsForMinimumSamples) {
  const Settings s = rule_settings();
  const StopDecision d = should_stop(std::vector<double>(9, 1e-3), 5.0, 5.0, s);
  EXPECT_FALSE(d.stop);
  EXPECT_TRUE(should_stop(std::vector<double>(10, 1e-3), 5.0, 5.0, s).stop);
}

TEST(ShouldStop, WaitsForMinimumTime) {
  const Settings s = rule_settings();
  EXPECT_FALSE(should_stop(std::vector<double>(50, 1e-3), 0.99, 5.0, s).stop);
  const StopDecision d = should_stop(std::vector<double>(50, 1e-3), 1.0, 5.0, s);
  EXPECT_TRUE(d.stop);
  EXPECT_TRUE(d.converged);
  EXPECT_EQ(d.reason, "noise below target");
}

TEST(ShouldStop, WaitsForMinimumWindow) {
  Settings s = rule_settings();
  s.min_window_s = 3.0;
  EXPECT_FALSE(should_stop(std::vector<double>(50, 1e-3), 2.0, 5.0, s).stop);
  const StopDecision d = should_stop(std::vector<double>(50, 1e-3), 3.0, 5.0, s);
  EXPECT_TRUE(d.stop);
  EXPECT_TRUE(d.converged);
}

TEST(ShouldStop, NoiseTarget) {
  Settings s = rule_settings();
  // Noisy samples never meet 1%...
  const StopDecision d = should_stop(noisy(50), 2.0, 5.0, s);
  EXPECT_FALSE(d.stop);
  // ...but do meet a target looser than their spread.
  const double spread_pct = summarize(noisy(50)).rel_spread * 100;
  ASSERT_GT(spread_pct, 1.0);
  s.max_noise_pct = spread_pct * 1.01;
  EXPECT_TRUE(should_stop(noisy(50), 2.0, 5.0, s).converged);
  s.max_noise_pct = spread_pct * 0.99;
  EXPECT_FALSE(should_stop(noisy(50), 2.0, 5.0, s).stop);
  // Small relative jitter: 1e-3 +- 0.1% converges.
  std::vector<double> quiet;
  for (std::size_t i = 0; i < 50; ++i) quiet.push_back(uniform(3, i, 0.999e-3, 1.001e-3));
  s.max_noise_pct = 1.0;
  EXPECT_TRUE(should_stop(quiet, 2.0, 5.0, s).converged);
}

TEST(ShouldStop, TimeoutIsNotConverged) {
  const Settings s = rule_settings();
  const StopDecision d = should_stop(noisy(50), 2.0, 10.0, s);
  EXPECT_TRUE(d.stop);
  EXPECT_FALSE(d.converged);
  EXPECT_NE(d.reason.find("timeout"), std::string::npos) << d.reason;
  // The timeout applies even before the minimum count or time is reached.
  const StopDecision early = should_stop(std::vector<double>(3, 1e-3), 0.001, 11.0, s);
  EXPECT_TRUE(early.stop);
  EXPECT_FALSE(early.converged);
  // Even quiet samples are "not converged" when the clock ran out first.
  EXPECT_FALSE(should_stop(std::vector<double>(50, 1e-3), 2.0, 10.0, s).converged);
}

TEST(ShouldStop, SampleLimitIsNotConverged) {
  const Settings s = rule_settings();
  const StopDecision d = should_stop(noisy(100), 2.0, 5.0, s);
  EXPECT_TRUE(d.stop);
  EXPECT_FALSE(d.converged);
  EXPECT_NE(d.reason.find("sample limit"), std::string::npos) << d.reason;
  EXPECT_FALSE(should_stop(noisy(99), 2.0, 5.0, s).stop);
  // A cap below the minimum count still ends the loop.
  Settings tight = s;
  tight.max_samples = 5;
  EXPECT_TRUE(should_stop(std::vector<double>(5, 1e-3), 0.001, 0.0, tight).stop);
}

TEST(TimingMode, ParseAndNames) {
  EXPECT_EQ(parse_timing_mode("batch"), TimingMode::batch);
  EXPECT_EQ(parse_timing_mode("cold"), TimingMode::cold);
  EXPECT_EQ(to_string(TimingMode::batch), "batch");
  EXPECT_EQ(to_string(TimingMode::cold), "cold");
  try {
    parse_timing_mode("warm");
    FAIL() << "no exception";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("warm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("batch"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cold"), std::string::npos) << msg;
  }
  EXPECT_THROW(parse_timing_mode("Batch"), UsageError);
  EXPECT_THROW(parse_timing_mode(""), UsageError);
}

// ---------------------------------------------------------------------------------------------
// The loop, with a fake timer

// Returns scripted per-iteration times and records how it was called. Every call runs the
// iteration once so the tests can see it was handed through.
class FakeTimer final : public IterationTimer {
 public:
  explicit FakeTimer(std::function<double(int call)> per_iteration_s) : per_iteration_s_(std::move(per_iteration_s)) {}
  double time_batch(const std::function<void()>& iteration, std::int64_t count) override {
    iteration();
    batch_counts.push_back(count);
    after_call();
    return per_iteration_s_(calls_++) * static_cast<double>(count);
  }
  double time_cold(const std::function<void()>& iteration) override {
    iteration();
    ++cold_calls;
    after_call();
    return per_iteration_s_(calls_++);
  }

  std::vector<std::int64_t> batch_counts;
  int cold_calls = 0;
  std::chrono::microseconds real_delay{0};  // real time each call takes, for wall-clock limits
  std::function<void()> on_call;

 private:
  void after_call() {
    if (real_delay.count() > 0) std::this_thread::sleep_for(real_delay);
    if (on_call) on_call();
  }
  std::function<double(int)> per_iteration_s_;
  int calls_ = 0;
};

Settings fast_settings() {
  Settings s;
  s.min_time_s = 0.01;
  s.warmup_s = 0.0;
  s.timeout_s = 2.0;
  s.min_samples = 10;
  s.max_samples = 1000;
  s.max_noise_pct = 1.0;
  s.target_sample_s = 0x1.0p-8;  // 3.9 ms
  return s;
}

TEST(Run, ConstantTimesConvergeWithZeroSpread) {
  const double t = 0x1.0p-13;  // 122 us per iteration: 32 iterations per 2^-8 s sample, exactly
  FakeTimer timer([t](int) { return t; });
  int runs = 0;
  const Result r = run(timer, [&runs] { ++runs; }, fast_settings());
  EXPECT_TRUE(r.converged);
  EXPECT_EQ(r.stop_reason, "noise below target");
  EXPECT_EQ(r.iterations_per_sample, 32);
  // min_samples = 10 samples of 2^-8 s each already exceed min_time = 0.01 s.
  ASSERT_EQ(r.iteration_s.size(), 10u);
  for (double v : r.iteration_s) EXPECT_DOUBLE_EQ(v, t);
  EXPECT_EQ(r.total_iterations, 320);
  EXPECT_DOUBLE_EQ(r.measured_s, 10 * 0x1.0p-8);
  EXPECT_DOUBLE_EQ(r.summary.median, t);
  EXPECT_DOUBLE_EQ(r.summary.rel_spread, 0.0);
  EXPECT_EQ(r.summary.count, 10u);
  EXPECT_LE(r.window_start_s, r.window_end_s);
  EXPECT_GT(r.window_start_s, 0.0);
  // One estimating call of one iteration, then the samples.
  ASSERT_EQ(timer.batch_counts.size(), 11u);
  EXPECT_EQ(timer.batch_counts.front(), 1);
  for (std::size_t i = 1; i < timer.batch_counts.size(); ++i) EXPECT_EQ(timer.batch_counts[i], 32);
  EXPECT_EQ(timer.cold_calls, 0);
  EXPECT_EQ(runs, 11);
}

TEST(Run, MinTimeKeepsSampling) {
  Settings s = fast_settings();
  s.min_time_s = 0.1;  // 26 samples of 2^-8 s
  FakeTimer timer([](int) { return 0x1.0p-13; });
  const Result r = run(timer, [] {}, s);
  EXPECT_TRUE(r.converged);
  EXPECT_GE(r.measured_s, 0.1);
  EXPECT_GE(r.iteration_s.size(), 26u);
  EXPECT_LE(r.iteration_s.size(), 28u);  // checks every sample while few
}

TEST(Run, MinWindowKeepsSampling) {
  Settings s = fast_settings();
  s.min_window_s = 0.2;  // 52 samples of 2^-8 s
  FakeTimer timer([](int) { return 0x1.0p-13; });
  const Result r = run(timer, [] {}, s);
  EXPECT_TRUE(r.converged);
  EXPECT_GE(r.measured_s, 0.2);
  EXPECT_GE(r.iteration_s.size(), 52u);
  EXPECT_LE(r.iteration_s.size(), 56u);  // checked every ~5% more samples
}

TEST(Run, BatchCalibrationFromTargetSampleTime) {
  struct Case {
    double per_iteration_s, target_s;
    std::int64_t expected;
  };
  for (const Case& c : {Case{0x1.0p-16, 0x1.0p-8, 256}, Case{0x1.0p-13, 0x1.0p-8, 32},
                        Case{3e-3, 1e-2, 4},                  // ceil(3.33)
                        Case{0.01, 0.005, 1},                 // slower than a sample: one iteration
                        Case{0x1.0p-40, 0x1.0p-8, 1 << 20}}) {  // clamped
    Settings s = fast_settings();
    s.target_sample_s = c.target_s;
    s.max_samples = 12;
    // The deadline predicts a sample's wall time from the last call's (here the one-iteration
    // first call, ~2 us under the sanitizers): at 2^20 fake-fast iterations a 2 s timeout refused
    // the first sample whenever that call ran a little slow (1 run in 13 on a loaded host). The
    // timeout here admits a first call of up to 10 ms; this test is about the calibration.
    s.timeout_s = 1e4;
    FakeTimer timer([&c](int) { return c.per_iteration_s; });
    const Result r = run(timer, [] {}, s);
    EXPECT_EQ(r.iterations_per_sample, c.expected) << c.per_iteration_s << " / " << c.target_s;
    EXPECT_EQ(r.total_iterations, r.iterations_per_sample * static_cast<std::int64_t>(r.iteration_s.size()));
    ASSERT_FALSE(r.iteration_s.empty());
    EXPECT_DOUBLE_EQ(r.iteration_s.front(), c.per_iteration_s) << "sample time divided by iterations";
  }
}

TEST(Run, ASampleHoldsAtLeastTheMinimumIterations) {
  for (const auto& [minimum, expected] : {std::pair<std::int64_t, std::int64_t>{5, 5}, {0, 1}, {1, 1}}) {
    Settings s = fast_settings();
    s.target_sample_s = 0.005;
    s.min_iterations_per_sample = minimum;
    s.max_samples = 12;
    FakeTimer timer([](int) { return 0.01; });  // slower than the target: one iteration unless told more
    const Result r = run(timer, [] {}, s);
    EXPECT_EQ(r.iterations_per_sample, expected) << minimum;
    ASSERT_FALSE(r.iteration_s.empty());
    EXPECT_DOUBLE_EQ(r.iteration_s.front(), 0.01) << "sample time divided by iterations";
  }
}

TEST(Run, CalibrationUsesTheLastWarmupEstimate) {
  // The first call (lazy initialisation) is slow; the warm-up then sees the real speed.
  Settings s = fast_settings();
  s.warmup_s = 0.01;
  FakeTimer timer([](int call) { return call == 0 ? 1.0 : 0x1.0p-16; });
  const Result r = run(timer, [] {}, s);
  EXPECT_EQ(r.iterations_per_sample, 256);
  // Warm-up doubles its batch: 1, 2, 4, ..., 256 (511 iterations of 2^-16 s), then the 145 that
  // complete 0.01 s (655.36 iterations), between the estimating call and the samples.
  const std::size_t warm_calls = timer.batch_counts.size() - 1 - r.iteration_s.size();
  ASSERT_EQ(warm_calls, 10u);
  std::int64_t warm = 0;
  for (std::size_t i = 1; i <= warm_calls; ++i) {
    EXPECT_EQ(timer.batch_counts[i], i < warm_calls ? std::int64_t{1} << (i - 1) : 145);
    warm += timer.batch_counts[i];
  }
  EXPECT_EQ(warm, 656);
  for (std::size_t i = warm_calls + 1; i < timer.batch_counts.size(); ++i) EXPECT_EQ(timer.batch_counts[i], 256);
  // Warm-up iterations are not counted as measured.
  EXPECT_EQ(r.total_iterations, 256 * static_cast<std::int64_t>(r.iteration_s.size()));
  EXPECT_DOUBLE_EQ(r.summary.median, 0x1.0p-16);
  EXPECT_TRUE(r.converged);
}

TEST(Run, LongWarmupEndsNearItsLength) {
  // 5 s of 1 ms iterations: the doubling batches would run 8191 (8.2 s); capped to what is left, 5000.
  Settings s = fast_settings();
  s.warmup_s = 5.0;
  s.timeout_s = 20.0;
  FakeTimer timer([](int) { return 1e-3; });
  const Result r = run(timer, [] {}, s);
  const std::size_t warm_calls = timer.batch_counts.size() - 1 - r.iteration_s.size();
  std::int64_t warm = 0;
  for (std::size_t i = 1; i <= warm_calls; ++i) warm += timer.batch_counts[i];
  EXPECT_GE(warm, 5000);
  EXPECT_LE(warm, 5001);  // one iteration of rounding at most
  EXPECT_TRUE(r.converged);
}

TEST(Run, WarmupStopsAtHalfTheTimeout) {
  // Real time runs out before the asked warm-up: the samples still get the other half.
  Settings s = fast_settings();
  s.warmup_s = 1e6;
  s.timeout_s = 1.0;  // the other half wide enough for a loaded host's stalls
  FakeTimer timer([](int) { return 1e-3; });
  timer.real_delay = std::chrono::microseconds(2000);
  const double start_s = monotonic_seconds();
  const Result r = run(timer, [] {}, s);
  EXPECT_GE(r.window_start_s - start_s, 0.5);  // warmed up until half the timeout
  EXPECT_LT(r.window_start_s - start_s, 1.0);
  EXPECT_FALSE(r.iteration_s.empty());
}

TEST(Run, NoisyTimesHitTheSampleLimit) {
  Settings s = fast_settings();
  s.max_samples = 50;
  s.timeout_s = 5;  // not reached: the fake timer takes no real time
  FakeTimer timer([](int call) { return uniform(5, static_cast<std::uint64_t>(call), 1e-4, 1e-2); });
  const Result r = run(timer, [] {}, s);
  EXPECT_FALSE(r.converged);
  EXPECT_EQ(r.stop_reason, "sample limit reached");
  EXPECT_EQ(r.iteration_s.size(), 50u);
  EXPECT_GT(r.summary.rel_spread, 0.01);
  EXPECT_EQ(r.summary.count, 50u);
}

TEST(Run, NoisyTimesHitTheTimeout) {
  Settings s = fast_settings();
  s.timeout_s = 0.1;
  s.max_samples = 1000000;
  FakeTimer timer([](int call) { return uniform(6, static_cast<std::uint64_t>(call), 1e-4, 1e-2); });
  timer.real_delay = std::chrono::microseconds(1000);
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run(timer, [] {}, s);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(r.converged);
  EXPECT_NE(r.stop_reason.find("timeout"), std::string::npos) << r.stop_reason;
  EXPECT_GE(wall, 0.1);
  EXPECT_LT(wall, 1.0);
  EXPECT_GT(r.iteration_s.size(), 0u);
  EXPECT_LT(r.iteration_s.size(), 200u);  // ~1 ms of real time per sample
  EXPECT_GE(r.window_end_s - r.window_start_s, 0.05);
}

TEST(Run, TimeoutIsAHardLimitOnIssuedWork) {
  // 0.3 s per call under a 1 s timeout: the first call and two samples fit; a third would end at
  // 1.2 s, so it is not issued, and two of the ten samples asked make the point a timeout.
  Settings s = fast_settings();
  s.timeout_s = 1.0;
  FakeTimer timer([](int) { return 0.3; });
  timer.real_delay = std::chrono::microseconds(300000);
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run(
      timer, [] {}, s);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(wall, 1.1);
  EXPECT_EQ(timer.batch_counts.size(), 3u);
  EXPECT_EQ(r.iteration_s.size(), 2u);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.converged);
  EXPECT_NE(r.stop_reason.find("timeout: 2 of at least 10 samples"), std::string::npos) << r.stop_reason;
}

TEST(Run, EnoughSamplesAtTheTimeoutIsNotATimeout) {
  Settings s = fast_settings();
  s.timeout_s = 0.1;
  s.max_samples = 1000000;
  FakeTimer timer([](int call) { return uniform(7, static_cast<std::uint64_t>(call), 1e-4, 1e-2); });
  timer.real_delay = std::chrono::microseconds(1000);
  const Result r = run(
      timer, [] {}, s);
  EXPECT_GE(r.iteration_s.size(), s.min_samples);
  EXPECT_FALSE(r.timed_out);
}

TEST(Run, ColdModeTimesOneIterationPerSample) {
  Settings s = fast_settings();
  s.mode = TimingMode::cold;
  s.min_time_s = 0.001;
  FakeTimer timer([](int) { return 0x1.0p-10; });
  const Result r = run(timer, [] {}, s);
  EXPECT_TRUE(r.converged);
  EXPECT_EQ(r.iterations_per_sample, 1);
  EXPECT_EQ(r.iteration_s.size(), 10u);
  EXPECT_EQ(timer.cold_calls, 10);
  EXPECT_EQ(r.total_iterations, 10);
  EXPECT_DOUBLE_EQ(r.measured_s, 10 * 0x1.0p-10);
  // Only the estimating call goes through time_batch.
  ASSERT_EQ(timer.batch_counts.size(), 1u);
  EXPECT_EQ(timer.batch_counts[0], 1);
}

TEST(Run, CancelledBeforeTheFirstSample) {
  std::atomic<bool> cancel{true};
  FakeTimer timer([](int) { return 1e-3; });
  const Result r = run(timer, [] {}, fast_settings(), &cancel);
  EXPECT_EQ(r.stop_reason, "cancelled");
  EXPECT_FALSE(r.converged);
  EXPECT_TRUE(r.iteration_s.empty());
  EXPECT_EQ(r.summary.count, 0u);
}

TEST(Run, CancelEndsTheLoopAfterTheSampleInFlight) {
  std::atomic<bool> cancel{false};
  FakeTimer timer([](int) { return 1e-3; });
  int calls = 0;
  timer.on_call = [&] {
    if (++calls == 4) cancel = true;  // call 1 estimates; calls 2..4 are samples 1..3
  };
  Settings s = fast_settings();
  s.min_samples = 100;
  const Result r = run(timer, [] {}, s, &cancel);
  EXPECT_EQ(r.stop_reason, "cancelled");
  EXPECT_FALSE(r.converged);
  EXPECT_EQ(r.iteration_s.size(), 3u);
  EXPECT_EQ(r.summary.count, 3u);
}

TEST(Run, NullCancelPointerIsAllowed) {
  FakeTimer timer([](int) { return 1e-3; });
  const Result r = run(timer, [] {}, fast_settings(), nullptr);
  EXPECT_TRUE(r.converged);
}

TEST(SteadyClockTimer, TimesRealWork) {
  SteadyClockTimer timer(1 << 20);
  int runs = 0;
  const double t = timer.time_batch([&runs] {
    ++runs;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }, 5);
  EXPECT_EQ(runs, 5);
  EXPECT_GE(t, 5 * 200e-6);
  EXPECT_LT(t, 1.0);
  const double cold = timer.time_cold([&runs] { ++runs; });
  EXPECT_EQ(runs, 6);
  EXPECT_GE(cold, 0.0);
  const double a = monotonic_seconds();
  const double b = monotonic_seconds();
  EXPECT_LE(a, b);
}

}  // namespace
}  // namespace ab::measure
