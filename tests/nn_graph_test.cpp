// Tests for the nn graph, memory planner and optimizers on the reference kernels: whole-graph
// gradients (branch points that sum gradients, an input gradient) against finite differences,
// planned buffers that never overlap while alive, an inference plan, per-op timing, a backend
// refusal and shape-inference errors that name the layer and the reason, and SGD/LARS steps
// against their formulas.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/rng.h"
#include "nn/graph.h"
#include "nn/ops.h"
#include "nn/optim.h"
#include "nn/planner.h"

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
  expect_valid_plan(bufs, plan);
  EXPECT_EQ(plan.offsets_bytes[0], plan.offsets_bytes[1]);  // a and b share bytes
  EXPECT_EQ(plan.peak_bytes, 1024 + 512);
  EXPECT_EQ(plan.total_bytes, 1024 + 1024 + 512);
  EXPECT_EQ(plan.live_bound_bytes, 1536);
}

TEST(Planner, RandomLifetimesNeverOverlapWhileAlive) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<BufferLifetime> bufs;
  for (std::uint64_t i = 0; i < 300; ++i) {
    const int first = static_cast<int>(mix64(seed, 3 * i) % 100);
    const int len = static_cast<int>(mix64(seed, 3 * i + 1) % 20);
    const auto bytes = static_cast<std::int64_t>(mix64(seed, 3 * i + 2) % 100000);
    bufs.push_back({bytes, first, first + len, "buffer " + std::to_string(i)});
  }
  const MemoryPlan plan = plan_memory(bufs);
  expect_valid_plan(bufs, plan);
  EXPECT_LT(plan.peak_bytes, plan.total_bytes / 2);  // short lifetimes over 120 steps: much reuse
}

// ---------------------------------------------------------------------------------------------
// a small network with the ResNet ingredients; `p` feeds three layers (gradients sum there)

struct SmallNet {
  Value x, labels, logits, loss;
};

SmallNet small_net(GraphBuilder& b, std::int64_t n) {
  SmallNet m;
  m.x = b.input("x", Shape{n, 2, 6, 6}, /*requires_grad=*/true);
  m.labels = b.input("labels", Shape{n}, DType::i32);
  Conv2dAttrs c1{4, 3, 3, Conv2dDesc{1, 1, 1, 1, 1, 1, 1}};
  Value y = relu(b, "relu1", batchnorm2d(b, "bn1", conv2d(b, "conv1", m.x, c1)));
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
  explicit Bound(GraphOptions o, std::int64_t n = 4) : b(o), m(small_net(b, n)), g(std::move(b)) {}
};

void fill_inputs(Graph& g, const SmallNet& m, std::int64_t n, std::uint64_t seed) {
  std::vector<double> x(static_cast<std::size_t>(n * 72)), labels(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = uniform(seed, i, -1, 1);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<double>(i % 3);
  g.set_input(m.x, x);
  g.set_input(m.labels, labels);
}

double loss_of(Graph& g, const SmallNet& m) {
  g.forward();
  return g.read(m.loss)[0];
}

// Central difference at two step sizes; a pair that disagrees straddles a ReLU or max-pool kink
// and is skipped (counted), anything else must match the analytic gradient.
void check_tensor_gradient(Graph& g, const SmallNet& m, const Tensor& value, const std::vector<double>& grad,
                           const std::string& what, std::uint64_t seed, int* checked, int* skipped) {
  auto v = read_host(value);
  for (std::uint64_t s = 0; s < 6; ++s) {
    const std::size_t i = mix64(seed, s) % v.size();
    const double x0 = v[i];
    auto diff = [&](double h) {
      v[i] = x0 + h;
      write_host(value, v);
      const double up = loss_of(g, m);
      v[i] = x0 - h;
      write_host(value, v);
      const double down = loss_of(g, m);
      v[i] = x0;
      write_host(value, v);
      return (up - down) / (2 * h);
    };
    const double n1 = diff(1e-6), n2 = diff(5e-7);
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
  o.seed = fresh_seed();
  Bound t(o);
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  t.g.bind(*t.k);
  fill_inputs(t.g, t.m, 4, o.seed);
  loss_of(t.g, t.m);
  t.g.backward();
  // Read now: the arena reuses the input gradient's bytes during the next forward pass.
  const auto grad_x = t.g.read(t.g.grad(t.m.x));
  int checked = 0, skipped = 0;
  for (auto& p : t.g.parameters()) {
    if (!p.spec.trainable()) continue;
    const auto grad = read_host(p.grad);
    double largest = 0;
    for (double v : grad) largest = std::max(largest, std::abs(v));
    EXPECT_GT(largest, 1e-6) << p.name << ": an all-zero gradient checks nothing";
    check_tensor_gradient(t.g, t.m, p.value, grad, p.name, o.seed + 1, &checked, &skipped);
  }
  // The input's gradient flows back through every branch point.
  check_tensor_gradient(t.g, t.m, t.g.tensor(t.m.x), grad_x, "x", o.seed + 2, &checked, &skipped);
  EXPECT_GE(checked, 44);  // 8 tensors x 6 elements, a few kinks skipped
  EXPECT_LE(skipped, 4);
}

TEST(Graph, PlanKeepsLiveBuffersApartAndReusesMemory) {
  Bound t(GraphOptions{});
  const auto& bufs = t.g.buffers();
  const MemoryPlan& plan = t.g.memory_plan();
  expect_valid_plan(bufs, plan);
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
  expect_valid_plan(inf.g.buffers(), inf.g.memory_plan());
  EXPECT_LT(inf.g.memory_plan().peak_bytes, train.g.memory_plan().peak_bytes);
  EXPECT_EQ(inf.g.backward_flops(), 0);
  for (const auto& b : inf.g.buffers()) EXPECT_EQ(b.label.rfind("grad ", 0), std::string::npos) << b.label;
  inf.g.bind(*inf.k);
  fill_inputs(inf.g, inf.m, 4, fresh_seed());
  inf.g.forward(false);
  EXPECT_THROW(inf.g.backward(), Error);
}

TEST(Graph, ProfilingRecordsEveryOpsTimeAndTheTableAddsUp) {
  Bound t(GraphOptions{});
  t.g.set_profiling(true);
  t.g.bind(*t.k);
  fill_inputs(t.g, t.m, 4, fresh_seed());
  t.g.forward();
  t.g.backward();
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

TEST(Graph, BackendRefusalNamesTheLayerAndTheReason) {
  GraphOptions o;
  o.dtype = DType::bf16;
  Bound t(o);
  try {
    t.g.bind(*t.k);
    FAIL() << "ref bound a bf16 graph";
  } catch (const Unsupported& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer 'conv1' (conv2d)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not bf16"), std::string::npos) << msg;
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

}  // namespace
}  // namespace ab::nn
