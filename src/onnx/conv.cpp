// Conv chains as the ResNet builder builds them (models/resnet.cpp): unfolded conv2d, batchnorm2d,
// add, relu; or folded (models::fold_batchnorm_parameters on the pair's values) into a bias_act
// epilogue, or into the convolution itself (conv_bias_act; in an fp8 graph e4m3 where the
// builder's rule lets it, models::fp8_conv_eligible). Names follow its rule: the convolution
// "<node>.conv", its batch norm "<node>.bn", so the fold pairs them as it pairs torchvision's.
// A zero Pad before the convolution (groups.cpp) becomes part of the convolution's padding.
#include <algorithm>

#include "models/resnet.h"
#include "nn/ops.h"
#include "onnx/groups.h"

namespace ab::onnx {
namespace {

// Begin and end padding of one spatial dim under auto_pad (ONNX's rule for SAME_*).
std::pair<std::int64_t, std::int64_t> auto_pads(const std::string& mode, std::int64_t in, std::int64_t kernel,
                                                std::int64_t stride, std::int64_t dilation) {
  if (mode == "VALID") return {0, 0};
  const std::int64_t out = (in + stride - 1) / stride;
  const std::int64_t total = std::max<std::int64_t>(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - in);
  return mode == "SAME_UPPER" ? std::pair{total / 2, total - total / 2} : std::pair{total - total / 2, total / 2};
}

struct Chain {
  const Node *pad = nullptr, *conv = nullptr, *bn = nullptr, *add = nullptr, *relu = nullptr;
  std::size_t residual_input = 0;  // of the add
};

Chain read_chain(const Ctx& c, const Group& g) {
  Chain ch;
  for (std::size_t j = 0; j < g.nodes.size(); ++j) {
    const Node& n = c.s.nodes[static_cast<std::size_t>(g.nodes[j])];
    if (n.op == "Pad") ch.pad = &n;
    if (n.op == "Conv") ch.conv = &n;
    if (n.op == "BatchNormalization") ch.bn = &n;
    if (n.op == "Relu") ch.relu = &n;
    if (n.op == "Add" && j > 0) {
      ch.add = &n;
      const Node& before = c.s.nodes[static_cast<std::size_t>(g.nodes[j - 1])];
      ch.residual_input = n.inputs[0] == before.outputs[0] ? 1 : 0;
    }
  }
  return ch;
}

// The unfolded values of the pair (convolution weight; batch norm with the convolution's own bias
// moved into its mean, BN(conv + b) = BN'(conv) with mean' = mean - b), or the convolution alone.
void pair_values(const Ctx& c, const Chain& ch, const std::string& base, nn::ParameterValues& v,
                 std::vector<double>& conv_bias) {
  v[base + ".conv.weight"] = c.constant(*ch.conv, 1).values();
  const std::size_t k = static_cast<std::size_t>(c.constant(*ch.conv, 1).dims.at(0));
  conv_bias = c.has_input(*ch.conv, 2) ? c.constant(*ch.conv, 2).values() : std::vector<double>(k, 0.0);
  if (conv_bias.size() != k)
    c.refuse(*ch.conv,
             "bias has " + std::to_string(conv_bias.size()) + " values for " + std::to_string(k) + " filters");
  if (ch.bn == nullptr) return;
  const char* names[] = {"weight", "bias", "running_mean", "running_var"};
  for (std::size_t i = 0; i < 4; ++i) {
    std::vector<double> p = c.constant(*ch.bn, i + 1).values();
    if (p.size() != k)
      c.refuse(*ch.bn, std::string(names[i]) + " has " + std::to_string(p.size()) + " values for " + std::to_string(k) +
                           " channels");
    if (i == 2)
      for (std::size_t j = 0; j < k; ++j) p[j] -= conv_bias[j];
    v[base + ".bn." + names[i]] = std::move(p);
  }
}

std::vector<std::int64_t> conv_out_dims(const std::vector<std::int64_t>& x, const nn::Conv2dAttrs& a) {
  const auto out = [](std::int64_t in, std::int64_t pad, std::int64_t k, std::int64_t d, std::int64_t s) {
    return (in + 2 * pad - d * (k - 1) - 1) / s + 1;
  };
  return {x[0], a.out_channels, out(x[2], a.conv.pad_h, a.kernel_h, a.conv.dilation_h, a.conv.stride_h),
          out(x[3], a.conv.pad_w, a.kernel_w, a.conv.dilation_w, a.conv.stride_w)};
}

void build_conv_chain(Ctx& c, const Group& g) {
  const Chain ch = read_chain(c, g);
  const Node& conv = *ch.conv;
  const HostTensor& w = c.constant(conv, 1);
  const ConvGeometry geo = conv_geometry(c, conv, w, ch.pad);
  const std::string base = c.unique_name(conv.name);
  nn::ParameterValues values;
  std::vector<double> conv_bias;
  pair_values(c, ch, base, values, conv_bias);
  nn::Value x = pad_for_conv(c, conv, c.value(ch.pad ? *ch.pad : conv, 0), geo);
  // A residual of another shape (broadcast) is not the epilogue's: the add and ReLU then map alone.
  nn::Value residual;
  const bool take_add =
      ch.add != nullptr && c.shape(*ch.add, ch.residual_input) == conv_out_dims(to_dims(c.b.desc(x).shape), geo.attrs);
  if (take_add) residual = c.value(*ch.add, ch.residual_input);
  const bool relu = ch.relu != nullptr && (take_add || ch.add == nullptr);
  const double epsilon = ch.bn ? attr_float(*ch.bn, "epsilon", 1e-5) : 1e-5;
  nn::Value y;
  const Node* last = ch.bn ? ch.bn : &conv;
  if (c.fold == Fold::off) {
    y = nn::conv2d(c.b, base + ".conv", x, geo.attrs);
    if (ch.bn) y = nn::batchnorm2d(c.b, base + ".bn", y, nn::BatchNormDesc{epsilon, 0.1});
    else if (c.has_input(conv, 2))
      y = nn::bias_activation(c.b, base + ".bn", y, nn::Value{}, false), values[base + ".bn.bias"] = conv_bias;
    if (take_add) y = nn::add(c.b, base + ".add", y, residual), last = ch.add;
    if (relu) y = nn::relu(c.b, base + ".relu", y), last = ch.relu;
  } else {
    const ab::models::FoldedBias on =
        c.fold == Fold::fused ? ab::models::FoldedBias::on_convolution : ab::models::FoldedBias::on_batchnorm;
    if (ch.bn) values = ab::models::fold_batchnorm_parameters(std::move(values), on, epsilon);
    else values[base + (c.fold == Fold::fused ? ".conv.bias" : ".bn.bias")] = conv_bias;
    const bool fp8 = c.fold == Fold::fused && c.b.options().precision == Precision::fp8 &&
                     ab::models::fp8_conv_eligible(c.b.desc(x), geo.attrs);
    c.fp8_layers += fp8;
    y = c.fold == Fold::fused
            ? nn::conv_bias_activation(c.b, base + ".conv", x, geo.attrs, residual, relu, fp8)
            : nn::bias_activation(c.b, base + ".bn", nn::conv2d(c.b, base + ".conv", x, geo.attrs), residual, relu);
    last = relu ? ch.relu : take_add ? ch.add : last;
    std::string kind = ch.pad ? "Pad+Conv" : "Conv";
    if (ch.bn) kind += "+BatchNormalization";
    if (take_add) kind += "+Add";
    if (relu) kind += "+Relu";
    c.fused.push_back(kind + ": " + conv.name);
  }
  for (auto& [name, v] : values) c.params[name] = std::move(v);
  c.set(last->outputs.at(0), y);
  // What the chain did not take maps on its own, in order.
  for (const Node* rest : {ch.add, ch.relu})
    if (rest != nullptr && rest != last && !(rest == ch.add && take_add) && !(rest == ch.relu && relu))
      mappings().at(rest->op)(c, *rest);
}

void build_gelu(Ctx& c, const Group& g) {
  const Node& div = c.s.nodes[static_cast<std::size_t>(g.nodes.front())];
  const Node& half = c.s.nodes[static_cast<std::size_t>(g.nodes.back())];
  const nn::Value y =
      nn::unary(c.b, c.unique_name(div.name + ".gelu"), c.value(div, 0), nn::UnaryAttrs{nn::UnaryKind::gelu_erf, 0, 0});
  c.fused.push_back("Div+Erf+Add+Mul+Mul (GELU): " + div.name);
  c.set(half.outputs.at(0), y);
}

}  // namespace

ConvGeometry conv_geometry(const Ctx& c, const Node& n, const HostTensor& weight, const Node* pad) {
  const std::vector<std::int64_t> x = c.shape(pad ? *pad : n, 0);
  if (weight.dims.size() != 4 || x.size() != 4)
    c.refuse(n, "only 2-D convolutions (NCHW input, 4-D weight) are mapped");
  const std::int64_t groups = attr_int(n, "group", 1);
  ConvGeometry g;
  nn::Conv2dAttrs& a = g.attrs;
  a.out_channels = weight.dims[0];
  a.kernel_h = weight.dims[2];
  a.kernel_w = weight.dims[3];
  a.conv.groups = groups;
  std::vector<std::int64_t> strides = attr_ints(n, "strides"), dilations = attr_ints(n, "dilations"),
                            pads = attr_ints(n, "pads");
  if (strides.empty()) strides = {1, 1};
  if (dilations.empty()) dilations = {1, 1};
  if (pads.empty()) pads = {0, 0, 0, 0};
  if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4)
    c.refuse(n, "strides, dilations or pads do not fit a 2-D convolution");
  const auto positive = [](const std::vector<std::int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [](auto e) { return e >= 1 && e <= 4096; });
  };
  if (!positive(strides) || !positive(dilations) || groups < 1 || a.kernel_h < 1 || a.kernel_w < 1 ||
      std::any_of(pads.begin(), pads.end(), [](auto p) { return p < 0 || p > 4096; }))
    c.refuse(n, "strides, dilations, group and kernel must be positive and pads non-negative");
  if (weight.dims[1] * groups != x[1])
    c.refuse(n, "weight " + dims_text(weight.dims) + " with group " + std::to_string(groups) + " does not fit input " +
                    dims_text(x));
  const std::string mode = attr_string(n, "auto_pad", "NOTSET");
  if (mode != "NOTSET") {
    if (mode != "VALID" && mode != "SAME_UPPER" && mode != "SAME_LOWER")
      c.refuse(n, "auto_pad '" + mode + "' is not an ONNX mode");
    const auto [t, b] = auto_pads(mode, x[2], a.kernel_h, strides[0], dilations[0]);
    const auto [l, r] = auto_pads(mode, x[3], a.kernel_w, strides[1], dilations[1]);
    pads = {t, l, b, r};
  }
  if (pad != nullptr) {  // [N, C, H, W] begins then ends; plan_groups took only zero N and C pads
    const HostTensor& p = c.constant(*pad, 1);
    for (std::size_t i = 0; i < 2; ++i) {
      pads[i] += p.int_value(2 + i);
      pads[2 + i] += p.int_value(6 + i);
    }
  }
  a.conv.stride_h = strides[0], a.conv.stride_w = strides[1];
  a.conv.dilation_h = dilations[0], a.conv.dilation_w = dilations[1];
  a.conv.pad_h = std::min(pads[0], pads[2]);
  a.conv.pad_w = std::min(pads[1], pads[3]);
  g.extra_top = pads[0] - a.conv.pad_h, g.extra_bottom = pads[2] - a.conv.pad_h;
  g.extra_left = pads[1] - a.conv.pad_w, g.extra_right = pads[3] - a.conv.pad_w;
  return g;
}

nn::Value pad_for_conv(Ctx& c, const Node& n, nn::Value x, const ConvGeometry& g) {
  if (g.extra_top == 0 && g.extra_left == 0 && g.extra_bottom == 0 && g.extra_right == 0) return x;
  // Asymmetric padding (SAME_UPPER at stride 2, explicit pads): the difference as zero padding first.
  return nn::pad(c.b, c.unique_name(n.name + ".pad"), x, {0, 0, g.extra_top, g.extra_left},
                 {0, 0, g.extra_bottom, g.extra_right}, 0.0);
}

void build_group(Ctx& c, const Group& g) {
  if (g.kind == "gelu") build_gelu(c, g);
  else if (g.kind == "linear") map_linear_group(c, g);
  else build_conv_chain(c, g);
}

}  // namespace ab::onnx
