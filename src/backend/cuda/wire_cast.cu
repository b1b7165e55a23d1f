#include "backend/cuda/wire_cast.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/check.h"
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

template <typename W>
__device__ __forceinline__ W narrow(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }

// Four 16-bit values: one 8-byte access.
template <typename W>
struct alignas(8) Four {
  W v[4];
};

// With `vector` (f32 side 16-byte and 16-bit side 8-byte aligned: buckets start on the gradient
// store's 256-byte boundaries and staging buffers come from cudaMalloc), four elements per thread
// per sweep; the remainder (and everything otherwise) one at a time.
template <typename W>
__global__ void __launch_bounds__(kThreads)
    narrow_kernel(const float* __restrict__ in, W* __restrict__ out, std::int64_t count, bool vector) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  const std::int64_t first = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (vector) {
    const std::int64_t quads = count / 4;
    const auto* in4 = reinterpret_cast<const float4*>(in);
    auto* out4 = reinterpret_cast<Four<W>*>(out);
    for (std::int64_t q = first; q < quads; q += stride) {
      const float4 x = in4[q];
      Four<W> y;
      y.v[0] = narrow<W>(x.x);
      y.v[1] = narrow<W>(x.y);
      y.v[2] = narrow<W>(x.z);
      y.v[3] = narrow<W>(x.w);
      out4[q] = y;
    }
    done = quads * 4;
  }
  for (std::int64_t i = done + first; i < count; i += stride) out[i] = narrow<W>(in[i]);
}

template <typename W>
__global__ void __launch_bounds__(kThreads)
    widen_kernel(const W* __restrict__ in, float* __restrict__ out, std::int64_t count, bool vector) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  const std::int64_t first = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (vector) {
    const std::int64_t quads = count / 4;
    const auto* in4 = reinterpret_cast<const Four<W>*>(in);
    auto* out4 = reinterpret_cast<float4*>(out);
    for (std::int64_t q = first; q < quads; q += stride) {
      const Four<W> x = in4[q];
      out4[q] = make_float4(widen(x.v[0]), widen(x.v[1]), widen(x.v[2]), widen(x.v[3]));
    }
    done = quads * 4;
  }
  for (std::int64_t i = done + first; i < count; i += stride) out[i] = widen(in[i]);
}

bool aligned(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

void check_launch(const char* what) {
  // Built only on failure: average() launches these for every bucket of every eager step.
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda(err, "cast kernel launch", what);
}

[[noreturn]] void not_a_wire_type(DType wire) {
  throw Unsupported("gradient all-reduces communicate in bf16 or f16, not " + std::string(to_string(wire)));
}

}  // namespace

void cast_f32_to_wire(DType wire, const float* in, void* out, std::int64_t count, int sm_count, cudaStream_t stream) {
  if (count <= 0) return;
  const bool vector = aligned(in, 16) && aligned(out, 8);
  const int blocks = cast_blocks(count, sm_count);
  if (wire == DType::bf16)
    narrow_kernel<<<blocks, kThreads, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out), count, vector);
  else if (wire == DType::f16)
    narrow_kernel<<<blocks, kThreads, 0, stream>>>(in, static_cast<__half*>(out), count, vector);
  else
    not_a_wire_type(wire);
  check_launch("f32 to 16-bit cast of a gradient bucket");
}

void cast_wire_to_f32(DType wire, const void* in, float* out, std::int64_t count, int sm_count, cudaStream_t stream) {
  if (count <= 0) return;
  const bool vector = aligned(in, 8) && aligned(out, 16);
  const int blocks = cast_blocks(count, sm_count);
  if (wire == DType::bf16)
    widen_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(in), out, count, vector);
  else if (wire == DType::f16)
    widen_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(in), out, count, vector);
  else
    not_a_wire_type(wire);
  check_launch("16-bit to f32 cast of a gradient bucket");
}

}  // namespace ab::backend::cuda
