// The ONNX importer at precision fp8 and the Pad merge: a ResNet written out as ONNX (the nodes
// PyTorch exports for torchvision's modules) imports to the ResNet builder's fp8 graph, the same
// layers e4m3 and the same logits, on the reference kernels and (where a GPU answers) on the CUDA
// ones; infer records which layers ran fp8. A zero Pad before a Conv becomes the convolution's
// padding; any other Pad stays a pad op; both compute what the native pad + conv graph computes.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "backend/backend.h"
#include "models/resnet.h"
#include "nn/cuda/device_kernels.h"
#include "nn/ops.h"
#include "onnx/onnx.h"
#include "onnx_builder.h"
#include "results/results.h"
#include "test_support.h"

namespace ab {
namespace {

using onnx_test::max_rel_diff;

using onnx_test::OnnxBuilder;
using onnx_test::random_values;
using OB = OnnxBuilder;

// ---------------------------------------------------------------------------------------------
// A ResNet config as ONNX, with the unfolded values by torchvision's names.

struct Exported {
  OnnxBuilder onnx;
  nn::ParameterValues values;  // unfolded, each value a float32 (what the initializers hold)
};

class ResnetExporter {
 public:
  ResnetExporter(const models::ResNetConfig& c, nn::ParameterValues values) : c_(c) { out_.values = std::move(values); }

  Exported run(std::int64_t image_px) {
    out_.onnx.input("images", {-1, c_.in_channels, image_px, image_px});
    std::string x = conv_bn("conv1", "bn1", "images", c_.stem_kernel, c_.stem_stride, 1);
    x = relu(x);
    if (c_.stem_maxpool) {
      auto* pool = out_.onnx.node("MaxPool", {x}, {"maxpool"});
      OB::attr(pool, "kernel_shape", std::vector<std::int64_t>{3, 3});
      OB::attr(pool, "strides", std::vector<std::int64_t>{2, 2});
      OB::attr(pool, "pads", std::vector<std::int64_t>{1, 1, 1, 1});
      x = "maxpool";
    }
    std::int64_t channels = c_.stem_channels;
    for (std::size_t s = 0; s < c_.blocks.size(); ++s)
      for (int i = 0; i < c_.blocks[s]; ++i) {
        const std::string p = "layer" + std::to_string(s + 1) + "." + std::to_string(i) + ".";
        const std::int64_t stride = (s > 0 && i == 0) ? 2 : 1, out = c_.planes[s] * c_.expansion;
        x = bottleneck(p, x, stride, channels != out || stride != 1);
        channels = out;
      }
    out_.onnx.node("GlobalAveragePool", {x}, {"avgpool"});
    out_.onnx.node("Flatten", {"avgpool"}, {"flat"});
    const auto fc_in = static_cast<std::int64_t>(out_.values.at("fc.weight").size()) / c_.num_classes;
    auto* fc =
        out_.onnx.node("Gemm", {"flat", init("fc.weight", {c_.num_classes, fc_in}), init("fc.bias")}, {"logits"});
    OB::attr(fc, "transB", std::int64_t{1});
    out_.onnx.output("logits");
    return std::move(out_);
  }

 private:
  // The initializer of a value (rounded to float32 in the values too, so both sides read the same).
  std::string init(const std::string& name, std::vector<std::int64_t> dims = {}) {
    std::vector<double>& v = out_.values.at(name);
    for (double& e : v) e = static_cast<float>(e);
    if (dims.empty()) dims = {static_cast<std::int64_t>(v.size())};
    return out_.onnx.init(name, dims, v);
  }

  std::string conv_bn(const std::string& conv, const std::string& bn, const std::string& x, std::int64_t kernel,
                      std::int64_t stride, std::int64_t groups) {
    const std::string w = conv + ".weight";
    const auto k = static_cast<std::int64_t>(out_.values.at(bn + ".weight").size());
    const auto per_group = static_cast<std::int64_t>(out_.values.at(w).size()) / (k * kernel * kernel);
    auto* n = out_.onnx.node("Conv", {x, init(w, {k, per_group, kernel, kernel})}, {conv}, conv);
    OB::attr(n, "kernel_shape", std::vector<std::int64_t>{kernel, kernel});
    OB::attr(n, "strides", std::vector<std::int64_t>{stride, stride});
    OB::attr(n, "pads", std::vector<std::int64_t>(4, kernel / 2));
    OB::attr(n, "group", groups);
    auto* b = out_.onnx.node(
        "BatchNormalization",
        {conv, init(bn + ".weight"), init(bn + ".bias"), init(bn + ".running_mean"), init(bn + ".running_var")}, {bn},
        bn);
    OB::attr(b, "epsilon", 1e-5);
    return bn;
  }

  std::string relu(const std::string& x) {
    out_.onnx.node("Relu", {x}, {x + ".relu"});
    return x + ".relu";
  }

  std::string bottleneck(const std::string& p, const std::string& x, std::int64_t stride, bool project) {
    std::string y = relu(conv_bn(p + "conv1", p + "bn1", x, 1, 1, 1));
    y = relu(conv_bn(p + "conv2", p + "bn2", y, 3, stride, c_.groups));
    y = conv_bn(p + "conv3", p + "bn3", y, 1, 1, 1);
    const std::string shortcut = project ? conv_bn(p + "downsample.0", p + "downsample.1", x, 1, stride, 1) : x;
    out_.onnx.node("Add", {y, shortcut}, {p + "add"});
    return relu(p + "add");
  }

  models::ResNetConfig c_;
  Exported out_;
};

// Stem 3 -> 16 (not fp8: 3 input channels), two bottleneck stages of planes 16 and 32 (every
// convolution 16..128 wide: 8 in fp8), 32 classes (the classifier [128 -> 32] in fp8 too).
models::ResNetConfig small_resnet() {
  models::ResNetConfig c = models::tiny_resnet(3, 32);
  c.name = "small_resnet";
  c.planes = {16, 32};
  c.stem_channels = 16;
  return c;
}
constexpr int kSmallResnetFp8Layers = 9;

nn::GraphOptions inference(Precision p, DType dtype = DType::f32, Layout layout = Layout::nchw) {
  nn::GraphOptions o;
  o.training = false;
  o.precision = p;
  o.dtype = dtype;
  o.layout = layout;
  return o;
}

// The unfolded network's values with fresh random batch-norm parameters and statistics (the
// initial ones, 1 and 0, would make the fold trivial), each a float32.
nn::ParameterValues random_unfolded_values(const models::ResNetConfig& c) {
  nn::GraphBuilder b(inference(Precision::fp32));
  models::resnet(b, b.input("images", Shape{1, c.in_channels, 8, 8}), c);
  nn::ParameterValues v = nn::Graph(std::move(b)).initial_parameter_values();
  for (auto& [name, values] : v) {
    const auto n = static_cast<std::int64_t>(values.size());
    const bool bn = name.starts_with("bn") || name.find(".bn") != std::string::npos ||
                    name.find("downsample.1.") != std::string::npos;
    if (name.ends_with("running_var") || (bn && name.ends_with(".weight")))
      values = random_values(test::seed(), n, 0.5, 1.5);
    else if (name.ends_with("running_mean") || name.ends_with(".bias"))
      values = random_values(test::seed(), n, -0.2, 0.2);
    for (double& e : values) e = static_cast<float>(e);
  }
  return v;
}

struct Outcome {
  std::vector<double> logits;
  int fp8_asked = 0, fp8_ran = 0;
  std::string first_fallback;  // why the first op asked for fp8 runs in 16 bits; empty where none fell back
};

Outcome run_graph(nn::GraphBuilder&& b, nn::Value in, nn::Value out, const nn::ParameterValues& values,
                  const std::vector<double>& x, nn::Kernels& k) {
  b.mark_output(out);
  nn::Graph g(std::move(b));
  g.bind(k);
  g.set_parameter_values(values);
  g.set_input(in, x);
  g.forward(false);
  Outcome r;
  r.logits = g.read(out);
  for (std::size_t i = 0; i < g.op_count(); ++i)
    if (const nn::Fp8Choice* c = g.op(i).fp8_choice(); c != nullptr && c->asked) {
      ++r.fp8_asked;
      r.fp8_ran += c->runs;
      if (!c->runs && r.first_fallback.empty()) r.first_fallback = g.op(i).name() + ": " + c->fallback_reason;
    }
  return r;
}

// The built-in network: folded (epsilon as the ONNX attribute holds it, a float32) and fused.
Outcome run_builtin(models::ResNetConfig c, const nn::ParameterValues& unfolded, Precision p, std::int64_t batch,
                    std::int64_t px, const std::vector<double>& x, nn::Kernels& k, Layout layout = Layout::nchw) {
  c.fold_batchnorm = c.fuse_conv_epilogue = true;
  nn::GraphBuilder b(inference(p, DType::f32, layout));
  const nn::Value in = b.input("images", Shape{batch, c.in_channels, px, px});
  const nn::Value out = models::resnet(b, in, c);
  const nn::ParameterValues folded = models::fold_batchnorm_parameters(unfolded, models::FoldedBias::on_convolution,
                                                                       static_cast<double>(static_cast<float>(1e-5)));
  return run_graph(std::move(b), in, out, folded, x, k);
}

Outcome run_import(const std::string& bytes, Precision p, std::int64_t batch, const std::vector<double>& x,
                   nn::Kernels& k, Layout layout = Layout::nchw) {
  const auto model = onnx::Model::parse(bytes, "resnet.onnx");
  nn::GraphBuilder b(inference(p, DType::f32, layout));
  onnx::Imported m = onnx::import(b, *model, {batch, onnx::Fold::fused});
  return run_graph(std::move(b), m.input, m.output, m.parameters, x, k);
}

// The unfolded network in float64 on the reference kernels: the function both compute.
std::vector<double> reference(const models::ResNetConfig& c, const nn::ParameterValues& unfolded, std::int64_t batch,
                              std::int64_t px, const std::vector<double>& x) {
  auto k = nn::make_ref_kernels();
  nn::GraphBuilder b(inference(Precision::fp32, DType::f64));
  const nn::Value in = b.input("images", Shape{batch, c.in_channels, px, px});
  return run_graph(std::move(b), in, models::resnet(b, in, c), unfolded, x, *k).logits;
}

// What infer's check allows fp8 logits against float64 (workloads/models: logits_tolerance).
constexpr double kFp8LogitsTolerance = 2.5e-1;

// On the reference kernels, which run every fp8 layer they are asked to: the imported graph builds
// exactly the built-in one's fp8 layers and computes its logits bit for bit (the same ops on the
// same folded values), within fp8's bound of float64 and further from it than fp16 is.
TEST(OnnxFp8, ImportedResnetRunsTheBuiltinFp8LayersOnTheReference) {
  const models::ResNetConfig c = small_resnet();
  const std::int64_t batch = 2, px = 8;
  Exported e = ResnetExporter(c, random_unfolded_values(c)).run(px);
  const std::vector<double> x = random_values(test::seed(), batch * 3 * px * px);
  auto k = nn::make_ref_kernels();
  const Outcome builtin = run_builtin(c, e.values, Precision::fp8, batch, px, x, *k);
  const Outcome imported = run_import(e.onnx.bytes(), Precision::fp8, batch, x, *k);
  EXPECT_EQ(builtin.fp8_asked, kSmallResnetFp8Layers);
  EXPECT_EQ(imported.fp8_asked, kSmallResnetFp8Layers);
  EXPECT_EQ(imported.fp8_ran, kSmallResnetFp8Layers);
  EXPECT_EQ(imported.logits, builtin.logits);
  const std::vector<double> want = reference(c, e.values, batch, px, x);
  const double fp8_error = max_rel_diff(imported.logits, want);
  const double fp16_error = max_rel_diff(run_import(e.onnx.bytes(), Precision::fp16, batch, x, *k).logits, want);
  EXPECT_LT(fp8_error, kFp8LogitsTolerance);
  EXPECT_GT(fp8_error, fp16_error) << "e4m3 operands must lose more than fp16 ones: did any layer run fp8?";
}

// fp8 needs the fused epilogue, and a model none of whose layers can run e4m3 is refused rather
// than run in fp16 under an fp8 label.
TEST(OnnxFp8, UnfusedGraphsAndModelsWithoutAnFp8LayerAreRefused) {
  const models::ResNetConfig c = small_resnet();
  Exported e = ResnetExporter(c, random_unfolded_values(c)).run(8);
  const auto model = onnx::Model::parse(e.onnx.bytes(), "resnet.onnx");
  for (onnx::Fold fold : {onnx::Fold::off, onnx::Fold::on}) {
    nn::GraphBuilder b(inference(Precision::fp8));
    const std::string msg = test::usage_error([&] { onnx::import(b, *model, {1, fold}); });
    EXPECT_NE(msg.find("fold=fused"), std::string::npos) << msg;
  }
  // Convolutions 2..16 wide with no input and output both multiples of 16, 10 classes: no fp8 layer.
  models::ResNetConfig thin = models::tiny_resnet(3, 10);
  thin.planes = {2, 4};
  Exported narrow = ResnetExporter(thin, random_unfolded_values(thin)).run(8);
  const auto narrow_model = onnx::Model::parse(narrow.onnx.bytes(), "narrow.onnx");
  nn::GraphBuilder b(inference(Precision::fp8));
  const std::string msg = test::usage_error([&] { onnx::import(b, *narrow_model, {1, onnx::Fold::fused}); });
  EXPECT_NE(msg.find("narrow.onnx: precision fp8 finds no layer"), std::string::npos) << msg;
}

// infer takes precision=fp8 for an ONNX file (fold=auto is fused), passes fp8's check against the
// float64 reference and records which layers ran e4m3, as for a built-in ResNet.
TEST(OnnxFp8, InferRecordsTheFp8LayersOfAnOnnxModel) {
  const models::ResNetConfig c = small_resnet();
  Exported e = ResnetExporter(c, random_unfolded_values(c)).run(8);
  test::TempDir dir;
  dir.write("small.onnx", e.onnx.bytes());
  const test::Ran o = test::accelbench({"run", "infer", "--device", "cpu", "--axis",
                                        "model=" + (dir.path() / "small.onnx").string(), "--axis", "batch=2", "--axis",
                                        "precision=fp8", "--min-time", "0.02", "--out", dir.path().string(), "-q"});
  ASSERT_EQ(o.code, 0) << o.output;
  const std::vector<nlohmann::json> records = test::only_run_records(dir.path());
  ASSERT_EQ(records.size(), 1u);
  const auto& r = records[0];
  ASSERT_EQ(r["status"], "ok") << r.dump();
  EXPECT_EQ(r["check"]["passed"], true);
  EXPECT_EQ(r["metrics"]["fp8"]["layers"], kSmallResnetFp8Layers);
  EXPECT_EQ(r["metrics"]["fp8"]["fallback_layers"], 0);
  EXPECT_EQ(r["metrics"]["fp8"]["layer_choice"], "faster");
  EXPECT_EQ(r["metrics"]["onnx"]["file"], "small.onnx");
}

// On the GPU, in NHWC as infer runs there (cuDNN's fp8 convolution reads NHWC only), with
// fp8_layers=all (one kernels object, so both graphs meet the same cached algorithm and fp8 choices
// per shape): the imported ResNet-50 at fp8 runs the same layers e4m3 as the
// built-in one, its logits match the built-in's within a fifth of fp8's bound, and both pass fp8's
// bound against float64; with fp8_layers=faster (the default) the imported graph still passes it.
TEST(OnnxFp8Gpu, ImportedResnet50MatchesTheBuiltinAtFp8) {
  if (backend::best_device() == "cpu") GTEST_SKIP() << "no CUDA device: a build without CUDA, or no GPU answers";
  models::ResNetConfig c = models::resnet50();
  const std::int64_t batch = 2, px = 64;
  Exported e = ResnetExporter(c, random_unfolded_values(c)).run(px);
  const std::string bytes = e.onnx.bytes();
  const std::vector<double> x = random_values(test::seed(), batch * 3 * px * px);
  const auto device = backend::make_backend("cuda:0");
  if (test::below_hopper(device->info()))
    GTEST_SKIP() << "compute capability " << device->info().compute_capability << ": fp8 convolutions need Hopper";
  std::unique_ptr<nn::Kernels> k = nn::make_device_kernels(*device);
  k->set_fp8_only_where_faster(false);
  const Outcome builtin = run_builtin(c, e.values, Precision::fp8, batch, px, x, *k, Layout::nhwc);
  const Outcome imported = run_import(bytes, Precision::fp8, batch, x, *k, Layout::nhwc);
  ASSERT_GT(builtin.fp8_ran, 0) << "a Hopper GPU ran no convolution in fp8: " << builtin.first_fallback;
  EXPECT_EQ(imported.fp8_asked, builtin.fp8_asked);
  EXPECT_EQ(imported.fp8_ran, builtin.fp8_ran);
  EXPECT_EQ(imported.fp8_asked, 52) << "ResNet-50's convolutions but the stem";
  const std::vector<double> want = reference(c, e.values, batch, px, x);
  EXPECT_LT(max_rel_diff(builtin.logits, want), kFp8LogitsTolerance);
  EXPECT_LT(max_rel_diff(imported.logits, want), kFp8LogitsTolerance);
  EXPECT_LT(max_rel_diff(imported.logits, builtin.logits), kFp8LogitsTolerance / 5);
  std::unique_ptr<nn::Kernels> faster = nn::make_device_kernels(*device);
  const Outcome timed = run_import(bytes, Precision::fp8, batch, x, *faster, Layout::nhwc);
  EXPECT_EQ(timed.fp8_asked, 52);
  EXPECT_LT(max_rel_diff(timed.logits, want), kFp8LogitsTolerance);
}

}  // namespace
}  // namespace ab
