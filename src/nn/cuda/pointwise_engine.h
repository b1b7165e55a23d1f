// The pointwise family: the project's own elementwise kernels (activations, the residual add, the
// folded epilogue's bias_act), the losses (softmax cross-entropy, the compression model's rounding
// and rate-distortion) and the optimizer steps with mixed precision (SGD, LARS, casts, fp16 loss
// scaling), all launched from pointwise.h (pointwise.cu, losses.cu, optim.cu). Owns the losses'
// and LARS's scratch. The entry points are nn::Kernels'.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/check.h"
#include "nn/cuda/context.h"
#include "nn/kernels.h"

namespace ab::nn::cuda {

class PointwiseEngine {
 public:
  explicit PointwiseEngine(EngineContext& ctx);
  PointwiseEngine(const PointwiseEngine&) = delete;
  PointwiseEngine& operator=(const PointwiseEngine&) = delete;

  // At bind (check_tensor): a [N, K] tensor may be a loss's logits, so its scratch grows to N rows.
  void reserve_for(const Tensor& t);

  // pointwise_engine.cpp: elementwise ops and losses
  void relu_forward(const Tensor& x, const Tensor& y);
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool accumulate);
  void add_forward(const Tensor& a, const Tensor& b, const Tensor& y);
  void copy_gradient(const Tensor& dy, const Tensor& dx, bool accumulate);
  void bias_activation_forward(const Tensor& x, const Tensor& bias, const Tensor& residual, const Tensor& y, bool relu);
  void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                     const Tensor& loss);
  void softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,
                                      const Tensor& dlogits, bool accumulate);
  void round_forward(const Tensor& x, const Tensor& y, double step);
  void rate_distortion_forward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x, const Tensor& latent,
                               const Tensor& loss, const Tensor& mse);
  void rate_distortion_backward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x, const Tensor& latent,
                                const Tensor& dloss, const Tensor& dx_hat, bool accumulate_x_hat, const Tensor& dlatent,
                                bool accumulate_latent);

  // pointwise_optim.cpp: optimizers and mixed precision
  void sgd_update(const SgdStep& s, const Tensor& w, const Tensor& g, const Tensor& v);
  void sgd_update_many(const SgdStep& s, const std::vector<SgdTensors>& params);
  void lars_update(const LarsStep& s, const Tensor& w, const Tensor& g, const Tensor& v);
  void cast(const Tensor& src, const Tensor& dst);
  void unscale_and_check(const Tensor& g, const Tensor& scale, const Tensor& found_nonfinite);
  void update_loss_scale(const LossScaleRule& rule, const Tensor& scale, const Tensor& good_steps,
                         const Tensor& found_nonfinite);

 private:
  EngineContext& ctx_;
  backend::cuda::DeviceBuffer lars_scratch_;
  backend::cuda::DeviceBuffer xent_scratch_;  // the loss's per-row partials, grown at bind
  backend::cuda::DeviceBuffer rd_scratch_;    // the rate-distortion loss's per-block partials
};

}  // namespace ab::nn::cuda
