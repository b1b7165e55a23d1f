// Kernels::conv2d_fp8_* on the GPU: per call, x's amax and its e4m3 image (the scale computed on the
// device, so a captured graph replays with each batch's own scale), then cuDNN's fp8 convolution
// graph with the descale, bias, residual and ReLU inside it (conv_fp8.h). The weights' e4m3
// image, descale and the bias widened to f32 are made once per parameter state and kept by the
// weight's address. Where cuDNN refuses the residual inside its graph, the graph stops after the
// descale and the bias_act kernel adds bias and residual and applies the ReLU.
#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "nn/cuda/conv_engine.h"
#include "nn/cuda/conv_fp8.h"
#include "nn/cuda/conv_search.h"
#include "nn/cuda/pointwise.h"

namespace ab::nn::cuda {
namespace {

// Scalars in the call's workspace: x's amax, then the convolution's descale, each on its own line.
constexpr std::int64_t kScalarSlot = kAllocAlignment;

// Beyond the rule every backend applies (nn::fp8_conv_refusal): what the cuDNN graph reads.
std::string cudnn_operand_refusal(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual,
                                  const Tensor& y) {
  if (y.shape.rank() != 4) return "y must be rank 4, got " + y.to_string();
  if (x.dtype != y.dtype || w.dtype != x.dtype)
    return "x, w and y must share one 16-bit type, got x " + std::string(to_string(x.dtype)) + ", w " +
           std::string(to_string(w.dtype)) + ", y " + std::string(to_string(y.dtype));
  // cuDNN's fp8 graph reads NHWC activations and KRSC filters.
  for (const Tensor* t : {&x, &w, &y})
    if (t->layout != Layout::nhwc || !t->is_contiguous())
      return "the fp8 convolution runs contiguous NHWC tensors only, got " + t->to_string();
  if (bias.numel() != y.shape[1] || !bias.is_contiguous() || (bias.dtype != y.dtype && bias.dtype != DType::f32))
    return "the bias must be a contiguous [" + std::to_string(y.shape[1]) + "] of y's type or f32, got " +
           bias.to_string();
  if (residual.shape.rank() != 0 &&
      (!(residual.shape == y.shape) || !(residual.strides == y.strides) || residual.dtype != y.dtype))
    return "the residual " + residual.to_string() + " must match y " + y.to_string();
  return {};
}

}  // namespace

Fp8Layer& ConvEngine::fp8_layer(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                const Tensor& residual, const Tensor& y, bool relu) {
  const bool has_residual = residual.shape.rank() != 0;
  Key key = conv_key(d, x, w, y);
  key.add(relu ? 1 : 0);
  key.add(has_residual ? 1 : 0);
  key.add(static_cast<std::int64_t>(bias.dtype));
  key.add(ctx_.modes.fp8_only_where_faster ? 1 : 0);
  if (const auto it = fp8_layers_.find(key); it != fp8_layers_.end()) {
    if (!it->second->plan) throw Unsupported(it->second->refusal);
    return *it->second;
  }
  const std::string label = "fp8 conv of x " + x.to_string() + ", w " + w.to_string();
  if (ctx_.capturing())
    throw Error(label + ": not prepared; call conv2d_fp8_prepare (bind the graph) before capturing");
  auto layer = std::make_unique<Fp8Layer>();
  Fp8ConvShape s;
  s.n = x.shape[0];
  s.c = x.shape[1];
  s.h = x.shape[2];
  s.w = x.shape[3];
  s.k = w.shape[0];
  s.r = w.shape[2];
  s.s = w.shape[3];
  s.conv = d;
  s.out = y.dtype;
  s.bias = true;
  s.residual = has_residual;
  s.relu = relu;
  try {
    if (std::string why = ab::nn::fp8_conv_refusal(d, x, w, y); !why.empty()) throw Unsupported(why);
    if (std::string why = cudnn_operand_refusal(x, w, bias, residual, y); !why.empty())
      throw Unsupported(label + ": " + why);
    try {
      layer->plan = std::make_unique<Fp8ConvPlan>(s, ctx_.stream);
    } catch (const Unsupported& e) {
      if (!has_residual) throw;
      // The convolution and descale alone, the epilogue in the bias_act kernel.
      s.bias = s.residual = s.relu = false;
      layer->plan = std::make_unique<Fp8ConvPlan>(s, ctx_.stream);
      layer->separate_epilogue = true;
      layer->note = std::string("epilogue in bias_act: cuDNN refused it in the graph: ") + e.what();
    }
    if (ctx_.modes.fp8_only_where_faster)
      if (std::string why = fp8_slower_than_16bit(*layer, d, x, w, bias, residual, y, relu); !why.empty())
        throw Unsupported(label + ": " + why);
  } catch (const Unsupported& e) {
    layer->plan.reset();
    layer->refusal = e.what();
    fp8_layers_.emplace(key, std::move(layer));
    throw;
  }
  return *fp8_layers_.emplace(key, std::move(layer)).first->second;
}

std::string ConvEngine::fp8_slower_than_16bit(Fp8Layer& layer, const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                              const Tensor& bias, const Tensor& residual, const Tensor& y, bool relu) {
  // The 16-bit side: what ConvBiasActivation runs on refusal, searched (and timed) by its prepare
  // (for a linear layer's [N, in, 1, 1] view, the 1x1 convolution standing in for its GEMM).
  const bool has_residual = residual.shape.rank() != 0;
  conv2d_bias_activation_prepare(d, x, w, bias, residual, y, relu);
  ConvPlan& p = prepared_conv_plan(d, x, w, y, ConvPasses{false, false});
  if (p.fwd.algo < 0) return {};  // no 16-bit forward to compare with: fp8 it is
  const ConvEpilogue& e = conv_epilogue(p, d, x, w, y, relu, has_residual);
  const double sixteen_s = e.fused && bias.dtype == y.dtype ? e.pass.time_s : e.unfused_s;

  // The fp8 side on scratch operands of the layer's sizes: x random in [-1, 1), w's e4m3 0.5 everywhere.
  const Fp8Layer& l = layer;  // read-only below; the timings are written at the end
  const std::int64_t k = y.shape[1];
  const std::int64_t xb = align_up(x.size_bytes()), qxb = align_up(x.numel()), qwb = align_up(w.numel());
  const std::int64_t yb = align_up(y.size_bytes()), bb = align_up(k * 4), wsb = align_up(l.plan->workspace_bytes());
  std::int64_t no_extra = 0;
  const std::string label = l.plan->shape().to_string() + ", fp8 against 16 bits";
  unsigned char* base = ctx_.search_operands(xb + qxb + qwb + 2 * yb + bb + 2 * kScalarSlot + wsb, no_extra, label);
  void* sx = base;
  auto* qx = base + xb;
  auto* qw = qx + qxb;
  void* sy = qw + qwb;
  void* sres = static_cast<unsigned char*>(sy) + yb;
  auto* sbias = reinterpret_cast<float*>(static_cast<unsigned char*>(sres) + yb);
  auto* amax = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(sbias) + bb);
  auto* descale = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(amax) + kScalarSlot);
  unsigned char* sws = reinterpret_cast<unsigned char*>(descale) + kScalarSlot;
  cuda_pointwise::fill_uniform(ctx_.stream, x.dtype, sx, x.numel(), 51, -1.0, 1.0);
  cuda_pointwise::fill_uniform(ctx_.stream, y.dtype, sres, y.numel(), 52, -1.0, 1.0);
  cuda_pointwise::fill_uniform(ctx_.stream, DType::f32, sbias, k, 53, -1.0, 1.0);
  AB_CUDA(cudaMemsetAsync(qw, 0x30, static_cast<std::size_t>(w.numel()), ctx_.stream), label);
  const Workspace ws{wsb > 0 ? sws : nullptr, wsb};
  const auto fp8_call = [&] {
    fp8_amax(ctx_.stream, x.dtype, sx, x.numel(), amax);
    fp8_quantize_e4m3(ctx_.stream, x.dtype, sx, x.numel(), amax, qx, descale);
    if (!l.separate_epilogue) {
      l.plan->execute(qx, qw, descale, sbias, sy, ws, has_residual ? sres : nullptr);
      return true;
    }
    l.plan->execute(qx, qw, descale, nullptr, sy, ws);
    cuda_pointwise::bias_activation_forward(ctx_.stream, y.dtype, y.layout, sy, sbias, false,
                                            has_residual ? sres : nullptr, sy, y.shape[0], k, y.shape[2] * y.shape[3],
                                            relu);
    return true;
  };
  fp8_call();  // warm
  GpuSampler sampler(ctx_.stream, label);
  const double fp8_s = time_candidate(sampler, fp8_call, std::numeric_limits<double>::infinity(), label);
  AB_CUDA(cudaStreamSynchronize(ctx_.stream), label);
  layer.fp8_s = fp8_s;
  layer.sixteen_s = sixteen_s;
  if (fp8_s < sixteen_s) return {};
  return std::string(nn::kFp8SlowerReason) + ": " + format_us(fp8_s) + " us (amax, quantize, convolution) against " +
         format_us(sixteen_s) + " us";
}

Fp8Weights& ConvEngine::fp8_weights(const Tensor& w, const Tensor& bias, const Fp8Layer& layer) {
  const auto it = fp8_weights_.try_emplace(w.data).first;
  Fp8Weights& fw = it->second;
  const std::int64_t k = w.shape[0];
  const bool sized = fw.weight_bytes == w.numel() && fw.bias_count == k;
  if (fw.fresh && sized && fw.bias_source == bias.data) return fw;
  if (!sized) {                                                 // new, or the address now holds another tensor
    const std::string label = layer.plan->shape().to_string();  // named only here: not per call
    if (ctx_.capturing()) {
      fp8_weights_.erase(it);
      throw Error(label + ": the weights were never quantized; run one forward before capturing");
    }
    fw.q = backend::cuda::DeviceBuffer(align_up(w.numel()), label + ", e4m3 weights");
    fw.scalars = backend::cuda::DeviceBuffer(2 * kScalarSlot + align_up(k * 4), label + ", weight scales and bias");
    fw.weight_bytes = w.numel();
    fw.bias_count = k;
  }
  float* amax = fw.scalars.as<float>();
  fp8_amax(ctx_.stream, w.dtype, w.data, w.numel(), amax);
  fp8_quantize_e4m3(ctx_.stream, w.dtype, w.data, w.numel(), amax, fw.q.as<std::uint8_t>(), fw.descale());
  cuda_pointwise::cast(ctx_.stream, bias.dtype, bias.data, DType::f32, fw.bias_f32(), k);
  // Quantized inside a capture, the graph quantizes again on every replay: correct, not fresh.
  fw.fresh = !ctx_.capturing();
  fw.bias_source = bias.data;
  return fw;
}

std::vector<std::string> ConvEngine::fp8_notes() const {
  std::vector<std::string> lines;
  for (const auto& [key, l] : fp8_layers_)
    lines.push_back(!l->plan ? "refused: " + l->refusal
                             : l->plan->shape().to_string() + ": " + l->plan->engine() +
                                   (l->separate_epilogue ? "; " + l->note : std::string()) +
                                   (l->sixteen_s > 0 ? "; whole call " + format_us(l->fp8_s) + " us, 16 bits " +
                                                           format_us(l->sixteen_s) + " us"
                                                     : std::string()));
  std::sort(lines.begin(), lines.end());
  return lines;
}

void ConvEngine::parameters_changed() {
  for (auto& [address, fw] : fp8_weights_) fw.fresh = false;
}

std::int64_t ConvEngine::conv2d_fp8_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                            const Tensor& residual, const Tensor& y, bool relu) {
  const Fp8Layer& l = fp8_layer(d, x, w, bias, residual, y, relu);
  // The plan's workspace, x's e4m3 image, then two scalars.
  return align_up(l.plan->workspace_bytes()) + align_up(x.numel()) + 2 * kScalarSlot;
}

void ConvEngine::conv2d_fp8_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                    const Tensor& residual, const Tensor& y, bool relu, Workspace ws) {
  const Fp8Layer& l = fp8_layer(d, x, w, bias, residual, y, relu);
  const std::int64_t plan_bytes = align_up(l.plan->workspace_bytes()), qx_bytes = align_up(x.numel());
  if (ws.bytes < plan_bytes + qx_bytes + 2 * kScalarSlot || ws.data == nullptr)
    throw Error(l.plan->shape().to_string() + ": needs a workspace of " +
                std::to_string(plan_bytes + qx_bytes + 2 * kScalarSlot) + " bytes, got " + std::to_string(ws.bytes) +
                " (size it from conv2d_fp8_prepare)");
  auto* base = static_cast<unsigned char*>(ws.data);
  auto* qx = base + plan_bytes;
  auto* amax_x = reinterpret_cast<float*>(qx + qx_bytes);
  auto* descale = reinterpret_cast<float*>(qx + qx_bytes + kScalarSlot);
  const Fp8Weights& fw = fp8_weights(w, bias, l);
  fp8_amax(ctx_.stream, x.dtype, x.data, x.numel(), amax_x);
  fp8_quantize_e4m3(ctx_.stream, x.dtype, x.data, x.numel(), amax_x, qx, descale, fw.descale());
  const Workspace plan_ws{plan_bytes > 0 ? ws.data : nullptr, plan_bytes};
  const bool has_residual = residual.defined();
  if (!l.separate_epilogue) {
    l.plan->execute(qx, fw.q.get(), descale, fw.bias_f32(), y.data, plan_ws, has_residual ? residual.data : nullptr);
    return;
  }
  l.plan->execute(qx, fw.q.get(), descale, nullptr, y.data, plan_ws);
  cuda_pointwise::bias_activation_forward(ctx_.stream, y.dtype, y.layout, y.data, bias.data, bias.dtype == y.dtype,
                                          has_residual ? residual.data : nullptr, y.data, y.shape[0], y.shape[1],
                                          y.shape[2] * y.shape[3], relu);
}

}  // namespace ab::nn::cuda
