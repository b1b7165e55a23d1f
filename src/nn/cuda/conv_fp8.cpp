// The fp8 (e4m3) convolution of conv_fp8.h on cuDNN's backend (graph) API (cudnn_graph.h: raw
// descriptors, no cudnn_frontend); a failure names the call, the descriptor and attribute it was
// for, the shape, cuDNN's status and its own last message. Tensors are described in cuDNN's
// logical NCHW order with NHWC strides (KRSC for the filter).
#include "nn/cuda/conv_fp8.h"

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "nn/cuda/common.h"
#include "nn/cuda/cudnn_graph.h"
#include "nn/cuda/gpu_sampler.h"

namespace ab::nn::cuda {
namespace {

using cudnn_graph::Candidate;
using cudnn_graph::Desc;

// Tensor ids in the variant pack; the virtual intermediates only name graph edges.
enum : std::int64_t { kIdX = 1, kIdW, kIdDescale, kIdBias, kIdY, kIdResidual, kIdConv = 101, kIdScaled, kIdBiased,
                      kIdSummed };
// Every buffer the plan reads or writes is 16-byte aligned (cudaMalloc gives 256), the descale 4.
constexpr std::int64_t kAlignment = 16, kScalarAlignment = 4;

Desc make_tensor(const char* name, std::int64_t id, cudnnDataType_t type, const std::vector<std::int64_t>& dims,
                 const std::vector<std::int64_t>& strides, bool is_virtual, std::int64_t alignment,
                 const std::string& label) {
  return cudnn_graph::make_tensor({name, id, type, dims, strides, is_virtual, alignment}, label);
}

// NHWC strides of logical [N, C, H, W] (a filter [K, C, R, S] gets KRSC the same way).
std::vector<std::int64_t> nhwc_strides(std::int64_t c, std::int64_t h, std::int64_t w) {
  return {h * w * c, 1, w * c, c};
}

std::int64_t extent(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t pad, std::int64_t dilation) {
  if (stride < 1) return 0;
  return (in + 2 * pad - dilation * (k - 1) - 1) / stride + 1;
}

}  // namespace

std::int64_t Fp8ConvShape::p() const { return extent(h, r, conv.stride_h, conv.pad_h, conv.dilation_h); }
std::int64_t Fp8ConvShape::q() const { return extent(w, s, conv.stride_w, conv.pad_w, conv.dilation_w); }

std::string Fp8ConvShape::to_string() const {
  const auto i = [](std::int64_t v) { return std::to_string(v); };
  return "fp8 conv x e4m3[N " + i(n) + ", H " + i(h) + ", W " + i(w) + ", C " + i(c) + "] nhwc, w e4m3[K " + i(k) +
         ", R " + i(r) + ", S " + i(s) + ", C " + i(c) + "], stride " + i(conv.stride_h) + "x" + i(conv.stride_w) +
         ", pad " + i(conv.pad_h) + "x" + i(conv.pad_w) + ", dilation " + i(conv.dilation_h) + "x" +
         i(conv.dilation_w) + ", groups " + i(conv.groups) + (bias ? ", + bias f32[K]" : "") +
         (residual ? ", + residual" : "") + (relu ? ", + ReLU" : "") + " -> y " + std::string(ab::to_string(out)) + "[N " + i(n) + ", P " + i(p()) +
         ", Q " + i(q()) + ", K " + i(k) + "] nhwc";
}

std::string fp8_conv_refusal(const Fp8ConvShape& s) {
  const std::string label = s.to_string() + ": ";
  if (s.c % kFp8ConvChannelMultiple != 0 || s.k % kFp8ConvChannelMultiple != 0)
    return label + "cuDNN's fp8 (e4m3) convolutions need C and K multiples of " +
           std::to_string(kFp8ConvChannelMultiple) + " (16-byte e4m3 channel vectors); C = " + std::to_string(s.c) +
           ", K = " + std::to_string(s.k) + " (the caller runs this layer in f16)";
  if (s.conv.groups != 1)
    return label + "the fp8 convolution runs groups = 1 only, got " + std::to_string(s.conv.groups);
  if (s.out != DType::f16 && s.out != DType::bf16)
    return label + "the fp8 convolution writes f16 or bf16, not " + std::string(ab::to_string(s.out));
  if (s.n < 1 || s.h < 1 || s.w < 1 || s.c < 1 || s.k < 1 || s.r < 1 || s.s < 1)
    return label + "every extent must be at least 1";
  if (s.conv.stride_h < 1 || s.conv.stride_w < 1 || s.conv.dilation_h < 1 || s.conv.dilation_w < 1 ||
      s.conv.pad_h < 0 || s.conv.pad_w < 0)
    return label + "strides and dilations must be at least 1, padding at least 0";
  if (s.p() < 1 || s.q() < 1) return label + "the output is empty";
  return {};
}

struct Fp8ConvPlan::Impl {
  Fp8ConvShape shape;
  std::string label;
  CudnnHandlePtr handle;
  std::deque<Desc> keep;  // tensors, convolution, pointwise and operations (a deque: references stay valid)
  std::unique_ptr<Desc> graph, plan;  // the operation graph and the chosen execution plan
  std::vector<std::unique_ptr<Desc>> configs;  // heuristics results (the chosen one among them)
  std::int64_t workspace_bytes = 0;
  std::string engine, plan_json;

  void build(void* stream);
  // Each candidate's GPU time per call on scratch operands of the shape (infinity where it fails).
  std::vector<double> time_candidates(const std::vector<Candidate>& candidates, cudaStream_t stream) const;
  cudnnStatus_t run(const Desc& chosen, const std::vector<std::int64_t>& ids, const std::vector<void*>& ptrs,
                    void* workspace) const {
    return cudnn_graph::execute(handle.get(), chosen, ids, ptrs, workspace, label);
  }
};

std::vector<double> Fp8ConvPlan::Impl::time_candidates(const std::vector<Candidate>& candidates,
                                                       cudaStream_t stream) const {
  const Fp8ConvShape& s = shape;
  std::int64_t ws_bytes = 0;
  for (const Candidate& c : candidates) ws_bytes = std::max(ws_bytes, c.workspace_bytes);
  const std::int64_t x_bytes = s.n * s.h * s.w * s.c, w_bytes = s.k * s.r * s.s * s.c;
  const std::int64_t y_bytes = s.n * s.p() * s.q() * s.k * 2, bias_bytes = s.k * 4;
  // One scratch block: x, w, y, residual, bias, descale, workspace (each 256-byte aligned).
  const auto up = [](std::int64_t b) { return (b + 255) / 256 * 256; };
  const std::int64_t total = up(x_bytes) + up(w_bytes) + 2 * up(y_bytes) + up(bias_bytes) + 256 + up(ws_bytes);
  void* block = nullptr;
  if (cudaMalloc(&block, static_cast<std::size_t>(total)) != cudaSuccess) {
    cudaGetLastError();
    return std::vector<double>(candidates.size(), 0.0);  // no room to time: keep heuristics' order
  }
  const std::unique_ptr<void, cudaError_t (*)(void*)> owner(block, cudaFree);
  auto* b = static_cast<unsigned char*>(block);
  unsigned char* x = b;
  unsigned char* w = x + up(x_bytes);
  unsigned char* y = w + up(w_bytes);
  unsigned char* res = y + up(y_bytes);
  unsigned char* bias = res + up(y_bytes);
  unsigned char* descale = bias + up(bias_bytes);
  unsigned char* ws = descale + 256;
  // e4m3 0x30 = 0.5 everywhere, descale 1, bias and residual 0: finite, and every engine sees the
  // same work whatever the values.
  AB_CUDA(cudaMemsetAsync(x, 0x30, static_cast<std::size_t>(x_bytes), stream), label);
  AB_CUDA(cudaMemsetAsync(w, 0x30, static_cast<std::size_t>(w_bytes), stream), label);
  AB_CUDA(cudaMemsetAsync(res, 0, static_cast<std::size_t>(up(y_bytes) + bias_bytes), stream), label);  // and bias
  const float one = 1.0f;
  AB_CUDA(cudaMemcpyAsync(descale, &one, sizeof one, cudaMemcpyHostToDevice, stream), label);
  std::vector<std::int64_t> ids{kIdX, kIdW, kIdDescale, kIdY};
  std::vector<void*> ptrs{x, w, descale, y};
  if (s.bias) {
    ids.push_back(kIdBias);
    ptrs.push_back(bias);
  }
  if (s.residual) {
    ids.push_back(kIdResidual);
    ptrs.push_back(res);
  }
  // The f16 search's sampler: host time queueing each call (the variant pack) stays out of the
  // GPU time, and a candidate much slower than the best so far is dropped after one sample.
  GpuSampler sampler(stream, label + ", timing fp8 plans");
  std::vector<double> seconds;
  double best_s = std::numeric_limits<double>::infinity();
  for (const Candidate& c : candidates) {
    const auto launch = [&] { return run(*c.plan, ids, ptrs, ws) == CUDNN_STATUS_SUCCESS; };
    double t = std::numeric_limits<double>::infinity();
    if (launch()) t = time_candidate(sampler, launch, best_s, label + ", " + c.name);  // warmed by the call before
    cudaGetLastError();  // a refused launch leaves no work, only its status
    best_s = std::min(best_s, t);
    seconds.push_back(t);
  }
  AB_CUDA(cudaStreamSynchronize(stream), label);
  return seconds;
}

void Fp8ConvPlan::Impl::build(void* stream) {
  const Fp8ConvShape& s = shape;
  cudnnHandle_t h = nullptr;
  AB_CUDNN(cudnnCreate(&h), label);
  handle.reset(h);
  AB_CUDNN(cudnnSetStream(h, static_cast<cudaStream_t>(stream)), label);

  const cudnnDataType_t fp8 = CUDNN_DATA_FP8_E4M3, f32 = CUDNN_DATA_FLOAT,
                        out = s.out == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  const std::int64_t P = s.p(), Q = s.q();
  const std::vector<std::int64_t> y_dims{s.n, s.k, P, Q}, y_strides = nhwc_strides(s.k, P, Q);
  const std::vector<std::int64_t> one{1, 1, 1, 1};
  const Desc& x = keep.emplace_back(
      make_tensor("x", kIdX, fp8, {s.n, s.c, s.h, s.w}, nhwc_strides(s.c, s.h, s.w), false, kAlignment, label));
  const Desc& w = keep.emplace_back(
      make_tensor("w", kIdW, fp8, {s.k, s.c, s.r, s.s}, nhwc_strides(s.c, s.r, s.s), false, kAlignment, label));
  const Desc& descale =
      keep.emplace_back(make_tensor("descale", kIdDescale, f32, one, one, false, kScalarAlignment, label));
  const Desc& conv_out =
      keep.emplace_back(make_tensor("conv output (virtual)", kIdConv, f32, y_dims, y_strides, true, kAlignment, label));

  // The convolution: cross-correlation in f32, alpha 1, beta 0.
  Desc& conv = keep.emplace_back(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "convolution", label);
  const std::int64_t spatial = 2;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t dilation[2] = {s.conv.dilation_h, s.conv.dilation_w},
                     stride[2] = {s.conv.stride_h, s.conv.stride_w}, pad[2] = {s.conv.pad_h, s.conv.pad_w};
  AB_SET(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  AB_SET(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  AB_SET(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
  AB_SET(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation);
  AB_SET(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
  AB_SET(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  AB_SET(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  conv.finalize();

  std::vector<cudnnBackendDescriptor_t> ops;
  Desc& conv_op = keep.emplace_back(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                    "convolution forward operation", label);
  const float alpha = 1.0f, beta = 0.0f;
  cudnnBackendDescriptor_t xd = x.get(), wd = w.get(), cd = conv.get(), yd = conv_out.get();
  AB_SET(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &xd);
  AB_SET(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &wd);
  AB_SET(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yd);
  AB_SET(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd);
  AB_SET(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
  AB_SET(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  conv_op.finalize();
  ops.push_back(conv_op.get());

  // Pointwise y_op = mode(in, b) (b null: unary) in f32 math, appended to the graph.
  const auto pointwise = [&](const char* name, cudnnPointwiseMode_t pw_mode, const Desc& in, const Desc* b,
                             const Desc& result) {
    Desc& pw = keep.emplace_back(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, std::string(name) + " pointwise", label);
    AB_SET(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &pw_mode);
    AB_SET(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    pw.finalize();
    Desc& op = keep.emplace_back(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, std::string(name) + " operation", label);
    cudnnBackendDescriptor_t pd = pw.get(), id = in.get(), od = result.get();
    AB_SET(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pd);
    AB_SET(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &id);
    if (b != nullptr) {
      cudnnBackendDescriptor_t bd = b->get();
      AB_SET(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bd);
    }
    AB_SET(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &od);
    op.finalize();
    ops.push_back(op.get());
  };
  // Each stage writes y where it is the last, else a virtual f32 tensor.
  const auto stage_out = [&](const char* name, std::int64_t id, bool is_last) -> const Desc& {
    return keep.emplace_back(is_last ? make_tensor("y", kIdY, out, y_dims, y_strides, false, kAlignment, label)
                                  : make_tensor(name, id, f32, y_dims, y_strides, true, kAlignment, label));
  };
  const Desc& scaled = stage_out("descaled (virtual)", kIdScaled, !s.bias && !s.residual && !s.relu);
  pointwise("descale MUL", CUDNN_POINTWISE_MUL, conv_out, &descale, scaled);
  const Desc* last = &scaled;
  if (s.bias) {
    const Desc& bias = keep.emplace_back(make_tensor("bias", kIdBias, f32, {1, s.k, 1, 1}, {s.k, 1, s.k, s.k}, false,
                                                     kAlignment, label));
    const Desc& biased = stage_out("biased (virtual)", kIdBiased, !s.residual && !s.relu);
    pointwise("bias ADD", CUDNN_POINTWISE_ADD, *last, &bias, biased);
    last = &biased;
  }
  if (s.residual) {
    const Desc& residual =
        keep.emplace_back(make_tensor("residual", kIdResidual, out, y_dims, y_strides, false, kAlignment, label));
    const Desc& summed = stage_out("summed (virtual)", kIdSummed, !s.relu);
    pointwise("residual ADD", CUDNN_POINTWISE_ADD, *last, &residual, summed);
    last = &summed;
  }
  if (s.relu) {
    const Desc& y = stage_out("y", kIdY, true);
    pointwise("RELU_FWD", CUDNN_POINTWISE_RELU_FWD, *last, nullptr, y);
  }

  graph = cudnn_graph::make_graph(h, ops, label);

  // Every plan heuristics mode A ranks that finalizes (FALLBACK's where A has none), each timed on
  // scratch operands; the fastest is kept (with heuristics' first plan, fp8 inference ran at half
  // fp16's rate on an H200: bench/HISTORY.md).
  std::string refusals;
  std::vector<Candidate> candidates;
  cudnn_graph::try_heuristics(h, *graph, CUDNN_HEUR_MODE_A, label, refusals, candidates, configs);
  if (candidates.empty())
    cudnn_graph::try_heuristics(h, *graph, CUDNN_HEUR_MODE_FALLBACK, label, refusals, candidates, configs);
  if (candidates.empty())
    throw Unsupported(label + ": no cuDNN engine accepts the graph (cuDNN " + std::to_string(cudnnGetVersion()) +
                      ")" + refusals);
  const std::vector<double> seconds = time_candidates(candidates, static_cast<cudaStream_t>(stream));
  std::size_t best = 0;
  std::string timed;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    timed += (i ? ", " : "") + candidates[i].name + " " +
             (std::isfinite(seconds[i]) ? format_us(seconds[i]) + " us" : std::string("failed"));
    if (seconds[i] < seconds[best]) best = i;
  }
  if (!std::isfinite(seconds[best]))
    throw Unsupported(label + ": every cuDNN plan that finalized failed to run: " + timed);
  Candidate& c = candidates[best];
  plan = std::move(c.plan);
  workspace_bytes = c.workspace_bytes;
  plan_json = std::move(c.json);
  engine = c.name + ", workspace " + std::to_string(workspace_bytes) + " B; timed: " + timed +
           (refusals.empty() ? std::string() : "; refused" + refusals);
  if (env_flag("AB_CONV_CHOICES")) std::fprintf(stderr, "%s: %s\n", label.c_str(), engine.c_str());
}

Fp8ConvPlan::Fp8ConvPlan(const Fp8ConvShape& shape, void* stream) : impl_(std::make_unique<Impl>()) {
  if (std::string why = fp8_conv_refusal(shape); !why.empty()) throw Unsupported(why);
  impl_->shape = shape;
  impl_->label = shape.to_string();
  impl_->build(stream);
}

Fp8ConvPlan::~Fp8ConvPlan() = default;
Fp8ConvPlan::Fp8ConvPlan(Fp8ConvPlan&&) noexcept = default;
Fp8ConvPlan& Fp8ConvPlan::operator=(Fp8ConvPlan&&) noexcept = default;

const Fp8ConvShape& Fp8ConvPlan::shape() const { return impl_->shape; }
std::int64_t Fp8ConvPlan::workspace_bytes() const { return impl_->workspace_bytes; }
const std::string& Fp8ConvPlan::engine() const { return impl_->engine; }
const std::string& Fp8ConvPlan::plan_json() const { return impl_->plan_json; }

void Fp8ConvPlan::execute(const void* x, const void* w, const float* descale, const float* bias, void* y,
                          Workspace ws, const void* residual) const {
  const Impl& p = *impl_;
  if (x == nullptr || w == nullptr || descale == nullptr || y == nullptr)
    throw Error(p.label + ": execute needs x, w, descale and y");
  if ((bias != nullptr) != p.shape.bias)
    throw Error(p.label + (p.shape.bias ? ": the plan adds a bias; pass one" : ": the plan has no bias; pass null"));
  if ((residual != nullptr) != p.shape.residual)
    throw Error(p.label + (p.shape.residual ? ": the plan adds a residual; pass one" : ": the plan has no residual; pass null"));
  if (ws.bytes < p.workspace_bytes || (p.workspace_bytes > 0 && ws.data == nullptr))
    throw Error(p.label + ": the plan needs a workspace of " + std::to_string(p.workspace_bytes) + " bytes, got " +
                std::to_string(ws.bytes));
  std::vector<std::int64_t> ids{kIdX, kIdW, kIdDescale, kIdY};
  std::vector<void*> ptrs{const_cast<void*>(x), const_cast<void*>(w), const_cast<float*>(descale), y};
  if (bias != nullptr) {
    ids.push_back(kIdBias);
    ptrs.push_back(const_cast<float*>(bias));
  }
  if (residual != nullptr) {
    ids.push_back(kIdResidual);
    ptrs.push_back(const_cast<void*>(residual));
  }
  if (const cudnnStatus_t st = p.run(*p.plan, ids, ptrs, ws.data); st != CUDNN_STATUS_SUCCESS)
    throw_cudnn(st, "cudnnBackendExecute", p.label + " with " + p.engine);
}

}  // namespace ab::nn::cuda
