#include "scenarios/suts.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace ab::scenarios {
namespace {

std::string ms(double s) {
  std::ostringstream o;
  o << s * 1e3 << " ms";
  return o.str();
}

}  // namespace

void FaultySut::issue_query(std::span<const QuerySample> samples, Completions& done) {
  kept_.clear();
  for (const QuerySample& s : samples) {
    if (++seen_ % drop_every_ == 0) ++dropped_;
    else kept_.push_back(s);
  }
  if (!kept_.empty()) done.complete(kept_);
}

void check_batcher(const Settings& s, const BatcherSettings& b) {
  const std::string where = std::string(to_string(s.scenario)) + ": ";
  if (b.max_batch < 1) throw UsageError(where + "max_batch must be at least 1");
  if (!(b.max_wait_s >= 0) || !std::isfinite(b.max_wait_s)) throw UsageError(where + "max_wait must be a finite time >= 0");
  if (s.latency_bound_s <= 0 || b.max_wait_s < s.latency_bound_s) return;
  if (s.scenario == Scenario::server)
    throw UsageError(where + "max_wait (" + ms(b.max_wait_s) + ") is not below the latency bound (" + ms(s.latency_bound_s) +
                     "): at a load too light to fill a batch of " + std::to_string(b.max_batch) +
                     " every sample waits max_wait, so the bound fails by construction");
  if ((s.scenario == Scenario::single_stream || s.scenario == Scenario::multi_stream) &&
      s.samples_per_query % b.max_batch != 0)
    throw UsageError(where + "a query of " + std::to_string(s.samples_per_query) + " samples leaves a batch of " +
                     std::to_string(s.samples_per_query % b.max_batch) + " below max_batch " + std::to_string(b.max_batch) +
                     " that waits max_wait (" + ms(b.max_wait_s) + ") every query, not below the latency bound (" +
                     ms(s.latency_bound_s) + "): the bound fails by construction");
}

BatchingSut::BatchingSut(std::string name, BatcherSettings settings, std::unique_ptr<BatchExecutor> executor)
    : name_(std::move(name)), settings_(settings), executor_(std::move(executor)) {
  if (settings_.max_batch < 1) throw UsageError("max_batch must be at least 1");
  stats_.batch_sizes.assign(settings_.max_batch + 1, 0);
  worker_ = std::thread([this] { work(); });
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return ready_; });
  if (prepare_error_) {
    stop_ = true;
    lock.unlock();
    cv_.notify_all();
    worker_.join();
    std::rethrow_exception(prepare_error_);
  }
}

BatchingSut::~BatchingSut() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void BatchingSut::issue_query(std::span<const QuerySample> samples, Completions& done) {
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const QuerySample& s : samples) queue_.push_back({s, &done, now});
  }
  cv_.notify_one();
}

void BatchingSut::flush_queries() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    flush_ = true;
  }
  cv_.notify_one();
}

std::string BatchingSut::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

BatchingSut::Stats BatchingSut::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void BatchingSut::work() {
  try {
    executor_->prepare();
  } catch (...) {
    prepare_error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_ = true;
  }
  cv_.notify_all();
  if (prepare_error_) return;

  const auto max_wait = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(settings_.max_wait_s));
  std::vector<QuerySample> batch;
  std::vector<Completions*> sinks;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (queue_.empty()) {
      flush_ = false;
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      continue;
    }
    const auto due = queue_.front().arrival + max_wait;
    if (queue_.size() < settings_.max_batch && !flush_ && Clock::now() < due) {
      cv_.wait_until(lock, due);  // a new sample or the oldest one's deadline, whichever first
      continue;
    }
    const std::size_t n = std::min(settings_.max_batch, queue_.size());
    batch.clear();
    sinks.clear();
    for (std::size_t i = 0; i < n; ++i) {
      batch.push_back(queue_.front().sample);
      sinks.push_back(queue_.front().done);
      queue_.pop_front();
    }
    ++stats_.batches;
    stats_.samples += n;
    ++stats_.batch_sizes[n];
    const bool failed = !failure_.empty();
    lock.unlock();
    if (!failed) {
      std::string error;
      try {
        executor_->run(batch);
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "unknown exception";
      }
      if (error.empty()) {
        // One report per run of samples bound for the same sink (in practice: the whole batch).
        std::size_t from = 0;
        for (std::size_t i = 1; i <= n; ++i) {
          if (i == n || sinks[i] != sinks[from]) {
            sinks[from]->complete(std::span<const QuerySample>(batch).subspan(from, i - from));
            from = i;
          }
        }
      }
      lock.lock();
      if (!error.empty() && failure_.empty()) failure_ = executor_->describe() + ": " + error;
    } else {
      lock.lock();  // after a failure the SUT drops what it is given: the load generator counts it lost
    }
  }
}

}  // namespace ab::scenarios
