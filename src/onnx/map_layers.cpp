// Mappings onto the layers the engine's built-in models use: convolutions, batch norm, pooling,
// linear layers, and the shape ops that are views (Flatten, Reshape, Squeeze, Unsqueeze).
#include <algorithm>
#include <limits>

#include "models/resnet.h"
#include "nn/ops.h"
#include "onnx/groups.h"

namespace ab::onnx {
namespace {

void pass_through(Ctx& c, const Node& n) {
  const Slot s = c.slot(n.inputs.at(0), n);
  c.slots[n.outputs.at(0)] = s;
}

// Views: the engine value stays, the ONNX shape changes (made a reshape only where an op needs it).
void set_view_dims(Ctx& c, const Node& n, std::vector<std::int64_t> dims) {
  const Slot& s = c.slot(n.inputs.at(0), n);
  if (s.constant) c.refuse(n, "a constant here should have been folded");
  const bool integral = s.integral;
  c.set_view(n.outputs.at(0), s.value, std::move(dims));
  c.slots[n.outputs.at(0)].integral = integral;
}

void map_reshape(Ctx& c, const Node& n) {
  set_view_dims(c, n, reshape_dims(c.shape(n, 0), c.constant(n, 1), attr_int(n, "allowzero", 0) != 0, n));
}
void map_flatten(Ctx& c, const Node& n) { set_view_dims(c, n, flatten_dims(c.shape(n, 0), attr_int(n, "axis", 1), n)); }
void map_squeeze(Ctx& c, const Node& n) {
  set_view_dims(c, n, squeeze_dims(c.shape(n, 0), c.has_input(n, 1) ? &c.constant(n, 1) : nullptr, n));
}
void map_unsqueeze(Ctx& c, const Node& n) { set_view_dims(c, n, unsqueeze_dims(c.shape(n, 0), c.constant(n, 1), n)); }

// The graph's precision policy decides every activation's type, so a cast to a float type is the
// identity. To an integer type only integer values (an integer input's, a mask) are cast, which the
// engine's float value holds exactly; to bool they become x != 0, as min(|x|, 1) of integers.
void map_cast(Ctx& c, const Node& n) {
  const std::int64_t to = attr_int(n, "to", 0);
  if (to == pb::TensorProto_DataType_FLOAT || to == pb::TensorProto_DataType_FLOAT16 ||
      to == pb::TensorProto_DataType_DOUBLE || to == pb::TensorProto_DataType_BFLOAT16)
    return pass_through(c, n);
  const bool integer_type = to == pb::TensorProto_DataType_INT64 || to == pb::TensorProto_DataType_INT32 ||
                            to == pb::TensorProto_DataType_INT8 || to == pb::TensorProto_DataType_UINT8;
  const Slot& in = c.slot(n.inputs.at(0), n);
  if (!in.integral || (!integer_type && to != pb::TensorProto_DataType_BOOL))
    c.refuse(n,
             "casts a computed tensor of non-integer values to a non-float type; the engine computes in the "
             "graph's precision");
  if (integer_type) return pass_through(c, n);
  const std::string name = c.unique_name(n.name);
  const nn::Value magnitude = nn::unary(c.b, name + ".abs", c.value(n, 0), {nn::UnaryKind::abs});
  const double inf = std::numeric_limits<double>::infinity();
  c.set(n.outputs.at(0), nn::unary(c.b, name, magnitude, {nn::UnaryKind::clip, -inf, 1.0}));
  c.slots[n.outputs.at(0)].integral = true;
}

void map_conv_alone(Ctx& c, const Node& n) { c.refuse(n, "its weight must be a constant (an initializer)"); }

void map_conv_transpose(Ctx& c, const Node& n) {
  const HostTensor& w = c.constant(n, 1);
  const std::vector<std::int64_t> x = c.shape(n, 0);
  if (w.dims.size() != 4 || x.size() != 4) c.refuse(n, "only 2-D transposed convolutions are mapped");
  if (has_attr(n, "output_shape") || attr_string(n, "auto_pad", "NOTSET") != "NOTSET")
    c.refuse(n, "output_shape and auto_pad are not mapped; export with explicit pads");
  nn::ConvTranspose2dAttrs a;
  a.conv.groups = attr_int(n, "group", 1);
  if (a.conv.groups < 1 || w.dims[0] != x[1])
    c.refuse(n, "weight " + dims_text(w.dims) + " does not fit input " + dims_text(x));
  a.out_channels = w.dims[1] * a.conv.groups;
  a.kernel_h = w.dims[2], a.kernel_w = w.dims[3];
  std::vector<std::int64_t> s = attr_ints(n, "strides"), d = attr_ints(n, "dilations"), p = attr_ints(n, "pads"),
                            op = attr_ints(n, "output_padding");
  if (s.empty()) s = {1, 1};
  if (d.empty()) d = {1, 1};
  if (p.empty()) p = {0, 0, 0, 0};
  if (op.empty()) op = {0, 0};
  if (s.size() != 2 || d.size() != 2 || p.size() != 4 || op.size() != 2) c.refuse(n, "attributes do not fit 2-D");
  if (p[0] != p[2] || p[1] != p[3])
    c.refuse(n, "asymmetric pads " + dims_text(p) + " are not mapped for ConvTranspose");
  for (auto v : {s[0], s[1], d[0], d[1]})
    if (v < 1 || v > 4096) c.refuse(n, "strides and dilations must be positive");
  for (auto v : {p[0], p[1], op[0], op[1]})
    if (v < 0 || v > 4096) c.refuse(n, "pads and output_padding must be non-negative");
  a.conv.stride_h = s[0], a.conv.stride_w = s[1], a.conv.dilation_h = d[0], a.conv.dilation_w = d[1];
  a.conv.pad_h = p[0], a.conv.pad_w = p[1];
  a.output_padding_h = op[0], a.output_padding_w = op[1];
  const std::string name = c.unique_name(n.name);
  nn::Value y = nn::conv_transpose2d(c.b, name, c.value(n, 0), a);
  c.params[name + ".weight"] = w.values();
  if (c.has_input(n, 2)) {
    y = nn::bias_activation(c.b, name + ".bias_act", y, nn::Value{}, false);
    c.params[name + ".bias_act.bias"] = c.constant(n, 2).values();
  }
  c.set(n.outputs.at(0), y);
}

void map_batchnorm(Ctx& c, const Node& n) {
  if (c.shape(n, 0).size() != 4) c.refuse(n, "only batch norms of NCHW tensors are mapped");
  const std::string name = c.unique_name(n.name);
  const double epsilon = attr_float(n, "epsilon", 1e-5);
  const nn::Value y = nn::batchnorm2d(c.b, name, c.value(n, 0), nn::BatchNormDesc{epsilon, 0.1});
  const char* names[] = {"weight", "bias", "running_mean", "running_var"};
  for (std::size_t i = 0; i < 4; ++i) c.params[name + "." + names[i]] = c.constant(n, i + 1).values();
  c.set(n.outputs.at(0), y);
}

void map_relu(Ctx& c, const Node& n) { c.set(n.outputs.at(0), nn::relu(c.b, c.unique_name(n.name), c.value(n, 0))); }

// Pool windows: 2-D, symmetric pads, no dilation, floor rounding.
nn::Pool2dDesc pool_desc(const Ctx& c, const Node& n) {
  const std::vector<std::int64_t> k = attr_ints(n, "kernel_shape");
  std::vector<std::int64_t> s = attr_ints(n, "strides"), p = attr_ints(n, "pads"), d = attr_ints(n, "dilations");
  if (s.empty()) s = {1, 1};
  if (p.empty()) p = {0, 0, 0, 0};
  if (k.size() != 2 || s.size() != 2 || p.size() != 4 || c.shape(n, 0).size() != 4)
    c.refuse(n, "only 2-D pooling is mapped");
  if (attr_int(n, "ceil_mode", 0) != 0) c.refuse(n, "ceil_mode=1 is not mapped (export with ceil_mode=False)");
  if (!d.empty() && std::any_of(d.begin(), d.end(), [](auto v) { return v != 1; }))
    c.refuse(n, "dilated pooling is not mapped");
  if (attr_string(n, "auto_pad", "NOTSET") != "NOTSET" && attr_string(n, "auto_pad", "") != "VALID")
    c.refuse(n, "auto_pad SAME_* is not mapped for pooling; export with explicit pads");
  if (p[0] != p[2] || p[1] != p[3]) c.refuse(n, "asymmetric pads " + dims_text(p) + " are not mapped for pooling");
  for (auto v : {k[0], k[1], s[0], s[1]})
    if (v < 1 || v > 4096) c.refuse(n, "kernel_shape and strides must be positive");
  if (p[0] < 0 || p[1] < 0 || p[0] >= k[0] || p[1] >= k[1]) c.refuse(n, "pads must be below the window");
  return nn::Pool2dDesc{k[0], k[1], s[0], s[1], p[0], p[1]};
}

void map_maxpool(Ctx& c, const Node& n) {
  if (n.outputs.size() > 1 && !n.outputs[1].empty()) c.refuse(n, "its Indices output is not mapped");
  c.set(n.outputs.at(0), nn::maxpool2d(c.b, c.unique_name(n.name), c.value(n, 0), pool_desc(c, n)));
}

void map_global_avgpool(Ctx& c, const Node& n) {
  const std::vector<std::int64_t> x = c.shape(n, 0);
  if (x.size() != 4) c.refuse(n, "only NCHW inputs are mapped");
  // The engine's op gives [N, C]; ONNX's [N, C, 1, 1] is a view of it (free before a Flatten).
  const nn::Value y = nn::global_avgpool(c.b, c.unique_name(n.name), c.value(n, 0));
  c.set_view(n.outputs.at(0), y, {x[0], x[1], 1, 1});
}

// y = x W^T + bias as nn::linear over the rows of x, viewed with the ONNX shape of x (last dim `out`).
void add_linear(Ctx& c, const Node& n, const std::vector<double>& weight_nk, std::int64_t out,
                const std::vector<double>* bias, const std::string& output) {
  const std::vector<std::int64_t> x = c.shape(n, 0);
  const nn::Value y = linear_of_rows(c, n, c.unique_name(n.name), weight_nk, out, bias);
  std::vector<std::int64_t> dims(x.begin(), x.end() - 1);
  dims.push_back(out);
  c.set_view(output, y, dims);
}

// [K, N] row-major -> [N, K] (nn::Linear's [out, in]).
std::vector<double> transposed(const HostTensor& t, std::int64_t rows, std::int64_t cols, double scale) {
  std::vector<double> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < cols; ++k)
      out[static_cast<std::size_t>(k * rows + r)] = scale * t.value(static_cast<std::size_t>(r * cols + k));
  return out;
}

void map_gemm(Ctx& c, const Node& n) {
  if (attr_int(n, "transA", 0) != 0) c.refuse(n, "transA=1 is not mapped");
  if (c.shape(n, 0).size() != 2) c.refuse(n, "A must be 2-D");
  const HostTensor& bm = c.constant(n, 1);
  if (bm.dims.size() != 2) c.refuse(n, "B must be a 2-D constant");
  const bool trans_b = attr_int(n, "transB", 0) != 0;
  const double alpha = attr_float(n, "alpha", 1.0), beta = attr_float(n, "beta", 1.0);
  const std::int64_t k = trans_b ? bm.dims[1] : bm.dims[0], out = trans_b ? bm.dims[0] : bm.dims[1];
  if (k != c.shape(n, 0)[1]) c.refuse(n, "B " + dims_text(bm.dims) + " does not fit A " + dims_text(c.shape(n, 0)));
  std::vector<double> w = trans_b ? bm.values() : transposed(bm, k, out, 1.0);
  for (auto& v : w) v *= alpha;
  std::vector<double> bias;
  if (c.has_input(n, 2)) {
    const HostTensor& ct = c.constant(n, 2);
    if (ct.numel() != out && ct.numel() != 1)
      c.refuse(n, "C " + dims_text(ct.dims) + " is not a bias of " + std::to_string(out));
    for (std::int64_t j = 0; j < out; ++j)
      bias.push_back(beta * ct.value(ct.numel() == 1 ? 0 : static_cast<std::size_t>(j)));
  }
  add_linear(c, n, w, out, c.has_input(n, 2) ? &bias : nullptr, n.outputs.at(0));
}

void map_matmul(Ctx& c, const Node& n) {
  if (!c.is_constant(n.inputs.at(1)) || c.constant(n, 1).dims.size() != 2) {
    const nn::Value a = c.value(n, 0), bm = c.value(n, 1);
    c.set(n.outputs.at(0), nn::matmul(c.b, c.unique_name(n.name), a, bm));
    return;
  }
  const HostTensor& bm = c.constant(n, 1);
  if (c.shape(n, 0).empty() || c.shape(n, 0).back() != bm.dims[0])
    c.refuse(n, "B " + dims_text(bm.dims) + " does not fit A");
  add_linear(c, n, transposed(bm, bm.dims[0], bm.dims[1], 1.0), bm.dims[1], nullptr, n.outputs.at(0));
}

}  // namespace

nn::Value linear_of_rows(Ctx& c, const Node& n, const std::string& name, const std::vector<double>& weight_nk,
                         std::int64_t out, const std::vector<double>* bias) {
  const std::vector<std::int64_t> x = c.shape(n, 0);
  if (x.size() < 2) c.refuse(n, "a vector input is not mapped");
  std::int64_t rows = 1;
  for (std::size_t k = 0; k + 1 < x.size(); ++k) rows *= x[k];
  const nn::Value in = c.value_as(n, 0, {rows, x.back()});
  // In an fp8 graph e4m3 where the ResNet builder's classifier would be (its rule, the same kernels).
  const bool fp8 = c.b.options().precision == Precision::fp8 && ab::models::fp8_linear_eligible(c.b.desc(in), out);
  c.fp8_layers += fp8;
  const nn::Value y = nn::linear(c.b, name, in, out, bias != nullptr, fp8);
  c.params[name + ".weight"] = weight_nk;
  if (bias != nullptr) c.params[name + ".bias"] = *bias;
  return y;
}

std::vector<double> linear_weight(const HostTensor& kn) { return transposed(kn, kn.dims.at(0), kn.dims.at(1), 1.0); }

namespace {

// MatMul by a constant then Add of a constant [N]: one linear layer with its bias (PyTorch's
// nn.Linear on a 3-D input exports so); with `transpose` and `mul` (a per-output scale after it: output_scale
// in groups.cpp) the scale is folded into the weight and bias, the Transpose maps as it is, and
// the Mul's output is the Transpose's.
void map_linear(Ctx& c, const Node& matmul, const Node& add, const Node* transpose, const Node* mul) {
  const HostTensor& bm = c.constant(matmul, 1);
  const std::size_t bias_input = add.inputs[0] == matmul.outputs[0] ? 1 : 0;
  std::vector<double> bias = c.constant(add, bias_input).values();
  std::vector<double> weight = transposed(bm, bm.dims[0], bm.dims[1], 1.0);  // [N, K]
  const std::int64_t n = bm.dims[1], k = bm.dims[0];
  if (mul == nullptr) {
    add_linear(c, matmul, weight, n, &bias, add.outputs.at(0));
    c.fused.push_back("MatMul+Add (linear with bias): " + matmul.name);
    return;
  }
  const std::size_t scale_input = mul->inputs[0] == transpose->outputs.at(0) ? 1 : 0;
  const std::vector<double> scale = c.constant(*mul, scale_input).values();  // N values, or one
  for (std::int64_t j = 0; j < n; ++j) {
    const double sj = scale.size() == 1 ? scale[0] : scale.at(static_cast<std::size_t>(j));
    bias[static_cast<std::size_t>(j)] *= sj;
    for (std::int64_t i = 0; i < k; ++i) weight[static_cast<std::size_t>(j * k + i)] *= sj;
  }
  add_linear(c, matmul, weight, n, &bias, add.outputs.at(0));
  map_node(c, *transpose);
  c.set(mul->outputs.at(0), c.value(*mul, 1 - scale_input));
  c.fused.push_back("MatMul+Add+Transpose+Mul (linear with bias, the scale folded in): " + matmul.name);
}

}  // namespace

void map_linear_group(Ctx& c, const Node& matmul, const Node& add) { map_linear(c, matmul, add, nullptr, nullptr); }

void map_linear_group(Ctx& c, const Group& g) {
  const auto node = [&](std::size_t i) -> const Node& { return c.s.nodes[static_cast<std::size_t>(g.nodes.at(i))]; };
  if (g.nodes.size() == 2) return map_linear(c, node(0), node(1), nullptr, nullptr);
  map_linear(c, node(0), node(1), &node(2), &node(3));
}

void add_layer_mappings(MapTable& t) {
  t["Conv"] = map_conv_alone;
  t["ConvTranspose"] = map_conv_transpose;
  t["BatchNormalization"] = map_batchnorm;
  t["Relu"] = map_relu;
  t["MaxPool"] = map_maxpool;
  t["GlobalAveragePool"] = map_global_avgpool;
  t["Gemm"] = map_gemm;
  t["MatMul"] = map_matmul;
  t["Flatten"] = map_flatten;
  t["Reshape"] = map_reshape;
  t["Squeeze"] = map_squeeze;
  t["Unsqueeze"] = map_unsqueeze;
  t["Identity"] = pass_through;
  t["Dropout"] = pass_through;  // inference: the identity (its mask output is not mapped)
  t["Cast"] = map_cast;
}

}  // namespace ab::onnx
