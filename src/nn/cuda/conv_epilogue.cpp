// The folded batch norm's epilogue inside the convolution: y = act(conv(x, w) + bias (+ z)) through
// cudnnConvolutionBiasActivationForward where it timed faster than the plain forward (searched by
// conv.cpp) followed by the bias_act kernel, else those two (docs/ENGINE.md, fold=fused).
#include <algorithm>
#include <cstdio>
#include <limits>

#include "nn/cuda/conv_engine.h"
#include "nn/cuda/conv_search.h"
#include "nn/cuda/pointwise.h"
#include "nn/cuda/spatial.h"

namespace ab::nn::cuda {

ConvEpilogue& ConvEngine::conv_epilogue(ConvPlan& plan, const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                        const Tensor& y, bool relu, bool residual) {
  ConvEpilogue& e = plan.epilogue[(relu ? 1 : 0) + (residual ? 2 : 0)];
  if (e.searched) return e;
  if (ctx_.capturing())
    throw Error(plan.label +
                ": the fused epilogue was not prepared; call conv2d_bias_activation_prepare (bind the "
                "graph) before capturing");
  search_conv_epilogue(plan, e, d, x, w, y, relu, residual);
  return e;
}

void ConvEngine::search_conv_epilogue(ConvPlan& plan, ConvEpilogue& e, const Conv2dDesc& d, const Tensor& x,
                                      const Tensor& w, const Tensor& y, bool relu, bool residual) {
  e.searched = true;
  e.pass.searched = true;
  if (plan.fwd.depthwise_kernel) {  // the project's kernel, faster than cuDNN's, applies the epilogue itself
    e.pass.choice = "epilogue: in the depthwise kernel";
    return;
  }
  if (plan.fwd.algo < 0) return;  // no plain forward either: the composition refuses, naming why
  const std::string label = plan.label + ", epilogue bias" + (residual ? " + residual" : "") + (relu ? " + ReLU" : "");
  const std::int64_t channels = y.shape[1];
  cudnnTensorDescriptor_t bd = nullptr;
  AB_CUDNN(cudnnCreateTensorDescriptor(&bd), label);
  e.bias.reset(bd);
  AB_CUDNN(cudnnSetTensor4dDescriptor(bd, CUDNN_TENSOR_NCHW, cudnn_dtype(y.dtype), 1, narrow(channels, label), 1, 1),
           label);
  cudnnActivationDescriptor_t ad = nullptr;
  AB_CUDNN(cudnnCreateActivationDescriptor(&ad), label);
  e.act.reset(ad);
  AB_CUDNN(cudnnSetActivationDescriptor(ad, relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
                                        CUDNN_NOT_PROPAGATE_NAN, 0.0),
           label);

  // Operands x, w, y, the residual and the bias, random in [-1, 1), then the largest workspace allowed.
  const std::int64_t xb = align_up(x.size_bytes()), wb = align_up(w.size_bytes()), yb = align_up(y.size_bytes());
  const std::int64_t bb = align_up(channels * static_cast<std::int64_t>(size_bytes(y.dtype)));
  std::int64_t cap = conv_workspace_cap();
  unsigned char* base = ctx_.search_operands(xb + wb + 2 * yb + bb, cap, label);
  void* sx = base;
  void* sw = base + xb;
  void* sy = base + xb + wb;
  void* sz = base + xb + wb + yb;
  void* sb = base + xb + wb + 2 * yb;
  void* sws = cap > 0 ? base + xb + wb + 2 * yb + bb : nullptr;
  cuda_pointwise::fill_uniform(ctx_.stream, x.dtype, sx, x.numel(), 41, -1.0, 1.0);
  cuda_pointwise::fill_uniform(ctx_.stream, w.dtype, sw, w.numel(), 42, -1.0, 1.0);
  cuda_pointwise::fill_uniform(ctx_.stream, y.dtype, sy, y.numel(), 43, -1.0, 1.0);
  cuda_pointwise::fill_uniform(ctx_.stream, y.dtype, sz, y.numel(), 44, -1.0, 1.0);
  cuda_pointwise::fill_uniform(ctx_.stream, y.dtype, sb, channels, 45, -1.0, 1.0);
  GpuSampler sampler(ctx_.stream, label + ", timing");
  const std::string what = label + ", timing";
  const float one = 1.0f, zero = 0.0f, alpha2 = residual ? 1.0f : 0.0f;

  // What the call runs unfused: the plain forward's chosen algorithm, then bias_act in place.
  const ConvPass& f = plan.fwd;
  const auto unfused = [&] {
    if (cudnnConvolutionForward(ctx_.cudnn.get(), &one, plan.x.get(), sx, plan.w.get(), sw, f.conv.get(),
                                static_cast<cudnnConvolutionFwdAlgo_t>(f.algo), sws,
                                static_cast<std::size_t>(f.workspace_bytes), &zero, plan.y.get(),
                                sy) != CUDNN_STATUS_SUCCESS)
      return false;
    cuda_pointwise::bias_activation_forward(ctx_.stream, y.dtype, y.layout, sy, sb, true, residual ? sz : nullptr, sy,
                                            y.shape[0], channels, y.shape[2] * y.shape[3], relu);
    return true;
  };
  if (!unfused()) throw Error(label + ": the plain forward failed after its algorithm search succeeded");
  e.unfused_s = time_candidate(sampler, unfused, std::numeric_limits<double>::infinity(), what);

  // Every forward algorithm cuDNN accepts for the fused call (an identity activation only with
  // IMPLICIT_PRECOMP_GEMM, cuDNN's rule), in the forward's math type.
  double best_s = std::numeric_limits<double>::infinity();
  std::string log;
  for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; ++a) {
    const auto algo = static_cast<cudnnConvolutionFwdAlgo_t>(a);
    if (!relu && algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) continue;
    ConvDescPtr conv = make_conv_desc(d, search_math(x.dtype, ctx_.modes.tf32), label);
    std::size_t ws = 0;
    if (cudnnGetConvolutionForwardWorkspaceSize(ctx_.cudnn.get(), plan.x.get(), plan.w.get(), conv.get(), plan.y.get(),
                                                algo, &ws) != CUDNN_STATUS_SUCCESS ||
        static_cast<std::int64_t>(ws) > cap) {
      cudaGetLastError();
      continue;
    }
    // Without a residual, alpha2 = 0 and cuDNN does not read z: y stands in for it.
    const auto launch = [&] {
      return cudnnConvolutionBiasActivationForward(ctx_.cudnn.get(), &one, plan.x.get(), sx, plan.w.get(), sw,
                                                   conv.get(), algo, sws, ws, &alpha2, plan.y.get(), residual ? sz : sy,
                                                   e.bias.get(), sb, e.act.get(), plan.y.get(), sy);
    };
    log += " " + std::to_string(a) + ":";
    if (const cudnnStatus_t st = launch(); st != CUDNN_STATUS_SUCCESS) {
      cudaGetLastError();  // a refused launch leaves no work, only its status
      log += std::string("refused (") + cudnnGetErrorString(st) + ")";
      continue;
    }
    const double t = time_candidate(
        sampler, [&] { return launch() == CUDNN_STATUS_SUCCESS; }, best_s, what);
    log += format_us(t) + "us";
    if (t < best_s) {
      best_s = t;
      e.pass.conv = std::move(conv);
      e.pass.algo = a;
      e.pass.workspace_bytes = static_cast<std::int64_t>(ws);
      e.pass.time_s = t;
    }
  }
  AB_CUDA(cudaStreamSynchronize(ctx_.stream), label);
  e.fused = e.pass.algo >= 0 && best_s < e.unfused_s;
  e.pass.choice =
      std::string("epilogue") + (residual ? " + residual" : "") + (relu ? " + ReLU" : "") + ": " +
      (e.fused ? "fused" : "unfused") + " (conv + bias_act " + format_us(e.unfused_s) + " us, fused " +
      (e.pass.algo >= 0 ? "algo " + std::to_string(e.pass.algo) + " " + format_us(best_s) + " us" : "refused") +
      "); timed" + log;
  if (env_flag("AB_CONV_CHOICES")) std::fprintf(stderr, "%s: %s\n", plan.label.c_str(), e.pass.choice.c_str());
}

std::int64_t ConvEngine::conv2d_bias_activation_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                                        const Tensor& bias, const Tensor& residual, const Tensor& y,
                                                        bool relu) {
  // The plain forward first: the fallback, and the time the fused call must beat.
  const std::int64_t plain_bytes =
      ctx_.kernels.Kernels::conv2d_bias_activation_prepare(d, x, w, bias, residual, y, relu);
  if (bias.dtype != y.dtype) return plain_bytes;  // cuDNN's fused call takes the bias in y's type only
  ConvPlan& p = prepared_conv_plan(d, x, w, y, ConvPasses{false, false});
  const ConvEpilogue& e = conv_epilogue(p, d, x, w, y, relu, residual.shape.rank() != 0);
  return e.fused ? std::max(plain_bytes, e.pass.workspace_bytes) : plain_bytes;
}

namespace {

// The operands a fused call (cuDNN's or the depthwise kernel's) reads: a residual like y, and a
// contiguous bias [C] in y's dtype (or f32 where `f32_bias` is allowed).
void require_epilogue_operands(const ConvPlan& p, const Tensor& bias, const Tensor& residual, const Tensor& y,
                               bool f32_bias) {
  if (residual.defined() &&
      (!(residual.shape == y.shape) || !(residual.strides == y.strides) || residual.dtype != y.dtype))
    throw Unsupported(p.label + ": the residual " + residual.to_string() + " must match y " + y.to_string());
  if (bias.numel() != y.shape[1] || !bias.is_contiguous() ||
      (bias.dtype != y.dtype && !(f32_bias && bias.dtype == DType::f32)))
    throw Unsupported(p.label + ": the bias must be a contiguous [" + std::to_string(y.shape[1]) + "] in " +
                      std::string(to_string(y.dtype)) + (f32_bias ? " or f32" : "") + ", got " + bias.to_string());
}

}  // namespace

void ConvEngine::conv2d_bias_activation_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                                const Tensor& bias, const Tensor& residual, const Tensor& y, bool relu,
                                                Workspace ws) {
  const bool has_residual = residual.defined();
  ConvPlan& p = conv_plan(d, x, w, y);
  if (p.fwd.depthwise_kernel) {
    require_epilogue_operands(p, bias, residual, y, /*f32_bias=*/true);
    cuda_spatial::depthwise_forward(ctx_.stream, d, x, w, bias.data, bias.dtype == y.dtype,
                                    has_residual ? residual.data : nullptr, y, relu);
    return;
  }
  if (bias.dtype == y.dtype) {
    const ConvEpilogue& e = conv_epilogue(p, d, x, w, y, relu, has_residual);
    if (e.fused) {
      require_epilogue_operands(p, bias, residual, y, /*f32_bias=*/false);
      const ConvPass& pass = usable_pass(e.pass, p, ws, "fused forward");
      const float one = 1.0f, alpha2 = has_residual ? 1.0f : 0.0f;
      AB_CUDNN(cudnnConvolutionBiasActivationForward(ctx_.cudnn.get(), &one, p.x.get(), x.data, p.w.get(), w.data,
                                                     pass.conv.get(), static_cast<cudnnConvolutionFwdAlgo_t>(pass.algo),
                                                     ws.data, static_cast<std::size_t>(pass.workspace_bytes), &alpha2,
                                                     p.y.get(), has_residual ? residual.data : y.data, e.bias.get(),
                                                     bias.data, e.act.get(), p.y.get(), y.data),
               p.label + ", fused epilogue");
      return;
    }
  }
  ctx_.kernels.Kernels::conv2d_bias_activation_forward(d, x, w, bias, residual, y, relu, ws);
}

}  // namespace ab::nn::cuda
