#include "models/resnet.h"

#include "core/error.h"
#include "nn/ops.h"

namespace ab::models {
namespace {

using nn::GraphBuilder;
using nn::Value;

Value conv_bn(GraphBuilder& b, const std::string& conv_name, const std::string& bn_name, Value x,
              std::int64_t out_channels, std::int64_t kernel, std::int64_t stride, std::int64_t groups) {
  nn::Conv2dAttrs a;
  a.out_channels = out_channels;
  a.kernel_h = a.kernel_w = kernel;
  a.conv.stride_h = a.conv.stride_w = stride;
  a.conv.pad_h = a.conv.pad_w = kernel / 2;
  a.conv.groups = groups;
  return nn::batchnorm2d(b, bn_name, nn::conv2d(b, conv_name, x, a));
}

// torchvision's Bottleneck: 1x1 reduce, 3x3 (stride, groups), 1x1 expand, each followed by a
// batch norm; a 1x1 strided projection on the shortcut where the shape changes.
Value bottleneck(GraphBuilder& b, const std::string& p, Value x, std::int64_t in_channels, std::int64_t planes,
                 std::int64_t stride, const ResNetConfig& c) {
  const std::int64_t width = planes * c.width_per_group / 64 * c.groups;
  const std::int64_t out_channels = planes * c.expansion;
  Value y = nn::relu(b, p + "relu1", conv_bn(b, p + "conv1", p + "bn1", x, width, 1, 1, 1));
  y = nn::relu(b, p + "relu2", conv_bn(b, p + "conv2", p + "bn2", y, width, 3, stride, c.groups));
  y = conv_bn(b, p + "conv3", p + "bn3", y, out_channels, 1, 1, 1);
  Value shortcut = x;
  if (stride != 1 || in_channels != out_channels)
    shortcut = conv_bn(b, p + "downsample.0", p + "downsample.1", x, out_channels, 1, stride, 1);
  return nn::relu(b, p + "relu3", nn::add(b, p + "add", y, shortcut));
}

}  // namespace

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

Value resnet(GraphBuilder& b, Value images, const ResNetConfig& c) {
  if (c.blocks.size() != c.planes.size() || c.blocks.empty())
    throw UsageError(c.name + ": blocks and planes must list the same, non-zero number of stages");
  Value x = nn::relu(b, "relu", conv_bn(b, "conv1", "bn1", images, c.stem_channels, c.stem_kernel, c.stem_stride, 1));
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
  return nn::linear(b, "fc", nn::global_avgpool(b, "avgpool", x), c.num_classes);
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
