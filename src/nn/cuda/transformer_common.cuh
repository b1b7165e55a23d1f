// Internal to the transformer family's kernels (transformer.cu, transformer_optim.cu): storage <->
// f32 conversions, the dtype dispatch, fixed-order warp and block sums, launch helpers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "nn/cuda/device_common.cuh"
#include "nn/cuda/pointwise.h"
#include "nn/cuda/transformer.h"

namespace ab::nn::cuda_transformer {
namespace {

using device_common::Chunk;
using device_common::load;
using device_common::store;
using device_common::Tag;
using std::int32_t;
using std::int64_t;

constexpr int kThreads = 256;

inline void check_launch(const char* what) { device_common::check_launch("cuda_transformer", what); }

// f(Tag<T>{}) with T the storage type of f32, f16 or bf16.
template <typename F>
void dispatch(DType t, const char* what, F&& f) {
  device_common::dispatch_storage<false>(t, "cuda_transformer", what, std::forward<F>(f));
}

__host__ __device__ inline bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// Grid-stride grids hold at most 8 blocks of kThreads per SM: one resident wave.
inline int blocks_for(int64_t items) {
  const int64_t needed = (items + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<int64_t>(needed, 1, int64_t{cuda_pointwise::sm_count()} * 8));
}

template <typename T>
constexpr int vec_of() {
  return static_cast<int>(16 / sizeof(T));
}

// Calls f.template operator()<V>() with V = T's 16-byte width where `vector_ok`, else 1.
template <typename T, typename F>
void with_width(bool vector_ok, F&& f) {
  if (vector_ok) f.template operator()<vec_of<T>()>();
  else f.template operator()<1>();
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// The xor butterfly leaves the same sum in every lane, in an order fixed by the lane numbers.
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block, returned to every thread; every thread must call it.
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

// The first index in sorted[0, n) whose value is >= key.
template <typename K>
__device__ __forceinline__ int64_t lower_bound(const K* sorted, int64_t n, K key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (sorted[mid] < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

}  // namespace
}  // namespace ab::nn::cuda_transformer
