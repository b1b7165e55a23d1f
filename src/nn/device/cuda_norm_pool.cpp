// Batch norm and max pooling through cuDNN. Batch norm: cuDNN's exponentialAverageFactor is
// PyTorch's momentum (running = (1 - f) running + f batch, the running variance from the unbiased
// batch variance) and its saved inverse variance is 1 / sqrt(var + eps), the reference's saved
// inverse std. NHWC f16/bf16 activations take the persistent NHWC kernels (the *Ex API with a
// workspace sized at bind); everything else the plain spatial mode. Parameters and statistics are
// f32 (cuDNN's rule for f32/f16/bf16 data). Max pooling uses cuDNN's deterministic max mode.
#include <algorithm>
#include <utility>

#include "nn/device/cuda_kernels_impl.h"

namespace ab::nn::cuda {
namespace {

bool is_nhwc(const Tensor& t) {
  return t.strides == contiguous_strides(t.shape, Layout::nhwc) &&
         !(t.strides == contiguous_strides(t.shape, Layout::nchw));
}

void require_like(const char* kernel, const Tensor& x, const Tensor& t, const char* what) {
  if (!(t.shape == x.shape) || !(t.strides == x.strides) || t.dtype != x.dtype)
    throw Unsupported(std::string("cuda ") + kernel + ": " + what + " " + t.to_string() +
                      " must have x's shape, strides and dtype " + x.to_string());
}

void require_channel_vector(const char* kernel, const Tensor& x, const Tensor& t, const char* what) {
  if (t.dtype != DType::f32 || t.numel() != x.shape[1] || !t.is_contiguous() || !t.defined())
    throw Unsupported(std::string("cuda ") + kernel + ": " + what + " must be f32 [" + std::to_string(x.shape[1]) +
                      "] (batch-norm parameters and statistics stay f32), got " + t.to_string());
}

using Named = std::pair<const Tensor*, const char*>;

double bn_epsilon(const BatchNormDesc& d) { return std::max(d.epsilon, CUDNN_BN_MIN_EPSILON); }

}  // namespace

BnPlan& CudaKernels::bn_plan(const Tensor& x) {
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
    const cudnnHandle_t h = cudnn_.get();
    const bool ok =
        cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, plan->mode, CUDNN_BATCHNORM_OPS_BN, plan->x.get(),
                                                                 nullptr, plan->x.get(), pd, nullptr,
                                                                 &fwd) == CUDNN_STATUS_SUCCESS &&
        cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, plan->mode, CUDNN_BATCHNORM_OPS_BN, plan->x.get(),
                                                          nullptr, plan->x.get(), nullptr, plan->x.get(), pd, nullptr,
                                                          &bwd) == CUDNN_STATUS_SUCCESS &&
        cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, plan->mode, CUDNN_BATCHNORM_OPS_BN, nullptr,
                                                             plan->x.get(), &reserve) == CUDNN_STATUS_SUCCESS;
    plan->use_ex = ok && reserve == 0;
    plan->fwd_workspace_bytes = static_cast<std::int64_t>(fwd);
    plan->bwd_workspace_bytes = static_cast<std::int64_t>(bwd);
  }
  return *bn_plans_.emplace(key, std::move(plan)).first->second;
}

std::int64_t CudaKernels::bn_ex_workspace_bytes(const Tensor& x) {
  if (x.shape.rank() != 4 || (x.dtype != DType::f16 && x.dtype != DType::bf16) || !is_nhwc(x)) return 0;
  try {
    const BnPlan& p = bn_plan(x);
    return p.use_ex ? std::max(p.fwd_workspace_bytes, p.bwd_workspace_bytes) : 0;
  } catch (const Error&) {
    return 0;  // not a shape batch norm can take: it will never meet one
  }
}

void CudaKernels::batchnorm_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma,
                                             const Tensor& beta, const Tensor& running_mean,
                                             const Tensor& running_var, const Tensor& y, const Tensor& saved_mean,
                                             const Tensor& saved_invstd) {
  const char* k = "batchnorm_forward_training";
  require_like(k, x, y, "y");
  for (const auto& [t, what] : {Named{&gamma, "gamma"}, Named{&beta, "beta"}, Named{&running_mean, "running_mean"},
                                Named{&running_var, "running_var"}, Named{&saved_mean, "saved_mean"},
                                Named{&saved_invstd, "saved_invstd"}})
    require_channel_vector(k, x, *t, what);
  BnPlan& p = bn_plan(x);
  const float one = 1.0f, zero = 0.0f;
  if (p.use_ex && p.fwd_workspace_bytes <= bn_workspace_.bytes()) {
    const cudnnStatus_t st = cudnnBatchNormalizationForwardTrainingEx(
        cudnn_.get(), p.mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, p.x.get(), x.data, nullptr, nullptr, p.x.get(),
        y.data, p.param.get(), gamma.data, beta.data, d.momentum, running_mean.data, running_var.data, bn_epsilon(d),
        saved_mean.data, saved_invstd.data, nullptr, bn_workspace_.get(),
        static_cast<std::size_t>(p.fwd_workspace_bytes), nullptr, 0);
    if (st == CUDNN_STATUS_SUCCESS) return;
    if (st != CUDNN_STATUS_NOT_SUPPORTED) check_cudnn(st, "cudnnBatchNormalizationForwardTrainingEx", p.label);
    p.use_ex = false;  // refused before launching anything: the plain API below, from now on
  }
  AB_CUDNN(cudnnBatchNormalizationForwardTraining(cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, p.x.get(),
                                                  x.data, p.x.get(), y.data, p.param.get(), gamma.data, beta.data,
                                                  d.momentum, running_mean.data, running_var.data, bn_epsilon(d),
                                                  saved_mean.data, saved_invstd.data),
           p.label);
}

void CudaKernels::batchnorm_forward_inference(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma,
                                              const Tensor& beta, const Tensor& running_mean,
                                              const Tensor& running_var, const Tensor& y) {
  const char* k = "batchnorm_forward_inference";
  require_like(k, x, y, "y");
  for (const auto& [t, what] : {Named{&gamma, "gamma"}, Named{&beta, "beta"}, Named{&running_mean, "running_mean"},
                                Named{&running_var, "running_var"}})
    require_channel_vector(k, x, *t, what);
  const BnPlan& p = bn_plan(x);
  const float one = 1.0f, zero = 0.0f;
  // Inference has no persistent variant; the [1, C, 1, 1] parameter descriptor is the same.
  AB_CUDNN(cudnnBatchNormalizationForwardInference(cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, p.x.get(),
                                                   x.data, p.x.get(), y.data, p.param.get(), gamma.data, beta.data,
                                                   running_mean.data, running_var.data, bn_epsilon(d)),
           p.label + ", inference");
}

void CudaKernels::batchnorm_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                     const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx,
                                     bool accumulate, const Tensor& dgamma, const Tensor& dbeta) {
  const char* k = "batchnorm_backward";
  if (!dx.defined() || !dgamma.defined() || !dbeta.defined())
    throw Unsupported("cuda batchnorm_backward: cuDNN writes dx, dgamma and dbeta together; all three must exist");
  require_like(k, x, dy, "dy");
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
        cudnn_.get(), p.mode, CUDNN_BATCHNORM_OPS_BN, &one, &data_beta, &one, &zero, p.x.get(), x.data, nullptr,
        nullptr, p.x.get(), dy.data, nullptr, nullptr, p.x.get(), dx.data, p.param.get(), gamma.data, nullptr,
        dgamma.data, dbeta.data, bn_epsilon(d), saved_mean.data, saved_invstd.data, nullptr, bn_workspace_.get(),
        static_cast<std::size_t>(p.bwd_workspace_bytes), nullptr, 0);
    if (st == CUDNN_STATUS_SUCCESS) return;
    if (st != CUDNN_STATUS_NOT_SUPPORTED) check_cudnn(st, "cudnnBatchNormalizationBackwardEx", p.label);
    p.use_ex = false;
  }
  AB_CUDNN(cudnnBatchNormalizationBackward(cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &one, &data_beta, &one, &zero,
                                           p.x.get(), x.data, p.x.get(), dy.data, p.x.get(), dx.data, p.param.get(),
                                           gamma.data, dgamma.data, dbeta.data, bn_epsilon(d), saved_mean.data,
                                           saved_invstd.data),
           p.label + ", backward");
}

// ---- max pooling

PoolPlan& CudaKernels::pool_plan(const Pool2dDesc& d, const Tensor& x, const Tensor& y) {
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

void CudaKernels::maxpool_forward(const Pool2dDesc& d, const Tensor& x, const Tensor& y) {
  const PoolPlan& p = pool_plan(d, x, y);
  const float one = 1.0f, zero = 0.0f;
  AB_CUDNN(cudnnPoolingForward(cudnn_.get(), p.pool.get(), &one, p.x.get(), x.data, &zero, p.y.get(), y.data),
           "maxpool forward " + x.to_string());
}

void CudaKernels::maxpool_backward(const Pool2dDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy,
                                   const Tensor& dx, bool accumulate) {
  require_like("maxpool_backward", y, dy, "dy");
  require_like("maxpool_backward", x, dx, "dx");
  const PoolPlan& p = pool_plan(d, x, y);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  AB_CUDNN(cudnnPoolingBackward(cudnn_.get(), p.pool.get(), &one, p.y.get(), y.data, p.y.get(), dy.data, p.x.get(),
                                x.data, &beta, p.x.get(), dx.data),
           "maxpool backward " + x.to_string());
}

}  // namespace ab::nn::cuda
