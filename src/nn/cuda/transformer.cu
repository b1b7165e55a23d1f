// The transformer family's row kernels (transformer.h): token + position embedding both ways
// (backward deterministic through a stable radix sort), LayerNorm both ways (forward: rows in
// registers or a warp per row; 16-byte loads, f32 statistics, dgamma/dbeta by a two-stage
// fixed-order reduction) and GELU.
#include <cub/device/device_radix_sort.cuh>

#include <cmath>
#include <string>

#include "core/error.h"
#include "nn/cuda/transformer_common.cuh"

namespace ab::nn::cuda_transformer {
namespace {

// ---- embedding

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(const int32_t* tokens, const T* wte, const T* wpe, T* y, int64_t rows, int64_t seq,
                             int64_t channels, int64_t vocab) {
  const int64_t per_row = channels / V, total = rows * per_row;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / per_row, c = (i % per_row) * V;
    const int32_t id = tokens[r];
    Chunk<T, V> out;
    if (id < 0 || id >= vocab) {
#pragma unroll
      for (int j = 0; j < V; ++j) out.v[j] = from_f32<T>(__int_as_float(0x7fc00000));
    } else {
      const auto a = load<V>(wte, id * channels + c);
      const auto b = load<V>(wpe, (r % seq) * channels + c);
#pragma unroll
      for (int j = 0; j < V; ++j) out.v[j] = from_f32<T>(to_f32(a.v[j]) + to_f32(b.v[j]));
    }
    store<V>(y, r * channels + c, out);
  }
}

// Runs of one token longer than this many rows are summed in segments of it first.
constexpr int64_t kSegment = 32;

// Sort keys (tokens; vocab for one outside the vocabulary, which sorts last and is never summed)
// and values (row numbers).
__global__ void embedding_keys_kernel(const int32_t* tokens, std::uint32_t* keys, std::uint32_t* rows_of, int64_t rows,
                                      int64_t vocab) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  const int32_t id = tokens[i];
  keys[i] = id >= 0 && id < vocab ? static_cast<std::uint32_t>(id) : static_cast<std::uint32_t>(vocab);
  rows_of[i] = static_cast<std::uint32_t>(i);
}

// The partial slot of the segment starting at sorted position p of a run starting at lo: a window
// of kSegment positions holds at most one run start and one mid-run start of runs longer than
// kSegment, so (window, which) is unique.
__device__ __forceinline__ int64_t segment_slot(int64_t p, int64_t lo) {
  return 2 * (p / kSegment) + (p == lo ? 0 : 1);
}

// Adds rows sorted_rows[first, last) of dy (channels [c, c + V)) to acc, in order.
template <typename T, int V>
__device__ __forceinline__ void add_rows(float (&acc)[V], const T* dy, const std::uint32_t* sorted_rows, int64_t first,
                                         int64_t last, int64_t channels, int64_t c) {
  for (int64_t p = first; p < last; ++p) {
    const auto g = load<V>(dy, int64_t{sorted_rows[p]} * channels + c);
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] += to_f32(g.v[j]);
  }
}

// Stage 1, a warp per sorted position p: where p starts a segment of a long run, the f32 sum of the
// segment's dy rows into its partial slot.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    embedding_segments_kernel(const T* dy, const std::uint32_t* keys, const std::uint32_t* sorted_rows, float* partials,
                              int64_t rows, int64_t channels, std::uint32_t vocab) {
  const int64_t p = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (p >= rows || keys[p] >= vocab) return;
  const int64_t lo = lower_bound(keys, rows, keys[p]), hi = lower_bound(keys, rows, keys[p] + 1);
  if (hi - lo <= kSegment || (p - lo) % kSegment != 0) return;
  float* out = partials + segment_slot(p, lo) * channels;
  for (int64_t c = int64_t{lane} * V; c < channels; c += 32 * V) {
    float acc[V] = {};
    add_rows<T, V>(acc, dy, sorted_rows, p, std::min(p + kSegment, hi), channels, c);
#pragma unroll
    for (int j = 0; j < V; ++j) out[c + j] = acc[j];
  }
}

// Stage 2, a warp per vocabulary row: its dy rows (short run) or its segments' partials (long
// run) summed in order onto the old row (accumulate) or zero. Untouched rows are zeroed or left.
template <typename T, typename G, int V>
__global__ void __launch_bounds__(kThreads)
    embedding_wte_kernel(const T* dy, const std::uint32_t* keys, const std::uint32_t* sorted_rows,
                         const float* partials, G* dwte, bool accumulate, int64_t rows, int64_t channels,
                         std::uint32_t vocab) {
  const int64_t token = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (token >= vocab) return;
  const auto key = static_cast<std::uint32_t>(token);
  const int64_t lo = lower_bound(keys, rows, key), hi = lower_bound(keys, rows, key + 1);
  if (lo == hi && accumulate) return;
  G* out = dwte + token * channels;
  for (int64_t c = int64_t{lane} * V; c < channels; c += 32 * V) {
    float acc[V] = {};
    if (accumulate) {
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = to_f32(out[c + j]);
    }
    if (hi - lo <= kSegment) {
      add_rows<T, V>(acc, dy, sorted_rows, lo, hi, channels, c);
    } else {
      for (int64_t p = lo; p < hi; p += kSegment) {
        const float* part = partials + segment_slot(p, lo) * channels + c;
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += part[j];
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) out[c + j] = from_f32<G>(acc[j]);
  }
}

// dwpe[t] = sum over b of dy[b * seq + t], b in order; positions past seq are zero.
template <typename T, typename G, int V>
__global__ void __launch_bounds__(kThreads)
    embedding_wpe_kernel(const T* dy, G* dwpe, int64_t rows, int64_t seq, int64_t channels, int64_t positions) {
  const int64_t per_row = channels / V, total = positions * per_row;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / per_row, c = (i % per_row) * V;
    float acc[V] = {};
    for (int64_t r = t; t < seq && r < rows; r += seq) {
      const auto g = load<V>(dy, r * channels + c);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += to_f32(g.v[j]);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) dwpe[t * channels + c + j] = from_f32<G>(acc[j]);
  }
}

// ---- LayerNorm. Forward: rows up to 32 x 8 vectors in registers (layernorm_forward_rows_kernel),
// wider rows a warp per row, read again from L1 for each pass. kRms: RMSNorm (no mean subtracted,
// no beta; mean and beta unused).

// y[c .. c + V) of a row: (x - mu) * inv * gamma + beta (RMSNorm: no beta).
template <bool kRms, typename T, typename P, int V>
__device__ __forceinline__ void store_normalised(const Chunk<T, V>& a, const P* gamma, const P* beta, T* y_row,
                                                 int64_t c, float mu, float inv) {
  const auto g = load<V>(gamma, c);
  Chunk<P, V> b{};
  if constexpr (!kRms) b = load<V>(beta, c);
  Chunk<T, V> out;
#pragma unroll
  for (int j = 0; j < V; ++j)
    out.v[j] = from_f32<T>((to_f32(a.v[j]) - mu) * inv * to_f32(g.v[j]) + (kRms ? 0.0f : to_f32(b.v[j])));
  store<V>(y_row, c, out);
}

template <typename T, typename P, int V, bool kRms>
__global__ void __launch_bounds__(kThreads)
    layernorm_forward_kernel(const T* x, const P* gamma, const P* beta, T* y, float* mean, float* rstd, int64_t rows,
                             int64_t channels, float epsilon) {
  const int64_t r = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const T* xr = x + r * channels;
  float sum = 0.0f;
  if constexpr (!kRms)
    for (int64_t c = int64_t{lane} * V; c < channels; c += 32 * V) {
      const auto a = load<V>(xr, c);
#pragma unroll
      for (int j = 0; j < V; ++j) sum += to_f32(a.v[j]);
    }
  const float mu = kRms ? 0.0f : warp_sum(sum) / static_cast<float>(channels);
  float squares = 0.0f;
  for (int64_t c = int64_t{lane} * V; c < channels; c += 32 * V) {
    const auto a = load<V>(xr, c);
#pragma unroll
    for (int j = 0; j < V; ++j) squares += (to_f32(a.v[j]) - mu) * (to_f32(a.v[j]) - mu);
  }
  const float inv = 1.0f / sqrtf(warp_sum(squares) / static_cast<float>(channels) + epsilon);
  if (lane == 0) {
    if constexpr (!kRms) mean[r] = mu;
    rstd[r] = inv;
  }
  for (int64_t c = int64_t{lane} * V; c < channels; c += 32 * V)
    store_normalised<kRms>(load<V>(xr, c), gamma, beta, y + r * channels, c, mu, inv);
}

// Rows that fit in registers: a group of `lanes` lanes (a power of 2, at most 32) per row, each
// holding K vectors of V channels (vector k of lane l at channel (k * lanes + l) * V), loaded at
// once; the statistics are group butterflies over registers, so the row is read once and no lane
// of a small row idles (C = 96 at 8 halves per vector: 4 lanes of 3 vectors, 8 rows per warp).
template <typename T, typename P, int V, int K, bool kRms>
__global__ void __launch_bounds__(kThreads)
    layernorm_forward_rows_kernel(const T* x, const P* gamma, const P* beta, T* y, float* mean, float* rstd,
                                  int64_t rows, int64_t channels, int lanes, float epsilon) {
  const int lane = threadIdx.x & (lanes - 1);
  const int64_t r = int64_t{blockIdx.x} * (blockDim.x / lanes) + threadIdx.x / lanes;
  // Every lane stays to the butterflies (full-warp shuffles); rows past the end only compute.
  const bool live = r < rows;
  const T* xr = x + (live ? r : 0) * channels;
  Chunk<T, V> a[K];
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t c = (int64_t{k} * lanes + lane) * V;
    a[k] = c < channels ? load<V>(xr, c) : Chunk<T, V>{};
#pragma unroll
    for (int j = 0; j < V; ++j) sum += to_f32(a[k].v[j]);
  }
  const auto group_sum = [lanes](float v) {
    for (int offset = lanes / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
  };
  const float mu = kRms ? 0.0f : group_sum(sum) / static_cast<float>(channels);
  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if ((int64_t{k} * lanes + lane) * V < channels)
#pragma unroll
      for (int j = 0; j < V; ++j) squares += (to_f32(a[k].v[j]) - mu) * (to_f32(a[k].v[j]) - mu);
  const float inv = 1.0f / sqrtf(group_sum(squares) / static_cast<float>(channels) + epsilon);
  if (!live) return;
  if (lane == 0) {
    if constexpr (!kRms) mean[r] = mu;
    rstd[r] = inv;
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t c = (int64_t{k} * lanes + lane) * V;
    if (c >= channels) break;
    store_normalised<kRms>(a[k], gamma, beta, y + r * channels, c, mu, inv);
  }
}

// The register kernel's shape for C channels in vectors of V: the fewest lanes (4 to 32) whose K
// vectors each hold the row, K one of the instantiated counts; lanes 0 where the row is too wide.
struct RowsShape {
  int lanes = 0, vectors = 0;
};
constexpr int kRowVectors[] = {1, 2, 3, 4, 6, 8};
RowsShape rows_shape(int64_t channels, int v) {
  const int64_t chunks = (channels + v - 1) / v;
  for (int lanes = 4; lanes <= 32; lanes *= 2)
    for (int k : kRowVectors)
      if (chunks <= int64_t{lanes} * k) return {lanes, k};
  return {};
}

// Shared memory the backward pass's per-warp channel sums may take (the static default).
constexpr int64_t kLayerNormSmemBytes = 48 * 1024;
int layernorm_warps(int64_t channels) {
  return static_cast<int>(std::clamp<int64_t>(kLayerNormSmemBytes / (8 * channels), 0, kThreads / 32));
}
int layernorm_grid(int64_t rows, int warps) {
  const int64_t needed = (rows + warps - 1) / warps;
  return static_cast<int>(std::clamp<int64_t>(needed, 1, int64_t{cuda_pointwise::sm_count()} * 4));
}

// Where channel j of the V-vector at c keeps its sum in a warp's shared memory: [j][c / V], so the
// lanes of one access (consecutive c / V) hit consecutive banks.
template <int V>
__device__ __forceinline__ int64_t sum_slot(int64_t c, int j, int64_t channels) {
  return j * (channels / V) + c / V;
}

// Stage 1: dx per row (warp per row, rows grid-strided), and each warp's sums of dy * xhat and dy
// per channel in shared memory (each lane owns its channels: no atomics); the block then writes the
// sums over its warps, in warp order, to partials[block][2C]. kRms: RMSNorm (no mean term).
template <typename T, typename P, int V, bool kRms>
__global__ void __launch_bounds__(kThreads)
    layernorm_backward_kernel(const T* x, const T* dy, const P* gamma, const float* mean, const float* rstd, T* dx,
                              bool accumulate, float* partials, int64_t rows, int64_t channels) {
  extern __shared__ float sums[];  // [warps][2C]: dgamma then dbeta
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* mine = sums + int64_t{warp} * 2 * channels;
  for (int64_t c = int64_t{lane} * V; c < channels; c += 32 * V)
#pragma unroll
    for (int j = 0; j < V; ++j) mine[sum_slot<V>(c, j, channels)] = mine[channels + sum_slot<V>(c, j, channels)] = 0.0f;
  const auto n = static_cast<float>(channels);
  for (int64_t r = int64_t{blockIdx.x} * warps + warp; r < rows; r += int64_t{gridDim.x} * warps) {
    const float mu = kRms ? 0.0f : mean[r], inv = rstd[r];
    const T* xr = x + r * channels;
    const T* dyr = dy + r * channels;
    float g_sum = 0.0f, gx_sum = 0.0f;
    for (int64_t c = int64_t{lane} * V; c < channels; c += 32 * V) {
      const auto a = load<V>(xr, c), d = load<V>(dyr, c);
      const auto g = load<V>(gamma, c);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float gj = to_f32(d.v[j]) * to_f32(g.v[j]);
        g_sum += gj;
        gx_sum += gj * (to_f32(a.v[j]) - mu) * inv;
      }
    }
    const float g_mean = kRms ? 0.0f : warp_sum(g_sum) / n, gx_mean = warp_sum(gx_sum) / n;
    for (int64_t c = int64_t{lane} * V; c < channels; c += 32 * V) {
      const auto a = load<V>(xr, c), d = load<V>(dyr, c);
      const auto g = load<V>(gamma, c);
      Chunk<T, V> out;
      if (accumulate) out = load<V>(dx + r * channels, c);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float xhat = (to_f32(a.v[j]) - mu) * inv, dj = to_f32(d.v[j]);
        const float v = inv * (dj * to_f32(g.v[j]) - g_mean - xhat * gx_mean);
        out.v[j] = from_f32<T>(accumulate ? to_f32(out.v[j]) + v : v);
        mine[sum_slot<V>(c, j, channels)] += dj * xhat;
        mine[channels + sum_slot<V>(c, j, channels)] += dj;
      }
      store<V>(dx + r * channels, c, out);
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < 2 * channels; i += blockDim.x) {
    const int64_t ch = i % channels, at = i - ch + sum_slot<V>(ch - ch % V, static_cast<int>(ch % V), channels);
    float s = 0.0f;
    for (int w = 0; w < warps; ++w) s += sums[int64_t{w} * 2 * channels + at];
    partials[int64_t{blockIdx.x} * 2 * channels + i] = s;
  }
}

// Stage 2: a 32 x 32 block per 32 of the 2C sums: thread (ty, tx) sums blocks ty, ty + 32, ... of
// column tx, then the 32 values are summed in ty order. dbeta null (RMSNorm): the first C only.
template <typename P>
__global__ void __launch_bounds__(1024)
    layernorm_params_kernel(const float* partials, int blocks, int64_t channels, P* dgamma, P* dbeta) {
  __shared__ float column[32][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t i = int64_t{blockIdx.x} * 32 + tx;
  float s = 0.0f;
  if (i < 2 * channels)
    for (int b = ty; b < blocks; b += 32) s += partials[int64_t{b} * 2 * channels + i];
  column[ty][tx] = s;
  __syncthreads();
  if (ty != 0 || i >= 2 * channels) return;
  float total = 0.0f;
  for (int k = 0; k < 32; ++k) total += column[k][tx];
  if (i < channels) dgamma[i] = from_f32<P>(total);
  else if (dbeta != nullptr) dbeta[i - channels] = from_f32<P>(total);
}

// ---- GELU, tanh form

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) gelu_forward_kernel(const T* x, T* y, int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x * V;
  for (int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    const auto a = load<V>(x, i);
    Chunk<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float v = to_f32(a.v[j]);
      out.v[j] = from_f32<T>(0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v))));
    }
    store<V>(y, i, out);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    gelu_backward_kernel(const T* x, const T* dy, T* dx, int64_t n, bool accumulate) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x * V;
  for (int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    const auto a = load<V>(x, i), d = load<V>(dy, i);
    Chunk<T, V> out;
    if (accumulate) out = load<V>(dx, i);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float v = to_f32(a.v[j]);
      const float th = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
      const float slope =
          0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
      const float g = to_f32(d.v[j]) * slope;
      out.v[j] = from_f32<T>(accumulate ? to_f32(out.v[j]) + g : g);
    }
    store<V>(dx, i, out);
  }
}

}  // namespace

void embedding_forward(cudaStream_t stream, DType t, const int32_t* tokens, const void* wte, const void* wpe, void* y,
                       int64_t rows, int64_t seq, int64_t channels, int64_t vocab) {
  if (rows == 0) return;
  dispatch(t, "embedding_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vector_ok = channels % vec_of<T>() == 0 && aligned(wte, 16) && aligned(wpe, 16) && aligned(y, 16);
    with_width<T>(vector_ok, [&]<int V>() {
      embedding_forward_kernel<T, V><<<blocks_for(rows * channels / V), kThreads, 0, stream>>>(
          tokens, static_cast<const T*>(wte), static_cast<const T*>(wpe), static_cast<T*>(y), rows, seq, channels,
          vocab);
    });
  });
  check_launch("embedding_forward");
}

namespace {

// The embedding backward's scratch: sort keys and values in and out, the long runs' partials,
// then CUB's temporary storage.
struct EmbeddingScratch {
  std::uint32_t *keys, *rows_of, *sorted_keys, *sorted_rows;
  float* partials;
  void* cub;
  std::size_t cub_bytes;
  int64_t total;
};

// The key bits the sort looks at: enough for vocab itself (the key of a token outside it).
int key_bits(int64_t vocab) {
  return std::max(1, static_cast<int>(std::ceil(std::log2(static_cast<double>(vocab) + 1.0))));
}

std::size_t cub_sort_bytes(int64_t rows, int64_t vocab) {
  std::size_t bytes = 0;
  AB_CUDA(
      cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const std::uint32_t*>(nullptr),
                                      static_cast<std::uint32_t*>(nullptr), static_cast<const std::uint32_t*>(nullptr),
                                      static_cast<std::uint32_t*>(nullptr), static_cast<int>(rows), 0, key_bits(vocab)),
      "cub radix sort size query");
  return bytes;
}

EmbeddingScratch embedding_scratch(void* base, int64_t rows, int64_t channels, int64_t vocab) {
  const auto up = [](int64_t b) { return (b + 255) / 256 * 256; };
  const int64_t ids = up(rows * 4), parts = up(2 * ((rows + kSegment - 1) / kSegment) * channels * 4);
  const auto at = [base](int64_t offset) {  // address arithmetic: base may be null (a size query)
    return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(base) + static_cast<std::uintptr_t>(offset));
  };
  EmbeddingScratch s{};
  s.keys = static_cast<std::uint32_t*>(at(0));
  s.rows_of = static_cast<std::uint32_t*>(at(ids));
  s.sorted_keys = static_cast<std::uint32_t*>(at(2 * ids));
  s.sorted_rows = static_cast<std::uint32_t*>(at(3 * ids));
  s.partials = static_cast<float*>(at(4 * ids));
  s.cub = at(4 * ids + parts);
  s.cub_bytes = cub_sort_bytes(rows, vocab);
  s.total = 4 * ids + parts + up(static_cast<int64_t>(s.cub_bytes));
  return s;
}

}  // namespace

int64_t embedding_backward_scratch_bytes(int64_t rows, int64_t channels, int64_t vocab) {
  return embedding_scratch(nullptr, rows, channels, vocab).total;
}

void embedding_backward(cudaStream_t stream, DType dy_t, const void* dy, DType grad_t, const int32_t* tokens,
                        void* dwte, bool accumulate_wte, void* dwpe, int64_t rows, int64_t seq, int64_t channels,
                        int64_t vocab, int64_t positions, void* scratch, int64_t scratch_bytes) {
  const EmbeddingScratch s = embedding_scratch(scratch, rows, channels, vocab);
  if (s.total > scratch_bytes) throw Error("internal: embedding_backward scratch too small");
  if (rows > 0) {
    embedding_keys_kernel<<<static_cast<int>((rows + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        tokens, s.keys, s.rows_of, rows, vocab);
    check_launch("embedding_backward keys");
    std::size_t cub_bytes = s.cub_bytes;
    AB_CUDA_LAZY(cub::DeviceRadixSort::SortPairs(s.cub, cub_bytes, s.keys, s.sorted_keys, s.rows_of, s.sorted_rows,
                                                 static_cast<int>(rows), 0, key_bits(vocab), stream),
                 "cuda_transformer embedding_backward radix sort");
  }
  const auto vocab32 = static_cast<std::uint32_t>(vocab);
  dispatch(dy_t, "embedding_backward", [&](auto dy_tag) {
    using T = typename decltype(dy_tag)::type;
    dispatch(grad_t, "embedding_backward", [&](auto grad_tag) {
      using G = typename decltype(grad_tag)::type;
      const bool vector_ok = channels % vec_of<T>() == 0 && aligned(dy, 16);
      with_width<T>(vector_ok, [&]<int V>() {
        const auto* d = static_cast<const T*>(dy);
        if (rows > 0) {
          embedding_segments_kernel<T, V>
              <<<static_cast<int>((rows * 32 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
                  d, s.sorted_keys, s.sorted_rows, s.partials, rows, channels, vocab32);
        }
        embedding_wte_kernel<T, G, V>
            <<<static_cast<int>((vocab * 32 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
                d, s.sorted_keys, s.sorted_rows, s.partials, static_cast<G*>(dwte), accumulate_wte, rows, channels,
                vocab32);
        embedding_wpe_kernel<T, G, V><<<blocks_for(positions * channels / V), kThreads, 0, stream>>>(
            d, static_cast<G*>(dwpe), rows, seq, channels, positions);
      });
    });
  });
  check_launch("embedding_backward");
}

void layernorm_forward(cudaStream_t stream, DType t, DType param_t, const void* x, const void* gamma, const void* beta,
                       void* y, float* mean, float* rstd, int64_t rows, int64_t channels, double epsilon) {
  if (rows == 0) return;
  dispatch(t, "layernorm_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch(param_t, "layernorm_forward", [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      if constexpr (std::is_same_v<P, float> || std::is_same_v<P, T>) {
        const bool rms = mean == nullptr;
        const bool vector_ok = channels % vec_of<T>() == 0 && aligned(x, 16) && aligned(y, 16) && aligned(gamma, 32) &&
                               (rms || aligned(beta, 32));
        with_width<T>(vector_ok, [&]<int V>() {
          const RowsShape shape = rows_shape(channels, V);
          if (shape.lanes > 0) {
            const int64_t per_block = kThreads / shape.lanes;
            const auto launch = [&]<int K>() {
              const auto kernel = rms ? layernorm_forward_rows_kernel<T, P, V, K, true>
                                      : layernorm_forward_rows_kernel<T, P, V, K, false>;
              kernel<<<static_cast<int>((rows + per_block - 1) / per_block), kThreads, 0, stream>>>(
                  static_cast<const T*>(x), static_cast<const P*>(gamma), static_cast<const P*>(beta),
                  static_cast<T*>(y), mean, rstd, rows, channels, shape.lanes, static_cast<float>(epsilon));
            };
            switch (shape.vectors) {
              case 1: return launch.template operator()<1>();
              case 2: return launch.template operator()<2>();
              case 3: return launch.template operator()<3>();
              case 4: return launch.template operator()<4>();
              case 6: return launch.template operator()<6>();
              default: return launch.template operator()<8>();
            }
          }
          const auto launch = [&](auto kernel) {
            kernel<<<static_cast<int>((rows + 7) / 8), kThreads, 0, stream>>>(
                static_cast<const T*>(x), static_cast<const P*>(gamma), static_cast<const P*>(beta), static_cast<T*>(y),
                mean, rstd, rows, channels, static_cast<float>(epsilon));
          };
          if (rms) launch(layernorm_forward_kernel<T, P, V, true>);
          else launch(layernorm_forward_kernel<T, P, V, false>);
        });
      } else {
        throw Unsupported("cuda_transformer layernorm_forward: gamma and beta must be f32 or x's dtype");
      }
    });
  });
  check_launch("layernorm_forward");
}

int64_t layernorm_max_channels() { return kLayerNormSmemBytes / 8; }

int64_t layernorm_backward_scratch_bytes(int64_t rows, int64_t channels) {
  const int warps = std::max(layernorm_warps(channels), 1);
  return int64_t{layernorm_grid(rows, warps)} * 2 * channels * 4;
}

void layernorm_backward(cudaStream_t stream, DType t, DType param_t, const void* x, const void* dy, const void* gamma,
                        const float* mean, const float* rstd, void* dx, bool accumulate, void* dgamma, void* dbeta,
                        int64_t rows, int64_t channels, float* scratch) {
  const int warps = layernorm_warps(channels);
  if (warps < 1)
    throw Unsupported("cuda_transformer layernorm_backward: C above " + std::to_string(layernorm_max_channels()));
  const int grid = layernorm_grid(rows, warps);
  dispatch(t, "layernorm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch(param_t, "layernorm_backward", [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      if constexpr (std::is_same_v<P, float> || std::is_same_v<P, T>) {
        const bool vector_ok =
            channels % vec_of<T>() == 0 && aligned(x, 16) && aligned(dy, 16) && aligned(dx, 16) && aligned(gamma, 32);
        with_width<T>(vector_ok, [&]<int V>() {
          const auto smem = static_cast<std::size_t>(warps) * 2 * static_cast<std::size_t>(channels) * 4;
          const auto launch = [&](auto kernel) {
            kernel<<<grid, warps * 32, smem, stream>>>(static_cast<const T*>(x), static_cast<const T*>(dy),
                                                       static_cast<const P*>(gamma), mean, rstd, static_cast<T*>(dx),
                                                       accumulate, scratch, rows, channels);
          };
          if (mean == nullptr) launch(layernorm_backward_kernel<T, P, V, true>);
          else launch(layernorm_backward_kernel<T, P, V, false>);
        });
        layernorm_params_kernel<P><<<static_cast<int>((2 * channels + 31) / 32), 1024, 0, stream>>>(
            scratch, grid, channels, static_cast<P*>(dgamma), static_cast<P*>(dbeta));
      } else {
        throw Unsupported("cuda_transformer layernorm_backward: gamma and its gradients must be f32 or x's dtype");
      }
    });
  });
  check_launch("layernorm_backward");
}

void gelu_forward(cudaStream_t stream, DType t, const void* x, void* y, int64_t n) {
  if (n == 0) return;
  dispatch(t, "gelu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_width<T>(n % vec_of<T>() == 0 && aligned(x, 16) && aligned(y, 16), [&]<int V>() {
      gelu_forward_kernel<T, V>
          <<<blocks_for(n / V), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), n);
    });
  });
  check_launch("gelu_forward");
}

void gelu_backward(cudaStream_t stream, DType t, const void* x, const void* dy, void* dx, int64_t n, bool accumulate) {
  if (n == 0) return;
  dispatch(t, "gelu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_width<T>(n % vec_of<T>() == 0 && aligned(x, 16) && aligned(dy, 16) && aligned(dx, 16), [&]<int V>() {
      gelu_backward_kernel<T, V><<<blocks_for(n / V), kThreads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n, accumulate);
    });
  });
  check_launch("gelu_backward");
}

}  // namespace ab::nn::cuda_transformer
