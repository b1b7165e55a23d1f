// nccl-tests' conventions for collectives (docs/METHODOLOGY.md "Collectives"): how many elements a
// size in bytes stands for, and the factor that turns algorithm bandwidth into bus bandwidth,
// checked for the workloads; each collective's facts are its entry in backend/collective_traits.h.
#pragma once

#include <cstdint>

#include "backend/collective_traits.h"
#include "backend/collectives.h"

namespace ab::dist {

// busbw = algbw × bus_factor(op, n): all_reduce 2(n-1)/n; all_gather, reduce_scatter and
// all_to_all (n-1)/n; broadcast, reduce and send_recv 1. Throws UsageError for n < 1.
double bus_factor(backend::CollectiveOp op, int ranks);

// nccl-tests' count for a size of `bytes`: bytes / element size, rounded down to a multiple of
// `ranks` for the ops that split their larger buffer into one chunk per rank (all_gather,
// reduce_scatter, all_to_all). 0 when the size holds less than one element (per rank).
std::int64_t collective_count(backend::CollectiveOp op, std::int64_t bytes, std::int64_t element_bytes, int ranks);

// Per-rank buffer lengths in elements for nccl-tests' count; UsageError where the op splits its
// larger buffer per rank and `count` is not a multiple of `ranks`.
using backend::CollectiveBuffers;
CollectiveBuffers collective_buffers(backend::CollectiveOp op, std::int64_t count, int ranks);

}  // namespace ab::dist
