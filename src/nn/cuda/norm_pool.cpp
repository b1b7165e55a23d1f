// Batch norm and pooling. Batch norm on [N*H*W, C] memory (NHWC) runs the project's kernels
// (batchnorm.cu): cuDNN's plain spatial API took 40 ms for one f32 NHWC backward at
// [256, 256, 56, 56], 890 ms of a 948 ms ResNet-50 step. The exceptions, and NCHW, go to cuDNN:
// its exponentialAverageFactor is PyTorch's momentum (running = (1 - f) running + f batch, the
// running variance from the unbiased batch variance) and its saved inverse variance is
// 1 / sqrt(var + eps), the reference's saved inverse std. NHWC f16/bf16 training takes cuDNN's
// persistent NHWC kernels (the *Ex API with a workspace sized at bind); the rest cuDNN's plain
// spatial mode. Parameters and statistics are f32 (cuDNN's rule for f32/f16/bf16 data). Max
// pooling forward on NHWC runs the project's kernel (cuda_spatial: cuDNN's moved about 1.1 TB/s
// at VGG-11's [64, 64, 224, 224] fp16), NCHW and the backward cuDNN's deterministic max mode;
// global average pooling the project's kernel.
#include <algorithm>
#include <limits>
#include <utility>

#include "nn/cuda/batchnorm.h"
#include "nn/cuda/norm_pool_engine.h"
#include "nn/cuda/norm_pool_internal.h"
#include "nn/cuda/pointwise.h"
#include "nn/cuda/spatial.h"

namespace ab::nn::cuda {

using namespace norm_pool;

void NormPoolEngine::reserve_for(const Tensor& t) {
  if (t.shape.rank() != 4 || t.dtype == DType::i32) return;
  const std::int64_t need = bn_ex_workspace_bytes(t);
  if (need > bn_workspace_.bytes())
    bn_workspace_ = backend::cuda::DeviceBuffer(need, ctx_.label + " batch-norm workspace");
  const std::int64_t scratch = bn_scratch_bytes(t);
  if (scratch > bn_scratch_.bytes())
    bn_scratch_ = backend::cuda::DeviceBuffer(scratch, ctx_.label + " batch-norm scratch");
}

std::int64_t NormPoolEngine::bn_scratch_bytes(const Tensor& x) const {
  if (!own_batchnorm(x, true, ctx_.modes.cooperative)) return 0;
  return cuda_batchnorm::scratch_bytes(bn_rows(x), x.shape[1]);
}

void* NormPoolEngine::bn_scratch(const Tensor& x, const char* kernel) {
  const std::int64_t need = bn_scratch_bytes(x);
  if (need > bn_scratch_.bytes()) {
    // Sized at bind (check_tensor); a direct call may grow it, a capture may not allocate.
    if (ctx_.capturing())
      throw Error(std::string("cuda ") + kernel + ": batch-norm scratch too small for " + x.to_string() +
                  " during capture (bind the graph first: check_tensor sizes it)");
    bn_scratch_ = backend::cuda::DeviceBuffer(need, ctx_.label + " batch-norm scratch");
  }
  return bn_scratch_.get();
}

BnPlan& NormPoolEngine::bn_plan(const Tensor& x) {
  Key key;
  key.add(x);
  if (auto it = bn_plans_.find(key); it != bn_plans_.end()) return *it->second;
  if (x.shape.rank() != 4) throw Unsupported("cuda batch norm: x must be [N, C, H, W], got " + x.to_string());
  if (x.dtype != DType::f32 && x.dtype != DType::f16 && x.dtype != DType::bf16)
    throw Unsupported("cuda batch norm runs f32, f16 or bf16 activations, not " + std::string(to_string(x.dtype)));
  auto plan = std::make_unique<BnPlan>();
  plan->label = "batchnorm x " + x.to_string();
  plan->x = make_tensor_desc(x);
  const bool persistent = (x.dtype == DType::f16 || x.dtype == DType::bf16) && is_nhwc(x);
  plan->mode = persistent ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT : CUDNN_BATCHNORM_SPATIAL;
  cudnnTensorDescriptor_t pd = nullptr;
  AB_CUDNN(cudnnCreateTensorDescriptor(&pd), plan->label);
  plan->param.reset(pd);
  AB_CUDNN(cudnnDeriveBNTensorDescriptor(pd, plan->x.get(), plan->mode), plan->label);
  if (persistent) {
    // The *Ex kernels need no reserve space for plain batch norm (no fused activation); where
    // cuDNN says otherwise, or refuses the queries, the plain API runs instead, in the spatial
    // mode every layout supports (the saved statistics mean the same in both modes).
    std::size_t fwd = 0, bwd = 0, reserve = 0;
    const cudnnHandle_t h = ctx_.cudnn.get();
    const bool ok =
        cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, plan->mode, CUDNN_BATCHNORM_OPS_BN, plan->x.get(),
                                                                 nullptr, plan->x.get(), pd, nullptr,
                                                                 &fwd) == CUDNN_STATUS_SUCCESS &&
        cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, plan->mode, CUDNN_BATCHNORM_OPS_BN, plan->x.get(), nullptr,
                                                          plan->x.get(), nullptr, plan->x.get(), pd, nullptr,
                                                          &bwd) == CUDNN_STATUS_SUCCESS &&
        cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, plan->mode, CUDNN_BATCHNORM_OPS_BN, nullptr,
                                                             plan->x.get(), &reserve) == CUDNN_STATUS_SUCCESS;
    plan->use_ex = ok && reserve == 0;
    plan->fwd_workspace_bytes = static_cast<std::int64_t>(fwd);
    plan->bwd_workspace_bytes = static_cast<std::int64_t>(bwd);
  }
  return *bn_plans_.emplace(key, std::move(plan)).first->second;
}

std::int64_t NormPoolEngine::bn_ex_workspace_bytes(const Tensor& x) {
  if (x.shape.rank() != 4 || (x.dtype != DType::f16 && x.dtype != DType::bf16) || !is_nhwc(x)) return 0;
  try {
    const BnPlan& p = bn_plan(x);
    return p.use_ex ? std::max(p.fwd_workspace_bytes, p.bwd_workspace_bytes) : 0;
  } catch (const Error&) {
    return 0;  // not a shape batch norm can take: it will never meet one
  }
}

void NormPoolEngine::batchnorm_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma,
                                                const Tensor& beta, const Tensor& running_mean,
                                                const Tensor& running_var, const Tensor& y, const Tensor& saved_mean,
                                                const Tensor& saved_invstd) {
  const char* k = "batchnorm_forward_training";
  require_like(k, x, y, "y");
  for (const auto& [t, what] :
       {Named{&gamma, "gamma"}, Named{&beta, "beta"}, Named{&running_mean, "running_mean"},
        Named{&running_var, "running_var"}, Named{&saved_mean, "saved_mean"}, Named{&saved_invstd, "saved_invstd"}})
    require_channel_vector(k, x, *t, what);
  if (own_batchnorm(x, true, ctx_.modes.cooperative)) {
    void* scratch = bn_scratch(x, k);
    cuda_batchnorm::forward_training(ctx_.stream, x.dtype, x.data, y.data, bn_rows(x), x.shape[1], f32(gamma),
                                     f32(beta), f32_out(running_mean), f32_out(running_var), f32_out(saved_mean),
                                     f32_out(saved_invstd), d.epsilon, d.momentum, scratch, bn_scratch_.bytes());
    return;
  }
  BnPlan& p = bn_plan(x);
  const float one = 1.0f, zero = 0.0f;
  if (p.use_ex && p.fwd_workspace_bytes <= bn_workspace_.bytes()) {
    const cudnnStatus_t st = cudnnBatchNormalizationForwardTrainingEx(
        ctx_.cudnn.get(), p.mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, p.x.get(), x.data, nullptr, nullptr, p.x.get(),
        y.data, p.param.get(), gamma.data, beta.data, d.momentum, running_mean.data, running_var.data, bn_epsilon(d),
        saved_mean.data, saved_invstd.data, nullptr, bn_workspace_.get(),
        static_cast<std::size_t>(p.fwd_workspace_bytes), nullptr, 0);
    if (st == CUDNN_STATUS_SUCCESS) return;
    if (!cudnn_not_supported(st)) check_cudnn(st, "cudnnBatchNormalizationForwardTrainingEx", p.label);
    p.use_ex = false;  // refused before launching anything: the plain API below, from now on
  }
  AB_CUDNN(cudnnBatchNormalizationForwardTraining(ctx_.cudnn.get(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, p.x.get(),
                                                  x.data, p.x.get(), y.data, p.param.get(), gamma.data, beta.data,
                                                  d.momentum, running_mean.data, running_var.data, bn_epsilon(d),
                                                  saved_mean.data, saved_invstd.data),
           p.label);
}

void NormPoolEngine::batchnorm_forward_inference(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma,
                                                 const Tensor& beta, const Tensor& running_mean,
                                                 const Tensor& running_var, const Tensor& y) {
  const char* k = "batchnorm_forward_inference";
  require_like(k, x, y, "y");
  for (const auto& [t, what] : {Named{&gamma, "gamma"}, Named{&beta, "beta"}, Named{&running_mean, "running_mean"},
                                Named{&running_var, "running_var"}})
    require_channel_vector(k, x, *t, what);
  if (own_batchnorm(x, false, ctx_.modes.cooperative)) {
    cuda_batchnorm::forward_inference(ctx_.stream, x.dtype, x.data, y.data, bn_rows(x), x.shape[1], f32(gamma),
                                      f32(beta), f32(running_mean), f32(running_var), d.epsilon);
    return;
  }
  const BnPlan& p = bn_plan(x);
  const float one = 1.0f, zero = 0.0f;
  // Inference has no persistent variant; the [1, C, 1, 1] parameter descriptor is the same.
  AB_CUDNN(cudnnBatchNormalizationForwardInference(ctx_.cudnn.get(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, p.x.get(),
                                                   x.data, p.x.get(), y.data, p.param.get(), gamma.data, beta.data,
                                                   running_mean.data, running_var.data, bn_epsilon(d)),
           p.label + ", inference");
}

void NormPoolEngine::batchnorm_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                        const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx,
                                        bool accumulate, const Tensor& dgamma, const Tensor& dbeta) {
  const char* k = "batchnorm_backward";
  require_like(k, x, dy, "dy");
  if (own_batchnorm(x, true, ctx_.modes.cooperative)) {
    // Any of dx, dgamma and dbeta may be absent.
    if (dx.defined()) require_like(k, x, dx, "dx");
    for (const auto& [t, what] :
         {Named{&gamma, "gamma"}, Named{&saved_mean, "saved_mean"}, Named{&saved_invstd, "saved_invstd"}})
      require_channel_vector(k, x, *t, what);
    for (const auto& [t, what] : {Named{&dgamma, "dgamma"}, Named{&dbeta, "dbeta"}})
      if (t->defined()) require_channel_vector(k, x, *t, what);
    void* scratch = bn_scratch(x, k);
    cuda_batchnorm::backward(ctx_.stream, x.dtype, x.data, dy.data, dx.defined() ? dx.data : nullptr, accumulate,
                             bn_rows(x), x.shape[1], f32(gamma), f32(saved_mean), f32(saved_invstd),
                             dgamma.defined() ? f32_out(dgamma) : nullptr, dbeta.defined() ? f32_out(dbeta) : nullptr,
                             scratch, bn_scratch_.bytes());
    return;
  }
  if (!dx.defined() || !dgamma.defined() || !dbeta.defined())
    throw Unsupported("cuda batchnorm_backward: cuDNN writes dx, dgamma and dbeta together; all three must exist");
  require_like(k, x, dx, "dx");
  for (const auto& [t, what] : {Named{&gamma, "gamma"}, Named{&saved_mean, "saved_mean"},
                                Named{&saved_invstd, "saved_invstd"}, Named{&dgamma, "dgamma"}, Named{&dbeta, "dbeta"}})
    require_channel_vector(k, x, *t, what);
  BnPlan& p = bn_plan(x);
  const float one = 1.0f, zero = 0.0f, data_beta = accumulate ? 1.0f : 0.0f;
  if (p.use_ex && p.bwd_workspace_bytes <= bn_workspace_.bytes()) {
    // No bias: plain batch norm's gradients do not depend on it (cuDNN reads it only for a fused
    // activation).
    const cudnnStatus_t st = cudnnBatchNormalizationBackwardEx(
        ctx_.cudnn.get(), p.mode, CUDNN_BATCHNORM_OPS_BN, &one, &data_beta, &one, &zero, p.x.get(), x.data, nullptr,
        nullptr, p.x.get(), dy.data, nullptr, nullptr, p.x.get(), dx.data, p.param.get(), gamma.data, nullptr,
        dgamma.data, dbeta.data, bn_epsilon(d), saved_mean.data, saved_invstd.data, nullptr, bn_workspace_.get(),
        static_cast<std::size_t>(p.bwd_workspace_bytes), nullptr, 0);
    if (st == CUDNN_STATUS_SUCCESS) return;
    if (!cudnn_not_supported(st)) check_cudnn(st, "cudnnBatchNormalizationBackwardEx", p.label);
    p.use_ex = false;
  }
  AB_CUDNN(cudnnBatchNormalizationBackward(ctx_.cudnn.get(), CUDNN_BATCHNORM_SPATIAL, &one, &data_beta, &one, &zero,
                                           p.x.get(), x.data, p.x.get(), dy.data, p.x.get(), dx.data, p.param.get(),
                                           gamma.data, dgamma.data, dbeta.data, bn_epsilon(d), saved_mean.data,
                                           saved_invstd.data),
           p.label + ", backward");
}

// ---- max pooling

PoolPlan& NormPoolEngine::pool_plan(const Pool2dDesc& d, const Tensor& x, const Tensor& y) {
  Key key;
  key.add(x);
  key.add(y);
  for (std::int64_t v : {d.window_h, d.window_w, d.stride_h, d.stride_w, d.pad_h, d.pad_w}) key.add(v);
  if (auto it = pool_plans_.find(key); it != pool_plans_.end()) return *it->second;
  const std::string label = "maxpool x " + x.to_string() + ", y " + y.to_string();
  if (x.shape.rank() != 4 || y.shape.rank() != 4 || x.dtype != y.dtype)
    throw Unsupported("cuda " + label + ": x and y must be [N, C, H, W] of one dtype");
  auto plan = std::make_unique<PoolPlan>();
  plan->x = make_tensor_desc(x);
  plan->y = make_tensor_desc(y);
  cudnnPoolingDescriptor_t pd = nullptr;
  AB_CUDNN(cudnnCreatePoolingDescriptor(&pd), label);
  plan->pool.reset(pd);
  // Deterministic max mode; a padded position must never win a window (checked against ref).
  auto i = [](std::int64_t v) { return static_cast<int>(v); };
  AB_CUDNN(cudnnSetPooling2dDescriptor(pd, CUDNN_POOLING_MAX_DETERMINISTIC, CUDNN_NOT_PROPAGATE_NAN, i(d.window_h),
                                       i(d.window_w), i(d.pad_h), i(d.pad_w), i(d.stride_h), i(d.stride_w)),
           label);
  int n = 0, c = 0, h = 0, w = 0;
  AB_CUDNN(cudnnGetPooling2dForwardOutputDim(pd, plan->x.get(), &n, &c, &h, &w), label);
  if (n != y.shape[0] || c != y.shape[1] || h != y.shape[2] || w != y.shape[3])
    throw Error(label + ": cuDNN computes an output of [" + std::to_string(n) + ", " + std::to_string(c) + ", " +
                std::to_string(h) + ", " + std::to_string(w) + "]");
  return *pool_plans_.emplace(key, std::move(plan)).first->second;
}

void NormPoolEngine::maxpool_forward(const Pool2dDesc& d, const Tensor& x, const Tensor& y) {
  if (cuda_spatial::maxpool_refusal(d, x, y).empty()) {
    cuda_spatial::maxpool_forward(ctx_.stream, d, x, y);
    return;
  }
  const PoolPlan& p = pool_plan(d, x, y);
  const float one = 1.0f, zero = 0.0f;
  AB_CUDNN(cudnnPoolingForward(ctx_.cudnn.get(), p.pool.get(), &one, p.x.get(), x.data, &zero, p.y.get(), y.data),
           "maxpool forward " + x.to_string());
}

void NormPoolEngine::maxpool_backward(const Pool2dDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy,
                                      const Tensor& dx, bool accumulate) {
  require_like("maxpool_backward", y, dy, "dy");
  require_like("maxpool_backward", x, dx, "dx");
  const PoolPlan& p = pool_plan(d, x, y);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  AB_CUDNN(cudnnPoolingBackward(ctx_.cudnn.get(), p.pool.get(), &one, p.y.get(), y.data, p.y.get(), dy.data, p.x.get(),
                                x.data, &beta, p.x.get(), dx.data),
           "maxpool backward " + x.to_string());
}

// ---- global average pooling (the project's kernels)

namespace {

void require_pool_operands(const char* kernel, const Tensor& x4, const Tensor& y2) {
  if (x4.shape.rank() != 4 || y2.shape.rank() != 2 || y2.shape[0] != x4.shape[0] || y2.shape[1] != x4.shape[1] ||
      !x4.is_contiguous() || !y2.is_contiguous() || x4.dtype != y2.dtype)
    throw Unsupported(std::string("cuda ") + kernel + ": needs contiguous [N, C, H, W] and [N, C] of one dtype, got " +
                      x4.to_string() + " and " + y2.to_string());
}

}  // namespace

void NormPoolEngine::global_avgpool_forward(const Tensor& x, const Tensor& y) {
  require_pool_operands("global_avgpool_forward", x, y);
  cuda_pointwise::global_avgpool_forward(ctx_.stream, x.dtype, x.layout, x.data, y.data, x.shape[0], x.shape[1],
                                         x.shape[2] * x.shape[3]);
}

void NormPoolEngine::global_avgpool_backward(const Tensor& dy, const Tensor& dx, bool accumulate) {
  require_pool_operands("global_avgpool_backward", dx, dy);
  cuda_pointwise::global_avgpool_backward(ctx_.stream, dx.dtype, dx.layout, dy.data, dx.data, dx.shape[0], dx.shape[1],
                                          dx.shape[2] * dx.shape[3], accumulate);
}

}  // namespace ab::nn::cuda
