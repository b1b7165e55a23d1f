// Pieces the engine's own CUDA kernel files share (the pointwise, batch-norm, transformer and
// attention families): vector chunks for 16-byte loads and stores, storage <-> f32 conversions,
// fixed-order warp and block sums, the dtype-to-storage-type dispatch, and the launch check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/cuda/check.h"
#include "core/dtype.h"
#include "core/error.h"

namespace ab::nn::device_common {

template <typename T, int W>
struct alignas(W * sizeof(T)) Chunk {
  T v[W];
};

template <int W, typename T>
__device__ __forceinline__ Chunk<T, W> load(const T* p, std::int64_t i) {
  return *reinterpret_cast<const Chunk<T, W>*>(p + i);
}
template <int W, typename T>
__device__ __forceinline__ void store(T* p, std::int64_t i, const Chunk<T, W>& c) {
  *reinterpret_cast<Chunk<T, W>*>(p + i) = c;
}

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with T the device storage type of float dtype t; f64 only WithF64. The error
// names the component and call ("cuda_pointwise fill: dtype i32 is not supported (valid: ...)").
template <bool WithF64, typename F>
void dispatch_storage(DType t, const char* component, const char* what, F&& f) {
  switch (t) {
    case DType::f32: f(Tag<float>{}); return;
    case DType::f16: f(Tag<__half>{}); return;
    case DType::bf16: f(Tag<__nv_bfloat16>{}); return;
    case DType::f64:
      if constexpr (WithF64) {
        f(Tag<double>{});
        return;
      }
      break;
    default: break;
  }
  throw Unsupported(std::string(component) + " " + what + ": dtype " + std::string(to_string(t)) +
                    " is not supported (valid: f32, f16, bf16" + (WithF64 ? ", f64)" : ")"));
}

// Only builds the message on failure, so a launch costs no string work.
inline void check_launch(const char* component, const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) backend::cuda::throw_cuda(err, "kernel launch", std::string(component) + " " + what);
}

__host__ __device__ inline bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

// Rounded to nearest even.
template <typename T>
__device__ __forceinline__ T from_f32(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return __float2bfloat16_rn(v);
}

// The xor butterfly leaves the same sum in every lane, in an order fixed by the lane numbers.
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the whole block, returned to every thread; every thread of the block must call it.
template <typename A>
__device__ A block_sum(A v) {
  __shared__ A partial[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  return warp_sum(lane < warps ? partial[lane] : A(0));
}

}  // namespace ab::nn::device_common
