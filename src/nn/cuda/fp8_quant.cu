// The fp8 (e4m3) quantization kernels of conv_fp8.h: a tensor's amax, its e4m3 image with the
// per-tensor scale 448 / amax computed on the device, and the product of two descales.
//
// Rounding must match the host's float_to_e4m3_bits (core/dtype.cpp), which the tests and the
// reference use: it maps NaN to 0x7f, clamps |v| to 448 (e4m3fn has no infinity: saturate), rounds
// |v| < 2^-6 to the nearest multiple of 2^-9 (subnormals; ties to even, 8 * 2^-9 landing on the
// smallest normal's encoding) and otherwise rounds the mantissa to 3 bits, ties to even, carrying
// into the exponent. __nv_cvt_float_to_fp8 with __NV_SATFINITE and __NV_E4M3 is, on sm_89 and
// later, one cvt.rn.satfinite.e4m3x2.f32: round to nearest even, finite overflow (anything from
// 464 = 448 + half an ulp up, infinity included) saturating to +-448, the same for every finite or
// infinite input. cuda_fp8.h's host emulation of this conversion agrees with float_to_e4m3_bits
// (nn_cuda_fp8_test Fp8Conversion.CudaHeaderRoundsLikeTheHost, every rounding tie included); that
// the instruction agrees too is what its GPU tests check. Only a NaN's sign might
// differ there (0xff against the host's 0x7f); a NaN input also makes amax NaN, so the scale falls
// back to 1 (below).
#include <cuda_fp8.h>

#include <cstdint>

#include "nn/cuda/conv_fp8.h"
#include "nn/cuda/pointwise_common.cuh"

namespace ab::nn::cuda {
namespace {

// The elementwise kernels' launch shape and storage -> float conversion.
using cuda_pointwise::grid_for;
using cuda_pointwise::kThreads;
using cuda_pointwise::kWarps;
using cuda_pointwise::to_math;
using device_common::dispatch_storage;

constexpr std::int64_t kMaxBlocks = 1024;
constexpr float kE4m3Max = 448.0f;
constexpr int kVectorBytes = 16;

// Elements one 16-byte load holds: 8 of f16/bf16, 4 of f32.
template <typename T>
constexpr int kLanes = kVectorBytes / static_cast<int>(sizeof(T));

// The vector loop takes 16-byte loads (and kLanes-byte stores of e4m3) where the pointers allow:
// one load instruction moves 8 activations instead of one, which is what lets these passes run near
// memory bandwidth (the one-element-per-thread version took ~5x a 16-bit 1x1 convolution's time on
// the same tensor). The scalar loop finishes the remainder, or does everything for unaligned data.
bool vectorizable(const void* p, int bytes_per_vector) {
  return reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(bytes_per_vector) == 0;
}

int blocks_for(std::int64_t items) { return grid_for(items, kMaxBlocks); }

// The lanes of one 16-byte load as floats.
template <typename T>
__device__ __forceinline__ void load_lanes(const T* x, std::int64_t vector, float (&out)[kLanes<T>]) {
  const uint4 raw = reinterpret_cast<const uint4*>(x)[vector];
  const T* lanes = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < kLanes<T>; ++j) out[j] = to_math(lanes[j]);
}

__device__ __forceinline__ unsigned int magnitude_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// max |x| as the bits of a non-negative float: those order like the values (NaN above infinity),
// so an integer max is exact and order-free, and one atomicMax per block joins the blocks.
// `vectors` 16-byte vectors first (0 where x is not aligned), then the elements after them.
template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, std::int64_t n, std::int64_t vectors,
                            unsigned int* __restrict__ out) {
  unsigned int m = 0;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t v = first; v < vectors; v += step) {
    float lanes[kLanes<T>];
    load_lanes(x, v, lanes);
#pragma unroll
    for (int j = 0; j < kLanes<T>; ++j) m = max(m, magnitude_bits(lanes[j]));
  }
  for (std::int64_t i = vectors * kLanes<T> + first; i < n; i += step) m = max(m, magnitude_bits(to_math(x[i])));
  for (int offset = 16; offset > 0; offset >>= 1) m = max(m, __shfl_down_sync(0xffffffffu, m, offset));
  __shared__ unsigned int warp_max[kWarps];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) m = max(m, warp_max[w]);
    atomicMax(out, m);
  }
}

// The scale 448 / amax is usable where it is a finite positive number; where it is not (amax 0,
// subnormally small, infinite or NaN) the tensor is stored unscaled (scale and descale 1) rather
// than as NaNs or zeros.
__device__ __forceinline__ bool usable_scale(float s) { return s > 0.0f && s <= 3.402823466e38f; }

__device__ __forceinline__ std::uint8_t to_e4m3(float v, float scale) {
  return __nv_cvt_float_to_fp8(__fmul_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
}

// The e4m3 bytes of one vector's lanes, stored at once (8 bytes for 16-bit input, 4 for f32).
template <int Lanes>
struct LaneBytes;
template <>
struct LaneBytes<8> {
  using type = uint2;
};
template <>
struct LaneBytes<4> {
  using type = unsigned int;
};

template <typename T>
__global__ void quantize_kernel(const T* __restrict__ x, std::int64_t n, std::int64_t vectors,
                                const float* __restrict__ amax, std::uint8_t* __restrict__ q,
                                float* __restrict__ descale, const float* __restrict__ times) {
  const float a = *amax;
  const float s = __fdiv_rn(kE4m3Max, a);
  const bool usable = usable_scale(s);
  const float scale = usable ? s : 1.0f;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // amax / 448 in one rounding (not 1 / scale, which would round twice).
  if (first == 0) {
    const float own = usable ? __fdiv_rn(a, kE4m3Max) : 1.0f;
    *descale = times != nullptr ? __fmul_rn(own, *times) : own;
  }
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  using Bytes = typename LaneBytes<kLanes<T>>::type;
  for (std::int64_t v = first; v < vectors; v += step) {
    float lanes[kLanes<T>];
    load_lanes(x, v, lanes);
    Bytes packed;
    auto* bytes = reinterpret_cast<std::uint8_t*>(&packed);
#pragma unroll
    for (int j = 0; j < kLanes<T>; ++j) bytes[j] = to_e4m3(lanes[j], scale);
    reinterpret_cast<Bytes*>(q)[v] = packed;
  }
  for (std::int64_t i = vectors * kLanes<T> + first; i < n; i += step) q[i] = to_e4m3(to_math(x[i]), scale);
}

__global__ void multiply_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out) {
  *out = __fmul_rn(*a, *b);
}

}  // namespace

void fp8_amax(void* stream, DType t, const void* x, std::int64_t n, float* amax) {
  const auto s = static_cast<cudaStream_t>(stream);
  AB_CUDA(cudaMemsetAsync(amax, 0, sizeof(float), s), "fp8 amax: clearing the result");
  if (n <= 0) return;
  dispatch_storage<false>(t, "fp8", "amax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::int64_t vectors = vectorizable(x, kVectorBytes) ? n / kLanes<T> : 0;
    amax_kernel<T><<<blocks_for(vectors > 0 ? vectors : n), kThreads, 0, s>>>(
        static_cast<const T*>(x), n, vectors, reinterpret_cast<unsigned int*>(amax));
  });
  device_common::check_launch("fp8", "amax");
}

void fp8_quantize_e4m3(void* stream, DType t, const void* x, std::int64_t n, const float* amax, std::uint8_t* q,
                       float* descale, const float* times) {
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_storage<false>(t, "fp8", "quantize_e4m3", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool aligned = vectorizable(x, kVectorBytes) && vectorizable(q, kLanes<T>);
    const std::int64_t vectors = aligned ? n / kLanes<T> : 0;
    // grid_for gives at least one block: the descale is written for an empty tensor too.
    quantize_kernel<T><<<blocks_for(vectors > 0 ? vectors : n), kThreads, 0, s>>>(
        static_cast<const T*>(x), n, vectors, amax, q, descale, times);
  });
  device_common::check_launch("fp8", "quantize_e4m3");
}

void fp8_multiply_scalars(void* stream, const float* a, const float* b, float* out) {
  multiply_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(a, b, out);
  device_common::check_launch("fp8", "multiply_scalars");
}

}  // namespace ab::nn::cuda
