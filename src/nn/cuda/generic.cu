// The generic elementwise kernels and every copy (generic.h): a vectorised flat path where all
// operands are contiguous alike, else the strided-index kernel (generic_common.cuh).
#include <type_traits>
#include <utility>

#include "nn/cuda/generic_common.cuh"

namespace ab::nn::cuda_generic {
namespace {

// Contiguous unary ops, one kernel per function (a switch per element would cost erf-GELU as
// many instructions again): each thread loads its next 16-byte vector before computing the
// current one, so a load is in flight while the math runs. y may be x.
template <typename T, UnaryKind K>
__global__ void __launch_bounds__(kThreads)
    unary_flat_kernel(const T* x, T* y, int64_t n, bool vectorised, Math<T> alpha, Math<T> beta) {
  constexpr int V = vec_of<T>();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t chunks = vectorised ? n / V : 0;
  if (first < chunks) {
    Chunk<T, V> next = load<V>(x, first * V);
    for (int64_t c = first; c < chunks; c += stride) {
      const Chunk<T, V> a = next;
      if (c + stride < chunks) next = load<V>(x, (c + stride) * V);
      Chunk<T, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = from_math<T>(unary_apply(K, alpha, beta, to_math(a.v[j])));
      store<V>(y, c * V, o);
    }
  }
  for (int64_t i = chunks * V + first; i < n; i += stride)
    y[i] = from_math<T>(unary_apply(K, alpha, beta, to_math(x[i])));
}

// Calls f(std::integral_constant<UnaryKind, kind>{}); false where kind is past the list (a
// kind added to the enum after `reciprocal`), which the caller refuses.
template <typename F, int... Kinds>
bool with_kind(UnaryKind kind, F&& f, std::integer_sequence<int, Kinds...> /*all*/) {
  return ((static_cast<int>(kind) == Kinds
               ? (f(std::integral_constant<UnaryKind, static_cast<UnaryKind>(Kinds)>{}), true)
               : false) ||
          ...);
}
template <typename F>
bool with_kind(UnaryKind kind, F&& f) {
  return with_kind(kind, std::forward<F>(f),
                   std::make_integer_sequence<int, static_cast<int>(UnaryKind::reciprocal) + 1>{});
}

template <typename T>
struct BinaryFlat : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* a;
  const T* b;
  T* y;
  BinaryKind kind;
  template <int W>
  __device__ void apply(int64_t i) const {
    const auto va = load<W>(a, i);
    const auto vb = load<W>(b, i);
    Chunk<T, W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) o.v[j] = from_math<T>(binary_apply(kind, to_math(va.v[j]), to_math(vb.v[j])));
    store<W>(y, i, o);
  }
};

// Strided forms: offsets are out, then the inputs.
template <typename T>
struct UnaryAt {
  const T* x;
  T* y;
  UnaryKind kind;
  Math<T> alpha, beta;
  __device__ void operator()(const int64_t (&o)[2]) const {
    y[o[0]] = from_math<T>(unary_apply(kind, alpha, beta, to_math(x[o[1]])));
  }
};

// Offsets count pieces of W elements (widen_index).
template <typename T, int W>
struct BinaryAt {
  const T* a;
  const T* b;
  T* y;
  BinaryKind kind;
  __device__ void operator()(const int64_t (&o)[3]) const {
    const auto va = load<W>(a, o[1] * W);
    const auto vb = load<W>(b, o[2] * W);
    Chunk<T, W> out;
#pragma unroll
    for (int j = 0; j < W; ++j) out.v[j] = from_math<T>(binary_apply(kind, to_math(va.v[j]), to_math(vb.v[j])));
    store<W>(y, o[0] * W, out);
  }
};

template <typename T>
struct WhereAt {
  const void* cond;
  Elem cond_t;
  const T* x;
  const T* y;
  T* out;
  __device__ void operator()(const int64_t (&o)[4]) const {
    out[o[0]] = load_elem(cond, cond_t, o[1]) != 0 ? x[o[2]] : y[o[3]];
  }
};

template <typename E>
struct CopyAt {
  const E* x;
  E* y;
  __device__ void operator()(const int64_t (&o)[2]) const { y[o[0]] = x[o[1]]; }
};

// A reshape's copy: element i of x and of y, each decoded in its own shape.
template <typename I, typename E>
__global__ void __launch_bounds__(kThreads)
    reshape_kernel(StridedIndex iy, StridedIndex ix, int64_t n, const E* x, E* y) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t oy[1], ox[1];
    offsets_of<1, I>(iy, i, oy);
    offsets_of<1, I>(ix, i, ox);
    y[oy[0]] = x[ox[0]];
  }
}

// Whether the index walks every operand as one unit-stride run (a memcpy).
bool one_run(const StridedIndex& ix) {
  if (ix.rank == 0) return true;
  if (ix.rank > 1) return false;
  for (int k = 0; k < ix.operands; ++k)
    if (ix.strides[k][0] != 1) return false;
  return true;
}

// The most elements per piece (a power of two up to 16 bytes, at most max_per) that cut the
// innermost dim into whole pieces in every operand: unit stride there, that dim and every other
// stride a multiple of it, every pointer aligned to the piece. The index is rewritten in pieces. A
// transpose of leading dims (heads, batch-first) then moves 16 bytes per index decode instead of
// one element, and a per-channel broadcast (ConvNeXt's layer scale) reads whole vectors.
std::int64_t widen_index(StridedIndex& ix, std::size_t element_bytes, std::int64_t max_per,
                         std::initializer_list<const void*> pointers) {
  if (ix.rank == 0) return 1;
  const int inner = ix.rank - 1;
  for (int k = 0; k < ix.operands; ++k)
    if (ix.strides[k][inner] != 1) return 1;
  for (std::int64_t per = std::min<std::int64_t>(max_per, static_cast<std::int64_t>(16 / element_bytes)); per > 1;
       per /= 2) {
    bool fits = ix.dims[inner] % per == 0;
    for (const void* p : pointers)
      fits = fits && device_common::aligned(p, static_cast<std::size_t>(per) * element_bytes);
    for (int k = 0; k < ix.operands; ++k)
      for (int d = 0; fits && d < inner; ++d) fits = ix.strides[k][d] % per == 0;
    if (!fits) continue;
    ix.dims[inner] /= per;
    for (int k = 0; k < ix.operands; ++k)
      for (int d = 0; d < inner; ++d) ix.strides[k][d] /= per;
    return per;
  }
  return 1;
}

// The copy's unit in bytes (16, 8 or 4 where the operands allow, else the element's).
std::size_t widen_copy(StridedIndex& ix, std::size_t element_bytes, const void* x, const void* y) {
  return element_bytes * static_cast<std::size_t>(widen_index(ix, element_bytes, 16, {x, y}));
}

void require_float_shape(const char* kernel, const Tensor& x, const Tensor& y) {
  require_same_dtype(kernel, {&x, &y});
  if (!(x.shape == y.shape))
    refuse(kernel, "shapes " + x.shape.to_string() + " and " + y.shape.to_string() + " differ");
}

}  // namespace

void unary_forward(cudaStream_t stream, const UnaryAttrs& a, const Tensor& x, const Tensor& y) {
  const char* k = "unary_forward";
  require_float_shape(k, x, y);
  dispatch_float(x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto alpha = static_cast<Math<T>>(a.alpha), beta = static_cast<Math<T>>(a.beta);
    if (flat_together({&x, &y})) {
      const int64_t n = x.numel();
      if (n == 0) return;
      const bool vectorised = all_aligned({x.data, y.data}) && n >= vec_of<T>();
      const int blocks = elementwise_blocks(vectorised ? n / vec_of<T>() + n % vec_of<T>() : n);
      const bool launched = with_kind(a.kind, [&](auto kind) {
        unary_flat_kernel<T, decltype(kind)::value>
            <<<blocks, kThreads, 0, stream>>>(x.as<const T>(), y.as<T>(), n, vectorised, alpha, beta);
      });
      if (!launched) refuse(k, "no kernel for unary kind " + std::to_string(static_cast<int>(a.kind)));
      return check_launch(k);
    }
    launch_indexed<2>(stream, broadcast_index(k, y, {x}), UnaryAt<T>{x.as<const T>(), y.as<T>(), a.kind, alpha, beta},
                      k);
  });
}

void binary_forward(cudaStream_t stream, BinaryKind kind, const Tensor& a, const Tensor& b, const Tensor& y) {
  const char* k = "binary_forward";
  require_same_dtype(k, {&a, &b, &y});
  dispatch_float(y.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (flat_together({&a, &b, &y})) {
      BinaryFlat<T> op;
      op.a = a.as<const T>(), op.b = b.as<const T>(), op.y = y.as<T>(), op.kind = kind;
      return launch_elementwise(stream, op, y.numel(), all_aligned({a.data, b.data, y.data}), k);
    }
    StridedIndex ix = broadcast_index(k, y, {a, b});
    order_by_output(ix);
    coalesce(ix);
    const std::int64_t per = widen_index(ix, sizeof(T), vec_of<T>(), {a.data, b.data, y.data});
    const auto run = [&](auto width) {
      launch_indexed<3>(stream, ix,
                        BinaryAt<T, decltype(width)::value>{a.as<const T>(), b.as<const T>(), y.as<T>(), kind}, k);
    };
    if (per == 8) run(std::integral_constant<int, 8>{});
    else if (per == 4) run(std::integral_constant<int, 4>{});
    else if (per == 2) run(std::integral_constant<int, 2>{});
    else run(std::integral_constant<int, 1>{});
  });
}

void where_forward(cudaStream_t stream, const Tensor& cond, const Tensor& x, const Tensor& y, const Tensor& out) {
  const char* k = "where_forward";
  require_same_dtype(k, {&x, &y, &out});
  const Elem ct = elem_of(cond.dtype, k);
  dispatch_float(out.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_indexed<4>(stream, broadcast_index(k, out, {cond, x, y}),
                      WhereAt<T>{cond.data, ct, x.as<const T>(), y.as<const T>(), out.as<T>()}, k);
  });
}

void copy_strided(cudaStream_t stream, const Tensor& x, const Tensor& y) {
  const char* k = "copy_strided";
  if (x.numel() != y.numel() || x.dtype != y.dtype)
    refuse(k, "needs one element count and dtype, got " + x.to_string() + " and " + y.to_string());
  if (y.numel() == 0) return;
  const std::size_t e = size_bytes(y.dtype);
  dispatch_bits(e, k, [&](auto tag) {
    using E = typename decltype(tag)::type;
    if (x.shape == y.shape) {
      StridedIndex ix = broadcast_index(k, y, {x});
      order_by_output(ix);
      coalesce(ix);
      if (one_run(ix)) {
        AB_CUDA_LAZY(
            cudaMemcpyAsync(y.data, x.data, static_cast<std::size_t>(y.numel()) * e, cudaMemcpyDeviceToDevice, stream),
            std::string("cuda ") + k);
        return;
      }
      const std::size_t unit = widen_copy(ix, e, x.data, y.data);
      if (unit == 16) return launch_indexed<2>(stream, ix, CopyAt<uint4>{x.as<const uint4>(), y.as<uint4>()}, k);
      return dispatch_bits(unit, k, [&](auto unit_tag) {
        using U = typename decltype(unit_tag)::type;
        launch_indexed<2>(stream, ix, CopyAt<U>{x.as<const U>(), y.as<U>()}, k);
      });
    }
    StridedIndex iy = broadcast_index(k, y, {}), ix = broadcast_index(k, x, {});
    coalesce(iy);
    coalesce(ix);
    if (one_run(iy) && one_run(ix)) {
      AB_CUDA_LAZY(
          cudaMemcpyAsync(y.data, x.data, static_cast<std::size_t>(y.numel()) * e, cudaMemcpyDeviceToDevice, stream),
          std::string("cuda ") + k);
      return;
    }
    const int blocks = elementwise_blocks(y.numel());
    if (y.numel() <= std::numeric_limits<std::uint32_t>::max())
      reshape_kernel<std::uint32_t, E><<<blocks, kThreads, 0, stream>>>(iy, ix, y.numel(), x.as<const E>(), y.as<E>());
    else
      reshape_kernel<std::uint64_t, E><<<blocks, kThreads, 0, stream>>>(iy, ix, y.numel(), x.as<const E>(), y.as<E>());
    check_launch(k);
  });
}

}  // namespace ab::nn::cuda_generic
