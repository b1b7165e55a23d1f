// Convolution through cuDNN's convolution API: descriptors built from the tensors' strides (NCHW
// and NHWC alike), and per distinct configuration one timed algorithm search (cudnnFind*Ex on
// scratch operands) for forward, backward data and backward filter, cached so identical layers
// search once. The fastest algorithm whose workspace fits the cap wins (only deterministic ones in
// deterministic mode); its math type (FMA, TF32 or tensor ops) is fixed in that pass's descriptor.
#include <algorithm>
#include <limits>
#include <vector>

#include "nn/device/cuda_kernels_impl.h"

namespace ab::nn::cuda {
namespace {

constexpr std::int64_t kMaxWorkspaceBytes = std::int64_t{1} << 30;

std::string conv_label(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) {
  return "conv2d x " + x.to_string() + ", w " + w.to_string() + ", y " + y.to_string() + ", stride " +
         std::to_string(d.stride_h) + "x" + std::to_string(d.stride_w) + ", pad " + std::to_string(d.pad_h) + "x" +
         std::to_string(d.pad_w) + ", dilation " + std::to_string(d.dilation_h) + "x" + std::to_string(d.dilation_w) +
         ", groups " + std::to_string(d.groups);
}

int narrow(std::int64_t v, const std::string& what) {
  if (v < 0 || v > std::numeric_limits<int>::max())
    throw Unsupported(what + ": value " + std::to_string(v) + " out of range");
  return static_cast<int>(v);
}

// Picks the first (fastest: cuDNN sorts by time) usable result.
template <typename Perf>
const Perf* pick(const std::vector<Perf>& found, int returned, std::int64_t cap_bytes, bool deterministic) {
  for (int i = 0; i < returned; ++i) {
    const Perf& p = found[static_cast<std::size_t>(i)];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (static_cast<std::int64_t>(p.memory) > cap_bytes) continue;
    if (deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    return &p;
  }
  return nullptr;
}

}  // namespace

std::int64_t CudaKernels::conv_workspace_cap() const {
  // At most 1 GiB, and at most a quarter of what is free now (the graph's arena comes later).
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return std::min(kMaxWorkspaceBytes, static_cast<std::int64_t>(free_bytes) / 4);
}

Key CudaKernels::conv_key(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) const {
  Key k;
  k.add(x);
  k.add(w);
  k.add(y);
  for (std::int64_t v : {d.stride_h, d.stride_w, d.pad_h, d.pad_w, d.dilation_h, d.dilation_w, d.groups}) k.add(v);
  k.add(deterministic_ ? 1 : 0);
  k.add(tf32_ ? 1 : 0);
  return k;
}

std::unique_ptr<ConvPlan> CudaKernels::build_conv_plan(const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                                       const Tensor& y) {
  auto plan = std::make_unique<ConvPlan>();
  plan->label = conv_label(d, x, w, y);
  const std::string& label = plan->label;
  if (x.shape.rank() != 4 || w.shape.rank() != 4 || y.shape.rank() != 4)
    throw Error(label + ": operands must be rank 4");
  if (x.dtype != w.dtype || x.dtype != y.dtype)
    throw Unsupported(label + ": x, w and y must share one dtype");
  if (x.dtype != DType::f32 && x.dtype != DType::f16 && x.dtype != DType::bf16)
    throw Unsupported(label + ": the CUDA convolution runs f32, f16 or bf16, not " + std::string(to_string(x.dtype)));
  for (const Tensor* t : {&x, &w, &y})
    if (!t->is_contiguous()) throw Unsupported(label + ": operands must be contiguous NCHW or NHWC");

  plan->x = make_tensor_desc(x);
  plan->y = make_tensor_desc(y);
  // Filters carry no strides in cuDNN: their layout is named (KCRS or KRSC). Where both name the
  // same bytes (one input channel per group) the activations' layout decides, so cuDNN sees one.
  const bool w_nchw = w.strides == contiguous_strides(w.shape, Layout::nchw);
  const bool w_nhwc = w.strides == contiguous_strides(w.shape, Layout::nhwc);
  const bool x_nhwc = x.strides == contiguous_strides(x.shape, Layout::nhwc) &&
                      !(x.strides == contiguous_strides(x.shape, Layout::nchw));
  if (!w_nchw && !w_nhwc) throw Unsupported(label + ": filter strides are neither KCRS nor KRSC");
  const cudnnTensorFormat_t wformat = (w_nhwc && (!w_nchw || x_nhwc)) ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  cudnnFilterDescriptor_t wd = nullptr;
  AB_CUDNN(cudnnCreateFilterDescriptor(&wd), label);
  plan->w.reset(wd);
  AB_CUDNN(cudnnSetFilter4dDescriptor(wd, cudnn_dtype(w.dtype), wformat, narrow(w.shape[0], label),
                                      narrow(w.shape[1], label), narrow(w.shape[2], label), narrow(w.shape[3], label)),
           label);

  // f32 stays in FMA math unless TF32 is allowed; f16/bf16 use tensor cores, accumulating in f32.
  const cudnnMathType_t search_math =
      x.dtype == DType::f32 ? (tf32_ ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH) : CUDNN_TENSOR_OP_MATH;
  auto make_conv = [&](cudnnMathType_t math) {
    cudnnConvolutionDescriptor_t cd = nullptr;
    AB_CUDNN(cudnnCreateConvolutionDescriptor(&cd), label);
    ConvDescPtr owned(cd);
    AB_CUDNN(cudnnSetConvolution2dDescriptor(cd, narrow(d.pad_h, label), narrow(d.pad_w, label),
                                             narrow(d.stride_h, label), narrow(d.stride_w, label),
                                             narrow(d.dilation_h, label), narrow(d.dilation_w, label),
                                             CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
             label);
    AB_CUDNN(cudnnSetConvolutionGroupCount(cd, narrow(d.groups, label)), label);
    AB_CUDNN(cudnnSetConvolutionMathType(cd, math), label);
    return owned;
  };
  const ConvDescPtr search = make_conv(search_math);
  // The math a chosen algorithm runs with: its own, except that f32 without TF32 stays in FMA
  // math whatever cuDNN reports, so no TF32 kernel can slip in.
  auto run_math = [&](cudnnMathType_t reported) { return search_math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : reported; };
  int on = 0, oc = 0, oh = 0, ow = 0;
  AB_CUDNN(cudnnGetConvolution2dForwardOutputDim(search.get(), plan->x.get(), plan->w.get(), &on, &oc, &oh, &ow),
           label);
  if (on != y.shape[0] || oc != y.shape[1] || oh != y.shape[2] || ow != y.shape[3])
    throw Error(label + ": cuDNN computes an output of [" + std::to_string(on) + ", " + std::to_string(oc) + ", " +
                std::to_string(oh) + ", " + std::to_string(ow) + "]");

  // Scratch operands for the timed search: x, w, y and the largest workspace allowed. Their
  // contents do not matter (zeroed so no NaN patterns take slow paths).
  const std::int64_t xb = align_up(x.size_bytes()), wb = align_up(w.size_bytes()), yb = align_up(y.size_bytes());
  std::int64_t cap = conv_workspace_cap();
  for (;;) {
    const std::int64_t need = xb + wb + yb + cap;
    if (search_scratch_.bytes() >= need) break;
    try {
      search_scratch_ = backend::cuda::DeviceBuffer();
      search_scratch_ = backend::cuda::DeviceBuffer(need, label + ", algorithm search operands");
      break;
    } catch (const OutOfMemory&) {
      if (cap == 0) throw;
      cap /= 8;  // less workspace (fewer algorithms) before giving up
      if (cap < (std::int64_t{1} << 20)) cap = 0;
    }
  }
  auto* base = search_scratch_.as<unsigned char>();
  void* sx = base;
  void* sw = base + xb;
  void* sy = base + xb + wb;
  void* sws = cap > 0 ? base + xb + wb + yb : nullptr;
  AB_CUDA(cudaMemsetAsync(base, 0, static_cast<std::size_t>(xb + wb + yb), stream_), label);
  const auto ws_size = static_cast<std::size_t>(cap);
  const std::string limits = std::string(deterministic_ ? " deterministic" : "") + " algorithm within a workspace of " +
                             std::to_string(cap >> 20) + " MiB for " + label;

  {
    int count = 0, returned = 0;
    AB_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(cudnn_.get(), &count), label);
    std::vector<cudnnConvolutionFwdAlgoPerf_t> found(static_cast<std::size_t>(std::max(count, 1)));
    AB_CUDNN(cudnnFindConvolutionForwardAlgorithmEx(cudnn_.get(), plan->x.get(), sx, plan->w.get(), sw, search.get(),
                                                    plan->y.get(), sy, count, &returned, found.data(), sws, ws_size),
             label + ", forward algorithm search");
    if (const auto* p = pick(found, returned, cap, deterministic_)) {
      plan->fwd.conv = make_conv(run_math(p->mathType));
      plan->fwd.algo = static_cast<int>(p->algo);
      plan->fwd.workspace_bytes = static_cast<std::int64_t>(p->memory);
    } else {
      plan->fwd.refusal = "cuDNN has no forward" + limits;
    }
  }
  // A backward pass cuDNN cannot run is refused when it is called, not here: an inference graph or
  // a first layer never calls it.
  try {
    int count = 0, returned = 0;
    AB_CUDNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnn_.get(), &count), label);
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> found(static_cast<std::size_t>(std::max(count, 1)));
    AB_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx(cudnn_.get(), plan->w.get(), sw, plan->y.get(), sy,
                                                         search.get(), plan->x.get(), sx, count, &returned,
                                                         found.data(), sws, ws_size),
             label + ", backward-data algorithm search");
    if (const auto* p = pick(found, returned, cap, deterministic_)) {
      plan->bwd_data.conv = make_conv(run_math(p->mathType));
      plan->bwd_data.algo = static_cast<int>(p->algo);
      plan->bwd_data.workspace_bytes = static_cast<std::int64_t>(p->memory);
    } else {
      plan->bwd_data.refusal = "cuDNN has no backward-data" + limits;
    }
  } catch (const Unsupported& e) {
    plan->bwd_data.refusal = e.what();
  }
  try {
    int count = 0, returned = 0;
    AB_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnn_.get(), &count), label);
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> found(static_cast<std::size_t>(std::max(count, 1)));
    AB_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnn_.get(), plan->x.get(), sx, plan->y.get(), sy,
                                                           search.get(), plan->w.get(), sw, count, &returned,
                                                           found.data(), sws, ws_size),
             label + ", backward-filter algorithm search");
    if (const auto* p = pick(found, returned, cap, deterministic_)) {
      plan->bwd_filter.conv = make_conv(run_math(p->mathType));
      plan->bwd_filter.algo = static_cast<int>(p->algo);
      plan->bwd_filter.workspace_bytes = static_cast<std::int64_t>(p->memory);
    } else {
      plan->bwd_filter.refusal = "cuDNN has no backward-filter" + limits;
    }
  } catch (const Unsupported& e) {
    plan->bwd_filter.refusal = e.what();
  }
  return plan;
}

ConvPlan& CudaKernels::conv_plan(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) {
  const Key key = conv_key(d, x, w, y);
  if (auto it = conv_plans_.find(key); it != conv_plans_.end()) return *it->second;
  // Not prepared (a direct call, or the mode changed since binding): search now, unless this is
  // a capture, where the search's allocations and synchronisation cannot happen.
  if (capturing())
    throw Error(conv_label(d, x, w, y) + ": not prepared; call conv2d_prepare (bind the graph) before capturing");
  auto plan = build_conv_plan(d, x, w, y);
  ++stats_.conv_searches;
  return *conv_plans_.emplace(key, std::move(plan)).first->second;
}

std::int64_t CudaKernels::conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) {
  AB_CUDA(cudaSetDevice(device_), label_ + " conv2d_prepare");
  const bool cached = conv_plans_.count(conv_key(d, x, w, y)) != 0;
  if (cached) ++stats_.conv_cache_hits;
  const ConvPlan& p = conv_plan(d, x, w, y);
  if (p.fwd.algo < 0) throw Unsupported(p.fwd.refusal);
  std::int64_t bytes = 0;
  for (const ConvPass* pass : {&p.fwd, &p.bwd_data, &p.bwd_filter})
    if (pass->algo >= 0) bytes = std::max(bytes, pass->workspace_bytes);
  return bytes;
}

namespace {

const ConvPass& usable(const ConvPass& pass, const ConvPlan& plan, const Workspace& ws, const char* what) {
  if (pass.algo < 0) throw Unsupported(pass.refusal);
  if (pass.workspace_bytes > ws.bytes)
    throw Error(plan.label + ": the " + what + " algorithm needs a workspace of " +
                std::to_string(pass.workspace_bytes) + " bytes, got " + std::to_string(ws.bytes) +
                " (size it from conv2d_prepare)");
  return pass;
}

}  // namespace

void CudaKernels::conv2d_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y, Workspace ws) {
  const ConvPlan& p = conv_plan(d, x, w, y);
  const ConvPass& pass = usable(p.fwd, p, ws, "forward");
  const float one = 1.0f, zero = 0.0f;
  AB_CUDNN(cudnnConvolutionForward(cudnn_.get(), &one, p.x.get(), x.data, p.w.get(), w.data, pass.conv.get(),
                                   static_cast<cudnnConvolutionFwdAlgo_t>(pass.algo), ws.data,
                                   static_cast<std::size_t>(pass.workspace_bytes), &zero, p.y.get(), y.data),
           p.label);
}

void CudaKernels::conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx,
                                       bool accumulate, Workspace ws) {
  const ConvPlan& p = conv_plan(d, dx, w, dy);
  const ConvPass& pass = usable(p.bwd_data, p, ws, "backward-data");
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  AB_CUDNN(cudnnConvolutionBackwardData(cudnn_.get(), &one, p.w.get(), w.data, p.y.get(), dy.data, pass.conv.get(),
                                        static_cast<cudnnConvolutionBwdDataAlgo_t>(pass.algo), ws.data,
                                        static_cast<std::size_t>(pass.workspace_bytes), &beta, p.x.get(), dx.data),
           p.label + ", backward data");
}

void CudaKernels::conv2d_backward_filter(const Conv2dDesc& d, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                         Workspace ws) {
  const ConvPlan& p = conv_plan(d, x, dw, dy);
  const ConvPass& pass = usable(p.bwd_filter, p, ws, "backward-filter");
  const float one = 1.0f, zero = 0.0f;
  AB_CUDNN(cudnnConvolutionBackwardFilter(cudnn_.get(), &one, p.x.get(), x.data, p.y.get(), dy.data, pass.conv.get(),
                                          static_cast<cudnnConvolutionBwdFilterAlgo_t>(pass.algo), ws.data,
                                          static_cast<std::size_t>(pass.workspace_bytes), &zero, p.w.get(), dw.data),
           p.label + ", backward filter");
}

}  // namespace ab::nn::cuda
