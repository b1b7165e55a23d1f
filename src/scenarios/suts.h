// Systems under test that ship with the load generator: the null SUT (completes every sample at
// once: what is measured is the load generator itself), a faulty one for tests, and a dynamic
// batcher that runs any per-batch executor (a model, a GEMM layer) on its own worker thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "scenarios/scenarios.h"

namespace ab::scenarios {

class NullSut final : public SystemUnderTest {
 public:
  std::string name() const override { return "null"; }
  void issue_query(std::span<const QuerySample> samples, Completions& done) override { done.complete(samples); }
};

// Completes at once like NullSut but silently drops every `drop_every`-th sample (1 drops all).
class FaultySut final : public SystemUnderTest {
 public:
  explicit FaultySut(std::uint64_t drop_every) : drop_every_(drop_every == 0 ? 1 : drop_every) {}
  std::string name() const override { return "faulty (drops every " + std::to_string(drop_every_) + ")"; }
  void issue_query(std::span<const QuerySample> samples, Completions& done) override;
  std::uint64_t dropped() const { return dropped_; }

 private:
  std::uint64_t drop_every_, seen_ = 0, dropped_ = 0;
  std::vector<QuerySample> kept_;
};

struct BatcherSettings {
  std::size_t max_batch = 8;
  double max_wait_s = 1e-3;  // the oldest waiting sample is dispatched at most this late; 0 = at once
};

// Refuses batcher settings no run of `s` can meet by construction (UsageError with the reason).
void check_batcher(const Settings& s, const BatcherSettings& b);

// What a batching SUT runs per batch, on its worker thread.
class BatchExecutor {
 public:
  virtual ~BatchExecutor() = default;
  virtual std::string describe() const = 0;
  // Once, on the worker thread, before the first batch (device plans made here use that thread).
  virtual void prepare() {}
  // Processes the batch (1 <= size <= max_batch) and returns when its results are ready.
  virtual void run(std::span<const QuerySample> batch) = 0;
};

// Queues samples from issue_query and forms batches of up to max_batch: a batch leaves when it is
// full, when its oldest sample has waited max_wait, or on flush. One worker thread executes them.
class BatchingSut final : public SystemUnderTest {
 public:
  // Starts the worker and waits for the executor's prepare(); rethrows what prepare() threw.
  BatchingSut(std::string name, BatcherSettings settings, std::unique_ptr<BatchExecutor> executor);
  ~BatchingSut() override;
  BatchingSut(const BatchingSut&) = delete;
  BatchingSut& operator=(const BatchingSut&) = delete;

  std::string name() const override { return name_; }
  void issue_query(std::span<const QuerySample> samples, Completions& done) override;
  void flush_queries() override;
  std::string failure() const override;

  struct Stats {
    std::uint64_t batches = 0, samples = 0;
    std::vector<std::uint64_t> batch_sizes;  // [size] = batches of that size
  };
  Stats stats() const;
  const BatcherSettings& settings() const { return settings_; }
  BatchExecutor& executor() { return *executor_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    QuerySample sample;
    Completions* done;
    Clock::time_point arrival;
  };
  void work();

  std::string name_;
  BatcherSettings settings_;
  std::unique_ptr<BatchExecutor> executor_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;
  bool flush_ = false, stop_ = false, ready_ = false;
  std::string failure_;
  std::exception_ptr prepare_error_;
  Stats stats_;
  std::thread worker_;
};

}  // namespace ab::scenarios
