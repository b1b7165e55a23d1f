// Activations, the residual add and the folded epilogue, gradient copies, global average pooling,
// fills and the timing spin (pointwise.h). The shared engine: pointwise_common.cuh.
#include "nn/cuda/pointwise_common.cuh"

namespace ab::nn::cuda_pointwise {

// SM count of the current device, cached: the query is no stream work, so it is safe while
// capturing, and a fixed count keeps reduction shapes (and so results) fixed per device.
int sm_count() {
  int device = 0;
  AB_CUDA(cudaGetDevice(&device), "cuda_pointwise: current device");
  static std::array<std::atomic<int>, 64> cache{};
  const bool cached = device >= 0 && device < static_cast<int>(cache.size());
  if (cached) {
    const int known = cache[static_cast<std::size_t>(device)].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int count = 0;
  AB_CUDA(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cuda_pointwise: SM count");
  count = std::max(count, 1);
  if (cached) cache[static_cast<std::size_t>(device)].store(count, std::memory_order_relaxed);
  return count;
}

namespace {

template <typename T>
struct ReluForwardOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* x;
  T* y;
  template <int W>
  __device__ void apply(int64_t i) const {
    const auto a = load<W>(x, i);
    Chunk<T, W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Math<T> v = to_math(a.v[j]);
      o.v[j] = from_math<T>(v > Math<T>(0) ? v : Math<T>(0));  // NaN -> 0, as the reference
    }
    store<W>(y, i, o);
  }
};

template <typename T>
struct ReluBackwardOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* y;
  const T* dy;
  T* dx;
  bool accumulate;
  template <int W>
  __device__ void apply(int64_t i) const {
    const auto out = load<W>(y, i);
    const auto g = load<W>(dy, i);
    Chunk<T, W> d;
    if (accumulate) d = load<W>(dx, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Math<T> v = to_math(out.v[j]) > Math<T>(0) ? to_math(g.v[j]) : Math<T>(0);
      d.v[j] = from_math<T>(accumulate ? to_math(d.v[j]) + v : v);
    }
    store<W>(dx, i, d);
  }
};

template <typename T>
struct AddOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* a;
  const T* b;
  T* y;
  template <int W>
  __device__ void apply(int64_t i) const {
    const auto va = load<W>(a, i);
    const auto vb = load<W>(b, i);
    Chunk<T, W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) o.v[j] = from_math<T>(to_math(va.v[j]) + to_math(vb.v[j]));
    store<W>(y, i, o);
  }
};

template <typename T>
struct CopyGradientOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* dy;
  T* dx;
  bool accumulate;
  template <int W>
  __device__ void apply(int64_t i) const {
    const auto g = load<W>(dy, i);
    if (!accumulate) {
      store<W>(dx, i, g);
      return;
    }
    auto d = load<W>(dx, i);
#pragma unroll
    for (int j = 0; j < W; ++j) d.v[j] = from_math<T>(to_math(d.v[j]) + to_math(g.v[j]));
    store<W>(dx, i, d);
  }
};

// dx (+)= dy[n, c] / HW. The [N, C] index of dx's element i is found with one division per
// chunk and then stepped, since 64-bit division per element would dominate this kernel.
template <typename T>
struct AvgpoolBackwardOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* dy;
  T* dx;
  int64_t C, HW;
  Math<T> inv_area;
  bool nhwc, accumulate;
  template <int W>
  __device__ void apply(int64_t i) const {
    int64_t k, c = 0, hw = 0;  // k: dy index; nhwc steps c then hw, nchw steps hw
    if (nhwc) {
      const int64_t q = i / C;  // n * HW + hw
      c = i - q * C;
      const int64_t n = q / HW;
      hw = q - n * HW;
      k = n * C + c;
    } else {
      k = i / HW;
      hw = i - k * HW;
    }
    Chunk<T, W> d;
    if (accumulate) d = load<W>(dx, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Math<T> g = to_math(dy[k]) * inv_area;
      d.v[j] = from_math<T>(accumulate ? to_math(d.v[j]) + g : g);
      if (nhwc) {
        ++c;
        ++k;
        if (c == C) {  // next pixel: back to channel 0 of this sample, or on to the next sample
          c = 0;
          k -= C;
          if (++hw == HW) {
            hw = 0;
            k += C;
          }
        }
      } else if (++hw == HW) {
        hw = 0;
        ++k;
      }
    }
    store<W>(dx, i, d);
  }
};

// y = act(x + bias[c] (+ residual)): a folded batch norm's shift, the block's residual add and
// ReLU in one pass. The bias B is the math type (f32; f64 for f64 data), as batch-norm parameters
// are stored, or the storage type T (the fused convolution's bias, its fallback). Element i's channel is found with divisions once per chunk, then stepped (as in
// AvgpoolBackwardOp): nhwc steps c every element, nchw steps hw and moves to the next channel.
template <typename T, typename B>
struct BiasActivationOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* x;
  const B* bias;
  const T* residual;  // null: none
  T* y;
  int64_t C, HW;
  bool nhwc, relu;
  template <int W>
  __device__ void apply(int64_t i) const {
    int64_t c, hw = 0;
    if (nhwc) {
      c = i % C;
    } else {
      const int64_t q = i / HW;  // n * C + c
      c = q % C;
      hw = i - q * HW;
    }
    const auto a = load<W>(x, i);
    Chunk<T, W> r;
    if (residual != nullptr) r = load<W>(residual, i);
    Chunk<T, W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      Math<T> v = to_math(a.v[j]) + static_cast<Math<T>>(to_math(bias[c]));
      if (residual != nullptr) v += to_math(r.v[j]);
      if (relu) v = v > Math<T>(0) ? v : Math<T>(0);  // NaN -> 0, as the reference
      o.v[j] = from_math<T>(v);
      if (nhwc) {
        if (++c == C) c = 0;
      } else if (++hw == HW) {
        hw = 0;
        if (++c == C) c = 0;
      }
    }
    store<W>(y, i, o);
  }
};

template <typename T>
struct FillOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  T* p;
  double value;
  template <int W>
  __device__ void apply(int64_t i) const {
    Chunk<T, W> o;
    T x;
    if constexpr (std::is_same_v<T, int32_t>) x = static_cast<int32_t>(value);
    else x = from_double<T>(value);
#pragma unroll
    for (int j = 0; j < W; ++j) o.v[j] = x;
    store<W>(p, i, o);
  }
};

// Uniform in [lo, hi) from a 64-bit mix of (seed, index): cheap, stateless, no curand.
template <typename T>
struct UniformOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  T* p;
  std::uint64_t seed;
  double lo, span;
  template <int W>
  __device__ void apply(int64_t i) const {
    Chunk<T, W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(i + j + 1);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      z ^= z >> 31;
      o.v[j] = from_double<T>(lo + span * static_cast<double>(z >> 11) * 0x1.0p-53);
    }
    store<W>(p, i, o);
  }
};

__global__ void spin_kernel(std::int64_t nanoseconds) {
  std::uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < static_cast<std::uint64_t>(nanoseconds));
}

// ---- global average pooling, forward

// NCHW: one warp per (n, c) plane, lanes stride along the contiguous H*W.
template <typename T>
__global__ void __launch_bounds__(kThreads) avgpool_nchw_kernel(const T* x, T* y, int64_t planes, int64_t HW) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * kWarps;
  const Math<T> inv_area = Math<T>(1) / static_cast<Math<T>>(HW);
  for (int64_t p = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; p < planes; p += warps) {
    const T* plane = x + p * HW;
    Math<T> sum = 0;
    for (int64_t k = lane; k < HW; k += 32) sum += to_math(plane[k]);
    sum = warp_sum(sum);
    if (lane == 0) y[p] = from_math<T>(sum * inv_area);
  }
}

// NHWC: a block covers 32 channels of one sample; its 8 warps split the pixels, each warp reading
// 32 consecutive channels per pixel (coalesced), and their sums are added in warp order.
template <typename T>
__global__ void __launch_bounds__(kThreads) avgpool_nhwc_kernel(const T* x, T* y, int64_t C, int64_t HW) {
  __shared__ Math<T> partial[kWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n = blockIdx.y;
  const int64_t c = int64_t{blockIdx.x} * 32 + lane;
  Math<T> sum = 0;
  if (c < C) {
    const T* base = x + n * HW * C + c;
    for (int64_t hw = warp; hw < HW; hw += kWarps) sum += to_math(base[hw * C]);
  }
  partial[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && c < C) {
    Math<T> total = 0;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) total += partial[k][lane];
    y[n * C + c] = from_math<T>(total * (Math<T>(1) / static_cast<Math<T>>(HW)));
  }
}

}  // namespace

// ---- elementwise

void relu_forward(cudaStream_t stream, DType t, const void* x, void* y, int64_t n) {
  dispatch_float(t, "relu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    ReluForwardOp<T> op;
    op.x = static_cast<const T*>(x);
    op.y = static_cast<T*>(y);
    launch_elementwise(stream, op, n, all_aligned16(x, y), "relu_forward");
  });
}

void relu_backward(cudaStream_t stream, DType t, const void* y, const void* dy, void* dx, int64_t n,
                   bool accumulate) {
  dispatch_float(t, "relu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    ReluBackwardOp<T> op;
    op.y = static_cast<const T*>(y);
    op.dy = static_cast<const T*>(dy);
    op.dx = static_cast<T*>(dx);
    op.accumulate = accumulate;
    launch_elementwise(stream, op, n, all_aligned16(y, dy, dx), "relu_backward");
  });
}

void add_forward(cudaStream_t stream, DType t, const void* a, const void* b, void* y, int64_t n) {
  dispatch_float(t, "add_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    AddOp<T> op;
    op.a = static_cast<const T*>(a);
    op.b = static_cast<const T*>(b);
    op.y = static_cast<T*>(y);
    launch_elementwise(stream, op, n, all_aligned16(a, b, y), "add_forward");
  });
}

void copy_gradient(cudaStream_t stream, DType t, const void* dy, void* dx, int64_t n, bool accumulate) {
  dispatch_float(t, "copy_gradient", [&](auto tag) {
    using T = typename decltype(tag)::type;
    CopyGradientOp<T> op;
    op.dy = static_cast<const T*>(dy);
    op.dx = static_cast<T*>(dx);
    op.accumulate = accumulate;
    launch_elementwise(stream, op, n, all_aligned16(dy, dx), "copy_gradient");
  });
}

void bias_activation_forward(cudaStream_t stream, DType t, Layout layout, const void* x, const void* bias,
                             bool bias_is_storage_type, const void* residual, void* y, int64_t N, int64_t C,
                             int64_t HW, bool relu) {
  dispatch_float(t, "bias_activation_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (N <= 0 || C <= 0 || HW <= 0) return;
    const auto launch = [&](auto bias_tag) {
      using B = typename decltype(bias_tag)::type;
      BiasActivationOp<T, B> op;
      op.x = static_cast<const T*>(x);
      op.bias = static_cast<const B*>(bias);
      op.residual = static_cast<const T*>(residual);
      op.y = static_cast<T*>(y);
      op.C = C;
      op.HW = HW;
      op.nhwc = layout == Layout::nhwc;
      op.relu = relu;
      const bool aligned = all_aligned16(x, y) && (residual == nullptr || aligned16(residual));
      launch_elementwise(stream, op, N * C * HW, aligned, "bias_activation_forward");
    };
    if (bias_is_storage_type) launch(tag);
    else launch(device_common::Tag<Math<T>>{});
  });
}

// ---- global average pooling

void global_avgpool_forward(cudaStream_t stream, DType t, Layout layout, const void* x, void* y, int64_t N,
                            int64_t C, int64_t HW) {
  dispatch_float(t, "global_avgpool_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (N <= 0 || C <= 0) return;
    if (HW <= 0) throw Error("cuda_pointwise global_avgpool_forward: H * W must be positive");
    if (layout == Layout::nhwc) {
      if (N > 65535) throw Unsupported("cuda_pointwise global_avgpool_forward: batch above 65535");
      const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(N));
      avgpool_nhwc_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), C, HW);
    } else {
      const int64_t planes = N * C;
      const int blocks = grid_for(planes * 32, int64_t{sm_count()} * kBlocksPerSm);
      avgpool_nchw_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), planes,
                                                              HW);
    }
    check_launch("global_avgpool_forward");
  });
}

void global_avgpool_backward(cudaStream_t stream, DType t, Layout layout, const void* dy, void* dx, int64_t N,
                             int64_t C, int64_t HW, bool accumulate) {
  dispatch_float(t, "global_avgpool_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (N <= 0 || C <= 0 || HW <= 0) return;
    AvgpoolBackwardOp<T> op;
    op.dy = static_cast<const T*>(dy);
    op.dx = static_cast<T*>(dx);
    op.C = C;
    op.HW = HW;
    op.inv_area = Math<T>(1) / static_cast<Math<T>>(HW);
    op.nhwc = layout == Layout::nhwc;
    op.accumulate = accumulate;
    launch_elementwise(stream, op, N * C * HW, aligned16(dx), "global_avgpool_backward");
  });
}

void fill(cudaStream_t stream, DType t, void* p, int64_t n, double value) {
  if (t == DType::i32) {
    FillOp<int32_t> op;
    op.p = static_cast<int32_t*>(p);
    op.value = value;
    launch_elementwise(stream, op, n, aligned16(p), "fill");
    return;
  }
  dispatch_float(t, "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    FillOp<T> op;
    op.p = static_cast<T*>(p);
    op.value = value;
    launch_elementwise(stream, op, n, aligned16(p), "fill");
  });
}

void fill_uniform(cudaStream_t stream, DType t, void* p, int64_t n, std::uint64_t seed, double lo, double hi) {
  dispatch_float(t, "fill_uniform", [&](auto tag) {
    using T = typename decltype(tag)::type;
    UniformOp<T> op;
    op.p = static_cast<T*>(p);
    op.seed = seed;
    op.lo = lo;
    op.span = hi - lo;
    launch_elementwise(stream, op, n, aligned16(p), "fill_uniform");
  });
}

void spin(cudaStream_t stream, int64_t nanoseconds) {
  spin_kernel<<<1, 1, 0, stream>>>(std::max<int64_t>(nanoseconds, 0));
  check_launch("spin");
}

}  // namespace ab::nn::cuda_pointwise
