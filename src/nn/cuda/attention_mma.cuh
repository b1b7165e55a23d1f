// Warp-level tensor-core pieces of the fused attention kernels, in inline PTX (sm_80 and later):
// ldmatrix loads of 8x8 16-bit blocks from shared memory and mma.sync m16n8k16 with f32
// accumulation. The fragment layouts are the PTX ISA's: with g = lane / 4 and t = lane % 4, an
// accumulator tile (16 x 8) holds rows g and g + 8, columns 2t and 2t + 1 ({c0, c1} and {c2, c3});
// an A tile (16 x 16) a0..a3 = (row g, cols 2t..), (row g + 8, cols 2t..), (row g, cols 8 + 2t..),
// (row g + 8, cols 8 + 2t..); a B tile (16 x 8) b0, b1 = (rows 2t.., col g), (rows 8 + 2t.., col g).
// So two accumulator tiles side by side are, packed to 16 bits, one A tile: the probabilities of
// S = Q K^T feed P V without leaving registers (flash attention 2's trick).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace ab::nn::cuda_attention::detail {

using Frag4 = std::uint32_t[4];  // an A tile, or two B tiles
using Acc = float[4];            // a 16 x 8 accumulator tile

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8x8 blocks; lane l gives the address of row l % 8 of block l / 8.
__device__ __forceinline__ void ldmatrix_x4(Frag4& r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row))
               : "memory");
}
// The same, each block transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(Frag4& r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row))
               : "memory");
}

// c += a b for one 16 x 8 tile (b0, b1 one B tile).
template <typename T>
__device__ __forceinline__ void mma(Acc& c, const Frag4& a, std::uint32_t b0, std::uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    AB_SM80_ASM(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    AB_SM80_ASM(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two f32 values as one register of 16-bit T, lo in the low half (the lower column).
template <typename T>
__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
}

// Accumulator tiles 2k and 2k + 1 (16 x 16 of a 16-row score block) as the A tile of k-step k.
template <typename T>
__device__ __forceinline__ void acc_to_a(Frag4& a, const Acc& left, const Acc& right) {
  a[0] = pack<T>(left[0], left[1]);
  a[1] = pack<T>(left[2], left[3]);
  a[2] = pack<T>(right[0], right[1]);
  a[3] = pack<T>(right[2], right[3]);
}

// ldmatrix row addresses (lane l) in a row-major 16-bit tile with `ld` elements a row:
// the A tile at (row0, col0);
__device__ __forceinline__ int a_offset(int lane, int ld, int row0, int col0) {
  return (row0 + lane % 16) * ld + col0 + (lane / 16) * 8;
}
// two B tiles (n0..n0+7 and n0+8..n0+15, k-step at col0) of a tile stored [n][k] (K for Q K^T);
__device__ __forceinline__ int bt_offset(int lane, int ld, int n0, int col0) {
  return (n0 + lane % 8 + (lane / 16) * 8) * ld + col0 + ((lane / 8) % 2) * 8;
}
// two B tiles (columns n0..n0+7 and n0+8..n0+15, k-step at row k0) of a tile stored [k][n] (V
// for P V), for ldmatrix_x4_trans.
__device__ __forceinline__ int b_offset(int lane, int ld, int k0, int n0) {
  return (k0 + lane % 8 + ((lane / 8) % 2) * 8) * ld + n0 + (lane / 16) * 8;
}

}  // namespace ab::nn::cuda_attention::detail
