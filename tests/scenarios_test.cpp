// Tests for src/scenarios (the load generator) and the loadgen workload: Poisson schedule
// statistics, LoadGen's percentile and the early-stopping maths against hand-computed values,
// validity rules, lost and misreported samples (bounded time, never a hang), refused settings,
// the dynamic batcher, MLLOG lines, the runner's `scenario` block, and the binary end to end.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.h"
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "harness/runner.h"
#include "harness/workload.h"
#include "scenarios/scenarios.h"
#include "scenarios/suts.h"
#include "workloads/loadgen.h"
#include "workloads/registry.h"

namespace ab::scenarios {
namespace {

using ab::test::TempDir;

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

double elapsed_s(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

bool has(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }



// Settings that make a run take a fraction of a second.
Settings fast(Scenario sc, double min_duration_s = 0.1) {
  Settings s = preset_settings(Preset::quick, sc);
  s.min_duration_s = min_duration_s;
  s.timeout_s = 5;
  s.drain_timeout_s = 0.2;
  s.search_min_duration_s = 0.05;
  s.search_min_query_count = 500;
  return s;
}

// Sleeps `delay` per batch: a SUT with a known service time.
class SleepExecutor final : public BatchExecutor {
 public:
  explicit SleepExecutor(double delay_s) : delay_s_(delay_s) {}
  std::string describe() const override { return "sleep"; }
  void run(std::span<const QuerySample>) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay_s_));
  }

 private:
  double delay_s_;
};

// Completes from several threads at once: the completion path under contention.
class ThreadedSut final : public SystemUnderTest {
 public:
  explicit ThreadedSut(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~ThreadedSut() override {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  std::string name() const override { return "threaded"; }
  void issue_query(std::span<const QuerySample> s, Completions& done) override {
    {
      std::lock_guard<std::mutex> l(m_);
      for (const auto& q : s) queue_.push_back({q, &done});
    }
    cv_.notify_one();
  }

 private:
  void work() {
    std::unique_lock<std::mutex> l(m_);
    while (true) {
      cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto [q, done] = queue_.front();
      queue_.pop_front();
      l.unlock();
      done->complete(std::span<const QuerySample>(&q, 1));
      l.lock();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<QuerySample, Completions*>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Reports every sample twice and one id it was never given.
class MisreportingSut final : public SystemUnderTest {
 public:
  std::string name() const override { return "misreporting"; }
  void issue_query(std::span<const QuerySample> s, Completions& done) override {
    done.complete(s);
    done.complete(s);
    const QuerySample bogus{s.back().id + 1000000, 0};
    done.complete(std::span<const QuerySample>(&bogus, 1));
  }
};

// ---------------------------------------------------------------------------------------------
// Poisson schedule

TEST(Poisson, InterArrivalMeanAndVarianceMatchTheRate) {
  const double qps = 2500;
  const int n = 200000;
  PoissonSchedule sched(qps, 12345);
  std::vector<double> gaps(n);
  for (auto& g : gaps) g = sched.next_gap_s();
  const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / n;
  double ss = 0;
  for (double g : gaps) ss += (g - mean) * (g - mean);
  const double var = ss / (n - 1);
  // Exponential(lambda): mean 1/lambda, variance 1/lambda^2; standard errors 1/(lambda sqrt n) and
  // sqrt(8/n)/lambda^2 (fourth central moment 9/lambda^4). Allow 5 standard errors.
  const double se_mean = 1 / qps / std::sqrt(n), se_var = std::sqrt(8.0 / n) / (qps * qps);
  EXPECT_NEAR(mean, 1 / qps, 5 * se_mean);
  EXPECT_NEAR(var, 1 / (qps * qps), 5 * se_var);
  EXPECT_GT(*std::min_element(gaps.begin(), gaps.end()), 0.0);
  // Arrivals in unit windows are Poisson: their variance equals their mean (dispersion index 1).
  std::vector<int> counts;
  double t = 0, window_end = 0.1;
  int c = 0;
  for (double g : gaps) {
    t += g;
    while (t >= window_end) {
      counts.push_back(c);
      c = 0;
      window_end += 0.1;
    }
    ++c;
  }
  const double cm = std::accumulate(counts.begin(), counts.end(), 0.0) / static_cast<double>(counts.size());
  double cv = 0;
  for (int k : counts) cv += (k - cm) * (k - cm);
  cv /= static_cast<double>(counts.size() - 1);
  EXPECT_NEAR(cm, qps * 0.1, 0.05 * qps * 0.1);
  EXPECT_NEAR(cv / cm, 1.0, 0.25);
}

TEST(Poisson, SeededAndReproducible) {
  PoissonSchedule a(100, 7), b(100, 7), c(100, 8);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const double x = a.next_gap_s();
    EXPECT_EQ(x, b.next_gap_s());
    differs |= x != c.next_gap_s();
  }
  EXPECT_TRUE(differs);
}

// ---------------------------------------------------------------------------------------------
// Percentiles and early stopping

TEST(Stats, LoadGenPercentileIsTheValueAtFloorNP) {
  std::vector<double> x(100);
  std::iota(x.begin(), x.end(), 1.0);  // 1..100
  EXPECT_EQ(percentile_loadgen(x, 0.50), 51);
  EXPECT_EQ(percentile_loadgen(x, 0.90), 91);
  EXPECT_EQ(percentile_loadgen(x, 0.99), 100);
  EXPECT_EQ(percentile_loadgen(x, 1.0), 100);
  EXPECT_EQ(percentile_loadgen(x, 0.0), 1);
  const std::vector<double> ten{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(percentile_loadgen(ten, 0.9), 10);
  EXPECT_EQ(percentile_loadgen(ten, 0.5), 6);
  EXPECT_EQ(percentile_loadgen(std::vector<double>{}, 0.9), 0);
}

// Binomial CDF summed directly with lgamma in long double: an independent reference.
double cdf_reference(std::uint64_t t, std::uint64_t n, double q) {
  long double sum = 0;
  for (std::uint64_t k = 0; k <= t && k <= n; ++k) {
    const long double kk = static_cast<long double>(k), nn = static_cast<long double>(n);
    const long double lp = std::lgamma(nn + 1) - std::lgamma(kk + 1) - std::lgamma(nn - kk + 1) + kk * std::log(static_cast<long double>(q)) +
                           (nn - kk) * std::log1p(-static_cast<long double>(q));
    sum += std::exp(lp);
  }
  return static_cast<double>(sum);
}

TEST(Stats, BinomialCdfAgainstHandComputedValues) {
  // Binomial(100, 0.1): P0..P3 = 2.6561e-5, 2.9513e-4, 1.6232e-3, 5.8916e-3 (by hand), sum 7.836e-3.
  EXPECT_NEAR(binomial_cdf(3, 100, 0.1), 7.8364e-3, 1e-6);
  EXPECT_NEAR(binomial_cdf(0, 100, 0.1), std::pow(0.9, 100), 1e-15);
  EXPECT_NEAR(binomial_cdf(0, 459, 0.01), std::pow(0.99, 459), 1e-15);
  EXPECT_EQ(binomial_cdf(100, 100, 0.3), 1.0);
  EXPECT_EQ(binomial_cdf(5, 10, 0.0), 1.0);
  for (auto [t, n, q] : {std::tuple{10ull, 50ull, 0.2}, {2600ull, 270336ull, 0.01}, {99000ull, 1000000ull, 0.1}})
    EXPECT_NEAR(binomial_cdf(t, n, q), cdf_reference(t, n, q), 1e-9) << t << " " << n;
  // (1-q)^n underflows a double for n = 10^6 at q = 0.1; the log-space sum still gets the tail.
  EXPECT_NEAR(binomial_cdf(99000, 1000000, 0.1), cdf_reference(99000, 1000000, 0.1), 1e-9);
}

// LoadGen's loop (results.cc EarlyStopping, single-stream case) with its definitions spelled out:
// h(t) = min h with P[Binomial(h + t, 1 - p) <= t] < 1 - c; t = the first i >= 2 with n < h(i) + i, minus 1.
std::uint64_t loadgen_t(std::uint64_t n, double p, double c) {
  auto h_of = [&](std::uint64_t t) {
    std::uint64_t h = 1;
    while (!(cdf_reference(t, h + t, 1 - p) < 1 - c)) ++h;
    return h;
  };
  if (n < h_of(1) + 1) return 0;
  for (std::uint64_t i = 2; i < n + 1; ++i)
    if (n < h_of(i) + i) return i - 1;
  return 1;
}

TEST(Stats, EarlyStoppingAgainstKnownValues) {
  // The fewest queries with an estimate (t = 1): 64 at p90 and 662 at p99 (mlperf.conf sets
  // MultiStream.min_query_count = 662 for this reason). By hand at p90: P[X<=1; 64] = 0.9^64 +
  // 64(0.1)0.9^63 = 0.00956 < 0.01, while n = 63 gives 0.01048.
  EXPECT_EQ(early_stopping_min_queries(0.90, 0.99), 64u);
  EXPECT_EQ(early_stopping_min_queries(0.99, 0.99), 662u);
  // Server with no overlatency query: p^n < 0.01 -> n = 44 at p90 (0.9^44 = 0.0097), 459 at p99.
  EXPECT_EQ(early_stopping_queries_needed(0, 0.90, 0.99), 44u);
  EXPECT_EQ(early_stopping_queries_needed(0, 0.99, 0.99), 459u);
  EXPECT_EQ(early_stopping_overlatency(63, 0.9, 0.99), 0u);
  EXPECT_EQ(early_stopping_overlatency(64, 0.9, 0.99), 1u);
  // n = 100 at p90: F(3) = 0.0078 < 0.01 <= F(4) = 0.0237, so t = 3: the estimate discards the two
  // slowest and reports the third (98 of the latencies 1..100).
  EXPECT_EQ(early_stopping_overlatency(100, 0.9, 0.99), 3u);
  std::vector<double> x(100);
  std::iota(x.begin(), x.end(), 1.0);
  EXPECT_EQ(x[100 - early_stopping_overlatency(100, 0.9, 0.99)], 98.0);
  // Equivalent to LoadGen's search loop, everywhere on a range.
  for (std::uint64_t n = 1; n <= 400; n += (n < 120 ? 1 : 7)) EXPECT_EQ(early_stopping_overlatency(n, 0.9, 0.99), loadgen_t(n, 0.9, 0.99)) << n;
  for (std::uint64_t n : {661ull, 662ull, 700ull, 1500ull}) EXPECT_EQ(early_stopping_overlatency(n, 0.99, 0.99), loadgen_t(n, 0.99, 0.99)) << n;
  // The server rule: t overlatency queries pass exactly from queries_needed(t) on.
  for (std::uint64_t t : {1ull, 5ull, 40ull}) {
    const std::uint64_t need = early_stopping_queries_needed(t, 0.99, 0.99);
    EXPECT_LT(binomial_cdf(t, need, 0.01), 0.01);
    EXPECT_GE(binomial_cdf(t, need - 1, 0.01), 0.01);
  }
  // A large run stays cheap and close to the plain percentile: 10^6 queries at p90 discard ~0.99%
  // fewer than 10% (the normal approximation: n q - 2.326 sqrt(n q (1-q)) = 99302).
  const std::uint64_t t = early_stopping_overlatency(1000000, 0.9, 0.99);
  EXPECT_NEAR(static_cast<double>(t), 99302, 5);
}

// ---------------------------------------------------------------------------------------------
// Runs: validity rules

TEST(Run, NullSingleStreamIsValidAndMeasuresFromScheduledTime) {
  NullSut sut;
  SyntheticLibrary lib(4096, 1024);
  const RunResult r = run(sut, lib, fast(Scenario::single_stream));
  EXPECT_TRUE(r.valid) << to_json(r).dump(1);
  EXPECT_TRUE(r.failed().empty());
  EXPECT_GE(r.duration_s, 0.1);
  EXPECT_EQ(r.samples_completed, r.queries_issued);
  EXPECT_GE(r.queries_issued, 100u);
  EXPECT_TRUE(r.early_stopping_met);
  EXPECT_GT(r.sample_latency.p90, 0);
  EXPECT_LE(r.sample_latency.p50, r.sample_latency.p99);
  EXPECT_LE(r.early_stopping_latency_s, r.sample_latency.max);
  EXPECT_EQ(lib.load_calls(), 1);
  EXPECT_EQ(lib.loaded(), 0u) << "unloaded after the run";
  EXPECT_GT(r.window_end_s, r.window_start_s);
}

TEST(Run, MultiStreamQueriesHoldEightSamplesAndReportQueryLatency) {
  ThreadedSut sut(3);
  SyntheticLibrary lib(1024, 1024);
  const RunResult r = run(sut, lib, fast(Scenario::multi_stream));
  EXPECT_TRUE(r.valid) << to_json(r).dump(1);
  EXPECT_EQ(r.samples_issued, 8 * r.queries_issued);
  EXPECT_GE(r.queries_issued, 662u);
  EXPECT_EQ(r.query_latency.count, r.queries_issued);
  EXPECT_GE(r.query_latency.p50, r.sample_latency.p50) << "a query ends with its slowest sample";
  EXPECT_EQ(to_json(r)["metric"]["name"], "query_latency_p99_early_stopping_s");
}

TEST(Run, ServerAtATargetQpsIsValidUnderContendedCompletions) {
  ThreadedSut sut(3);
  SyntheticLibrary lib(1024, 256);
  Settings s = fast(Scenario::server, 0.3);
  s.target_qps = 10000;
  s.latency_bound_s = 0.1;  // generous: a busy 2-core machine may park the SUT's threads for ms
  const RunResult r = run(sut, lib, s);
  EXPECT_TRUE(r.valid) << to_json(r).dump(1);
  EXPECT_EQ(r.samples_completed, r.queries_issued);
  EXPECT_NEAR(r.scheduled_qps, 10000, 1000);
  EXPECT_GE(r.duration_s, 0.3);
}

// Sleeps 20 us per sample of a query; each query of over 5000 samples (the offline runs; the
// probe's bursts stay smaller) runs 1.5x faster than the one before, up to 2.25x: a SUT that
// speeds up under load.
class AcceleratingSut final : public SystemUnderTest {
 public:
  std::string name() const override { return "accelerating"; }
  void issue_query(std::span<const QuerySample> s, Completions& done) override {
    const bool long_query = s.size() > 5000;
    if (long_query) speed_ = std::min(speed_ * 1.5, 2.25);
    std::this_thread::sleep_for(std::chrono::duration<double>(20e-6 * static_cast<double>(s.size()) / speed_));
    done.complete(s);
  }

 private:
  double speed_ = 1.0;
};

TEST(Run, OfflineRerunsUntilASpeedingUpSutFillsTheMinimumDuration) {
  AcceleratingSut sut;
  SyntheticLibrary lib(64, 64);
  // The probe sees 50k samples/s; the first run (sized for that) and the first rerun at the rates
  // the runs before them reached end short (0.37 s, 0.4 s); the second rerun lasts 0.6 s.
  const RunResult r = run(sut, lib, fast(Scenario::offline, 0.5));
  EXPECT_TRUE(r.valid) << to_json(r).dump(1);
  EXPECT_GE(r.duration_s, 0.5);
  const auto reruns = std::count_if(r.notes.begin(), r.notes.end(),
                                    [](const std::string& n) { return n.find("rerun sized") != std::string::npos; });
  EXPECT_GE(reruns, 2) << to_json(r).dump(1);
}

TEST(Run, TooShortIsInvalidNamingMinDuration) {
  NullSut sut;
  SyntheticLibrary lib(64, 64);
  // Offline told to expect 1 sample/s builds a query of min_query_count samples, done in microseconds.
  Settings s = fast(Scenario::offline, 0.5);
  s.target_qps = 1;
  RunResult r = run(sut, lib, s);
  EXPECT_FALSE(r.valid);
  EXPECT_TRUE(has(r.failed(), "min_duration")) << to_json(r).dump(1);
  EXPECT_FALSE(has(r.failed(), "min_sample_count"));
  // Single-stream stopped by the per-run capacity before its minimum duration.
  Settings c = fast(Scenario::single_stream, 0.5);
  c.max_samples = 1000;
  r = run(sut, lib, c);
  EXPECT_FALSE(r.valid);
  EXPECT_TRUE(has(r.failed(), "min_duration"));
  EXPECT_TRUE(has(r.failed(), "capacity"));
  EXPECT_EQ(r.queries_issued, 1000u);
}

TEST(Run, TooFewQueriesIsInvalidAtTheTimeout) {
  BatchingSut sut("sleep", {1, 0.0}, std::make_unique<SleepExecutor>(2e-3));
  SyntheticLibrary lib(64, 64);
  Settings s = fast(Scenario::single_stream, 0.1);
  s.min_query_count = 100000;
  s.timeout_s = 0.4;
  const auto t0 = Clock::now();
  const RunResult r = run(sut, lib, s);
  EXPECT_LT(elapsed_s(t0), 2.0);
  EXPECT_FALSE(r.valid);
  EXPECT_EQ(r.failed(), std::vector<std::string>{"min_query_count"}) << to_json(r).dump(1);
  EXPECT_FALSE(r.notes.empty());
  EXPECT_GT(r.sample_latency.p50, 2e-3);
}

TEST(Run, P99OverTheBoundIsInvalid) {
  BatchingSut sut("sleep", {1, 0.0}, std::make_unique<SleepExecutor>(3e-3));
  SyntheticLibrary lib(64, 64);
  Settings s = fast(Scenario::server, 0.2);
  s.target_qps = 100;
  s.min_query_count = 20;
  s.latency_bound_s = 1e-3;
  const RunResult r = run(sut, lib, s);
  EXPECT_FALSE(r.valid);
  EXPECT_TRUE(has(r.failed(), "latency_bound")) << to_json(r).dump(1);
  EXPECT_TRUE(has(r.failed(), "early_stopping"));
  EXPECT_GT(r.target_percentile_latency_s, 3e-3);
  EXPECT_EQ(r.overlatency_queries, r.queries_issued);
  // A lighter SUT under a bound it meets, with enough queries for early stopping (459 at p99). The
  // bound is 250x the service time: a loaded CI host (sanitizers, parallel tests) delays wake-ups by
  // tens of milliseconds.
  BatchingSut light("sleep", {1, 0.0}, std::make_unique<SleepExecutor>(1e-3));
  s.latency_bound_s = 0.25;
  s.min_query_count = 500;
  s.target_qps = 300;
  const RunResult ok = run(light, lib, s);
  EXPECT_TRUE(ok.valid) << to_json(ok).dump(1);
}

// ---------------------------------------------------------------------------------------------
// Lost and misreported samples: INVALID with the count, in bounded time

TEST(Faults, DroppedQueriesEndAtTheTimeoutWithTheLostCount) {
  SyntheticLibrary lib(64, 64);
  {  // single-stream waits for the dropped query until the timeout, then drains and stops
    FaultySut sut(10);
    Settings s = fast(Scenario::single_stream, 0.1);
    s.timeout_s = 0.5;
    const auto t0 = Clock::now();
    const RunResult r = run(sut, lib, s);
    EXPECT_LT(elapsed_s(t0), s.timeout_s + s.drain_timeout_s + 1.0);
    EXPECT_FALSE(r.valid);
    EXPECT_TRUE(has(r.failed(), "lost_queries")) << to_json(r).dump(1);
    EXPECT_EQ(r.lost_samples, 1u);
    EXPECT_EQ(r.lost_queries, 1u);
    EXPECT_EQ(r.queries_issued, 10u);
    EXPECT_EQ(to_json(r)["lost_queries"], 1);
  }
  {  // server keeps issuing; every dropped sample is counted
    FaultySut sut(10);
    Settings s = fast(Scenario::server, 0.2);
    s.target_qps = 5000;
    const RunResult r = run(sut, lib, s);
    EXPECT_FALSE(r.valid);
    EXPECT_EQ(r.lost_samples, sut.dropped());
    EXPECT_EQ(r.lost_queries, sut.dropped());
    EXPECT_GE(r.lost_samples, r.queries_issued / 10);
  }
  {  // a SUT that never answers: multi-stream and offline stop at the timeout
    for (Scenario sc : {Scenario::multi_stream, Scenario::offline}) {
      FaultySut sut(1);
      Settings s = fast(sc, 0.1);
      s.timeout_s = 0.4;
      s.target_qps = 1000;
      const auto t0 = Clock::now();
      const RunResult r = run(sut, lib, s);
      EXPECT_LT(elapsed_s(t0), s.timeout_s + s.drain_timeout_s + 1.0) << to_string(sc);
      EXPECT_FALSE(r.valid);
      EXPECT_EQ(r.samples_completed, 0u);
      EXPECT_EQ(r.lost_samples, r.samples_issued);
      EXPECT_EQ(r.lost_queries, r.queries_issued) << to_string(sc);
    }
  }
}

TEST(Faults, SearchStopsAtOnceOnADroppingSut) {
  FaultySut sut(100);
  SyntheticLibrary lib(64, 64);
  Settings s = fast(Scenario::server, 0.1);
  const auto t0 = Clock::now();
  const SearchResult r = find_peak_qps(sut, lib, s);
  EXPECT_LT(elapsed_s(t0), 10.0);
  EXPECT_FALSE(r.found);
  EXPECT_FALSE(r.final.valid);
  EXPECT_TRUE(has(r.final.failed(), "lost_queries"));
  EXPECT_NE(r.stop_reason.find("no QPS can pass"), std::string::npos) << r.stop_reason;
}

TEST(Faults, DuplicateAndUnknownReportsAreCompletionErrors) {
  MisreportingSut sut;
  SyntheticLibrary lib(64, 64);
  const RunResult r = run(sut, lib, fast(Scenario::single_stream, 0.05));
  EXPECT_FALSE(r.valid);
  EXPECT_EQ(r.failed(), std::vector<std::string>{"completion_errors"});
  EXPECT_EQ(r.duplicate_completions, r.queries_issued);
  EXPECT_EQ(r.unknown_completions, r.queries_issued);
}

TEST(Faults, CancelStopsTheRun) {
  BatchingSut sut("sleep", {1, 0.0}, std::make_unique<SleepExecutor>(1e-3));
  SyntheticLibrary lib(64, 64);
  std::atomic<bool> cancel{false};
  std::thread stopper([&cancel] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel = true;
  });
  const auto t0 = Clock::now();
  const RunResult r = run(sut, lib, fast(Scenario::single_stream, 3.0), &cancel);
  stopper.join();
  EXPECT_LT(elapsed_s(t0), 2.0);
  EXPECT_TRUE(r.interrupted);
  EXPECT_TRUE(has(r.failed(), "interrupted"));
}

// ---------------------------------------------------------------------------------------------
// Refused settings

TEST(Settings, PresetsCarryTheOfficialMinimums) {
  const Settings ss = preset_settings(Preset::mlperf, Scenario::single_stream);
  EXPECT_EQ(ss.min_duration_s, 600);
  EXPECT_EQ(ss.min_query_count, 1024u);
  EXPECT_EQ(ss.target_percentile, 0.90);
  const Settings ms = preset_settings(Preset::mlperf, Scenario::multi_stream);
  EXPECT_EQ(ms.min_query_count, 270336u);
  EXPECT_EQ(ms.samples_per_query, 8u);
  EXPECT_EQ(ms.target_percentile, 0.99);
  EXPECT_EQ(preset_settings(Preset::mlperf, Scenario::server).min_query_count, 270336u);
  EXPECT_EQ(preset_settings(Preset::mlperf, Scenario::offline).min_query_count, 24576u);
  for (Scenario sc : {Scenario::single_stream, Scenario::multi_stream, Scenario::server, Scenario::offline}) {
    const Settings q = preset_settings(Preset::quick, sc);
    EXPECT_EQ(q.min_duration_s, 1.0);
    if (sc == Scenario::single_stream || sc == Scenario::multi_stream) {
      EXPECT_GE(q.min_query_count, early_stopping_min_queries(q.target_percentile, q.confidence)) << to_string(sc);
    }
    if (sc == Scenario::server) {
      EXPECT_GE(q.min_query_count, early_stopping_queries_needed(0, 0.99, 0.99));
    }
  }
}

TEST(Settings, InconsistentSettingsAreRefusedWithTheReason) {
  // Multi-stream: 8 samples in batches of 3 leave 2 waiting max_wait every query; a bound at or
  // below max_wait fails by construction.
  Settings ms = fast(Scenario::multi_stream);
  ms.latency_bound_s = 1e-3;
  std::string msg = ab::test::usage_error([&] { check_batcher(ms, {3, 2e-3}); });
  EXPECT_NE(msg.find("by construction"), std::string::npos) << msg;
  EXPECT_NE(msg.find("batch of 2"), std::string::npos) << msg;
  EXPECT_NO_THROW(check_batcher(ms, {8, 2e-3})) << "8 samples fill a batch of 8 at once";
  EXPECT_NO_THROW(check_batcher(ms, {3, 0.5e-3}));
  Settings sv = fast(Scenario::server);
  sv.latency_bound_s = 1e-3;
  msg = ab::test::usage_error([&] { check_batcher(sv, {8, 1e-3}); });
  EXPECT_NE(msg.find("max_wait"), std::string::npos) << msg;
  // The minimum duration must fit in the timeout (the mlperf preset needs --timeout above 600 s).
  Settings ml = preset_settings(Preset::mlperf, Scenario::offline);
  ml.timeout_s = 60;
  msg = ab::test::usage_error([&] { check_settings(ml); });
  EXPECT_NE(msg.find("--timeout"), std::string::npos) << msg;
  sv.latency_bound_s = 0;
  msg = ab::test::usage_error([&] { check_settings(sv); });
  EXPECT_NE(msg.find("latency bound"), std::string::npos) << msg;
  Settings ss = fast(Scenario::single_stream);
  ss.samples_per_query = 4;
  ab::test::usage_error([&] { check_settings(ss); });
  Settings cap = fast(Scenario::multi_stream);
  cap.max_samples = 1000;
  msg = ab::test::usage_error([&] { check_settings(cap); });
  EXPECT_NE(msg.find("capacity"), std::string::npos) << msg;
  NullSut sut;
  SyntheticLibrary lib(8, 8);
  Settings no_qps = fast(Scenario::server);
  msg = ab::test::usage_error([&] { run(sut, lib, no_qps); });
  EXPECT_NE(msg.find("target QPS"), std::string::npos) << msg;
  ab::test::usage_error([] { SyntheticLibrary(10, 20); });
  ab::test::usage_error([] { parse_scenario("streaming"); });
}

// ---------------------------------------------------------------------------------------------
// Dynamic batcher

class CountingExecutor final : public BatchExecutor {
 public:
  std::string describe() const override { return "count"; }
  void prepare() override { prepared_on = std::this_thread::get_id(); }
  void run(std::span<const QuerySample> b) override { sizes.push_back(b.size()); }
  std::vector<std::size_t> sizes;
  std::thread::id prepared_on;
};

struct Collect final : Completions {
  void complete(std::span<const QuerySample> s) override {
    std::lock_guard<std::mutex> l(m);
    for (const auto& q : s) ids.push_back(q.id);
    when = Clock::now();
  }
  std::size_t count() {
    std::lock_guard<std::mutex> l(m);
    return ids.size();
  }
  std::mutex m;
  std::vector<std::uint64_t> ids;
  Clock::time_point when;
};

TEST(Batcher, FullBatchesLeaveAtOncePartialOnesAfterMaxWait) {
  auto exec = std::make_unique<CountingExecutor>();
  CountingExecutor* e = exec.get();
  BatchingSut sut("b", {4, 0.5}, std::move(exec));  // max_wait well above a loaded host's stalls
  EXPECT_NE(e->prepared_on, std::this_thread::get_id()) << "prepare() runs on the worker";
  Collect done;
  std::vector<QuerySample> q(6);
  for (std::uint64_t i = 0; i < 6; ++i) q[i] = {i, i};
  const auto t0 = Clock::now();
  sut.issue_query(q, done);
  while (done.count() < 4) std::this_thread::sleep_for(std::chrono::microseconds(100));
  EXPECT_LT(elapsed_s(t0), 0.4) << "a full batch does not wait";
  while (done.count() < 6) std::this_thread::sleep_for(std::chrono::microseconds(100));
  EXPECT_GE(std::chrono::duration<double>(done.when - t0).count(), 0.495) << "the partial batch waits max_wait";
  // flush: a partial batch leaves at once
  const QuerySample one{6, 0};
  const auto t1 = Clock::now();
  sut.issue_query(std::span<const QuerySample>(&one, 1), done);
  sut.flush_queries();
  while (done.count() < 7) std::this_thread::sleep_for(std::chrono::microseconds(100));
  EXPECT_LT(elapsed_s(t1), 0.4);
  const auto st = sut.stats();
  EXPECT_EQ(st.batches, 3u);
  EXPECT_EQ(st.samples, 7u);
  EXPECT_EQ(st.batch_sizes[4], 1u);
  EXPECT_EQ(st.batch_sizes[2], 1u);
  EXPECT_EQ(st.batch_sizes[1], 1u);
}

class FailingExecutor final : public BatchExecutor {
 public:
  explicit FailingExecutor(bool in_prepare) : in_prepare_(in_prepare) {}
  std::string describe() const override { return "failing"; }
  void prepare() override {
    if (in_prepare_) throw OutOfMemory("no room for the plans");
  }
  void run(std::span<const QuerySample>) override { throw std::runtime_error("device fault"); }

 private:
  bool in_prepare_;
};

TEST(Batcher, ErrorsSurfaceAsFailureOrFromTheConstructor) {
  EXPECT_THROW(BatchingSut("x", {4, 0.0}, std::make_unique<FailingExecutor>(true)), OutOfMemory);
  BatchingSut sut("x", {4, 0.0}, std::make_unique<FailingExecutor>(false));
  SyntheticLibrary lib(16, 16);
  Settings s = fast(Scenario::single_stream, 0.05);
  s.timeout_s = 0.3;
  const RunResult r = run(sut, lib, s);
  EXPECT_FALSE(r.valid);
  EXPECT_TRUE(has(r.failed(), "sut_failure"));
  EXPECT_NE(r.sut_failure.find("device fault"), std::string::npos) << r.sut_failure;
}

// ---------------------------------------------------------------------------------------------
// MLLOG

void expect_mllog(const std::vector<std::string>& lines) {
  ASSERT_FALSE(lines.empty());
  const std::string prefix = ":::MLLOG ";
  for (const auto& l : lines) {
    ASSERT_EQ(l.rfind(prefix, 0), 0u) << l;
    const json j = json::parse(l.substr(prefix.size()));  // throws, failing the test, if not JSON
    for (const char* k : {"key", "value", "time_ms", "namespace", "event_type", "metadata"}) EXPECT_TRUE(j.contains(k)) << l;
    EXPECT_TRUE(j["key"].is_string());
    EXPECT_TRUE(j["time_ms"].is_number());
    EXPECT_TRUE(j["metadata"]["is_error"].is_boolean());
  }
}

json value_of(const std::vector<std::string>& lines, const std::string& key) {
  for (const auto& l : lines) {
    const json j = json::parse(l.substr(9));
    if (j["key"] == key) return j["value"];
  }
  return nullptr;
}

TEST(Mllog, EveryLineParsesAsJson) {
  NullSut sut;
  SyntheticLibrary lib(64, 64);
  const SearchResult search = find_peak_qps(sut, lib, fast(Scenario::server, 0.1));
  const LogInfo info{"accelbench test", "null", "synthetic", 64, 64, "2026-01-01T00:00:00.000Z"};
  const auto detail = mllog_detail(search.final, &search, info);
  const auto summary = mllog_summary(search.final, info);
  ASSERT_NO_FATAL_FAILURE(expect_mllog(detail));
  ASSERT_NO_FATAL_FAILURE(expect_mllog(summary));
  EXPECT_EQ(value_of(summary, "result_validity"), search.final.valid ? "VALID" : "INVALID");
  EXPECT_EQ(value_of(detail, "requested_scenario"), "Server");
  EXPECT_EQ(value_of(detail, "requested_test_mode"), "FindPeakPerformance");
  EXPECT_EQ(value_of(detail, "result_query_count"), search.final.queries_issued);
  // Awkward strings stay valid JSON.
  ASSERT_NO_FATAL_FAILURE(expect_mllog({mllog_line("k\"ey\n", "quote \" backslash \\ tab \t \x01", 1.5, true)}));

  FaultySut faulty(5);
  Settings s = fast(Scenario::offline, 0.05);
  s.timeout_s = 0.3;
  s.target_qps = 1000;
  const RunResult lost = run(faulty, lib, s);
  TempDir dir;
  write_mllog(dir.path() / "logs", lost, nullptr, info);
  std::ifstream in(dir.path() / "logs" / "mlperf_log_detail.txt");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_NO_FATAL_FAILURE(expect_mllog(lines));
  EXPECT_EQ(value_of(lines, "result_validity"), "INVALID");
  EXPECT_EQ(value_of(lines, "accelbench_lost_samples"), lost.lost_samples);
  std::ifstream summary_file(dir.path() / "logs" / "mlperf_log_summary.txt");
  const std::string text((std::istreambuf_iterator<char>(summary_file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, loadgen_summary_text(lost, nullptr, info));
  EXPECT_NE(text.find("Result is : INVALID"), std::string::npos) << text;
  EXPECT_NE(text.find("ERROR(s) encountered"), std::string::npos) << text;
}

// The summary file in LoadGen's own layout, so scripts that parse MLPerf submissions read it.
TEST(Mllog, SummaryTextHasLoadGenLayout) {
  NullSut sut;
  SyntheticLibrary lib(64, 64);
  const LogInfo info{"accelbench test", "null", "synthetic", 64, 64, "2026-01-01T00:00:00.000Z"};
  const RunResult r = run(sut, lib, fast(Scenario::single_stream, 0.05));
  const std::string text = loadgen_summary_text(r, nullptr, info);
  const std::string banner =
      "================================================\nMLPerf Results Summary\n"
      "================================================\n";
  EXPECT_EQ(text.rfind(banner, 0), 0u) << text;
  for (const char* line : {"SUT name : null\n", "Scenario : SingleStream\n", "Mode     : PerformanceOnly\n",
                           "90th percentile latency (ns) : ", "  Min duration satisfied : ", "Additional Stats\n",
                           "Test Parameters Used\n", "min_query_count : "})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  EXPECT_NE(text.find(std::string("Result is : ") + (r.valid ? "VALID\n" : "INVALID\n")), std::string::npos) << text;
  // The percentiles in integer nanoseconds, as LoadGen prints them.
  const auto at = text.find("99.00 percentile latency (ns)   : ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string value = text.substr(at + 34, text.find('\n', at) - at - 34);
  EXPECT_EQ(value, std::to_string(std::llround(r.sample_latency.p99 * 1e9)));
  // An offline run prints its throughput headline; a server one its constraint line.
  const RunResult off = run(sut, lib, fast(Scenario::offline, 0.05));
  EXPECT_NE(loadgen_summary_text(off, nullptr, info).find("Samples per second: "), std::string::npos);
  const SearchResult search = find_peak_qps(sut, lib, fast(Scenario::server, 0.1));
  const std::string server = loadgen_summary_text(search.final, &search, info);
  EXPECT_NE(server.find("Mode     : FindPeakPerformance\n"), std::string::npos) << server;
  EXPECT_NE(server.find("  Performance constraints satisfied : "), std::string::npos) << server;
  EXPECT_NE(server.find("Completed samples per second    : "), std::string::npos) << server;
}

}  // namespace
}  // namespace ab::scenarios

// ---------------------------------------------------------------------------------------------
// The runner's scenario block and the loadgen workload

namespace ab::workloads {
using namespace ab::harness;
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct Captured {
  std::vector<json> records;
  std::vector<std::array<double, 3>> windows;
  RunnerHooks hooks(const fs::path& dir) {
    RunnerHooks h;
    h.sink = [this](const json& r) { records.push_back(r); };
    h.telemetry = [this](double t0, double t1, double samples) {
      windows.push_back({t0, t1, samples});
      return json{{"samples_per_j", 1.0}};
    };
    h.artifact_dir = dir;
    return h;
  }
};

TEST(LoadgenWorkload, RecordsCarryTheScenarioBlockRatesTelemetryAndLogs) {
  auto be = backend::make_backend("cpu");
  auto w = make_loadgen();
  const fs::path dir = fs::temp_directory_path() / ("ab_lgw_" + std::to_string(getpid()));
  fs::remove_all(dir);
  Captured cap;
  measure::Settings ms;
  ms.timeout_s = 4;  // the faulty points wait for their dropped samples until the timeout
  Runner runner(*be, ms, json::object(), "run-x", cap.hooks(dir), nullptr);
  auto plan = plan_for(*w, "cpu", {parse_axis_argument("scenario=offline,multi-stream"),
                                   parse_axis_argument("sut=null,faulty,gemm"), parse_axis_argument("max_batch=4")});
  ASSERT_EQ(plan.size(), 6u);
  const std::atomic<bool> cancel{false};
  const RunTotals totals = runner.run(plan, cancel);
  ASSERT_EQ(cap.records.size(), 6u);
  for (const json& r : cap.records) {
    SCOPED_TRACE(r.dump().substr(0, 2000));
    EXPECT_EQ(r["status"], "ok");
    ASSERT_TRUE(r.contains("scenario"));
    const json& sc = r["scenario"];
    EXPECT_TRUE(sc["valid"].is_boolean());
    EXPECT_TRUE(sc["failed_constraints"].is_array());
    EXPECT_FALSE(r.contains("time"));
    const std::string sut = r["params"]["sut"];
    if (sut == "faulty") {
      EXPECT_EQ(sc["result"], "INVALID");
      EXPECT_GT(sc["lost_queries"].get<int>(), 0);
    } else {
      // gemm's verdict depends on how busy the machine is; the null SUT's does not.
      if (sut == "null") {
        // On a loaded machine the calibrated offline query can end short of the minimum duration;
        // nothing else may fail for a SUT that completes at once.
        for (const auto& c : sc["failed_constraints"]) EXPECT_EQ(c.get<std::string>(), "min_duration");
        EXPECT_EQ(sc.value("lost_queries", 0), 0);
      }
      EXPECT_GT(r["rates"]["samples_per_s"].get<double>(), 0);
    }
    if (sut == "gemm") {
      EXPECT_TRUE(r["check"]["passed"].get<bool>());
      EXPECT_GT(r["rates"]["tflops"].get<double>(), 0);
      EXPECT_EQ(r["metrics"]["batcher"]["max_batch"], 4);
    }
    EXPECT_EQ(r["telemetry"]["samples_per_j"], 1.0);
    for (const char* f : {"summary", "detail"}) EXPECT_TRUE(fs::exists(dir / sc["logs"][f].get<std::string>())) << f;
  }
  ASSERT_EQ(cap.windows.size(), 6u);
  for (const auto& wdw : cap.windows) EXPECT_LT(wdw[0], wdw[1]);
  EXPECT_EQ(cap.windows[0][2], cap.records[0]["scenario"]["samples_completed"].get<double>());
  fs::remove_all(dir);
}

TEST(LoadgenWorkload, RefusedSettingsBecomeInvalidPointsWithTheReason) {
  auto be = backend::make_backend("cpu");
  auto w = make_loadgen();
  Captured cap;
  Runner runner(*be, measure::Settings{}, json::object(), "run-y", cap.hooks({}), nullptr);
  auto plan = plan_for(*w, "cpu", {parse_axis_argument("scenario=multi-stream,single-stream"),
                                   parse_axis_argument("latency_bound_ms=1"), parse_axis_argument("max_batch=3"),
                                   parse_axis_argument("max_wait_us=5000")});
  plan.push_back(plan_for(*w, "cpu", {parse_axis_argument("scenario=server"), parse_axis_argument("preset=mlperf")}).front());
  plan.push_back(plan_for(*w, "cpu", {parse_axis_argument("scenario=single-stream"), parse_axis_argument("target_qps=5")}).front());
  const std::atomic<bool> cancel{false};
  runner.run(plan, cancel);
  ASSERT_EQ(cap.records.size(), 4u);
  EXPECT_EQ(cap.records[0]["status"], "invalid");
  EXPECT_NE(cap.records[0]["reason"].get<std::string>().find("by construction"), std::string::npos) << cap.records[0]["reason"];
  // single-stream dispatches at once (no max_wait), so the same axes are consistent there.
  EXPECT_EQ(cap.records[1]["status"], "ok") << cap.records[1].value("reason", "");
  EXPECT_EQ(cap.records[2]["status"], "invalid");
  EXPECT_NE(cap.records[2]["reason"].get<std::string>().find("--timeout"), std::string::npos);
  EXPECT_EQ(cap.records[3]["status"], "skipped");
}

// ---------------------------------------------------------------------------------------------
// End to end through the binary

TEST(LoadgenCli, NullAndGemmQuickPresetProduceRecordsWithValidity) {
  const fs::path out = fs::temp_directory_path() / ("ab_lgcli_" + std::to_string(getpid()));
  fs::remove_all(out);
  // Every scenario on the null SUT; the gemm SUT (real work behind the batcher) where a run is
  // short even on a loaded 2-core machine: its server search runs many trials.
  for (const std::vector<std::string>& axes : {std::vector<std::string>{"--axis", "sut=null"},
                                               {"--axis", "sut=gemm", "--axis", "scenario=single-stream,offline"}}) {
    std::vector<std::string> args{"run", "loadgen", "--device", "cpu"};
    args.insert(args.end(), axes.begin(), axes.end());
    args.insert(args.end(), {"--axis", "preset=quick", "--out", out.string()});
    const test::Ran r = test::accelbench(args);
    ASSERT_EQ(r.code, 0) << r.output;
  }
  std::vector<json> records;
  std::vector<fs::path> points_files;
  for (const auto& e : fs::recursive_directory_iterator(out))
    if (e.path().filename() == "points.jsonl") points_files.push_back(e.path());
  ASSERT_EQ(points_files.size(), 2u);
  std::map<std::string, fs::path> run_dir_of;  // run_id -> its folder, for the log paths
  for (const auto& points : points_files) {
    std::ifstream in(points);
    for (std::string l; std::getline(in, l);) {
      records.push_back(json::parse(l));
      run_dir_of[records.back()["run_id"]] = points.parent_path();
    }
  }
  ASSERT_EQ(records.size(), 6u);  // 4 scenarios on null, 2 on gemm
  int mllog_files = 0;
  for (const json& r : records) {
    SCOPED_TRACE(r["params"].dump());
    EXPECT_EQ(r["workload"], "loadgen");
    EXPECT_EQ(r["status"], "ok") << r.value("reason", "");
    const json& sc = r["scenario"];
    EXPECT_TRUE(sc["result"] == "VALID" || sc["result"] == "INVALID");
    EXPECT_EQ(sc["valid"].get<bool>(), sc["result"] == "VALID");
    EXPECT_TRUE(sc["latency_s"].contains("p99"));
    EXPECT_GT(sc["completed_samples_per_s"].get<double>(), 0);
    const std::string name = sc["name"];
    if (r["params"]["sut"] == "null" && (name == "single-stream" || name == "offline")) {
      // Only the load-dependent minimum duration may fail for a SUT that completes at once.
      for (const auto& c : sc["failed_constraints"]) EXPECT_EQ(c.get<std::string>(), "min_duration");
    }
    if (name == "server") {
      EXPECT_TRUE(sc.contains("search"));
    }
    std::ifstream mllog(run_dir_of[r["run_id"]] / sc["logs"]["detail"].get<std::string>());
    for (std::string l; std::getline(mllog, l);) EXPECT_NO_THROW(json::parse(l.substr(9))) << l;
    ++mllog_files;
    std::ifstream summary(run_dir_of[r["run_id"]] / sc["logs"]["summary"].get<std::string>());
    const std::string text((std::istreambuf_iterator<char>(summary)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("Result is : " + sc["result"].get<std::string>() + "\n"), std::string::npos) << text;
    ++mllog_files;
  }
  EXPECT_EQ(mllog_files, 12);
  fs::remove_all(out);
}

}  // namespace
}  // namespace ab::workloads
