// Tests for the CUDA linear family (nn/cuda/linear*.cpp) against the reference kernels in f64 on
// the same dtype-rounded random inputs: the GELU fused into the forward GEMM (GELU_AUX_BIAS, and
// GELU_BIAS with nothing kept) and into the backward-data GEMM (DGELU) against linear + gelu, at
// K = 768 and 3072 with rows off every tile size; that cuBLASLt's GELU is the tanh form (not erf);
// padded rows (stride > width) for every operand of forward, backward data and backward weights,
// the padding left untouched; the bias gradient inside the weight GEMM; bit-identical results twice
// in deterministic mode; the classifier's logits at the full vocabulary (50257 stored 50304 wide);
// the algorithm choice (timed outside a capture, the heuristic's first inside one) as
// cuda_linear_choices reports it. Skips where no GPU answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "nn/cuda/kernels.h"
#include "nn/kernels.h"
#include "test_support.h"

namespace ab::nn {
namespace {

using std::int64_t;

bool has_gpu() { return backend::cuda::device_count() > 0; }

std::size_t sz(int64_t v) { return static_cast<std::size_t>(v); }

// Tolerance relative to the largest reference value: the stored result's rounding plus f32
// arithmetic on f16/bf16 operands against the f64 oracle (as nn_cuda_test's).
double tolerance(DType t) {
  if (t == DType::bf16) return 3e-2;
  if (t == DType::f16) return 1e-2;
  return 1e-4;
}

// What the padding of a padded matrix holds before a call: a call must leave it so.
constexpr double kPad = 7.0;

// A [rows, cols] matrix stored with row stride `ld` on the GPU in `dtype`, and its f64 twin on the
// host with the same strides, holding the same (rounded) values; the padding holds kPad in both.
struct Mat {
  Buffer dev_buf, ref_buf;
  Tensor dev, ref;
  Tensor dev_backing;  // [rows, ld] contiguous: what upload and download move
  int64_t rows = 0, cols = 0, ld = 0;
};

Tensor padded_view(const Tensor& backing, int64_t cols) {
  Tensor t = backing;
  t.shape = Shape{backing.shape[0], cols};
  t.strides = Shape{backing.shape[1], 1};
  return t;
}

class CudaLinearTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_gpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
    backend_ = backend::make_backend("cuda:0");
    cuda_ = make_cuda_kernels(*backend_);
    ref_ = make_ref_kernels();
  }

  // Logical values from `values` (row-major rows x cols), or uniform in [lo, hi) where empty.
  Mat mat(DType dtype, int64_t rows, int64_t cols, int64_t ld, double lo = -1, double hi = 1,
          std::vector<double> values = {}) {
    Mat m;
    m.rows = rows, m.cols = cols, m.ld = ld;
    if (values.empty()) {
      values.resize(sz(rows * cols));
      for (double& v : values) v = uniform(seed_, counter_++, lo, hi);
    }
    std::vector<double> full(sz(rows * ld), kPad);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) full[sz(r * ld + c)] = values[sz(r * cols + c)];
    const Tensor d = Tensor::describe(dtype, Shape{rows, ld}, Layout::nchw, DeviceKind::cuda);
    const Tensor r = Tensor::describe(DType::f64, Shape{rows, ld});
    m.dev_buf = Buffer(cuda_->allocator(), d.size_bytes());
    m.ref_buf = Buffer(ref_->allocator(), r.size_bytes());
    m.dev_backing = m.dev_buf.view(d);
    std::vector<unsigned char> host(sz(d.size_bytes()));
    const Tensor staging = Tensor::describe(dtype, Shape{rows, ld}).with_data(host.data());
    write_host(staging, full);
    cuda_->upload(m.dev_backing, host.data());
    const Tensor ref_backing = m.ref_buf.view(r);
    write_host(ref_backing, read_host(staging));  // the rounded values
    m.dev = padded_view(m.dev_backing, cols);
    m.ref = padded_view(ref_backing, cols);
    return m;
  }
  Mat vec(DType dtype, int64_t n) {
    Mat m = mat(dtype, 1, n, n);
    m.dev.shape = Shape{n}, m.dev.strides = Shape{1};
    m.ref.shape = Shape{n}, m.ref.strides = Shape{1};
    return m;
  }

  // Every stored element of the GPU matrix, padding included (row-major rows x ld).
  std::vector<double> read_full(const Mat& m) {
    std::vector<unsigned char> host(sz(m.dev_backing.size_bytes()));
    cuda_->download(m.dev_backing, host.data());
    return read_host(Tensor::describe(m.dev_backing.dtype, m.dev_backing.shape).with_data(host.data()));
  }
  std::vector<double> read(const Mat& m) {
    const auto full = read_full(m);
    std::vector<double> out;
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < m.cols; ++c) out.push_back(full[sz(r * m.ld + c)]);
    return out;
  }

  // max |gpu - ref| <= tol * max |ref| over the logical elements, reporting the worst; the GPU's
  // padding still holds kPad.
  void expect_close(const Mat& m, double tol, const std::string& what) {
    const auto full = read_full(m), want = read_host(m.ref);
    double scale = 0, worst = -1;
    int64_t at = 0, pad_written = 0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < m.ld; ++c) {
        const double got = full[sz(r * m.ld + c)];
        if (c >= m.cols) {
          pad_written += got != kPad;
          continue;
        }
        const double err = std::isnan(got) ? INFINITY : std::abs(got - want[sz(r * m.cols + c)]);
        if (err > worst) worst = err, at = r * m.cols + c;
      }
    EXPECT_GT(scale, 0) << what << ": an all-zero reference checks nothing";
    EXPECT_LE(worst, tol * scale) << what << ": worst element [" << at / m.cols << ", " << at % m.cols << "] gpu "
                                  << read(m)[sz(at)] << " ref " << want[sz(at)] << " (max |ref| " << scale << ", seed "
                                  << seed_ << ")";
    EXPECT_EQ(pad_written, 0) << what << ": " << pad_written << " padding elements (row stride " << m.ld << ", width "
                              << m.cols << ") were written";
  }

  // The plan lines of cuda_linear_choices that contain `needle`, printed for the log.
  std::vector<std::string> choices_with(const std::string& needle) {
    std::vector<std::string> out;
    for (const std::string& line : cuda_linear_choices(*cuda_))
      if (line.find(needle) != std::string::npos) out.push_back(line);
    for (const std::string& line : out) std::printf("  %s\n", line.c_str());
    return out;
  }

  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<Kernels> cuda_, ref_;
  std::uint64_t seed_ = test::seed();
  std::uint64_t counter_ = 0;
};

std::string type_name(DType t) { return std::string(to_string(t)); }

// ---------------------------------------------------------------------------------------------
// GELU fused into the GEMMs

struct GeluCase {
  int64_t n, in, out;
};
// K = in (forward) is 768 or 3072, as GPT-2's c_fc and c_proj; rows are no multiple of 128.
const GeluCase kGeluCases[] = {{136, 768, 512}, {72, 3072, 256}};

TEST_F(CudaLinearTest, FusedGeluForwardMatchesLinearThenGeluAndRunsTheEpilogue) {
  for (DType t : {DType::bf16, DType::f16})
    for (const GeluCase& c : kGeluCases)
      for (bool keep_pre : {true, false}) {
        SCOPED_TRACE(type_name(t) + " n=" + std::to_string(c.n) + " in=" + std::to_string(c.in) +
                     " out=" + std::to_string(c.out) + (keep_pre ? " pre kept" : " no pre"));
        Mat x = mat(t, c.n, c.in, c.in), w = mat(t, c.out, c.in, c.in, -0.08, 0.08), b = vec(t, c.out);
        Mat pre = mat(t, c.n, c.out, c.out), y = mat(t, c.n, c.out, c.out);
        cuda_->linear_gelu_forward(x.dev, w.dev, b.dev, keep_pre ? pre.dev : Tensor{}, y.dev);
        ref_->linear_forward(x.ref, w.ref, b.ref, pre.ref);
        ref_->gelu_forward(pre.ref, y.ref);
        if (keep_pre) {
          ASSERT_NO_FATAL_FAILURE(expect_close(pre, tolerance(t), "pre (x w^T + b)"));
        }
        ASSERT_NO_FATAL_FAILURE(expect_close(y, tolerance(t), "y = gelu(pre)"));
      }
  for (const char* epilogue : {"+gelu_aux_bias", "+gelu_bias"})
    for (DType t : {DType::bf16, DType::f16}) {
      const auto lines = choices_with("gemm " + type_name(t) + " ");
      EXPECT_TRUE(std::any_of(lines.begin(), lines.end(),
                              [&](const std::string& l) {
                                return l.find(epilogue) != std::string::npos &&
                                       l.find("cublasLt algo") != std::string::npos;
                              }))
          << "no " << type_name(t) << " plan ran the " << epilogue << " epilogue: the call composed linear + gelu";
    }
  const Kernels::FusionCounts counts = cuda_->fusion_counts();  // what records report
  EXPECT_EQ(counts.fused, 2 * 2 * 2) << "GELU plans fused (2 dtypes x 2 shapes x pre kept or not)";
  EXPECT_EQ(counts.unfused, 0) << "GELU plans that composed the separate kernels";
}

TEST_F(CudaLinearTest, FusedGeluBackwardDataMatchesLinearBackwardThenGeluBackward) {
  for (DType t : {DType::bf16, DType::f16})
    for (const GeluCase& c : kGeluCases)
      for (const bool with_bias : {false, true}) {
        // The layer after the GELU: dy [n, out], w [out, in]; K = out. So K = 768 and 3072 here too.
        const int64_t n = c.n, k = c.in, in = c.out;
        SCOPED_TRACE(type_name(t) + " n=" + std::to_string(n) + " K=" + std::to_string(k) +
                     " in=" + std::to_string(in) + (with_bias ? ", with the bias gradient" : ""));
        Mat dy = mat(t, n, k, k), w = mat(t, k, in, in, -0.08, 0.08), pre = mat(t, n, in, in, -3, 3);
        Mat dx = mat(t, n, in, in), db = vec(t, in);
        cuda_->linear_backward_data_gelu(dy.dev, w.dev, pre.dev, dx.dev, with_bias ? db.dev : Tensor{});
        ref_->linear_backward_data(dy.ref, w.ref, dx.ref, false);
        ref_->gelu_backward(pre.ref, dx.ref, dx.ref, false);
        ASSERT_NO_FATAL_FAILURE(expect_close(dx, tolerance(t), "dx = gelu'(pre) * (dy w)"));
        if (!with_bias) continue;
        ref_->column_sums(dx.ref, db.ref);
        ASSERT_NO_FATAL_FAILURE(expect_close(db, tolerance(t), "dbias = the column sums of dx"));
      }
  for (DType t : {DType::bf16, DType::f16}) {
    const auto lines = choices_with("gemm " + type_name(t) + " ");
    EXPECT_TRUE(std::any_of(lines.begin(), lines.end(),
                            [](const std::string& l) {
                              return l.find("+dgelu") != std::string::npos &&
                                     l.find("cublasLt algo") != std::string::npos;
                            }))
        << "no " << type_name(t) << " plan ran the DGELU epilogue: the call composed linear + gelu_backward";
  }
}

// The tanh form (GPT-2's, the reference's) and the erf form differ by up to ~5e-4, most in
// relative terms for x in [-4, -1.5], where the GELU is small and its stored ulp fine. With w = I
// and no bias, pre = x exactly (one product per sum), so y is cuBLASLt's GELU of known values: it
// must match the tanh form as every GEMM result here does, and on [-4, -1.5] lie far nearer to it
// than to the erf form. The same for DGELU with dy as the data. How far cuBLASLt is from an
// f32-faithful tanh form (an ulp of the stored result plus a few f32 ulps lost in 1 + tanh(u) and
// 1 - tanh(u)^2: a fast tanh would show here) is printed for the log.
TEST_F(CudaLinearTest, CublasLtGeluIsTheTanhFormForwardAndBackward) {
  const int64_t n = 96, d = 64;
  const auto erf_gelu = [](double x) { return 0.5 * x * (1 + std::erf(x / std::numbers::sqrt2)); };
  const auto erf_dgelu = [](double x) {
    return 0.5 * (1 + std::erf(x / std::numbers::sqrt2)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi);
  };
  std::vector<double> eye(sz(d * d), 0.0);
  for (int64_t i = 0; i < d; ++i) eye[sz(i * d + i)] = 1.0;
  for (DType t : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(type_name(t));
    const double ulp = t == DType::f16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    const double floor = t == DType::f16 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -133);
    const double f32_loss = std::ldexp(1.0, -21);
    Mat w = mat(t, d, d, d, 0, 0, eye), x = mat(t, n, d, d, -5, 3), y = mat(t, n, d, d);
    Mat dy = mat(t, n, d, d, 0.5, 2), dx = mat(t, n, d, d);
    cuda_->linear_gelu_forward(x.dev, w.dev, Tensor{}, Tensor{}, y.dev);
    cuda_->linear_backward_data_gelu(dy.dev, w.dev, x.dev, dx.dev, Tensor{});
    ref_->gelu_forward(x.ref, y.ref);
    ref_->gelu_backward(x.ref, dy.ref, dx.ref, false);
    ASSERT_NO_FATAL_FAILURE(expect_close(y, tolerance(t), "forward gelu(x), the tanh form"));
    ASSERT_NO_FATAL_FAILURE(expect_close(dx, tolerance(t), "backward gelu'(x) * dy, the tanh form"));
    const auto xs = read_host(x.ref), dys = read_host(dy.ref);
    for (const bool backward : {false, true}) {
      const char* what = backward ? "backward gelu'(x) * dy" : "forward gelu(x)";
      const auto got = read(backward ? dx : y), want = read_host(backward ? dx.ref : y.ref);
      double off_tanh = 0, off_erf = 0, worst = 0;
      std::size_t at = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double v = xs[i], a = std::abs(v);
        const double erf_value = backward ? erf_dgelu(v) * dys[i] : erf_gelu(v);
        const double math = backward ? f32_loss * (1 + a * a * a) * dys[i] : f32_loss * a;
        const double excess = std::abs(got[i] - want[i]) - (ulp * std::abs(want[i]) + math + floor);
        if (excess > worst) worst = excess, at = i;
        if (v < -1.5 && v > -4) {
          off_tanh += std::abs(got[i] - want[i]);
          off_erf += std::abs(got[i] - erf_value);
        }
      }
      EXPECT_LT(off_tanh, 0.5 * off_erf) << what << ": summed distance over x in [-4, -1.5] to the tanh form "
                                         << off_tanh << ", to the erf form " << off_erf
                                         << " (cuBLASLt's GELU is the erf form, or too far from both to tell)";
      std::printf(
          "  %s %s: summed distance on [-4, -1.5] to tanh %.3g, to erf %.3g; worst excess over an "
          "f32-faithful tanh form %.3g at x = %.4g (gpu %.6g, tanh form %.6g)\n",
          type_name(t).c_str(), what, off_tanh, off_erf, worst, xs[at], got[at], want[at]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// padded rows, the bias gradient, determinism

struct PadCase {
  DType dtype;
  int64_t n, in, out, ld_in, ld_out;  // row strides of [n, in] and [n, out] operands
};

TEST_F(CudaLinearTest, PaddedRowsInEveryOperandOfEveryCallMatchTheReferenceAndKeepThePadding) {
  // The classifier's case in small: 1001 logits stored 1008 wide (16-byte rows in bf16).
  for (const PadCase& c : {PadCase{DType::bf16, 130, 96, 200, 104, 208}, PadCase{DType::f16, 64, 128, 1001, 136, 1008},
                           PadCase{DType::f32, 70, 40, 24, 44, 28}, PadCase{DType::bf16, 64, 128, 1001, 128, 1008}}) {
    SCOPED_TRACE(type_name(c.dtype) + " n=" + std::to_string(c.n) + " in=" + std::to_string(c.in) + "/" +
                 std::to_string(c.ld_in) + " out=" + std::to_string(c.out) + "/" + std::to_string(c.ld_out));
    const double tol = tolerance(c.dtype);
    Mat x = mat(c.dtype, c.n, c.in, c.ld_in), w = mat(c.dtype, c.out, c.in, c.in), b = vec(c.dtype, c.out);
    Mat y = mat(c.dtype, c.n, c.out, c.ld_out);
    cuda_->linear_forward(x.dev, w.dev, b.dev, y.dev);
    ref_->linear_forward(x.ref, w.ref, b.ref, y.ref);
    ASSERT_NO_FATAL_FAILURE(expect_close(y, tol, "forward"));

    Mat dy = mat(c.dtype, c.n, c.out, c.ld_out);
    for (bool accumulate : {false, true}) {
      Mat dx = mat(c.dtype, c.n, c.in, c.ld_in);
      cuda_->linear_backward_data(dy.dev, w.dev, dx.dev, accumulate);
      ref_->linear_backward_data(dy.ref, w.ref, dx.ref, accumulate);
      ASSERT_NO_FATAL_FAILURE(expect_close(dx, tol, accumulate ? "dx, accumulate" : "dx"));
    }
    Mat dw = mat(c.dtype, c.out, c.in, c.in), db = vec(c.dtype, c.out);
    cuda_->linear_backward_weights(x.dev, dy.dev, dw.dev, db.dev);
    ref_->linear_backward_weights(x.ref, dy.ref, dw.ref, db.ref);
    ASSERT_NO_FATAL_FAILURE(expect_close(dw, tol, "dw"));
    ASSERT_NO_FATAL_FAILURE(expect_close(db, tol, "dbias"));
  }
}

// [first, first + count) of a matrix's rows, or of its columns, as a view (the reference reads
// any strides, so slices of the large case below are checked at a fraction of its cost).
Tensor row_slice(const Tensor& t, int64_t first, int64_t count) {
  Tensor s = t;
  s.data = static_cast<unsigned char*>(t.data) + first * t.strides[0] * static_cast<int64_t>(size_bytes(t.dtype));
  s.shape = Shape{count, t.shape[1]};
  return s;
}
Tensor column_slice(const Tensor& t, int64_t first, int64_t count) {
  Tensor s = t;
  s.data = static_cast<unsigned char*>(t.data) + first * static_cast<int64_t>(size_bytes(t.dtype));
  s.shape = Shape{t.shape[0], count};
  return s;
}

// The classifier's layout at the real vocabulary: 50257 logits stored 50304 wide, as the rows of
// the forward's D, the K of backward data and the columns of the weight gradient. The reference
// runs on rows at both ends of the batch and vocabulary rows at both ends (the last before the
// padding among them); the padding of every logits row stays untouched.
TEST_F(CudaLinearTest, ClassifierLogitsStoredPaddedAtTheFullVocabularyWidth) {
  const DType t = DType::bf16;
  const int64_t n = 64, c = 64, v = 50257, ld = 50304;
  Mat x = mat(t, n, c, c), w = mat(t, v, c, c), y = mat(t, n, v, ld), dy = mat(t, n, v, ld);
  Mat dx = mat(t, n, c, c), dw = mat(t, v, c, c);
  cuda_->linear_forward(x.dev, w.dev, Tensor{}, y.dev);
  cuda_->linear_backward_data(dy.dev, w.dev, dx.dev, false);
  cuda_->linear_backward_weights(x.dev, dy.dev, dw.dev, Tensor{});
  const auto y_full = read_full(y), dx_got = read(dx), dw_got = read(dw);
  // max |gpu - ref| <= tol * max |ref| over rows [first, first + count) of a matrix.
  const auto expect_rows = [&](const std::vector<double>& got, int64_t got_ld, const Tensor& ref, int64_t first,
                               const std::string& what) {
    const int64_t count = 8, cols = ref.shape[1];
    const auto slice = read_host(row_slice(ref, first, count));
    double scale = 0, worst = 0;
    for (double value : slice) scale = std::max(scale, std::abs(value));
    for (int64_t r = 0; r < count; ++r)
      for (int64_t j = 0; j < cols; ++j)
        worst = std::max(worst, std::abs(got[sz((first + r) * got_ld + j)] - slice[sz(r * cols + j)]));
    EXPECT_GT(scale, 0) << what;
    EXPECT_LE(worst, tolerance(t) * scale)
        << what << " rows " << first << ".." << first + count - 1 << ": worst |gpu - ref| " << worst << " (max |ref| "
        << scale << ", seed " << seed_ << ")";
  };
  for (const int64_t first : {int64_t{0}, n - 8}) {
    ref_->linear_forward(row_slice(x.ref, first, 8), w.ref, Tensor{}, row_slice(y.ref, first, 8));
    expect_rows(y_full, ld, y.ref, first, "logits");
    ref_->linear_backward_data(row_slice(dy.ref, first, 8), w.ref, row_slice(dx.ref, first, 8), false);
    expect_rows(dx_got, c, dx.ref, first, "dx from the padded dlogits");
  }
  for (const int64_t first : {int64_t{0}, v - 8}) {
    ref_->linear_backward_weights(x.ref, column_slice(dy.ref, first, 8), row_slice(dw.ref, first, 8), Tensor{});
    expect_rows(dw_got, c, dw.ref, first, "dw from the padded dlogits");
  }
  int64_t pad_written = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = v; j < ld; ++j) pad_written += y_full[sz(r * ld + j)] != kPad;
  EXPECT_EQ(pad_written, 0) << "padding elements of the logits written";
  choices_with("50257");  // for the log: the classifier's algorithms
}

TEST_F(CudaLinearTest, BiasGradientMatchesTheReferenceWithAndWithoutTheFusedEpilogue) {
  // 1000 rows: no multiple of any tile; 70000 rows: more than one chunk of the fallback's sums.
  struct BiasCase {
    DType t;
    int64_t n, in;
  };
  for (const auto& [t, n, in] : {BiasCase{DType::bf16, 1000, 64}, BiasCase{DType::f16, 1000, 64},
                                 BiasCase{DType::f32, 1000, 64}, BiasCase{DType::bf16, 70000, 8}}) {
    SCOPED_TRACE(type_name(t) + " n=" + std::to_string(n) + " in=" + std::to_string(in));
    const int64_t out = 192;
    Mat x = mat(t, n, in, in), dy = mat(t, n, out, out), dw = mat(t, out, in, in), db = vec(t, out);
    cuda_->linear_backward_weights(x.dev, dy.dev, dw.dev, db.dev);
    ref_->linear_backward_weights(x.ref, dy.ref, dw.ref, db.ref);
    ASSERT_NO_FATAL_FAILURE(expect_close(dw, tolerance(t), "dw"));
    ASSERT_NO_FATAL_FAILURE(expect_close(db, tolerance(t), "dbias"));
  }
  choices_with("+bgradb");  // for the log: where cuBLASLt ran the bias gradient in the weight GEMM
}

// The engine's column sums (Kernels::column_sums; the bias gradients' kernel under
// AB_BIAS_GRADIENT=columns and after a DGELU without BGRAD): against the reference's f64 sums, on
// GPT-2's widths, padded rows and widths off the 16-byte vector, the same bits twice.
TEST_F(CudaLinearTest, ColumnSumsMatchTheReferenceAndRepeatBitForBit) {
  struct Case {
    int64_t n, cols, ld;
  };
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (const Case& c : {Case{4099, 768, 768}, Case{1000, 2304, 2304}, Case{77, 64, 72}, Case{333, 37, 40}}) {
      SCOPED_TRACE(type_name(t) + " [" + std::to_string(c.n) + ", " + std::to_string(c.cols) + "] row stride " +
                   std::to_string(c.ld));
      Mat x = mat(t, c.n, c.cols, c.ld), sums = vec(t, c.cols);
      cuda_->column_sums(x.dev, sums.dev);
      ref_->column_sums(x.ref, sums.ref);
      ASSERT_NO_FATAL_FAILURE(expect_close(sums, tolerance(t), "column sums"));
      const std::vector<double> first = read(sums);
      cuda_->column_sums(x.dev, sums.dev);
      EXPECT_TRUE(read(sums) == first) << "the column sums differ between two runs";
    }
}

TEST_F(CudaLinearTest, DeterministicModeGivesBitIdenticalResultsTwice) {
  cuda_->set_deterministic(true);
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(type_name(t));
    const int64_t n = 1000, in = 768, out = 320;
    Mat x = mat(t, n, in, in), w = mat(t, out, in, in, -0.08, 0.08), b = vec(t, out), dy = mat(t, n, out, out);
    Mat w2 = mat(t, out, out, out, -0.08, 0.08);  // the layer after the GELU: K = out
    std::vector<std::vector<double>> runs[2];
    for (auto& run : runs) {
      Mat y = mat(t, n, out, out), pre = mat(t, n, out, out), dx = mat(t, n, in, in), dxg = mat(t, n, out, out);
      Mat dw = mat(t, out, in, in), db = vec(t, out), dbg = vec(t, out);
      cuda_->linear_gelu_forward(x.dev, w.dev, b.dev, pre.dev, y.dev);
      cuda_->linear_backward_data(dy.dev, w.dev, dx.dev, false);
      cuda_->linear_backward_weights(x.dev, dy.dev, dw.dev, db.dev);
      cuda_->linear_backward_data_gelu(dy.dev, w2.dev, pre.dev, dxg.dev, dbg.dev);
      run = {read(y), read(pre), read(dx), read(dw), read(db), read(dxg), read(dbg)};
    }
    const char* names[] = {"y", "pre", "dx", "dw", "dbias", "dx through the GELU", "dbias through the GELU"};
    for (std::size_t i = 0; i < runs[0].size(); ++i) {
      std::size_t differ = 0;
      for (std::size_t j = 0; j < runs[0][i].size(); ++j) differ += std::memcmp(&runs[0][i][j], &runs[1][i][j], 8) != 0;
      EXPECT_EQ(differ, 0u) << names[i] << ": " << differ << " of " << runs[0][i].size() << " elements differ";
    }
  }
  for (const std::string& line : choices_with("linear gemm"))
    EXPECT_EQ(line.find(" timed ("), std::string::npos) << line << ": chosen by timing in deterministic mode";
}

TEST_F(CudaLinearTest, AShapeIsTimedOutsideACaptureAndTakesTheHeuristicsFirstInsideOne) {
  const DType t = DType::bf16;
  Mat x = mat(t, 136, 768, 768), w = mat(t, 256, 768, 768, -0.08, 0.08), y = mat(t, 136, 256, 256);
  cuda_->linear_forward(x.dev, w.dev, Tensor{}, y.dev);
  ref_->linear_forward(x.ref, w.ref, Tensor{}, y.ref);
  ASSERT_NO_FATAL_FAILURE(expect_close(y, tolerance(t), "forward, timed at its first call"));
  const auto timed = choices_with("m=256 n=136 k=768");
  ASSERT_EQ(timed.size(), 1u);
  EXPECT_NE(timed[0].find("cublasLt algo"), std::string::npos) << timed[0];
  EXPECT_TRUE(timed[0].find(" timed (") != std::string::npos || timed[0].find("only candidate") != std::string::npos)
      << timed[0];

  Mat x2 = mat(t, 72, 768, 768), y2 = mat(t, 72, 256, 256);
  const auto replay = cuda_->capture([&] { cuda_->linear_forward(x2.dev, w.dev, Tensor{}, y2.dev); });
  replay->replay();
  ref_->linear_forward(x2.ref, w.ref, Tensor{}, y2.ref);
  ASSERT_NO_FATAL_FAILURE(expect_close(y2, tolerance(t), "forward, first met inside a capture"));
  const auto captured = choices_with("m=256 n=72 k=768");
  ASSERT_EQ(captured.size(), 1u);
  EXPECT_TRUE(captured[0].find("inside a capture") != std::string::npos ||
              captured[0].find("only candidate") != std::string::npos)
      << captured[0];
}

TEST_F(CudaLinearTest, OperandsItCannotReadAreRefusedByName) {
  const DType t = DType::bf16;
  Mat x = mat(t, 8, 16, 16), w = mat(t, 4, 16, 16), y = mat(t, 8, 4, 4);
  Tensor strided = y.dev;
  strided.strides = Shape{4, 2};  // columns not unit-stride
  const std::string msg =
      test::error_message<Unsupported>([&] { cuda_->linear_forward(x.dev, w.dev, Tensor{}, strided); });
  EXPECT_NE(msg.find("unit column stride"), std::string::npos) << msg;
  Tensor narrow = x.dev;
  narrow.strides = Shape{8, 1};  // rows overlap
  const std::string overlap =
      test::error_message<Unsupported>([&] { cuda_->linear_forward(narrow, w.dev, Tensor{}, y.dev); });
  EXPECT_NE(overlap.find("row stride of at least its width"), std::string::npos) << overlap;
}

}  // namespace
}  // namespace ab::nn
