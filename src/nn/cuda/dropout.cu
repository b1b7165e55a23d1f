// Dropout's kernel (transformer.h): each thread a V-vector of elements, its mask bits from
// dropout_mask.h's hash of (seed, *counter, index), so the reference drops the same elements.
#include <cstdint>

#include "nn/cuda/transformer_common.cuh"
#include "nn/dropout_mask.h"

namespace ab::nn::cuda_transformer {
namespace {

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    dropout_kernel(const T* x, T* y, int64_t n, uint64_t seed, const int32_t* counter, uint32_t threshold, float scale,
                   bool accumulate) {
  const uint64_t stream = dropout_stream(seed, *counter);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x * V;
  for (int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    const auto a = load<V>(x, i);
    Chunk<T, V> out;
    if (accumulate) out = load<V>(y, i);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float v = dropout_keeps(stream, static_cast<uint64_t>(i + j), threshold) ? to_f32(a.v[j]) * scale : 0.0f;
      out.v[j] = from_f32<T>(accumulate ? to_f32(out.v[j]) + v : v);
    }
    store<V>(y, i, out);
  }
}

}  // namespace

void dropout(cudaStream_t stream, DType t, const void* x, void* y, int64_t n, uint64_t seed, const int32_t* counter,
             uint32_t threshold, float scale, bool accumulate) {
  if (n == 0) return;
  dispatch(t, "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_width<T>(n % vec_of<T>() == 0 && aligned(x, 16) && aligned(y, 16), [&]<int V>() {
      dropout_kernel<T, V><<<blocks_for(n / V), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), n,
                                                                       seed, counter, threshold, scale, accumulate);
    });
  });
  check_launch("dropout");
}

}  // namespace ab::nn::cuda_transformer
