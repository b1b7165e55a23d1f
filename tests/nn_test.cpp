// Tests for core/tensor and the nn ops on the reference kernels: every op's forward against an
// independent naive formula, every op's backward against central finite differences on fresh
// random inputs (f64 storage), the accumulate path of every input gradient, layouts, and
// bit-identical results at any thread count; 16-bit storage (each op's result is the f64 result
// rounded once), casts, loss scaling, skipped optimizer steps and capture on the reference kernels;
// the fused bias_act epilogue against the reference ops it replaces; conv_bias_act's fp8 path and
// its 16-bit fallback.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/kernels.h"
#include "nn/ops.h"
#include "nn/ref/ref_kernels.h"
#include "test_support.h"

namespace ab::nn {
namespace {

// ---------------------------------------------------------------------------------------------
// core/tensor

TEST(Tensor, StridesAndLayouts) {
  const Shape s{2, 3, 4, 5};
  EXPECT_EQ(s.numel(), 120);
  EXPECT_EQ(contiguous_strides(s, Layout::nchw), (Shape{60, 20, 5, 1}));
  EXPECT_EQ(contiguous_strides(s, Layout::nhwc), (Shape{60, 1, 15, 3}));  // N, H, W, C
  EXPECT_EQ(contiguous_strides(Shape{7, 9}, Layout::nhwc), (Shape{9, 1}));  // other ranks: row-major
  const Tensor t = Tensor::describe(DType::bf16, s, Layout::nhwc);
  EXPECT_EQ(t.size_bytes(), 240);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_string(), "bf16[2, 3, 4, 5] nhwc");
  EXPECT_THROW(Shape({1, -2}), Error);
  EXPECT_THROW(parse_layout("chwn"), UsageError);
}

TEST(Tensor, HostValuesKeepLogicalOrderInEveryLayout) {
  HostAllocator alloc;
  const Shape s{2, 3, 2, 2};
  std::vector<double> v(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) + 0.5;
  Buffer a(alloc, 1024), b(alloc, 1024);
  const Tensor nchw = a.view(Tensor::describe(DType::f32, s, Layout::nchw));
  const Tensor nhwc = b.view(Tensor::describe(DType::f32, s, Layout::nhwc));
  write_host(nchw, v);
  write_host(nhwc, v);
  EXPECT_EQ(read_host(nchw), v);
  EXPECT_EQ(read_host(nhwc), v);
  // Element (n=0, c=1, h=0, w=0) is logical index 4: second in NHWC memory, fifth in NCHW memory.
  EXPECT_EQ(nhwc.as<float>()[1], 4.5f);
  EXPECT_EQ(nchw.as<float>()[4], 4.5f);
  EXPECT_EQ(alloc.bytes_in_use(), 2048);
  EXPECT_THROW(a.view(Tensor::describe(DType::f64, Shape{200})), Error);  // 1600 bytes > 1024
}

TEST(Tensor, BufferReleasesOnMoveAndDestruction) {
  HostAllocator alloc;
  {
    Buffer a(alloc, 4096);
    Buffer b = std::move(a);
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(alloc.bytes_in_use(), 4096);
    b = Buffer(alloc, 100);
    EXPECT_EQ(alloc.bytes_in_use(), 100);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % kAllocAlignment, 0u);
  }
  EXPECT_EQ(alloc.bytes_in_use(), 0);
  EXPECT_EQ(alloc.peak_bytes(), 4196);
}

// ---------------------------------------------------------------------------------------------
// The finite-difference harness: one op with every tensor bound to its own host buffer.

struct Harness {
  std::unique_ptr<Kernels> k = make_ref_kernels();
  Op& op;
  std::vector<Buffer> store;
  OpTensors t;
  std::vector<double> r;  // the loss is sum(r * y): dy = r
  std::uint64_t seed;

  Tensor alloc(const Tensor& desc) {
    store.emplace_back(k->allocator(), desc.size_bytes());
    return store.back().view(desc);
  }

  // Inputs get values from `gen` (per input, per element); parameters random, positive where
  // they are running variances; `needs` says which inputs get a gradient.
  Harness(Op& o, const std::vector<Tensor>& inputs, const std::vector<bool>& needs, Layout layout,
          const std::function<double(std::size_t, std::size_t)>& gen)
      : op(o), seed(test::seed()) {
    auto place = [&](const Tensor& d) { return Tensor::describe(d.dtype, d.shape, layout); };
    const auto outs = op.infer(inputs);
    op.set_context(true, needs);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      t.in.push_back(alloc(place(inputs[i])));
      std::vector<double> v(static_cast<std::size_t>(inputs[i].numel()));
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = gen(i, j);
      write_host(t.in.back(), v);
      t.din.push_back(needs[i] ? alloc(place(inputs[i])) : place(inputs[i]));
      t.din_accumulate.push_back(false);
    }
    std::size_t salt = 1000;
    for (const auto& spec : op.parameters()) {
      t.params.push_back(alloc(place(Tensor::describe(spec.dtype, spec.shape))));
      std::vector<double> v(static_cast<std::size_t>(spec.shape.numel()));
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = uniform(seed, salt++, spec.name == "running_var" ? 0.5 : -1.0, 1.5);
      write_host(t.params.back(), v);
      t.dparams.push_back(spec.trainable() ? alloc(t.params.back()) : t.params.back().with_data(nullptr));
    }
    for (const auto& s : op.saved()) t.saved.push_back(alloc(place(s)));
    for (const auto& o2 : outs) {
      t.out.push_back(alloc(place(o2)));
      t.dout.push_back(alloc(place(o2)));
      for (std::int64_t j = 0; j < o2.numel(); ++j) r.push_back(uniform(seed, salt++, -1.0, 1.0));
      write_host(t.dout.back(), std::vector<double>(r.end() - o2.numel(), r.end()));
    }
    op.prepare(*k, t);
  }

  double loss() {
    op.forward(*k, t);
    const auto y = read_host(t.out[0]);
    double l = 0;
    for (std::size_t i = 0; i < y.size(); ++i) l += r[i] * y[i];
    return l;
  }

  // Compares the analytic gradient of `x` (in `dx`) with central differences at up to `samples`
  // elements; also checks that accumulate adds onto what dx held.
  void check(const Tensor& x, const Tensor& dx, const std::string& what, int samples = 24) {
    SCOPED_TRACE(op.name() + " d/d" + what + " seed " + std::to_string(seed));
    const auto grad = read_host(dx);
    auto values = read_host(x);
    const auto n = values.size();
    for (int s = 0; s < samples && s < static_cast<int>(n); ++s) {
      const std::size_t i = n <= static_cast<std::size_t>(samples) ? static_cast<std::size_t>(s)
                                                                    : mix64(seed, 7000 + static_cast<std::uint64_t>(s)) % n;
      const double numeric = test::central_difference(x, values, i, 1e-5 * std::max(1.0, std::abs(values[i])),
                                                             [this] { return loss(); });
      EXPECT_NEAR(grad[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << "element " << i;
    }
  }

  // Runs forward + backward, checks every gradient by finite differences, then the accumulate path.
  void run_all(int samples = 24) {
    loss();
    op.backward(*k, t);
    for (std::size_t i = 0; i < t.in.size(); ++i)
      if (t.din[i].defined()) check(t.in[i], t.din[i], "input" + std::to_string(i), samples);
    const auto specs = op.parameters();
    for (std::size_t j = 0; j < specs.size(); ++j)
      if (specs[j].trainable()) check(t.params[j], t.dparams[j], specs[j].name, samples);
    // Accumulate: din = previous + gradient.
    std::vector<std::vector<double>> grads, before;
    for (std::size_t i = 0; i < t.in.size(); ++i) {
      if (!t.din[i].defined()) continue;
      grads.push_back(read_host(t.din[i]));
      std::vector<double> prev(grads.back().size());
      for (std::size_t j = 0; j < prev.size(); ++j) prev[j] = uniform(seed, 9000 + j, -2.0, 2.0);
      write_host(t.din[i], prev);
      before.push_back(prev);
      t.din_accumulate[i] = true;
    }
    loss();
    op.backward(*k, t);
    for (std::size_t i = 0, g = 0; i < t.in.size(); ++i) {
      if (!t.din[i].defined()) continue;
      const auto now = read_host(t.din[i]);
      for (std::size_t j = 0; j < now.size(); ++j)
        ASSERT_NEAR(now[j], before[g][j] + grads[g][j], 1e-12) << op.name() << " accumulate input " << i;
      t.din_accumulate[i] = false;
      ++g;
    }
  }
};

// Fresh uniform values, kept away from 0 (ReLU's kink) by at least 0.05.
std::function<double(std::size_t, std::size_t)> away_from_zero(std::uint64_t seed) {
  return [seed](std::size_t i, std::size_t j) {
    const double v = uniform(seed, i * 100000 + j, 0.05, 1.0);
    return (mix64(seed + 1, i * 100000 + j) & 1) ? v : -v;
  };
}

Tensor f64(const Shape& s) { return Tensor::describe(DType::f64, s); }

// ---------------------------------------------------------------------------------------------
// conv2d: forward against a naive loop over logical indices, backward by finite differences

std::vector<double> naive_conv(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w,
                               const Shape& ws, const Conv2dDesc& d, const Shape& ys) {
  std::vector<double> y(static_cast<std::size_t>(ys.numel()), 0.0);
  const std::int64_t cg = xs[1] / d.groups, kg = ys[1] / d.groups;
  for (std::int64_t n = 0; n < ys[0]; ++n)
    for (std::int64_t k = 0; k < ys[1]; ++k)
      for (std::int64_t oh = 0; oh < ys[2]; ++oh)
        for (std::int64_t ow = 0; ow < ys[3]; ++ow) {
          double acc = 0;
          for (std::int64_t c = 0; c < cg; ++c)
            for (std::int64_t r = 0; r < ws[2]; ++r)
              for (std::int64_t s = 0; s < ws[3]; ++s) {
                const std::int64_t ih = oh * d.stride_h - d.pad_h + r * d.dilation_h;
                const std::int64_t iw = ow * d.stride_w - d.pad_w + s * d.dilation_w;
                if (ih < 0 || iw < 0 || ih >= xs[2] || iw >= xs[3]) continue;
                const std::int64_t ci = (k / kg) * cg + c;
                acc += x[static_cast<std::size_t>(((n * xs[1] + ci) * xs[2] + ih) * xs[3] + iw)] *
                       w[static_cast<std::size_t>(((k * ws[1] + c) * ws[2] + r) * ws[3] + s)];
              }
          y[static_cast<std::size_t>(((n * ys[1] + k) * ys[2] + oh) * ys[3] + ow)] = acc;
        }
  return y;
}

struct ConvCase {
  const char* label;
  Shape x;
  Conv2dAttrs a;
};

std::vector<ConvCase> conv_cases() {
  auto attrs = [](std::int64_t k, std::int64_t kh, std::int64_t kw, std::int64_t sh, std::int64_t sw, std::int64_t ph,
                  std::int64_t pw, std::int64_t dil, std::int64_t groups) {
    Conv2dAttrs a;
    a.out_channels = k;
    a.kernel_h = kh;
    a.kernel_w = kw;
    a.conv = Conv2dDesc{sh, sw, ph, pw, dil, dil, groups};
    return a;
  };
  return {{"3x3 pad 1", Shape{2, 3, 5, 5}, attrs(4, 3, 3, 1, 1, 1, 1, 1, 1)},
          {"3x3 stride 2 pad 1", Shape{2, 3, 7, 6}, attrs(4, 3, 3, 2, 2, 1, 1, 1, 1)},
          {"1x1 stride 2 (projection)", Shape{2, 4, 6, 6}, attrs(6, 1, 1, 2, 2, 0, 0, 1, 1)},
          {"3x3 dilation 2 pad 2", Shape{1, 2, 7, 7}, attrs(3, 3, 3, 1, 1, 2, 2, 2, 1)},
          {"1x3 stride 2x1 pad 0x1", Shape{2, 2, 5, 6}, attrs(3, 1, 3, 2, 1, 0, 1, 1, 1)},
          {"3x3 groups 2", Shape{2, 4, 5, 5}, attrs(6, 3, 3, 1, 1, 1, 1, 1, 2)},
          {"3x3 depthwise stride 2", Shape{2, 4, 6, 6}, attrs(4, 3, 3, 2, 2, 1, 1, 1, 4)},
          {"7x7 stride 2 pad 3 (stem)", Shape{1, 3, 9, 9}, attrs(2, 7, 7, 2, 2, 3, 3, 1, 1)}};
}

TEST(Conv2d, ForwardMatchesNaiveLoopInBothLayouts) {
  for (const auto& c : conv_cases()) {
    SCOPED_TRACE(c.label);
    for (Layout layout : {Layout::nchw, Layout::nhwc}) {
      Conv2d op("conv", c.a);
      const std::uint64_t seed = test::seed();
      Harness h(op, {f64(c.x)}, {true}, layout, [&](std::size_t, std::size_t j) { return uniform(seed, j, -1, 1); });
      op.forward(*h.k, h.t);
      const auto want = naive_conv(read_host(h.t.in[0]), c.x, read_host(h.t.params[0]), h.t.params[0].shape, c.a.conv,
                                   h.t.out[0].shape);
      const auto got = read_host(h.t.out[0]);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << "element " << i;
    }
  }
}

TEST(Conv2d, NhwcGivesBitIdenticalResultsToNchw) {
  // Same logical values, same summation order: any difference is a stride bug.
  const auto c = conv_cases()[5];
  const std::uint64_t seed = test::seed();
  std::vector<std::vector<double>> y;
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    Conv2d op("conv", c.a);
    Harness h(op, {f64(c.x)}, {true}, layout, [&](std::size_t, std::size_t j) { return uniform(seed, j, -1, 1); });
    std::vector<double> w(static_cast<std::size_t>(h.t.params[0].numel()));
    for (std::size_t j = 0; j < w.size(); ++j) w[j] = uniform(seed + 1, j, -1, 1);
    write_host(h.t.params[0], w);
    op.forward(*h.k, h.t);
    y.push_back(read_host(h.t.out[0]));
  }
  EXPECT_EQ(y[0], y[1]);
}

TEST(Conv2d, BackwardMatchesFiniteDifferences) {
  for (Layout layout : {Layout::nchw, Layout::nhwc})
    for (const auto& c : conv_cases()) {
      SCOPED_TRACE(std::string(c.label) + " " + std::string(to_string(layout)));
      Conv2d op("conv", c.a);
      Harness h(op, {f64(c.x)}, {true}, layout, away_from_zero(test::seed()));
      ASSERT_NO_FATAL_FAILURE(h.run_all());
    }
}

TEST(Conv2d, FirstLayerSkipsTheDataGradientAndItsCost) {
  Conv2d op("conv1", conv_cases()[0].a);
  Harness h(op, {f64(conv_cases()[0].x)}, {false}, Layout::nchw, away_from_zero(test::seed()));
  EXPECT_EQ(op.flops(Pass::backward), op.flops(Pass::forward));
  EXPECT_FALSE(op.passes().backward_data);  // so prepare asks no backward-data search
  EXPECT_TRUE(op.passes().backward_filter);
  ASSERT_NO_FATAL_FAILURE(h.run_all());  // only the filter gradient is checked; din is undefined
  op.set_context(true, {true});
  EXPECT_EQ(op.flops(Pass::backward), 2 * op.flops(Pass::forward));
  EXPECT_EQ(op.flops(Pass::forward), 2 * 2 * 4 * 5 * 5 * 3 * 3 * 3);
  EXPECT_TRUE(op.passes().backward_data);
  EXPECT_TRUE(op.passes().backward_filter);
  op.set_context(false, {false});  // an inference graph: forward only
  EXPECT_FALSE(op.passes().backward_data);
  EXPECT_FALSE(op.passes().backward_filter);
}

// ---------------------------------------------------------------------------------------------
// batch norm, relu, add, pools, linear, loss

TEST(BatchNorm2d, TrainingForwardNormalisesAndUpdatesRunningStatistics) {
  BatchNorm2d op("bn", BatchNormDesc{1e-5, 0.1});
  const Shape s{3, 2, 3, 2};
  Harness h(op, {f64(s)}, {true}, Layout::nhwc, away_from_zero(test::seed()));
  const auto rm0 = read_host(h.t.params[2]), rv0 = read_host(h.t.params[3]);
  const auto gamma = read_host(h.t.params[0]), beta = read_host(h.t.params[1]);
  op.forward(*h.k, h.t);
  const auto x = read_host(h.t.in[0]), y = read_host(h.t.out[0]);
  const auto rm = read_host(h.t.params[2]), rv = read_host(h.t.params[3]);
  for (std::int64_t c = 0; c < 2; ++c) {
    std::vector<double> xs;
    for (std::int64_t n = 0; n < 3; ++n)
      for (std::int64_t i = 0; i < 6; ++i) xs.push_back(x[static_cast<std::size_t>((n * 2 + c) * 6 + i)]);
    const double mean = std::accumulate(xs.begin(), xs.end(), 0.0) / 18.0;
    double var = 0;
    for (double v : xs) var += (v - mean) * (v - mean) / 18.0;
    const auto cu = static_cast<std::size_t>(c);
    EXPECT_NEAR(rm[cu], 0.9 * rm0[cu] + 0.1 * mean, 1e-12);
    EXPECT_NEAR(rv[cu], 0.9 * rv0[cu] + 0.1 * var * 18.0 / 17.0, 1e-12);  // unbiased, as PyTorch
    for (std::int64_t n = 0; n < 3; ++n)
      for (std::int64_t i = 0; i < 6; ++i) {
        const auto j = static_cast<std::size_t>((n * 2 + c) * 6 + i);
        EXPECT_NEAR(y[j], (x[j] - mean) / std::sqrt(var + 1e-5) * gamma[cu] + beta[cu], 1e-12);
      }
  }
}

TEST(BatchNorm2d, InferenceUsesRunningStatistics) {
  BatchNorm2d op("bn");
  Harness h(op, {f64(Shape{2, 3, 2, 2})}, {true}, Layout::nchw, away_from_zero(test::seed()));
  h.t.training = false;
  op.forward(*h.k, h.t);
  const auto x = read_host(h.t.in[0]), y = read_host(h.t.out[0]);
  const auto g = read_host(h.t.params[0]), b = read_host(h.t.params[1]);
  const auto rm = read_host(h.t.params[2]), rv = read_host(h.t.params[3]);
  for (std::size_t j = 0; j < x.size(); ++j) {
    const std::size_t c = (j / 4) % 3;
    EXPECT_NEAR(y[j], (x[j] - rm[c]) / std::sqrt(rv[c] + 1e-5) * g[c] + b[c], 1e-12);
  }
  EXPECT_EQ(op.flops(Pass::forward), 6 * 24);  // the training graph's count
}

TEST(BatchNorm2d, BackwardMatchesFiniteDifferences) {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    BatchNorm2d op("bn");
    Harness h(op, {f64(Shape{3, 3, 3, 2})}, {true}, layout, away_from_zero(test::seed()));
    ASSERT_NO_FATAL_FAILURE(h.run_all());
  }
}

TEST(Relu, ForwardAndBackward) {
  Relu op("relu");
  Harness h(op, {f64(Shape{2, 3, 3, 3})}, {true}, Layout::nchw, away_from_zero(test::seed()));
  op.forward(*h.k, h.t);
  const auto x = read_host(h.t.in[0]), y = read_host(h.t.out[0]);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], x[i] > 0 ? x[i] : 0.0);
  ASSERT_NO_FATAL_FAILURE(h.run_all());
}

TEST(Add, ForwardAndBackwardOfBothInputs) {
  Add op("add");
  Harness h(op, {f64(Shape{2, 2, 3, 3}), f64(Shape{2, 2, 3, 3})}, {true, true}, Layout::nhwc,
            away_from_zero(test::seed()));
  op.forward(*h.k, h.t);
  const auto a = read_host(h.t.in[0]), b = read_host(h.t.in[1]), y = read_host(h.t.out[0]);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], a[i] + b[i]);
  ASSERT_NO_FATAL_FAILURE(h.run_all());
}

// ---------------------------------------------------------------------------------------------
// bias_act: the fused inference epilogue of a folded batch norm

// Tensors of fresh uniform values in [lo, hi) on a backend, alive as long as this object.
class RandomTensors {
 public:
  RandomTensors(Kernels& k, std::uint64_t seed) : k_(k), seed_(seed) {}
  Tensor operator()(DType t, const Shape& s, Layout l, double lo, double hi) {
    const Tensor d = Tensor::describe(t, s, l);
    store_.emplace_back(k_.allocator(), d.size_bytes());
    const Tensor v = store_.back().view(d);
    std::vector<double> values(static_cast<std::size_t>(s.numel()));
    for (auto& x : values) x = uniform(seed_, counter_++, lo, hi);
    write_host(v, values);
    return v;
  }

 private:
  Kernels& k_;
  std::uint64_t seed_, counter_ = 0;
  std::vector<Buffer> store_;
};

// The fused kernel against the reference ops it replaces, on fresh random inputs: a batch norm in
// inference with gamma 1, mean 0 and var 1 - eps (so it adds beta = bias), then add, then ReLU;
// and against the formula itself in logical order. f64 agrees to rounding; f32, where the
// composition rounds after each op and the fused kernel once, to a few ulps.
TEST(BiasActivation, MatchesTheComposedReferenceOpsInEveryConfiguration) {
  auto k = make_ref_kernels();
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  RandomTensors make(*k, seed);
  const Shape xs{2, 5, 3, 4};
  const std::int64_t ch = xs[1];
  int cases = 0;
  for (Layout layout : {Layout::nchw, Layout::nhwc})
    for (DType t : {DType::f64, DType::f32})
      for (bool residual : {false, true})
        for (bool relu : {false, true}) {
          SCOPED_TRACE(std::string(to_string(layout)) + " " + std::string(to_string(t)) +
                       (residual ? " residual" : "") + (relu ? " relu" : ""));
          const Tensor x = make(t, xs, layout, -2, 2), r = make(t, xs, layout, -1, 1);
          const Tensor bias = make(t, Shape{ch}, Layout::nchw, -1, 1);
          const Tensor fused = make(t, xs, layout, 5, 6), composed = make(t, xs, layout, 5, 6);
          k->bias_activation_forward(x, bias, residual ? r : Tensor{}, fused, relu);

          const BatchNormDesc d{};
          const Tensor gamma = make(t, Shape{ch}, Layout::nchw, 0, 0), mean = make(t, Shape{ch}, Layout::nchw, 0, 0);
          const Tensor var = make(t, Shape{ch}, Layout::nchw, 0, 0);
          k->fill(gamma, 1.0);
          k->fill(var, 1.0 - d.epsilon);
          k->batchnorm_forward_inference(d, x, gamma, bias, mean, var, composed);
          if (residual) k->add_forward(composed, r, composed);
          if (relu) k->relu_forward(composed, composed);

          const auto got = read_host(fused), want = read_host(composed);
          const auto xv = read_host(x), rv = read_host(r), bv = read_host(bias);
          const double tol = t == DType::f64 ? 1e-12 : 1e-6;
          int positive = 0, negative = 0;
          for (std::size_t i = 0; i < got.size(); ++i) {
            double v = xv[i] + bv[(i / 12) % 5] + (residual ? rv[i] : 0.0);  // logical NCHW: c = i / (H*W) % C
            if (relu) v = std::max(v, 0.0);
            EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
            EXPECT_NEAR(got[i], v, t == DType::f64 ? 1e-15 : 4e-7) << "element " << i;
            positive += got[i] > 0;
            negative += got[i] < 0;
          }
          EXPECT_GT(positive, 10);  // not a vacuous all-zero comparison
          EXPECT_EQ(negative > 0, !relu);
          ++cases;
        }
  EXPECT_EQ(cases, 16);
}

TEST(BiasActivation, ShapesParametersCostsAndRefusals) {
  BiasActivation op("layer1.0.bn3", true);
  const Shape xs{2, 4, 3, 3};
  EXPECT_EQ(op.infer({Tensor::describe(DType::bf16, xs), Tensor::describe(DType::bf16, xs)})[0].shape, xs);
  const auto params = op.parameters();
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].name, "bias");
  EXPECT_EQ(params[0].shape, Shape{4});
  EXPECT_EQ(params[0].dtype, DType::f32);  // as batch-norm parameters beside 16-bit data
  EXPECT_EQ(params[0].role, ParamRole::bias);
  op.set_context(false, {false, false});
  EXPECT_EQ(op.flops(Pass::forward), 3 * xs.numel());  // bias, residual, ReLU
  EXPECT_EQ(op.bytes(Pass::forward), 3 * xs.numel() * 2 + 4 * 4);
  EXPECT_EQ(op.flops(Pass::backward), 0);

  BiasActivation plain("bn1", false);
  plain.infer({Tensor::describe(DType::f32, xs)});
  plain.set_context(false, {false});
  EXPECT_EQ(plain.flops(Pass::forward), xs.numel());
  EXPECT_EQ(plain.bytes(Pass::forward), 2 * xs.numel() * 4 + 4 * 4);

  BiasActivation bad("bn2", true);
  const std::string shape = test::error_message<LayerError>(
      [&] { bad.infer({Tensor::describe(DType::f32, xs), Tensor::describe(DType::f32, Shape{2, 4, 3, 2})}); });
  EXPECT_NE(shape.find("layer 'bn2' (bias_act): residual shape"), std::string::npos) << shape;
  EXPECT_THROW(bad.infer({Tensor::describe(DType::f32, Shape{2, 4})}), LayerError);

  // Inference only: a training graph is refused when bound, and backward names why.
  auto k = make_ref_kernels();
  BiasActivation train("bn1", true);
  train.infer({Tensor::describe(DType::f32, xs)});
  train.set_context(true, {true});
  OpTensors descs;
  descs.in = {Tensor::describe(DType::f32, xs)};
  descs.out = descs.in;
  descs.params = {Tensor::describe(DType::f32, Shape{4})};
  const std::string refused = test::error_message<LayerError>([&] { train.prepare(*k, descs); });
  EXPECT_NE(refused.find("inference only"), std::string::npos) << refused;
  EXPECT_THROW(train.backward(*k, descs), LayerError);
}

// The fused convolution epilogue on the reference (the Kernels default: conv2d_forward, then
// bias_act in place) against a convolution and a bias_act into separate buffers, and against the
// formula: y = act(conv(x) + bias (+ residual)), with a 16-bit-style bias of x's dtype.
TEST(ConvBiasActivation, MatchesTheConvolutionAndBiasActInEveryConfiguration) {
  auto k = make_ref_kernels();
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  RandomTensors make(*k, seed);
  Conv2dAttrs a;
  a.out_channels = 4;
  a.kernel_h = a.kernel_w = 3;
  a.conv.stride_h = a.conv.stride_w = 2;
  a.conv.pad_h = a.conv.pad_w = 1;
  a.conv.groups = 2;
  const Shape xs{2, 6, 5, 5}, ys{2, 4, 3, 3}, ws{4, 3, 3, 3};
  int cases = 0;
  for (Layout layout : {Layout::nchw, Layout::nhwc})
    for (DType t : {DType::f64, DType::f32, DType::bf16})
      for (bool residual : {false, true})
        for (bool relu : {false, true}) {
          SCOPED_TRACE(std::string(to_string(layout)) + " " + std::string(to_string(t)) +
                       (residual ? " residual" : "") + (relu ? " relu" : ""));
          const Tensor x = make(t, xs, layout, -1, 1), w = make(t, ws, layout, -0.5, 0.5);
          const Tensor r = make(t, ys, layout, -1, 1), bias = make(t, Shape{4}, Layout::nchw, -1, 1);
          const Tensor fused = make(t, ys, layout, 5, 6), conv = make(t, ys, layout, 5, 6);
          const Tensor composed = make(t, ys, layout, 5, 6);
          const Tensor none = residual ? r : Tensor{};
          EXPECT_EQ(k->conv2d_bias_activation_prepare(a.conv, x, w, bias, none, fused, relu), 0);
          k->conv2d_bias_activation_forward(a.conv, x, w, bias, none, fused, relu, Workspace{});
          k->conv2d_forward(a.conv, x, w, conv, Workspace{});
          k->bias_activation_forward(conv, bias, none, composed, relu);
          const auto got = read_host(fused), want = read_host(composed), cv = read_host(conv);
          const auto rv = read_host(r), bv = read_host(bias);
          int positive = 0, negative = 0;
          for (std::size_t i = 0; i < got.size(); ++i) {
            EXPECT_EQ(got[i], want[i]) << "element " << i;  // the same kernels, so the same bits
            double v = cv[i] + bv[(i / 9) % 4] + (residual ? rv[i] : 0.0);  // logical NCHW: c = i / (H*W) % C
            if (relu) v = std::max(v, 0.0);
            const double tol = t == DType::f64 ? 1e-14 : t == DType::f32 ? 1e-6 : 2e-2;
            EXPECT_NEAR(got[i], v, tol * (1 + std::abs(v))) << "element " << i;
            positive += got[i] > 0;
            negative += got[i] < 0;
          }
          EXPECT_GT(positive, 3);  // not a vacuous all-zero comparison (72 outputs)
          EXPECT_EQ(negative > 0, !relu);
          ++cases;
        }
  EXPECT_EQ(cases, 24);
}

TEST(ConvBiasActivation, ShapesParametersCostsAndRefusals) {
  Conv2dAttrs a;
  a.out_channels = 8;
  a.kernel_h = a.kernel_w = 1;
  ConvBiasActivation op("layer1.0.conv3", a, true);
  const Shape xs{2, 4, 3, 3}, ys{2, 8, 3, 3};
  EXPECT_EQ(op.infer({Tensor::describe(DType::bf16, xs), Tensor::describe(DType::bf16, ys)})[0].shape, ys);
  const auto params = op.parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].name, "weight");
  EXPECT_EQ(params[0].shape, (Shape{8, 4, 1, 1}));
  EXPECT_EQ(params[1].name, "bias");
  EXPECT_EQ(params[1].shape, Shape{8});
  EXPECT_EQ(params[1].dtype, DType::bf16);  // the data's type, as cuDNN's fused call takes it
  EXPECT_EQ(params[1].role, ParamRole::bias);
  op.set_context(false, {false, false});
  EXPECT_EQ(op.macs(), ys.numel() * 4);
  EXPECT_EQ(op.flops(Pass::forward), 2 * ys.numel() * 4 + 3 * ys.numel());  // conv; bias, residual, ReLU
  EXPECT_EQ(op.bytes(Pass::forward), (xs.numel() + 8 * 4 + ys.numel() + 8 + ys.numel()) * 2);
  EXPECT_EQ(op.flops(Pass::backward), 0);

  ConvBiasActivation bad("conv2", a, true);
  const std::string shape = test::error_message<LayerError>(
      [&] { bad.infer({Tensor::describe(DType::f32, xs), Tensor::describe(DType::f32, xs)}); });
  EXPECT_NE(shape.find("layer 'conv2' (conv_bias_act): residual shape"), std::string::npos) << shape;
  a.conv.groups = 3;  // 4 input channels do not split into 3 groups: the convolution's own rule
  ConvBiasActivation grouped("conv1", a, false);
  EXPECT_THROW(grouped.infer({Tensor::describe(DType::f32, xs)}), LayerError);

  // Inference only: a training graph is refused when bound, and backward names why.
  auto k = make_ref_kernels();
  a.conv.groups = 1;
  ConvBiasActivation train("conv1", a, true);
  train.infer({Tensor::describe(DType::f32, xs)});
  train.set_context(true, {true});
  OpTensors descs;
  descs.in = {Tensor::describe(DType::f32, xs)};
  descs.out = {Tensor::describe(DType::f32, ys)};
  descs.params = {Tensor::describe(DType::f32, Shape{8, 4, 1, 1}), Tensor::describe(DType::f32, Shape{8})};
  const std::string refused = test::error_message<LayerError>([&] { train.prepare(*k, descs); });
  EXPECT_NE(refused.find("inference only"), std::string::npos) << refused;
  EXPECT_THROW(train.backward(*k, descs), LayerError);
}

// Reference kernels whose fp8 convolution takes every configuration or refuses every one, counting
// which path runs; a taken fp8 call runs the 16-bit kernels (the fp8 arithmetic is not tested here).
class Fp8SwitchKernels final : public ref::RefKernels {
 public:
  explicit Fp8SwitchKernels(bool take) : take_(take) {}
  std::int64_t conv2d_fp8_prepare(const Conv2dDesc&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, bool) override {
    ++fp8_prepares;
    if (!take_) throw Unsupported("refused by the test kernels");
    return 0;
  }
  void conv2d_fp8_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                          const Tensor& residual, const Tensor& y, bool relu, Workspace ws) override {
    ++fp8_forwards;
    RefKernels::conv2d_bias_activation_forward(d, x, w, bias, residual, y, relu, ws);
  }
  void conv2d_bias_activation_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Tensor& residual, const Tensor& y, bool relu, Workspace ws) override {
    ++f16_forwards;
    RefKernels::conv2d_bias_activation_forward(d, x, w, bias, residual, y, relu, ws);
  }
  int fp8_prepares = 0, fp8_forwards = 0, f16_forwards = 0;

 private:
  bool take_;
};

// conv_bias_act with its fp8 flag in an fp8 inference graph: prepare asks the kernels for fp8;
// taken, forward runs the fp8 call and bytes count the quantize passes; refused, the op runs the
// 16-bit path (the same values as an op built without the flag) and keeps the reason.
TEST(ConvBiasActivation, Fp8RunsWhereTheKernelsTakeItElseFallsBackWithTheReason) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  GraphOptions o;
  o.precision = Precision::fp8;
  o.training = false;
  Fp8SwitchKernels take(true), refuse(false), plain(true);  // declared before the graphs bound to them
  auto ref = make_ref_kernels();
  const auto run = [&](Kernels& k, std::int64_t channels, bool fp8, std::vector<double>* y_out) {
    Conv2dAttrs a;
    a.out_channels = 16;
    a.kernel_h = a.kernel_w = 3;
    a.conv.pad_h = a.conv.pad_w = 1;
    GraphBuilder b(o);
    const Value x = b.input("x", Shape{2, channels, 5, 5}), r = b.input("r", Shape{2, 16, 5, 5});
    const Value y = conv_bias_activation(b, "conv", x, a, r, true, fp8);
    b.mark_output(y);
    auto g = std::make_unique<Graph>(std::move(b));
    g->bind(k);
    std::vector<double> xv(static_cast<std::size_t>(2 * channels * 25)), rv(2 * 16 * 25);
    for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = uniform(seed, i, -1, 1);
    for (std::size_t i = 0; i < rv.size(); ++i) rv[i] = uniform(seed + 1, i, -1, 1);
    g->set_input(x, xv);
    g->set_input(r, rv);
    g->forward(false);
    if (y_out != nullptr) *y_out = g->read(y);
    return g;
  };
  const std::int64_t x16 = 2 * 16 * 25, y16 = 2 * 16 * 25, w16 = 16 * 16 * 9, e = 2;  // f16 storage
  const std::int64_t f16_bytes = (x16 + w16 + y16) * e + (16 + y16) * e;  // conv + bias + residual

  std::vector<double> y_fp8;
  auto g = run(take, 16, true, &y_fp8);
  const auto& op = dynamic_cast<const ConvBiasActivation&>(g->op(0));
  EXPECT_TRUE(op.fp8());
  EXPECT_TRUE(op.runs_fp8());
  EXPECT_EQ(op.fp8_fallback_reason(), "");
  EXPECT_EQ(take.fp8_forwards, 1);
  EXPECT_EQ(take.f16_forwards, 0);
  // x read twice (amax, quantize) in f16, its e4m3 copy written and read; w in e4m3; y, bias, residual f16.
  EXPECT_EQ(op.bytes(Pass::forward), x16 * (2 * e + 2) + w16 + y16 * e + (16 + y16) * e);
  // Dynamic scales cost traffic: 4 more bytes per x element outweigh the byte saved per weight here.
  EXPECT_GT(op.bytes(Pass::forward), f16_bytes);

  std::vector<double> y_fallback;
  g = run(refuse, 16, true, &y_fallback);
  const auto& fallback = dynamic_cast<const ConvBiasActivation&>(g->op(0));
  EXPECT_TRUE(fallback.fp8());
  EXPECT_FALSE(fallback.runs_fp8());
  EXPECT_NE(fallback.fp8_fallback_reason().find("refused by the test kernels"), std::string::npos)
      << fallback.fp8_fallback_reason();
  EXPECT_EQ(refuse.fp8_prepares, 1);
  EXPECT_EQ(refuse.fp8_forwards, 0);
  EXPECT_EQ(refuse.f16_forwards, 1);
  EXPECT_EQ(fallback.bytes(Pass::forward), f16_bytes);

  // Without the flag the op never asks for fp8; its values are the fallback's, bit for bit.
  std::vector<double> y_f16;
  g = run(plain, 16, false, &y_f16);
  EXPECT_EQ(plain.fp8_prepares, 0);
  EXPECT_EQ(plain.f16_forwards, 1);
  EXPECT_EQ(y_f16, y_fallback);
  EXPECT_EQ(y_f16, y_fp8);  // the test kernels' fp8 path runs the 16-bit one
  int positive = 0;
  for (double v : y_f16) positive += v > 0;
  EXPECT_GT(positive, 10);  // not a comparison of zeros (ReLU)

  // The reference kernels refuse 8 input channels (not a multiple of 16) with a reason.
  g = run(*ref, 8, true, nullptr);
  const auto& refused = dynamic_cast<const ConvBiasActivation&>(g->op(0));
  EXPECT_FALSE(refused.runs_fp8());
  EXPECT_FALSE(refused.fp8_fallback_reason().empty());
}

// linear with its fp8 flag in an fp8 inference graph: x [N, in] and w [out, in] run as the e4m3
// 1x1 convolution they are, on the reference kernels' real fp8 arithmetic: the same bits as
// conv2d_fp8_forward on the [N, in, 1, 1] views, near (not equal to) the 16-bit layer; an output
// count the rule refuses (10, not a multiple of 16) runs in 16 bits and says why.
TEST(Linear, Fp8RunsAsThe1x1ConvolutionItIsOrFallsBackWithTheReason) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto k = make_ref_kernels();
  GraphOptions o;
  o.precision = Precision::fp8;
  o.training = false;
  const std::int64_t n = 4, in = 32;
  std::vector<double> xv(static_cast<std::size_t>(n * in));
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = uniform(seed, i, -2, 2);
  const auto run = [&](std::int64_t out, bool fp8, std::vector<double>& y_out, nn::ParameterValues* params) {
    GraphBuilder b(o);
    const Value x = b.input("x", Shape{n, in});
    const Value y = linear(b, "fc", x, out, true, fp8);
    b.mark_output(y);
    auto g = std::make_unique<Graph>(std::move(b));
    g->bind(*k);
    if (params != nullptr && !params->empty()) g->set_parameter_values(*params);
    if (params != nullptr) *params = g->parameter_values();
    g->set_input(x, xv);
    g->forward(false);
    y_out = g->read(y);
    return g;
  };
  nn::ParameterValues params;
  std::vector<double> y8, y16;
  auto g = run(16, true, y8, &params);
  const auto& op = dynamic_cast<const Linear&>(g->op(0));
  ASSERT_NE(op.fp8_choice(), nullptr);
  EXPECT_TRUE(op.fp8_choice()->runs) << op.fp8_choice()->fallback_reason;
  // fp8 bytes: x read twice in f16, its e4m3 copy written and read; w in e4m3; bias and y in f16.
  EXPECT_EQ(op.bytes(Pass::forward), n * in * (2 * 2 + 2) + 16 * in + (16 + n * 16) * 2);
  run(16, false, y16, &params);

  // The same bits as the reference fp8 convolution on the views of the same f16 values.
  const auto host = [](DType t, const Shape& shape, const std::vector<double>& v, std::vector<unsigned char>& bytes) {
    const Tensor d = Tensor::describe(t, shape);
    bytes.assign(static_cast<std::size_t>(d.size_bytes()), 0);
    const Tensor h = d.with_data(bytes.data());
    write_host(h, v);
    return h;
  };
  std::vector<unsigned char> xb, wb, bb, yb;
  const Tensor xt = host(DType::f16, Shape{n, in}, xv, xb), wt = host(DType::f16, Shape{16, in}, params.at("fc.weight"), wb),
               bt = host(DType::f16, Shape{16}, params.at("fc.bias"), bb),
               yt = host(DType::f16, Shape{n, 16}, std::vector<double>(static_cast<std::size_t>(n * 16), 0.0), yb);
  k->conv2d_fp8_forward(Conv2dDesc{}, fp8_linear_view(xt), fp8_linear_view(wt), bt, Tensor{}, fp8_linear_view(yt), false,
                        Workspace{});
  EXPECT_EQ(y8, read_host(yt));
  // Near the 16-bit layer, and not equal to it (the quantization shows).
  double largest = 0, worst = 0;
  for (std::size_t i = 0; i < y16.size(); ++i) {
    largest = std::max(largest, std::abs(y16[i]));
    worst = std::max(worst, std::abs(y8[i] - y16[i]));
  }
  EXPECT_GT(largest, 0.1);
  EXPECT_GT(worst, 0.0);
  EXPECT_LT(worst, 0.1 * largest);

  std::vector<double> y10;
  g = run(10, true, y10, nullptr);
  const Fp8Choice* refused = g->op(0).fp8_choice();
  ASSERT_NE(refused, nullptr);
  EXPECT_TRUE(refused->asked);
  EXPECT_FALSE(refused->runs);
  EXPECT_NE(refused->fallback_reason.find("multiples of 16"), std::string::npos) << refused->fallback_reason;
  EXPECT_NE(fp8_linear_refusal(Tensor::describe(DType::f16, Shape{n, in}), Tensor::describe(DType::f16, Shape{10, in}),
                               Tensor::describe(DType::f16, Shape{n, 10})),
            "");
}

// bn_act: batch norm (+ residual) + ReLU as one op. Its forward and backward on the reference
// (the Kernels defaults) against BatchNorm2d, Add and Relu run one after the other on the same
// values: the same outputs, statistics and gradients, bit for bit. Each of those ops is checked
// by finite differences above; a difference check of the fused op would straddle ReLU's kink.
TEST(BatchNormActivation, TrainingForwardAndBackwardEqualTheSeparateOps) {
  auto k = make_ref_kernels();
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  RandomTensors make(*k, seed);
  const Shape xs{2, 3, 4, 3}, cs{3};
  int cases = 0;
  for (Layout layout : {Layout::nchw, Layout::nhwc})
    for (bool residual : {false, true})
      for (bool dz_accumulate : {false, true}) {
        if (!residual && dz_accumulate) continue;
        SCOPED_TRACE(std::string(to_string(layout)) + (residual ? " residual" : "") +
                     (dz_accumulate ? " dz accumulate" : ""));
        BatchNormActivation op("bn3");
        std::vector<Tensor> in{Tensor::describe(DType::f64, xs)};
        if (residual) in.push_back(in[0]);
        op.infer(in);
        op.set_context(true, std::vector<bool>(in.size(), true));
        const auto specs = op.parameters();
        ASSERT_EQ(specs.size(), 4u);
        EXPECT_EQ(specs[3].name, "running_var");
        OpTensors t;
        t.in = {make(DType::f64, xs, layout, -1, 1)};
        t.din = {make(DType::f64, xs, layout, -1, 1)};
        t.din_accumulate = {false};
        if (residual) {
          t.in.push_back(make(DType::f64, xs, layout, -1, 1));
          t.din.push_back(make(DType::f64, xs, layout, -1, 1));  // kept where accumulated
          t.din_accumulate.push_back(dz_accumulate);
        }
        for (const auto& spec : specs) {
          t.params.push_back(make(DType::f64, spec.shape, Layout::nchw, 0.5, 1.5));
          t.dparams.push_back(make(DType::f64, spec.shape, Layout::nchw, 0, 1));
        }
        for (const auto& sv : op.saved()) t.saved.push_back(make(sv.dtype, sv.shape, Layout::nchw, 0, 1));
        t.out = {make(DType::f64, xs, layout, 5, 6)};
        t.dout = {make(DType::f64, xs, layout, -1, 1)};
        const std::int64_t ws_bytes = op.prepare(*k, t);
        EXPECT_EQ(ws_bytes, t.in[0].size_bytes());
        Buffer ws(k->allocator(), ws_bytes);
        t.workspace = Workspace{ws.data(), ws_bytes};

        // The separate ops on copies of the same values.
        const auto copy = [&](const Tensor& v) {
          const Tensor c = make(v.dtype, v.shape, v.layout, 0, 1);
          write_host(c, read_host(v));
          return c;
        };
        const Tensor x = copy(t.in[0]), gamma = copy(t.params[0]), beta = copy(t.params[1]);
        const Tensor rmean = copy(t.params[2]), rvar = copy(t.params[3]), dy = copy(t.dout[0]);
        const Tensor bn_y = make(DType::f64, xs, layout, 0, 1), y = make(DType::f64, xs, layout, 0, 1);
        const Tensor mean = make(DType::f64, cs, Layout::nchw, 0, 1), invstd = make(DType::f64, cs, Layout::nchw, 0, 1);
        const Tensor dsum = make(DType::f64, xs, layout, 0, 1);
        const Tensor dx = copy(t.din[0]), dgamma = copy(t.dparams[0]), dbeta = copy(t.dparams[1]);
        const BatchNormDesc d{};
        k->batchnorm_forward_training(d, x, gamma, beta, rmean, rvar, bn_y, mean, invstd);
        Tensor sum = bn_y;
        if (residual) {
          sum = make(DType::f64, xs, layout, 0, 1);
          k->add_forward(bn_y, copy(t.in[1]), sum);
        }
        k->relu_forward(sum, y);
        k->relu_backward(y, dy, dsum, false);
        Tensor dz;
        if (residual) {
          dz = copy(t.din[1]);
          k->copy_gradient(dsum, dz, dz_accumulate);
        }
        k->batchnorm_backward(d, x, dsum, gamma, mean, invstd, dx, false, dgamma, dbeta);

        op.forward(*k, t);
        op.backward(*k, t);
        EXPECT_EQ(read_host(t.out[0]), read_host(y));
        EXPECT_EQ(read_host(t.saved[0]), read_host(mean));
        EXPECT_EQ(read_host(t.saved[1]), read_host(invstd));
        EXPECT_EQ(read_host(t.params[2]), read_host(rmean));
        EXPECT_EQ(read_host(t.params[3]), read_host(rvar));
        EXPECT_EQ(read_host(t.din[0]), read_host(dx));
        if (residual) {
          EXPECT_EQ(read_host(t.din[1]), read_host(dz));
        }
        EXPECT_EQ(read_host(t.dparams[0]), read_host(dgamma));
        EXPECT_EQ(read_host(t.dparams[1]), read_host(dbeta));
        const auto yv = read_host(y), dxv = read_host(dx);
        EXPECT_GT(std::count(yv.begin(), yv.end(), 0.0), 0);  // the ReLU clamps some outputs...
        EXPECT_LT(std::count(yv.begin(), yv.end(), 0.0), static_cast<std::ptrdiff_t>(yv.size()));  // ...not all
        EXPECT_GT(std::count_if(dxv.begin(), dxv.end(), [](double v) { return v != 0.0; }), 0);
        ++cases;
      }
  EXPECT_EQ(cases, 6);
}

TEST(BatchNormActivation, ShapesCostsInferenceAndRefusals) {
  BatchNormActivation op("layer1.0.bn3");
  const Shape xs{2, 4, 3, 3};
  EXPECT_EQ(op.infer({Tensor::describe(DType::bf16, xs), Tensor::describe(DType::bf16, xs)})[0].shape, xs);
  const auto params = op.parameters();
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0].name, "weight");
  EXPECT_EQ(params[0].dtype, DType::f32);  // as BatchNorm2d's beside 16-bit data
  const auto saved = op.saved();
  ASSERT_EQ(saved.size(), 3u);
  EXPECT_EQ(saved[2].dtype, DType::i32);
  EXPECT_EQ(saved[2].numel(), (xs.numel() + 31) / 32 + 1024);  // a bit per element, and room to spare
  op.set_context(true, {true, true});
  BatchNorm2d bn("bn");
  bn.infer({Tensor::describe(DType::bf16, xs)});
  bn.set_context(true, {true});
  EXPECT_EQ(op.flops(Pass::forward), bn.flops(Pass::forward) + 2 * xs.numel());  // the add and the ReLU
  EXPECT_EQ(op.bytes(Pass::forward), bn.bytes(Pass::forward) + xs.numel() * 2);  // reads z too
  EXPECT_EQ(op.bytes(Pass::backward), bn.bytes(Pass::backward) + 2 * xs.numel() * 2);  // reads y, writes dz

  BatchNormActivation bad("bn2");
  const std::string shape = test::error_message<LayerError>(
      [&] { bad.infer({Tensor::describe(DType::f32, xs), Tensor::describe(DType::f32, Shape{2, 4, 3, 2})}); });
  EXPECT_NE(shape.find("layer 'bn2' (bn_act): residual shape"), std::string::npos) << shape;
  EXPECT_THROW(bad.infer({Tensor::describe(DType::i32, xs)}), LayerError);

  // Inference: running statistics, then add and ReLU, as BatchNorm2d + Add + Relu compute them.
  auto k = make_ref_kernels();
  RandomTensors make(*k, test::seed());
  BatchNormActivation inf("bn1");
  inf.infer({Tensor::describe(DType::f64, xs), Tensor::describe(DType::f64, xs)});
  inf.set_context(false, {false, false});
  OpTensors t;
  t.training = false;
  t.in = {make(DType::f64, xs, Layout::nhwc, -1, 1), make(DType::f64, xs, Layout::nhwc, -1, 1)};
  for (int i = 0; i < 4; ++i) t.params.push_back(make(DType::f64, Shape{4}, Layout::nchw, 0.5, 1.5));
  t.out = {make(DType::f64, xs, Layout::nhwc, 5, 6)};
  EXPECT_EQ(inf.prepare(*k, t), 0);  // no backward, no workspace
  inf.forward(*k, t);
  const Tensor want = make(DType::f64, xs, Layout::nhwc, 0, 1);
  k->batchnorm_forward_inference({}, t.in[0], t.params[0], t.params[1], t.params[2], t.params[3], want);
  k->add_forward(want, t.in[1], want);
  k->relu_forward(want, want);
  EXPECT_EQ(read_host(t.out[0]), read_host(want));
}

// Distinct values 0.01 apart (a shuffled ramp): a finite-difference step never changes which
// element of a window is the maximum.
std::function<double(std::size_t, std::size_t)> distinct_values(std::uint64_t seed, std::size_t n) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), 0.0);
  for (std::size_t i = n; i > 1; --i) std::swap(v[i - 1], v[mix64(seed, i) % i]);  // Fisher-Yates
  return [v](std::size_t, std::size_t j) { return v[j] * 0.01 - 1.0; };
}

TEST(MaxPool2d, ForwardMatchesNaiveWindowsAndPadsWithMinusInfinity) {
  MaxPool2d op("maxpool", Pool2dDesc{3, 3, 2, 2, 1, 1});
  Harness h(op, {f64(Shape{1, 2, 5, 5})}, {true}, Layout::nchw, [](std::size_t, std::size_t j) {
    return -100.0 - static_cast<double>(j);  // all negative: a zero-padded pool would return 0
  });
  op.forward(*h.k, h.t);
  EXPECT_EQ(h.t.out[0].shape, (Shape{1, 2, 3, 3}));
  const auto y = read_host(h.t.out[0]);
  // Output (0, 0) sees input rows/cols 0..1: the max of -100 - {0, 1, 5, 6} is -100.
  EXPECT_EQ(y[0], -100.0);
  EXPECT_EQ(y[4], -100.0 - 6.0);           // centre (1, 1) sees rows/cols 1..3: max at (1, 1)
  EXPECT_EQ(y[9], -100.0 - 25.0);          // channel 1, output (0, 0)
}

TEST(MaxPool2d, TiesRouteTheGradientToTheFirstMaximumOfEachWindow) {
  MaxPool2d op("maxpool", Pool2dDesc{2, 2, 2, 2, 0, 0});
  Harness h(op, {f64(Shape{1, 1, 2, 4})}, {true}, Layout::nchw, [](std::size_t, std::size_t) { return 0.5; });
  write_host(h.t.dout[0], {3.0, 7.0});
  op.forward(*h.k, h.t);
  op.backward(*h.k, h.t);
  EXPECT_EQ(read_host(h.t.din[0]), (std::vector<double>{3, 0, 7, 0, 0, 0, 0, 0}));  // PyTorch's choice
}

TEST(MaxPool2d, BackwardMatchesFiniteDifferences) {
  for (const auto& d : {Pool2dDesc{3, 3, 2, 2, 1, 1}, Pool2dDesc{2, 2, 2, 2, 0, 0}, Pool2dDesc{3, 2, 1, 2, 1, 0}}) {
    MaxPool2d op("maxpool", d);
    Harness h(op, {f64(Shape{2, 2, 6, 5})}, {true}, Layout::nhwc, distinct_values(test::seed(), 120));
    ASSERT_NO_FATAL_FAILURE(h.run_all(40));
  }
}

TEST(GlobalAvgPool, ForwardAndBackward) {
  GlobalAvgPool op("avgpool");
  Harness h(op, {f64(Shape{2, 3, 3, 2})}, {true}, Layout::nhwc, away_from_zero(test::seed()));
  op.forward(*h.k, h.t);
  EXPECT_EQ(h.t.out[0].shape, (Shape{2, 3}));
  const auto x = read_host(h.t.in[0]), y = read_host(h.t.out[0]);
  for (std::size_t nc = 0; nc < 6; ++nc)
    EXPECT_NEAR(y[nc], std::accumulate(x.begin() + static_cast<long>(nc * 6), x.begin() + static_cast<long>(nc * 6 + 6), 0.0) / 6,
                1e-12);
  ASSERT_NO_FATAL_FAILURE(h.run_all());
}

TEST(Linear, ForwardAndBackward) {
  Linear op("fc", 5);
  Harness h(op, {f64(Shape{3, 4})}, {true}, Layout::nchw, away_from_zero(test::seed()));
  op.forward(*h.k, h.t);
  const auto x = read_host(h.t.in[0]), w = read_host(h.t.params[0]), b = read_host(h.t.params[1]);
  const auto y = read_host(h.t.out[0]);
  for (std::size_t n = 0; n < 3; ++n)
    for (std::size_t o = 0; o < 5; ++o) {
      double want = b[o];
      for (std::size_t i = 0; i < 4; ++i) want += x[n * 4 + i] * w[o * 4 + i];
      EXPECT_NEAR(y[n * 5 + o], want, 1e-12);
    }
  ASSERT_NO_FATAL_FAILURE(h.run_all());
  EXPECT_EQ(op.flops(Pass::forward), 2 * 3 * 4 * 5 + 3 * 5);
}

// The classifier's logits are stored wider than the vocabulary (50257 in rows of 50304): every
// linear kernel reads and writes [rows, width] operands of any row stride >= width, leaves the
// padding alone, and gives the contiguous operands' results bit for bit.
TEST(Linear, PaddedRowsGiveTheContiguousResultsAndLeaveThePaddingAlone) {
  const auto k = make_ref_kernels();
  constexpr double kPad = 7.0;
  const std::uint64_t seed = test::seed();
  std::uint64_t counter = 0;
  std::vector<std::vector<double>> storage;  // host memory of every matrix below
  // A [rows, cols] matrix with row stride ld and the same values stored contiguously.
  struct Pair {
    Tensor padded, dense;
    std::int64_t ld;
  };
  auto pair = [&](DType t, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
    std::vector<double> values(static_cast<std::size_t>(rows * cols));
    for (double& v : values) v = uniform(seed, counter++, -1.0, 1.0);
    Pair p;
    p.ld = ld;
    storage.emplace_back(static_cast<std::size_t>(rows * ld), 0.0);  // f64 slots hold any dtype's bytes
    const Tensor backing = Tensor::describe(t, Shape{rows, ld}).with_data(storage.back().data());
    write_host(backing, std::vector<double>(static_cast<std::size_t>(rows * ld), kPad));
    p.padded = backing;
    p.padded.shape = Shape{rows, cols};
    write_host(p.padded, values);
    storage.emplace_back(static_cast<std::size_t>(rows * cols), 0.0);
    p.dense = Tensor::describe(t, Shape{rows, cols}).with_data(storage.back().data());
    write_host(p.dense, values);
    return p;
  };
  auto expect_same = [&](const Pair& p, const std::string& what) {
    EXPECT_EQ(read_host(p.padded), read_host(p.dense)) << what;
    Tensor backing = p.padded;
    backing.shape = Shape{p.padded.shape[0], p.ld};
    const auto full = read_host(backing);
    std::int64_t written = 0;
    for (std::size_t i = 0; i < full.size(); ++i)
      written += static_cast<std::int64_t>(i) % p.ld >= p.padded.shape[1] && full[i] != kPad;
    EXPECT_EQ(written, 0) << what << ": padding elements written";
  };
  for (DType t : {DType::f64, DType::bf16}) {
    SCOPED_TRACE(std::string(to_string(t)));
    const std::int64_t n = 5, in = 7, out = 11;
    Pair x = pair(t, n, in, 8), w = pair(t, out, in, 9), y = pair(t, n, out, 16), dy = pair(t, n, out, 12);
    Pair b = pair(t, 1, out, out), db = pair(t, 1, out, out), dw = pair(t, out, in, 10);
    Tensor bias = b.dense, dbias = db.dense;
    bias.shape = dbias.shape = Shape{out};
    bias.strides = dbias.strides = Shape{1};
    k->linear_forward(x.padded, w.padded, bias, y.padded);
    k->linear_forward(x.dense, w.dense, bias, y.dense);
    expect_same(y, "forward");
    for (bool accumulate : {false, true}) {
      Pair dx = pair(t, n, in, 13);
      k->linear_backward_data(dy.padded, w.padded, dx.padded, accumulate);
      k->linear_backward_data(dy.dense, w.dense, dx.dense, accumulate);
      expect_same(dx, accumulate ? "backward data, accumulate" : "backward data");
    }
    k->linear_backward_weights(x.padded, dy.padded, dw.padded, dbias);
    const auto dbias_padded = read_host(dbias);
    k->linear_backward_weights(x.dense, dy.dense, dw.dense, dbias);
    expect_same(dw, "backward weights");
    EXPECT_EQ(dbias_padded, read_host(dbias)) << "bias gradient";
  }
}

TEST(SoftmaxCrossEntropy, KnownValuesAndBackward) {
  SoftmaxCrossEntropy op("loss");
  const std::uint64_t seed = test::seed();
  Harness h(op, {f64(Shape{4, 3}), Tensor::describe(DType::i32, Shape{4})}, {true, false}, Layout::nchw,
            [&](std::size_t i, std::size_t j) { return i == 1 ? static_cast<double>(j % 3) : uniform(seed, j, -3, 3); });
  // Equal logits: loss ln(3) whatever the labels.
  write_host(h.t.in[0], std::vector<double>(12, 0.7));
  h.loss();
  EXPECT_NEAR(read_host(h.t.out[0])[0], std::log(3.0), 1e-14);
  // One confident row per label, stable for large logits.
  write_host(h.t.in[0], {1000, 0, 0, 0, 1000, 0, 0, 0, 1000, 2, 1, 0});
  h.loss();
  const double row4 = std::log(std::exp(2.0) + std::exp(1.0) + 1.0) - 2.0;  // label 0, logits (2, 1, 0)
  EXPECT_NEAR(read_host(h.t.out[0])[0], row4 / 4.0, 1e-12);
  // Backward by finite differences on fresh logits.
  std::vector<double> z(12);
  for (std::size_t j = 0; j < 12; ++j) z[j] = uniform(seed, 50 + j, -3, 3);
  write_host(h.t.in[0], z);
  ASSERT_NO_FATAL_FAILURE(h.run_all());
}

TEST(SoftmaxCrossEntropy, LabelOutOfRangeIsAnError) {
  SoftmaxCrossEntropy op("loss");
  Harness h(op, {f64(Shape{2, 3}), Tensor::describe(DType::i32, Shape{2})}, {true, false}, Layout::nchw,
            [](std::size_t i, std::size_t j) { return i == 1 ? 3.0 * static_cast<double>(j) : 0.1; });
  try {
    h.loss();
    FAIL() << "no error for label 3 of 3 classes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 3"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// determinism: work is split over outputs only, so the thread count cannot change a bit

TEST(RefKernels, ResultsDoNotDependOnTheThreadCount) {
  Conv2dAttrs a{16, 3, 3, Conv2dDesc{1, 1, 1, 1, 1, 1, 1}};
  Conv2d conv("conv", a);
  BatchNorm2d bn("bn");
  MaxPool2d pool("pool", Pool2dDesc{3, 3, 2, 2, 1, 1});
  Linear fc("fc", 128);
  const std::uint64_t seed = test::seed();
  const auto gen = [seed](std::size_t, std::size_t j) { return uniform(seed, j, -1, 1); };
  // Each problem is above the size at which the kernels start threads (kParallelMinWork).
  std::vector<std::unique_ptr<Harness>> hs;
  hs.push_back(std::make_unique<Harness>(conv, std::vector<Tensor>{f64(Shape{4, 16, 24, 24})}, std::vector<bool>{true},
                                         Layout::nchw, gen));
  hs.push_back(std::make_unique<Harness>(bn, std::vector<Tensor>{f64(Shape{16, 64, 32, 32})}, std::vector<bool>{true},
                                         Layout::nhwc, gen));
  hs.push_back(std::make_unique<Harness>(pool, std::vector<Tensor>{f64(Shape{16, 64, 32, 32})},
                                         std::vector<bool>{true}, Layout::nchw, gen));
  hs.push_back(std::make_unique<Harness>(fc, std::vector<Tensor>{f64(Shape{64, 256})}, std::vector<bool>{true},
                                         Layout::nchw, gen));
  const int threads = omp_get_max_threads();
  std::vector<std::vector<std::vector<double>>> runs;
  for (int t : {1, 2}) {
    omp_set_num_threads(t);
    runs.emplace_back();
    for (auto& h : hs) {
      h->op.forward(*h->k, h->t);
      h->op.backward(*h->k, h->t);
      runs.back().push_back(read_host(h->t.out[0]));
      runs.back().push_back(read_host(h->t.din[0]));
      for (const auto& dp : h->t.dparams)
        if (dp.defined()) runs.back().push_back(read_host(dp));
    }
  }
  omp_set_num_threads(threads);
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (std::size_t i = 0; i < runs[0].size(); ++i) EXPECT_EQ(runs[0][i], runs[1][i]) << "result " << i;
}

// ---------------------------------------------------------------------------------------------
// 16-bit storage, mixed precision and capture on the reference kernels

// The nearest value of a 16-bit format to v (ties to the even encoding), by brute force over the
// neighbours of v's float rounding: independent of the kernels' round-to-odd path.
double nearest_16bit(DType t, double v) {
  const float f = static_cast<float>(v);
  const auto bits = t == DType::f16 ? float_to_half_bits(f) : float_to_bf16_bits(f);
  auto value = [t](std::uint16_t b) { return t == DType::f16 ? half_bits_to_float(b) : bf16_bits_to_float(b); };
  std::uint16_t best = bits;
  for (int d : {-1, 1}) {
    const auto b = static_cast<std::uint16_t>(bits + d);
    const double err = std::abs(value(b) - v), best_err = std::abs(value(best) - v);
    if (err < best_err || (err == best_err && (b & 1) == 0)) best = b;
  }
  return value(best);
}

// v rounded once to t, by the independent oracle above.
double round_to(DType t, double v) {
  switch (t) {
    case DType::f16:
    case DType::bf16: return nearest_16bit(t, v);
    case DType::f32: return static_cast<float>(v);
    default: return v;
  }
}

TEST(SixteenBit, LoadsAreExactAndStoresRoundOnceToNearestEven) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double h = ref::Half::from_bits(bits), want_h = half_bits_to_float(bits);
    const double bf = ref::BFloat16::from_bits(bits), want_bf = bf16_bits_to_float(bits);
    ASSERT_TRUE(h == want_h || (std::isnan(h) && std::isnan(want_h))) << "f16 bits " << b;
    ASSERT_TRUE(bf == want_bf || (std::isnan(bf) && std::isnan(want_bf))) << "bf16 bits " << b;
  }
  // Just above a 16-bit tie: rounding to float first lands on the tie, and ties-to-even would
  // then round down; a single rounding goes up.
  EXPECT_EQ(static_cast<double>(ref::Half(1 + 0x1p-11 + 0x1p-40)), 1 + 0x1p-10);
  EXPECT_EQ(static_cast<double>(ref::BFloat16(1 + 0x1p-8 + 0x1p-40)), 1 + 0x1p-7);
  EXPECT_EQ(static_cast<double>(ref::Half(1 + 0x1p-11)), 1.0);  // an exact tie goes to even
  EXPECT_TRUE(std::isinf(static_cast<double>(ref::Half(70000.0))));
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (std::uint64_t i = 0; i < 20000; ++i) {
    // Magnitudes from half subnormals (below 2^-14) to 2^15, short of f16 overflow.
    const double v = uniform(seed, i, -1, 1) * std::ldexp(1.0, static_cast<int>(mix64(seed, i) % 36) - 20);
    ASSERT_EQ(static_cast<double>(ref::Half(v)), nearest_16bit(DType::f16, v)) << v;
    ASSERT_EQ(static_cast<double>(ref::BFloat16(v)), nearest_16bit(DType::bf16, v)) << v;
  }
}

// Runs an op on `t` storage (parameters and statistics as the op declares them: f32 beside
// 16-bit data) and on f64 with the same values, and demands that every 16-bit result be the f64
// result rounded once: the kernels load exactly, sum in f64 in one order, and round on store.
void expect_f64_rounded_once(const std::function<std::unique_ptr<Op>()>& make, const std::vector<Tensor>& inputs,
                             DType t, const std::function<double(std::size_t, std::size_t)>& gen) {
  SCOPED_TRACE(std::string(make()->kind()) + " in " + std::string(to_string(t)));
  std::vector<Tensor> narrow = inputs;
  std::vector<bool> needs;
  for (auto& d : narrow) {
    needs.push_back(d.dtype != DType::i32);
    if (d.dtype != DType::i32) d.dtype = t;
  }
  auto lo_op = make(), hi_op = make();
  Harness lo(*lo_op, narrow, needs, Layout::nhwc, gen), hi(*hi_op, inputs, needs, Layout::nhwc, gen);
  auto copy = [](const std::vector<Tensor>& from, const std::vector<Tensor>& to) {
    for (std::size_t i = 0; i < from.size(); ++i)
      if (from[i].defined()) write_host(to[i], read_host(from[i]));
  };
  copy(lo.t.in, hi.t.in);
  copy(lo.t.params, hi.t.params);
  copy(lo.t.dout, hi.t.dout);
  auto expect_rounded = [](const std::vector<Tensor>& narrow_results, const std::vector<Tensor>& wide,
                           const std::string& what) {
    for (std::size_t i = 0; i < narrow_results.size(); ++i) {
      if (!narrow_results[i].defined()) continue;
      const auto got = read_host(narrow_results[i]), want = read_host(wide[i]);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t j = 0; j < got.size(); ++j)
        ASSERT_EQ(got[j], round_to(narrow_results[i].dtype, want[j])) << what << " " << i << " element " << j;
    }
  };
  lo_op->forward(*lo.k, lo.t);
  hi_op->forward(*hi.k, hi.t);
  expect_rounded(lo.t.out, hi.t.out, "output");
  expect_rounded(lo.t.saved, hi.t.saved, "saved");
  expect_rounded(lo.t.params, hi.t.params, "parameter");  // running statistics
  // Backward from the same saved tensors and outputs as the narrow run stored them.
  copy(lo.t.saved, hi.t.saved);
  copy(lo.t.out, hi.t.out);
  lo_op->backward(*lo.k, lo.t);
  hi_op->backward(*hi.k, hi.t);
  expect_rounded(lo.t.din, hi.t.din, "input gradient");
  expect_rounded(lo.t.dparams, hi.t.dparams, "parameter gradient");
}

TEST(SixteenBit, EveryOpGivesTheF64ResultRoundedOnce) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto gen = away_from_zero(seed);
  for (DType t : {DType::bf16, DType::f16}) {
    ASSERT_NO_FATAL_FAILURE(expect_f64_rounded_once([] { return std::make_unique<Conv2d>("conv", conv_cases()[5].a); },
                            {f64(conv_cases()[5].x)}, t, gen));
    ASSERT_NO_FATAL_FAILURE(expect_f64_rounded_once([] { return std::make_unique<BatchNorm2d>("bn"); }, {f64(Shape{3, 4, 3, 2})}, t, gen));
    ASSERT_NO_FATAL_FAILURE(expect_f64_rounded_once([] { return std::make_unique<Relu>("relu"); }, {f64(Shape{2, 3, 3, 3})}, t, gen));
    ASSERT_NO_FATAL_FAILURE(expect_f64_rounded_once([] { return std::make_unique<Add>("add"); }, {f64(Shape{2, 2, 3, 3}), f64(Shape{2, 2, 3, 3})},
                            t, gen));
    ASSERT_NO_FATAL_FAILURE(expect_f64_rounded_once([] { return std::make_unique<MaxPool2d>("pool", Pool2dDesc{3, 3, 2, 2, 1, 1}); },
                            {f64(Shape{2, 2, 6, 5})}, t, distinct_values(seed, 120)));
    ASSERT_NO_FATAL_FAILURE(expect_f64_rounded_once([] { return std::make_unique<GlobalAvgPool>("gap"); }, {f64(Shape{2, 3, 3, 2})}, t, gen));
    ASSERT_NO_FATAL_FAILURE(expect_f64_rounded_once([] { return std::make_unique<Linear>("fc", 5); }, {f64(Shape{3, 4})}, t, gen));
    ASSERT_NO_FATAL_FAILURE(expect_f64_rounded_once([] { return std::make_unique<SoftmaxCrossEntropy>("loss"); },
                            {f64(Shape{4, 3}), Tensor::describe(DType::i32, Shape{4})}, t,
                            [&](std::size_t i, std::size_t j) { return i == 1 ? static_cast<double>(j % 3) : gen(i, j); }));
  }
}

TEST(SixteenBit, OpsDeclareWideStatisticsLossAndParameters) {
  BatchNorm2d bn("bn");
  const auto y = bn.infer({Tensor::describe(DType::bf16, Shape{2, 8, 4, 4})});
  EXPECT_EQ(y[0].dtype, DType::bf16);
  for (const auto& s : bn.saved()) EXPECT_EQ(s.dtype, DType::f32);
  for (const auto& p : bn.parameters()) EXPECT_EQ(p.dtype, DType::f32) << p.name;
  // Bytes: data in 2-byte elements, the 8 per-channel vectors of training in 4-byte ones.
  bn.set_context(true, {true});
  EXPECT_EQ(bn.bytes(Pass::forward), 2 * 256 * 2 + 8 * 8 * 4);
  Conv2d conv("conv", Conv2dAttrs{4, 3, 3, Conv2dDesc{1, 1, 1, 1, 1, 1, 1}});
  conv.infer({Tensor::describe(DType::f16, Shape{2, 8, 4, 4})});
  EXPECT_EQ(conv.parameters()[0].dtype, DType::f16);  // the graph keeps an f32 master beside it
  EXPECT_EQ(conv.bytes(Pass::forward), (256 + 4 * 8 * 9 + 128) * 2);
  SoftmaxCrossEntropy loss("loss");
  const auto l = loss.infer({Tensor::describe(DType::f16, Shape{4, 10}), Tensor::describe(DType::i32, Shape{4})});
  EXPECT_EQ(l[0].dtype, DType::f32);
  EXPECT_EQ(loss.saved()[0].dtype, DType::f32);
  EXPECT_EQ(loss.bytes(Pass::forward), 40 * 2 + 41 * 4 + 4 * 4);
}

struct HostTensors {
  std::unique_ptr<Kernels> k = make_ref_kernels();
  std::vector<Buffer> store;
  Tensor make(DType t, const Shape& s) {
    const Tensor d = Tensor::describe(t, s);
    store.emplace_back(k->allocator(), d.size_bytes());
    return store.back().view(d);
  }
  Tensor scalar(DType t, double v) {
    const Tensor x = make(t, Shape{1});
    write_host(x, {v});
    return x;
  }
};

TEST(MixedPrecision, CastRoundsToNearestEvenBothWays) {
  HostTensors h;
  const std::uint64_t seed = test::seed();
  std::vector<double> v(257);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = uniform(seed, i, -3, 3) * std::ldexp(1.0, static_cast<int>(i % 30) - 15);
  const Tensor src = h.make(DType::f32, Shape{257});
  write_host(src, v);
  const auto wide = read_host(src);
  for (DType t : {DType::f16, DType::bf16}) {
    const Tensor narrow = h.make(t, Shape{257}), back = h.make(DType::f32, Shape{257});
    h.k->cast(src, narrow);
    h.k->cast(narrow, back);
    const auto n = read_host(narrow), b = read_host(back);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto f = static_cast<float>(wide[i]);
      const double want = t == DType::f16 ? half_bits_to_float(float_to_half_bits(f)) : bf16_bits_to_float(float_to_bf16_bits(f));
      ASSERT_EQ(n[i], want) << to_string(t) << " element " << i;
      ASSERT_EQ(b[i], n[i]);  // widening is exact
    }
  }
  EXPECT_THROW(h.k->cast(src, h.make(DType::f32, Shape{256})), Unsupported);
}

TEST(MixedPrecision, UnscaleAndCheckAndTheLossScaleRuleFollowGradScaler) {
  HostTensors h;
  const Tensor g = h.make(DType::f32, Shape{5});
  const Tensor scale = h.scalar(DType::f32, 1024), found = h.scalar(DType::i32, 0), good = h.scalar(DType::i32, 0);
  const std::uint64_t seed = test::seed();
  std::vector<double> v(5);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = uniform(seed, i, -1000, 1000);
  write_host(g, v);
  const auto stored = read_host(g);
  h.k->unscale_and_check(g, scale, found);
  const auto u = read_host(g);
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(u[i], stored[i] / 1024);  // exact: power-of-two scale
  EXPECT_EQ(read_host(found)[0], 0);
  v[3] = std::numeric_limits<double>::infinity();
  write_host(g, v);
  h.k->unscale_and_check(g, scale, found);
  EXPECT_EQ(read_host(found)[0], 1);
  write_host(g, {1, 2, 3, 4, 5});
  h.k->unscale_and_check(g, scale, found);
  EXPECT_EQ(read_host(found)[0], 1) << "a finite gradient must not clear the flag";
  write_host(g, {1, std::nan(""), 3, 4, 5});
  const Tensor found2 = h.scalar(DType::i32, 0);
  h.k->unscale_and_check(g, scale, found2);
  EXPECT_EQ(read_host(found2)[0], 1) << "NaN";

  const LossScaleRule rule{2.0, 0.5, 3};
  h.k->update_loss_scale(rule, scale, good, found);  // overflow: back off, restart the count
  EXPECT_EQ(read_host(scale)[0], 512);
  EXPECT_EQ(read_host(good)[0], 0);
  EXPECT_EQ(read_host(found)[0], 0) << "cleared for the next step";
  const std::vector<double> want_scale{512, 512, 1024, 1024, 1024, 2048}, want_good{1, 2, 0, 1, 2, 0};
  for (std::size_t step = 0; step < want_scale.size(); ++step) {
    h.k->update_loss_scale(rule, scale, good, found);
    EXPECT_EQ(read_host(scale)[0], want_scale[step]) << "good step " << step;
    EXPECT_EQ(read_host(good)[0], want_good[step]) << "good step " << step;
  }
  write_host(scale, {3e38});
  write_host(good, {2});
  h.k->update_loss_scale(rule, scale, good, found);
  EXPECT_EQ(read_host(scale)[0], static_cast<float>(3e38)) << "growth to infinity is refused";
}

TEST(MixedPrecision, SkipIfLeavesSgdAndLarsStepsWithoutEffect) {
  HostTensors h;
  const std::uint64_t seed = test::seed();
  for (bool lars : {false, true}) {
    const Tensor w = h.make(DType::f32, Shape{6}), g = h.make(DType::f32, Shape{6}), v = h.make(DType::f32, Shape{6});
    std::vector<double> w0(6), g0(6), v0(6);
    for (std::size_t i = 0; i < 6; ++i) {
      w0[i] = uniform(seed, i, -1, 1);
      g0[i] = uniform(seed, 10 + i, -1, 1);
      v0[i] = uniform(seed, 20 + i, -1, 1);
    }
    write_host(w, w0);
    write_host(g, g0);
    write_host(v, v0);
    const auto wb = read_host(w), vb = read_host(v);
    const Tensor skip = h.scalar(DType::i32, 1);
    auto step = [&] {
      if (lars)
        h.k->lars_update(LarsStep{0.1, 0.9, 1e-4, 0.001, 0.0, true, skip}, w, g, v);
      else
        h.k->sgd_update(SgdStep{0.1, 0.9, 1e-4, skip}, w, g, v);
    };
    step();
    EXPECT_EQ(read_host(w), wb);
    EXPECT_EQ(read_host(v), vb);
    write_host(skip, {0});
    step();
    EXPECT_NE(read_host(w), wb);
    EXPECT_NE(read_host(v), vb);
  }
}

TEST(Capture, RecordsKernelCallsAndRunsThemOnlyOnReplay) {
  HostTensors h;
  const Tensor x = h.make(DType::f32, Shape{8}), y = h.make(DType::f32, Shape{8});
  const std::uint64_t seed = test::seed();
  std::vector<double> v(8);
  for (std::size_t i = 0; i < 8; ++i) v[i] = uniform(seed, i, -1, 1);
  write_host(x, v);
  write_host(y, std::vector<double>(8, 42.0));
  double value = 3.0;
  int host_runs = 0;
  auto replay = h.k->capture([&] {
    ++host_runs;
    h.k->relu_forward(x, y);
    h.k->fill(x, value);  // the value is taken now, as a CUDA graph's kernel argument would be
  });
  EXPECT_EQ(host_runs, 1);
  EXPECT_EQ(read_host(y), std::vector<double>(8, 42.0)) << "capture ran the work";
  value = 5.0;
  replay->replay();
  EXPECT_EQ(host_runs, 1) << "replay ran host code";
  const auto first = read_host(y);
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(first[i], std::max(static_cast<double>(static_cast<float>(v[i])), 0.0));
  EXPECT_EQ(read_host(x), std::vector<double>(8, 3.0));
  replay->replay();  // relu of the filled 3s
  EXPECT_EQ(read_host(y), std::vector<double>(8, 3.0));

  // What a CUDA graph could not hold fails on the CPU too, and leaves the kernels usable.
  EXPECT_THROW(h.k->capture([&] { Buffer b(h.k->allocator(), 64); }), Error);
  std::vector<float> host(8);
  EXPECT_THROW(h.k->capture([&] { h.k->download(x, host.data()); }), Error);
  EXPECT_THROW(h.k->capture([&] { h.k->synchronize(); }), Error);
  EXPECT_THROW(h.k->capture([&] { h.k->capture([] {}); }), Error);
  h.k->fill(x, 1.0);
  EXPECT_EQ(read_host(x), std::vector<double>(8, 1.0));
  Buffer after(h.k->allocator(), 64);
  EXPECT_NE(after.data(), nullptr);
}

// The loadgen SUT's path: single samples from a host pool into rows of a batch, in any order, and
// some rows back; ranges outside the tensor and copies while capturing are refused.
TEST(HostBuffer, ByteRangeCopiesGatherSamplesAndRefuseRangesOutsideTheTensor) {
  HostTensors h;
  constexpr std::int64_t kSamples = 5, kRow = 6, kRowBytes = kRow * 4;
  HostBuffer pool = h.k->allocate_host(kSamples * kRowBytes);
  ASSERT_NE(pool.data(), nullptr);
  EXPECT_EQ(pool.bytes(), kSamples * kRowBytes);
  for (std::int64_t i = 0; i < kSamples * kRow; ++i) pool.as<float>()[i] = static_cast<float>(i + 1);
  const Tensor batch = h.make(DType::f32, Shape{3, kRow});
  h.k->fill(batch, -1.0);
  const std::int64_t order[] = {4, 0, 2};
  for (std::int64_t row = 0; row < 3; ++row)
    h.k->upload_bytes(batch, row * kRowBytes, pool.as<unsigned char>() + order[row] * kRowBytes, kRowBytes);
  HostBuffer out = h.k->allocate_host(2 * kRowBytes);
  h.k->download_bytes(batch, kRowBytes, out.data(), 2 * kRowBytes);  // rows 1 and 2
  h.k->synchronize();
  const std::vector<double> got = read_host(batch);
  for (std::int64_t row = 0; row < 3; ++row)
    for (std::int64_t j = 0; j < kRow; ++j) {
      const double want = static_cast<double>(order[row] * kRow + j + 1);
      EXPECT_EQ(got[static_cast<std::size_t>(row * kRow + j)], want) << "row " << row << " element " << j;
      if (row > 0) {
        EXPECT_EQ(out.as<float>()[(row - 1) * kRow + j], want) << "downloaded row " << row;
      }
    }

  EXPECT_THROW(h.k->upload_bytes(batch, 2 * kRowBytes + 4, pool.data(), kRowBytes), Error);
  EXPECT_THROW(h.k->upload_bytes(batch, -4, pool.data(), 4), Error);
  EXPECT_THROW(h.k->download_bytes(batch, 0, out.data(), 3 * kRowBytes + 1), Error);
  EXPECT_THROW(h.k->capture([&] { h.k->upload_bytes(batch, 0, pool.data(), 4); }), Error);
  EXPECT_THROW(h.k->capture([&] { h.k->download_bytes(batch, 0, out.data(), 4); }), Error);

  void* const block = out.data();
  HostBuffer moved = std::move(out);
  EXPECT_EQ(moved.data(), block);
  EXPECT_EQ(moved.bytes(), 2 * kRowBytes);
  EXPECT_EQ(out.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is defined
  EXPECT_EQ(out.bytes(), 0);
  EXPECT_EQ(h.k->allocate_host(0).data(), nullptr);
}

// ---------------------------------------------------------------------------------------------
// Learned compression: conv_transpose2d, quantize_ste, rate_distortion_loss

// The transposed convolution by its definition: every input element scatters x * w into the
// outputs it touches, oh = ih * stride - pad + r * dilation (logical NCHW, w [in, out / g, R, S]).
std::vector<double> naive_conv_transpose(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w,
                                         const Shape& ws, const Conv2dDesc& d, const Shape& ys) {
  std::vector<double> y(static_cast<std::size_t>(ys.numel()), 0.0);
  const std::int64_t cg = xs[1] / d.groups, kg = ys[1] / d.groups;
  for (std::int64_t n = 0; n < xs[0]; ++n)
    for (std::int64_t ci = 0; ci < xs[1]; ++ci)
      for (std::int64_t ih = 0; ih < xs[2]; ++ih)
        for (std::int64_t iw = 0; iw < xs[3]; ++iw) {
          const double xv = x[static_cast<std::size_t>(((n * xs[1] + ci) * xs[2] + ih) * xs[3] + iw)];
          for (std::int64_t k = 0; k < kg; ++k)
            for (std::int64_t r = 0; r < ws[2]; ++r)
              for (std::int64_t s = 0; s < ws[3]; ++s) {
                const std::int64_t oh = ih * d.stride_h - d.pad_h + r * d.dilation_h;
                const std::int64_t ow = iw * d.stride_w - d.pad_w + s * d.dilation_w;
                if (oh < 0 || ow < 0 || oh >= ys[2] || ow >= ys[3]) continue;
                const std::int64_t co = (ci / cg) * kg + k;
                y[static_cast<std::size_t>(((n * ys[1] + co) * ys[2] + oh) * ys[3] + ow)] +=
                    xv * w[static_cast<std::size_t>(((ci * ws[1] + k) * ws[2] + r) * ws[3] + s)];
              }
        }
  return y;
}

struct ConvTCase {
  const char* label;
  Shape x;
  ConvTranspose2dAttrs a;
  Shape y;  // expected output shape (PyTorch's formula)
};

std::vector<ConvTCase> conv_transpose_cases() {
  auto attrs = [](std::int64_t k, std::int64_t kh, std::int64_t kw, std::int64_t sh, std::int64_t sw, std::int64_t ph,
                  std::int64_t pw, std::int64_t dil, std::int64_t groups, std::int64_t oph, std::int64_t opw) {
    return ConvTranspose2dAttrs{k, kh, kw, Conv2dDesc{sh, sw, ph, pw, dil, dil, groups}, oph, opw};
  };
  return {{"5x5 stride 2 pad 2 output_padding 1 (the model's)", Shape{2, 3, 3, 4}, attrs(2, 5, 5, 2, 2, 2, 2, 1, 1, 1, 1),
           Shape{2, 2, 6, 8}},
          {"3x3 stride 2 pad 1 output_padding 0", Shape{1, 2, 4, 3}, attrs(3, 3, 3, 2, 2, 1, 1, 1, 1, 0, 0),
           Shape{1, 3, 7, 5}},
          {"3x3 stride 1 pad 1 groups 2", Shape{2, 4, 4, 4}, attrs(6, 3, 3, 1, 1, 1, 1, 1, 2, 0, 0), Shape{2, 6, 4, 4}},
          {"3x3 dilation 2 stride 2 output_padding 1", Shape{1, 2, 3, 3}, attrs(2, 3, 3, 2, 2, 1, 1, 2, 1, 1, 1),
           Shape{1, 2, 8, 8}},
          {"1x3 stride 3x1 pad 0x1 output_padding 2x0", Shape{2, 2, 3, 4}, attrs(3, 1, 3, 3, 1, 0, 1, 1, 1, 2, 0),
           Shape{2, 3, 9, 4}},
          {"2x2 stride 2 (no overlap), depthwise", Shape{1, 3, 2, 3}, attrs(3, 2, 2, 2, 2, 0, 0, 1, 3, 0, 0),
           Shape{1, 3, 4, 6}}};
}

TEST(ConvTranspose2d, ForwardMatchesNaiveScatterInBothLayouts) {
  for (const auto& c : conv_transpose_cases()) {
    SCOPED_TRACE(c.label);
    for (Layout layout : {Layout::nchw, Layout::nhwc}) {
      ConvTranspose2d op("deconv", c.a);
      const std::uint64_t seed = test::seed();
      Harness h(op, {f64(c.x)}, {true}, layout, [&](std::size_t, std::size_t j) { return uniform(seed, j, -1, 1); });
      ASSERT_EQ(h.t.out[0].shape, c.y);
      ASSERT_EQ(h.t.params[0].shape,
                (Shape{c.x[1], c.a.out_channels / c.a.conv.groups, c.a.kernel_h, c.a.kernel_w}));
      op.forward(*h.k, h.t);
      const auto want = naive_conv_transpose(read_host(h.t.in[0]), c.x, read_host(h.t.params[0]),
                                             h.t.params[0].shape, c.a.conv, c.y);
      const auto got = read_host(h.t.out[0]);
      ASSERT_EQ(got.size(), want.size());
      double largest = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-12) << "element " << i;
        largest = std::max(largest, std::abs(want[i]));
      }
      EXPECT_GT(largest, 0.1);  // not a vacuous comparison of zeros
    }
  }
}

TEST(ConvTranspose2d, BackwardMatchesFiniteDifferencesIncludingTheAccumulatePath) {
  for (Layout layout : {Layout::nchw, Layout::nhwc})
    for (const auto& c : conv_transpose_cases()) {
      SCOPED_TRACE(std::string(c.label) + " " + std::string(to_string(layout)));
      ConvTranspose2d op("deconv", c.a);
      Harness h(op, {f64(c.x)}, {true}, layout, away_from_zero(test::seed()));
      // The accumulating data gradient needs the scratch prepare asks for once dx accumulates.
      h.t.din_accumulate[0] = true;
      const std::int64_t ws_bytes = op.prepare(*h.k, h.t);
      h.t.din_accumulate[0] = false;
      EXPECT_GE(ws_bytes, h.t.in[0].size_bytes());
      EXPECT_EQ(op.prepare(*h.k, h.t), 0);  // ref: no convolution workspace, no scratch without accumulation
      op.prepare(*h.k, h.t);
      Buffer ws(h.k->allocator(), ws_bytes);
      h.t.workspace = Workspace{ws.data(), ws_bytes};
      ASSERT_NO_FATAL_FAILURE(h.run_all());
    }
}

TEST(ConvTranspose2d, CountsAndRefusals) {
  const auto c = conv_transpose_cases()[0];
  ConvTranspose2d op("deconv", c.a);
  op.infer({f64(c.x)});
  // Each of the 2*3*3*4 inputs meets 2 output channels x 25 taps.
  EXPECT_EQ(op.macs(), 2 * 3 * 3 * 4 * 2 * 25);
  EXPECT_EQ(op.flops(Pass::forward), 2 * op.macs());
  op.set_context(true, {true});
  EXPECT_EQ(op.flops(Pass::backward), 4 * op.macs());
  op.set_context(true, {false});
  EXPECT_EQ(op.flops(Pass::backward), 2 * op.macs());
  const std::int64_t x = 72, y = 2 * 2 * 6 * 8, w = 3 * 2 * 25;
  EXPECT_EQ(op.bytes(Pass::forward), (x + w + y) * 8);
  EXPECT_EQ(op.bytes(Pass::backward), (x + y + w) * 8);
  EXPECT_EQ(op.passes().backward_data, true);  // the transposed forward is the convolution's backward-data
  EXPECT_EQ(op.passes().backward_filter, true);
  op.set_context(false, {false});
  EXPECT_EQ(op.passes().backward_filter, false);
  auto bad = c.a;
  bad.output_padding_h = 2;  // must be < max(stride, dilation) = 2
  ConvTranspose2d refused("deconv", bad);
  EXPECT_THROW(refused.infer({f64(c.x)}), LayerError);
  auto groups = c.a;
  groups.conv.groups = 2;  // 3 input channels
  ConvTranspose2d refused2("deconv", groups);
  EXPECT_THROW(refused2.infer({f64(c.x)}), LayerError);
}

TEST(QuantizeSte, RoundsToNearestEvenAndPassesTheGradientStraightThrough) {
  const std::vector<double> x{-2.5, -1.5, -0.6, -0.5, -0.4, 0.0, 0.4, 0.5, 0.51, 1.5, 2.5, 3.49, 7.2, -7.7};
  const std::vector<double> integers{-2, -2, -1, -0.0, -0.0, 0, 0, 0, 1, 2, 2, 3, 7, -8};
  const std::vector<double> quarters{-2.5, -1.5, -0.5, -0.5, -0.5, 0, 0.5, 0.5, 0.5, 1.5, 2.5, 3.5, 7.25, -7.75};
  for (const double step : {1.0, 0.25}) {
    SCOPED_TRACE("step " + std::to_string(step));
    QuantizeSte op("quantize", step);
    Harness h(op, {f64(Shape{2, 7})}, {true}, Layout::nchw, [&](std::size_t, std::size_t j) { return x[j]; });
    op.forward(*h.k, h.t);
    EXPECT_EQ(read_host(h.t.out[0]), step == 1.0 ? integers : quarters);
    // Straight through: dx = dy exactly, and dx += dy when accumulating. (Finite differences do
    // not apply: rounding's derivative is 0 almost everywhere, which is why the estimator exists.)
    op.backward(*h.k, h.t);
    const auto dy = read_host(h.t.dout[0]);
    EXPECT_EQ(read_host(h.t.din[0]), dy);
    std::vector<double> prev(dy.size(), 0.75);
    write_host(h.t.din[0], prev);
    h.t.din_accumulate[0] = true;
    op.backward(*h.k, h.t);
    const auto acc = read_host(h.t.din[0]);
    for (std::size_t i = 0; i < dy.size(); ++i) EXPECT_EQ(acc[i], 0.75 + dy[i]);
  }
  EXPECT_EQ(QuantizeSte("q").flops(Pass::backward), 0);
  QuantizeSte bad("q", 0.0);
  EXPECT_THROW(bad.infer({f64(Shape{3})}), LayerError);
}

TEST(RateDistortionLoss, KnownValuesAndBackwardOfEveryInput) {
  RateDistortionLoss op("loss", {0.3});
  const std::uint64_t seed = test::seed();
  Harness h(op, {f64(Shape{2, 3, 4, 4}), f64(Shape{2, 3, 4, 4}), f64(Shape{2, 5, 1, 1})}, {true, true, true},
            Layout::nhwc, away_from_zero(seed));
  // x_hat - x = 0.5 everywhere and |latent| = 2: mse 0.25, loss 0.25 + 0.3 * 2.
  write_host(h.t.in[0], std::vector<double>(96, 0.75));
  write_host(h.t.in[1], std::vector<double>(96, 0.25));
  std::vector<double> latent(10, 2.0);
  for (std::size_t i = 0; i < latent.size(); i += 2) latent[i] = -2.0;
  write_host(h.t.in[2], latent);
  h.loss();
  EXPECT_NEAR(read_host(h.t.out[0])[0], 0.25 + 0.6, 1e-15);
  EXPECT_NEAR(read_host(h.t.out[1])[0], 0.25, 1e-15);
  // Gradients by central differences on fresh values (latent away from |.|'s kink at 0).
  const auto gen = away_from_zero(seed + 1);
  for (std::size_t i = 0; i < 3; ++i) {
    std::vector<double> v(static_cast<std::size_t>(h.t.in[i].numel()));
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = gen(i, j);
    write_host(h.t.in[i], v);
  }
  ASSERT_NO_FATAL_FAILURE(h.run_all(40));
  EXPECT_EQ(op.flops(Pass::forward), 3 * 96 + 2 * 10 + 4);
  EXPECT_EQ(op.flops(Pass::backward), 2 * 96 * 2 + 2 * 10);
}

TEST(RateDistortionLoss, RefusesMismatchedImages) {
  RateDistortionLoss op("loss", {0.01});
  EXPECT_THROW(op.infer({f64(Shape{1, 3, 4, 4}), f64(Shape{1, 3, 4, 2}), f64(Shape{1, 2, 1, 1})}), LayerError);
  RateDistortionLoss negative("loss", {-1.0});
  EXPECT_THROW(negative.infer({f64(Shape{1, 3, 4, 4}), f64(Shape{1, 3, 4, 4}), f64(Shape{1, 2, 1, 1})}), LayerError);
}

TEST(SixteenBit, CompressionOpsGiveTheF64ResultRoundedOnce) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto gen = away_from_zero(seed);
  for (DType t : {DType::bf16, DType::f16}) {
    const auto c = conv_transpose_cases()[0];
    ASSERT_NO_FATAL_FAILURE(expect_f64_rounded_once([&] { return std::make_unique<ConvTranspose2d>("deconv", c.a); }, {f64(c.x)}, t, gen));
    ASSERT_NO_FATAL_FAILURE(expect_f64_rounded_once([] { return std::make_unique<QuantizeSte>("quantize", 0.25); }, {f64(Shape{2, 3, 2, 2})},
                            t, gen));
    ASSERT_NO_FATAL_FAILURE(expect_f64_rounded_once([] { return std::make_unique<RateDistortionLoss>("loss", RateDistortionDesc{0.1}); },
                            {f64(Shape{2, 3, 4, 4}), f64(Shape{2, 3, 4, 4}), f64(Shape{2, 2, 1, 1})}, t, gen));
  }
}

}  // namespace
}  // namespace ab::nn
