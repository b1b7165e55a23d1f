// The generic kernels that reduce or index (generic.h): softmax and the mean (a warp per row where
// the row is contiguous), average pooling, resize and gather (a thread per output element).
#include "nn/cuda/generic_common.cuh"

namespace ab::nn::cuda_generic {
namespace {

template <typename A>
__device__ __forceinline__ A group_max(A v, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
template <typename A>
__device__ __forceinline__ A group_sum(A v, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// `lanes` threads (32: a warp, for contiguous rows; 1) per row of n elements, rows from the index
// (operands y, x); the row's element j lies j * sy (sx) past its start.
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    softmax_kernel(StridedIndex rows, int64_t nrows, int64_t n, int64_t sx, int64_t sy, int lanes, const T* x, T* y) {
  using A = Math<T>;
  const int64_t thread = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int lane = static_cast<int>(thread % lanes);
  const int64_t groups = int64_t{gridDim.x} * blockDim.x / lanes;
  for (int64_t r = thread / lanes; r < nrows; r += groups) {
    int64_t o[2];
    offsets_of<2, I>(rows, r, o);
    const T* xr = x + o[1];
    A m = -INFINITY;
    for (int64_t j = lane; j < n; j += lanes) m = max(m, to_math(xr[j * sx]));
    m = group_max(m, lanes);
    A sum = 0;
    for (int64_t j = lane; j < n; j += lanes) sum += exp(to_math(xr[j * sx]) - m);
    const A inv = A(1) / group_sum(sum, lanes);
    for (int64_t j = lane; j < n; j += lanes) y[o[0] + j * sy] = from_math<T>(exp(to_math(xr[j * sx]) - m) * inv);
  }
}

// A warp per output of the mean: lanes walk the reduced block (index `block`, operand x).
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    mean_kernel(StridedIndex outs, int64_t nout, StridedIndex block, int64_t count, const T* x, T* y) {
  using A = Math<T>;
  const int64_t thread = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int lane = static_cast<int>(thread % 32);
  for (int64_t r = thread / 32; r < nout; r += int64_t{gridDim.x} * blockDim.x / 32) {
    int64_t o[2];
    offsets_of<2, I>(outs, r, o);
    A sum = 0;
    for (int64_t j = lane; j < count; j += 32) {
      int64_t b[1];
      offsets_of<1, I>(block, j, b);
      sum += to_math(x[o[1] + b[0]]);
    }
    sum = group_sum(sum, 32);
    if (lane == 0) y[o[0]] = from_math<T>(sum / static_cast<A>(count));
  }
}

// Logical [N, C, H, W] geometry of x and y with their strides.
struct Geo4 {
  int64_t xd[4], xs[4], yd[4], ys[4];
};
Geo4 geo4(const Tensor& x, const Tensor& y) {
  Geo4 g{};
  for (int d = 0; d < 4; ++d)
    g.xd[d] = x.shape[d], g.xs[d] = x.strides[d], g.yd[d] = y.shape[d], g.ys[d] = y.strides[d];
  return g;
}
__device__ __forceinline__ void coords4(const Geo4& g, int64_t i, int64_t (&c)[4]) {
  for (int d = 3; d >= 0; --d) {
    c[d] = i % g.yd[d];
    i /= g.yd[d];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    avgpool_kernel(Geo4 g, Pool2dDesc d, bool include_pad, int64_t n, const T* x, T* y) {
  using A = Math<T>;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t c[4];
    coords4(g, i, c);
    const T* plane = x + c[0] * g.xs[0] + c[1] * g.xs[1];
    A sum = 0;
    int64_t count = 0;
    for (int64_t r = 0; r < d.window_h; ++r) {
      const int64_t h = c[2] * d.stride_h - d.pad_h + r;
      if (h < 0 || h >= g.xd[2]) continue;
      for (int64_t s = 0; s < d.window_w; ++s) {
        const int64_t w = c[3] * d.stride_w - d.pad_w + s;
        if (w < 0 || w >= g.xd[3]) continue;
        sum += to_math(plane[h * g.xs[2] + w * g.xs[3]]);
        ++count;
      }
    }
    const int64_t divisor = include_pad ? d.window_h * d.window_w : count;
    y[c[0] * g.ys[0] + c[1] * g.ys[1] + c[2] * g.ys[2] + c[3] * g.ys[3]] = from_math<T>(sum / static_cast<A>(divisor));
  }
}

// One axis's source for output coordinate o: nearest's floor index, or linear's two and weight.
__device__ __forceinline__ void resize_source(bool linear, int64_t o, int64_t in, int64_t out, int64_t& i0, int64_t& i1,
                                              float& frac) {
  if (!linear) {  // floor(o * in / out) in integers, as the reference
    i0 = i1 = min(o * in / out, in - 1);
    frac = 0;
    return;
  }
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  const float s = fminf(fmaxf((static_cast<float>(o) + 0.5f) * scale - 0.5f, 0.0f), static_cast<float>(in - 1));
  i0 = static_cast<int64_t>(floorf(s));
  i1 = min(i0 + 1, in - 1);
  frac = s - static_cast<float>(i0);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) resize_kernel(Geo4 g, bool linear, int64_t n, const T* x, T* y) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t c[4], h0, h1, w0, w1;
    float fh, fw;
    coords4(g, i, c);
    resize_source(linear, c[2], g.xd[2], g.yd[2], h0, h1, fh);
    resize_source(linear, c[3], g.xd[3], g.yd[3], w0, w1, fw);
    const T* plane = x + c[0] * g.xs[0] + c[1] * g.xs[1];
    const auto at = [&](int64_t h, int64_t w) { return to_math(plane[h * g.xs[2] + w * g.xs[3]]); };
    const float top = (1 - fw) * at(h0, w0) + fw * at(h0, w1), bottom = (1 - fw) * at(h1, w0) + fw * at(h1, w1);
    y[c[0] * g.ys[0] + c[1] * g.ys[1] + c[2] * g.ys[2] + c[3] * g.ys[3]] = from_math<T>((1 - fh) * top + fh * bottom);
  }
}

// y's dims are table's before axis, the indices', table's after it; strides per y dim of each.
struct GatherGeo {
  int rank = 0, axis = 0, index_rank = 0;
  int64_t dim = 0, table_axis_stride = 0;
  int64_t yd[Shape::kMaxRank], ys[Shape::kMaxRank], ts[Shape::kMaxRank], is[Shape::kMaxRank];
};

template <typename E>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(GatherGeo g, int64_t n, const E* table, const void* indices, Elem it, E* y) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i, oy = 0, ot = 0, oi = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
      const int64_t c = rest % g.yd[d];
      rest /= g.yd[d];
      oy += c * g.ys[d];
      ot += c * g.ts[d];  // 0 along the indices' dims
      oi += c * g.is[d];  // 0 outside them
    }
    auto idx = static_cast<int64_t>(load_elem(indices, it, oi));
    if (idx < 0) idx += g.dim;
    y[oy] = (idx >= 0 && idx < g.dim) ? table[ot + idx * g.table_axis_stride] : E(0);
  }
}

int blocks_for(int64_t threads) { return elementwise_blocks(threads); }

}  // namespace

void softmax_forward(cudaStream_t stream, int axis, const Tensor& x, const Tensor& y) {
  const char* k = "softmax_forward";
  require_same_dtype(k, {&x, &y});
  if (!(x.shape == y.shape) || axis < 0 || axis >= x.shape.rank())
    refuse(k, "needs one shape and an axis in range, got " + x.to_string() + ", axis " + std::to_string(axis));
  Tensor rows = y, x_rows = x;
  rows.shape[axis] = x_rows.shape[axis] = 1;
  StridedIndex ix = broadcast_index(k, rows, {x_rows});
  order_by_output(ix);
  coalesce(ix);
  const int64_t nrows = rows.numel(), n = x.shape[axis];
  const int lanes = x.strides[axis] == 1 && y.strides[axis] == 1 && n > 1 ? 32 : 1;
  dispatch_float(x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_kernel<T, std::uint64_t><<<blocks_for(nrows * lanes), kThreads, 0, stream>>>(
        ix, nrows, n, x.strides[axis], y.strides[axis], lanes, x.as<const T>(), y.as<T>());
  });
  check_launch(k);
}

void reduce_mean_forward(cudaStream_t stream, const Tensor& x, const Tensor& y) {
  const char* k = "reduce_mean_forward";
  require_same_dtype(k, {&x, &y});
  if (x.shape.rank() != y.shape.rank()) refuse(k, "y must have x's rank");
  Tensor reduced = x, kept = x;
  kept.shape = y.shape;
  for (int d = 0; d < x.shape.rank(); ++d) {
    if (y.shape[d] != x.shape[d] && y.shape[d] != 1)
      refuse(k, "y " + y.shape.to_string() + " is not a reduction of x " + x.shape.to_string());
    if (y.shape[d] == x.shape[d] && y.shape[d] != 1) reduced.shape[d] = 1;
  }
  StridedIndex outs = broadcast_index(k, y, {kept}), block = broadcast_index(k, reduced, {});
  for (StridedIndex* ix : {&outs, &block}) {  // rows and the sum's terms in memory order
    order_by_output(*ix);
    coalesce(*ix);
  }
  const int64_t count = reduced.numel();
  dispatch_float(x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    mean_kernel<T, std::uint64_t><<<blocks_for(y.numel() * 32), kThreads, 0, stream>>>(outs, y.numel(), block, count,
                                                                                       x.as<const T>(), y.as<T>());
  });
  check_launch(k);
}

void avgpool_forward(cudaStream_t stream, const Pool2dDesc& d, bool count_include_pad, const Tensor& x,
                     const Tensor& y) {
  const char* k = "avgpool_forward";
  require_same_dtype(k, {&x, &y});
  if (x.shape.rank() != 4 || y.shape.rank() != 4) refuse(k, "needs [N, C, H, W] operands");
  dispatch_float(x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    avgpool_kernel<T><<<blocks_for(y.numel()), kThreads, 0, stream>>>(geo4(x, y), d, count_include_pad, y.numel(),
                                                                      x.as<const T>(), y.as<T>());
  });
  check_launch(k);
}

void resize_forward(cudaStream_t stream, bool linear, const Tensor& x, const Tensor& y) {
  const char* k = "resize_forward";
  require_same_dtype(k, {&x, &y});
  if (x.shape.rank() != 4 || y.shape.rank() != 4 || x.shape[0] != y.shape[0] || x.shape[1] != y.shape[1])
    refuse(k, "needs x [N, C, H, W] and y [N, C, OH, OW], got " + x.to_string() + ", " + y.to_string());
  dispatch_float(x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    resize_kernel<T>
        <<<blocks_for(y.numel()), kThreads, 0, stream>>>(geo4(x, y), linear, y.numel(), x.as<const T>(), y.as<T>());
  });
  check_launch(k);
}

void gather_forward(cudaStream_t stream, int axis, const Tensor& table, const Tensor& indices, const Tensor& y) {
  const char* k = "gather_forward";
  const int rt = table.shape.rank(), ri = indices.shape.rank();
  if (axis < 0 || axis >= rt || y.shape.rank() != rt - 1 + ri || y.dtype != table.dtype)
    refuse(k, "operands " + table.to_string() + ", " + indices.to_string() + " -> " + y.to_string());
  GatherGeo g;
  g.rank = y.shape.rank(), g.axis = axis, g.index_rank = ri;
  g.dim = table.shape[axis], g.table_axis_stride = table.strides[axis];
  for (int d = 0; d < g.rank; ++d) {
    g.yd[d] = y.shape[d], g.ys[d] = y.strides[d];
    const bool in_index = d >= axis && d < axis + ri;
    g.ts[d] = in_index ? 0 : table.strides[d < axis ? d : d - ri + 1];
    g.is[d] = in_index ? indices.strides[d - axis] : 0;
  }
  const Elem it = elem_of(indices.dtype, k);
  if (y.numel() == 0) return;
  dispatch_bits(size_bytes(y.dtype), k, [&](auto tag) {
    using E = typename decltype(tag)::type;
    gather_kernel<E><<<blocks_for(y.numel()), kThreads, 0, stream>>>(g, y.numel(), table.as<const E>(), indices.data,
                                                                     it, y.as<E>());
  });
  check_launch(k);
}

}  // namespace ab::nn::cuda_generic
