// Checked size arithmetic for the sizes a workload is given: a product or sum that does not fit
// in int64, a negative operand, or a buffer larger than the device holds is refused as a
// UsageError naming the quantity (the point is recorded `invalid` with the reason), before any
// allocation or kernel sees a wrapped-around value.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "core/error.h"

namespace ab {

// a × b; throws UsageError naming `what` when an operand is negative or the product overflows.
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& what) {
  if (a < 0 || b < 0) throw UsageError(what + ": negative size (" + std::to_string(a) + " x " + std::to_string(b) + ")");
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out))
    throw UsageError(what + " overflows 64 bits (" + std::to_string(a) + " x " + std::to_string(b) + ")");
  return out;
}

// a + b; throws UsageError naming `what` when an operand is negative or the sum overflows.
inline std::int64_t checked_add(std::int64_t a, std::int64_t b, const std::string& what) {
  if (a < 0 || b < 0) throw UsageError(what + ": negative size (" + std::to_string(a) + " + " + std::to_string(b) + ")");
  std::int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out))
    throw UsageError(what + " overflows 64 bits (" + std::to_string(a) + " + " + std::to_string(b) + ")");
  return out;
}

// Refuses `bytes` of buffers (the whole point's footprint) above `capacity_bytes` of the device
// named `device`; a capacity <= 0 means unknown and bounds nothing.
inline void check_fits_memory(std::int64_t bytes, std::int64_t capacity_bytes, const std::string& what,
                              const std::string& device) {
  if (capacity_bytes > 0 && bytes > capacity_bytes)
    throw UsageError(what + " need " + std::to_string(bytes) + " bytes, more than the " +
                     std::to_string(capacity_bytes) + " bytes of memory of " + device);
}

}  // namespace ab
