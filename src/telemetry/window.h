// The maths of a measured window over sampled series: interpolation at the window ends, trapezoid
// integration, counter differences. Pure functions, so tests check them against hand-computed values.
#pragma once

#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "telemetry/telemetry.h"

namespace ab::telemetry {

struct Point {
  double t_s = 0, value = 0;
};
using Series = std::vector<Point>;  // sorted by time

// Linear interpolation at t_s; empty outside [first, last] or for an empty series.
std::optional<double> value_at(const Series& s, double t_s);

struct Integral {
  double area = 0;       // value × seconds
  double covered_s = 0;  // part of the window inside [first, last]
};
// Trapezoid rule over [t0_s, t1_s] clipped to the series, interpolating at the clipped ends.
Integral integrate(const Series& s, double t0_s, double t1_s);

// A value that holds over (t0_s, t1_s]: a rate or a fraction measured over the interval that ends
// at a reading. The window weights each interval by its overlap with it.
struct Interval {
  double t0_s = 0, t1_s = 0, value = 0;
};
Integral integrate_intervals(const std::vector<Interval>& intervals, double t0_s, double t1_s);

// A cumulative counter at t_s, between the two readings around it. With a `shape` series (power
// readings covering that interval) the increase is spread in proportion to the integral of the
// shape, so sparse counter readings still follow load changes between them; otherwise linearly.
std::optional<double> counter_at(const Series& counter, double t_s, const Series& shape = {});

// Counter at t1 minus counter at t0 (each by counter_at), clipped to the counter's readings.
// Empty when the clipped window is empty or the counter went backwards (a driver reload resets it).
struct CounterDelta {
  double delta = 0, covered_s = 0;
};
std::optional<CounterDelta> counter_delta(const Series& counter, double t0_s, double t1_s, const Series& shape = {});

// Time-weighted mean (trapezoid); with no covered time, the mean of the points inside the window.
std::optional<double> window_mean(const Series& s, double t0_s, double t1_s);
// Largest reading inside the window, the interpolated values at its ends included.
std::optional<double> window_peak(const Series& s, double t0_s, double t1_s);

// Per-device and host summaries of [t0_s, t1_s]; keys as in docs/TELEMETRY.md, absent when no data.
nlohmann::json summarize_gpu_window(const std::vector<GpuSample>& samples, double t0_s, double t1_s);
nlohmann::json summarize_host_window(const std::vector<HostSample>& samples, double t0_s, double t1_s);

}  // namespace ab::telemetry
