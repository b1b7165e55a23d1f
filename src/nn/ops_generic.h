// The generic inference ops (ONNX import; builders in nn/ops.h): forward only. Each refuses a
// training graph at bind (prepare) and throws if backward is called; shapes are logical (rank 4 is
// NCHW whatever GraphOptions::layout), and every kernel reads strides, so each op runs in either
// layout. Costs: docs/ENGINE.md (forward only; backward 0).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/op.h"

namespace ab::nn {

class InferenceOp : public Op {
 public:
  using Op::Op;
  std::int64_t prepare(Kernels& k, const OpTensors& descs) override;  // refuses a training graph
  void backward(Kernels& k, const OpTensors& t) override;             // throws Error
  // A rank-4 output keeps the layout of the first input of its shape (an element-wise op then
  // walks both in one order), else takes the graph's.
  Layout output_layout(std::size_t slot, Layout graph) const override;
  bool reads_any_layout() const final { return true; }
  std::int64_t flops(Pass p) const final { return p == Pass::forward ? forward_flops() : 0; }
  std::int64_t bytes(Pass p) const final { return p == Pass::forward ? forward_bytes() : 0; }

 protected:
  virtual std::int64_t forward_flops() const { return 0; }
  virtual std::int64_t forward_bytes() const;  // every input and output once
  void require_inputs(const std::vector<Tensor>& in, std::size_t n) const;
  // Normalises a possibly negative axis of a rank-`rank` tensor, refusing one out of range.
  int axis_in(int axis, int rank) const;
};

class Unary final : public InferenceOp {
 public:
  Unary(std::string name, const UnaryAttrs& a) : InferenceOp(std::move(name)), a_(a) {}
  std::string_view kind() const override;  // the function's name: "sigmoid", "hard_swish", ...
  void forward(Kernels& k, const OpTensors& t) override { k.unary_forward(a_, t.in[0], t.out[0]); }

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  std::int64_t forward_flops() const override;
  UnaryAttrs a_;
};

class Binary final : public InferenceOp {
 public:
  Binary(std::string name, BinaryKind kind) : InferenceOp(std::move(name)), kind_(kind) {}
  std::string_view kind() const override;  // "binary_add", "binary_mul", ...
  void forward(Kernels& k, const OpTensors& t) override { k.binary_forward(kind_, t.in[0], t.in[1], t.out[0]); }

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  std::int64_t forward_flops() const override { return out_[0].numel(); }
  BinaryKind kind_;
};

class Where final : public InferenceOp {
 public:
  using InferenceOp::InferenceOp;
  std::string_view kind() const override { return "where"; }
  void forward(Kernels& k, const OpTensors& t) override { k.where_forward(t.in[0], t.in[1], t.in[2], t.out[0]); }

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  std::int64_t forward_flops() const override { return out_[0].numel(); }  // one select
};

// A tensor held as a non-trainable parameter "value" (role running_stat: no optimizer sees it),
// initialised by bind to the values given here; forward copies it into the op's output.
class Constant final : public InferenceOp {
 public:
  Constant(std::string name, const Shape& shape, std::vector<double> values, DType dtype);
  std::string_view kind() const override { return "constant"; }
  std::vector<ParamSpec> parameters() const override;
  std::vector<double> initial_values(std::size_t) const override { return values_; }
  void forward(Kernels& k, const OpTensors& t) override { k.copy_strided(t.params[0], t.out[0]); }

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  std::int64_t forward_bytes() const override;
  Shape shape_;
  std::vector<double> values_;
  DType dtype_;
};

class Concat final : public InferenceOp {
 public:
  Concat(std::string name, int axis) : InferenceOp(std::move(name)), axis_(axis) {}
  std::string_view kind() const override { return "concat"; }
  void forward(Kernels& k, const OpTensors& t) override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  int axis_;
};

class Split final : public InferenceOp {
 public:
  Split(std::string name, int axis, std::vector<std::int64_t> sizes)
      : InferenceOp(std::move(name)), axis_(axis), sizes_(std::move(sizes)) {}
  std::string_view kind() const override { return "split"; }
  void forward(Kernels& k, const OpTensors& t) override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  int axis_;
  std::vector<std::int64_t> sizes_;
};

// x viewed through a different shape and strides (slice, transpose, expand), copied to the output;
// relayout copies x into the graph's layout (the builder's, before a built-in op).
class ViewCopy final : public InferenceOp {
 public:
  enum class Mode { slice, transpose, expand, reshape, relayout };
  ViewCopy(std::string name, Mode mode, std::vector<std::int64_t> a, std::vector<std::int64_t> b = {},
           std::vector<std::int64_t> c = {})
      : InferenceOp(std::move(name)), mode_(mode), a_(std::move(a)), b_(std::move(b)), c_(std::move(c)) {}
  std::string_view kind() const override;
  void forward(Kernels& k, const OpTensors& t) override { k.copy_strided(source(t.in[0]), t.out[0]); }
  // A reshape or transpose stores a rank-4 output where the copy keeps the bytes as they lie: a
  // reshape of a row-major x row-major, a transpose in the layout of x's permuted strides.
  Layout output_layout(std::size_t slot, Layout graph) const override;
  // Whether copying x to y would write x's bytes as they lie (a reshape between row-major tensors,
  // a transpose whose permuted strides are y's): the graph may then make y x's bytes.
  bool keeps_bytes(const Tensor& x, const Tensor& y) const;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  Tensor source(const Tensor& x) const;  // the view of x whose logical order is the output's
  Mode mode_;
  // slice: starts, ends, steps; transpose: perm; expand and reshape: the shape.
  std::vector<std::int64_t> a_, b_, c_;
};

class Pad final : public InferenceOp {
 public:
  Pad(std::string name, std::vector<std::int64_t> begins, std::vector<std::int64_t> ends, double value)
      : InferenceOp(std::move(name)), begins_(std::move(begins)), ends_(std::move(ends)), value_(value) {}
  std::string_view kind() const override { return "pad"; }
  void forward(Kernels& k, const OpTensors& t) override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  std::int64_t forward_bytes() const override;  // the fill writes y, the copy reads x's kept part and writes it again
  std::int64_t kept_elements() const;
  std::vector<std::int64_t> begins_, ends_;
  double value_;
};

class Softmax final : public InferenceOp {
 public:
  Softmax(std::string name, int axis) : InferenceOp(std::move(name)), axis_(axis) {}
  std::string_view kind() const override { return "softmax"; }
  void forward(Kernels& k, const OpTensors& t) override { k.softmax_forward(axis_, t.in[0], t.out[0]); }

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  // Per element: max, subtract, exp, sum, divide.
  std::int64_t forward_flops() const override { return 5 * in_[0].numel(); }
  int axis_;
};

class ReduceMean final : public InferenceOp {
 public:
  ReduceMean(std::string name, std::vector<int> axes, bool keepdims)
      : InferenceOp(std::move(name)), axes_(std::move(axes)), keepdims_(keepdims) {}
  std::string_view kind() const override { return "reduce_mean"; }
  void forward(Kernels& k, const OpTensors& t) override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  std::int64_t forward_flops() const override {
    return in_[0].numel() + out_[0].numel();
  }  // adds, one divide per output
  std::vector<int> axes_;
  bool keepdims_;
};

class AvgPool2d final : public InferenceOp {
 public:
  AvgPool2d(std::string name, const Pool2dDesc& d, bool count_include_pad)
      : InferenceOp(std::move(name)), d_(d), count_include_pad_(count_include_pad) {}
  std::string_view kind() const override { return "avgpool2d"; }
  void forward(Kernels& k, const OpTensors& t) override {
    k.avgpool_forward(d_, count_include_pad_, t.in[0], t.out[0]);
  }

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  std::int64_t forward_flops() const override { return out_[0].numel() * (d_.window_h * d_.window_w + 1); }
  Pool2dDesc d_;
  bool count_include_pad_;
};

class Resize final : public InferenceOp {
 public:
  Resize(std::string name, std::int64_t out_h, std::int64_t out_w, bool linear)
      : InferenceOp(std::move(name)), out_h_(out_h), out_w_(out_w), linear_(linear) {}
  std::string_view kind() const override { return linear_ ? "resize_linear" : "resize_nearest"; }
  void forward(Kernels& k, const OpTensors& t) override { k.resize_forward(linear_, t.in[0], t.out[0]); }

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  // Bilinear: two lerps along W and one along H, 3 FLOPs each; nearest copies.
  std::int64_t forward_flops() const override { return linear_ ? 9 * out_[0].numel() : 0; }
  std::int64_t out_h_, out_w_;
  bool linear_;
};

// Operands that are not contiguous row-major (a rank-4 tensor of an NHWC graph) are staged
// through the workspace, as Kernels::matmul_forward takes row-major operands.
class MatMul final : public InferenceOp {
 public:
  using InferenceOp::InferenceOp;
  std::string_view kind() const override { return "matmul"; }
  std::int64_t prepare(Kernels& k, const OpTensors& descs) override;
  void forward(Kernels& k, const OpTensors& t) override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  std::int64_t forward_flops() const override;
  std::int64_t forward_bytes() const override;
};

class Gather final : public InferenceOp {
 public:
  Gather(std::string name, int axis) : InferenceOp(std::move(name)), axis_(axis) {}
  std::string_view kind() const override { return "gather"; }
  void forward(Kernels& k, const OpTensors& t) override { k.gather_forward(axis_, t.in[0], t.in[1], t.out[0]); }

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  std::int64_t forward_bytes() const override;  // the indices, the rows gathered, the output
  int axis_;
};

// LayerNorm over dims axis..end (ONNX's LayerNormalization) through Kernels::layernorm_forward on
// the [rows, normalised size] view; statistics (and, for a view that is not row-major, the staged
// x and y) live in the workspace.
class LayerNormAxis final : public InferenceOp {
 public:
  LayerNormAxis(std::string name, int axis, double epsilon)
      : InferenceOp(std::move(name)), axis_(axis), desc_{epsilon} {}
  std::string_view kind() const override { return "layer_norm"; }
  std::vector<ParamSpec> parameters() const override;  // weight, bias of the normalised shape
  std::int64_t prepare(Kernels& k, const OpTensors& descs) override;
  void forward(Kernels& k, const OpTensors& t) override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& in) override;
  std::int64_t forward_flops() const override { return 5 * in_[0].numel(); }  // as the layernorm op
  std::int64_t forward_bytes() const override;
  std::int64_t rows() const;
  int axis_;
  LayerNormDesc desc_;
};

}  // namespace ab::nn
