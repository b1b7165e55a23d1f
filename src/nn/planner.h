// Activation memory planning: buffers with known lifetimes (in steps of the fixed forward/backward
// sequence) are placed in one arena so that buffers never alive at the same step may share bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ab::nn {

// A buffer is written at `first_step` and last read at `last_step` (inclusive).
struct BufferLifetime {
  std::int64_t bytes = 0;
  int first_step = 0;
  int last_step = 0;
  std::string label;  // "layer1.0.conv1:out", "grad fc:out", ... for reports and test messages
};

struct MemoryPlan {
  std::vector<std::int64_t> offsets_bytes;  // one per buffer, aligned to kAllocAlignment
  std::int64_t peak_bytes = 0;              // arena size: max over buffers of offset + size
  std::int64_t total_bytes = 0;             // every buffer in its own memory (no reuse)
  std::int64_t live_bound_bytes = 0;        // most bytes alive at one step: no plan can go lower
};

// Greedy by size: the largest buffers are placed first, each at the lowest offset where it meets
// no already-placed buffer whose lifetime intersects its own. Deterministic for a given input.
MemoryPlan plan_memory(const std::vector<BufferLifetime>& buffers);

// Whether buffers i and j are alive at a common step and share an address range (a bad plan).
bool plan_conflict(const std::vector<BufferLifetime>& buffers, const MemoryPlan& plan, std::size_t i,
                   std::size_t j);

}  // namespace ab::nn
