// Depthwise convolution and max pooling on NHWC tensors (spatial.h). Each thread owns a vector of V
// adjacent channels (16-byte loads where channels and pointers allow), so a warp reads whole
// pixels. The depthwise kernels keep their block's filters in shared memory, tap-major, and each
// thread computes kTileW outputs along W: the generic kernel reads each tap's input from L1, the
// register-tiled one (3, 5 or 7 wide) each filter row's shared input columns once.
#include "nn/cuda/spatial.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "nn/cuda/device_common.cuh"

namespace ab::nn::cuda_spatial {
namespace {

using device_common::Chunk;
using device_common::from_f32;
using device_common::to_f32;
using std::int64_t;

constexpr int kThreads = 256;
constexpr int kTileW = 4;                        // depthwise outputs per thread along W
constexpr int kFilterFloats = 8192;              // a block's filters in shared memory (32 KiB)
constexpr int kMaxChannelGroups = kThreads / 8;  // at least 8 pixel rows per block

struct ConvGeometry {
  int64_t n, c, h, w, oh, ow, r, s, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int64_t tiles;  // ceil(ow / kTileW)
  int64_t items;  // n * oh * tiles
  int groups;     // channel vectors per block
  int rows;       // pixel items per block
};

struct PoolGeometry {
  int64_t n, c, h, w, oh, ow, window_h, window_w, stride_h, stride_w, pad_h, pad_w;
};

bool nhwc(const Tensor& t) {
  return t.shape.rank() == 4 && same_order(t.shape, t.strides, contiguous_strides(t.shape, Layout::nhwc));
}

// The widest channel vector (16 bytes at most) that divides C and every pointer's alignment.
template <typename T>
int vector_width(int64_t channels, std::initializer_list<const void*> pointers) {
  for (int v = static_cast<int>(16 / sizeof(T)); v > 1; v /= 2) {
    bool ok = channels % v == 0;
    for (const void* p : pointers) ok = ok && (p == nullptr || device_common::aligned(p, v * sizeof(T)));
    if (ok) return v;
  }
  return 1;
}

// Where a block keeps filter value k of channel vector `group` for `tap` in shared memory:
// tap-major, and a vector of more than 4 floats split into planes of 4, so the 16-byte reads of
// 8 consecutive lanes (consecutive groups) cover 128 contiguous bytes: no bank conflicts.
template <int V>
__device__ __forceinline__ int filter_index(int tap, int group, int k, int groups) {
  constexpr int kPlanes = (V + 3) / 4, kWidth = V < 4 ? V : 4;
  return ((tap * kPlanes + k / 4) * groups + group) * kWidth + k % 4;
}

// A block's filters (channels c0 .. c0 + groups * V) into shared memory at filter_index.
template <int V, typename T>
__device__ __forceinline__ void load_filters(float* filters, const T* w, int64_t c0, int groups, int taps,
                                             int64_t channels) {
  const int block_channels = groups * V;
  for (int i = threadIdx.x; i < taps * block_channels; i += blockDim.x) {
    const int tap = i / block_channels, cl = i % block_channels;
    const int64_t c = c0 + cl;
    filters[filter_index<V>(tap, cl / V, cl % V, groups)] = c < channels ? to_f32(w[c * taps + tap]) : 0.0f;
  }
  __syncthreads();
}

// y at the kTileW outputs from ow0 of row (n, oh), channels c.. c + V: act(acc + bias (+ z)).
template <typename T, int V>
__device__ __forceinline__ void store_outputs(const float (&acc)[kTileW][V], const void* bias,
                                              bool bias_is_storage_type, const T* z, T* y, const ConvGeometry& g,
                                              int64_t n, int64_t oh, int64_t ow0, int64_t c, bool relu) {
  float b[V] = {};
  if (bias != nullptr)
#pragma unroll
    for (int v = 0; v < V; ++v)
      b[v] = bias_is_storage_type ? to_f32(static_cast<const T*>(bias)[c + v]) : static_cast<const float*>(bias)[c + v];
#pragma unroll
  for (int t = 0; t < kTileW; ++t) {
    if (ow0 + t >= g.ow) break;
    const int64_t at = ((n * g.oh + oh) * g.ow + ow0 + t) * g.c + c;
    Chunk<T, V> out;
    Chunk<T, V> res{};
    if (z != nullptr) res = device_common::load<V>(z, at);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float a = acc[t][v] + b[v];
      if (z != nullptr) a += to_f32(res.v[v]);
      out.v[v] = from_f32<T>(relu ? fmaxf(a, 0.0f) : a);
    }
    device_common::store<V>(y, at, out);
  }
}

template <typename T, int V>
__global__ void depthwise_nhwc(const T* __restrict__ x, const T* __restrict__ w, const void* __restrict__ bias,
                               bool bias_is_storage_type, const T* __restrict__ z, T* __restrict__ y, ConvGeometry g,
                               bool relu) {
  extern __shared__ float filters[];  // at filter_index
  const int block_channels = g.groups * V;
  const int64_t c0 = int64_t{blockIdx.y} * block_channels;
  load_filters<V>(filters, w, c0, g.groups, static_cast<int>(g.r * g.s), g.c);
  const int group = threadIdx.x % g.groups, row = threadIdx.x / g.groups;
  const int64_t c = c0 + int64_t{group} * V, item = int64_t{blockIdx.x} * g.rows + row;
  if (row >= g.rows || c >= g.c || item >= g.items) return;
  const int64_t tile = item % g.tiles, oh = (item / g.tiles) % g.oh, n = item / g.tiles / g.oh;
  const int64_t ow0 = tile * kTileW;

  float acc[kTileW][V] = {};
  for (int64_t r = 0; r < g.r; ++r) {
    const int64_t ih = oh * g.stride_h - g.pad_h + r * g.dil_h;
    if (ih < 0 || ih >= g.h) continue;
    const T* x_row = x + (n * g.h + ih) * g.w * g.c + c;
    for (int64_t s = 0; s < g.s; ++s) {
      const int tap = static_cast<int>(r * g.s + s);
      float wv[V];
#pragma unroll
      for (int v = 0; v < V; ++v) wv[v] = filters[filter_index<V>(tap, group, v, g.groups)];
#pragma unroll
      for (int t = 0; t < kTileW; ++t) {
        const int64_t iw = (ow0 + t) * g.stride_w - g.pad_w + s * g.dil_w;
        if (ow0 + t >= g.ow || iw < 0 || iw >= g.w) continue;
        const Chunk<T, V> xv = device_common::load<V>(x_row, iw * g.c);
#pragma unroll
        for (int v = 0; v < V; ++v) acc[t][v] = fmaf(to_f32(xv.v[v]), wv[v], acc[t][v]);
      }
    }
  }
  store_outputs<T, V>(acc, bias, bias_is_storage_type, z, y, g, n, oh, ow0, c, relu);
}

// The common shapes (S of 3, 5 or 7 along W, stride 1 or 2 there, no dilation along W, the widest
// channel vector): each filter row reads the COLS input vectors its kTileW outputs share once into
// registers, in f32, and every tap of the row reuses them.
template <typename T, int V, int S, int SW>
__global__ void __launch_bounds__(kThreads, 2)
    depthwise_nhwc_rows(const T* __restrict__ x, const T* __restrict__ w, const void* __restrict__ bias,
                        bool bias_is_storage_type, const T* __restrict__ z, T* __restrict__ y, ConvGeometry g,
                        bool relu) {
  constexpr int kCols = (kTileW - 1) * SW + S;
  extern __shared__ float filters[];  // at filter_index
  const int block_channels = g.groups * V;
  const int64_t c0 = int64_t{blockIdx.y} * block_channels;
  load_filters<V>(filters, w, c0, g.groups, static_cast<int>(g.r) * S, g.c);
  const int group = threadIdx.x % g.groups, row = threadIdx.x / g.groups;
  const int64_t c = c0 + int64_t{group} * V, item = int64_t{blockIdx.x} * g.rows + row;
  if (row >= g.rows || c >= g.c || item >= g.items) return;
  const int64_t tile = item % g.tiles, oh = (item / g.tiles) % g.oh, n = item / g.tiles / g.oh;
  const int ow0 = static_cast<int>(tile) * kTileW;
  const int iw0 = ow0 * SW - static_cast<int>(g.pad_w), width = static_cast<int>(g.w);

  float acc[kTileW][V] = {};
  for (int r = 0; r < static_cast<int>(g.r); ++r) {
    const int64_t ih = oh * g.stride_h - g.pad_h + r * g.dil_h;
    if (ih < 0 || ih >= g.h) continue;
    const T* x_row = x + (n * g.h + ih) * g.w * g.c + c;
    // Every column's load first, unconditionally (a column outside the row reads its nearest
    // inside one, then counts as zero), so the row's loads are in flight together.
    Chunk<T, V> raw[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j)
      raw[j] = device_common::load<V>(x_row, int64_t{min(max(iw0 + j, 0), width - 1)} * g.c);
    float cols[kCols][V];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const bool inside = iw0 + j >= 0 && iw0 + j < width;
#pragma unroll
      for (int k = 0; k < V; ++k) cols[j][k] = inside ? to_f32(raw[j].v[k]) : 0.0f;
    }
#pragma unroll
    for (int s = 0; s < S; ++s) {
      float wv[V];
#pragma unroll
      for (int k = 0; k < V; ++k) wv[k] = filters[filter_index<V>(r * S + s, group, k, g.groups)];
#pragma unroll
      for (int t = 0; t < kTileW; ++t)
#pragma unroll
        for (int k = 0; k < V; ++k) acc[t][k] = fmaf(cols[t * SW + s][k], wv[k], acc[t][k]);
    }
  }
  store_outputs<T, V>(acc, bias, bias_is_storage_type, z, y, g, n, oh, ow0, c, relu);
}

// One thread per output pixel and channel vector. As the reference: the first position inside the
// image starts the window, and a later one wins only where it is greater.
template <typename T, int V>
__global__ void maxpool_nhwc(const T* __restrict__ x, T* __restrict__ y, PoolGeometry g) {
  const int64_t vectors = g.c / V, total = g.n * g.oh * g.ow * vectors;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = (i % vectors) * V, pixel = i / vectors;
    const int64_t ow = pixel % g.ow, oh = (pixel / g.ow) % g.oh, n = pixel / g.ow / g.oh;
    Chunk<T, V> best{};
    bool any = false;
    for (int64_t r = 0; r < g.window_h; ++r) {
      const int64_t ih = oh * g.stride_h - g.pad_h + r;
      if (ih < 0 || ih >= g.h) continue;
      for (int64_t s = 0; s < g.window_w; ++s) {
        const int64_t iw = ow * g.stride_w - g.pad_w + s;
        if (iw < 0 || iw >= g.w) continue;
        const Chunk<T, V> v = device_common::load<V>(x, ((n * g.h + ih) * g.w + iw) * g.c + c);
#pragma unroll
        for (int k = 0; k < V; ++k)
          if (!any || to_f32(v.v[k]) > to_f32(best.v[k])) best.v[k] = v.v[k];
        any = true;
      }
    }
    device_common::store<V>(y, i * V, best);
  }
}

// Calls f(std::integral_constant<int, V>) for v of 8, 4, 2 or 1 (what vector_width chose).
template <typename F>
void with_width(int v, F&& f) {
  if (v == 8) f(std::integral_constant<int, 8>{});
  else if (v == 4) f(std::integral_constant<int, 4>{});
  else if (v == 2) f(std::integral_constant<int, 2>{});
  else f(std::integral_constant<int, 1>{});
}

// The register-tiled kernel where the shape has one (S, stride along W), else the generic one.
template <typename T, int V>
auto depthwise_kernel_for(const ConvGeometry& g) {
  using Kernel = void (*)(const T*, const T*, const void*, bool, const T*, T*, ConvGeometry, bool);
  Kernel k = depthwise_nhwc<T, V>;
  if constexpr (V * sizeof(T) == 16) {
    if (g.dil_w != 1 || (g.stride_w != 1 && g.stride_w != 2)) return k;
    const bool s1 = g.stride_w == 1;
    if (g.s == 3) k = s1 ? depthwise_nhwc_rows<T, V, 3, 1> : depthwise_nhwc_rows<T, V, 3, 2>;
    else if (g.s == 5) k = s1 ? depthwise_nhwc_rows<T, V, 5, 1> : depthwise_nhwc_rows<T, V, 5, 2>;
    else if (g.s == 7) k = s1 ? depthwise_nhwc_rows<T, V, 7, 1> : depthwise_nhwc_rows<T, V, 7, 2>;
  }
  return k;
}

template <typename T, int V>
void launch_depthwise(cudaStream_t stream, ConvGeometry g, const Tensor& x, const Tensor& w, const void* bias,
                      bool bias_is_storage_type, const void* residual, const Tensor& y, bool relu) {
  // Channel vectors per block: as many as the filters' shared memory holds (at most
  // kMaxChannelGroups), then evened out over the blocks C needs.
  const int64_t vectors = g.c / V, taps = g.r * g.s;
  const int64_t fit = std::clamp<int64_t>(kFilterFloats / (taps * V), 1, kMaxChannelGroups);
  const int64_t blocks_c = (vectors + fit - 1) / fit;
  g.groups = static_cast<int>((vectors + blocks_c - 1) / blocks_c);
  g.rows = kThreads / g.groups;
  const dim3 grid(static_cast<unsigned>((g.items + g.rows - 1) / g.rows), static_cast<unsigned>(blocks_c));
  const auto shared = static_cast<std::size_t>(taps * g.groups * V) * sizeof(float);
  depthwise_kernel_for<T, V>(g)<<<grid, g.rows * g.groups, shared, stream>>>(
      static_cast<const T*>(x.data), static_cast<const T*>(w.data), bias, bias_is_storage_type,
      static_cast<const T*>(residual), static_cast<T*>(y.data), g, relu);
  device_common::check_launch("cuda_spatial", "depthwise_forward");
}

template <typename T, int V>
void launch_maxpool(cudaStream_t stream, const PoolGeometry& g, const Tensor& x, const Tensor& y) {
  const int64_t total = g.n * g.oh * g.ow * (g.c / V);
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((total + kThreads - 1) / kThreads, 1, 1 << 20));
  maxpool_nhwc<T, V><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(x.data), static_cast<T*>(y.data), g);
  device_common::check_launch("cuda_spatial", "maxpool_forward");
}

}  // namespace

std::string depthwise_refusal(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) {
  if (!nhwc(x) || !nhwc(y)) return "x and y are not NHWC";
  if (x.dtype != w.dtype || x.dtype != y.dtype) return "x, w and y differ in dtype";
  if (x.dtype != DType::f32 && x.dtype != DType::f16 && x.dtype != DType::bf16)
    return "the dtype is not f32, f16 or bf16";
  if (w.shape.rank() != 4 || w.shape[1] != 1 || d.groups != x.shape[1] || w.shape[0] != x.shape[1] ||
      y.shape[1] != x.shape[1])
    return "not one filter per channel";
  if (!same_order(w.shape, w.strides, contiguous_strides(w.shape, Layout::nchw))) return "the filter is not contiguous";
  if (w.shape[2] * w.shape[3] > kMaxDepthwiseTaps)
    return "the filter has more than " + std::to_string(kMaxDepthwiseTaps) + " taps";
  return {};
}

void depthwise_forward(cudaStream_t stream, const Conv2dDesc& d, const Tensor& x, const Tensor& w, const void* bias,
                       bool bias_is_storage_type, const void* residual, const Tensor& y, bool relu) {
  if (const std::string why = depthwise_refusal(d, x, w, y); !why.empty())
    throw Unsupported("cuda_spatial depthwise_forward: " + why);
  ConvGeometry g{x.shape[0],   x.shape[1],   x.shape[2], x.shape[3], y.shape[2], y.shape[3],
                 w.shape[2],   w.shape[3],   d.stride_h, d.stride_w, d.pad_h,    d.pad_w,
                 d.dilation_h, d.dilation_w, 0,          0,          0,          0};
  g.tiles = (g.ow + kTileW - 1) / kTileW;
  g.items = g.n * g.oh * g.tiles;
  if (g.items == 0 || g.c == 0) return;
  device_common::dispatch_storage<false>(x.dtype, "cuda_spatial", "depthwise_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_width(vector_width<T>(g.c, {x.data, y.data, residual}), [&](auto width) {
      launch_depthwise<T, decltype(width)::value>(stream, g, x, w, bias, bias_is_storage_type, residual, y, relu);
    });
  });
}

std::string maxpool_refusal(const Pool2dDesc& /*d*/, const Tensor& x, const Tensor& y) {
  if (!nhwc(x) || !nhwc(y)) return "x and y are not NHWC";
  if (x.dtype != y.dtype) return "x and y differ in dtype";
  if (x.dtype != DType::f32 && x.dtype != DType::f16 && x.dtype != DType::bf16)
    return "the dtype is not f32, f16 or bf16";
  if (x.shape[0] != y.shape[0] || x.shape[1] != y.shape[1]) return "x and y differ in batch or channels";
  return {};
}

void maxpool_forward(cudaStream_t stream, const Pool2dDesc& d, const Tensor& x, const Tensor& y) {
  if (const std::string why = maxpool_refusal(d, x, y); !why.empty())
    throw Unsupported("cuda_spatial maxpool_forward: " + why);
  const PoolGeometry g{x.shape[0], x.shape[1], x.shape[2], x.shape[3], y.shape[2], y.shape[3],
                       d.window_h, d.window_w, d.stride_h, d.stride_w, d.pad_h,    d.pad_w};
  if (y.numel() == 0) return;
  device_common::dispatch_storage<false>(x.dtype, "cuda_spatial", "maxpool_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_width(vector_width<T>(g.c, {x.data, y.data}),
               [&](auto width) { launch_maxpool<T, decltype(width)::value>(stream, g, x, y); });
  });
}

}  // namespace ab::nn::cuda_spatial
