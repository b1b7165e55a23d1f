// What the fused attention kernels (attention_flash_fwd.cu, attention_flash_bwd.cu) share: the
// tile shape, padded shared-memory tiles and their 16-byte loads, the mask, the dtype and head-dim
// dispatch (their tensor-core pieces are attention_mma.cuh).
#pragma once

#include "nn/cuda/attention_common.cuh"
#include "nn/cuda/device_common.cuh"

namespace ab::nn::cuda_attention::detail {

// 64 query rows by 64 key rows per tile; 4 warps, each owning 16 rows of its block's 64.
constexpr int kTile = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kFrag = 16;
// Row padding (elements): rows stay 16-byte aligned for ldmatrix, and the 8 rows one ldmatrix
// block reads fall in distinct banks.
constexpr int kPad16 = 8;

// Rows [row0, row0 + Rows) of head (b, h) into dst (ld elements a row) by cp.async, 16 bytes a
// copy; rows at or past `rows` are zero-filled (so no stale value, NaN included, reaches a
// product). Lands while the block computes on another buffer; cp_async_commit closes a group,
// cp_async_wait<N> waits until at most N of this thread's groups are in flight (then a
// __syncthreads publishes them).
// Threads: the block's size (every thread takes part).
template <typename T, int D, int Rows = kTile, int Threads = kThreads>
__device__ __forceinline__ void load_tile_async(T* dst, int ld, const Heads& t, int b, int h, int row0, int rows) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < Rows * kChunks; idx += Threads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    const bool in = row0 + r < rows;
    const T* src = row_ptr<const T>(t, b, h, in ? row0 + r : row0) + c;  // a valid address even when unread
    const auto dst_addr = static_cast<unsigned>(__cvta_generic_to_shared(dst + r * ld + c));
    AB_SM80_ASM("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_addr), "l"(src), "r"(in ? 16 : 0));
  }
}
__device__ __forceinline__ void cp_async_commit() { AB_SM80_ASM("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  AB_SM80_ASM("cp.async.wait_group %0;\n" ::"n"(N));
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
