// The Kernels contract's default compositions: a backend that has no fused kernel for a call runs
// the unfused ones, so every backend computes every op and a fused one is an optimisation only.
#include "nn/kernels.h"

#include "core/error.h"

namespace ab::nn {

std::int64_t Kernels::conv2d_bias_activation_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                                     const Tensor& bias, const Tensor& residual, const Tensor& y,
                                                     bool /*relu*/) {
  check_tensor(bias);
  // An absent residual is an empty descriptor (rank 0).
  if (residual.shape.rank() != 0 && (residual.dtype != y.dtype || !(residual.shape == y.shape)))
    throw Unsupported("conv2d_bias_activation: residual " + residual.to_string() + " must match y " + y.to_string());
  return conv2d_prepare(d, x, w, y, ConvPasses{false, false});
}

void Kernels::conv2d_bias_activation_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                             const Tensor& residual, const Tensor& y, bool relu, Workspace ws) {
  conv2d_forward(d, x, w, y, ws);
  bias_activation_forward(y, bias, residual, y, relu);
}

}  // namespace ab::nn
