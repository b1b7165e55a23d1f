// Counter-based random numbers: the same (seed, index) gives the same value on any thread,
// so inputs are reproducible and generation parallelises without shared state.
#pragma once

#include <cstdint>

namespace ab {

// SplitMix64 finaliser of (seed, index): a well-mixed 64-bit value.
constexpr std::uint64_t mix64(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [lo, hi) from 53 random bits.
constexpr double uniform(std::uint64_t seed, std::uint64_t index, double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(mix64(seed, index) >> 11) * 0x1.0p-53;
}

// A fresh seed per call from the clock and a counter: checks use new random data every run.
std::uint64_t fresh_seed();

}  // namespace ab
