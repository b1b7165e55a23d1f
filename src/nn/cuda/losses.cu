// Softmax cross-entropy and the learned-compression losses (rounding, rate-distortion) with their
// gradients (pointwise.h). The shared engine: pointwise_common.cuh.
#include "nn/cuda/pointwise_common.cuh"

namespace ab::nn::cuda_pointwise {
namespace {

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

}  // namespace

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

}  // namespace ab::nn::cuda_pointwise
