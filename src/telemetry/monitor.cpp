// `accelbench monitor`: live readings in fixed columns, one line per GPU and one host line per
// interval, in the manner of `nvidia-smi dmon`.
#include <signal.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "core/error.h"
#include "measure/timer.h"
#include "telemetry/telemetry.h"

namespace ab::telemetry {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_interrupt(int) { g_interrupted = 1; }

// Installs a Ctrl-C handler for the monitor's lifetime and puts the previous one back.
class InterruptScope {
 public:
  InterruptScope() {
    g_interrupted = 0;
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~InterruptScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

std::string cell(const std::optional<double>& v, int width, int decimals, double scale = 1.0) {
  char buf[64];
  if (v) std::snprintf(buf, sizeof buf, "%*.*f", width, decimals, *v * scale);
  else std::snprintf(buf, sizeof buf, "%*s", width, "-");
  return buf;
}

std::string throttle_cell(const std::optional<std::uint64_t>& mask) {
  if (!mask) return "-";
  if (*mask == 0) return "none";
  std::string out;
  for (const auto& name : decode_throttle_reasons(*mask)) out += (out.empty() ? "" : ",") + name;
  return out;
}

}  // namespace

int run_monitor(std::vector<std::unique_ptr<GpuSource>> gpus, std::unique_ptr<HostSource> host,
                const std::string& note, double interval_s, double duration_s, std::ostream& out,
                const std::function<bool()>& should_stop) {
  if (!(interval_s > 0)) throw UsageError("monitor interval must be positive");
  if (duration_s < 0) throw UsageError("monitor duration must not be negative");
  auto stop = [&] { return should_stop && should_stop(); };

  out << "# accelbench monitor: every " << interval_s * 1e3 << " ms"
      << (duration_s > 0 ? " for " + std::to_string(duration_s) + " s" : std::string(", until Ctrl-C")) << "\n";
  if (!note.empty()) out << "# " << note << "\n";
  if (host && !host->has_package_energy()) out << "# CPU package power: " << host->package_energy_note() << "\n";
  if (!gpus.empty()) {
    for (std::size_t i = 0; i < gpus.size(); ++i)
      out << "# gpu " << i << ": " << gpus[i]->name() << " " << gpus[i]->pci_bus_id() << "\n";
    out << "#  time_s   dev   pwr_w  inst_w  temp_c  sm_pct mem_pct  sm_mhz mem_mhz used_mib"
           "  pcie_tx_MB/s pcie_rx_MB/s  nvl_tx_MB/s  nvl_rx_MB/s  throttle\n";
  }
  if (host) out << "#  time_s   dev cpu_pct max_core_pct proc_cpu_pct  rss_mib   pkg_w\n";
  out.flush();

  // A first reading primes the rates (CPU busy, byte counters) that need a previous one.
  const double t_start = measure::monotonic_seconds();
  for (auto& g : gpus) g->read(t_start, ReadLevel::counters);
  std::optional<HostSample> prev_host;
  if (host) prev_host = host->read(t_start);

  double next = t_start + interval_s;
  for (;;) {
    // Sleep in short slices so Ctrl-C ends the monitor promptly.
    for (double now = measure::monotonic_seconds(); now < next && !stop(); now = measure::monotonic_seconds())
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.05, next - now)));
    if (stop()) break;
    const double t = measure::monotonic_seconds();
    char time_col[32];
    std::snprintf(time_col, sizeof time_col, "%9.2f", t - t_start);
    for (std::size_t i = 0; i < gpus.size(); ++i) {
      const GpuSample s = gpus[i]->read(t, ReadLevel::counters);
      out << time_col << " " << std::string(5 - std::min<std::size_t>(5, std::to_string(i).size()), ' ') << i
          << cell(s.power_w, 8, 1) << cell(s.power_instant_w, 8, 1) << cell(s.temperature_c, 8, 0)
          << cell(s.gpu_util_pct, 8, 0) << cell(s.mem_util_pct, 8, 0) << cell(s.sm_clock_mhz, 8, 0)
          << cell(s.mem_clock_mhz, 8, 0) << cell(s.mem_used_bytes, 9, 0, 1.0 / (1 << 20))
          << cell(s.pcie_tx_bytes_per_s, 14, 1, 1e-6) << cell(s.pcie_rx_bytes_per_s, 13, 1, 1e-6)
          << cell(s.nvlink_tx_bytes_per_s, 13, 1, 1e-6) << cell(s.nvlink_rx_bytes_per_s, 13, 1, 1e-6) << "  "
          << throttle_cell(s.throttle_reasons);
      if (s.error) out << "  error: " << *s.error;
      out << "\n";
    }
    if (host) {
      const HostSample h = host->read(t);
      std::optional<double> mean, busiest, proc_pct, pkg_w;
      if (!h.core_busy_frac.empty()) {
        double sum = 0, mx = 0;
        for (double f : h.core_busy_frac) sum += f, mx = std::max(mx, f);
        mean = 100.0 * sum / static_cast<double>(h.core_busy_frac.size());
        busiest = 100.0 * mx;
      }
      const double dt = h.t_s - prev_host->t_s;
      if (dt > 0) {
        proc_pct = 100.0 * (h.process_cpu_s - prev_host->process_cpu_s) / dt;
        if (h.package_energy_j && prev_host->package_energy_j)
          pkg_w = (*h.package_energy_j - *prev_host->package_energy_j) / dt;
      }
      std::optional<double> rss;
      if (h.rss_bytes) rss = static_cast<double>(*h.rss_bytes);
      out << time_col << "  host" << cell(mean, 8, 1) << cell(busiest, 13, 1) << cell(proc_pct, 13, 1)
          << cell(rss, 9, 0, 1.0 / (1 << 20)) << cell(pkg_w, 8, 1);
      if (h.error) out << "  error: " << *h.error;
      out << "\n";
      prev_host = h;
    }
    out.flush();
    if (duration_s > 0 && t - t_start >= duration_s - 1e-9) break;
    next += interval_s;
    if (next < t) next = t + interval_s;  // fell behind (slow driver): skip, do not burst
  }
  return 0;
}

int run_monitor(double interval_s, double duration_s, std::ostream& out) {
  std::string reason;
  auto gpus = open_nvml_devices({}, &reason);
  if (gpus.empty() && !reason.empty()) reason += " - host columns only";
  InterruptScope interrupt;
  return run_monitor(std::move(gpus), std::make_unique<HostSource>(), reason, interval_s, duration_s, out,
                     [] { return g_interrupted != 0; });
}

}  // namespace ab::telemetry
