// Internal to the CUDA convolution (conv.cpp: the algorithm search; conv_epilogue.cpp:
// the fused bias + residual + activation call): timing GPU work free of host overhead, and the
// descriptor helpers both build with.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <functional>
#include <string>

#include "backend/cuda/check.h"
#include "nn/cuda/kernels_impl.h"

namespace ab::nn::cuda {

// GPU time of one launch sequence, free of host overhead: a spin kernel holds the stream while the
// host queues the runs between two events, so they execute back to back. If queueing took longer
// than half the spin (a slow host call), the spin doubles and the sample is taken again.
class GpuSampler {
 public:
  GpuSampler(cudaStream_t stream, const std::string& what)
      : stream_(stream), start_(backend::cuda::create_event(what)), stop_(backend::cuda::create_event(what)) {}

  // Seconds per call of `run`, timed over `calls` back-to-back calls; `run` returns false if the
  // call failed (nothing was queued).
  double sample(const std::function<bool()>& run, int calls, const std::string& what);

 private:
  static constexpr int kMaxAttempts = 4;
  static constexpr std::int64_t kMaxSpinNs = 100'000'000;
  cudaStream_t stream_;
  backend::cuda::EventPtr start_, stop_;
  std::int64_t spin_ns_ = 200'000;
};

// The median GPU time of `run` (one call already warmed it), or its first sample where that was
// already much slower than `best_s`, the fastest candidate so far.
double time_candidate(GpuSampler& sampler, const std::function<bool()>& run, double best_s, const std::string& what);

// `v` as an int for a cuDNN descriptor; Unsupported naming `what` where it does not fit.
int narrow(std::int64_t v, const std::string& what);
std::string format_us(double seconds);  // "12.3" (microseconds)
// f32 stays in FMA math unless TF32 is allowed; f16/bf16 use tensor cores, accumulating in f32.
cudnnMathType_t search_math(DType t, bool tf32);
ConvDescPtr make_conv_desc(const Conv2dDesc& d, cudnnMathType_t math, const std::string& label);
// The pass a call may run: prepared, with an algorithm, and a workspace that fits; else Error
// (Unsupported where cuDNN had none) naming the plan and the pass.
const ConvPass& usable_pass(const ConvPass& pass, const ConvPlan& plan, const Workspace& ws, const char* what);

}  // namespace ab::nn::cuda
