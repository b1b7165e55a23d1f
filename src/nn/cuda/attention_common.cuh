// Pieces the attention kernel files share (attention.cu, attention_flash_fwd.cu,
// attention_flash_bwd.cu): operand addressing, the key mask, and the fused
// kernels' launchers that attention.cu dispatches to.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "nn/cuda/attention.h"
#include "nn/cuda/device_common.cuh"

// Inline PTX of the fused kernels that needs sm_80 (cp.async, mma.sync m16n8k16). A binary built
// for older GPUs too (the release preset's sm_75) compiles those kernels to a trap there; fused()
// never picks them on such a device (device_runs_fused), so the trap is unreachable.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define AB_SM80_ASM(...) __trap()
#else
#define AB_SM80_ASM(...) asm volatile(__VA_ARGS__)
#endif

namespace ab::nn::cuda_attention::detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using device_common::from_f32;
using device_common::to_f32;

// Row `row` of head (b, h).
template <typename T>
__device__ __forceinline__ T* row_ptr(const Heads& t, int b, int h, std::int64_t row) {
  return static_cast<T*>(t.data) + b * t.batch_stride + h * t.head_stride + row * t.row_stride;
}

// Keys [0, length) of sequence b are real; the rest are padding.
__device__ __forceinline__ int key_length(const Problem& p, int b) {
  if (p.key_lengths == nullptr) return p.keys;
  return min(max(p.key_lengths[b * p.key_lengths_stride], 0), p.keys);
}

// The keys query i may see: [0, end).
__device__ __forceinline__ int visible_end(const Problem& p, int length, int i) {
  return p.causal ? min(length, i + 1) : length;
}

// The fused kernels (f16/bf16, D 64 or 128; fused() has said yes).
void flash_forward(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v,
                   const Heads& o, float* lse);
// di: the row-dot scratch (B * H * Tq floats); dq_accum: null, or the dQ accumulator (backward()).
void flash_backward(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v,
                    const Heads& o, const Heads& dout, const float* lse, float* di, const Heads& dq, const Heads& dk,
                    const Heads& dv, float* dq_accum);

}  // namespace ab::nn::cuda_attention::detail
