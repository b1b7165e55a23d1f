// Tests for src/models: ResNet-50 v1.5 and ResNeXt parameter counts and forward MACs against
// torchvision's published figures (from the ops' own counts, no execution), the memory plan of a
// full-size training graph, and, on the reference backend, that a tiny ResNet learns a synthetic
// 4-class task and that two runs give bit-identical losses; batch norms folded into the
// convolutions compute the same function (a block, tiny ResNet logits) with fewer ops; an fp8
// graph marks exactly the convolutions e4m3 can run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/rng.h"
#include "models/compression.h"
#include "models/resnet.h"
#include "nn/ops.h"
#include "nn/optim.h"
#include "nn/ref/ref_kernels.h"
#include "test_support.h"

namespace ab::models {
namespace {

std::int64_t matmul_macs(const nn::Graph& g) {
  std::int64_t macs = 0;
  for (std::size_t i = 0; i < g.op_count(); ++i) {
    if (const auto* conv = dynamic_cast<const nn::Conv2d*>(&g.op(i))) macs += conv->macs();
    if (const auto* conv = dynamic_cast<const nn::ConvBiasActivation*>(&g.op(i))) macs += conv->macs();
    if (const auto* fc = dynamic_cast<const nn::Linear*>(&g.op(i))) macs += fc->macs();
  }
  return macs;
}

nn::Graph classifier_graph(const ResNetConfig& c, std::int64_t batch, std::int64_t px, bool training = true) {
  nn::GraphOptions o;
  o.training = training;
  nn::GraphBuilder b(o);
  build_classifier(b, c, batch, px);
  return nn::Graph(std::move(b));
}

const nn::Op& find_op(const nn::Graph& g, const std::string& name) {
  for (std::size_t i = 0; i < g.op_count(); ++i)
    if (g.op(i).name() == name) return g.op(i);
  throw Error("no op " + name);
}

TEST(ResNet, Resnet50MatchesTorchvision) {
  const nn::Graph g = classifier_graph(resnet50(), 1, 224);
  EXPECT_EQ(g.parameter_count(), 25'557'032);
  // torchvision lists 4.09 GFLOPS, counted as multiply-adds of convolutions and the classifier.
  const auto macs = static_cast<double>(matmul_macs(g));
  EXPECT_NEAR(macs / 4.09e9, 1.0, 0.01) << macs;
  // Everything else (batch norm, ReLU, adds, pools, loss) is well under 2% on top.
  const auto flops = static_cast<double>(g.forward_flops());
  EXPECT_GT(flops, 2 * macs);
  EXPECT_LT(flops, 2 * macs * 1.02);
  // Backward: twice the forward for every conv and linear, except the stem conv's data gradient.
  const auto stem = static_cast<double>(dynamic_cast<const nn::Conv2d&>(find_op(g, "conv1")).macs());
  EXPECT_NEAR(static_cast<double>(g.backward_flops()) / (2 * (2 * macs - stem)), 1.0, 0.02);

  // v1.5: the stride sits on the 3x3 convolution; the projection shortcut is a strided 1x1.
  const auto& conv2 = dynamic_cast<const nn::Conv2d&>(find_op(g, "layer2.0.conv2"));
  EXPECT_EQ(conv2.attrs().conv.stride_h, 2);
  EXPECT_EQ(dynamic_cast<const nn::Conv2d&>(find_op(g, "layer2.0.conv1")).attrs().conv.stride_h, 1);
  EXPECT_EQ(conv2.outputs()[0].shape, (Shape{1, 128, 28, 28}));
  EXPECT_EQ(find_op(g, "layer2.0.downsample.0").parameters()[0].shape, (Shape{512, 256, 1, 1}));
  EXPECT_EQ(find_op(g, "layer4.2.conv3").parameters()[0].shape, (Shape{2048, 512, 1, 1}));
  EXPECT_EQ(find_op(g, "layer4.2.bn3").outputs()[0].shape, (Shape{1, 2048, 7, 7}));
  EXPECT_EQ(find_op(g, "fc").outputs()[0].shape, (Shape{1, 1000}));
  EXPECT_EQ(find_op(g, "maxpool").outputs()[0].shape, (Shape{1, 64, 56, 56}));
}

TEST(ResNet, DeeperAndGroupedVariantsMatchTorchvision) {
  struct Case {
    ResNetConfig c;
    std::int64_t params;
    double gmacs;
  };
  for (const Case& k : {Case{resnet101(), 44'549'160, 7.80}, Case{resnext50_32x4d(), 25'028'904, 4.23},
                        Case{resnext101_32x8d(), 88'791'336, 16.41}}) {
    SCOPED_TRACE(k.c.name);
    const nn::Graph g = classifier_graph(k.c, 1, 224, false);
    EXPECT_EQ(g.parameter_count(), k.params);
    EXPECT_NEAR(static_cast<double>(matmul_macs(g)) / (k.gmacs * 1e9), 1.0, 0.01);
  }
  // ResNeXt's grouped 3x3: 32 groups of 4 (x4d) channels in layer1 -> 128 wide.
  const nn::Graph g = classifier_graph(resnext101_32x4d(), 1, 224, false);
  const auto& conv2 = dynamic_cast<const nn::Conv2d&>(find_op(g, "layer1.0.conv2"));
  EXPECT_EQ(conv2.attrs().conv.groups, 32);
  EXPECT_EQ(conv2.parameters()[0].shape, (Shape{128, 4, 3, 3}));
}

TEST(ResNet, BadConfigurationsAreRefusedWithTheReason) {
  ResNetConfig c = resnet50();
  c.planes.pop_back();
  nn::GraphBuilder b;
  EXPECT_THROW(build_classifier(b, c, 1, 224), UsageError);
  // Too small an image for the stem: the error names the layer.
  ResNetConfig tiny = tiny_resnet(1, 4);
  tiny.stem_kernel = 7;
  tiny.stem_stride = 1;
  tiny.stem_maxpool = false;
  nn::GraphBuilder b2;
  const nn::Value x = b2.input("images", Shape{1, 1, 2, 2});
  try {
    nn::Conv2dAttrs a{8, 7, 7, nn::Conv2dDesc{1, 1, 0, 0, 1, 1, 1}};
    nn::conv2d(b2, "conv1", x, a);
    FAIL();
  } catch (const nn::LayerError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 'conv1' (conv2d)"), std::string::npos) << e.what();
  }
}

TEST(ResNet, FullSizeTrainingPlanReusesMemoryWithoutOverlap) {
  const nn::Graph train = classifier_graph(resnet50(), 2, 224);
  const nn::Graph infer = classifier_graph(resnet50(), 2, 224, false);
  const auto& bufs = train.buffers();
  const auto& plan = train.memory_plan();
  for (std::size_t i = 0; i < bufs.size(); ++i)
    for (std::size_t j = i + 1; j < bufs.size(); ++j)
      ASSERT_FALSE(nn::plan_conflict(bufs, plan, i, j)) << bufs[i].label << " / " << bufs[j].label;
  EXPECT_LT(plan.peak_bytes, plan.total_bytes / 2);
  EXPECT_GE(plan.peak_bytes, plan.live_bound_bytes);
  EXPECT_LT(plan.peak_bytes, plan.live_bound_bytes * 5 / 4);  // greedy lands near the bound
  EXPECT_LT(infer.memory_plan().peak_bytes * 5, plan.peak_bytes);  // inference frees as it goes
  std::printf("resnet50 batch 2 at 224: training arena %.1f MB (all buffers %.1f MB, live bound %.1f MB), "
              "inference arena %.1f MB\n",
              static_cast<double>(plan.peak_bytes) / 1e6, static_cast<double>(plan.total_bytes) / 1e6,
              static_cast<double>(plan.live_bound_bytes) / 1e6, static_cast<double>(infer.memory_plan().peak_bytes) / 1e6);
}

// ---------------------------------------------------------------------------------------------
// Learning on the reference backend: the synthetic pattern task of test_support.h.

constexpr std::int64_t kClasses = test::kPatternClasses;
// Over 20 seeds SGD's mean loss of the last 10 of 100 steps was at most 0.014 and LARS's 0.036
// (chance: ln 4 = 1.39); the margins keep the test deterministic in practice.
constexpr int kSgdSteps = 120;

using test::mean_tail;
using test::TrainRun;

TrainRun train_tiny(std::uint64_t data_seed, std::uint64_t init_seed, int steps, bool lars = false, int eval_batches = 0,
                    Layout layout = Layout::nchw) {
  auto kernels = nn::make_ref_kernels();
  return test::train_tiny(*kernels, {data_seed, init_seed, steps, lars, eval_batches, layout});
}

TEST(Learnability, TinyResnetLearnsASyntheticFourClassTaskWithSgd) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto start = std::chrono::steady_clock::now();
  const TrainRun r = train_tiny(seed, seed + 1, kSgdSteps, false, 4);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double chance = std::log(static_cast<double>(kClasses));
  EXPECT_NEAR(mean_tail({r.losses.begin(), r.losses.begin() + 5}, 5), chance, 0.5);  // starts near chance
  EXPECT_LT(mean_tail(r.losses, 10), 0.25 * chance);
  EXPECT_GT(r.accuracy, 0.9);
#ifdef NDEBUG  // the time bound is for the optimised build; sanitizer builds are many times slower
  EXPECT_LT(seconds, 20.0);
#endif
  std::printf("tiny resnet, SGD: loss %.3f -> %.3f in %d steps, held-out accuracy %.3f, %.1f s\n", r.losses.front(),
              mean_tail(r.losses, 10), kSgdSteps, r.accuracy, seconds);
}

TEST(Learnability, LarsAlsoLearns) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TrainRun r = train_tiny(seed, seed + 1, 100, true);
  EXPECT_LT(mean_tail(r.losses, 10), 0.25 * std::log(static_cast<double>(kClasses)));
}

TEST(Determinism, TwoRunsGiveBitIdenticalLosses) {
  // The reference kernels sum every output in a fixed order (nn_test checks that the thread
  // count does not change a bit), so a rerun must reproduce every loss exactly.
  const std::uint64_t seed = test::seed();
  const TrainRun a = train_tiny(seed, 7, 12);
  const TrainRun b = train_tiny(seed, 7, 12);
  EXPECT_EQ(a.losses, b.losses);  // exact: same bits
  const TrainRun c = train_tiny(seed, 8, 12);
  EXPECT_NE(a.losses, c.losses);  // a different initialisation seed changes the run
}

TEST(Determinism, NhwcTrainsBitIdenticallyToNchw) {
  // Same logical values and the same order of every sum: only the strides differ, so any
  // difference in a loss is a layout bug somewhere in the graph or the kernels.
  const std::uint64_t seed = test::seed();
  const TrainRun nchw = train_tiny(seed, 3, 6, false, 0, Layout::nchw);
  const TrainRun nhwc = train_tiny(seed, 3, 6, false, 0, Layout::nhwc);
  EXPECT_EQ(nchw.losses, nhwc.losses);
}

// ---------------------------------------------------------------------------------------------
// Batch-norm folding (ResNetConfig::fold_batchnorm, fold_batchnorm_parameters, nn::BiasActivation)

std::vector<double> random_values(std::int64_t n, std::uint64_t seed) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = uniform(seed, 500000 + i, -1.5, 1.5);
  return v;
}

// max |a - b| <= tol * max |b|, and b is not all zeros.
void expect_close(const std::vector<double>& a, const std::vector<double>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 0, worst = 0;
  for (double v : b) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_GT(scale, 0) << what << ": all-zero outputs check nothing";
  EXPECT_LE(worst, tol * scale) << what << " (max |ref| " << scale << ")";
}

// A conv + BN + ReLU, conv + BN, projection conv + BN, add, ReLU block with torchvision's names,
// unfolded or folded by hand into convolutions and bias_act ops.
struct SmallBlock {
  nn::Value x, y;
};
SmallBlock small_block(nn::GraphBuilder& b, bool fold) {
  const auto conv = [&](const std::string& name, nn::Value in, std::int64_t k, std::int64_t kernel) {
    nn::Conv2dAttrs a;
    a.out_channels = k;
    a.kernel_h = a.kernel_w = kernel;
    a.conv.pad_h = a.conv.pad_w = kernel / 2;
    return nn::conv2d(b, name, in, a);
  };
  SmallBlock s;
  s.x = b.input("x", Shape{2, 3, 6, 6});
  nn::Value y = conv("conv1", s.x, 4, 3);
  y = fold ? nn::bias_activation(b, "bn1", y, nn::Value{}, true) : nn::relu(b, "relu1", nn::batchnorm2d(b, "bn1", y));
  y = conv("conv2", y, 5, 3);
  nn::Value shortcut = conv("downsample.0", s.x, 5, 1);
  if (fold) {
    shortcut = nn::bias_activation(b, "downsample.1", shortcut, nn::Value{}, false);
    s.y = nn::bias_activation(b, "bn2", y, shortcut, true);
  } else {
    shortcut = nn::batchnorm2d(b, "downsample.1", shortcut);
    s.y = nn::relu(b, "relu2", nn::add(b, "add", nn::batchnorm2d(b, "bn2", y), shortcut));
  }
  b.mark_output(s.y);
  return s;
}

// Runs `check` with inference options for f64 and f32 storage in both layouts (seeded with `seed`).
void for_each_inference_options(std::uint64_t seed, const std::function<void(const nn::GraphOptions&)>& check) {
  for (DType t : {DType::f64, DType::f32})
    for (Layout layout : {Layout::nchw, Layout::nhwc}) {
      SCOPED_TRACE(std::string(to_string(t)) + " " + std::string(to_string(layout)));
      nn::GraphOptions o;
      o.dtype = t;
      o.layout = layout;
      o.training = false;
      o.seed = seed;
      check(o);
    }
}

TEST(FoldBatchnorm, ConvBnAddReluBlockComputesTheSameFunctionFolded) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for_each_inference_options(seed, [&](const nn::GraphOptions& o) {
    const DType t = o.dtype;
    auto k = nn::make_ref_kernels();
    nn::GraphBuilder ub(o), fb(o);
    const SmallBlock us = small_block(ub, false), fs = small_block(fb, true);
    nn::Graph unfolded(std::move(ub)), folded(std::move(fb));
    EXPECT_EQ(unfolded.op_count(), 9u);
    EXPECT_EQ(folded.op_count(), 6u);
    unfolded.bind(*k);
    folded.bind(*k);
    nn::ParameterValues values = unfolded.parameter_values();
    ASSERT_NO_FATAL_FAILURE(test::randomise_batchnorms(values, seed));
    unfolded.set_parameter_values(values);
    const nn::ParameterValues f = fold_batchnorm_parameters(values);
    // The folded weights are the unfolded ones scaled per output channel, by more than rounding.
    EXPECT_EQ(f.size(), 3u + 3u);  // three convolutions' weights, three biases
    EXPECT_GT(std::abs(f.at("conv2.weight")[0] / values.at("conv2.weight")[0] - 1.0), 1e-3);
    folded.set_parameter_values(f);

    const std::vector<double> x = random_values(2 * 3 * 6 * 6, seed);
    unfolded.set_input(us.x, x);
    folded.set_input(fs.x, x);
    unfolded.forward(false);
    folded.forward(false);
    const auto want = unfolded.read(us.y), got = folded.read(fs.y);
    ASSERT_NO_FATAL_FAILURE(expect_close(got, want, t == DType::f64 ? 1e-12 : 2e-6, "block output"));
    const auto zeros = std::count(want.begin(), want.end(), 0.0);
    EXPECT_GT(zeros, 0);  // the ReLU clamps some elements and passes others
    EXPECT_LT(zeros, static_cast<std::ptrdiff_t>(want.size() * 9 / 10));
  });
}

TEST(FoldBatchnorm, TinyResnetInferenceLogitsMatchTheUnfoldedNetwork) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for_each_inference_options(seed, [&](const nn::GraphOptions& o) {
    const DType t = o.dtype;
    ResNetConfig c = tiny_resnet(3, 5);
    nn::GraphBuilder ub(o);
    const nn::Value ui = ub.input("images", Shape{2, 3, 8, 8});
    const nn::Value ul = resnet(ub, ui, c);
    ub.mark_output(ul);
    c.fold_batchnorm = true;
    nn::GraphBuilder fb(o);
    const nn::Value fi = fb.input("images", Shape{2, 3, 8, 8});
    const nn::Value fl = resnet(fb, fi, c);
    fb.mark_output(fl);
    c.fuse_conv_epilogue = true;
    nn::GraphBuilder eb(o);
    const nn::Value ei = eb.input("images", Shape{2, 3, 8, 8});
    const nn::Value el = resnet(eb, ei, c);
    eb.mark_output(el);
    auto k = nn::make_ref_kernels();  // outlives the graphs, whose memory it holds
    nn::Graph unfolded(std::move(ub)), folded(std::move(fb)), fused(std::move(eb));
    // Removed: the stem's ReLU and per block three ReLUs and the add; each batch norm became a bias_act.
    EXPECT_EQ(unfolded.op_count() - folded.op_count(), 1u + 2u * 4u);
    // Fused: each bias_act went into its convolution (the stem's, and per block three plus the projection).
    EXPECT_EQ(folded.op_count() - fused.op_count(), 1u + 2u * 4u);
    EXPECT_EQ(fused.parameter_count(), folded.parameter_count());

    unfolded.bind(*k);
    folded.bind(*k);
    fused.bind(*k);
    nn::ParameterValues values = unfolded.parameter_values();
    ASSERT_NO_FATAL_FAILURE(test::randomise_batchnorms(values, seed));
    unfolded.set_parameter_values(values);
    folded.set_parameter_values(fold_batchnorm_parameters(values));
    const nn::ParameterValues on_conv = fold_batchnorm_parameters(values, FoldedBias::on_convolution);
    EXPECT_EQ(on_conv.count("layer1.0.conv3.bias"), 1u);
    EXPECT_EQ(on_conv.count("layer1.0.bn3.bias"), 0u);
    fused.set_parameter_values(on_conv);
    const std::vector<double> images = random_values(2 * 3 * 8 * 8, seed);
    unfolded.set_input(ui, images);
    folded.set_input(fi, images);
    fused.set_input(ei, images);
    unfolded.forward(false);
    folded.forward(false);
    fused.forward(false);
    ASSERT_NO_FATAL_FAILURE(expect_close(folded.read(fl), unfolded.read(ul), t == DType::f64 ? 1e-11 : 1e-5, "logits"));
    // The same kernels in the same order on the reference: the same bits.
    EXPECT_EQ(fused.read(el), folded.read(fl));
  });
}

// fuse_batchnorm_relu: each batch norm with its ReLU (and a block's add) as one bn_act op. On the
// reference the op runs the same kernels, so a training step gives the same loss, logits and
// parameter gradients bit for bit, with 9 ops fewer (the stem's ReLU; per block three ReLUs and the
// add), in both layouts and in bf16.
TEST(FuseBatchnormRelu, TinyResnetTrainingStepIsTheUnfusedOne) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (Layout layout : {Layout::nchw, Layout::nhwc})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(std::string(to_string(layout)) + " " + std::string(to_string(p)));
      nn::GraphOptions o;
      o.layout = layout;
      o.precision = p;
      ResNetConfig c = tiny_resnet(3, 5);
      nn::GraphBuilder ub(o);
      const Classifier um = build_classifier(ub, c, 4, 8);
      c.fuse_batchnorm_relu = true;
      nn::GraphBuilder fb(o);
      const Classifier fm = build_classifier(fb, c, 4, 8);
      auto k = nn::make_ref_kernels();
      nn::Graph unfused(std::move(ub)), fused(std::move(fb));
      EXPECT_EQ(unfused.op_count() - fused.op_count(), 9u);
      std::size_t bn_acts = 0;
      for (std::size_t i = 0; i < fused.op_count(); ++i) bn_acts += fused.op(i).kind() == "bn_act";
      EXPECT_EQ(bn_acts, 1u + 2u * 3u);  // the projections' batch norms stay plain
      unfused.bind(*k);
      fused.bind(*k);
      nn::ParameterValues values = unfused.parameter_values();
      ASSERT_NO_FATAL_FAILURE(test::randomise_batchnorms(values, seed));
      unfused.set_parameter_values(values);
      fused.set_parameter_values(values);
      const std::vector<double> images = random_values(4 * 3 * 8 * 8, seed);
      const std::vector<double> labels{0, 3, 1, 4};
      for (nn::Graph* g : {&unfused, &fused}) {
        g->set_input(g == &fused ? fm.images : um.images, images);
        g->set_input(g == &fused ? fm.labels : um.labels, labels);
        g->forward(true);
        g->backward();
      }
      EXPECT_EQ(fused.read(fm.loss), unfused.read(um.loss));
      EXPECT_EQ(fused.read(fm.logits), unfused.read(um.logits));
      ASSERT_EQ(fused.parameters().size(), unfused.parameters().size());
      std::map<std::string, std::vector<double>> want;
      for (const auto& prm : unfused.parameters())
        if (prm.grad.defined()) want[prm.name] = unfused.read(prm.grad);
      std::size_t compared = 0;
      for (const auto& prm : fused.parameters()) {
        if (!prm.grad.defined()) continue;
        EXPECT_EQ(fused.read(prm.grad), want.at(prm.name)) << prm.name;
        ++compared;
      }
      EXPECT_EQ(compared, want.size());
      // The statistics the step updated, too.
      EXPECT_EQ(fused.parameter_values().at("layer2.0.bn3.running_var"),
                unfused.parameter_values().at("layer2.0.bn3.running_var"));
    }
}

TEST(FuseBatchnormRelu, Resnet50TrainingGraphLosesItsReluAndAddOps) {
  // The stem's ReLU and each of the 16 blocks' three ReLUs and add; the same parameters and FLOPs.
  nn::GraphOptions o;
  o.precision = Precision::bf16;
  o.layout = Layout::nhwc;
  ResNetConfig c = resnet50();
  nn::GraphBuilder ub(o);
  build_classifier(ub, c, 2, 224);
  c.fuse_batchnorm_relu = true;
  nn::GraphBuilder fb(o);
  build_classifier(fb, c, 2, 224);
  const nn::Graph unfused(std::move(ub)), fused(std::move(fb));
  EXPECT_EQ(unfused.op_count() - fused.op_count(), 1u + 16u * 4u);
  EXPECT_EQ(fused.parameter_count(), unfused.parameter_count());
  EXPECT_EQ(fused.forward_flops(), unfused.forward_flops());
  EXPECT_EQ(fused.backward_flops(), unfused.backward_flops());
  // Memory: the masks (a bit per element, ~1/16 of a bf16 activation) outweigh the ReLU outputs no
  // longer kept, by a few percent.
  EXPECT_LT(fused.memory_plan().peak_bytes, unfused.memory_plan().peak_bytes * 11 / 10);
}

TEST(FoldBatchnorm, FullSizeResnextLosesItsReluAndAddKernels) {
  // ResNeXt-101 32x4d inference: 344 ops unfolded; folded, the stem's ReLU and each of the 33
  // blocks' three ReLUs and add disappear, leaving convolutions, bias_acts, the pool and fc.
  nn::GraphOptions o;
  o.training = false;
  ResNetConfig c = resnext101_32x4d();
  nn::GraphBuilder ub(o);
  resnet(ub, ub.input("images", Shape{2, 3, 224, 224}), c);
  c.fold_batchnorm = true;
  nn::GraphBuilder fb(o);
  resnet(fb, fb.input("images", Shape{2, 3, 224, 224}), c);
  const nn::Graph unfolded(std::move(ub)), folded(std::move(fb));
  EXPECT_EQ(unfolded.op_count(), 344u);
  EXPECT_EQ(folded.op_count(), 344u - 1u - 33u * 4u);
  EXPECT_EQ(matmul_macs(folded), matmul_macs(unfolded));
  std::size_t bias_acts = 0, batchnorms = 0;
  for (std::size_t i = 0; i < folded.op_count(); ++i) bias_acts += folded.op(i).kind() == "bias_act";
  for (std::size_t i = 0; i < unfolded.op_count(); ++i) batchnorms += unfolded.op(i).kind() == "batchnorm2d";
  EXPECT_EQ(bias_acts, 104u);  // 3 per block, 1 per projection (4 of them), 1 in the stem
  EXPECT_EQ(bias_acts, batchnorms);
  EXPECT_LT(folded.forward_flops(), unfolded.forward_flops());
  // Trainable parameters: each batch norm's gamma is gone (its beta lives on as the bias).
  std::int64_t gammas = 0;
  for (std::size_t i = 0; i < unfolded.op_count(); ++i)
    if (unfolded.op(i).kind() == "batchnorm2d") gammas += unfolded.op(i).outputs()[0].shape[1];
  EXPECT_EQ(folded.parameter_count(), unfolded.parameter_count() - gammas);

  // Fused: each bias_act went into its convolution; the same multiply-adds and parameters, and
  // one pass over each convolution's output fewer.
  c.fuse_conv_epilogue = true;
  nn::GraphBuilder eb(o);
  resnet(eb, eb.input("images", Shape{2, 3, 224, 224}), c);
  const nn::Graph fused(std::move(eb));
  EXPECT_EQ(fused.op_count(), folded.op_count() - bias_acts);
  EXPECT_EQ(matmul_macs(fused), matmul_macs(folded));
  EXPECT_EQ(fused.parameter_count(), folded.parameter_count());
  std::int64_t folded_bytes = 0, fused_bytes = 0;
  for (const auto& op : folded.report()) folded_bytes += op.forward_bytes;
  for (const auto& op : fused.report()) fused_bytes += op.forward_bytes;
  EXPECT_LT(fused_bytes, folded_bytes);
  // Training a folded network is refused when bound.
  nn::GraphOptions t;
  ResNetConfig tiny = tiny_resnet(3, 5);
  tiny.fold_batchnorm = true;
  nn::GraphBuilder tb(t);
  build_classifier(tb, tiny, 2, 8);
  auto k = nn::make_ref_kernels();
  nn::Graph tg(std::move(tb));
  const std::string msg = test::error_message<nn::LayerError>([&] { tg.bind(*k); });
  EXPECT_NE(msg.find("(bias_act): is inference only"), std::string::npos) << msg;
}

// Precision fp8: every conv_bias_act whose convolution has groups 1 and input and output channels
// multiples of 16 is built to run e4m3, and no other op. ResNet-50: all 53 convolutions but the
// stem (3 input channels; 64..2048 channels elsewhere) = 52. ResNeXt-101 32x4d: 33 blocks of three
// convolutions, 4 projections and the stem = 104; less the stem and the 33 grouped 3x3s = 70 (its
// 1x1s are 128..2048 wide). The classifier is a Linear and stays 16-bit.
TEST(Fp8, ResnetBuilderMarksExactlyTheEligibleConvolutions) {
  nn::GraphOptions o;
  o.training = false;
  o.precision = Precision::fp8;
  for (const auto& [config, eligible] : {std::pair{resnet50(), 52}, std::pair{resnext101_32x4d(), 70}}) {
    SCOPED_TRACE(config.name);
    ResNetConfig c = config;
    c.fold_batchnorm = c.fuse_conv_epilogue = true;
    nn::GraphBuilder b(o);
    resnet(b, b.input("images", Shape{1, 3, 64, 64}), c);
    const nn::Graph g(std::move(b));
    int fp8 = 0, convs = 0, grouped = 0;
    for (std::size_t i = 0; i < g.op_count(); ++i) {
      const auto* conv = dynamic_cast<const nn::ConvBiasActivation*>(&g.op(i));
      if (conv == nullptr) continue;
      ++convs;
      const std::int64_t cin = conv->inputs()[0].shape[1], cout = conv->attrs().out_channels;
      const bool want = conv->attrs().conv.groups == 1 && cin % 16 == 0 && cout % 16 == 0;
      EXPECT_EQ(conv->fp8(), want) << conv->name();
      EXPECT_FALSE(conv->runs_fp8()) << "not bound: nothing ran yet";
      fp8 += conv->fp8();
      grouped += conv->attrs().conv.groups > 1;
    }
    EXPECT_EQ(fp8, eligible);
    EXPECT_EQ(convs, c.groups == 1 ? 53 : 104);
    EXPECT_EQ(grouped, c.groups == 1 ? 0 : 33);
    EXPECT_FALSE(dynamic_cast<const nn::ConvBiasActivation&>(find_op(g, "conv1")).fp8());  // the stem
    EXPECT_EQ(find_op(g, "fc").kind(), "linear");
    EXPECT_EQ(find_op(g, "fc").inputs()[0].dtype, DType::f16);  // fp8 stores as fp16
  }
  // Without an fp8 graph nothing is marked; without fused convolutions an fp8 graph is refused.
  nn::GraphOptions f16 = o;
  f16.precision = Precision::fp16;
  ResNetConfig c = resnet50();
  c.fold_batchnorm = c.fuse_conv_epilogue = true;
  nn::GraphBuilder hb(f16);
  resnet(hb, hb.input("images", Shape{1, 3, 32, 32}), c);
  const nn::Graph half(std::move(hb));
  for (std::size_t i = 0; i < half.op_count(); ++i) {
    if (const auto* conv = dynamic_cast<const nn::ConvBiasActivation*>(&half.op(i))) {
      EXPECT_FALSE(conv->fp8()) << conv->name();
    }
  }
  for (bool fold : {false, true}) {  // unfolded, then folded with the epilogue outside
    c.fold_batchnorm = fold;
    c.fuse_conv_epilogue = false;
    nn::GraphBuilder ub(o);
    const std::string msg = test::usage_error([&] { resnet(ub, ub.input("images", Shape{1, 3, 32, 32}), c); });
    EXPECT_NE(msg.find("precision fp8 runs the folded convolutions"), std::string::npos) << msg;
  }
}

TEST(FoldBatchnorm, ParameterValuesRoundTripAndRefuseWrongNamesOrSizes) {
  nn::GraphOptions o;
  o.dtype = DType::f64;
  o.training = false;
  nn::GraphBuilder b(o);
  resnet(b, b.input("images", Shape{1, 3, 8, 8}), tiny_resnet(3, 5));
  auto k = nn::make_ref_kernels();
  nn::Graph g(std::move(b));
  const nn::ParameterValues initial = g.initial_parameter_values();  // before bind
  g.bind(*k);
  EXPECT_EQ(g.parameter_values(), initial);  // exactly what bind wrote (f64)
  nn::ParameterValues missing = initial;
  missing.erase("fc.bias");
  EXPECT_NE(test::error_message<Error>([&] { g.set_parameter_values(missing); }).find("'fc.bias'"), std::string::npos);
  nn::ParameterValues extra = initial;
  extra["fc.scale"] = {1.0};
  EXPECT_NE(test::error_message<Error>([&] { g.set_parameter_values(extra); }).find("'fc.scale'"), std::string::npos);
  nn::ParameterValues short_one = initial;
  short_one.at("conv1.weight").pop_back();
  EXPECT_THROW(g.set_parameter_values(short_one), Error);
  nn::ParameterValues changed = initial;
  changed.at("fc.bias")[0] = 0.25;
  g.set_parameter_values(changed);
  EXPECT_EQ(g.parameter_values().at("fc.bias")[0], 0.25);
  // A batch norm whose convolution cannot be named is refused.
  nn::ParameterValues odd = initial;
  odd["head.norm.running_var"] = {1.0};
  EXPECT_THROW(fold_batchnorm_parameters(odd), Error);
}

// ---------------------------------------------------------------------------------------------
// The image-compression autoencoder

nn::Graph compression_graph(const CompressionConfig& c, std::int64_t batch, std::int64_t px, bool training = true) {
  nn::GraphOptions o;
  o.training = training;
  nn::GraphBuilder b(o);
  build_compression_ae(b, c, batch, px);
  return nn::Graph(std::move(b));
}

TEST(CompressionAe, ParameterCountAndShapesAtN128M192) {
  const CompressionConfig c = compression_ae();
  ASSERT_EQ(c.channels, 128);
  ASSERT_EQ(c.latent_channels, 192);
  const nn::Graph g = compression_graph(c, 1, 256);
  // 5x5 kernels, no biases. Encoder: 3*128*25 = 9,600; two 128*128*25 = 409,600 each; 128*192*25 =
  // 614,400; 1,443,200 in all. The decoder mirrors it (192*128*25, 2 x 128*128*25, 128*3*25):
  // 1,443,200. Total 2,886,400.
  EXPECT_EQ(g.parameter_count(), 2'886'400);
  const auto& latent = dynamic_cast<const nn::Conv2d&>(find_op(g, "encoder.conv4"));
  EXPECT_EQ(latent.outputs()[0].shape, (Shape{1, 192, 16, 16}));  // 256 / 2^4
  const auto& out = dynamic_cast<const nn::ConvTranspose2d&>(find_op(g, "decoder.deconv4"));
  EXPECT_EQ(out.outputs()[0].shape, (Shape{1, 3, 256, 256}));
  // Forward multiply-adds per 256x256 image: encoder 128x128*9,600 + 64x64*409,600 + 32x32*409,600
  // + 16x16*614,400; the decoder's transposed convolutions cost the same per input element.
  const double enc = 128.0 * 128 * 9600 + 64.0 * 64 * 409600 + 32.0 * 32 * 409600 + 16.0 * 16 * 614400;
  double macs = 0;
  for (std::size_t i = 0; i < g.op_count(); ++i) {
    if (const auto* conv = dynamic_cast<const nn::Conv2d*>(&g.op(i))) macs += static_cast<double>(conv->macs());
    if (const auto* t = dynamic_cast<const nn::ConvTranspose2d*>(&g.op(i))) macs += static_cast<double>(t->macs());
  }
  EXPECT_EQ(macs, 2 * enc);
  EXPECT_GT(static_cast<double>(g.forward_flops()), 2 * macs);
  EXPECT_LT(static_cast<double>(g.forward_flops()), 2 * macs * 1.01);
  // Backward: both gradients of every layer but the first (the images need none).
  const auto first = static_cast<double>(dynamic_cast<const nn::Conv2d&>(find_op(g, "encoder.conv1")).macs());
  EXPECT_NEAR(static_cast<double>(g.backward_flops()) / (2 * (2 * macs - first)), 1.0, 0.01);
  // Sizes that four stride-2 stages cannot halve are refused at the layer that fails.
  EXPECT_THROW(compression_graph(c, 1, 8), nn::LayerError);
}

// Smooth synthetic images in [-0.5, 0.5]: per image, a sum of two random low-frequency cosines
// per channel (a few numbers describe each image, which a latent of a few channels can carry).
std::vector<double> smooth_images(std::uint64_t seed, std::int64_t batch, std::int64_t channels, std::int64_t px) {
  std::vector<double> v(static_cast<std::size_t>(batch * channels * px * px));
  const double two_pi = 6.283185307179586;
  std::size_t i = 0;
  for (std::int64_t n = 0; n < batch; ++n)
    for (std::int64_t c = 0; c < channels; ++c) {
      const auto key = static_cast<std::uint64_t>(n * channels + c) * 8;
      const double a = uniform(seed, key, -0.25, 0.25), b = uniform(seed, key + 1, -0.2, 0.2);
      const double ph = uniform(seed, key + 2, 0, two_pi), pw = uniform(seed, key + 3, 0, two_pi);
      for (std::int64_t h = 0; h < px; ++h)
        for (std::int64_t w = 0; w < px; ++w)
          v[i++] = a * std::cos(two_pi * static_cast<double>(h) / static_cast<double>(px) + ph) +
                   b * std::cos(two_pi * static_cast<double>(w) / static_cast<double>(px) + pw);
    }
  return v;
}

struct AeRun {
  std::vector<double> losses, mses;
  int nonzero_latents = 0;  // after training
};

AeRun train_tiny_ae(std::uint64_t data_seed, int steps, double lr) {
  auto kernels = nn::make_ref_kernels();
  const CompressionConfig c = tiny_compression_ae();
  nn::GraphOptions o;
  o.seed = data_seed + 1;
  nn::GraphBuilder b(o);
  const CompressionModel m = build_compression_ae(b, c, 8, 16);
  nn::Graph g(std::move(b));
  g.bind(*kernels);
  g.set_input(m.images, smooth_images(data_seed, 8, 3, 16));
  nn::Sgd sgd(lr, 0.9, 0.0);
  AeRun r;
  for (int s = 0; s < steps; ++s) {
    g.forward();
    g.backward();
    g.update(sgd);
    r.losses.push_back(g.read(m.loss)[0]);
    r.mses.push_back(g.read(m.mse)[0]);
  }
  const auto q = g.read(m.quantized);
  for (double v : q) r.nonzero_latents += v != 0 ? 1 : 0;
  // The quantiser's output lies on its grid.
  for (double v : q) EXPECT_EQ(v, c.quant_step * std::nearbyint(v / c.quant_step));
  return r;
}

// Fixed seeds, not fresh ones: this tiny network (no biases, ReLU, a 1x1x6 latent) stalls from some
// initialisations — 2 of 8 fresh seeds at 150 steps and 1 of 12 at 400 did not improve in a CI
// rehearsal — so a fresh seed would make the test flaky without testing anything more.
class TinyAeSeeds : public ::testing::TestWithParam<std::uint64_t> {};
INSTANTIATE_TEST_SUITE_P(Learnability, TinyAeSeeds, ::testing::Values(1, 2, 3));

TEST_P(TinyAeSeeds, TinyCompressionAutoencoderImprovesItsReconstruction) {
  const std::uint64_t seed = GetParam();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // The train workload's SGD rate for autoencoders (train.cpp: kAutoencoderSgdLr), 400 steps on one
  // batch of 8 images, 16x16 (a 1x1x6 latent).
  const AeRun r = train_tiny_ae(seed, 400, 10.0);
  for (double l : r.losses) ASSERT_TRUE(std::isfinite(l));
  const double first = mean_tail({r.mses.begin(), r.mses.begin() + 5}, 5), last = mean_tail(r.mses, 10);
  EXPECT_GT(first, 0.005);  // the images' variance is about 0.017: the untrained decoder is far off
  EXPECT_LT(last, 0.85 * first);
  EXPECT_GT(psnr_db(last) - psnr_db(first), 0.7);
  EXPECT_LT(mean_tail(r.losses, 10), 0.85 * mean_tail({r.losses.begin(), r.losses.begin() + 5}, 5));
  EXPECT_GT(r.nonzero_latents, 0);  // the latent did not collapse into the quantiser's dead zone
  std::printf("tiny compression autoencoder: mse %.5f -> %.5f, PSNR %.2f -> %.2f dB in 400 steps\n", first, last,
              psnr_db(first), psnr_db(last));
}

}  // namespace
}  // namespace ab::models
