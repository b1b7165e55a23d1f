// The engine's own CUDA kernels (nn/cuda/pointwise) against the reference kernels in f64 on
// the same (dtype-rounded) random inputs, or against a plain host computation: every float dtype,
// both accumulate modes, sizes off the vector width, both avgpool layouts, stable softmax, device-
// side skip flags, rounding cases, loss scaling, run-to-run bit equality and CUDA graph capture;
// the fused bias_act epilogue (both layouts, residual and ReLU on and off, unaligned operands).
// Skips where no GPU answers.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/cuda/pointwise.h"
#include "nn/kernels.h"
#include "test_support.h"

namespace ab::nn {
namespace {

namespace pw = cuda_pointwise;
using std::int32_t;
using std::int64_t;

bool has_device() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!has_device()) GTEST_SKIP() << "no CUDA device"

using Values = std::vector<double>;
const std::vector<DType> kFloatTypes = {DType::f32, DType::bf16, DType::f16, DType::f64};
const std::vector<int64_t> kSizes = {1, 7, 1000003};  // off every vector width

// Relative error a result stored in t may carry (half an ulp plus the f32 math before it).
double rel_tol(DType t) {
  switch (t) {
    case DType::f64: return 1e-12;
    case DType::f32: return 2e-6;
    case DType::f16: return 1.5e-3;
    default: return 8e-3;  // bf16
  }
}

// Absolute error near zero: f16 results below 2^-14 are subnormals spaced 2^-24 apart, so a value
// computed in f32 and rounded there may sit a step from the exactly rounded f64 reference.
double abs_tol(DType t, double floor) { return t == DType::f16 ? std::max(floor, std::ldexp(1.0, -24)) : floor; }

// Host bytes of `v` stored as t (rounding to nearest even as the device does from f32 values).
std::vector<unsigned char> encode(DType t, const std::vector<double>& v) {
  std::vector<unsigned char> out(v.size() * size_bytes(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    unsigned char* p = out.data() + i * size_bytes(t);
    switch (t) {
      case DType::f64: std::memcpy(p, &v[i], 8); break;
      case DType::f32: {
        const auto f = static_cast<float>(v[i]);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::f16: {
        const std::uint16_t h = float_to_half_bits(static_cast<float>(v[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::bf16: {
        const std::uint16_t b = float_to_bf16_bits(static_cast<float>(v[i]));
        std::memcpy(p, &b, 2);
        break;
      }
      case DType::i32: {
        const auto x = static_cast<int32_t>(v[i]);
        std::memcpy(p, &x, 4);
        break;
      }
      default: throw Error("encode: no host encoding for " + std::string(to_string(t)));
    }
  }
  return out;
}

// The values t can hold nearest to v: what the device and the reference both start from.
std::vector<double> quantize(DType t, const std::vector<double>& v) {
  const auto bytes = encode(t, v);
  return to_doubles(t, bytes.data(), v.size());
}

struct Rng {
  std::uint64_t seed = test::seed();
  std::mt19937_64 gen{seed};
  std::vector<double> uniform(int64_t n, double lo = -1.0, double hi = 1.0) {
    std::uniform_real_distribution<double> d(lo, hi);
    std::vector<double> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = d(gen);
    return v;
  }
  std::vector<double> uniform_in(DType t, int64_t n, double lo = -1.0, double hi = 1.0) {
    return quantize(t, uniform(n, lo, hi));
  }
  std::string trace() const { return "seed " + std::to_string(seed); }
};

// A device array of n elements of t, with host round trips.
class DeviceArray {
 public:
  DeviceArray(DType t, int64_t n) : t_(t), n_(n), buf_(std::max<int64_t>(1, n) * int64_t(size_bytes(t)), "test") {}
  DeviceArray(DType t, const std::vector<double>& values) : DeviceArray(t, int64_t(values.size())) { upload(values); }
  void upload(const std::vector<double>& values) {
    const auto bytes = encode(t_, values);
    AB_CUDA(cudaMemcpy(buf_.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "test upload");
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> out(static_cast<std::size_t>(n_) * size_bytes(t_));
    AB_CUDA(cudaMemcpy(out.data(), buf_.get(), out.size(), cudaMemcpyDeviceToHost), "test download");
    return out;
  }
  std::vector<double> download() const { return to_doubles(t_, bytes().data(), static_cast<std::size_t>(n_)); }
  void* get() const { return buf_.get(); }
  template <typename T>
  T* as() const {
    return buf_.as<T>();
  }

 private:
  DType t_;
  int64_t n_;
  backend::cuda::DeviceBuffer buf_;
};

// Host f64 tensor over `v` for the reference kernels.
Tensor host(std::vector<double>& v, const Shape& s, Layout layout = Layout::nchw) {
  return Tensor::describe(DType::f64, s, layout).with_data(v.data());
}
Tensor host_i32(std::vector<int32_t>& v) {
  return Tensor::describe(DType::i32, Shape{int64_t(v.size())}).with_data(v.data());
}

Kernels& ref() {
  static const std::unique_ptr<Kernels> k = make_ref_kernels();
  return *k;
}

void sync() { AB_CUDA(cudaDeviceSynchronize(), "test sync"); }

// Every element within abs + rel * |want| (NaN never is); reports the first miss.
void expect_near(const std::vector<double>& got, const std::vector<double>& want, double rel, double abs,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= abs + rel * std::fabs(want[i])) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " off, first at " << first << ": got "
                     << got[first] << ", want " << want[first];
}

std::string name(DType t) { return std::string(to_string(t)); }

// ---- without a device: argument checks happen before any launch

TEST(CudaPointwise, RejectsNonFloatDtypesNamingTheValidOnes) {
  try {
    pw::relu_forward(nullptr, DType::i8, nullptr, nullptr, 16);
    FAIL() << "no exception";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("valid: f32, f16, bf16, f64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pw::cast(nullptr, DType::f32, nullptr, DType::i32, nullptr, 4), Unsupported);
  EXPECT_THROW(pw::softmax_xent_forward(nullptr, DType::f32, nullptr, nullptr, DType::f32, nullptr, DType::i64,
                                        nullptr, 4, 10, nullptr),
               Unsupported);
  EXPECT_THROW(pw::update_loss_scale(nullptr, LossScaleRule{2.0, 0.5, 0}, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(pw::round_forward(nullptr, DType::i32, nullptr, nullptr, 4, 1.0), Unsupported);
  EXPECT_THROW(pw::rate_distortion_forward(nullptr, DType::f32, nullptr, nullptr, 4, nullptr, 2, 0.1, DType::i32,
                                           nullptr, nullptr, nullptr),
               Unsupported);
}

TEST(CudaPointwise, ScratchSizes) {
  EXPECT_GE(pw::lars_scratch_floats(), 2);
  EXPECT_GE(pw::rate_distortion_scratch_floats(), 4);
  EXPECT_GE(pw::softmax_xent_scratch_floats(1024), 1024);
}

// ---- elementwise

TEST(CudaPointwise, ReluAddCopyMatchReference) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (DType t : kFloatTypes)
    for (int64_t n : kSizes) {
      SCOPED_TRACE(name(t) + " n=" + std::to_string(n));
      const Shape s{n};
      auto a = rng.uniform_in(t, n), b = rng.uniform_in(t, n), old = rng.uniform_in(t, n);
      DeviceArray da(t, a), db(t, b), dy(t, n), dx(t, n);

      pw::relu_forward(nullptr, t, da.get(), dy.get(), n);
      std::vector<double> want(a.size());
      ref().relu_forward(host(a, s), host(want, s));
      ASSERT_NO_FATAL_FAILURE(expect_near(dy.download(), want, 0, 0, "relu_forward"));  // exact: a max with 0

      pw::add_forward(nullptr, t, da.get(), db.get(), dy.get(), n);
      ref().add_forward(host(a, s), host(b, s), host(want, s));
      ASSERT_NO_FATAL_FAILURE(expect_near(dy.download(), want, rel_tol(t), 0, "add_forward"));

      for (bool acc : {false, true}) {
        SCOPED_TRACE(acc ? "accumulate" : "overwrite");
        // relu_backward reads the forward output: a has both signs, b is dy.
        dx.upload(old);
        want = old;
        pw::relu_backward(nullptr, t, da.get(), db.get(), dx.get(), n, acc);
        ref().relu_backward(host(a, s), host(b, s), host(want, s), acc);
        ASSERT_NO_FATAL_FAILURE(expect_near(dx.download(), want, rel_tol(t), 0, "relu_backward"));

        dx.upload(old);
        want = old;
        pw::copy_gradient(nullptr, t, db.get(), dx.get(), n, acc);
        ref().copy_gradient(host(b, s), host(want, s), acc);
        ASSERT_NO_FATAL_FAILURE(expect_near(dx.download(), want, acc ? rel_tol(t) : 0, 0, "copy_gradient"));
      }
    }
}

TEST(CudaPointwise, UnalignedAndInPlaceElementwise) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(name(t));
    const int64_t n = 1001;
    auto a = rng.uniform_in(t, n + 1), b = rng.uniform_in(t, n + 1);
    DeviceArray da(t, a), db(t, b), dy(t, n + 1);
    const auto es = int64_t(size_bytes(t));
    // One element in: the scalar path (16-byte vectors would fault or misread here).
    pw::add_forward(nullptr, t, da.as<char>() + es, db.as<char>() + es, dy.as<char>() + es, n);
    const auto got = dy.download();
    for (int64_t i = 1; i <= n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      ASSERT_NEAR(got[k], a[k] + b[k], rel_tol(t) * std::fabs(a[k] + b[k])) << i;
    }
    // In place: y == x.
    pw::relu_forward(nullptr, t, da.get(), da.get(), n + 1);
    const auto relu = da.download();
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(relu[i], std::max(a[i], 0.0)) << i;
  }
}

// ---- the fused inference epilogue: y = act(x + bias[c] (+ residual))

TEST(CudaPointwise, BiasActivationMatchesReferenceInBothLayouts) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  struct Case {
    int64_t n, c, h, w;
  };
  // Channel counts off and on the vector widths; one large enough for the grid-stride loop.
  const std::vector<Case> cases = {{3, 37, 7, 7}, {2, 64, 3, 5}, {2, 5, 1, 1}, {2, 256, 56, 56}};
  for (DType t : kFloatTypes)
    for (Layout layout : {Layout::nchw, Layout::nhwc})
      for (const Case& k : cases)
        for (bool residual : {false, true})
          for (bool relu : {false, true}) {
            const Shape xs{k.n, k.c, k.h, k.w};
            // The bias as batch-norm parameters are stored (f32; f64 beside f64), or in the data's own
            // type (a fused convolution's bias) in every other configuration.
            const bool storage_bias = residual != relu;
            SCOPED_TRACE(name(t) + " " + std::string(to_string(layout)) + " " + xs.to_string() +
                         (residual ? " residual" : "") + (relu ? " relu" : "") +
                         (storage_bias ? " storage-type bias" : ""));
            const int64_t nx = xs.numel();
            const DType bias_t = storage_bias ? t : t == DType::f64 ? DType::f64 : DType::f32;
            auto x = rng.uniform_in(t, nx, -2, 2), r = rng.uniform_in(t, nx), b = rng.uniform_in(bias_t, k.c);
            DeviceArray dxv(t, x), dr(t, r), db(bias_t, b), dy(t, rng.uniform_in(t, nx, 5, 6));
            pw::bias_activation_forward(nullptr, t, layout, dxv.get(), db.get(), storage_bias,
                                        residual ? dr.get() : nullptr, dy.get(), k.n, k.c, k.h * k.w, relu);
            std::vector<double> want(static_cast<std::size_t>(nx));
            ref().bias_activation_forward(host(x, xs, layout), host(b, Shape{k.c}),
                                          residual ? host(r, xs, layout) : Tensor{}, host(want, xs, layout), relu);
            // Absolute slack for cancellation: the device sums in f32 before rounding once.
            ASSERT_NO_FATAL_FAILURE(expect_near(dy.download(), want, rel_tol(t), t == DType::f64 ? 1e-14 : abs_tol(t, 1e-6), "y"));
          }
  // Unaligned operands (one element in): the scalar path, NHWC with an odd channel count.
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(name(t) + " unaligned");
    const Shape xs{2, 7, 3, 5};
    const int64_t nx = xs.numel(), es = int64_t(size_bytes(t));
    auto x = rng.uniform_in(t, nx + 1, -2, 2), r = rng.uniform_in(t, nx + 1), b = rng.uniform_in(DType::f32, 7);
    DeviceArray dxv(t, x), dr(t, r), db(DType::f32, b), dy(t, nx + 1);
    pw::bias_activation_forward(nullptr, t, Layout::nhwc, dxv.as<char>() + es, db.get(), false, dr.as<char>() + es,
                                dy.as<char>() + es, 2, 7, 15, true);
    const auto got = dy.download();
    for (int64_t i = 0; i < nx; ++i) {
      const auto k = static_cast<std::size_t>(i + 1);
      const double want = std::max(x[k] + b[static_cast<std::size_t>(i % 7)] + r[k], 0.0);
      ASSERT_NEAR(got[k], want, rel_tol(t) * std::fabs(want) + 1e-6) << i;
    }
  }
  EXPECT_THROW(pw::bias_activation_forward(nullptr, DType::i32, Layout::nchw, nullptr, nullptr, false, nullptr, nullptr,
                                           1, 1, 1, false),
               Unsupported);
}

// ---- global average pooling

TEST(CudaPointwise, GlobalAvgpoolMatchesReferenceInBothLayouts) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  struct Case {
    int64_t n, c, h, w;
  };
  const std::vector<Case> cases = {{3, 37, 7, 7}, {2, 2048, 7, 7}, {2, 5, 1, 1}, {1, 3, 56, 56}, {5, 64, 3, 5}};
  for (DType t : kFloatTypes)
    for (Layout layout : {Layout::nchw, Layout::nhwc})
      for (const Case& k : cases) {
        SCOPED_TRACE(name(t) + " " + std::string(to_string(layout)) + " " + (Shape{k.n, k.c, k.h, k.w}).to_string());
        const Shape xs{k.n, k.c, k.h, k.w}, ys{k.n, k.c};
        const int64_t hw = k.h * k.w, nx = k.n * k.c * hw, ny = k.n * k.c;
        auto x = rng.uniform_in(t, nx), dyv = rng.uniform_in(t, ny), old = rng.uniform_in(t, nx);
        DeviceArray dx_in(t, x), dy_out(t, ny), ddy(t, dyv), ddx(t, nx);

        pw::global_avgpool_forward(nullptr, t, layout, dx_in.get(), dy_out.get(), k.n, k.c, hw);
        std::vector<double> want(static_cast<std::size_t>(ny));
        ref().global_avgpool_forward(host(x, xs, layout), host(want, ys));
        ASSERT_NO_FATAL_FAILURE(expect_near(dy_out.download(), want, rel_tol(t), 1e-6, "forward"));

        for (bool acc : {false, true}) {
          SCOPED_TRACE(acc ? "accumulate" : "overwrite");
          ddx.upload(old);
          auto want_dx = old;
          pw::global_avgpool_backward(nullptr, t, layout, ddy.get(), ddx.get(), k.n, k.c, hw, acc);
          ref().global_avgpool_backward(host(dyv, ys), host(want_dx, xs, layout), acc);
          ASSERT_NO_FATAL_FAILURE(expect_near(ddx.download(), want_dx, rel_tol(t), 1e-7, "backward"));
        }
      }
}

// ---- softmax cross-entropy

struct XentCase {
  int64_t n, k;
  double logit_scale;
};

TEST(CudaPointwise, SoftmaxCrossEntropyForwardMatchesReference) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  // K = 5000 takes the block-per-row path; scale 3000 is far past where a naive exp overflows.
  const std::vector<XentCase> cases = {{1, 10, 4}, {37, 1000, 4}, {1024, 1001, 8}, {16, 5000, 4}, {64, 1000, 3000}};
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (const XentCase& c : cases) {
      SCOPED_TRACE(name(t) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k) +
                   " scale=" + std::to_string(c.logit_scale));
      auto z = rng.uniform_in(t, c.n * c.k, -c.logit_scale, c.logit_scale);
      std::vector<int32_t> labels(static_cast<std::size_t>(c.n));
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.k - 1));
      for (auto& l : labels) l = pick(rng.gen);
      std::vector<double> lv(labels.begin(), labels.end());
      DeviceArray dz(t, z), dlabels(DType::i32, lv), dp(t, c.n * c.k), dloss(DType::f32, 1),
          scratch(DType::f32, pw::softmax_xent_scratch_floats(c.n));
      pw::softmax_xent_forward(nullptr, t, dz.get(), dlabels.as<int32_t>(), t, dp.get(), DType::f32, dloss.get(), c.n,
                               c.k, scratch.as<float>());
      std::vector<double> want_p(z.size()), want_loss(1);
      ref().softmax_cross_entropy_forward(host(z, Shape{c.n, c.k}), host_i32(labels), host(want_p, Shape{c.n, c.k}),
                                          host(want_loss, Shape{1}));
      const double loss = dloss.download()[0];
      EXPECT_TRUE(std::isfinite(loss));
      EXPECT_NEAR(loss, want_loss[0], 2e-5 * std::fabs(want_loss[0]) + 2e-6);
      ASSERT_NO_FATAL_FAILURE(expect_near(dp.download(), want_p, std::max(rel_tol(t), 2e-5), 1e-7, "probs"));
    }
}

TEST(CudaPointwise, SoftmaxCrossEntropyMixedDtypesAndBadLabel) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = 33, k = 100;
  auto z = rng.uniform_in(DType::bf16, n * k, -5, 5);
  std::vector<int32_t> labels(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>((i * 37) % k);
  std::vector<double> lv(labels.begin(), labels.end());
  DeviceArray dz(DType::bf16, z), dlabels(DType::i32, lv), dp(DType::f32, n * k), dloss(DType::f64, 1),
      scratch(DType::f32, pw::softmax_xent_scratch_floats(n));
  pw::softmax_xent_forward(nullptr, DType::bf16, dz.get(), dlabels.as<int32_t>(), DType::f32, dp.get(), DType::f64,
                           dloss.get(), n, k, scratch.as<float>());
  std::vector<double> want_p(z.size()), want_loss(1);
  ref().softmax_cross_entropy_forward(host(z, Shape{n, k}), host_i32(labels), host(want_p, Shape{n, k}),
                                      host(want_loss, Shape{1}));
  EXPECT_NEAR(dloss.download()[0], want_loss[0], 2e-5 * std::fabs(want_loss[0]));
  ASSERT_NO_FATAL_FAILURE(expect_near(dp.download(), want_p, 2e-5, 1e-8, "f32 probs from bf16 logits"));

  // A label outside [0, K) cannot throw on the device: the loss reads NaN ("diverged").
  lv[5] = double(k);
  dlabels.upload(lv);
  pw::softmax_xent_forward(nullptr, DType::bf16, dz.get(), dlabels.as<int32_t>(), DType::f32, dp.get(), DType::f64,
                           dloss.get(), n, k, scratch.as<float>());
  EXPECT_TRUE(std::isnan(dloss.download()[0]));
}

TEST(CudaPointwise, SoftmaxCrossEntropyBackwardMatchesReference) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (DType t : kFloatTypes)
    for (const XentCase& c : std::vector<XentCase>{{1, 7, 1}, {1024, 1000, 1}, {3, 5000, 1}}) {
      SCOPED_TRACE(name(t) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k));
      auto p = rng.uniform_in(t, c.n * c.k, 0, 1), old = rng.uniform_in(t, c.n * c.k, -1e-3, 1e-3);
      std::vector<double> dl = quantize(t, {rng.uniform(1, 0.5, 2)[0]});
      std::vector<int32_t> labels(static_cast<std::size_t>(c.n));
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.k - 1));
      for (auto& l : labels) l = pick(rng.gen);
      std::vector<double> lv(labels.begin(), labels.end());
      DeviceArray dp(t, p), dlabels(DType::i32, lv), ddl(t, dl), dg(t, c.n * c.k);
      for (bool acc : {false, true}) {
        SCOPED_TRACE(acc ? "accumulate" : "overwrite");
        dg.upload(old);
        auto want = old;
        pw::softmax_xent_backward(nullptr, t, dp.get(), dlabels.as<int32_t>(), t, ddl.get(), t, dg.get(), c.n, c.k,
                                  acc);
        ref().softmax_cross_entropy_backward(host(p, Shape{c.n, c.k}), host_i32(labels), host(dl, Shape{1}),
                                             host(want, Shape{c.n, c.k}), acc);
        ASSERT_NO_FATAL_FAILURE(expect_near(dg.download(), want, rel_tol(t), abs_tol(t, 1e-9), "dlogits"));
      }
    }
}

TEST(CudaPointwise, LossIsBitIdenticalRunToRun) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = 1024, k = 1000;
  auto z = rng.uniform_in(DType::f32, n * k, -10, 10);
  std::vector<double> lv(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < lv.size(); ++i) lv[i] = double((i * 7919) % k);
  DeviceArray dz(DType::f32, z), dlabels(DType::i32, lv), dp(DType::f32, n * k), dloss(DType::f32, 1),
      scratch(DType::f32, pw::softmax_xent_scratch_floats(n));
  std::vector<unsigned char> first_loss, first_p;
  for (int run = 0; run < 3; ++run) {
    pw::softmax_xent_forward(nullptr, DType::f32, dz.get(), dlabels.as<int32_t>(), DType::f32, dp.get(), DType::f32,
                             dloss.get(), n, k, scratch.as<float>());
    if (run == 0) {
      first_loss = dloss.bytes();
      first_p = dp.bytes();
    } else {
      EXPECT_EQ(dloss.bytes(), first_loss) << "run " << run;
      EXPECT_EQ(dp.bytes(), first_p) << "run " << run;
    }
  }
}

// ---- learned compression: rounding and the rate-distortion proxy

TEST(CudaPointwise, RoundMatchesReferenceWithTiesToEven) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (DType t : kFloatTypes)
    for (const double step : {1.0, 1.0 / 32.0})
      for (int64_t n : kSizes) {
        SCOPED_TRACE(name(t) + " step " + std::to_string(step) + " n=" + std::to_string(n));
        auto x = rng.uniform_in(t, n, -8, 8);
        // Ties in every dtype: k + 1/2 steps round to the even neighbour.
        const std::vector<double> ties{0.5, 1.5, 2.5, -0.5, -1.5, -2.5};
        for (std::size_t i = 0; i < ties.size() && i < x.size(); ++i) x[i] = ties[i] * step;
        DeviceArray dx(t, x), dy(t, n);
        pw::round_forward(nullptr, t, dx.get(), dy.get(), n, step);
        std::vector<double> want(x.size());
        ref().round_forward(host(x, Shape{n}), host(want, Shape{n}), step);
        ASSERT_NO_FATAL_FAILURE(expect_near(dy.download(), want, 0, 0, "round_forward"));  // exact
        if (n >= 6) {
          EXPECT_EQ(dy.download()[1], 2 * step);  // 1.5 steps: the even neighbour
        }
      }
}

TEST(CudaPointwise, RateDistortionForwardAndBackwardMatchReference) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (DType t : kFloatTypes)
    for (const auto& [n_x, n_l] : std::vector<std::pair<int64_t, int64_t>>{{7, 3}, {3 * 64 * 64 * 4, 192 * 4 * 4 * 4},
                                                                            {1000003, 5}}) {
      SCOPED_TRACE(name(t) + " n_x=" + std::to_string(n_x) + " n_latent=" + std::to_string(n_l));
      const double lambda = 0.37;
      auto xh = rng.uniform_in(t, n_x, 0, 1), x = rng.uniform_in(t, n_x, 0, 1), l = rng.uniform_in(t, n_l, -4, 4);
      DeviceArray dxh(t, xh), dxv(t, x), dl(t, l), loss(DType::f32, 1), mse(DType::f32, 1),
          scratch(DType::f32, pw::rate_distortion_scratch_floats());
      pw::rate_distortion_forward(nullptr, t, dxh.get(), dxv.get(), n_x, dl.get(), n_l, lambda, DType::f32, loss.get(),
                                  mse.get(), scratch.as<float>());
      std::vector<double> want_loss(1), want_mse(1);
      ref().rate_distortion_forward({lambda}, host(xh, Shape{n_x}), host(x, Shape{n_x}), host(l, Shape{n_l}),
                                    host(want_loss, Shape{1}), host(want_mse, Shape{1}));
      EXPECT_GT(want_mse[0], 0.05);  // uniform [0, 1) pairs: 1/6
      EXPECT_NEAR(mse.download()[0], want_mse[0], 2e-6 * want_mse[0]);
      EXPECT_NEAR(loss.download()[0], want_loss[0], 2e-6 * want_loss[0]);

      std::vector<double> dloss = quantize(t, {rng.uniform(1, 0.5, 2)[0]});
      auto old_x = rng.uniform_in(t, n_x, -1e-3, 1e-3), old_l = rng.uniform_in(t, n_l, -1e-3, 1e-3);
      DeviceArray ddloss(t, dloss), gx(t, n_x), gl(t, n_l);
      // Accumulating adds the gradient to an old value of either sign, so a sum may cancel to far
      // below the gradient it holds: its error is the gradient's rounding, relative to the
      // gradient's scale (the overwrite pass's largest element), not to the small sum.
      double scale_x = 0, scale_l = 0;
      for (bool acc : {false, true}) {
        SCOPED_TRACE(acc ? "accumulate" : "overwrite");
        gx.upload(old_x);
        gl.upload(old_l);
        auto want_x = old_x, want_l = old_l;
        pw::rate_distortion_backward(nullptr, t, dxh.get(), dxv.get(), n_x, dl.get(), n_l, lambda, t, ddloss.get(),
                                     gx.get(), acc, gl.get(), acc);
        ref().rate_distortion_backward({lambda}, host(xh, Shape{n_x}), host(x, Shape{n_x}), host(l, Shape{n_l}),
                                       host(dloss, Shape{1}), host(want_x, Shape{n_x}), acc, host(want_l, Shape{n_l}),
                                       acc);
        if (!acc)
          for (const double v : want_x) scale_x = std::max(scale_x, std::fabs(v));
        if (!acc)
          for (const double v : want_l) scale_l = std::max(scale_l, std::fabs(v));
        const double floor_x = acc ? rel_tol(t) * scale_x : 1e-12, floor_l = acc ? rel_tol(t) * scale_l : 1e-12;
        ASSERT_NO_FATAL_FAILURE(expect_near(gx.download(), want_x, rel_tol(t), abs_tol(t, floor_x), "dx_hat"));
        ASSERT_NO_FATAL_FAILURE(expect_near(gl.download(), want_l, rel_tol(t), abs_tol(t, floor_l), "dlatent"));
      }
      // An absent gradient is skipped: only dlatent written.
      gx.upload(old_x);
      pw::rate_distortion_backward(nullptr, t, dxh.get(), dxv.get(), n_x, dl.get(), n_l, lambda, t, ddloss.get(),
                                   nullptr, false, gl.get(), false);
      EXPECT_EQ(gx.download(), quantize(t, old_x));
    }
}

TEST(CudaPointwise, RateDistortionLossIsBitIdenticalRunToRun) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n_x = 3 * 256 * 256 * 8, n_l = 192 * 16 * 16 * 8;
  DeviceArray dxh(DType::f32, rng.uniform(n_x, 0, 1)), dxv(DType::f32, rng.uniform(n_x, 0, 1)),
      dl(DType::f32, rng.uniform(n_l, -3, 3)), loss(DType::f32, 1), mse(DType::f32, 1),
      scratch(DType::f32, pw::rate_distortion_scratch_floats());
  std::vector<unsigned char> first_loss, first_mse;
  for (int run = 0; run < 3; ++run) {
    pw::rate_distortion_forward(nullptr, DType::f32, dxh.get(), dxv.get(), n_x, dl.get(), n_l, 0.01, DType::f32,
                                loss.get(), mse.get(), scratch.as<float>());
    if (run == 0) {
      first_loss = loss.bytes();
      first_mse = mse.bytes();
    } else {
      EXPECT_EQ(loss.bytes(), first_loss) << "run " << run;
      EXPECT_EQ(mse.bytes(), first_mse) << "run " << run;
    }
  }
}

// ---- optimizers

TEST(CudaPointwise, SgdMatchesReferenceAndSkipsOnFlag) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  SgdStep step;
  step.learning_rate = 0.1;
  step.momentum = 0.9;
  step.weight_decay = 5e-4;
  for (DType t : kFloatTypes)
    for (int64_t n : kSizes) {
      SCOPED_TRACE(name(t) + " n=" + std::to_string(n));
      const Shape s{n};
      auto w = rng.uniform_in(t, n), g = rng.uniform_in(t, n), v = rng.uniform_in(t, n, -0.1, 0.1);
      DeviceArray dw(t, w), dg(t, g), dv(t, v), flag(DType::i32, Values{0.0});

      // Set flag: nothing changes, to the bit.
      flag.upload({1.0});
      const auto w_bytes = dw.bytes(), v_bytes = dv.bytes();
      pw::sgd_update(nullptr, t, dw.get(), dg.get(), dv.get(), n, step, flag.as<int32_t>());
      EXPECT_EQ(dw.bytes(), w_bytes);
      EXPECT_EQ(dv.bytes(), v_bytes);

      // Clear flag, then no flag at all: two steps, each as the reference's.
      flag.upload({0.0});
      for (const int32_t* skip : {static_cast<const int32_t*>(flag.as<int32_t>()), static_cast<const int32_t*>(nullptr)}) {
        pw::sgd_update(nullptr, t, dw.get(), dg.get(), dv.get(), n, step, skip);
        ref().sgd_update(step, host(w, s), host(g, s), host(v, s));
        const auto got_w = dw.download(), got_v = dv.download();
        ASSERT_NO_FATAL_FAILURE(expect_near(got_w, w, 2 * rel_tol(t), 1e-6, "w"));
        ASSERT_NO_FATAL_FAILURE(expect_near(got_v, v, 2 * rel_tol(t), 1e-6, "v"));
        w = got_w;  // the next step starts where the device is, so rounding does not compound
        v = got_v;
      }
    }
}

// The fused step of many parameters against sgd_update then cast, parameter by parameter: the
// same bits, over more parameters than one launch holds, sizes off the vector width and the
// per-block chunk, one misaligned parameter (the scalar path), two weight decays, each copy dtype,
// and with a partner gradient (data parallelism's mean in the update) against the host's
// (a + b) * 0.5f in f32 given to sgd_update.
TEST(CudaPointwise, SgdUpdateManyIsSgdUpdateThenCastBitForBit) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const std::vector<int64_t> sizes = {1, 3, 7, 8191, 8192, 8193, 20003};
  constexpr int kParameters = 45;
  constexpr int kMisaligned = 5;
  const SgdStep step{0.1, 0.9, 0.0, {}};
  std::vector<std::pair<bool, DType>> cases;  // (partner gradient, copy dtype; f32 = no copies)
  for (const bool partner : {false, true})
    for (const DType copy_t : {DType::f32, DType::bf16, DType::f16}) cases.emplace_back(partner, copy_t);
  for (const auto& [partner, copy_t] : cases) {
    SCOPED_TRACE("copies: " + (copy_t == DType::f32 ? std::string("none") : name(copy_t)) +
                 (partner ? ", partner gradient" : ""));
    const bool copies = copy_t != DType::f32;
    struct Side {
      std::vector<DeviceArray> w, g, v, c, partner;
    };
    Side unfused, fused;
    std::vector<pw::SgdSegment> segments;
    std::vector<int64_t> offsets;
    for (int i = 0; i < kParameters; ++i) {
      const int64_t n = sizes[static_cast<std::size_t>(i) % sizes.size()], off = i == kMisaligned ? 1 : 0;
      const auto w = rng.uniform_in(DType::f32, n + off), g = rng.uniform_in(DType::f32, n + off),
                 v = rng.uniform_in(DType::f32, n + off, -0.1, 0.1), h = rng.uniform_in(DType::f32, n + off);
      Values mean = g;  // what the fused side averages, computed as the mean kernel does
      for (std::size_t e = 0; e < mean.size(); ++e)
        mean[e] = static_cast<double>((static_cast<float>(g[e]) + static_cast<float>(h[e])) * 0.5f);
      for (Side* side : {&unfused, &fused}) {
        side->w.emplace_back(DType::f32, w);
        side->g.emplace_back(DType::f32, partner && side == &unfused ? mean : g);
        side->v.emplace_back(DType::f32, v);
        side->c.emplace_back(copy_t, Values(static_cast<std::size_t>(n + off), 0.0));
        side->partner.emplace_back(DType::f32, h);
      }
      offsets.push_back(off);
      void* copy = copies ? static_cast<unsigned char*>(fused.c.back().get()) + off * int64_t(size_bytes(copy_t)) : nullptr;
      segments.push_back({fused.w.back().as<float>() + off, fused.g.back().as<const float>() + off,
                          fused.v.back().as<float>() + off, copy, n, i % 2 == 0 ? 1e-4 : 0.0,
                          partner ? fused.partner.back().as<const float>() + off : nullptr});
    }
    const auto bytes_of = [&](const Side& side) {
      std::vector<std::vector<unsigned char>> all;
      for (int i = 0; i < kParameters; ++i)
        for (const auto* arrays : {&side.w, &side.v, &side.c}) all.push_back((*arrays)[static_cast<std::size_t>(i)].bytes());
      return all;
    };
    DeviceArray flag(DType::i32, Values{1.0});
    const auto before = bytes_of(fused);
    pw::sgd_update_many(nullptr, segments, copy_t, step, flag.as<int32_t>());
    EXPECT_TRUE(bytes_of(fused) == before) << "a set flag changed something";

    flag.upload({0.0});
    pw::sgd_update_many(nullptr, segments, copy_t, step, flag.as<int32_t>());
    pw::sgd_update_many(nullptr, segments, copy_t, step, nullptr);
    for (int run = 0; run < 2; ++run)
      for (int i = 0; i < kParameters; ++i) {
        const auto u = static_cast<std::size_t>(i);
        const int64_t off = offsets[u];
        SgdStep one = step;
        one.weight_decay = segments[u].weight_decay;
        float* w = unfused.w[u].as<float>() + off;
        pw::sgd_update(nullptr, DType::f32, w, unfused.g[u].as<float>() + off, unfused.v[u].as<float>() + off,
                       segments[u].n, one, nullptr);
        if (copies)
          pw::cast(nullptr, DType::f32, w, copy_t,
                   static_cast<unsigned char*>(unfused.c[u].get()) + off * int64_t(size_bytes(copy_t)), segments[u].n);
      }
    const auto want = bytes_of(unfused), got = bytes_of(fused);
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(got[i] == want[i]) << "parameter " << i / 3 << " (n=" << segments[i / 3].n << "), "
                                     << (i % 3 == 0 ? "w" : i % 3 == 1 ? "v" : "copy") << " differs";
  }
}

TEST(CudaPointwise, LarsMatchesReferenceAndSkipsOnFlag) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (bool adapt : {true, false})
    for (DType t : kFloatTypes)
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{2048}, int64_t{1000003}}) {
        SCOPED_TRACE(name(t) + " n=" + std::to_string(n) + (adapt ? " adapt" : " plain"));
        LarsStep step;
        step.learning_rate = 2.5;
        step.momentum = 0.9;
        step.weight_decay = 5e-5;
        step.trust_coefficient = 0.001;
        step.epsilon = 1e-9;
        step.adapt = adapt;
        const Shape s{n};
        auto w = rng.uniform_in(t, n), g = rng.uniform_in(t, n, -0.01, 0.01), v = rng.uniform_in(t, n, -1e-3, 1e-3);
        DeviceArray dw(t, w), dg(t, g), dv(t, v), flag(DType::i32, Values{1.0}), scratch(DType::f32, pw::lars_scratch_floats());

        const auto w_bytes = dw.bytes(), v_bytes = dv.bytes();
        pw::lars_update(nullptr, t, dw.get(), dg.get(), dv.get(), n, step, flag.as<int32_t>(), scratch.as<float>());
        EXPECT_EQ(dw.bytes(), w_bytes);
        EXPECT_EQ(dv.bytes(), v_bytes);

        flag.upload({0.0});
        pw::lars_update(nullptr, t, dw.get(), dg.get(), dv.get(), n, step, flag.as<int32_t>(), scratch.as<float>());
        ref().lars_update(step, host(w, s), host(g, s), host(v, s));
        ASSERT_NO_FATAL_FAILURE(expect_near(dw.download(), w, 2 * rel_tol(t), 1e-7, "w"));
        ASSERT_NO_FATAL_FAILURE(expect_near(dv.download(), v, 4 * rel_tol(t), abs_tol(t, 1e-9), "v"));
      }
}

TEST(CudaPointwise, LarsIsBitIdenticalRunToRun) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = 2359296;  // ResNet-50's largest 3x3 filter, 512 x 512 x 3 x 3
  LarsStep step;
  step.weight_decay = 5e-5;
  auto w = rng.uniform_in(DType::f32, n), g = rng.uniform_in(DType::f32, n, -0.01, 0.01),
       v = rng.uniform_in(DType::f32, n, -1e-3, 1e-3);
  DeviceArray dw(DType::f32, n), dg(DType::f32, g), dv(DType::f32, n), scratch(DType::f32, pw::lars_scratch_floats());
  std::vector<unsigned char> first_w, first_v;
  for (int run = 0; run < 3; ++run) {
    dw.upload(w);
    dv.upload(v);
    for (int s = 0; s < 3; ++s)
      pw::lars_update(nullptr, DType::f32, dw.get(), dg.get(), dv.get(), n, step, nullptr, scratch.as<float>());
    if (run == 0) {
      first_w = dw.bytes();
      first_v = dv.bytes();
    } else {
      EXPECT_EQ(dw.bytes(), first_w) << "run " << run;
      EXPECT_EQ(dv.bytes(), first_v) << "run " << run;
    }
  }
}

// ---- mixed precision

TEST(CudaPointwise, CastRoundTripsAndRoundsToNearestEven) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    // f32 -> narrow: the host's round-to-nearest-even, bit for bit; back to f32: exact.
    auto x = rng.uniform_in(DType::f32, n, -70000, 70000);
    DeviceArray src(DType::f32, x), back(DType::f32, n);
    for (DType narrow : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(name(narrow));
      DeviceArray mid(narrow, n);
      pw::cast(nullptr, DType::f32, src.get(), narrow, mid.get(), n);
      EXPECT_EQ(mid.bytes(), encode(narrow, x));
      pw::cast(nullptr, narrow, mid.get(), DType::f32, back.get(), n);
      const auto want = quantize(narrow, x);
      const auto got = back.download();
      for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;  // f16 overflow: Inf both
      // And from f64 (values f32 holds exactly, so one rounding either way).
      DeviceArray wide(DType::f64, x), mid2(narrow, n);
      pw::cast(nullptr, DType::f64, wide.get(), narrow, mid2.get(), n);
      EXPECT_EQ(mid2.bytes(), mid.bytes());
    }
    DeviceArray wide(DType::f64, n);
    pw::cast(nullptr, DType::f32, src.get(), DType::f64, wide.get(), n);
    EXPECT_EQ(wide.download(), x);
  }

  // Known cases: ties go to the even neighbour; f64 reaches a narrow type in one rounding.
  const double b = 1.0 / 256, h = 1.0 / 2048;
  struct Case {
    DType src, dst;
    double in, out;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Case> cases = {
      {DType::f32, DType::bf16, 1 + b, 1.0},              // tie, down to even
      {DType::f32, DType::bf16, 1 + 3 * b, 1 + 4 * b},    // tie, up to even
      {DType::f32, DType::bf16, 1 + b + 1.0 / (1 << 20), 1 + 2 * b},
      {DType::f32, DType::f16, 1 + h, 1.0},
      {DType::f32, DType::f16, 1 + 3 * h, 1 + 4 * h},
      {DType::f32, DType::f16, 65520.0, inf},             // the tie above 65504 rounds to Inf
      {DType::f32, DType::f16, 65519.0, 65504.0},
      {DType::bf16, DType::f16, 131072.0, inf},
      {DType::f64, DType::f32, 1 + std::ldexp(1.0, -24), 1.0},
      {DType::f64, DType::bf16, 1 + b + std::ldexp(1.0, -30), 1 + 2 * b},  // via f32 would tie to 1
      {DType::f64, DType::f16, 1 + h + std::ldexp(1.0, -40), 1 + 2 * h},
      {DType::f16, DType::bf16, 1 + b + 2 * h, 1 + 2 * b},  // exact in f16, above the bf16 tie
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(name(c.src) + " -> " + name(c.dst) + " of " + std::to_string(c.in));
    DeviceArray s(c.src, std::vector<double>{c.in, -c.in}), d(c.dst, 2);
    pw::cast(nullptr, c.src, s.get(), c.dst, d.get(), 2);
    const auto got = d.download();
    EXPECT_EQ(got[0], c.out);
    EXPECT_EQ(got[1], -c.out);
  }
  DeviceArray nan_src(DType::f32, std::vector<double>{std::nan("")}), nan_dst(DType::bf16, 1);
  pw::cast(nullptr, DType::f32, nan_src.get(), DType::bf16, nan_dst.get(), 1);
  EXPECT_TRUE(std::isnan(nan_dst.download()[0]));
}

TEST(CudaPointwise, UnscaleAndCheckFindsPlantedNonFinite) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const double scale = 1024;  // a power of two: unscaling is exact
  for (DType t : kFloatTypes)
    for (int64_t n : kSizes) {
      SCOPED_TRACE(name(t) + " n=" + std::to_string(n));
      auto g = rng.uniform_in(t, n, -60, 60);
      DeviceArray dg(t, g), dscale(DType::f32, Values{scale}), found(DType::i32, Values{0.0});
      pw::unscale_and_check(nullptr, t, dg.get(), n, dscale.as<float>(), found.as<int32_t>());
      auto want = g;
      for (auto& x : want) x /= scale;
      want = quantize(t, want);  // exact in f32; small f16 values land on subnormals
      ASSERT_NO_FATAL_FAILURE(expect_near(dg.download(), want, 0, 0, "unscaled"));
      EXPECT_EQ(found.download()[0], 0);

      for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
        SCOPED_TRACE(std::isnan(bad) ? "NaN" : "Inf");
        auto planted = g;
        const auto at = static_cast<std::size_t>(n - 1 - n / 3);
        planted[at] = bad;
        dg.upload(planted);
        pw::unscale_and_check(nullptr, t, dg.get(), n, dscale.as<float>(), found.as<int32_t>());
        EXPECT_EQ(found.download()[0], 1);
        const auto got = dg.download();
        EXPECT_FALSE(std::isfinite(got[at]));
        if (n > 1) {
          EXPECT_EQ(got[(at + 1) % got.size()], want[(at + 1) % want.size()]);
        }
        found.upload({0.0});
      }
      // Never cleared here: a set flag stays set over a finite gradient.
      found.upload({1.0});
      dg.upload(g);
      pw::unscale_and_check(nullptr, t, dg.get(), n, dscale.as<float>(), found.as<int32_t>());
      EXPECT_EQ(found.download()[0], 1);
    }
}

TEST(CudaPointwise, UpdateLossScaleFollowsGradScalerAndReference) {
  SKIP_WITHOUT_GPU();
  const LossScaleRule rule{2.0, 0.5, 3};
  DeviceArray scale(DType::f32, Values{65536.0}), good(DType::i32, Values{0.0}), found(DType::i32, Values{0.0});
  std::vector<float> rscale{65536.0f};
  std::vector<int32_t> rgood{0}, rfound{0};
  const Tensor ts = Tensor::describe(DType::f32, Shape{1}).with_data(rscale.data());
  const Tensor tg = Tensor::describe(DType::i32, Shape{1}).with_data(rgood.data());
  const Tensor tf = Tensor::describe(DType::i32, Shape{1}).with_data(rfound.data());
  struct Step {
    int found;
    double scale;
    int good;
  };
  const std::vector<Step> steps = {{0, 65536, 1}, {0, 65536, 2}, {0, 131072, 0}, {1, 65536, 0},
                                   {0, 65536, 1}, {1, 32768, 0}, {1, 16384, 0},  {0, 16384, 1}};
  for (std::size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    found.upload({double(steps[i].found)});
    rfound[0] = steps[i].found;
    pw::update_loss_scale(nullptr, rule, scale.as<float>(), good.as<int32_t>(), found.as<int32_t>());
    ref().update_loss_scale(rule, ts, tg, tf);
    EXPECT_EQ(scale.download()[0], steps[i].scale);
    EXPECT_EQ(good.download()[0], steps[i].good);
    EXPECT_EQ(found.download()[0], 0);
    EXPECT_EQ(scale.download()[0], double(rscale[0]));
    EXPECT_EQ(good.download()[0], double(rgood[0]));
  }
  // Growing past the f32 range keeps the old scale.
  const double big = 3e38;
  scale.upload({big});
  good.upload({0.0});
  pw::update_loss_scale(nullptr, LossScaleRule{2.0, 0.5, 1}, scale.as<float>(), good.as<int32_t>(),
                        found.as<int32_t>());
  EXPECT_EQ(scale.download()[0], double(static_cast<float>(big)));
  EXPECT_EQ(good.download()[0], 0);
}

TEST(CudaPointwise, FillEveryDtype) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  const double value = -1.25 + std::ldexp(std::floor(rng.uniform(1, 1, 64)[0]), -4);  // exact in every dtype
  SCOPED_TRACE(rng.trace() + " value " + std::to_string(value));
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32})
    for (int64_t n : kSizes) {
      SCOPED_TRACE(name(t) + " n=" + std::to_string(n));
      DeviceArray p(t, rng.uniform(n));
      pw::fill(nullptr, t, p.get(), n, t == DType::i32 ? 7.0 : value);
      const auto got = p.download();
      const double want = t == DType::i32 ? 7.0 : value;
      std::size_t bad = 0;
      for (double x : got) bad += x != want;
      EXPECT_EQ(bad, 0u);
    }
}

// ---- CUDA graph capture: a step's kernels record (no sync, no allocation) and replay to the
// same bits as a direct run, with the skip flag read at replay time.

TEST(CudaPointwise, CapturedStepReplaysLikeDirectRun) {
  SKIP_WITHOUT_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = 100003, rows = 64, k = 1000;
  LarsStep step;
  step.weight_decay = 5e-5;
  auto w = rng.uniform_in(DType::f32, n), g = rng.uniform_in(DType::f32, n, -10, 10),
       v = rng.uniform_in(DType::f32, n, -1e-3, 1e-3), z = rng.uniform_in(DType::f32, rows * k, -5, 5);
  std::vector<double> lv(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < lv.size(); ++i) lv[i] = double((i * 13) % k);
  DeviceArray dw(DType::f32, w), dg(DType::f32, g), dv(DType::f32, v), dz(DType::f32, z), dlabels(DType::i32, lv),
      dp(DType::f32, rows * k), dloss(DType::f32, 1), xscratch(DType::f32, pw::softmax_xent_scratch_floats(rows)),
      lscratch(DType::f32, pw::lars_scratch_floats()), scale(DType::f32, Values{8.0}), good(DType::i32, Values{0.0}),
      found(DType::i32, Values{0.0});
  const auto run = [&](cudaStream_t s) {
    pw::softmax_xent_forward(s, DType::f32, dz.get(), dlabels.as<int32_t>(), DType::f32, dp.get(), DType::f32,
                             dloss.get(), rows, k, xscratch.as<float>());
    pw::unscale_and_check(s, DType::f32, dg.get(), n, scale.as<float>(), found.as<int32_t>());
    pw::lars_update(s, DType::f32, dw.get(), dg.get(), dv.get(), n, step, found.as<int32_t>(), lscratch.as<float>());
    pw::update_loss_scale(s, LossScaleRule{2.0, 0.5, 1}, scale.as<float>(), good.as<int32_t>(), found.as<int32_t>());
  };
  const auto reset = [&] {
    dw.upload(w);
    dg.upload(g);
    dv.upload(v);
    scale.upload({8.0});
    good.upload({0.0});
    found.upload({0.0});
  };
  cudaStream_t stream = nullptr;
  AB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "test stream");
  reset();
  run(stream);
  AB_CUDA(cudaStreamSynchronize(stream), "direct run");
  const auto want_w = dw.bytes(), want_v = dv.bytes(), want_loss = dloss.bytes();
  EXPECT_NE(want_w, encode(DType::f32, w));  // the step did something
  EXPECT_EQ(scale.download()[0], 16.0);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  AB_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  run(stream);
  AB_CUDA(cudaStreamEndCapture(stream, &graph), "end capture");
  AB_CUDA(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  reset();
  AB_CUDA(cudaGraphLaunch(exec, stream), "replay");
  AB_CUDA(cudaStreamSynchronize(stream), "replay");
  EXPECT_EQ(dw.bytes(), want_w);
  EXPECT_EQ(dv.bytes(), want_v);
  EXPECT_EQ(dloss.bytes(), want_loss);

  // Replay with an Inf in the gradient: the device flag skips the update, the scale backs off.
  reset();
  auto bad = g;
  bad[17] = std::numeric_limits<double>::infinity();
  dg.upload(bad);
  AB_CUDA(cudaGraphLaunch(exec, stream), "replay with Inf");
  AB_CUDA(cudaStreamSynchronize(stream), "replay with Inf");
  EXPECT_EQ(dw.bytes(), encode(DType::f32, w));
  EXPECT_EQ(dv.bytes(), encode(DType::f32, v));
  EXPECT_EQ(scale.download()[0], 4.0);
  EXPECT_EQ(found.download()[0], 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace ab::nn
