#include "measure/measure.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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

namespace {

std::string format_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Wall-clock bookkeeping of the loop: every timer call goes through `issue`, which refuses a call
// that the timeout no longer leaves room for, judged from the wall time of the calls so far.
class Deadline {
 public:
  explicit Deadline(double timeout_s) : start_s_(monotonic_seconds()), timeout_s_(timeout_s) {}
  double elapsed_s() const { return monotonic_seconds() - start_s_; }
  bool admits(std::int64_t count) const {
    const double elapsed = elapsed_s();
    if (elapsed >= timeout_s_) return false;
    const double predicted_s = wall_per_iteration_s_ * static_cast<double>(count);
    return elapsed + predicted_s <= timeout_s_ * (1.0 + kMaxOverrunShare);
  }
  template <typename Call>
  double issue(std::int64_t count, Call&& call) {
    const double before = monotonic_seconds();
    const double t = call();
    wall_per_iteration_s_ = (monotonic_seconds() - before) / static_cast<double>(std::max<std::int64_t>(count, 1));
    return t;
  }

 private:
  double start_s_;
  double timeout_s_;
  double wall_per_iteration_s_ = 0;
};

}  // namespace

Result run(IterationTimer& timer, const std::function<void()>& iteration, const Settings& settings,
           const std::atomic<bool>* cancel) {
  Deadline deadline(settings.timeout_s);
  const auto cancelled = [cancel] { return cancel != nullptr && cancel->load(std::memory_order_relaxed); };
  const auto batch = [&](std::int64_t count) {
    return deadline.issue(count, [&] { return timer.time_batch(iteration, count); });
  };

  // Warm-up: the first call pays for lazy initialisation; the rest estimate one iteration's time.
  // Batches double (each estimate better than the last) but stop near warmup_s rather than up to
  // twice past it, which matters for warm-ups of tens of seconds.
  double estimate_s = batch(1);
  std::int64_t warm_count = 1;
  double warm_total_s = 0;
  while (warm_total_s < settings.warmup_s && deadline.elapsed_s() < settings.timeout_s * kMaxWarmupShare &&
         deadline.admits(warm_count) && !cancelled()) {
    const double t = batch(warm_count);
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
    if (!deadline.admits(r.iterations_per_sample)) {
      r.stop_reason = "timeout before the noise target";
      break;
    }
    const double t = settings.mode == TimingMode::batch ? batch(r.iterations_per_sample)
                                                        : deadline.issue(1, [&] { return timer.time_cold(iteration); });
    r.measured_s += t;
    r.total_iterations += r.iterations_per_sample;
    r.iteration_s.push_back(t / static_cast<double>(r.iterations_per_sample));
    const double elapsed = deadline.elapsed_s();
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
  if (!r.converged && r.stop_reason.find("timeout") != std::string::npos &&
      r.iteration_s.size() < settings.min_samples) {
    r.timed_out = true;
    r.stop_reason = "timeout: " + std::to_string(r.iteration_s.size()) + " of at least " +
                    std::to_string(settings.min_samples) + " samples in the " + format_g(settings.timeout_s) +
                    " s timeout";
  }
  return r;
}

}  // namespace ab::measure
