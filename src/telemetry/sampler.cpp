// The sampler thread: every source read once per period, appended under a lock; windows are
// summarised from the stored series on the caller's thread.
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "measure/timer.h"
#include "telemetry/window.h"

namespace ab::telemetry {
namespace {

double thread_cpu_s() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Drops elements older than t_s but keeps the last one before it, so later windows stay bracketed.
template <class V, class T>
void trim(V& v, double t_s, T time_of) {
  std::size_t keep_from = 0;
  while (keep_from + 1 < v.size() && time_of(v[keep_from + 1]) < t_s) ++keep_from;
  v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(keep_from));
}

}  // namespace

Sampler::Sampler(std::vector<std::unique_ptr<GpuSource>> gpus, std::unique_ptr<HostSource> host, double period_s,
                 std::function<double()> clock)
    : Sampler(std::move(gpus), std::move(host), SamplerOptions{period_s, std::max(period_s, 0.1), 0},
              std::move(clock)) {}

Sampler::Sampler(std::vector<std::unique_ptr<GpuSource>> gpus, std::unique_ptr<HostSource> host,
                 SamplerOptions options, std::function<double()> clock)
    : gpus_(std::move(gpus)), host_(std::move(host)), period_s_(options.period_s), clock_(std::move(clock)) {
  if (!(period_s_ > 0) || !std::isfinite(period_s_)) throw UsageError("telemetry period must be positive");
  if (!(options.slow_period_s >= 0) || !(options.counter_period_s >= 0))
    throw UsageError("telemetry slow and counter periods must not be negative");
  if (!clock_) clock_ = measure::monotonic_seconds;
  const double counter_s =
      options.counter_period_s > 0 ? options.counter_period_s : 1.0 * static_cast<double>(std::max<std::size_t>(1, gpus_.size()));
  slow_every_ = std::max(1L, std::lround(options.slow_period_s / period_s_));
  counter_every_ = std::max(1L, std::lround(counter_s / period_s_));
  gpu_series_.resize(gpus_.size());
}

Sampler::~Sampler() {
  try {
    stop();
  } catch (...) {  // a destructor must not throw; stop() only throws if joining is impossible
  }
}

bool Sampler::running() const { return running_.load(); }

void Sampler::start() {
  std::lock_guard lifecycle(lifecycle_m_);
  if (running_) return;
  const double c0 = thread_cpu_s();
  const double t = tick(true);
  account_cpu(t, thread_cpu_s() - c0);
  tick_index_ = 0;
  {
    std::lock_guard lk(ctl_m_);
    stop_requested_ = false;
    sample_requested_ = false;
  }
  // The thread starts with asynchronous signals blocked, so Ctrl-C reaches the main thread (whose
  // handler sets the cancel flag) and never interrupts a driver call here. Faults stay deliverable.
  sigset_t all, old;
  sigfillset(&all);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS}) sigdelset(&all, s);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  running_ = true;
  try {
    thread_ = std::thread(&Sampler::loop, this);
  } catch (...) {
    running_ = false;
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void Sampler::stop() {
  std::lock_guard lifecycle(lifecycle_m_);
  if (!running_) return;
  {
    std::lock_guard lk(ctl_m_);
    stop_requested_ = true;
  }
  ctl_cv_.notify_all();
  thread_.join();
  // One more reading after the thread is gone: a window that ended just before stop() is bracketed.
  const double c0 = thread_cpu_s();
  const double t = tick(true);
  account_cpu(t, thread_cpu_s() - c0);
  {
    std::lock_guard lk(data_m_);  // under the lock, or a summarize() waiting on data_cv_ could miss it
    running_ = false;
  }
  data_cv_.notify_all();
}

void Sampler::loop() {
  using clock = std::chrono::steady_clock;
  const auto period = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(period_s_));
  auto next = clock::now() + period;  // start() has just read every source
  double cpu_last = thread_cpu_s();
  try {
    for (;;) {
      bool requested = false;
      {
        std::unique_lock lk(ctl_m_);
        ctl_cv_.wait_until(lk, next, [&] { return stop_requested_ || sample_requested_; });
        if (stop_requested_) break;
        requested = std::exchange(sample_requested_, false);
      }
      const bool periodic = clock::now() >= next;
      if (periodic) ++tick_index_;
      const double t = tick(requested);  // a summarize() waiting for this reading gets every counter
      const double cpu_now = thread_cpu_s();
      account_cpu(t, cpu_now - cpu_last);  // waking up counts too, not only the reads
      cpu_last = cpu_now;
      if (periodic) {
        const auto now = clock::now();
        next += period;
        if (next <= now) next = now + period;  // after a stall, no burst of catch-up readings
      }
    }
  } catch (const std::exception& e) {
    std::lock_guard lk(data_m_);
    thread_error_ = std::string("sampler thread stopped: ") + e.what();
  } catch (...) {
    std::lock_guard lk(data_m_);
    thread_error_ = "sampler thread stopped: unknown exception";
  }
  account_cpu(clock_(), thread_cpu_s() - cpu_last);
  data_cv_.notify_all();
}

double Sampler::tick(bool full) {
  double first_t = 0;
  try {
    std::vector<GpuSample> g;
    g.reserve(gpus_.size());
    const long n = tick_index_;
    for (std::size_t i = 0; i < gpus_.size(); ++i) {
      // Devices take turns for the expensive counter reads, spread evenly over the counter period.
      const long offset = static_cast<long>(i) * counter_every_ / static_cast<long>(gpus_.size());
      const ReadLevel level = full || (n + offset) % counter_every_ == 0 ? ReadLevel::counters
                              : n % slow_every_ == 0                      ? ReadLevel::slow
                                                                           : ReadLevel::fast;
      const double t = clock_();  // per device: with many GPUs the reads take a while
      if (i == 0) first_t = t;
      try {
        g.push_back(gpus_[i]->read(t, level));
      } catch (const std::exception& e) {  // a source is not supposed to throw; record it anyway
        GpuSample s;
        s.t_s = t;
        s.error = e.what();
        g.push_back(std::move(s));
      }
    }
    std::optional<HostSample> h;
    if (host_ && (full || n % slow_every_ == 0)) {
      const double t = clock_();
      if (gpus_.empty()) first_t = t;
      h = host_->read(t);
    }
    if (g.empty() && !h) first_t = clock_();
    bool power = false;
    for (const auto& s : g) power = power || s.power_w || s.energy_j;
    {
      std::lock_guard lk(data_m_);
      for (std::size_t i = 0; i < g.size(); ++i) gpu_series_[i].push_back(std::move(g[i]));
      if (h) host_series_.push_back(std::move(*h));
      if (full) last_full_t_ = first_t;
    }
    if (power) has_power_ = true;
  } catch (const std::exception& e) {  // out of memory: keep the thread alive, say so in the summary
    std::lock_guard lk(data_m_);
    thread_error_ = std::string("sampler reading failed: ") + e.what();
  }
  data_cv_.notify_all();
  return first_t;
}

void Sampler::account_cpu(double t_s, double cpu_s) {
  std::lock_guard lk(data_m_);
  overhead_cpu_s_ += std::max(cpu_s, 0.0);
  if (!overhead_series_.empty() && t_s < overhead_series_.back().first) t_s = overhead_series_.back().first;
  overhead_series_.emplace_back(t_s, overhead_cpu_s_);
}

void Sampler::wait_for_reading_at_or_after(double t_s) const {
  if (!running_) return;
  {
    std::lock_guard lk(data_m_);
    if (last_full_t_ >= t_s) return;
  }
  {
    std::lock_guard lk(ctl_m_);
    sample_requested_ = true;
  }
  ctl_cv_.notify_all();
  std::unique_lock lk(data_m_);
  // Bounded: with a clock that lags t_s (a test's fake clock) the wait gives up.
  data_cv_.wait_for(lk, std::chrono::duration<double>(0.25 + 2 * period_s_),
                    [&] { return last_full_t_ >= t_s || !running_ || !thread_error_.empty(); });
}

nlohmann::json Sampler::summarize(double t0_s, double t1_s, double samples_processed) const {
  if (!(t1_s > t0_s)) throw Error("telemetry window must end after it starts");
  wait_for_reading_at_or_after(t1_s);
  const double window_s = t1_s - t0_s;
  nlohmann::json out = {{"window_s", window_s}, {"period_s", period_s_}};
  std::lock_guard lk(data_m_);

  nlohmann::json gpus = nlohmann::json::array();
  bool all_energy = !gpus_.empty(), all_power = !gpus_.empty();
  double energy_j = 0, mean_power_w = 0;
  std::string method;
  for (std::size_t i = 0; i < gpus_.size(); ++i) {
    nlohmann::json g = summarize_gpu_window(gpu_series_[i], t0_s, t1_s);
    g["name"] = gpus_[i]->name();
    if (const std::string id = gpus_[i]->pci_bus_id(); !id.empty()) g["pci_bus_id"] = id;
    if (g.contains("energy_j")) {
      energy_j += g["energy_j"].get<double>();
      const std::string m = g["energy_method"].get<std::string>();
      method = method.empty() || method == m ? m : "mixed";
    } else {
      all_energy = false;
    }
    if (g.contains("mean_power_w")) mean_power_w += g["mean_power_w"].get<double>();
    else all_power = false;
    gpus.push_back(std::move(g));
  }
  if (!gpus_.empty()) out["gpus"] = std::move(gpus);
  // Totals only when every device contributes: a partial sum would pass for the whole.
  if (all_energy) {
    out["energy_j"] = energy_j;
    out["energy_method"] = method;
    if (samples_processed > 0 && energy_j > 0) out["samples_per_j"] = samples_processed / energy_j;
  }
  if (all_power) {
    out["mean_power_w"] = mean_power_w;
    if (samples_processed > 0 && mean_power_w > 0)
      out["samples_per_s_per_w"] = samples_processed / window_s / mean_power_w;
  }
  if (host_) {
    nlohmann::json h = summarize_host_window(host_series_, t0_s, t1_s);
    if (!host_->has_package_energy()) h["package_energy_note"] = host_->package_energy_note();
    out["host"] = std::move(h);
  }
  Series overhead;
  for (const auto& [t, cpu] : overhead_series_) overhead.push_back({t, cpu});
  if (const auto cd = counter_delta(overhead, t0_s, t1_s)) {
    out["sampler_cpu_s"] = cd->delta;
    out["sampler_cpu_pct_of_core"] = 100.0 * cd->delta / cd->covered_s;
  }
  if (!thread_error_.empty()) out["sampler_error"] = thread_error_;
  return out;
}

nlohmann::json Sampler::trace() const {
  std::lock_guard lk(data_m_);
  nlohmann::json out = {{"period_s", period_s_},
                        {"slow_period_s", period_s_ * static_cast<double>(slow_every_)},
                        {"counter_period_s", period_s_ * static_cast<double>(counter_every_)},
                        {"overhead_cpu_s", overhead_cpu_s_}};
  nlohmann::json gpus = nlohmann::json::array();
  for (std::size_t i = 0; i < gpus_.size(); ++i) {
    nlohmann::json g = {{"name", gpus_[i]->name()}};
    if (const std::string id = gpus_[i]->pci_bus_id(); !id.empty()) g["pci_bus_id"] = id;
    nlohmann::json samples = nlohmann::json::array();
    for (const auto& s : gpu_series_[i]) samples.push_back(to_json(s));
    g["samples"] = std::move(samples);
    gpus.push_back(std::move(g));
  }
  out["gpus"] = std::move(gpus);
  if (host_) {
    nlohmann::json samples = nlohmann::json::array();
    for (const auto& s : host_series_) samples.push_back(to_json(s));
    out["host"] = {{"samples", std::move(samples)}};
    if (!host_->has_package_energy()) out["host"]["package_energy_note"] = host_->package_energy_note();
  }
  if (!thread_error_.empty()) out["sampler_error"] = thread_error_;
  return out;
}

void Sampler::discard_before(double t_s) {
  std::lock_guard lk(data_m_);
  for (auto& series : gpu_series_) trim(series, t_s, [](const GpuSample& s) { return s.t_s; });
  trim(host_series_, t_s, [](const HostSample& s) { return s.t_s; });
  trim(overhead_series_, t_s, [](const std::pair<double, double>& p) { return p.first; });
}

bool Sampler::has_power() const { return has_power_.load(); }

double Sampler::overhead_cpu_s() const {
  std::lock_guard lk(data_m_);
  return overhead_cpu_s_;
}

}  // namespace ab::telemetry
