// The fused attention forward pass (flash attention 2): a block of 4 warps per 64 query rows of
// one head, 16 rows a warp, its Q fragments held in registers; per 64-key block (K and V staged
// in shared memory by cp.async, the next block's while this one computes), S = Q K^T on mma.sync tensor cores into registers, an online softmax in f32
// (each row's four lanes reduce its maximum with two shuffles), P packed to 16 bits straight into
// the A operand of O += P V, O accumulated in f32 registers. Scores never leave registers; causal
// key blocks above the diagonal and blocks past a sequence's length are never loaded.
#include <cmath>

#include "nn/cuda/attention_flash.cuh"
#include "nn/cuda/attention_mma.cuh"
#include "nn/cuda/device_common.cuh"

namespace ab::nn::cuda_attention::detail {
namespace {

// The block's shared memory: Q (then each warp's rows of O, staged for 16-byte stores), and two
// buffers of K and V: the next key block lands while the block computes on this one.
template <typename T, int D>
struct ForwardSmem {
  static constexpr int kLd = D + kPad16;
  static constexpr std::size_t kTileBytes = std::size_t{kTile} * kLd * sizeof(T);
  static constexpr std::size_t q = 0, bytes = 5 * kTileBytes;
  // K of buffer n at k(n), its V right after.
  static constexpr std::size_t k(int n) { return (1 + 2 * n) * kTileBytes; }
  static constexpr std::size_t v(int n) { return (2 + 2 * n) * kTileBytes; }
};

// The lane's two rows (g and g + 8 of its warp's 16) through one key block: masks the scores
// (keys at or past each row's end get -inf), moves the running maxima m (log2 domain), rescales
// the lane's partial sums l and its O accumulators, and turns s into unnormalised probabilities.
// A row that has seen no key keeps m = -inf and l = 0 and never forms inf - inf.
template <int D>
__device__ __forceinline__ void online_softmax(Acc (&s)[kTile / 8], Acc (&o)[D / 8], int first_key, int end0,
                                               int end1, float scale_log2, float (&m)[2], float (&l)[2]) {
  const int t = threadIdx.x % 4;
  float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = first_key + nt * 8 + 2 * t + (e % 2);
      s[nt][e] = key < (e < 2 ? end0 : end1) ? s[nt][e] * scale_log2 : -INFINITY;
      block_max[e / 2] = fmaxf(block_max[e / 2], s[nt][e]);
    }
  float alpha[2], use[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
    block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
    const float m_new = fmaxf(m[r], block_max[r]);
    use[r] = m_new == -INFINITY ? 0.0f : m_new;
    alpha[r] = exp2f(m[r] - use[r]);
    m[r] = m_new;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = exp2f(s[nt][e] - use[e / 2]);
      l[e / 2] += s[nt][e];
    }
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] *= alpha[e / 2];
}

// O (rows row0.. of head (b, h), those below `rows`) = the warp's accumulators times each row's
// 1 / l, through the warp's own 16 rows of `stage` (ld elements a row) for 16-byte stores.
template <typename T, int D>
__device__ __forceinline__ void store_output(const Acc (&o)[D / 8], const float (&inv)[2], T* stage, int ld,
                                             const Heads& out, int b, int h, int row0, int rows) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    *reinterpret_cast<std::uint32_t*>(stage + g * ld + dt * 8 + 2 * t) = pack<T>(o[dt][0] * inv[0], o[dt][1] * inv[0]);
    *reinterpret_cast<std::uint32_t*>(stage + (g + 8) * ld + dt * 8 + 2 * t) =
        pack<T>(o[dt][2] * inv[1], o[dt][3] * inv[1]);
  }
  __syncwarp();
  constexpr int kChunks = D / 8;
  for (int idx = lane; idx < kFrag * kChunks; idx += 32) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    if (row0 + r < rows)
      *reinterpret_cast<uint4*>(row_ptr<T>(out, b, h, row0 + r) + c) = *reinterpret_cast<const uint4*>(stage + r * ld + c);
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(Problem p, Heads q, Heads k, Heads v, Heads o,
                                                                 float* lse) {
  using L = ForwardSmem<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + L::q);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;  // the longest causal rows start first
  const int length = key_length(p, b), key_end = p.causal ? min(length, q0 + kTile) : length;
  const int row0 = q0 + warp * kFrag;
  const int end0 = visible_end(p, length, row0 + g), end1 = visible_end(p, length, row0 + g + 8);
  const float scale_log2 = p.scale * kLog2e;
  const auto load_keys = [&](int kb0, int buffer) {
    load_tile_async<T, D>(reinterpret_cast<T*>(smem + L::k(buffer)), L::kLd, k, b, h, kb0, p.keys);
    load_tile_async<T, D>(reinterpret_cast<T*>(smem + L::v(buffer)), L::kLd, v, b, h, kb0, p.keys);
  };

  load_tile_async<T, D>(q_s, L::kLd, q, b, h, q0, p.queries);
  if (key_end > 0) load_keys(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  Frag4 qf[D / 16];
#pragma unroll
  for (int kt = 0; kt < D / 16; ++kt) ldmatrix_x4(qf[kt], q_s + a_offset(lane, L::kLd, warp * kFrag, kt * 16));
  Acc o_acc[D / 8] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int kb0 = 0, buffer = 0; kb0 < key_end; kb0 += kTile, buffer ^= 1) {
    // The other buffer was last read in the previous block, which every warp has left.
    if (kb0 + kTile < key_end) load_keys(kb0 + kTile, buffer ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this block's keys are in; the next block's may still fly
    __syncthreads();
    const T* k_s = reinterpret_cast<const T*>(smem + L::k(buffer));
    const T* v_s = reinterpret_cast<const T*>(smem + L::v(buffer));
    Acc s[kTile / 8] = {};
#pragma unroll
    for (int kt = 0; kt < D / 16; ++kt)
#pragma unroll
      for (int n2 = 0; n2 < kTile / 16; ++n2) {
        Frag4 kb;
        ldmatrix_x4(kb, k_s + bt_offset(lane, L::kLd, n2 * 16, kt * 16));
        mma<T>(s[2 * n2], qf[kt], kb[0], kb[1]);
        mma<T>(s[2 * n2 + 1], qf[kt], kb[2], kb[3]);
      }
    online_softmax<D>(s, o_acc, kb0, end0, end1, scale_log2, m, l);
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      Frag4 pa;
      acc_to_a<T>(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int d2 = 0; d2 < D / 16; ++d2) {
        Frag4 vb;
        ldmatrix_x4_trans(vb, v_s + b_offset(lane, L::kLd, kk * 16, d2 * 16));
        mma<T>(o_acc[2 * d2], pa, vb[0], vb[1]);
        mma<T>(o_acc[2 * d2 + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next block refills it
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
  }
  // The warp's rows of q_s are its own (its Q fragments are in registers): the stage for O.
  store_output<T, D>(o_acc, inv, q_s + warp * kFrag * L::kLd, L::kLd, o, b, h, row0, p.queries);
  if (lane % 4 == 0)
    for (int r = 0; r < 2; ++r) {
      const int i = row0 + g + 8 * r;
      if (i < p.queries)
        lse[(static_cast<std::int64_t>(b) * p.heads + h) * p.queries + i] =
            l[r] > 0.0f ? (m[r] + log2f(l[r])) * kLn2 : -INFINITY;
    }
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
