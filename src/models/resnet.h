// ResNet v1.5 and ResNeXt as torchvision defines them (bottleneck blocks, the stride on the 3x3
// convolution, a batch norm after every convolution), built into an nn graph. One configuration
// struct covers ResNet-50/101/152, ResNeXt-50/101 and tiny variants for the reference backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/graph.h"

namespace ab::nn {
struct Conv2dAttrs;
}

namespace ab::models {

struct ResNetConfig {
  std::string name = "resnet50";
  std::vector<int> blocks{3, 4, 6, 3};                  // bottlenecks per stage
  std::vector<std::int64_t> planes{64, 128, 256, 512};  // per stage; a block outputs planes * expansion
  std::int64_t expansion = 4;
  // ResNeXt: the 3x3 convolution has `groups` groups and the bottleneck is
  // planes * width_per_group / 64 * groups wide (torchvision's rule); 1 and 64 give ResNet.
  std::int64_t groups = 1;
  std::int64_t width_per_group = 64;
  std::int64_t in_channels = 3;
  std::int64_t stem_channels = 64;
  std::int64_t stem_kernel = 7;  // padding kernel / 2
  std::int64_t stem_stride = 2;
  bool stem_maxpool = true;      // 3x3, stride 2, padding 1
  std::int64_t num_classes = 1000;
  // Inference only: each batch norm folded into the convolution before it, whose output then goes
  // through one bias_act op (nn::BiasActivation) that adds the folded shift and, where the
  // unfolded network follows with them, the block's residual and ReLU. The convolutions keep their
  // names and the bias_act op takes the batch norm's ("layer1.0.bn1", parameter "bias"), so
  // fold_batchnorm_parameters maps the unfolded network's values onto the folded one by name.
  bool fold_batchnorm = false;
  // With fold_batchnorm: the bias_act goes inside the convolution (one nn::ConvBiasActivation,
  // Kernels::conv2d_bias_activation_forward), named after the convolution, so the folded shift is
  // the convolution's "bias" (fold_batchnorm_parameters with FoldedBias::on_convolution).
  // In a graph of precision fp8 (which requires both flags) each of these whose convolution has
  // groups 1 and input and output channels multiples of 16 (nn::fp8_conv_refusal finds nothing) is
  // built with fp8 = true; the stem, grouped convolutions and the classifier stay 16-bit.
  bool fuse_conv_epilogue = false;
  // Unfolded (training too): each batch norm with the ReLU after it, and at a block's end with the
  // residual add between, as one nn::BatchNormActivation named after the batch norm (same
  // parameters; the ReLU and add ops disappear). The projection's batch norm stays plain.
  bool fuse_batchnorm_relu = false;
};

// Where the folded shift is stored: as the batch norm's "bias" (a bias_act op of the batch norm's
// name) or as the convolution's (a conv_bias_act op of the convolution's name).
enum class FoldedBias { on_batchnorm, on_convolution };

ResNetConfig resnet50();
ResNetConfig resnet101();
ResNetConfig resnext50_32x4d();
ResNetConfig resnext101_32x4d();
ResNetConfig resnext101_32x8d();
// Two stages of one bottleneck each, a 3x3 stride-1 stem and no max pool: a few thousand
// parameters, for small images on the reference backend (tests, CI).
ResNetConfig tiny_resnet(std::int64_t in_channels, std::int64_t num_classes);
// For 28x28 grey images (Fashion-MNIST, MNIST): a 3x3 stride-1 stem of 32 channels, no max pool,
// three stages of two bottlenecks (planes 16, 32, 64; outputs 64, 128, 256) at 28, 14 and 7 px,
// 10 classes: about 0.22 M parameters, the small-image ResNet shape of He et al.'s CIFAR networks.
ResNetConfig fashion_resnet();

// Whether a graph of precision fp8 builds a layer on `x` to run e4m3: where no backend refuses it
// by rule (nn::fp8_conv_refusal: groups 1, C and K multiples of 16, 16-bit x and y), which in a
// ResNet leaves out the stem (3 input channels) and ResNeXt's grouped 3x3 convolutions. The
// convolution's as conv_bias_act takes it; a linear layer's [N, in] -> [N, out_features] as the 1x1
// convolution its fp8 path runs (fp8_linear_refusal). The ONNX importer asks the same.
bool fp8_conv_eligible(const Tensor& x, const nn::Conv2dAttrs& a);
bool fp8_linear_eligible(const Tensor& x, std::int64_t out_features);

// Adds the network to `b` and returns the logits [N, num_classes]. Layer and parameter names
// follow torchvision's state_dict ("layer1.0.conv2.weight"). Throws nn::LayerError for a
// configuration that does not fit (the message names the layer).
nn::Value resnet(nn::GraphBuilder& b, nn::Value images, const ResNetConfig& c);

// The parameter values of the folded network (ResNetConfig::fold_batchnorm) that computes what the
// unfolded network computes with `unfolded` (its values by name: an unfolded graph's
// initial_parameter_values(), or trained ones). For each batch norm and the convolution before it,
//   s[k] = gamma[k] / sqrt(running_var[k] + epsilon),  W'[k] = W[k] * s[k],
//   bias'[k] = beta[k] - running_mean[k] * s[k]  (stored as the batch norm's or the convolution's
//   "bias", as `bias_on` says),
// the batch norm's other parameters are dropped and everything else is copied. Pairs follow
// torchvision's names (bnK after convK, downsample.1 after downsample.0); Error for a batch norm
// whose convolution or statistics are missing. Host arithmetic in f64. A mapping of values rather
// than a pass over a built graph: graphs are immutable once planned, and building the folded
// network directly plans (and sizes memory for) exactly what it runs.
// Takes the values by value: pass an rvalue to fold in place (a ResNeXt-101 32x8d holds 88 M).
nn::ParameterValues fold_batchnorm_parameters(nn::ParameterValues unfolded,
                                              FoldedBias bias_on = FoldedBias::on_batchnorm,
                                              double epsilon = nn::BatchNormDesc{}.epsilon);

// A classifier ready to train: images [N, C, H, W], i32 labels [N], logits and the mean
// softmax cross-entropy loss (set as the graph's loss; logits kept readable).
struct Classifier {
  nn::Value images, labels, logits, loss;
};
Classifier build_classifier(nn::GraphBuilder& b, const ResNetConfig& c, std::int64_t batch, std::int64_t image_px);

}  // namespace ab::models
