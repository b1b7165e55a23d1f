// Dropout's mask as a pure function of (seed, step counter, element index), shared by the
// reference and the CUDA kernels so that both drop the same elements: nothing is stored between
// forward and backward, and a new counter (one per training forward, kept on the device) draws a
// new mask on every replay of a captured step.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define AB_HOST_DEVICE __host__ __device__
#else
#define AB_HOST_DEVICE
#endif

namespace ab::nn {

// splitmix64's finaliser (Steele, Lea and Flood 2014).
AB_HOST_DEVICE inline std::uint64_t dropout_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The stream of one call: its op's seed and the step counter's value.
AB_HOST_DEVICE inline std::uint64_t dropout_stream(std::uint64_t seed, std::int32_t counter) {
  return dropout_mix(
      seed ^ dropout_mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(counter)) + 0x632BE59BD9B4E019ull));
}

// 2^24 * probability, rounded down: an element is dropped where the top 24 bits of its hash fall
// below it (so probability 0 drops nothing).
inline std::uint32_t dropout_threshold(double probability) {
  return static_cast<std::uint32_t>(probability * 16777216.0);
}

AB_HOST_DEVICE inline bool dropout_keeps(std::uint64_t stream, std::uint64_t index, std::uint32_t threshold) {
  return (dropout_mix(stream + index * 0x9E3779B97F4A7C15ull) >> 40) >= threshold;
}

}  // namespace ab::nn
