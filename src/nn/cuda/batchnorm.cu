#include "nn/cuda/batchnorm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "backend/cuda/check.h"
#include "core/error.h"
#include "nn/cuda/device_common.cuh"
#include "nn/cuda/pointwise.h"

namespace ab::nn::cuda_batchnorm {
namespace {

using std::int64_t;

// A tile block: tx threads across channel vectors (V channels each, one 16-byte load at most),
// ty = kThreads / tx across rows, so a warp reads whole rows' channel slices, coalesced.
constexpr int kThreads = 256;
constexpr int kMaxTx = 32;
// Statistics blocks per SM (partials per channel grow with it) and elementwise blocks per SM.
constexpr int kStatsBlocksPerSm = 4;
constexpr int kApplyBlocksPerSm = 8;
// Channels one statistics block is assumed to cover when sizing the grid; a constant (not the
// vector width) so the scratch size depends on the shape only.
constexpr int64_t kChannelsPerBlockEstimate = 128;
constexpr int64_t kMinRowsPerBlock = 64;
// Rows each thread loads before using them: several 16-byte loads in flight per thread.
constexpr int kRowsPerBatch = 4;
// The finalising kernels: 32 channels x 32 groups of partials per block.
constexpr int kFinalX = 32, kFinalY = 32;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t align256(int64_t b) { return (b + 255) / 256 * 256; }

void check_launch(const char* what) { device_common::check_launch("cuda_batchnorm", what); }

// ---- device helpers

using device_common::Chunk;
using device_common::load;
using device_common::store;
using device_common::Tag;

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

// Math of the elementwise passes: f64 beside f32 data, f32 beside 16-bit data.
template <typename T>
struct ApplyMathOf {
  using type = float;
};
template <>
struct ApplyMathOf<float> {
  using type = double;
};
template <typename T>
using ApplyMath = typename ApplyMathOf<T>::type;

// One rounding to the storage type, to nearest even.
template <typename T>
__device__ __forceinline__ T narrow(double v);
template <>
__device__ __forceinline__ float narrow<float>(double v) { return __double2float_rn(v); }
template <typename T>
__device__ __forceinline__ T narrow(float v);
template <>
__device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The block's two per-channel f64 sums, reduced over the block's rows (ty) in a fixed tree
// order, written by the first row of threads to out[c * 2 + {0, 1}].
template <int V>
__device__ void block_sums_to(const double (&s1)[V], const double (&s2)[V], double* out, int64_t C, int64_t c0) {
  extern __shared__ double shared[];
  const int tx = threadIdx.x, ty = threadIdx.y, width = blockDim.x * V, ty_count = blockDim.y;
  double* a = shared;
  double* b = shared + ty_count * width;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    a[ty * width + tx * V + j] = s1[j];
    b[ty * width + tx * V + j] = s2[j];
  }
  __syncthreads();
  for (int half = ty_count / 2; half > 0; half /= 2) {  // ty_count is a power of two
    if (ty < half) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        a[ty * width + tx * V + j] += a[(ty + half) * width + tx * V + j];
        b[ty * width + tx * V + j] += b[(ty + half) * width + tx * V + j];
      }
    }
    __syncthreads();
  }
  if (ty == 0 && c0 < C) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      out[(c0 + j) * 2] = a[tx * V + j];
      out[(c0 + j) * 2 + 1] = b[tx * V + j];
    }
  }
}

// Forward statistics: block (bx, by) sums (x - x[0, c]) and its square over rows
// [bx * rows_per_block, ...) for its channel slice into partials[bx][c][2].
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    forward_stats_kernel(const T* __restrict__ x, int64_t rows, int64_t C, int64_t rows_per_block,
                         double* __restrict__ partials) {
  const int ty = threadIdx.y, ty_count = blockDim.y;
  const int64_t c0 = (int64_t{blockIdx.y} * blockDim.x + threadIdx.x) * V;
  double s1[V], s2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) s1[j] = s2[j] = 0.0;
  if (c0 < C) {
    const Chunk<T, V> first = load<V>(x, c0);
    double shift[V];
#pragma unroll
    for (int j = 0; j < V; ++j) shift[j] = widen(first.v[j]);
    const int64_t begin = int64_t{blockIdx.x} * rows_per_block;
    const int64_t end = begin + rows_per_block < rows ? begin + rows_per_block : rows;
    for (int64_t r = begin + ty; r < end; r += int64_t{kRowsPerBatch} * ty_count) {
      Chunk<T, V> a[kRowsPerBatch];
#pragma unroll
      for (int u = 0; u < kRowsPerBatch; ++u)
        if (r + int64_t{u} * ty_count < end) a[u] = load<V>(x, (r + int64_t{u} * ty_count) * C + c0);
#pragma unroll
      for (int u = 0; u < kRowsPerBatch; ++u) {
        if (r + int64_t{u} * ty_count >= end) continue;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const double d = static_cast<double>(widen(a[u].v[j])) - shift[j];
          s1[j] += d;
          s2[j] = fma(d, d, s2[j]);
        }
      }
    }
  }
  block_sums_to<V>(s1, s2, partials + int64_t{blockIdx.x} * C * 2, C, c0);
}

// Backward statistics: sums of dy and dy * (x - saved_mean) per channel, as above.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    backward_stats_kernel(const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ mean,
                          int64_t rows, int64_t C, int64_t rows_per_block, double* __restrict__ partials) {
  const int ty = threadIdx.y, ty_count = blockDim.y;
  const int64_t c0 = (int64_t{blockIdx.y} * blockDim.x + threadIdx.x) * V;
  double s1[V], s2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) s1[j] = s2[j] = 0.0;
  if (c0 < C) {
    double m[V];
#pragma unroll
    for (int j = 0; j < V; ++j) m[j] = mean[c0 + j];
    const int64_t begin = int64_t{blockIdx.x} * rows_per_block;
    const int64_t end = begin + rows_per_block < rows ? begin + rows_per_block : rows;
    for (int64_t r = begin + ty; r < end; r += int64_t{kRowsPerBatch} * ty_count) {
      Chunk<T, V> a[kRowsPerBatch], g[kRowsPerBatch];
#pragma unroll
      for (int u = 0; u < kRowsPerBatch; ++u) {
        const int64_t ru = r + int64_t{u} * ty_count;
        if (ru < end) {
          a[u] = load<V>(x, ru * C + c0);
          g[u] = load<V>(dy, ru * C + c0);
        }
      }
#pragma unroll
      for (int u = 0; u < kRowsPerBatch; ++u) {
        if (r + int64_t{u} * ty_count >= end) continue;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const double gj = widen(g[u].v[j]);
          s1[j] += gj;
          s2[j] = fma(gj, static_cast<double>(widen(a[u].v[j])) - m[j], s2[j]);
        }
      }
    }
  }
  block_sums_to<V>(s1, s2, partials + int64_t{blockIdx.x} * C * 2, C, c0);
}

// Sums channel c's partials over the row blocks in a fixed order: 32 strided groups per channel,
// then a tree over the groups. Every thread of the block must call it; the total is valid in
// the threads with threadIdx.y == 0.
__device__ void sum_partials(const double* __restrict__ partials, int64_t row_blocks, int64_t C, int64_t c,
                             double* s1, double* s2) {
  __shared__ double a[kFinalY][kFinalX], b[kFinalY][kFinalX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  double x1 = 0.0, x2 = 0.0;
  if (c < C) {
#pragma unroll 4
    for (int64_t g = ty; g < row_blocks; g += kFinalY) {
      x1 += partials[(g * C + c) * 2];
      x2 += partials[(g * C + c) * 2 + 1];
    }
  }
  a[ty][tx] = x1;
  b[ty][tx] = x2;
  __syncthreads();
  for (int half = kFinalY / 2; half > 0; half /= 2) {
    if (ty < half) {
      a[ty][tx] += a[ty + half][tx];
      b[ty][tx] += b[ty + half][tx];
    }
    __syncthreads();
  }
  *s1 = a[0][tx];
  *s2 = b[0][tx];
}

template <typename T>
__global__ void __launch_bounds__(kFinalX * kFinalY)
    forward_finalize_kernel(const double* __restrict__ partials, int64_t row_blocks, int64_t rows, int64_t C,
                            const T* __restrict__ x, float* running_mean, float* running_var, float* saved_mean,
                            float* saved_invstd, double epsilon, double momentum) {
  const int64_t c = int64_t{blockIdx.x} * kFinalX + threadIdx.x;
  double s1 = 0.0, s2 = 0.0;
  sum_partials(partials, row_blocks, C, c, &s1, &s2);
  if (threadIdx.y != 0 || c >= C) return;
  const double m = static_cast<double>(rows);
  const double shift = widen(x[c]);
  const double d = s1 / m;  // mean - shift
  const double var = fmax((s2 - s1 * d) / m, 0.0);
  const double mean = shift + d;
  const double unbiased = rows > 1 ? var * m / (m - 1) : var;
  running_mean[c] = __double2float_rn((1 - momentum) * running_mean[c] + momentum * mean);
  running_var[c] = __double2float_rn((1 - momentum) * running_var[c] + momentum * unbiased);
  saved_mean[c] = __double2float_rn(mean);
  saved_invstd[c] = __double2float_rn(1.0 / sqrt(var + epsilon));
}

// Per channel for the backward's elementwise pass: coef[c] = gamma * invstd, coef[C + c] =
// mean(dy), coef[2C + c] = mean(dy * xhat).
__global__ void __launch_bounds__(kFinalX * kFinalY)
    backward_finalize_kernel(const double* __restrict__ partials, int64_t row_blocks, int64_t rows, int64_t C,
                             const float* __restrict__ gamma, const float* __restrict__ saved_invstd, float* dgamma,
                             float* dbeta, double* coef) {
  const int64_t c = int64_t{blockIdx.x} * kFinalX + threadIdx.x;
  double sum_dy = 0.0, sum_dy_xmu = 0.0;
  sum_partials(partials, row_blocks, C, c, &sum_dy, &sum_dy_xmu);
  if (threadIdx.y != 0 || c >= C) return;
  const double invstd = saved_invstd[c], m = static_cast<double>(rows);
  const double sum_dy_xhat = sum_dy_xmu * invstd;
  if (dgamma != nullptr) dgamma[c] = __double2float_rn(sum_dy_xhat);
  if (dbeta != nullptr) dbeta[c] = __double2float_rn(sum_dy);
  coef[c] = static_cast<double>(gamma[c]) * invstd;
  coef[C + c] = sum_dy / m;
  coef[2 * C + c] = sum_dy_xhat / m;
}

// y = (x - mean) * scale + beta; scale = gamma * invstd, with invstd given (training: the saved
// one) or, when invstd is null, 1 / sqrt(var + epsilon) (inference). Then, for a fused batch norm
// + ReLU, z added where not null and ReLU applied where `relu`, before the one rounding. Rows are
// grid-strided.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    forward_apply_kernel(const T* x, const T* z, T* y, bool relu, int64_t rows, int64_t C,
                         const float* __restrict__ mean, const float* __restrict__ invstd,
                         const float* __restrict__ var, double epsilon, const float* __restrict__ gamma,
                         const float* __restrict__ beta) {
  using A = ApplyMath<T>;
  const int64_t c0 = (int64_t{blockIdx.y} * blockDim.x + threadIdx.x) * V;
  if (c0 >= C) return;
  A m[V], s[V], b[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t c = c0 + j;
    const double inv = invstd != nullptr ? static_cast<double>(invstd[c]) : 1.0 / sqrt(var[c] + epsilon);
    m[j] = static_cast<A>(mean[c]);
    s[j] = static_cast<A>(gamma[c] * inv);
    b[j] = static_cast<A>(beta[c]);
  }
  const int64_t stride = int64_t{gridDim.x} * blockDim.y;
  for (int64_t r = int64_t{blockIdx.x} * blockDim.y + threadIdx.y; r < rows; r += kRowsPerBatch * stride) {
    Chunk<T, V> a[kRowsPerBatch], zz[kRowsPerBatch];
#pragma unroll
    for (int u = 0; u < kRowsPerBatch; ++u)
      if (r + u * stride < rows) {
        a[u] = load<V>(x, (r + u * stride) * C + c0);
        if (z != nullptr) zz[u] = load<V>(z, (r + u * stride) * C + c0);
      }
#pragma unroll
    for (int u = 0; u < kRowsPerBatch; ++u) {
      if (r + u * stride >= rows) continue;
      Chunk<T, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        A v = (static_cast<A>(widen(a[u].v[j])) - m[j]) * s[j] + b[j];
        if (z != nullptr) v += static_cast<A>(widen(zz[u].v[j]));
        if (relu) v = v > A(0) ? v : A(0);  // NaN -> 0, as the reference's ReLU
        o.v[j] = narrow<T>(v);
      }
      store<V>(y, (r + u * stride) * C + c0, o);
    }
  }
}

// dx (+)= k * (dy - mean(dy) - xhat * mean(dy * xhat)), xhat = (x - mean) * invstd.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    backward_apply_kernel(const T* x, const T* dy, T* dx, bool accumulate, int64_t rows, int64_t C,
                          const float* __restrict__ mean, const float* __restrict__ invstd,
                          const double* __restrict__ coef) {
  using A = ApplyMath<T>;
  const int64_t c0 = (int64_t{blockIdx.y} * blockDim.x + threadIdx.x) * V;
  if (c0 >= C) return;
  A m[V], inv[V], k[V], mdy[V], mdyx[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t c = c0 + j;
    m[j] = static_cast<A>(mean[c]);
    inv[j] = static_cast<A>(invstd[c]);
    k[j] = static_cast<A>(coef[c]);
    mdy[j] = static_cast<A>(coef[C + c]);
    mdyx[j] = static_cast<A>(coef[2 * C + c]);
  }
  const int64_t stride = int64_t{gridDim.x} * blockDim.y;
  for (int64_t r = int64_t{blockIdx.x} * blockDim.y + threadIdx.y; r < rows; r += kRowsPerBatch * stride) {
    Chunk<T, V> a[kRowsPerBatch], g[kRowsPerBatch], d[kRowsPerBatch];
#pragma unroll
    for (int u = 0; u < kRowsPerBatch; ++u) {
      const int64_t i = (r + u * stride) * C + c0;
      if (r + u * stride < rows) {
        a[u] = load<V>(x, i);
        g[u] = load<V>(dy, i);
        if (accumulate) d[u] = load<V>(dx, i);
      }
    }
#pragma unroll
    for (int u = 0; u < kRowsPerBatch; ++u) {
      if (r + u * stride >= rows) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A xhat = (static_cast<A>(widen(a[u].v[j])) - m[j]) * inv[j];
        const A v = k[j] * (static_cast<A>(widen(g[u].v[j])) - mdy[j] - xhat * mdyx[j]);
        d[u].v[j] = narrow<T>(accumulate ? static_cast<A>(widen(d[u].v[j])) + v : v);
      }
      store<V>(dx, (r + u * stride) * C + c0, d[u]);
    }
  }
}

// ---- host side: launch shapes (a function of the shape, dtype, alignment and SM count only)

struct Tile {
  int vec = 1;  // channels per thread
  dim3 block;   // (tx, ty)
  unsigned channel_blocks = 1;
};

int64_t stats_row_blocks(int64_t rows, int64_t C) {
  const int64_t groups = ceil_div(C, kChannelsPerBlockEstimate);
  const int64_t target = std::max<int64_t>(1, int64_t{cuda_pointwise::sm_count()} * kStatsBlocksPerSm / groups);
  const int64_t blocks = std::clamp<int64_t>(std::min(target, ceil_div(rows, kMinRowsPerBlock)), 1, 1 << 30);
  return ceil_div(rows, ceil_div(rows, blocks));  // no empty block
}

int64_t partials_bytes(int64_t rows, int64_t C) { return align256(stats_row_blocks(rows, C) * C * 2 * 8); }

bool aligned(const void* p, int64_t bytes) { return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// The widest vector (16 bytes at most) that divides C and suits every pointer's alignment.
template <typename T>
Tile tile_for(int64_t C, std::initializer_list<const void*> pointers) {
  int vec = static_cast<int>(16 / sizeof(T));
  while (vec > 1) {
    bool ok = C % vec == 0;
    for (const void* p : pointers) ok = ok && aligned(p, vec * static_cast<int64_t>(sizeof(T)));
    if (ok) break;
    vec /= 2;
  }
  int tx = 1;
  while (tx < kMaxTx && tx * int64_t{vec} < C) tx *= 2;
  Tile t;
  t.vec = vec;
  t.block = dim3(static_cast<unsigned>(tx), static_cast<unsigned>(kThreads / tx));
  const int64_t channel_blocks = ceil_div(C, int64_t{tx} * vec);
  if (channel_blocks > 65535)
    throw Unsupported("cuda batch norm: " + std::to_string(C) + " channels exceed the kernels' grid");
  t.channel_blocks = static_cast<unsigned>(channel_blocks);
  return t;
}

unsigned apply_row_blocks(const Tile& t, int64_t rows) {
  const int64_t by_work = ceil_div(rows, int64_t{t.block.y} * kRowsPerBatch);
  const int64_t cap = std::max<int64_t>(1, int64_t{cuda_pointwise::sm_count()} * kApplyBlocksPerSm / t.channel_blocks);
  return static_cast<unsigned>(std::clamp<int64_t>(std::min(by_work, cap), 1, int64_t{1} << 30));
}

std::size_t stats_shared_bytes(const Tile& t) { return std::size_t{2} * kThreads * t.vec * sizeof(double); }

// Calls f(Tag<T>{}) for the storage type of t (no f64: the statistics kernels are f32/16-bit).
template <typename F>
void dispatch(DType t, const char* what, F&& f) {
  device_common::dispatch_storage<false>(t, "cuda batch norm", what, std::forward<F>(f));
}

// Calls f(std::integral_constant<int, V>{}) for the tile's vector width.
template <typename T, typename F>
void with_vec(int vec, F&& f) {
  switch (vec) {
    case 8:
      if constexpr (sizeof(T) == 2) return f(std::integral_constant<int, 8>{});
      break;
    case 4: return f(std::integral_constant<int, 4>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: break;
  }
  f(std::integral_constant<int, 1>{});
}

void require_scratch(const char* what, int64_t rows, int64_t C, int64_t have) {
  const int64_t need = scratch_bytes(rows, C);
  if (have < need)
    throw Error(std::string("cuda batch norm ") + what + ": scratch of " + std::to_string(have) + " bytes, [" +
                std::to_string(rows) + ", " + std::to_string(C) + "] needs " + std::to_string(need));
}

}  // namespace

std::int64_t scratch_bytes(std::int64_t rows, std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return 0;
  return partials_bytes(rows, channels) + 3 * channels * 8;
}

void forward_training(cudaStream_t stream, DType t, const void* x, void* y, std::int64_t rows, std::int64_t channels,
                      const float* gamma, const float* beta, float* running_mean, float* running_var,
                      float* saved_mean, float* saved_invstd, double epsilon, double momentum, void* scratch,
                      std::int64_t scratch_size, const void* z, bool relu) {
  if (rows <= 0 || channels <= 0) return;
  require_scratch("forward_training", rows, channels, scratch_size);
  dispatch(t, "forward_training", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Tile tile = tile_for<T>(channels, {x, y, z});
    const int64_t row_blocks = stats_row_blocks(rows, channels);
    const int64_t rows_per_block = ceil_div(rows, row_blocks);
    auto* partials = static_cast<double*>(scratch);
    with_vec<T>(tile.vec, [&](auto v) {
      constexpr int V = decltype(v)::value;
      forward_stats_kernel<T, V>
          <<<dim3(static_cast<unsigned>(row_blocks), tile.channel_blocks), tile.block, stats_shared_bytes(tile),
             stream>>>(static_cast<const T*>(x), rows, channels, rows_per_block, partials);
      check_launch("forward statistics");
      forward_finalize_kernel<T><<<static_cast<unsigned>(ceil_div(channels, kFinalX)), dim3(kFinalX, kFinalY), 0,
                                   stream>>>(partials, row_blocks, rows, channels, static_cast<const T*>(x),
                                             running_mean, running_var, saved_mean, saved_invstd, epsilon, momentum);
      check_launch("forward finalize");
      forward_apply_kernel<T, V><<<dim3(apply_row_blocks(tile, rows), tile.channel_blocks), tile.block, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(z), static_cast<T*>(y), relu, rows, channels, saved_mean,
          saved_invstd, nullptr, 0.0, gamma, beta);
      check_launch("forward apply");
    });
  });
}

void forward_inference(cudaStream_t stream, DType t, const void* x, void* y, std::int64_t rows,
                       std::int64_t channels, const float* gamma, const float* beta, const float* running_mean,
                       const float* running_var, double epsilon) {
  if (rows <= 0 || channels <= 0) return;
  dispatch(t, "forward_inference", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Tile tile = tile_for<T>(channels, {x, y});
    with_vec<T>(tile.vec, [&](auto v) {
      constexpr int V = decltype(v)::value;
      forward_apply_kernel<T, V><<<dim3(apply_row_blocks(tile, rows), tile.channel_blocks), tile.block, 0, stream>>>(
          static_cast<const T*>(x), nullptr, static_cast<T*>(y), false, rows, channels, running_mean, nullptr,
          running_var, epsilon, gamma, beta);
      check_launch("inference");
    });
  });
}

void backward(cudaStream_t stream, DType t, const void* x, const void* dy, void* dx, bool accumulate,
              std::int64_t rows, std::int64_t channels, const float* gamma, const float* saved_mean,
              const float* saved_invstd, float* dgamma, float* dbeta, void* scratch, std::int64_t scratch_size) {
  if (rows <= 0 || channels <= 0) return;
  require_scratch("backward", rows, channels, scratch_size);
  dispatch(t, "backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Tile tile = tile_for<T>(channels, {x, dy, dx});
    const int64_t row_blocks = stats_row_blocks(rows, channels);
    const int64_t rows_per_block = ceil_div(rows, row_blocks);
    auto* partials = static_cast<double*>(scratch);
    auto* coef = reinterpret_cast<double*>(static_cast<unsigned char*>(scratch) + partials_bytes(rows, channels));
    with_vec<T>(tile.vec, [&](auto v) {
      constexpr int V = decltype(v)::value;
      backward_stats_kernel<T, V>
          <<<dim3(static_cast<unsigned>(row_blocks), tile.channel_blocks), tile.block, stats_shared_bytes(tile),
             stream>>>(static_cast<const T*>(x), static_cast<const T*>(dy), saved_mean, rows, channels,
                       rows_per_block, partials);
      check_launch("backward statistics");
      backward_finalize_kernel<<<static_cast<unsigned>(ceil_div(channels, kFinalX)), dim3(kFinalX, kFinalY), 0,
                                 stream>>>(partials, row_blocks, rows, channels, gamma, saved_invstd, dgamma, dbeta,
                                           coef);
      check_launch("backward finalize");
      if (dx == nullptr) return;
      backward_apply_kernel<T, V><<<dim3(apply_row_blocks(tile, rows), tile.channel_blocks), tile.block, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), accumulate, rows, channels,
          saved_mean, saved_invstd, coef);
      check_launch("backward apply");
    });
  });
}

}  // namespace ab::nn::cuda_batchnorm
