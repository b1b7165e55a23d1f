// Layers with parameters: convolution, batch norm, linear. Cost rules: docs/ENGINE.md.
#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "nn/ops.h"

namespace ab::nn {
namespace {

// Asks the kernels for an op's fp8 path where the op was built for it. A refusal is an answer, not
// an error: the layer runs in 16 bits and the record says why. The fp8 workspace bytes, or nullopt.
std::optional<std::int64_t> prepare_fp8(Fp8Choice& c, const std::function<std::int64_t()>& fp8_prepare) {
  c.runs = false;
  c.fallback_reason.clear();
  if (!c.asked) return std::nullopt;
  try {
    const std::int64_t ws = fp8_prepare();
    c.runs = true;
    return ws;
  } catch (const Unsupported& e) {
    c.fallback_reason = e.what();
    return std::nullopt;
  }
}

// Forward bytes of an op on the fp8 path (per-call dynamic scales): x (16-bit, `x` elements) read
// twice, by the amax and by the quantize pass, its e4m3 copy written once and read once by the
// convolution; the weights read as e4m3 (quantized once per parameter state, not per call); then
// `rest16` elements of 16-bit traffic (y, bias, residual); the scalar scales are not counted.
std::int64_t fp8_forward_bytes(std::int64_t x, std::int64_t w, std::int64_t rest16, std::int64_t element_bytes) {
  const auto e4m3 = static_cast<std::int64_t>(size_bytes(DType::f8e4m3));
  return x * (2 * element_bytes + 2 * e4m3) + w * e4m3 + rest16 * element_bytes;
}

std::int64_t conv_out_extent(std::int64_t in, std::int64_t kernel, std::int64_t stride, std::int64_t pad,
                             std::int64_t dilation) {
  const std::int64_t span = dilation * (kernel - 1) + 1;
  if (in + 2 * pad < span) return 0;
  return (in + 2 * pad - span) / stride + 1;
}

}  // namespace

// ---- conv2d

std::vector<Tensor> Conv2d::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  const Tensor& x = in[0];
  const Conv2dDesc& c = a_.conv;
  require_conv_geometry(x, a_.out_channels, a_.kernel_h, a_.kernel_w, c);
  const std::int64_t oh = conv_out_extent(x.shape[2], a_.kernel_h, c.stride_h, c.pad_h, c.dilation_h);
  const std::int64_t ow = conv_out_extent(x.shape[3], a_.kernel_w, c.stride_w, c.pad_w, c.dilation_w);
  require(oh >= 1 && ow >= 1, "dilated kernel " + std::to_string(a_.kernel_h) + "x" + std::to_string(a_.kernel_w) +
                                  " does not fit the padded input " + x.shape.to_string());
  return {Tensor::describe(x.dtype, Shape{x.shape[0], a_.out_channels, oh, ow})};
}

std::vector<ParamSpec> Conv2d::parameters() const {
  const std::int64_t cin = in_.empty() ? 0 : in_[0].shape[1];
  // torchvision's ResNet init: kaiming_normal_(mode="fan_out", nonlinearity="relu"),
  // fan_out = out_channels * kernel area (PyTorch ignores groups here).
  const double fan_out = static_cast<double>(a_.out_channels * a_.kernel_h * a_.kernel_w);
  ParamSpec w{"weight", Shape{a_.out_channels, cin / a_.conv.groups, a_.kernel_h, a_.kernel_w}, ParamRole::weight,
              {ParamInit::Dist::normal, std::sqrt(2.0 / fan_out)}, in_.empty() ? DType::f32 : in_[0].dtype};
  return {w};
}

std::int64_t Conv2d::macs() const {
  const Shape& y = out_[0].shape;
  return y[0] * y[1] * y[2] * y[3] * (in_[0].shape[1] / a_.conv.groups) * a_.kernel_h * a_.kernel_w;
}

std::int64_t Conv2d::prepare(Kernels& k, const OpTensors& d) {
  Op::prepare(k, d);
  // Only the passes backward() will call: an inference graph runs none, and the first layer
  // (whose input needs no gradient) no backward-data. Searching the rest cost seconds per graph.
  return k.conv2d_prepare(a_.conv, d.in[0], d.params[0], d.out[0], passes());
}

void Conv2d::forward(Kernels& k, const OpTensors& t) {
  k.conv2d_forward(a_.conv, t.in[0], t.params[0], t.out[0], t.workspace);
}

ConvPasses Conv2d::passes() const { return {training_ && input_needs_grad(0), training_}; }

void Conv2d::backward(Kernels& k, const OpTensors& t) {
  if (t.din[0].defined())
    k.conv2d_backward_data(a_.conv, t.dout[0], t.params[0], t.din[0], t.din_accumulate[0], t.workspace);
  k.conv2d_backward_filter(a_.conv, t.in[0], t.dout[0], t.dparams[0], t.workspace);
}

std::int64_t Conv2d::flops(Pass p) const {
  // Backward: the filter gradient always, the data gradient where the input needs one; each
  // costs as much as the forward pass.
  return 2 * macs() * (p == Pass::forward ? 1 : (input_needs_grad(0) ? 2 : 1));
}

std::int64_t Conv2d::bytes(Pass p) const {
  const std::int64_t x = in_[0].numel(), y = out_[0].numel();
  const std::int64_t w = a_.out_channels * (in_[0].shape[1] / a_.conv.groups) * a_.kernel_h * a_.kernel_w;
  if (p == Pass::forward) return (x + w + y) * element_bytes();
  const std::int64_t filter = x + y + w, data = input_needs_grad(0) ? y + w + x : 0;
  return (filter + data) * element_bytes();
}

// ---- batchnorm2d

std::vector<Tensor> BatchNorm2d::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  require(in[0].shape.rank() == 4, "input must be [N, C, H, W], got " + in[0].shape.to_string());
  require_float(in[0]);
  require(d_.epsilon > 0, "epsilon must be > 0");
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

std::vector<ParamSpec> BatchNorm2d::parameters() const {
  const Shape c{in_.empty() ? 0 : in_[0].shape[1]};
  const DType t = in_.empty() ? DType::f32 : wide_dtype(in_[0].dtype);
  return {{"weight", c, ParamRole::norm_scale, {ParamInit::Dist::ones, 0}, t},
          {"bias", c, ParamRole::norm_shift, {ParamInit::Dist::zeros, 0}, t},
          {"running_mean", c, ParamRole::running_stat, {ParamInit::Dist::zeros, 0}, t},
          {"running_var", c, ParamRole::running_stat, {ParamInit::Dist::ones, 0}, t}};
}

std::vector<Tensor> BatchNorm2d::saved() const {
  const Tensor c = Tensor::describe(wide_dtype(in_[0].dtype), Shape{in_[0].shape[1]});
  return {c, c};
}

void BatchNorm2d::forward(Kernels& k, const OpTensors& t) {
  const auto& p = t.params;
  if (t.training)
    k.batchnorm_forward_training(d_, t.in[0], p[0], p[1], p[2], p[3], t.out[0], t.saved[0], t.saved[1]);
  else
    k.batchnorm_forward_inference(d_, t.in[0], p[0], p[1], p[2], p[3], t.out[0]);
}

void BatchNorm2d::backward(Kernels& k, const OpTensors& t) {
  k.batchnorm_backward(d_, t.in[0], t.dout[0], t.params[0], t.saved[0], t.saved[1], t.din[0],
                       t.din_accumulate.empty() ? false : t.din_accumulate[0], t.dparams[0], t.dparams[1]);
}

std::int64_t BatchNorm2d::flops(Pass p) const {
  // Per element: training forward 6 (sum, sum of squares, normalise, scale and shift), inference
  // forward 2 (one folded scale and shift), backward 9 (two reductions and the data gradient).
  const std::int64_t n = in_[0].numel();
  if (p == Pass::backward) return 9 * n;
  return (training_ ? 6 : 2) * n;
}

std::int64_t BatchNorm2d::bytes(Pass p) const {
  const std::int64_t n = in_[0].numel(), c = in_[0].shape[1];
  const std::int64_t e = element_bytes(), ec = bytes_of(wide_dtype(in_[0].dtype));  // data; per-channel
  if (p == Pass::backward) return (2 * n + (input_needs_grad(0) ? n : 0)) * e + 5 * c * ec;
  // Training reads gamma, beta and the running statistics and writes them and the saved pair.
  return 2 * n * e + (training_ ? 8 : 4) * c * ec;
}

// ---- bn_act

std::vector<Tensor> BatchNormActivation::do_infer(const std::vector<Tensor>& in) {
  require(!in.empty(), "takes x and an optional residual, got no inputs");
  std::vector<Tensor> out = bn_.infer({in[0]});  // batch norm's rules on x
  require_optional_residual(in, out[0].shape);
  return out;
}

std::vector<ParamSpec> BatchNormActivation::parameters() const { return bn_.parameters(); }

std::vector<Tensor> BatchNormActivation::saved() const {
  std::vector<Tensor> s = bn_.saved();  // the batch mean and 1 / sqrt(var + eps), then the mask
  s.push_back(Tensor::describe(DType::i32, Shape{bn_activation_mask_words(in_[0].shape)}));
  return s;
}

std::int64_t BatchNormActivation::prepare(Kernels& k, const OpTensors& d) {
  Op::prepare(k, d);
  return training_ ? k.batchnorm_activation_prepare(d.in[0], residual() ? d.in[1] : Tensor{}, d.saved[2]) : 0;
}

void BatchNormActivation::forward(Kernels& k, const OpTensors& t) {
  const auto& p = t.params;
  const Tensor z = residual() ? t.in[1] : Tensor{};
  if (t.training) {
    k.batchnorm_activation_forward_training(d_, t.in[0], z, p[0], p[1], p[2], p[3], t.out[0], t.saved[0],
                                            t.saved[1], t.saved[2]);
    return;
  }
  k.batchnorm_forward_inference(d_, t.in[0], p[0], p[1], p[2], p[3], t.out[0]);
  if (z.defined()) k.add_forward(t.out[0], z, t.out[0]);
  k.relu_forward(t.out[0], t.out[0]);
}

void BatchNormActivation::backward(Kernels& k, const OpTensors& t) {
  const bool z = residual();
  k.batchnorm_activation_backward(d_, t.in[0], t.out[0], t.dout[0], t.params[0], t.params[1], t.saved[0],
                                  t.saved[1], t.saved[2], z, t.din[0], t.din_accumulate[0], z ? t.din[1] : Tensor{},
                                  z && t.din_accumulate[1], t.dparams[0], t.dparams[1], t.workspace);
}

std::int64_t BatchNormActivation::flops(Pass p) const {
  // Batch norm's (BatchNorm2d::flops), plus per element the residual add and the ReLU's compare.
  const std::int64_t n = in_[0].numel(), extra = (residual() ? 1 : 0) + 1;
  if (p == Pass::backward) return (9 + 1) * n;
  return ((training_ ? 6 : 2) + extra) * n;
}

std::int64_t BatchNormActivation::bytes(Pass p) const {
  const std::int64_t n = in_[0].numel(), c = in_[0].shape[1];
  const std::int64_t e = element_bytes(), ec = bytes_of(wide_dtype(in_[0].dtype));
  const std::int64_t z = residual() ? n : 0;
  // Backward reads x, y and dy and writes dx (and dz); forward reads x (and z) and writes y.
  if (p == Pass::backward) return (3 * n + (input_needs_grad(0) ? n : 0) + z) * e + 5 * c * ec;
  return (2 * n + z) * e + (training_ ? 8 : 4) * c * ec;
}

// ---- bias_act

std::vector<Tensor> BiasActivation::do_infer(const std::vector<Tensor>& in) {
  require(!in.empty(), "takes x and an optional residual, got no inputs");
  require(in[0].shape.rank() == 4, "input must be [N, C, H, W], got " + in[0].shape.to_string());
  require_float(in[0]);
  require_optional_residual(in, in[0].shape);
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

std::vector<ParamSpec> BiasActivation::parameters() const {
  // Zeros, as the batch norm's shift it replaces; a folded graph gets its values from
  // models::fold_batchnorm_parameters, not from this initialisation.
  const Shape c{in_.empty() ? 0 : in_[0].shape[1]};
  const DType t = in_.empty() ? DType::f32 : wide_dtype(in_[0].dtype);
  return {{"bias", c, ParamRole::bias, {ParamInit::Dist::zeros, 0}, t}};
}

std::int64_t BiasActivation::prepare(Kernels& k, const OpTensors& d) {
  if (training_) fail("is inference only (a folded batch norm); build the graph with training = false");
  return Op::prepare(k, d);
}

void BiasActivation::forward(Kernels& k, const OpTensors& t) {
  k.bias_activation_forward(t.in[0], t.params[0], t.in.size() > 1 ? t.in[1] : Tensor{}, t.out[0], relu_);
}

void BiasActivation::backward(Kernels&, const OpTensors&) {
  fail("has no backward: it exists only in inference graphs");
}

std::int64_t BiasActivation::flops(Pass p) const {
  if (p == Pass::backward) return 0;
  // Per element: the bias add, the residual add, the ReLU's compare.
  return (1 + (in_.size() > 1 ? 1 : 0) + (relu_ ? 1 : 0)) * in_[0].numel();
}

std::int64_t BiasActivation::bytes(Pass p) const {
  if (p == Pass::backward) return 0;
  const std::int64_t n = in_[0].numel(), c = in_[0].shape[1];
  const auto tensors = static_cast<std::int64_t>(in_.size()) + 1;  // x (+ residual), y
  return tensors * n * element_bytes() + c * bytes_of(wide_dtype(in_[0].dtype));
}

// ---- conv_bias_act

std::vector<Tensor> ConvBiasActivation::do_infer(const std::vector<Tensor>& in) {
  require(!in.empty(), "takes x and an optional residual, got no inputs");
  std::vector<Tensor> out = conv_.infer({in[0]});  // the convolution's rules on x
  require_optional_residual(in, out[0].shape);
  return out;
}

std::vector<ParamSpec> ConvBiasActivation::parameters() const {
  std::vector<ParamSpec> p = conv_.parameters();
  // Zeros, as the batch norm's shift it replaces: values come from models::fold_batchnorm_parameters.
  p.push_back({"bias", Shape{conv_.attrs().out_channels}, ParamRole::bias, {ParamInit::Dist::zeros, 0},
               in_.empty() ? DType::f32 : in_[0].dtype});
  return p;
}

std::int64_t ConvBiasActivation::prepare(Kernels& k, const OpTensors& d) {
  if (training_) fail("is inference only (a folded batch norm); build the graph with training = false");
  Op::prepare(k, d);
  const Tensor residual = d.in.size() > 1 ? d.in[1] : Tensor{};
  if (const auto ws = prepare_fp8(fp8_, [&] {
        return k.conv2d_fp8_prepare(attrs().conv, d.in[0], d.params[0], d.params[1], residual, d.out[0], relu_);
      }))
    return *ws;
  return k.conv2d_bias_activation_prepare(attrs().conv, d.in[0], d.params[0], d.params[1], residual, d.out[0], relu_);
}

void ConvBiasActivation::forward(Kernels& k, const OpTensors& t) {
  const Tensor residual = t.in.size() > 1 ? t.in[1] : Tensor{};
  if (fp8_.runs)
    k.conv2d_fp8_forward(attrs().conv, t.in[0], t.params[0], t.params[1], residual, t.out[0], relu_, t.workspace);
  else
    k.conv2d_bias_activation_forward(attrs().conv, t.in[0], t.params[0], t.params[1], residual, t.out[0], relu_,
                                     t.workspace);
}

void ConvBiasActivation::backward(Kernels&, const OpTensors&) {
  fail("has no backward: it exists only in inference graphs");
}

std::int64_t ConvBiasActivation::flops(Pass p) const {
  if (p == Pass::backward) return 0;
  // The convolution, then per output element the bias add, the residual add and the ReLU's compare.
  return conv_.flops(Pass::forward) + (1 + (in_.size() > 1 ? 1 : 0) + (relu_ ? 1 : 0)) * out_[0].numel();
}

std::int64_t ConvBiasActivation::bytes(Pass p) const {
  if (p == Pass::backward) return 0;
  // x, w and y once each, the bias, and the residual where there is one: the epilogue moves no
  // extra pass over y.
  const std::int64_t epilogue = conv_.attrs().out_channels + (in_.size() > 1 ? in_[1].numel() : 0);  // elements
  // Before prepare (or where the backend refused) the 16-bit formula holds.
  if (!fp8_.runs) return conv_.bytes(Pass::forward) + epilogue * element_bytes();
  return fp8_forward_bytes(in_[0].numel(), conv_.parameters()[0].shape.numel(), out_[0].numel() + epilogue,
                           element_bytes());
}

// ---- linear

std::vector<Tensor> Linear::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  require(in[0].shape.rank() == 2, "input must be [N, features], got " + in[0].shape.to_string());
  require_float(in[0]);
  require(out_features_ >= 1, "out_features must be >= 1");
  return {Tensor::describe(in[0].dtype, Shape{in[0].shape[0], out_features_})};
}

std::vector<ParamSpec> Linear::parameters() const {
  const std::int64_t fan_in = in_.empty() ? 0 : in_[0].shape[1];
  // PyTorch's nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  const DType t = in_.empty() ? DType::f32 : in_[0].dtype;
  const ParamInit uniform{ParamInit::Dist::uniform, bound};
  std::vector<ParamSpec> p{
      {"weight", Shape{out_features_, fan_in}, ParamRole::weight, weight_init_.value_or(uniform), t}};
  if (bias_) p.push_back({"bias", Shape{out_features_}, ParamRole::bias, weight_init_ ? ParamInit{} : uniform, t});
  return p;
}

std::int64_t Linear::macs() const { return in_[0].shape[0] * in_[0].shape[1] * out_features_; }

std::int64_t Linear::prepare(Kernels& k, const OpTensors& d) {
  const std::int64_t plain = Op::prepare(k, d);
  if (fp8_.asked && training_) fail("runs fp8 in inference graphs only; build the graph with training = false");
  if (const auto ws = prepare_fp8(fp8_, [&] {
        return k.conv2d_fp8_prepare(Conv2dDesc{}, fp8_linear_view(d.in[0]), fp8_linear_view(d.params[0]),
                                    bias_ ? d.params[1] : Tensor{}, Tensor{}, fp8_linear_view(d.out[0]), false);
      }))
    return std::max(plain, *ws);
  return plain;
}

void Linear::forward(Kernels& k, const OpTensors& t) {
  if (fp8_.runs)
    k.conv2d_fp8_forward(Conv2dDesc{}, fp8_linear_view(t.in[0]), fp8_linear_view(t.params[0]),
                         bias_ ? t.params[1] : Tensor{}, Tensor{}, fp8_linear_view(t.out[0]), false, t.workspace);
  else
    k.linear_forward(t.in[0], t.params[0], bias_ ? t.params[1] : Tensor{}, t.out[0]);
}

void Linear::backward(Kernels& k, const OpTensors& t) {
  if (t.din[0].defined()) k.linear_backward_data(t.dout[0], t.params[0], t.din[0], t.din_accumulate[0]);
  k.linear_backward_weights(t.in[0], t.dout[0], t.dparams[0], bias_ ? t.dparams[1] : Tensor{});
}

std::int64_t Linear::flops(Pass p) const {
  const std::int64_t bias = bias_ ? in_[0].shape[0] * out_features_ : 0;
  if (p == Pass::forward) return 2 * macs() + bias;
  return 2 * macs() * (input_needs_grad(0) ? 2 : 1) + bias;
}

std::int64_t Linear::bytes(Pass p) const {
  const std::int64_t x = in_[0].numel(), y = out_[0].numel(), w = out_features_ * in_[0].shape[1];
  const std::int64_t b = bias_ ? out_features_ : 0;
  if (p == Pass::forward && fp8_.runs) return fp8_forward_bytes(x, w, b + y, element_bytes());
  if (p == Pass::forward) return (x + w + b + y) * element_bytes();
  const std::int64_t data = input_needs_grad(0) ? y + w + x : 0;
  return (data + x + y + w + b) * element_bytes();
}

}  // namespace ab::nn
