// Column sums of a row-major [rows, C] matrix (transformer.h): the linear layers' bias gradients
// read once at bandwidth. Stage 1: a block per (strip of 32 x V columns, row split), its warps
// taking rows in turn, each lane summing V columns in f32 (kUnroll rows' 16-byte loads in flight);
// the warps' sums added in warp order into partials[split][C]. Stage 2: a thread per column adds
// the splits in order. Shapes and the SM count fix every order: bit-identical run to run.
#include "core/error.h"
#include "nn/cuda/transformer_common.cuh"

namespace ab::nn::cuda_transformer {
namespace {

constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;
constexpr int kMaxSplits = 128;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    column_partials_kernel(const T* x, int64_t ld, int64_t rows, int64_t cols, float* partials) {
  __shared__ float block_sums[32 * 16];  // one strip: 32 lanes x V (at most 16) columns
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t c = (int64_t{blockIdx.x} * 32 + lane) * V, split = blockIdx.y, step = int64_t{gridDim.y} * kWarps;
  float acc[V] = {};
  if (c < cols) {
    int64_t r = split * kWarps + warp;
    for (; r + (kUnroll - 1) * step < rows; r += kUnroll * step) {
      Chunk<T, V> a[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) a[u] = load<V>(x + (r + u * step) * ld, c);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += to_f32(a[u].v[j]);
    }
    for (; r < rows; r += step) {
      const auto a = load<V>(x + r * ld, c);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += to_f32(a.v[j]);
    }
  }
  for (int w = 0; w < kWarps; ++w) {  // warp order: a fixed sum
    if (warp == w)
#pragma unroll
      for (int j = 0; j < V; ++j) block_sums[lane * V + j] = w == 0 ? acc[j] : block_sums[lane * V + j] + acc[j];
    __syncthreads();
  }
  for (int i = threadIdx.x; i < 32 * V; i += blockDim.x) {
    const int64_t col = int64_t{blockIdx.x} * 32 * V + i;
    if (col < cols) partials[split * cols + col] = block_sums[i];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    column_total_kernel(const float* partials, int splits, int64_t cols, T* sums) {
  const int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float total = 0.0f;
  for (int s = 0; s < splits; ++s) total += partials[int64_t{s} * cols + c];
  sums[c] = from_f32<T>(total);
}

// Row splits: about 16 warps per SM over the strips, at most kMaxSplits and the partials' room.
int column_splits(int64_t rows, int64_t strips, int64_t cols, int64_t scratch_bytes) {
  const int64_t warps_wanted = int64_t{cuda_pointwise::sm_count()} * 16;
  const int64_t by_rows = (rows + kWarps - 1) / kWarps, by_room = scratch_bytes / (cols * 4);
  return static_cast<int>(std::clamp<int64_t>(
      std::min({(warps_wanted + strips * kWarps - 1) / (strips * kWarps), by_rows, by_room, int64_t{kMaxSplits}}), 1,
      kMaxSplits));
}

}  // namespace

int64_t column_sums_scratch_bytes(int64_t cols) { return int64_t{kMaxSplits} * cols * 4; }

void column_sums(cudaStream_t stream, DType t, const void* x, int64_t ld, int64_t rows, int64_t cols, void* sums,
                 float* scratch, int64_t scratch_bytes) {
  if (cols == 0) return;
  if (scratch_bytes < cols * 4) throw Error("internal: column_sums scratch too small");
  dispatch(t, "column_sums", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vector_ok = aligned(x, 16) && ld % vec_of<T>() == 0 && cols % vec_of<T>() == 0;
    with_width<T>(vector_ok, [&]<int V>() {
      const int64_t strips = (cols + 32 * V - 1) / (32 * V);
      const int splits = column_splits(rows, strips, cols, scratch_bytes);
      column_partials_kernel<T, V>
          <<<dim3(static_cast<unsigned>(strips), static_cast<unsigned>(splits)), kThreads, 0, stream>>>(
              static_cast<const T*>(x), ld, rows, cols, scratch);
      column_total_kernel<T><<<static_cast<int>((cols + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
          scratch, splits, cols, static_cast<T*>(sums));
    });
  });
  check_launch("column_sums");
}

}  // namespace ab::nn::cuda_transformer
