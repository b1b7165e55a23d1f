// The fused attention backward pass (flash attention 2's, without atomics): Di = rowsum(dO * O)
// is already in `di`; one kernel per 64-key block (4 warps, 16 keys each) walks the query blocks
// that see it, rebuilding P^T = exp(K Q^T * scale - lse) and dP^T = V dO^T on tensor cores, and
// accumulates dV += P^T dO and dK += dS^T Q (dS = P (dP - Di)) in f32 fragments; one kernel per
// 64-query block walks its visible key blocks for dQ += dS K. Each output element is summed by
// one warp in a fixed order: bit-identical run to run.
#include <cmath>

#include "nn/cuda/attention_flash.cuh"
#include "nn/cuda/device_common.cuh"

namespace ab::nn::cuda_attention::detail {
namespace {

// Both kernels' shared memory: two tiles kept for the whole block (K, V or Q, dO), two streamed
// (Q, dO or K, V), each warp's f32 score and dP tiles (at the end, the f32 stage of its 16 output
// rows), its 16-bit P and dS tiles, and the streamed query rows' log2-domain lse and Di.
template <typename T, int D>
struct BackwardSmem {
  static constexpr int kLd = D + kPad16, kStageLd = D + kPadF32;
  static constexpr std::size_t kTileBytes = std::size_t{kTile} * kLd * sizeof(T);
  static constexpr std::size_t kWarpScores = std::size_t{kFrag} * kScoreLd;  // floats
  static constexpr std::size_t kWarpProbs = std::size_t{kFrag} * kProbLd;    // elements
  static constexpr std::size_t kept0 = 0, kept1 = kTileBytes, streamed0 = 2 * kTileBytes, streamed1 = 3 * kTileBytes;
  static constexpr std::size_t scores = 4 * kTileBytes;
  static constexpr std::size_t dprobs = scores + kWarps * kWarpScores * sizeof(float);
  static constexpr std::size_t probs = dprobs + kWarps * kWarpScores * sizeof(float);
  static constexpr std::size_t dscores = probs + kWarps * kWarpProbs * sizeof(T);
  static constexpr std::size_t rows = dscores + kWarps * kWarpProbs * sizeof(T);
  static constexpr std::size_t bytes = rows + 2 * kTile * sizeof(float);
  static_assert(kWarps * kFrag * kStageLd <= 2 * kWarps * kWarpScores, "the output stage fits the score tiles");
};

template <typename T>
struct BackwardTiles {
  T *kept0, *kept1, *streamed0, *streamed1;
  float *score_w, *dprob_w, *stage_w, *lse2, *di;
  T *prob_w, *dscore_w;
};

template <typename T, int D>
__device__ __forceinline__ BackwardTiles<T> backward_tiles(unsigned char* smem, int warp) {
  using L = BackwardSmem<T, D>;
  BackwardTiles<T> t;
  t.kept0 = reinterpret_cast<T*>(smem + L::kept0);
  t.kept1 = reinterpret_cast<T*>(smem + L::kept1);
  t.streamed0 = reinterpret_cast<T*>(smem + L::streamed0);
  t.streamed1 = reinterpret_cast<T*>(smem + L::streamed1);
  t.score_w = reinterpret_cast<float*>(smem + L::scores) + warp * L::kWarpScores;
  t.dprob_w = reinterpret_cast<float*>(smem + L::dprobs) + warp * L::kWarpScores;
  t.stage_w = reinterpret_cast<float*>(smem + L::scores) + warp * kFrag * L::kStageLd;
  t.prob_w = reinterpret_cast<T*>(smem + L::probs) + warp * L::kWarpProbs;
  t.dscore_w = reinterpret_cast<T*>(smem + L::dscores) + warp * L::kWarpProbs;
  t.lse2 = reinterpret_cast<float*>(smem + L::rows);
  t.di = t.lse2 + kTile;
  return t;
}

// lse (in log2 units) and Di of query rows [q0, q0 + kTile); 0 past the last (never used: masked).
__device__ __forceinline__ void load_row_stats(float* lse2, float* di_s, const float* lse, const float* di,
                                               std::int64_t base, int q0, int queries) {
  for (int t = threadIdx.x; t < kTile; t += kThreads) {
    const bool in = q0 + t < queries;
    lse2[t] = in ? lse[base + q0 + t] * kLog2e : 0.0f;
    di_s[t] = in ? di[base + q0 + t] : 0.0f;
  }
}

// A warp's accumulators (f32, 16 x D) times `factor` into rows [row0, row0 + 16) below `rows`.
template <typename T, int D>
__device__ __forceinline__ void store_acc(const FragC (&acc)[D / kFrag], float* stage_w, const Heads& t, int b, int h,
                                          int row0, int rows, float factor) {
#pragma unroll
  for (int dt = 0; dt < D / kFrag; ++dt)
    wmma::store_matrix_sync(stage_w + dt * kFrag, acc[dt], D + kPadF32, wmma::mem_row_major);
  __syncwarp();
  store_rows<T, D>(t, b, h, row0, rows, stage_w, factor);
  __syncwarp();
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_dkv_kernel(Problem p, Heads q, Heads k, Heads v, Heads dout,
                                                             const float* lse, const float* di, Heads dk, Heads dv) {
  using L = BackwardSmem<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  const BackwardTiles<T> s = backward_tiles<T, D>(smem, warp);
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads, kb0 = blockIdx.y * kTile;
  const int length = key_length(p, b), j = kb0 + warp * kFrag + r;
  const std::int64_t stats = (static_cast<std::int64_t>(b) * p.heads + h) * p.queries;
  const float scale_log2 = p.scale * kLog2e;
  FragC dk_acc[D / kFrag], dv_acc[D / kFrag];
#pragma unroll
  for (int dt = 0; dt < D / kFrag; ++dt) {
    wmma::fill_fragment(dk_acc[dt], 0.0f);
    wmma::fill_fragment(dv_acc[dt], 0.0f);
  }
  if (kb0 < length) {  // a block of padding keys only gets zero gradients
    load_tile<T, D>(s.kept0, L::kLd, k, b, h, kb0, p.keys);
    load_tile<T, D>(s.kept1, L::kLd, v, b, h, kb0, p.keys);
    for (int q0 = p.causal ? kb0 : 0; q0 < p.queries; q0 += kTile) {
      __syncthreads();  // every warp is done with the previous Q and dO
      load_tile<T, D>(s.streamed0, L::kLd, q, b, h, q0, p.queries);
      load_tile<T, D>(s.streamed1, L::kLd, dout, b, h, q0, p.queries);
      load_row_stats(s.lse2, s.di, lse, di, stats, q0, p.queries);
      __syncthreads();
      scores_16x64<T, D>(s.score_w, s.kept0 + warp * kFrag * L::kLd, L::kLd, s.streamed0, L::kLd);
      scores_16x64<T, D>(s.dprob_w, s.kept1 + warp * kFrag * L::kLd, L::kLd, s.streamed1, L::kLd);
      __syncwarp();
#pragma unroll 8
      for (int c = half * 32; c < half * 32 + 32; ++c) {  // row r is key j, column c query q0 + c
        const int i = q0 + c;
        const float prob =
            i < p.queries && pair_visible(p, length, i, j) ? exp2f(s.score_w[r * kScoreLd + c] * scale_log2 - s.lse2[c]) : 0.0f;
        s.prob_w[r * kProbLd + c] = from_f32<T>(prob);
        s.dscore_w[r * kProbLd + c] = from_f32<T>(prob * (s.dprob_w[r * kScoreLd + c] - s.di[c]));
      }
      __syncwarp();
      accumulate_16xD<T, D>(dv_acc, s.prob_w, s.streamed1, L::kLd);
      accumulate_16xD<T, D>(dk_acc, s.dscore_w, s.streamed0, L::kLd);
    }
  }
  __syncthreads();  // the stage overlays every warp's score tiles
  store_acc<T, D>(dv_acc, s.stage_w, dv, b, h, kb0 + warp * kFrag, p.keys, 1.0f);
  store_acc<T, D>(dk_acc, s.stage_w, dk, b, h, kb0 + warp * kFrag, p.keys, p.scale);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_dq_kernel(Problem p, Heads q, Heads k, Heads v, Heads dout,
                                                            const float* lse, const float* di, Heads dq) {
  using L = BackwardSmem<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  const BackwardTiles<T> s = backward_tiles<T, D>(smem, warp);
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;  // the longest causal rows start first
  const int length = key_length(p, b), key_end = p.causal ? min(length, q0 + kTile) : length;
  const int row = warp * kFrag + r, i = q0 + row;
  const float scale_log2 = p.scale * kLog2e;
  load_tile<T, D>(s.kept0, L::kLd, q, b, h, q0, p.queries);
  load_tile<T, D>(s.kept1, L::kLd, dout, b, h, q0, p.queries);
  load_row_stats(s.lse2, s.di, lse, di, (static_cast<std::int64_t>(b) * p.heads + h) * p.queries, q0, p.queries);
  FragC dq_acc[D / kFrag];
#pragma unroll
  for (int dt = 0; dt < D / kFrag; ++dt) wmma::fill_fragment(dq_acc[dt], 0.0f);
  for (int kb0 = 0; kb0 < key_end; kb0 += kTile) {
    __syncthreads();  // every warp is done with the previous K and V (and the first, with the row stats)
    load_tile<T, D>(s.streamed0, L::kLd, k, b, h, kb0, p.keys);
    load_tile<T, D>(s.streamed1, L::kLd, v, b, h, kb0, p.keys);
    __syncthreads();
    scores_16x64<T, D>(s.score_w, s.kept0 + warp * kFrag * L::kLd, L::kLd, s.streamed0, L::kLd);
    scores_16x64<T, D>(s.dprob_w, s.kept1 + warp * kFrag * L::kLd, L::kLd, s.streamed1, L::kLd);
    __syncwarp();
    const float row_lse2 = s.lse2[row], row_di = s.di[row];
#pragma unroll 8
    for (int c = half * 32; c < half * 32 + 32; ++c) {  // row r is query i, column c key kb0 + c
      const float prob = i < p.queries && pair_visible(p, length, i, kb0 + c)
                             ? exp2f(s.score_w[r * kScoreLd + c] * scale_log2 - row_lse2)
                             : 0.0f;
      s.dscore_w[r * kProbLd + c] = from_f32<T>(prob * (s.dprob_w[r * kScoreLd + c] - row_di));
    }
    __syncwarp();
    accumulate_16xD<T, D>(dq_acc, s.dscore_w, s.streamed0, L::kLd);
  }
  __syncthreads();  // the stage overlays every warp's score tiles
  store_acc<T, D>(dq_acc, s.stage_w, dq, b, h, q0 + warp * kFrag, p.queries, p.scale);
}

}  // namespace

void flash_backward_prepare() {
  for (const DType t : {DType::f16, DType::bf16})
    for (const int dim : {64, 128}) {
      Problem p;
      p.dtype = t;
      p.dim = dim;
      dispatch_fused(p, [&](auto tag, auto d) {
        using T = typename decltype(tag)::type;
        constexpr int D = decltype(d)::value;
        const int bytes = static_cast<int>(BackwardSmem<T, D>::bytes);
        AB_CUDA(cudaFuncSetAttribute(flash_dkv_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                "attention backward (dk, dv) shared memory");
        AB_CUDA(cudaFuncSetAttribute(flash_dq_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                "attention backward (dq) shared memory");
      });
    }
}

void flash_backward(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v,
                    const Heads& dout, const float* lse, const float* di, const Heads& dq, const Heads& dk,
                    const Heads& dv) {
  dispatch_fused(p, [&](auto tag, auto d) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(d)::value;
    const std::size_t bytes = BackwardSmem<T, D>::bytes;
    const auto heads = static_cast<unsigned>(p.batch * p.heads);
    if (p.keys > 0) {
      flash_dkv_kernel<T, D><<<dim3(heads, static_cast<unsigned>((p.keys + kTile - 1) / kTile)), kThreads, bytes,
                               stream>>>(p, q, k, v, dout, lse, di, dk, dv);
      device_common::check_launch("cuda_attention", "attention_backward (fused dk, dv)");
    }
    flash_dq_kernel<T, D><<<dim3(heads, static_cast<unsigned>((p.queries + kTile - 1) / kTile)), kThreads, bytes,
                            stream>>>(p, q, k, v, dout, lse, di, dq);
    device_common::check_launch("cuda_attention", "attention_backward (fused dq)");
  });
}

}  // namespace ab::nn::cuda_attention::detail
