// Tests for the nn graph, memory planner and optimizers on the reference kernels: whole-graph
// gradients (branch points that sum gradients, an input gradient) against finite differences,
// planned buffers that never overlap while alive, an inference plan, per-op timing, a backend
// refusal and shape-inference errors that name the layer and the reason, SGD/LARS steps against
// their formulas; the precision policies on a tiny ResNet (types, masters and copies, the arena,
// agreement with fp32, fp16 loss scaling, bf16 learning), the convolution passes a graph prepares,
// whole-step capture and the flags a graph passes to its kernels.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/rng.h"
#include "dist/data_parallel/buckets.h"
#include "nn/graph.h"
#include "nn/ops.h"
#include "nn/optim.h"
#include "nn/planner.h"
#include "nn/ref/ref_kernels.h"
#include "models/resnet.h"
#include "test_support.h"

namespace ab::nn {
namespace {

// ---------------------------------------------------------------------------------------------
// planner

void expect_valid_plan(const std::vector<BufferLifetime>& bufs, const MemoryPlan& plan) {
  ASSERT_EQ(plan.offsets_bytes.size(), bufs.size());
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_EQ(plan.offsets_bytes[i] % kAllocAlignment, 0) << bufs[i].label;
    EXPECT_LE(plan.offsets_bytes[i] + bufs[i].bytes, plan.peak_bytes) << bufs[i].label;
    for (std::size_t j = i + 1; j < bufs.size(); ++j)
      ASSERT_FALSE(plan_conflict(bufs, plan, i, j)) << bufs[i].label << " overlaps " << bufs[j].label;
  }
  EXPECT_GE(plan.peak_bytes, plan.live_bound_bytes);
  EXPECT_LE(plan.peak_bytes, plan.total_bytes);
}

TEST(Planner, ReusesMemoryOfBuffersThatAreNeverAliveTogether) {
  const std::vector<BufferLifetime> bufs{{1000, 0, 1, "a"}, {1000, 2, 3, "b"}, {500, 1, 2, "c"}};
  const MemoryPlan plan = plan_memory(bufs);
  ASSERT_NO_FATAL_FAILURE(expect_valid_plan(bufs, plan));
  EXPECT_EQ(plan.offsets_bytes[0], plan.offsets_bytes[1]);  // a and b share bytes
  EXPECT_EQ(plan.peak_bytes, 1024 + 512);
  EXPECT_EQ(plan.total_bytes, 1024 + 1024 + 512);
  EXPECT_EQ(plan.live_bound_bytes, 1536);
}

TEST(Planner, RandomLifetimesNeverOverlapWhileAlive) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<BufferLifetime> bufs;
  for (std::uint64_t i = 0; i < 300; ++i) {
    const int first = static_cast<int>(mix64(seed, 3 * i) % 100);
    const int len = static_cast<int>(mix64(seed, 3 * i + 1) % 20);
    const auto bytes = static_cast<std::int64_t>(mix64(seed, 3 * i + 2) % 100000);
    bufs.push_back({bytes, first, first + len, "buffer " + std::to_string(i)});
  }
  const MemoryPlan plan = plan_memory(bufs);
  ASSERT_NO_FATAL_FAILURE(expect_valid_plan(bufs, plan));
  EXPECT_LT(plan.peak_bytes, plan.total_bytes / 2);  // short lifetimes over 120 steps: much reuse
}

// Sizes whose rounding or sum does not fit in 64 bits, negative sizes and backwards lifetimes are
// refused with the buffer's name, never planned with wrapped-around offsets.
TEST(Planner, SizesThatOverflowOrAreNegativeAreRefusedNamingTheBuffer) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::string msg = test::usage_error([&] { plan_memory({{kMax, 0, 1, "huge"}}); });
  EXPECT_NE(msg.find("buffer huge bytes overflows 64 bits"), std::string::npos) << msg;
  // Each fits alone; together they do not.
  const std::int64_t half = kMax / 2;
  msg = test::usage_error([&] { plan_memory({{half, 0, 1, "a"}, {half, 0, 1, "b"}}); });
  EXPECT_NE(msg.find("total bytes overflows 64 bits"), std::string::npos) << msg;
  msg = test::usage_error([&] { plan_memory({{-512, 0, 1, "negative"}}); });
  EXPECT_NE(msg.find("buffer negative bytes: negative size"), std::string::npos) << msg;
  msg = test::error_message<Error>([&] { plan_memory({{512, 3, 1, "backwards"}}); });
  EXPECT_NE(msg.find("buffer backwards: lifetime [3, 1]"), std::string::npos) << msg;
  // The largest sizes that do fit are still planned exactly.
  const std::int64_t big = kMax / 4 / kAllocAlignment * kAllocAlignment;
  const MemoryPlan plan = plan_memory({{big, 0, 1, "x"}, {big, 0, 1, "y"}, {big, 2, 3, "z"}});
  EXPECT_EQ(plan.total_bytes, 3 * big);
  EXPECT_EQ(plan.peak_bytes, 2 * big);
  EXPECT_EQ(plan.live_bound_bytes, 2 * big);
}

// ---------------------------------------------------------------------------------------------
// a small network with the ResNet ingredients; `p` feeds three layers (gradients sum there)

struct SmallNet {
  Value x, labels, logits, loss;
};

// Without batch norm, a batch's gradient is the mean of its halves' (data parallelism's check).
SmallNet small_net(GraphBuilder& b, std::int64_t n, bool with_batchnorm = true) {
  SmallNet m;
  m.x = b.input("x", Shape{n, 2, 6, 6}, /*requires_grad=*/true);
  m.labels = b.input("labels", Shape{n}, DType::i32);
  Conv2dAttrs c1{4, 3, 3, Conv2dDesc{1, 1, 1, 1, 1, 1, 1}};
  Value y = conv2d(b, "conv1", m.x, c1);
  y = relu(b, "relu1", with_batchnorm ? batchnorm2d(b, "bn1", y) : y);
  const Value p = maxpool2d(b, "pool", y, Pool2dDesc{2, 2, 2, 2, 0, 0});
  Conv2dAttrs c2{4, 3, 3, Conv2dDesc{1, 1, 1, 1, 1, 1, 2}};
  Conv2dAttrs c3{4, 1, 1, Conv2dDesc{}};
  y = add(b, "add1", p, conv2d(b, "conv2", p, c2));
  y = add(b, "add2", y, conv2d(b, "conv3", p, c3));
  m.logits = linear(b, "fc", global_avgpool(b, "gap", y), 3);
  m.loss = softmax_cross_entropy(b, "loss", m.logits, m.labels);
  b.mark_output(m.logits);
  b.set_loss(m.loss);
  return m;
}

struct Bound {
  std::unique_ptr<Kernels> k = make_ref_kernels();
  GraphBuilder b;
  SmallNet m;
  Graph g;
  explicit Bound(GraphOptions o, std::int64_t n = 4, bool with_batchnorm = true)
      : b(o), m(small_net(b, n, with_batchnorm)), g(std::move(b)) {}
};

// Samples first..first+n-1 of one seeded data set (a sample does not depend on its batch).
void fill_inputs(Graph& g, const SmallNet& m, std::int64_t n, std::uint64_t seed, std::int64_t first = 0) {
  std::vector<double> x(static_cast<std::size_t>(n * 72)), labels(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = uniform(seed, static_cast<std::uint64_t>(first * 72) + i, -1, 1);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<double>((static_cast<std::size_t>(first) + i) % 3);
  g.set_input(m.x, x);
  g.set_input(m.labels, labels);
}

double loss_of(Graph& g, const SmallNet& m) {
  g.forward();
  return g.read(m.loss)[0];
}

// Central difference at two step sizes on `elements` seeded elements; a pair that disagrees
// straddles a ReLU, max-pool or |.| kink and is skipped (counted), anything else must match the
// analytic gradient, which must not be all zero (that would check nothing).
void check_tensor_gradient(const std::function<double()>& loss, const Tensor& value, const std::vector<double>& grad,
                           const std::string& what, std::uint64_t seed, int elements, int* checked, int* skipped) {
  double largest = 0;
  for (double e : grad) largest = std::max(largest, std::abs(e));
  EXPECT_GT(largest, 1e-6) << what << ": an all-zero gradient checks nothing";
  auto v = read_host(value);
  for (std::uint64_t s = 0; s < static_cast<std::uint64_t>(elements); ++s) {
    const std::size_t i = mix64(seed, s) % v.size();
    const double n1 = test::central_difference(value, v, i, 1e-6, loss),
                 n2 = test::central_difference(value, v, i, 5e-7, loss);
    if (std::abs(n1 - n2) > 1e-6 * std::max(1.0, std::abs(n1))) {
      ++*skipped;
      continue;
    }
    ++*checked;
    EXPECT_NEAR(grad[i], n1, 2e-6 * std::max(1.0, std::abs(n1))) << what << " element " << i;
  }
}

TEST(Graph, WholeGraphGradientsMatchFiniteDifferences) {
  GraphOptions o;
  o.dtype = DType::f64;
  o.seed = test::seed();
  Bound t(o);
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  t.g.bind(*t.k);
  fill_inputs(t.g, t.m, 4, o.seed);
  loss_of(t.g, t.m);
  t.g.backward();
  // Read now: the arena reuses the input gradient's bytes during the next forward pass.
  const auto grad_x = t.g.read(t.g.grad(t.m.x));
  int checked = 0, skipped = 0;
  const auto loss = [&] { return loss_of(t.g, t.m); };
  for (auto& p : t.g.parameters())
    if (p.spec.trainable())
      check_tensor_gradient(loss, p.value, read_host(p.grad), p.name, o.seed + 1, 6, &checked, &skipped);
  // The input's gradient flows back through every branch point.
  check_tensor_gradient(loss, t.g.tensor(t.m.x), grad_x, "x", o.seed + 2, 6, &checked, &skipped);
  EXPECT_GE(checked, 44);  // 8 tensors x 6 elements, a few kinks skipped
  EXPECT_LE(skipped, 4);
}

TEST(Graph, PlanKeepsLiveBuffersApartAndReusesMemory) {
  Bound t(GraphOptions{});
  const auto& bufs = t.g.buffers();
  const MemoryPlan& plan = t.g.memory_plan();
  ASSERT_NO_FATAL_FAILURE(expect_valid_plan(bufs, plan));
  EXPECT_LT(plan.peak_bytes, plan.total_bytes);
  // The pool output is read by three layers forward and by max pool's own backward; the conv1
  // input gradient (x requires one) lives to the end of the step for the caller.
  const auto find = [&](const std::string& label) {
    for (const auto& b : bufs)
      if (b.label == label) return b;
    ADD_FAILURE() << "no buffer " << label;
    return BufferLifetime{};
  };
  const int n = static_cast<int>(t.g.op_count());
  EXPECT_EQ(find("grad x").last_step, 2 * n);
  EXPECT_EQ(find("relu1").last_step, 2 * n - 1 - 2);  // read by its own backward (op 2), after pool's
  EXPECT_EQ(find("conv1").last_step, 2 * n - 1 - 1);  // read by bn1's backward (op 1)
  EXPECT_EQ(find("bn1").last_step, 2);                // relu reads only its output
}

TEST(Graph, InferencePlanIsSmallerAndHasNoBackward) {
  GraphOptions o;
  o.training = false;
  Bound inf(o), train(GraphOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_valid_plan(inf.g.buffers(), inf.g.memory_plan()));
  EXPECT_LT(inf.g.memory_plan().peak_bytes, train.g.memory_plan().peak_bytes);
  EXPECT_EQ(inf.g.backward_flops(), 0);
  for (const auto& b : inf.g.buffers()) EXPECT_EQ(b.label.rfind("grad ", 0), std::string::npos) << b.label;
  inf.g.bind(*inf.k);
  fill_inputs(inf.g, inf.m, 4, test::seed());
  inf.g.forward(false);
  EXPECT_THROW(inf.g.backward(), Error);
}

TEST(Graph, ProfilingRecordsEveryOpsTimeAndTheTableAddsUp) {
  Bound t(GraphOptions{}, 4, /*with_batchnorm=*/false);  // batch norm's statistics move on each replay
  t.g.bind(*t.k);
  fill_inputs(t.g, t.m, 4, test::seed());
  t.g.forward();
  t.g.backward();
  const auto logits = t.g.read(t.m.logits), dx = t.g.read(t.g.grad(t.m.x));
  t.g.set_profiling(true);
  t.g.forward();
  t.g.backward();
  t.g.set_profiling(false);
  // Each op was timed by replaying its launches, which re-runs in-place and accumulating ops, so
  // the profiled step's own values are not a step's; the inputs and parameters it leaves are, and
  // the next plain step computes what the first one did.
  t.g.forward();
  t.g.backward();
  EXPECT_EQ(t.g.read(t.m.logits), logits);
  EXPECT_EQ(t.g.read(t.g.grad(t.m.x)), dx);
  const auto rows = t.g.report();
  ASSERT_EQ(rows.size(), t.g.op_count());
  std::int64_t fwd = 0, bwd = 0;
  double time_s = 0;
  for (const auto& r : rows) {
    fwd += r.forward_flops;
    bwd += r.backward_flops;
    EXPECT_GE(r.forward_s, 0.0);
    time_s += r.forward_s + r.backward_s;
    EXPECT_GT(r.forward_bytes, 0) << r.name;
  }
  EXPECT_GT(time_s, 0.0);
  EXPECT_EQ(fwd, t.g.forward_flops());
  EXPECT_EQ(bwd, t.g.backward_flops());
  EXPECT_EQ(rows[0].name, "conv1");
  EXPECT_EQ(rows[0].params, 4 * 2 * 9);
  EXPECT_EQ(rows[0].forward_flops, 2 * 4 * 4 * 36 * 2 * 9);
  EXPECT_EQ(rows[0].backward_flops, 2 * rows[0].forward_flops);  // x requires a gradient here
}

// An op observer is told around every op's forward and, in backward order, every backward an op
// runs, each begin closed by its end before the next op; the step computes what it computes
// unobserved; a step cannot be captured while one is set.
TEST(Graph, AnOpObserverSeesEachOpsForwardAndBackwardOnce) {
  struct Log final : OpObserver {
    std::vector<std::pair<std::size_t, bool>> begun;
    int open = 0, nested = 0;
    void begin(std::size_t op, bool backward) override {
      nested += open;
      ++open;
      begun.emplace_back(op, backward);
    }
    void end(std::size_t op, bool backward) override {
      --open;
      EXPECT_EQ(begun.back(), std::make_pair(op, backward));
    }
  } log;
  Bound t(GraphOptions{}, 4, /*with_batchnorm=*/false);
  t.g.bind(*t.k);
  fill_inputs(t.g, t.m, 4, test::seed());
  t.g.forward();
  t.g.backward();
  const auto logits = t.g.read(t.m.logits), dx = t.g.read(t.g.grad(t.m.x));
  t.g.set_op_observer(&log);
  t.g.forward();
  t.g.backward();
  EXPECT_THROW((void)t.g.capture_step(nullptr), Error);
  t.g.set_op_observer(nullptr);
  EXPECT_EQ(t.g.read(t.m.logits), logits);
  EXPECT_EQ(t.g.read(t.g.grad(t.m.x)), dx);
  EXPECT_EQ(log.nested, 0);
  EXPECT_EQ(log.open, 0);
  const std::size_t n = t.g.op_count();
  ASSERT_GT(log.begun.size(), n);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(log.begun[i], std::make_pair(i, false));
  std::size_t last = n;
  for (std::size_t i = n; i < log.begun.size(); ++i) {
    EXPECT_TRUE(log.begun[i].second);
    EXPECT_LT(log.begun[i].first, last);  // backward runs the ops in reverse, each once
    last = log.begun[i].first;
  }
  EXPECT_EQ(log.begun.back().first, 0u);  // conv1 takes x, which asks for its gradient here
}

// Reference kernels that refuse grouped convolutions, as a device backend might.
class NoGroupedConv final : public ref::RefKernels {
 public:
  std::int64_t conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                              ConvPasses passes) override {
    if (d.groups > 1) throw Unsupported("grouped convolutions are not supported here");
    return RefKernels::conv2d_prepare(d, x, w, y, passes);
  }
};

TEST(Graph, BackendRefusalNamesTheLayerAndTheReason) {
  Bound t(GraphOptions{});
  NoGroupedConv k;
  try {
    t.g.bind(k);
    FAIL() << "bound a grouped convolution";
  } catch (const Unsupported& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer 'conv2' (conv2d)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("grouped convolutions are not supported"), std::string::npos) << msg;
  }
}

TEST(Graph, TrainingGraphNeedsALossAndBindingBeforeUse) {
  GraphBuilder b;
  relu(b, "relu", b.input("x", Shape{1, 1, 2, 2}));
  EXPECT_THROW(Graph(std::move(b)), Error);
  Bound t(GraphOptions{});
  EXPECT_THROW(t.g.forward(), Error);
}

// ---------------------------------------------------------------------------------------------
// shape inference errors name the layer and the reason

std::string layer_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const LayerError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no LayerError";
  return {};
}

TEST(ShapeInference, ErrorsNameTheLayerAndTheReason) {
  GraphBuilder b;
  const Value x = b.input("images", Shape{2, 6, 8, 8});
  Conv2dAttrs a;
  a.out_channels = 8;
  a.kernel_h = a.kernel_w = 3;
  a.conv.groups = 4;
  auto msg = layer_error([&] { conv2d(b, "layer1.0.conv2", x, a); });
  EXPECT_NE(msg.find("layer 'layer1.0.conv2' (conv2d)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("input channels 6 not divisible by groups 4"), std::string::npos) << msg;

  a.conv.groups = 1;
  a.kernel_h = a.kernel_w = 11;
  msg = layer_error([&] { conv2d(b, "big", x, a); });
  EXPECT_NE(msg.find("layer 'big'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not fit"), std::string::npos) << msg;

  const Value y = maxpool2d(b, "pool", x, Pool2dDesc{2, 2, 2, 2, 0, 0});
  msg = layer_error([&] { add(b, "layer2.0.add", x, y); });
  EXPECT_NE(msg.find("layer 'layer2.0.add' (add): input shapes [2, 6, 8, 8] and [2, 6, 4, 4] differ"),
            std::string::npos) << msg;
  msg = layer_error([&] { linear(b, "fc", x, 10); });
  EXPECT_NE(msg.find("layer 'fc' (linear): input must be [N, features]"), std::string::npos) << msg;
  msg = layer_error([&] { maxpool2d(b, "pool2", x, Pool2dDesc{2, 2, 2, 2, 2, 2}); });
  EXPECT_NE(msg.find("padding must be between 0 and half the window"), std::string::npos) << msg;
  const Value logits = b.input("logits", Shape{2, 5});
  const Value labels = b.input("labels", Shape{2});  // f32, not i32
  msg = layer_error([&] { softmax_cross_entropy(b, "loss", logits, labels); });
  EXPECT_NE(msg.find("labels must be i32"), std::string::npos) << msg;
  msg = layer_error([&] { relu(b, "pool", x); });
  EXPECT_NE(msg.find("name is already used"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// optimizers

struct OneParam {
  std::unique_ptr<Kernels> k = make_ref_kernels();
  Buffer w, g;
  std::vector<Parameter> params;
  OneParam(ParamRole role, const std::vector<double>& w0, const std::vector<double>& g0) {
    const Tensor d = Tensor::describe(DType::f64, Shape{static_cast<std::int64_t>(w0.size())});
    w = Buffer(k->allocator(), d.size_bytes());
    g = Buffer(k->allocator(), d.size_bytes());
    Parameter p;
    p.name = "p";
    p.spec.role = role;
    p.value = w.view(d);
    p.grad = g.view(d);
    write_host(p.value, w0);
    write_host(p.grad, g0);
    params.push_back(p);
  }
  std::vector<double> value() const { return read_host(params[0].value); }
};

TEST(Optimizer, SgdMomentumAndWeightDecayFollowPyTorch) {
  const std::vector<double> w0{1.0, -2.0, 0.5}, g0{0.1, 0.2, -0.3};
  OneParam p(ParamRole::weight, w0, g0);
  Sgd sgd(0.1, 0.9, 0.01);
  std::vector<double> w = w0, v(3, 0.0);
  for (int step = 0; step < 3; ++step) {
    sgd.step(*p.k, p.params);
    for (std::size_t i = 0; i < 3; ++i) {
      v[i] = 0.9 * v[i] + g0[i] + 0.01 * w[i];
      w[i] -= 0.1 * v[i];
    }
    const auto got = p.value();
    for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], w[i], 1e-15) << "step " << step;
  }
  EXPECT_EQ(sgd.flops(100), 600);
}

// step() also refreshes each parameter's 16-bit copy from its new value (the graph's forward
// pass reads the copy), for SGD's fused path and LARS's per-parameter one alike.
TEST(Optimizer, StepRefreshesTheSixteenBitCopies) {
  const std::vector<double> w0{1.0, -2.0, 0.5}, g0{0.1, 0.2, -0.3};
  for (const bool lars : {false, true}) {
    SCOPED_TRACE(lars ? "lars" : "sgd");
    OneParam p(ParamRole::weight, w0, g0);
    const Tensor d16 = Tensor::describe(DType::bf16, Shape{3});
    Buffer copy(p.k->allocator(), d16.size_bytes());
    p.params[0].copy = copy.view(d16);
    write_host(p.params[0].copy, {9.0, 9.0, 9.0});  // stale: the step must overwrite it
    std::unique_ptr<Optimizer> opt;
    if (lars) opt = std::make_unique<Lars>(0.5, 0.9, 0.01);
    else opt = std::make_unique<Sgd>(0.5, 0.9, 0.01);
    opt->step(*p.k, p.params);
    const auto w = p.value(), c = read_host(p.params[0].copy);
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_NE(w[i], w0[i]);
      EXPECT_EQ(c[i], static_cast<double>(bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(w[i])))));
    }
  }
}

TEST(Optimizer, LarsScalesWeightsByTheTrustRatioAndLeavesNormParametersPlain) {
  const std::vector<double> w0{3.0, 4.0}, g0{0.6, 0.8};  // |w| = 5, |g| = 1
  OneParam weight(ParamRole::weight, w0, g0), scale(ParamRole::norm_scale, w0, g0);
  Lars lars(2.0, 0.9, 0.1, 0.001);
  const double trust = 0.001 * 5.0 / (1.0 + 0.1 * 5.0);
  lars.step(*weight.k, weight.params);
  Lars lars2(2.0, 0.9, 0.1, 0.001);
  lars2.step(*scale.k, scale.params);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(weight.value()[i], w0[i] - 2.0 * trust * (g0[i] + 0.1 * w0[i]), 1e-15);
    EXPECT_NEAR(scale.value()[i], w0[i] - 2.0 * g0[i], 1e-15);  // no trust ratio, no decay
  }
}

// ---------------------------------------------------------------------------------------------
// precision policies on a tiny ResNet

struct Tiny {
  std::unique_ptr<Kernels> k;
  GraphBuilder b;
  models::Classifier m;
  Graph g;
  std::int64_t batch, px;
  Tiny(GraphOptions o, std::int64_t batch_size = 8, std::int64_t image_px = 8,
       std::unique_ptr<Kernels> kernels = make_ref_kernels())
      : k(std::move(kernels)), b(o), m(models::build_classifier(b, models::tiny_resnet(1, 4), batch_size, image_px)),
        g(std::move(b)), batch(batch_size), px(image_px) {}
  // Fresh random images and labels for `step`.
  void feed(std::uint64_t seed, std::uint64_t step) {
    std::vector<double> x(static_cast<std::size_t>(batch * px * px)), labels(static_cast<std::size_t>(batch));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = uniform(seed + step, i, -2, 2);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<double>(mix64(seed + step, 1000 + i) % 4);
    g.set_input(m.images, x);
    g.set_input(m.labels, labels);
  }
  void step(Optimizer& opt) {
    g.forward();
    g.backward();
    g.update(opt);
  }
};

GraphOptions with_precision(Precision p, std::uint64_t seed = 1) {
  GraphOptions o;
  o.precision = p;
  o.seed = seed;
  return o;
}

double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

// An f32 value rounded to the 16-bit type by core's conversions (an oracle apart from the kernels').
double round_16(DType t, double v) {
  const auto f = static_cast<float>(v);
  return t == DType::f16 ? half_bits_to_float(float_to_half_bits(f)) : bf16_bits_to_float(float_to_bf16_bits(f));
}

// Every 16-bit copy holds its f32 master rounded to nearest even.
void expect_copies_are_rounded_masters(Graph& g, DType t) {
  int copies = 0, weights = 0;
  for (const auto& p : g.parameters()) {
    weights += p.spec.role == ParamRole::weight || p.spec.role == ParamRole::bias ? 1 : 0;
    if (!p.copy.defined()) continue;
    ++copies;
    ASSERT_EQ(p.value.dtype, DType::f32) << p.name;
    ASSERT_EQ(p.copy.dtype, t) << p.name;
    const auto master = g.read(p.value), copy = g.read(p.copy);
    for (std::size_t i = 0; i < master.size(); ++i) ASSERT_EQ(copy[i], round_16(t, master[i])) << p.name << " " << i;
  }
  EXPECT_EQ(copies, weights) << "every convolution and linear parameter has a copy";
  EXPECT_GT(copies, 0);
}

TEST(Precision, OptionsAreValidatedWithTheValidValues) {
  GraphOptions o;
  o.precision = Precision::int8;
  auto msg = test::usage_error([&] { GraphBuilder b(o); });
  EXPECT_NE(msg.find("fp32, tf32, bf16, fp16 or fp8"), std::string::npos) << msg;
  // fp8 is an inference policy stored as fp16; a training graph is refused with the reason.
  o.precision = Precision::fp8;
  msg = test::usage_error([&] { GraphBuilder b(o); });
  EXPECT_NE(msg.find("fp8 is inference only"), std::string::npos) << msg;
  o.training = false;
  EXPECT_EQ(activation_dtype(o), DType::f16);
  o.dtype = DType::f64;
  msg = test::usage_error([&] { GraphBuilder b(o); });
  EXPECT_NE(msg.find("leave dtype at f32"), std::string::npos) << msg;
  o = GraphOptions{};
  o.precision = Precision::bf16;
  o.dtype = DType::f64;
  msg = test::usage_error([&] { GraphBuilder b(o); });
  EXPECT_NE(msg.find("leave dtype at f32"), std::string::npos) << msg;
  o = with_precision(Precision::fp16);
  o.loss_scale_rule.backoff = 1.5;
  msg = test::usage_error([&] { GraphBuilder b(o); });
  EXPECT_NE(msg.find("0 < backoff < 1"), std::string::npos) << msg;
  o = with_precision(Precision::fp16);
  o.initial_loss_scale = 0;
  EXPECT_THROW(GraphBuilder{o}, UsageError);
}

TEST(Precision, SixteenBitPoliciesKeepF32MastersStatisticsAndLoss) {
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    const DType t = p == Precision::bf16 ? DType::bf16 : DType::f16;
    SCOPED_TRACE(std::string(to_string(p)));
    const std::uint64_t seed = test::seed();
    Tiny n(with_precision(p, seed));
    n.g.bind(*n.k);
    EXPECT_EQ(n.g.tensor(n.m.images).dtype, t);
    EXPECT_EQ(n.g.tensor(n.m.logits).dtype, t);
    EXPECT_EQ(n.g.tensor(n.m.loss).dtype, DType::f32);
    EXPECT_EQ(n.g.tensor(n.m.labels).dtype, DType::i32);
    for (const auto& param : n.g.parameters()) {
      EXPECT_EQ(param.value.dtype, DType::f32) << param.name;
      if (param.spec.trainable()) {
        EXPECT_EQ(param.grad.dtype, DType::f32) << param.name;
      }
      const bool norm = param.spec.role == ParamRole::norm_scale || param.spec.role == ParamRole::norm_shift ||
                        param.spec.role == ParamRole::running_stat;
      EXPECT_EQ(param.copy.defined(), !norm) << param.name;
    }
    ASSERT_NO_FATAL_FAILURE(expect_copies_are_rounded_masters(n.g, t));
    // Saved batch statistics are f32; each 16-bit weight gradient lives in the arena for one step.
    bool saw_saved = false, saw_grad16 = false;
    for (const auto& buf : n.g.buffers()) {
      if (buf.label == "bn1:saved0") saw_saved = buf.bytes == 8 * 4;
      if (buf.label == "grad conv1.weight (" + std::string(to_string(t)) + ")") {
        saw_grad16 = buf.bytes == 8 * 9 * 2;
        EXPECT_EQ(buf.first_step, buf.last_step);
      }
    }
    EXPECT_TRUE(saw_saved);
    EXPECT_TRUE(saw_grad16);
    Sgd sgd(0.05, 0.9, 5e-4);
    const auto before = n.g.read(n.g.parameters()[0].value);
    n.feed(seed, 0);
    n.step(sgd);
    const auto after = n.g.read(n.g.parameters()[0].value);
    EXPECT_NE(after, before);
    // The master keeps what the 16-bit copy cannot hold (a step far below its last place).
    int finer = 0;
    for (double v : after) finer += v != round_16(t, v) ? 1 : 0;
    EXPECT_GT(finer, static_cast<int>(after.size()) / 2);
    ASSERT_NO_FATAL_FAILURE(expect_copies_are_rounded_masters(n.g, t));  // refreshed after the update
  }
}

TEST(Precision, SixteenBitActivationsHalveTheArenaAndTheBytes) {
  Tiny f32(with_precision(Precision::fp32), 32, 16), bf16(with_precision(Precision::bf16), 32, 16),
      f16(with_precision(Precision::fp16), 32, 16);
  for (const Tiny* half : {&bf16, &f16}) {
    ASSERT_NO_FATAL_FAILURE(expect_valid_plan(half->g.buffers(), half->g.memory_plan()));
    const double ratio = static_cast<double>(half->g.memory_plan().peak_bytes) /
                         static_cast<double>(f32.g.memory_plan().peak_bytes);
    EXPECT_GT(ratio, 0.45);  // f32 batch statistics and probabilities stay
    EXPECT_LT(ratio, 0.55);
    const auto a = f32.g.report(), b = half->g.report();
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].forward_flops, b[i].forward_flops) << a[i].name;
      if (a[i].kind == "conv2d" || a[i].kind == "relu" || a[i].kind == "add" || a[i].kind == "linear") {
        EXPECT_EQ(b[i].forward_bytes * 2, a[i].forward_bytes) << a[i].name;
        EXPECT_EQ(b[i].backward_bytes * 2, a[i].backward_bytes) << a[i].name;
      }
    }
  }
  EXPECT_EQ(bf16.g.memory_plan().peak_bytes, f16.g.memory_plan().peak_bytes);
}

TEST(Precision, Bf16AndFp16StepsAgreeWithFp32) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Tiny ref32(with_precision(Precision::fp32, seed), 16);
  ref32.g.bind(*ref32.k);
  ref32.feed(seed, 0);
  ref32.g.forward();
  ref32.g.backward();
  const auto logits32 = ref32.g.read(ref32.m.logits);
  const double loss32 = ref32.g.read(ref32.m.loss)[0];
  std::vector<double> grads32;
  for (auto& p : ref32.g.parameters())
    if (p.spec.trainable())
      for (double v : ref32.g.read(p.grad)) grads32.push_back(v);
  Sgd sgd32(0.05, 0.9, 5e-4);
  ref32.g.update(sgd32);
  // Tolerances, relative: 2-5x the largest seen over 300 seeds (the tails are long). Logits and the classifier's
  // gradients carry a few roundings (bf16 keeps 8 significant bits, fp16 11). Earlier layers'
  // gradients differ more, and a small one (a batch-norm bias) can be all noise: rounding moves
  // activations across ReLU's kink, an error that shrinks only as the square root of the
  // precision. So those are checked together, with the weights the step moved.
  struct Tol {
    Precision p;
    double logits, loss, classifier, grads, weights;
  };
  for (const Tol& tol : {Tol{Precision::bf16, 0.04, 3e-3, 0.045, 0.5, 0.02},
                         Tol{Precision::fp16, 5e-3, 4e-4, 6e-3, 0.3, 0.012}}) {
    SCOPED_TRACE(std::string(to_string(tol.p)));
    Tiny n(with_precision(tol.p, seed), 16);
    n.g.bind(*n.k);
    n.feed(seed, 0);
    n.g.forward();
    n.g.backward();
    const double e_logits = rel_error(n.g.read(n.m.logits), logits32);
    const double e_loss = std::abs(n.g.read(n.m.loss)[0] - loss32) / loss32;
    std::vector<double> grads, fc, fc32;
    for (auto& param : n.g.parameters()) {
      if (!param.spec.trainable()) continue;
      const auto g = n.g.read(param.grad);
      if (param.name.rfind("fc.", 0) == 0) {
        fc.insert(fc.end(), g.begin(), g.end());
        fc32.insert(fc32.end(), grads32.begin() + static_cast<long>(grads.size()),
                    grads32.begin() + static_cast<long>(grads.size() + g.size()));
      }
      grads.insert(grads.end(), g.begin(), g.end());
    }
    const double e_fc = rel_error(fc, fc32), e_grads = rel_error(grads, grads32);
    EXPECT_LT(e_logits, tol.logits);
    EXPECT_LT(e_loss, tol.loss);
    EXPECT_LT(e_fc, tol.classifier);
    EXPECT_LT(e_grads, tol.grads);  // fp16: a forgotten unscale would be 65536x off
    Sgd sgd(0.05, 0.9, 5e-4);
    n.g.update(sgd);
    EXPECT_FALSE(n.g.last_step_skipped());
    double e_weights = 0;
    for (std::size_t i = 0; i < n.g.parameters().size(); ++i) {
      const auto& param = n.g.parameters()[i];
      if (param.spec.role != ParamRole::weight) continue;
      e_weights = std::max(e_weights, rel_error(n.g.read(param.value), ref32.g.read(ref32.g.parameters()[i].value)));
    }
    EXPECT_LT(e_weights, tol.weights);
    std::printf("%s vs fp32: logits %.1e, loss %.1e, classifier gradients %.1e, all gradients %.1e, "
                "weights after a step %.1e\n",
                std::string(to_string(tol.p)).c_str(), e_logits, e_loss, e_fc, e_grads, e_weights);
  }
}

// Trainable masters and 16-bit copies, as bits.
std::vector<std::vector<double>> trained_state(Graph& g) {
  std::vector<std::vector<double>> s;
  for (const auto& p : g.parameters()) {
    if (!p.spec.trainable()) continue;
    s.push_back(g.read(p.value));
    if (p.copy.defined()) s.push_back(g.read(p.copy));
  }
  return s;
}

TEST(Precision, Fp16SkipsAStepWithANonFiniteGradientAndAdaptsTheScale) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  GraphOptions o = with_precision(Precision::fp16, seed);
  o.initial_loss_scale = 1024;
  o.loss_scale_rule.growth_interval = 3;
  Tiny n(o);
  n.g.bind(*n.k);
  EXPECT_EQ(n.g.loss_scale(), 1024);
  Sgd sgd(0.05, 0.9, 5e-4);
  n.feed(seed, 0);
  n.step(sgd);
  EXPECT_FALSE(n.g.last_step_skipped());
  EXPECT_EQ(n.g.loss_scale(), 1024);

  // An infinite pixel: every gradient is NaN, the step must change nothing.
  auto state = trained_state(n.g);
  n.feed(seed, 1);
  auto images = n.g.read(n.m.images);
  images[5] = std::numeric_limits<double>::infinity();
  n.g.set_input(n.m.images, images);
  n.step(sgd);
  EXPECT_TRUE(n.g.last_step_skipped());
  EXPECT_EQ(n.g.loss_scale(), 512);
  EXPECT_EQ(trained_state(n.g), state) << "a skipped step changed a parameter";

  // Good steps again: the scale grows after growth_interval of them in a row.
  const std::vector<double> want{512, 512, 1024, 1024};
  for (std::size_t i = 0; i < want.size(); ++i) {
    n.feed(seed, 2 + i);
    n.step(sgd);
    EXPECT_FALSE(n.g.last_step_skipped()) << "good step " << i;
    EXPECT_EQ(n.g.loss_scale(), want[i]) << "good step " << i;
    EXPECT_NE(trained_state(n.g), state);
    state = trained_state(n.g);
  }

  // A scale so large that the 16-bit gradients overflow: skipped, backed off.
  n.g.set_loss_scale(3e38);
  n.feed(seed, 9);
  n.step(sgd);
  EXPECT_TRUE(n.g.last_step_skipped());
  EXPECT_EQ(n.g.loss_scale(), static_cast<double>(static_cast<float>(static_cast<float>(3e38) * 0.5)));
  EXPECT_EQ(trained_state(n.g), state);
}

// Reference kernels that remember the flags a graph sets.
class FlagSpy final : public ref::RefKernels {
 public:
  void set_deterministic(bool on) override { deterministic = on; }
  void set_tf32(bool allowed) override { tf32 = allowed; }
  int deterministic = -1, tf32 = -1;
};

TEST(Precision, DeterministicAndTf32FlagsReachTheKernels) {
  FlagSpy spy;
  GraphOptions o = with_precision(Precision::tf32);
  o.deterministic = true;
  Tiny a(o);
  a.g.bind(spy);
  EXPECT_EQ(spy.deterministic, 1);
  EXPECT_EQ(spy.tf32, 1);
  EXPECT_EQ(a.g.tensor(a.m.images).dtype, DType::f32);  // tf32 stores f32
  Tiny b(with_precision(Precision::fp32));
  b.g.bind(spy);
  EXPECT_EQ(spy.deterministic, 0);
  EXPECT_EQ(spy.tf32, 0);
}

// ---------------------------------------------------------------------------------------------
// convolution passes

// Reference kernels that record the passes each convolution is prepared for and, as the CUDA
// kernels do, refuse a backward pass for a configuration no layer was prepared for.
class ConvPassSpy final : public ref::RefKernels {
 public:
  std::int64_t conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                              ConvPasses passes) override {
    prepared.push_back(passes);
    if (passes.backward_data) with_data.push_back(x.to_string() + " " + w.to_string());
    if (passes.backward_filter) with_filter.push_back(x.to_string() + " " + w.to_string());
    return RefKernels::conv2d_prepare(d, x, w, y, passes);
  }
  void conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate,
                            Workspace ws) override {
    ++data_calls;
    if (!has(with_data, dx.to_string() + " " + w.to_string())) throw Error("backward-data not prepared");
    RefKernels::conv2d_backward_data(d, dy, w, dx, accumulate, ws);
  }
  void conv2d_backward_filter(const Conv2dDesc& d, const Tensor& x, const Tensor& dy, const Tensor& dw,
                              Workspace ws) override {
    ++filter_calls;
    if (!has(with_filter, x.to_string() + " " + dw.to_string())) throw Error("backward-filter not prepared");
    RefKernels::conv2d_backward_filter(d, x, dy, dw, ws);
  }
  static bool has(const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  }
  std::vector<ConvPasses> prepared;
  std::vector<std::string> with_data, with_filter;  // the configurations prepared for each pass
  int data_calls = 0, filter_calls = 0;
};

TEST(Graph, ConvolutionsArePreparedOnlyForThePassesTheyRun) {
  // Inference: forward only, for every convolution.
  GraphOptions inference;
  inference.training = false;
  ConvPassSpy inf_spy;
  Tiny inf(inference);
  inf.g.bind(inf_spy);
  ASSERT_GT(inf_spy.prepared.size(), 3u);
  for (const ConvPasses& p : inf_spy.prepared) {
    EXPECT_FALSE(p.backward_data);
    EXPECT_FALSE(p.backward_filter);
  }
  inf.feed(test::seed(), 0);
  inf.g.forward(false);

  // Training: the stem's input (the images; convolution 0) needs no gradient, so no backward-data;
  // every convolution has a trainable weight, so backward-filter. A step runs only prepared passes.
  ConvPassSpy spy;
  Tiny train(GraphOptions{});
  train.g.bind(spy);
  ASSERT_EQ(spy.prepared.size(), inf_spy.prepared.size());
  for (std::size_t i = 0; i < spy.prepared.size(); ++i) {
    EXPECT_EQ(spy.prepared[i].backward_data, i > 0) << "convolution " << i;
    EXPECT_TRUE(spy.prepared[i].backward_filter) << "convolution " << i;
  }
  Sgd sgd(0.05, 0.9, 0);
  train.feed(test::seed(), 0);
  train.step(sgd);
  const auto convs = static_cast<int>(spy.prepared.size());
  EXPECT_EQ(spy.data_calls, convs - 1);
  EXPECT_EQ(spy.filter_calls, convs);

  // An input that requires a gradient gets the first convolution's backward-data too.
  ConvPassSpy x_spy;
  Bound b(GraphOptions{});
  b.g.bind(x_spy);
  ASSERT_EQ(x_spy.prepared.size(), 3u);
  for (const ConvPasses& p : x_spy.prepared) EXPECT_TRUE(p.backward_data && p.backward_filter);
}

// ---------------------------------------------------------------------------------------------
// whole-step capture

TEST(Capture, ReplayedStepsEqualDirectCallsInEveryPolicy) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(std::string(to_string(p)));
    const std::uint64_t seed = test::seed();
    Tiny direct(with_precision(p, seed)), captured(with_precision(p, seed));
    direct.g.bind(*direct.k);
    captured.g.bind(*captured.k);
    Sgd sgd_direct(0.05, 0.9, 5e-4), sgd_captured(0.05, 0.9, 5e-4);
    const auto initial = trained_state(captured.g);
    captured.feed(seed, 0);
    auto step = captured.g.capture_step(&sgd_captured);
    EXPECT_EQ(trained_state(captured.g), initial) << "capture ran the step";
    sgd_captured.set_learning_rate(0.0);  // no effect: the replay keeps the captured value
    for (std::uint64_t i = 0; i < 3; ++i) {
      direct.feed(seed, i);
      direct.step(sgd_direct);
      captured.feed(seed, i);
      step->replay();
      EXPECT_EQ(captured.g.read(captured.m.loss), direct.g.read(direct.m.loss)) << "step " << i;
      EXPECT_EQ(trained_state(captured.g), trained_state(direct.g)) << "step " << i;
      EXPECT_EQ(captured.g.loss_scale(), direct.g.loss_scale());
    }
    EXPECT_NE(trained_state(captured.g), initial);
  }
}

TEST(Capture, InferenceGraphReplaysItsForwardPass) {
  GraphOptions o = with_precision(Precision::bf16);
  o.training = false;
  Tiny n(o);
  n.g.bind(*n.k);
  auto step = n.g.capture_step(nullptr);
  const std::uint64_t seed = test::seed();
  n.feed(seed, 0);
  step->replay();
  const auto replayed = n.g.read(n.m.logits);
  n.g.forward(false);
  EXPECT_EQ(n.g.read(n.m.logits), replayed);
  n.feed(seed, 1);
  step->replay();
  EXPECT_NE(n.g.read(n.m.logits), replayed);
}

TEST(Capture, RefusesProfilingAndAStepThatAllocates) {
  Tiny n(GraphOptions{});
  n.g.bind(*n.k);
  Sgd sgd(0.05, 0.9, 0);
  n.g.set_profiling(true);
  EXPECT_THROW(n.g.capture_step(&sgd), Error);
  n.g.set_profiling(false);
  // Capturing by hand with an optimizer that has not allocated its velocities yet: the first
  // step would allocate, which a captured step cannot. capture_step binds the optimizer first.
  try {
    n.k->capture([&] { n.step(sgd); });
    FAIL() << "a step that allocates was captured";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("while capturing"), std::string::npos) << e.what();
  }
  EXPECT_NE(n.g.capture_step(&sgd), nullptr);
}

// ---------------------------------------------------------------------------------------------
// learning in bf16 on the reference kernels

TEST(Learnability, TinyResnetLearnsTheSyntheticTaskInBf16) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto start = std::chrono::steady_clock::now();
  auto kernels = make_ref_kernels();
  GraphBuilder b(with_precision(Precision::bf16, seed + 1));
  const models::Classifier m = models::build_classifier(b, models::tiny_resnet(1, test::kPatternClasses),
                                                        test::kPatternBatch, test::kPatternPx);
  Graph g(std::move(b));
  g.bind(*kernels);
  Sgd sgd(0.05, 0.9, 5e-4);
  std::vector<double> losses;
  // Over 38 seeds the mean loss of the last 10 of 60 steps was at most 0.053 (chance: ln 4 = 1.39).
  constexpr int kSteps = 60;
  for (int step = 0; step < kSteps; ++step) {
    const test::PatternBatch batch = test::pattern_batch(seed, static_cast<std::uint64_t>(step));
    g.set_input(m.images, batch.images);
    g.set_input(m.labels, batch.labels);
    g.forward();
    g.backward();
    g.update(sgd);
    losses.push_back(g.read(m.loss)[0]);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double chance = std::log(static_cast<double>(test::kPatternClasses));
  EXPECT_LT(test::mean_tail(losses, 10), 0.25 * chance);
  std::printf("tiny resnet, bf16 SGD: loss %.3f -> %.3f in %d steps, %.1f s\n", losses.front(),
              test::mean_tail(losses, 10), kSteps, seconds);
}

// ---------------------------------------------------------------------------------------------
// data parallelism: gradient buckets

using dist::BucketedGradientSync;
using dist::GradientAverager;

// Records the blocks it is asked to average, in order; averaging is left to the test.
struct RecordingAverager final : GradientAverager {
  std::vector<Tensor> blocks;
  std::vector<std::string> events;  // "average" / "join", in call order
  void average(const Tensor& flat) override {
    blocks.push_back(flat);
    events.emplace_back("average");
  }
  void join() override { events.emplace_back("join"); }
};

TEST(DataParallel, AveragedBucketsOfTwoHalfBatchesGiveTheFullBatchGradients) {
  GraphOptions o;
  o.dtype = DType::f64;
  o.seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  Bound full(o, 8, /*with_batchnorm=*/false);
  full.g.bind(*full.k);
  fill_inputs(full.g, full.m, 8, o.seed);
  full.g.forward();
  full.g.backward();

  // Two ranks, simulated: each half batch on its own graph with its own sync; tiny buckets so
  // that the parameters spread over several of them.
  Bound half0(o, 4, false), half1(o, 4, false);
  RecordingAverager avg0, avg1;
  half0.g.bind(*half0.k);
  half1.g.bind(*half1.k);
  BucketedGradientSync sync0(half0.g.parameters(), avg0, 100), sync1(half1.g.parameters(), avg1, 100);
  ASSERT_GT(sync0.buckets().size(), 2u);
  half0.g.set_gradient_sync(&sync0);
  half1.g.set_gradient_sync(&sync1);
  fill_inputs(half0.g, half0.m, 4, o.seed, 0);
  fill_inputs(half1.g, half1.m, 4, o.seed, 4);
  for (Bound* h : {&half0, &half1}) {
    h->g.forward();
    h->g.backward();
  }
  // Every bucket once per backward, in bucket order (backward order), then one join.
  ASSERT_EQ(avg0.blocks.size(), sync0.buckets().size());
  ASSERT_EQ(avg1.blocks.size(), avg0.blocks.size());
  EXPECT_EQ(avg0.events.back(), "join");
  EXPECT_EQ(std::count(avg0.events.begin(), avg0.events.end(), "join"), 1);
  for (std::size_t b = 0; b < avg0.blocks.size(); ++b) {
    EXPECT_EQ(avg0.blocks[b].data, sync0.buckets()[b].flat.data) << "bucket " << b;
    const auto a = read_host(avg0.blocks[b]), c = read_host(avg1.blocks[b]);
    std::vector<double> mean(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) mean[i] = (a[i] + c[i]) / 2;
    write_host(avg0.blocks[b], mean);
  }
  // Bucket 0 holds the last layer's parameters: reduction starts with the first gradients made.
  EXPECT_EQ(sync0.buckets().front().parameters.front(), half0.g.parameters().size() - 1);

  std::size_t compared = 0;
  for (std::size_t i = 0; i < full.g.parameters().size(); ++i) {
    const Parameter& want = full.g.parameters()[i];
    if (!want.grad.defined()) continue;
    const auto w = read_host(want.grad), got = read_host(half0.g.parameters()[i].grad);
    double largest = 0;
    for (double v : w) largest = std::max(largest, std::abs(v));
    ASSERT_GT(largest, 1e-8) << want.name << ": an all-zero gradient checks nothing";
    for (std::size_t j = 0; j < w.size(); ++j)
      ASSERT_NEAR(got[j], w[j], 1e-12 * std::max(1.0, largest)) << want.name << " element " << j;
    ++compared;
  }
  EXPECT_EQ(compared, 5u);  // three convolution weights, the linear layer's weight and bias
}

TEST(DataParallel, ABucketIsAveragedWhenItsLastGradientIsReadyAndTheRestAtFinish) {
  // Four f32 gradients of 64 bytes in one store, as the graph lays them out (aligned).
  std::vector<unsigned char> store(4 * kAllocAlignment);
  std::vector<Parameter> params(4);
  for (std::size_t i = 0; i < params.size(); ++i) {
    params[i].name = "p" + std::to_string(i);
    params[i].grad = Tensor::describe(DType::f32, Shape{16}).with_data(store.data() + i * kAllocAlignment);
  }
  RecordingAverager avg;
  BucketedGradientSync sync(params, avg, 128);  // two gradients per bucket: {p3, p2}, {p1, p0}
  ASSERT_EQ(sync.buckets().size(), 2u);
  EXPECT_EQ(sync.buckets()[0].parameters, (std::vector<std::size_t>{3, 2}));
  EXPECT_EQ(sync.buckets()[0].flat.data, params[2].grad.data);
  EXPECT_EQ(sync.buckets()[0].flat.numel(), kAllocAlignment / 4 + 16);  // p2, padding, p3
  for (int step = 0; step < 2; ++step) {
    avg.blocks.clear();
    sync.begin();
    sync.ready(3);
    EXPECT_TRUE(avg.blocks.empty());
    sync.ready(2);
    ASSERT_EQ(avg.blocks.size(), 1u) << "the first bucket starts as soon as it is complete";
    sync.ready(1);  // p0's op ran no backward: its bucket goes at finish
    EXPECT_EQ(avg.blocks.size(), 1u);
    sync.finish();
    ASSERT_EQ(avg.blocks.size(), 2u);
    EXPECT_EQ(avg.blocks[1].data, params[0].grad.data);
  }
  sync.begin();
  sync.ready(3);
  EXPECT_THROW(sync.ready(3), Error);
  EXPECT_THROW(BucketedGradientSync(params, avg, 0), UsageError);

  // A tail: the first parameters (backward's last gradients) alone in the bucket reduced last.
  BucketedGradientSync tail1(params, avg, 128, 1);  // p0 holds >= 1 byte: {p3, p2}, {p1}, {p0}
  ASSERT_EQ(tail1.buckets().size(), 3u);
  EXPECT_EQ(tail1.buckets()[1].parameters, (std::vector<std::size_t>{1}));
  EXPECT_EQ(tail1.buckets()[2].parameters, (std::vector<std::size_t>{0}));
  avg.blocks.clear();
  tail1.begin();
  for (std::size_t i : {3, 2, 1}) tail1.ready(i);
  EXPECT_EQ(avg.blocks.size(), 2u) << "p1's bucket no longer waits for p0";
  tail1.ready(0);
  ASSERT_EQ(avg.blocks.size(), 3u);
  EXPECT_EQ(avg.blocks[2].data, params[0].grad.data);
  tail1.finish();
  EXPECT_EQ(avg.blocks.size(), 3u);
  BucketedGradientSync tail100(params, avg, 128, 100);  // p0 + p1 reach 100 bytes: {p3, p2}, {p1, p0}
  ASSERT_EQ(tail100.buckets().size(), 2u);
  EXPECT_EQ(tail100.buckets()[1].parameters, (std::vector<std::size_t>{1, 0}));
  BucketedGradientSync everything(params, avg, 128, 1 << 20);  // the tail takes all: one bucket
  ASSERT_EQ(everything.buckets().size(), 1u);
  EXPECT_THROW(BucketedGradientSync(params, avg, 128, -1), UsageError);
}

// ---------------------------------------------------------------------------------------------
// The compression layers in a graph

// x -> conv (stride 2) -> relu = t; t feeds two transposed convolutions (a branch point: the second
// one in backward order adds its data gradient through the scratch after the workspace), their sum
// is x_hat, and the rate-distortion loss reads x_hat, x itself (so x's gradient sums the loss's and
// the convolution's) and t as the latent. No quantiser: its straight-through gradient is not the
// derivative finite differences measure.
struct CodecNet {
  Value x, t, loss, mse;
};

CodecNet codec_net(GraphBuilder& b) {
  CodecNet m;
  m.x = b.input("x", Shape{2, 2, 6, 6}, /*requires_grad=*/true);
  const Conv2dDesc s2{2, 2, 1, 1, 1, 1, 1};
  m.t = relu(b, "relu", conv2d(b, "conv", m.x, Conv2dAttrs{3, 3, 3, s2}));
  const Value a = conv_transpose2d(b, "deconv_a", m.t, ConvTranspose2dAttrs{2, 3, 3, s2, 1, 1});
  const Value c = conv_transpose2d(b, "deconv_b", m.t, ConvTranspose2dAttrs{2, 2, 2, Conv2dDesc{2, 2, 0, 0, 1, 1, 1}, 0, 0});
  const RateDistortion rd = rate_distortion_loss(b, "loss", add(b, "sum", a, c), m.x, m.t, {0.05});
  m.loss = rd.loss;
  m.mse = rd.mse;
  b.set_loss(m.loss);
  b.mark_output(m.mse);
  return m;
}

TEST(Graph, CompressionLayersGradientsMatchFiniteDifferencesThroughBranchPoints) {
  GraphOptions o;
  o.dtype = DType::f64;
  o.seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  auto k = make_ref_kernels();
  GraphBuilder b(o);
  const CodecNet m = codec_net(b);
  Graph g(std::move(b));
  g.bind(*k);
  std::vector<double> x(144);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = uniform(o.seed, i, -1, 1);
  g.set_input(m.x, x);
  const auto loss = [&] {
    g.forward();
    return g.read(m.loss)[0];
  };
  loss();
  EXPECT_GT(g.read(m.mse)[0], 0.0);
  g.backward();
  const auto grad_x = g.read(g.grad(m.x));
  int checked = 0, skipped = 0;
  for (auto& p : g.parameters())
    check_tensor_gradient(loss, p.value, read_host(p.grad), p.name, o.seed + 1, 8, &checked, &skipped);
  check_tensor_gradient(loss, g.tensor(m.x), grad_x, "x", o.seed + 2, 8, &checked, &skipped);
  EXPECT_GE(checked, 28);  // 4 tensors x 8 elements, a few kinks skipped
  EXPECT_LE(skipped, 4);
}

TEST(Graph, QuantizerSharesItsGradientBufferWhenItWritesItFirst) {
  // Rate on the quantised latent: the encoder's output has one consumer, the quantiser, which
  // writes its gradient first, so the planner gives both one buffer and the backward copies nothing.
  GraphOptions o;
  o.dtype = DType::f64;
  o.seed = test::seed();
  auto k = make_ref_kernels();
  GraphBuilder b(o);
  const Value x = b.input("x", Shape{2, 2, 4, 4});
  const Value y = conv2d(b, "enc", x, Conv2dAttrs{3, 3, 3, Conv2dDesc{2, 2, 1, 1, 1, 1, 1}});
  const Value q = quantize_ste(b, "quantize", y, 0.25);
  const Value x_hat = conv_transpose2d(b, "dec", q, ConvTranspose2dAttrs{2, 3, 3, Conv2dDesc{2, 2, 1, 1, 1, 1, 1}, 1, 1});
  const RateDistortion rd = rate_distortion_loss(b, "loss", x_hat, x, q, {0.1});
  b.set_loss(rd.loss);
  Graph g(std::move(b));
  g.bind(*k);
  std::vector<double> images(64);
  for (std::size_t i = 0; i < images.size(); ++i) images[i] = uniform(o.seed, i, -2, 2);
  g.set_input(x, images);
  g.forward();
  g.backward();
  EXPECT_EQ(g.grad(y).data, g.grad(q).data);
  const auto dq = g.read(g.grad(q));
  double largest = 0;
  for (double v : dq) largest = std::max(largest, std::abs(v));
  EXPECT_GT(largest, 0.0);
  for (std::size_t i = 0; i < g.op_count(); ++i)
    if (g.op(i).name() == "quantize") {
      EXPECT_EQ(g.op(i).bytes(Pass::backward), 0);
    }
  // Quantised: every latent on the grid.
  for (double v : g.read(q)) EXPECT_EQ(v, 0.25 * std::nearbyint(v / 0.25));
}

}  // namespace
}  // namespace ab::nn
