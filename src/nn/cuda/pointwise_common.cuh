// Internal to the project's own elementwise and reduction kernels (pointwise.cu: activations,
// pooling, fills; losses.cu: softmax cross-entropy and the compression losses; optim.cu:
// optimizers and mixed precision): launch constants, dtype dispatch, storage <-> math conversions,
// fixed-order reductions and the elementwise engine every family builds on. Everything has internal
// linkage, one copy per translation unit; host helpers are inline so a family need not use each.
#pragma once

#include "nn/cuda/pointwise.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>

#include "backend/cuda/check.h"
#include "core/error.h"
#include "nn/cuda/device_common.cuh"

namespace ab::nn::cuda_pointwise {
namespace {

using std::int32_t;
using std::int64_t;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Elementwise grids hold at most this many blocks per SM: one resident wave (8 x 256 threads
// fills an SM's 2048 thread slots) that grid-strides over the rest.
constexpr int kBlocksPerSm = 8;
// LARS norm partials: at most this many blocks, two f64 sums each (lars_scratch_floats).
constexpr int kMaxNormBlocks = 1024;
constexpr int kNormBlocksPerSm = 4;
constexpr int kLossThreads = 1024;

// ---- host helpers

inline void check_launch(const char* what) { device_common::check_launch("cuda_pointwise", what); }


inline int grid_for(int64_t items, int64_t max_blocks) {
  const int64_t needed = (items + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<int64_t>(needed, 1, max_blocks));
}

inline int elementwise_blocks(int64_t items) { return grid_for(items, int64_t{sm_count()} * kBlocksPerSm); }

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
template <typename... P>
bool all_aligned16(const P*... p) {
  return (aligned16(p) && ...);
}

// Calls f(Tag<T>{}) with T the device storage type of float dtype t (f64 included).
template <typename F>
void dispatch_float(DType t, const char* what, F&& f) {
  device_common::dispatch_storage<true>(t, "cuda_pointwise", what, std::forward<F>(f));
}

// Small single values (loss, dloss) whose dtype is chosen at run time, not by template.
enum class ScalarType : int { f32, f16, bf16, f64 };
inline ScalarType scalar_type(DType t, const char* what) {
  ScalarType s = ScalarType::f32;
  dispatch_float(t, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, __half>) s = ScalarType::f16;
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) s = ScalarType::bf16;
    else if constexpr (std::is_same_v<T, double>) s = ScalarType::f64;
  });
  return s;
}

// ---- device conversions: storage <-> math type (f32; f64 for f64)

template <typename T>
struct MathOf {
  using type = float;
};
template <>
struct MathOf<double> {
  using type = double;
};
template <typename T>
using Math = typename MathOf<T>::type;

__device__ __forceinline__ float to_math(float v) { return v; }
__device__ __forceinline__ double to_math(double v) { return v; }
__device__ __forceinline__ float to_math(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_math(__nv_bfloat16 v) { return __bfloat162float(v); }

// Rounds to nearest even. From double, each narrow type is reached in one rounding (no detour
// through f32 that could round twice).
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ double from_float<double>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__device__ __forceinline__ T from_double(double v);
template <>
__device__ __forceinline__ float from_double<float>(double v) { return __double2float_rn(v); }
template <>
__device__ __forceinline__ double from_double<double>(double v) { return v; }
template <>
__device__ __forceinline__ __half from_double<__half>(double v) { return __double2half(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_double<__nv_bfloat16>(double v) { return __double2bfloat16(v); }

template <typename T>
__device__ __forceinline__ T from_math(float v) { return from_float<T>(v); }
template <typename T>
__device__ __forceinline__ T from_math(double v) { return from_double<T>(v); }

template <typename D, typename S>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<S, D>) return v;
  else if constexpr (std::is_same_v<S, double>) return from_double<D>(v);
  else return from_float<D>(to_math(v));  // f16/bf16/f32 are exact in f32
}

__device__ __forceinline__ double load_scalar(const void* p, ScalarType t) {
  switch (t) {
    case ScalarType::f16: return __half2float(*static_cast<const __half*>(p));
    case ScalarType::bf16: return __bfloat162float(*static_cast<const __nv_bfloat16*>(p));
    case ScalarType::f64: return *static_cast<const double*>(p);
    default: return *static_cast<const float*>(p);
  }
}

__device__ __forceinline__ void store_scalar(void* p, ScalarType t, double v) {
  switch (t) {
    case ScalarType::f16: *static_cast<__half*>(p) = __double2half(v); break;
    case ScalarType::bf16: *static_cast<__nv_bfloat16*>(p) = __double2bfloat16(v); break;
    case ScalarType::f64: *static_cast<double*>(p) = v; break;
    default: *static_cast<float*>(p) = __double2float_rn(v); break;
  }
}

__device__ __forceinline__ bool is_finite_value(float v) { return isfinite(v); }
__device__ __forceinline__ bool is_finite_value(double v) { return isfinite(v); }

// ---- vector access: W consecutive elements as one aligned load or store (16 bytes at most)

using device_common::Chunk;
using device_common::load;
using device_common::store;
using device_common::Tag;

// ---- reductions in a fixed order

using device_common::block_sum;
using device_common::warp_sum;

// ---- the elementwise engine: an Op processes W consecutive elements at i (W = Op::kVec on the
// aligned body, 1 on the tail). begin() runs once per thread (reads device flags), skipped()
// ends the kernel without touching memory, end() runs once per thread after the loops.

struct OpBase {
  __device__ void begin() {}
  __device__ bool skipped() const { return false; }
  __device__ void end() {}
};

template <typename Op>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(Op op, int64_t n, bool vectorised) {
  op.begin();
  if (op.skipped()) return;
  constexpr int V = Op::kVec;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorised) {
    const int64_t chunks = n / V;
    for (int64_t c = first; c < chunks; c += stride) op.template apply<V>(c * V);
    done = chunks * V;
  }
  for (int64_t i = done + first; i < n; i += stride) op.template apply<1>(i);
  op.end();
}

template <typename Op>
void launch_elementwise(cudaStream_t stream, const Op& op, int64_t n, bool aligned, const char* what,
                        int blocks = 0) {
  if (n <= 0) return;
  const bool vectorised = aligned && Op::kVec > 1 && n >= Op::kVec;
  const int64_t items = vectorised ? n / Op::kVec + n % Op::kVec : n;
  if (blocks <= 0) blocks = elementwise_blocks(items);
  elementwise_kernel<Op><<<blocks, kThreads, 0, stream>>>(op, n, vectorised);
  check_launch(what);
}

template <typename T>
constexpr int vec_of() {
  return static_cast<int>(16 / sizeof(T));
}

}  // namespace
}  // namespace ab::nn::cuda_pointwise
