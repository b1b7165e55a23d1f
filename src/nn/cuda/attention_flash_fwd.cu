// The fused attention forward pass (flash attention 2): a block of 4 warps per 64 query rows of
// one head, 16 rows a warp; per 64-key block, S = Q K^T on tensor cores into the warp's shared
// score tile, an online softmax in f32 (each lane pair owns a row), P in the storage type, and
// O += P V accumulated in f32 in shared memory (rescaled by the running maximum first). Scores
// never reach global memory; causal key blocks above the diagonal and blocks past a sequence's
// length are never loaded.
#include <cmath>

#include "nn/cuda/attention_flash.cuh"
#include "nn/cuda/device_common.cuh"

namespace ab::nn::cuda_attention::detail {
namespace {

// The block's shared memory (byte offsets, each a multiple of 128).
template <typename T, int D>
struct ForwardSmem {
  static constexpr int kLd = D + kPad16, kOutLd = D + kPadF32;
  static constexpr std::size_t kTileBytes = std::size_t{kTile} * kLd * sizeof(T);
  static constexpr std::size_t q = 0, k = q + kTileBytes, v = k + kTileBytes, scores = v + kTileBytes;
  static constexpr std::size_t probs = scores + std::size_t{kWarps} * kFrag * kScoreLd * sizeof(float);
  static constexpr std::size_t out = probs + std::size_t{kWarps} * kFrag * kProbLd * sizeof(T);
  static constexpr std::size_t bytes = out + std::size_t{kWarps} * kFrag * kOutLd * sizeof(float);
};

// One key block's online-softmax step for the lane pair's row: the new running maximum m (log2
// domain) and sum l, P written to prob_row, the row of out rescaled. Columns at or past
// `row_end` (the keys the row may not see) get probability 0; a row that has seen no key keeps
// m = -inf, l = 0 and never forms inf - inf.
template <typename T, int D>
__device__ __forceinline__ void softmax_step(const float* score_row, T* prob_row, float* out_row, int first_key,
                                             int row_end, float scale_log2, float& m, float& l) {
  float x[32];
  float block_max = -INFINITY;
#pragma unroll
  for (int c = 0; c < 32; ++c) {
    x[c] = first_key + c < row_end ? score_row[c] * scale_log2 : -INFINITY;
    block_max = fmaxf(block_max, x[c]);
  }
  block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
  const float m_new = fmaxf(m, block_max), m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float alpha = exp2f(m - m_use);
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < 32; ++c) {
    const float e = exp2f(x[c] - m_use);
    sum += e;
    prob_row[c] = from_f32<T>(e);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  l = l * alpha + sum;
  m = m_new;
#pragma unroll 8
  for (int c = 0; c < D / 2; ++c) out_row[c] *= alpha;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(Problem p, Heads q, Heads k, Heads v, Heads o,
                                                                 float* lse) {
  using L = ForwardSmem<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + L::q);
  T* k_s = reinterpret_cast<T*>(smem + L::k);
  T* v_s = reinterpret_cast<T*>(smem + L::v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  float* score_w = reinterpret_cast<float*>(smem + L::scores) + warp * kFrag * kScoreLd;
  T* prob_w = reinterpret_cast<T*>(smem + L::probs) + warp * kFrag * kProbLd;
  float* out_w = reinterpret_cast<float*>(smem + L::out) + warp * kFrag * L::kOutLd;

  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;  // the longest causal rows start first
  const int length = key_length(p, b);
  const int key_end = p.causal ? min(length, q0 + kTile) : length;
  const int i = q0 + warp * kFrag + r, row_end = visible_end(p, length, i);
  const float scale_log2 = p.scale * kLog2e;

  load_tile<T, D>(q_s, L::kLd, q, b, h, q0, p.queries);
  for (int idx = lane; idx < kFrag * L::kOutLd; idx += 32) out_w[idx] = 0.0f;
  __syncwarp();  // the zeros are read by other lanes (at the end, where no key block runs)
  float m = -INFINITY, l = 0.0f;
  for (int kb0 = 0; kb0 < key_end; kb0 += kTile) {
    __syncthreads();  // every warp is done with the previous K and V
    load_tile<T, D>(k_s, L::kLd, k, b, h, kb0, p.keys);
    load_tile<T, D>(v_s, L::kLd, v, b, h, kb0, p.keys);
    __syncthreads();
    scores_16x64<T, D>(score_w, q_s + warp * kFrag * L::kLd, L::kLd, k_s, L::kLd);
    __syncwarp();
    softmax_step<T, D>(score_w + r * kScoreLd + half * 32, prob_w + r * kProbLd + half * 32,
                       out_w + r * L::kOutLd + half * (D / 2), kb0 + half * 32, row_end, scale_log2, m, l);
    __syncwarp();
    FragC acc[D / kFrag];
#pragma unroll
    for (int dt = 0; dt < D / kFrag; ++dt) wmma::load_matrix_sync(acc[dt], out_w + dt * kFrag, L::kOutLd, wmma::mem_row_major);
    accumulate_16xD<T, D>(acc, prob_w, v_s, L::kLd);
#pragma unroll
    for (int dt = 0; dt < D / kFrag; ++dt) wmma::store_matrix_sync(out_w + dt * kFrag, acc[dt], L::kOutLd, wmma::mem_row_major);
    __syncwarp();
  }
  store_rows<T, D>(o, b, h, q0 + warp * kFrag, p.queries, out_w, l > 0.0f ? 1.0f / l : 0.0f);
  if (half == 0 && i < p.queries)
    lse[(static_cast<std::int64_t>(b) * p.heads + h) * p.queries + i] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
}

}  // namespace

void flash_forward_prepare() {
  for (const DType t : {DType::f16, DType::bf16})
    for (const int dim : {64, 128}) {
      Problem p;
      p.dtype = t;
      p.dim = dim;
      dispatch_fused(p, [&](auto tag, auto d) {
        using T = typename decltype(tag)::type;
        constexpr int D = decltype(d)::value;
        AB_CUDA(cudaFuncSetAttribute(flash_forward_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(ForwardSmem<T, D>::bytes)),
                "attention forward shared memory");
      });
    }
}

void flash_forward(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v,
                   const Heads& o, float* lse) {
  dispatch_fused(p, [&](auto tag, auto d) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(d)::value;
    const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.queries + kTile - 1) / kTile));
    flash_forward_kernel<T, D><<<grid, kThreads, ForwardSmem<T, D>::bytes, stream>>>(p, q, k, v, o, lse);
    device_common::check_launch("cuda_attention", "attention_forward (fused)");
  });
}

}  // namespace ab::nn::cuda_attention::detail
