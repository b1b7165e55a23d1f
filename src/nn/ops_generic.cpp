// The generic inference ops' shape rules and forward calls: elementwise, constants and data
// movement. Every data movement is Kernels::copy_strided from a view of its input (nn/broadcast.h).
#include "nn/ops_generic.h"

#include <numeric>

#include "nn/broadcast.h"
#include "nn/generic_math.h"

namespace ab::nn {

namespace {

// The layout whose contiguous strides `strides` of `shape` are: the graph's where both layouts'
// are (a dim of size 1), the other where only its are, else the graph's.
Layout layout_of_strides(const Shape& shape, const Strides& strides, Layout graph) {
  const Layout other = graph == Layout::nchw ? Layout::nhwc : Layout::nchw;
  return !same_order(shape, strides, contiguous_strides(shape, graph)) &&
                 same_order(shape, strides, contiguous_strides(shape, other))
             ? other
             : graph;
}

bool row_major(const Tensor& t) { return same_order(t.shape, t.strides, contiguous_strides(t.shape, Layout::nchw)); }

}  // namespace

// ---- InferenceOp

Layout InferenceOp::output_layout(std::size_t slot, Layout graph) const {
  const Shape& shape = out_[slot].shape;
  for (const Tensor& x : in_)
    if (x.shape == shape) return layout_of_strides(shape, x.strides, graph);
  return graph;
}

std::int64_t InferenceOp::prepare(Kernels& k, const OpTensors& descs) {
  if (training_) fail("is inference only (no backward is built); build the graph with training = false");
  return Op::prepare(k, descs);
}

void InferenceOp::backward(Kernels&, const OpTensors&) { fail("has no backward: it exists only in inference graphs"); }

std::int64_t InferenceOp::forward_bytes() const {
  std::int64_t total = 0;
  for (const auto* group : {&in_, &out_})
    for (const Tensor& t : *group) total += t.numel() * bytes_of(t.dtype);
  return total;
}

void InferenceOp::require_inputs(const std::vector<Tensor>& in, std::size_t n) const {
  require(in.size() == n, "takes " + std::to_string(n) + " input(s), got " + std::to_string(in.size()));
}

int InferenceOp::axis_in(int axis, int rank) const {
  require(axis >= -rank && axis < rank,
          "axis " + std::to_string(axis) + " outside a rank-" + std::to_string(rank) + " tensor");
  return axis < 0 ? axis + rank : axis;
}

// ---- unary, binary, where

std::string_view Unary::kind() const {
  static constexpr std::string_view names[] = {"sigmoid", "hard_sigmoid", "hard_swish", "silu",      "leaky_relu",
                                               "clip",    "erf",          "gelu_erf",   "gelu_tanh", "sqrt",
                                               "exp",     "tanh",         "neg",        "abs",       "reciprocal"};
  return names[static_cast<int>(a_.kind)];
}

std::vector<Tensor> Unary::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 1);
  require_float(in[0]);
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

std::int64_t Unary::forward_flops() const { return unary_flops_per_element(a_.kind) * in_[0].numel(); }

std::string_view Binary::kind() const {
  static constexpr std::string_view names[] = {"binary_add", "binary_sub", "binary_mul", "binary_div",
                                               "binary_pow", "binary_max", "binary_min"};
  return names[static_cast<int>(kind_)];
}

std::vector<Tensor> Binary::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 2);
  require_float(in[0]);
  require(in[0].dtype == in[1].dtype, "input dtypes " + std::string(to_string(in[0].dtype)) + " and " +
                                          std::string(to_string(in[1].dtype)) + " differ");
  Shape out;
  require(broadcast_shapes(in[0].shape, in[1].shape, out),
          "input shapes " + in[0].shape.to_string() + " and " + in[1].shape.to_string() + " do not broadcast");
  return {Tensor::describe(in[0].dtype, out)};
}

std::vector<Tensor> Where::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 3);
  const DType c = in[0].dtype;
  require(c == DType::i8 || c == DType::i32 || c == DType::i64 || c == in[1].dtype,
          "the condition must be i8, i32, i64 or of the values' dtype, got " + std::string(to_string(c)));
  require_float(in[1]);
  require(in[1].dtype == in[2].dtype, "the values' dtypes differ");
  Shape out;
  require(broadcast_shapes(in[0].shape, in[1].shape, out) && broadcast_shapes(out, in[2].shape, out),
          "shapes " + in[0].shape.to_string() + ", " + in[1].shape.to_string() + ", " + in[2].shape.to_string() +
              " do not broadcast");
  return {Tensor::describe(in[1].dtype, out)};
}

// ---- constant

Constant::Constant(std::string name, const Shape& shape, std::vector<double> values, DType dtype)
    : InferenceOp(std::move(name)), shape_(shape), values_(std::move(values)), dtype_(dtype) {}

std::vector<Tensor> Constant::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 0);
  require(static_cast<std::int64_t>(values_.size()) == shape_.numel(),
          std::to_string(values_.size()) + " values for shape " + shape_.to_string());
  return {Tensor::describe(dtype_, shape_)};
}

std::vector<ParamSpec> Constant::parameters() const {
  return {{"value", shape_, ParamRole::running_stat, {ParamInit::Dist::zeros, 0.0}, dtype_}};
}

std::int64_t Constant::forward_bytes() const { return 2 * shape_.numel() * bytes_of(dtype_); }

// ---- concat, split

std::vector<Tensor> Concat::do_infer(const std::vector<Tensor>& in) {
  require(!in.empty(), "takes at least one input");
  const int axis = axis_in(axis_, in[0].shape.rank());
  Shape out = in[0].shape;
  out[axis] = 0;
  for (const Tensor& t : in) {
    bool same = t.shape.rank() == out.rank() && t.dtype == in[0].dtype;
    for (int d = 0; same && d < out.rank(); ++d) same = d == axis || t.shape[d] == out[d];
    require(same, "input " + t.to_string() + " does not match " + in[0].to_string() + " outside axis " +
                      std::to_string(axis));
    out[axis] += t.shape[axis];
  }
  axis_ = axis;
  return {Tensor::describe(in[0].dtype, out)};
}

void Concat::forward(Kernels& k, const OpTensors& t) {
  std::int64_t start = 0;
  for (const Tensor& x : t.in) {
    k.copy_strided(x, narrow_view(t.out[0], axis_, start, x.shape[axis_]));
    start += x.shape[axis_];
  }
}

std::vector<Tensor> Split::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 1);
  axis_ = axis_in(axis_, in[0].shape.rank());
  require(!sizes_.empty(), "needs at least one part");
  std::int64_t total = 0;
  std::vector<Tensor> outs;
  for (std::int64_t s : sizes_) {
    require(s >= 0, "part sizes must be >= 0");
    Shape part = in[0].shape;
    part[axis_] = s;
    outs.push_back(Tensor::describe(in[0].dtype, part));
    total += s;
  }
  require(total == in[0].shape[axis_], "parts sum to " + std::to_string(total) + ", not the dim " +
                                           std::to_string(in[0].shape[axis_]) + " of axis " + std::to_string(axis_));
  return outs;
}

void Split::forward(Kernels& k, const OpTensors& t) {
  std::int64_t start = 0;
  for (const Tensor& y : t.out) {
    if (y.numel() > 0) k.copy_strided(narrow_view(t.in[0], axis_, start, y.shape[axis_]), y);
    start += y.shape[axis_];
  }
}

// ---- slice, transpose, expand, reshape

std::string_view ViewCopy::kind() const {
  static constexpr std::string_view names[] = {"slice", "transpose", "expand", "reshape", "relayout"};
  return names[static_cast<int>(mode_)];
}

namespace {
Shape to_shape(const std::vector<std::int64_t>& dims) {
  Shape s;
  for (std::int64_t d : dims) s.push_back(d);
  return s;
}
}  // namespace

std::vector<Tensor> ViewCopy::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 1);
  const Tensor& x = in[0];
  const auto rank = static_cast<std::size_t>(x.shape.rank());
  Shape out;
  switch (mode_) {
    case Mode::slice:
      require(a_.size() == rank && b_.size() == rank && c_.size() == rank, "needs one start, end and step per dim");
      for (std::size_t d = 0; d < rank; ++d) {
        const std::int64_t dim = x.shape[static_cast<int>(d)], end = std::min(b_[d], dim);
        require(a_[d] >= 0 && c_[d] >= 1, "starts must be >= 0 and steps >= 1 (normalised)");
        out.push_back(end > a_[d] ? (end - a_[d] + c_[d] - 1) / c_[d] : 0);
      }
      break;
    case Mode::transpose: {
      require(a_.size() == rank, "perm needs one entry per dim");
      std::vector<bool> seen(rank, false);
      for (std::int64_t p : a_) {
        require(p >= 0 && p < static_cast<std::int64_t>(rank) && !seen[static_cast<std::size_t>(p)],
                "perm is not a permutation of the dims");
        seen[static_cast<std::size_t>(p)] = true;
        out.push_back(x.shape[static_cast<int>(p)]);
      }
      break;
    }
    case Mode::expand:
      require(broadcast_shapes(x.shape, to_shape(a_), out),
              "shape " + x.shape.to_string() + " does not broadcast with " + to_shape(a_).to_string());
      break;
    case Mode::reshape:
      out = to_shape(a_);
      require(out.numel() == x.numel(), "shape " + out.to_string() + " holds " + std::to_string(out.numel()) +
                                            " elements, x " + x.shape.to_string() + " holds " +
                                            std::to_string(x.numel()));
      break;
    case Mode::relayout: out = x.shape; break;
  }
  return {Tensor::describe(x.dtype, out)};
}

Layout ViewCopy::output_layout(std::size_t slot, Layout graph) const {
  switch (mode_) {
    case Mode::transpose: return layout_of_strides(out_[slot].shape, source(in_[0]).strides, graph);
    case Mode::reshape: return row_major(in_[0]) ? Layout::nchw : graph;
    case Mode::slice:
    case Mode::expand:
    case Mode::relayout: break;
  }
  return graph;
}

bool ViewCopy::keeps_bytes(const Tensor& x, const Tensor& y) const {
  if (x.dtype != y.dtype || x.numel() != y.numel()) return false;
  switch (mode_) {
    case Mode::reshape: return row_major(x) && row_major(y);
    case Mode::transpose:
      return same_order(y.shape, y.strides, contiguous_strides(y.shape, y.layout)) &&
             same_order(y.shape, source(x).strides, y.strides);
    case Mode::slice:
    case Mode::expand:
    case Mode::relayout: break;
  }
  return false;
}

Tensor ViewCopy::source(const Tensor& x) const {
  Tensor v = x;
  switch (mode_) {
    case Mode::slice: {
      std::int64_t offset = 0;
      for (int d = 0; d < x.shape.rank(); ++d) {
        offset += a_[static_cast<std::size_t>(d)] * x.strides[d];
        v.strides[d] = x.strides[d] * c_[static_cast<std::size_t>(d)];
      }
      v.shape = out_[0].shape;
      v.data = static_cast<char*>(x.data) + offset * bytes_of(x.dtype);
      return v;
    }
    case Mode::transpose:
      for (int d = 0; d < x.shape.rank(); ++d) {
        v.shape[d] = x.shape[static_cast<int>(a_[static_cast<std::size_t>(d)])];
        v.strides[d] = x.strides[static_cast<int>(a_[static_cast<std::size_t>(d)])];
      }
      return v;
    case Mode::expand: return broadcast_view(x, out_[0].shape);
    case Mode::reshape:
    case Mode::relayout: return x;  // copy_strided walks both in logical order
  }
  return v;
}

// ---- pad

std::vector<Tensor> Pad::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 1);
  const int rank = in[0].shape.rank();
  require(begins_.size() == static_cast<std::size_t>(rank) && ends_.size() == static_cast<std::size_t>(rank),
          "needs one begin and end per dim");
  Shape out;
  for (int d = 0; d < rank; ++d) {
    const std::int64_t dim = in[0].shape[d] + begins_[static_cast<std::size_t>(d)] + ends_[static_cast<std::size_t>(d)];
    require(dim >= 0, "padding leaves dim " + std::to_string(d) + " negative");
    out.push_back(dim);
  }
  return {Tensor::describe(in[0].dtype, out)};
}

std::int64_t Pad::kept_elements() const {
  std::int64_t n = 1;
  for (int d = 0; d < in_[0].shape.rank(); ++d) {
    const auto i = static_cast<std::size_t>(d);
    n *= std::max<std::int64_t>(
        0, in_[0].shape[d] - std::max<std::int64_t>(0, -begins_[i]) - std::max<std::int64_t>(0, -ends_[i]));
  }
  return n;
}

void Pad::forward(Kernels& k, const OpTensors& t) {
  k.fill(t.out[0], value_);
  if (kept_elements() == 0) return;
  Tensor src = t.in[0], dst = t.out[0];
  for (int d = 0; d < src.shape.rank(); ++d) {  // negative pads crop
    const auto i = static_cast<std::size_t>(d);
    const std::int64_t skip = std::max<std::int64_t>(0, -begins_[i]);
    const std::int64_t size = src.shape[d] - skip - std::max<std::int64_t>(0, -ends_[i]);
    src = narrow_view(src, d, skip, size);
    dst = narrow_view(dst, d, std::max<std::int64_t>(0, begins_[i]), size);
  }
  k.copy_strided(src, dst);
}

std::int64_t Pad::forward_bytes() const { return (out_[0].numel() + 2 * kept_elements()) * element_bytes(); }

}  // namespace ab::nn
