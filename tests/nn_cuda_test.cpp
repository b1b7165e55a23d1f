// Tests for the CUDA engine kernels (nn/cuda): cuDNN convolution (strides, padding, dilation,
// groups, 1x1, NCHW and NHWC), batch norm (cuDNN and the project's NHWC kernels: training,
// inference, backward), the project's depthwise convolution and max pooling, and the cuBLASLt
// linear layer against the reference kernels in f64 on the same dtype-rounded random inputs; the
// algorithm cache and its timed choices,
// out-of-memory, CUDA-graph capture and deterministic mode; then whole models: a tiny ResNet's
// logits and gradients against the reference, every kernel call of a ResNet-50 step (64x64)
// against the reference on the GPU's own operands plus its logits and loss, and a tiny ResNet
// learning on the GPU; the fused bias_act epilogue and a folded tiny ResNet's inference. Skips
// where no GPU answers (the check of the per-call check runs anyway).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/compression.h"
#include "models/resnet.h"
#include "nn/cuda/device_kernels.h"
#include "nn/cuda/kernels.h"
#include "nn/cuda/spatial.h"
#include "nn/ops.h"
#include "nn/optim.h"
#include "nn/ref/ref_kernels.h"
#include "test_support.h"

namespace ab::nn {
namespace {

bool has_gpu() { return backend::cuda::device_count() > 0; }

#define SKIP_WITHOUT_GPU() \
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)"

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// Tolerance relative to the largest reference value: rounding of the stored result plus f32
// (or TF32, or f16/bf16 operand) arithmetic against the f64 oracle.
double tolerance(DType t, bool tf32 = false) {
  if (t == DType::bf16) return 3e-2;
  if (t == DType::f16) return 1e-2;
  return tf32 ? 5e-3 : 1e-4;
}

// A tensor on the GPU in `dtype` and its twin in f64 on the host for the reference kernels,
// holding the same values (the GPU's rounded ones).
struct Twin {
  Buffer dev_buf, ref_buf;
  Tensor dev, ref;
};

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    backend_ = backend::make_backend("cuda:0");
    cuda_ = make_cuda_kernels(*backend_);
    ref_ = make_ref_kernels();
  }

  Twin twin(DType dtype, const Shape& shape, Layout layout, const std::vector<double>& values) {
    Twin t;
    const Layout l = shape.rank() == 4 ? layout : Layout::nchw;
    const Tensor d = Tensor::describe(dtype, shape, l, DeviceKind::cuda);
    const Tensor r = Tensor::describe(DType::f64, shape, l);
    t.dev_buf = Buffer(cuda_->allocator(), d.size_bytes());
    t.ref_buf = Buffer(ref_->allocator(), r.size_bytes());
    t.dev = t.dev_buf.view(d);
    t.ref = t.ref_buf.view(r);
    std::vector<unsigned char> host(sz(d.size_bytes()));
    const Tensor staging = Tensor::describe(dtype, shape, l).with_data(host.data());
    write_host(staging, values);
    cuda_->upload(t.dev, host.data());
    write_host(t.ref, read_host(staging));  // the rounded values
    return t;
  }

  Twin random(DType dtype, const Shape& shape, Layout layout = Layout::nchw, double lo = -1, double hi = 1) {
    std::vector<double> v(sz(shape.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = uniform(seed_, counter_++, lo, hi);
    return twin(dtype, shape, layout, v);
  }

  std::vector<double> read(const Tensor& dev) {
    std::vector<unsigned char> host(sz(dev.size_bytes()));
    cuda_->download(dev, host.data());
    Tensor staging = dev;
    staging.data = host.data();
    staging.device = DeviceKind::host;
    return read_host(staging);
  }

  // max |gpu - ref| <= tol * max |ref|, reporting the worst element.
  void expect_close(const Twin& t, double tol, const std::string& what) {
    const auto got = read(t.dev), want = read_host(t.ref);
    ASSERT_EQ(got.size(), want.size());
    double scale = 0, worst = 0;
    std::size_t at = 0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < got.size(); ++i)
      if (!(std::abs(got[i] - want[i]) <= worst)) {
        worst = std::isnan(got[i]) ? INFINITY : std::abs(got[i] - want[i]);
        at = i;
      }
    EXPECT_GT(scale, 0) << what << ": an all-zero reference checks nothing";
    EXPECT_LE(worst, tol * scale) << what << ": worst element " << at << " gpu " << got[at] << " ref " << want[at]
                                  << " (max |ref| " << scale << ", seed " << seed_ << ")";
  }

  void captured_step_matches_direct_calls(DType t);

  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<Kernels> cuda_, ref_;
  std::uint64_t seed_ = test::seed();
  std::uint64_t counter_ = 0;
};

// ---------------------------------------------------------------------------------------------
// without a GPU: what is refused before any device work

TEST(CudaKernelsRefusal, NonCudaBackendIsRefusedByName) {
  const auto cpu = backend::make_backend("cpu");
  const std::string msg = test::error_message<Error>([&] { make_cuda_kernels(*cpu); });
  EXPECT_NE(msg.find("'cpu' is not a CUDA backend"), std::string::npos) << msg;
  EXPECT_EQ(make_device_kernels(*cpu)->name(), "ref");
}

TEST_F(CudaKernelsTest, CheckTensorRefusesWhatTheGpuCannotStore) {
  EXPECT_EQ(make_device_kernels(*backend_)->name(), "cuda");
  const std::string f64 =
      test::error_message<Unsupported>([&] { cuda_->check_tensor(Tensor::describe(DType::f64, Shape{2, 3})); });
  EXPECT_NE(f64.find("not f64"), std::string::npos) << f64;
  // fp8 is stored by the fp8 layers themselves, never as a graph tensor; integers (indices, masks) are.
  EXPECT_THROW(cuda_->check_tensor(Tensor::describe(DType::f8e4m3, Shape{4})), Unsupported);
  Tensor strided = Tensor::describe(DType::f32, Shape{2, 3, 4, 5});
  strided.strides = Strides{60, 1, 15, 3};  // neither NCHW nor NHWC
  EXPECT_THROW(cuda_->check_tensor(strided), Unsupported);
  cuda_->check_tensor(Tensor::describe(DType::bf16, Shape{2, 8, 4, 4}, Layout::nhwc));
  for (DType integer : {DType::i8, DType::i32, DType::i64}) cuda_->check_tensor(Tensor::describe(integer, Shape{2}));
}

// ---------------------------------------------------------------------------------------------
// convolution

struct ConvCase {
  const char* name;
  std::int64_t n, c, h, w, k, r, s;
  Conv2dDesc d;
  Layout layout;
  DType dtype;
  bool tf32 = false;
};

std::int64_t out_extent(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t pad, std::int64_t dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

TEST_F(CudaKernelsTest, ConvolutionMatchesReferenceInEveryConfiguration) {
  const std::vector<ConvCase> cases{
      {"3x3 stride 2 pad 1 nchw f32", 2, 8, 9, 9, 16, 3, 3, {2, 2, 1, 1, 1, 1, 1}, Layout::nchw, DType::f32},
      {"3x3 dilation 2 nhwc f32", 2, 16, 10, 10, 8, 3, 3, {1, 1, 2, 2, 2, 2, 1}, Layout::nhwc, DType::f32},
      {"1x3 stride 1x2 pad 0x1 nchw f32", 3, 4, 6, 11, 6, 1, 3, {1, 2, 0, 1, 1, 1, 1}, Layout::nchw, DType::f32},
      {"grouped 32 (ResNeXt) nhwc f32", 2, 128, 8, 8, 128, 3, 3, {1, 1, 1, 1, 1, 1, 32}, Layout::nhwc, DType::f32},
      {"grouped 32 stride 2 nhwc bf16", 2, 128, 8, 8, 128, 3, 3, {2, 2, 1, 1, 1, 1, 32}, Layout::nhwc, DType::bf16},
      {"1x1 nhwc bf16", 4, 64, 7, 7, 256, 1, 1, {}, Layout::nhwc, DType::bf16},
      {"1x1 stride 2 nchw f16", 2, 32, 8, 8, 64, 1, 1, {2, 2, 0, 0, 1, 1, 1}, Layout::nchw, DType::f16},
      {"7x7 stride 2 stem nhwc bf16", 2, 3, 32, 32, 64, 7, 7, {2, 2, 3, 3, 1, 1, 1}, Layout::nhwc, DType::bf16},
      {"3x3 nhwc f16", 2, 32, 12, 12, 32, 3, 3, {1, 1, 1, 1, 1, 1, 1}, Layout::nhwc, DType::f16},
      {"3x3 nhwc tf32", 2, 32, 12, 12, 32, 3, 3, {1, 1, 1, 1, 1, 1, 1}, Layout::nhwc, DType::f32, true},
  };
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.name);
    cuda_->set_tf32(c.tf32);
    const Conv2dDesc& d = c.d;
    const Shape ys{c.n, c.k, out_extent(c.h, c.r, d.stride_h, d.pad_h, d.dilation_h),
                   out_extent(c.w, c.s, d.stride_w, d.pad_w, d.dilation_w)};
    Twin x = random(c.dtype, Shape{c.n, c.c, c.h, c.w}, c.layout);
    Twin w = random(c.dtype, Shape{c.k, c.c / d.groups, c.r, c.s}, c.layout);
    Twin y = random(c.dtype, ys, c.layout);
    const std::int64_t ws_bytes = cuda_->conv2d_prepare(d, x.dev, w.dev, y.dev, ConvPasses{});
    ASSERT_GE(ws_bytes, 0);
    Buffer ws(cuda_->allocator(), ws_bytes);
    const Workspace space{ws.data(), ws_bytes};
    const double tol = tolerance(c.dtype, c.tf32);

    cuda_->conv2d_forward(d, x.dev, w.dev, y.dev, space);
    ref_->conv2d_forward(d, x.ref, w.ref, y.ref, {});
    ASSERT_NO_FATAL_FAILURE(expect_close(y, tol, "forward"));

    Twin dy = random(c.dtype, ys, c.layout);
    for (bool accumulate : {false, true}) {
      Twin dx = random(c.dtype, x.dev.shape, c.layout);  // old values, kept by accumulate
      cuda_->conv2d_backward_data(d, dy.dev, w.dev, dx.dev, accumulate, space);
      ref_->conv2d_backward_data(d, dy.ref, w.ref, dx.ref, accumulate, {});
      ASSERT_NO_FATAL_FAILURE(expect_close(dx, tol, accumulate ? "backward data, accumulate" : "backward data"));
    }
    Twin dw = random(c.dtype, w.dev.shape, c.layout);
    cuda_->conv2d_backward_filter(d, x.dev, dy.dev, dw.dev, space);
    ref_->conv2d_backward_filter(d, x.ref, dy.ref, dw.ref, {});
    ASSERT_NO_FATAL_FAILURE(expect_close(dw, tol, "backward filter"));
  }
}

TEST_F(CudaKernelsTest, IdenticalConvolutionsSearchOnce) {
  const auto& stats = cuda_kernel_stats(*cuda_);
  EXPECT_EQ(stats.conv_searches, 0);
  const Conv2dDesc d{1, 1, 1, 1, 1, 1, 1};
  const Tensor x = Tensor::describe(DType::bf16, Shape{4, 64, 14, 14}, Layout::nhwc, DeviceKind::cuda);
  const Tensor w = Tensor::describe(DType::bf16, Shape{64, 64, 3, 3}, Layout::nhwc, DeviceKind::cuda);
  const std::int64_t first = cuda_->conv2d_prepare(d, x, w, x, ConvPasses{});  // descriptors only: no data needed
  EXPECT_EQ(stats.conv_searches, 1);
  EXPECT_EQ(stats.conv_pass_searches, 3);
  EXPECT_EQ(cuda_->conv2d_prepare(d, x, w, x, ConvPasses{}), first);  // a second identical layer
  EXPECT_EQ(stats.conv_searches, 1);
  EXPECT_EQ(stats.conv_pass_searches, 3);
  EXPECT_EQ(stats.conv_cache_hits, 1);
  const Tensor x2 = Tensor::describe(DType::bf16, Shape{4, 64, 7, 7}, Layout::nhwc, DeviceKind::cuda);
  cuda_->conv2d_prepare(d, x2, w, x2, ConvPasses{});  // another shape searches
  EXPECT_EQ(stats.conv_searches, 2);
  cuda_->set_deterministic(true);  // the mode is part of the key
  cuda_->conv2d_prepare(d, x, w, x, ConvPasses{});
  EXPECT_EQ(stats.conv_searches, 3);
  EXPECT_THROW(cuda_kernel_stats(*ref_), Error);
}

// A layer searches only the passes it runs. An inference layer's plan is forward only; a first
// layer in training adds backward-filter and a later layer of the same configuration
// backward-data, each extending the one cached plan; a pass never prepared throws, naming the
// shape and the pass, instead of running without an algorithm.
TEST_F(CudaKernelsTest, ConvolutionSearchesOnlyThePassesALayerRunsAndExtendsTheCachedPlan) {
  const auto& stats = cuda_kernel_stats(*cuda_);
  const DType t = DType::bf16;
  const Conv2dDesc d{1, 1, 1, 1, 1, 1, 1};
  Twin x = random(t, Shape{4, 32, 10, 10}, Layout::nhwc), w = random(t, Shape{32, 32, 3, 3}, Layout::nhwc);
  Twin y = random(t, Shape{4, 32, 10, 10}, Layout::nhwc), dy = random(t, Shape{4, 32, 10, 10}, Layout::nhwc);
  Twin dx = random(t, x.dev.shape, Layout::nhwc), dw = random(t, w.dev.shape, Layout::nhwc);
  const std::int64_t fwd_bytes = cuda_->conv2d_prepare(d, x.dev, w.dev, y.dev, ConvPasses{false, false});
  EXPECT_EQ(stats.conv_searches, 1);
  EXPECT_EQ(stats.conv_pass_searches, 1);
  EXPECT_EQ(stats.conv_cache_hits, 0);
  Buffer fwd_ws(cuda_->allocator(), fwd_bytes);
  cuda_->conv2d_forward(d, x.dev, w.dev, y.dev, {fwd_ws.data(), fwd_bytes});
  ref_->conv2d_forward(d, x.ref, w.ref, y.ref, {});
  ASSERT_NO_FATAL_FAILURE(expect_close(y, tolerance(t), "forward"));
  for (const char* pass : {"backward-data", "backward-filter"}) {
    const bool data = std::string(pass) == "backward-data";
    // No workspace: the missing search is what must be reported.
    const std::string msg = test::error_message<Error>([&] {
      if (data)
        cuda_->conv2d_backward_data(d, dy.dev, w.dev, dx.dev, false, {});
      else
        cuda_->conv2d_backward_filter(d, x.dev, dy.dev, dw.dev, {});
    });
    EXPECT_NE(msg.find(std::string("the ") + pass + " pass was not prepared"), std::string::npos) << msg;
    EXPECT_NE(msg.find("conv2d x " + x.dev.to_string()), std::string::npos) << msg;
  }
  EXPECT_EQ(stats.conv_pass_searches, 1) << "a refused call must not search";

  // A first layer in training: backward-filter, no backward-data.
  const std::int64_t filter_bytes = cuda_->conv2d_prepare(d, x.dev, w.dev, y.dev, ConvPasses{false, true});
  EXPECT_EQ(stats.conv_searches, 1);
  EXPECT_EQ(stats.conv_pass_searches, 2);
  EXPECT_GE(filter_bytes, fwd_bytes);
  Buffer filter_ws(cuda_->allocator(), filter_bytes);
  cuda_->conv2d_backward_filter(d, x.dev, dy.dev, dw.dev, {filter_ws.data(), filter_bytes});
  ref_->conv2d_backward_filter(d, x.ref, dy.ref, dw.ref, {});
  ASSERT_NO_FATAL_FAILURE(expect_close(dw, tolerance(t), "backward filter"));
  EXPECT_THROW(cuda_->conv2d_backward_data(d, dy.dev, w.dev, dx.dev, false, {filter_ws.data(), filter_bytes}),
               Error);

  // A later layer of the same configuration: every pass.
  const std::int64_t all_bytes = cuda_->conv2d_prepare(d, x.dev, w.dev, y.dev, ConvPasses{});
  EXPECT_EQ(stats.conv_searches, 1);
  EXPECT_EQ(stats.conv_pass_searches, 3);
  EXPECT_EQ(stats.conv_cache_hits, 0);
  EXPECT_GE(all_bytes, filter_bytes);
  Buffer all_ws(cuda_->allocator(), all_bytes);
  cuda_->conv2d_backward_data(d, dy.dev, w.dev, dx.dev, false, {all_ws.data(), all_bytes});
  ref_->conv2d_backward_data(d, dy.ref, w.ref, dx.ref, false, {});
  ASSERT_NO_FATAL_FAILURE(expect_close(dx, tolerance(t), "backward data"));

  // Answered from the cache, each with the workspace of its own passes only.
  EXPECT_EQ(cuda_->conv2d_prepare(d, x.dev, w.dev, y.dev, ConvPasses{}), all_bytes);
  EXPECT_EQ(cuda_->conv2d_prepare(d, x.dev, w.dev, y.dev, ConvPasses{false, false}), fwd_bytes);
  EXPECT_EQ(stats.conv_pass_searches, 3);
  EXPECT_EQ(stats.conv_cache_hits, 2);
}

// An inference graph binds with forward searches only.
TEST_F(CudaKernelsTest, InferenceGraphSearchesOnlyForwardConvolutions) {
  GraphOptions o;
  o.training = false;
  o.layout = Layout::nhwc;
  o.dtype = DType::bf16;
  GraphBuilder b(o);
  const models::Classifier m = models::build_classifier(b, models::tiny_resnet(1, 4), 4, 8);
  Graph g(std::move(b));
  g.bind(*cuda_);
  const auto& stats = cuda_kernel_stats(*cuda_);
  EXPECT_GT(stats.conv_searches, 1);
  EXPECT_EQ(stats.conv_pass_searches, stats.conv_searches);
  g.set_input(m.images, std::vector<double>(sz(4 * 8 * 8), 0.5));
  g.set_input(m.labels, {0, 1, 2, 3});
  g.forward(false);
  EXPECT_EQ(g.read(m.logits).size(), sz(4 * 4));
}

TEST_F(CudaKernelsTest, DeterministicModeGivesBitIdenticalGradients) {
  cuda_->set_deterministic(true);
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(to_string(t)));
    // Many images reduced into few filter taps: where non-deterministic algorithms would split the sum.
    const Conv2dDesc d{1, 1, 1, 1, 1, 1, 1};
    const Shape xs{32, 64, 28, 28}, wsh{64, 64, 3, 3};
    Twin x = random(t, xs, Layout::nhwc), dy = random(t, xs, Layout::nhwc), w = random(t, wsh, Layout::nhwc);
    Twin dx = random(t, xs, Layout::nhwc), dw = random(t, wsh, Layout::nhwc);
    const std::int64_t ws_bytes = cuda_->conv2d_prepare(d, x.dev, w.dev, dy.dev, ConvPasses{});
    Buffer ws(cuda_->allocator(), ws_bytes);
    auto run = [&] {
      cuda_->conv2d_backward_filter(d, x.dev, dy.dev, dw.dev, {ws.data(), ws_bytes});
      cuda_->conv2d_backward_data(d, dy.dev, w.dev, dx.dev, false, {ws.data(), ws_bytes});
      std::vector<unsigned char> gw(sz(dw.dev.size_bytes())), gx(sz(dx.dev.size_bytes()));
      cuda_->download(dw.dev, gw.data());
      cuda_->download(dx.dev, gx.data());
      return std::pair{gw, gx};
    };
    const auto first = run();
    const auto second = run();
    EXPECT_EQ(first.first, second.first) << "backward filter differs between two runs";
    EXPECT_EQ(first.second, second.second) << "backward data differs between two runs";
  }
}

// ---------------------------------------------------------------------------------------------
// batch norm and pooling

// NHWC runs the project's kernels (cuda_batchnorm) except 16-bit training (cuDNN's persistent
// path); NCHW runs cuDNN. Odd channel counts take narrow vectors, row counts that fill no tile
// evenly take the tail paths, several channel and row blocks take the two-stage reduction, and
// a mean far from zero checks that the variance loses no digits to cancellation.
TEST_F(CudaKernelsTest, BatchNormMatchesReferenceInTrainingInferenceAndBackward) {
  struct Case {
    Layout layout;
    DType dtype;
    Shape shape;
    double lo = -2, hi = 3;
  };
  const std::vector<Case> cases = {
      {Layout::nchw, DType::f32, Shape{4, 16, 5, 6}},     {Layout::nhwc, DType::f32, Shape{4, 16, 5, 6}},
      {Layout::nhwc, DType::f32, Shape{3, 3, 7, 5}},      {Layout::nhwc, DType::f32, Shape{2, 1000, 3, 3}},
      {Layout::nhwc, DType::f32, Shape{4, 320, 17, 19}},  {Layout::nhwc, DType::f32, Shape{2, 8, 9, 9}, 100, 101},
      {Layout::nhwc, DType::f32, Shape{1, 7, 1, 1}},      {Layout::nhwc, DType::bf16, Shape{4, 16, 5, 6}},
      {Layout::nhwc, DType::bf16, Shape{2, 1000, 3, 3}},  {Layout::nhwc, DType::f16, Shape{4, 16, 5, 6}},
      {Layout::nhwc, DType::f16, Shape{3, 3, 7, 5}},      {Layout::nhwc, DType::f16, Shape{4, 320, 17, 19}},
      {Layout::nchw, DType::bf16, Shape{4, 16, 5, 6}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(to_string(c.layout)) + " " + std::string(to_string(c.dtype)) + " " + c.shape.to_string());
    const Shape& xs = c.shape;
    const std::int64_t ch = xs[1];
    const BatchNormDesc d{1e-5, 0.1};
    const double tol = tolerance(c.dtype);
    Twin x = random(c.dtype, xs, c.layout, c.lo, c.hi);
    cuda_->check_tensor(x.dev);  // as binding does: sizes the batch-norm workspaces
    // Parameters and statistics stay f32 whatever the activations' dtype.
    Twin gamma = random(DType::f32, Shape{ch}, Layout::nchw, 0.5, 1.5);
    Twin beta = random(DType::f32, Shape{ch}, Layout::nchw, -0.5, 0.5);
    Twin rmean = random(DType::f32, Shape{ch}, Layout::nchw, -0.2, 0.2);
    Twin rvar = random(DType::f32, Shape{ch}, Layout::nchw, 0.5, 1.5);
    Twin smean = random(DType::f32, Shape{ch}), sinv = random(DType::f32, Shape{ch});
    Twin y = random(c.dtype, xs, c.layout);

    cuda_->batchnorm_forward_training(d, x.dev, gamma.dev, beta.dev, rmean.dev, rvar.dev, y.dev, smean.dev, sinv.dev);
    ref_->batchnorm_forward_training(d, x.ref, gamma.ref, beta.ref, rmean.ref, rvar.ref, y.ref, smean.ref, sinv.ref);
    ASSERT_NO_FATAL_FAILURE(expect_close(y, tol, "training y"));
    ASSERT_NO_FATAL_FAILURE(expect_close(smean, tol, "saved mean"));
    ASSERT_NO_FATAL_FAILURE(expect_close(sinv, tol, "saved inverse std"));
    ASSERT_NO_FATAL_FAILURE(expect_close(rmean, tol, "running mean (momentum)"));
    ASSERT_NO_FATAL_FAILURE(expect_close(rvar, tol, "running variance (unbiased)"));

    // One value per channel (N*H*W = 1): every dx is 0 whatever the kernel, nothing to compare.
    if (xs[0] * xs[2] * xs[3] > 1) {
      Twin dy = random(c.dtype, xs, c.layout);
      for (bool accumulate : {false, true}) {
        Twin dx = random(c.dtype, xs, c.layout);
        Twin dgamma = random(DType::f32, Shape{ch}), dbeta = random(DType::f32, Shape{ch});
        cuda_->batchnorm_backward(d, x.dev, dy.dev, gamma.dev, smean.dev, sinv.dev, dx.dev, accumulate, dgamma.dev,
                                  dbeta.dev);
        ref_->batchnorm_backward(d, x.ref, dy.ref, gamma.ref, smean.ref, sinv.ref, dx.ref, accumulate, dgamma.ref,
                                 dbeta.ref);
        ASSERT_NO_FATAL_FAILURE(expect_close(dx, tol, accumulate ? "dx, accumulate" : "dx"));
        ASSERT_NO_FATAL_FAILURE(expect_close(dgamma, tol, "dgamma"));
        ASSERT_NO_FATAL_FAILURE(expect_close(dbeta, tol, "dbeta"));
      }
    }

    Twin yi = random(c.dtype, xs, c.layout);
    cuda_->batchnorm_forward_inference(d, x.dev, gamma.dev, beta.dev, rmean.dev, rvar.dev, yi.dev);
    ref_->batchnorm_forward_inference(d, x.ref, gamma.ref, beta.ref, rmean.ref, rvar.ref, yi.ref);
    ASSERT_NO_FATAL_FAILURE(expect_close(yi, tol, "inference y"));
  }
}

// The fused inference epilogue (a folded batch norm's shift, the residual add, ReLU) against the
// reference on the same rounded inputs: every storage type, both layouts, residual and ReLU on and
// off, channel counts off the vector width (the channel index steps across chunks) and on it.
TEST_F(CudaKernelsTest, BiasActivationMatchesReferenceInEveryConfiguration) {
  const std::vector<Shape> shapes = {Shape{2, 13, 5, 7}, Shape{4, 64, 8, 8}, Shape{1, 3, 1, 1}};
  int compared = 0;
  for (const Shape& xs : shapes)
    for (Layout layout : {Layout::nchw, Layout::nhwc})
      for (DType t : {DType::f32, DType::bf16, DType::f16})
        for (bool residual : {false, true})
          for (bool relu : {false, true}) {
            // The bias in f32 (a batch-norm parameter) or, every other case, in the data's type (a fused
            // convolution's, when its epilogue runs here).
            const DType bias_t = compared % 2 == 0 ? DType::f32 : t;
            SCOPED_TRACE(xs.to_string() + " " + std::string(to_string(layout)) + " " + std::string(to_string(t)) +
                         (residual ? " residual" : "") + (relu ? " relu" : "") + " bias " +
                         std::string(to_string(bias_t)));
            // Random in [-2, 2], but the first element kept above and the last below every bias +
            // residual (each within [-1, 1]): ReLU both passes and clamps, even on the 3-element shape.
            std::vector<double> xv(sz(xs.numel()));
            for (double& v : xv) v = uniform(seed_, counter_++, -2, 2);
            xv.front() = 3;
            xv.back() = -3;
            Twin x = twin(t, xs, layout, xv);
            Twin bias = random(bias_t, Shape{xs[1]}, Layout::nchw, -1, 1);
            Twin r = random(t, xs, layout, -1, 1);
            Twin y = random(t, xs, layout);  // old values, all overwritten
            cuda_->bias_activation_forward(x.dev, bias.dev, residual ? r.dev : Tensor{}, y.dev, relu);
            ref_->bias_activation_forward(x.ref, bias.ref, residual ? r.ref : Tensor{}, y.ref, relu);
            ASSERT_NO_FATAL_FAILURE(expect_close(y, tolerance(t), "y"));
            if (relu) {
              const auto got = read(y.dev);
              EXPECT_GE(*std::min_element(got.begin(), got.end()), 0.0);
            }
            ++compared;
          }
  EXPECT_EQ(compared, 3 * 2 * 3 * 2 * 2);
  // Refused with the reason: a bias in another 16-bit type, a residual of another layout.
  const Shape s{2, 8, 3, 3};
  Twin x = random(DType::bf16, s, Layout::nhwc), y = random(DType::bf16, s, Layout::nhwc);
  Twin f16 = random(DType::f16, Shape{8});
  EXPECT_THROW(cuda_->bias_activation_forward(x.dev, f16.dev, Tensor{}, y.dev, true), Unsupported);
  Twin b = random(DType::f32, Shape{8}), r = random(DType::bf16, s, Layout::nchw);
  EXPECT_THROW(cuda_->bias_activation_forward(x.dev, b.dev, r.dev, y.dev, true), Unsupported);
}

// The folded epilogue inside the convolution: cuDNN's fused call where it timed faster, else the
// plain forward and bias_act, against the reference in the shapes of a ResNeXt block (1x1, grouped
// 3x3 with stride 2, the 7x7 stem), with and without a residual and ReLU. y starts as NaN: without a
// residual cuDNN is handed y as its (unread, alpha2 = 0) z, and a read would show.
TEST_F(CudaKernelsTest, ConvBiasActivationMatchesReferenceFusedOrNot) {
  const std::vector<ConvCase> cases{
      {"1x1 nhwc f16", 2, 64, 8, 8, 256, 1, 1, {}, Layout::nhwc, DType::f16},
      {"grouped 32 stride 2 nhwc bf16", 2, 128, 8, 8, 128, 3, 3, {2, 2, 1, 1, 1, 1, 32}, Layout::nhwc, DType::bf16},
      {"7x7 stride 2 stem nhwc f16", 1, 3, 32, 32, 64, 7, 7, {2, 2, 3, 3, 1, 1, 1}, Layout::nhwc, DType::f16},
      {"3x3 nchw f32", 2, 16, 9, 9, 32, 3, 3, {1, 1, 1, 1, 1, 1, 1}, Layout::nchw, DType::f32},
  };
  int fused = 0, compared = 0;
  for (const ConvCase& c : cases)
    for (bool residual : {false, true})
      for (bool relu : {false, true}) {
        SCOPED_TRACE(std::string(c.name) + (residual ? " residual" : "") + (relu ? " relu" : ""));
        const Conv2dDesc& d = c.d;
        const Shape ys{c.n, c.k, out_extent(c.h, c.r, d.stride_h, d.pad_h, d.dilation_h),
                       out_extent(c.w, c.s, d.stride_w, d.pad_w, d.dilation_w)};
        Twin x = random(c.dtype, Shape{c.n, c.c, c.h, c.w}, c.layout);
        Twin w = random(c.dtype, Shape{c.k, c.c / d.groups, c.r, c.s}, c.layout, -0.3, 0.3);
        Twin bias = random(c.dtype, Shape{c.k}, Layout::nchw, -0.5, 0.5);
        Twin r = random(c.dtype, ys, c.layout);
        std::vector<double> nan(sz(ys.numel()), std::numeric_limits<double>::quiet_NaN());
        Twin y = twin(c.dtype, ys, c.layout, nan);
        const Tensor res = residual ? r.dev : Tensor{};
        const std::int64_t ws_bytes = cuda_->conv2d_bias_activation_prepare(d, x.dev, w.dev, bias.dev, res, y.dev, relu);
        Buffer ws(cuda_->allocator(), ws_bytes);
        cuda_->conv2d_bias_activation_forward(d, x.dev, w.dev, bias.dev, res, y.dev, relu, {ws.data(), ws_bytes});
        ref_->conv2d_bias_activation_forward(d, x.ref, w.ref, bias.ref, residual ? r.ref : Tensor{}, y.ref, relu, {});
        ASSERT_NO_FATAL_FAILURE(expect_close(y, tolerance(c.dtype), "y"));
        if (relu) {
          const auto got = read(y.dev);
          EXPECT_GE(*std::min_element(got.begin(), got.end()), 0.0);
        }
        ++compared;
      }
  // Which path each configuration took, and the times that decided it (informational: a path is
  // chosen by timing on this GPU).
  for (const std::string& line : cuda_conv_choices(*cuda_))
    if (line.find(": epilogue") != std::string::npos) {
      fused += line.find(": fused (") != std::string::npos ? 1 : 0;
      std::printf("%s\n", line.c_str());
    }
  EXPECT_EQ(compared, 4 * 2 * 2);
  std::printf("conv_bias_act: %d of 16 configurations fused\n", fused);
  const Kernels::FusionCounts counts = cuda_->fusion_counts();  // what records report
  EXPECT_EQ(counts.fused, fused);
  EXPECT_EQ(counts.fused + counts.unfused, 16);
}

// The project's depthwise kernel, called directly (the convolution search runs it only where it
// times faster than cuDNN): every vector width (C a multiple of 8, 4, 2, 1), strides, dilations and
// padding, with and without bias, residual and ReLU, against the reference's conv + bias + act.
TEST_F(CudaKernelsTest, DepthwiseKernelMatchesReferenceInEveryConfiguration) {
  const std::vector<ConvCase> cases{
      {"7x7 pad 3 (ConvNeXt) f16", 2, 96, 14, 13, 96, 7, 7, {1, 1, 3, 3, 1, 1, 96}, Layout::nhwc, DType::f16},
      {"3x3 stride 2 pad 1 bf16", 2, 32, 11, 12, 32, 3, 3, {2, 2, 1, 1, 1, 1, 32}, Layout::nhwc, DType::bf16},
      {"5x5 dilation 2 pad 4 f32", 1, 12, 10, 9, 12, 5, 5, {1, 1, 4, 4, 2, 2, 12}, Layout::nhwc, DType::f32},
      {"3x5 stride 1x2 pad 1x2 f16, C 6", 3, 6, 7, 9, 6, 3, 5, {1, 2, 1, 2, 1, 1, 6}, Layout::nhwc, DType::f16},
      {"3x3 no pad f32, C 5", 2, 5, 6, 6, 5, 3, 3, {1, 1, 0, 0, 1, 1, 5}, Layout::nhwc, DType::f32},
  };
  for (const ConvCase& c : cases)
    for (int variant = 0; variant < 4; ++variant) {
      const bool bias_on = variant != 0, residual = variant >= 2, relu = variant == 1 || variant == 3;
      SCOPED_TRACE(std::string(c.name) + (bias_on ? " bias" : "") + (residual ? " residual" : "") +
                   (relu ? " relu" : ""));
      const Conv2dDesc& d = c.d;
      const Shape ys{c.n, c.k, out_extent(c.h, c.r, d.stride_h, d.pad_h, d.dilation_h),
                     out_extent(c.w, c.s, d.stride_w, d.pad_w, d.dilation_w)};
      Twin x = random(c.dtype, Shape{c.n, c.c, c.h, c.w}, c.layout);
      Twin w = random(c.dtype, Shape{c.k, 1, c.r, c.s}, c.layout, -0.3, 0.3);
      Twin bias = random(c.dtype, Shape{c.k}, Layout::nchw, -0.5, 0.5);
      Twin r = random(c.dtype, ys, c.layout);
      Twin y = twin(c.dtype, ys, c.layout, std::vector<double>(sz(ys.numel()), std::nan("")));
      ASSERT_EQ(cuda_spatial::depthwise_refusal(d, x.dev, w.dev, y.dev), "");
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      cuda_spatial::depthwise_forward(nullptr, d, x.dev, w.dev, bias_on ? bias.dev.data : nullptr, true,
                                      residual ? r.dev.data : nullptr, y.dev, relu);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (bias_on)
        ref_->conv2d_bias_activation_forward(d, x.ref, w.ref, bias.ref, residual ? r.ref : Tensor{}, y.ref, relu, {});
      else ref_->conv2d_forward(d, x.ref, w.ref, y.ref, {});
      ASSERT_NO_FATAL_FAILURE(expect_close(y, tolerance(c.dtype), "y"));
    }
  // What it refuses goes to cuDNN: NCHW, a filter per several channels.
  const Tensor nchw = Tensor::describe(DType::f16, Shape{1, 8, 4, 4}, Layout::nchw, DeviceKind::cuda);
  const Tensor filters = Tensor::describe(DType::f16, Shape{8, 1, 3, 3}, Layout::nchw, DeviceKind::cuda);
  EXPECT_NE(cuda_spatial::depthwise_refusal({1, 1, 1, 1, 1, 1, 8}, nchw, filters, nchw), "");
  const Tensor nhwc = Tensor::describe(DType::f16, Shape{1, 8, 4, 4}, Layout::nhwc, DeviceKind::cuda);
  const Tensor grouped = Tensor::describe(DType::f16, Shape{8, 2, 3, 3}, Layout::nhwc, DeviceKind::cuda);
  EXPECT_NE(cuda_spatial::depthwise_refusal({1, 1, 1, 1, 1, 1, 4}, nhwc, grouped, nhwc), "");
}

// Through the kernels' API, a ConvNeXt-sized depthwise layer: whichever path the search picks
// (printed with its times), forward and the fused epilogue match the reference.
TEST_F(CudaKernelsTest, DepthwiseConvolutionMatchesReferenceWhicheverPathIsChosen) {
  const Conv2dDesc d{1, 1, 3, 3, 1, 1, 192};
  Twin x = random(DType::f16, Shape{4, 192, 28, 28}, Layout::nhwc);
  Twin w = random(DType::f16, Shape{192, 1, 7, 7}, Layout::nhwc, -0.3, 0.3);
  Twin bias = random(DType::f16, Shape{192}, Layout::nchw, -0.5, 0.5);
  Twin y = random(DType::f16, x.dev.shape, Layout::nhwc);
  const std::int64_t ws_bytes = cuda_->conv2d_bias_activation_prepare(d, x.dev, w.dev, bias.dev, {}, y.dev, false);
  Buffer ws(cuda_->allocator(), ws_bytes);
  cuda_->conv2d_bias_activation_forward(d, x.dev, w.dev, bias.dev, {}, y.dev, false, {ws.data(), ws_bytes});
  ref_->conv2d_bias_activation_forward(d, x.ref, w.ref, bias.ref, {}, y.ref, false, {});
  ASSERT_NO_FATAL_FAILURE(expect_close(y, tolerance(DType::f16), "conv + bias"));
  cuda_->conv2d_forward(d, x.dev, w.dev, y.dev, {ws.data(), ws_bytes});
  ref_->conv2d_forward(d, x.ref, w.ref, y.ref, {});
  ASSERT_NO_FATAL_FAILURE(expect_close(y, tolerance(DType::f16), "conv"));
  for (const std::string& line : cuda_conv_choices(*cuda_)) std::printf("%s\n", line.c_str());
}

// Batch norm (+ residual) + ReLU in training, kernel by kernel: forward and backward on the GPU
// (cuDNN's fused NHWC 16-bit kernels, the project's fused forward, or the separate kernels, as the
// shape decides) against the reference from the same values, in both layouts and every float type,
// with and without a residual, with dz overwritten and accumulated. The reference's backward reads
// the GPU's y, so both mask the same elements.
TEST_F(CudaKernelsTest, BatchNormActivationMatchesReferenceInEveryConfiguration) {
  const Shape xs{4, 32, 5, 6}, cs{32};
  int compared = 0;
  // With cooperative kernels off, 16-bit NHWC runs the project's kernels instead of cuDNN's persistent ones.
  for (bool cooperative : {true, false})
  for (Layout layout : {Layout::nhwc, Layout::nchw})
    for (DType t : {DType::bf16, DType::f16, DType::f32})
      for (bool residual : {false, true})
        for (bool dz_accumulate : {false, true}) {
          if (!residual && dz_accumulate) continue;
          SCOPED_TRACE(std::string(to_string(layout)) + " " + std::string(to_string(t)) +
                       (residual ? " residual" : "") + (dz_accumulate ? " dz accumulate" : "") +
                       (cooperative ? "" : ", cooperative kernels off"));
          cuda_->set_cooperative_kernels(cooperative);
          const BatchNormDesc d{};
          Twin x = random(t, xs, layout, -2, 2), z = random(t, xs, layout), y = random(t, xs, layout);
          Twin gamma = random(DType::f32, cs, Layout::nchw, 0.5, 1.5), beta = random(DType::f32, cs);
          Twin rm = random(DType::f32, cs), rv = random(DType::f32, cs, Layout::nchw, 0.5, 1.5);
          Twin sm = random(DType::f32, cs), si = random(DType::f32, cs);
          Buffer mask(cuda_->allocator(), bn_activation_mask_words(xs) * 4);
          const Tensor mask_t = mask.view(Tensor::describe(DType::i32, Shape{bn_activation_mask_words(xs)},
                                                           Layout::nchw, DeviceKind::cuda));
          const Tensor zd = residual ? z.dev : Tensor{};
          const std::int64_t ws_bytes = cuda_->batchnorm_activation_prepare(x.dev, zd, mask_t);
          Buffer ws(cuda_->allocator(), ws_bytes), hws(ref_->allocator(), x.ref.size_bytes());
          cuda_->batchnorm_activation_forward_training(d, x.dev, zd, gamma.dev, beta.dev, rm.dev, rv.dev, y.dev, sm.dev,
                                                       si.dev, mask_t);
          ref_->batchnorm_activation_forward_training(d, x.ref, residual ? z.ref : Tensor{}, gamma.ref, beta.ref, rm.ref,
                                                      rv.ref, y.ref, sm.ref, si.ref, Tensor{});
          ASSERT_NO_FATAL_FAILURE(expect_close(y, tolerance(t), "y"));
          ASSERT_NO_FATAL_FAILURE(expect_close(sm, 1e-5, "saved mean"));
          ASSERT_NO_FATAL_FAILURE(expect_close(si, 1e-4, "saved inverse std"));
          ASSERT_NO_FATAL_FAILURE(expect_close(rv, 1e-4, "running variance"));
          const auto yv = read(y.dev);
          EXPECT_GE(*std::min_element(yv.begin(), yv.end()), 0.0);

          Twin ygpu = twin(t, xs, layout, yv);  // the GPU's y on both sides
          Twin dy = random(t, xs, layout), dx = random(t, xs, layout), dz = random(t, xs, layout);
          Twin dgamma = random(DType::f32, cs), dbeta = random(DType::f32, cs);
          cuda_->batchnorm_activation_backward(d, x.dev, y.dev, dy.dev, gamma.dev, beta.dev, sm.dev, si.dev, mask_t,
                                               residual, dx.dev, false, residual ? dz.dev : Tensor{}, dz_accumulate,
                                               dgamma.dev, dbeta.dev, {ws.data(), ws_bytes});
          ref_->batchnorm_activation_backward(d, x.ref, ygpu.ref, dy.ref, gamma.ref, beta.ref, sm.ref, si.ref, Tensor{},
                                              residual, dx.ref, false, residual ? dz.ref : Tensor{}, dz_accumulate,
                                              dgamma.ref, dbeta.ref, {hws.data(), x.ref.size_bytes()});
          ASSERT_NO_FATAL_FAILURE(expect_close(dx, 3 * tolerance(t), "dx"));
          if (residual) {
            ASSERT_NO_FATAL_FAILURE(expect_close(dz, tolerance(t), dz_accumulate ? "dz (accumulate)" : "dz"));
          }
          ASSERT_NO_FATAL_FAILURE(expect_close(dgamma, 3 * tolerance(t), "dgamma"));
          ASSERT_NO_FATAL_FAILURE(expect_close(dbeta, tolerance(t), "dbeta"));
          ++compared;
        }
  EXPECT_EQ(compared, 2 * 2 * 3 * 3);
  for (const std::string& line : cuda_bn_fusion_notes(*cuda_)) std::printf("%s\n", line.c_str());
}

// The project's NHWC kernels (f32 training): a second run gives the same bits (fixed-order
// reductions, no atomics), and without dx only the parameter gradients are written.
TEST_F(CudaKernelsTest, NhwcBatchNormIsBitIdenticalRunToRunAndMayOmitDx) {
  const Shape xs{8, 96, 23, 21};
  const std::int64_t ch = xs[1];
  const BatchNormDesc d{1e-5, 0.1};
  const DType t = DType::f32;
  Twin x = random(t, xs, Layout::nhwc), dy = random(t, xs, Layout::nhwc);
  cuda_->check_tensor(x.dev);
  Twin gamma = random(DType::f32, Shape{ch}, Layout::nchw, 0.5, 1.5), beta = random(DType::f32, Shape{ch});
  Twin rmean = random(DType::f32, Shape{ch}), rvar = random(DType::f32, Shape{ch}, Layout::nchw, 0.5, 1.5);
  Twin smean = random(DType::f32, Shape{ch}), sinv = random(DType::f32, Shape{ch});
  Twin y = random(t, xs, Layout::nhwc), dx = random(t, xs, Layout::nhwc);
  Twin dgamma = random(DType::f32, Shape{ch}), dbeta = random(DType::f32, Shape{ch});
  std::vector<std::vector<double>> first;
  for (int run = 0; run < 2; ++run) {
    cuda_->batchnorm_forward_training(d, x.dev, gamma.dev, beta.dev, rmean.dev, rvar.dev, y.dev, smean.dev, sinv.dev);
    cuda_->batchnorm_backward(d, x.dev, dy.dev, gamma.dev, smean.dev, sinv.dev, dx.dev, false, dgamma.dev, dbeta.dev);
    std::vector<std::vector<double>> got = {read(y.dev),  read(smean.dev),  read(sinv.dev),
                                            read(dx.dev), read(dgamma.dev), read(dbeta.dev)};
    if (run == 0) first = std::move(got);
    else EXPECT_EQ(got, first) << "a second run changed some bits";
  }
  Twin dgamma2 = random(DType::f32, Shape{ch}), dbeta2 = random(DType::f32, Shape{ch});
  cuda_->batchnorm_backward(d, x.dev, dy.dev, gamma.dev, smean.dev, sinv.dev, Tensor{}, false, dgamma2.dev,
                            dbeta2.dev);
  EXPECT_EQ(read(dgamma2.dev), first[4]);
  EXPECT_EQ(read(dbeta2.dev), first[5]);
}

TEST_F(CudaKernelsTest, MaxPoolMatchesReferenceAndPaddingNeverWins) {
  struct Case {
    Pool2dDesc d;
    Layout layout;
    DType dtype;
    std::int64_t channels = 5;  // NHWC forward runs the project's kernel: 5, 8 and 24 take each vector width
  };
  for (const Case& c :
       {Case{{3, 3, 2, 2, 1, 1}, Layout::nchw, DType::f32}, Case{{3, 3, 2, 2, 1, 1}, Layout::nhwc, DType::bf16},
        Case{{2, 2, 2, 2, 0, 0}, Layout::nhwc, DType::f32}, Case{{3, 3, 1, 1, 1, 1}, Layout::nchw, DType::f16},
        Case{{3, 3, 2, 2, 1, 1}, Layout::nhwc, DType::f16, 24}, Case{{2, 2, 2, 2, 0, 0}, Layout::nhwc, DType::f32, 8},
        Case{{3, 3, 1, 1, 1, 1}, Layout::nhwc, DType::bf16, 6}}) {
    SCOPED_TRACE(std::string(to_string(c.layout)) + " " + std::string(to_string(c.dtype)) + " window " +
                 std::to_string(c.d.window_h) + " stride " + std::to_string(c.d.stride_h) + " channels " +
                 std::to_string(c.channels));
    const std::int64_t n = 2, ch = c.channels, h = 12, w = 11;
    // Distinct values in every plane, exact in bf16 (multiples of 1/64 below 2): no ties, so
    // which maximum receives the gradient is unambiguous. Most are negative, so a padded zero
    // that won a window would show.
    std::vector<double> v(sz(n * ch * h * w));
    for (std::int64_t p = 0; p < n * ch; ++p) {
      std::vector<double> plane(sz(h * w));
      for (std::int64_t i = 0; i < h * w; ++i) plane[sz(i)] = static_cast<double>(i - h * w + 8) / 64.0;
      for (std::size_t i = plane.size(); i > 1; --i) std::swap(plane[i - 1], plane[mix64(seed_, counter_++) % i]);
      std::copy(plane.begin(), plane.end(), v.begin() + p * h * w);
    }
    Twin x = twin(c.dtype, Shape{n, ch, h, w}, c.layout, v);
    const Shape ys{n, ch, (h + 2 * c.d.pad_h - c.d.window_h) / c.d.stride_h + 1,
                   (w + 2 * c.d.pad_w - c.d.window_w) / c.d.stride_w + 1};
    Twin y = random(c.dtype, ys, c.layout);
    cuda_->maxpool_forward(c.d, x.dev, y.dev);
    ref_->maxpool_forward(c.d, x.ref, y.ref);
    ASSERT_NO_FATAL_FAILURE(expect_close(y, 0.0, "forward (exact: a maximum is one of the inputs)"));
    Twin dy = random(c.dtype, ys, c.layout);
    for (bool accumulate : {false, true}) {
      Twin dx = random(c.dtype, x.dev.shape, c.layout);
      cuda_->maxpool_backward(c.d, x.dev, y.dev, dy.dev, dx.dev, accumulate);
      ref_->maxpool_backward(c.d, x.ref, y.ref, dy.ref, dx.ref, accumulate);
      ASSERT_NO_FATAL_FAILURE(expect_close(dx, tolerance(c.dtype), accumulate ? "backward, accumulate" : "backward"));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// linear

TEST_F(CudaKernelsTest, LinearMatchesReferenceWithAndWithoutBiasAndAccumulate) {
  struct Case {
    DType dtype;
    bool tf32, bias;
    std::int64_t n, in, out;
  };
  for (const Case& c : {Case{DType::f32, false, true, 8, 40, 24}, Case{DType::f32, true, true, 16, 64, 10},
                        Case{DType::bf16, false, false, 8, 64, 32}, Case{DType::f16, false, true, 12, 48, 20},
                        Case{DType::bf16, false, true, 32, 2048, 1000},
                        Case{DType::f32, false, true, 70000, 8, 4}}) {  // more rows than one bias-sum chunk
    SCOPED_TRACE(std::string(to_string(c.dtype)) + (c.tf32 ? " tf32" : "") + (c.bias ? " bias" : "") + " n=" +
                 std::to_string(c.n) + " in=" + std::to_string(c.in) + " out=" + std::to_string(c.out));
    cuda_->set_tf32(c.tf32);
    const double tol = tolerance(c.dtype, c.tf32);
    Twin x = random(c.dtype, Shape{c.n, c.in}), w = random(c.dtype, Shape{c.out, c.in});
    Twin b = random(c.dtype, Shape{c.out}), y = random(c.dtype, Shape{c.n, c.out});
    const Tensor no_bias;
    cuda_->linear_forward(x.dev, w.dev, c.bias ? b.dev : no_bias, y.dev);
    ref_->linear_forward(x.ref, w.ref, c.bias ? b.ref : no_bias, y.ref);
    ASSERT_NO_FATAL_FAILURE(expect_close(y, tol, "forward"));

    Twin dy = random(c.dtype, Shape{c.n, c.out});
    for (bool accumulate : {false, true}) {
      Twin dx = random(c.dtype, Shape{c.n, c.in});
      cuda_->linear_backward_data(dy.dev, w.dev, dx.dev, accumulate);
      ref_->linear_backward_data(dy.ref, w.ref, dx.ref, accumulate);
      ASSERT_NO_FATAL_FAILURE(expect_close(dx, tol, accumulate ? "dx, accumulate" : "dx"));
    }
    Twin dw = random(c.dtype, Shape{c.out, c.in}), db = random(c.dtype, Shape{c.out});
    cuda_->linear_backward_weights(x.dev, dy.dev, dw.dev, c.bias ? db.dev : no_bias);
    ref_->linear_backward_weights(x.ref, dy.ref, dw.ref, c.bias ? db.ref : no_bias);
    ASSERT_NO_FATAL_FAILURE(expect_close(dw, tol, "dw"));
    if (c.bias) {
      ASSERT_NO_FATAL_FAILURE(expect_close(db, tol, "dbias (column sums of dy)"));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// memory and capture

TEST_F(CudaKernelsTest, HugeAllocationThrowsOutOfMemoryNamingTheSize) {
  const std::int64_t huge = std::int64_t{1} << 50;  // 1 PiB
  const std::string msg = test::error_message<OutOfMemory>([&] { cuda_->allocator().allocate(huge); });
  EXPECT_NE(msg.find(std::to_string(huge)), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  // The device is still usable, and a freed block is handed out again from the cache.
  Allocator& a = cuda_->allocator();
  void* p = a.allocate(1 << 20);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % kAllocAlignment, 0u);
  a.deallocate(p, 1 << 20);
  EXPECT_EQ(a.allocate(1 << 20), p);
  a.deallocate(p, 1 << 20);
}

// The loadgen SUT's path: samples from a page-locked pool into rows of a device batch, queued with
// no wait, in any order, and rows back into page-locked memory; one synchronize makes them land.
TEST_F(CudaKernelsTest, PinnedByteRangeCopiesGatherSamplesInOrderAndRefuseRangesOutsideTheTensor) {
  constexpr std::int64_t kSamples = 64, kRow = 3 * 32 * 32, kRowBytes = kRow * 2;  // f16 32x32 images
  HostBuffer pool = cuda_->allocate_host(kSamples * kRowBytes);
  ASSERT_NE(pool.data(), nullptr);
  for (std::int64_t i = 0; i < kSamples * kRow; ++i)
    pool.as<std::uint16_t>()[i] = static_cast<std::uint16_t>((i * 7919 + 13) & 0x7bff);  // finite f16 bit patterns
  const Tensor d = Tensor::describe(DType::f16, Shape{40, kRow}, Layout::nchw, DeviceKind::cuda);
  Buffer buf(cuda_->allocator(), d.size_bytes());
  const Tensor batch = buf.view(d);
  cuda_->fill(batch, 0.0);
  std::vector<std::int64_t> order(40);
  for (std::size_t r = 0; r < order.size(); ++r) order[r] = static_cast<std::int64_t>((r * 37 + 5) % kSamples);
  for (std::size_t r = 0; r < order.size(); ++r)
    cuda_->upload_bytes(batch, static_cast<std::int64_t>(r) * kRowBytes,
                        pool.as<unsigned char>() + order[r] * kRowBytes, kRowBytes);
  HostBuffer out = cuda_->allocate_host(30 * kRowBytes);
  std::memset(out.data(), 0xff, sz(out.bytes()));
  cuda_->download_bytes(batch, 10 * kRowBytes, out.data(), 30 * kRowBytes);  // rows 10..39
  cuda_->synchronize();
  std::vector<std::uint16_t> all(sz(40 * kRow));
  cuda_->download(batch, all.data());
  for (std::int64_t r = 0; r < 40; ++r) {
    const auto* want = pool.as<std::uint16_t>() + order[sz(r)] * kRow;
    ASSERT_EQ(std::memcmp(all.data() + r * kRow, want, sz(kRowBytes)), 0)
        << "row " << r << " is not sample " << order[sz(r)];
    if (r >= 10) {
      ASSERT_EQ(std::memcmp(out.as<std::uint16_t>() + (r - 10) * kRow, want, sz(kRowBytes)), 0)
          << "downloaded row " << r;
    }
  }
  EXPECT_THROW(cuda_->upload_bytes(batch, 39 * kRowBytes + 2, pool.data(), kRowBytes), Error);
  EXPECT_THROW(cuda_->download_bytes(batch, -2, out.data(), 2), Error);
}

// bf16 takes cuDNN's batch norm, f32 NHWC the project's kernels: both capture.
TEST_F(CudaKernelsTest, CapturedStepReplaysToTheSameResultsAsDirectCalls) {
  for (DType t : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(std::string(to_string(t)));
    captured_step_matches_direct_calls(t);
  }
}

void CudaKernelsTest::captured_step_matches_direct_calls(DType t) {
  const Conv2dDesc d{1, 1, 1, 1, 1, 1, 1};
  Twin x = random(t, Shape{4, 32, 10, 10}, Layout::nhwc), w = random(t, Shape{32, 32, 3, 3}, Layout::nhwc);
  Twin y = random(t, Shape{4, 32, 10, 10}, Layout::nhwc), z = random(t, Shape{4, 32, 10, 10}, Layout::nhwc);
  Twin p = random(t, Shape{4, 32, 5, 5}, Layout::nhwc), g = random(t, Shape{4, 32});
  Twin fc = random(t, Shape{10, 32}), logits = random(t, Shape{4, 10});
  Twin gamma = random(DType::f32, Shape{32}), beta = random(DType::f32, Shape{32});
  Twin rm = random(DType::f32, Shape{32}), rv = random(DType::f32, Shape{32}, Layout::nchw, 0.5, 1.5);
  Twin sm = random(DType::f32, Shape{32}), si = random(DType::f32, Shape{32});
  for (const Tensor* v : {&x.dev, &y.dev, &z.dev}) cuda_->check_tensor(*v);
  const std::int64_t ws_bytes = cuda_->conv2d_prepare(d, x.dev, w.dev, y.dev, ConvPasses{});
  Buffer ws(cuda_->allocator(), ws_bytes);
  auto step = [&] {
    cuda_->conv2d_forward(d, x.dev, w.dev, y.dev, {ws.data(), ws_bytes});
    cuda_->batchnorm_forward_training({}, y.dev, gamma.dev, beta.dev, rm.dev, rv.dev, z.dev, sm.dev, si.dev);
    cuda_->relu_forward(z.dev, z.dev);
    cuda_->maxpool_forward({2, 2, 2, 2, 0, 0}, z.dev, p.dev);
    cuda_->global_avgpool_forward(p.dev, g.dev);
    cuda_->linear_forward(g.dev, fc.dev, {}, logits.dev);
  };
  step();
  const auto direct_p = read(p.dev), direct_logits = read(logits.dev);
  cuda_->fill(p.dev, 0.0);
  cuda_->fill(logits.dev, 0.0);
  const auto graph = cuda_->capture(step);
  cuda_->synchronize();
  for (double v : read(logits.dev)) ASSERT_EQ(v, 0.0) << "capture ran the work; it should only record it";
  graph->replay();
  EXPECT_EQ(read(p.dev), direct_p);
  EXPECT_EQ(read(logits.dev), direct_logits);
  // The graph reads its buffers at replay: new inputs give what direct calls give on them.
  Twin x2 = random(t, Shape{4, 32, 10, 10}, Layout::nhwc);
  std::vector<unsigned char> bytes(sz(x2.dev.size_bytes()));
  cuda_->download(x2.dev, bytes.data());
  cuda_->upload(x.dev, bytes.data());
  graph->replay();
  const auto replayed = read(logits.dev);
  step();
  EXPECT_EQ(replayed, read(logits.dev));
  EXPECT_NE(replayed, direct_logits);
}

// ---------------------------------------------------------------------------------------------
// whole models against the reference

struct ModelRun {
  std::vector<std::string> names;  // "logits", "loss", then each trainable parameter's gradient
  std::vector<std::vector<double>> values;
  std::vector<std::vector<double>> params;  // every parameter's values as stored (before the step)
};

// One forward (and with `backward`, one backward) of the classifier on `k` in `dtype`, on the
// seed's batch. With `params` the parameters are overwritten with those values first, so runs in
// f32 and f64 start from the same (f32) numbers.
ModelRun run_model(Kernels& k, DType dtype, const models::ResNetConfig& c, std::int64_t batch, std::int64_t px,
                   Layout layout, std::uint64_t seed, const std::vector<std::vector<double>>* params = nullptr,
                   bool backward = true) {
  GraphOptions o;
  o.layout = layout;
  o.seed = seed;
  o.dtype = dtype;
  GraphBuilder b(o);
  const models::Classifier m = models::build_classifier(b, c, batch, px);
  Graph g(std::move(b));
  g.bind(k);
  ModelRun r;
  for (std::size_t i = 0; i < g.parameters().size(); ++i) {
    const Tensor& t = g.parameters()[i].value;
    if (params != nullptr) {
      std::vector<unsigned char> host(sz(t.size_bytes()));
      Tensor staging = t;
      staging.data = host.data();
      staging.device = DeviceKind::host;
      write_host(staging, params->at(i));
      k.upload(t, host.data());
    }
    r.params.push_back(g.read(t));
  }
  std::vector<double> images(sz(batch * c.in_channels * px * px)), labels(sz(batch));
  for (std::size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>(uniform(seed, i, -1, 1));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<double>(mix64(seed, i) % c.num_classes);
  g.set_input(m.images, images);
  g.set_input(m.labels, labels);
  g.forward();
  r.names = {"logits", "loss"};
  r.values = {g.read(m.logits), g.read(m.loss)};
  if (!backward) return r;
  g.backward();
  for (const Parameter& p : g.parameters()) {
    if (!p.spec.trainable()) continue;
    r.names.push_back("gradient of " + p.name);
    r.values.push_back(g.read(p.grad));
  }
  return r;
}

// max |got - want| <= tol * max |want| (and the reference is not all zero), else a line in *log.
bool close_to(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what,
              std::string* log) {
  double scale = 0, worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    const double e = std::isnan(got[i]) ? INFINITY : std::abs(got[i] - want[i]);
    if (e > worst) worst = e, at = i;
  }
  if (got.size() == want.size() && scale > 0 && worst <= tol * scale) return true;
  *log += what + ": max |error| " + std::to_string(worst) + " at " + std::to_string(at) + " > " + std::to_string(tol) +
          " x max |reference| " + std::to_string(scale) + "\n";
  return false;
}

// The CUDA kernels in f32 against the reference in f64 from the same parameters and batch: logits,
// loss and every parameter gradient after one forward/backward. For small networks only: see
// CheckedKernels for why whole-model gradients of ResNet-50 cannot be compared this way.
void compare_model(Kernels& cuda, const models::ResNetConfig& c, std::int64_t batch, std::int64_t px, Layout layout,
                   double tol) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
  const ModelRun gpu = run_model(cuda, DType::f32, c, batch, px, layout, seed);
  auto ref = make_ref_kernels();
  const ModelRun f64 = run_model(*ref, DType::f64, c, batch, px, layout, seed, &gpu.params);
  ASSERT_EQ(gpu.names, f64.names);
  ASSERT_GT(gpu.names.size(), 2u);
  std::string log;
  for (std::size_t i = 0; i < gpu.names.size(); ++i) close_to(gpu.values[i], f64.values[i], tol, gpu.names[i], &log);
  EXPECT_TRUE(log.empty()) << log;
}

TEST_F(CudaKernelsTest, TinyResnetLogitsAndGradientsMatchReference) {
  ASSERT_NO_FATAL_FAILURE(compare_model(*cuda_, models::tiny_resnet(3, 5), 8, 8, Layout::nchw, 1e-3));
}

// Checks every kernel call of a step against the f64 reference on the same inputs: each call's
// inputs are read back from the kernels under test, the call runs there, and the reference runs
// it in f64 on those values; outputs must agree to `tol` of their largest element (conv_tol for
// convolutions, whose fast algorithms round more). Errors cannot compound or meet a kink, so
// every op of a deep network is held to a unit test's tolerance in its real shapes and layouts.
//
// Why not compare whole-model gradients with an f64 run: ResNet-50's are discontinuous in the
// rounding. On the reference kernels alone (NHWC, batch 2-4, 64-128 px), f32 storage moves the
// logits by ~1e-5, and that forward noise flips a ReLU whose input lies within ~1e-5 of zero: in
// the 2x2 maps of layer4 one flipped element changes a channel's batch statistics, and for about
// half the seeds the median parameter gradient moves by 0.3-3% and the worst by 10-36% (other
// seeds: ~5e-5); larger batches or images do not help. The GPU, accumulating in f32, flips more.
class CheckedKernels final : public Kernels {
 public:
  CheckedKernels(Kernels& under_test, double tol, double conv_tol)
      : dut_(under_test), ref_(make_ref_kernels()), tol_(tol), conv_tol_(conv_tol) {}

  const std::string& failures() const { return failures_; }
  int checked() const { return checked_; }
  int failed() const { return failed_; }

  std::string_view name() const override { return dut_.name(); }
  Allocator& allocator() override { return dut_.allocator(); }
  std::unique_ptr<measure::IterationTimer> make_timer() override { return dut_.make_timer(); }
  void synchronize() override { dut_.synchronize(); }
  void upload(const Tensor& dst, const void* host) override { dut_.upload(dst, host); }
  void download(const Tensor& src, void* host) override { dut_.download(src, host); }
  HostBuffer allocate_host(std::int64_t bytes) override { return dut_.allocate_host(bytes); }
  void upload_bytes(const Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) override {
    dut_.upload_bytes(dst, offset, host, bytes);
  }
  void download_bytes(const Tensor& src, std::int64_t offset, void* host, std::int64_t bytes) override {
    dut_.download_bytes(src, offset, host, bytes);
  }
  void fill(const Tensor& t, double value) override { dut_.fill(t, value); }
  void check_tensor(const Tensor& t) override { dut_.check_tensor(t); }
  std::int64_t conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                              ConvPasses passes) override {
    return dut_.conv2d_prepare(d, x, w, y, passes);
  }

  std::int64_t conv2d_bias_activation_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                              const Tensor& bias, const Tensor& residual, const Tensor& y,
                                              bool relu) override {
    return dut_.conv2d_bias_activation_prepare(d, x, w, bias, residual, y, relu);
  }
  void conv2d_bias_activation_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Tensor& residual, const Tensor& y, bool relu, Workspace ws) override {
    Call c(*this, "conv2d_bias_activation_forward " + x.to_string() + " -> " + y.to_string(), conv_tol_);
    const Tensor hx = c.in(x), hw = c.in(w), hb = c.in(bias), hr = c.in(residual), hy = c.out(y);
    dut_.conv2d_bias_activation_forward(d, x, w, bias, residual, y, relu, ws);
    ref_->conv2d_bias_activation_forward(d, hx, hw, hb, hr, hy, relu, {});
    c.check(y, hy, "y");
  }
  void conv2d_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y, Workspace ws) override {
    Call c(*this, "conv2d_forward " + x.to_string() + " -> " + y.to_string(), conv_tol_);
    const Tensor hx = c.in(x), hw = c.in(w), hy = c.out(y);
    dut_.conv2d_forward(d, x, w, y, ws);
    ref_->conv2d_forward(d, hx, hw, hy, {});
    c.check(y, hy, "y");
  }
  void conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate,
                            Workspace ws) override {
    Call c(*this, "conv2d_backward_data " + dy.to_string() + " -> " + dx.to_string(), conv_tol_);
    const Tensor hdy = c.in(dy), hw = c.in(w), hdx = c.out(dx, accumulate);
    dut_.conv2d_backward_data(d, dy, w, dx, accumulate, ws);
    ref_->conv2d_backward_data(d, hdy, hw, hdx, accumulate, {});
    c.check(dx, hdx, accumulate ? "dx (accumulate)" : "dx");
  }
  void conv2d_backward_filter(const Conv2dDesc& d, const Tensor& x, const Tensor& dy, const Tensor& dw,
                              Workspace ws) override {
    Call c(*this, "conv2d_backward_filter " + x.to_string() + ", dy " + dy.to_string(), conv_tol_);
    const Tensor hx = c.in(x), hdy = c.in(dy), hdw = c.out(dw);
    dut_.conv2d_backward_filter(d, x, dy, dw, ws);
    ref_->conv2d_backward_filter(d, hx, hdy, hdw, {});
    c.check(dw, hdw, "dw");
  }
  void batchnorm_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& rmean, const Tensor& rvar, const Tensor& y, const Tensor& smean,
                                  const Tensor& sinvstd) override {
    Call c(*this, "batchnorm_forward_training " + x.to_string(), tol_);
    const Tensor hx = c.in(x), hg = c.in(gamma), hb = c.in(beta), hrm = c.in(rmean), hrv = c.in(rvar);
    const Tensor hy = c.out(y), hsm = c.out(smean), hsi = c.out(sinvstd);
    dut_.batchnorm_forward_training(d, x, gamma, beta, rmean, rvar, y, smean, sinvstd);
    ref_->batchnorm_forward_training(d, hx, hg, hb, hrm, hrv, hy, hsm, hsi);
    c.check(y, hy, "y");
    c.check(smean, hsm, "saved mean");
    c.check(sinvstd, hsi, "saved inverse std");
    c.check(rmean, hrm, "running mean");
    c.check(rvar, hrv, "running variance");
  }
  void batchnorm_forward_inference(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& rmean, const Tensor& rvar, const Tensor& y) override {
    Call c(*this, "batchnorm_forward_inference " + x.to_string(), tol_);
    const Tensor hx = c.in(x), hg = c.in(gamma), hb = c.in(beta), hrm = c.in(rmean), hrv = c.in(rvar), hy = c.out(y);
    dut_.batchnorm_forward_inference(d, x, gamma, beta, rmean, rvar, y);
    ref_->batchnorm_forward_inference(d, hx, hg, hb, hrm, hrv, hy);
    c.check(y, hy, "y");
  }
  void batchnorm_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& smean, const Tensor& sinvstd, const Tensor& dx, bool accumulate,
                          const Tensor& dgamma, const Tensor& dbeta) override {
    Call c(*this, "batchnorm_backward " + x.to_string(), tol_);
    const Tensor hx = c.in(x), hdy = c.in(dy), hg = c.in(gamma), hsm = c.in(smean), hsi = c.in(sinvstd);
    const Tensor hdx = c.out(dx, accumulate), hdg = c.out(dgamma), hdb = c.out(dbeta);
    dut_.batchnorm_backward(d, x, dy, gamma, smean, sinvstd, dx, accumulate, dgamma, dbeta);
    ref_->batchnorm_backward(d, hx, hdy, hg, hsm, hsi, hdx, accumulate, hdg, hdb);
    c.check(dx, hdx, accumulate ? "dx (accumulate)" : "dx");
    c.check(dgamma, hdg, "dgamma");
    c.check(dbeta, hdb, "dbeta");
  }
  std::int64_t batchnorm_activation_prepare(const Tensor& x, const Tensor& z, const Tensor& mask) override {
    return dut_.batchnorm_activation_prepare(x, z, mask);
  }
  // The mask is the backend's own (cuDNN's reserve space): passed through, never compared.
  void batchnorm_activation_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& z,
                                             const Tensor& gamma, const Tensor& beta, const Tensor& rmean,
                                             const Tensor& rvar, const Tensor& y, const Tensor& smean,
                                             const Tensor& sinvstd, const Tensor& mask) override {
    Call c(*this, "batchnorm_activation_forward_training " + x.to_string() + (z.defined() ? " + residual" : ""), tol_);
    const Tensor hx = c.in(x), hz = c.in(z), hg = c.in(gamma), hb = c.in(beta), hrm = c.in(rmean), hrv = c.in(rvar);
    const Tensor hy = c.out(y), hsm = c.out(smean), hsi = c.out(sinvstd);
    dut_.batchnorm_activation_forward_training(d, x, z, gamma, beta, rmean, rvar, y, smean, sinvstd, mask);
    ref_->batchnorm_activation_forward_training(d, hx, hz, hg, hb, hrm, hrv, hy, hsm, hsi, Tensor{});
    c.check(y, hy, "y");
    c.check(smean, hsm, "saved mean");
    c.check(sinvstd, hsi, "saved inverse std");
    c.check(rmean, hrm, "running mean");
    c.check(rvar, hrv, "running variance");
  }
  void batchnorm_activation_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy,
                                     const Tensor& gamma, const Tensor& beta, const Tensor& smean,
                                     const Tensor& sinvstd, const Tensor& mask, bool residual, const Tensor& dx,
                                     bool dx_accumulate, const Tensor& dz, bool dz_accumulate, const Tensor& dgamma,
                                     const Tensor& dbeta, Workspace ws) override {
    Call c(*this, "batchnorm_activation_backward " + x.to_string() + (residual ? " + residual" : ""), tol_);
    const Tensor hx = c.in(x), hy = c.in(y), hdy = c.in(dy), hg = c.in(gamma), hb = c.in(beta), hsm = c.in(smean);
    const Tensor hsi = c.in(sinvstd), hdx = c.out(dx, dx_accumulate), hdz = c.out(dz, dz_accumulate);
    const Tensor hdg = c.out(dgamma), hdb = c.out(dbeta);
    dut_.batchnorm_activation_backward(d, x, y, dy, gamma, beta, smean, sinvstd, mask, residual, dx, dx_accumulate, dz,
                                       dz_accumulate, dgamma, dbeta, ws);
    Buffer hws(ref_->allocator(), hdy.size_bytes());  // the reference's ReLU gradient
    ref_->batchnorm_activation_backward(d, hx, hy, hdy, hg, hb, hsm, hsi, Tensor{}, residual, hdx, dx_accumulate, hdz,
                                        dz_accumulate, hdg, hdb, {hws.data(), hdy.size_bytes()});
    c.check(dx, hdx, dx_accumulate ? "dx (accumulate)" : "dx");
    c.check(dz, hdz, dz_accumulate ? "dz (accumulate)" : "dz");
    c.check(dgamma, hdg, "dgamma");
    c.check(dbeta, hdb, "dbeta");
  }
  void relu_forward(const Tensor& x, const Tensor& y) override {
    Call c(*this, "relu_forward " + x.to_string(), tol_);
    const Tensor hx = c.in(x), hy = c.out(y);
    dut_.relu_forward(x, y);
    ref_->relu_forward(hx, hy);
    c.check(y, hy, "y");
  }
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool accumulate) override {
    Call c(*this, "relu_backward " + y.to_string(), tol_);
    const Tensor hy = c.in(y), hdy = c.in(dy), hdx = c.out(dx, accumulate);
    dut_.relu_backward(y, dy, dx, accumulate);
    ref_->relu_backward(hy, hdy, hdx, accumulate);
    c.check(dx, hdx, accumulate ? "dx (accumulate)" : "dx");
  }
  void add_forward(const Tensor& a, const Tensor& b, const Tensor& y) override {
    Call c(*this, "add_forward " + a.to_string(), tol_);
    const Tensor ha = c.in(a), hb = c.in(b), hy = c.out(y);
    dut_.add_forward(a, b, y);
    ref_->add_forward(ha, hb, hy);
    c.check(y, hy, "y");
  }
  void copy_gradient(const Tensor& dy, const Tensor& dx, bool accumulate) override {
    Call c(*this, "copy_gradient " + dy.to_string(), tol_);
    const Tensor hdy = c.in(dy), hdx = c.out(dx, accumulate);
    dut_.copy_gradient(dy, dx, accumulate);
    ref_->copy_gradient(hdy, hdx, accumulate);
    c.check(dx, hdx, accumulate ? "dx (accumulate)" : "dx");
  }
  void bias_activation_forward(const Tensor& x, const Tensor& bias, const Tensor& residual, const Tensor& y,
                               bool relu) override {
    Call c(*this, "bias_activation_forward " + x.to_string(), tol_);
    const Tensor hx = c.in(x), hb = c.in(bias), hr = c.in(residual), hy = c.out(y);  // hr undefined without one
    dut_.bias_activation_forward(x, bias, residual, y, relu);
    ref_->bias_activation_forward(hx, hb, hr, hy, relu);
    c.check(y, hy, "y");
  }
  void maxpool_forward(const Pool2dDesc& d, const Tensor& x, const Tensor& y) override {
    Call c(*this, "maxpool_forward " + x.to_string(), tol_);
    const Tensor hx = c.in(x), hy = c.out(y);
    dut_.maxpool_forward(d, x, y);
    ref_->maxpool_forward(d, hx, hy);
    c.check(y, hy, "y");
  }
  void maxpool_backward(const Pool2dDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
                        bool accumulate) override {
    Call c(*this, "maxpool_backward " + x.to_string(), tol_);
    const Tensor hx = c.in(x), hy = c.in(y), hdy = c.in(dy), hdx = c.out(dx, accumulate);
    dut_.maxpool_backward(d, x, y, dy, dx, accumulate);
    ref_->maxpool_backward(d, hx, hy, hdy, hdx, accumulate);
    c.check(dx, hdx, accumulate ? "dx (accumulate)" : "dx");
  }
  void global_avgpool_forward(const Tensor& x, const Tensor& y) override {
    Call c(*this, "global_avgpool_forward " + x.to_string(), tol_);
    const Tensor hx = c.in(x), hy = c.out(y);
    dut_.global_avgpool_forward(x, y);
    ref_->global_avgpool_forward(hx, hy);
    c.check(y, hy, "y");
  }
  void global_avgpool_backward(const Tensor& dy, const Tensor& dx, bool accumulate) override {
    Call c(*this, "global_avgpool_backward " + dx.to_string(), tol_);
    const Tensor hdy = c.in(dy), hdx = c.out(dx, accumulate);
    dut_.global_avgpool_backward(dy, dx, accumulate);
    ref_->global_avgpool_backward(hdy, hdx, accumulate);
    c.check(dx, hdx, accumulate ? "dx (accumulate)" : "dx");
  }
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) override {
    Call c(*this, "linear_forward " + x.to_string() + " x " + w.to_string(), conv_tol_);
    const Tensor hx = c.in(x), hw = c.in(w), hb = c.in(bias), hy = c.out(y);
    dut_.linear_forward(x, w, bias, y);
    ref_->linear_forward(hx, hw, hb, hy);
    c.check(y, hy, "y");
  }
  void linear_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate) override {
    Call c(*this, "linear_backward_data " + dy.to_string(), conv_tol_);
    const Tensor hdy = c.in(dy), hw = c.in(w), hdx = c.out(dx, accumulate);
    dut_.linear_backward_data(dy, w, dx, accumulate);
    ref_->linear_backward_data(hdy, hw, hdx, accumulate);
    c.check(dx, hdx, accumulate ? "dx (accumulate)" : "dx");
  }
  void linear_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias) override {
    Call c(*this, "linear_backward_weights " + x.to_string(), conv_tol_);
    const Tensor hx = c.in(x), hdy = c.in(dy), hdw = c.out(dw), hdb = c.out(dbias);
    dut_.linear_backward_weights(x, dy, dw, dbias);
    ref_->linear_backward_weights(hx, hdy, hdw, hdb);
    c.check(dw, hdw, "dw");
    c.check(dbias, hdb, "dbias");
  }
  void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                     const Tensor& loss) override {
    Call c(*this, "softmax_cross_entropy_forward " + logits.to_string(), tol_);
    const Tensor hl = c.in(logits), hlab = c.in(labels), hp = c.out(probs), hloss = c.out(loss);
    dut_.softmax_cross_entropy_forward(logits, labels, probs, loss);
    ref_->softmax_cross_entropy_forward(hl, hlab, hp, hloss);
    c.check(probs, hp, "probs");
    c.check(loss, hloss, "loss");
  }
  void softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,
                                      const Tensor& dlogits, bool accumulate) override {
    Call c(*this, "softmax_cross_entropy_backward " + probs.to_string(), tol_);
    const Tensor hp = c.in(probs), hlab = c.in(labels), hdl = c.in(dloss), hdx = c.out(dlogits, accumulate);
    dut_.softmax_cross_entropy_backward(probs, labels, dloss, dlogits, accumulate);
    ref_->softmax_cross_entropy_backward(hp, hlab, hdl, hdx, accumulate);
    c.check(dlogits, hdx, accumulate ? "dlogits (accumulate)" : "dlogits");
  }

  void round_forward(const Tensor& x, const Tensor& y, double step) override {
    Call c(*this, "round_forward " + x.to_string(), tol_);
    const Tensor hx = c.in(x), hy = c.out(y);
    dut_.round_forward(x, y, step);
    ref_->round_forward(hx, hy, step);
    c.check(y, hy, "y");
  }
  void rate_distortion_forward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x, const Tensor& latent,
                               const Tensor& loss, const Tensor& mse) override {
    Call c(*this, "rate_distortion_forward " + x.to_string(), tol_);
    const Tensor hxh = c.in(x_hat), hx = c.in(x), hl = c.in(latent), hloss = c.out(loss), hmse = c.out(mse);
    dut_.rate_distortion_forward(d, x_hat, x, latent, loss, mse);
    ref_->rate_distortion_forward(d, hxh, hx, hl, hloss, hmse);
    c.check(loss, hloss, "loss");
    c.check(mse, hmse, "mse");
  }
  void rate_distortion_backward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x, const Tensor& latent,
                                const Tensor& dloss, const Tensor& dx_hat, bool acc_x_hat, const Tensor& dlatent,
                                bool acc_latent) override {
    Call c(*this, "rate_distortion_backward " + x.to_string(), tol_);
    const Tensor hxh = c.in(x_hat), hx = c.in(x), hl = c.in(latent), hdl = c.in(dloss);
    const Tensor hdx = dx_hat.defined() ? c.out(dx_hat, acc_x_hat) : Tensor{};
    const Tensor hdlat = dlatent.defined() ? c.out(dlatent, acc_latent) : Tensor{};
    dut_.rate_distortion_backward(d, x_hat, x, latent, dloss, dx_hat, acc_x_hat, dlatent, acc_latent);
    ref_->rate_distortion_backward(d, hxh, hx, hl, hdl, hdx, acc_x_hat, hdlat, acc_latent);
    if (dx_hat.defined()) c.check(dx_hat, hdx, "dx_hat");
    if (dlatent.defined()) c.check(dlatent, hdlat, "dlatent");
  }

  // Not part of a forward/backward step: passed through unchecked.
  void sgd_update(const SgdStep& s, const Tensor& w, const Tensor& g, const Tensor& v) override {
    dut_.sgd_update(s, w, g, v);
  }
  void sgd_update_many(const SgdStep& s, const std::vector<SgdTensors>& params) override {
    dut_.sgd_update_many(s, params);
  }
  void lars_update(const LarsStep& s, const Tensor& w, const Tensor& g, const Tensor& v) override {
    dut_.lars_update(s, w, g, v);
  }
  void cast(const Tensor& src, const Tensor& dst) override { dut_.cast(src, dst); }
  void unscale_and_check(const Tensor& g, const Tensor& scale, const Tensor& found) override {
    dut_.unscale_and_check(g, scale, found);
  }
  void update_loss_scale(const LossScaleRule& r, const Tensor& scale, const Tensor& good, const Tensor& found) override {
    dut_.update_loss_scale(r, scale, good, found);
  }
  std::unique_ptr<Replayable> capture(const std::function<void()>&) override {
    throw Error("CheckedKernels reads every call's operands back: it cannot capture");
  }
  void set_deterministic(bool on) override { dut_.set_deterministic(on); }
  void set_tf32(bool allowed) override { dut_.set_tf32(allowed); }

 private:
  // One checked call: f64 host copies of its operands (outputs that accumulate start from the
  // old values), freed when the call ends. An output that does not accumulate is overwritten on
  // the kernels under test with kPoison first (unless it shares memory with an input of the call,
  // as in-place ops do): a kernel that fails to write it must not pass on what the buffer held
  // before. The graph's arena is allocated anew for every run, and the allocator often hands back
  // the memory of the previous run, whose tensors at the same offsets held the right values for
  // the same seed: a fused backward that dropped dz then read as correct for some runs.
  // The poison is finite and exact in every dtype (fp8 e4m3 included), so a kernel that scales its
  // old output by beta = 0 is not blamed; no checked output is 256 everywhere.
  static constexpr double kPoison = 256;
  class Call {
   public:
    Call(CheckedKernels& k, std::string what, double tol) : k_(k), what_(std::move(what)), tol_(tol) {}
    Tensor in(const Tensor& t) {
      if (t.defined()) inputs_.push_back(t);
      return copy(t, true);
    }
    Tensor out(const Tensor& t, bool keep = false) {
      if (!keep) poison(t);
      return copy(t, keep);
    }
    void check(const Tensor& dut, const Tensor& ref, const char* what) {
      if (!dut.defined()) return;
      ++k_.checked_;
      if (!close_to(k_.read(dut), read_host(ref), tol_, what_ + ": " + what, &k_.failures_)) ++k_.failed_;
    }

   private:
    static bool overlap(const Tensor& a, const Tensor& b) {
      const auto* a0 = static_cast<const unsigned char*>(a.data);
      const auto* b0 = static_cast<const unsigned char*>(b.data);
      return a0 < b0 + b.size_bytes() && b0 < a0 + a.size_bytes();
    }
    void poison(const Tensor& t) {
      if (!t.defined() || !t.is_contiguous()) return;
      for (const Tensor& i : inputs_)
        if (overlap(t, i)) return;
      std::vector<unsigned char> host(sz(t.size_bytes()));
      Tensor staging = t;
      staging.data = host.data();
      staging.device = DeviceKind::host;
      write_host(staging, std::vector<double>(sz(t.numel()), kPoison));
      k_.dut_.upload(t, host.data());
    }
    Tensor copy(const Tensor& t, bool with_values) {
      if (!t.defined()) return Tensor{};
      const DType dtype = t.dtype == DType::i32 ? DType::i32 : DType::f64;
      const Tensor h = Tensor::describe(dtype, t.shape, t.layout);
      buffers_.emplace_back(k_.ref_->allocator(), h.size_bytes());
      const Tensor bound = buffers_.back().view(h);
      write_host(bound, with_values ? k_.read(t) : std::vector<double>(sz(t.numel()), 0.0));
      return bound;
    }
    CheckedKernels& k_;
    std::string what_;
    double tol_;
    std::vector<Tensor> inputs_;  // the call's operands on the kernels under test
    std::vector<Buffer> buffers_;
  };

  std::vector<double> read(const Tensor& t) {
    std::vector<unsigned char> host(sz(t.size_bytes()));
    dut_.download(t, host.data());
    Tensor staging = t;
    staging.data = host.data();
    staging.device = DeviceKind::host;
    return read_host(staging);
  }

  Kernels& dut_;
  std::unique_ptr<Kernels> ref_;
  double tol_, conv_tol_;
  std::string failures_;
  int checked_ = 0, failed_ = 0;
};

models::ResNetConfig resnet50_10_classes() {
  models::ResNetConfig c = models::resnet50();
  c.num_classes = 10;
  return c;
}

// ResNet-50 (NHWC, f32, batch 2, 64 px): every kernel call of one training step against the f64
// reference on the GPU's own operands, and the logits and loss (continuous in the rounding, so
// comparable end to end) against an f64 run.
TEST_F(CudaKernelsTest, Resnet50At64PixelsLogitsAndGradientsMatchReference) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const models::ResNetConfig c = resnet50_10_classes();
  CheckedKernels checked(*cuda_, 1e-4, 1e-3);
  const ModelRun gpu = run_model(checked, DType::f32, c, 2, 64, Layout::nhwc, seed);
  EXPECT_EQ(checked.failed(), 0) << checked.failed() << " of " << checked.checked()
                                 << " checked outputs differ:\n" << checked.failures();
  // 53 convolutions x 3 passes (but the stem's data gradient), 53 batch norms x 2, ...
  EXPECT_GT(checked.checked(), 400);
  auto ref = make_ref_kernels();
  const ModelRun f64 = run_model(*ref, DType::f64, c, 2, 64, Layout::nhwc, seed, &gpu.params, false);
  std::string log;
  close_to(gpu.values[0], f64.values[0], 1e-3, "logits", &log);
  close_to(gpu.values[1], f64.values[1], 1e-3, "loss", &log);
  EXPECT_TRUE(log.empty()) << log;
  // 53 convolutions, far fewer distinct configurations: identical layers searched once, each for
  // three passes but the stem (its own configuration), whose input needs no gradient.
  const auto& stats = cuda_kernel_stats(*cuda_);
  EXPECT_LT(stats.conv_searches, 30);
  EXPECT_GT(stats.conv_cache_hits, 20);
  EXPECT_EQ(stats.conv_pass_searches, 3 * stats.conv_searches - 1);
}

// Batch norm (+ residual) + ReLU as one op in training (fuse=on): one training step of the tiny
// ResNet (NHWC) on `dut`, every kernel call checked against the reference on dut's operands.
// Returns the number of checked outputs.
int check_fused_tiny_resnet_step(CheckedKernels& dut, Precision p, std::uint64_t seed) {
  GraphOptions o;
  o.layout = Layout::nhwc;
  o.precision = p;
  o.seed = seed;
  models::ResNetConfig c = models::tiny_resnet(3, 5);
  c.fuse_batchnorm_relu = true;
  GraphBuilder b(o);
  const models::Classifier m = models::build_classifier(b, c, 8, 8);
  Graph g(std::move(b));
  g.bind(dut);
  std::vector<double> images(sz(8 * 3 * 8 * 8)), labels(8);
  for (std::size_t i = 0; i < images.size(); ++i) images[i] = uniform(seed, i, -1, 1);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<double>(mix64(seed, i) % 5);
  g.set_input(m.images, images);
  g.set_input(m.labels, labels);
  g.forward();
  g.backward();
  for (double v : g.read(m.logits)) EXPECT_TRUE(std::isfinite(v));
  return dut.checked();
}

// A reference whose fused backward forgets the residual's gradient: what the check must catch.
class ResidualGradientDroppingKernels final : public ref::RefKernels {
 public:
  void batchnorm_activation_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy,
                                     const Tensor& gamma, const Tensor& beta, const Tensor& smean,
                                     const Tensor& sinvstd, const Tensor& mask, bool residual, const Tensor& dx,
                                     bool dx_accumulate, const Tensor&, bool, const Tensor& dgamma,
                                     const Tensor& dbeta, Workspace ws) override {
    RefKernels::batchnorm_activation_backward(d, x, y, dy, gamma, beta, smean, sinvstd, mask, residual, dx,
                                              dx_accumulate, Tensor{}, false, dgamma, dbeta, ws);
  }
};

// The check above on the CPU: the reference passes every call (each bn_act forward and backward
// among them); one whose fused backward drops dz fails both block-ending backward calls on dz (and
// the calls downstream of the lost gradient).
TEST(CudaModelCheck, FusedBatchNormReluStepIsCheckedCallByCallOnTheReference) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto honest = make_ref_kernels();
  CheckedKernels ok(*honest, 1e-5, 1e-5);
  EXPECT_GT(check_fused_tiny_resnet_step(ok, Precision::fp32, seed), 40);
  EXPECT_EQ(ok.failed(), 0) << ok.failures();
  ResidualGradientDroppingKernels faulty;
  CheckedKernels bad(faulty, 1e-5, 1e-5);
  check_fused_tiny_resnet_step(bad, Precision::fp32, seed);
  EXPECT_GE(bad.failed(), 2) << bad.failures();
  std::size_t dz_failures = 0;
  for (std::size_t at = bad.failures().find("+ residual: dz:"); at != std::string::npos;
       at = bad.failures().find("+ residual: dz:", at + 1))
    ++dz_failures;
  EXPECT_EQ(dz_failures, 2u) << bad.failures();
}

// The same on the GPU, in the NHWC 16-bit precisions where cuDNN's fused kernels may run and in
// f32 (the separate kernels). Which shapes cuDNN fused is printed (its decision, not the test's).
TEST_F(CudaKernelsTest, FusedBatchNormReluTrainingStepMatchesTheReferenceCallByCall) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (Precision p : {Precision::bf16, Precision::fp16, Precision::fp32}) {
    SCOPED_TRACE(std::string(to_string(p)));
    const bool wide = p == Precision::fp32;
    const DType t = wide ? DType::f32 : (p == Precision::bf16 ? DType::bf16 : DType::f16);
    CheckedKernels checked(*cuda_, tolerance(t), wide ? 1e-3 : 3e-2);
    EXPECT_GT(check_fused_tiny_resnet_step(checked, p, seed), 40);
    EXPECT_EQ(checked.failed(), 0) << checked.failed() << " of " << checked.checked() << " checked outputs differ:\n"
                                   << checked.failures();
  }
  for (const std::string& line : cuda_bn_fusion_notes(*cuda_)) std::printf("%s\n", line.c_str());
}

// Batch norms folded into the convolutions (inference): a folded tiny ResNet on `dut`, every
// kernel call checked against the reference on dut's operands (the bias_act epilogue with and
// without a residual among them), and its logits against the unfolded network's in f64 on the
// reference, from the same non-trivial batch-norm values (random gamma, beta, mean and variance).
// With `fuse`, each epilogue runs inside its convolution (conv2d_bias_activation_forward).
// Returns the logits' comparison log (empty when within logits_tol).
std::string check_folded_tiny_resnet(CheckedKernels& dut, Precision p, Layout layout, std::uint64_t seed,
                                     double logits_tol, bool fuse = false) {
  auto ref = make_ref_kernels();
  models::ResNetConfig c = models::tiny_resnet(3, 5);
  // The tiny ResNet on 2 images of 8x8, inference, its logits kept: (graph, images, logits).
  const auto build = [&](GraphOptions o) {
    o.layout = layout;
    o.training = false;
    GraphBuilder b(o);
    const Value in = b.input("images", Shape{2, 3, 8, 8});
    const Value out = models::resnet(b, in, c);
    b.mark_output(out);
    return std::make_tuple(std::make_unique<Graph>(std::move(b)), in, out);
  };
  GraphOptions ro;
  ro.dtype = DType::f64;
  const auto [reference, ri, rl] = build(ro);
  reference->bind(*ref);
  ParameterValues values = reference->parameter_values();
  test::randomise_batchnorms(values, seed);
  if (::testing::Test::HasFatalFailure()) return "the network has no batch norm to randomise";
  reference->set_parameter_values(values);
  std::vector<double> images(2 * 3 * 8 * 8);
  for (std::size_t i = 0; i < images.size(); ++i) images[i] = uniform(seed + 1, i, -1.5, 1.5);
  reference->set_input(ri, images);
  reference->forward(false);

  c.fold_batchnorm = true;
  c.fuse_conv_epilogue = fuse;
  GraphOptions go;
  go.precision = p;
  const auto [folded, gi, gl] = build(go);
  folded->bind(dut);
  folded->set_parameter_values(models::fold_batchnorm_parameters(
      values, fuse ? models::FoldedBias::on_convolution : models::FoldedBias::on_batchnorm));
  folded->set_input(gi, images);
  folded->forward(false);
  std::string log;
  close_to(folded->read(gl), reference->read(rl), logits_tol, "logits", &log);
  return log;
}

// A reference whose fused epilogue forgets the residual: what the per-call check must catch.
class ResidualDroppingKernels final : public ref::RefKernels {
 public:
  void bias_activation_forward(const Tensor& x, const Tensor& bias, const Tensor&, const Tensor& y,
                               bool relu) override {
    RefKernels::bias_activation_forward(x, bias, Tensor{}, y, relu);
  }
};

// The check above on the CPU: the f32 reference passes every call and gives the unfolded logits;
// an epilogue without its residual fails exactly the two block-ending calls and the logits.
TEST(CudaModelCheck, FoldedTinyResnetIsCheckedCallByCallOnTheReference) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto honest = make_ref_kernels();
  CheckedKernels ok(*honest, 1e-5, 1e-5);
  EXPECT_EQ(check_folded_tiny_resnet(ok, Precision::fp32, Layout::nhwc, seed, 1e-5), "");
  // The stem's conv and bias_act, per block conv, bias_act x 2, conv x 2 (with the projection),
  // bias_act x 2; the pool and fc.
  EXPECT_EQ(ok.checked(), 2 + 2 * 8 + 2);
  EXPECT_EQ(ok.failed(), 0) << ok.failures();
  ResidualDroppingKernels faulty;
  CheckedKernels bad(faulty, 1e-5, 1e-5);
  EXPECT_NE(check_folded_tiny_resnet(bad, Precision::fp32, Layout::nhwc, seed, 1e-5), "");
  EXPECT_EQ(bad.failed(), 2) << bad.failures();
  // Fused: one call per convolution and its epilogue (the stem's, four per block), the pool and fc.
  CheckedKernels ok_fused(*honest, 1e-5, 1e-5);
  EXPECT_EQ(check_folded_tiny_resnet(ok_fused, Precision::fp32, Layout::nhwc, seed, 1e-5, true), "");
  EXPECT_EQ(ok_fused.checked(), 1 + 2 * 4 + 2);
  EXPECT_EQ(ok_fused.failed(), 0) << ok_fused.failures();
  CheckedKernels bad_fused(faulty, 1e-5, 1e-5);
  EXPECT_NE(check_folded_tiny_resnet(bad_fused, Precision::fp32, Layout::nhwc, seed, 1e-5, true), "");
  EXPECT_EQ(bad_fused.failed(), 2) << bad_fused.failures();
}

TEST_F(CudaKernelsTest, FoldedTinyResnetInferenceMatchesTheUnfoldedReference) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (bool fuse : {false, true})
    for (Precision p : {Precision::fp32, Precision::bf16})
      for (Layout layout : {Layout::nchw, Layout::nhwc}) {
        SCOPED_TRACE(std::string(to_string(p)) + " " + std::string(to_string(layout)) + (fuse ? " fused" : ""));
        const bool bf16 = p == Precision::bf16;
        CheckedKernels checked(*cuda_, tolerance(bf16 ? DType::bf16 : DType::f32), bf16 ? 3e-2 : 1e-3);
        EXPECT_EQ(check_folded_tiny_resnet(checked, p, layout, seed, bf16 ? 1e-1 : 1e-3, fuse), "");
        EXPECT_EQ(checked.failed(), 0) << checked.failed() << " of " << checked.checked()
                                       << " checked outputs differ:\n" << checked.failures();
        EXPECT_EQ(checked.checked(), fuse ? 1 + 2 * 4 + 2 : 2 + 2 * 8 + 2);
      }
}

// Reference kernels with one classic mistake each: a backward-data convolution that should add
// into a residual branch point overwrites it (the other branch's gradient is lost), or a batch
// norm writes dgamma and dbeta swapped.
class FaultyRefKernels final : public ref::RefKernels {
 public:
  FaultyRefKernels(int drop_accumulate_at, int swap_batchnorm_at)
      : drop_at_(drop_accumulate_at), swap_at_(swap_batchnorm_at) {}
  void conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate,
                            Workspace ws) override {
    if (accumulate && accumulates_++ == drop_at_) accumulate = false;
    RefKernels::conv2d_backward_data(d, dy, w, dx, accumulate, ws);
  }
  void batchnorm_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx, bool accumulate,
                          const Tensor& dgamma, const Tensor& dbeta) override {
    const bool swap = batchnorms_++ == swap_at_;
    RefKernels::batchnorm_backward(d, x, dy, gamma, saved_mean, saved_invstd, dx, accumulate, swap ? dbeta : dgamma,
                                   swap ? dgamma : dbeta);
  }

 private:
  int drop_at_, swap_at_;
  int accumulates_ = 0, batchnorms_ = 0;
};

// The check above, on the CPU: the f32 reference kernels pass it; with either mistake, exactly
// the faulty call fails. No GPU needed. ResNet-50's graph (its 53 convolutions and batch norms,
// every residual branch point, 707 checked outputs) at 1/16 of its widths: what the check proves
// depends on the ops and their order, not the channel counts, and the three runs take ~1 s on
// the reference kernels instead of ~100 s.
TEST(CudaModelCheck, EveryKernelCallCheckCatchesALostResidualGradientAndSwappedGradients) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  models::ResNetConfig c = resnet50_10_classes();
  c.planes = {4, 8, 16, 32};
  c.stem_channels = 8;
  auto honest = make_ref_kernels();
  CheckedKernels ok(*honest, 1e-4, 1e-3);
  const ModelRun base = run_model(ok, DType::f32, c, 2, 64, Layout::nhwc, seed);
  EXPECT_EQ(ok.failed(), 0) << ok.failures();
  EXPECT_GT(ok.checked(), 400);

  FaultyRefKernels drop(8, -1), swap(-1, 40);
  CheckedKernels dropped(drop, 1e-4, 1e-3), swapped(swap, 1e-4, 1e-3);
  run_model(dropped, DType::f32, c, 2, 64, Layout::nhwc, seed, &base.params);
  run_model(swapped, DType::f32, c, 2, 64, Layout::nhwc, seed, &base.params);
  EXPECT_EQ(dropped.failed(), 1) << dropped.failures();
  EXPECT_NE(dropped.failures().find("conv2d_backward_data"), std::string::npos) << dropped.failures();
  EXPECT_EQ(swapped.failed(), 2) << swapped.failures();  // dgamma and dbeta
  EXPECT_NE(swapped.failures().find("batchnorm_backward"), std::string::npos) << swapped.failures();
  std::printf("%d outputs checked; a lost residual gradient:\n%sswapped batch-norm gradients:\n%s", ok.checked(),
              dropped.failures().c_str(), swapped.failures().c_str());
}

// One training step (forward, backward) of a small compression autoencoder (N = 16, M = 12, 5x5,
// 32 px: latent 2x2) through CheckedKernels: every call, the transposed convolutions' swapped
// convolution calls, the rounding and the rate-distortion loss included, against the reference.
// Returns the number of checked outputs; failures are the wrapper's.
int run_checked_autoencoder_step(CheckedKernels& k, Layout layout, std::uint64_t seed) {
  models::CompressionConfig c = models::compression_ae();
  c.channels = 16;
  c.latent_channels = 12;
  GraphOptions o;
  o.layout = layout;
  o.seed = seed;
  GraphBuilder b(o);
  const models::CompressionModel m = models::build_compression_ae(b, c, 2, 32);
  Graph g(std::move(b));
  g.bind(k);
  std::vector<double> images(sz(2 * 3 * 32 * 32));
  for (std::size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>(uniform(seed, i, -0.5, 0.5));
  g.set_input(m.images, images);
  g.forward();
  g.backward();
  EXPECT_TRUE(std::isfinite(g.read(m.loss)[0]));
  return k.checked();
}

TEST(CudaModelCheck, CompressionAutoencoderStepIsCheckedCallByCallOnTheReference) {
  // The wrapper itself, on the CPU: the f32 reference passes every call.
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto honest = make_ref_kernels();
  CheckedKernels ok(*honest, 1e-4, 1e-3);
  // 8 forward convolutions, 7 data and 8 filter gradients, 6 ReLUs each way, the rounding, the
  // loss forward and backward, the straight-through copy.
  EXPECT_GE(run_checked_autoencoder_step(ok, Layout::nhwc, seed), 40);
  EXPECT_EQ(ok.failed(), 0) << ok.failures();
}

TEST_F(CudaKernelsTest, CompressionAutoencoderStepMatchesReferenceCallByCall) {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    const std::uint64_t seed = test::seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " " + std::string(to_string(layout)));
    CheckedKernels checked(*cuda_, 1e-4, 1e-3);
    EXPECT_GE(run_checked_autoencoder_step(checked, layout, seed), 40);
    EXPECT_EQ(checked.failed(), 0) << checked.failed() << " of " << checked.checked()
                                   << " checked outputs differ:\n" << checked.failures();
  }
}

// At batch 1 cudnnFind's single, host-bound timing misranks algorithms: every usable candidate is
// re-timed on the GPU alone and the fastest kept. Prints the choices and the captured forward's
// time (ResNet-50, fp16, NHWC, 224 px) for the record; asserts only what must hold.
TEST_F(CudaKernelsTest, Resnet50BatchOneConvolutionChoicesAreTimed) {
  GraphOptions o;
  o.layout = Layout::nhwc;
  o.precision = Precision::fp16;
  o.training = false;
  GraphBuilder b(o);
  const models::Classifier m = models::build_classifier(b, models::resnet50(), 1, 224);
  Graph g(std::move(b));
  g.bind(*cuda_);
  const auto lines = cuda_conv_choices(*cuda_);
  // One line per searched pass of each distinct configuration: an inference graph searches the
  // forward pass only.
  std::size_t forward_lines = 0;
  for (const std::string& line : lines) {
    const bool forward = line.find(": forward algo ") != std::string::npos;
    forward_lines += forward ? 1 : 0;
    EXPECT_TRUE(forward) << "a backward pass searched for an inference graph: " << line;
    std::printf("%s\n", line.c_str());
  }
  EXPECT_GE(forward_lines, 10u) << "one forward choice per distinct convolution configuration";
  EXPECT_EQ(static_cast<std::int64_t>(forward_lines), cuda_kernel_stats(*cuda_).conv_searches);
  std::vector<double> images(sz(3 * 224 * 224));
  for (std::size_t i = 0; i < images.size(); ++i) images[i] = uniform(seed_, i, -1, 1);
  g.set_input(m.images, images);
  g.set_input(m.labels, {0.0});
  const auto forward = g.capture_step(nullptr);
  forward->replay();
  cuda_->synchronize();
  const auto timer = cuda_->make_timer();
  std::vector<double> ms;
  for (int i = 0; i < 7; ++i) ms.push_back(timer->time_batch([&] { forward->replay(); }, 20) / 20 * 1e3);
  std::sort(ms.begin(), ms.end());
  std::printf("resnet50 fp16 nhwc batch 1: captured forward %.3f ms (median of 7 x 20 replays)\n", ms[3]);
  for (double v : g.read(m.logits)) ASSERT_TRUE(std::isfinite(v));
}

TEST_F(CudaKernelsTest, TinyResnetLearnsTheSyntheticTaskOnTheGpu) {
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const test::TrainRun r = test::train_tiny(*cuda_, {seed, seed + 1, 200, false, 4, Layout::nhwc});
  const double chance = std::log(static_cast<double>(test::kPatternClasses));
  EXPECT_NEAR(test::mean_tail({r.losses.begin(), r.losses.begin() + 5}, 5), chance, 0.5);  // starts near chance
  EXPECT_LT(test::mean_tail(r.losses, 10), 0.25 * chance);
  EXPECT_GT(r.accuracy, 0.9);
  std::printf("tiny resnet on cuda, SGD: loss %.3f -> %.3f in %zu steps, held-out accuracy %.3f\n", r.losses.front(),
              test::mean_tail(r.losses, 10), r.losses.size(), r.accuracy);
}

}  // namespace
}  // namespace ab::nn
