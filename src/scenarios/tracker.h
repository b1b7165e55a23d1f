// Completion bookkeeping of one run (internal to scenarios/). A SUT reports from any thread through
// a lock-free path: one atomic slot per sample id and a counter. The issuing thread touches the
// mutex only while it waits, and completions take it only when someone is waiting.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "scenarios/scenarios.h"

namespace ab::scenarios::detail {

using Clock = std::chrono::steady_clock;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Tracker final : public Completions {
 public:
  Tracker(Clock::time_point start, std::uint64_t capacity);
  ~Tracker();
  Tracker(const Tracker&) = delete;
  Tracker& operator=(const Tracker&) = delete;

  // Issuing thread: publishes ids [issued(), issued() + n); false when the run's capacity is reached.
  bool reserve(std::uint64_t n);
  std::uint64_t issued() const { return issued_.load(std::memory_order_acquire); }
  std::uint64_t completed() const { return completed_.load(std::memory_order_acquire); }

  void complete(std::span<const QuerySample> samples) override;

  // Waits until completed() >= target; false at the deadline or when *cancel is set.
  bool wait_completed(std::uint64_t target, Clock::time_point deadline, const std::atomic<bool>* cancel);

  // Ends the run: later completions are ignored. Returns once no complete() call is still inside.
  void close();
  // After close(): ns from the start to the sample's completion, or -1 if it never completed.
  std::int64_t completion_ns(std::uint64_t id) const;
  // After close(): frees the slots (the tracker itself may have to outlive a SUT that still owes samples).
  void release_slots();

  std::uint64_t duplicates() const { return duplicates_.load(); }
  std::uint64_t unknown() const { return unknown_.load(); }
  std::int64_t since_start_ns(Clock::time_point t) const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - start_).count();
  }

 private:
  static constexpr unsigned kChunkBits = 20;  // 8 MiB of slots per chunk, zero pages until touched
  static constexpr std::uint64_t kChunk = std::uint64_t{1} << kChunkBits;

  Clock::time_point start_;
  std::uint64_t capacity_;
  std::vector<std::int64_t*> chunks_;  // sized once; chunk i is written before its ids are published
  std::atomic<std::uint64_t> issued_{0}, completed_{0}, duplicates_{0}, unknown_{0};
  std::atomic<int> waiters_{0}, inside_{0};
  std::atomic<bool> closed_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace ab::scenarios::detail
