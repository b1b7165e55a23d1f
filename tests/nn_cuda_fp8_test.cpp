// Tests for the fp8 (e4m3) groundwork (nn/cuda/conv_fp8.h): the device amax and
// quantization kernels against the host's float_to_e4m3_bits byte for byte (f32, f16 and bf16
// inputs, an outlier, a calibrated amax that saturates, the fallback scale, rounding ties), and
// cuDNN's fp8 convolution graph (conv -> descale -> bias -> ReLU) against an f64 convolution of
// the dequantized bytes, printing the engine cuDNN chose per shape. The alignment refusal runs
// anywhere (it happens before any cuDNN call); the rest skips where no GPU answers, or where the
// GPU is older than Hopper.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "nn/cuda/conv_fp8.h"
#include "nn/cuda/kernels.h"
#include "test_support.h"

namespace ab::nn::cuda {
namespace {

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

Fp8ConvShape make_shape(std::int64_t n, std::int64_t hw, std::int64_t c, std::int64_t k, std::int64_t rs,
                        std::int64_t stride, std::int64_t pad, bool bias, bool relu, DType out) {
  Fp8ConvShape s;
  s.n = n;
  s.h = s.w = hw;
  s.c = c;
  s.k = k;
  s.r = s.s = rs;
  s.conv.stride_h = s.conv.stride_w = stride;
  s.conv.pad_h = s.conv.pad_w = pad;
  s.bias = bias;
  s.relu = relu;
  s.out = out;
  return s;
}

// ---------------------------------------------------------------------------------------------
// without a GPU: the conversion the quantize kernel uses, and what is refused before any cuDNN call

// cuda_fp8.h's conversion (its host path, the rounding the kernel's cvt instruction documents)
// against the host's float_to_e4m3_bits, which the reference and the tests use: every sign,
// exponent and top 7 mantissa bits (the top 16 bits of the float, so every rounding tie of the
// 3-bit mantissa) with low halves 0, 1, 0x7fff, 0x8000 and 0xffff; NaNs only by being NaN.
TEST(Fp8Conversion, CudaHeaderRoundsLikeTheHost) {
  int compared = 0;
  for (std::uint32_t high = 0; high <= 0xffffu; ++high)
    for (std::uint32_t low : {0x0u, 0x1u, 0x7fffu, 0x8000u, 0xffffu}) {
      const std::uint32_t bits = high << 16 | low;
      float v;
      std::memcpy(&v, &bits, sizeof v);
      const auto cuda = static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
      const std::uint8_t host = float_to_e4m3_bits(v);
      if (std::isnan(v)) {
        ASSERT_EQ(cuda & 0x7f, 0x7f) << "NaN 0x" << std::hex << bits;
        ASSERT_EQ(host & 0x7f, 0x7f) << "NaN 0x" << std::hex << bits;
      } else {
        ASSERT_EQ(cuda, host) << "float bits 0x" << std::hex << bits << " (" << v << ")";
      }
      ++compared;
    }
  EXPECT_EQ(compared, 5 * 65536);
}

TEST(Fp8ConvRefusal, StemChannelsAreRefusedBeforeAnyCudnnCall) {
  // The ResNet stem: 7x7 stride 2 over C = 3. A null stream: reaching cuDNN would fail otherwise.
  const Fp8ConvShape stem = make_shape(1, 32, 3, 64, 7, 2, 3, true, true, DType::f16);
  const std::string msg = test::error_message<Unsupported>([&] { Fp8ConvPlan plan(stem, nullptr); });
  EXPECT_NE(msg.find("C and K multiples of 16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("C = 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("x e4m3[N 1, H 32, W 32, C 3]"), std::string::npos) << msg;
  EXPECT_EQ(fp8_conv_refusal(stem), msg);

  const std::string k24 = fp8_conv_refusal(make_shape(1, 8, 32, 24, 1, 1, 0, false, false, DType::f16));
  EXPECT_NE(k24.find("K = 24"), std::string::npos) << k24;
  Fp8ConvShape grouped = make_shape(1, 8, 128, 128, 3, 1, 1, false, false, DType::bf16);
  grouped.conv.groups = 32;
  EXPECT_NE(fp8_conv_refusal(grouped).find("groups = 1 only"), std::string::npos);
  const std::string f32 = fp8_conv_refusal(make_shape(1, 8, 32, 32, 1, 1, 0, false, false, DType::f32));
  EXPECT_NE(f32.find("not f32"), std::string::npos) << f32;
  EXPECT_EQ(fp8_conv_refusal(make_shape(4, 9, 32, 64, 3, 2, 1, true, true, DType::bf16)), "");
}

// ---------------------------------------------------------------------------------------------
// on a GPU

// Host bytes of `values` in dtype t and the values those bytes hold (rounded to t).
struct HostTensor {
  std::vector<unsigned char> bytes;
  std::vector<float> values;
};

HostTensor encode(DType t, const std::vector<double>& v) {
  HostTensor h;
  h.bytes.resize(v.size() * size_bytes(t));
  h.values.resize(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto f = static_cast<float>(v[i]);
    if (t == DType::f32) {
      std::memcpy(&h.bytes[i * 4], &f, 4);
      h.values[i] = f;
    } else {
      const std::uint16_t b = t == DType::f16 ? float_to_half_bits(f) : float_to_bf16_bits(f);
      std::memcpy(&h.bytes[i * 2], &b, 2);
      h.values[i] = t == DType::f16 ? half_bits_to_float(b) : bf16_bits_to_float(b);
    }
  }
  return h;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

class Fp8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    if (backend::cuda::device_count() == 0)
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none): the fp8 kernels and cuDNN's fp8 "
                      "convolution need a Hopper GPU (the lead runs this on an H200)";
    backend_ = backend::make_backend("cuda:0");
    if (test::below_hopper(backend_->info()))
      GTEST_SKIP() << "compute capability " << backend_->info().compute_capability
                   << ": the build targets sm_90 and cuDNN's fp8 convolutions need Hopper or newer";
    cuda_ = make_cuda_kernels(*backend_);
    stream_ = backend::cuda::native_stream(*backend_);
  }

  // `bytes` device bytes as a tensor the kernels can copy (one byte per element).
  static Tensor raw(const Buffer& b, std::int64_t bytes) { return raw(b.data(), bytes); }
  static Tensor raw(void* p, std::int64_t bytes) {
    return Tensor::describe(DType::f8e4m3, Shape{bytes}, Layout::nchw, DeviceKind::cuda).with_data(p);
  }
  Buffer device(std::int64_t bytes) { return Buffer(cuda_->allocator(), std::max<std::int64_t>(bytes, 16)); }
  Buffer to_device(const void* host, std::int64_t bytes) {
    Buffer b = device(bytes);
    cuda_->upload(raw(b, bytes), host);
    return b;
  }
  template <typename T>
  std::vector<T> from_device(const Buffer& b, std::int64_t count) {
    std::vector<T> out(sz(count));
    cuda_->download(raw(b, count * static_cast<std::int64_t>(sizeof(T))), out.data());
    return out;
  }
  float scalar(const Buffer& b) { return from_device<float>(b, 1)[0]; }
  static float* f32(const Buffer& b) { return static_cast<float*>(b.data()); }

  // Quantizes `x` (dtype t) with `amax` on the device (this tensor's own where amax_override is
  // NaN) and checks every byte against float_to_e4m3_bits(x * scale) and the descale against
  // amax / 448 (1 where the scale is not usable). Returns the device bytes.
  // With `misalign`, x and q start that many elements past an aligned address (the kernels' scalar path).
  std::vector<std::uint8_t> check_quantize(DType t, const HostTensor& x, const std::string& what,
                                           float amax_override = std::numeric_limits<float>::quiet_NaN(),
                                           std::int64_t misalign = 0) {
    const auto n = static_cast<std::int64_t>(x.values.size());
    const auto bytes = static_cast<std::int64_t>(x.bytes.size());
    const std::int64_t shift = misalign * static_cast<std::int64_t>(size_bytes(t));
    Buffer x_block = device(bytes + shift), amax = device(4), descale = device(4), q_block = device(n + misalign);
    void* dx = static_cast<unsigned char*>(x_block.data()) + shift;
    auto* q = static_cast<std::uint8_t*>(q_block.data()) + misalign;
    cuda_->upload(raw(dx, bytes), x.bytes.data());
    const float host_amax = max_abs(x.values);
    if (std::isnan(amax_override)) {
      fp8_amax(stream_, t, dx, n, f32(amax));
      const float got = scalar(amax);
      EXPECT_EQ(got, host_amax) << what << ": device amax";
    } else {
      cuda_->upload(raw(amax, 4), &amax_override);
    }
    const float a = std::isnan(amax_override) ? host_amax : amax_override;
    fp8_quantize_e4m3(stream_, t, dx, n, f32(amax), q, f32(descale));
    std::vector<std::uint8_t> got(sz(n));
    cuda_->download(raw(q, n), got.data());
    const float s = 448.0f / a;
    const bool usable = s > 0.0f && std::isfinite(s);
    const float scale = usable ? s : 1.0f;
    EXPECT_EQ(scalar(descale), usable ? a / 448.0f : 1.0f) << what << ": descale (amax " << a << ")";
    std::int64_t mismatches = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const std::uint8_t want = float_to_e4m3_bits(x.values[i] * scale);
      if (got[i] != want && ++mismatches <= 5)
        ADD_FAILURE() << what << ": element " << i << " = " << x.values[i] << " (x scale " << scale << " = "
                      << x.values[i] * scale << "): device 0x" << std::hex << int{got[i]} << ", host 0x" << int{want}
                      << std::dec;
    }
    EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " of " << n << " bytes differ";
    return got;
  }

  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<Kernels> cuda_;
  void* stream_ = nullptr;
  std::uint64_t seed_ = test::seed();
  std::uint64_t counter_ = 0;

  std::vector<double> random(std::size_t n, double lo, double hi) {
    std::vector<double> v(n);
    for (double& x : v) x = uniform(seed_, counter_++, lo, hi);
    return v;
  }
};


// ---- quantization

TEST_F(Fp8Test, QuantizeMatchesHostBitForBit) {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    // Spanning more than the kernels' 1024 blocks of 256 (the grid-stride loops), and an odd count.
    const std::string name = std::string(to_string(t));
    const std::vector<std::uint8_t> q = check_quantize(t, encode(t, random(300007, -3, 3)), name + " uniform [-3, 3)");
    // The largest element lands on +-448 (0x7e / 0xfe); a healthy spread of codes besides.
    EXPECT_TRUE(std::count(q.begin(), q.end(), 0x7e) + std::count(q.begin(), q.end(), 0xfe) >= 1) << name;
    EXPECT_GT(std::set<std::uint8_t>(q.begin(), q.end()).size(), 150u) << name;

    // One outlier: everything else lands in e4m3's subnormals and smallest normals.
    std::vector<double> v = random(10007, -1, 1);
    v[sz(static_cast<std::int64_t>(uniform(seed_, counter_++, 0, 10007)))] = -1000.0;
    const std::vector<std::uint8_t> qo = check_quantize(t, encode(t, v), name + " one outlier -1000 among [-1, 1)");
    EXPECT_EQ(std::count(qo.begin(), qo.end(), 0xfe), 1) << name << ": the outlier alone is -448";
    EXPECT_TRUE(std::any_of(qo.begin(), qo.end(), [](std::uint8_t b) { return (b & 0x78) == 0 && (b & 7) != 0; }))
        << name << ": no subnormal code";

    // One element off a 16-byte boundary: the scalar loop alone, the same bytes.
    check_quantize(t, encode(t, random(4101, -3, 3)), name + " at a misaligned address",
                   std::numeric_limits<float>::quiet_NaN(), 1);
  }
}

TEST_F(Fp8Test, CalibratedAmaxSaturatesAndTiesRoundToEven) {
  // A calibrated amax a quarter of this tensor's: scaled values reach 4 x 448 and saturate.
  const HostTensor x = encode(DType::f32, random(4099, -2, 2));
  const std::vector<std::uint8_t> q = check_quantize(DType::f32, x, "calibrated amax 0.5 of 2", 0.5f);
  EXPECT_GT(std::count(q.begin(), q.end(), 0x7e), 100) << "saturated at +448";
  EXPECT_GT(std::count(q.begin(), q.end(), 0xfe), 100) << "saturated at -448";
  // amax 0 (an all-zero calibration): scale and descale fall back to 1.
  check_quantize(DType::f32, x, "amax 0 (fallback scale 1)", 0.0f);
  // amax 448: scale exactly 1, so the values themselves sit on e4m3's ties and edges.
  const std::vector<double> edges{1.0625,     -1.1875,     0x1.0p-10, 3 * 0x1.0p-10, -5 * 0x1.0p-10, 0x1.0p-6,
                                  0x1.0p-7 * 1.0625, 15 * 0x1.0p-10, 464.0, -464.0, 465.0, 1e6, -1e30,
                                  std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                                  240.0 + 8.0, 0.0, 447.9};
  check_quantize(DType::f32, encode(DType::f32, edges), "ties, subnormals, saturation and infinities at scale 1",
                 448.0f);
}

// ---- the convolution

struct ConvCase {
  const char* name;
  Fp8ConvShape shape;
};

double round_to(DType t, double v) {
  const auto f = static_cast<float>(v);
  return t == DType::f16 ? half_bits_to_float(float_to_half_bits(f)) : bf16_bits_to_float(float_to_bf16_bits(f));
}

TEST_F(Fp8Test, ConvolutionMatchesDequantizedReference) {
  const std::vector<ConvCase> cases{
      {"1x1 stride 1 b1 f16", make_shape(1, 8, 32, 16, 1, 1, 0, false, false, DType::f16)},
      {"1x1 stride 1 b4 bias relu bf16", make_shape(4, 7, 64, 32, 1, 1, 0, true, true, DType::bf16)},
      {"3x3 stride 1 pad 1 b1 bias f16", make_shape(1, 10, 16, 32, 3, 1, 1, true, false, DType::f16)},
      {"3x3 stride 1 pad 1 b4 relu bf16", make_shape(4, 9, 32, 64, 3, 1, 1, false, true, DType::bf16)},
      {"3x3 stride 2 pad 1 b4 bias relu f16", make_shape(4, 12, 64, 32, 3, 2, 1, true, true, DType::f16)},
      {"3x3 stride 2 pad 1 b1 bf16", make_shape(1, 11, 16, 16, 3, 2, 1, false, false, DType::bf16)},
      {"1x1 stride 2 b4 bias relu f16", make_shape(4, 8, 32, 64, 1, 2, 0, true, true, DType::f16)},
      {"1x1 stride 2 b1 relu bf16", make_shape(1, 9, 48, 16, 1, 2, 0, false, true, DType::bf16)},
  };
  int ran = 0;
  std::vector<std::string> refused;
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Fp8ConvShape& s = c.shape;
    std::unique_ptr<Fp8ConvPlan> plan;
    try {
      plan = std::make_unique<Fp8ConvPlan>(s, stream_);
    } catch (const Unsupported& e) {
      std::printf("fp8 conv [%s]: cuDNN refused: %s\n", c.name, e.what());
      refused.push_back(c.name);
      continue;
    }
    std::printf("fp8 conv [%s]: %s\n", c.name, plan->engine().c_str());
    // cuDNN's plan description runs to ~50 kB a shape: only on request.
    if (std::getenv("AB_FP8_PLAN_JSON") != nullptr && !plan->plan_json().empty())
      std::printf("fp8 conv [%s]: plan json %s\n", c.name, plan->plan_json().c_str());
    std::fflush(stdout);

    // x and w: random f32, quantized on the device with their own amax; the descale their product.
    const std::int64_t xn = s.n * s.h * s.w * s.c, wn = s.k * s.r * s.s * s.c, P = s.p(), Q = s.q();
    const std::int64_t yn = s.n * P * Q * s.k;
    const HostTensor xh = encode(DType::f32, random(sz(xn), -1, 1)), wh = encode(DType::f32, random(sz(wn), -1, 1));
    Buffer x32 = to_device(xh.bytes.data(), xn * 4), w32 = to_device(wh.bytes.data(), wn * 4);
    Buffer xq = device(xn), wq = device(wn), amax = device(4), dx = device(4), dw = device(4), descale = device(4);
    fp8_amax(stream_, DType::f32, x32.data(), xn, f32(amax));
    fp8_quantize_e4m3(stream_, DType::f32, x32.data(), xn, f32(amax), static_cast<std::uint8_t*>(xq.data()), f32(dx));
    fp8_amax(stream_, DType::f32, w32.data(), wn, f32(amax));
    fp8_quantize_e4m3(stream_, DType::f32, w32.data(), wn, f32(amax), static_cast<std::uint8_t*>(wq.data()), f32(dw));
    fp8_multiply_scalars(stream_, f32(dx), f32(dw), f32(descale));
    std::vector<float> bias = [&] {
      std::vector<float> b;
      for (double v : random(sz(s.k), -0.5, 0.5)) b.push_back(static_cast<float>(v));
      return b;
    }();
    Buffer db = to_device(bias.data(), s.k * 4);
    const std::int64_t out_bytes = yn * static_cast<std::int64_t>(size_bytes(s.out));
    Buffer y = device(out_bytes);
    Buffer ws = device(plan->workspace_bytes());
    plan->execute(xq.data(), wq.data(), f32(descale), s.bias ? f32(db) : nullptr, y.data(),
                  Workspace{ws.data(), plan->workspace_bytes()});

    const std::vector<std::uint8_t> xb = from_device<std::uint8_t>(xq, xn), wb = from_device<std::uint8_t>(wq, wn);
    const float descale_x = scalar(dx), descale_w = scalar(dw), d = scalar(descale);
    EXPECT_EQ(d, descale_x * descale_w) << "the combined descale";
    const std::vector<std::uint16_t> yb = from_device<std::uint16_t>(y, yn);

    // f64 reference on the dequantized bytes (x's and w's scales stay in: the descale removes them).
    std::vector<double> xf(sz(xn)), wf(sz(wn));
    for (std::size_t i = 0; i < xf.size(); ++i) xf[i] = e4m3_bits_to_float(xb[i]);
    for (std::size_t i = 0; i < wf.size(); ++i) wf[i] = e4m3_bits_to_float(wb[i]);
    double scale = 0, worst = 0;
    std::size_t at = 0;
    std::vector<double> ref(sz(yn)), got(sz(yn));
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t p = 0; p < P; ++p)
        for (std::int64_t q = 0; q < Q; ++q)
          for (std::int64_t k = 0; k < s.k; ++k) {
            double acc = 0;
            for (std::int64_t r = 0; r < s.r; ++r) {
              const std::int64_t ih = p * s.conv.stride_h - s.conv.pad_h + r * s.conv.dilation_h;
              if (ih < 0 || ih >= s.h) continue;
              for (std::int64_t t = 0; t < s.s; ++t) {
                const std::int64_t iw = q * s.conv.stride_w - s.conv.pad_w + t * s.conv.dilation_w;
                if (iw < 0 || iw >= s.w) continue;
                const double* xrow = &xf[sz(((n * s.h + ih) * s.w + iw) * s.c)];
                const double* wrow = &wf[sz(((k * s.r + r) * s.s + t) * s.c)];
                for (std::int64_t ch = 0; ch < s.c; ++ch) acc += xrow[ch] * wrow[ch];
              }
            }
            double v = acc * d + (s.bias ? bias[sz(k)] : 0.0);
            if (s.relu) v = std::max(v, 0.0);
            const std::size_t i = sz(((n * P + p) * Q + q) * s.k + k);
            ref[i] = round_to(s.out, v);
            got[i] = s.out == DType::f16 ? half_bits_to_float(yb[i]) : bf16_bits_to_float(yb[i]);
            scale = std::max(scale, std::fabs(ref[i]));
          }
    for (std::size_t i = 0; i < ref.size(); ++i)
      if (!(std::fabs(got[i] - ref[i]) <= worst)) {
        worst = std::isnan(got[i]) ? INFINITY : std::fabs(got[i] - ref[i]);
        at = i;
      }
    const double tol = s.out == DType::bf16 ? 3e-2 : 1e-2;
    EXPECT_GT(scale, 0) << "an all-zero reference checks nothing";
    EXPECT_LE(worst, tol * scale) << s.to_string() << ": worst element " << at << " gpu " << got[at] << " ref "
                                  << ref[at] << " (max |ref| " << scale << ", seed " << seed_ << ", " << plan->engine()
                                  << ")";
    if (s.relu) {
      EXPECT_TRUE(std::any_of(got.begin(), got.end(), [](double v) { return v == 0.0; }) &&
                  std::any_of(got.begin(), got.end(), [](double v) { return v > 0.0; }))
          << "ReLU should leave zeros and positives";
    }
    ++ran;
  }
  std::printf("fp8 conv: %d of %zu aligned shapes ran, %zu refused by cuDNN\n", ran, cases.size(), refused.size());
  EXPECT_GT(ran, 0) << "cuDNN refused every aligned fp8 shape (see the 'cuDNN refused' lines): a real finding";
}

// ---- Kernels::conv2d_fp8_forward: the CUDA engine against the reference kernels

// One 16-bit NHWC tensor on the GPU and the same bytes on the host for the reference kernels.
struct Pair {
  Buffer dev_buf, ref_buf;
  Tensor dev, ref;
};

class Fp8KernelsTest : public Fp8Test {
 protected:
  void SetUp() override {
    Fp8Test::SetUp();
    if (IsSkipped()) return;
    ref_ = make_ref_kernels();
  }
  Pair pair(DType t, const Shape& shape, Layout layout, double lo, double hi) {
    Pair p;
    const Tensor d = Tensor::describe(t, shape, layout, DeviceKind::cuda), h = Tensor::describe(t, shape, layout);
    p.dev_buf = Buffer(cuda_->allocator(), d.size_bytes());
    p.ref_buf = Buffer(ref_->allocator(), h.size_bytes());
    p.dev = p.dev_buf.view(d);
    p.ref = p.ref_buf.view(h);
    fill(p, lo, hi);
    return p;
  }
  // Fresh random values into both sides.
  void fill(Pair& p, double lo, double hi) {
    write_host(p.ref, random(sz(p.ref.numel()), lo, hi));
    cuda_->upload(p.dev, p.ref.data);
  }
  std::vector<double> read_dev(const Tensor& t) {
    std::vector<unsigned char> host(sz(t.size_bytes()));
    cuda_->download(t, host.data());
    Tensor staging = t;
    staging.data = host.data();
    staging.device = DeviceKind::host;
    return read_host(staging);
  }
  // max |gpu - ref| <= tol * max |ref|; both are one rounding of nearly the same f32 value.
  void expect_close(const Pair& y, const std::string& what) {
    const std::vector<double> got = read_dev(y.dev), want = read_host(y.ref);
    double scale = 0, worst = 0;
    std::size_t at = 0;
    for (double v : want) scale = std::max(scale, std::fabs(v));
    for (std::size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= worst)) {
        worst = std::isnan(got[i]) ? INFINITY : std::fabs(got[i] - want[i]);
        at = i;
      }
    const double tol = y.dev.dtype == DType::bf16 ? 1.6e-2 : 2e-3;
    EXPECT_GT(scale, 0) << what << ": an all-zero reference checks nothing";
    EXPECT_LE(worst, tol * scale) << what << ": worst element " << at << " gpu " << got[at] << " ref " << want[at]
                                  << " (max |ref| " << scale << ", seed " << seed_ << ")";
  }
  std::unique_ptr<Kernels> ref_;
};

TEST_F(Fp8KernelsTest, ConvFp8MatchesTheReferenceKernelsDirectCapturedAndAfterNewWeights) {
  cuda_->set_fp8_only_where_faster(false);  // the fp8 path itself, also where 16 bits would be faster
  struct Case {
    const char* name;
    std::int64_t n, c, hw, k, rs;
    Conv2dDesc d;
    DType t;
  };
  const std::vector<Case> cases{
      {"1x1 f16", 2, 64, 8, 256, 1, {}, DType::f16},
      {"3x3 pad 1 bf16", 2, 32, 9, 64, 3, {1, 1, 1, 1, 1, 1, 1}, DType::bf16},
      {"3x3 stride 2 f16", 4, 64, 12, 32, 3, {2, 2, 1, 1, 1, 1, 1}, DType::f16},
      {"1x1 on 1x1 pixels (a linear layer's view) f16", 8, 64, 1, 32, 1, {}, DType::f16},
  };
  int compared = 0;
  for (const Case& c : cases)
    for (bool residual : {false, true})
      for (bool relu : {false, true}) {
        SCOPED_TRACE(std::string(c.name) + (residual ? " residual" : "") + (relu ? " relu" : ""));
        const Conv2dDesc& d = c.d;
        const std::int64_t p = (c.hw + 2 * d.pad_h - (c.rs - 1) - 1) / d.stride_h + 1;
        Pair x = pair(c.t, Shape{c.n, c.c, c.hw, c.hw}, Layout::nhwc, -2, 2);
        Pair w = pair(c.t, Shape{c.k, c.c, c.rs, c.rs}, Layout::nhwc, -0.3, 0.3);
        Pair bias = pair(c.t, Shape{c.k}, Layout::nchw, -0.5, 0.5);
        Pair r = pair(c.t, Shape{c.n, c.k, p, p}, Layout::nhwc, -1, 1);
        Pair y = pair(c.t, Shape{c.n, c.k, p, p}, Layout::nhwc, -1, 1);
        const Tensor rd = residual ? r.dev : Tensor{}, rr = residual ? r.ref : Tensor{};
        const std::int64_t ws_bytes = cuda_->conv2d_fp8_prepare(d, x.dev, w.dev, bias.dev, rd, y.dev, relu);
        Buffer ws = device(ws_bytes);
        const Workspace cws{ws.data(), ws_bytes};
        const auto forward = [&] { cuda_->conv2d_fp8_forward(d, x.dev, w.dev, bias.dev, rd, y.dev, relu, cws); };
        const auto reference = [&] {
          const std::int64_t rb = ref_->conv2d_fp8_prepare(d, x.ref, w.ref, bias.ref, rr, y.ref, relu);
          Buffer rws(ref_->allocator(), std::max<std::int64_t>(rb, 16));
          ref_->conv2d_fp8_forward(d, x.ref, w.ref, bias.ref, rr, y.ref, relu, {rws.data(), rb});
        };
        forward();
        reference();
        expect_close(y, "direct call");
        // Captured after one direct call: each replay quantizes its own x with its own scale.
        const std::unique_ptr<Replayable> step = cuda_->capture(forward);
        fill(x, -8, 8);
        step->replay();
        reference();
        expect_close(y, "replay with a new x (4x the range)");
        // New weights: stale until parameters_changed(), then quantized again by the next call.
        fill(w, -0.1, 0.1);
        cuda_->parameters_changed();
        forward();
        reference();
        expect_close(y, "direct call after new weights");
        if (relu) {
          const std::vector<double> got = read_dev(y.dev);
          EXPECT_GE(*std::min_element(got.begin(), got.end()), 0.0);
        }
        ++compared;
      }
  for (const std::string& line : cuda_fp8_notes(*cuda_)) std::printf("fp8 layer: %s\n", line.c_str());
  EXPECT_EQ(compared, 4 * 2 * 2);
  // Refused configurations: grouped and NCHW, as Unsupported (the op then runs 16 bits).
  Pair x = pair(DType::f16, Shape{1, 64, 8, 8}, Layout::nhwc, -1, 1);
  Pair wg = pair(DType::f16, Shape{64, 2, 3, 3}, Layout::nhwc, -1, 1);
  Pair b = pair(DType::f16, Shape{64}, Layout::nchw, -1, 1);
  Pair y = pair(DType::f16, Shape{1, 64, 8, 8}, Layout::nhwc, -1, 1);
  const std::string grouped = test::error_message<Unsupported>(
      [&] { cuda_->conv2d_fp8_prepare({1, 1, 1, 1, 1, 1, 32}, x.dev, wg.dev, b.dev, Tensor{}, y.dev, true); });
  EXPECT_NE(grouped.find("groups"), std::string::npos) << grouped;
  Pair xn = pair(DType::f16, Shape{1, 64, 8, 8}, Layout::nchw, -1, 1);
  Pair wn = pair(DType::f16, Shape{64, 64, 1, 1}, Layout::nchw, -1, 1);
  Pair yn = pair(DType::f16, Shape{1, 64, 8, 8}, Layout::nchw, -1, 1);
  const std::string nchw = test::error_message<Unsupported>(
      [&] { cuda_->conv2d_fp8_prepare({}, xn.dev, wn.dev, b.dev, Tensor{}, yn.dev, true); });
  EXPECT_NE(nchw.find("NHWC"), std::string::npos) << nchw;
}

TEST_F(Fp8KernelsTest, ByDefaultALayerRunsFp8OnlyWhereItsWholeCallTimedFaster) {
  // Two shapes of ResNet-50 at batch 16: a bottleneck's 1x1 reduction of a 256-channel 56x56 input
  // (the quantize pass reads the largest tensor) and layer4's 3x3 (compute-heavy, small input).
  struct Case {
    std::int64_t c, hw, k, rs;
    Conv2dDesc d;
  };
  const std::vector<Case> cases{{256, 56, 64, 1, {}}, {512, 7, 512, 3, {1, 1, 1, 1, 1, 1, 1}}};
  const std::regex refused("fp8 timed no faster than 16 bits: ([0-9.]+) us .* against ([0-9.]+) us");
  const std::regex took("whole call ([0-9.]+) us, 16 bits ([0-9.]+) us");
  for (const Case& c : cases) {
    Pair x = pair(DType::f16, Shape{16, c.c, c.hw, c.hw}, Layout::nhwc, -2, 2);
    Pair w = pair(DType::f16, Shape{c.k, c.c, c.rs, c.rs}, Layout::nhwc, -0.3, 0.3);
    Pair bias = pair(DType::f16, Shape{c.k}, Layout::nchw, -0.5, 0.5);
    Pair y = pair(DType::f16, Shape{16, c.k, c.hw, c.hw}, Layout::nhwc, -1, 1);
    std::smatch m;
    try {
      cuda_->conv2d_fp8_prepare(c.d, x.dev, w.dev, bias.dev, Tensor{}, y.dev, true);
      bool found = false;
      for (const std::string& line : cuda_fp8_notes(*cuda_))
        if (line.find("C " + std::to_string(c.c) + "]") != std::string::npos && std::regex_search(line, m, took)) {
          found = true;
          std::printf("fp8 chosen: %s\n", line.c_str());
          EXPECT_LT(std::stod(m[1]), std::stod(m[2])) << "fp8 was taken although it timed slower: " << line;
        }
      EXPECT_TRUE(found) << "the taken layer's notes name both timings";
    } catch (const Unsupported& e) {
      const std::string why = e.what();
      std::printf("16 bits chosen: %s\n", why.c_str());
      ASSERT_TRUE(std::regex_search(why, m, refused)) << "an aligned NHWC shape refused for another reason: " << why;
      EXPECT_GE(std::stod(m[1]), std::stod(m[2])) << why;
    }
  }
}

}  // namespace
}  // namespace ab::nn::cuda
