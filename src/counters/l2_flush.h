// Internal to src/counters (CUDA builds): empties a device's L2 of every other buffer's lines
// before a counter range (L2State::flushed), as Nsight Compute's `--cache-control all` does. Not
// the timer's cold-mode flush (backend/cuda): that one writes its buffer, and the dirty lines it
// leaves would be written back inside the measured range and counted there.
#pragma once

#include <cstddef>

namespace ab::counters {

class L2Flush {
 public:
  // Allocates a buffer of kL2Multiple times the device's L2 size and reads it once (its own
  // zeroing left lines dirty). Throws std::runtime_error with CUDA's words.
  explicit L2Flush(int ordinal);
  ~L2Flush();
  L2Flush(const L2Flush&) = delete;
  L2Flush& operator=(const L2Flush&) = delete;
  // Reads the whole buffer on the default stream and waits: each dirty line in L2 is written back
  // when this evicts it, and L2 ends holding clean lines of the buffer alone.
  void run();

 private:
  static constexpr std::size_t kL2Multiple = 3;  // L2 is not strict LRU: read well past its size
  void* buffer_ = nullptr;
  int* sink_ = nullptr;  // written only where the buffer held other than zeros: never
  std::size_t bytes_ = 0;
  int blocks_ = 0;
};

}  // namespace ab::counters
