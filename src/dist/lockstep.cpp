// Rank 0 broadcasts a command before each batch (run `count` iterations, or stop); every rank
// times the batch on its own device and the ranks exchange their times (and any error) after it.
#include "dist/lockstep.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "measure/timer.h"

namespace ab::dist {
namespace {

enum Command : std::int64_t { kBatch = 0, kCold = 1, kStop = 2 };

// The batches every rank ran, as agreed after each: the slowest rank's seconds, and this rank's.
struct Batches {
  std::vector<double> slowest_s, own_s, start_s, end_s;
  std::vector<std::int64_t> counts;
};

// Runs one batch locally and agrees with the other ranks on it; throws on every rank if any failed.
double run_batch(Comm& comm, Batches& b, std::int64_t count, const std::function<double()>& timed) {
  double t = 0;
  Outcome mine;
  const double start = measure::monotonic_seconds();
  try {
    t = timed();
  } catch (const std::exception& e) {
    mine = {static_cast<int>(error_kind(e)), e.what()};  // rethrown below as the same kind
  }
  const double end = measure::monotonic_seconds();
  const auto all = comm.allgather(Packer().put(static_cast<std::int64_t>(mine.code)).put(t).put(mine.message).bytes());
  double slowest = 0;
  for (std::size_t r = 0; r < all.size(); ++r) {
    Unpacker in(all[r]);
    const std::int64_t code = in.get_int();
    const double rt = in.get_double();
    if (code != 0)
      throw_error(static_cast<ErrorKind>(code), (comm.size() > 1 ? "rank " + std::to_string(r) + ": " : "") + in.get_string());
    slowest = std::max(slowest, rt);
  }
  b.slowest_s.push_back(slowest);
  b.own_s.push_back(t);
  b.start_s.push_back(start);
  b.end_s.push_back(end);
  b.counts.push_back(count);
  return slowest;
}

class LeaderTimer final : public measure::IterationTimer {
 public:
  LeaderTimer(Comm& comm, measure::IterationTimer& local, Batches& b) : comm_(comm), local_(local), b_(b) {}
  double time_batch(const std::function<void()>& iteration, std::int64_t count) override {
    send(Packer().put(static_cast<std::int64_t>(kBatch)).put(count).bytes());
    return run_batch(comm_, b_, count, [&] { return local_.time_batch(iteration, count); });
  }
  double time_cold(const std::function<void()>& iteration) override {
    send(Packer().put(static_cast<std::int64_t>(kCold)).put(std::int64_t{1}).bytes());
    return run_batch(comm_, b_, 1, [&] { return local_.time_cold(iteration); });
  }
  void send(Bytes command) { comm_.broadcast(command, 0); }

 private:
  Comm& comm_;
  measure::IterationTimer& local_;
  Batches& b_;
};

std::size_t first_measured(const Batches& b, std::int64_t measured) {
  const auto n = static_cast<std::int64_t>(b.counts.size());
  return static_cast<std::size_t>(n - std::clamp<std::int64_t>(measured, 0, n));
}

RankTimes times_of(const std::vector<double>& per_iteration_s) {
  if (per_iteration_s.empty()) return {};
  const measure::Summary s = measure::summarize(per_iteration_s);
  return {s.median, s.mean, s.min, s.max};
}

}  // namespace

LockstepResult measure_lockstep(Comm& comm, measure::IterationTimer& local, const std::function<void()>& iteration,
                                const measure::Settings& settings, const std::atomic<bool>* cancel) {
  Batches b;
  LockstepResult out;
  std::int64_t measured = 0;
  if (comm.rank() == 0) {
    LeaderTimer leader(comm, local, b);
    out.result = measure::run(leader, iteration, settings, cancel);
    measured = static_cast<std::int64_t>(out.result.iteration_s.size());
    leader.send(Packer()
                    .put(static_cast<std::int64_t>(kStop))
                    .put(measured)
                    .put(static_cast<std::int64_t>(out.result.converged))
                    .put(out.result.stop_reason)
                    .bytes());
  } else {
    for (;;) {
      Bytes command;
      comm.broadcast(command, 0);
      Unpacker in(command);
      const std::int64_t kind = in.get_int();
      if (kind == kStop) {
        measured = in.get_int();
        out.result.converged = in.get_int() != 0;
        out.result.stop_reason = in.get_string();
        break;
      }
      const std::int64_t count = in.get_int();
      if (kind == kCold) run_batch(comm, b, 1, [&] { return local.time_cold(iteration); });
      else run_batch(comm, b, count, [&] { return local.time_batch(iteration, count); });
    }
    // The measured samples are the last `measured` batches; the ones before them were warm-up.
    measure::Result& r = out.result;
    const std::size_t first = first_measured(b, measured);
    for (std::size_t i = first; i < b.counts.size(); ++i) {
      r.iteration_s.push_back(b.slowest_s[i] / static_cast<double>(b.counts[i]));
      r.measured_s += b.slowest_s[i];
      r.total_iterations += b.counts[i];
      r.iterations_per_sample = b.counts[i];
    }
    if (first < b.counts.size()) {
      r.window_start_s = b.start_s[first];
      r.window_end_s = b.end_s.back();
    }
    r.summary = measure::summarize(r.iteration_s);
  }
  // Every rank's own time per iteration over the measured samples.
  std::vector<double> own;
  for (std::size_t i = first_measured(b, measured); i < b.counts.size(); ++i) own.push_back(b.own_s[i] / static_cast<double>(b.counts[i]));
  const RankTimes mine = times_of(own);
  for (const auto& bytes : comm.allgather(Packer().put(mine.median_s).put(mine.mean_s).put(mine.min_s).put(mine.max_s).bytes())) {
    Unpacker in(bytes);
    RankTimes t;
    t.median_s = in.get_double();
    t.mean_s = in.get_double();
    t.min_s = in.get_double();
    t.max_s = in.get_double();
    out.ranks.push_back(t);
  }
  return out;
}

}  // namespace ab::dist
