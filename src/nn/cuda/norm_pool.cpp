// Batch norm and max pooling. Batch norm on [N*H*W, C] memory (NHWC) runs the project's kernels
// (cuda_batchnorm): cuDNN's plain spatial API took 40 ms for one f32 NHWC backward at
// [256, 256, 56, 56], 890 ms of a 948 ms ResNet-50 step. The exceptions, and NCHW, go to cuDNN:
// its exponentialAverageFactor is PyTorch's momentum (running = (1 - f) running + f batch, the
// running variance from the unbiased batch variance) and its saved inverse variance is
// 1 / sqrt(var + eps), the reference's saved inverse std. NHWC f16/bf16 training takes cuDNN's
// persistent NHWC kernels (the *Ex API with a workspace sized at bind); the rest cuDNN's plain
// spatial mode. Parameters and statistics are f32 (cuDNN's rule for f32/f16/bf16 data). Max
// pooling uses cuDNN's deterministic max mode.
#include <algorithm>
#include <limits>
#include <utility>

#include "nn/cuda/batchnorm.h"
#include "nn/cuda/conv_search.h"
#include "nn/cuda/kernels_impl.h"
#include "nn/cuda/pointwise.h"

namespace ab::nn::cuda {
namespace {

// How much faster (a fraction of the unfused time) cuDNN's cooperative fused batch norm must time
// to be chosen (time_bn_fusion).
constexpr double kCooperativeMargin = 0.03;

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

// Memory [N*H*W, C] row-major: NHWC, or a shape where NCHW and NHWC name the same bytes.
bool rows_by_channel(const Tensor& x) {
  return x.shape.rank() == 4 && x.strides == contiguous_strides(x.shape, Layout::nhwc);
}

// Whether a batch norm on x runs on cuda_batchnorm (else cuDNN). NHWC training with f16/bf16
// activations runs cuDNN's persistent NHWC kernels where cooperative kernels are allowed (the
// default: cuDNN's path reads x once per forward, ours twice, and measured fast: ResNet-50 bf16 b256
// training 5727 img/s against PyTorch's 4673 on an H200), else the project's kernels
// (set_cooperative_kernels(false): nothing that needs every SM at once).
bool own_batchnorm(const Tensor& x, bool training, bool cooperative_allowed) {
  if (!rows_by_channel(x)) return false;
  if (x.dtype == DType::f32) return true;
  if (x.dtype == DType::f16 || x.dtype == DType::bf16) return !training || !cooperative_allowed;
  return false;
}

std::int64_t bn_rows(const Tensor& x) { return x.shape[0] * x.shape[2] * x.shape[3]; }

const float* f32(const Tensor& t) { return static_cast<const float*>(t.data); }
float* f32_out(const Tensor& t) { return static_cast<float*>(t.data); }

}  // namespace

std::int64_t CudaKernels::bn_scratch_bytes(const Tensor& x) const {
  if (!own_batchnorm(x, true, cooperative_)) return 0;
  return cuda_batchnorm::scratch_bytes(bn_rows(x), x.shape[1]);
}

void* CudaKernels::bn_scratch(const Tensor& x, const char* kernel) {
  const std::int64_t need = bn_scratch_bytes(x);
  if (need > bn_scratch_.bytes()) {
    // Sized at bind (check_tensor); a direct call may grow it, a capture may not allocate.
    if (capturing())
      throw Error(std::string("cuda ") + kernel + ": batch-norm scratch too small for " + x.to_string() +
                  " during capture (bind the graph first: check_tensor sizes it)");
    bn_scratch_ = backend::cuda::DeviceBuffer(need, label_ + " batch-norm scratch");
  }
  return bn_scratch_.get();
}

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
  if (own_batchnorm(x, true, cooperative_)) {
    void* scratch = bn_scratch(x, k);
    cuda_batchnorm::forward_training(stream_, x.dtype, x.data, y.data, bn_rows(x), x.shape[1], f32(gamma), f32(beta),
                                     f32_out(running_mean), f32_out(running_var), f32_out(saved_mean),
                                     f32_out(saved_invstd), d.epsilon, d.momentum, scratch, bn_scratch_.bytes());
    return;
  }
  BnPlan& p = bn_plan(x);
  const float one = 1.0f, zero = 0.0f;
  if (p.use_ex && p.fwd_workspace_bytes <= bn_workspace_.bytes()) {
    const cudnnStatus_t st = cudnnBatchNormalizationForwardTrainingEx(
        cudnn_.get(), p.mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, p.x.get(), x.data, nullptr, nullptr, p.x.get(),
        y.data, p.param.get(), gamma.data, beta.data, d.momentum, running_mean.data, running_var.data, bn_epsilon(d),
        saved_mean.data, saved_invstd.data, nullptr, bn_workspace_.get(),
        static_cast<std::size_t>(p.fwd_workspace_bytes), nullptr, 0);
    if (st == CUDNN_STATUS_SUCCESS) return;
    if (!cudnn_not_supported(st)) check_cudnn(st, "cudnnBatchNormalizationForwardTrainingEx", p.label);
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
  if (own_batchnorm(x, false, cooperative_)) {
    cuda_batchnorm::forward_inference(stream_, x.dtype, x.data, y.data, bn_rows(x), x.shape[1], f32(gamma), f32(beta),
                                      f32(running_mean), f32(running_var), d.epsilon);
    return;
  }
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
  require_like(k, x, dy, "dy");
  if (own_batchnorm(x, true, cooperative_)) {
    // Any of dx, dgamma and dbeta may be absent.
    if (dx.defined()) require_like(k, x, dx, "dx");
    for (const auto& [t, what] :
         {Named{&gamma, "gamma"}, Named{&saved_mean, "saved_mean"}, Named{&saved_invstd, "saved_invstd"}})
      require_channel_vector(k, x, *t, what);
    for (const auto& [t, what] : {Named{&dgamma, "dgamma"}, Named{&dbeta, "dbeta"}})
      if (t->defined()) require_channel_vector(k, x, *t, what);
    void* scratch = bn_scratch(x, k);
    cuda_batchnorm::backward(stream_, x.dtype, x.data, dy.data, dx.defined() ? dx.data : nullptr, accumulate,
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
        cudnn_.get(), p.mode, CUDNN_BATCHNORM_OPS_BN, &one, &data_beta, &one, &zero, p.x.get(), x.data, nullptr,
        nullptr, p.x.get(), dy.data, nullptr, nullptr, p.x.get(), dx.data, p.param.get(), gamma.data, nullptr,
        dgamma.data, dbeta.data, bn_epsilon(d), saved_mean.data, saved_invstd.data, nullptr, bn_workspace_.get(),
        static_cast<std::size_t>(p.bwd_workspace_bytes), nullptr, 0);
    if (st == CUDNN_STATUS_SUCCESS) return;
    if (!cudnn_not_supported(st)) check_cudnn(st, "cudnnBatchNormalizationBackwardEx", p.label);
    p.use_ex = false;
  }
  AB_CUDNN(cudnnBatchNormalizationBackward(cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &one, &data_beta, &one, &zero,
                                           p.x.get(), x.data, p.x.get(), dy.data, p.x.get(), dx.data, p.param.get(),
                                           gamma.data, dgamma.data, dbeta.data, bn_epsilon(d), saved_mean.data,
                                           saved_invstd.data),
           p.label + ", backward");
}

// ---- batch norm + (residual add +) ReLU, fused by cuDNN where it can

BnFusion* CudaKernels::bn_fusion(const Tensor& x, bool residual, std::int64_t mask_bytes) {
  if (!cooperative_) return nullptr;  // cuDNN's fused batch-norm kernels are persistent (cooperative)
  if (x.shape.rank() != 4 || (x.dtype != DType::f16 && x.dtype != DType::bf16) || !is_nhwc(x)) return nullptr;
  BnPlan& p = bn_plan(x);
  BnFusion& f = p.fusion[residual ? 1 : 0];
  if (!f.queried) {
    f.queried = true;
    const cudnnHandle_t h = cudnn_.get();
    if (!p.relu) {
      cudnnActivationDescriptor_t ad = nullptr;
      AB_CUDNN(cudnnCreateActivationDescriptor(&ad), p.label);
      p.relu.reset(ad);
      AB_CUDNN(cudnnSetActivationDescriptor(ad, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0), p.label);
    }
    const cudnnBatchNormOps_t ops = residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    const cudnnTensorDescriptor_t xd = p.x.get(), zd = residual ? xd : nullptr;
    std::size_t fwd = 0, bwd = 0, reserve = 0;
    const cudnnStatus_t sf = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, xd, zd, xd, p.param.get(), p.relu.get(), &fwd);
    const cudnnStatus_t sb = cudnnGetBatchNormalizationBackwardExWorkspaceSize(
        h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, xd, xd, xd, zd, xd, p.param.get(), p.relu.get(), &bwd);
    const cudnnStatus_t sr = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
        h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, p.relu.get(), xd, &reserve);
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

std::vector<std::string> CudaKernels::bn_fusion_notes() const {
  std::vector<std::string> lines;
  for (const auto& [key, plan] : bn_plans_)
    for (const BnFusion& f : plan->fusion)
      if (f.queried) lines.push_back(f.note);
  std::sort(lines.begin(), lines.end());
  return lines;
}

Kernels::FusionCounts CudaKernels::fusion_counts() const {
  FusionCounts c;
  const auto count = [&](bool decided, bool fused) {
    if (decided) ++(fused ? c.fused : c.unfused);
  };
  for (const auto& [key, plan] : bn_plans_)
    for (const BnFusion& f : plan->fusion) count(f.queried, f.usable);
  for (const auto& [key, plan] : conv_plans_)
    for (const ConvEpilogue& e : plan->epilogue) count(e.searched, e.fused);
  return c;
}

namespace {

// Where cuDNN's fused kernels do not run, an NHWC batch norm + ReLU forward still runs as one op:
// the project's batch norm with the residual add and ReLU in its normalising pass
// (cuda_batchnorm::forward_training with z and relu). Its backward is the separate kernels'.
bool own_fused_forward(const Tensor& x) {
  return rows_by_channel(x) && (x.dtype == DType::f32 || x.dtype == DType::f16 || x.dtype == DType::bf16);
}

}  // namespace

std::int64_t CudaKernels::batchnorm_activation_prepare(const Tensor& x, const Tensor& z, const Tensor& mask) {
  const std::int64_t unfused_bytes = Kernels::batchnorm_activation_prepare(x, z, mask);
  const bool residual = z.shape.rank() != 0;
  // Sized here, at bind: a capture may not allocate.
  if (own_fused_forward(x)) {  // also the fallback where cuDNN's fused call is refused or slower
    const std::int64_t need = cuda_batchnorm::scratch_bytes(bn_rows(x), x.shape[1]);
    if (need > bn_scratch_.bytes()) bn_scratch_ = backend::cuda::DeviceBuffer(need, label_ + " batch-norm scratch");
  }
  if (BnFusion* f = bn_fusion(x, residual, mask.size_bytes())) {
    const std::int64_t need = std::max(f->fwd_workspace_bytes, f->bwd_workspace_bytes);
    if (need > bn_workspace_.bytes()) bn_workspace_ = backend::cuda::DeviceBuffer(need, label_ + " batch-norm workspace");
    if (!f->timed) time_bn_fusion(*f, x, residual, mask.size_bytes());
  }
  return unfused_bytes;
}

void CudaKernels::time_bn_fusion(BnFusion& f, const Tensor& x, bool residual, std::int64_t mask_bytes) {
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
    base = search_operands(7 * xb + mb + 8 * cb, no_workspace, what);
  } catch (const OutOfMemory&) {
    f.usable = false;
    f.note += "; no memory for a trial, unfused";
    return;
  }
  const auto at = [&](int i) { return x.with_data(base + i * xb); };
  const Tensor tx = at(0), tz = at(1), ty = at(2), tdy = at(3), tdx = at(4), tdz = at(5);
  const Workspace ws{base + 6 * xb, xb};
  const Tensor mask = Tensor::describe(DType::i32, Shape{mask_bytes / 4}, Layout::nchw, DeviceKind::cuda)
                          .with_data(base + 7 * xb);
  std::vector<Tensor> v;
  for (int i = 0; i < 8; ++i)
    v.push_back(Tensor::describe(DType::f32, Shape{C}, Layout::nchw, DeviceKind::cuda).with_data(base + 7 * xb + mb + i * cb));
  for (int i = 0; i < 4; ++i)
    cuda_pointwise::fill_uniform(stream_, x.dtype, base + i * xb, x.numel(), 61 + static_cast<std::uint64_t>(i), -1.0, 1.0);
  cuda_pointwise::fill(stream_, DType::f32, v[0].data, C, 1.0);  // gamma
  cuda_pointwise::fill(stream_, DType::f32, v[1].data, C, 0.0);  // beta
  cuda_pointwise::fill(stream_, DType::f32, v[2].data, C, 0.0);  // running mean
  cuda_pointwise::fill(stream_, DType::f32, v[3].data, C, 1.0);  // running variance
  const BatchNormDesc d{};
  const Tensor z = residual ? tz : Tensor{}, dz = residual ? tdz : Tensor{};
  const auto forward_backward = [&] {
    batchnorm_activation_forward_training(d, tx, z, v[0], v[1], v[2], v[3], ty, v[4], v[5], mask);
    batchnorm_activation_backward(d, tx, ty, tdy, v[0], v[1], v[4], v[5], mask, residual, tdx, false, dz, false, v[6],
                                  v[7], ws);
    return true;
  };
  GpuSampler sampler(stream_, what);
  double fused_s = 0, unfused_s = 0;
  try {
    forward_backward();  // with f.usable: cuDNN's fused kernels (a refusal switches f off)
    AB_CUDA(cudaStreamSynchronize(stream_), what);
    if (f.usable) fused_s = time_candidate(sampler, forward_backward, std::numeric_limits<double>::infinity(), what);
  } catch (const Error& e) {  // an error where the query had agreed: this shape runs unfused
    cudaStreamSynchronize(stream_);  // queued work on the scratch ends before it may be freed
    cudaGetLastError();
    f.usable = false;
    f.note += std::string("; trial failed (") + e.what() + ")";
  }
  if (!f.usable) return;
  f.usable = false;  // the unfused path for the comparison
  forward_backward();
  unfused_s = time_candidate(sampler, forward_backward, std::numeric_limits<double>::infinity(), what);
  AB_CUDA(cudaStreamSynchronize(stream_), what);
  // cuDNN's fused kernels are cooperative: beside any other kernel (a data-parallel averaging, an
  // all-reduce) they wait for SMs, and a shape where the two time alike flipped between runs (a
  // 2-GPU ResNet-50 step lost 0.14 ms to it, bench/RESULTS.md). They run only where clearly faster.
  f.usable = fused_s < (1.0 - kCooperativeMargin) * unfused_s;
  f.note += std::string(f.usable ? "" : "; not clearly faster than the project's forward + separate backward, unfused") +
            " (forward + backward: fused " + format_us(fused_s) + " us, unfused " + format_us(unfused_s) + " us)";
}

void CudaKernels::batchnorm_activation_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& z,
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
    for (const auto& [t, what] : {Named{&gamma, "gamma"}, Named{&beta, "beta"}, Named{&running_mean, "running_mean"},
                                  Named{&running_var, "running_var"}, Named{&saved_mean, "saved_mean"},
                                  Named{&saved_invstd, "saved_invstd"}})
      require_channel_vector(k, x, *t, what);
  }
  if (f != nullptr) {
    const BnPlan& p = bn_plan(x);
    const float one = 1.0f, zero = 0.0f;
    const cudnnStatus_t st = cudnnBatchNormalizationForwardTrainingEx(
        cudnn_.get(), CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
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
    cuda_batchnorm::forward_training(stream_, x.dtype, x.data, y.data, bn_rows(x), x.shape[1], f32(gamma), f32(beta),
                                     f32_out(running_mean), f32_out(running_var), f32_out(saved_mean),
                                     f32_out(saved_invstd), d.epsilon, d.momentum, bn_scratch_.get(),
                                     bn_scratch_.bytes(), z.defined() ? z.data : nullptr, true);
    return;
  }
  Kernels::batchnorm_activation_forward_training(d, x, z, gamma, beta, running_mean, running_var, y, saved_mean,
                                                 saved_invstd, mask);
}

void CudaKernels::batchnorm_activation_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& y,
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
    for (const auto& [t, what] : {Named{&gamma, "gamma"}, Named{&beta, "beta"}, Named{&saved_mean, "saved_mean"},
                                  Named{&saved_invstd, "saved_invstd"}, Named{&dgamma, "dgamma"},
                                  Named{&dbeta, "dbeta"}})
      require_channel_vector(k, x, *t, what);
    const BnPlan& p = bn_plan(x);
    const float one = 1.0f, zero = 0.0f;
    const cudnnStatus_t st = cudnnBatchNormalizationBackwardEx(
        cudnn_.get(), CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
        residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION, &one, &zero, &one, &zero,
        p.x.get(), x.data, p.x.get(), y.data, p.x.get(), dy.data, residual ? p.x.get() : nullptr,
        residual ? dz.data : nullptr, p.x.get(), dx.data, p.param.get(), gamma.data, beta.data, dgamma.data,
        dbeta.data, bn_epsilon(d), saved_mean.data, saved_invstd.data, p.relu.get(), bn_workspace_.get(),
        static_cast<std::size_t>(f->bwd_workspace_bytes), mask.data, static_cast<std::size_t>(f->reserve_bytes));
    if (st == CUDNN_STATUS_SUCCESS) return;
    if (!cudnn_not_supported(st)) check_cudnn(st, "cudnnBatchNormalizationBackwardEx (fused)", p.label);
    f->usable = false;
    f->note += "; backward refused at its first call (NOT_SUPPORTED), unfused";
  }
  Kernels::batchnorm_activation_backward(d, x, y, dy, gamma, beta, saved_mean, saved_invstd, mask, residual, dx,
                                         dx_accumulate, dz, dz_accumulate, dgamma, dbeta, ws);
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
