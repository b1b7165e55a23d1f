// The pointwise family's elementwise ops and losses on the project's own kernels (pointwise.h);
// its optimizer steps are in pointwise_optim.cpp.
#include <algorithm>
#include <cmath>

#include "nn/cuda/pointwise.h"
#include "nn/cuda/pointwise_engine.h"

namespace ab::nn::cuda {

PointwiseEngine::PointwiseEngine(EngineContext& ctx) : ctx_(ctx) {
  lars_scratch_ = backend::cuda::DeviceBuffer(std::max<std::int64_t>(cuda_pointwise::lars_scratch_floats(), 1) * 4,
                                              ctx_.label + " LARS scratch");
  xent_scratch_ = backend::cuda::DeviceBuffer(
      std::max<std::int64_t>(cuda_pointwise::softmax_xent_scratch_floats(1024), 1) * 4, ctx_.label + " loss scratch");
  rd_scratch_ = backend::cuda::DeviceBuffer(cuda_pointwise::rate_distortion_scratch_floats() * 4,
                                            ctx_.label + " rate-distortion scratch");
}

void PointwiseEngine::reserve_for(const Tensor& t) {
  if (t.shape.rank() != 2) return;
  const std::int64_t need = cuda_pointwise::softmax_xent_scratch_floats(t.shape[0]) * 4;
  if (need > xent_scratch_.bytes()) xent_scratch_ = backend::cuda::DeviceBuffer(need, ctx_.label + " loss scratch");
}

// ---- elementwise

void PointwiseEngine::relu_forward(const Tensor& x, const Tensor& y) {
  require_flat("relu_forward", x, y);
  cuda_pointwise::relu_forward(ctx_.stream, x.dtype, x.data, y.data, x.numel());
}

void PointwiseEngine::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool accumulate) {
  require_flat("relu_backward", y, dy);
  require_flat("relu_backward", y, dx);
  cuda_pointwise::relu_backward(ctx_.stream, y.dtype, y.data, dy.data, dx.data, y.numel(), accumulate);
}

void PointwiseEngine::add_forward(const Tensor& a, const Tensor& b, const Tensor& y) {
  require_flat("add_forward", a, b);
  require_flat("add_forward", a, y);
  cuda_pointwise::add_forward(ctx_.stream, a.dtype, a.data, b.data, y.data, a.numel());
}

void PointwiseEngine::copy_gradient(const Tensor& dy, const Tensor& dx, bool accumulate) {
  require_flat("copy_gradient", dy, dx);
  cuda_pointwise::copy_gradient(ctx_.stream, dy.dtype, dy.data, dx.data, dy.numel(), accumulate);
}

void PointwiseEngine::bias_activation_forward(const Tensor& x, const Tensor& bias, const Tensor& residual,
                                              const Tensor& y, bool relu) {
  require_flat("bias_activation_forward", x, y);
  if (residual.defined()) require_flat("bias_activation_forward", x, residual);
  // The bias is stored as batch-norm parameters are (f32 beside f32/f16/bf16 data, f64 beside
  // f64) or in x's own type (a fused convolution's bias, when its epilogue runs here).
  const DType bias_t = x.dtype == DType::f64 ? DType::f64 : DType::f32;
  if (x.shape.rank() != 4 || (bias.dtype != bias_t && bias.dtype != x.dtype) || bias.shape.rank() != 1 ||
      bias.shape[0] != x.shape[1] || !bias.is_contiguous())
    throw Unsupported("cuda bias_activation_forward: needs x [N, C, H, W] and a contiguous " +
                      std::string(to_string(bias_t)) + " or " + std::string(to_string(x.dtype)) + " bias [C], got x " +
                      x.to_string() + ", bias " + bias.to_string());
  cuda_pointwise::bias_activation_forward(ctx_.stream, x.dtype, x.layout, x.data, bias.data, bias.dtype == x.dtype,
                                          residual.defined() ? residual.data : nullptr, y.data, x.shape[0], x.shape[1],
                                          x.shape[2] * x.shape[3], relu);
}

void PointwiseEngine::softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                                    const Tensor& loss) {
  if (logits.shape.rank() != 2 || !(probs.shape == logits.shape) || !logits.is_contiguous() || !probs.is_contiguous() ||
      labels.dtype != DType::i32 || labels.numel() != logits.shape[0] || !labels.is_contiguous() || loss.numel() != 1)
    throw Unsupported(
        "cuda softmax_cross_entropy_forward: needs contiguous logits and probs [N, K], i32 labels [N] "
        "and a loss [1]; got " +
        logits.to_string() + ", " + labels.to_string() + ", " + probs.to_string() + ", " + loss.to_string());
  const std::int64_t n = logits.shape[0];
  const std::int64_t need = cuda_pointwise::softmax_xent_scratch_floats(n) * 4;
  if (need > xent_scratch_.bytes()) {
    if (ctx_.capturing())
      throw Error("cuda softmax_cross_entropy_forward: loss scratch too small for " + std::to_string(n) +
                  " rows during capture (bind the graph first: check_tensor sizes it)");
    xent_scratch_ = backend::cuda::DeviceBuffer(need, ctx_.label + " loss scratch");
  }
  cuda_pointwise::softmax_xent_forward(ctx_.stream, logits.dtype, logits.data, labels.as<const std::int32_t>(),
                                       probs.dtype, probs.data, loss.dtype, loss.data, n, logits.shape[1],
                                       xent_scratch_.as<float>());
}

void PointwiseEngine::softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,
                                                     const Tensor& dlogits, bool accumulate) {
  if (probs.shape.rank() != 2 || !(probs.shape == dlogits.shape) || !probs.is_contiguous() ||
      !dlogits.is_contiguous() || labels.dtype != DType::i32 || labels.numel() != probs.shape[0] || dloss.numel() != 1)
    throw Unsupported(
        "cuda softmax_cross_entropy_backward: needs contiguous probs and dlogits [N, K], i32 labels [N] "
        "and dloss [1]; got " +
        probs.to_string() + ", " + labels.to_string() + ", " + dloss.to_string() + ", " + dlogits.to_string());
  cuda_pointwise::softmax_xent_backward(ctx_.stream, probs.dtype, probs.data, labels.as<const std::int32_t>(),
                                        dloss.dtype, dloss.data, dlogits.dtype, dlogits.data, probs.shape[0],
                                        probs.shape[1], accumulate);
}

// ---- learned compression

void PointwiseEngine::round_forward(const Tensor& x, const Tensor& y, double step) {
  require_flat("round_forward", x, y);
  if (!(step > 0) || !std::isfinite(step)) throw Error("cuda round_forward: step must be positive and finite");
  cuda_pointwise::round_forward(ctx_.stream, x.dtype, x.data, y.data, x.numel(), step);
}

void PointwiseEngine::rate_distortion_forward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x,
                                              const Tensor& latent, const Tensor& loss, const Tensor& mse) {
  require_flat("rate_distortion_forward", x_hat, x);
  if (!latent.is_contiguous() || latent.dtype != x.dtype || loss.numel() != 1 || mse.numel() != 1 ||
      loss.dtype != mse.dtype)
    throw Unsupported(
        "cuda rate_distortion_forward: needs a contiguous latent of the images' dtype and loss, mse [1] "
        "of one dtype; got " +
        latent.to_string() + ", " + loss.to_string() + ", " + mse.to_string());
  cuda_pointwise::rate_distortion_forward(ctx_.stream, x.dtype, x_hat.data, x.data, x.numel(), latent.data,
                                          latent.numel(), d.lambda, loss.dtype, loss.data, mse.data,
                                          rd_scratch_.as<float>());
}

void PointwiseEngine::rate_distortion_backward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x,
                                               const Tensor& latent, const Tensor& dloss, const Tensor& dx_hat,
                                               bool accumulate_x_hat, const Tensor& dlatent, bool accumulate_latent) {
  require_flat("rate_distortion_backward", x_hat, x);
  if (dx_hat.defined()) require_flat("rate_distortion_backward", x_hat, dx_hat);
  if (dlatent.defined()) require_flat("rate_distortion_backward", latent, dlatent);
  if (dloss.numel() != 1)
    throw Unsupported("cuda rate_distortion_backward: dloss must be [1], got " + dloss.to_string());
  cuda_pointwise::rate_distortion_backward(ctx_.stream, x.dtype, x_hat.data, x.data, x.numel(), latent.data,
                                           latent.numel(), d.lambda, dloss.dtype, dloss.data, dx_hat.data,
                                           accumulate_x_hat, dlatent.data, accumulate_latent);
}

}  // namespace ab::nn::cuda
