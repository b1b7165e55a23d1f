// Internal to the convolution family (conv.cpp: the algorithm search; conv_epilogue.cpp: the fused
// bias + residual + activation call; conv_fp8_layer.cpp): the descriptor helpers they build with.
// Timing is gpu_sampler.h's.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <string>

#include "nn/cuda/conv_engine.h"
#include "nn/cuda/gpu_sampler.h"

namespace ab::nn::cuda {

// `v` as an int for a cuDNN descriptor; Unsupported naming `what` where it does not fit.
int narrow(std::int64_t v, const std::string& what);
// f32 stays in FMA math unless TF32 is allowed; f16/bf16 use tensor cores, accumulating in f32.
cudnnMathType_t search_math(DType t, bool tf32);
ConvDescPtr make_conv_desc(const Conv2dDesc& d, cudnnMathType_t math, const std::string& label);
// The pass a call may run: prepared, with an algorithm, and a workspace that fits; else Error
// (Unsupported where cuDNN had none) naming the plan and the pass.
const ConvPass& usable_pass(const ConvPass& pass, const ConvPlan& plan, const Workspace& ws, const char* what);

}  // namespace ab::nn::cuda
