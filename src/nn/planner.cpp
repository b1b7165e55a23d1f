#include "nn/planner.h"

#include <algorithm>
#include <numeric>

#include "core/checked.h"
#include "core/tensor.h"

namespace ab::nn {
namespace {

bool lifetimes_intersect(const BufferLifetime& a, const BufferLifetime& b) {
  return a.first_step <= b.last_step && b.first_step <= a.last_step;
}

// The buffer's bytes rounded up to the arena's alignment; a size that cannot be rounded in 64 bits,
// or a lifetime that ends before it starts, is refused rather than planned with wrapped values.
std::int64_t aligned_size(const BufferLifetime& b) {
  if (b.first_step < 0 || b.last_step < b.first_step)
    throw Error("buffer " + b.label + ": lifetime [" + std::to_string(b.first_step) + ", " +
                std::to_string(b.last_step) + "] is not a range of steps");
  const std::int64_t rounded = checked_add(b.bytes, kAllocAlignment - 1, "buffer " + b.label + " bytes");
  return checked_mul(rounded / kAllocAlignment, kAllocAlignment, "buffer " + b.label + " bytes");
}

}  // namespace

MemoryPlan plan_memory(const std::vector<BufferLifetime>& buffers) {
  MemoryPlan plan;
  const std::size_t n = buffers.size();
  plan.offsets_bytes.assign(n, 0);
  std::vector<std::int64_t> sizes(n);
  for (std::size_t i = 0; i < n; ++i) {
    sizes[i] = aligned_size(buffers[i]);
    plan.total_bytes = checked_add(plan.total_bytes, sizes[i], "the activation buffers' total bytes");
  }

  // Largest first (ties: earlier start, then index) so that big buffers claim low offsets and small
  // ones fill the gaps between them.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (sizes[a] != sizes[b]) return sizes[a] > sizes[b];
    if (buffers[a].first_step != buffers[b].first_step) return buffers[a].first_step < buffers[b].first_step;
    return a < b;
  });

  std::vector<std::size_t> placed;
  std::vector<std::pair<std::int64_t, std::int64_t>> busy;  // [begin, end) of conflicting buffers
  for (std::size_t i : order) {
    if (sizes[i] == 0) continue;
    busy.clear();
    for (std::size_t j : placed)
      if (lifetimes_intersect(buffers[i], buffers[j]))
        busy.emplace_back(plan.offsets_bytes[j], plan.offsets_bytes[j] + sizes[j]);
    std::sort(busy.begin(), busy.end());
    // The first gap from offset 0 upwards that holds the buffer.
    std::int64_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (begin - offset >= sizes[i]) break;
      offset = std::max(offset, end);
    }
    plan.offsets_bytes[i] = offset;
    // offset + size <= total_bytes, which fitted: no overflow here or in the busy ranges above.
    plan.peak_bytes = std::max(plan.peak_bytes, offset + sizes[i]);
    placed.push_back(i);
  }

  // The live-bytes bound: at each step, the sum of the buffers alive then.
  int last = 0;
  for (const auto& b : buffers) last = std::max(last, b.last_step);
  std::vector<std::int64_t> live(static_cast<std::size_t>(last) + 2, 0);
  for (std::size_t i = 0; i < n; ++i) {
    live[static_cast<std::size_t>(buffers[i].first_step)] += sizes[i];
    live[static_cast<std::size_t>(buffers[i].last_step) + 1] -= sizes[i];
  }
  std::int64_t running = 0;
  for (std::int64_t delta : live) {
    running += delta;
    plan.live_bound_bytes = std::max(plan.live_bound_bytes, running);
  }
  return plan;
}

bool plan_conflict(const std::vector<BufferLifetime>& buffers, const MemoryPlan& plan, std::size_t i,
                   std::size_t j) {
  if (i == j || !lifetimes_intersect(buffers[i], buffers[j])) return false;
  if (buffers[i].bytes == 0 || buffers[j].bytes == 0) return false;
  const std::int64_t bi = plan.offsets_bytes[i], ei = bi + buffers[i].bytes;
  const std::int64_t bj = plan.offsets_bytes[j], ej = bj + buffers[j].bytes;
  return bi < ej && bj < ei;
}

}  // namespace ab::nn
