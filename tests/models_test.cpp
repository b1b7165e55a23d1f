// Tests for src/models: ResNet-50 v1.5 and ResNeXt parameter counts and forward MACs against
// torchvision's published figures (from the ops' own counts, no execution), the memory plan of a
// full-size training graph, and, on the reference backend, that a tiny ResNet learns a synthetic
// 4-class task and that two runs give bit-identical losses.
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/rng.h"
#include "models/resnet.h"
#include "nn/ops.h"
#include "nn/optim.h"
#include "test_support.h"

namespace ab::models {
namespace {

std::int64_t matmul_macs(const nn::Graph& g) {
  std::int64_t macs = 0;
  for (std::size_t i = 0; i < g.op_count(); ++i) {
    if (const auto* conv = dynamic_cast<const nn::Conv2d*>(&g.op(i))) macs += conv->macs();
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
  const std::uint64_t seed = fresh_seed();
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
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TrainRun r = train_tiny(seed, seed + 1, 100, true);
  EXPECT_LT(mean_tail(r.losses, 10), 0.25 * std::log(static_cast<double>(kClasses)));
}

TEST(Determinism, TwoRunsGiveBitIdenticalLosses) {
  // The reference kernels sum every output in a fixed order (nn_test checks that the thread
  // count does not change a bit), so a rerun must reproduce every loss exactly.
  const std::uint64_t seed = fresh_seed();
  const TrainRun a = train_tiny(seed, 7, 12);
  const TrainRun b = train_tiny(seed, 7, 12);
  EXPECT_EQ(a.losses, b.losses);  // exact: same bits
  const TrainRun c = train_tiny(seed, 8, 12);
  EXPECT_NE(a.losses, c.losses);  // a different initialisation seed changes the run
}

TEST(Determinism, NhwcTrainsBitIdenticallyToNchw) {
  // Same logical values and the same order of every sum: only the strides differ, so any
  // difference in a loss is a layout bug somewhere in the graph or the kernels.
  const std::uint64_t seed = fresh_seed();
  const TrainRun nchw = train_tiny(seed, 3, 6, false, 0, Layout::nchw);
  const TrainRun nhwc = train_tiny(seed, 3, 6, false, 0, Layout::nhwc);
  EXPECT_EQ(nchw.losses, nhwc.losses);
}

}  // namespace
}  // namespace ab::models
