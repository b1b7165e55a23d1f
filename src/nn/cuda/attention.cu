// The attention family's entry points and its plain kernels: one warp per query row (forward,
// dQ) or per key row (dK, dV), each lane holding D / 32 values, dot products reduced across the
// warp in a fixed order and broadcast from lane 0 (every lane then takes the same branch with the
// same value: bit-identical run to run). f32 and any head dim up to kMaxSimpleDim; the fused
// kernels (attention_flash_*.cu) take f16/bf16 at D 64 and 128.
#include <atomic>
#include <cmath>
#include <string>

#include "nn/cuda/attention_flash.cuh"
#include "nn/cuda/device_common.cuh"

namespace ab::nn::cuda_attention {
namespace {

using namespace detail;
constexpr int kLanesValues = kMaxSimpleDim / 32;
constexpr int kWarpsPerBlock = 4;

using device_common::warp_sum;

// Lane `lane`'s values of row `r` (columns lane, lane + 32, ...), zero past D.
template <typename T>
__device__ __forceinline__ void load_row(const T* r, int dim, int lane, float (&out)[kLanesValues]) {
#pragma unroll
  for (int c = 0; c < kLanesValues; ++c) out[c] = lane + 32 * c < dim ? to_f32(r[lane + 32 * c]) : 0.0f;
}
__device__ __forceinline__ float dot(const float (&a)[kLanesValues], const float (&b)[kLanesValues]) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kLanesValues; ++c) s += a[c] * b[c];
  return warp_sum(s);
}
template <typename T>
__device__ __forceinline__ void store_row(T* r, int dim, int lane, const float (&v)[kLanesValues], float factor) {
#pragma unroll
  for (int c = 0; c < kLanesValues; ++c)
    if (lane + 32 * c < dim) r[lane + 32 * c] = from_f32<T>(v[c] * factor);
}

// Warp `w` of the grid: (b, h, row) of `rows` rows per head; false past the last.
__device__ __forceinline__ bool warp_row(const Problem& p, int rows, int& b, int& h, int& row) {
  const std::int64_t w = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (w >= static_cast<std::int64_t>(p.batch) * p.heads * rows) return false;
  row = static_cast<int>(w % rows);
  const auto bh = static_cast<int>(w / rows);
  h = bh % p.heads;
  b = bh / p.heads;
  return true;
}

template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    simple_forward_kernel(Problem p, Heads q, Heads k, Heads v, Heads o, float* lse) {
  int b, h, i;
  if (!warp_row(p, p.queries, b, h, i)) return;
  const int lane = threadIdx.x % 32, end = visible_end(p, key_length(p, b), i);
  float qv[kLanesValues], kv[kLanesValues], acc[kLanesValues] = {};
  load_row(row_ptr<const T>(q, b, h, i), p.dim, lane, qv);
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < end; ++j) {
    load_row(row_ptr<const T>(k, b, h, j), p.dim, lane, kv);
    const float s = dot(qv, kv) * p.scale, m_new = fmaxf(m, s);
    const float alpha = expf(m - m_new), e = expf(s - m_new);
    l = l * alpha + e;
    m = m_new;
    load_row(row_ptr<const T>(v, b, h, j), p.dim, lane, kv);
#pragma unroll
    for (int c = 0; c < kLanesValues; ++c) acc[c] = acc[c] * alpha + e * kv[c];
  }
  store_row(row_ptr<T>(o, b, h, i), p.dim, lane, acc, l > 0.0f ? 1.0f / l : 0.0f);
  if (lane == 0) lse[(static_cast<std::int64_t>(b) * p.heads + h) * p.queries + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// di = rowsum(dO * O) per query row, in f32 from the stored values.
template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) row_dot_kernel(Problem p, Heads o, Heads dout, float* di) {
  int b, h, i;
  if (!warp_row(p, p.queries, b, h, i)) return;
  const int lane = threadIdx.x % 32;
  const T* orow = row_ptr<const T>(o, b, h, i);
  const T* drow = row_ptr<const T>(dout, b, h, i);
  float s = 0.0f;
  for (int c = lane; c < p.dim; c += 32) s += to_f32(orow[c]) * to_f32(drow[c]);
  s = warp_sum(s);
  if (lane == 0) di[(static_cast<std::int64_t>(b) * p.heads + h) * p.queries + i] = s;
}

template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    simple_dq_kernel(Problem p, Heads q, Heads k, Heads v, Heads dout, const float* lse, const float* di, Heads dq) {
  int b, h, i;
  if (!warp_row(p, p.queries, b, h, i)) return;
  const int lane = threadIdx.x % 32, end = visible_end(p, key_length(p, b), i);
  const std::int64_t stat = (static_cast<std::int64_t>(b) * p.heads + h) * p.queries + i;
  const float row_lse = lse[stat], row_di = di[stat];
  float qv[kLanesValues], dov[kLanesValues], kv[kLanesValues], acc[kLanesValues] = {};
  load_row(row_ptr<const T>(q, b, h, i), p.dim, lane, qv);
  load_row(row_ptr<const T>(dout, b, h, i), p.dim, lane, dov);
  for (int j = 0; j < end; ++j) {
    load_row(row_ptr<const T>(v, b, h, j), p.dim, lane, kv);
    const float dp = dot(dov, kv);
    load_row(row_ptr<const T>(k, b, h, j), p.dim, lane, kv);
    const float prob = expf(dot(qv, kv) * p.scale - row_lse), ds = prob * (dp - row_di);
#pragma unroll
    for (int c = 0; c < kLanesValues; ++c) acc[c] += ds * kv[c];
  }
  store_row(row_ptr<T>(dq, b, h, i), p.dim, lane, acc, p.scale);
}

template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    simple_dkv_kernel(Problem p, Heads q, Heads k, Heads v, Heads dout, const float* lse, const float* di, Heads dk,
                      Heads dv) {
  int b, h, j;
  if (!warp_row(p, p.keys, b, h, j)) return;
  const int lane = threadIdx.x % 32;
  const bool real = j < key_length(p, b);  // a padding key gets no gradient
  float kv[kLanesValues], vv[kLanesValues], x[kLanesValues], dk_acc[kLanesValues] = {}, dv_acc[kLanesValues] = {};
  load_row(row_ptr<const T>(k, b, h, j), p.dim, lane, kv);
  load_row(row_ptr<const T>(v, b, h, j), p.dim, lane, vv);
  const std::int64_t stats = (static_cast<std::int64_t>(b) * p.heads + h) * p.queries;
  for (int i = real ? (p.causal ? j : 0) : p.queries; i < p.queries; ++i) {
    load_row(row_ptr<const T>(dout, b, h, i), p.dim, lane, x);
    const float dp = dot(x, vv);
    float qv[kLanesValues];
    load_row(row_ptr<const T>(q, b, h, i), p.dim, lane, qv);
    const float prob = expf(dot(qv, kv) * p.scale - lse[stats + i]), ds = prob * (dp - di[stats + i]);
#pragma unroll
    for (int c = 0; c < kLanesValues; ++c) {
      dv_acc[c] += prob * x[c];
      dk_acc[c] += ds * qv[c];
    }
  }
  store_row(row_ptr<T>(dk, b, h, j), p.dim, lane, dk_acc, p.scale);
  store_row(row_ptr<T>(dv, b, h, j), p.dim, lane, dv_acc, 1.0f);
}

unsigned blocks_for_rows(const Problem& p, int rows) {
  const std::int64_t warps = static_cast<std::int64_t>(p.batch) * p.heads * rows;
  return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

template <typename F>
void dispatch(const Problem& p, const char* what, F&& f) {
  device_common::dispatch_storage<false>(p.dtype, "cuda_attention", what, std::forward<F>(f));
}

bool aligned16(const Heads& t) {
  return reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 && t.batch_stride % 8 == 0 && t.head_stride % 8 == 0 &&
         t.row_stride % 8 == 0;
}

}  // namespace

Variants& variants() {
  static Variants v;
  return v;
}

void prepare() {
  flash_forward_prepare();
  flash_backward_prepare();
}

namespace {
// Whether the current device has sm_80's cp.async and mma.sync (per device, asked once).
bool device_runs_fused() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};  // 0 unknown, 1 no, 2 yes
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  if (const int k = known[device].load(std::memory_order_relaxed); k != 0) return k == 2;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) major = 0;
  known[device].store(major >= 8 ? 2 : 1, std::memory_order_relaxed);
  return major >= 8;
}
}  // namespace

bool fused(const Problem& p, const Heads* operands, int count) {
  if (!device_runs_fused()) return false;
  if ((p.dtype != DType::f16 && p.dtype != DType::bf16) || (p.dim != 64 && p.dim != 128)) return false;
  for (int n = 0; n < count; ++n)
    if (!aligned16(operands[n])) return false;
  return true;
}

void forward(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v, const Heads& o,
             float* lse) {
  if (p.batch == 0 || p.heads == 0 || p.queries == 0) return;
  const Heads all[] = {q, k, v, o};
  if (fused(p, all, 4)) return flash_forward(stream, p, q, k, v, o, lse);
  dispatch(p, "attention_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    simple_forward_kernel<T><<<blocks_for_rows(p, p.queries), kWarpsPerBlock * 32, 0, stream>>>(p, q, k, v, o, lse);
    device_common::check_launch("cuda_attention", "attention_forward");
  });
}

void backward(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v, const Heads& o,
              const Heads& dout, const float* lse, const Heads& dq, const Heads& dk, const Heads& dv, float* di,
              float* dq_accum) {
  if (p.batch == 0 || p.heads == 0 || p.queries == 0) return;
  const Heads all[] = {q, k, v, o, dout, dq, dk, dv};
  if (fused(p, all, 8)) return flash_backward(stream, p, q, k, v, o, dout, lse, di, dq, dk, dv, dq_accum);
  dispatch(p, "attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    row_dot_kernel<T><<<blocks_for_rows(p, p.queries), kWarpsPerBlock * 32, 0, stream>>>(p, o, dout, di);
    device_common::check_launch("cuda_attention", "attention_backward (row dots)");
    simple_dq_kernel<T>
        <<<blocks_for_rows(p, p.queries), kWarpsPerBlock * 32, 0, stream>>>(p, q, k, v, dout, lse, di, dq);
    device_common::check_launch("cuda_attention", "attention_backward (dq)");
    if (p.keys == 0) return;
    simple_dkv_kernel<T>
        <<<blocks_for_rows(p, p.keys), kWarpsPerBlock * 32, 0, stream>>>(p, q, k, v, dout, lse, di, dk, dv);
    device_common::check_launch("cuda_attention", "attention_backward (dk, dv)");
  });
}

}  // namespace ab::nn::cuda_attention
