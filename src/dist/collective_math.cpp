#include "dist/collective_math.h"

#include <string>

#include "backend/collective_traits.h"
#include "core/error.h"

namespace ab::dist {
namespace {

using backend::CollectiveOp;

bool splits_per_rank(CollectiveOp op) { return backend::collective_traits(op).splits_per_rank; }

void require_ranks(int ranks) {
  if (ranks < 1) throw UsageError("a collective needs at least one rank, not " + std::to_string(ranks));
}

}  // namespace

double bus_factor(CollectiveOp op, int ranks) {
  require_ranks(ranks);
  return backend::collective_traits(op).bus_factor(ranks);
}

std::int64_t collective_count(CollectiveOp op, std::int64_t bytes, std::int64_t element_bytes, int ranks) {
  require_ranks(ranks);
  if (element_bytes < 1) throw UsageError("element size must be at least 1 byte");
  if (bytes < 0) throw UsageError("a collective's size must not be negative");
  std::int64_t count = bytes / element_bytes;
  if (splits_per_rank(op)) count -= count % ranks;
  return count;
}

CollectiveBuffers collective_buffers(CollectiveOp op, std::int64_t count, int ranks) {
  require_ranks(ranks);
  if (splits_per_rank(op) && count % ranks != 0)
    throw UsageError(collective_op_name(op) + " needs a count that is a multiple of the " + std::to_string(ranks) +
                     " ranks, not " + std::to_string(count));
  return backend::collective_traits(op).buffers(count, ranks);
}

}  // namespace ab::dist
