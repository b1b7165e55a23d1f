// Tests for the reference backend's fp8 (e4m3) convolution (Kernels::conv2d_fp8_*): against an
// independent naive quantize-and-convolve written here from the contract, on fresh random inputs
// in every layout, output type and epilogue; the quantization error against the 16-bit fused
// convolution (real, and small); the refusals shared with the CUDA kernels; the fallback scale of
// an all-zero x; a large x that an unscaled e4m3 image would saturate; capture and replay.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/kernels.h"
#include "test_support.h"

namespace ab::nn {
namespace {

// Host tensors of given values on a backend, alive as long as this object.
class Tensors {
 public:
  explicit Tensors(Kernels& k, std::uint64_t seed) : k_(k), seed_(seed) {}
  Tensor make(DType t, const Shape& s, Layout l, const std::vector<double>& values) {
    const Tensor d = Tensor::describe(t, s, l);
    store_.emplace_back(k_.allocator(), d.size_bytes());
    const Tensor v = store_.back().view(d);
    write_host(v, values);
    return v;
  }
  // Fresh uniform values in [lo, hi).
  Tensor random(DType t, const Shape& s, Layout l, double lo, double hi) {
    std::vector<double> values(static_cast<std::size_t>(s.numel()));
    for (auto& x : values) x = uniform(seed_, counter_++, lo, hi);
    return make(t, s, l, values);
  }
  // Fresh multiples of 1/8 in [lo, hi]: sums of two are exact in f16.
  Tensor eighths(DType t, const Shape& s, Layout l, double lo, double hi) {
    std::vector<double> values(static_cast<std::size_t>(s.numel()));
    for (auto& x : values) x = std::round(uniform(seed_, counter_++, lo, hi) * 8) / 8;
    return make(t, s, l, values);
  }

 private:
  Kernels& k_;
  std::uint64_t seed_, counter_ = 0;
  std::vector<Buffer> store_;
};

// The contract, written independently of nn/ref: the per-tensor scale 448 / max|v| in f32 (1, with
// descale 1, where that is not a finite positive number), the e4m3 image of the f32 product.
struct Quantized {
  std::vector<double> q;
  float descale = 1.0f;
};
Quantized quantize(const std::vector<double>& v) {
  float amax = 0.0f;
  for (double x : v) amax = std::max(amax, std::fabs(static_cast<float>(x)));
  float scale = 448.0f / amax;
  Quantized out;
  if (std::isfinite(scale) && scale > 0.0f) {
    out.descale = amax / 448.0f;
  } else {
    scale = 1.0f;
  }
  for (double x : v) out.q.push_back(e4m3_bits_to_float(float_to_e4m3_bits(static_cast<float>(x) * scale)));
  return out;
}

struct Problem {
  Shape xs, ws, ys;  // logical NCHW / KCRS
  Conv2dDesc conv;
};

// y = act(conv(qx, qw) * (dx * dw) + bias[k] (+ residual)) in f64, logical NCHW order; a direct
// seven-deep loop over (n, k, p, q, c, r, s). `bias` and `residual` may be empty.
std::vector<double> naive_fp8(const Problem& p, const std::vector<double>& x, const std::vector<double>& w,
                              const std::vector<double>& bias, const std::vector<double>& residual, bool relu) {
  const Quantized qx = quantize(x), qw = quantize(w);
  const auto descale = static_cast<double>(qx.descale * qw.descale);
  const std::int64_t N = p.xs[0], C = p.xs[1], H = p.xs[2], W = p.xs[3];
  const std::int64_t K = p.ws[0], R = p.ws[2], S = p.ws[3], P = p.ys[2], Q = p.ys[3];
  const auto at = [](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d, const Shape& s) {
    return static_cast<std::size_t>(((a * s[1] + b) * s[2] + c) * s[3] + d);
  };
  std::vector<double> y(static_cast<std::size_t>(p.ys.numel()));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t oh = 0; oh < P; ++oh)
        for (std::int64_t ow = 0; ow < Q; ++ow) {
          double acc = 0;
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t r = 0; r < R; ++r)
              for (std::int64_t s = 0; s < S; ++s) {
                const std::int64_t ih = oh * p.conv.stride_h - p.conv.pad_h + r * p.conv.dilation_h;
                const std::int64_t iw = ow * p.conv.stride_w - p.conv.pad_w + s * p.conv.dilation_w;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += qx.q[at(n, c, ih, iw, p.xs)] * qw.q[at(k, c, r, s, p.ws)];
              }
          const std::size_t i = at(n, k, oh, ow, p.ys);
          double v = acc * descale + (bias.empty() ? 0.0 : bias[static_cast<std::size_t>(k)]);
          if (!residual.empty()) v += residual[i];
          y[i] = relu ? std::max(v, 0.0) : v;
        }
  return y;
}

Problem problem(std::int64_t c, std::int64_t k, std::int64_t hw, std::int64_t rs, std::int64_t stride,
                std::int64_t pad) {
  Problem p;
  p.conv.stride_h = p.conv.stride_w = stride;
  p.conv.pad_h = p.conv.pad_w = pad;
  const std::int64_t out = (hw + 2 * pad - rs) / stride + 1;
  p.xs = Shape{2, c, hw, hw};
  p.ws = Shape{k, c, rs, rs};
  p.ys = Shape{2, k, out, out};
  return p;
}

// The unit roundoff of one rounding to `t` (relative), and the smallest half-step near zero.
double roundoff(DType t) { return t == DType::f16 ? 0x1p-11 : 0x1p-8; }
constexpr double kTiny = 0x1p-24;

// ||a - b|| / ||b|| over all elements.
double relative_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

TEST(Fp8ConvRef, MatchesTheNaiveQuantizedConvolutionInEveryConfiguration) {
  auto k = make_ref_kernels();
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Tensors make(*k, seed);
  int cases = 0;
  for (const Problem& p : {problem(16, 32, 7, 3, 1, 0), problem(32, 16, 9, 3, 2, 1)})
    for (Layout layout : {Layout::nchw, Layout::nhwc})
      for (DType t : {DType::f16, DType::bf16})
        for (int bias_kind = 0; bias_kind < 3; ++bias_kind)  // none, y's dtype, f32
          for (bool residual : {false, true})
            for (bool relu : {false, true}) {
              SCOPED_TRACE(p.xs.to_string() + " stride " + std::to_string(p.conv.stride_h) + " pad " +
                           std::to_string(p.conv.pad_h) + " " + std::string(to_string(layout)) + " " +
                           std::string(to_string(t)) + " bias " + std::to_string(bias_kind) +
                           (residual ? " residual" : "") + (relu ? " relu" : ""));
              const Tensor x = make.random(t, p.xs, layout, -3, 3), w = make.random(t, p.ws, layout, -0.2, 0.2);
              const Tensor r = make.random(t, p.ys, layout, -1, 1);
              const Tensor b = bias_kind == 0 ? Tensor{}
                                              : make.random(bias_kind == 1 ? t : DType::f32, Shape{p.ys[1]},
                                                            Layout::nchw, -1, 1);
              const Tensor y = make.random(t, p.ys, layout, 5, 6);
              const Tensor res = residual ? r : Tensor{};
              EXPECT_EQ(k->conv2d_fp8_prepare(p.conv, x, w, b, res, y, relu), 0);
              k->conv2d_fp8_forward(p.conv, x, w, b, res, y, relu, Workspace{});
              const std::vector<double> none;
              const auto want = naive_fp8(p, read_host(x), read_host(w), b.defined() ? read_host(b) : none,
                                          residual ? read_host(r) : none, relu);
              const auto got = read_host(y);
              int positive = 0, negative = 0;
              for (std::size_t i = 0; i < got.size(); ++i) {
                ASSERT_NEAR(got[i], want[i], roundoff(t) * std::abs(want[i]) + kTiny) << "element " << i;
                positive += got[i] > 0;
                negative += got[i] < 0;
              }
              EXPECT_GT(positive, static_cast<int>(got.size()) / 4);  // not a vacuous all-zero comparison
              EXPECT_EQ(negative > 0, !relu);
              ++cases;
            }
  EXPECT_EQ(cases, 96);
}

// The e4m3 rounding is real (the result is not the 16-bit one) and small (a few percent).
TEST(Fp8ConvRef, DiffersFromThe16BitConvolutionByTheQuantizationErrorOnly) {
  auto k = make_ref_kernels();
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Tensors make(*k, seed);
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    const Problem p = problem(32, 32, 8, 3, 1, 1);
    const Tensor x = make.random(DType::f16, p.xs, layout, -2, 2), w = make.random(DType::f16, p.ws, layout, -0.1, 0.1);
    const Tensor b = make.random(DType::f16, Shape{32}, Layout::nchw, -0.5, 0.5);
    const Tensor r = make.random(DType::f16, p.ys, layout, -0.5, 0.5);
    const Tensor y8 = make.random(DType::f16, p.ys, layout, 5, 6), y16 = make.random(DType::f16, p.ys, layout, 5, 6);
    k->conv2d_fp8_forward(p.conv, x, w, b, r, y8, false, Workspace{});
    k->conv2d_bias_activation_forward(p.conv, x, w, b, r, y16, false, Workspace{});
    const double rel = relative_l2(read_host(y8), read_host(y16));
    std::cout << "fp8 vs f16 conv_bias_act (" << to_string(layout) << ", C 32, 3x3, y " << p.ys.to_string()
              << "): relative L2 difference " << rel << "\n";
    EXPECT_GT(rel, 1e-3);  // the e4m3 rounding shows
    EXPECT_LT(rel, 0.1);
  }
}

TEST(Fp8ConvRef, RefusesWhatTheCudaKernelsRefuseNamingWhy) {
  auto k = make_ref_kernels();
  Tensors make(*k, test::seed());
  const auto expect_refused = [&](const Problem& p, DType t, const std::string& why) {
    SCOPED_TRACE(why);
    const Tensor x = make.random(t, p.xs, Layout::nhwc, -1, 1), w = make.random(t, p.ws, Layout::nhwc, -1, 1);
    const Tensor y = make.random(t, p.ys, Layout::nhwc, -1, 1), b = make.random(t, Shape{p.ys[1]}, Layout::nchw, -1, 1);
    const std::string shared = fp8_conv_refusal(p.conv, x, w, y);
    EXPECT_NE(shared.find(why), std::string::npos) << shared;
    const std::string prepare =
        test::error_message<Unsupported>([&] { k->conv2d_fp8_prepare(p.conv, x, w, b, Tensor{}, y, true); });
    EXPECT_NE(prepare.find(why), std::string::npos) << prepare;
    const std::string forward = test::error_message<Unsupported>(
        [&] { k->conv2d_fp8_forward(p.conv, x, w, b, Tensor{}, y, true, Workspace{}); });
    EXPECT_NE(forward.find(why), std::string::npos) << forward;
  };
  Problem grouped = problem(32, 32, 6, 3, 1, 1);
  grouped.conv.groups = 2;
  grouped.ws = Shape{32, 16, 3, 3};
  expect_refused(grouped, DType::f16, "groups = 1 only, got 2");
  expect_refused(problem(3, 16, 8, 3, 1, 1), DType::f16, "C and K must be multiples of 16");  // a stem
  expect_refused(problem(16, 24, 8, 1, 1, 0), DType::bf16, "C and K must be multiples of 16");
  expect_refused(problem(16, 16, 8, 1, 1, 0), DType::f32, "x and y must be f16 or bf16");

  const Problem ok = problem(16, 16, 8, 1, 1, 0);
  const Tensor x = Tensor::describe(DType::bf16, ok.xs, Layout::nhwc), w = Tensor::describe(DType::bf16, ok.ws);
  EXPECT_EQ(fp8_conv_refusal(ok.conv, x, w, Tensor::describe(DType::bf16, ok.ys)), "");
}

// An all-zero x takes the fallback scale (448 / 0 is not finite): y = act(bias (+ residual))
// exactly, with bias and residual multiples of 1/8 so that their sum is exact in f16.
TEST(Fp8ConvRef, AllZeroInputGivesTheEpilogueExactly) {
  auto k = make_ref_kernels();
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Tensors make(*k, seed);
  const Problem p = problem(16, 16, 5, 3, 2, 1);
  for (bool residual : {false, true})
    for (bool relu : {false, true}) {
      SCOPED_TRACE(std::string(residual ? "residual" : "") + (relu ? " relu" : ""));
      const std::vector<double> zeros(static_cast<std::size_t>(p.xs.numel()), 0.0);
      const Tensor x = make.make(DType::f16, p.xs, Layout::nhwc, zeros);
      const Tensor w = make.random(DType::f16, p.ws, Layout::nhwc, -1, 1);
      const Tensor b = make.eighths(DType::f32, Shape{16}, Layout::nchw, -1, 2);  // some channel positive
      const Tensor r = make.eighths(DType::f16, p.ys, Layout::nhwc, -2, 2);
      const Tensor y = make.random(DType::f16, p.ys, Layout::nhwc, 5, 6);
      k->conv2d_fp8_forward(p.conv, x, w, b, residual ? r : Tensor{}, y, relu, Workspace{});
      const auto got = read_host(y), bv = read_host(b), rv = read_host(r);
      const std::size_t plane = static_cast<std::size_t>(p.ys[2] * p.ys[3]);
      int nonzero = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        double v = bv[(i / plane) % 16] + (residual ? rv[i] : 0.0);
        if (relu) v = std::max(v, 0.0);
        ASSERT_EQ(got[i], v) << "element " << i;
        nonzero += got[i] != 0;
      }
      // Not vacuous: most elements nonzero, and with the ReLU at least one channel's plane.
      EXPECT_GT(nonzero, relu ? static_cast<int>(plane) : static_cast<int>(got.size()) / 2);
    }
}

// max|x| = 1e4: unscaled, nearly every element would saturate at 448; scaled, the result is the
// naive one and within the quantization error of the f16 convolution, and finite.
TEST(Fp8ConvRef, LargeInputIsScaledNotSaturated) {
  auto k = make_ref_kernels();
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Tensors make(*k, seed);
  const Problem p = problem(16, 16, 6, 3, 1, 1);
  std::vector<double> xv(static_cast<std::size_t>(p.xs.numel()));
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = uniform(seed, 1'000'000 + i, -1e4, 1e4);
  xv[7] = -1e4;  // max|x| exactly, on the negative side
  const Tensor x = make.make(DType::f16, p.xs, Layout::nchw, xv);
  const Tensor w = make.random(DType::f16, p.ws, Layout::nchw, -0.05, 0.05);
  const Tensor b = make.random(DType::f16, Shape{16}, Layout::nchw, -1, 1);
  const Tensor y8 = make.random(DType::f16, p.ys, Layout::nchw, 5, 6);
  const Tensor y16 = make.random(DType::f16, p.ys, Layout::nchw, 5, 6);
  k->conv2d_fp8_forward(p.conv, x, w, b, Tensor{}, y8, false, Workspace{});
  k->conv2d_bias_activation_forward(p.conv, x, w, b, Tensor{}, y16, false, Workspace{});
  const auto got = read_host(y8);
  const auto want = naive_fp8(p, read_host(x), read_host(w), read_host(b), {}, false);
  double largest = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
    ASSERT_NEAR(got[i], want[i], roundoff(DType::f16) * std::abs(want[i]) + kTiny) << "element " << i;
    largest = std::max(largest, std::abs(got[i]));
  }
  const double rel = relative_l2(got, read_host(y16));
  std::cout << "fp8 vs f16 with max|x| = 1e4: relative L2 difference " << rel << ", max|y| " << largest << "\n";
  EXPECT_GT(largest, 1000.0);
  EXPECT_GT(rel, 1e-3);
  EXPECT_LT(rel, 0.1);
}

// Captured, the call runs on replay only and gives the same bits as a direct call.
TEST(Fp8ConvRef, CaptureDefersTheCallAndReplaysTheSameBits) {
  auto k = make_ref_kernels();
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Tensors make(*k, seed);
  const Problem p = problem(16, 16, 6, 3, 1, 1);
  const Tensor x = make.random(DType::bf16, p.xs, Layout::nhwc, -1, 1);
  const Tensor w = make.random(DType::bf16, p.ws, Layout::nhwc, -1, 1);
  const Tensor b = make.random(DType::f32, Shape{16}, Layout::nchw, -1, 1);
  const Tensor direct = make.random(DType::bf16, p.ys, Layout::nhwc, 5, 6);
  const Tensor captured = make.random(DType::bf16, p.ys, Layout::nhwc, 5, 6);
  k->conv2d_fp8_forward(p.conv, x, w, b, Tensor{}, direct, true, Workspace{});
  const auto before = read_host(captured);
  auto replay = k->capture([&] { k->conv2d_fp8_forward(p.conv, x, w, b, Tensor{}, captured, true, Workspace{}); });
  EXPECT_EQ(read_host(captured), before) << "capture ran the work";
  replay->replay();
  EXPECT_EQ(read_host(captured), read_host(direct));
}

}  // namespace
}  // namespace ab::nn
