#include "scenarios/tracker.h"

#include <cstdlib>
#include <new>
#include <thread>

namespace ab::scenarios::detail {

Tracker::Tracker(Clock::time_point start, std::uint64_t capacity)
    : start_(start), capacity_(capacity), chunks_(static_cast<std::size_t>(capacity / kChunk + 1), nullptr) {}

Tracker::~Tracker() { release_slots(); }

bool Tracker::reserve(std::uint64_t n) {
  const std::uint64_t first = issued_.load(std::memory_order_relaxed);
  if (first + n > capacity_) return false;
  for (std::uint64_t c = first >> kChunkBits; c <= (first + n - 1) >> kChunkBits; ++c) {
    if (chunks_[c] != nullptr) continue;
    // calloc: the kernel hands out zero pages lazily, so a large chunk costs nothing until used.
    chunks_[c] = static_cast<std::int64_t*>(std::calloc(kChunk, sizeof(std::int64_t)));
    if (chunks_[c] == nullptr) throw std::bad_alloc();
  }
  issued_.store(first + n, std::memory_order_release);
  return true;
}

void Tracker::complete(std::span<const QuerySample> samples) {
  // Entering before looking at closed_ lets close() wait for every call that got past the check.
  inside_.fetch_add(1, std::memory_order_seq_cst);
  if (closed_.load(std::memory_order_seq_cst)) {
    inside_.fetch_sub(1, std::memory_order_release);
    return;
  }
  const std::int64_t stamp = since_start_ns(Clock::now()) + 1;  // 0 marks "not completed"
  const std::uint64_t issued = issued_.load(std::memory_order_acquire);
  std::uint64_t good = 0, duplicate = 0, unknown = 0;
  for (const QuerySample& s : samples) {
    if (s.id >= issued) {
      ++unknown;
      continue;
    }
    std::int64_t expected = 0;
    std::atomic_ref<std::int64_t> slot(chunks_[s.id >> kChunkBits][s.id & (kChunk - 1)]);
    if (slot.compare_exchange_strong(expected, stamp, std::memory_order_relaxed)) ++good;
    else ++duplicate;
  }
  if (duplicate != 0) duplicates_.fetch_add(duplicate, std::memory_order_relaxed);
  if (unknown != 0) unknown_.fetch_add(unknown, std::memory_order_relaxed);
  completed_.fetch_add(good, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    cv_.notify_all();
  }
  inside_.fetch_sub(1, std::memory_order_release);
}

bool Tracker::wait_completed(std::uint64_t target, Clock::time_point deadline, const std::atomic<bool>* cancel) {
  // A short spin catches fast SUTs without a sleep; then block (a spinning issuer would take a core
  // from the SUT on a small machine).
  for (int i = 0; i < 64; ++i) {
    if (completed_.load(std::memory_order_acquire) >= target) return true;
    cpu_relax();
  }
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    while (completed_.load(std::memory_order_seq_cst) < target) {
      if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) break;
      const auto now = Clock::now();
      if (now >= deadline) break;
      // Bounded waits: cancel is polled, and a missed wake-up costs at most 2 ms.
      cv_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(2)));
    }
  }
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
  return completed_.load(std::memory_order_acquire) >= target;
}

void Tracker::close() {
  closed_.store(true, std::memory_order_seq_cst);
  while (inside_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

std::int64_t Tracker::completion_ns(std::uint64_t id) const {
  if (id >= issued_.load(std::memory_order_acquire) || chunks_[id >> kChunkBits] == nullptr) return -1;
  const std::int64_t v = std::atomic_ref<std::int64_t>(chunks_[id >> kChunkBits][id & (kChunk - 1)]).load(
      std::memory_order_acquire);
  return v == 0 ? -1 : v - 1;
}

void Tracker::release_slots() {
  for (auto*& c : chunks_) {
    std::free(c);
    c = nullptr;
  }
}

}  // namespace ab::scenarios::detail
