// Steps every rank of a multi-process point takes together (collectives, data-parallel training).
#pragma once

#include <functional>

#include "dist/comm.h"

namespace ab::harness {

// Runs a step on this rank, then every rank shares the first failure (dist::agree) and rethrows it
// as the same kind (SkipPoint, CheckFailed, Diverged, OutOfMemory, Unsupported, UsageError, Error),
// so all ranks record the same status and none waits for a rank that gave up.
void on_all_ranks(dist::Comm& comm, const std::function<void()>& step);

}  // namespace ab::harness
