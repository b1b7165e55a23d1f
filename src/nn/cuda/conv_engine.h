// The convolution family: cuDNN's convolution passes with their algorithm search (conv.cpp), the
// folded epilogue act(conv + bias (+ residual)) (conv_epilogue.cpp) and the fp8 path
// (conv_fp8_layer.cpp over conv_fp8.h). Every per-shape object (descriptors, chosen algorithms,
// fp8 plans) is built once and cached by a key of dtypes, shapes, strides and attributes, so a step
// only looks plans up. The entry points are nn::Kernels' (nn/kernels.h says what each computes).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/check.h"
#include "nn/cuda/common.h"
#include "nn/cuda/context.h"
#include "nn/cuda/conv_fp8.h"
#include "nn/cuda/kernels.h"
#include "nn/kernels.h"

namespace ab::nn::cuda {

class GpuSampler;

// One pass of a convolution: its own descriptor (the chosen algorithm fixes the math type) and
// algorithm; algo < 0 where no algorithm fitted (the pass then refuses to run, naming why).
// searched: false until a conv2d_prepare asked for the pass (a backward pass no layer of this
// configuration runs is never searched, and calling it is an Error).
struct ConvPass {
  bool searched = false;
  ConvDescPtr conv;
  int algo = -1;
  std::int64_t workspace_bytes = 0;
  // Forward only: the project's depthwise kernel (cuda_spatial) timed faster than every cuDNN
  // algorithm, so it runs instead (no workspace; the fused epilogue is its own).
  bool depthwise_kernel = false;
  double time_s = 0;   // the chosen algorithm's timed GPU time per call
  std::string choice;  // the chosen algorithm and every candidate's time, for reports
  std::string refusal;
};

// The folded epilogue act(conv + bias (+ residual)) of one (ReLU, residual) combination: cuDNN's
// fused cudnnConvolutionBiasActivationForward where it timed faster than the plain forward
// followed by the bias_act kernel (fused = true), else those two (cuDNN may run the fused call as
// separate kernels, or slower ones, for some shapes).
struct ConvEpilogue {
  bool searched = false, fused = false;
  ConvPass pass;          // the fused call's descriptor, algorithm and workspace
  TensorDescPtr bias;     // [1, C, 1, 1] in y's dtype
  ActivationDescPtr act;  // ReLU, or identity
  double unfused_s = 0;   // the plain forward plus bias_act, timed the same way
};

struct ConvPlan {
  TensorDescPtr x, y;
  FilterDescPtr w;
  ConvPass fwd, bwd_data, bwd_filter;
  std::array<ConvEpilogue, 4> epilogue;  // index: relu + 2 * residual
  std::string label;
};

// One fp8 convolution configuration (shape, bias type, residual, ReLU): cuDNN's graph with the whole
// epilogue, or (separate_epilogue) the convolution and descale alone followed by the bias_act
// kernel where cuDNN refused the residual inside the graph. A refused configuration keeps its
// reason (plan null) so that it is not searched again.
struct Fp8Layer {
  std::unique_ptr<Fp8ConvPlan> plan;
  bool separate_epilogue = false;
  std::string note, refusal;
  double fp8_s = 0, sixteen_s = 0;  // the timed comparison (0: not timed)
};

// A weight tensor's e4m3 image, its descale and its layer's bias widened to f32, made on the first
// forward after parameters_changed() and kept by the weight's address.
struct Fp8Weights {
  backend::cuda::DeviceBuffer q;
  backend::cuda::DeviceBuffer scalars;  // amax, descale (a line each), then the bias f32 [K]
  const void* bias_source = nullptr;
  std::int64_t weight_bytes = 0, bias_count = 0;  // what the buffers were made for
  bool fresh = false;
  float* descale() const { return reinterpret_cast<float*>(scalars.as<unsigned char>() + kAllocAlignment); }
  float* bias_f32() const { return reinterpret_cast<float*>(scalars.as<unsigned char>() + 2 * kAllocAlignment); }
};

class ConvEngine {
 public:
  // Registers a write hook: a write into a weight or bias makes its e4m3 image stale.
  explicit ConvEngine(EngineContext& ctx);
  ConvEngine(const ConvEngine&) = delete;
  ConvEngine& operator=(const ConvEngine&) = delete;

  std::int64_t conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                              ConvPasses passes);
  void conv2d_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y, Workspace ws);
  void conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate,
                            Workspace ws);
  void conv2d_backward_filter(const Conv2dDesc& d, const Tensor& x, const Tensor& dy, const Tensor& dw, Workspace ws);

  std::int64_t conv2d_bias_activation_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                              const Tensor& residual, const Tensor& y, bool relu);
  void conv2d_bias_activation_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Tensor& residual, const Tensor& y, bool relu, Workspace ws);

  std::int64_t conv2d_fp8_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                  const Tensor& residual, const Tensor& y, bool relu);
  void conv2d_fp8_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                          const Tensor& residual, const Tensor& y, bool relu, Workspace ws);
  void parameters_changed();

  // For reports and tests: the epilogues decided (Kernels::fusion_counts), the searches' counters,
  // the chosen algorithms (cuda_conv_choices) and the fp8 configurations (cuda_fp8_notes).
  void count_fusions(Kernels::FusionCounts& counts) const;
  const CudaKernelStats& stats() const { return stats_; }
  std::vector<std::string> conv_choices() const;
  std::vector<std::string> fp8_notes() const;

 private:
  // conv.cpp
  Key conv_key(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) const;
  // For a kernel call: the cached plan, or where none is (a direct call without conv2d_prepare)
  // one searched now for every pass.
  ConvPlan& conv_plan(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y);
  // The cached plan with forward and `passes` searched: a cached plan lacking a pass is extended.
  ConvPlan& prepared_conv_plan(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                               ConvPasses passes);
  std::unique_ptr<ConvPlan> build_conv_plan(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y);
  // Searches forward (if not yet) and the passes in `passes` not searched yet.
  void search_conv_passes(ConvPlan& plan, const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                          ConvPasses passes);
  // x, w, y: the search's scratch operands.
  void time_depthwise_kernel(ConvPass& fwd, const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                             GpuSampler& sampler);
  std::int64_t conv_workspace_cap() const;
  // conv_epilogue.cpp: times the fused epilogue call against the plain forward (searched already)
  // plus bias_act.
  void search_conv_epilogue(ConvPlan& plan, ConvEpilogue& e, const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                            const Tensor& y, bool relu, bool residual);
  // The epilogue entry of (relu, residual), searched now where no prepare did (outside a capture).
  ConvEpilogue& conv_epilogue(ConvPlan& plan, const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                              bool relu, bool residual);
  // conv_fp8_layer.cpp: the cached fp8 configuration (built now outside a capture; throws
  // Unsupported, also for a cached refusal) and the weights' e4m3 image, quantized where stale.
  Fp8Layer& fp8_layer(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual,
                      const Tensor& y, bool relu);
  Fp8Weights& fp8_weights(const Tensor& w, const Tensor& bias, const Fp8Layer& layer);
  // Why the layer should run in 16 bits: its whole fp8 call (amax, quantize, convolution, epilogue)
  // timed on scratch operands no faster than the 16-bit call the op would run instead (the
  // searched conv2d_bias_activation); empty where fp8 is faster or the 16-bit call cannot run.
  std::string fp8_slower_than_16bit(Fp8Layer& layer, const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                    const Tensor& bias, const Tensor& residual, const Tensor& y, bool relu);
  // A write into a tensor starting at `data` (upload, fill, cast): the e4m3 image of a weight or
  // bias there is stale (memory a freed weight held may come back as another tensor).
  void fp8_weights_written(const void* data) {
    if (fp8_weights_.empty()) return;
    for (auto& [address, fw] : fp8_weights_)
      if (address == data || fw.bias_source == data) fw.fresh = false;
  }

  EngineContext& ctx_;
  CudaKernelStats stats_;
  std::unordered_map<Key, std::unique_ptr<ConvPlan>, KeyHash> conv_plans_;
  std::unordered_map<Key, std::unique_ptr<Fp8Layer>, KeyHash> fp8_layers_;
  std::unordered_map<const void*, Fp8Weights> fp8_weights_;
};

}  // namespace ab::nn::cuda
