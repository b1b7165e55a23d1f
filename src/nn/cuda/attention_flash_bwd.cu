// The fused attention backward pass (flash attention 2's): Di = rowsum(dO * O) first (one
// 16-byte chunk a lane), then one kernel per key block (a warp per 16 keys) walks the query
// blocks that see it, rebuilding P^T = exp(K Q^T * scale - lse) and dP^T = V dO^T on mma.sync
// tensor cores in registers, and accumulates dV += P^T dO and dK += dS^T Q (dS = P (dP - Di),
// packed to 16 bits as the A operand) in f32 registers. dQ two ways:
// - deterministic: one kernel per 64-query block walks its visible key blocks for dQ += dS K
//   (rebuilding S and dP a second time); each output element is summed by one lane in a fixed
//   order, bit-identical run to run;
// - with an f32 accumulator: the key-block kernel stages dS in shared memory and adds dS K into
//   it with vector reductions (red.global.add.v4.f32, in whatever order the blocks run), then a
//   small kernel scales it into dq's 16-bit view (the row-dot kernel zeroes it first). No second
//   pass over S and dP; 64 keys a block (4 warps) or 128 (8 warps, which load Q and dO and add
//   into dQ half as often; a causal warp whose keys all follow the query block skips its products).
// The streamed tiles are double-buffered (cp.async).
#include <cmath>

#include "nn/cuda/attention_flash.cuh"
#include "nn/cuda/attention_mma.cuh"
#include "nn/cuda/device_common.cuh"

namespace ab::nn::cuda_attention::detail {
namespace {

// Both kernels' shared memory: two tiles kept for the whole block (K, V or Q, dO, of KeptRows
// rows; at the end each warp's own rows stage its outputs), and two buffers of the two streamed
// 64-row tiles (Q, dO or K, V) with the streamed query rows' log2-domain lse and Di: the next
// block lands (cp.async) while the block computes on this one. With the dQ accumulator, dS^T of
// the block (keys by queries) after the rest.
template <typename T, int D, int KeptRows = kTile>
struct BackwardSmem {
  static constexpr int kLd = D + kPad16, kDsLd = kTile + kPad16;
  static constexpr std::size_t kTileBytes = std::size_t{kTile} * kLd * sizeof(T);
  static constexpr std::size_t kKeptBytes = std::size_t{KeptRows} * kLd * sizeof(T);
  static constexpr std::size_t kRowBytes = 2 * kTile * sizeof(float);
  static constexpr std::size_t kStreamed = 2 * kKeptBytes, kRows = kStreamed + 4 * kTileBytes;
  static constexpr std::size_t bytes = kRows + 2 * kRowBytes;
  static constexpr std::size_t ds = bytes, ds_bytes = bytes + std::size_t{KeptRows} * kDsLd * sizeof(T);
};

template <typename T, int D, int KeptRows = kTile>
struct BackwardTiles {
  unsigned char* base;
  using L = BackwardSmem<T, D, KeptRows>;
  __device__ T* kept(int n) const { return reinterpret_cast<T*>(base + n * L::kKeptBytes); }
  __device__ T* streamed(int buffer, int n) const {
    return reinterpret_cast<T*>(base + L::kStreamed + (2 * buffer + n) * L::kTileBytes);
  }
  __device__ float* lse2(int buffer) const { return reinterpret_cast<float*>(base + L::kRows + buffer * L::kRowBytes); }
  __device__ float* di(int buffer) const { return lse2(buffer) + kTile; }
};

// lse (in log2 units) and Di of query rows [q0, q0 + kTile); 0 past the last (never used: masked).
__device__ __forceinline__ void load_row_stats(float* lse2, float* di_s, const float* lse, const float* di,
                                               std::int64_t base, int q0, int queries) {
  for (int t = threadIdx.x; t < kTile; t += kThreads) {
    const bool in = q0 + t < queries;
    lse2[t] = in ? lse[base + q0 + t] * kLog2e : 0.0f;
    di_s[t] = in ? di[base + q0 + t] : 0.0f;
  }
}

// out (16 x 64: the warp's rows `a_row0`.. of a, times the 64 rows of b, transposed) = A B^T,
// both tiles row-major with ld elements a row.
template <typename T, int D>
__device__ __forceinline__ void product_abt(Acc (&out)[kTile / 8], const T* a, const T* b, int a_row0, int ld) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) out[nt][e] = 0.0f;
#pragma unroll
  for (int kt = 0; kt < D / 16; ++kt) {
    Frag4 fa;
    ldmatrix_x4(fa, a + a_offset(lane, ld, a_row0, kt * 16));
#pragma unroll
    for (int n2 = 0; n2 < kTile / 16; ++n2) {
      Frag4 fb;
      ldmatrix_x4(fb, b + bt_offset(lane, ld, n2 * 16, kt * 16));
      mma<T>(out[2 * n2], fa, fb[0], fb[1]);
      mma<T>(out[2 * n2 + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc (16 x D) += x (16 x 64, accumulator layout, packed to 16 bits) times b (64 x D, row-major).
template <typename T, int D>
__device__ __forceinline__ void accumulate_xb(Acc (&acc)[D / 8], const Acc (&x)[kTile / 8], const T* b, int ld) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    Frag4 fa;
    acc_to_a<T>(fa, x[2 * kk], x[2 * kk + 1]);
#pragma unroll
    for (int d2 = 0; d2 < D / 16; ++d2) {
      Frag4 fb;
      ldmatrix_x4_trans(fb, b + b_offset(lane, ld, kk * 16, d2 * 16));
      mma<T>(acc[2 * d2], fa, fb[0], fb[1]);
      mma<T>(acc[2 * d2 + 1], fa, fb[2], fb[3]);
    }
  }
}

// A warp's accumulators (rows g and g + 8 of its 16) times `factor` into rows [row0, row0 + 16)
// of head (b, h) below `rows`, staged through the warp's own 16 rows of `stage` for 16-byte stores.
template <typename T, int D>
__device__ __forceinline__ void store_acc(const Acc (&acc)[D / 8], float factor, T* stage, int ld, const Heads& out,
                                          int b, int h, int row0, int rows) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    *reinterpret_cast<std::uint32_t*>(stage + g * ld + dt * 8 + 2 * t) =
        pack<T>(acc[dt][0] * factor, acc[dt][1] * factor);
    *reinterpret_cast<std::uint32_t*>(stage + (g + 8) * ld + dt * 8 + 2 * t) =
        pack<T>(acc[dt][2] * factor, acc[dt][3] * factor);
  }
  __syncwarp();
  constexpr int kChunks = D / 8;
  for (int idx = lane; idx < kFrag * kChunks; idx += 32) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    if (row0 + r < rows)
      *reinterpret_cast<uint4*>(row_ptr<T>(out, b, h, row0 + r) + c) =
          *reinterpret_cast<const uint4*>(stage + r * ld + c);
  }
}

// dS^T (the warp's 16 key rows by the block's 64 queries, accumulator layout) as 16 bits into
// rows warp * 16.. of ds_s (ld elements a row): the A operand of dQ += dS K for every warp.
template <typename T>
__device__ __forceinline__ void stage_ds(T* ds_s, int ld, const Acc (&dst)[kTile / 8]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, row = (threadIdx.x / 32) * kFrag + g;
#pragma unroll
  for (int nt = 0; nt < kTile / 8; ++nt) {
    *reinterpret_cast<std::uint32_t*>(ds_s + row * ld + nt * 8 + 2 * t) = pack<T>(dst[nt][0], dst[nt][1]);
    *reinterpret_cast<std::uint32_t*>(ds_s + (row + 8) * ld + nt * 8 + 2 * t) = pack<T>(dst[nt][2], dst[nt][3]);
  }
}

// dst[0..3] += v in global memory (16-byte aligned), one vector reduction (no value returned;
// sm_90, else four scalar atomics).
__device__ __forceinline__ void red_add4(float* dst, float x, float y, float z, float w) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
  atomicAdd(dst + 2, z);
  atomicAdd(dst + 3, w);
#endif
}

// The block's dS K (queries q0.. by D) from ds_s (dS^T: KeyRows keys by 64 queries, ld elements
// a row) and k_s (the block's keys, ld_k elements a row), added into the f32 accumulator rows of
// head (b, h) (`accum_head`: [Tq, D] contiguous) below `queries`. Warp w takes query rows
// (w % 4) * 16.. and, with 8 warps, half of the columns; at most 64 columns at a time (so that
// only 32 accumulators are live beside dK and dV).
template <typename T, int D, int KeyRows>
__device__ __forceinline__ void add_dq(float* accum_head, const T* ds_s, int ld, const T* k_s, int ld_k, int q0,
                                       int queries) {
  constexpr int kColGroups = KeyRows / kFrag / 4, kCols = D / kColGroups, kChunk = kCols < 64 ? kCols : 64;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int m0 = (warp % 4) * kFrag, col_begin = (warp / 4) * kCols;
  if (q0 + m0 >= queries) return;  // the warp's rows are all past the last
  // After the exchange below, an even lane holds 4 columns of row g, an odd one of row g + 8.
  const int row = q0 + m0 + g + (t % 2) * 8;
#pragma unroll
  for (int c0 = col_begin; c0 < col_begin + kCols; c0 += kChunk) {
    Acc acc[kChunk / 8] = {};
#pragma unroll
    for (int kk = 0; kk < KeyRows / 16; ++kk) {
      Frag4 fa;  // A = dS (queries by keys) from its transpose: the B-tile addressing, transposed
      ldmatrix_x4_trans(fa, ds_s + bt_offset(lane, ld, kk * 16, m0));
#pragma unroll
      for (int d2 = 0; d2 < kChunk / 16; ++d2) {
        Frag4 fb;
        ldmatrix_x4_trans(fb, k_s + b_offset(lane, ld_k, kk * 16, c0 + d2 * 16));
        mma<T>(acc[2 * d2], fa, fb[0], fb[1]);
        mma<T>(acc[2 * d2 + 1], fa, fb[2], fb[3]);
      }
    }
#pragma unroll
    for (int dt = 0; dt < kChunk / 8; ++dt) {
      // Lanes t and t ^ 1 swap halves: the even one gets its partner's row-g pair (columns
      // 2t + 2, 2t + 3), the odd one its partner's row-(g + 8) pair (columns 2t - 2, 2t - 1).
      const bool odd = t % 2 == 1;
      const float give0 = odd ? acc[dt][0] : acc[dt][2], give1 = odd ? acc[dt][1] : acc[dt][3];
      const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1), got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
      const int col = c0 + dt * 8 + 2 * (t - t % 2);
      if (row < queries) {
        float* dst = accum_head + static_cast<std::int64_t>(row) * D + col;
        if (odd) red_add4(dst, got0, got1, acc[dt][2], acc[dt][3]);
        else red_add4(dst, acc[dt][0], acc[dt][1], got0, got1);
      }
    }
  }
}

// dq = scale * the f32 accumulator ([B * H, Tq, D] contiguous), 8 elements (one 16-byte store) a
// thread.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) dq_convert_kernel(Problem p, const float* accum, Heads dq) {
  constexpr int kChunks = D / 8;
  const std::int64_t thread = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (thread >= static_cast<std::int64_t>(p.batch) * p.heads * p.queries * kChunks) return;
  const std::int64_t row = thread / kChunks;
  const int c = static_cast<int>(thread % kChunks) * 8;
  const auto i = static_cast<int>(row % p.queries), bh = static_cast<int>(row / p.queries);
  const float4 lo = *reinterpret_cast<const float4*>(accum + row * D + c);
  const float4 hi = *reinterpret_cast<const float4*>(accum + row * D + c + 4);
  uint4 out;
  out.x = pack<T>(lo.x * p.scale, lo.y * p.scale);
  out.y = pack<T>(lo.z * p.scale, lo.w * p.scale);
  out.z = pack<T>(hi.x * p.scale, hi.y * p.scale);
  out.w = pack<T>(hi.z * p.scale, hi.w * p.scale);
  *reinterpret_cast<uint4*>(row_ptr<T>(dq, bh / p.heads, bh % p.heads, i) + c) = out;
}

// di = rowsum(dO * O) in f32 from the stored values: D / 8 lanes a row, a 16-byte chunk each,
// summed by a fixed shuffle tree (every lane of the warp takes part). With a dQ accumulator
// ([B * H, Tq, D] f32), its elements of the lane's chunk are zeroed on the way (no separate memset).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) row_dot_kernel(Problem p, Heads o, Heads dout, float* di, float* dq_accum) {
  constexpr int kLanesPerRow = D / 8;
  const std::int64_t thread = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const std::int64_t row = thread / kLanesPerRow;
  const int c = static_cast<int>(thread % kLanesPerRow) * 8;
  const bool in = row < static_cast<std::int64_t>(p.batch) * p.heads * p.queries;
  float sum = 0.0f;
  if (in) {
    const auto i = static_cast<int>(row % p.queries), bh = static_cast<int>(row / p.queries);
    const uint4 oc = *reinterpret_cast<const uint4*>(row_ptr<const T>(o, bh / p.heads, bh % p.heads, i) + c);
    const uint4 dc = *reinterpret_cast<const uint4*>(row_ptr<const T>(dout, bh / p.heads, bh % p.heads, i) + c);
    const T* ov = reinterpret_cast<const T*>(&oc);
    const T* dv = reinterpret_cast<const T*>(&dc);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += to_f32(ov[e]) * to_f32(dv[e]);
    if (dq_accum != nullptr) {
      float4* zero = reinterpret_cast<float4*>(dq_accum + row * D + c);
      zero[0] = zero[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (in && c == 0) di[row] = sum;
}

// One block per KeyWarps * 16 keys (a warp a 16-key slice). FusedDq: dQ too, added into dq_accum
// (f32 [B * H, Tq, D], zeroed before).
template <typename T, int D, bool FusedDq, int KeyWarps = kWarps>
__global__ void __launch_bounds__(KeyWarps * 32)
    flash_dkv_kernel(Problem p, Heads q, Heads k, Heads v, Heads dout, const float* lse, const float* di, Heads dk,
                     Heads dv, float* dq_accum) {
  constexpr int kKeyRows = KeyWarps * kFrag, kBlockThreads = KeyWarps * 32;
  using L = BackwardSmem<T, D, kKeyRows>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardTiles<T, D, kKeyRows> s{smem};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads, kb0 = blockIdx.y * kKeyRows;
  const int length = key_length(p, b), row0 = kb0 + warp * kFrag;
  const std::int64_t stats = (static_cast<std::int64_t>(b) * p.heads + h) * p.queries;
  const float scale_log2 = p.scale * kLog2e;
  const auto load_queries = [&](int q0, int buffer) {
    load_tile_async<T, D, kTile, kBlockThreads>(s.streamed(buffer, 0), L::kLd, q, b, h, q0, p.queries);
    load_tile_async<T, D, kTile, kBlockThreads>(s.streamed(buffer, 1), L::kLd, dout, b, h, q0, p.queries);
    load_row_stats(s.lse2(buffer), s.di(buffer), lse, di, stats, q0, p.queries);
  };
  Acc dk_acc[D / 8] = {}, dv_acc[D / 8] = {};
  if (kb0 < length) {  // a block of padding keys only gets zero gradients
    const int q_begin = p.causal ? kb0 : 0;
    load_tile_async<T, D, kKeyRows, kBlockThreads>(s.kept(0), L::kLd, k, b, h, kb0, p.keys);
    load_tile_async<T, D, kKeyRows, kBlockThreads>(s.kept(1), L::kLd, v, b, h, kb0, p.keys);
    load_queries(q_begin, 0);
    cp_async_commit();
    for (int q0 = q_begin, buffer = 0; q0 < p.queries; q0 += kTile, buffer ^= 1) {
      // The other buffer was last read in the previous block, which every warp has left.
      if (q0 + kTile < p.queries) load_queries(q0 + kTile, buffer ^ 1);
      cp_async_commit();
      cp_async_wait<1>();  // this block's queries are in; the next block's may still fly
      __syncthreads();
      const T* q_s = s.streamed(buffer, 0);
      const T* do_s = s.streamed(buffer, 1);
      const float* lse2 = s.lse2(buffer);
      const float* di_s = s.di(buffer);
      Acc pt[kTile / 8], dst[kTile / 8];  // P^T, then dS^T: rows keys, columns queries
      // A causal warp whose keys all come after this block's queries (on the diagonal of a
      // 128-key block) has P = 0: its products are skipped (warp-uniform).
      const bool sees = !FusedDq || !p.causal || row0 < q0 + kTile;
      if (sees) {
        product_abt<T, D>(pt, s.kept(0), q_s, warp * kFrag, L::kLd);
        product_abt<T, D>(dst, s.kept(1), do_s, warp * kFrag, L::kLd);
      }
#pragma unroll
      for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = nt * 8 + 2 * t + (e % 2), i = q0 + c, j = row0 + g + 8 * (e / 2);
          const float prob =
              sees && i < p.queries && pair_visible(p, length, i, j) ? exp2f(pt[nt][e] * scale_log2 - lse2[c]) : 0.0f;
          pt[nt][e] = prob;
          dst[nt][e] = sees ? prob * (dst[nt][e] - di_s[c]) : 0.0f;
        }
      if constexpr (FusedDq) stage_ds<T>(reinterpret_cast<T*>(smem + L::ds), L::kDsLd, dst);
      if (sees) {
        accumulate_xb<T, D>(dv_acc, pt, do_s, L::kLd);
        accumulate_xb<T, D>(dk_acc, dst, q_s, L::kLd);
      }
      if constexpr (FusedDq) {
        __syncthreads();  // every warp's dS^T is staged
        add_dq<T, D, kKeyRows>(dq_accum + stats * D, reinterpret_cast<const T*>(smem + L::ds), L::kDsLd, s.kept(0),
                               L::kLd, q0, p.queries);
      }
      // Every warp is done with this buffer (and the staged dS^T) before the next block refills it.
      __syncthreads();
    }
  }
  cp_async_wait<0>();
  // The warp's own rows of the kept tiles (no other warp reads them) stage its outputs.
  store_acc<T, D>(dv_acc, 1.0f, s.kept(1) + warp * kFrag * L::kLd, L::kLd, dv, b, h, row0, p.keys);
  store_acc<T, D>(dk_acc, p.scale, s.kept(0) + warp * kFrag * L::kLd, L::kLd, dk, b, h, row0, p.keys);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_dq_kernel(Problem p, Heads q, Heads k, Heads v, Heads dout, const float* lse, const float* di, Heads dq) {
  using L = BackwardSmem<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardTiles<T, D> s{smem};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;  // the longest causal rows start first
  const int length = key_length(p, b), key_end = p.causal ? min(length, q0 + kTile) : length;
  const int row0 = q0 + warp * kFrag;
  const std::int64_t stats = (static_cast<std::int64_t>(b) * p.heads + h) * p.queries;
  const float scale_log2 = p.scale * kLog2e;
  const auto load_keys = [&](int kb0, int buffer) {
    load_tile_async<T, D>(s.streamed(buffer, 0), L::kLd, k, b, h, kb0, p.keys);
    load_tile_async<T, D>(s.streamed(buffer, 1), L::kLd, v, b, h, kb0, p.keys);
  };
  float row_lse2[2], row_di[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + g + 8 * r;
    row_lse2[r] = i < p.queries ? lse[stats + i] * kLog2e : 0.0f;
    row_di[r] = i < p.queries ? di[stats + i] : 0.0f;
  }
  load_tile_async<T, D>(s.kept(0), L::kLd, q, b, h, q0, p.queries);
  load_tile_async<T, D>(s.kept(1), L::kLd, dout, b, h, q0, p.queries);
  if (key_end > 0) load_keys(0, 0);
  cp_async_commit();
  Acc dq_acc[D / 8] = {};
  for (int kb0 = 0, buffer = 0; kb0 < key_end; kb0 += kTile, buffer ^= 1) {
    // The other buffer was last read in the previous block, which every warp has left.
    if (kb0 + kTile < key_end) load_keys(kb0 + kTile, buffer ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this block's keys are in; the next block's may still fly
    __syncthreads();
    const T* k_s = s.streamed(buffer, 0);
    const T* v_s = s.streamed(buffer, 1);
    Acc sc[kTile / 8], ds[kTile / 8];  // S, then dS: rows queries, columns keys
    product_abt<T, D>(sc, s.kept(0), k_s, warp * kFrag, L::kLd);
    product_abt<T, D>(ds, s.kept(1), v_s, warp * kFrag, L::kLd);
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, i = row0 + g + 8 * r, j = kb0 + nt * 8 + 2 * t + (e % 2);
        const float prob =
            i < p.queries && pair_visible(p, length, i, j) ? exp2f(sc[nt][e] * scale_log2 - row_lse2[r]) : 0.0f;
        ds[nt][e] = prob * (ds[nt][e] - row_di[r]);
      }
    accumulate_xb<T, D>(dq_acc, ds, k_s, L::kLd);
    __syncthreads();  // every warp is done with this buffer before the next block refills it
  }
  // The warp's own rows of Q (no other warp reads them) stage its output; where no key block ran,
  // every copy into them must first have landed.
  cp_async_wait<0>();
  __syncthreads();
  store_acc<T, D>(dq_acc, p.scale, s.kept(0) + warp * kFrag * L::kLd, L::kLd, dq, b, h, row0, p.queries);
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
        constexpr auto smem = cudaFuncAttributeMaxDynamicSharedMemorySize;
        const int bytes = static_cast<int>(BackwardSmem<T, D>::bytes);
        AB_CUDA(cudaFuncSetAttribute(flash_dkv_kernel<T, D, false>, smem, bytes),
                "attention backward (dk, dv) shared memory");
        AB_CUDA(cudaFuncSetAttribute(flash_dkv_kernel<T, D, true, 4>, smem,
                                     static_cast<int>(BackwardSmem<T, D, 4 * kFrag>::ds_bytes)),
                "attention backward (dk, dv, dq) shared memory");
        AB_CUDA(cudaFuncSetAttribute(flash_dkv_kernel<T, D, true, 8>, smem,
                                     static_cast<int>(BackwardSmem<T, D, 8 * kFrag>::ds_bytes)),
                "attention backward (dk, dv, dq; 128 keys a block) shared memory");
        AB_CUDA(cudaFuncSetAttribute(flash_dq_kernel<T, D>, smem, bytes), "attention backward (dq) shared memory");
      });
    }
}

// The key-block kernel that adds dQ into its accumulator, KeyWarps * 16 keys a block.
template <typename T, int D, int KeyWarps>
void launch_fused_dq(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v,
                     const Heads& dout, const float* lse, const float* di, const Heads& dk, const Heads& dv,
                     float* dq_accum) {
  constexpr int kKeyRows = KeyWarps * kFrag;
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.keys + kKeyRows - 1) / kKeyRows));
  flash_dkv_kernel<T, D, true, KeyWarps><<<grid, KeyWarps * 32, BackwardSmem<T, D, kKeyRows>::ds_bytes, stream>>>(
      p, q, k, v, dout, lse, di, dk, dv, dq_accum);
  device_common::check_launch("cuda_attention", "attention_backward (fused dk, dv, dq)");
}

void flash_backward(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v,
                    const Heads& o, const Heads& dout, const float* lse, float* di, const Heads& dq, const Heads& dk,
                    const Heads& dv, float* dq_accum) {
  dispatch_fused(p, [&](auto tag, auto d) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(d)::value;
    using L = BackwardSmem<T, D>;
    const auto heads = static_cast<unsigned>(p.batch * p.heads);
    const std::int64_t row_dot_threads = static_cast<std::int64_t>(heads) * p.queries * (D / 8);
    const auto blocks_of = [](std::int64_t threads) {
      return static_cast<unsigned>((threads + kThreads - 1) / kThreads);
    };
    row_dot_kernel<T, D><<<blocks_of(row_dot_threads), kThreads, 0, stream>>>(p, o, dout, di, dq_accum);
    device_common::check_launch("cuda_attention", "attention_backward (fused row dots)");
    if (dq_accum != nullptr) {
      if (p.keys > 0) {
        if (variants().backward_keys_per_block == 128)
          launch_fused_dq<T, D, 8>(stream, p, q, k, v, dout, lse, di, dk, dv, dq_accum);
        else launch_fused_dq<T, D, 4>(stream, p, q, k, v, dout, lse, di, dk, dv, dq_accum);
      }
      dq_convert_kernel<T, D><<<blocks_of(row_dot_threads), kThreads, 0, stream>>>(p, dq_accum, dq);
      device_common::check_launch("cuda_attention", "attention_backward (fused dq from its accumulator)");
      return;
    }
    if (p.keys > 0) {
      flash_dkv_kernel<T, D, false>
          <<<dim3(heads, static_cast<unsigned>((p.keys + kTile - 1) / kTile)), kThreads, L::bytes, stream>>>(
              p, q, k, v, dout, lse, di, dk, dv, nullptr);
      device_common::check_launch("cuda_attention", "attention_backward (fused dk, dv)");
    }
    flash_dq_kernel<T, D>
        <<<dim3(heads, static_cast<unsigned>((p.queries + kTile - 1) / kTile)), kThreads, L::bytes, stream>>>(
            p, q, k, v, dout, lse, di, dq);
    device_common::check_launch("cuda_attention", "attention_backward (fused dq)");
  });
}

}  // namespace ab::nn::cuda_attention::detail
