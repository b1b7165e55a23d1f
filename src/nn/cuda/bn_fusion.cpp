// Batch norm + (residual add +) ReLU as one op: cuDNN's fused NHWC kernels (the *Ex API, persistent
// mode) where a trial at bind timed them clearly faster, else the project's batch norm with the add
// and ReLU in its normalising pass forward and the separate kernels backward (docs/ENGINE.md).
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "nn/cuda/batchnorm.h"
#include "nn/cuda/gpu_sampler.h"
#include "nn/cuda/norm_pool_engine.h"
#include "nn/cuda/norm_pool_internal.h"
#include "nn/cuda/pointwise.h"

namespace ab::nn::cuda {

using namespace norm_pool;

namespace {

// How much faster (a fraction of the unfused time) cuDNN's cooperative fused batch norm must time
// to be chosen (time_bn_fusion).
constexpr double kCooperativeMargin = 0.03;

}  // namespace

BnFusion* NormPoolEngine::bn_fusion(const Tensor& x, bool residual, std::int64_t mask_bytes) {
  if (!ctx_.modes.cooperative) return nullptr;  // cuDNN's fused batch-norm kernels are persistent (cooperative)
  if (x.shape.rank() != 4 || (x.dtype != DType::f16 && x.dtype != DType::bf16) || !is_nhwc(x)) return nullptr;
  BnPlan& p = bn_plan(x);
  BnFusion& f = p.fusion[residual ? 1 : 0];
  if (!f.queried) {
    f.queried = true;
    const cudnnHandle_t h = ctx_.cudnn.get();
    if (!p.relu) {
      cudnnActivationDescriptor_t ad = nullptr;
      AB_CUDNN(cudnnCreateActivationDescriptor(&ad), p.label);
      p.relu.reset(ad);
      AB_CUDNN(cudnnSetActivationDescriptor(ad, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0), p.label);
    }
    const cudnnBatchNormOps_t ops =
        residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    const cudnnTensorDescriptor_t xd = p.x.get(), zd = residual ? xd : nullptr;
    std::size_t fwd = 0, bwd = 0, reserve = 0;
    const cudnnStatus_t sf = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, xd, zd, xd, p.param.get(), p.relu.get(), &fwd);
    const cudnnStatus_t sb = cudnnGetBatchNormalizationBackwardExWorkspaceSize(
        h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, xd, xd, xd, zd, xd, p.param.get(), p.relu.get(), &bwd);
    const cudnnStatus_t sr = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
                                                                                  ops, p.relu.get(), xd, &reserve);
    f.fwd_workspace_bytes = static_cast<std::int64_t>(fwd);
    f.bwd_workspace_bytes = static_cast<std::int64_t>(bwd);
    f.reserve_bytes = static_cast<std::int64_t>(reserve);
    const std::string what = p.label + (residual ? ", + residual + ReLU" : ", + ReLU");
    if (sf != CUDNN_STATUS_SUCCESS || sb != CUDNN_STATUS_SUCCESS || sr != CUDNN_STATUS_SUCCESS) {
      f.note = what + ": unfused (cuDNN refuses the fused kernels: " + cudnnGetErrorString(sf) + " / " +
               cudnnGetErrorString(sb) + " / " + cudnnGetErrorString(sr) + "; forward: the project's batch norm " +
               "with add + ReLU, backward: separate kernels)";
    } else if (f.reserve_bytes > mask_bytes) {
      f.note = what + ": unfused (cuDNN's reserve space " + std::to_string(f.reserve_bytes) + " B exceeds the mask's " +
               std::to_string(mask_bytes) + " B; forward: the project's batch norm with add + ReLU)";
    } else {
      f.usable = true;
      f.note = what + ": fused (workspace " + std::to_string(std::max(fwd, bwd)) + " B, reserve " +
               std::to_string(reserve) + " B)";
    }
  }
  return f.usable ? &f : nullptr;
}

std::vector<std::string> NormPoolEngine::bn_fusion_notes() const {
  std::vector<std::string> lines;
  for (const auto& [key, plan] : bn_plans_)
    for (const BnFusion& f : plan->fusion)
      if (f.queried) lines.push_back(f.note);
  std::sort(lines.begin(), lines.end());
  return lines;
}

void NormPoolEngine::count_fusions(Kernels::FusionCounts& counts) const {
  for (const auto& [key, plan] : bn_plans_)
    for (const BnFusion& f : plan->fusion)
      if (f.queried) ++(f.usable ? counts.fused : counts.unfused);
}

namespace {

// Where cuDNN's fused kernels do not run, an NHWC batch norm + ReLU forward still runs as one op:
// the project's batch norm with the residual add and ReLU in its normalising pass
// (cuda_batchnorm::forward_training with z and relu). Its backward is the separate kernels'.
bool own_fused_forward(const Tensor& x) {
  return rows_by_channel(x) && (x.dtype == DType::f32 || x.dtype == DType::f16 || x.dtype == DType::bf16);
}

}  // namespace

std::int64_t NormPoolEngine::batchnorm_activation_prepare(const Tensor& x, const Tensor& z, const Tensor& mask) {
  const std::int64_t unfused_bytes = ctx_.kernels.Kernels::batchnorm_activation_prepare(x, z, mask);
  const bool residual = z.shape.rank() != 0;
  // Sized here, at bind: a capture may not allocate.
  if (own_fused_forward(x)) {  // also the fallback where cuDNN's fused call is refused or slower
    const std::int64_t need = cuda_batchnorm::scratch_bytes(bn_rows(x), x.shape[1]);
    if (need > bn_scratch_.bytes()) bn_scratch_ = backend::cuda::DeviceBuffer(need, ctx_.label + " batch-norm scratch");
  }
  if (BnFusion* f = bn_fusion(x, residual, mask.size_bytes())) {
    const std::int64_t need = std::max(f->fwd_workspace_bytes, f->bwd_workspace_bytes);
    if (need > bn_workspace_.bytes())
      bn_workspace_ = backend::cuda::DeviceBuffer(need, ctx_.label + " batch-norm workspace");
    if (!f->timed) time_bn_fusion(*f, x, residual, mask.size_bytes());
  }
  return unfused_bytes;
}

void NormPoolEngine::time_bn_fusion(BnFusion& f, const Tensor& x, bool residual, std::int64_t mask_bytes) {
  f.timed = true;
  BnPlan& p = bn_plan(x);
  const std::string what = p.label + ", fused batch norm + ReLU trial";
  // Operands: x, z, y, dy, dx, dz and the unfused backward's workspace (x-sized each), the mask,
  // and eight f32 channel vectors (gamma, beta, running and saved statistics, dgamma, dbeta).
  const std::int64_t xb = align_up(x.size_bytes()), mb = align_up(mask_bytes), C = x.shape[1];
  const std::int64_t cb = align_up(C * 4);
  std::int64_t no_workspace = 0;
  unsigned char* base = nullptr;
  try {
    base = ctx_.search_operands(7 * xb + mb + 8 * cb, no_workspace, what);
  } catch (const OutOfMemory&) {
    f.usable = false;
    f.note += "; no memory for a trial, unfused";
    return;
  }
  const auto at = [&](int i) { return x.with_data(base + i * xb); };
  const Tensor tx = at(0), tz = at(1), ty = at(2), tdy = at(3), tdx = at(4), tdz = at(5);
  const Workspace ws{base + 6 * xb, xb};
  const Tensor mask =
      Tensor::describe(DType::i32, Shape{mask_bytes / 4}, Layout::nchw, DeviceKind::cuda).with_data(base + 7 * xb);
  std::vector<Tensor> v;
  for (int i = 0; i < 8; ++i)
    v.push_back(
        Tensor::describe(DType::f32, Shape{C}, Layout::nchw, DeviceKind::cuda).with_data(base + 7 * xb + mb + i * cb));
  for (int i = 0; i < 4; ++i)
    cuda_pointwise::fill_uniform(ctx_.stream, x.dtype, base + i * xb, x.numel(), 61 + static_cast<std::uint64_t>(i),
                                 -1.0, 1.0);
  cuda_pointwise::fill(ctx_.stream, DType::f32, v[0].data, C, 1.0);  // gamma
  cuda_pointwise::fill(ctx_.stream, DType::f32, v[1].data, C, 0.0);  // beta
  cuda_pointwise::fill(ctx_.stream, DType::f32, v[2].data, C, 0.0);  // running mean
  cuda_pointwise::fill(ctx_.stream, DType::f32, v[3].data, C, 1.0);  // running variance
  const BatchNormDesc d{};
  const Tensor z = residual ? tz : Tensor{}, dz = residual ? tdz : Tensor{};
  const auto forward_backward = [&] {
    batchnorm_activation_forward_training(d, tx, z, v[0], v[1], v[2], v[3], ty, v[4], v[5], mask);
    batchnorm_activation_backward(d, tx, ty, tdy, v[0], v[1], v[4], v[5], mask, residual, tdx, false, dz, false, v[6],
                                  v[7], ws);
    return true;
  };
  GpuSampler sampler(ctx_.stream, what);
  double fused_s = 0, unfused_s = 0;
  try {
    forward_backward();  // with f.usable: cuDNN's fused kernels (a refusal switches f off)
    AB_CUDA(cudaStreamSynchronize(ctx_.stream), what);
    if (f.usable) fused_s = time_candidate(sampler, forward_backward, std::numeric_limits<double>::infinity(), what);
  } catch (const Error& e) {             // an error where the query had agreed: this shape runs unfused
    cudaStreamSynchronize(ctx_.stream);  // queued work on the scratch ends before it may be freed
    cudaGetLastError();
    f.usable = false;
    f.note += std::string("; trial failed (") + e.what() + ")";
  }
  if (!f.usable) return;
  f.usable = false;  // the unfused path for the comparison
  forward_backward();
  unfused_s = time_candidate(sampler, forward_backward, std::numeric_limits<double>::infinity(), what);
  AB_CUDA(cudaStreamSynchronize(ctx_.stream), what);
  // cuDNN's fused kernels are cooperative: beside any other kernel (a data-parallel averaging, an
  // all-reduce) they wait for SMs, and a shape where the two time alike flipped between runs (a
  // 2-GPU ResNet-50 step lost 0.14 ms to it, bench/HISTORY.md). They run only where clearly faster.
  f.usable = fused_s < (1.0 - kCooperativeMargin) * unfused_s;
  f.note +=
      std::string(f.usable ? "" : "; not clearly faster than the project's forward + separate backward, unfused") +
      " (forward + backward: fused " + format_us(fused_s) + " us, unfused " + format_us(unfused_s) + " us)";
}

void NormPoolEngine::batchnorm_activation_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& z,
                                                           const Tensor& gamma, const Tensor& beta,
                                                           const Tensor& running_mean, const Tensor& running_var,
                                                           const Tensor& y, const Tensor& saved_mean,
                                                           const Tensor& saved_invstd, const Tensor& mask) {
  const char* k = "batchnorm_activation_forward_training";
  BnFusion* f = bn_fusion(x, z.defined(), mask.size_bytes());
  if (f != nullptr && f->fwd_workspace_bytes > bn_workspace_.bytes()) {
    // Not prepared (a direct call): unfused from now on, so that no backward reads a mask this
    // forward did not write.
    f->usable = false;
    f->note += "; called without batchnorm_activation_prepare, unfused";
    f = nullptr;
  }
  const bool own = own_fused_forward(x) &&
                   cuda_batchnorm::scratch_bytes(bn_rows(x), x.shape[1]) <= bn_scratch_.bytes();  // sized at bind
  if (f != nullptr || own) {
    require_like(k, x, y, "y");
    if (z.defined()) require_like(k, x, z, "z");
    for (const auto& [t, what] :
         {Named{&gamma, "gamma"}, Named{&beta, "beta"}, Named{&running_mean, "running_mean"},
          Named{&running_var, "running_var"}, Named{&saved_mean, "saved_mean"}, Named{&saved_invstd, "saved_invstd"}})
      require_channel_vector(k, x, *t, what);
  }
  if (f != nullptr) {
    const BnPlan& p = bn_plan(x);
    const float one = 1.0f, zero = 0.0f;
    const cudnnStatus_t st = cudnnBatchNormalizationForwardTrainingEx(
        ctx_.cudnn.get(), CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
        z.defined() ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION, &one, &zero, p.x.get(),
        x.data, z.defined() ? p.x.get() : nullptr, z.defined() ? z.data : nullptr, p.x.get(), y.data, p.param.get(),
        gamma.data, beta.data, d.momentum, running_mean.data, running_var.data, bn_epsilon(d), saved_mean.data,
        saved_invstd.data, p.relu.get(), bn_workspace_.get(), static_cast<std::size_t>(f->fwd_workspace_bytes),
        mask.data, static_cast<std::size_t>(f->reserve_bytes));
    if (st == CUDNN_STATUS_SUCCESS) return;
    if (!cudnn_not_supported(st)) check_cudnn(st, "cudnnBatchNormalizationForwardTrainingEx (fused)", p.label);
    // Refused before launching anything: from now on the path below forward and the separate
    // kernels backward (which read y, not the mask).
    f->usable = false;
    f->note += "; refused at its first call (NOT_SUPPORTED), unfused";
  }
  if (own) {
    cuda_batchnorm::forward_training(ctx_.stream, x.dtype, x.data, y.data, bn_rows(x), x.shape[1], f32(gamma),
                                     f32(beta), f32_out(running_mean), f32_out(running_var), f32_out(saved_mean),
                                     f32_out(saved_invstd), d.epsilon, d.momentum, bn_scratch_.get(),
                                     bn_scratch_.bytes(), z.defined() ? z.data : nullptr, true);
    return;
  }
  ctx_.kernels.Kernels::batchnorm_activation_forward_training(d, x, z, gamma, beta, running_mean, running_var, y,
                                                              saved_mean, saved_invstd, mask);
}

void NormPoolEngine::batchnorm_activation_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& y,
                                                   const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                                   const Tensor& saved_mean, const Tensor& saved_invstd,
                                                   const Tensor& mask, bool residual, const Tensor& dx,
                                                   bool dx_accumulate, const Tensor& dz, bool dz_accumulate,
                                                   const Tensor& dgamma, const Tensor& dbeta, Workspace ws) {
  // cuDNN's fused backward overwrites dx, dz (with a residual), dgamma and dbeta: anything else (an
  // accumulating gradient, a residual without one) runs the separate kernels, which read y only.
  BnFusion* f = bn_fusion(x, residual, mask.size_bytes());
  const bool fits = dx.defined() && !dx_accumulate && dgamma.defined() && dbeta.defined() &&
                    (!residual || (dz.defined() && !dz_accumulate));
  if (f != nullptr && fits && f->bwd_workspace_bytes <= bn_workspace_.bytes()) {
    const char* k = "batchnorm_activation_backward";
    for (const auto& [t, what] : {Named{&y, "y"}, Named{&dy, "dy"}, Named{&dx, "dx"}}) require_like(k, x, *t, what);
    if (residual) require_like(k, x, dz, "dz");
    for (const auto& [t, what] :
         {Named{&gamma, "gamma"}, Named{&beta, "beta"}, Named{&saved_mean, "saved_mean"},
          Named{&saved_invstd, "saved_invstd"}, Named{&dgamma, "dgamma"}, Named{&dbeta, "dbeta"}})
      require_channel_vector(k, x, *t, what);
    const BnPlan& p = bn_plan(x);
    const float one = 1.0f, zero = 0.0f;
    const cudnnStatus_t st = cudnnBatchNormalizationBackwardEx(
        ctx_.cudnn.get(), CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
        residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION, &one, &zero, &one, &zero,
        p.x.get(), x.data, p.x.get(), y.data, p.x.get(), dy.data, residual ? p.x.get() : nullptr,
        residual ? dz.data : nullptr, p.x.get(), dx.data, p.param.get(), gamma.data, beta.data, dgamma.data, dbeta.data,
        bn_epsilon(d), saved_mean.data, saved_invstd.data, p.relu.get(), bn_workspace_.get(),
        static_cast<std::size_t>(f->bwd_workspace_bytes), mask.data, static_cast<std::size_t>(f->reserve_bytes));
    if (st == CUDNN_STATUS_SUCCESS) return;
    if (!cudnn_not_supported(st)) check_cudnn(st, "cudnnBatchNormalizationBackwardEx (fused)", p.label);
    f->usable = false;
    f->note += "; backward refused at its first call (NOT_SUPPORTED), unfused";
  }
  ctx_.kernels.Kernels::batchnorm_activation_backward(d, x, y, dy, gamma, beta, saved_mean, saved_invstd, mask,
                                                      residual, dx, dx_accumulate, dz, dz_accumulate, dgamma, dbeta,
                                                      ws);
}

}  // namespace ab::nn::cuda
