// What the fused attention kernels (attention_flash_fwd.cu, attention_flash_bwd.cu) share: the
// tile shape, padded shared-memory tiles, 16-byte tile loads, and the nvcuda::wmma fragments
// (16x16x16, f32 accumulation) they multiply with.
#pragma once

#include <mma.h>

#include "nn/cuda/attention_common.cuh"
#include "nn/cuda/device_common.cuh"

namespace ab::nn::cuda_attention::detail {

namespace wmma = nvcuda::wmma;

// 64 query rows by 64 key rows per tile; 4 warps, each owning 16 rows of its block's 64.
constexpr int kTile = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kFrag = 16;
// Row padding (elements) that keeps wmma's 32-byte alignment and shifts rows across banks.
constexpr int kPad16 = 8;
constexpr int kPadF32 = 4;
constexpr int kScoreLd = kTile + kPadF32;  // a warp's f32 16 x 64 score tile
constexpr int kProbLd = kTile + kPad16;    // a warp's 16-bit 16 x 64 probability tile

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, wmma::row_major>;
template <typename T>
using FragB = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, wmma::row_major>;
template <typename T>
using FragBt = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, wmma::col_major>;  // a row-major tile, transposed
using FragC = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// rows [row0, row0 + kTile) of head (b, h) into dst (ld elements a row) by 16-byte chunks; rows
// at or past `rows` are zero (so no stale value, NaN included, reaches a product).
template <typename T, int D>
__device__ __forceinline__ void load_tile(T* dst, int ld, const Heads& t, int b, int h, int row0, int rows) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < kTile * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    uint4 chunk = make_uint4(0, 0, 0, 0);
    if (row0 + r < rows) chunk = *reinterpret_cast<const uint4*>(row_ptr<const T>(t, b, h, row0 + r) + c);
    *reinterpret_cast<uint4*>(dst + r * ld + c) = chunk;
  }
}

// out (16 x 64, f32, ld kScoreLd) = a (16 x D rows, ld lda) times b (64 x D rows, ld ldb) transposed.
template <typename T, int D>
__device__ __forceinline__ void scores_16x64(float* out, const T* a, int lda, const T* b, int ldb) {
  FragA<T> fa[D / kFrag];
#pragma unroll
  for (int kt = 0; kt < D / kFrag; ++kt) wmma::load_matrix_sync(fa[kt], a + kt * kFrag, lda);
#pragma unroll
  for (int nt = 0; nt < kTile / kFrag; ++nt) {
    FragC c;
    wmma::fill_fragment(c, 0.0f);
#pragma unroll
    for (int kt = 0; kt < D / kFrag; ++kt) {
      FragBt<T> fb;
      wmma::load_matrix_sync(fb, b + nt * kFrag * ldb + kt * kFrag, ldb);
      wmma::mma_sync(c, fa[kt], fb, c);
    }
    wmma::store_matrix_sync(out + nt * kFrag, c, kScoreLd, wmma::mem_row_major);
  }
}

// acc[dt] (16 x 16 column block dt of 16 x D) += a (16 x 64, ld kProbLd) times b (64 x D rows, ld ldb).
template <typename T, int D>
__device__ __forceinline__ void accumulate_16xD(FragC (&acc)[D / kFrag], const T* a, const T* b, int ldb) {
#pragma unroll
  for (int kt = 0; kt < kTile / kFrag; ++kt) {
    FragA<T> fa;
    wmma::load_matrix_sync(fa, a + kt * kFrag, kProbLd);
#pragma unroll
    for (int dt = 0; dt < D / kFrag; ++dt) {
      FragB<T> fb;
      wmma::load_matrix_sync(fb, b + kt * kFrag * ldb + dt * kFrag, ldb);
      wmma::mma_sync(acc[dt], fa, fb, acc[dt]);
    }
  }
}

// A warp's 16 x D f32 rows (staged in `stage`, ld D + kPadF32) times `factor` into rows
// [row0, row0 + 16) of head (b, h), those below `rows`; lane pairs share a row, half each.
template <typename T, int D>
__device__ __forceinline__ void store_rows(const Heads& t, int b, int h, int row0, int rows, const float* stage,
                                           float factor) {
  const int lane = threadIdx.x % 32, r = lane / 2, c0 = (lane % 2) * (D / 2);
  if (row0 + r >= rows) return;
  T* dst = row_ptr<T>(t, b, h, row0 + r);
#pragma unroll
  for (int c = c0; c < c0 + D / 2; c += 8) {
    alignas(16) T chunk[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) chunk[e] = from_f32<T>(stage[r * (D + kPadF32) + c + e] * factor);
    *reinterpret_cast<uint4*>(dst + c) = *reinterpret_cast<const uint4*>(chunk);
  }
}

// Whether query i sees key j: a real key (below the sequence's length), not after i when causal.
__device__ __forceinline__ bool pair_visible(const Problem& p, int length, int i, int j) {
  return j < length && (!p.causal || j <= i);
}

// Calls f(Tag<T>{}, integral_constant<int, D>{}) with T the storage type (f16 or bf16) and D
// the head dim (64 or 128) of p.
template <typename F>
void dispatch_fused(const Problem& p, F&& f) {
  const auto by_dim = [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.dim == 64) f(device_common::Tag<T>{}, std::integral_constant<int, 64>{});
    else f(device_common::Tag<T>{}, std::integral_constant<int, 128>{});
  };
  if (p.dtype == DType::f16) by_dim(device_common::Tag<__half>{});
  else by_dim(device_common::Tag<__nv_bfloat16>{});
}

// Sets the fused kernels' shared-memory limits (above the default 48 KiB) on the current device;
// once, before any launch or capture.
void flash_forward_prepare();
void flash_backward_prepare();

}  // namespace ab::nn::cuda_attention::detail
