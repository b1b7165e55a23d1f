#include "measure/timer.h"

#include <chrono>
#include <vector>

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

double SteadyClockTimer::time_cold(const std::function<void()>& iteration) {
  // Writing a buffer larger than the last-level cache evicts the working set.
  std::vector<char> flush(static_cast<std::size_t>(flush_bytes_));
  for (std::size_t i = 0; i < flush.size(); i += 64) flush[i] = static_cast<char>(i);
  volatile char sink = flush[flush.size() / 2];
  (void)sink;
  return time_batch(iteration, 1);
}

}  // namespace ab::measure
