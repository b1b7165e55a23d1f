// Internal to the transformer family's kernels (transformer.cu, transformer_optim.cu): the dtype
// dispatch and launch helpers (conversions and fixed-order sums: device_common.cuh).
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

using device_common::aligned;
using device_common::block_sum;
using device_common::Chunk;
using device_common::from_f32;
using device_common::load;
using device_common::store;
using device_common::Tag;
using device_common::to_f32;
using device_common::warp_sum;
using std::int32_t;
using std::int64_t;

constexpr int kThreads = 256;

inline void check_launch(const char* what) { device_common::check_launch("cuda_transformer", what); }

// f(Tag<T>{}) with T the storage type of f32, f16 or bf16.
template <typename F>
void dispatch(DType t, const char* what, F&& f) {
  device_common::dispatch_storage<false>(t, "cuda_transformer", what, std::forward<F>(f));
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
