// Pieces the engine's own CUDA kernel files share (pointwise.cu, batchnorm.cu): vector
// chunks for 16-byte loads and stores, the dtype-to-storage-type dispatch, and the launch check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
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

}  // namespace ab::nn::device_common
