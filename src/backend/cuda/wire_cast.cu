#include "backend/cuda/wire_cast.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/pair_mean.cuh"
#include "core/error.h"

namespace ab::backend::cuda {
namespace {

// At most 2 blocks per SM: the cast overlaps backward's kernels and is short (a 25 MiB bucket is
// ~40 MiB of traffic); grid-stride loops cover the rest. Not tuned on a GPU.
constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 2;

int cast_blocks(std::int64_t count, int sm_count) {
  const std::int64_t needed = (count / 4 + kThreads) / kThreads;
  return static_cast<int>(std::clamp<std::int64_t>(needed, 1, std::int64_t{std::max(sm_count, 1)} * kBlocksPerSm));
}

// One conversion each way, rounding to nearest even where it narrows.
__device__ __forceinline__ void convert(float v, __nv_bfloat16& out) { out = __float2bfloat16_rn(v); }
__device__ __forceinline__ void convert(float v, __half& out) { out = __float2half_rn(v); }
__device__ __forceinline__ void convert(__nv_bfloat16 v, float& out) { out = __bfloat162float(v); }
__device__ __forceinline__ void convert(__half v, float& out) { out = __half2float(v); }
__device__ __forceinline__ void convert(float v, float& out) { out = v; }

// Four values moved as one access (16 bytes of f32, 8 of a 16-bit type).
template <typename T>
struct alignas(4 * sizeof(T)) Four {
  T v[4];
};

// With `vector` (both sides aligned to their Four: buckets start on the gradient store's 256-byte
// boundaries and staging buffers come from cudaMalloc), four elements per thread per sweep; the
// remainder (and everything otherwise) one at a time.
template <typename In, typename Out>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(const In* __restrict__ in, Out* __restrict__ out, std::int64_t count, bool vector) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  const std::int64_t first = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (vector) {
    const std::int64_t quads = count / 4;
    const auto* in4 = reinterpret_cast<const Four<In>*>(in);
    auto* out4 = reinterpret_cast<Four<Out>*>(out);
    for (std::int64_t q = first; q < quads; q += stride) {
      const Four<In> x = in4[q];
      Four<Out> y;
#pragma unroll
      for (int j = 0; j < 4; ++j) convert(x.v[j], y.v[j]);
      out4[q] = y;
    }
    done = quads * 4;
  }
  for (std::int64_t i = done + first; i < count; i += stride) convert(in[i], out[i]);
}

// The pairwise mean, vectorized like the cast.
template <typename T>
__device__ __forceinline__ T mean_of(T a, T b) {
  float x, y;
  convert(a, x);
  convert(b, y);
  T out;
  convert(pair_mean(x, y), out);
  return out;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    mean_kernel(T* __restrict__ data, const T* __restrict__ other, std::int64_t count, bool vector) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  const std::int64_t first = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (vector) {
    const std::int64_t quads = count / 4;
    auto* d4 = reinterpret_cast<Four<T>*>(data);
    const auto* o4 = reinterpret_cast<const Four<T>*>(other);
    for (std::int64_t q = first; q < quads; q += stride) {
      Four<T> x = d4[q];
      const Four<T> y = o4[q];
#pragma unroll
      for (int j = 0; j < 4; ++j) x.v[j] = mean_of(x.v[j], y.v[j]);
      d4[q] = x;
    }
    done = quads * 4;
  }
  for (std::int64_t i = done + first; i < count; i += stride) data[i] = mean_of(data[i], other[i]);
}

bool aligned(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// Built only on failure: average() launches these for every bucket of every eager step.
void check_launch(const char* kernel, const char* what) {
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) throw_cuda(err, kernel, what);
}

[[noreturn]] void not_a_wire_type(DType wire) {
  throw Unsupported("gradient all-reduces communicate in bf16 or f16, not " + std::string(to_string(wire)));
}

template <typename In, typename Out>
void launch_cast(const In* in, Out* out, std::int64_t count, int sm_count, cudaStream_t stream, const char* what) {
  const bool vector = aligned(in, sizeof(Four<In>)) && aligned(out, sizeof(Four<Out>));
  cast_kernel<<<cast_blocks(count, sm_count), kThreads, 0, stream>>>(in, out, count, vector);
  check_launch("cast kernel launch", what);
}

template <typename T>
void launch_mean(void* data, const void* other, std::int64_t count, int sm_count, cudaStream_t stream) {
  auto* d = static_cast<T*>(data);
  const auto* o = static_cast<const T*>(other);
  const bool vector = aligned(d, sizeof(Four<T>)) && aligned(o, sizeof(Four<T>));
  mean_kernel<<<cast_blocks(count, sm_count), kThreads, 0, stream>>>(d, o, count, vector);
  check_launch("mean kernel launch", "pairwise mean of a gradient bucket");
}

}  // namespace

void average_in_place(DType dtype, void* data, const void* other, std::int64_t count, int sm_count, cudaStream_t stream) {
  if (count <= 0) return;
  if (dtype == DType::f32)
    launch_mean<float>(data, other, count, sm_count, stream);
  else if (dtype == DType::bf16)
    launch_mean<__nv_bfloat16>(data, other, count, sm_count, stream);
  else if (dtype == DType::f16)
    launch_mean<__half>(data, other, count, sm_count, stream);
  else
    throw Unsupported("gradients are averaged in f32, bf16 or f16, not " + std::string(to_string(dtype)));
}

void cast_f32_to_wire(DType wire, const float* in, void* out, std::int64_t count, int sm_count, cudaStream_t stream) {
  if (count <= 0) return;
  constexpr const char* what = "f32 to 16-bit cast of a gradient bucket";
  if (wire == DType::bf16)
    launch_cast(in, static_cast<__nv_bfloat16*>(out), count, sm_count, stream, what);
  else if (wire == DType::f16)
    launch_cast(in, static_cast<__half*>(out), count, sm_count, stream, what);
  else
    not_a_wire_type(wire);
}

void cast_wire_to_f32(DType wire, const void* in, float* out, std::int64_t count, int sm_count, cudaStream_t stream) {
  if (count <= 0) return;
  constexpr const char* what = "16-bit to f32 cast of a gradient bucket";
  if (wire == DType::bf16)
    launch_cast(static_cast<const __nv_bfloat16*>(in), out, count, sm_count, stream, what);
  else if (wire == DType::f16)
    launch_cast(static_cast<const __half*>(in), out, count, sm_count, stream, what);
  else
    not_a_wire_type(wire);
}

}  // namespace ab::backend::cuda
