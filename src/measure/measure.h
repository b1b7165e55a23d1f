// The measurement loop: warm-up, then samples until the median is known well enough, with a hard
// timeout. The loop owns time; workloads hand it one iteration and never time themselves.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "measure/stats.h"
#include "measure/timer.h"

namespace ab::measure {

enum class TimingMode { batch, cold };
std::string_view to_string(TimingMode m);
TimingMode parse_timing_mode(std::string_view s);  // throws UsageError

// The warm-up stops at this share of the point's timeout whatever it asked, so the samples get the
// rest; `run` refuses a --warmup of this share or more outright.
inline constexpr double kMaxWarmupShare = 0.5;

// A timer call (warm-up batch or sample) is not started once the timeout has passed, nor when the
// last call's wall time says it would end past the timeout by more than this share of it.
inline constexpr double kMaxOverrunShare = 0.1;

struct Settings {
  TimingMode mode = TimingMode::batch;
  double min_time_s = 0.5;         // measured time before the stopping rule may stop
  double max_noise_pct = 1.0;      // target relative spread of the median, percent
  std::size_t min_samples = 10;
  std::size_t max_samples = 20000;
  double timeout_s = 60.0;         // hard wall-clock limit for the whole point, warm-up included: no
                                   // call is issued past it (see kMaxOverrunShare)
  double warmup_s = 0.1;           // timed warm-up before the samples (a GPU reaches its steady clocks and
                                   // temperature only after tens of seconds of load); see kMaxWarmupShare
  double target_sample_s = 5e-3;   // batch mode: iterations per sample so a sample lasts this long
  std::int64_t min_iterations_per_sample = 1;  // batch mode: and at least this many (back-to-back steps)
  double min_window_s = 0.0;       // keep sampling until the measured window is this long (energy)
};

struct Result {
  std::vector<double> iteration_s;  // one value per sample: sample time / iterations per sample
  std::int64_t iterations_per_sample = 1;
  std::int64_t total_iterations = 0;  // measured iterations, warm-up excluded
  double measured_s = 0;              // sum of sample times
  double window_start_s = 0;          // monotonic_seconds() at the first and after the last sample
  double window_end_s = 0;
  bool converged = false;
  bool timed_out = false;  // the timeout ended the loop before min_samples samples
  std::string stop_reason;
  Summary summary;
};

// `cancel`, when set by another thread (Ctrl-C), ends the loop after the sample in flight.
Result run(IterationTimer& timer, const std::function<void()>& iteration, const Settings& settings,
           const std::atomic<bool>* cancel = nullptr);

// The stopping rule on its own, for tests: may the loop stop after these samples?
struct StopDecision {
  bool stop = false;
  bool converged = false;
  std::string reason;
};
StopDecision should_stop(const std::vector<double>& iteration_s, double measured_s, double elapsed_wall_s,
                         const Settings& settings);

}  // namespace ab::measure
