// The generic inference ops that compute (softmax, mean, pooling, resize, matmul, gather, layer
// norm) and the builders of every generic op (nn/ops.h).
#include <algorithm>

#include "nn/broadcast.h"
#include "nn/ops.h"
#include "nn/ops_generic.h"

namespace ab::nn {
namespace {

bool row_major(const Tensor& t) { return t.strides == contiguous_strides(t.shape, Layout::nchw); }

// A row-major descriptor of t's shape placed `offset` bytes into the workspace.
Tensor staged(const Tensor& t, const Workspace& ws, std::int64_t offset) {
  Tensor s = Tensor::describe(t.dtype, t.shape, Layout::nchw, t.device);
  s.data = static_cast<char*>(ws.data) + offset;
  return s;
}

std::int64_t staging_bytes(const Tensor& t) {
  return row_major(t) ? 0 : align_up(t.numel() * static_cast<std::int64_t>(size_bytes(t.dtype)));
}

}  // namespace

// ---- softmax, reduce_mean

std::vector<Tensor> Softmax::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 1);
  require_float(in[0]);
  axis_ = axis_in(axis_, in[0].shape.rank());
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

std::vector<Tensor> ReduceMean::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 1);
  require_float(in[0]);
  const int rank = in[0].shape.rank();
  std::vector<bool> reduced(static_cast<std::size_t>(rank), axes_.empty());  // no axes: all (ONNX)
  for (int& a : axes_) {
    a = axis_in(a, rank);
    reduced[static_cast<std::size_t>(a)] = true;
  }
  Shape out;
  for (int d = 0; d < rank; ++d)
    if (!reduced[static_cast<std::size_t>(d)]) out.push_back(in[0].shape[d]);
    else if (keepdims_) out.push_back(1);
  axes_.clear();
  for (int d = 0; d < rank; ++d)
    if (reduced[static_cast<std::size_t>(d)]) axes_.push_back(d);
  return {Tensor::describe(in[0].dtype, out)};
}

void ReduceMean::forward(Kernels& k, const OpTensors& t) {
  Tensor y = t.out[0];
  if (!keepdims_) {  // the kernel takes y at x's rank: reinsert the reduced dims (size 1, stride 0)
    y.shape = t.in[0].shape;
    y.strides = t.in[0].shape;
    int src = 0;
    for (int d = 0; d < y.shape.rank(); ++d) {
      const bool r = std::find(axes_.begin(), axes_.end(), d) != axes_.end();
      y.shape[d] = r ? 1 : t.out[0].shape[src];
      y.strides[d] = r ? 0 : t.out[0].strides[src++];
    }
  }
  k.reduce_mean_forward(t.in[0], y);
}

// ---- avgpool2d, resize

std::vector<Tensor> AvgPool2d::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 1);
  const Tensor& x = in[0];
  require(x.shape.rank() == 4, "input must be [N, C, H, W], got " + x.shape.to_string());
  require_float(x);
  require(d_.window_h >= 1 && d_.window_w >= 1 && d_.stride_h >= 1 && d_.stride_w >= 1,
          "window and stride must be >= 1");
  // Every window then holds a real element, so excluding padding never divides by zero.
  require(d_.pad_h >= 0 && d_.pad_w >= 0 && d_.pad_h < d_.window_h && d_.pad_w < d_.window_w,
          "padding must be >= 0 and below the window");
  require(x.shape[2] + 2 * d_.pad_h >= d_.window_h && x.shape[3] + 2 * d_.pad_w >= d_.window_w,
          "window larger than the padded input " + x.shape.to_string());
  const std::int64_t oh = (x.shape[2] + 2 * d_.pad_h - d_.window_h) / d_.stride_h + 1;
  const std::int64_t ow = (x.shape[3] + 2 * d_.pad_w - d_.window_w) / d_.stride_w + 1;
  return {Tensor::describe(x.dtype, Shape{x.shape[0], x.shape[1], oh, ow})};
}

std::vector<Tensor> Resize::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 1);
  require(in[0].shape.rank() == 4, "input must be [N, C, H, W], got " + in[0].shape.to_string());
  require_float(in[0]);
  require(out_h_ >= 1 && out_w_ >= 1, "output size must be >= 1");
  return {Tensor::describe(in[0].dtype, Shape{in[0].shape[0], in[0].shape[1], out_h_, out_w_})};
}

// ---- matmul

std::vector<Tensor> MatMul::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 2);
  const Shape &a = in[0].shape, &b = in[1].shape;
  require(a.rank() >= 2 && b.rank() >= 2,
          "operands need rank >= 2 (reshape a vector), got " + a.to_string() + " x " + b.to_string());
  require_float(in[0]);
  require(in[0].dtype == in[1].dtype, "operand dtypes differ");
  require(a[a.rank() - 1] == b[b.rank() - 2], "inner dims of " + a.to_string() + " x " + b.to_string() + " differ");
  Shape ba, bb, out;
  for (int d = 0; d < a.rank() - 2; ++d) ba.push_back(a[d]);
  for (int d = 0; d < b.rank() - 2; ++d) bb.push_back(b[d]);
  require(broadcast_shapes(ba, bb, out),
          "batch dims of " + a.to_string() + " x " + b.to_string() + " do not broadcast");
  out.push_back(a[a.rank() - 2]);
  out.push_back(b[b.rank() - 1]);
  return {Tensor::describe(in[0].dtype, out)};
}

std::int64_t MatMul::prepare(Kernels& k, const OpTensors& d) {
  InferenceOp::prepare(k, d);
  return staging_bytes(d.in[0]) + staging_bytes(d.in[1]) + staging_bytes(d.out[0]);
}

void MatMul::forward(Kernels& k, const OpTensors& t) {
  std::int64_t offset = 0;
  Tensor ops[3] = {t.in[0], t.in[1], t.out[0]};
  for (int i = 0; i < 3; ++i)
    if (!row_major(ops[i])) {
      const Tensor s = staged(ops[i], t.workspace, offset);
      offset += staging_bytes(ops[i]);
      if (i < 2) k.copy_strided(ops[i], s);
      ops[i] = s;
    }
  k.matmul_forward(ops[0], ops[1], ops[2]);
  if (ops[2].data != t.out[0].data) k.copy_strided(ops[2], t.out[0]);
}

std::int64_t MatMul::forward_flops() const {
  const Shape& y = out_[0].shape;
  const std::int64_t k = in_[0].shape[in_[0].shape.rank() - 1];
  return 2 * y.numel() * k;  // 2 M N K per batch
}

std::int64_t MatMul::forward_bytes() const {
  std::int64_t staged_elems = 0;  // each staged operand is written and read once more
  for (const Tensor* t : {&in_[0], &in_[1], &out_[0]})
    if (!row_major(*t)) staged_elems += 2 * t->numel();
  return InferenceOp::forward_bytes() + staged_elems * element_bytes();
}

// ---- gather

std::vector<Tensor> Gather::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 2);
  require_float(in[0]);
  const DType i = in[1].dtype;
  require(i == DType::i32 || i == DType::i64 || is_float(i),
          "indices must be i32, i64 or a float, got " + std::string(to_string(i)));
  axis_ = axis_in(axis_, in[0].shape.rank());
  Shape out;
  for (int d = 0; d < axis_; ++d) out.push_back(in[0].shape[d]);
  for (int d = 0; d < in[1].shape.rank(); ++d) out.push_back(in[1].shape[d]);
  for (int d = axis_ + 1; d < in[0].shape.rank(); ++d) out.push_back(in[0].shape[d]);
  require(out.rank() <= Shape::kMaxRank, "output rank above " + std::to_string(Shape::kMaxRank));
  return {Tensor::describe(in[0].dtype, out)};
}

std::int64_t Gather::forward_bytes() const {
  return in_[1].numel() * bytes_of(in_[1].dtype) + 2 * out_[0].numel() * element_bytes();
}

// ---- layer_norm

std::vector<Tensor> LayerNormAxis::do_infer(const std::vector<Tensor>& in) {
  require_inputs(in, 1);
  require_float(in[0]);
  axis_ = axis_in(axis_, in[0].shape.rank());
  require(desc_.epsilon > 0, "epsilon must be > 0");
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

std::vector<ParamSpec> LayerNormAxis::parameters() const {
  Shape norm;
  for (int d = axis_; d < in_[0].shape.rank(); ++d) norm.push_back(in_[0].shape[d]);
  const DType t = in_[0].dtype;
  return {{"weight", norm, ParamRole::norm_scale, {ParamInit::Dist::ones, 0.0}, t},
          {"bias", norm, ParamRole::norm_shift, {ParamInit::Dist::zeros, 0.0}, t}};
}

std::int64_t LayerNormAxis::rows() const {
  std::int64_t r = 1;
  for (int d = 0; d < axis_; ++d) r *= in_[0].shape[d];
  return r;
}

std::int64_t LayerNormAxis::prepare(Kernels& k, const OpTensors& d) {
  InferenceOp::prepare(k, d);
  const std::int64_t stats = 2 * align_up(rows() * bytes_of(wide_dtype(d.in[0].dtype)));
  return stats + staging_bytes(d.in[0]) + staging_bytes(d.out[0]);
}

void LayerNormAxis::forward(Kernels& k, const OpTensors& t) {
  const std::int64_t r = rows(), cols = in_[0].numel() / std::max<std::int64_t>(r, 1);
  const DType wide = wide_dtype(t.in[0].dtype);
  const std::int64_t stat_bytes = align_up(r * bytes_of(wide));
  char* ws = static_cast<char*>(t.workspace.data);
  const Tensor mean = Tensor::describe(wide, Shape{r}, Layout::nchw, t.in[0].device).with_data(ws);
  const Tensor rstd = mean.with_data(ws + stat_bytes);
  std::int64_t offset = 2 * stat_bytes;
  Tensor x = t.in[0], y = t.out[0];
  if (!row_major(x)) {
    const Tensor s = staged(x, t.workspace, offset);
    offset += staging_bytes(x);
    k.copy_strided(x, s);
    x = s;
  }
  if (!row_major(y)) y = staged(y, t.workspace, offset);
  const auto matrix = [&](const Tensor& v) {
    return Tensor::describe(v.dtype, Shape{r, cols}, Layout::nchw, v.device).with_data(v.data);
  };
  const auto vector = [&](const Tensor& v) {
    return Tensor::describe(v.dtype, Shape{cols}, Layout::nchw, v.device).with_data(v.data);
  };
  k.layernorm_forward(desc_, matrix(x), vector(t.params[0]), vector(t.params[1]), matrix(y), mean, rstd);
  if (y.data != t.out[0].data) k.copy_strided(y, t.out[0]);
}

std::int64_t LayerNormAxis::forward_bytes() const {
  std::int64_t staged_elems = 0;
  for (const Tensor* t : {&in_[0], &out_[0]})
    if (!row_major(*t)) staged_elems += 2 * t->numel();
  const std::int64_t params = 2 * (in_[0].numel() / std::max<std::int64_t>(rows(), 1)) * element_bytes();
  const std::int64_t stats = 2 * rows() * bytes_of(wide_dtype(in_[0].dtype));
  return (2 * in_[0].numel() + staged_elems) * element_bytes() + params + stats;
}

// ---- builders

Value unary(GraphBuilder& b, const std::string& name, Value x, const UnaryAttrs& a) {
  return b.add1(std::make_unique<Unary>(name, a), {x});
}
Value binary(GraphBuilder& b, const std::string& name, Value x, Value y, BinaryKind kind) {
  return b.add1(std::make_unique<Binary>(name, kind), {x, y});
}
Value constant(GraphBuilder& b, const std::string& name, const Shape& shape, const std::vector<double>& values) {
  return constant(b, name, shape, values, activation_dtype(b.options()));
}
Value constant(GraphBuilder& b, const std::string& name, const Shape& shape, const std::vector<double>& values,
               DType dtype) {
  return b.add1(std::make_unique<Constant>(name, shape, values, dtype), {});
}
Value concat(GraphBuilder& b, const std::string& name, const std::vector<Value>& xs, int axis) {
  return b.add1(std::make_unique<Concat>(name, axis), xs);
}
std::vector<Value> split(GraphBuilder& b, const std::string& name, Value x, int axis,
                         const std::vector<std::int64_t>& sizes) {
  return b.add(std::make_unique<Split>(name, axis, sizes), {x});
}
Value slice(GraphBuilder& b, const std::string& name, Value x, const std::vector<std::int64_t>& starts,
            const std::vector<std::int64_t>& ends, const std::vector<std::int64_t>& steps) {
  return b.add1(std::make_unique<ViewCopy>(name, ViewCopy::Mode::slice, starts, ends, steps), {x});
}
Value transpose(GraphBuilder& b, const std::string& name, Value x, const std::vector<int>& perm) {
  return b.add1(
      std::make_unique<ViewCopy>(name, ViewCopy::Mode::transpose, std::vector<std::int64_t>(perm.begin(), perm.end())),
      {x});
}
namespace {
std::vector<std::int64_t> dims_of(const Shape& s) {
  std::vector<std::int64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(s[i]);
  return d;
}
}  // namespace
Value reshape(GraphBuilder& b, const std::string& name, Value x, const Shape& shape) {
  return b.add1(std::make_unique<ViewCopy>(name, ViewCopy::Mode::reshape, dims_of(shape)), {x});
}
Value expand(GraphBuilder& b, const std::string& name, Value x, const Shape& shape) {
  return b.add1(std::make_unique<ViewCopy>(name, ViewCopy::Mode::expand, dims_of(shape)), {x});
}
Value softmax(GraphBuilder& b, const std::string& name, Value x, int axis) {
  return b.add1(std::make_unique<Softmax>(name, axis), {x});
}
Value reduce_mean(GraphBuilder& b, const std::string& name, Value x, const std::vector<int>& axes, bool keepdims) {
  return b.add1(std::make_unique<ReduceMean>(name, axes, keepdims), {x});
}
Value avgpool2d(GraphBuilder& b, const std::string& name, Value x, const Pool2dDesc& d, bool count_include_pad) {
  return b.add1(std::make_unique<AvgPool2d>(name, d, count_include_pad), {x});
}
Value pad(GraphBuilder& b, const std::string& name, Value x, const std::vector<std::int64_t>& begins,
          const std::vector<std::int64_t>& ends, double value) {
  return b.add1(std::make_unique<Pad>(name, begins, ends, value), {x});
}
Value resize(GraphBuilder& b, const std::string& name, Value x, std::int64_t out_h, std::int64_t out_w, bool linear) {
  return b.add1(std::make_unique<Resize>(name, out_h, out_w, linear), {x});
}
Value matmul(GraphBuilder& b, const std::string& name, Value a, Value bm) {
  return b.add1(std::make_unique<MatMul>(name), {a, bm});
}
Value gather(GraphBuilder& b, const std::string& name, Value table, Value indices, int axis) {
  return b.add1(std::make_unique<Gather>(name, axis), {table, indices});
}
Value where(GraphBuilder& b, const std::string& name, Value cond, Value x, Value y) {
  return b.add1(std::make_unique<Where>(name), {cond, x, y});
}
Value layer_norm(GraphBuilder& b, const std::string& name, Value x, int axis, double epsilon) {
  return b.add1(std::make_unique<LayerNormAxis>(name, axis, epsilon), {x});
}

}  // namespace ab::nn
