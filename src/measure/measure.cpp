#include "measure/measure.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ab::measure {

std::string_view to_string(TimingMode m) { return m == TimingMode::batch ? "batch" : "cold"; }

TimingMode parse_timing_mode(std::string_view s) {
  if (s == "batch") return TimingMode::batch;
  if (s == "cold") return TimingMode::cold;
  throw UsageError("unknown timing mode '" + std::string(s) + "'; valid: batch, cold");
}

StopDecision should_stop(const std::vector<double>& iteration_s, double measured_s, double elapsed_wall_s,
                         const Settings& settings) {
  if (iteration_s.size() >= settings.max_samples) return {true, false, "sample limit reached"};
  if (elapsed_wall_s >= settings.timeout_s) return {true, false, "timeout before the noise target"};
  if (iteration_s.size() < settings.min_samples || measured_s < settings.min_time_s ||
      measured_s < settings.min_window_s)
    return {};
  const Summary s = summarize(iteration_s);
  if (s.rel_spread * 100.0 <= settings.max_noise_pct) return {true, true, "noise below target"};
  return {};
}

Result run(IterationTimer& timer, const std::function<void()>& iteration, const Settings& settings,
           const std::atomic<bool>* cancel) {
  const double start_wall = monotonic_seconds();
  const auto cancelled = [cancel] { return cancel != nullptr && cancel->load(std::memory_order_relaxed); };

  // Warm-up: the first call pays for lazy initialisation; the rest estimate one iteration's time.
  // Batches double (each estimate better than the last) but stop near warmup_s rather than up to
  // twice past it, which matters for warm-ups of tens of seconds.
  double estimate_s = timer.time_batch(iteration, 1);
  std::int64_t warm_count = 1;
  double warm_total_s = 0;
  while (warm_total_s < settings.warmup_s && monotonic_seconds() - start_wall < settings.timeout_s * kMaxWarmupShare &&
         !cancelled()) {
    const double t = timer.time_batch(iteration, warm_count);
    warm_total_s += t;
    estimate_s = t / static_cast<double>(warm_count);
    std::int64_t next = std::min<std::int64_t>(warm_count * 2, 1 << 20);
    if (estimate_s > 0)
      next = std::clamp<std::int64_t>(
          static_cast<std::int64_t>(std::ceil((settings.warmup_s - warm_total_s) / estimate_s)), 1, next);
    warm_count = next;
  }

  Result r;
  if (settings.mode == TimingMode::batch && estimate_s > 0)
    r.iterations_per_sample =
        std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(settings.target_sample_s / estimate_s)),
                                 std::clamp<std::int64_t>(settings.min_iterations_per_sample, 1, 1 << 20), 1 << 20);
  r.window_start_s = monotonic_seconds();
  std::size_t next_check = settings.min_samples;
  for (;;) {
    if (cancelled()) {
      r.stop_reason = "cancelled";
      break;
    }
    const double t = settings.mode == TimingMode::batch ? timer.time_batch(iteration, r.iterations_per_sample)
                                                        : timer.time_cold(iteration);
    r.measured_s += t;
    r.total_iterations += r.iterations_per_sample;
    r.iteration_s.push_back(t / static_cast<double>(r.iterations_per_sample));
    const double elapsed = monotonic_seconds() - start_wall;
    // Summaries cost O(n log n): check every sample while few, then every ~5% more samples.
    const bool hard_limit = elapsed >= settings.timeout_s || r.iteration_s.size() >= settings.max_samples;
    if (r.iteration_s.size() < next_check && !hard_limit) continue;
    next_check = std::max(r.iteration_s.size() + 1, r.iteration_s.size() * 21 / 20);
    const StopDecision d = should_stop(r.iteration_s, r.measured_s, elapsed, settings);
    if (d.stop) {
      r.converged = d.converged;
      r.stop_reason = d.reason;
      break;
    }
  }
  r.window_end_s = monotonic_seconds();
  r.summary = summarize(r.iteration_s);
  return r;
}

}  // namespace ab::measure
