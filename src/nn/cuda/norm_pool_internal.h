// Internal to the normalisation and pooling family (norm_pool.cpp, bn_fusion.cpp): the layout
// tests and operand checks both files apply.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include <cudnn.h>

#include "core/error.h"
#include "core/tensor.h"
#include "nn/kernels.h"

namespace ab::nn::cuda::norm_pool {


inline bool is_nhwc(const Tensor& t) {
  return t.strides == contiguous_strides(t.shape, Layout::nhwc) &&
         !(t.strides == contiguous_strides(t.shape, Layout::nchw));
}

inline void require_like(const char* kernel, const Tensor& x, const Tensor& t, const char* what) {
  if (!(t.shape == x.shape) || !(t.strides == x.strides) || t.dtype != x.dtype)
    throw Unsupported(std::string("cuda ") + kernel + ": " + what + " " + t.to_string() +
                      " must have x's shape, strides and dtype " + x.to_string());
}

inline void require_channel_vector(const char* kernel, const Tensor& x, const Tensor& t, const char* what) {
  if (t.dtype != DType::f32 || t.numel() != x.shape[1] || !t.is_contiguous() || !t.defined())
    throw Unsupported(std::string("cuda ") + kernel + ": " + what + " must be f32 [" + std::to_string(x.shape[1]) +
                      "] (batch-norm parameters and statistics stay f32), got " + t.to_string());
}

using Named = std::pair<const Tensor*, const char*>;

inline double bn_epsilon(const BatchNormDesc& d) { return std::max(d.epsilon, CUDNN_BN_MIN_EPSILON); }

// Memory [N*H*W, C] row-major: NHWC, or a shape where NCHW and NHWC name the same bytes.
inline bool rows_by_channel(const Tensor& x) {
  return x.shape.rank() == 4 && x.strides == contiguous_strides(x.shape, Layout::nhwc);
}

// Whether a batch norm on x runs on cuda_batchnorm (else cuDNN). NHWC training with f16/bf16
// activations runs cuDNN's persistent NHWC kernels where cooperative kernels are allowed (the
// default: cuDNN's path reads x once per forward, ours twice, and measured fast: ResNet-50 bf16 b256
// training 5727 img/s against PyTorch's 4673 on an H200), else the project's kernels
// (set_cooperative_kernels(false): nothing that needs every SM at once).
inline bool own_batchnorm(const Tensor& x, bool training, bool cooperative_allowed) {
  if (!rows_by_channel(x)) return false;
  if (x.dtype == DType::f32) return true;
  if (x.dtype == DType::f16 || x.dtype == DType::bf16) return !training || !cooperative_allowed;
  return false;
}

inline std::int64_t bn_rows(const Tensor& x) { return x.shape[0] * x.shape[2] * x.shape[3]; }

inline const float* f32(const Tensor& t) { return static_cast<const float*>(t.data); }
inline float* f32_out(const Tensor& t) { return static_cast<float*>(t.data); }

}  // namespace ab::nn::cuda::norm_pool
