// Internal to the CUDA engine: the launchers of the transformer family's own kernels
// (transformer.cu: embedding, LayerNorm, GELU; transformer_optim.cu: the gradient norm, AdamW, the
// step counter, the fused cross-entropy; column_sums.cu: the bias gradients' column sums). Raw device pointers and
// dtypes; the engine (transformer_engine.h) checks the tensors. Activations are f32, f16 or bf16; every sum is in f32
// or f64 in an order fixed by the shapes and the device's SM count, never by scheduling, so results
// are bit-identical run to run. Scratch is the caller's device memory (256-byte aligned).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace ab::nn::cuda_transformer {

// ---- embedding. tokens i32 [rows] (b * seq + t), wte [vocab, C], wpe [positions, C], y [rows, C]
// contiguous, all of dtype t. A token outside [0, vocab) gives a NaN row (the device cannot throw).
void embedding_forward(cudaStream_t stream, DType t, const std::int32_t* tokens, const void* wte, const void* wpe,
                       void* y, std::int64_t rows, std::int64_t seq, std::int64_t channels, std::int64_t vocab);
// Scratch bytes embedding_backward needs for `rows` tokens of `channels` over `vocab`.
std::int64_t embedding_backward_scratch_bytes(std::int64_t rows, std::int64_t channels, std::int64_t vocab);
// dy [rows, C] of dy_t; dwte [vocab, C], dwpe [positions, C] of grad_t. A stable radix sort of
// (token, row) groups each token's rows in row order; runs longer than kEmbeddingSegment rows are
// summed in segments first (partials), so no warp sums more than that many rows or partials.
// Tokens outside [0, vocab) are ignored.
void embedding_backward(cudaStream_t stream, DType dy_t, const void* dy, DType grad_t, const std::int32_t* tokens,
                        void* dwte, bool accumulate_wte, void* dwpe, std::int64_t rows, std::int64_t seq,
                        std::int64_t channels, std::int64_t vocab, std::int64_t positions, void* scratch,
                        std::int64_t scratch_bytes);

// ---- widening casts (transformer_optim.cu): dst[i] (f32) = src[i] (f16 or bf16: `t`), n[i] each.
struct WidenTensor {
  const void* src;
  float* dst;
  std::int64_t n;
};
// dst = scale * (accumulate ? dst + src : src), computed in f32.
struct WidenMode {
  bool accumulate = false;
  float scale = 1.0f;
};
void widen_many(cudaStream_t stream, DType t, const std::vector<WidenTensor>& tensors, WidenMode mode = {});

// ---- column sums (column_sums.cu): sums[c] = the sum over rows of x[:, c]; x [rows, cols] of
// dtype t with row stride ld, sums [cols] of t. Scratch: f32 partials, up to
// column_sums_scratch_bytes(cols) (less splits the rows more coarsely; at least cols * 4).
std::int64_t column_sums_scratch_bytes(std::int64_t cols);
void column_sums(cudaStream_t stream, DType t, const void* x, std::int64_t ld, std::int64_t rows, std::int64_t cols,
                 void* sums, float* scratch, std::int64_t scratch_bytes);

// ---- LayerNorm over rows of C: x, y, dy, dx of dtype t; gamma, beta, dgamma, dbeta of param_t
// (f32 or t); mean, rstd f32 [rows]. mean null: RMSNorm (no mean, beta and dbeta null).
void layernorm_forward(cudaStream_t stream, DType t, DType param_t, const void* x, const void* gamma, const void* beta,
                       void* y, float* mean, float* rstd, std::int64_t rows, std::int64_t channels, double epsilon);
// Largest C layernorm_backward takes (its per-warp channel sums live in shared memory).
std::int64_t layernorm_max_channels();
std::int64_t layernorm_backward_scratch_bytes(std::int64_t rows, std::int64_t channels);
void layernorm_backward(cudaStream_t stream, DType t, DType param_t, const void* x, const void* dy, const void* gamma,
                        const float* mean, const float* rstd, void* dx, bool accumulate, void* dgamma, void* dbeta,
                        std::int64_t rows, std::int64_t channels, float* scratch);

// ---- Dropout (dropout.cu): y (+)= x * keep * scale over n contiguous elements of dtype t, keep
// from dropout_mask.h with the counter (i32 [1]) read on the device.
void dropout(cudaStream_t stream, DType t, const void* x, void* y, std::int64_t n, std::uint64_t seed,
             const std::int32_t* counter, std::uint32_t threshold, float scale, bool accumulate);

// ---- GELU (tanh form), n elements of dtype t; y may be x, dx may be x or dy.
void gelu_forward(cudaStream_t stream, DType t, const void* x, void* y, std::int64_t n);
void gelu_backward(cudaStream_t stream, DType t, const void* x, const void* dy, void* dx, std::int64_t n,
                   bool accumulate);

// ---- the global gradient norm: *out (f32) = the sum of squares of every tensor's elements.
struct SquaresTensor {
  const void* data;
  std::int64_t n;
  DType t;
};
std::int64_t sum_squares_scratch_bytes(std::int64_t tensors);
void sum_squares(cudaStream_t stream, const std::vector<SquaresTensor>& tensors, float* out, float* scratch);

// ---- AdamW over f32 masters, gradients and moments. Each parameter's pointers and size travel in
// the kernel's parameters (up to kAdamWPerLaunch per launch), so a captured step reads no table.
struct AdamWParam {
  float* w;
  const float* g;
  float* m;
  float* v;
  void* copy;  // null, or where the new w is cast to (the launch's copy dtype)
  std::int64_t n;
  double weight_decay;
};
// The step's scalars; the device pointers may be null (step_count: use `step`; grad_norm_squared:
// no clipping; skip_if: never skip).
struct AdamWScalars {
  double learning_rate, beta1, beta2, epsilon, max_grad_norm;
  std::int64_t step;
  const std::int32_t* step_count;
  const float* grad_norm_squared;
  const std::int32_t* skip_if;
};
// copy_t: f16 or bf16, or f32 for a group whose copies are all null.
void adamw_update_many(cudaStream_t stream, const std::vector<AdamWParam>& params, DType copy_t, const AdamWScalars& s);
// *counter += 1 unless skip_if (may be null) holds non-zero.
void count_step(cudaStream_t stream, std::int32_t* counter, const std::int32_t* skip_if);

// ---- the fused classifier loss. logits and dlogits (may be null, may be logits) of dtype t, rows
// `row_stride` elements apart; labels i32 [rows] in [0, vocab) or -1; loss f32 [1]; seed f32 [1]
// (null: 1). A label >= vocab makes the loss NaN.
std::int64_t cross_entropy_scratch_bytes(std::int64_t rows);
void cross_entropy_fused(cudaStream_t stream, DType t, const void* logits, std::int64_t logits_stride,
                         const std::int32_t* labels, float* loss, void* dlogits, std::int64_t dlogits_stride,
                         const float* seed, std::int64_t rows, std::int64_t vocab, void* scratch);

}  // namespace ab::nn::cuda_transformer
