// The L2 flush before a counter range (l2_flush.h): a read-only sweep, so that it leaves no dirty
// line of its own behind for the measured work to write back.
#include "counters/l2_flush.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace ab::counters {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// XORs every 16-byte word of the buffer; the sum decides a store the compiler cannot drop.
__global__ void read_all(const int4* __restrict__ words, std::size_t count, int* sink) {
  int4 acc{0, 0, 0, 0};
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const int4 w = words[i];
    acc.x ^= w.x, acc.y ^= w.y, acc.z ^= w.z, acc.w ^= w.w;
  }
  if ((acc.x | acc.y | acc.z | acc.w) != 0) *sink = 1;
}

}  // namespace

L2Flush::L2Flush(int ordinal) {
  int l2_bytes = 0, sms = 0;
  check(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, ordinal), "cudaDeviceGetAttribute(L2CacheSize)");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal), "cudaDeviceGetAttribute(SM count)");
  bytes_ = kL2Multiple * static_cast<std::size_t>(l2_bytes > 0 ? l2_bytes : 64 << 20);
  bytes_ -= bytes_ % sizeof(int4);
  blocks_ = 4 * sms;
  check(cudaMalloc(&buffer_, bytes_), "cudaMalloc (the L2 flush buffer)");
  check(cudaMalloc(reinterpret_cast<void**>(&sink_), sizeof(int)), "cudaMalloc (the L2 flush sink)");
  check(cudaMemset(buffer_, 0, bytes_), "cudaMemset (the L2 flush buffer)");
  run();
}

L2Flush::~L2Flush() {
  cudaFree(buffer_);
  cudaFree(sink_);
}

void L2Flush::run() {
  read_all<<<blocks_, 256>>>(static_cast<const int4*>(buffer_), bytes_ / sizeof(int4), sink_);
  check(cudaGetLastError(), "the L2 flush's launch");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (the L2 flush)");
}

}  // namespace ab::counters
