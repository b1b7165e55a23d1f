// The transformer kernels of the reference backend (nn/ref/ref_transformer.cpp): every forward
// against an independent naive formula and every backward against central finite differences, on
// fresh random f64 inputs; attention with causal and padding masks on strided views of one QKV
// buffer; 16-bit storage rounded once; bad operands refused with the reason; AdamW by hand, and
// with its device step count across a captured replay; the fused cross-entropy on padded rows.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/graph.h"
#include "nn/kernels.h"
#include "nn/ops.h"
#include "test_support.h"

namespace ab::nn {
namespace {

std::size_t sz(std::int64_t i) { return static_cast<std::size_t>(i); }

// Host tensors of the reference kernels, alive as long as this object; values drawn from one seed.
class Tensors {
 public:
  Tensors() : kernels_(make_ref_kernels()), seed_(test::seed()) {}
  Kernels& k() { return *kernels_; }
  std::uint64_t seed() const { return seed_; }
  Tensor make(DType t, const Shape& s, const std::vector<double>& values) {
    const Tensor d = Tensor::describe(t, s);
    store_.emplace_back(kernels_->allocator(), d.size_bytes());
    const Tensor v = store_.back().view(d);
    write_host(v, values);
    return v;
  }
  std::vector<double> draw(std::int64_t n, double lo, double hi) {
    std::vector<double> v(sz(n));
    for (auto& x : v) x = uniform(seed_, counter_++, lo, hi);
    return v;
  }
  Tensor random(DType t, const Shape& s, double lo = -1.0, double hi = 1.0) { return make(t, s, draw(s.numel(), lo, hi)); }
  Tensor zeros(DType t, const Shape& s) { return make(t, s, std::vector<double>(sz(s.numel()), 0.0)); }
  Tensor ints(const Shape& s, const std::vector<double>& ids) { return make(DType::i32, s, ids); }

 private:
  std::unique_ptr<Kernels> kernels_;
  std::uint64_t seed_, counter_ = 0;
  std::vector<Buffer> store_;
};

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks d(sum(r * f))/dx, computed analytically as `analytic`, against central differences of
// `loss` at every element of the f64 tensor x.
template <class Loss>
void expect_gradient(const Tensor& x, const std::vector<double>& analytic, Loss&& loss, const std::string& what,
                     double tolerance = 1e-6) {
  std::vector<double> values = read_host(x);
  ASSERT_EQ(values.size(), analytic.size()) << what;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double numeric = test::central_difference(x, values, i, 1e-5, loss);
    EXPECT_NEAR(analytic[i], numeric, tolerance * std::max(1.0, std::abs(numeric))) << what << " element " << i;
  }
}

// ---- LayerNorm

TEST(TransformerRef, LayerNormMatchesTheFormulaAndFiniteDifferences) {
  Tensors t;
  SCOPED_TRACE("seed " + std::to_string(t.seed()));
  const std::int64_t rows = 3, channels = 7;
  const Tensor x = t.random(DType::f64, {rows, channels}, -2, 2), gamma = t.random(DType::f64, {channels}, 0.5, 1.5);
  const Tensor beta = t.random(DType::f64, {channels}), y = t.zeros(DType::f64, {rows, channels});
  const Tensor mean = t.zeros(DType::f64, {rows}), rstd = t.zeros(DType::f64, {rows});
  const LayerNormDesc d{.epsilon = 1e-5};
  t.k().layernorm_forward(d, x, gamma, beta, y, mean, rstd);
  const std::vector<double> xv = read_host(x), gv = read_host(gamma), bv = read_host(beta), yv = read_host(y);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (std::int64_t c = 0; c < channels; ++c) mu += xv[sz(r * channels + c)] / channels;
    for (std::int64_t c = 0; c < channels; ++c) var += std::pow(xv[sz(r * channels + c)] - mu, 2) / channels;
    EXPECT_NEAR(read_host(mean)[sz(r)], mu, 1e-14);
    EXPECT_NEAR(read_host(rstd)[sz(r)], 1 / std::sqrt(var + 1e-5), 1e-12);
    for (std::int64_t c = 0; c < channels; ++c)
      EXPECT_NEAR(yv[sz(r * channels + c)], (xv[sz(r * channels + c)] - mu) / std::sqrt(var + 1e-5) * gv[sz(c)] + bv[sz(c)],
                  1e-12);
  }
  const std::vector<double> r = t.draw(rows * channels, -1, 1);
  const Tensor dy = t.make(DType::f64, {rows, channels}, r);
  const Tensor dx = t.random(DType::f64, {rows, channels}), dgamma = t.zeros(DType::f64, {channels});
  const Tensor dbeta = t.zeros(DType::f64, {channels});
  const std::vector<double> before = read_host(dx);
  t.k().layernorm_backward(x, dy, gamma, mean, rstd, dx, /*accumulate=*/true, dgamma, dbeta);
  const auto loss = [&] {
    t.k().layernorm_forward(d, x, gamma, beta, y, mean, rstd);
    return dot(read_host(y), r);
  };
  std::vector<double> added = read_host(dx);
  for (std::size_t i = 0; i < added.size(); ++i) added[i] -= before[i];  // accumulate adds the gradient
  expect_gradient(x, added, loss, "dx");
  expect_gradient(gamma, read_host(dgamma), loss, "dgamma");
  expect_gradient(beta, read_host(dbeta), loss, "dbeta");
}

TEST(TransformerRef, RmsNormMatchesTheFormulaAndFiniteDifferences) {
  Tensors t;
  SCOPED_TRACE("seed " + std::to_string(t.seed()));
  const std::int64_t rows = 4, channels = 9;
  const Tensor x = t.random(DType::f64, {rows, channels}, -2, 2), gamma = t.random(DType::f64, {channels}, 0.5, 1.5);
  const Tensor y = t.zeros(DType::f64, {rows, channels}), rstd = t.zeros(DType::f64, {rows});
  const LayerNormDesc d{.epsilon = 1e-6};
  t.k().rmsnorm_forward(d, x, gamma, y, rstd);
  const std::vector<double> xv = read_host(x), gv = read_host(gamma), yv = read_host(y);
  for (std::int64_t r = 0; r < rows; ++r) {
    double squares = 0;
    for (std::int64_t c = 0; c < channels; ++c) squares += std::pow(xv[sz(r * channels + c)], 2) / channels;
    const double inv = 1 / std::sqrt(squares + 1e-6);
    EXPECT_NEAR(read_host(rstd)[sz(r)], inv, 1e-12);
    for (std::int64_t c = 0; c < channels; ++c)
      EXPECT_NEAR(yv[sz(r * channels + c)], xv[sz(r * channels + c)] * inv * gv[sz(c)], 1e-12);
  }
  const std::vector<double> r = t.draw(rows * channels, -1, 1);
  const Tensor dy = t.make(DType::f64, {rows, channels}, r);
  const Tensor dx = t.random(DType::f64, {rows, channels}), dgamma = t.zeros(DType::f64, {channels});
  t.k().rmsnorm_backward(x, dy, gamma, rstd, dx, /*accumulate=*/false, dgamma);
  const auto loss = [&] {
    t.k().rmsnorm_forward(d, x, gamma, y, rstd);
    return dot(read_host(y), r);
  };
  expect_gradient(x, read_host(dx), loss, "dx");
  expect_gradient(gamma, read_host(dgamma), loss, "dgamma");
}

TEST(TransformerRef, RmsNormOpHasNoShiftAndKeepsOneStatistic) {
  const auto op = LayerNorm::rms("norm");
  GraphOptions o;
  o.training = false;
  GraphBuilder b(o);
  const Value x = b.input("x", Shape{5, 16});
  b.add1(LayerNorm::rms("norm"), {x});
  EXPECT_EQ(op->kind(), "rmsnorm");
  Graph g(std::move(b));
  ASSERT_EQ(g.report().size(), 1u);
  EXPECT_EQ(g.report()[0].params, 16) << "a scale per channel, no shift";
  EXPECT_EQ(g.op(0).saved().size(), 1u) << "1/std only";
}

// ---- Dropout

TEST(TransformerRef, DropoutDropsItsShareScalesTheRestAndBackwardUsesTheSameMask) {
  Tensors t;
  const std::int64_t n = 200000;
  const Tensor x = t.random(DType::f64, {n}, 0.5, 1.5), y = t.zeros(DType::f64, {n});
  const Tensor counter = t.ints({1}, {7});
  const DropoutDesc d{.probability = 0.25, .seed = 12345};
  t.k().dropout_forward(d, x, y, counter);
  const std::vector<double> xv = read_host(x), yv = read_host(y);
  std::int64_t dropped = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (yv[sz(i)] == 0.0) ++dropped;
    else EXPECT_DOUBLE_EQ(yv[sz(i)], xv[sz(i)] / 0.75) << "element " << i;
  }
  EXPECT_NEAR(static_cast<double>(dropped) / n, 0.25, 0.01);  // 5 sigma of a binomial share is 0.005
  const Tensor dy = t.random(DType::f64, {n}, 0.5, 1.5), dx = t.random(DType::f64, {n});
  const std::vector<double> before = read_host(dx), dyv = read_host(dy);
  t.k().dropout_backward(d, dy, dx, counter, /*accumulate=*/true);
  const std::vector<double> dxv = read_host(dx);
  for (std::int64_t i = 0; i < n; ++i) {
    const double want = yv[sz(i)] == 0.0 ? 0.0 : dyv[sz(i)] / 0.75;
    ASSERT_NEAR(dxv[sz(i)] - before[sz(i)], want, 1e-12) << "element " << i;
  }
  // Another step's counter or another op's seed draws another mask: about p^2 of the elements
  // are dropped by both.
  for (const auto& [seed, step] : {std::pair<std::uint64_t, double>{12345, 8}, {54321, 7}}) {
    const Tensor other = t.zeros(DType::f64, {n});
    t.k().dropout_forward({.probability = 0.25, .seed = seed}, x, other, t.ints({1}, {step}));
    std::int64_t both = 0;
    const std::vector<double> ov = read_host(other);
    for (std::int64_t i = 0; i < n; ++i) both += (ov[sz(i)] == 0.0 && yv[sz(i)] == 0.0) ? 1 : 0;
    EXPECT_NEAR(static_cast<double>(both) / n, 0.0625, 0.005) << "seed " << seed << ", counter " << step;
  }
  const Tensor none = t.zeros(DType::f64, {n});
  t.k().dropout_forward({.probability = 0.0, .seed = 1}, x, none, counter);
  EXPECT_EQ(read_host(none), xv) << "probability 0 keeps everything";
  EXPECT_THROW(t.k().dropout_forward({.probability = 1.0, .seed = 1}, x, none, counter), Error);
}

// In a graph: a training forward draws a new mask each step (the graph's counter), an inference
// forward is the identity.
TEST(TransformerRef, DropoutOpDrawsANewMaskEachTrainingForward) {
  Tensors t;
  GraphOptions o;
  o.dtype = DType::f64;
  o.training = false;
  GraphBuilder b(o);
  const Value x = b.input("x", Shape{64, 64});
  const Value y = b.add1(std::make_unique<Dropout>("drop", 0.5, 3), {x});
  b.mark_output(y);
  Graph g(std::move(b));
  g.bind(t.k());
  const std::vector<double> xv = t.draw(64 * 64, 0.5, 1.5);
  g.set_input(x, xv);
  g.forward(/*training=*/false);
  EXPECT_EQ(g.read(y), xv);
  g.forward(true);
  const std::vector<double> first = g.read(y);
  g.forward(true);
  const std::vector<double> second = g.read(y);
  EXPECT_NE(first, second) << "the same mask twice";
  std::int64_t dropped = 0;
  for (const double v : first) dropped += v == 0.0 ? 1 : 0;
  EXPECT_NEAR(static_cast<double>(dropped) / 4096, 0.5, 0.05);
}

TEST(TransformerRef, LayerNormInBf16IsTheF64ResultRoundedOnce) {
  Tensors t;
  SCOPED_TRACE("seed " + std::to_string(t.seed()));
  const Shape s{4, 16};
  const Tensor x16 = t.random(DType::bf16, s, -3, 3), g16 = t.random(DType::bf16, {16}), b16 = t.random(DType::bf16, {16});
  const Tensor x = t.make(DType::f64, s, read_host(x16)), g = t.make(DType::f64, {16}, read_host(g16));
  const Tensor b = t.make(DType::f64, {16}, read_host(b16));
  const Tensor y16 = t.zeros(DType::bf16, s), y = t.zeros(DType::f64, s);
  const Tensor m16 = t.zeros(DType::f32, {4}), r16 = t.zeros(DType::f32, {4}), m = t.zeros(DType::f32, {4}),
               r = t.zeros(DType::f32, {4});
  t.k().layernorm_forward({}, x16, g16, b16, y16, m16, r16);
  t.k().layernorm_forward({}, x, g, b, y, m, r);
  const Tensor rounded = t.make(DType::bf16, s, read_host(y));
  EXPECT_EQ(read_host(y16), read_host(rounded));
  EXPECT_EQ(read_host(m16), read_host(m));
}

// ---- GELU

TEST(TransformerRef, GeluIsTheTanhFormAndItsDerivative) {
  Tensors t;
  SCOPED_TRACE("seed " + std::to_string(t.seed()));
  const Tensor x = t.random(DType::f64, {40}, -4, 4), y = t.zeros(DType::f64, {40});
  t.k().gelu_forward(x, y);
  const std::vector<double> xv = read_host(x), yv = read_host(y);
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const double u = std::sqrt(2 / M_PI) * (xv[i] + 0.044715 * std::pow(xv[i], 3));
    EXPECT_NEAR(yv[i], 0.5 * xv[i] * (1 + std::tanh(u)), 1e-15);
    EXPECT_NEAR(yv[i], 0.5 * xv[i] * std::erfc(-xv[i] / std::sqrt(2.0)), 2e-3);  // the exact GELU it approximates
  }
  const std::vector<double> r = t.draw(40, -1, 1);
  const Tensor dy = t.make(DType::f64, {40}, r), dx = t.zeros(DType::f64, {40});
  t.k().gelu_backward(x, dy, dx, false);
  expect_gradient(x, read_host(dx), [&] {
    t.k().gelu_forward(x, y);
    return dot(read_host(y), r);
  }, "dgelu");
}

TEST(TransformerRef, BackwardDataThroughTheGeluSumsTheBiasGradientByDefault) {
  // The contract's default (RefKernels keeps it): linear_backward_data, gelu_backward, then the
  // column sums of dx (RefKernels' column_sums) into dbias.
  Tensors t;
  SCOPED_TRACE("seed " + std::to_string(t.seed()));
  const std::int64_t n = 5, out = 3, in = 4;
  const Tensor dy = t.random(DType::f64, {n, out}), w = t.random(DType::f64, {out, in});
  const Tensor pre = t.random(DType::f64, {n, in}, -3, 3);
  const Tensor dx = t.random(DType::f64, {n, in}), db = t.random(DType::f64, {in});
  const Tensor want_dx = t.zeros(DType::f64, {n, in});
  t.k().linear_backward_data_gelu(dy, w, pre, dx, db);
  t.k().linear_backward_data(dy, w, want_dx, false);
  t.k().gelu_backward(pre, want_dx, want_dx, false);
  const std::vector<double> got_dx = read_host(dx), wanted = read_host(want_dx), got_db = read_host(db);
  EXPECT_EQ(got_dx, wanted) << "dx differs from linear_backward_data then gelu_backward";
  for (std::int64_t c = 0; c < in; ++c) {
    double sum = 0.0;
    for (std::int64_t r = 0; r < n; ++r) sum += wanted[sz(r * in + c)];
    EXPECT_NEAR(got_db[sz(c)], sum, 1e-14) << "dbias[" << c << "]";
  }
  // Undefined dbias: dx alone.
  const Tensor dx2 = t.random(DType::f64, {n, in});
  t.k().linear_backward_data_gelu(dy, w, pre, dx2, Tensor{});
  EXPECT_EQ(read_host(dx2), wanted);
}

// ---- attention

// q, k and v as GPT-2's attention reads them: [B, H, T, D] views into one [B, T, 3, H, D] buffer.
struct Qkv {
  Tensor q, k, v;
};
Qkv qkv_views(const Tensor& buffer, std::int64_t batch, std::int64_t heads, std::int64_t seq, std::int64_t dim) {
  const std::int64_t width = heads * dim;
  Tensor view = Tensor::describe(buffer.dtype, {batch, heads, seq, dim});
  view.strides = {seq * 3 * width, dim, 3 * width, 1};
  const auto at = [&](std::int64_t part) {
    return view.with_data(static_cast<char*>(buffer.data) + part * width * static_cast<std::int64_t>(size_bytes(buffer.dtype)));
  };
  return {at(0), at(1), at(2)};
}

// softmax(q k^T / sqrt(D) + mask) v, straight from the definition.
std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, std::int64_t bh, std::int64_t seq, std::int64_t dim,
                                    const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& visible) {
  std::vector<double> o(q.size(), 0.0);
  for (std::int64_t n = 0; n < bh; ++n)
    for (std::int64_t i = 0; i < seq; ++i) {
      std::vector<double> w(sz(seq), 0.0);
      double total = 0.0;
      for (std::int64_t j = 0; j < seq; ++j) {
        if (!visible(n, i, j)) continue;
        double s = 0.0;
        for (std::int64_t c = 0; c < dim; ++c) s += q[sz((n * seq + i) * dim + c)] * k[sz((n * seq + j) * dim + c)];
        total += w[sz(j)] = std::exp(s / std::sqrt(static_cast<double>(dim)));
      }
      for (std::int64_t j = 0; j < seq; ++j)
        for (std::int64_t c = 0; c < dim; ++c)
          o[sz((n * seq + i) * dim + c)] += w[sz(j)] / total * v[sz((n * seq + j) * dim + c)];
    }
  return o;
}

TEST(TransformerRef, AttentionMatchesTheDefinitionAndFiniteDifferencesInEveryMask) {
  const std::int64_t batch = 2, heads = 2, seq = 5, dim = 4;
  for (const bool causal : {false, true})
    for (const bool padded : {false, true}) {
      Tensors t;
      SCOPED_TRACE("causal " + std::to_string(causal) + " padded " + std::to_string(padded) + " seed " +
                   std::to_string(t.seed()));
      const Tensor buffer = t.random(DType::f64, {batch, seq, 3 * heads * dim}, -1.5, 1.5);
      const Qkv in = qkv_views(buffer, batch, heads, seq, dim);
      const Tensor lengths = t.ints({batch}, {3, 5});
      const AttentionDesc d{.causal = causal, .key_lengths = padded ? lengths : Tensor{}};
      const Tensor o = t.zeros(DType::f64, {batch, heads, seq, dim}), stats = t.zeros(DType::f64, {batch, heads, seq});
      t.k().attention_forward(d, in.q, in.k, in.v, o, stats);
      const auto visible = [&](std::int64_t n, std::int64_t i, std::int64_t j) {
        return (!causal || j <= i) && (!padded || j < (n / heads == 0 ? 3 : 5));
      };
      const std::vector<double> expected =
          naive_attention(read_host(in.q), read_host(in.k), read_host(in.v), batch * heads, seq, dim, visible);
      const std::vector<double> got = read_host(o);
      for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-13) << i;

      const std::vector<double> r = t.draw(batch * heads * seq * dim, -1, 1);
      const Tensor dout = t.make(DType::f64, {batch, heads, seq, dim}, r);
      const Tensor dbuffer = t.zeros(DType::f64, {batch, seq, 3 * heads * dim});
      const Qkv grad = qkv_views(dbuffer, batch, heads, seq, dim);
      t.k().attention_backward(d, in.q, in.k, in.v, o, dout, stats, grad.q, grad.k, grad.v);
      const auto loss = [&] {
        t.k().attention_forward(d, in.q, in.k, in.v, o, stats);
        return dot(read_host(o), r);
      };
      expect_gradient(in.q, read_host(grad.q), loss, "dq");
      expect_gradient(in.k, read_host(grad.k), loss, "dk");
      expect_gradient(in.v, read_host(grad.v), loss, "dv");
    }
}

TEST(TransformerRef, AttentionStatsAreTheRowsLogSumExp) {
  Tensors t;
  SCOPED_TRACE("seed " + std::to_string(t.seed()));
  const Tensor q = t.random(DType::f64, {1, 1, 3, 2}), k = t.random(DType::f64, {1, 1, 3, 2});
  const Tensor v = t.random(DType::f64, {1, 1, 3, 2}), o = t.zeros(DType::f64, {1, 1, 3, 2});
  const Tensor stats = t.zeros(DType::f32, {1, 1, 3});
  t.k().attention_forward({.causal = true}, q, k, v, o, stats);
  const std::vector<double> qv = read_host(q), kv = read_host(k), lse = read_host(stats);
  for (std::int64_t i = 0; i < 3; ++i) {
    double sum = 0.0;
    for (std::int64_t j = 0; j <= i; ++j)
      sum += std::exp((qv[sz(2 * i)] * kv[sz(2 * j)] + qv[sz(2 * i + 1)] * kv[sz(2 * j + 1)]) / std::sqrt(2.0));
    EXPECT_NEAR(lse[sz(i)], std::log(sum), 1e-6);  // stored in f32
  }
}

TEST(TransformerRef, AttentionRefusesShapesAndMasksItCannotTake) {
  Tensors t;
  const Tensor q = t.random(DType::f64, {2, 1, 3, 2}), k4 = t.random(DType::f64, {2, 1, 4, 2});
  const Tensor o = t.zeros(DType::f64, {2, 1, 3, 2}), stats = t.zeros(DType::f32, {2, 1, 3});
  const std::string causal = test::error_message<Error>([&] { t.k().attention_forward({.causal = true}, q, k4, k4, o, stats); });
  EXPECT_NE(causal.find("as many queries as keys"), std::string::npos) << causal;
  const Tensor zero_length = t.ints({2}, {0, 3});
  const std::string pad = test::error_message<Error>(
      [&] { t.k().attention_forward({.key_lengths = zero_length}, q, q, q, o, stats); });
  EXPECT_NE(pad.find("key length 0"), std::string::npos) << pad;
  const Tensor wrong = t.zeros(DType::f64, {2, 1, 3, 3});
  EXPECT_THROW(t.k().attention_forward({}, q, q, wrong, o, stats), Error);
}

// ---- embedding

TEST(TransformerRef, EmbeddingAddsTokenAndPositionRowsAndScattersGradients) {
  Tensors t;
  SCOPED_TRACE("seed " + std::to_string(t.seed()));
  const std::int64_t vocab = 5, positions = 4, channels = 3;
  const Tensor tokens = t.ints({2, 3}, {1, 4, 1, 0, 1, 3});  // token 1 three times
  const Tensor wte = t.random(DType::f64, {vocab, channels}), wpe = t.random(DType::f64, {positions, channels});
  const Tensor y = t.zeros(DType::f64, {6, channels});
  t.k().embedding_forward(tokens, wte, wpe, y);
  const std::vector<double> te = read_host(wte), pe = read_host(wpe), yv = read_host(y);
  const std::vector<int> ids{1, 4, 1, 0, 1, 3};
  for (std::int64_t r = 0; r < 6; ++r)
    for (std::int64_t c = 0; c < channels; ++c)
      EXPECT_EQ(yv[sz(r * channels + c)], te[sz(ids[sz(r)] * channels + c)] + pe[sz((r % 3) * channels + c)]);

  const std::vector<double> r = t.draw(6 * channels, -1, 1);
  const Tensor dy = t.make(DType::f64, {6, channels}, r);
  const Tensor dwte = t.random(DType::f64, {vocab, channels}), dwpe = t.random(DType::f64, {positions, channels});
  const std::vector<double> before = read_host(dwte);
  t.k().embedding_backward(tokens, dy, dwte, /*accumulate_wte=*/true, dwpe);  // tied: adds to the classifier's
  std::vector<double> added = read_host(dwte);
  for (std::size_t i = 0; i < added.size(); ++i) added[i] -= before[i];
  const auto loss = [&] {
    t.k().embedding_forward(tokens, wte, wpe, y);
    return dot(read_host(y), r);
  };
  expect_gradient(wte, added, loss, "dwte");
  expect_gradient(wpe, read_host(dwpe), loss, "dwpe");  // position 3 is unused: its gradient is 0
}

TEST(TransformerRef, EmbeddingRefusesTokensOutsideTheVocabularyAndLongSequences) {
  Tensors t;
  const Tensor wte = t.random(DType::f64, {5, 2}), wpe = t.random(DType::f64, {3, 2});
  const Tensor bad = t.ints({1, 2}, {2, 5}), y2 = t.zeros(DType::f64, {2, 2});
  const std::string v = test::error_message<Error>([&] { t.k().embedding_forward(bad, wte, wpe, y2); });
  EXPECT_NE(v.find("token 5 at [0, 1] outside the vocabulary [0, 5)"), std::string::npos) << v;
  const Tensor long_seq = t.ints({1, 4}, {0, 1, 2, 3}), y4 = t.zeros(DType::f64, {4, 2});
  const std::string p = test::error_message<Error>([&] { t.k().embedding_forward(long_seq, wte, wpe, y4); });
  EXPECT_NE(p.find("4 tokens is longer than the model's 3 positions"), std::string::npos) << p;
}

// ---- the global norm and AdamW

TEST(TransformerRef, SumSquaresCoversEveryTensor) {
  Tensors t;
  const Tensor a = t.make(DType::f32, {3}, {1, -2, 3}), b = t.make(DType::bf16, {2}, {0.5, -4});
  const Tensor out = t.zeros(DType::f32, {1});
  t.k().sum_squares({a, b}, out);
  EXPECT_EQ(read_host(out)[0], 1 + 4 + 9 + 0.25 + 16);
}

TEST(TransformerRef, AdamWFollowsTheUpdateRuleWithBiasCorrectionClippingAndSkips) {
  Tensors t;
  SCOPED_TRACE("seed " + std::to_string(t.seed()));
  const std::vector<double> w0 = t.draw(4, -1, 1), g1 = t.draw(4, -1, 1), g2 = t.draw(4, -1, 1);
  const Tensor w = t.make(DType::f64, {4}, w0), g = t.make(DType::f64, {4}, g1);
  const Tensor m = t.zeros(DType::f64, {4}), v = t.zeros(DType::f64, {4});
  AdamWStep s{.learning_rate = 0.01, .beta1 = 0.9, .beta2 = 0.95, .epsilon = 1e-8, .weight_decay = 0.1};
  t.k().adamw_update(s, w, g, m, v);
  write_host(g, g2);
  s.step = 2;
  t.k().adamw_update(s, w, g, m, v);
  const std::vector<double> got = read_host(w);
  for (std::size_t i = 0; i < 4; ++i) {
    double wi = w0[i], mi = 0, vi = 0;
    for (int step = 1; step <= 2; ++step) {
      const double gi = step == 1 ? g1[i] : g2[i];
      mi = 0.9 * mi + 0.1 * gi;
      vi = 0.95 * vi + 0.05 * gi * gi;
      const double mhat = mi / (1 - std::pow(0.9, step)), vhat = vi / (1 - std::pow(0.95, step));
      wi -= 0.01 * (mhat / (std::sqrt(vhat) + 1e-8) + 0.1 * wi);
    }
    EXPECT_NEAR(got[i], wi, 1e-15) << i;
  }
  // Clipping scales the gradient by max_norm / |g| before the moments see it.
  const Tensor m2 = t.zeros(DType::f64, {4}), v2 = t.zeros(DType::f64, {4}), norm2 = t.zeros(DType::f32, {1});
  t.k().sum_squares({g}, norm2);
  t.k().adamw_update({.max_grad_norm = 0.5, .grad_norm_squared = norm2}, w, g, m2, v2);
  const double norm = std::sqrt(read_host(norm2)[0]);
  ASSERT_GT(norm, 0.5);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(read_host(m2)[i], 0.1 * g2[i] * 0.5 / norm, 1e-12) << i;
  // A skipped step (fp16 loss scaling found a non-finite gradient) changes nothing.
  const Tensor skip = t.ints({1}, {1});
  const std::vector<double> kept = read_host(w);
  t.k().adamw_update({.skip_if = skip}, w, g, m2, v2);
  EXPECT_EQ(read_host(w), kept);
  EXPECT_THROW(t.k().adamw_update({.step = 0}, w, g, m2, v2), Error);
}

TEST(TransformerRef, AdamWReadsTheDeviceStepCountAtEveryReplayOfACapturedStep) {
  Tensors t;
  SCOPED_TRACE("seed " + std::to_string(t.seed()));
  const std::int64_t n = 6;
  const std::vector<double> w0 = t.draw(n, -1, 1), g0 = t.draw(n, -1, 1);
  const Tensor w = t.make(DType::f64, {n}, w0), g = t.make(DType::f64, {n}, g0);
  const Tensor m = t.zeros(DType::f64, {n}), v = t.zeros(DType::f64, {n});
  const Tensor counter = t.ints({1}, {1}), no_skip = t.ints({1}, {0});
  const AdamWStep s{
      .learning_rate = 0.02, .beta1 = 0.8, .beta2 = 0.9, .weight_decay = 0.05, .step = 7, .step_count = counter};
  auto replay = t.k().capture([&] {
    t.k().adamw_update(s, w, g, m, v);
    t.k().count_step(counter, no_skip);
  });
  EXPECT_EQ(read_host(counter)[0], 1) << "capture ran count_step";
  EXPECT_EQ(read_host(w), w0) << "capture ran adamw_update";
  replay->replay();
  replay->replay();
  EXPECT_EQ(read_host(counter)[0], 3);
  // Two plain steps numbered 1 and 2 (not s.step = 7: step_count wins).
  const Tensor w2 = t.make(DType::f64, {n}, w0), m2 = t.zeros(DType::f64, {n}), v2 = t.zeros(DType::f64, {n});
  AdamWStep plain = s;
  plain.step_count = Tensor{};
  for (plain.step = 1; plain.step <= 2; ++plain.step) t.k().adamw_update(plain, w2, g, m2, v2);
  EXPECT_EQ(read_host(w), read_host(w2));
  EXPECT_EQ(read_host(m), read_host(m2));
  EXPECT_EQ(read_host(v), read_host(v2));
  // A skipped step leaves the counter; a counter at 0 is refused as step 0 is.
  const Tensor skip = t.ints({1}, {1});
  t.k().count_step(counter, skip);
  EXPECT_EQ(read_host(counter)[0], 3);
  const Tensor zero = t.ints({1}, {0});
  EXPECT_THROW(t.k().adamw_update({.step_count = zero}, w, g, m, v), Error);
  EXPECT_THROW(t.k().count_step(t.zeros(DType::f32, {1}), Tensor{}), Error);
}

// ---- the classifier's fused cross-entropy

// A [rows, cols] view into random [rows, stride] storage: rows padded as a 50257-token vocabulary's
// logits are, 50304 wide.
Tensor padded_rows(Tensors& t, DType d, std::int64_t rows, std::int64_t cols, std::int64_t stride, double lo,
                   double hi) {
  Tensor full = t.random(d, {rows, stride}, lo, hi);
  full.shape = Shape{rows, cols};
  return full;
}

TEST(TransformerRef, FusedCrossEntropyIsTheMeanOverScoredRowsAndItsGradientInPlace) {
  Tensors t;
  SCOPED_TRACE("seed " + std::to_string(t.seed()));
  const std::int64_t rows = 5, vocab = 7, stride = 9;
  const Tensor logits = padded_rows(t, DType::f64, rows, vocab, stride, -3, 3);
  const std::vector<double> labels_v = {3, -1, 0, 6, 2};
  const Tensor labels = t.ints({rows}, labels_v);
  const Tensor loss = t.zeros(DType::f32, {1}), loss64 = t.zeros(DType::f64, {1});
  const Tensor seed = t.make(DType::f32, {1}, {0.75});
  const Tensor dlogits = padded_rows(t, DType::f64, rows, vocab, stride, -1, 1);
  t.k().cross_entropy_fused(logits, labels, loss64, dlogits, seed);
  const std::vector<double> x = read_host(logits);
  double want = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (labels_v[sz(r)] < 0) continue;
    double sum = 0;
    for (std::int64_t c = 0; c < vocab; ++c) sum += std::exp(x[sz(r * vocab + c)]);
    want += std::log(sum) - x[sz(r * vocab + std::int64_t(labels_v[sz(r)]))];
  }
  EXPECT_NEAR(read_host(loss64)[0], want / 4, 1e-13);
  // dlogits = seed * d(loss)/d(logits), the unscored row's zero.
  const auto loss_of = [&] {
    t.k().cross_entropy_fused(logits, labels, loss64, Tensor{}, Tensor{});
    return read_host(loss64)[0] * 0.75;
  };
  const std::vector<double> grad = read_host(dlogits);
  for (std::int64_t c = 0; c < vocab; ++c) EXPECT_EQ(grad[sz(vocab + c)], 0.0) << "unscored row, column " << c;
  expect_gradient(logits, grad, loss_of, "dlogits");
  // In place (dlogits = logits), in f32 loss: the same values; the padding columns untouched.
  std::vector<double> storage_before(sz(rows * stride));
  const Tensor whole = Tensor::describe(DType::f64, {rows, stride}).with_data(logits.data);
  storage_before = read_host(whole);
  t.k().cross_entropy_fused(logits, labels, loss, logits, seed);
  EXPECT_NEAR(read_host(loss)[0], want / 4, 1e-6);
  const std::vector<double> in_place = read_host(logits), storage_after = read_host(whole);
  for (std::size_t i = 0; i < grad.size(); ++i) EXPECT_EQ(in_place[i], grad[i]) << i;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = vocab; c < stride; ++c)
      EXPECT_EQ(storage_after[sz(r * stride + c)], storage_before[sz(r * stride + c)]) << "padding " << r << ", " << c;
}

TEST(TransformerRef, FusedCrossEntropyWithNoScoredRowIsZeroAndBadLabelsAreRefused) {
  Tensors t;
  const Tensor logits = t.random(DType::bf16, {3, 4}, -2, 2), dlogits = t.random(DType::f32, {3, 4});
  const Tensor loss = t.random(DType::f32, {1});
  t.k().cross_entropy_fused(logits, t.ints({3}, {-1, -1, -1}), loss, dlogits, Tensor{});
  EXPECT_EQ(read_host(loss)[0], 0.0);
  EXPECT_EQ(read_host(dlogits), std::vector<double>(12, 0.0));
  EXPECT_THROW(t.k().cross_entropy_fused(logits, t.ints({3}, {0, 4, 1}), loss, dlogits, Tensor{}), Error);
  EXPECT_THROW(t.k().cross_entropy_fused(logits, t.ints({3}, {0, -2, 1}), loss, dlogits, Tensor{}), Error);
  EXPECT_THROW(t.k().cross_entropy_fused(logits, t.ints({2}, {0, 1}), loss, dlogits, Tensor{}), Error);
}

TEST(TransformerRef, BackendsWithoutTheKernelsRefuseByName) {
  // The Kernels contract's defaults (called past RefKernels' overrides): Unsupported, naming the
  // backend and the kernel, so a model that needs them is skipped with that reason.
  Tensors t;
  const Tensor x = t.random(DType::f32, {4}), y = t.zeros(DType::f32, {4});
  Kernels& k = t.k();
  try {
    k.Kernels::gelu_forward(x, y);
    ADD_FAILURE() << "the default gelu_forward ran";
  } catch (const Unsupported& e) {
    EXPECT_STREQ(e.what(), "ref kernels have no gelu_forward (transformer ops)");
  }
  EXPECT_THROW(k.Kernels::attention_forward({}, x, x, x, y, y), Unsupported);
  EXPECT_THROW(k.Kernels::column_sums(t.random(DType::f32, {2, 2}), y), Unsupported);
  EXPECT_THROW(k.Kernels::adamw_update({}, x, x, x, x), Unsupported);
}

// ---- the layers in a graph: a two-block pre-norm decoder (GPT-2's shape, 16 channels)

struct TinyDecoder {
  Value tokens, labels, loss;
};

TinyDecoder tiny_decoder(GraphBuilder& b, std::int64_t batch, std::int64_t seq, std::int64_t vocab, std::int64_t width,
                         std::int64_t heads) {
  TinyDecoder m;
  m.tokens = b.input("tokens", Shape{batch, seq}, DType::i32);
  m.labels = b.input("labels", Shape{batch * seq}, DType::i32);
  Value x = embedding(b, "emb", m.tokens, vocab, seq + 2, width);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    Value a = layernorm(b, p + "ln1", x);
    a = linear(b, p + "qkv", a, 3 * width);
    a = attention(b, p + "attn", a, heads, seq, /*causal=*/true);
    x = add(b, p + "res1", x, linear(b, p + "proj", a, width));
    Value f = layernorm(b, p + "ln2", x);
    f = gelu(b, p + "gelu", linear(b, p + "fc", f, 4 * width));
    x = add(b, p + "res2", x, linear(b, p + "fc_proj", f, width));
  }
  const Value logits = linear(b, "lm_head", layernorm(b, "ln_f", x), vocab, /*bias=*/false);
  m.loss = softmax_cross_entropy(b, "loss", logits, m.labels);
  b.set_loss(m.loss);
  return m;
}

TEST(TransformerRef, TinyDecoderGradientsMatchFiniteDifferencesThroughTheGraph) {
  const std::int64_t batch = 2, seq = 4, vocab = 11, width = 16, heads = 2;
  GraphOptions options;
  options.dtype = DType::f64;
  GraphBuilder b(options);
  const TinyDecoder m = tiny_decoder(b, batch, seq, vocab, width, heads);
  const auto k = make_ref_kernels();  // before the graph, whose memory comes from its allocator
  Graph g(std::move(b));
  g.bind(*k);
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<double> tokens, labels;
  for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(batch * seq); ++i) {
    tokens.push_back(static_cast<double>(mix64(seed, i) % vocab));
    labels.push_back(static_cast<double>(mix64(seed, 1000 + i) % vocab));
  }
  g.set_input(m.tokens, tokens);
  g.set_input(m.labels, labels);
  // GPT-2's N(0, 0.02) start is nearly flat: larger random values make every path matter.
  ParameterValues values = g.parameter_values();
  std::uint64_t counter = 0;
  for (auto& [name, v] : values)
    for (double& x : v) x = uniform(seed, 5000 + counter++, -0.5, 0.5);
  g.set_parameter_values(values);
  g.forward();
  g.backward();
  EXPECT_GT(g.forward_flops(), 0);
  int checked = 0;
  for (const Parameter& p : g.parameters()) {
    const std::vector<double> analytic = g.read(p.grad);
    std::vector<double>& v = values.at(p.name);
    for (std::size_t s = 0; s < 3; ++s) {  // three elements of every parameter
      const std::size_t i = mix64(seed, 9000 + s + 17 * static_cast<std::uint64_t>(checked)) % v.size();
      const double x0 = v[i], h = 1e-5;
      const auto loss_at = [&](double x) {
        v[i] = x;
        g.set_parameter_values(values);
        g.forward();
        return g.read(m.loss)[0];
      };
      const double numeric = (loss_at(x0 + h) - loss_at(x0 - h)) / (2 * h);
      v[i] = x0;
      EXPECT_NEAR(analytic[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << p.name << "[" << i << "]";
    }
    ++checked;
  }
  g.set_parameter_values(values);
  EXPECT_EQ(checked, 2 + 2 * 12 + 3);  // wte, wpe; 12 per block; ln_f weight and bias, lm_head
}

}  // namespace
}  // namespace ab::nn
