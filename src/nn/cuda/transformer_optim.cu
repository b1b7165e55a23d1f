// The transformer family's reductions and steps (transformer.h): the global gradient norm, AdamW
// over many tensors (their pointers in the kernel's parameters), the device step counter and the
// classifier's fused cross-entropy (a block per row staged in shared memory, online max and sum,
// dlogits in place).
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "nn/cuda/transformer_common.cuh"

namespace ab::nn::cuda_transformer {
namespace {

// ---- many tensors per launch: chunks of kChunk elements, first_chunk[k] the first of tensor k's.

constexpr int kSquaresPerLaunch = 256;
constexpr int kAdamWPerLaunch = 128;
constexpr int64_t kChunk = 8192;

template <int K>
__device__ __forceinline__ int tensor_of(const int64_t (&first_chunk)[K + 1], int count, int64_t chunk) {
  int lo = 0, hi = count;  // the last k with first_chunk[k] <= chunk
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (first_chunk[mid] <= chunk) lo = mid;
    else hi = mid;
  }
  return lo;
}

struct SquaresBatch {
  const void* data[kSquaresPerLaunch];
  int64_t n[kSquaresPerLaunch];
  int64_t first_chunk[kSquaresPerLaunch + 1];
  int type[kSquaresPerLaunch];  // 0 f32, 1 f16, 2 bf16
  int count;
};
static_assert(sizeof(SquaresBatch) < 32000, "kernel parameters are limited to 32,764 bytes");

template <typename T>
__device__ float chunk_squares(const T* p, int64_t begin, int64_t end, bool vector_ok) {
  float acc = 0.0f;
  constexpr int V = vec_of<T>();
  int64_t i = begin + int64_t{threadIdx.x} * V;
  if (vector_ok) {
    for (; i + V <= end; i += int64_t{blockDim.x} * V) {
      const auto a = load<V>(p, i);
#pragma unroll
      for (int j = 0; j < V; ++j) acc += to_f32(a.v[j]) * to_f32(a.v[j]);
    }
  }
  // The tail (or all, unaligned) element by element, from where the vector loop stopped.
  const int64_t tail = vector_ok ? std::max(begin, end - (end - begin) % V) : begin;
  for (int64_t k = tail + threadIdx.x; k < end; k += blockDim.x) acc += to_f32(p[k]) * to_f32(p[k]);
  return acc;
}

// Each block sums chunks b, b + grid, ... and writes its f32 sum to partials[b].
__global__ void __launch_bounds__(kThreads) squares_kernel(const SquaresBatch batch, float* partials) {
  float acc = 0.0f;
  const int64_t chunks = batch.first_chunk[batch.count];
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int k = tensor_of<kSquaresPerLaunch>(batch.first_chunk, batch.count, chunk);
    const int64_t begin = (chunk - batch.first_chunk[k]) * kChunk, end = std::min(begin + kChunk, batch.n[k]);
    const bool vector_ok = aligned(batch.data[k], 16);
    switch (batch.type[k]) {
      case 1: acc += chunk_squares(static_cast<const __half*>(batch.data[k]), begin, end, vector_ok); break;
      case 2: acc += chunk_squares(static_cast<const __nv_bfloat16*>(batch.data[k]), begin, end, vector_ok); break;
      default: acc += chunk_squares(static_cast<const float*>(batch.data[k]), begin, end, vector_ok); break;
    }
  }
  const float total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// One block: the partials summed in f64 in a fixed order.
__global__ void __launch_bounds__(kThreads) squares_total_kernel(const float* partials, int64_t n, float* out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) *out = static_cast<float>(total);
}

// Grid of the norm's first stage, per launch: fixed by the SM count, so the order is too.
int squares_grid() { return cuda_pointwise::sm_count() * 2; }

// ---- widening casts: many 16-bit tensors into f32 ones, four elements a thread per step

constexpr int kWidenPerLaunch = 256;

struct WidenBatch {
  const void* src[kWidenPerLaunch];
  float* dst[kWidenPerLaunch];
  int64_t n[kWidenPerLaunch];
  int64_t first_chunk[kWidenPerLaunch + 1];
  int count;
};
static_assert(sizeof(WidenBatch) < 32000, "kernel parameters are limited to 32,764 bytes");

template <typename S, bool kPlain>
__global__ void __launch_bounds__(kThreads) widen_kernel(const WidenBatch batch, const WidenMode mode) {
  const int64_t chunks = batch.first_chunk[batch.count];
  // The plain widening stores; an accumulated or scaled one reads the destination too.
  const auto out = [&](float old_value, float v) {
    return kPlain ? v : mode.scale * (mode.accumulate ? old_value + v : v);
  };
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int k = tensor_of<kWidenPerLaunch>(batch.first_chunk, batch.count, chunk);
    const int64_t begin = (chunk - batch.first_chunk[k]) * kChunk, end = std::min(begin + kChunk, batch.n[k]);
    const S* src = static_cast<const S*>(batch.src[k]);
    float* dst = batch.dst[k];
    const bool vector_ok = aligned(src, 4 * sizeof(S) >= 16 ? 16 : 8) && aligned(dst, 16);
    int64_t i = begin + int64_t{threadIdx.x} * 4;
    if (vector_ok)
      for (; i + 4 <= end; i += int64_t{blockDim.x} * 4) {
        const Chunk<S, 4> v = load<4>(src, i);
        float4 d = make_float4(0.f, 0.f, 0.f, 0.f);
        if (!kPlain && mode.accumulate) d = *reinterpret_cast<const float4*>(dst + i);
        *reinterpret_cast<float4*>(dst + i) = make_float4(out(d.x, to_f32(v.v[0])), out(d.y, to_f32(v.v[1])),
                                                          out(d.z, to_f32(v.v[2])), out(d.w, to_f32(v.v[3])));
      }
    for (; i < end; i += int64_t{blockDim.x} * 4)
      for (int64_t j = i; j < std::min(i + 4, end); ++j)
        dst[j] = out(!kPlain && mode.accumulate ? dst[j] : 0.f, to_f32(src[j]));
  }
}

// ---- AdamW

struct AdamWBatch {
  float* w[kAdamWPerLaunch];
  const float* g[kAdamWPerLaunch];
  float* m[kAdamWPerLaunch];
  float* v[kAdamWPerLaunch];
  void* copy[kAdamWPerLaunch];
  float weight_decay[kAdamWPerLaunch];
  int64_t n[kAdamWPerLaunch];
  int64_t first_chunk[kAdamWPerLaunch + 1];
  int count;
};
static_assert(sizeof(AdamWBatch) < 32000, "kernel parameters are limited to 32,764 bytes");

struct AdamWDevice {
  float lr, beta1, beta2, epsilon, max_grad_norm;
  // 1 - beta and beta itself from the host's doubles: 1.0f - 0.99f is 0.01 to 1e-6 only, which
  // a second moment of small gradients would carry; the bias corrections' powers take the doubles.
  float one_minus_beta1, one_minus_beta2;
  double beta1_exact, beta2_exact;
  int64_t step;
  const int32_t* step_count;
  const float* grad_norm_squared;
  const int32_t* skip_if;
};

struct AdamWRates {
  float clip, correction1, correction2;
};

template <typename C>
__device__ __forceinline__ void adamw_element(const AdamWDevice& s, const AdamWRates& r, float wd, float* w,
                                              const float* g, float* m, float* v, C* copy, int64_t i) {
  const float grad = g[i] * r.clip, weight = w[i];
  const float mom = s.beta1 * m[i] + s.one_minus_beta1 * grad;
  const float var = s.beta2 * v[i] + s.one_minus_beta2 * grad * grad;
  m[i] = mom;
  v[i] = var;
  const float update = mom / r.correction1 / (sqrtf(var / r.correction2) + s.epsilon);
  const float next = weight - s.lr * (update + wd * weight);
  w[i] = next;
  if constexpr (!std::is_same_v<C, float>) {
    if (copy != nullptr) copy[i] = from_f32<C>(next);
  }
}

// The step's run-time scalars, read on the device: the step number, the clip factor.
__device__ AdamWRates adamw_rates(const AdamWDevice& s) {
  const int64_t step = s.step_count != nullptr ? int64_t{*s.step_count} : s.step;
  AdamWRates r{1.0f, static_cast<float>(1.0 - pow(s.beta1_exact, static_cast<double>(step))),
               static_cast<float>(1.0 - pow(s.beta2_exact, static_cast<double>(step)))};
  if (s.grad_norm_squared != nullptr && s.max_grad_norm > 0.0f) {
    const float norm = sqrtf(*s.grad_norm_squared);
    if (norm > s.max_grad_norm) r.clip = s.max_grad_norm / norm;
  }
  return r;
}

template <typename C>
__global__ void __launch_bounds__(kThreads) adamw_kernel(const AdamWBatch batch, const AdamWDevice s) {
  if (s.skip_if != nullptr && *s.skip_if != 0) return;
  const AdamWRates r = adamw_rates(s);
  const int64_t chunks = batch.first_chunk[batch.count];
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int k = tensor_of<kAdamWPerLaunch>(batch.first_chunk, batch.count, chunk);
    const int64_t begin = (chunk - batch.first_chunk[k]) * kChunk, end = std::min(begin + kChunk, batch.n[k]);
    float *w = batch.w[k], *m = batch.m[k], *v = batch.v[k];
    const float* g = batch.g[k];
    C* copy = static_cast<C*>(batch.copy[k]);
    const bool vector_ok = aligned(w, 16) && aligned(g, 16) && aligned(m, 16) && aligned(v, 16) && aligned(copy, 8);
    int64_t i = begin + int64_t{threadIdx.x} * 4;
    if (vector_ok) {
      for (; i + 4 <= end; i += int64_t{blockDim.x} * 4) {
        // Four elements per thread: the compiler merges the four into 16-byte accesses.
        float4 wv = *reinterpret_cast<float4*>(w + i), mv = *reinterpret_cast<float4*>(m + i);
        float4 vv = *reinterpret_cast<float4*>(v + i);
        const float4 gv = *reinterpret_cast<const float4*>(g + i);
        float ws[4] = {wv.x, wv.y, wv.z, wv.w}, ms[4] = {mv.x, mv.y, mv.z, mv.w}, vs[4] = {vv.x, vv.y, vv.z, vv.w};
        const float gs[4] = {gv.x, gv.y, gv.z, gv.w};
        C cs[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) adamw_element<C>(s, r, batch.weight_decay[k], ws, gs, ms, vs, cs, j);
        *reinterpret_cast<float4*>(w + i) = make_float4(ws[0], ws[1], ws[2], ws[3]);
        *reinterpret_cast<float4*>(m + i) = make_float4(ms[0], ms[1], ms[2], ms[3]);
        *reinterpret_cast<float4*>(v + i) = make_float4(vs[0], vs[1], vs[2], vs[3]);
        if constexpr (!std::is_same_v<C, float>) {
          if (copy != nullptr) {
            Chunk<C, 4> out;
#pragma unroll
            for (int j = 0; j < 4; ++j) out.v[j] = cs[j];
            store<4>(copy, i, out);
          }
        }
      }
    }
    const int64_t tail = vector_ok ? std::max(begin, end - (end - begin) % 4) : begin;
    for (int64_t e = tail + threadIdx.x; e < end; e += blockDim.x)
      adamw_element<C>(s, r, batch.weight_decay[k], w, g, m, v, copy, e);
  }
}

__global__ void count_step_kernel(int32_t* counter, const int32_t* skip_if) {
  if (skip_if == nullptr || *skip_if == 0) ++*counter;
}

// ---- the fused cross-entropy

// A row per block of 512 threads. Where the row fits in shared memory (a 50304-wide bf16 row is
// 100 KB: two blocks per SM), it is staged there on its one read from global memory and dlogits
// come from the copy, so the logits are read once and dlogits written once; two rows per SM keep
// one block's loads overlapping the other's reductions and stores. Wider rows are read twice.
constexpr int kLossThreads = 512;
constexpr int kLossUnroll = 4;  // 16-byte loads in flight per thread

template <typename T>
__device__ __forceinline__ float exp_of(float v) {
  if constexpr (std::is_same_v<T, float>) return expf(v);
  else return __expf(v);  // a few ulps of f32: far below a 16-bit result's rounding
}

// (max, sum of exp(x - max)) pairs combined; commutative bit for bit, so the xor butterfly leaves
// the same pair in every lane.
struct MaxSum {
  float max, sum;
};
template <typename T>
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float top = fmaxf(a.max, b.max);
  const float ea = a.max == -INFINITY ? 0.0f : a.sum * exp_of<T>(a.max - top);
  const float eb = b.max == -INFINITY ? 0.0f : b.sum * exp_of<T>(b.max - top);
  return {top, ea + eb};
}

// acc with V more values folded in: one rescale for the chunk.
template <typename T, int V>
__device__ __forceinline__ MaxSum fold(MaxSum acc, const Chunk<T, V>& a) {
  float top = acc.max;
#pragma unroll
  for (int j = 0; j < V; ++j) top = fmaxf(top, to_f32(a.v[j]));
  float sum = acc.max == -INFINITY ? 0.0f : acc.sum * exp_of<T>(acc.max - top);
#pragma unroll
  for (int j = 0; j < V; ++j) sum += exp_of<T>(to_f32(a.v[j]) - top);
  return {top, sum};
}

template <typename T>
__device__ MaxSum block_max_sum(MaxSum v) {
  __shared__ MaxSum partial[32];
  for (int offset = 16; offset > 0; offset >>= 1)
    v = combine<T>(v, {__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)});
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < blockDim.x / 32 ? partial[lane] : MaxSum{-INFINITY, 0.0f};
  for (int offset = 16; offset > 0; offset >>= 1)
    v = combine<T>(v, {__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)});
  return v;
}

// One thread: the scored rows (labels >= 0).
__global__ void __launch_bounds__(1024) count_scored_kernel(const int32_t* labels, int64_t rows, int32_t* scored) {
  int count = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) count += labels[i] >= 0 ? 1 : 0;
  const int total = block_sum(count);
  if (threadIdx.x == 0) *scored = total;
}

// The row's online (max, sum) from global memory, kLossUnroll chunks of V per thread in flight;
// `staged` (when not null) receives a copy of the row.
template <typename T, int V>
__device__ MaxSum row_max_sum(const T* x, T* staged, int64_t vocab) {
  constexpr int64_t step = int64_t{kLossThreads} * V;
  const int64_t body = vocab - vocab % V;
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t base = int64_t{threadIdx.x} * V; base < body; base += step * kLossUnroll) {
    Chunk<T, V> a[kLossUnroll];
#pragma unroll
    for (int u = 0; u < kLossUnroll; ++u)
      if (base + u * step < body) a[u] = load<V>(x, base + u * step);
#pragma unroll
    for (int u = 0; u < kLossUnroll; ++u) {
      if (base + u * step >= body) break;
      if (staged != nullptr) store<V>(staged, base + u * step, a[u]);
      acc = fold<T, V>(acc, a[u]);
    }
  }
  for (int64_t i = body + threadIdx.x; i < vocab; i += blockDim.x) {
    const T v = x[i];
    if (staged != nullptr) staged[i] = v;
    acc = combine<T>(acc, {to_f32(v), 1.0f});
  }
  return acc;
}

// A block per row: the online max and sum over the row, the row's loss, then dlogits written over
// the row from the staged copy (kStaged) or from a second read of the logits (in place allowed:
// each element is read before the same thread writes it).
template <typename T, int V, bool kStaged>
__global__ void __launch_bounds__(kLossThreads, 2)
    xent_row_kernel(const T* logits, int64_t stride, const int32_t* labels, T* dlogits, int64_t dstride,
                    const float* seed, const int32_t* scored, float* row_loss, int64_t vocab) {
  extern __shared__ uint4 staged_row[];  // 16-byte aligned for the chunks
  T* staged = kStaged ? reinterpret_cast<T*>(staged_row) : nullptr;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * stride;
  const int32_t label = labels[row];
  // The label's logit before anything is written (dlogits may be logits).
  const float at_label = label >= 0 && label < vocab ? to_f32(x[label]) : __int_as_float(0x7fc00000);
  const MaxSum total = block_max_sum<T>(row_max_sum<T, V>(x, staged, vocab));  // syncs: the row is staged
  const float lse = total.max + logf(total.sum);
  if (threadIdx.x == 0) row_loss[row] = label < 0 ? 0.0f : lse - at_label;
  if (dlogits == nullptr) return;
  const T* src = kStaged ? staged : x;
  T* d = dlogits + row * dstride;
  const float scale = (seed != nullptr ? *seed : 1.0f) / static_cast<float>(max(*scored, 1));
  const int64_t body = vocab - vocab % V;
#pragma unroll 4
  for (int64_t i = int64_t{threadIdx.x} * V; i < body; i += int64_t{kLossThreads} * V) {
    const auto a = load<V>(src, i);
    Chunk<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float p = exp_of<T>(to_f32(a.v[j]) - lse) - (i + j == label ? 1.0f : 0.0f);
      out.v[j] = from_f32<T>(label < 0 ? 0.0f : scale * p);
    }
    store<V>(d, i, out);
  }
  for (int64_t i = body + threadIdx.x; i < vocab; i += blockDim.x) {
    const float p = exp_of<T>(to_f32(src[i]) - lse) - (i == label ? 1.0f : 0.0f);
    d[i] = from_f32<T>(label < 0 ? 0.0f : scale * p);
  }
}

// One block: the rows' losses summed in f64 in a fixed order, over the scored rows.
__global__ void __launch_bounds__(1024)
    xent_total_kernel(const float* row_loss, int64_t rows, const int32_t* scored, float* loss) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) acc += row_loss[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) *loss = *scored > 0 ? static_cast<float>(total / *scored) : 0.0f;
}

}  // namespace

int64_t sum_squares_scratch_bytes(int64_t tensors) {
  const int64_t launches = std::max<int64_t>((tensors + kSquaresPerLaunch - 1) / kSquaresPerLaunch, 1);
  return launches * squares_grid() * 4;
}

void sum_squares(cudaStream_t stream, const std::vector<SquaresTensor>& tensors, float* out, float* scratch) {
  const int grid = squares_grid();
  int64_t launches = 0;
  for (std::size_t first = 0; first < tensors.size(); first += kSquaresPerLaunch, ++launches) {
    SquaresBatch batch{};
    for (std::size_t i = first; i < std::min(tensors.size(), first + kSquaresPerLaunch); ++i, ++batch.count) {
      const SquaresTensor& t = tensors[i];
      batch.data[batch.count] = t.data;
      batch.n[batch.count] = t.n;
      batch.type[batch.count] = t.t == DType::f16 ? 1 : t.t == DType::bf16 ? 2 : 0;
      batch.first_chunk[batch.count + 1] = batch.first_chunk[batch.count] + (t.n + kChunk - 1) / kChunk;
    }
    squares_kernel<<<grid, kThreads, 0, stream>>>(batch, scratch + launches * grid);
    check_launch("sum_squares");
  }
  squares_total_kernel<<<1, kThreads, 0, stream>>>(scratch, launches * grid, out);
  check_launch("sum_squares total");
}

void widen_many(cudaStream_t stream, DType t, const std::vector<WidenTensor>& tensors, WidenMode mode) {
  const bool plain = !mode.accumulate && mode.scale == 1.0f;
  for (std::size_t first = 0; first < tensors.size(); first += kWidenPerLaunch) {
    WidenBatch batch{};
    for (std::size_t i = first; i < std::min(tensors.size(), first + kWidenPerLaunch); ++i, ++batch.count) {
      const WidenTensor& w = tensors[i];
      batch.src[batch.count] = w.src;
      batch.dst[batch.count] = w.dst;
      batch.n[batch.count] = w.n;
      batch.first_chunk[batch.count + 1] = batch.first_chunk[batch.count] + (w.n + kChunk - 1) / kChunk;
    }
    const auto grid = static_cast<unsigned>(std::min<int64_t>(batch.first_chunk[batch.count], 4 * 132));
    if (grid == 0) continue;
    const auto launch = [&](auto tag) {
      using S = decltype(tag);
      if (plain) widen_kernel<S, true><<<grid, kThreads, 0, stream>>>(batch, mode);
      else widen_kernel<S, false><<<grid, kThreads, 0, stream>>>(batch, mode);
    };
    if (t == DType::bf16) launch(__nv_bfloat16{});
    else if (t == DType::f16) launch(__half{});
    else launch(float{});
    check_launch("cast_many");
  }
}

void adamw_update_many(cudaStream_t stream, const std::vector<AdamWParam>& params, DType copy_t,
                       const AdamWScalars& s) {
  const AdamWDevice dev{static_cast<float>(s.learning_rate),
                        static_cast<float>(s.beta1),
                        static_cast<float>(s.beta2),
                        static_cast<float>(s.epsilon),
                        static_cast<float>(s.max_grad_norm),
                        static_cast<float>(1.0 - s.beta1),
                        static_cast<float>(1.0 - s.beta2),
                        s.beta1,
                        s.beta2,
                        s.step,
                        s.step_count,
                        s.grad_norm_squared,
                        s.skip_if};
  const auto launch = [&](auto tag) {
    using C = typename decltype(tag)::type;
    for (std::size_t first = 0; first < params.size(); first += kAdamWPerLaunch) {
      AdamWBatch batch{};
      for (std::size_t i = first; i < std::min(params.size(), first + kAdamWPerLaunch); ++i, ++batch.count) {
        const AdamWParam& p = params[i];
        const int k = batch.count;
        batch.w[k] = p.w;
        batch.g[k] = p.g;
        batch.m[k] = p.m;
        batch.v[k] = p.v;
        batch.copy[k] = p.copy;
        batch.n[k] = p.n;
        batch.weight_decay[k] = static_cast<float>(p.weight_decay);
        batch.first_chunk[k + 1] = batch.first_chunk[k] + (p.n + kChunk - 1) / kChunk;
      }
      const int64_t chunks = batch.first_chunk[batch.count];
      if (chunks == 0) continue;
      const int grid = static_cast<int>(std::min<int64_t>(chunks, int64_t{cuda_pointwise::sm_count()} * 8));
      adamw_kernel<C><<<grid, kThreads, 0, stream>>>(batch, dev);
      check_launch("adamw_update_many");
    }
  };
  if (copy_t == DType::f32) launch(Tag<float>{});
  else dispatch(copy_t, "adamw_update_many copy", launch);
}

void count_step(cudaStream_t stream, int32_t* counter, const int32_t* skip_if) {
  count_step_kernel<<<1, 1, 0, stream>>>(counter, skip_if);
  check_launch("count_step");
}

namespace {

// The largest row the loss stages in shared memory: the device's opt-in limit less the block
// reduction's static share.
int64_t staged_limit_bytes() {
  int device = 0, optin = 0;
  AB_CUDA(cudaGetDevice(&device), "cuda_transformer: current device");
  AB_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
          "cuda_transformer: shared memory per block");
  return int64_t{optin} - 1024;
}

}  // namespace

int64_t cross_entropy_scratch_bytes(int64_t rows) { return 256 + (rows * 4 + 255) / 256 * 256; }

void cross_entropy_fused(cudaStream_t stream, DType t, const void* logits, int64_t logits_stride, const int32_t* labels,
                         float* loss, void* dlogits, int64_t dlogits_stride, const float* seed, int64_t rows,
                         int64_t vocab, void* scratch) {
  auto* scored = static_cast<int32_t*>(scratch);
  auto* row_loss = reinterpret_cast<float*>(static_cast<unsigned char*>(scratch) + 256);
  count_scored_kernel<<<1, 1024, 0, stream>>>(labels, rows, scored);
  check_launch("cross_entropy_fused count");
  if (rows > 0) {
    dispatch(t, "cross_entropy_fused", [&](auto tag) {
      using T = typename decltype(tag)::type;
      constexpr int V = vec_of<T>();
      const bool vector_ok = aligned(logits, 16) && logits_stride % V == 0 &&
                             (dlogits == nullptr || (aligned(dlogits, 16) && dlogits_stride % V == 0));
      const auto staged_bytes = static_cast<int>((vocab + V - 1) / V * 16);
      const bool staged = dlogits != nullptr && staged_bytes <= staged_limit_bytes();
      with_width<T>(vector_ok, [&]<int W>() {
        const auto launch = [&](auto kernel, int smem) {
          if (smem > 48 * 1024)
            AB_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                    "cuda_transformer cross_entropy_fused shared memory");
          kernel<<<static_cast<int>(rows), kLossThreads, smem, stream>>>(static_cast<const T*>(logits), logits_stride,
                                                                         labels, static_cast<T*>(dlogits),
                                                                         dlogits_stride, seed, scored, row_loss, vocab);
        };
        if (staged) launch(xent_row_kernel<T, W, true>, staged_bytes);
        else launch(xent_row_kernel<T, W, false>, 0);
      });
    });
    check_launch("cross_entropy_fused rows");
  }
  xent_total_kernel<<<1, 1024, 0, stream>>>(row_loss, rows, scored, loss);
  check_launch("cross_entropy_fused total");
}

}  // namespace ab::nn::cuda_transformer
