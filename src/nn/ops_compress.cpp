// Layers of the learned-compression model (models/compression.h): the transposed convolution on
// the Kernels convolution calls, straight-through rounding, the rate-distortion proxy loss.
// Cost rules: docs/ENGINE.md.
#include <algorithm>
#include <cmath>

#include "nn/ops.h"

namespace ab::nn {
namespace {

std::int64_t transposed_extent(std::int64_t in, std::int64_t kernel, std::int64_t stride, std::int64_t pad,
                               std::int64_t dilation, std::int64_t output_padding) {
  return (in - 1) * stride - 2 * pad + dilation * (kernel - 1) + output_padding + 1;
}

}  // namespace

// ---- conv_transpose2d

std::vector<Tensor> ConvTranspose2d::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  const Tensor& x = in[0];
  const Conv2dDesc& c = a_.conv;
  require_conv_geometry(x, a_.out_channels, a_.kernel_h, a_.kernel_w, c);
  // PyTorch's rule: the padding only picks one of the output sizes that map back to the input.
  require(a_.output_padding_h >= 0 && a_.output_padding_w >= 0 &&
              a_.output_padding_h < std::max(c.stride_h, c.dilation_h) &&
              a_.output_padding_w < std::max(c.stride_w, c.dilation_w),
          "output_padding must be >= 0 and smaller than stride or dilation");
  const std::int64_t oh =
      transposed_extent(x.shape[2], a_.kernel_h, c.stride_h, c.pad_h, c.dilation_h, a_.output_padding_h);
  const std::int64_t ow =
      transposed_extent(x.shape[3], a_.kernel_w, c.stride_w, c.pad_w, c.dilation_w, a_.output_padding_w);
  require(oh >= 1 && ow >= 1, "padding leaves no output for input " + x.shape.to_string());
  return {Tensor::describe(x.dtype, Shape{x.shape[0], a_.out_channels, oh, ow})};
}

std::vector<ParamSpec> ConvTranspose2d::parameters() const {
  const std::int64_t cin = in_.empty() ? 0 : in_[0].shape[1];
  // He initialisation for the fan-in an output element actually sees: (in / groups) * R * S taps
  // spread over stride_h * stride_w output phases.
  const double fan_in = static_cast<double>(std::max<std::int64_t>(cin / a_.conv.groups, 1) * a_.kernel_h *
                                            a_.kernel_w) /
                        static_cast<double>(a_.conv.stride_h * a_.conv.stride_w);
  ParamSpec w{"weight", Shape{cin, a_.out_channels / a_.conv.groups, a_.kernel_h, a_.kernel_w}, ParamRole::weight,
              {ParamInit::Dist::normal, std::sqrt(2.0 / std::max(fan_in, 1.0))},
              in_.empty() ? DType::f32 : in_[0].dtype};
  return {w};
}

std::int64_t ConvTranspose2d::macs() const {
  const Shape& x = in_[0].shape;
  return x[0] * x[1] * x[2] * x[3] * (a_.out_channels / a_.conv.groups) * a_.kernel_h * a_.kernel_w;
}

ConvPasses ConvTranspose2d::passes() const { return {true, training_}; }

std::int64_t ConvTranspose2d::prepare(Kernels& k, const OpTensors& d) {
  Op::prepare(k, d);
  // The swapped convolution reads our output as its input and writes our input as its output.
  conv_workspace_ = k.conv2d_prepare(a_.conv, d.out[0], d.params[0], d.in[0], passes());
  // Its forward (our data gradient) cannot add into dx: an accumulating data gradient is written
  // to scratch after the convolution's workspace and added with copy_gradient.
  const bool accumulates = training_ && input_needs_grad(0) && !d.din_accumulate.empty() && d.din_accumulate[0];
  return accumulates ? align_up(conv_workspace_) + d.in[0].size_bytes() : conv_workspace_;
}

void ConvTranspose2d::forward(Kernels& k, const OpTensors& t) {
  k.conv2d_backward_data(a_.conv, t.in[0], t.params[0], t.out[0], /*accumulate=*/false, t.workspace);
}

void ConvTranspose2d::backward(Kernels& k, const OpTensors& t) {
  if (t.din[0].defined()) {
    if (t.din_accumulate[0]) {
      const Tensor scratch = t.din[0].with_data(static_cast<char*>(t.workspace.data) + align_up(conv_workspace_));
      k.conv2d_forward(a_.conv, t.dout[0], t.params[0], scratch, Workspace{t.workspace.data, conv_workspace_});
      k.copy_gradient(scratch, t.din[0], /*accumulate=*/true);
    } else {
      k.conv2d_forward(a_.conv, t.dout[0], t.params[0], t.din[0], t.workspace);
    }
  }
  k.conv2d_backward_filter(a_.conv, t.dout[0], t.in[0], t.dparams[0], t.workspace);
}

std::int64_t ConvTranspose2d::flops(Pass p) const {
  return 2 * macs() * (p == Pass::forward ? 1 : (input_needs_grad(0) ? 2 : 1));
}

std::int64_t ConvTranspose2d::bytes(Pass p) const {
  // As conv2d's; an accumulated data gradient's scratch round trip is not compulsory traffic.
  const std::int64_t x = in_[0].numel(), y = out_[0].numel();
  const std::int64_t w = in_[0].shape[1] * (a_.out_channels / a_.conv.groups) * a_.kernel_h * a_.kernel_w;
  if (p == Pass::forward) return (x + w + y) * element_bytes();
  const std::int64_t filter = x + y + w, data = input_needs_grad(0) ? y + w + x : 0;
  return (filter + data) * element_bytes();
}

// ---- quantize_ste

std::vector<Tensor> QuantizeSte::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  require_float(in[0]);
  require(step_ > 0 && std::isfinite(step_), "step must be positive and finite");
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

void QuantizeSte::forward(Kernels& k, const OpTensors& t) { k.round_forward(t.in[0], t.out[0], step_); }

void QuantizeSte::backward(Kernels& k, const OpTensors& t) {
  // A gradient in the output gradient's own buffer (the planner's sharing) already holds it.
  if (t.din[0].defined() && !(t.din[0].data == t.dout[0].data && !t.din_accumulate[0]))
    k.copy_gradient(t.dout[0], t.din[0], t.din_accumulate[0]);
}

std::int64_t QuantizeSte::flops(Pass p) const { return p == Pass::forward ? in_[0].numel() : 0; }

std::int64_t QuantizeSte::bytes(Pass p) const {
  const std::int64_t n = in_[0].numel();
  if (p == Pass::forward) return 2 * n * element_bytes();
  return input_needs_grad(0) && !shares_gradient(0) ? 2 * n * element_bytes() : 0;
}

// ---- rate_distortion_loss

std::vector<Tensor> RateDistortionLoss::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 3, "takes x_hat, x and latent, got " + std::to_string(in.size()) + " inputs");
  require(in[0].shape == in[1].shape,
          "x_hat " + in[0].shape.to_string() + " and x " + in[1].shape.to_string() + " differ in shape");
  require(in[0].dtype == in[1].dtype && in[0].dtype == in[2].dtype, "inputs must share one dtype");
  require_float(in[0]);
  require(in[0].numel() >= 1 && in[2].numel() >= 1, "inputs must not be empty");
  require(d_.lambda >= 0 && std::isfinite(d_.lambda), "lambda must be finite and >= 0");
  const Tensor scalar = Tensor::describe(wide_dtype(in[0].dtype), Shape{1});
  return {scalar, scalar};
}

void RateDistortionLoss::forward(Kernels& k, const OpTensors& t) {
  k.rate_distortion_forward(d_, t.in[0], t.in[1], t.in[2], t.out[0], t.out[1]);
}

void RateDistortionLoss::backward(Kernels& k, const OpTensors& t) {
  const auto acc = [&](std::size_t i) { return t.din_accumulate.empty() ? false : static_cast<bool>(t.din_accumulate[i]); };
  if (t.din[0].defined() || t.din[2].defined())
    k.rate_distortion_backward(d_, t.in[0], t.in[1], t.in[2], t.dout[0], t.din[0], acc(0), t.din[2], acc(2));
  // The target's gradient (only where it asks for one): the distortion's with x_hat and x swapped.
  if (t.din[1].defined())
    k.rate_distortion_backward(d_, t.in[1], t.in[0], t.in[2], t.dout[0], t.din[1], acc(1), Tensor{}, false);
}

std::int64_t RateDistortionLoss::flops(Pass p) const {
  const std::int64_t nx = in_[0].numel(), nl = in_[2].numel();
  // Forward: subtract, square, add per image element; abs, add per latent; two means and the sum.
  if (p == Pass::forward) return 3 * nx + 2 * nl + 4;
  // Backward: subtract and scale per image-gradient element, sign and scale per latent.
  return 2 * nx * ((input_needs_grad(0) ? 1 : 0) + (input_needs_grad(1) ? 1 : 0)) +
         (input_needs_grad(2) ? 2 * nl : 0);
}

std::int64_t RateDistortionLoss::bytes(Pass p) const {
  const std::int64_t nx = in_[0].numel(), nl = in_[2].numel(), e = element_bytes();
  const std::int64_t w = bytes_of(wide_dtype(in_[0].dtype));
  if (p == Pass::forward) return (2 * nx + nl) * e + 2 * w;  // x_hat, x, latent; loss, mse
  return w + 3 * nx * e * ((input_needs_grad(0) ? 1 : 0) + (input_needs_grad(1) ? 1 : 0)) +
         (input_needs_grad(2) ? 2 * nl * e : 0);
}

// ---- builder helpers

Value conv_transpose2d(GraphBuilder& b, const std::string& name, Value x, const ConvTranspose2dAttrs& a) {
  return b.add1(std::make_unique<ConvTranspose2d>(name, a), {x});
}
Value quantize_ste(GraphBuilder& b, const std::string& name, Value x, double step) {
  return b.add1(std::make_unique<QuantizeSte>(name, step), {x});
}
RateDistortion rate_distortion_loss(GraphBuilder& b, const std::string& name, Value x_hat, Value x, Value latent,
                                    const RateDistortionDesc& d) {
  const std::vector<Value> out = b.add(std::make_unique<RateDistortionLoss>(name, d), {x_hat, x, latent});
  return {out[0], out[1]};
}

}  // namespace ab::nn
