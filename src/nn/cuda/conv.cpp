// Convolution through cuDNN's convolution API: descriptors built from the tensors' strides (NCHW
// and NHWC alike), and per distinct configuration one algorithm choice for forward and for each
// backward pass a layer runs (backward data, backward filter), cached so identical layers choose
// once; a pass no layer asked for is never searched (an inference graph searches forward only:
// the backward searches had cost seconds per graph at binding). cudnnFind*Ex lists the usable
// algorithms (workspace within the cap; only deterministic ones in deterministic mode), but it
// times each once, with host overhead, on zero operands: at batch 1 its order picked kernels
// several times slower than the best. So every candidate Find ranks within reach of its fastest is
// run again on the exact descriptor, algorithm and workspace size a step will use, on random
// operands, queued behind a GPU spin so events time the GPU's work alone, and the median of
// several samples wins. The runs also warm each kernel (module loading, runtime compilation)
// before any step. The chosen algorithm's math type (FMA, TF32 or tensor ops) is fixed in that
// pass's descriptor.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "nn/cuda/conv_engine.h"
#include "nn/cuda/conv_search.h"
#include "nn/cuda/pointwise.h"
#include "nn/cuda/spatial.h"

namespace ab::nn::cuda {
namespace {

constexpr std::int64_t kMaxWorkspaceBytes = std::int64_t{1} << 30;

std::string conv_label(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) {
  return "conv2d x " + x.to_string() + ", w " + w.to_string() + ", y " + y.to_string() + ", stride " +
         std::to_string(d.stride_h) + "x" + std::to_string(d.stride_w) + ", pad " + std::to_string(d.pad_h) + "x" +
         std::to_string(d.pad_w) + ", dilation " + std::to_string(d.dilation_h) + "x" + std::to_string(d.dilation_w) +
         ", groups " + std::to_string(d.groups);
}

// A usable algorithm from cudnnFind*Ex, in Find's order (fastest first by its single timing).
struct Candidate {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  std::int64_t workspace_bytes = 0;
  double find_ms = 0;
};

// Candidates Find timed beyond this many times its fastest (and beyond kFarMs) are not re-timed:
// at large shapes Find's order is sound and slow algorithms (FFT at a big batch) would only cost
// search time. At small shapes every usable algorithm is re-timed.
constexpr double kFarFactor = 8.0, kFarMs = 1.0;

template <typename Perf>
std::vector<Candidate> usable(const std::vector<Perf>& found, int returned, std::int64_t cap_bytes,
                              bool deterministic) {
  std::vector<Candidate> out;
  for (int i = 0; i < returned; ++i) {
    const Perf& p = found[static_cast<std::size_t>(i)];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (static_cast<std::int64_t>(p.memory) > cap_bytes) continue;
    if (deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    const double ms = std::isfinite(p.time) && p.time >= 0 ? p.time : 0.0;
    if (!out.empty() && ms > kFarFactor * out.front().find_ms && ms > kFarMs) continue;
    out.push_back({static_cast<int>(p.algo), p.mathType, static_cast<std::int64_t>(p.memory), ms});
  }
  return out;
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "default";
    case CUDNN_TENSOR_OP_MATH: return "tensor-op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor-op-conv";
    case CUDNN_FMA_MATH: return "fma";
    default: return "?";
  }
}

}  // namespace

int narrow(std::int64_t v, const std::string& what) {
  if (v < 0 || v > std::numeric_limits<int>::max())
    throw Unsupported(what + ": value " + std::to_string(v) + " out of range");
  return static_cast<int>(v);
}

// f32 stays in FMA math unless TF32 is allowed; f16/bf16 use tensor cores, accumulating in f32.
cudnnMathType_t search_math(DType t, bool tf32) {
  return t == DType::f32 ? (tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH) : CUDNN_TENSOR_OP_MATH;
}

ConvDescPtr make_conv_desc(const Conv2dDesc& d, cudnnMathType_t math, const std::string& label) {
  cudnnConvolutionDescriptor_t cd = nullptr;
  AB_CUDNN(cudnnCreateConvolutionDescriptor(&cd), label);
  ConvDescPtr owned(cd);
  AB_CUDNN(cudnnSetConvolution2dDescriptor(
               cd, narrow(d.pad_h, label), narrow(d.pad_w, label), narrow(d.stride_h, label), narrow(d.stride_w, label),
               narrow(d.dilation_h, label), narrow(d.dilation_w, label), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
           label);
  AB_CUDNN(cudnnSetConvolutionGroupCount(cd, narrow(d.groups, label)), label);
  AB_CUDNN(cudnnSetConvolutionMathType(cd, math), label);
  return owned;
}

const ConvPass& usable_pass(const ConvPass& pass, const ConvPlan& plan, const Workspace& ws, const char* what) {
  if (!pass.searched)
    throw Error(plan.label + ": the " + what + " pass was not prepared; conv2d_prepare was asked only for the " +
                "passes the layer runs (no backward in an inference graph, no backward-data where the input " +
                "needs no gradient)");
  if (pass.algo < 0) throw Unsupported(pass.refusal);
  if (pass.workspace_bytes > ws.bytes)
    throw Error(plan.label + ": the " + what + " algorithm needs a workspace of " +
                std::to_string(pass.workspace_bytes) + " bytes, got " + std::to_string(ws.bytes) +
                " (size it from conv2d_prepare)");
  return pass;
}

ConvEngine::ConvEngine(EngineContext& ctx) : ctx_(ctx) {
  ctx_.add_write_hook([this](const void* data) { fp8_weights_written(data); });
}

std::int64_t ConvEngine::conv_workspace_cap() const {
  // At most 1 GiB, and at most a quarter of what is free now (the graph's arena comes later).
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return std::min(kMaxWorkspaceBytes, static_cast<std::int64_t>(free_bytes) / 4);
}

Key ConvEngine::conv_key(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) const {
  Key k;
  k.add(x);
  k.add(w);
  k.add(y);
  for (std::int64_t v : {d.stride_h, d.stride_w, d.pad_h, d.pad_w, d.dilation_h, d.dilation_w, d.groups}) k.add(v);
  k.add(ctx_.modes.deterministic ? 1 : 0);
  k.add(ctx_.modes.tf32 ? 1 : 0);
  return k;
}

std::unique_ptr<ConvPlan> ConvEngine::build_conv_plan(const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                                      const Tensor& y) {
  auto plan = std::make_unique<ConvPlan>();
  plan->label = conv_label(d, x, w, y);
  const std::string& label = plan->label;
  if (x.shape.rank() != 4 || w.shape.rank() != 4 || y.shape.rank() != 4)
    throw Error(label + ": operands must be rank 4");
  if (x.dtype != w.dtype || x.dtype != y.dtype) throw Unsupported(label + ": x, w and y must share one dtype");
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

  const ConvDescPtr search = make_conv_desc(d, search_math(x.dtype, ctx_.modes.tf32), label);
  int on = 0, oc = 0, oh = 0, ow = 0;
  AB_CUDNN(cudnnGetConvolution2dForwardOutputDim(search.get(), plan->x.get(), plan->w.get(), &on, &oc, &oh, &ow),
           label);
  if (on != y.shape[0] || oc != y.shape[1] || oh != y.shape[2] || ow != y.shape[3])
    throw Error(label + ": cuDNN computes an output of [" + std::to_string(on) + ", " + std::to_string(oc) + ", " +
                std::to_string(oh) + ", " + std::to_string(ow) + "]");
  return plan;
}

void ConvEngine::search_conv_passes(ConvPlan& plan, const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                    const Tensor& y, ConvPasses passes) {
  const bool want_fwd = !plan.fwd.searched, want_data = passes.backward_data && !plan.bwd_data.searched,
             want_filter = passes.backward_filter && !plan.bwd_filter.searched;
  if (!want_fwd && !want_data && !want_filter) return;
  const std::string& label = plan.label;
  const cudnnMathType_t math = search_math(x.dtype, ctx_.modes.tf32);
  const ConvDescPtr search = make_conv_desc(d, math, label);
  // The math a chosen algorithm runs with: its own, except that f32 without TF32 stays in FMA
  // math whatever cuDNN reports, so no TF32 kernel can slip in.
  auto run_math = [&](cudnnMathType_t reported) { return math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : reported; };

  // Scratch operands for the search: x, w, y and the largest workspace allowed, filled with
  // random values in [-1, 1) before each pass is timed.
  const std::int64_t xb = align_up(x.size_bytes()), wb = align_up(w.size_bytes()), yb = align_up(y.size_bytes());
  std::int64_t cap = conv_workspace_cap();
  unsigned char* base = ctx_.search_operands(xb + wb + yb, cap, label);
  void* sx = base;
  void* sw = base + xb;
  void* sy = base + xb + wb;
  void* sws = cap > 0 ? base + xb + wb + yb : nullptr;
  auto randomise = [&](std::uint64_t seed) {
    cuda_pointwise::fill_uniform(ctx_.stream, x.dtype, sx, x.numel(), seed, -1.0, 1.0);
    cuda_pointwise::fill_uniform(ctx_.stream, w.dtype, sw, w.numel(), seed + 1, -1.0, 1.0);
    cuda_pointwise::fill_uniform(ctx_.stream, y.dtype, sy, y.numel(), seed + 2, -1.0, 1.0);
  };
  randomise(1);
  const auto ws_size = static_cast<std::size_t>(cap);
  const std::string limits = std::string(ctx_.modes.deterministic ? " deterministic" : "") +
                             " algorithm within a workspace of " + std::to_string(cap >> 20) + " MiB for " + label;
  GpuSampler sampler(ctx_.stream, label + ", algorithm timing");

  // Runs each candidate once (a failure drops it; the run also loads or compiles its kernel), then
  // times it; the fastest median wins. `launch` queues one call and returns cuDNN's status.
  auto choose = [&](const std::vector<Candidate>& candidates, const char* pass, std::uint64_t seed,
                    const std::function<cudnnStatus_t(const Candidate&, cudnnConvolutionDescriptor_t)>& launch,
                    ConvPass& out) {
    const std::string what = label + ", " + pass + " algorithm timing";
    randomise(seed);
    double best_s = std::numeric_limits<double>::infinity();
    std::string log;
    for (const Candidate& c : candidates) {
      ConvDescPtr conv = make_conv_desc(d, run_math(c.math), label);
      log += " " + std::to_string(c.algo) + "/" + math_name(run_math(c.math)) + ":";
      const cudnnStatus_t warm = launch(c, conv.get());
      if (warm != CUDNN_STATUS_SUCCESS) {
        cudaGetLastError();  // a refused launch leaves no work, only its status
        log += std::string("refused (") + cudnnGetErrorString(warm) + ")";
        continue;
      }
      const double median_s = time_candidate(
          sampler, [&] { return launch(c, conv.get()) == CUDNN_STATUS_SUCCESS; }, best_s, what);
      log += format_us(median_s) + "us(find " + format_us(c.find_ms * 1e-3) + ")";
      if (median_s < best_s) {
        best_s = median_s;
        out.conv = std::move(conv);
        out.algo = c.algo;
        out.workspace_bytes = c.workspace_bytes;
        out.time_s = median_s;
      }
    }
    if (out.algo >= 0)
      out.choice = std::string(pass) + " algo " + std::to_string(out.algo) + " " + format_us(out.time_s) +
                   " us, workspace " + std::to_string(out.workspace_bytes) + " B; timed" + log;
  };

  const float one = 1.0f, zero = 0.0f;
  if (want_fwd) {
    int count = 0, returned = 0;
    AB_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(ctx_.cudnn.get(), &count), label);
    std::vector<cudnnConvolutionFwdAlgoPerf_t> found(static_cast<std::size_t>(std::max(count, 1)));
    AB_CUDNN(cudnnFindConvolutionForwardAlgorithmEx(ctx_.cudnn.get(), plan.x.get(), sx, plan.w.get(), sw, search.get(),
                                                    plan.y.get(), sy, count, &returned, found.data(), sws, ws_size),
             label + ", forward algorithm search");
    choose(
        usable(found, returned, cap, ctx_.modes.deterministic), "forward", 11,
        [&](const Candidate& c, cudnnConvolutionDescriptor_t cd) {
          return cudnnConvolutionForward(ctx_.cudnn.get(), &one, plan.x.get(), sx, plan.w.get(), sw, cd,
                                         static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), sws,
                                         static_cast<std::size_t>(c.workspace_bytes), &zero, plan.y.get(), sy);
        },
        plan.fwd);
    time_depthwise_kernel(plan.fwd, d, x.with_data(sx), w.with_data(sw), y.with_data(sy), sampler);
    if (plan.fwd.algo < 0 && !plan.fwd.depthwise_kernel) plan.fwd.refusal = "cuDNN has no forward" + limits;
    plan.fwd.searched = true;
    ++stats_.conv_pass_searches;
  }
  // A backward pass cuDNN cannot run is refused when it is called, not here: the layer asking for
  // it may be one of several of this configuration, and a refusal is only an error when it runs.
  if (want_data) {
    try {
      int count = 0, returned = 0;
      AB_CUDNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(ctx_.cudnn.get(), &count), label);
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> found(static_cast<std::size_t>(std::max(count, 1)));
      randomise(21);
      AB_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx(ctx_.cudnn.get(), plan.w.get(), sw, plan.y.get(), sy,
                                                           search.get(), plan.x.get(), sx, count, &returned,
                                                           found.data(), sws, ws_size),
               label + ", backward-data algorithm search");
      choose(
          usable(found, returned, cap, ctx_.modes.deterministic), "backward-data", 22,
          [&](const Candidate& c, cudnnConvolutionDescriptor_t cd) {
            return cudnnConvolutionBackwardData(ctx_.cudnn.get(), &one, plan.w.get(), sw, plan.y.get(), sy, cd,
                                                static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), sws,
                                                static_cast<std::size_t>(c.workspace_bytes), &zero, plan.x.get(), sx);
          },
          plan.bwd_data);
      if (plan.bwd_data.algo < 0) plan.bwd_data.refusal = "cuDNN has no backward-data" + limits;
    } catch (const Unsupported& e) {
      plan.bwd_data.refusal = e.what();
    }
    plan.bwd_data.searched = true;
    ++stats_.conv_pass_searches;
  }
  if (want_filter) {
    try {
      int count = 0, returned = 0;
      AB_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(ctx_.cudnn.get(), &count), label);
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> found(static_cast<std::size_t>(std::max(count, 1)));
      randomise(31);
      AB_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(ctx_.cudnn.get(), plan.x.get(), sx, plan.y.get(), sy,
                                                             search.get(), plan.w.get(), sw, count, &returned,
                                                             found.data(), sws, ws_size),
               label + ", backward-filter algorithm search");
      choose(
          usable(found, returned, cap, ctx_.modes.deterministic), "backward-filter", 32,
          [&](const Candidate& c, cudnnConvolutionDescriptor_t cd) {
            return cudnnConvolutionBackwardFilter(ctx_.cudnn.get(), &one, plan.x.get(), sx, plan.y.get(), sy, cd,
                                                  static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), sws,
                                                  static_cast<std::size_t>(c.workspace_bytes), &zero, plan.w.get(), sw);
          },
          plan.bwd_filter);
      if (plan.bwd_filter.algo < 0) plan.bwd_filter.refusal = "cuDNN has no backward-filter" + limits;
    } catch (const Unsupported& e) {
      plan.bwd_filter.refusal = e.what();
    }
    plan.bwd_filter.searched = true;
    ++stats_.conv_pass_searches;
  }
  AB_CUDA(cudaStreamSynchronize(ctx_.stream), label + ", algorithm search");
  if (env_flag("AB_CONV_CHOICES"))
    for (const auto& [pass, now] :
         {std::pair{&plan.fwd, want_fwd}, {&plan.bwd_data, want_data}, {&plan.bwd_filter, want_filter}})
      if (now && !pass->choice.empty()) std::fprintf(stderr, "%s: %s\n", label.c_str(), pass->choice.c_str());
}

// The project's depthwise kernel, where it runs the configuration, against cuDNN's chosen forward
// (timed the same way, on the same operands); the faster runs.
void ConvEngine::time_depthwise_kernel(ConvPass& fwd, const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                       const Tensor& y, GpuSampler& sampler) {
  if (!cuda_spatial::depthwise_refusal(d, x, w, y).empty()) return;
  const auto launch = [&] {
    cuda_spatial::depthwise_forward(ctx_.stream, d, x, w, nullptr, false, nullptr, y, false);
    return true;
  };
  launch();  // warm
  const double best_s = fwd.algo >= 0 ? fwd.time_s : std::numeric_limits<double>::infinity();
  const double t = time_candidate(sampler, launch, best_s, "depthwise kernel timing");
  fwd.choice += (fwd.choice.empty() ? "forward:" : ";") + std::string(" depthwise kernel ") + format_us(t) + " us";
  if (t < best_s) {
    fwd.depthwise_kernel = true;
    fwd.time_s = t;
    fwd.workspace_bytes = 0;
    fwd.choice += " (runs)";
  }
}

ConvPlan& ConvEngine::conv_plan(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) {
  if (auto it = conv_plans_.find(conv_key(d, x, w, y)); it != conv_plans_.end()) return *it->second;
  // Not prepared (a direct call, or the mode changed since binding): search every pass now.
  return prepared_conv_plan(d, x, w, y, ConvPasses{});
}

// A cached plan always has its forward pass searched: a new plan enters the cache only after that.
ConvPlan& ConvEngine::prepared_conv_plan(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                                         ConvPasses passes) {
  const Key key = conv_key(d, x, w, y);
  const auto it = conv_plans_.find(key);
  ConvPlan* plan = it != conv_plans_.end() ? it->second.get() : nullptr;
  if (plan != nullptr && (!passes.backward_data || plan->bwd_data.searched) &&
      (!passes.backward_filter || plan->bwd_filter.searched))
    return *plan;
  // The search's allocations and synchronisation cannot happen inside a capture.
  if (ctx_.capturing())
    throw Error(conv_label(d, x, w, y) + ": not prepared; call conv2d_prepare (bind the graph) before capturing");
  if (plan != nullptr) {  // cached for fewer passes (an inference or first layer): extend it
    search_conv_passes(*plan, d, x, w, y, passes);
    return *plan;
  }
  auto built = build_conv_plan(d, x, w, y);
  search_conv_passes(*built, d, x, w, y, passes);
  ++stats_.conv_searches;
  return *conv_plans_.emplace(key, std::move(built)).first->second;
}

std::vector<std::string> ConvEngine::conv_choices() const {
  std::vector<std::string> lines;
  for (const auto& [key, plan] : conv_plans_) {
    for (const ConvPass* pass : {&plan->fwd, &plan->bwd_data, &plan->bwd_filter})
      if (!pass->choice.empty()) lines.push_back(plan->label + ": " + pass->choice);
    for (const ConvEpilogue& e : plan->epilogue)
      if (!e.pass.choice.empty()) lines.push_back(plan->label + ": " + e.pass.choice);
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

void ConvEngine::count_fusions(Kernels::FusionCounts& counts) const {
  for (const auto& [key, plan] : conv_plans_)
    for (const ConvEpilogue& e : plan->epilogue)
      if (e.searched) ++(e.fused ? counts.fused : counts.unfused);
}

std::int64_t ConvEngine::conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                                        ConvPasses passes) {
  AB_CUDA(cudaSetDevice(ctx_.device), ctx_.label + " conv2d_prepare");
  const std::int64_t searched_before = stats_.conv_pass_searches;
  const ConvPlan& p = prepared_conv_plan(d, x, w, y, passes);
  if (stats_.conv_pass_searches == searched_before) ++stats_.conv_cache_hits;
  if (p.fwd.algo < 0 && !p.fwd.depthwise_kernel) throw Unsupported(p.fwd.refusal);
  // The passes this layer runs only: another layer of the configuration may have asked for more.
  std::int64_t bytes = p.fwd.workspace_bytes;
  if (passes.backward_data && p.bwd_data.algo >= 0) bytes = std::max(bytes, p.bwd_data.workspace_bytes);
  if (passes.backward_filter && p.bwd_filter.algo >= 0) bytes = std::max(bytes, p.bwd_filter.workspace_bytes);
  return bytes;
}

void ConvEngine::conv2d_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y, Workspace ws) {
  const ConvPlan& p = conv_plan(d, x, w, y);
  if (p.fwd.depthwise_kernel) {
    cuda_spatial::depthwise_forward(ctx_.stream, d, x, w, nullptr, false, nullptr, y, false);
    return;
  }
  const ConvPass& pass = usable_pass(p.fwd, p, ws, "forward");
  const float one = 1.0f, zero = 0.0f;
  AB_CUDNN(cudnnConvolutionForward(ctx_.cudnn.get(), &one, p.x.get(), x.data, p.w.get(), w.data, pass.conv.get(),
                                   static_cast<cudnnConvolutionFwdAlgo_t>(pass.algo), ws.data,
                                   static_cast<std::size_t>(pass.workspace_bytes), &zero, p.y.get(), y.data),
           p.label);
}

void ConvEngine::conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx,
                                      bool accumulate, Workspace ws) {
  const ConvPlan& p = conv_plan(d, dx, w, dy);
  const ConvPass& pass = usable_pass(p.bwd_data, p, ws, "backward-data");
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  AB_CUDNN(cudnnConvolutionBackwardData(ctx_.cudnn.get(), &one, p.w.get(), w.data, p.y.get(), dy.data, pass.conv.get(),
                                        static_cast<cudnnConvolutionBwdDataAlgo_t>(pass.algo), ws.data,
                                        static_cast<std::size_t>(pass.workspace_bytes), &beta, p.x.get(), dx.data),
           p.label + ", backward data");
}

void ConvEngine::conv2d_backward_filter(const Conv2dDesc& d, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                        Workspace ws) {
  const ConvPlan& p = conv_plan(d, x, dw, dy);
  const ConvPass& pass = usable_pass(p.bwd_filter, p, ws, "backward-filter");
  const float one = 1.0f, zero = 0.0f;
  AB_CUDNN(
      cudnnConvolutionBackwardFilter(ctx_.cudnn.get(), &one, p.x.get(), x.data, p.y.get(), dy.data, pass.conv.get(),
                                     static_cast<cudnnConvolutionBwdFilterAlgo_t>(pass.algo), ws.data,
                                     static_cast<std::size_t>(pass.workspace_bytes), &zero, p.w.get(), dw.data),
      p.label + ", backward filter");
}

}  // namespace ab::nn::cuda
