#include "nn/device/cuda_pointwise.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>

#include "backend/cuda/check.h"
#include "core/error.h"
#include "nn/device/cuda_device_common.cuh"

namespace ab::nn::cuda_pointwise {
namespace {

using std::int32_t;
using std::int64_t;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Elementwise grids hold at most this many blocks per SM: one resident wave (8 x 256 threads
// fills an SM's 2048 thread slots) that grid-strides over the rest.
constexpr int kBlocksPerSm = 8;
// LARS norm partials: at most this many blocks, two f64 sums each (lars_scratch_floats).
constexpr int kMaxNormBlocks = 1024;
constexpr int kNormBlocksPerSm = 4;
constexpr int kLossThreads = 1024;

// ---- host helpers

void check_launch(const char* what) { device_common::check_launch("cuda_pointwise", what); }

}  // namespace

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

int grid_for(int64_t items, int64_t max_blocks) {
  const int64_t needed = (items + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<int64_t>(needed, 1, max_blocks));
}

int elementwise_blocks(int64_t items) { return grid_for(items, int64_t{sm_count()} * kBlocksPerSm); }

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
template <typename... P>
bool all_aligned16(const P*... p) {
  return (aligned16(p) && ...);
}

// Calls f(Tag<T>{}) with T the device storage type of float dtype t (f64 included).
template <typename F>
void dispatch_float(DType t, const char* what, F&& f) {
  device_common::dispatch_storage<true>(t, "cuda_pointwise", what, std::forward<F>(f));
}

// Small single values (loss, dloss) whose dtype is chosen at run time, not by template.
enum class ScalarType : int { f32, f16, bf16, f64 };
ScalarType scalar_type(DType t, const char* what) {
  ScalarType s = ScalarType::f32;
  dispatch_float(t, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, __half>) s = ScalarType::f16;
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) s = ScalarType::bf16;
    else if constexpr (std::is_same_v<T, double>) s = ScalarType::f64;
  });
  return s;
}

// ---- device conversions: storage <-> math type (f32; f64 for f64)

template <typename T>
struct MathOf {
  using type = float;
};
template <>
struct MathOf<double> {
  using type = double;
};
template <typename T>
using Math = typename MathOf<T>::type;

__device__ __forceinline__ float to_math(float v) { return v; }
__device__ __forceinline__ double to_math(double v) { return v; }
__device__ __forceinline__ float to_math(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_math(__nv_bfloat16 v) { return __bfloat162float(v); }

// Rounds to nearest even. From double, each narrow type is reached in one rounding (no detour
// through f32 that could round twice).
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ double from_float<double>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__device__ __forceinline__ T from_double(double v);
template <>
__device__ __forceinline__ float from_double<float>(double v) { return __double2float_rn(v); }
template <>
__device__ __forceinline__ double from_double<double>(double v) { return v; }
template <>
__device__ __forceinline__ __half from_double<__half>(double v) { return __double2half(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_double<__nv_bfloat16>(double v) { return __double2bfloat16(v); }

template <typename T>
__device__ __forceinline__ T from_math(float v) { return from_float<T>(v); }
template <typename T>
__device__ __forceinline__ T from_math(double v) { return from_double<T>(v); }

template <typename D, typename S>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<S, D>) return v;
  else if constexpr (std::is_same_v<S, double>) return from_double<D>(v);
  else return from_float<D>(to_math(v));  // f16/bf16/f32 are exact in f32
}

__device__ __forceinline__ double load_scalar(const void* p, ScalarType t) {
  switch (t) {
    case ScalarType::f16: return __half2float(*static_cast<const __half*>(p));
    case ScalarType::bf16: return __bfloat162float(*static_cast<const __nv_bfloat16*>(p));
    case ScalarType::f64: return *static_cast<const double*>(p);
    default: return *static_cast<const float*>(p);
  }
}

__device__ __forceinline__ void store_scalar(void* p, ScalarType t, double v) {
  switch (t) {
    case ScalarType::f16: *static_cast<__half*>(p) = __double2half(v); break;
    case ScalarType::bf16: *static_cast<__nv_bfloat16*>(p) = __double2bfloat16(v); break;
    case ScalarType::f64: *static_cast<double*>(p) = v; break;
    default: *static_cast<float*>(p) = __double2float_rn(v); break;
  }
}

__device__ __forceinline__ bool is_finite_value(float v) { return isfinite(v); }
__device__ __forceinline__ bool is_finite_value(double v) { return isfinite(v); }

// ---- vector access: W consecutive elements as one aligned load or store (16 bytes at most)

using device_common::Chunk;
using device_common::load;
using device_common::store;
using device_common::Tag;

// ---- reductions in a fixed order (the xor butterfly leaves the same sum in every lane)

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the whole block, returned to every thread; every thread of the block must call it.
template <typename A>
__device__ A block_sum(A v) {
  __shared__ A partial[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  return warp_sum(lane < warps ? partial[lane] : A(0));
}

// ---- the elementwise engine: an Op processes W consecutive elements at i (W = Op::kVec on the
// aligned body, 1 on the tail). begin() runs once per thread (reads device flags), skipped()
// ends the kernel without touching memory, end() runs once per thread after the loops.

struct OpBase {
  __device__ void begin() {}
  __device__ bool skipped() const { return false; }
  __device__ void end() {}
};

template <typename Op>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(Op op, int64_t n, bool vectorised) {
  op.begin();
  if (op.skipped()) return;
  constexpr int V = Op::kVec;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorised) {
    const int64_t chunks = n / V;
    for (int64_t c = first; c < chunks; c += stride) op.template apply<V>(c * V);
    done = chunks * V;
  }
  for (int64_t i = done + first; i < n; i += stride) op.template apply<1>(i);
  op.end();
}

template <typename Op>
void launch_elementwise(cudaStream_t stream, const Op& op, int64_t n, bool aligned, const char* what,
                        int blocks = 0) {
  if (n <= 0) return;
  const bool vectorised = aligned && Op::kVec > 1 && n >= Op::kVec;
  const int64_t items = vectorised ? n / Op::kVec + n % Op::kVec : n;
  if (blocks <= 0) blocks = elementwise_blocks(items);
  elementwise_kernel<Op><<<blocks, kThreads, 0, stream>>>(op, n, vectorised);
  check_launch(what);
}

template <typename T>
constexpr int vec_of() {
  return static_cast<int>(16 / sizeof(T));
}

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

// PyTorch's SGD; the step flag is read once per thread.
template <typename T>
struct SgdOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  T* w;
  const T* g;
  T* v;
  Math<T> lr, momentum, weight_decay;
  const int32_t* skip_if;
  bool skip = false;
  __device__ void begin() { skip = skip_if != nullptr && *skip_if != 0; }
  __device__ bool skipped() const { return skip; }
  template <int W>
  __device__ void apply(int64_t i) const {
    auto vw = load<W>(w, i);
    const auto vg = load<W>(g, i);
    auto vv = load<W>(v, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Math<T> wj = to_math(vw.v[j]);
      const Math<T> vel = momentum * to_math(vv.v[j]) + (to_math(vg.v[j]) + weight_decay * wj);
      vv.v[j] = from_math<T>(vel);
      vw.v[j] = from_math<T>(wj - lr * vel);
    }
    store<W>(v, i, vv);
    store<W>(w, i, vw);
  }
};

// LARS pass 1: each block writes its sums of w^2 and g^2 (f64) to partials[2b], partials[2b + 1].
template <typename T>
struct NormsOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* w;
  const T* g;
  double* partials;
  double w2 = 0.0, g2 = 0.0;
  template <int W>
  __device__ void apply(int64_t i) {
    const auto vw = load<W>(w, i);
    const auto vg = load<W>(g, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const double a = to_math(vw.v[j]), b = to_math(vg.v[j]);
      w2 += a * a;
      g2 += b * b;
    }
  }
  __device__ void end() {
    const double bw = block_sum(w2);
    const double bg = block_sum(g2);
    if (threadIdx.x == 0) {
      partials[2 * blockIdx.x] = bw;
      partials[2 * blockIdx.x + 1] = bg;
    }
  }
};

// LARS pass 2: every block sums the partials in the same order (so all agree on the trust ratio
// bit for bit), then applies the momentum step with the layer's learning rate.
template <typename T>
struct LarsOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  T* w;
  const T* g;
  T* v;
  Math<T> momentum, weight_decay;
  double lr, trust_coefficient, weight_decay_f64, epsilon;
  const double* partials;  // null: adapt off, trust 1
  int partial_blocks;
  const int32_t* skip_if;
  bool skip = false;
  Math<T> rate = 0;
  __device__ void begin() {
    skip = skip_if != nullptr && *skip_if != 0;
    if (skip) return;  // every thread of the grid reads the same flag, so none reaches block_sum
    double trust = 1.0;
    if (partials != nullptr) {
      double w2 = 0.0, g2 = 0.0;
      for (int b = threadIdx.x; b < partial_blocks; b += blockDim.x) {
        w2 += partials[2 * b];
        g2 += partials[2 * b + 1];
      }
      w2 = block_sum(w2);
      g2 = block_sum(g2);
      const double wn = sqrt(w2), gn = sqrt(g2);
      if (wn > 0.0 && gn > 0.0) trust = trust_coefficient * wn / (gn + weight_decay_f64 * wn + epsilon);
    }
    rate = static_cast<Math<T>>(lr * trust);
  }
  __device__ bool skipped() const { return skip; }
  template <int W>
  __device__ void apply(int64_t i) const {
    auto vw = load<W>(w, i);
    const auto vg = load<W>(g, i);
    auto vv = load<W>(v, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Math<T> wj = to_math(vw.v[j]);
      const Math<T> vel = momentum * to_math(vv.v[j]) + rate * (to_math(vg.v[j]) + weight_decay * wj);
      vv.v[j] = from_math<T>(vel);
      vw.v[j] = from_math<T>(wj - vel);
    }
    store<W>(v, i, vv);
    store<W>(w, i, vw);
  }
};

template <typename S, typename D>
struct CastOp : OpBase {
  static constexpr int kVec = static_cast<int>(16 / std::max(sizeof(S), sizeof(D)));
  const S* src;
  D* dst;
  template <int W>
  __device__ void apply(int64_t i) const {
    const auto a = load<W>(src, i);
    Chunk<D, W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) o.v[j] = convert<D>(a.v[j]);
    store<W>(dst, i, o);
  }
};

// PyTorch's _amp_foreach_non_finite_check_and_unscale_ (the scaled input is checked), and as the
// reference, the unscaled value too.
template <typename T>
struct UnscaleOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  T* g;
  const float* scale;
  int32_t* found;
  Math<T> inv = 1;
  bool bad = false;
  __device__ void begin() { inv = static_cast<Math<T>>(1.0f / *scale); }
  template <int W>
  __device__ void apply(int64_t i) {
    auto vg = load<W>(g, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Math<T> x = to_math(vg.v[j]);
      const Math<T> y = x * inv;
      bad |= !is_finite_value(x) || !is_finite_value(y);
      vg.v[j] = from_math<T>(y);
    }
    store<W>(g, i, vg);
  }
  // One store per block that saw a non-finite value; every writer stores 1, so order is moot.
  __device__ void end() {
    if (__syncthreads_or(bad) && threadIdx.x == 0) *found = 1;
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

// ---- softmax cross-entropy

__device__ __forceinline__ float math_exp(float v) { return expf(v); }
__device__ __forceinline__ double math_exp(double v) { return exp(v); }
__device__ __forceinline__ float math_log(float v) { return logf(v); }
__device__ __forceinline__ double math_log(double v) { return log(v); }
__device__ __forceinline__ float math_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double math_max(double a, double b) { return fmax(a, b); }

template <typename A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = math_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Max or sum over the threads of one row: a warp (kWarpsPerRow 1) or the whole block (8).
template <int kWarpsPerRow, typename A>
__device__ __forceinline__ A row_reduce(A v, bool is_max, A* shared) {
  v = is_max ? warp_max(v) : warp_sum(v);
  if constexpr (kWarpsPerRow == 1) {
    return v;
  } else {
    const int warp = threadIdx.x / 32;
    __syncthreads();  // shared may still be read by the previous reduction
    if (threadIdx.x % 32 == 0) shared[warp] = v;
    __syncthreads();
    const int first = warp / kWarpsPerRow * kWarpsPerRow;
    A r = shared[first];
    for (int k = 1; k < kWarpsPerRow; ++k) r = is_max ? math_max(r, shared[first + k]) : r + shared[first + k];
    return r;
  }
}

// Per row: the max, the sum of exp(z - max), then the probabilities and the row's loss
// log(sum) - (z[label] - max) into row_loss, in the math type of the logits.
template <typename TL, typename TP, int kWarpsPerRow>
__global__ void __launch_bounds__(kThreads)
    softmax_xent_rows_kernel(const TL* logits, const int32_t* labels, TP* probs, double* row_loss, int64_t N,
                             int64_t K) {
  using A = Math<TL>;
  constexpr int kRowsPerBlock = kWarps / kWarpsPerRow;
  constexpr int kWidth = 32 * kWarpsPerRow;
  __shared__ A shared[kWarps];
  const int warp = threadIdx.x / 32;
  const int t = (warp % kWarpsPerRow) * 32 + threadIdx.x % 32;
  // The row loop is uniform across the block, so the block-wide reductions stay in step.
  for (int64_t base = int64_t{blockIdx.x} * kRowsPerBlock; base < N; base += int64_t{gridDim.x} * kRowsPerBlock) {
    const int64_t row = base + warp / kWarpsPerRow;
    const bool valid = row < N;
    const TL* z = logits + (valid ? row : 0) * K;
    A m = -INFINITY;
    if (valid)
      for (int64_t k = t; k < K; k += kWidth) m = math_max(m, to_math(z[k]));
    m = row_reduce<kWarpsPerRow>(m, true, shared);
    A sum = 0;
    if (valid)
      for (int64_t k = t; k < K; k += kWidth) sum += math_exp(to_math(z[k]) - m);
    sum = row_reduce<kWarpsPerRow>(sum, false, shared);
    if (!valid) continue;
    TP* p = probs + row * K;
    for (int64_t k = t; k < K; k += kWidth) p[k] = from_math<TP>(math_exp(to_math(z[k]) - m) / sum);
    if (t == 0) {
      const int32_t label = labels[row];
      row_loss[row] = label >= 0 && label < K ? static_cast<double>(math_log(sum) - (to_math(z[label]) - m))
                                              : __longlong_as_double(0x7ff8000000000000LL);
    }
  }
}

// One block sums the row losses in a fixed order: loss = mean.
__global__ void __launch_bounds__(kLossThreads)
    loss_mean_kernel(const double* row_loss, int64_t N, void* loss, ScalarType loss_t) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) sum += row_loss[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) store_scalar(loss, loss_t, sum / static_cast<double>(N));
}

// Blocks stride over rows, threads along K: one label and dloss read per row, coalesced rows.
template <typename TP, typename TG>
__global__ void __launch_bounds__(kThreads)
    softmax_xent_backward_kernel(const TP* probs, const int32_t* labels, const void* dloss, ScalarType dloss_t,
                                 TG* dlogits, int64_t N, int64_t K, bool accumulate) {
  using A = Math<TG>;
  const A scale = static_cast<A>(load_scalar(dloss, dloss_t)) / static_cast<A>(N);
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t label = labels[row];
    const TP* p = probs + row * K;
    TG* d = dlogits + row * K;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
      const A g = scale * (static_cast<A>(to_math(p[k])) - (k == label ? A(1) : A(0)));
      d[k] = from_math<TG>(accumulate ? to_math(d[k]) + g : g);
    }
  }
}

// ---- learned compression

__device__ __forceinline__ float math_rint(float v) { return rintf(v); }  // nearest, ties to even
__device__ __forceinline__ double math_rint(double v) { return rint(v); }

template <typename T>
struct RoundOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* x;
  T* y;
  Math<T> step;
  template <int W>
  __device__ void apply(int64_t i) const {
    const auto a = load<W>(x, i);
    Chunk<T, W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) o.v[j] = from_math<T>(step * math_rint(to_math(a.v[j]) / step));
    store<W>(y, i, o);
  }
};

// Blocks of the rate-distortion reduction: a fixed count, so the order of every sum is fixed.
constexpr int kRdBlocks = 256;

// Each block writes its f64 sums of (x_hat - x)^2 and |latent| to partials[2b] and [2b + 1]; each
// thread strides over the elements in a fixed order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rd_partials_kernel(const T* x_hat, const T* x, int64_t n_x, const T* latent, int64_t n_latent,
                       double* partials) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  double squares = 0.0, l1 = 0.0;
  for (int64_t i = first; i < n_x; i += stride) {
    const double e = static_cast<double>(to_math(x_hat[i])) - static_cast<double>(to_math(x[i]));
    squares += e * e;
  }
  for (int64_t i = first; i < n_latent; i += stride) l1 += fabs(static_cast<double>(to_math(latent[i])));
  const double bs = block_sum(squares);
  const double bl = block_sum(l1);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = bs;
    partials[2 * blockIdx.x + 1] = bl;
  }
}

__global__ void __launch_bounds__(kRdBlocks)
    rd_total_kernel(const double* partials, int64_t n_x, int64_t n_latent, double lambda, void* loss, void* mse,
                    ScalarType loss_t) {
  const double squares = block_sum(partials[2 * threadIdx.x]);
  const double l1 = block_sum(partials[2 * threadIdx.x + 1]);
  if (threadIdx.x == 0) {
    const double distortion = squares / static_cast<double>(n_x);
    store_scalar(mse, loss_t, distortion);
    store_scalar(loss, loss_t, distortion + lambda * l1 / static_cast<double>(n_latent));
  }
}

// dx_hat (+)= dloss * scale * (x_hat - x), dloss read once per thread.
template <typename T>
struct MseGradOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* x_hat;
  const T* x;
  T* dx;
  const void* dloss;
  ScalarType dloss_t;
  double scale;  // 2 / n_x
  Math<T> g = 0;
  bool accumulate;
  __device__ void begin() { g = static_cast<Math<T>>(load_scalar(dloss, dloss_t) * scale); }
  template <int W>
  __device__ void apply(int64_t i) const {
    const auto a = load<W>(x_hat, i);
    const auto b = load<W>(x, i);
    Chunk<T, W> d;
    if (accumulate) d = load<W>(dx, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Math<T> v = g * (to_math(a.v[j]) - to_math(b.v[j]));
      d.v[j] = from_math<T>(accumulate ? to_math(d.v[j]) + v : v);
    }
    store<W>(dx, i, d);
  }
};

// dlatent (+)= dloss * scale * sign(latent).
template <typename T>
struct L1GradOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* latent;
  T* dl;
  const void* dloss;
  ScalarType dloss_t;
  double scale;  // lambda / n_latent
  Math<T> g = 0;
  bool accumulate;
  __device__ void begin() { g = static_cast<Math<T>>(load_scalar(dloss, dloss_t) * scale); }
  template <int W>
  __device__ void apply(int64_t i) const {
    const auto a = load<W>(latent, i);
    Chunk<T, W> d;
    if (accumulate) d = load<W>(dl, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Math<T> v = to_math(a.v[j]);
      const Math<T> s = v > Math<T>(0) ? g : v < Math<T>(0) ? -g : Math<T>(0);
      d.v[j] = from_math<T>(accumulate ? to_math(d.v[j]) + s : s);
    }
    store<W>(dl, i, d);
  }
};

// ---- loss scale

// Products in f64 then rounded, as the reference forms them.
__global__ void update_loss_scale_kernel(float* scale, int32_t* good_steps, int32_t* found, double growth,
                                         double backoff, int64_t growth_interval) {
  if (*found != 0) {
    *scale = __double2float_rn(*scale * backoff);
    *good_steps = 0;
  } else {
    const int64_t good = int64_t{*good_steps} + 1;
    if (good >= growth_interval) {
      const float grown = __double2float_rn(*scale * growth);
      if (isfinite(grown)) *scale = grown;  // as GradScaler: never grow into Inf
      *good_steps = 0;
    } else {
      *good_steps = static_cast<int32_t>(good);
    }
  }
  *found = 0;
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

// ---- softmax cross-entropy

std::int64_t softmax_xent_scratch_floats(std::int64_t N) { return 2 * std::max<int64_t>(N, 1); }  // f64 per row

void softmax_xent_forward(cudaStream_t stream, DType logits_t, const void* logits, const int32_t* labels,
                          DType probs_t, void* probs, DType loss_t, void* loss, int64_t N, int64_t K,
                          float* scratch) {
  const ScalarType lt = scalar_type(loss_t, "softmax_xent_forward (loss)");
  if (N <= 0 || K <= 0) throw Error("cuda_pointwise softmax_xent_forward: N and K must be positive");
  if (scratch == nullptr || reinterpret_cast<std::uintptr_t>(scratch) % alignof(double) != 0)
    throw Error("cuda_pointwise softmax_xent_forward: scratch must be 8-byte aligned device memory of "
                "softmax_xent_scratch_floats(N) floats");
  auto* row_loss = reinterpret_cast<double*>(scratch);
  dispatch_float(logits_t, "softmax_xent_forward (logits)", [&](auto ltag) {
    using TL = typename decltype(ltag)::type;
    dispatch_float(probs_t, "softmax_xent_forward (probs)", [&](auto ptag) {
      using TP = typename decltype(ptag)::type;
      const auto* z = static_cast<const TL*>(logits);
      auto* p = static_cast<TP*>(probs);
      const int64_t max_blocks = int64_t{sm_count()} * kBlocksPerSm;
      // A warp per row while a row is a few reads per lane; a whole block per longer row.
      if (K <= 2048) {
        const int blocks = static_cast<int>(std::clamp<int64_t>((N + kWarps - 1) / kWarps, 1, max_blocks));
        softmax_xent_rows_kernel<TL, TP, 1><<<blocks, kThreads, 0, stream>>>(z, labels, p, row_loss, N, K);
      } else {
        const int blocks = static_cast<int>(std::clamp<int64_t>(N, 1, max_blocks));
        softmax_xent_rows_kernel<TL, TP, kWarps><<<blocks, kThreads, 0, stream>>>(z, labels, p, row_loss, N, K);
      }
    });
  });
  check_launch("softmax_xent_forward (rows)");
  loss_mean_kernel<<<1, kLossThreads, 0, stream>>>(row_loss, N, loss, lt);
  check_launch("softmax_xent_forward (mean)");
}

void softmax_xent_backward(cudaStream_t stream, DType probs_t, const void* probs, const int32_t* labels,
                           DType dloss_t, const void* dloss, DType dlogits_t, void* dlogits, int64_t N, int64_t K,
                           bool accumulate) {
  const ScalarType dt = scalar_type(dloss_t, "softmax_xent_backward (dloss)");
  if (N <= 0 || K <= 0) return;
  dispatch_float(probs_t, "softmax_xent_backward (probs)", [&](auto ptag) {
    using TP = typename decltype(ptag)::type;
    dispatch_float(dlogits_t, "softmax_xent_backward (dlogits)", [&](auto gtag) {
      using TG = typename decltype(gtag)::type;
      const int blocks = static_cast<int>(std::clamp<int64_t>(N, 1, int64_t{sm_count()} * kBlocksPerSm));
      softmax_xent_backward_kernel<TP, TG><<<blocks, kThreads, 0, stream>>>(
          static_cast<const TP*>(probs), labels, dloss, dt, static_cast<TG*>(dlogits), N, K, accumulate);
    });
  });
  check_launch("softmax_xent_backward");
}

// ---- learned compression

void round_forward(cudaStream_t stream, DType t, const void* x, void* y, int64_t n, double step) {
  dispatch_float(t, "round_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RoundOp<T> op;
    op.x = static_cast<const T*>(x);
    op.y = static_cast<T*>(y);
    op.step = static_cast<Math<T>>(step);
    launch_elementwise(stream, op, n, all_aligned16(x, y), "round_forward");
  });
}

std::int64_t rate_distortion_scratch_floats() { return 4 * kRdBlocks; }  // two f64 per block

void rate_distortion_forward(cudaStream_t stream, DType t, const void* x_hat, const void* x, int64_t n_x,
                             const void* latent, int64_t n_latent, double lambda, DType loss_t, void* loss, void* mse,
                             float* scratch) {
  const ScalarType lt = scalar_type(loss_t, "rate_distortion_forward (loss)");
  if (n_x <= 0 || n_latent <= 0) throw Error("cuda_pointwise rate_distortion_forward: inputs must not be empty");
  if (scratch == nullptr || reinterpret_cast<std::uintptr_t>(scratch) % alignof(double) != 0)
    throw Error("cuda_pointwise rate_distortion_forward: scratch must be 8-byte aligned device memory of "
                "rate_distortion_scratch_floats() floats");
  auto* partials = reinterpret_cast<double*>(scratch);
  dispatch_float(t, "rate_distortion_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    rd_partials_kernel<T><<<kRdBlocks, kThreads, 0, stream>>>(static_cast<const T*>(x_hat), static_cast<const T*>(x),
                                                             n_x, static_cast<const T*>(latent), n_latent, partials);
  });
  check_launch("rate_distortion_forward (partials)");
  rd_total_kernel<<<1, kRdBlocks, 0, stream>>>(partials, n_x, n_latent, lambda, loss, mse, lt);
  check_launch("rate_distortion_forward (total)");
}

void rate_distortion_backward(cudaStream_t stream, DType t, const void* x_hat, const void* x, int64_t n_x,
                              const void* latent, int64_t n_latent, double lambda, DType dloss_t, const void* dloss,
                              void* dx_hat, bool accumulate_x_hat, void* dlatent, bool accumulate_latent) {
  const ScalarType dt = scalar_type(dloss_t, "rate_distortion_backward (dloss)");
  dispatch_float(t, "rate_distortion_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (dx_hat != nullptr && n_x > 0) {
      MseGradOp<T> op;
      op.x_hat = static_cast<const T*>(x_hat);
      op.x = static_cast<const T*>(x);
      op.dx = static_cast<T*>(dx_hat);
      op.dloss = dloss;
      op.dloss_t = dt;
      op.scale = 2.0 / static_cast<double>(n_x);
      op.accumulate = accumulate_x_hat;
      launch_elementwise(stream, op, n_x, all_aligned16(x_hat, x, dx_hat), "rate_distortion_backward (x_hat)");
    }
    if (dlatent != nullptr && n_latent > 0) {
      L1GradOp<T> op;
      op.latent = static_cast<const T*>(latent);
      op.dl = static_cast<T*>(dlatent);
      op.dloss = dloss;
      op.dloss_t = dt;
      op.scale = lambda / static_cast<double>(n_latent);
      op.accumulate = accumulate_latent;
      launch_elementwise(stream, op, n_latent, all_aligned16(latent, dlatent), "rate_distortion_backward (latent)");
    }
  });
}

// ---- optimizers

void sgd_update(cudaStream_t stream, DType t, void* w, const void* g, void* v, int64_t n, const SgdStep& s,
                const int32_t* skip_if) {
  dispatch_float(t, "sgd_update", [&](auto tag) {
    using T = typename decltype(tag)::type;
    SgdOp<T> op;
    op.w = static_cast<T*>(w);
    op.g = static_cast<const T*>(g);
    op.v = static_cast<T*>(v);
    op.lr = static_cast<Math<T>>(s.learning_rate);
    op.momentum = static_cast<Math<T>>(s.momentum);
    op.weight_decay = static_cast<Math<T>>(s.weight_decay);
    op.skip_if = skip_if;
    launch_elementwise(stream, op, n, all_aligned16(w, g, v), "sgd_update");
  });
}

std::int64_t lars_scratch_floats() { return 4 * kMaxNormBlocks; }  // two f64 per block

void lars_update(cudaStream_t stream, DType t, void* w, const void* g, void* v, int64_t n, const LarsStep& s,
                 const int32_t* skip_if, float* scratch) {
  dispatch_float(t, "lars_update", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n <= 0) return;
    const bool aligned = all_aligned16(w, g, v);
    double* partials = nullptr;
    int partial_blocks = 0;
    if (s.adapt) {
      if (scratch == nullptr || reinterpret_cast<std::uintptr_t>(scratch) % alignof(double) != 0)
        throw Error("cuda_pointwise lars_update: scratch must be 8-byte aligned device memory of "
                    "lars_scratch_floats() floats");
      NormsOp<T> norms;
      norms.w = static_cast<const T*>(w);
      norms.g = static_cast<const T*>(g);
      norms.partials = partials = reinterpret_cast<double*>(scratch);
      const int64_t items = aligned && n >= NormsOp<T>::kVec ? n / NormsOp<T>::kVec + n % NormsOp<T>::kVec : n;
      partial_blocks = grid_for(items, std::min<int64_t>(kMaxNormBlocks, int64_t{sm_count()} * kNormBlocksPerSm));
      launch_elementwise(stream, norms, n, aligned, "lars_update (norms)", partial_blocks);
    }
    LarsOp<T> op;
    op.w = static_cast<T*>(w);
    op.g = static_cast<const T*>(g);
    op.v = static_cast<T*>(v);
    op.momentum = static_cast<Math<T>>(s.momentum);
    op.weight_decay = static_cast<Math<T>>(s.weight_decay);
    op.lr = s.learning_rate;
    op.trust_coefficient = s.trust_coefficient;
    op.weight_decay_f64 = s.weight_decay;
    op.epsilon = s.epsilon;
    op.partials = partials;
    op.partial_blocks = partial_blocks;
    op.skip_if = skip_if;
    launch_elementwise(stream, op, n, aligned, "lars_update");
  });
}

// ---- mixed precision

void cast(cudaStream_t stream, DType src_t, const void* src, DType dst_t, void* dst, int64_t n) {
  dispatch_float(src_t, "cast (source)", [&](auto stag) {
    using S = typename decltype(stag)::type;
    dispatch_float(dst_t, "cast (destination)", [&](auto dtag) {
      using D = typename decltype(dtag)::type;
      CastOp<S, D> op;
      op.src = static_cast<const S*>(src);
      op.dst = static_cast<D*>(dst);
      launch_elementwise(stream, op, n, all_aligned16(src, dst), "cast");
    });
  });
}

void unscale_and_check(cudaStream_t stream, DType t, void* g, int64_t n, const float* scale,
                       int32_t* found_nonfinite) {
  dispatch_float(t, "unscale_and_check", [&](auto tag) {
    using T = typename decltype(tag)::type;
    UnscaleOp<T> op;
    op.g = static_cast<T*>(g);
    op.scale = scale;
    op.found = found_nonfinite;
    launch_elementwise(stream, op, n, aligned16(g), "unscale_and_check");
  });
}

void update_loss_scale(cudaStream_t stream, const LossScaleRule& rule, float* scale, int32_t* good_steps,
                       int32_t* found_nonfinite) {
  if (rule.growth_interval < 1)
    throw Error("cuda_pointwise update_loss_scale: growth_interval must be at least 1, not " +
                std::to_string(rule.growth_interval));
  update_loss_scale_kernel<<<1, 1, 0, stream>>>(scale, good_steps, found_nonfinite, rule.growth, rule.backoff,
                                                rule.growth_interval);
  check_launch("update_loss_scale");
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
