#include "nn/cuda/allocator.h"

#include <cuda_runtime_api.h>

#include "backend/cuda/check.h"
#include "core/error.h"

namespace ab::nn::cuda {
namespace {

constexpr std::int64_t kSmallLimitBytes = std::int64_t{1} << 20;
constexpr std::int64_t kSmallGranuleBytes = 512;
constexpr std::int64_t kLargeGranuleBytes = std::int64_t{2} << 20;

std::string mib(std::int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

DeviceAllocator::DeviceAllocator(int device, std::string label) : device_(device), label_(std::move(label)) {}

DeviceAllocator::~DeviceAllocator() {
  // Teardown never throws: errors from cudaFree are dropped (the context may already be gone).
  cudaSetDevice(device_);
  release_cached();
  for (auto& [p, bytes] : in_use_) cudaFree(p);
}

std::int64_t DeviceAllocator::size_class(std::int64_t bytes) {
  return bytes <= kSmallLimitBytes ? align_up(bytes, kSmallGranuleBytes) : align_up(bytes, kLargeGranuleBytes);
}

void* DeviceAllocator::allocate(std::int64_t bytes) {
  if (bytes <= 0) return nullptr;
  const std::int64_t cls = size_class(bytes);
  const std::lock_guard lock(mu_);
  if (auto it = free_.find(cls); it != free_.end()) {
    void* p = it->second;
    free_.erase(it);
    cached_bytes_ -= cls;
    in_use_.emplace(p, cls);
    note_allocate(bytes);
    return p;
  }
  backend::cuda::check_cuda(cudaSetDevice(device_), "cudaSetDevice", label_ + " allocator");
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, static_cast<std::size_t>(cls));
  if (err == cudaErrorMemoryAllocation && cached_bytes_ > 0) {
    // Blocks of other sizes sit in the cache: give them back and try once more.
    cudaGetLastError();
    for (auto& [size, block] : free_) cudaFree(block);
    free_.clear();
    cached_bytes_ = 0;
    err = cudaMalloc(&p, static_cast<std::size_t>(cls));
  }
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: later calls start clean
    std::int64_t in_use = 0;
    for (const auto& [block, size] : in_use_) in_use += size;
    std::size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) cudaGetLastError();
    throw OutOfMemory(label_ + " out of memory allocating " + std::to_string(bytes) + " bytes (" + mib(bytes) +
                      "); this allocator holds " + mib(in_use) + ", the device has " +
                      mib(static_cast<std::int64_t>(free_bytes)) + " free of " +
                      mib(static_cast<std::int64_t>(total_bytes)));
  }
  backend::cuda::check_cuda(err, "cudaMalloc", label_ + " allocator, " + std::to_string(bytes) + " bytes");
  in_use_.emplace(p, cls);
  note_allocate(bytes);
  return p;
}

void DeviceAllocator::deallocate(void* p, std::int64_t bytes) noexcept {
  if (p == nullptr) return;
  const std::lock_guard lock(mu_);
  auto it = in_use_.find(p);
  if (it == in_use_.end()) return;  // not ours: ignoring it beats freeing a stranger's block
  // Work still queued on the stream may read the block; it is only handed out again to work
  // enqueued later on the same stream, which runs after it.
  free_.emplace(it->second, p);
  cached_bytes_ += it->second;
  in_use_.erase(it);
  note_deallocate(bytes);
}

void DeviceAllocator::release_cached() noexcept {
  const std::lock_guard lock(mu_);
  if (free_.empty()) return;
  cudaSetDevice(device_);
  for (auto& [size, block] : free_) cudaFree(block);
  free_.clear();
  cached_bytes_ = 0;
}

std::int64_t DeviceAllocator::cached_bytes() const {
  const std::lock_guard lock(mu_);
  return cached_bytes_;
}

}  // namespace ab::nn::cuda
