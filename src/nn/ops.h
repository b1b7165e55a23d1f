// The layers of the engine and one-line helpers that add them to a graph. Each op is a thin
// adapter between the graph's bound tensors and the Kernels contract, plus its cost model.
#pragma once

#include <cstdint>
#include <string>

#include "nn/graph.h"
#include "nn/op.h"

namespace ab::nn {

struct Conv2dAttrs {
  std::int64_t out_channels = 1;
  std::int64_t kernel_h = 1, kernel_w = 1;
  Conv2dDesc conv;  // stride, padding, dilation, groups
};

// No bias: in the models here a batch norm follows every convolution.
class Conv2d final : public Op {
 public:
  Conv2d(std::string name, const Conv2dAttrs& a) : Op(std::move(name)), a_(a) {}
  std::string_view kind() const override { return "conv2d"; }
  std::vector<ParamSpec> parameters() const override;
  bool backward_reads_input(int i) const override { return i == 0; }
  std::int64_t prepare(Kernels& k, const OpTensors& descs) override;
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;
  std::int64_t macs() const;  // multiply-adds of the forward pass
  const Conv2dAttrs& attrs() const { return a_; }
  // The backward passes backward() runs in the graph's context (set_context), which prepare asks for.
  ConvPasses passes() const;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  Conv2dAttrs a_;
};

class BatchNorm2d final : public Op {
 public:
  BatchNorm2d(std::string name, const BatchNormDesc& d = {}) : Op(std::move(name)), d_(d) {}
  std::string_view kind() const override { return "batchnorm2d"; }
  std::vector<ParamSpec> parameters() const override;  // weight, bias, running_mean, running_var
  std::vector<Tensor> saved() const override;           // batch mean and 1/sqrt(var + eps)
  bool backward_reads_input(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  BatchNormDesc d_;
};

class Relu final : public Op {
 public:
  using Op::Op;
  std::string_view kind() const override { return "relu"; }
  bool backward_reads_output(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
};

// The residual add: y = a + b, both of one shape.
class Add final : public Op {
 public:
  using Op::Op;
  std::string_view kind() const override { return "add"; }
  bool passes_gradient_through(int /*i*/) const override { return true; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
};

class MaxPool2d final : public Op {
 public:
  MaxPool2d(std::string name, const Pool2dDesc& d) : Op(std::move(name)), d_(d) {}
  std::string_view kind() const override { return "maxpool2d"; }
  bool backward_reads_input(int i) const override { return i == 0; }
  bool backward_reads_output(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  Pool2dDesc d_;
};

// [N, C, H, W] -> [N, C]: torchvision's AdaptiveAvgPool2d((1, 1)) followed by flatten.
class GlobalAvgPool final : public Op {
 public:
  using Op::Op;
  std::string_view kind() const override { return "global_avgpool"; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
};

// [N, in] -> [N, out] with weight [out, in] and bias [out], PyTorch's default initialisation.
class Linear final : public Op {
 public:
  Linear(std::string name, std::int64_t out_features, bool bias = true)
      : Op(std::move(name)), out_features_(out_features), bias_(bias) {}
  std::string_view kind() const override { return "linear"; }
  std::vector<ParamSpec> parameters() const override;
  bool backward_reads_input(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;
  std::int64_t macs() const;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  std::int64_t out_features_;
  bool bias_;
};

// (logits [N, K], labels [N] i32) -> mean loss [1]; keeps the probabilities for backward.
class SoftmaxCrossEntropy final : public Op {
 public:
  using Op::Op;
  std::string_view kind() const override { return "softmax_cross_entropy"; }
  std::vector<Tensor> saved() const override;
  bool backward_reads_input(int i) const override { return i == 1; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
};

// Helpers that add one layer to a graph and return its output.
Value conv2d(GraphBuilder& b, const std::string& name, Value x, const Conv2dAttrs& a);
Value batchnorm2d(GraphBuilder& b, const std::string& name, Value x, const BatchNormDesc& d = {});
Value relu(GraphBuilder& b, const std::string& name, Value x);
Value add(GraphBuilder& b, const std::string& name, Value x, Value y);
Value maxpool2d(GraphBuilder& b, const std::string& name, Value x, const Pool2dDesc& d);
Value global_avgpool(GraphBuilder& b, const std::string& name, Value x);
Value linear(GraphBuilder& b, const std::string& name, Value x, std::int64_t out_features, bool bias = true);
Value softmax_cross_entropy(GraphBuilder& b, const std::string& name, Value logits, Value labels);

}  // namespace ab::nn
