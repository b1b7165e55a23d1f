// The ONNX importer against the same networks built natively with the nn builders, on the
// reference backend in float64, with fresh random weights and inputs; and every bad input refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>

#include "nn/ops.h"
#include "onnx/onnx.h"
#include "onnx_builder.h"
#include "results/results.h"
#include "test_support.h"
#include "workloads/models/models.h"

namespace ab {
namespace {

using onnx_test::f64_inference;
using onnx_test::max_rel_diff;
using onnx_test::OnnxBuilder;
using onnx_test::random_values;
using onnx_test::run;
using OB = OnnxBuilder;

struct Net {
  OnnxBuilder onnx;
  nn::ParameterValues native;  // the same numbers by the native graph's names
  std::uint64_t seed = 0;
  std::uint64_t next() { return seed++; }
};

// Conv (no bias) + BatchNormalization in ONNX; their values under native names "<name>.conv", "<name>.bn".
// With `bias`, the convolution has one of its own before the batch norm (native: "<name>.cb", a bias_act).
std::string conv_bn(Net& t, const std::string& name, const std::string& in, std::int64_t c, std::int64_t k,
                    bool bias = false) {
  const std::vector<double> w = random_values(t.next(), k * c * 9, -0.5, 0.5);
  const std::vector<double> gamma = random_values(t.next(), k, 0.5, 1.5), beta = random_values(t.next(), k),
                            mean = random_values(t.next(), k, -0.2, 0.2), var = random_values(t.next(), k, 0.5, 1.5);
  std::vector<std::string> inputs{in, t.onnx.init(name + ".w", {k, c, 3, 3}, w)};
  if (bias) {
    t.native[name + ".cb.bias"] = random_values(t.next(), k);
    inputs.push_back(t.onnx.init(name + ".cbias", {k}, t.native[name + ".cb.bias"]));
  }
  auto* conv = t.onnx.node("Conv", inputs, {name + ".c"}, name + "/Conv");
  OB::attr(conv, "pads", std::vector<std::int64_t>{1, 1, 1, 1});
  OB::attr(conv, "kernel_shape", std::vector<std::int64_t>{3, 3});
  t.onnx.node("BatchNormalization",
              {name + ".c", t.onnx.init(name + ".g", {k}, gamma), t.onnx.init(name + ".b", {k}, beta),
               t.onnx.init(name + ".m", {k}, mean), t.onnx.init(name + ".v", {k}, var)},
              {name + ".y"}, name + "/BatchNormalization");
  t.native[name + ".conv.weight"] = w;
  t.native[name + ".bn.weight"] = gamma;
  t.native[name + ".bn.bias"] = beta;
  t.native[name + ".bn.running_mean"] = mean;
  t.native[name + ".bn.running_var"] = var;
  return name + ".y";
}

nn::Conv2dAttrs conv3x3(std::int64_t k, std::int64_t stride = 1) {
  nn::Conv2dAttrs a;
  a.out_channels = k;
  a.kernel_h = a.kernel_w = 3;
  a.conv.stride_h = a.conv.stride_w = stride;
  a.conv.pad_h = a.conv.pad_w = 1;
  return a;
}

nn::Value native_conv_bn(nn::GraphBuilder& b, const std::string& name, nn::Value x, std::int64_t k, bool bias = false) {
  nn::Value y = nn::conv2d(b, name + ".conv", x, conv3x3(k));
  if (bias) y = nn::bias_activation(b, name + ".cb", y, nn::Value{}, false);
  return nn::batchnorm2d(b, name + ".bn", y);
}

// A tiny ResNet: stem conv+bn+relu, one residual block, a biased stride-2 conv + relu (PyTorch's
// export folds batch norms into such biases), max pool, global average pool, flatten, Gemm.
Net tiny_resnet_onnx(std::uint64_t seed, std::int64_t batch_dim) {
  Net t;
  t.seed = seed;
  t.onnx.input("x", {batch_dim, 3, 8, 8});
  t.onnx.node("Relu", {conv_bn(t, "stem", "x", 3, 8, /*bias=*/true)}, {"a"});
  t.onnx.node("Relu", {conv_bn(t, "b1", "a", 8, 8)}, {"r1"});
  t.onnx.node("Add", {conv_bn(t, "b2", "r1", 8, 8), "a"}, {"sum"});
  t.onnx.node("Relu", {"sum"}, {"r2"});
  const std::vector<double> dw = random_values(t.next(), 16 * 8 * 9, -0.5, 0.5), db = random_values(t.next(), 16);
  auto* down = t.onnx.node("Conv", {"r2", t.onnx.init("down.w", {16, 8, 3, 3}, dw), t.onnx.init("down.b", {16}, db)},
                           {"d"}, "down/Conv");
  OB::attr(down, "pads", std::vector<std::int64_t>{1, 1, 1, 1});
  OB::attr(down, "strides", std::vector<std::int64_t>{2, 2});
  t.onnx.node("Relu", {"d"}, {"dr"});
  auto* pool = t.onnx.node("MaxPool", {"dr"}, {"p"});
  OB::attr(pool, "kernel_shape", std::vector<std::int64_t>{3, 3});
  OB::attr(pool, "strides", std::vector<std::int64_t>{2, 2});
  OB::attr(pool, "pads", std::vector<std::int64_t>{1, 1, 1, 1});
  t.onnx.node("GlobalAveragePool", {"p"}, {"g"});
  t.onnx.node("Flatten", {"g"}, {"f"});
  const std::vector<double> fw = random_values(t.next(), 10 * 16), fb = random_values(t.next(), 10);
  auto* gemm = t.onnx.node("Gemm", {"f", t.onnx.init("fc.w", {10, 16}, fw), t.onnx.init("fc.b", {10}, fb)}, {"logits"});
  OB::attr(gemm, "transB", std::int64_t{1});
  t.onnx.output("logits");
  t.native["down.conv.weight"] = dw;
  t.native["down.bias"] = db;
  t.native["fc.weight"] = fw;
  t.native["fc.bias"] = fb;
  return t;
}

nn::Value tiny_resnet_native(nn::GraphBuilder& b, nn::Value x) {
  const nn::Value a = nn::relu(b, "r0", native_conv_bn(b, "stem", x, 8, /*bias=*/true));
  const nn::Value r1 = nn::relu(b, "r1", native_conv_bn(b, "b1", a, 8));
  const nn::Value r2 = nn::relu(b, "r2", nn::add(b, "add", native_conv_bn(b, "b2", r1, 8), a));
  const nn::Value d = nn::bias_activation(b, "down", nn::conv2d(b, "down.conv", r2, conv3x3(16, 2)), nn::Value{}, true);
  const nn::Value p = nn::maxpool2d(b, "pool", d, nn::Pool2dDesc{3, 3, 2, 2, 1, 1});
  return nn::linear(b, "fc", nn::global_avgpool(b, "gap", p), 10);
}

std::vector<double> run_imported(const std::string& bytes, std::int64_t batch, onnx::Fold fold,
                                 const std::vector<double>& x, std::vector<std::string>* fused = nullptr) {
  const auto model = onnx::Model::parse(bytes, "test.onnx");
  nn::GraphBuilder b(f64_inference());
  onnx::Imported m = onnx::import(b, *model, {batch, fold});
  if (fused != nullptr) *fused = m.fused;
  return run(std::move(b), m.input, m.output, m.parameters, x);
}

std::vector<double> tiny_resnet_reference(Net& t, std::int64_t batch, const std::vector<double>& x) {
  nn::GraphBuilder b(f64_inference());
  const nn::Value in = b.input("x", Shape{batch, 3, 8, 8});
  const nn::Value out = tiny_resnet_native(b, in);
  return run(std::move(b), in, out, t.native, x);
}

TEST(OnnxImport, TinyResnetMatchesTheNativeGraphInEveryFoldMode) {
  Net t = tiny_resnet_onnx(test::seed(), 2);
  const std::vector<double> x = random_values(test::seed(), 2 * 3 * 8 * 8);
  const std::vector<double> want = tiny_resnet_reference(t, 2, x);
  for (onnx::Fold fold : {onnx::Fold::off, onnx::Fold::on, onnx::Fold::fused}) {
    std::vector<std::string> fused;
    const std::vector<double> got = run_imported(t.onnx.bytes(), 2, fold, x, &fused);
    EXPECT_LT(max_rel_diff(got, want), 1e-10) << "fold mode " << static_cast<int>(fold);
    if (fold == onnx::Fold::off) continue;
    // The stem and block convolutions take their batch norm, ReLU and (b2) the residual add.
    ASSERT_EQ(fused.size(), 4u);
    EXPECT_EQ(fused[0], "Conv+BatchNormalization+Relu: stem/Conv");
    EXPECT_EQ(fused[2], "Conv+BatchNormalization+Add+Relu: b2/Conv");
    EXPECT_EQ(fused[3], "Conv+Relu: down/Conv");
  }
}

TEST(OnnxImport, FusedImportRunsTheResnetBuildersFusedOps) {
  Net t = tiny_resnet_onnx(test::seed(), -1);
  const auto model = onnx::Model::parse(t.onnx.bytes(), "test.onnx");
  nn::GraphOptions o;
  o.training = false;
  nn::GraphBuilder b(o);
  onnx::import(b, *model, {4, onnx::Fold::fused});
  const nn::Graph g(std::move(b));
  std::map<std::string, int> kinds;
  for (const auto& op : g.report()) ++kinds[op.kind];
  EXPECT_EQ(kinds["conv_bias_act"], 4);
  EXPECT_EQ(kinds["batchnorm2d"] + kinds["relu"] + kinds["add"] + kinds["bias_act"], 0);
  EXPECT_EQ(kinds["maxpool2d"], 1);
  EXPECT_EQ(kinds["global_avgpool"], 1);
  EXPECT_EQ(kinds["linear"], 1);
  EXPECT_EQ(g.op_count(), 7u) << "the flatten after the pooling must be a view, not an op";
}

TEST(OnnxImport, SymbolicBatchIsBoundPerBatchValue) {
  Net t = tiny_resnet_onnx(test::seed(), -1);
  for (std::int64_t batch : {1, 3}) {
    const std::vector<double> x = random_values(test::seed(), batch * 3 * 8 * 8);
    const std::vector<double> got = run_imported(t.onnx.bytes(), batch, onnx::Fold::fused, x);
    EXPECT_EQ(got.size(), static_cast<std::size_t>(batch * 10));
    EXPECT_LT(max_rel_diff(got, tiny_resnet_reference(t, batch, x)), 1e-10) << "batch " << batch;
  }
  const auto model = onnx::Model::parse(t.onnx.bytes(), "test.onnx");
  EXPECT_TRUE(model->facts().symbolic_batch);
  Net fixed = tiny_resnet_onnx(test::seed(), 2);
  const auto fixed_model = onnx::Model::parse(fixed.onnx.bytes(), "fixed.onnx");
  nn::GraphBuilder b(f64_inference());
  EXPECT_NE(test::usage_error([&] {
              onnx::import(b, *fixed_model, {3, onnx::Fold::off});
            }).find("fixed batch of 2"),
            std::string::npos);
}

// x.view(x.size(0), -1) as PyTorch exports it, with the element count computed from the shape too.
TEST(OnnxImport, PytorchShapeSubgraphFoldsIntoAStaticReshape) {
  OnnxBuilder m;
  m.input("x", {-1, 4, 2, 2});
  m.node("Shape", {"x"}, {"shape"});
  m.node("Gather", {"shape", m.init_ints("zero", {}, {0})}, {"n"});
  m.node("Unsqueeze", {"n", m.init_ints("axes0", {1}, {0})}, {"n1"});
  // C*H*W: the shape's tail through Slice, a float round trip (Cast) and integer products.
  m.node("Slice",
         {"shape", m.init_ints("s", {1}, {1}), m.init_ints("e", {1}, {std::numeric_limits<std::int64_t>::max()})},
         {"chw"});
  OB::attr(m.node("Cast", {"chw"}, {"chw_f"}), "to", std::int64_t{::onnx::TensorProto_DataType_FLOAT});
  OB::attr(m.node("Cast", {"chw_f"}, {"chw_i"}), "to", std::int64_t{::onnx::TensorProto_DataType_INT64});
  m.node("Gather", {"chw_i", m.init_ints("one", {}, {0})}, {"c_"});
  m.node("Gather", {"chw_i", m.init_ints("two", {}, {1})}, {"h_"});
  m.node("Gather", {"chw_i", m.init_ints("three", {}, {2})}, {"w_"});
  m.node("Mul", {"c_", "h_"}, {"ch"});
  m.node("Mul", {"ch", "w_"}, {"chw_n"});
  m.node("Unsqueeze", {"chw_n", "axes0"}, {"chw1"});
  OB::attr(m.node("Concat", {"n1", "chw1"}, {"target"}), "axis", std::int64_t{0});
  m.node("Reshape", {"x", "target"}, {"flat"});
  const std::vector<double> w = random_values(test::seed(), 5 * 16), bias = random_values(test::seed(), 5);
  OB::attr(m.node("Gemm", {"flat", m.init("w", {5, 16}, w), m.init("b", {5}, bias)}, {"y"}), "transB", std::int64_t{1});
  m.output("y");
  for (std::int64_t batch : {1, 5}) {
    const std::vector<double> x = random_values(test::seed(), batch * 16);
    nn::GraphBuilder b(f64_inference());
    const nn::Value in = b.input("x", Shape{batch, 16});
    const std::vector<double> want =
        run(std::move(b), in, nn::linear(b, "fc", in, 5), {{"fc.weight", w}, {"fc.bias", bias}}, x);
    EXPECT_LT(max_rel_diff(run_imported(m.bytes(), batch, onnx::Fold::fused, x), want), 1e-12) << "batch " << batch;
  }
}

nn::Conv2dAttrs conv1x1(std::int64_t k) {
  nn::Conv2dAttrs a;
  a.out_channels = k;
  return a;
}

// Squeeze-excitation (MobileNetV3, EfficientNet): global pool, two biased 1x1 convolutions, a gate
// (HardSigmoid, or Sigmoid for EfficientNet's), multiplied into x by broadcasting; then SiLU as
// x * Sigmoid(x).
TEST(OnnxImport, SqueezeExcitationBlockMatchesTheNativeGraph) {
  for (const bool hard : {true, false}) {
    OnnxBuilder m;
    m.input("x", {-1, 8, 4, 4});
    m.node("GlobalAveragePool", {"x"}, {"s"});
    const std::vector<double> w1 = random_values(test::seed(), 4 * 8), b1 = random_values(test::seed(), 4),
                              w2 = random_values(test::seed(), 8 * 4), b2 = random_values(test::seed(), 8);
    m.node("Conv", {"s", m.init("w1", {4, 8, 1, 1}, w1), m.init("b1", {4}, b1)}, {"s1"}, "fc1");
    m.node("Relu", {"s1"}, {"s2"});
    m.node("Conv", {"s2", m.init("w2", {8, 4, 1, 1}, w2), m.init("b2", {8}, b2)}, {"s3"}, "fc2");
    auto* gate = m.node(hard ? "HardSigmoid" : "Sigmoid", {"s3"}, {"g"});
    const double alpha = static_cast<float>(1.0 / 6);  // as the attribute stores it
    if (hard) OB::attr(gate, "alpha", alpha);
    m.node("Mul", {"x", "g"}, {"se"});
    m.node("Sigmoid", {"se"}, {"sig"});
    m.node("Mul", {"se", "sig"}, {"y"});
    m.output("y");
    const std::int64_t batch = 2;
    const std::vector<double> x = random_values(test::seed(), batch * 8 * 16);
    nn::GraphBuilder b(f64_inference());
    const nn::Value in = b.input("x", Shape{batch, 8, 4, 4});
    const nn::Value pooled = nn::reshape(b, "view", nn::global_avgpool(b, "gap", in), Shape{batch, 8, 1, 1});
    const nn::Value h = nn::bias_activation(b, "fc1", nn::conv2d(b, "fc1.conv", pooled, conv1x1(4)), nn::Value{}, true);
    const nn::Value z = nn::bias_activation(b, "fc2", nn::conv2d(b, "fc2.conv", h, conv1x1(8)), nn::Value{}, false);
    const nn::UnaryAttrs g =
        hard ? nn::UnaryAttrs{nn::UnaryKind::hard_sigmoid, alpha, 0.5} : nn::UnaryAttrs{nn::UnaryKind::sigmoid, 0, 0};
    const nn::Value se = nn::binary(b, "mul", in, nn::unary(b, "gate", z, g), nn::BinaryKind::mul);
    const nn::Value y =
        nn::binary(b, "silu", se, nn::unary(b, "sig", se, {nn::UnaryKind::sigmoid, 0, 0}), nn::BinaryKind::mul);
    const nn::ParameterValues values{
        {"fc1.conv.weight", w1}, {"fc1.bias", b1}, {"fc2.conv.weight", w2}, {"fc2.bias", b2}};
    const std::vector<double> want = run(std::move(b), in, y, values, x);
    for (onnx::Fold fold : {onnx::Fold::off, onnx::Fold::fused})
      EXPECT_LT(max_rel_diff(run_imported(m.bytes(), batch, fold, x), want), 1e-10) << (hard ? "hard" : "sigmoid");
  }
}

// DenseNet: each layer's output concatenated to its input, then a pre-activation batch norm.
TEST(OnnxImport, DenseConcatenationMatchesTheNativeGraph) {
  OnnxBuilder m;
  m.input("x", {-1, 4, 4, 4});
  const std::vector<double> w = random_values(test::seed(), 4 * 4 * 9), bias = random_values(test::seed(), 4),
                            w2 = random_values(test::seed(), 2 * 8);
  const std::vector<double> gamma = random_values(test::seed(), 8, 0.5, 1.5), beta = random_values(test::seed(), 8),
                            mean = random_values(test::seed(), 8, -0.2, 0.2),
                            var = random_values(test::seed(), 8, 0.5, 1.5);
  OB::attr(m.node("Conv", {"x", m.init("w", {4, 4, 3, 3}, w), m.init("b", {4}, bias)}, {"c"}, "conv"), "pads",
           std::vector<std::int64_t>{1, 1, 1, 1});
  m.node("Relu", {"c"}, {"r"});
  OB::attr(m.node("Concat", {"x", "r"}, {"cat"}), "axis", std::int64_t{1});
  m.node("BatchNormalization",
         {"cat", m.init("g", {8}, gamma), m.init("be", {8}, beta), m.init("m", {8}, mean), m.init("v", {8}, var)},
         {"bn"}, "norm");
  m.node("Relu", {"bn"}, {"r2"});
  m.node("Conv", {"r2", m.init("w2", {2, 8, 1, 1}, w2)}, {"y"}, "transition");
  m.output("y");
  const std::vector<double> x = random_values(test::seed(), 3 * 4 * 16);
  nn::GraphBuilder b(f64_inference());
  const nn::Value in = b.input("x", Shape{3, 4, 4, 4});
  const nn::Value r = nn::bias_activation(b, "conv", nn::conv2d(b, "conv.conv", in, conv3x3(4)), nn::Value{}, true);
  const nn::Value cat = nn::concat(b, "cat", {in, r}, 1);
  const nn::Value y = nn::conv2d(b, "transition", nn::relu(b, "r2", nn::batchnorm2d(b, "norm", cat)), conv1x1(2));
  const nn::ParameterValues values{{"conv.conv.weight", w},  {"conv.bias", bias},         {"norm.weight", gamma},
                                   {"norm.bias", beta},      {"norm.running_mean", mean}, {"norm.running_var", var},
                                   {"transition.weight", w2}};
  const std::vector<double> want = run(std::move(b), in, y, values, x);
  for (onnx::Fold fold : {onnx::Fold::off, onnx::Fold::on, onnx::Fold::fused})
    EXPECT_LT(max_rel_diff(run_imported(m.bytes(), 3, fold, x), want), 1e-10);
}

// A transformer MLP as PyTorch exports it: LayerNormalization, MatMul + Add (nn.Linear on a 3-D
// input), GELU as Div -> Erf -> Add -> Mul -> Mul; the chains become layer_norm, linear, gelu_erf.
TEST(OnnxImport, TransformerMlpPatternsBecomeOneOpEach) {
  OnnxBuilder m;
  m.input("x", {-1, 3, 6});
  const std::vector<double> scale = random_values(test::seed(), 6, 0.5, 1.5), shift = random_values(test::seed(), 6),
                            w = random_values(test::seed(), 6 * 5), bias = random_values(test::seed(), 5);
  OB::attr(m.node("LayerNormalization", {"x", m.init("ln.s", {6}, scale), m.init("ln.b", {6}, shift)}, {"n"}, "ln"),
           "axis", std::int64_t{-1});
  m.node("MatMul", {"n", m.init("w", {6, 5}, w)}, {"mm"}, "fc");
  m.node("Add", {"mm", m.init("bias", {5}, bias)}, {"h"});
  m.node("Div", {"h", m.init("sqrt2", {}, {std::numbers::sqrt2})}, {"d"}, "gelu");
  m.node("Erf", {"d"}, {"e"});
  m.node("Add", {"e", m.init("one", {}, {1.0})}, {"e1"});
  m.node("Mul", {"h", "e1"}, {"p"});
  m.node("Mul", {"p", m.init("half", {}, {0.5})}, {"y"});
  m.output("y");
  const std::vector<double> x = random_values(test::seed(), 2 * 3 * 6);
  nn::GraphBuilder b(f64_inference());
  const nn::Value in = b.input("x", Shape{2, 3, 6});
  const nn::Value rows = nn::reshape(b, "rows", nn::layer_norm(b, "ln", in, 2, 1e-5), Shape{6, 6});
  const nn::Value y = nn::unary(b, "gelu", nn::linear(b, "fc", rows, 5), {nn::UnaryKind::gelu_erf, 0, 0});
  const std::vector<double> want = run(std::move(b), in, y,
                                       {{"ln.weight", scale},
                                        {"ln.bias", shift},
                                        {"fc.weight",
                                         [&] {
                                           std::vector<double> t(30);  // [6, 5] -> [5, 6]
                                           for (int k = 0; k < 6; ++k)
                                             for (int j = 0; j < 5; ++j)
                                               t[static_cast<std::size_t>(j * 6 + k)] =
                                                   w[static_cast<std::size_t>(k * 5 + j)];
                                           return t;
                                         }()},
                                        {"fc.bias", bias}},
                                       x);
  std::vector<std::string> fused;
  EXPECT_LT(max_rel_diff(run_imported(m.bytes(), 2, onnx::Fold::fused, x, &fused), want), 1e-10);
  EXPECT_EQ(fused, (std::vector<std::string>{"MatMul+Add (linear with bias): fc", "Div+Erf+Add+Mul+Mul (GELU): gelu"}));
}

// ConvNeXt's block tail: the channels-last MLP's second MatMul + Add, the Transpose back to
// channels first and the layer scale (Mul by [C, 1, 1]): the scale is folded into the linear, and
// the values are the unfolded formula's.
TEST(OnnxImport, LayerScaleAfterTheChannelsFirstTransposeFoldsIntoTheLinear) {
  OnnxBuilder m;
  m.input("x", {-1, 2, 3, 6});  // [N, H, W, 4C]
  const std::vector<double> w = random_values(test::seed(), 6 * 4), bias = random_values(test::seed(), 4),
                            gamma = random_values(test::seed(), 4, 0.5, 1.5);
  m.node("MatMul", {"x", m.init("w", {6, 4}, w)}, {"mm"}, "fc2");
  m.node("Add", {"mm", m.init("bias", {4}, bias)}, {"h"});
  OB::attr(m.node("Transpose", {"h"}, {"t"}, "first"), "perm", std::vector<std::int64_t>{0, 3, 1, 2});
  m.node("Mul", {"t", m.init("gamma", {4, 1, 1}, gamma)}, {"y"}, "scale");
  m.output("y");
  const std::int64_t batch = 2;
  const std::vector<double> x = random_values(test::seed(), batch * 2 * 3 * 6);
  std::vector<double> want(static_cast<std::size_t>(batch * 4 * 2 * 3));  // [N, C, H, W]
  for (std::int64_t n = 0; n < batch; ++n)
    for (std::int64_t p = 0; p < 6; ++p)  // pixel h * 3 + w
      for (std::int64_t c = 0; c < 4; ++c) {
        double v = bias[static_cast<std::size_t>(c)];
        for (std::int64_t k = 0; k < 6; ++k)
          v += x[static_cast<std::size_t>((n * 6 + p) * 6 + k)] * w[static_cast<std::size_t>(k * 4 + c)];
        want[static_cast<std::size_t>((n * 4 + c) * 6 + p)] = v * gamma[static_cast<std::size_t>(c)];
      }
  std::vector<std::string> fused;
  EXPECT_LT(max_rel_diff(run_imported(m.bytes(), batch, onnx::Fold::fused, x, &fused), want), 1e-12);
  EXPECT_EQ(fused, (std::vector<std::string>{"MatMul+Add+Transpose+Mul (linear with bias, the scale folded in): fc2"}));
  // A constant over another axis is a plain Mul after the linear.
  OnnxBuilder other;
  other.input("x", {-1, 2, 3, 6});
  other.node("MatMul", {"x", other.init("w", {6, 4}, w)}, {"mm"}, "fc2");
  other.node("Add", {"mm", other.init("bias", {4}, bias)}, {"h"});
  OB::attr(other.node("Transpose", {"h"}, {"t"}, "first"), "perm", std::vector<std::int64_t>{0, 3, 1, 2});
  other.node("Mul", {"t", other.init("gamma", {2, 1}, {0.5, 2.0})}, {"y"}, "scale");
  other.output("y");
  fused.clear();
  run_imported(other.bytes(), batch, onnx::Fold::fused, x, &fused);
  EXPECT_EQ(fused, (std::vector<std::string>{"MatMul+Add (linear with bias): fc2"}));
}

// ConvNeXt's channels-first LayerNorm as transformers writes it (mean, centred square through Pow,
// Sqrt, Div, per-channel scale and shift [C, 1, 1]), checked against the formula on the host.
TEST(OnnxImport, ElementwiseChainsWithScalarAndChannelConstantsBroadcast) {
  OnnxBuilder m;
  m.input("x", {-1, 4, 3, 3});
  const std::vector<double> scale = random_values(test::seed(), 4, 0.5, 1.5), shift = random_values(test::seed(), 4);
  const auto mean_c = [&](const std::string& in, const std::string& out) {
    auto* r = m.node("ReduceMean", {in}, {out});
    OB::attr(r, "axes", std::vector<std::int64_t>{1});
    OB::attr(r, "keepdims", std::int64_t{1});
  };
  mean_c("x", "u");
  m.node("Sub", {"x", "u"}, {"d"});
  m.node("Pow", {"d", m.init("two", {}, {2.0})}, {"d2"});
  mean_c("d2", "var");
  m.node("Add", {"var", m.init("eps", {}, {static_cast<float>(1e-6)})}, {"ve"});
  m.node("Sqrt", {"ve"}, {"sd"});
  m.node("Div", {"d", "sd"}, {"n"});
  m.node("Mul", {m.init("scale", {4, 1, 1}, scale), "n"}, {"ns"});
  m.node("Add", {"ns", m.init("shift", {4, 1, 1}, shift)}, {"y"});
  m.output("y");
  const std::int64_t batch = 2;
  const std::vector<double> x = random_values(test::seed(), batch * 36);
  std::vector<double> want(x.size());
  const double eps = static_cast<float>(1e-6);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t p = 0; p < 9; ++p) {
      const auto at = [&](std::int64_t ch) { return static_cast<std::size_t>((b * 4 + ch) * 9 + p); };
      double mean = 0, var = 0;
      for (std::int64_t ch = 0; ch < 4; ++ch) mean += x[at(ch)] / 4;
      for (std::int64_t ch = 0; ch < 4; ++ch) var += (x[at(ch)] - mean) * (x[at(ch)] - mean) / 4;
      for (std::int64_t ch = 0; ch < 4; ++ch)
        want[at(ch)] = scale[static_cast<std::size_t>(ch)] * (x[at(ch)] - mean) / std::sqrt(var + eps) +
                       shift[static_cast<std::size_t>(ch)];
    }
  EXPECT_LT(max_rel_diff(run_imported(m.bytes(), batch, onnx::Fold::fused, x), want), 1e-10);
}

// The model axis takes the file: infer checks it against its float64 reference (the imported graph
// unfolded on the reference kernels), writes the outputs where asked, and records the onnx block.
// layout=auto: NHWC on a GPU for a convolutional network (the tiny ResNet's four Convs), NCHW for an
// imported one of at most one Conv (rank-4 tensors are attention heads there) and on the CPU; an
// explicit layout stays as asked.
TEST(OnnxLayout, AutoIsNhwcOnAGpuButForANetworkOfAtMostOneConv) {
  using workloads::zoo::layout_of;
  test::TempDir dir;
  dir.write("tiny.onnx", tiny_resnet_onnx(test::seed(), -1).onnx.bytes());
  OnnxBuilder mm;
  mm.input("x", {1, 4});
  mm.node("MatMul", {"x", mm.init("w", {4, 3}, random_values(test::seed(), 12))}, {"y"}, "mm");
  mm.output("y", {1, 3});
  dir.write("matmul.onnx", mm.bytes());
  const std::string resnet = (dir.path() / "tiny.onnx").string(), matmul = (dir.path() / "matmul.onnx").string();
  EXPECT_EQ(layout_of("auto", resnet, true), Layout::nhwc);
  EXPECT_EQ(layout_of("auto", matmul, true), Layout::nchw);
  EXPECT_EQ(layout_of("auto", resnet, false), Layout::nchw);
  EXPECT_EQ(layout_of("auto", "resnet50", true), Layout::nhwc);
  EXPECT_EQ(layout_of("nhwc", matmul, true), Layout::nhwc);
  EXPECT_EQ(layout_of("nchw", resnet, true), Layout::nchw);
}

TEST(OnnxCli, DumpOutputsAllRunsEverySampleOfTheInputsFileInBatchesOfThePoint) {
  test::TempDir dir;
  Net t = tiny_resnet_onnx(test::seed(), -1);
  const std::string file = (dir.path() / "tiny.onnx").string();
  dir.write("tiny.onnx", t.onnx.bytes());
  constexpr std::size_t kSamples = 5, kPixels = 3 * 8 * 8, kClasses = 10;
  const std::vector<double> x = random_values(test::seed() + 1, kSamples * kPixels);
  const std::vector<float> xf(x.begin(), x.end());
  dir.write("inputs.f32", std::string(reinterpret_cast<const char*>(xf.data()), xf.size() * sizeof(float)));
  const std::string inputs = "inputs=" + (dir.path() / "inputs.f32").string();
  const test::Ran o = test::accelbench({"run", "infer", "--device", "cpu", "--axis", "model=" + file, "--axis",
                                        "batch=1,2", "--option", inputs, "--option", "dump_outputs=all", "--min-time",
                                        "0.02", "--out", dir.path().string(), "-q"});
  ASSERT_EQ(o.code, 0) << o.output;
  const std::vector<nlohmann::json> records = test::only_run_records(dir.path());
  ASSERT_EQ(records.size(), 2u);
  const std::vector<double> want = tiny_resnet_reference(t, kSamples, x);
  for (const auto& r : records) {
    ASSERT_EQ(r["status"], "ok") << r.dump();
    // Batch 1: all five samples; batch 2: the two whole batches (four), the fifth left out.
    const std::size_t samples = r["params"]["batch"] == 1 ? 5 : 4;
    const std::filesystem::path out = r["metrics"]["outputs_file"].get<std::string>();
    ASSERT_EQ(std::filesystem::file_size(out), samples * kClasses * sizeof(float));
    std::ifstream f(out, std::ios::binary);
    std::vector<float> got(samples * kClasses);
    f.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size() * sizeof(float)));
    EXPECT_LT(max_rel_diff({got.begin(), got.end()},
                           {want.begin(), want.begin() + static_cast<std::ptrdiff_t>(samples * kClasses)}),
              1e-5);
  }
  // Without an inputs file there is nothing to run every sample of: the point says so.
  test::TempDir other;
  const test::Ran none =
      test::accelbench({"run", "infer", "--device", "cpu", "--axis", "model=" + file, "--axis", "batch=1", "--option",
                        "dump_outputs=all", "--min-time", "0.02", "--out", other.path().string(), "-q"});
  const std::vector<nlohmann::json> failed = test::only_run_records(other.path());
  ASSERT_EQ(failed.size(), 1u) << none.output;
  EXPECT_NE(failed[0]["status"], "ok");
  EXPECT_NE(failed[0]["reason"].get<std::string>().find("inputs file"), std::string::npos) << failed[0].dump();
}

TEST(OnnxCli, InferRunsAnOnnxFileAndRecordsWhatItIs) {
  test::TempDir dir;
  Net t = tiny_resnet_onnx(test::seed(), -1);
  const std::string file = (dir.path() / "tiny.onnx").string();
  dir.write("tiny.onnx", t.onnx.bytes());
  const std::vector<double> x = random_values(test::seed(), 2 * 3 * 8 * 8);
  const std::vector<float> xf(x.begin(), x.end());
  dir.write("inputs.f32", std::string(reinterpret_cast<const char*>(xf.data()), xf.size() * sizeof(float)));
  const test::Ran o =
      test::accelbench({"run", "infer", "--device", "cpu", "--axis", "model=" + file, "--axis", "batch=1,2", "--option",
                        "inputs=" + (dir.path() / "inputs.f32").string(), "--option", "dump_outputs=on", "--min-time",
                        "0.02", "--out", dir.path().string(), "-q"});
  ASSERT_EQ(o.code, 0) << o.output;
  const std::vector<nlohmann::json> records = test::only_run_records(dir.path());
  ASSERT_EQ(records.size(), 2u);
  const std::vector<double> want = tiny_resnet_reference(t, 2, x);
  for (const auto& r : records) {
    ASSERT_EQ(r["status"], "ok") << r.dump();
    const auto& onnx = r["metrics"]["onnx"];
    EXPECT_EQ(onnx["file"], "tiny.onnx");
    EXPECT_EQ(onnx["sha256"].get<std::string>().size(), 64u);
    EXPECT_EQ(onnx["opset"], 17);
    EXPECT_EQ(onnx["ops"]["Conv"], 4);
    EXPECT_GT(onnx["parameters"].get<double>(), 1000);
    EXPECT_GT(onnx["gflops_per_sample"].get<double>(), 0);
    EXPECT_EQ(onnx["fused_chains"], 4);
    EXPECT_EQ(r["metrics"]["layout"], "nchw") << "layout=auto on the CPU";
    // The outputs of the given inputs, in fp32 storage: PyTorch's comparison reads these.
    std::ifstream f(r["metrics"]["outputs_file"].get<std::string>(), std::ios::binary);
    const auto batch = r["params"]["batch"].get<std::size_t>();
    std::vector<float> got(batch * 10);
    f.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size() * sizeof(float)));
    ASSERT_TRUE(f);
    EXPECT_LT(
        max_rel_diff({got.begin(), got.end()}, {want.begin(), want.begin() + static_cast<std::ptrdiff_t>(batch * 10)}),
        1e-5);
  }
}

TEST(OnnxCli, LoadgenRunsAnOnnxFileAsItsSystemUnderTest) {
  test::TempDir dir;
  Net t = tiny_resnet_onnx(test::seed(), -1);
  const std::string file = (dir.path() / "tiny.onnx").string();
  dir.write("tiny.onnx", t.onnx.bytes());
  const test::Ran o =
      test::accelbench({"run", "loadgen", "--device", "cpu", "--axis", "sut=" + file, "--axis",
                        "scenario=single-stream", "--axis", "samples=64", "--out", dir.path().string(), "-q"});
  ASSERT_EQ(o.code, 0) << o.output;
  const std::vector<nlohmann::json> records = test::only_run_records(dir.path());
  ASSERT_EQ(records.size(), 1u);
  const auto& r = records[0];
  ASSERT_EQ(r["status"], "ok") << r.dump();
  EXPECT_NE(r["scenario"]["sut"].get<std::string>().find("tiny.onnx"), std::string::npos) << r["scenario"].dump();
  EXPECT_GT(r["counts"]["flops"].get<double>(), 0.0);
  EXPECT_GT(r["scenario"]["completed_samples_per_s"].get<double>(), 0.0);
}

TEST(OnnxCli, InspectPrintsTheHistogramTheFusionsAndEveryUnsupportedOp) {
  test::TempDir dir;
  Net t = tiny_resnet_onnx(test::seed(), -1);
  dir.write("tiny.onnx", t.onnx.bytes());
  test::Ran o = test::accelbench({"inspect", (dir.path() / "tiny.onnx").string()});
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_NE(o.output.find("Conv 4;"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("conv_bias_act 4;"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("Conv+BatchNormalization+Add+Relu: b2/Conv"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("GFLOP per sample"), std::string::npos) << o.output;
  t.onnx.node("TopK", {"logits"}, {"top"}, "top5");
  dir.write("topk.onnx", t.onnx.bytes());
  o = test::accelbench({"inspect", (dir.path() / "topk.onnx").string()});
  EXPECT_EQ(o.code, 1) << o.output;
  EXPECT_NE(o.output.find("TopK (1): top5"), std::string::npos) << o.output;
  dir.write("broken.onnx", t.onnx.bytes().substr(0, 100));
  o = test::accelbench({"inspect", (dir.path() / "broken.onnx").string()});
  EXPECT_EQ(o.code, 2) << o.output;
  // infer refuses the same file before anything runs, with the list.
  o = test::accelbench({"run", "infer", "--device", "cpu", "--axis", "model=" + (dir.path() / "topk.onnx").string(),
                        "--out", dir.path().string(), "-q"});
  EXPECT_NE(o.code, 0) << o.output;
  EXPECT_NE(o.output.find("TopK (1): top5"), std::string::npos) << o.output;
}

}  // namespace
}  // namespace ab
