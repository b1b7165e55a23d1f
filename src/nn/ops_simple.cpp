// Layers without parameters (ReLU, residual add, pooling, the loss) and the builder helpers.
// Cost rules: docs/ENGINE.md.
#include "nn/ops.h"

namespace ab::nn {

// ---- relu

std::vector<Tensor> Relu::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  require_float(in[0]);
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

void Relu::forward(Kernels& k, const OpTensors& t) { k.relu_forward(t.in[0], t.out[0]); }

void Relu::backward(Kernels& k, const OpTensors& t) {
  if (t.din[0].defined()) k.relu_backward(t.out[0], t.dout[0], t.din[0], t.din_accumulate[0]);
}

std::int64_t Relu::flops(Pass) const { return in_[0].numel(); }  // one compare (and select) per element

std::int64_t Relu::bytes(Pass p) const {
  return (p == Pass::forward ? 2 : 3) * in_[0].numel() * element_bytes();
}

// ---- add

std::vector<Tensor> Add::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 2, "takes two inputs, got " + std::to_string(in.size()));
  require(in[0].shape == in[1].shape,
          "input shapes " + in[0].shape.to_string() + " and " + in[1].shape.to_string() + " differ");
  require(in[0].dtype == in[1].dtype, "input dtypes differ");
  require_float(in[0]);
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

void Add::forward(Kernels& k, const OpTensors& t) { k.add_forward(t.in[0], t.in[1], t.out[0]); }

void Add::backward(Kernels& k, const OpTensors& t) {
  // In slot order, so that an add of a value to itself overwrites then accumulates. An input
  // gradient in the output gradient's own buffer (the planner's sharing) already holds it.
  for (std::size_t i = 0; i < 2; ++i)
    if (t.din[i].defined() && !(t.din[i].data == t.dout[0].data && !t.din_accumulate[i]))
      k.copy_gradient(t.dout[0], t.din[i], t.din_accumulate[i]);
}

std::int64_t Add::flops(Pass p) const { return p == Pass::forward ? in_[0].numel() : 0; }

std::int64_t Add::bytes(Pass p) const {
  const std::int64_t n = in_[0].numel();
  if (p == Pass::forward) return 3 * n * element_bytes();
  const std::int64_t copies = (input_needs_grad(0) && !shares_gradient(0) ? 1 : 0) +
                              (input_needs_grad(1) && !shares_gradient(1) ? 1 : 0);
  return 2 * n * copies * element_bytes();
}

// ---- maxpool2d

std::vector<Tensor> MaxPool2d::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  const Tensor& x = in[0];
  require(x.shape.rank() == 4, "input must be [N, C, H, W], got " + x.shape.to_string());
  require_float(x);
  require(d_.window_h >= 1 && d_.window_w >= 1 && d_.stride_h >= 1 && d_.stride_w >= 1,
          "window and stride must be >= 1");
  // PyTorch's rule; it also guarantees every window holds at least one real element.
  require(d_.pad_h >= 0 && d_.pad_w >= 0 && 2 * d_.pad_h <= d_.window_h && 2 * d_.pad_w <= d_.window_w,
          "padding must be between 0 and half the window");
  const std::int64_t oh = (x.shape[2] + 2 * d_.pad_h - d_.window_h) / d_.stride_h + 1;
  const std::int64_t ow = (x.shape[3] + 2 * d_.pad_w - d_.window_w) / d_.stride_w + 1;
  require(x.shape[2] + 2 * d_.pad_h >= d_.window_h && x.shape[3] + 2 * d_.pad_w >= d_.window_w,
          "window larger than the padded input " + x.shape.to_string());
  return {Tensor::describe(x.dtype, Shape{x.shape[0], x.shape[1], oh, ow})};
}

void MaxPool2d::forward(Kernels& k, const OpTensors& t) { k.maxpool_forward(d_, t.in[0], t.out[0]); }

void MaxPool2d::backward(Kernels& k, const OpTensors& t) {
  if (t.din[0].defined()) k.maxpool_backward(d_, t.in[0], t.out[0], t.dout[0], t.din[0], t.din_accumulate[0]);
}

std::int64_t MaxPool2d::flops(Pass) const {
  return out_[0].numel() * d_.window_h * d_.window_w;  // one compare per window element
}

std::int64_t MaxPool2d::bytes(Pass p) const {
  const std::int64_t x = in_[0].numel(), y = out_[0].numel();
  return (p == Pass::forward ? x + y : 2 * x + 2 * y) * element_bytes();
}

// ---- global_avgpool

std::vector<Tensor> GlobalAvgPool::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  require(in[0].shape.rank() == 4, "input must be [N, C, H, W], got " + in[0].shape.to_string());
  require_float(in[0]);
  return {Tensor::describe(in[0].dtype, Shape{in[0].shape[0], in[0].shape[1]})};
}

void GlobalAvgPool::forward(Kernels& k, const OpTensors& t) { k.global_avgpool_forward(t.in[0], t.out[0]); }

void GlobalAvgPool::backward(Kernels& k, const OpTensors& t) {
  if (t.din[0].defined()) k.global_avgpool_backward(t.dout[0], t.din[0], t.din_accumulate[0]);
}

std::int64_t GlobalAvgPool::flops(Pass p) const {
  // Forward: one add per input element and one scale per output; backward: one scale per element.
  return in_[0].numel() + (p == Pass::forward ? out_[0].numel() : 0);
}

std::int64_t GlobalAvgPool::bytes(Pass) const { return (in_[0].numel() + out_[0].numel()) * element_bytes(); }

// ---- softmax_cross_entropy

std::vector<Tensor> SoftmaxCrossEntropy::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 2, "takes logits and labels, got " + std::to_string(in.size()) + " inputs");
  const Tensor& z = in[0];
  require(z.shape.rank() == 2, "logits must be [N, classes], got " + z.shape.to_string());
  require(is_float(z.dtype), "logits dtype " + std::string(to_string(z.dtype)) + " is not a floating type");
  require(in[1].dtype == DType::i32, "labels must be i32, got " + std::string(to_string(in[1].dtype)));
  require(in[1].shape == Shape{z.shape[0]},
          "labels must be [" + std::to_string(z.shape[0]) + "], got " + in[1].shape.to_string());
  return {Tensor::describe(wide_dtype(z.dtype), Shape{1})};
}

std::vector<Tensor> SoftmaxCrossEntropy::saved() const {
  return {Tensor::describe(wide_dtype(in_[0].dtype), in_[0].shape)};
}

void SoftmaxCrossEntropy::forward(Kernels& k, const OpTensors& t) {
  k.softmax_cross_entropy_forward(t.in[0], t.in[1], t.saved[0], t.out[0]);
}

void SoftmaxCrossEntropy::backward(Kernels& k, const OpTensors& t) {
  if (t.din[0].defined()) k.softmax_cross_entropy_backward(t.saved[0], t.in[1], t.dout[0], t.din[0], t.din_accumulate[0]);
}

std::int64_t SoftmaxCrossEntropy::flops(Pass p) const {
  // Forward per logit: max, subtract, exp, sum, divide (exp counted as one); per row: log, pick,
  // subtract. Backward per logit: subtract the one-hot, scale.
  const std::int64_t nk = in_[0].numel(), n = in_[0].shape[0];
  return p == Pass::forward ? 5 * nk + 3 * n : 2 * nk;
}

std::int64_t SoftmaxCrossEntropy::bytes(Pass p) const {
  // Logits and their gradient in the data type e; probabilities and the loss in w (f32 for 16-bit).
  const std::int64_t nk = in_[0].numel(), n = in_[0].shape[0], e = element_bytes();
  const std::int64_t w = bytes_of(wide_dtype(in_[0].dtype));
  if (p == Pass::forward) return nk * e + (nk + 1) * w + 4 * n;  // logits, probs, loss; i32 labels
  return nk * w + nk * e + 4 * n + w;                             // probs, dlogits, labels, dloss
}

// ---- builder helpers

Value conv2d(GraphBuilder& b, const std::string& name, Value x, const Conv2dAttrs& a) {
  return b.add1(std::make_unique<Conv2d>(name, a), {x});
}
Value batchnorm2d(GraphBuilder& b, const std::string& name, Value x, const BatchNormDesc& d) {
  return b.add1(std::make_unique<BatchNorm2d>(name, d), {x});
}
Value relu(GraphBuilder& b, const std::string& name, Value x) { return b.add1(std::make_unique<Relu>(name), {x}); }
Value batchnorm_activation(GraphBuilder& b, const std::string& name, Value x, Value residual, const BatchNormDesc& d) {
  auto op = std::make_unique<BatchNormActivation>(name, d);
  return residual.id < 0 ? b.add1(std::move(op), {x}) : b.add1(std::move(op), {x, residual});
}
Value add(GraphBuilder& b, const std::string& name, Value x, Value y) {
  return b.add1(std::make_unique<Add>(name), {x, y});
}
Value bias_activation(GraphBuilder& b, const std::string& name, Value x, Value residual, bool relu) {
  auto op = std::make_unique<BiasActivation>(name, relu);
  return residual.id < 0 ? b.add1(std::move(op), {x}) : b.add1(std::move(op), {x, residual});
}
Value conv_bias_activation(GraphBuilder& b, const std::string& name, Value x, const Conv2dAttrs& a, Value residual,
                           bool relu, bool fp8) {
  auto op = std::make_unique<ConvBiasActivation>(name, a, relu, fp8);
  return residual.id < 0 ? b.add1(std::move(op), {x}) : b.add1(std::move(op), {x, residual});
}
Value maxpool2d(GraphBuilder& b, const std::string& name, Value x, const Pool2dDesc& d) {
  return b.add1(std::make_unique<MaxPool2d>(name, d), {x});
}
Value global_avgpool(GraphBuilder& b, const std::string& name, Value x) {
  return b.add1(std::make_unique<GlobalAvgPool>(name), {x});
}
Value linear(GraphBuilder& b, const std::string& name, Value x, std::int64_t out_features, bool bias, bool fp8,
             std::optional<ParamInit> weight_init) {
  return b.add1(std::make_unique<Linear>(name, out_features, bias, fp8, weight_init), {x});
}
Value softmax_cross_entropy(GraphBuilder& b, const std::string& name, Value logits, Value labels) {
  return b.add1(std::make_unique<SoftmaxCrossEntropy>(name), {logits, labels});
}

}  // namespace ab::nn
