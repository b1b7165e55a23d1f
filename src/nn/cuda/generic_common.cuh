// Internal to generic.cu and generic_reduce.cu: operand checks, the strided index decoded on the
// device (32-bit division where the element count allows), and the grid-stride launch over it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "nn/broadcast.h"
#include "nn/cuda/generic.h"
#include "nn/cuda/pointwise_common.cuh"
#include "nn/generic_math.h"

namespace ab::nn::cuda_generic {
namespace {

using namespace cuda_pointwise;  // NOLINT: the shared launch constants, conversions and chunks
using std::int64_t;

[[noreturn]] inline void refuse(const char* kernel, const std::string& why) {
  throw Unsupported(std::string("cuda ") + kernel + ": " + why);
}

inline void require_same_dtype(const char* kernel, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->dtype != (*ts.begin())->dtype)
      refuse(kernel, "operands " + (*ts.begin())->to_string() + " and " + t->to_string() + " differ in dtype");
}

// Every operand of one shape and strides, contiguous: the flat (vectorised) path applies.
inline bool flat_together(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (!(t->shape == (*ts.begin())->shape) || !(t->strides == (*ts.begin())->strides) || !t->is_contiguous())
      return false;
  return true;
}

inline bool all_aligned(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (!aligned16(p)) return false;
  return true;
}

// off[k] = operand k's element offset of logical element i; I is the division's integer type.
template <int N, typename I>
__device__ __forceinline__ void offsets_of(const StridedIndex& ix, int64_t i, int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
  I rest = static_cast<I>(i);
  for (int d = ix.rank - 1; d >= 0; --d) {
    const I dim = static_cast<I>(ix.dims[d]);
    const I c = rest % dim;
    rest /= dim;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(c) * ix.strides[k][d];
  }
}

template <int N, typename I, typename F>
__global__ void __launch_bounds__(kThreads) indexed_kernel(StridedIndex ix, int64_t n, F f) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[N];
    offsets_of<N, I>(ix, i, off);
    f(off);
  }
}

// Runs f(offsets) for each of the index's elements, N operands (the index's first N), in the
// output's memory order (independent elements only).
template <int N, typename F>
void launch_indexed(cudaStream_t stream, StridedIndex ix, const F& f, const char* what) {
  order_by_output(ix);
  coalesce(ix);
  int64_t n = 1;
  for (int d = 0; d < ix.rank; ++d) n *= ix.dims[d];
  if (n <= 0) return;
  const int blocks = elementwise_blocks(n);
  if (n <= std::numeric_limits<std::uint32_t>::max())
    indexed_kernel<N, std::uint32_t><<<blocks, kThreads, 0, stream>>>(ix, n, f);
  else indexed_kernel<N, std::uint64_t><<<blocks, kThreads, 0, stream>>>(ix, n, f);
  check_launch(what);
}

// Calls f(Tag<E>{}) with E an unsigned integer of `bytes` bytes: copies move any dtype as bits.
template <typename F>
void dispatch_bits(std::size_t bytes, const char* what, F&& f) {
  switch (bytes) {
    case 1: f(Tag<std::uint8_t>{}); return;
    case 2: f(Tag<std::uint16_t>{}); return;
    case 4: f(Tag<std::uint32_t>{}); return;
    case 8: f(Tag<std::uint64_t>{}); return;
    default: refuse(what, "no copy for " + std::to_string(bytes) + "-byte elements");
  }
}

// Integer or floating elements read as a double on the device (indices, conditions).
enum class Elem : int { i8, i32, i64, f32, f16, bf16, f64 };
inline Elem elem_of(DType t, const char* what) {
  switch (t) {
    case DType::i8: return Elem::i8;
    case DType::i32: return Elem::i32;
    case DType::i64: return Elem::i64;
    case DType::f32: return Elem::f32;
    case DType::f16: return Elem::f16;
    case DType::bf16: return Elem::bf16;
    case DType::f64: return Elem::f64;
    default: refuse(what, "no index or condition of dtype " + std::string(to_string(t)));
  }
}
__device__ __forceinline__ double load_elem(const void* p, Elem t, int64_t i) {
  switch (t) {
    case Elem::i8: return static_cast<const std::int8_t*>(p)[i];
    case Elem::i32: return static_cast<const std::int32_t*>(p)[i];
    case Elem::i64: return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
    case Elem::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case Elem::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case Elem::f64: return static_cast<const double*>(p)[i];
    default: return static_cast<const float*>(p)[i];
  }
}

}  // namespace
}  // namespace ab::nn::cuda_generic
