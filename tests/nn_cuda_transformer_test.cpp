// The CUDA engine's transformer kernels (nn/cuda/transformer_engine.h) against the reference
// kernels on the same fresh random inputs, stored in the same dtype (the reference holds f16/bf16
// exactly and sums in f64): every activation dtype, small shapes and GPT-2-like ones (C = 768,
// row counts off every block size, a 50257-token vocabulary padded to 50304), in place where the
// contract allows it, embedding and LayerNorm backward and the loss bit-identical run to run,
// AdamW over many tensors in a captured step replayed twice against two reference steps (the
// device step count advancing), skip flags honoured, refusals named. Tolerances: the output
// dtype's rounding plus the f32 arithmetic's bound.
// Skips where no GPU answers.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/cuda/kernels.h"
#include "nn/kernels.h"
#include "test_support.h"

namespace ab::nn {
namespace {

using std::int64_t;

bool has_gpu() { return backend::cuda::device_count() > 0; }

std::size_t sz(int64_t v) { return static_cast<std::size_t>(v); }

const std::vector<DType> kActivationTypes = {DType::f32, DType::bf16, DType::f16};

// Relative error of one rounding to t (an ulp at most, for results the f32 arithmetic may put on
// the other side of a rounding boundary than the f64 oracle), and f32's own unit roundoff.
double rounding(DType t) {
  switch (t) {
    case DType::bf16: return 8e-3;
    case DType::f16: return 1e-3;
    default: return 2.4e-7;
  }
}
constexpr double kF32Eps = 6e-8;

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (const double x : v) m = std::max(m, std::abs(x));
  return m;
}

// got[i] against want[i] within rel * |want[i]| + abs[i] (abs: one bound, or one per element);
// the message names how many differ, the worst one and its bound.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                  const std::vector<double>& abs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = rel * std::abs(want[i]) + abs[abs.size() == 1 ? 0 : i];
    const double err = std::abs(got[i] - want[i]);
    const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
    if (!(err <= bound)) ++bad;
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements outside the bound; worst at " << worst
                     << ": got " << got[worst] << ", reference " << want[worst] << ", bound "
                     << rel * std::abs(want[worst]) + abs[abs.size() == 1 ? 0 : worst];
}

// A tensor on the GPU and its twin on the reference, of one dtype and the same bytes. `view`
// is the logical tensor (padded rows for logits), `storage` the whole contiguous block.
struct Twin {
  Buffer dev_buf, ref_buf;
  Tensor dev, ref, dev_storage, ref_storage;
};

class CudaTransformer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_gpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
    backend_ = backend::make_backend("cuda:0");
    cuda_ = make_cuda_kernels(*backend_);
    ref_ = make_ref_kernels();
  }

 public:
  Kernels& cuda() { return *cuda_; }
  Kernels& ref() { return *ref_; }
  std::string trace() const { return "seed " + std::to_string(seed_); }

  std::vector<double> draw(int64_t n, double lo, double hi) {
    std::vector<double> v(sz(n));
    for (auto& x : v) x = uniform(seed_, counter_++, lo, hi);
    return v;
  }

  // `values` (row-major over `storage_cols` columns) stored as t on both; the logical view has
  // `cols` columns (cols < storage_cols: padded rows). cols 0: the storage shape itself.
  Twin& make(DType t, const Shape& shape, const std::vector<double>& values, int64_t cols = 0) {
    twins_.push_back(std::make_unique<Twin>());
    Twin& w = *twins_.back();
    const Tensor d = Tensor::describe(t, shape);
    w.dev_buf = Buffer(cuda_->allocator(), d.size_bytes());
    w.ref_buf = Buffer(ref_->allocator(), d.size_bytes());
    w.ref_storage = w.ref_buf.view(d);
    w.dev_storage = w.dev_buf.view(Tensor::describe(t, shape, Layout::nchw, DeviceKind::cuda));
    write_host(w.ref_storage, values);  // rounded once to t
    cuda_->upload(w.dev_storage, w.ref_storage.data);
    w.dev = w.dev_storage;
    w.ref = w.ref_storage;
    if (cols > 0) w.dev.shape = w.ref.shape = Shape{shape[0], cols};
    return w;
  }
  Twin& random(DType t, const Shape& shape, double lo = -1, double hi = 1, int64_t cols = 0) {
    return make(t, shape, draw(shape.numel(), lo, hi), cols);
  }
  Twin& ints(const Shape& shape, const std::vector<double>& v) { return make(DType::i32, shape, v); }

  // The GPU tensor's values (its logical view), and the reference twin's.
  std::vector<double> got(const Twin& w) {
    std::vector<unsigned char> bytes(sz(w.dev_storage.size_bytes()));
    cuda_->download(w.dev_storage, bytes.data());
    Tensor host = w.ref;
    host.data = bytes.data();
    return read_host(host);
  }
  std::vector<double> got_storage(const Twin& w) {
    std::vector<unsigned char> bytes(sz(w.dev_storage.size_bytes()));
    cuda_->download(w.dev_storage, bytes.data());
    return read_host(w.ref_storage.with_data(bytes.data()));
  }
  std::vector<unsigned char> bytes(const Twin& w) {
    std::vector<unsigned char> b(sz(w.dev_storage.size_bytes()));
    cuda_->download(w.dev_storage, b.data());
    return b;
  }
  static std::vector<double> want(const Twin& w) { return read_host(w.ref); }
  // The GPU twin set to the reference's values (so the next kernel starts both from one input).
  void sync(const Twin& w) { cuda_->upload(w.dev_storage, w.ref_storage.data); }

 private:
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<Kernels> cuda_, ref_;
  std::uint64_t seed_ = test::seed(), counter_ = 0;
  std::vector<std::unique_ptr<Twin>> twins_;  // destroyed before the kernels (declared after them)
};

// ---- embedding

// Token ids with a skewed distribution: about a third from five frequent ids (runs far longer
// than a 32-row segment), the rest uniform over the vocabulary.
std::vector<double> skewed_tokens(int64_t n, int64_t vocab, const std::vector<double>& u) {
  std::vector<double> ids(sz(n));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const double r = u[2 * i], s = u[2 * i + 1];
    ids[i] = r < 0.35 ? std::floor(s * static_cast<double>(std::min<int64_t>(5, vocab)))
                      : std::floor(s * static_cast<double>(vocab));
  }
  return ids;
}

struct EmbeddingShape {
  int64_t batch, seq, channels, vocab, positions;
};

void check_embedding(CudaTransformer& t, DType act, DType grad_t, const EmbeddingShape& e, bool accumulate) {
  SCOPED_TRACE(std::string(to_string(act)) + " dy, " + std::string(to_string(grad_t)) + " gradients, C " +
               std::to_string(e.channels) + ", V " + std::to_string(e.vocab) + (accumulate ? ", accumulate" : ""));
  const int64_t rows = e.batch * e.seq;
  auto& tokens = t.ints({e.batch, e.seq}, skewed_tokens(rows, e.vocab, t.draw(2 * rows, 0, 0.999999)));
  auto& wte = t.random(act, {e.vocab, e.channels});
  auto& wpe = t.random(act, {e.positions, e.channels});
  auto& y = t.random(act, {rows, e.channels});
  t.cuda().embedding_forward(tokens.dev, wte.dev, wpe.dev, y.dev);
  t.ref().embedding_forward(tokens.ref, wte.ref, wpe.ref, y.ref);
  expect_close(t.got(y), CudaTransformer::want(y), rounding(act), {0.0}, "y");

  auto& dy = t.random(act, {rows, e.channels});
  auto& dwte = t.random(grad_t, {e.vocab, e.channels});
  auto& dwpe = t.random(grad_t, {e.positions, e.channels});
  // The f32 sums' bound: k terms (the most rows of one token, plus the old value) times the sum of
  // their magnitudes, which the reference gives from |dy| and |old|.
  std::vector<double> dy_abs = CudaTransformer::want(dy), old_abs = CudaTransformer::want(dwte);
  for (auto& v : dy_abs) v = std::abs(v);
  for (auto& v : old_abs) v = std::abs(v);
  auto& dy_mag = t.make(DType::f64, {rows, e.channels}, dy_abs);
  auto& wte_mag = t.make(DType::f64, {e.vocab, e.channels}, old_abs);
  auto& wpe_mag = t.make(DType::f64, {e.positions, e.channels}, std::vector<double>(sz(e.positions * e.channels)));
  t.ref().embedding_backward(tokens.ref, dy_mag.ref, wte_mag.ref, accumulate, wpe_mag.ref);
  const std::vector<double> ids = CudaTransformer::want(tokens);
  std::vector<int64_t> count(sz(e.vocab));
  for (const double id : ids) ++count[sz(static_cast<int64_t>(id))];
  const double terms = static_cast<double>(*std::max_element(count.begin(), count.end()) + 1);
  std::vector<double> wte_bound = CudaTransformer::want(wte_mag), wpe_bound = CudaTransformer::want(wpe_mag);
  for (auto& b : wte_bound) b *= terms * kF32Eps;
  for (auto& b : wpe_bound) b *= static_cast<double>(e.batch + 1) * kF32Eps;

  t.cuda().embedding_backward(tokens.dev, dy.dev, dwte.dev, accumulate, dwpe.dev);
  const std::vector<unsigned char> first = t.bytes(dwte), first_pe = t.bytes(dwpe);
  t.ref().embedding_backward(tokens.ref, dy.ref, dwte.ref, accumulate, dwpe.ref);
  expect_close(t.got(dwte), CudaTransformer::want(dwte), rounding(grad_t), wte_bound, "dwte");
  expect_close(t.got(dwpe), CudaTransformer::want(dwpe), rounding(grad_t), wpe_bound, "dwpe");
  if (!accumulate) {  // a second run over the same operands: the same bits
    t.cuda().embedding_backward(tokens.dev, dy.dev, dwte.dev, false, dwpe.dev);
    EXPECT_TRUE(t.bytes(dwte) == first) << "dwte differs between two runs";
    EXPECT_TRUE(t.bytes(dwpe) == first_pe) << "dwpe differs between two runs";
  }
}

TEST_F(CudaTransformer, EmbeddingMatchesTheReferenceAndItsBackwardIsDeterministic) {
  SCOPED_TRACE(trace());
  // Small: a vocabulary of 37 over 1000 rows (every token in long runs) at C 40 (vector loads),
  // and C 13 (element by element).
  for (const DType act : kActivationTypes) {
    check_embedding(*this, act, DType::f32, {4, 250, 40, 37, 300}, false);
    check_embedding(*this, act, act, {3, 7, 13, 11, 9}, true);
  }
  // GPT-2-like: C 768, bf16 activations and f32 gradients, 1024 positions; the padded vocabulary
  // where the tied embedding accumulates onto the classifier's dwte, a smaller one written.
  check_embedding(*this, DType::bf16, DType::f32, {4, 1024, 768, 50304, 1024}, true);
  check_embedding(*this, DType::bf16, DType::f32, {3, 1000, 768, 5000, 1024}, false);
}

// ---- LayerNorm

// LayerNorm, or (rms) RMSNorm: no mean, no beta.
void check_layernorm(CudaTransformer& t, DType act, DType param_t, int64_t rows, int64_t channels, bool accumulate,
                     bool rms = false) {
  SCOPED_TRACE(std::string(rms ? "RMSNorm, " : "LayerNorm, ") + std::string(to_string(act)) + " x, " +
               std::string(to_string(param_t)) + " parameters, " + std::to_string(rows) + " x " +
               std::to_string(channels));
  auto& x = t.random(act, {rows, channels}, -2, 3);
  auto& gamma = t.random(param_t, {channels}, 0.5, 1.5);
  auto& beta = t.random(param_t, {channels}, -0.5, 0.5);
  auto& y = t.random(act, {rows, channels});
  auto& mean = t.random(DType::f32, {rows});
  auto& rstd = t.random(DType::f32, {rows});
  const LayerNormDesc d{.epsilon = 1e-5};
  if (rms) {
    t.cuda().rmsnorm_forward(d, x.dev, gamma.dev, y.dev, rstd.dev);
    t.ref().rmsnorm_forward(d, x.ref, gamma.ref, y.ref, rstd.ref);
  } else {
    t.cuda().layernorm_forward(d, x.dev, gamma.dev, beta.dev, y.dev, mean.dev, rstd.dev);
    t.ref().layernorm_forward(d, x.ref, gamma.ref, beta.ref, y.ref, mean.ref, rstd.ref);
  }
  const double x_max = max_abs(CudaTransformer::want(x));
  // f32 sums of C terms (a lane's share, then the warp's butterfly): (C / 32 + 5) roundings.
  const double sum_err = (static_cast<double>(channels) / 32 + 5) * kF32Eps;
  if (!rms) expect_close(t.got(mean), CudaTransformer::want(mean), 0, {sum_err * x_max}, "mean");
  expect_close(t.got(rstd), CudaTransformer::want(rstd), 4 * sum_err + 4 * kF32Eps, {0.0}, "rstd");
  const double y_max = max_abs(CudaTransformer::want(y));
  expect_close(t.got(y), CudaTransformer::want(y), rounding(act), {20 * sum_err * y_max}, "y");

  t.sync(mean);  // backward from the same statistics on both
  t.sync(rstd);
  auto& dy = t.random(act, {rows, channels});
  auto& dx = t.random(act, {rows, channels});
  auto& dgamma = t.random(param_t, {channels});
  auto& dbeta = t.random(param_t, {channels});
  const auto backward = [&](bool acc) {
    if (rms) t.cuda().rmsnorm_backward(x.dev, dy.dev, gamma.dev, rstd.dev, dx.dev, acc, dgamma.dev);
    else t.cuda().layernorm_backward(x.dev, dy.dev, gamma.dev, mean.dev, rstd.dev, dx.dev, acc, dgamma.dev, dbeta.dev);
  };
  backward(accumulate);
  if (rms) t.ref().rmsnorm_backward(x.ref, dy.ref, gamma.ref, rstd.ref, dx.ref, accumulate, dgamma.ref);
  else
    t.ref().layernorm_backward(x.ref, dy.ref, gamma.ref, mean.ref, rstd.ref, dx.ref, accumulate, dgamma.ref, dbeta.ref);
  const double dx_max = max_abs(CudaTransformer::want(dx));
  expect_close(t.got(dx), CudaTransformer::want(dx), rounding(act), {40 * sum_err * dx_max}, "dx");
  // dgamma, dbeta: f32 sums over every row (lanes, warps, blocks, the second stage) bounded by the
  // sum of the terms' magnitudes, which the host computes from the reference's statistics.
  const std::vector<double> xv = CudaTransformer::want(x), dyv = CudaTransformer::want(dy);
  const std::vector<double> mv = CudaTransformer::want(mean), rv = CudaTransformer::want(rstd);
  std::vector<double> gamma_mag(sz(channels)), beta_mag(sz(channels));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < channels; ++c) {
      const double g = dyv[sz(r * channels + c)];
      const double xhat = (xv[sz(r * channels + c)] - (rms ? 0.0 : mv[sz(r)])) * rv[sz(r)];
      gamma_mag[sz(c)] += std::abs(g * xhat);
      beta_mag[sz(c)] += std::abs(g);
    }
  const double reduction_terms = static_cast<double>(rows) / 256 + 8 + 64;
  for (auto& b : gamma_mag) b *= reduction_terms * kF32Eps;
  for (auto& b : beta_mag) b *= reduction_terms * kF32Eps;
  expect_close(t.got(dgamma), CudaTransformer::want(dgamma), rounding(param_t), gamma_mag, "dgamma");
  if (!rms) expect_close(t.got(dbeta), CudaTransformer::want(dbeta), rounding(param_t), beta_mag, "dbeta");
  if (accumulate) return;
  // Fixed-order sums: a second run gives the same bits.
  const std::vector<double> dx_first = t.got(dx), dgamma_first = t.got(dgamma), dbeta_first = t.got(dbeta);
  backward(false);
  EXPECT_TRUE(t.got(dx) == dx_first) << "dx differs between two runs";
  EXPECT_TRUE(t.got(dgamma) == dgamma_first) << "dgamma differs between two runs";
  EXPECT_TRUE(t.got(dbeta) == dbeta_first) << "dbeta differs between two runs";
}

TEST_F(CudaTransformer, LayerNormMatchesTheReferenceBothWays) {
  SCOPED_TRACE(trace());
  for (const DType act : kActivationTypes) {
    check_layernorm(*this, act, DType::f32, 5, 20, false);     // C off the vector width: scalar loads
    check_layernorm(*this, act, act, 9, 64, true);             // 16-bit parameters; dx accumulates
    check_layernorm(*this, act, DType::f32, 4099, 768, true);  // GPT-2's C, rows off the 8-row block
    check_layernorm(*this, act, DType::f32, 333, 320, false);  // a lane's last chunk partly past C
    check_layernorm(*this, act, DType::f32, 1001, 96, false);  // ConvNeXt's C: rows in registers, 4-lane groups
    check_layernorm(*this, act, act, 203, 1536, false);        // fp32 past the register kernel: a warp per row
  }
  check_layernorm(*this, DType::bf16, DType::f32, 1027, 1024, false);  // BERT-large's C
}

TEST_F(CudaTransformer, RmsNormMatchesTheReferenceBothWays) {
  SCOPED_TRACE(trace());
  for (const DType act : kActivationTypes) {
    check_layernorm(*this, act, DType::f32, 5, 20, false, /*rms=*/true);
    check_layernorm(*this, act, act, 9, 64, true, true);
    check_layernorm(*this, act, DType::f32, 4099, 4096, true, true);  // a Llama-7B width
  }
}

// ---- GELU

// Widening 16-bit values to f32 is exact: cast_many's one launch must give every value, in tensors
// of sizes off the vector width, beside a pair it hands to the plain cast (f32 -> bf16).
// cast_many's operands: for each source dtype, tensors of sizes off the vector width, each with an
// f32 destination drawn from [-dst_bound, dst_bound).
struct CastPairs {
  std::vector<Tensor> srcs, dsts;
  std::vector<Twin*> from, to;
  void add(Twin& src, Twin& dst) {
    from.push_back(&src);
    to.push_back(&dst);
    srcs.push_back(src.dev);
    dsts.push_back(dst.dev);
  }
};

CastPairs cast_pairs(CudaTransformer& t, const std::vector<DType>& source_types, double dst_bound) {
  CastPairs p;
  for (const DType type : source_types)
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{8195}, int64_t{(1 << 20) + 3}})
      p.add(t.random(type, {n}, -3, 3), t.random(DType::f32, {n}, -dst_bound, dst_bound));
  return p;
}

TEST_F(CudaTransformer, CastManyWidensEveryTensorExactly) {
  SCOPED_TRACE(trace());
  CastPairs p = cast_pairs(*this, {DType::bf16, DType::f16, DType::bf16}, 1);
  p.add(random(DType::f32, {1001}), random(DType::bf16, {1001}));
  const auto& [srcs, dsts, from, to] = p;
  cuda().cast_many(srcs, dsts);
  for (std::size_t i = 0; i < from.size(); ++i) {
    ref().cast(from[i]->ref, to[i]->ref);
    EXPECT_EQ(got(*to[i]), want(*to[i])) << "tensor " << i << " (" << from[i]->dev.to_string() << ")";
  }
}

// Gradient accumulation's cast_many: dst = scale * (dst + src) from 16-bit and f32 sources (the
// micro-batches' staged gradients) against the reference, within an f32 rounding of each value.
TEST_F(CudaTransformer, CastManyAccumulatesAndScalesIntoF32) {
  SCOPED_TRACE(trace());
  const CastPairs p = cast_pairs(*this, {DType::bf16, DType::f16, DType::f32}, 3);
  const auto& [srcs, dsts, from, to] = p;
  for (const CastManyMode mode :
       {CastManyMode{.accumulate = true, .scale = 1.0}, CastManyMode{.accumulate = true, .scale = 0.25},
        CastManyMode{.accumulate = false, .scale = 1.0 / 3.0}}) {
    SCOPED_TRACE(std::string("accumulate ") + (mode.accumulate ? "on" : "off") + ", scale " +
                 std::to_string(mode.scale));
    cuda().cast_many(srcs, dsts, mode);
    for (std::size_t i = 0; i < from.size(); ++i) {
      ref().cast_many({from[i]->ref}, {to[i]->ref}, mode);
      expect_close(got(*to[i]), want(*to[i]), 2 * kF32Eps, {0.0}, "tensor " + std::to_string(i));
      sync(*to[i]);  // the next mode starts from the same values on both sides
    }
  }
  EXPECT_THROW(cuda().cast_many({from[0]->dev}, {from[1]->dev}, CastManyMode{.accumulate = true}), Unsupported)
      << "a 16-bit destination";
}

// Dropout: the device drops exactly the elements the reference drops (one hash, dropout_mask.h),
// scales the rest within the dtype's rounding, and backward reuses the mask (accumulating too).
TEST_F(CudaTransformer, DropoutDropsTheReferencesElementsBothWays) {
  SCOPED_TRACE(trace());
  for (const DType act : {DType::f32, DType::bf16, DType::f16})
    for (const int64_t n : {int64_t{7}, int64_t{4099}, int64_t{(1 << 20) + 8}}) {
      SCOPED_TRACE(std::string(to_string(act)) + ", " + std::to_string(n) + " elements");
      auto& x = random(act, {n}, 0.5, 1.5);
      auto& y = random(act, {n});
      auto& counter = ints({1}, {11});
      const DropoutDesc d{.probability = 0.1, .seed = 77};
      cuda().dropout_forward(d, x.dev, y.dev, counter.dev);
      ref().dropout_forward(d, x.ref, y.ref, counter.ref);
      const std::vector<double> gy = got(y), wy = want(y);
      for (std::size_t i = 0; i < gy.size(); ++i)
        ASSERT_EQ(gy[i] == 0.0, wy[i] == 0.0) << "element " << i << ": the masks differ";
      expect_close(gy, wy, rounding(act), {0.0}, "y");
      auto& dy = random(act, {n}, 0.5, 1.5);
      auto& dx = random(act, {n});
      // dx + dy / (1 - p) rounds within the dtype's rounding of its operands' magnitudes (the sum
      // may cancel, so a bound relative to the result would not hold).
      const std::vector<double> before = want(dx), dyv = want(dy);
      std::vector<double> bound(before.size());
      for (std::size_t i = 0; i < bound.size(); ++i)
        bound[i] = 2 * rounding(act) * (std::abs(before[i]) + std::abs(dyv[i]) / (1 - d.probability));
      cuda().dropout_backward(d, dy.dev, dx.dev, counter.dev, /*accumulate=*/true);
      ref().dropout_backward(d, dy.ref, dx.ref, counter.ref, true);
      expect_close(got(dx), want(dx), 0.0, bound, "dx");
    }
}

TEST_F(CudaTransformer, GeluMatchesTheReferenceBothWaysAndInPlace) {
  SCOPED_TRACE(trace());
  for (const DType act : kActivationTypes)
    for (const int64_t n : {int64_t{7}, int64_t{1003}, int64_t{(1 << 20) + 8}}) {
      SCOPED_TRACE(std::string(to_string(act)) + ", " + std::to_string(n) + " elements");
      auto& x = random(act, {n});
      auto& y = random(act, {n});
      cuda().gelu_forward(x.dev, y.dev);
      ref().gelu_forward(x.ref, y.ref);
      const double floor = 4 * kF32Eps * max_abs(want(x));  // tanhf's and the cubic's roundings
      expect_close(got(y), want(y), rounding(act), {floor}, "y");
      auto& dy = random(act, {n});
      auto& dx = random(act, {n});
      for (const bool accumulate : {false, true}) {
        sync(dx);  // both start from the same dx (the previous pass rounded each its own way)
        cuda().gelu_backward(x.dev, dy.dev, dx.dev, accumulate);
        ref().gelu_backward(x.ref, dy.ref, dx.ref, accumulate);
        expect_close(got(dx), want(dx), rounding(act), {16 * kF32Eps * max_abs(want(dx))},
                     accumulate ? "dx accumulated" : "dx");
      }
      // In place: dx over dy, then y over x.
      cuda().gelu_backward(x.dev, dy.dev, dy.dev, false);
      ref().gelu_backward(x.ref, dy.ref, dy.ref, false);
      expect_close(got(dy), want(dy), rounding(act), {16 * kF32Eps * max_abs(want(dy))}, "dx in place");
      cuda().gelu_forward(x.dev, x.dev);
      ref().gelu_forward(x.ref, x.ref);
      expect_close(got(x), want(x), rounding(act), {floor}, "y in place");
    }
}

// ---- the gradient norm

int sm_count() {
  int sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  return std::max(sms, 1);
}

TEST_F(CudaTransformer, SumSquaresOverManyTensorsMatchesTheReferenceBitForBitTwice) {
  SCOPED_TRACE(trace());
  // 300 tensors (more than one launch holds), sizes off the 8192-element chunk and the vector
  // widths, mostly f32 with some 16-bit, two of GPT-2's 768 x 3072.
  std::vector<Tensor> dev, host;
  int64_t chunks = 0;
  for (int i = 0; i < 300; ++i) {
    const int64_t n = i == 11 || i == 250 ? 768 * 3072 : i % 50 == 0 ? 3 * 8192 + 5 : 1 + (i * 7919) % 5000;
    const DType dt = i % 10 == 3 ? DType::bf16 : i % 10 == 7 ? DType::f16 : DType::f32;
    auto& g = random(dt, {n});
    dev.push_back(g.dev);
    host.push_back(g.ref);
    chunks += (n + 8191) / 8192;
  }
  auto& out = random(DType::f32, {1});
  cuda().sum_squares(dev, out.dev);
  const std::vector<unsigned char> first = bytes(out);
  ref().sum_squares(host, out.ref);
  // A thread's f32 sum takes 32 elements per chunk of its block's (2 blocks per SM) and the chunk's
  // sum, then the block's 10 butterfly steps; the partials are summed in f64. Every term is positive.
  const double per_thread = static_cast<double>((chunks + 2 * sm_count() - 1) / (2 * sm_count())) * 33 + 16;
  expect_close(got(out), want(out), per_thread * kF32Eps, {0.0}, "sum of squares");
  cuda().sum_squares(dev, out.dev);
  EXPECT_TRUE(bytes(out) == first) << "the sum differs between two runs";
}

// ---- AdamW

// The size of what `steps` AdamW steps subtract from w (sum of lr * (|update| + decay * |w|)),
// from the rule in f64: the scale of the f32 arithmetic's error in w, even where steps cancel.
double adamw_step_sizes(const AdamWStep& s, double decay, double w, double g, double m, double v, int first_step,
                        int steps) {
  double total = 0;
  for (int step = first_step; step < first_step + steps; ++step) {
    m = s.beta1 * m + (1 - s.beta1) * g;
    v = s.beta2 * v + (1 - s.beta2) * g * g;
    const double update =
        m / (1 - std::pow(s.beta1, step)) / (std::sqrt(v / (1 - std::pow(s.beta2, step))) + s.epsilon);
    total += s.learning_rate * (std::abs(update) + decay * std::abs(w));
    w -= s.learning_rate * (update + decay * w);
  }
  return total;
}

TEST_F(CudaTransformer, AdamWOverManyTensorsInACapturedStepReplayedTwiceIsTwoReferenceSteps) {
  SCOPED_TRACE(trace());
  // 136 parameters (two launches): odd sizes, GPT-2's 768 x 768 + 3; bf16, f16 or no copy;
  // decayed or not. Moments start random (a run's middle), the gradient norm clips.
  struct Param {
    Twin *w, *g, *m, *v, *copy;
    double decay;
    std::vector<double> w0, g0, m0, v0;
  };
  std::vector<Param> params;
  std::vector<AdamWTensors> dev, host;
  std::vector<Tensor> dev_g, host_g;
  const std::vector<int64_t> big = {1, 7, 4099, 65539, 300000, 768 * 768 + 3};
  for (int i = 0; i < 136; ++i) {
    const int64_t n = i < 6 ? big[sz(i)] : 1 + i % 37;
    Param p{&random(DType::f32, {n}),
            &random(DType::f32, {n}),
            &random(DType::f32, {n}, -0.1, 0.1),
            &random(DType::f32, {n}, 1e-4, 1e-2),
            nullptr,
            i % 2 ? 0.1 : 0.0,
            {},
            {},
            {},
            {}};
    if (i % 3 != 2) p.copy = &random(i % 3 == 0 ? DType::bf16 : DType::f16, {n});
    p.w0 = want(*p.w), p.g0 = want(*p.g), p.m0 = want(*p.m), p.v0 = want(*p.v);
    const Tensor no_copy{};
    dev.push_back({p.w->dev, p.g->dev, p.m->dev, p.v->dev, p.copy ? p.copy->dev : no_copy, p.decay});
    host.push_back({p.w->ref, p.g->ref, p.m->ref, p.v->ref, p.copy ? p.copy->ref : no_copy, p.decay});
    dev_g.push_back(p.g->dev);
    host_g.push_back(p.g->ref);
    params.push_back(std::move(p));
  }
  auto& counter = ints({1}, {1});
  auto& skip = ints({1}, {0});
  auto& norm2 = random(DType::f32, {1});
  const auto step_of = [&](bool on_gpu) {
    const auto pick = [&](Twin& w) { return on_gpu ? w.dev : w.ref; };
    return AdamWStep{.learning_rate = 1e-3,
                     .beta1 = 0.9,
                     .beta2 = 0.95,
                     .epsilon = 1e-8,
                     .weight_decay = 0.0,
                     .step = 1000,
                     .step_count = pick(counter),
                     .max_grad_norm = 1.0,
                     .grad_norm_squared = pick(norm2),
                     .skip_if = pick(skip)};
  };
  const AdamWStep dev_step = step_of(true), host_step = step_of(false);
  auto gpu = cuda().capture([&] {
    cuda().sum_squares(dev_g, norm2.dev);
    cuda().adamw_update_many(dev_step, dev);
    cuda().count_step(counter.dev, skip.dev);
  });
  auto cpu = ref().capture([&] {
    ref().sum_squares(host_g, norm2.ref);
    ref().adamw_update_many(host_step, host);
    ref().count_step(counter.ref, skip.ref);
  });
  EXPECT_EQ(got(counter)[0], 1) << "the capture ran count_step";
  for (int i = 0; i < 2; ++i) {
    gpu->replay();
    cpu->replay();
  }
  EXPECT_EQ(got(counter)[0], 3);
  EXPECT_EQ(want(counter)[0], 3);
  const double clip = std::min(1.0, 1.0 / std::sqrt(want(norm2)[0]));
  ASSERT_LT(clip, 0.1) << "the test's gradients should be clipped";
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    SCOPED_TRACE("parameter " + std::to_string(i) + " of " + std::to_string(p.w0.size()) + " elements");
    // The moments: f32 arithmetic, the clip factor from an f32 norm (~1e-5 relative at most).
    std::vector<double> m_bound(p.w0.size()), v_bound(p.w0.size()), w_bound(p.w0.size());
    for (std::size_t e = 0; e < p.w0.size(); ++e) {
      const double g = std::abs(p.g0[e]) * clip;
      m_bound[e] = 1e-5 * (std::abs(p.m0[e]) + g);
      v_bound[e] = 1e-5 * (p.v0[e] + g * g);
      // The updates' own relative error (f32, and the clip factor's from an f32 norm).
      w_bound[e] = 1e-5 * adamw_step_sizes(host_step, p.decay, p.w0[e], p.g0[e] * clip, p.m0[e], p.v0[e], 1, 2);
    }
    expect_close(got(*p.m), want(*p.m), 4 * kF32Eps, m_bound, "m");
    expect_close(got(*p.v), want(*p.v), 4 * kF32Eps, v_bound, "v");
    expect_close(got(*p.w), want(*p.w), 4 * kF32Eps, w_bound, "w");
    if (p.copy != nullptr) {  // one rounding of w (f16's subnormals: their spacing)
      const double floor = p.copy->dev.dtype == DType::f16 ? std::ldexp(1.0, -24) : 0.0;
      expect_close(got(*p.copy), want(*p.copy), rounding(p.copy->dev.dtype), {floor}, "copy");
    }
  }
  // A skipped step (fp16 loss scaling found a non-finite gradient): nothing moves, the count stays.
  std::vector<std::vector<unsigned char>> before;
  for (const Param& p : params) before.push_back(bytes(*p.w)), before.push_back(bytes(*p.m));
  cuda().upload(skip.dev, std::vector<std::int32_t>{1}.data());
  gpu->replay();
  EXPECT_EQ(got(counter)[0], 3) << "count_step counted a skipped step";
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(bytes(*params[i].w) == before[2 * i]) << "w of parameter " << i << " moved in a skipped step";
    EXPECT_TRUE(bytes(*params[i].m) == before[2 * i + 1]) << "m of parameter " << i << " moved in a skipped step";
  }
}

TEST_F(CudaTransformer, AdamWTakesTheHostStepWithoutACounter) {
  SCOPED_TRACE(trace());
  auto& w = random(DType::f32, {1001});
  auto& g = random(DType::f32, {1001});
  auto& m = random(DType::f32, {1001}, -0.1, 0.1);
  auto& v = random(DType::f32, {1001}, 1e-4, 1e-2);
  const std::vector<double> w0 = want(w), g0 = want(g), m0 = want(m), v0 = want(v);
  AdamWStep s{.learning_rate = 0.01, .beta1 = 0.8, .beta2 = 0.99, .epsilon = 1e-6, .weight_decay = 0.05, .step = 3};
  s.step_count = Tensor{};
  cuda().adamw_update(s, w.dev, g.dev, m.dev, v.dev);
  ref().adamw_update(s, w.ref, g.ref, m.ref, v.ref);
  std::vector<double> w_bound(w0.size());
  const double c1 = 1 - std::pow(s.beta1, 3), c2 = 1 - std::pow(s.beta2, 3);
  for (std::size_t e = 0; e < w0.size(); ++e) {
    // Non-zero moments: beta1 m + (1 - beta1) g may cancel, and its f32 rounding (relative to the
    // terms, not to the small sum) reaches w through lr / c1 / (sqrt(v_hat) + epsilon).
    const double v_hat = (s.beta2 * v0[e] + (1 - s.beta2) * g0[e] * g0[e]) / c2;
    const double cancellation = s.learning_rate * 8 * kF32Eps *
                                (s.beta1 * std::abs(m0[e]) + (1 - s.beta1) * std::abs(g0[e])) / c1 /
                                (std::sqrt(v_hat) + s.epsilon);
    w_bound[e] = 1e-5 * adamw_step_sizes(s, s.weight_decay, w0[e], g0[e], m0[e], v0[e], 3, 1) + cancellation;
  }
  expect_close(got(w), want(w), 4 * kF32Eps, w_bound, "w");
  expect_close(got(m), want(m), 4 * kF32Eps, {1e-7}, "m");
  expect_close(got(v), want(v), 4 * kF32Eps, {1e-9}, "v");
  s.step = 0;
  EXPECT_THROW(cuda().adamw_update(s, w.dev, g.dev, m.dev, v.dev), Error);
}

// ---- the fused cross-entropy

// The error of an f32 log-sum-exp over `vocab` logits in [-4, 4]: a thread's share of the row (a
// block of at least 512 threads) and the block's combine steps in the sum, the log and the max's
// roundings, and __expf's few ulps per term on 16-bit rows.
double lse_error(DType act, int64_t vocab) {
  return (static_cast<double>(vocab) / 512 + 40) * kF32Eps + 4 * kF32Eps * (4 + std::log(static_cast<double>(vocab))) +
         (act == DType::f32 ? 0 : 2e-6);
}

struct LossCase {
  int64_t rows, vocab, stride;
  bool in_place, seeded;
};

void check_cross_entropy(CudaTransformer& t, DType act, const LossCase& c) {
  SCOPED_TRACE(std::string(to_string(act)) + ", " + std::to_string(c.rows) + " rows of " + std::to_string(c.vocab) +
               " (stride " + std::to_string(c.stride) + ")" + (c.in_place ? ", in place" : "") +
               (c.seeded ? ", seed 0.5" : ""));
  auto& logits = t.random(act, {c.rows, c.stride}, -4, 4, c.vocab);
  std::vector<double> labels_v = t.draw(c.rows, 0, 0.999999);
  for (std::size_t r = 0; r < labels_v.size(); ++r)
    labels_v[r] = r % 5 == 1 ? -1 : std::floor(labels_v[r] * static_cast<double>(c.vocab));
  auto& labels = t.ints({c.rows}, labels_v);
  auto& loss = t.random(DType::f32, {1});
  auto& seed = t.make(DType::f32, {1}, {0.5});
  Twin& dl = c.in_place ? logits : t.random(act, {c.rows, c.stride}, -1, 1, c.vocab);
  const std::vector<double> storage_before = t.got_storage(dl);
  t.cuda().cross_entropy_fused(logits.dev, labels.dev, loss.dev, dl.dev, c.seeded ? seed.dev : Tensor{});
  t.ref().cross_entropy_fused(logits.ref, labels.ref, loss.ref, dl.ref, c.seeded ? seed.ref : Tensor{});
  const double lse_err = lse_error(act, c.vocab);
  expect_close(t.got(loss), CudaTransformer::want(loss), 4 * kF32Eps, {lse_err}, "loss");
  int64_t scored = 0;
  for (const double l : labels_v) scored += l >= 0 ? 1 : 0;
  const double scale = (c.seeded ? 0.5 : 1.0) / static_cast<double>(std::max<int64_t>(scored, 1));
  const double f16_floor = act == DType::f16 ? std::ldexp(1.0, -24) : 0.0;  // f16 subnormals' spacing
  const std::vector<double> grad = t.got(dl);
  expect_close(grad, CudaTransformer::want(dl), rounding(act) + lse_err + 2e-6, {(lse_err + 2e-6) * scale + f16_floor},
               "dlogits");
  for (int64_t r = 1; r < c.rows; r += 5)
    for (int64_t v = 0; v < c.vocab; ++v)
      ASSERT_EQ(grad[sz(r * c.vocab + v)], 0.0) << "unscored row " << r << ", column " << v;
  const std::vector<double> storage_after = t.got_storage(dl);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t v = c.vocab; v < c.stride; ++v)
      ASSERT_EQ(storage_after[sz(r * c.stride + v)], storage_before[sz(r * c.stride + v)])
          << "padding column " << v << " of row " << r << " was written";
}

TEST_F(CudaTransformer, FusedCrossEntropyMatchesTheReferenceOnPaddedRowsInPlace) {
  SCOPED_TRACE(trace());
  for (const DType act : kActivationTypes) {
    check_cross_entropy(*this, act, {5, 7, 9, false, true});          // rows not 16-byte aligned: scalar loads
    check_cross_entropy(*this, act, {6, 13, 16, true, false});        // vector loads and a tail
    check_cross_entropy(*this, act, {67, 50257, 50304, true, true});  // GPT-2's padded vocabulary
  }
  check_cross_entropy(*this, DType::bf16, {33, 50257, 50304, false, false});
  // f32 rows wider than shared memory holds (240 KB): read twice instead of staged.
  check_cross_entropy(*this, DType::f32, {3, 60001, 60004, true, false});
}

TEST_F(CudaTransformer, FusedCrossEntropyIsBitIdenticalRunToRun) {
  SCOPED_TRACE(trace());
  for (const int64_t vocab : {int64_t{50257}, int64_t{60001}}) {  // bf16 staged; f32 wider than shared memory
    const DType act = vocab == 50257 ? DType::bf16 : DType::f32;
    SCOPED_TRACE(std::string(to_string(act)) + ", vocabulary " + std::to_string(vocab));
    auto& logits = random(act, {9, vocab}, -4, 4);
    auto& labels = ints({9}, {0, 3, -1, 7, static_cast<double>(vocab - 1), 11, 2, 5, 1});
    auto& loss = random(DType::f32, {1});
    auto& dl = random(act, {9, vocab});
    cuda().cross_entropy_fused(logits.dev, labels.dev, loss.dev, dl.dev, Tensor{});
    const std::vector<double> first_loss = got(loss), first_grad = got(dl);
    cuda().cross_entropy_fused(logits.dev, labels.dev, loss.dev, dl.dev, Tensor{});
    EXPECT_EQ(got(loss), first_loss) << "the loss differs between two runs";
    EXPECT_TRUE(got(dl) == first_grad) << "dlogits differ between two runs";
  }
}

TEST_F(CudaTransformer, FusedCrossEntropyWithNoScoredRowIsZero) {
  SCOPED_TRACE(trace());
  auto& logits = random(DType::bf16, {4, 64}, -2, 2);
  auto& loss = random(DType::f32, {1});
  cuda().cross_entropy_fused(logits.dev, ints({4}, {-1, -1, -1, -1}).dev, loss.dev, logits.dev, Tensor{});
  EXPECT_EQ(got(loss)[0], 0.0);
  EXPECT_EQ(got(logits), std::vector<double>(256, 0.0));
  // Loss only (inference): dlogits undefined, the logits untouched.
  auto& kept = random(DType::f32, {3, 40}, -2, 2);
  const std::vector<double> before = got(kept);
  cuda().cross_entropy_fused(kept.dev, ints({3}, {0, 39, 7}).dev, loss.dev, Tensor{}, Tensor{});
  ref().cross_entropy_fused(kept.ref, ints({3}, {0, 39, 7}).ref, loss.ref, Tensor{}, Tensor{});
  EXPECT_EQ(got(kept), before);
  expect_close(got(loss), want(loss), 4 * kF32Eps, {lse_error(DType::f32, 40)}, "loss");
}

// ---- what the family refuses, by name

TEST_F(CudaTransformer, RefusesOperandsItCannotTakeWithTheReason) {
  auto& w16 = random(DType::bf16, {8});
  auto& f = random(DType::f32, {8});
  const auto message = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const Unsupported& e) {
      return std::string(e.what());
    }
    return std::string("no Unsupported");
  };
  EXPECT_NE(message([&] { cuda().adamw_update({}, w16.dev, w16.dev, w16.dev, w16.dev); }).find("must be f32"),
            std::string::npos);
  auto& x = random(DType::bf16, {2, 8000});
  auto& gamma = random(DType::f32, {8000});
  auto& stats = random(DType::f32, {2});
  EXPECT_NE(message([&] {
              cuda().layernorm_backward(x.dev, x.dev, gamma.dev, stats.dev, stats.dev, x.dev, false, gamma.dev,
                                        gamma.dev);
            }).find("C = 8000"),
            std::string::npos);
  auto& logits = random(DType::bf16, {2, 8});
  EXPECT_NE(message([&] {
              cuda().cross_entropy_fused(logits.dev, ints({3}, {0, 1, 2}).dev, f.dev, Tensor{}, Tensor{});
            }).find("cross_entropy_fused"),
            std::string::npos);
  // No tensor at all: the norm is 0.
  auto& out = random(DType::f32, {1});
  cuda().sum_squares({}, out.dev);
  EXPECT_EQ(got(out)[0], 0.0);
}

}  // namespace
}  // namespace ab::nn
