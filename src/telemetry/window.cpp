#include "telemetry/window.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

namespace ab::telemetry {
namespace {

double lerp(const Point& a, const Point& b, double t_s) {
  if (b.t_s <= a.t_s) return b.value;
  return a.value + (b.value - a.value) * (t_s - a.t_s) / (b.t_s - a.t_s);
}

// [first, end) of the samples with t0 <= t <= t1.
template <class S>
std::pair<std::size_t, std::size_t> in_window(const std::vector<S>& v, double t0_s, double t1_s) {
  const auto lo = std::lower_bound(v.begin(), v.end(), t0_s, [](const S& x, double t) { return x.t_s < t; });
  const auto hi = std::upper_bound(v.begin(), v.end(), t1_s, [](double t, const S& x) { return t < x.t_s; });
  return {static_cast<std::size_t>(lo - v.begin()), static_cast<std::size_t>(std::max(lo, hi) - v.begin())};
}

// The readings of one field inside the window plus the nearest reading on each side of it, so the
// window ends can be interpolated across samples where the field is missing (errors).
template <class S, class Get>
Series collect(const std::vector<S>& v, double t0_s, double t1_s, Get get) {
  const auto [first, end] = in_window(v, t0_s, t1_s);
  Series s;
  for (std::size_t i = first; i-- > 0;) {
    if (const auto x = get(v[i])) {
      s.push_back({v[i].t_s, static_cast<double>(*x)});
      break;
    }
  }
  for (std::size_t i = first; i < end; ++i)
    if (const auto x = get(v[i])) s.push_back({v[i].t_s, static_cast<double>(*x)});
  for (std::size_t i = end; i < v.size(); ++i) {
    if (const auto x = get(v[i])) {
      s.push_back({v[i].t_s, static_cast<double>(*x)});
      break;
    }
  }
  return s;
}

// Samples whose interval overlaps the window, each with the start of its interval. A value read at
// t_i covers the time since the previous reading that carried it (the source's previous counter or
// /proc/stat snapshot) or, for the first one, since the reading before it (the priming snapshot).
template <class S, class Present>
std::vector<std::pair<const S*, double>> intervals_in(const std::vector<S>& v, double t0_s, double t1_s,
                                                      Present present) {
  std::vector<std::pair<const S*, double>> out;
  std::size_t i = in_window(v, t0_s, t1_s).first;
  while (i < v.size() && v[i].t_s <= t0_s) ++i;  // intervals ending at or before t0 do not overlap
  std::optional<double> prev_t;
  for (std::size_t k = i; k-- > 0;) {
    if (present(v[k])) {
      prev_t = v[k].t_s;
      break;
    }
  }
  for (; i < v.size() && (!prev_t || *prev_t < t1_s); ++i) {
    if (!present(v[i])) continue;
    if (!prev_t && i > 0) prev_t = v[i - 1].t_s;
    if (prev_t) out.emplace_back(&v[i], *prev_t);
    prev_t = v[i].t_s;
  }
  return out;
}

std::optional<double> interval_mean(const std::vector<GpuSample>& v, double t0_s, double t1_s,
                                    std::optional<double> GpuSample::*field) {
  std::vector<Interval> iv;
  for (const auto& [s, start] : intervals_in(v, t0_s, t1_s, [&](const GpuSample& x) { return (x.*field).has_value(); }))
    iv.push_back({start, s->t_s, *(s->*field)});
  const Integral in = integrate_intervals(iv, t0_s, t1_s);
  if (in.covered_s <= 0) return std::nullopt;
  return in.area / in.covered_s;
}

void put(nlohmann::json& j, const char* key, const std::optional<double>& v) {
  if (v) j[key] = *v;
}

auto field(std::optional<double> GpuSample::*f) {
  return [f](const GpuSample& s) { return s.*f; };
}

}  // namespace

std::optional<double> value_at(const Series& s, double t_s) {
  if (s.empty() || t_s < s.front().t_s || t_s > s.back().t_s) return std::nullopt;
  const auto hi = std::upper_bound(s.begin(), s.end(), t_s, [](double t, const Point& p) { return t < p.t_s; });
  if (hi == s.end()) return s.back().value;
  return lerp(*(hi - 1), *hi, t_s);
}

Integral integrate(const Series& s, double t0_s, double t1_s) {
  Integral out;
  if (s.size() < 2) return out;
  const double lo = std::max(t0_s, s.front().t_s), hi = std::min(t1_s, s.back().t_s);
  if (hi <= lo) return out;
  for (std::size_t i = 0; i + 1 < s.size(); ++i) {
    const double a = std::max(lo, s[i].t_s), b = std::min(hi, s[i + 1].t_s);
    if (b <= a) continue;
    out.area += (b - a) * (lerp(s[i], s[i + 1], a) + lerp(s[i], s[i + 1], b)) / 2;
    out.covered_s += b - a;
  }
  return out;
}

Integral integrate_intervals(const std::vector<Interval>& intervals, double t0_s, double t1_s) {
  Integral out;
  for (const Interval& iv : intervals) {
    const double overlap = std::min(iv.t1_s, t1_s) - std::max(iv.t0_s, t0_s);
    if (overlap <= 0) continue;
    out.area += iv.value * overlap;
    out.covered_s += overlap;
  }
  return out;
}

std::optional<double> counter_at(const Series& counter, double t_s, const Series& shape) {
  if (counter.empty() || t_s < counter.front().t_s || t_s > counter.back().t_s) return std::nullopt;
  const auto hi = std::upper_bound(counter.begin(), counter.end(), t_s,
                                   [](double t, const Point& p) { return t < p.t_s; });
  if (hi == counter.end()) return counter.back().value;
  const Point& a = *(hi - 1);
  const Point& b = *hi;
  const Integral whole = integrate(shape, a.t_s, b.t_s);
  // Only a shape that covers the whole interval with positive area can place the increase.
  if (whole.area > 0 && whole.covered_s >= (b.t_s - a.t_s) * (1 - 1e-9))
    return a.value + (b.value - a.value) * integrate(shape, a.t_s, t_s).area / whole.area;
  return lerp(a, b, t_s);
}

std::optional<CounterDelta> counter_delta(const Series& counter, double t0_s, double t1_s, const Series& shape) {
  if (counter.size() < 2) return std::nullopt;
  const double lo = std::max(t0_s, counter.front().t_s), hi = std::min(t1_s, counter.back().t_s);
  if (hi <= lo) return std::nullopt;
  for (std::size_t i = 1; i < counter.size(); ++i)
    if (counter[i].value < counter[i - 1].value) return std::nullopt;  // reset: the difference means nothing
  return CounterDelta{*counter_at(counter, hi, shape) - *counter_at(counter, lo, shape), hi - lo};
}

std::optional<double> window_mean(const Series& s, double t0_s, double t1_s) {
  const Integral in = integrate(s, t0_s, t1_s);
  if (in.covered_s > 0) return in.area / in.covered_s;
  double sum = 0;
  int n = 0;
  for (const Point& p : s) {
    if (p.t_s >= t0_s && p.t_s <= t1_s) sum += p.value, ++n;
  }
  if (n == 0) return std::nullopt;
  return sum / n;
}

std::optional<double> window_peak(const Series& s, double t0_s, double t1_s) {
  std::optional<double> peak;
  auto take = [&](std::optional<double> v) {
    if (v && (!peak || *v > *peak)) peak = v;
  };
  for (const Point& p : s)
    if (p.t_s >= t0_s && p.t_s <= t1_s) take(p.value);
  take(value_at(s, t0_s));
  take(value_at(s, t1_s));
  return peak;
}

nlohmann::json summarize_gpu_window(const std::vector<GpuSample>& v, double t0_s, double t1_s) {
  nlohmann::json j = nlohmann::json::object();
  const auto [first, end] = in_window(v, t0_s, t1_s);
  j["readings"] = end - first;
  if (!v.empty() && t1_s > t0_s) {
    const double covered = std::min(t1_s, v.back().t_s) - std::max(t0_s, v.front().t_s);
    j["window_covered_frac"] = std::clamp(covered / (t1_s - t0_s), 0.0, 1.0);
  }

  const Series power = collect(v, t0_s, t1_s, field(&GpuSample::power_w));
  put(j, "mean_power_w", window_mean(power, t0_s, t1_s));
  put(j, "peak_power_w", window_peak(power, t0_s, t1_s));
  put(j, "peak_power_instant_w",
      window_peak(collect(v, t0_s, t1_s, field(&GpuSample::power_instant_w)), t0_s, t1_s));

  // Energy: the device's own counter where it has one, else the integral of the power readings.
  // The counter is read sparsely (it is expensive); between its readings the energy follows the
  // power readings, instantaneous ones where the device has them.
  const Series counter = collect(v, t0_s, t1_s, field(&GpuSample::energy_j));
  Series shape;
  if (counter.size() >= 2) {
    shape = collect(v, counter.front().t_s, counter.back().t_s, field(&GpuSample::power_instant_w));
    if (shape.size() < 2) shape = collect(v, counter.front().t_s, counter.back().t_s, field(&GpuSample::power_w));
  }
  if (const auto cd = counter_delta(counter, t0_s, t1_s, shape)) {
    j["energy_j"] = cd->delta;
    j["energy_method"] = "counter";
    j["mean_power_from_energy_w"] = cd->delta / cd->covered_s;
  } else {
    if (counter.size() >= 2) j["energy_note"] = "energy counter went backwards (driver reload?); used integrated power";
    const Integral in = integrate(power, t0_s, t1_s);
    if (in.covered_s > 0) {
      j["energy_j"] = in.area;
      j["energy_method"] = "integrated_power";
      j["mean_power_from_energy_w"] = in.area / in.covered_s;
    }
  }

  put(j, "power_limit_w", window_peak(collect(v, t0_s, t1_s, field(&GpuSample::power_limit_w)), t0_s, t1_s));
  put(j, "mean_sm_clock_mhz", window_mean(collect(v, t0_s, t1_s, field(&GpuSample::sm_clock_mhz)), t0_s, t1_s));
  put(j, "mean_mem_clock_mhz", window_mean(collect(v, t0_s, t1_s, field(&GpuSample::mem_clock_mhz)), t0_s, t1_s));
  put(j, "mean_gpu_util_pct", window_mean(collect(v, t0_s, t1_s, field(&GpuSample::gpu_util_pct)), t0_s, t1_s));
  put(j, "mean_mem_util_pct", window_mean(collect(v, t0_s, t1_s, field(&GpuSample::mem_util_pct)), t0_s, t1_s));
  put(j, "max_temperature_c", window_peak(collect(v, t0_s, t1_s, field(&GpuSample::temperature_c)), t0_s, t1_s));
  if (const auto m = window_peak(collect(v, t0_s, t1_s, field(&GpuSample::mem_used_bytes)), t0_s, t1_s))
    j["max_mem_used_bytes"] = static_cast<std::int64_t>(std::llround(*m));
  put(j, "mean_pcie_tx_bytes_per_s", interval_mean(v, t0_s, t1_s, &GpuSample::pcie_tx_bytes_per_s));
  put(j, "mean_pcie_rx_bytes_per_s", interval_mean(v, t0_s, t1_s, &GpuSample::pcie_rx_bytes_per_s));
  put(j, "mean_nvlink_tx_bytes_per_s", interval_mean(v, t0_s, t1_s, &GpuSample::nvlink_tx_bytes_per_s));
  put(j, "mean_nvlink_rx_bytes_per_s", interval_mean(v, t0_s, t1_s, &GpuSample::nvlink_rx_bytes_per_s));

  // Throttle reasons seen inside the window; with no reading inside it, those bracketing it.
  std::optional<std::uint64_t> mask;
  auto add_mask = [&](const GpuSample& s) {
    if (s.throttle_reasons) mask = mask.value_or(0) | *s.throttle_reasons;
  };
  for (std::size_t i = first; i < end; ++i) add_mask(v[i]);
  if (!mask) {
    if (first > 0) add_mask(v[first - 1]);
    if (end < v.size()) add_mask(v[end]);
  }
  if (mask) {
    j["throttle_mask"] = *mask;
    j["throttle_reasons"] = decode_throttle_reasons(*mask);
  }
  // How much of the window each reason held: the share of the readings inside it that carry the
  // bit (readings come at a fixed period), so a window says whether its GPU met the power cap once
  // or a third of the time (ResNet-50 training on an H200 does the latter, bench/HISTORY.md).
  std::map<std::string, int> held;
  int with_mask = 0;
  for (std::size_t i = first; i < end; ++i) {
    if (!v[i].throttle_reasons) continue;
    ++with_mask;
    for (const std::string& reason : decode_throttle_reasons(*v[i].throttle_reasons)) ++held[reason];
  }
  if (with_mask > 0) {
    nlohmann::json fraction = nlohmann::json::object();
    for (const auto& [reason, count] : held) fraction[reason] = static_cast<double>(count) / with_mask;
    j["throttle_fraction"] = fraction;
  }

  std::map<std::string, int> errors;
  for (std::size_t i = first; i < end; ++i)
    if (v[i].error) ++errors[*v[i].error];
  if (!errors.empty()) {
    nlohmann::json e = nlohmann::json::array();
    for (const auto& [message, count] : errors) e.push_back({{"message", message}, {"count", count}});
    j["errors"] = e;
  }
  return j;
}

nlohmann::json summarize_host_window(const std::vector<HostSample>& v, double t0_s, double t1_s) {
  nlohmann::json j = nlohmann::json::object();
  const auto [first, end] = in_window(v, t0_s, t1_s);
  j["readings"] = end - first;

  // Per-core busy fraction, weighted by each interval's overlap with the window.
  std::vector<double> area, covered;
  for (const auto& [s, start] :
       intervals_in(v, t0_s, t1_s, [](const HostSample& x) { return !x.core_busy_frac.empty(); })) {
    const double overlap = std::min(s->t_s, t1_s) - std::max(start, t0_s);
    if (overlap <= 0) continue;
    if (area.size() < s->core_busy_frac.size()) {
      area.resize(s->core_busy_frac.size());
      covered.resize(s->core_busy_frac.size());
    }
    for (std::size_t c = 0; c < s->core_busy_frac.size(); ++c) {
      area[c] += s->core_busy_frac[c] * overlap;
      covered[c] += overlap;
    }
  }
  std::vector<double> core_mean;
  for (std::size_t c = 0; c < area.size(); ++c)
    if (covered[c] > 0) core_mean.push_back(area[c] / covered[c]);
  if (!core_mean.empty()) {
    double sum = 0;
    for (double x : core_mean) sum += x;
    j["cores"] = core_mean.size();
    j["mean_cpu_pct"] = 100.0 * sum / static_cast<double>(core_mean.size());
    j["busiest_core_pct"] = 100.0 * *std::max_element(core_mean.begin(), core_mean.end());
  }

  const Series cpu = collect(v, t0_s, t1_s, [](const HostSample& s) { return std::optional<double>(s.process_cpu_s); });
  if (const auto cd = counter_delta(cpu, t0_s, t1_s)) j["process_cpu_s"] = cd->delta;
  const Series rss = collect(v, t0_s, t1_s, [](const HostSample& s) {
    return s.rss_bytes ? std::optional<double>(static_cast<double>(*s.rss_bytes)) : std::nullopt;
  });
  if (const auto m = window_peak(rss, t0_s, t1_s)) j["max_rss_bytes"] = static_cast<std::int64_t>(std::llround(*m));
  const Series pkg = collect(v, t0_s, t1_s, [](const HostSample& s) { return s.package_energy_j; });
  if (const auto cd = counter_delta(pkg, t0_s, t1_s)) {
    j["package_energy_j"] = cd->delta;
    j["package_mean_power_w"] = cd->delta / cd->covered_s;
  }
  return j;
}

std::vector<std::string> decode_throttle_reasons(std::uint64_t mask) {
  // Bit values of nvmlClocksEventReason* (nvml.h; the older nvmlClocksThrottleReason* are the same).
  static constexpr std::array<std::pair<std::uint64_t, const char*>, 9> kNames = {{
      {0x1, "gpu_idle"},
      {0x2, "applications_clocks_setting"},
      {0x4, "sw_power_cap"},
      {0x8, "hw_slowdown"},
      {0x10, "sync_boost"},
      {0x20, "sw_thermal_slowdown"},
      {0x40, "hw_thermal_slowdown"},
      {0x80, "hw_power_brake_slowdown"},
      {0x100, "display_clock_setting"},
  }};
  std::vector<std::string> out;
  std::uint64_t known = 0;
  for (const auto& [bit, name] : kNames) {
    known |= bit;
    if (mask & bit) out.emplace_back(name);
  }
  if (const std::uint64_t rest = mask & ~known) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "unknown_0x%llx", static_cast<unsigned long long>(rest));
    out.emplace_back(buf);
  }
  return out;
}

nlohmann::json to_json(const GpuSample& s) {
  nlohmann::json j = {{"t_s", s.t_s}};
  put(j, "power_w", s.power_w);
  put(j, "power_instant_w", s.power_instant_w);
  put(j, "energy_j", s.energy_j);
  put(j, "power_limit_w", s.power_limit_w);
  put(j, "sm_clock_mhz", s.sm_clock_mhz);
  put(j, "mem_clock_mhz", s.mem_clock_mhz);
  put(j, "temperature_c", s.temperature_c);
  put(j, "gpu_util_pct", s.gpu_util_pct);
  put(j, "mem_util_pct", s.mem_util_pct);
  put(j, "mem_used_bytes", s.mem_used_bytes);
  put(j, "pcie_tx_bytes_per_s", s.pcie_tx_bytes_per_s);
  put(j, "pcie_rx_bytes_per_s", s.pcie_rx_bytes_per_s);
  put(j, "nvlink_tx_bytes_per_s", s.nvlink_tx_bytes_per_s);
  put(j, "nvlink_rx_bytes_per_s", s.nvlink_rx_bytes_per_s);
  if (s.throttle_reasons) j["throttle_reasons"] = *s.throttle_reasons;
  if (s.error) j["error"] = *s.error;
  return j;
}

nlohmann::json to_json(const HostSample& s) {
  nlohmann::json j = {{"t_s", s.t_s}, {"process_cpu_s", s.process_cpu_s}};
  if (!s.core_busy_frac.empty()) j["core_busy_frac"] = s.core_busy_frac;
  if (s.rss_bytes) j["rss_bytes"] = *s.rss_bytes;
  put(j, "package_energy_j", s.package_energy_j);
  if (s.error) j["error"] = *s.error;
  return j;
}

}  // namespace ab::telemetry
