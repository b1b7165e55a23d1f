// The engine's own NHWC spatial kernels, for what cuDNN's legacy API runs slowly: depthwise
// convolution (one filter per channel, any kernel up to kMaxDepthwiseTaps taps, stride, padding and
// dilation) with the folded epilogue act(conv + bias (+ residual)), which the convolution search
// times against cuDNN's algorithms (conv.cpp), and max pooling. Semantics are nn::Kernels'
// (nn/kernels.h), checked against the reference kernels. Every call enqueues on `stream` only (no
// allocation, no sync), so it can be captured; math is f32; dtypes f32, f16, bf16.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/tensor.h"
#include "nn/kernels.h"

namespace ab::nn::cuda_spatial {

inline constexpr int kMaxDepthwiseTaps = 121;  // up to 11 x 11

// Empty where depthwise_forward runs this convolution (x, y NHWC-contiguous [N, C, H, W] of one
// dtype, w [C, 1, R, S] contiguous, groups = C), else the reason.
std::string depthwise_refusal(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y);
// y = act(conv(x, w) + bias (+ residual)), act = ReLU when `relu`. bias: [C], null for none, in y's
// dtype (bias_is_storage_type) or f32; residual: like y, or null.
void depthwise_forward(cudaStream_t stream, const Conv2dDesc& d, const Tensor& x, const Tensor& w, const void* bias,
                       bool bias_is_storage_type, const void* residual, const Tensor& y, bool relu);

// Empty where maxpool_forward runs this pooling (x, y NHWC-contiguous of one dtype), else the reason.
std::string maxpool_refusal(const Pool2dDesc& d, const Tensor& x, const Tensor& y);
// y = the largest x in each window, as the reference picks it: the window's first position inside
// the image starts it and a later one replaces it only where greater (padding never wins).
void maxpool_forward(cudaStream_t stream, const Pool2dDesc& d, const Tensor& x, const Tensor& y);

}  // namespace ab::nn::cuda_spatial
