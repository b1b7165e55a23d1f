// Telemetry: window maths against hand-computed values, host parsing against a fake /proc and /sys,
// the sampler with scripted GPUs (start/stop, concurrency, faults, overhead), NVML absent here.
#include <dlfcn.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "test_support.h"

#include "core/error.h"
#include "measure/timer.h"
#include "telemetry/telemetry.h"
#include "telemetry/window.h"

namespace fs = std::filesystem;
using namespace ab::telemetry;
using nlohmann::json;

namespace {

using ab::test::TempDir;

// A GPU whose readings are functions of the time it is read at; read number `error_at` fails.
struct Script {
  std::function<std::optional<double>(double)> power_w = [](double) { return 150.0; };
  std::function<std::optional<double>(double)> energy_j = [](double t) { return 1000.0 + 150.0 * t; };
  std::function<std::optional<double>(double)> sm_clock_mhz = [](double) { return 1980.0; };
  std::optional<double> temperature_c;  // empty: the device does not report it
  std::uint64_t throttle = 0x4;
  std::set<int> error_at;
};

class FakeGpuSource final : public GpuSource {
 public:
  FakeGpuSource(Script s, std::shared_ptr<std::atomic<int>> reads) : s_(std::move(s)), reads_(std::move(reads)) {}
  std::string name() const override { return "Fake GPU"; }
  std::string pci_bus_id() const override { return "00000000:01:00.0"; }
  GpuSample read(double t_s, ReadLevel level) override {
    const int k = (*reads_)++;
    GpuSample g;
    g.t_s = t_s;
    if (s_.error_at.count(k)) {
      g.error = "nvmlDeviceGetPowerUsage: GPU is lost";
      return g;
    }
    g.power_w = s_.power_w(t_s);
    if (level == ReadLevel::counters) g.energy_j = s_.energy_j(t_s);
    g.sm_clock_mhz = s_.sm_clock_mhz(t_s);
    if (level != ReadLevel::fast) g.temperature_c = s_.temperature_c;
    g.throttle_reasons = s_.throttle;
    return g;
  }

 private:
  Script s_;
  std::shared_ptr<std::atomic<int>> reads_;
};

std::vector<std::unique_ptr<GpuSource>> one_gpu(Script s, std::shared_ptr<std::atomic<int>> reads) {
  std::vector<std::unique_ptr<GpuSource>> v;
  v.push_back(std::make_unique<FakeGpuSource>(std::move(s), std::move(reads)));
  return v;
}

// Every call advances 0.1 s: deterministic timestamps whatever the real timing.
std::function<double()> stepping_clock(double step = 0.1) {
  auto n = std::make_shared<std::atomic<long>>(0);
  return [n, step] { return static_cast<double>((*n)++) * step; };
}

void wait_for_reads(const std::atomic<int>& reads, int n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (reads.load() < n && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_GE(reads.load(), n);
}


GpuSample gpu_at(double t, std::optional<double> power, std::optional<double> energy) {
  GpuSample s;
  s.t_s = t;
  s.power_w = power;
  s.energy_j = energy;
  return s;
}

}  // namespace

// --- window maths ---------------------------------------------------------------------------

TEST(TelemetryWindow, InterpolatesInsideAndNothingOutside) {
  const Series s = {{0, 0}, {1, 10}, {3, 30}};
  EXPECT_DOUBLE_EQ(*value_at(s, 0.5), 5);
  EXPECT_DOUBLE_EQ(*value_at(s, 2), 20);
  EXPECT_DOUBLE_EQ(*value_at(s, 3), 30);
  EXPECT_FALSE(value_at(s, -0.1));
  EXPECT_FALSE(value_at(s, 3.1));
  EXPECT_FALSE(value_at({}, 0));
}

TEST(TelemetryWindow, TrapezoidWithInterpolatedEnds) {
  const Series p = {{0, 100}, {1, 200}, {2, 200}};
  // [0.5, 1]: (150 + 200)/2 × 0.5 = 87.5; [1, 1.5]: 200 × 0.5 = 100.
  const Integral in = integrate(p, 0.5, 1.5);
  EXPECT_DOUBLE_EQ(in.area, 187.5);
  EXPECT_DOUBLE_EQ(in.covered_s, 1.0);
  // A window reaching before the first reading counts only the covered part.
  const Integral clipped = integrate(p, -1, 0.5);
  EXPECT_DOUBLE_EQ(clipped.area, 62.5);
  EXPECT_DOUBLE_EQ(clipped.covered_s, 0.5);
  EXPECT_DOUBLE_EQ(*window_mean(p, 0.5, 1.5), 187.5);
  EXPECT_DOUBLE_EQ(*window_peak(p, 0.1, 0.6), 160);  // no reading inside: the larger interpolated end
}

TEST(TelemetryWindow, CounterDifferenceAndReset) {
  const Series e = {{0, 1000}, {1, 1100}, {2, 1300}};
  const auto d = counter_delta(e, 0.5, 1.5);  // 1200 - 1050
  ASSERT_TRUE(d);
  EXPECT_DOUBLE_EQ(d->delta, 150);
  EXPECT_DOUBLE_EQ(d->covered_s, 1);
  EXPECT_FALSE(counter_delta({{0, 1000}, {1, 5}, {2, 50}}, 0, 2));  // driver reload
  EXPECT_FALSE(counter_delta({{0, 1000}}, 0, 2));
}

TEST(TelemetryWindow, SparseCounterFollowsThePowerShape) {
  const Series counter = {{0, 0}, {1, 100}};
  const Series power = {{0, 0}, {0.5, 0}, {0.5, 200}, {1, 200}};  // idle, then 200 W from 0.5 s
  EXPECT_DOUBLE_EQ(*counter_at(counter, 0.5, power), 0);
  EXPECT_DOUBLE_EQ(*counter_at(counter, 0.75, power), 50);
  EXPECT_DOUBLE_EQ(counter_delta(counter, 0.5, 1, power)->delta, 100);
  EXPECT_DOUBLE_EQ(counter_delta(counter, 0.5, 1)->delta, 50);  // without a shape: linear
  // A shape that does not cover the interval cannot place the increase: linear again.
  EXPECT_DOUBLE_EQ(*counter_at(counter, 0.75, {{0.5, 200}, {1, 200}}), 75);
}

TEST(TelemetryWindow, IntervalValuesWeightedByOverlap) {
  const std::vector<Interval> iv = {{0, 1, 0.5}, {1, 2, 1.0}};
  const Integral in = integrate_intervals(iv, 0.5, 1.5);
  EXPECT_DOUBLE_EQ(in.area, 0.75);
  EXPECT_DOUBLE_EQ(in.covered_s, 1.0);
}

TEST(TelemetryWindow, GpuSummaryByCounterAndByIntegration) {
  // Readings at t = 0..4 s; the counter follows constant power between readings.
  const double power[] = {100, 200, 200, 300, 100};
  const double energy[] = {0, 150, 350, 600, 800};
  const double sm[] = {1000, 1500, 1500, 1500, 1000};
  const std::uint64_t thr[] = {0, 0x4, 0, 0x40, 0};
  std::vector<GpuSample> v, no_counter;
  for (int i = 0; i < 5; ++i) {
    GpuSample s = gpu_at(i, power[i], energy[i]);
    s.sm_clock_mhz = sm[i];
    s.throttle_reasons = thr[i];
    v.push_back(s);
    s.energy_j.reset();
    no_counter.push_back(s);
  }
  const json j = summarize_gpu_window(v, 0.5, 3.5);
  EXPECT_EQ(j["energy_method"], "counter");
  // Counter at each end placed by the power readings: at 0.5 s, 150 J × (62.5 / 150) of the first
  // interval; at 3.5 s, 600 + 200 J × (125 / 200). (Linear interpolation would say 75 and 700.)
  EXPECT_DOUBLE_EQ(j["energy_j"].get<double>(), 725 - 62.5);
  // Trapezoid of power over [0.5, 3.5]: 87.5 + 200 + 250 + 125 = 662.5 J in 3 s.
  EXPECT_NEAR(j["mean_power_w"].get<double>(), 662.5 / 3, 1e-9);
  EXPECT_DOUBLE_EQ(j["peak_power_w"].get<double>(), 300);
  EXPECT_NEAR(j["mean_sm_clock_mhz"].get<double>(), 4375.0 / 3, 1e-9);
  EXPECT_EQ(j["throttle_reasons"], json({"sw_power_cap", "hw_thermal_slowdown"}));
  // Readings at 1, 2, 3 s: the cap in one of three, the thermal slowdown in another.
  EXPECT_EQ(j["throttle_fraction"], json({{"hw_thermal_slowdown", 1.0 / 3}, {"sw_power_cap", 1.0 / 3}}));
  EXPECT_EQ(j["readings"], 3);
  EXPECT_DOUBLE_EQ(j["window_covered_frac"].get<double>(), 1.0);

  const json k = summarize_gpu_window(no_counter, 0.5, 3.5);
  EXPECT_EQ(k["energy_method"], "integrated_power");
  EXPECT_DOUBLE_EQ(k["energy_j"].get<double>(), 662.5);
  EXPECT_FALSE(k.contains("max_temperature_c"));  // never reported: left out, not zero
  EXPECT_FALSE(k.contains("mean_pcie_tx_bytes_per_s"));
}

TEST(TelemetryWindow, ErrorMidWindowIsRecordedAndBridged) {
  std::vector<GpuSample> v;
  for (int i = 0; i < 5; ++i) v.push_back(gpu_at(i, 150, 150.0 * i));
  v[2] = GpuSample{};
  v[2].t_s = 2;
  v[2].error = "nvmlDeviceGetTotalEnergyConsumption: GPU is lost";
  const json j = summarize_gpu_window(v, 0.5, 3.5);
  EXPECT_DOUBLE_EQ(j["energy_j"].get<double>(), 450);  // interpolated across the failed reading
  ASSERT_TRUE(j.contains("errors"));
  EXPECT_EQ(j["errors"][0]["count"], 1);
  EXPECT_EQ(j["errors"][0]["message"], "nvmlDeviceGetTotalEnergyConsumption: GPU is lost");
}

TEST(TelemetryWindow, HostSummary) {
  std::vector<HostSample> v(3);
  for (int i = 0; i < 3; ++i) v[i].t_s = i;
  v[1].core_busy_frac = {0.5, 1.0};  // over (0, 1]
  v[2].core_busy_frac = {0.0, 0.5};  // over (1, 2]
  v[0].process_cpu_s = 1.0, v[1].process_cpu_s = 1.5, v[2].process_cpu_s = 2.5;
  v[0].rss_bytes = 100, v[1].rss_bytes = 300, v[2].rss_bytes = 200;
  const json j = summarize_host_window(v, 0.5, 2);
  // core 0: (0.5×0.5 + 0×1)/1.5; core 1: (1×0.5 + 0.5×1)/1.5.
  EXPECT_NEAR(j["mean_cpu_pct"].get<double>(), 100 * (0.25 / 1.5 + 1.0 / 1.5) / 2, 1e-9);
  EXPECT_NEAR(j["busiest_core_pct"].get<double>(), 100 * 1.0 / 1.5, 1e-9);
  EXPECT_DOUBLE_EQ(j["process_cpu_s"].get<double>(), 2.5 - 1.25);
  EXPECT_EQ(j["max_rss_bytes"], 300);
  EXPECT_FALSE(j.contains("package_energy_j"));
}

TEST(TelemetryWindow, ThrottleNamesAndSampleJson) {
  EXPECT_EQ(decode_throttle_reasons(0x1 | 0x80), (std::vector<std::string>{"gpu_idle", "hw_power_brake_slowdown"}));
  EXPECT_EQ(decode_throttle_reasons(0x1000), (std::vector<std::string>{"unknown_0x1000"}));
  const json j = to_json(gpu_at(1.5, 99.5, std::nullopt));
  EXPECT_EQ(j, json({{"t_s", 1.5}, {"power_w", 99.5}}));  // every unsupported field left out
}

// --- host parsing ---------------------------------------------------------------------------

TEST(TelemetryHost, ProcStatDeltasRssAndPowercapWrap) {
  TempDir d;
  const double max_uj = 262143328850;
  d.write("proc/stat",
          "cpu  300 0 50 1600 50 0 0 0 0 0\n"
          "cpu0 100 0 50 800 50 0 0 0 0 0\n"
          "cpu1 200 0 0 800 0 0 0 0 0 0\n"
          "intr 12345 1 2 3\nctxt 99\n");
  d.write("proc/self/statm", "4000 512 100 10 0 300 0\n");
  d.write("sys/class/powercap/intel-rapl:0/name", "package-0\n");
  d.write("sys/class/powercap/intel-rapl:0/max_energy_range_uj", "262143328850\n");
  d.write("sys/class/powercap/intel-rapl:0/energy_uj", "262142328850\n");  // 1 J below the wrap
  d.write("sys/class/powercap/intel-rapl:0:0/energy_uj", "123\n");        // a sub-zone: not a package
  HostSource host(d.path() / "proc", d.path() / "sys");
  ASSERT_TRUE(host.has_package_energy());
  const HostSample a = host.read(1.0);
  EXPECT_TRUE(a.core_busy_frac.empty());  // no previous snapshot yet
  EXPECT_EQ(a.rss_bytes, 512 * sysconf(_SC_PAGESIZE));
  ASSERT_TRUE(a.package_energy_j);
  EXPECT_DOUBLE_EQ(*a.package_energy_j, (max_uj - 1e6) / 1e6);
  EXPECT_GT(a.process_cpu_s, 0);

  // cpu0: +30 user +10 system +50 idle +10 iowait -> 40/100 busy; cpu1: +90 user +10 steal -> 90/100.
  d.write("proc/stat",
          "cpu  420 0 60 1650 60 0 0 10 0 0\n"
          "cpu0 130 0 60 850 60 0 0 0 0 0\n"
          "cpu1 290 0 0 800 0 0 0 10 0 0\n"
          "intr 12345 1 2 3\n");
  d.write("sys/class/powercap/intel-rapl:0/energy_uj", "500000\n");  // wrapped: +1.5 J
  d.write("sys/class/powercap/intel-rapl:0:0/energy_uj", "999999999\n");
  const HostSample b = host.read(2.0);
  ASSERT_EQ(b.core_busy_frac.size(), 2u);
  EXPECT_DOUBLE_EQ(b.core_busy_frac[0], 0.4);
  EXPECT_DOUBLE_EQ(b.core_busy_frac[1], 0.9);
  EXPECT_NEAR(*b.package_energy_j - *a.package_energy_j, 1.5, 1e-9);
  EXPECT_FALSE(b.error);
}

// A shared host: others' busy cores, scaled to the cores this run may use, and the run's threads
// against the free ones; the note is the warning the run prints once.
TEST(TelemetryHost, HostLoadSaysWhenTheHostIsSharedOrOversubscribed) {
  const HostLoad idle{0.2, 16, 0.5};
  const json quiet = host_load_json(idle, 0, 8);
  EXPECT_FALSE(quiet["busy"].get<bool>());
  EXPECT_FALSE(quiet["oversubscribed"].get<bool>());
  EXPECT_FALSE(quiet.contains("note"));
  EXPECT_EQ(quiet["cores"], 16);
  EXPECT_DOUBLE_EQ(quiet["load_avg_1m"].get<double>(), 0.5);

  const json all_threads = host_load_json(idle, 0, 16);  // 16 threads, 15.8 free: rounds to 16, fits
  EXPECT_FALSE(all_threads["oversubscribed"].get<bool>());

  const HostLoad loaded{6.0, 16, std::nullopt};
  const json busy = host_load_json(loaded, 0, 8);
  EXPECT_TRUE(busy["busy"].get<bool>());
  EXPECT_FALSE(busy["oversubscribed"].get<bool>());  // 8 threads on 10 free cores
  EXPECT_FALSE(busy.contains("load_avg_1m"));
  EXPECT_NE(busy["note"].get<std::string>().find("6.0 of 16 core(s) busy"), std::string::npos) << busy;

  const json over = host_load_json(loaded, 0, 16);
  EXPECT_TRUE(over["oversubscribed"].get<bool>());
  EXPECT_NE(over["note"].get<std::string>().find("16 thread(s) outnumber the 10.0 free core(s)"), std::string::npos)
      << over;

  // Restricted to 4 of the 16 cores: a quarter of the others' load falls on them (1.5 busy).
  const json pinned = host_load_json(loaded, 4, 4);
  EXPECT_EQ(pinned["cores"], 4);
  EXPECT_DOUBLE_EQ(pinned["busy_cores"].get<double>(), 1.5);
  EXPECT_TRUE(pinned["busy"].get<bool>());
  EXPECT_TRUE(pinned["oversubscribed"].get<bool>());

  const json one_busy_core_of_64 = host_load_json({1.0, 64, std::nullopt}, 0, 1);
  EXPECT_FALSE(one_busy_core_of_64["busy"].get<bool>());  // under a tenth of the cores
}

TEST(TelemetryHost, HostLoadReadsProcStatAndTheLoadAverage) {
  TempDir d;
  d.write("proc/stat", "cpu  1 0 0 1 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\ncpu1 1 0 0 1 0 0 0 0 0 0\n");
  d.write("proc/loadavg", "3.25 2.00 1.00 2/300 4242\n");
  const HostLoad load = measure_host_load(0.01, d.path() / "proc");
  EXPECT_EQ(load.cores, 2);
  EXPECT_DOUBLE_EQ(load.busy_cores, 0.0);  // the ticks did not move
  ASSERT_TRUE(load.load_avg_1m);
  EXPECT_DOUBLE_EQ(*load.load_avg_1m, 3.25);
}

TEST(TelemetryHost, NoPowercapIsSaidNotZeroed) {
  TempDir d;
  d.write("proc/stat", "cpu  1 0 0 1 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n");
  HostSource host(d.path() / "proc", d.path() / "sys");
  EXPECT_FALSE(host.has_package_energy());
  EXPECT_NE(host.package_energy_note().find("no powercap (intel-rapl)"), std::string::npos);
  const HostSample s = host.read(0);
  EXPECT_FALSE(s.package_energy_j);
  EXPECT_FALSE(s.rss_bytes);  // no statm file in the fake tree: left out
  EXPECT_FALSE(s.error);
  EXPECT_TRUE(HostSource(d.path() / "missing", d.path() / "sys").read(0).error.has_value());
}

// --- sampler --------------------------------------------------------------------------------

TEST(TelemetrySampler, ScriptedGpuEnergyAndEfficiency) {
  auto reads = std::make_shared<std::atomic<int>>(0);
  Script s;
  s.error_at = {3};  // the reading at t = 0.3 s fails; sampling goes on
  Sampler sampler(one_gpu(s, reads), nullptr, 0.002, stepping_clock());
  sampler.start();
  EXPECT_TRUE(sampler.has_power());
  ASSERT_NO_FATAL_FAILURE(wait_for_reads(*reads, 12));
  sampler.stop();
  const int after_stop = reads->load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(reads->load(), after_stop);  // the thread is gone

  const json j = sampler.summarize(0.25, 0.75, 300);
  ASSERT_EQ(j["gpus"].size(), 1u);
  const json& g = j["gpus"][0];
  EXPECT_EQ(g["name"], "Fake GPU");
  EXPECT_EQ(g["pci_bus_id"], "00000000:01:00.0");
  EXPECT_EQ(g["energy_method"], "counter");
  EXPECT_NEAR(g["energy_j"].get<double>(), 75, 1e-9);  // 150 W × 0.5 s
  EXPECT_NEAR(g["mean_power_w"].get<double>(), 150, 1e-9);
  EXPECT_NEAR(j["samples_per_j"].get<double>(), 4.0, 1e-9);
  EXPECT_NEAR(j["samples_per_s_per_w"].get<double>(), 4.0, 1e-9);
  EXPECT_EQ(g["errors"][0]["count"], 1);
  EXPECT_EQ(g["throttle_reasons"], json({"sw_power_cap"}));
  EXPECT_FALSE(g.contains("max_temperature_c"));
  EXPECT_FALSE(j.contains("host"));

  const json t = sampler.trace();
  ASSERT_GE(t["gpus"][0]["samples"].size(), 12u);
  EXPECT_TRUE(t["gpus"][0]["samples"][3].contains("error"));
  EXPECT_FALSE(t["gpus"][0]["samples"][3].contains("power_w"));
  EXPECT_FALSE(t["gpus"][0]["samples"][4].contains("temperature_c"));
}

TEST(TelemetrySampler, SparseCounterReadingsStillGiveTheWindowEnergy) {
  // Power 100 W, a ramp to 300 W over [0.4, 0.5] s, then 300 W; the energy counter is its integral.
  Script s;
  s.power_w = [](double t) { return t <= 0.4 ? 100 : t >= 0.5 ? 300 : 100 + 2000 * (t - 0.4); };
  s.energy_j = [](double t) {
    if (t <= 0.4) return 1000 + 100 * t;
    if (t <= 0.5) return 1040 + 100 * (t - 0.4) + 1000 * (t - 0.4) * (t - 0.4);
    return 1060 + 300 * (t - 0.5);
  };
  auto reads = std::make_shared<std::atomic<int>>(0);
  SamplerOptions o;
  o.period_s = 0.002;
  o.counter_period_s = 10;  // counters only at start() and stop()
  Sampler sampler(one_gpu(s, reads), nullptr, o, stepping_clock());
  sampler.start();
  ASSERT_NO_FATAL_FAILURE(wait_for_reads(*reads, 15));
  sampler.stop();
  const json t = sampler.trace();
  const auto& samples = t["gpus"][0]["samples"];
  EXPECT_TRUE(samples.front().contains("energy_j"));
  EXPECT_FALSE(samples[1].contains("energy_j"));
  EXPECT_TRUE(samples.back().contains("energy_j"));
  const json j = sampler.summarize(0.25, 0.75, 1);
  EXPECT_EQ(j["gpus"][0]["energy_method"], "counter");
  EXPECT_NEAR(j["gpus"][0]["energy_j"].get<double>(), (1060 + 300 * 0.25) - (1000 + 100 * 0.25), 1e-6);
}

TEST(TelemetrySampler, ReadLevelsFollowTheirCadences) {
  auto reads = std::make_shared<std::atomic<int>>(0);
  Script s;
  s.temperature_c = 40;  // read at the slow level only
  SamplerOptions o;
  o.period_s = 0.001;
  o.slow_period_s = 0.005;     // every 5th periodic reading
  o.counter_period_s = 0.010;  // every 10th
  Sampler sampler(one_gpu(s, reads), nullptr, o, stepping_clock());
  sampler.start();
  ASSERT_NO_FATAL_FAILURE(wait_for_reads(*reads, 40));
  sampler.stop();
  const json samples = sampler.trace()["gpus"][0]["samples"];
  int slow = 0, counters = 0;
  for (std::size_t i = 1; i + 1 < samples.size(); ++i) {  // between the full start and stop readings
    slow += samples[i].contains("temperature_c");
    counters += samples[i].contains("energy_j");
    if (samples[i].contains("energy_j")) {
      EXPECT_TRUE(samples[i].contains("temperature_c"));
    }
  }
  const int periodic = static_cast<int>(samples.size()) - 2;
  EXPECT_EQ(slow, periodic / 5);
  EXPECT_EQ(counters, periodic / 10);
}

TEST(TelemetrySampler, NoPowerWithoutPowerFields) {
  Script s;
  s.power_w = [](double) { return std::nullopt; };
  s.energy_j = [](double) { return std::nullopt; };
  Sampler sampler(one_gpu(s, std::make_shared<std::atomic<int>>(0)), nullptr, 0.01);
  sampler.start();
  sampler.stop();
  EXPECT_FALSE(sampler.has_power());
  const json j = sampler.summarize(0, 1, 10);
  EXPECT_FALSE(j.contains("energy_j"));
  EXPECT_FALSE(j.contains("samples_per_j"));
  EXPECT_FALSE(j["gpus"][0].contains("mean_power_w"));
}

TEST(TelemetrySampler, RepeatedStartStopAndConcurrentSummaries) {
  auto reads = std::make_shared<std::atomic<int>>(0);
  Sampler sampler(one_gpu(Script{}, reads), std::make_unique<HostSource>(), 0.002);
  std::atomic<bool> done{false};
  std::atomic<int> summaries{0};
  std::thread reader([&] {
    while (!done) {
      const double now = ab::measure::monotonic_seconds();
      const json j = sampler.summarize(now - 0.05, now, 10);
      if (j.contains("gpus")) ++summaries;
      (void)sampler.trace();
      (void)sampler.overhead_cpu_s();
    }
  });
  for (int i = 0; i < 5; ++i) {
    sampler.start();
    sampler.start();  // idempotent
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    sampler.stop();
    sampler.stop();
    EXPECT_FALSE(sampler.running());
  }
  done = true;
  reader.join();
  EXPECT_GT(summaries.load(), 0);
  // Timestamps strictly ordered across the restarts.
  const json t = sampler.trace();
  double last = -1;
  for (const auto& s : t["gpus"][0]["samples"]) {
    EXPECT_GT(s["t_s"].get<double>(), last);
    last = s["t_s"].get<double>();
  }
  EXPECT_EQ(t["gpus"][0]["samples"].size(), static_cast<std::size_t>(reads->load()));
}

TEST(TelemetrySampler, WindowEndJustNowIsBracketed) {
  Sampler sampler(one_gpu(Script{}, std::make_shared<std::atomic<int>>(0)), nullptr, 0.5);
  sampler.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double t1 = ab::measure::monotonic_seconds();
  const auto begin = std::chrono::steady_clock::now();
  const json j = sampler.summarize(t1 - 0.01, t1, 1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(), 0.2);
  EXPECT_DOUBLE_EQ(j["gpus"][0]["window_covered_frac"].get<double>(), 1.0);
  EXPECT_EQ(j["gpus"][0]["energy_method"], "counter");
}

TEST(TelemetrySampler, DestructorAndExceptionsStopTheThread) {
  auto reads = std::make_shared<std::atomic<int>>(0);
  try {
    Sampler sampler(one_gpu(Script{}, reads), nullptr, 0.001);
    sampler.start();
    ASSERT_NO_FATAL_FAILURE(wait_for_reads(*reads, 3));
    throw std::runtime_error("workload failed");
  } catch (const std::runtime_error&) {
  }
  const int n = reads->load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(reads->load(), n);
  EXPECT_THROW(Sampler({}, nullptr, 0.0), ab::UsageError);
}

TEST(TelemetrySampler, DiscardKeepsTheBracketingReading) {
  auto reads = std::make_shared<std::atomic<int>>(0);
  Sampler sampler(one_gpu(Script{}, reads), nullptr, 0.001, stepping_clock());
  sampler.start();
  ASSERT_NO_FATAL_FAILURE(wait_for_reads(*reads, 15));
  sampler.stop();
  sampler.discard_before(0.55);
  const json t = sampler.trace();
  EXPECT_NEAR(t["gpus"][0]["samples"][0]["t_s"].get<double>(), 0.5, 1e-9);
  EXPECT_NEAR(sampler.summarize(0.55, 0.95, 1)["gpus"][0]["energy_j"].get<double>(), 60, 1e-9);
}

namespace {
std::atomic<long> g_signal_tid{0};
extern "C" void record_tid(int) { g_signal_tid = static_cast<long>(syscall(SYS_gettid)); }
}  // namespace

TEST(TelemetrySampler, CtrlCReachesTheMainThreadNotTheSampler) {
  struct sigaction sa {}, old {};
  sa.sa_handler = record_tid;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old);
  Sampler sampler(one_gpu(Script{}, std::make_shared<std::atomic<int>>(0)), nullptr, 0.001);
  sampler.start();
  const long main_tid = static_cast<long>(syscall(SYS_gettid));
  for (int i = 0; i < 20; ++i) {
    g_signal_tid = 0;
    kill(getpid(), SIGINT);  // process-directed: any thread that does not block it may take it
    while (g_signal_tid == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    EXPECT_EQ(g_signal_tid.load(), main_tid);
  }
  sampler.stop();
  sigaction(SIGINT, &old, nullptr);
}

TEST(TelemetrySampler, OverheadOfTheRealHostSourceAt20ms) {
  Sampler sampler({}, std::make_unique<HostSource>(), 0.020);
  const double t0 = ab::measure::monotonic_seconds();
  sampler.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  sampler.stop();
  const double wall = ab::measure::monotonic_seconds() - t0;
  const double frac = sampler.overhead_cpu_s() / wall;
  std::cout << "[ overhead ] sampler CPU " << sampler.overhead_cpu_s() * 1e3 << " ms over " << wall
            << " s wall = " << 100 * frac << "% of one core\n";
  EXPECT_LT(frac, 0.05);
  const json j = sampler.summarize(t0, t0 + 0.4, 0);
  EXPECT_TRUE(j.contains("sampler_cpu_pct_of_core"));
  EXPECT_TRUE(j["host"].contains("mean_cpu_pct"));
  EXPECT_GE(j["host"]["readings"].get<int>(), 3);  // host every 100 ms
  ::testing::Test::RecordProperty("sampler_overhead_pct", std::to_string(100 * frac));
}

// --- NVML and monitor -----------------------------------------------------------------------

TEST(TelemetryNvml, AbsentDriverGivesNoDevicesAndAReason) {
  if (void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(h);
    GTEST_SKIP() << "libnvidia-ml.so.1 is present on this machine";
  }
  std::string reason;
  const auto devices = open_nvml_devices({}, &reason);
  EXPECT_TRUE(devices.empty());
  EXPECT_NE(reason.find("NVML unavailable"), std::string::npos);
  const auto lib = NvmlLibrary::load();
  EXPECT_FALSE(lib->available());
  EXPECT_EQ(lib->device_count(), 0);
  std::string err;
  EXPECT_EQ(lib->open_index(0, &err), nullptr);
  EXPECT_FALSE(err.empty());
}

// On a machine with a driver (the H200 nodes): real readings, per-read cost, a sampled window.
TEST(TelemetryNvml, RealDevicesWhenPresent) {
  std::string reason;
  auto gpus = open_nvml_devices({}, &reason);
  if (gpus.empty()) GTEST_SKIP() << reason;
  auto cpu_s = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  };
  for (auto& g : gpus) {
    g->read(ab::measure::monotonic_seconds(), ReadLevel::counters);  // primes the counter rates
    for (ReadLevel level : {ReadLevel::fast, ReadLevel::slow, ReadLevel::counters}) {
      const int n = 10;
      double cpu = 0;
      for (int i = 0; i < n; ++i) {  // after a sleep, as in the sampler: a warm loop is far cheaper
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const double c0 = cpu_s();
        g->read(ab::measure::monotonic_seconds(), level);
        cpu += cpu_s() - c0;
      }
      std::cout << "[ nvml ] " << g->name() << " " << g->pci_bus_id() << ": a " << static_cast<int>(level)
                << " (0 fast, 1 slow, 2 counters) reading costs " << cpu / n * 1e6 << " us CPU\n";
    }
    const GpuSample s = g->read(ab::measure::monotonic_seconds(), ReadLevel::counters);
    std::cout << "[ nvml ] " << to_json(s).dump() << "\n";
    EXPECT_TRUE(s.power_w || s.energy_j);
    EXPECT_FALSE(s.error) << *s.error;
  }
  Sampler sampler(std::move(gpus), std::make_unique<HostSource>(), 0.020);
  const double t0 = ab::measure::monotonic_seconds();
  sampler.start();
  EXPECT_TRUE(sampler.has_power());
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  const json j = sampler.summarize(t0 + 0.2, ab::measure::monotonic_seconds(), 1000);
  sampler.stop();
  const double wall = ab::measure::monotonic_seconds() - t0;
  std::cout << "[ nvml ] summary " << j.dump(1) << "\n[ nvml ] sampler CPU " << 100 * sampler.overhead_cpu_s() / wall
            << "% of one core at 20 ms\n";
  EXPECT_TRUE(j.contains("energy_j"));
  EXPECT_LT(sampler.overhead_cpu_s() / wall, 0.05);
  std::ostringstream out;
  run_monitor(0.1, 0.35, out);
  std::cout << out.str();
}

TEST(TelemetryMonitor, PrintsHeaderAndLinesForFakeSources) {
  TempDir d;
  d.write("proc/stat", "cpu  1 0 0 1 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n");
  std::ostringstream out;
  auto reads = std::make_shared<std::atomic<int>>(0);
  Script s;
  s.temperature_c = 41;
  EXPECT_EQ(run_monitor(one_gpu(s, reads), std::make_unique<HostSource>(d.path() / "proc", d.path() / "sys"), "", 0.03,
                        0.07, out),
            0);
  const std::string text = out.str();
  EXPECT_NE(text.find("pwr_w"), std::string::npos);
  EXPECT_NE(text.find("cpu_pct"), std::string::npos);
  EXPECT_NE(text.find("150.0"), std::string::npos);
  EXPECT_NE(text.find("sw_power_cap"), std::string::npos);
  EXPECT_GE(reads->load(), 3);  // the priming reading plus at least two lines
}

TEST(TelemetryMonitor, RealMachineWithoutNvmlShowsHostColumns) {
  std::ostringstream out;
  EXPECT_EQ(run_monitor(0.03, 0.07, out), 0);
  const std::string text = out.str();
  EXPECT_NE(text.find(" host"), std::string::npos);
  if (void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(h);
  } else {
    EXPECT_NE(text.find("host columns only"), std::string::npos) << text;
  }
}
