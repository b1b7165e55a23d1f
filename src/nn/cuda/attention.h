// The attention family's CUDA kernels (attention.cu, attention_flash_fwd.cu, attention_flash_bwd.cu):
// scaled dot-product attention forward and backward with nn::Kernels' semantics (nn/kernels.h).
//
// Fused flash-attention-2 kernels for f16 and bf16 at head dims 64 and 128 (mma.sync tensor cores,
// f32 accumulation, online softmax, scores kept in registers, causal blocks above the diagonal
// skipped);
// a plain warp-per-row kernel for f32 and other head dims (up to kMaxSimpleDim). Backward:
// Di = rowsum(dO * O), then one pass over key blocks (dK, dV) rebuilding P from q, k and the
// saved log-sum-exp; dQ either from a second pass over query blocks (deterministic, no atomics)
// or, given an f32 accumulator (fused kernels only), added in the key-block pass by atomic
// reductions (flash attention 2's way: S and dP built once; the sum's order varies run to run),
// 64 or 128 keys a block (attention_variants.h).
//
// Every function enqueues on `stream` and returns: no allocation, no host sync, no host reads of
// device values (key lengths are read on the device), so calls can be captured into a CUDA graph.
// A failed launch throws ab::Error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "nn/cuda/attention_variants.h"

namespace ab::nn::cuda_attention {

// The largest head dim the plain kernels take (each lane of a warp holds D / 32 values).
inline constexpr int kMaxSimpleDim = 256;

// A [B, H, T, D] operand: element strides of batch, head and row; the last dim contiguous.
struct Heads {
  void* data = nullptr;
  std::int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};

struct Problem {
  DType dtype = DType::bf16;  // f32, f16 or bf16: every operand but the statistics
  int batch = 0, heads = 0, queries = 0, keys = 0, dim = 0;
  float scale = 0.0f;  // already resolved (never 0)
  bool causal = false;
  const std::int32_t* key_lengths = nullptr;  // device i32 [B] (null: every key), clamped to [0, keys]
  std::int64_t key_lengths_stride = 1;
};

// Raises the fused kernels' shared-memory limits on the current device: once, before any call
// (and outside any capture).
void prepare();

// Whether the fused kernels take this problem: an sm_80 or later device, f16/bf16, D 64 or 128,
// and every operand's base 16-byte aligned with strides that keep each row so (what their
// 16-byte loads need).
bool fused(const Problem& p, const Heads* operands, int count);

// o [B, H, Tq, D]; lse f32 [B, H, Tq] contiguous: each query row's log-sum-exp of its scaled,
// masked scores (-inf, with o = 0, for a row that sees no key).
void forward(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v, const Heads& o,
             float* lse);

// dq, dk, dv written. di: f32 scratch of B * H * Tq floats. dq_accum: null (deterministic), or
// f32 scratch of B * H * Tq * D floats for the atomic dQ (used where the fused kernels run).
void backward(cudaStream_t stream, const Problem& p, const Heads& q, const Heads& k, const Heads& v, const Heads& o,
              const Heads& dout, const float* lse, const Heads& dq, const Heads& dk, const Heads& dv, float* di,
              float* dq_accum);

}  // namespace ab::nn::cuda_attention
