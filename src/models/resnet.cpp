#include "models/resnet.h"

#include <cmath>
#include <utility>

#include "core/error.h"
#include "nn/ops.h"

namespace ab::models {
namespace {

using nn::GraphBuilder;
using nn::Value;

nn::Conv2dAttrs conv_attrs(std::int64_t out_channels, std::int64_t kernel, std::int64_t stride, std::int64_t groups) {
  nn::Conv2dAttrs a;
  a.out_channels = out_channels;
  a.kernel_h = a.kernel_w = kernel;
  a.conv.stride_h = a.conv.stride_w = stride;
  a.conv.pad_h = a.conv.pad_w = kernel / 2;
  a.conv.groups = groups;
  return a;
}

// A folded convolution and its epilogue act(conv(x) + bias (+ residual)): one conv_bias_act named
// after the convolution, or a convolution and a bias_act named after the batch norm.
Value folded_conv(GraphBuilder& b, const ResNetConfig& c, const std::string& conv_name, const std::string& bn_name,
                  Value x, const nn::Conv2dAttrs& a, Value residual, bool relu) {
  if (c.fuse_conv_epilogue) {
    const bool fp8 = b.options().precision == Precision::fp8 && fp8_conv_eligible(b.desc(x), a);
    return nn::conv_bias_activation(b, conv_name, x, a, residual, relu, fp8);
  }
  return nn::bias_activation(b, bn_name, nn::conv2d(b, conv_name, x, a), residual, relu);
}

// Convolution, batch norm, ReLU; folded: see folded_conv.
Value conv_bn_relu(GraphBuilder& b, const ResNetConfig& c, const std::string& conv_name, const std::string& bn_name,
                   const std::string& relu_name, Value x, std::int64_t out_channels, std::int64_t kernel,
                   std::int64_t stride, std::int64_t groups) {
  const nn::Conv2dAttrs a = conv_attrs(out_channels, kernel, stride, groups);
  if (c.fold_batchnorm) return folded_conv(b, c, conv_name, bn_name, x, a, Value{}, true);
  const Value y = nn::conv2d(b, conv_name, x, a);
  if (c.fuse_batchnorm_relu) return nn::batchnorm_activation(b, bn_name, y, Value{});
  return nn::relu(b, relu_name, nn::batchnorm2d(b, bn_name, y));
}

Value conv_bn(GraphBuilder& b, const std::string& conv_name, const std::string& bn_name, Value x,
              std::int64_t out_channels, std::int64_t kernel, std::int64_t stride, std::int64_t groups) {
  return nn::batchnorm2d(b, bn_name, nn::conv2d(b, conv_name, x, conv_attrs(out_channels, kernel, stride, groups)));
}

// torchvision's Bottleneck: 1x1 reduce, 3x3 (stride, groups), 1x1 expand, each followed by a
// batch norm; a 1x1 strided projection on the shortcut where the shape changes. Folded, the last
// batch norm, the residual add and the final ReLU are one bias_act.
Value bottleneck(GraphBuilder& b, const std::string& p, Value x, std::int64_t in_channels, std::int64_t planes,
                 std::int64_t stride, const ResNetConfig& c) {
  const std::int64_t width = planes * c.width_per_group / 64 * c.groups;
  const std::int64_t out_channels = planes * c.expansion;
  const bool project = stride != 1 || in_channels != out_channels;
  Value y = conv_bn_relu(b, c, p + "conv1", p + "bn1", p + "relu1", x, width, 1, 1, 1);
  y = conv_bn_relu(b, c, p + "conv2", p + "bn2", p + "relu2", y, width, 3, stride, c.groups);
  if (c.fold_batchnorm) {
    Value shortcut = x;
    if (project)
      shortcut = folded_conv(b, c, p + "downsample.0", p + "downsample.1", x, conv_attrs(out_channels, 1, stride, 1),
                             Value{}, false);
    return folded_conv(b, c, p + "conv3", p + "bn3", y, conv_attrs(out_channels, 1, 1, 1), shortcut, true);
  }
  y = c.fuse_batchnorm_relu ? nn::conv2d(b, p + "conv3", y, conv_attrs(out_channels, 1, 1, 1))
                            : conv_bn(b, p + "conv3", p + "bn3", y, out_channels, 1, 1, 1);
  Value shortcut = x;
  if (project) shortcut = conv_bn(b, p + "downsample.0", p + "downsample.1", x, out_channels, 1, stride, 1);
  if (c.fuse_batchnorm_relu) return nn::batchnorm_activation(b, p + "bn3", y, shortcut);
  return nn::relu(b, p + "relu3", nn::add(b, p + "add", y, shortcut));
}

// The convolution a batch norm follows, by torchvision's names: "layer1.0.bn2" -> "layer1.0.conv2",
// "bn1" -> "conv1", "layer2.0.downsample.1" -> "layer2.0.downsample.0".
std::string conv_before(const std::string& bn) {
  const std::size_t dot = bn.rfind('.');
  const std::string prefix = dot == std::string::npos ? "" : bn.substr(0, dot + 1);
  const std::string last = dot == std::string::npos ? bn : bn.substr(dot + 1);
  if (last.starts_with("bn")) return prefix + "conv" + last.substr(2);
  if (last == "1" && prefix.ends_with("downsample.")) return prefix + "0";
  throw Error("fold_batchnorm_parameters: batch norm '" + bn + "' follows no convolution named by torchvision's rule");
}

}  // namespace

// No backend refuses it by rule (nn::fp8_conv_refusal: groups 1, C and K multiples of 16, 16-bit x
// and y). The shapes come from a Conv2d of the same attributes, whose rules conv_bias_act's are.
bool fp8_conv_eligible(const Tensor& x, const nn::Conv2dAttrs& a) {
  nn::Conv2d conv("fp8_eligible", a);
  const Tensor y = conv.infer({x})[0];
  const nn::ParamSpec w = conv.parameters()[0];
  return nn::fp8_conv_refusal(a.conv, x, Tensor::describe(w.dtype, w.shape), y).empty();
}

bool fp8_linear_eligible(const Tensor& x, std::int64_t out_features) {
  if (x.shape.rank() != 2) return false;
  return nn::fp8_linear_refusal(x, Tensor::describe(x.dtype, Shape{out_features, x.shape[1]}),
                                Tensor::describe(x.dtype, Shape{x.shape[0], out_features}))
      .empty();
}

ResNetConfig resnet50() { return {}; }

ResNetConfig resnet101() {
  ResNetConfig c;
  c.name = "resnet101";
  c.blocks = {3, 4, 23, 3};
  return c;
}

ResNetConfig resnext50_32x4d() {
  ResNetConfig c;
  c.name = "resnext50_32x4d";
  c.groups = 32;
  c.width_per_group = 4;
  return c;
}

ResNetConfig resnext101_32x4d() {
  ResNetConfig c = resnet101();
  c.name = "resnext101_32x4d";
  c.groups = 32;
  c.width_per_group = 4;
  return c;
}

ResNetConfig resnext101_32x8d() {
  ResNetConfig c = resnext101_32x4d();
  c.name = "resnext101_32x8d";
  c.width_per_group = 8;
  return c;
}

ResNetConfig tiny_resnet(std::int64_t in_channels, std::int64_t num_classes) {
  ResNetConfig c;
  c.name = "tiny_resnet";
  c.blocks = {1, 1};
  c.planes = {4, 8};
  c.in_channels = in_channels;
  c.stem_channels = 8;
  c.stem_kernel = 3;
  c.stem_stride = 1;
  c.stem_maxpool = false;
  c.num_classes = num_classes;
  return c;
}

ResNetConfig fashion_resnet() {
  ResNetConfig c = tiny_resnet(1, 10);
  c.name = "fashion_resnet";
  c.blocks = {2, 2, 2};
  c.planes = {16, 32, 64};
  c.stem_channels = 32;
  return c;
}

Value resnet(GraphBuilder& b, Value images, const ResNetConfig& c) {
  if (c.blocks.size() != c.planes.size() || c.blocks.empty())
    throw UsageError(c.name + ": blocks and planes must list the same, non-zero number of stages");
  // Only conv_bias_act runs e4m3: any other form would run the whole network in f16 under an fp8 label.
  if (b.options().precision == Precision::fp8 && !(c.fold_batchnorm && c.fuse_conv_epilogue))
    throw UsageError(c.name + ": precision fp8 runs the folded convolutions with their epilogue inside "
                     "(fold_batchnorm and fuse_conv_epilogue); an unfused graph would run no layer in fp8");
  Value x = conv_bn_relu(b, c, "conv1", "bn1", "relu", images, c.stem_channels, c.stem_kernel, c.stem_stride, 1);
  if (c.stem_maxpool) x = nn::maxpool2d(b, "maxpool", x, nn::Pool2dDesc{3, 3, 2, 2, 1, 1});
  std::int64_t channels = c.stem_channels;
  for (std::size_t s = 0; s < c.blocks.size(); ++s) {
    for (int i = 0; i < c.blocks[s]; ++i) {
      const std::int64_t stride = (s > 0 && i == 0) ? 2 : 1;
      const std::string prefix = "layer" + std::to_string(s + 1) + "." + std::to_string(i) + ".";
      x = bottleneck(b, prefix, x, channels, c.planes[s], stride, c);
      channels = c.planes[s] * c.expansion;
    }
  }
  const Value pooled = nn::global_avgpool(b, "avgpool", x);
  // The classifier in fp8 too where the same rule lets it (ImageNet's 1000 classes are not a
  // multiple of 16, so a ResNet's stays 16-bit; a head of 16k classes would not).
  const bool fp8_fc = b.options().precision == Precision::fp8 && fp8_linear_eligible(b.desc(pooled), c.num_classes);
  return nn::linear(b, "fc", pooled, c.num_classes, true, fp8_fc);
}

nn::ParameterValues fold_batchnorm_parameters(nn::ParameterValues values, FoldedBias bias_on, double epsilon) {
  const std::string stat = ".running_var";
  const auto take = [&](const std::string& name) {  // moves the value out and drops the name
    const auto it = values.find(name);
    if (it == values.end()) throw Error("fold_batchnorm_parameters: no parameter '" + name + "'");
    std::vector<double> v = std::move(it->second);
    values.erase(it);
    return v;
  };
  std::vector<std::string> batchnorms;
  for (const auto& entry : values)
    if (entry.first.ends_with(stat)) batchnorms.push_back(entry.first.substr(0, entry.first.size() - stat.size()));
  for (const std::string& bn : batchnorms) {
    const std::string conv_name = conv_before(bn), weight = conv_name + ".weight";
    const std::vector<double> var = take(bn + stat), gamma = take(bn + ".weight"), beta = take(bn + ".bias"),
                              mean = take(bn + ".running_mean");
    const auto it = values.find(weight);
    if (it == values.end()) throw Error("fold_batchnorm_parameters: no parameter '" + weight + "'");
    std::vector<double>& w = it->second;
    const std::size_t k = var.size();
    if (gamma.size() != k || beta.size() != k || mean.size() != k || k == 0 || w.size() % k != 0)
      throw Error("fold_batchnorm_parameters: batch norm '" + bn + "' (" + std::to_string(k) +
                  " channels) does not match convolution '" + weight + "' (" + std::to_string(w.size()) +
                  " weights)");
    std::vector<double> bias(k);
    const std::size_t per_filter = w.size() / k;  // KCRS: filter k's weights are contiguous
    for (std::size_t i = 0; i < k; ++i) {
      const double scale = gamma[i] / std::sqrt(var[i] + epsilon);
      for (std::size_t j = 0; j < per_filter; ++j) w[i * per_filter + j] *= scale;
      bias[i] = beta[i] - mean[i] * scale;
    }
    values[(bias_on == FoldedBias::on_convolution ? conv_name : bn) + ".bias"] = std::move(bias);
  }
  return values;
}

Classifier build_classifier(GraphBuilder& b, const ResNetConfig& c, std::int64_t batch, std::int64_t image_px) {
  Classifier m;
  m.images = b.input("images", Shape{batch, c.in_channels, image_px, image_px});
  m.labels = b.input("labels", Shape{batch}, DType::i32);
  m.logits = resnet(b, m.images, c);
  m.loss = nn::softmax_cross_entropy(b, "loss", m.logits, m.labels);
  b.mark_output(m.logits);
  b.set_loss(m.loss);
  return m;
}

}  // namespace ab::models
