// How a backend times work: the measurement loop calls these and never touches clocks itself,
// so CPU (steady_clock) and GPU (events) timing share one stopping rule.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace ab::measure {

class IterationTimer {
 public:
  virtual ~IterationTimer() = default;
  // Runs `iteration` `count` times back to back; returns the elapsed seconds for all of them.
  virtual double time_batch(const std::function<void()>& iteration, std::int64_t count) = 0;
  // Evicts caches (L2 on a GPU, last-level cache on a CPU), then times one iteration.
  virtual double time_cold(const std::function<void()>& iteration) = 0;
};

// Host timer on std::chrono::steady_clock; `flush_bytes` of memory are rewritten before a cold sample.
class SteadyClockTimer final : public IterationTimer {
 public:
  explicit SteadyClockTimer(std::int64_t flush_bytes = 64 << 20);
  ~SteadyClockTimer() override;
  double time_batch(const std::function<void()>& iteration, std::int64_t count) override;
  double time_cold(const std::function<void()>& iteration) override;

 private:
  std::int64_t flush_bytes_;
  std::vector<char> flush_;  // allocated on the first cold sample, rewritten before each
};

// Seconds on the monotonic clock that measurements and telemetry share.
double monotonic_seconds();

}  // namespace ab::measure
