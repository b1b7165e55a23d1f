// The pooling device allocator behind nn's Allocator interface: freed blocks stay cached by size
// class and are handed out again (a graph re-bound, an optimizer's velocities), so steady state
// makes no cudaMalloc/cudaFree; everything goes back to the driver at teardown.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace ab::nn::cuda {

class DeviceAllocator final : public Allocator {
 public:
  DeviceAllocator(int device, std::string label);  // label: "cuda:0", for messages
  ~DeviceAllocator() override;
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  DeviceKind device() const override { return DeviceKind::cuda; }
  // Throws OutOfMemory naming the request and the device when cudaMalloc fails even after the
  // cached blocks were returned to the driver.
  void* allocate(std::int64_t bytes) override;
  void deallocate(void* p, std::int64_t bytes) noexcept override;

  // Returns every cached (free) block to the driver; blocks in use stay.
  void release_cached() noexcept;
  std::int64_t cached_bytes() const;
  // The block size a request of `bytes` is served with.
  static std::int64_t size_class(std::int64_t bytes);

 private:
  int device_;
  std::string label_;
  mutable std::mutex mu_;
  std::multimap<std::int64_t, void*> free_;           // size class -> cached block
  std::unordered_map<void*, std::int64_t> in_use_;    // block -> size class
  std::int64_t cached_bytes_ = 0;
};

}  // namespace ab::nn::cuda
