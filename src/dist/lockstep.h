// One measurement shared by every rank of a multi-process point: rank 0 runs the harness's
// measurement loop (warm-up, stopping rule, timeout, Ctrl-C) and every other rank follows its
// commands, so all ranks enqueue the same collectives in the same batches and none waits forever
// for a partner that stopped. docs/METHODOLOGY.md "Multi-process runs".
#pragma once

#include <atomic>
#include <functional>
#include <vector>

#include "dist/comm.h"
#include "measure/measure.h"

namespace ab::dist {

// One rank's own time per iteration over its samples.
struct RankTimes {
  double median_s = 0, mean_s = 0, min_s = 0, max_s = 0;
};

struct LockstepResult {
  // The same on every rank: each sample is the slowest rank's time for that batch (a collective
  // ends on all ranks only when the last has taken part); stop reason and convergence are rank 0's.
  measure::Result result;
  std::vector<RankTimes> ranks;  // every rank's own times, in rank order
};

// Measures `iteration` on every rank of `comm` with `local` timing this rank's batches. Every rank
// calls it with the same settings; only rank 0's `cancel` is read. An exception thrown by one
// rank's batch is rethrown on every rank as the same kind of ab::Error ("rank R: ..."), after the
// batch, so no rank is left waiting and every rank records the same status. (A rank whose device hangs inside a collective cannot be rescued from here: the
// launcher's time limit ends such a job.)
LockstepResult measure_lockstep(Comm& comm, measure::IterationTimer& local, const std::function<void()>& iteration,
                                const measure::Settings& settings, const std::atomic<bool>* cancel);

}  // namespace ab::dist
