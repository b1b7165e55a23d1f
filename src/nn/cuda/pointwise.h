// The engine's own CUDA kernels (everything that is not cuDNN or cuBLASLt): elementwise ops,
// global average pooling, the softmax cross-entropy loss, the SGD/LARS updates and mixed precision.
// Semantics are nn::Kernels' (nn/kernels.h), checked against the reference kernels (nn/ref).
//
// Every function enqueues on `stream` and returns: no allocation, no host sync, no host reads of
// device values, so a sequence of calls can be captured into a CUDA graph. Device flags (skip_if,
// found_nonfinite, the loss scale) are read by the kernels. Reductions whose result is a value
// (loss, LARS norms) use fixed-order trees and no float atomics: bit-identical run to run on one
// device. Math is in f32 (f64 for f64 tensors). Float dtypes are f32, f16, bf16 and f64; any other
// dtype throws ab::Unsupported naming the valid ones. A failed launch throws ab::Error.
// Pointers are device pointers; 16-byte aligned ones take the vectorised paths.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "nn/kernels.h"

namespace ab::nn::cuda_pointwise {

// ---- elementwise (flat arrays of n elements, one dtype)
void relu_forward(cudaStream_t stream, DType t, const void* x, void* y, std::int64_t n);
// dx (+)= (y > 0 ? dy : 0)
void relu_backward(cudaStream_t stream, DType t, const void* y, const void* dy, void* dx, std::int64_t n,
                   bool accumulate);
void add_forward(cudaStream_t stream, DType t, const void* a, const void* b, void* y, std::int64_t n);
// dx (+)= dy
void copy_gradient(cudaStream_t stream, DType t, const void* dy, void* dx, std::int64_t n, bool accumulate);
// y = act(x + bias[c] (+ residual)), act = ReLU when `relu`: x, residual (null: none) and y logical
// [N, C, H, W] contiguous in `layout` (nhwc: C fastest), HW = H * W; bias [C] in the math type (f32
// for f32/f16/bf16 data, f64 for f64), as batch-norm parameters are stored, or with
// bias_is_storage_type in t itself (a fused convolution's bias). y may be x (in place).
void bias_activation_forward(cudaStream_t stream, DType t, Layout layout, const void* x, const void* bias,
                             bool bias_is_storage_type, const void* residual, void* y, std::int64_t N, std::int64_t C,
                             std::int64_t HW, bool relu);

// ---- global average pooling
// x: logical [N, C, H, W] contiguous in `layout` (nhwc: C fastest), HW = H * W; y: [N, C] row-major.
void global_avgpool_forward(cudaStream_t stream, DType t, Layout layout, const void* x, void* y, std::int64_t N,
                            std::int64_t C, std::int64_t HW);
// dx (+)= dy / HW broadcast over H and W.
void global_avgpool_backward(cudaStream_t stream, DType t, Layout layout, const void* dy, void* dx, std::int64_t N,
                             std::int64_t C, std::int64_t HW, bool accumulate);

// ---- softmax cross-entropy
// Floats of scratch softmax_xent_forward needs for N rows (per-row f64 losses, summed in a fixed
// order by a second kernel so the loss is bit-identical run to run). Scratch is the caller's device
// memory, 8-byte aligned (every allocation is), contents irrelevant; calls on one stream may share it.
std::int64_t softmax_xent_scratch_floats(std::int64_t N);
// logits, probs: [N, K] row-major; labels: i32 [N] in [0, K); loss: [1], the mean over the batch.
// A label outside [0, K) makes the loss NaN (the device cannot throw; a NaN loss reads "diverged").
void softmax_xent_forward(cudaStream_t stream, DType logits_t, const void* logits, const std::int32_t* labels,
                          DType probs_t, void* probs, DType loss_t, void* loss, std::int64_t N, std::int64_t K,
                          float* scratch);
// dlogits (+)= dloss[0] * (probs - onehot(labels)) / N; dloss: [1] read on the device.
void softmax_xent_backward(cudaStream_t stream, DType probs_t, const void* probs, const std::int32_t* labels,
                           DType dloss_t, const void* dloss, DType dlogits_t, void* dlogits, std::int64_t N,
                           std::int64_t K, bool accumulate);

// ---- learned compression
// y = step * round(x / step), to the nearest integer with ties to even (torch.round), n elements;
// in the math type (f32; f64 for f64).
void round_forward(cudaStream_t stream, DType t, const void* x, void* y, std::int64_t n, double step);
// Floats of scratch rate_distortion_forward needs (per-block f64 partials; same rules as the
// softmax cross-entropy's scratch).
std::int64_t rate_distortion_scratch_floats();
// x_hat, x: n_x elements, latent: n_latent elements, all of dtype t; loss, mse: [1] of loss_t.
// mse = mean((x_hat - x)^2), loss = mse + lambda * mean(|latent|): f64 sums over a fixed grid, then
// one block sums the partials in a fixed order (bit-identical run to run).
void rate_distortion_forward(cudaStream_t stream, DType t, const void* x_hat, const void* x, std::int64_t n_x,
                             const void* latent, std::int64_t n_latent, double lambda, DType loss_t, void* loss,
                             void* mse, float* scratch);
// dloss: [1] of dloss_t, read on the device. Where dx_hat is non-null: dx_hat (+)= dloss * 2 (x_hat - x) / n_x;
// where dlatent is non-null: dlatent (+)= dloss * lambda * sign(latent) / n_latent (sign(0) = 0).
void rate_distortion_backward(cudaStream_t stream, DType t, const void* x_hat, const void* x, std::int64_t n_x,
                              const void* latent, std::int64_t n_latent, double lambda, DType dloss_t,
                              const void* dloss, void* dx_hat, bool accumulate_x_hat, void* dlatent,
                              bool accumulate_latent);

// ---- optimizer steps (w, g, v: n elements of dtype t). The skip_if member of the step struct is
// ignored; the flag comes as the device pointer skip_if (i32 [1], may be null = never skip):
// non-zero at run time leaves w and v unchanged.
void sgd_update(cudaStream_t stream, DType t, void* w, const void* g, void* v, std::int64_t n, const SgdStep& s,
                const std::int32_t* skip_if);
// One f32 parameter of sgd_update_many: w, g, v of n elements, its weight decay, copy (null for
// none): where the new w is cast to, in the launch's copy dtype, and g_partner (null for none): a
// second gradient; the step then takes (g + g_partner) * 0.5 for g.
struct SgdSegment {
  float* w;
  const float* g;
  float* v;
  void* copy;
  std::int64_t n;
  double weight_decay;
  const float* g_partner = nullptr;
};
// sgd_update on every segment, each new w also cast into its copy (copy_t f16 or bf16; f32 = no
// copies, every segment's copy null), in launches of up to 40 segments (the kernel's parameters
// hold their pointers); s.weight_decay is ignored. Either every segment has a g_partner or none.
// The same arithmetic as sgd_update's f32 path (after the mean: the pairwise mean kernel's).
void sgd_update_many(cudaStream_t stream, const std::vector<SgdSegment>& segments, DType copy_t, const SgdStep& s,
                     const std::int32_t* skip_if);
// Floats of scratch lars_update needs (per-block norm partials). Scratch is the caller's device
// memory, 8-byte aligned (every allocation is), contents irrelevant; calls on one stream may share it.
std::int64_t lars_scratch_floats();
void lars_update(cudaStream_t stream, DType t, void* w, const void* g, void* v, std::int64_t n, const LarsStep& s,
                 const std::int32_t* skip_if, float* scratch);

// ---- mixed precision
// dst = src converted, n elements; f64/f32/f16/bf16 either way, rounding to nearest even.
void cast(cudaStream_t stream, DType src_t, const void* src, DType dst_t, void* dst, std::int64_t n);
// g *= 1 / scale[0] (scale: f32 [1] on the device); *found_nonfinite = 1 if any element of g, as
// read or unscaled, is NaN or Inf (never cleared here).
void unscale_and_check(cudaStream_t stream, DType t, void* g, std::int64_t n, const float* scale,
                       std::int32_t* found_nonfinite);
// PyTorch's GradScaler update on the device: if *found_nonfinite: scale *= backoff, good_steps = 0;
// else ++good_steps, and at growth_interval: scale *= growth (kept only if finite), good_steps = 0.
// Then *found_nonfinite = 0.
void update_loss_scale(cudaStream_t stream, const LossScaleRule& rule, float* scale, std::int32_t* good_steps,
                       std::int32_t* found_nonfinite);

// p[0, n) = value converted to t (float dtypes and i32).
void fill(cudaStream_t stream, DType t, void* p, std::int64_t n, double value);

// ---- for algorithm searches (not per step)
// p[i] = uniform in [lo, hi) from a hash of (seed, i), converted to float dtype t: non-zero,
// non-repeating operands, so a timed kernel meets data like a real step's.
void fill_uniform(cudaStream_t stream, DType t, void* p, std::int64_t n, std::uint64_t seed, double lo, double hi);
// One thread that busy-waits `nanoseconds` on the GPU clock: launches queued behind it start back
// to back, so events around them time the GPU's work, not the host's enqueueing.
void spin(cudaStream_t stream, std::int64_t nanoseconds);

// SM count of the current device (cached per device; launch shapes that fix a reduction order
// depend on it, never on anything that varies run to run).
int sm_count();

}  // namespace ab::nn::cuda_pointwise
