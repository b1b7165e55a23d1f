// The fused attention forward pass (flash attention 2): a block of 4 warps per 128 query rows
// of one head at D 64 (32 rows a warp: two 16-row tiles share each K and V fragment) or 64 rows
// at D 128 (16 a warp, what the registers hold), or (attention_variants.h) 8 warps of 16 rows
// per 128 (more warps an SM, each K and V fragment read by a warp for one tile), the Q
// fragments in registers; per 64-key block (K and V staged in shared memory by cp.async, the
// next block's while this one computes), S = Q K^T on mma.sync tensor cores into registers, an
// online softmax in f32 (each row's four lanes reduce its maximum with two shuffles), P packed to
// 16 bits straight into the A operand of O += P V, O accumulated in f32 registers. Scores never
// leave registers; causal key blocks above the diagonal and blocks past a sequence's length are
// never loaded, and a warp skips a key block on the diagonal that none of its rows sees.
#include <cmath>

#include "nn/cuda/attention_flash.cuh"
#include "nn/cuda/attention_mma.cuh"
#include "nn/cuda/device_common.cuh"

namespace ab::nn::cuda_attention::detail {
namespace {

// A block's shape: Warps warps of R 16-row tiles each (R 2 only where the accumulators' registers
// allow it: D 64), MinBlocks of them resident on an SM (what the registers a thread may use are
// cut to).
template <int Warps, int R, int MinBlocks = 0>
struct FwdShape {
  static constexpr int kRowTiles = R, kThreads = Warps * 32, kRows = Warps * R * kFrag, kMinBlocks = MinBlocks;
};

// The block's shared memory: Q (then each warp's rows of O, staged for 16-byte stores), and two
// buffers of K and V: the next key block lands while the block computes on this one.
template <typename T, int D, typename S>
struct ForwardSmem {
  static constexpr int kLd = D + kPad16;
  static constexpr std::size_t kTileBytes = std::size_t{kTile} * kLd * sizeof(T);
  static constexpr std::size_t kQBytes = std::size_t{S::kRows} * kLd * sizeof(T);
  static constexpr std::size_t q = 0, bytes = kQBytes + 4 * kTileBytes;
  // K of buffer n at k(n), its V right after.
  static constexpr std::size_t k(int n) { return kQBytes + 2 * n * kTileBytes; }
  static constexpr std::size_t v(int n) { return kQBytes + (2 * n + 1) * kTileBytes; }
};

// One 16-row tile's running state: its rows' ends (keys [0, end) visible), maxima m (log2
// domain), the lane's partial sums l, and the O accumulators.
template <int D>
struct RowTile {
  int end[2];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  Acc o[D / 8] = {};
};

// The lane's two rows (g and g + 8) of a tile through one key block: masks the scores (keys at
// or past each row's end get -inf), moves the running maxima, rescales the partial sums and the
// O accumulators, and turns s into unnormalised probabilities. A row that has seen no key keeps
// m = -inf and l = 0 and never forms inf - inf.
template <int D>
__device__ __forceinline__ void online_softmax(Acc (&s)[kTile / 8], RowTile<D>& r, int first_key, float scale_log2) {
  const int t = threadIdx.x % 4;
  float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = first_key + nt * 8 + 2 * t + (e % 2);
      s[nt][e] = key < r.end[e / 2] ? s[nt][e] * scale_log2 : -INFINITY;
      block_max[e / 2] = fmaxf(block_max[e / 2], s[nt][e]);
    }
  float alpha[2], use[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    block_max[h] = fmaxf(block_max[h], __shfl_xor_sync(0xffffffffu, block_max[h], 1));
    block_max[h] = fmaxf(block_max[h], __shfl_xor_sync(0xffffffffu, block_max[h], 2));
    const float m_new = fmaxf(r.m[h], block_max[h]);
    use[h] = m_new == -INFINITY ? 0.0f : m_new;
    alpha[h] = exp2f(r.m[h] - use[h]);
    r.m[h] = m_new;
    r.l[h] *= alpha[h];
  }
#pragma unroll
  for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = exp2f(s[nt][e] - use[e / 2]);
      r.l[e / 2] += s[nt][e];
    }
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) r.o[dt][e] *= alpha[e / 2];
}

// A tile's O (rows row0.. of head (b, h), those below `rows`) = its accumulators over each row's
// sum, through the tile's 16 rows of `stage` (the warp's own, ld elements a row) for 16-byte
// stores; its log-sum-exp into lse (-inf for a row that saw no key).
template <typename T, int D>
__device__ __forceinline__ void finish_tile(RowTile<D>& r, T* stage, int ld, const Heads& out, float* lse_row0, int b,
                                            int h, int row0, int rows) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float inv[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    r.l[x] += __shfl_xor_sync(0xffffffffu, r.l[x], 1);
    r.l[x] += __shfl_xor_sync(0xffffffffu, r.l[x], 2);
    inv[x] = r.l[x] > 0.0f ? 1.0f / r.l[x] : 0.0f;
    if (t == 0 && row0 + g + 8 * x < rows)
      lse_row0[g + 8 * x] = r.l[x] > 0.0f ? (r.m[x] + log2f(r.l[x])) * kLn2 : -INFINITY;
  }
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    *reinterpret_cast<std::uint32_t*>(stage + g * ld + dt * 8 + 2 * t) =
        pack<T>(r.o[dt][0] * inv[0], r.o[dt][1] * inv[0]);
    *reinterpret_cast<std::uint32_t*>(stage + (g + 8) * ld + dt * 8 + 2 * t) =
        pack<T>(r.o[dt][2] * inv[1], r.o[dt][3] * inv[1]);
  }
  __syncwarp();
  constexpr int kChunks = D / 8;
  for (int idx = lane; idx < kFrag * kChunks; idx += 32) {
    const int row = idx / kChunks, c = (idx % kChunks) * 8;
    if (row0 + row < rows)
      *reinterpret_cast<uint4*>(row_ptr<T>(out, b, h, row0 + row) + c) =
          *reinterpret_cast<const uint4*>(stage + row * ld + c);
  }
}

// One key block (K and V in shared memory) for every tile of the warp: each K and V fragment
// loaded once and used by all of them.
template <typename T, int D, int R>
__device__ __forceinline__ void key_block(RowTile<D> (&tiles)[R], const Frag4 (&qf)[R][D / 16], const T* k_s,
                                          const T* v_s, int ld, int kb0, float scale_log2) {
  const int lane = threadIdx.x % 32;
  Acc s[R][kTile / 8] = {};
#pragma unroll
  for (int kt = 0; kt < D / 16; ++kt)
#pragma unroll
    for (int n2 = 0; n2 < kTile / 16; ++n2) {
      Frag4 kb;
      ldmatrix_x4(kb, k_s + bt_offset(lane, ld, n2 * 16, kt * 16));
#pragma unroll
      for (int x = 0; x < R; ++x) {
        mma<T>(s[x][2 * n2], qf[x][kt], kb[0], kb[1]);
        mma<T>(s[x][2 * n2 + 1], qf[x][kt], kb[2], kb[3]);
      }
    }
#pragma unroll
  for (int x = 0; x < R; ++x) online_softmax<D>(s[x], tiles[x], kb0, scale_log2);
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    Frag4 pa[R];
#pragma unroll
    for (int x = 0; x < R; ++x) acc_to_a<T>(pa[x], s[x][2 * kk], s[x][2 * kk + 1]);
#pragma unroll
    for (int d2 = 0; d2 < D / 16; ++d2) {
      Frag4 vb;
      ldmatrix_x4_trans(vb, v_s + b_offset(lane, ld, kk * 16, d2 * 16));
#pragma unroll
      for (int x = 0; x < R; ++x) {
        mma<T>(tiles[x].o[2 * d2], pa[x], vb[0], vb[1]);
        mma<T>(tiles[x].o[2 * d2 + 1], pa[x], vb[2], vb[3]);
      }
    }
  }
}

template <typename T, int D, typename S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    flash_forward_kernel(Problem p, Heads q, Heads k, Heads v, Heads o, float* lse) {
  using L = ForwardSmem<T, D, S>;
  constexpr int R = S::kRowTiles, kBlockRows = S::kRows, kBlockThreads = S::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + L::q);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBlockRows;  // the longest causal rows start first
  const int length = key_length(p, b), key_end = p.causal ? min(length, q0 + kBlockRows) : length;
  const int warp_row0 = warp * kFrag * R;  // the warp's first row in the block
  // Keys past its last row's end are masked for all the warp's rows: a causal warp skips the key
  // blocks there (on the diagonal), which would leave its state as it is.
  const int warp_key_end = visible_end(p, length, q0 + warp_row0 + R * kFrag - 1);
  const float scale_log2 = p.scale * kLog2e;
  const auto load_keys = [&](int kb0, int buffer) {
    load_tile_async<T, D, kTile, kBlockThreads>(reinterpret_cast<T*>(smem + L::k(buffer)), L::kLd, k, b, h, kb0,
                                                p.keys);
    load_tile_async<T, D, kTile, kBlockThreads>(reinterpret_cast<T*>(smem + L::v(buffer)), L::kLd, v, b, h, kb0,
                                                p.keys);
  };

  load_tile_async<T, D, kBlockRows, kBlockThreads>(q_s, L::kLd, q, b, h, q0, p.queries);
  if (key_end > 0) load_keys(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  Frag4 qf[R][D / 16];
  RowTile<D> tiles[R];
#pragma unroll
  for (int x = 0; x < R; ++x) {
    const int row = q0 + warp_row0 + x * kFrag + g;
    tiles[x].end[0] = visible_end(p, length, row);
    tiles[x].end[1] = visible_end(p, length, row + 8);
#pragma unroll
    for (int kt = 0; kt < D / 16; ++kt)
      ldmatrix_x4(qf[x][kt], q_s + a_offset(lane, L::kLd, warp_row0 + x * kFrag, kt * 16));
  }
  for (int kb0 = 0, buffer = 0; kb0 < key_end; kb0 += kTile, buffer ^= 1) {
    // The other buffer was last read in the previous block, which every warp has left.
    if (kb0 + kTile < key_end) load_keys(kb0 + kTile, buffer ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this block's keys are in; the next block's may still fly
    __syncthreads();
    if (kb0 < warp_key_end)
      key_block<T, D, R>(tiles, qf, reinterpret_cast<const T*>(smem + L::k(buffer)),
                         reinterpret_cast<const T*>(smem + L::v(buffer)), L::kLd, kb0, scale_log2);
    __syncthreads();  // every warp is done with this buffer before the next block refills it
  }
  // The warp's rows of q_s are its own (its Q fragments are in registers): the stage for O.
  float* lse_head = lse + (static_cast<std::int64_t>(b) * p.heads + h) * p.queries;
#pragma unroll
  for (int x = 0; x < R; ++x) {
    const int row0 = warp_row0 + x * kFrag;
    finish_tile<T, D>(tiles[x], q_s + row0 * L::kLd, L::kLd, o, lse_head + q0 + row0, b, h, q0 + row0, p.queries);
  }
}

// The block shapes: the default (4 warps: 2 row tiles each at D 64, 1 at D 128) and 8 warps of one
// (two blocks an SM at D 64: 16 warps).
template <int D>
using DefaultShape = FwdShape<kWarps, D <= 64 ? 2 : 1>;
template <int D>
using EightWarps = FwdShape<8, 1, D <= 64 ? 2 : 1>;

template <typename T, int D, typename S>
void launch_forward(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v,
                    const Heads& o, float* lse) {
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads),
                  static_cast<unsigned>((p.queries + S::kRows - 1) / S::kRows));
  flash_forward_kernel<T, D, S><<<grid, S::kThreads, ForwardSmem<T, D, S>::bytes, stream>>>(p, q, k, v, o, lse);
  device_common::check_launch("cuda_attention", "attention_forward (fused)");
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
        const auto set = [](auto kernel, std::size_t bytes) {
          AB_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                  "attention forward shared memory");
        };
        set(flash_forward_kernel<T, D, DefaultShape<D>>, ForwardSmem<T, D, DefaultShape<D>>::bytes);
        set(flash_forward_kernel<T, D, EightWarps<D>>, ForwardSmem<T, D, EightWarps<D>>::bytes);
      });
    }
}

void flash_forward(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v,
                   const Heads& o, float* lse) {
  dispatch_fused(p, [&](auto tag, auto d) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(d)::value;
    if (variants().forward_eight_warps) launch_forward<T, D, EightWarps<D>>(stream, p, q, k, v, o, lse);
    else launch_forward<T, D, DefaultShape<D>>(stream, p, q, k, v, o, lse);
  });
}

}  // namespace ab::nn::cuda_attention::detail
