// Mappings onto the engine's generic inference ops (nn::unary, binary, concat, slice, softmax,
// matmul...): the elementwise, shape and transformer ops of CNN and ViT exports.
#include <algorithm>
#include <cmath>
#include <limits>

#include "nn/ops.h"
#include "onnx/internal.h"

namespace ab::onnx {
namespace {

std::vector<std::int64_t> ints(const HostTensor& t) {
  std::vector<std::int64_t> v;
  for (std::size_t i = 0; i < static_cast<std::size_t>(t.numel()); ++i) v.push_back(t.int_value(i));
  return v;
}

nn::Value unary_of(Ctx& c, const Node& n, nn::UnaryAttrs a) {
  return nn::unary(c.b, c.unique_name(n.name), c.value(n, 0), a);
}

template <nn::UnaryKind K>
void map_unary(Ctx& c, const Node& n) {
  c.set(n.outputs.at(0), unary_of(c, n, nn::UnaryAttrs{K, 0, 0}));
}

void map_leaky_relu(Ctx& c, const Node& n) {
  c.set(n.outputs.at(0), unary_of(c, n, {nn::UnaryKind::leaky_relu, attr_float(n, "alpha", 0.01), 0}));
}

void map_hard_sigmoid(Ctx& c, const Node& n) {
  c.set(n.outputs.at(0),
        unary_of(c, n, {nn::UnaryKind::hard_sigmoid, attr_float(n, "alpha", 0.2), attr_float(n, "beta", 0.5)}));
}

// Clip (opset 11+: min and max as optional constant inputs); ReLU6 exports as Clip(0, 6).
void map_clip(Ctx& c, const Node& n) {
  const double inf = std::numeric_limits<double>::infinity();
  const auto bound = [&](std::size_t i, double fallback) {
    if (!c.has_input(n, i)) return fallback;
    const HostTensor& t = c.constant(n, i);
    if (t.numel() != 1) c.refuse(n, "min and max must be scalars");
    return t.value(0);
  };
  c.set(n.outputs.at(0), unary_of(c, n, {nn::UnaryKind::clip, bound(1, -inf), bound(2, inf)}));
}

// Binary ops: both operands as engine values (a constant one as an nn::constant), numpy broadcast.
template <nn::BinaryKind K>
void map_binary(Ctx& c, const Node& n) {
  if (n.inputs.size() != 2) c.refuse(n, "takes two inputs here (variadic Max/Min/Sum are not mapped)");
  const nn::Value a = c.value(n, 0), b = c.value(n, 1);
  c.set(n.outputs.at(0), nn::binary(c.b, c.unique_name(n.name), a, b, K));
}

// Add of two computed tensors of one shape is the engine's residual add; anything else broadcasts.
void map_add(Ctx& c, const Node& n) {
  if (!c.is_constant(n.inputs.at(0)) && !c.is_constant(n.inputs.at(1)) && c.shape(n, 0) == c.shape(n, 1)) {
    const nn::Value a = c.value(n, 0), b = c.value(n, 1);
    c.set(n.outputs.at(0), nn::add(c.b, c.unique_name(n.name), a, b));
    return;
  }
  map_binary<nn::BinaryKind::add>(c, n);
}

void map_concat(Ctx& c, const Node& n) {
  std::vector<nn::Value> xs;
  for (std::size_t i = 0; i < n.inputs.size(); ++i) xs.push_back(c.value(n, i));
  const auto rank = static_cast<std::int64_t>(c.shape(n, 0).size());
  c.set(n.outputs.at(0), nn::concat(c.b, c.unique_name(n.name), xs, normalize_axis(attr_int(n, "axis", 0), rank, n)));
}

void map_split(Ctx& c, const Node& n) {
  const std::vector<std::int64_t> x = c.shape(n, 0);
  const int axis = normalize_axis(attr_int(n, "axis", 0), static_cast<std::int64_t>(x.size()), n);
  std::vector<std::int64_t> sizes;
  if (c.has_input(n, 1)) {
    sizes = ints(c.constant(n, 1));
  } else {
    const auto parts = static_cast<std::int64_t>(n.outputs.size());
    const std::int64_t dim = x[static_cast<std::size_t>(axis)], each = (dim + parts - 1) / parts;
    for (std::int64_t i = 0; i < parts; ++i) sizes.push_back(std::min(each, dim - i * each));
  }
  if (sizes.size() != n.outputs.size()) c.refuse(n, "split sizes do not match its outputs");
  const std::vector<nn::Value> ys = nn::split(c.b, c.unique_name(n.name), c.value(n, 0), axis, sizes);
  for (std::size_t i = 0; i < ys.size(); ++i) c.set(n.outputs[i], ys[i]);
}

void map_slice(Ctx& c, const Node& n) {
  std::vector<const HostTensor*> ins{nullptr};
  for (std::size_t i = 1; i < n.inputs.size(); ++i) ins.push_back(c.has_input(n, i) ? &c.constant(n, i) : nullptr);
  const SliceRanges r = slice_ranges(c.shape(n, 0), ins, n);
  if (std::any_of(r.steps.begin(), r.steps.end(), [](auto s) { return s < 1; }))
    c.refuse(n, "negative steps are not mapped");
  c.set(n.outputs.at(0), nn::slice(c.b, c.unique_name(n.name), c.value(n, 0), r.starts, r.ends, r.steps));
}

void map_transpose(Ctx& c, const Node& n) {
  const auto rank = c.shape(n, 0).size();
  std::vector<int> perm;
  for (auto v : transpose_perm(n, rank)) perm.push_back(normalize_axis(v, static_cast<std::int64_t>(rank), n));
  c.set(n.outputs.at(0), nn::transpose(c.b, c.unique_name(n.name), c.value(n, 0), perm));
}

void map_softmax(Ctx& c, const Node& n) {
  const auto rank = static_cast<std::int64_t>(c.shape(n, 0).size());
  c.set(n.outputs.at(0),
        nn::softmax(c.b, c.unique_name(n.name), c.value(n, 0), normalize_axis(attr_int(n, "axis", -1), rank, n)));
}

void map_reduce_mean(Ctx& c, const Node& n) {
  const auto rank = static_cast<std::int64_t>(c.shape(n, 0).size());
  std::vector<std::int64_t> list = c.has_input(n, 1) ? ints(c.constant(n, 1)) : attr_ints(n, "axes");
  std::vector<int> axes;
  for (auto a : list) axes.push_back(normalize_axis(a, rank, n));
  c.set(n.outputs.at(0),
        nn::reduce_mean(c.b, c.unique_name(n.name), c.value(n, 0), axes, attr_int(n, "keepdims", 1) != 0));
}

void map_average_pool(Ctx& c, const Node& n) {
  const std::vector<std::int64_t> k = attr_ints(n, "kernel_shape");
  std::vector<std::int64_t> s = attr_ints(n, "strides"), p = attr_ints(n, "pads");
  if (s.empty()) s = {1, 1};
  if (p.empty()) p = {0, 0, 0, 0};
  const std::vector<std::int64_t> x = c.shape(n, 0);
  if (k.size() != 2 || s.size() != 2 || p.size() != 4 || x.size() != 4) c.refuse(n, "only 2-D pooling is mapped");
  // A window over the whole (unpadded) input is the global mean, whatever ceil_mode says
  // (transformers' EfficientNet pools with AvgPool2d(1280, ceil_mode=True) over 7 x 7).
  if (std::all_of(p.begin(), p.end(), [](auto v) { return v == 0; }) && k[0] >= x[2] && k[1] >= x[3] &&
      (attr_int(n, "ceil_mode", 0) != 0 || (k[0] == x[2] && k[1] == x[3]))) {
    const nn::Value y = nn::global_avgpool(c.b, c.unique_name(n.name), c.value(n, 0));
    c.set_view(n.outputs.at(0), y, {x[0], x[1], 1, 1});
    return;
  }
  if (attr_int(n, "ceil_mode", 0) != 0 || attr_string(n, "auto_pad", "NOTSET") != "NOTSET")
    c.refuse(n, "ceil_mode and auto_pad are not mapped; export with explicit pads");
  if (p[0] != p[2] || p[1] != p[3]) c.refuse(n, "asymmetric pads are not mapped for pooling");
  for (auto v : {k[0], k[1], s[0], s[1]})
    if (v < 1 || v > 4096) c.refuse(n, "kernel_shape and strides must be positive");
  if (p[0] < 0 || p[1] < 0 || p[0] >= k[0] || p[1] >= k[1]) c.refuse(n, "pads must be below the window");
  const nn::Pool2dDesc d{k[0], k[1], s[0], s[1], p[0], p[1]};
  c.set(n.outputs.at(0),
        nn::avgpool2d(c.b, c.unique_name(n.name), c.value(n, 0), d, attr_int(n, "count_include_pad", 0) != 0));
}

void map_pad(Ctx& c, const Node& n) {
  if (attr_string(n, "mode", "constant") != "constant") c.refuse(n, "only constant padding is mapped");
  const std::vector<std::int64_t> x = c.shape(n, 0), pads = ints(c.constant(n, 1));
  const std::size_t rank = x.size();
  if (pads.size() != 2 * rank || c.has_input(n, 3))
    c.refuse(n, "pads must give both ends of every dim (no axes input)");
  const double value = c.has_input(n, 2) && c.constant(n, 2).numel() == 1 ? c.constant(n, 2).value(0) : 0.0;
  for (auto p : pads)
    if (std::abs(p) > (std::int64_t{1} << 20)) c.refuse(n, "pads are out of range");
  c.set(n.outputs.at(0), nn::pad(c.b, c.unique_name(n.name), c.value(n, 0),
                                 {pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(rank)},
                                 {pads.begin() + static_cast<std::ptrdiff_t>(rank), pads.end()}, value));
}

void map_resize(Ctx& c, const Node& n) {
  const std::vector<std::int64_t> x = c.shape(n, 0);
  if (x.size() != 4) c.refuse(n, "only NCHW resizing is mapped");
  const std::string mode = attr_string(n, "mode", "nearest"),
                    coords = attr_string(n, "coordinate_transformation_mode", "half_pixel");
  const bool linear = mode == "linear";
  if (linear ? coords != "half_pixel" && coords != "pytorch_half_pixel"
             : mode != "nearest" || coords != "asymmetric" ||
                   attr_string(n, "nearest_mode", "round_prefer_floor") != "floor")
    c.refuse(
        n,
        "mapped: nearest with asymmetric coordinates and floor (PyTorch's nearest), or linear with half_pixel; not " +
            mode + "/" + coords);
  std::int64_t h = 0, w = 0;
  if (c.has_input(n, 3)) {
    const std::vector<std::int64_t> sizes = ints(c.constant(n, 3));
    if (sizes.size() != 4 || sizes[0] != x[0] || sizes[1] != x[1]) c.refuse(n, "sizes must keep N and C");
    h = sizes[2], w = sizes[3];
  } else {
    const std::vector<double> scales = c.constant(n, 2).values();
    if (scales.size() != 4 || scales[0] != 1 || scales[1] != 1) c.refuse(n, "scales must keep N and C");
    h = static_cast<std::int64_t>(std::floor(static_cast<double>(x[2]) * std::clamp(scales[2], 0.0, 4096.0)));
    w = static_cast<std::int64_t>(std::floor(static_cast<double>(x[3]) * std::clamp(scales[3], 0.0, 4096.0)));
  }
  if (h < 1 || w < 1 || h > (1 << 20) || w > (1 << 20)) c.refuse(n, "output size out of range");
  c.set(n.outputs.at(0), nn::resize(c.b, c.unique_name(n.name), c.value(n, 0), h, w, linear));
}

// Constant Gather indices as an i32 constant (exact in any activation dtype), negatives resolved.
nn::Value index_constant(Ctx& c, const Node& n, std::int64_t extent) {
  const HostTensor& t = c.constant(n, 1);
  std::vector<double> v;
  for (std::size_t i = 0; i < static_cast<std::size_t>(t.numel()); ++i) {
    std::int64_t j = t.int_value(i);
    if (j < -extent || j >= extent) c.refuse(n, "index " + std::to_string(j) + " outside " + std::to_string(extent));
    v.push_back(static_cast<double>(j < 0 ? j + extent : j));
  }
  const std::string name = c.unique_name(n.name + ".indices");
  const nn::Value idx = nn::constant(c.b, name, to_shape(t.dims, n.name), v, DType::i32);
  c.params[name + ".value"] = std::move(v);
  return idx;
}

// Gather by a constant scalar index on a computed tensor is a slice with the axis dropped (ViT's
// class token, x[:, 0]); otherwise the engine's gather.
void map_gather(Ctx& c, const Node& n) {
  const std::vector<std::int64_t> x = c.shape(n, 0);
  const int axis = normalize_axis(attr_int(n, "axis", 0), static_cast<std::int64_t>(x.size()), n);
  if (c.is_constant(n.inputs.at(1)) && c.constant(n, 1).numel() == 1 && c.constant(n, 1).dims.empty()) {
    std::int64_t i = c.constant(n, 1).int_value(0);
    const std::int64_t dim = x[static_cast<std::size_t>(axis)];
    if (i < -dim || i >= dim) c.refuse(n, "index " + std::to_string(i) + " outside " + std::to_string(dim));
    if (i < 0) i += dim;
    std::vector<std::int64_t> starts(x.size(), 0), ends = x, steps(x.size(), 1);
    starts[static_cast<std::size_t>(axis)] = i, ends[static_cast<std::size_t>(axis)] = i + 1;
    const nn::Value y = nn::slice(c.b, c.unique_name(n.name), c.value(n, 0), starts, ends, steps);
    std::vector<std::int64_t> dims = x;
    dims.erase(dims.begin() + axis);
    c.set_view(n.outputs.at(0), y, dims);
    return;
  }
  const bool integral = c.slot(n.inputs.at(0), n).integral;
  const nn::Value table = c.value(n, 0), idx = c.is_constant(n.inputs.at(1))
                                                   ? index_constant(c, n, x[static_cast<std::size_t>(axis)])
                                                   : c.value(n, 1);
  c.set(n.outputs.at(0), nn::gather(c.b, c.unique_name(n.name), table, idx, axis));
  c.slots[n.outputs.at(0)].integral = integral;
}

// And of 0/1 values (masks): their product; a constant operand of no zeros leaves the other as it is.
void map_and(Ctx& c, const Node& n) {
  for (std::size_t i = 0; i < 2; ++i) {
    const std::size_t other = 1 - i;
    if (!c.is_constant(n.inputs.at(i)) || c.is_constant(n.inputs.at(other))) continue;
    const HostTensor& t = c.constant(n, i);
    const std::vector<double> v = t.values();
    if (std::all_of(v.begin(), v.end(), [](double e) { return e != 0; }) &&
        broadcast_dims(t.dims, c.shape(n, other), n.name) == c.shape(n, other)) {
      c.slots[n.outputs.at(0)] = c.slot(n.inputs[other], n);
      return;
    }
  }
  for (std::size_t i = 0; i < 2; ++i)
    if (!c.is_constant(n.inputs.at(i)) && !c.slot(n.inputs[i], n).integral)
      c.refuse(n, "its input '" + n.inputs[i] + "' is not a mask of integer values");
  const nn::Value a = c.value(n, 0), b = c.value(n, 1);
  c.set(n.outputs.at(0), nn::binary(c.b, c.unique_name(n.name), a, b, nn::BinaryKind::mul));
  c.slots[n.outputs.at(0)].integral = true;
}

// IsNaN(x) as x - x, which is NaN (true to Where) where x is NaN or infinite and 0 elsewhere: mapped
// where x is a Softmax's output (never infinite) read only as Where's condition (the export of
// scaled_dot_product_attention zeroes fully masked rows so).
void map_isnan(Ctx& c, const Node& n) {
  const std::string& x = n.inputs.at(0);
  const bool from_softmax = std::any_of(c.s.nodes.begin(), c.s.nodes.end(), [&](const Node& m) {
    return m.op == "Softmax" && !m.outputs.empty() && m.outputs[0] == x;
  });
  const bool only_conditions = std::all_of(c.s.nodes.begin(), c.s.nodes.end(), [&](const Node& m) {
    for (std::size_t i = 0; i < m.inputs.size(); ++i)
      if (m.inputs[i] == n.outputs.at(0) && (m.op != "Where" || i != 0)) return false;
    return true;
  });
  if (!from_softmax || !only_conditions || n.outputs[0] == c.s.facts.output_name)
    c.refuse(n, "mapped only on a Softmax's output read as Where's condition");
  const nn::Value v = c.value(n, 0);
  c.set(n.outputs.at(0), nn::binary(c.b, c.unique_name(n.name), v, v, nn::BinaryKind::sub));
}

void map_where(Ctx& c, const Node& n) {
  const nn::Value cond = c.value(n, 0), x = c.value(n, 1), y = c.value(n, 2);
  c.set(n.outputs.at(0), nn::where(c.b, c.unique_name(n.name), cond, x, y));
}

void map_expand(Ctx& c, const Node& n) {
  const std::vector<std::int64_t> dims = broadcast_dims(c.shape(n, 0), ints(c.constant(n, 1)), n.name);
  c.set(n.outputs.at(0), nn::expand(c.b, c.unique_name(n.name), c.value(n, 0), to_shape(dims, n.name)));
}

void map_layer_norm(Ctx& c, const Node& n) {
  const std::vector<std::int64_t> x = c.shape(n, 0);
  const int axis = normalize_axis(attr_int(n, "axis", -1), static_cast<std::int64_t>(x.size()), n);
  if (n.outputs.size() > 1 &&
      std::any_of(n.outputs.begin() + 1, n.outputs.end(), [](const auto& o) { return !o.empty(); }))
    c.refuse(n, "its Mean and InvStdDev outputs are not mapped");
  std::int64_t count = 1;
  for (std::size_t k = static_cast<std::size_t>(axis); k < x.size(); ++k) count *= x[k];
  const auto full = [&](std::size_t i, double fallback) {
    std::vector<double> v(static_cast<std::size_t>(count), fallback);
    if (!c.has_input(n, i)) return v;
    const HostTensor& t = c.constant(n, i);
    if (t.numel() != count && t.numel() != 1) c.refuse(n, "scale and bias must cover the normalised dims");
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = t.value(t.numel() == 1 ? 0 : j);
    return v;
  };
  const std::string name = c.unique_name(n.name);
  c.set(n.outputs.at(0), nn::layer_norm(c.b, name, c.value(n, 0), axis, attr_float(n, "epsilon", 1e-5)));
  c.params[name + ".weight"] = full(1, 1.0);
  c.params[name + ".bias"] = full(2, 0.0);
}

}  // namespace

void add_generic_mappings(MapTable& t) {
  using U = nn::UnaryKind;
  using B = nn::BinaryKind;
  t["Sigmoid"] = map_unary<U::sigmoid>;
  t["HardSwish"] = map_unary<U::hard_swish>;
  t["Erf"] = map_unary<U::erf>;
  t["Sqrt"] = map_unary<U::sqrt>;
  t["Exp"] = map_unary<U::exp>;
  t["Tanh"] = map_unary<U::tanh>;
  t["Neg"] = map_unary<U::neg>;
  t["Abs"] = map_unary<U::abs>;
  t["Reciprocal"] = map_unary<U::reciprocal>;
  t["HardSigmoid"] = map_hard_sigmoid;
  t["LeakyRelu"] = map_leaky_relu;
  t["Clip"] = map_clip;
  t["Add"] = map_add;
  t["Sub"] = map_binary<B::sub>;
  t["Mul"] = map_binary<B::mul>;
  t["Div"] = map_binary<B::div>;
  t["Pow"] = map_binary<B::pow>;
  t["Max"] = map_binary<B::max>;
  t["Min"] = map_binary<B::min>;
  t["Concat"] = map_concat;
  t["Split"] = map_split;
  t["Slice"] = map_slice;
  t["Transpose"] = map_transpose;
  t["Softmax"] = map_softmax;
  t["ReduceMean"] = map_reduce_mean;
  t["AveragePool"] = map_average_pool;
  t["Pad"] = map_pad;
  t["Resize"] = map_resize;
  t["Gather"] = map_gather;
  t["Where"] = map_where;
  t["And"] = map_and;
  t["IsNaN"] = map_isnan;
  t["Expand"] = map_expand;
  t["LayerNormalization"] = map_layer_norm;
}

}  // namespace ab::onnx
