// Batch norm on activations whose memory is [rows, C] row-major: NHWC (rows = N * H * W, C
// fastest), where cuDNN's plain spatial kernels are slow (one backward at [256, 256, 56, 56] took
// 40 ms). Semantics are nn::Kernels' and the reference's (nn/ref/ref_norm_pool.cpp): biased batch
// variance for normalising, unbiased for the running variance, PyTorch's momentum, the exact
// epsilon (no cuDNN minimum).
//
// Statistics are per-channel sums in f64 over fixed tiles of rows (a two-stage reduction: per
// block partials into scratch, then a small kernel sums them in a fixed order), so results are
// bit-identical run to run and use no atomics. The forward sums x - x[0, c] and its square: a
// shift by one sample keeps the variance free of cancellation, and every block's partial sums add
// up exactly. Elementwise passes compute in f64 beside f32 data and in f32 beside f16/bf16 (the
// stored result's rounding dominates there), rounding once to the storage type.
//
// Activations f32, f16 or bf16 (others throw Unsupported naming these); parameters and
// statistics f32 [C]; pointers are device pointers. Every call only enqueues on `stream`: no
// allocation and no synchronisation, so a step can be captured. Scratch is the caller's device
// memory (scratch_bytes), contents irrelevant; calls on one stream may share it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace ab::nn::cuda_batchnorm {

// Scratch bytes forward_training and backward need for [rows, channels] on the current device.
std::int64_t scratch_bytes(std::int64_t rows, std::int64_t channels);

// y = (x - mean) * gamma * invstd + beta with the batch's statistics; writes saved_mean,
// saved_invstd = 1 / sqrt(var + epsilon) and updates the running statistics. y may be x. For a
// batch norm fused with what follows it in a ResNet: z (same layout as x; null: none) is added and,
// with `relu`, ReLU applied, in the same pass, rounding once.
void forward_training(cudaStream_t stream, DType t, const void* x, void* y, std::int64_t rows, std::int64_t channels,
                      const float* gamma, const float* beta, float* running_mean, float* running_var,
                      float* saved_mean, float* saved_invstd, double epsilon, double momentum, void* scratch,
                      std::int64_t scratch_bytes, const void* z = nullptr, bool relu = false);

// y = (x - running_mean) * gamma / sqrt(running_var + epsilon) + beta. One elementwise pass.
void forward_inference(cudaStream_t stream, DType t, const void* x, void* y, std::int64_t rows,
                       std::int64_t channels, const float* gamma, const float* beta, const float* running_mean,
                       const float* running_var, double epsilon);

// With xhat = (x - saved_mean) * saved_invstd, per channel: dbeta = sum(dy), dgamma = sum(dy * xhat),
// dx (+)= gamma * invstd * (dy - dbeta / rows - xhat * dgamma / rows). dx, dgamma and dbeta may
// each be null (not computed). dx may be dy.
void backward(cudaStream_t stream, DType t, const void* x, const void* dy, void* dx, bool accumulate,
              std::int64_t rows, std::int64_t channels, const float* gamma, const float* saved_mean,
              const float* saved_invstd, float* dgamma, float* dbeta, void* scratch, std::int64_t scratch_bytes);

}  // namespace ab::nn::cuda_batchnorm
