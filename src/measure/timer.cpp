#include "measure/timer.h"

#include <chrono>

namespace ab::measure {

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

SteadyClockTimer::SteadyClockTimer(std::int64_t flush_bytes) : flush_bytes_(flush_bytes) {}

double SteadyClockTimer::time_batch(const std::function<void()>& iteration, std::int64_t count) {
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < count; ++i) iteration();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

SteadyClockTimer::~SteadyClockTimer() = default;

double SteadyClockTimer::time_cold(const std::function<void()>& iteration) {
  // Rewriting a buffer larger than the last-level cache evicts the working set; the buffer is
  // kept so that a cold sample costs one pass over it, not an allocation and a page-in.
  if (flush_.empty()) flush_.resize(static_cast<std::size_t>(flush_bytes_));
  const char stamp = static_cast<char>(flush_[0] + 1);
  for (std::size_t i = 0; i < flush_.size(); i += 64) flush_[i] = stamp;
  volatile char sink = flush_[flush_.size() / 2];
  (void)sink;
  return time_batch(iteration, 1);
}

}  // namespace ab::measure
