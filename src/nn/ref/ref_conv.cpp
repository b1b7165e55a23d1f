// Reference convolution: direct loops over strided NCHW/NHWC tensors of one storage type (f64, f32,
// f16 or bf16, as cuDNN wants them alike), float64 accumulators.
// Each parallel task owns whole outputs (a (n, k) plane, a (n, c) plane, a filter row), so the
// order of every sum is fixed whatever the thread count.
#include <algorithm>
#include <vector>

#include "nn/ref/ref_kernels.h"

namespace ab::nn::ref {
namespace {

// The output positions o in [lo, hi) whose input index o * stride + offset lies in [0, extent).
struct Range {
  std::int64_t lo, hi;
};
Range valid_outputs(std::int64_t offset, std::int64_t stride, std::int64_t extent, std::int64_t out_extent) {
  const std::int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const std::int64_t hi = extent - 1 - offset < 0 ? 0 : (extent - 1 - offset) / stride + 1;
  return {lo, std::min(hi, out_extent)};
}

template <typename T>
void conv_forward(const Conv2dDesc& d, const Tensor& xt, const Tensor& wt, const Tensor& yt) {
  const View4<const T> x(xt), w(wt);
  const View4<T> y(yt);
  const std::int64_t cg = x.c / d.groups, kg = y.c / d.groups, planes = y.n * y.c;
#pragma omp parallel if (worth_threads(y.n * y.c * y.h * y.w * cg * w.h * w.w))
  {
    std::vector<double> acc(sz(y.h * y.w));
#pragma omp for schedule(static)
    for (std::int64_t nk = 0; nk < planes; ++nk) {
      const std::int64_t n = nk / y.c, k = nk % y.c, g = k / kg;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t c = 0; c < cg; ++c) {
        const T* xp = x.plane(n, g * cg + c);
        for (std::int64_t r = 0; r < w.h; ++r) {
          for (std::int64_t s = 0; s < w.w; ++s) {
            const double wv = w.at(k, c, r, s);
            const std::int64_t off_w = s * d.dilation_w - d.pad_w;
            const Range ow = valid_outputs(off_w, d.stride_w, x.w, y.w);
            for (std::int64_t oh = 0; oh < y.h; ++oh) {
              const std::int64_t ih = oh * d.stride_h - d.pad_h + r * d.dilation_h;
              if (ih < 0 || ih >= x.h) continue;
              const T* row = xp + ih * x.sh;
              double* out = acc.data() + oh * y.w;
              for (std::int64_t o = ow.lo; o < ow.hi; ++o) out[o] += wv * row[(o * d.stride_w + off_w) * x.sw];
            }
          }
        }
      }
      for (std::int64_t oh = 0; oh < y.h; ++oh)
        for (std::int64_t o = 0; o < y.w; ++o) y.at(n, k, oh, o) = static_cast<T>(acc[sz(oh * y.w + o)]);
    }
  }
}

template <typename T>
void conv_backward_data(const Conv2dDesc& d, const Tensor& dyt, const Tensor& wt, const Tensor& dxt, bool accumulate) {
  const View4<const T> dy(dyt), w(wt);
  const View4<T> dx(dxt);
  const std::int64_t cg = dx.c / d.groups, kg = dy.c / d.groups, planes = dx.n * dx.c;
#pragma omp parallel if (worth_threads(dx.n * dx.c * dx.h * dx.w * kg * w.h * w.w))
  {
    std::vector<double> acc(sz(dx.h * dx.w));
#pragma omp for schedule(static)
    for (std::int64_t nc = 0; nc < planes; ++nc) {
      const std::int64_t n = nc / dx.c, ci = nc % dx.c, g = ci / cg, c = ci % cg;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t k = g * kg; k < (g + 1) * kg; ++k) {
        const T* dyp = dy.plane(n, k);
        for (std::int64_t r = 0; r < w.h; ++r) {
          for (std::int64_t s = 0; s < w.w; ++s) {
            const double wv = w.at(k, c, r, s);
            const std::int64_t off_w = s * d.dilation_w - d.pad_w;
            const Range ow = valid_outputs(off_w, d.stride_w, dx.w, dy.w);
            for (std::int64_t oh = 0; oh < dy.h; ++oh) {
              const std::int64_t ih = oh * d.stride_h - d.pad_h + r * d.dilation_h;
              if (ih < 0 || ih >= dx.h) continue;
              const T* row = dyp + oh * dy.sh;
              double* in = acc.data() + ih * dx.w;
              for (std::int64_t o = ow.lo; o < ow.hi; ++o) in[o * d.stride_w + off_w] += wv * row[o * dy.sw];
            }
          }
        }
      }
      for (std::int64_t ih = 0; ih < dx.h; ++ih)
        for (std::int64_t iw = 0; iw < dx.w; ++iw) {
          T& out = dx.at(n, ci, ih, iw);
          const double v = acc[sz(ih * dx.w + iw)];
          out = static_cast<T>(accumulate ? static_cast<double>(out) + v : v);
        }
    }
  }
}

template <typename T>
void conv_backward_filter(const Conv2dDesc& d, const Tensor& xt, const Tensor& dyt, const Tensor& dwt) {
  const View4<const T> x(xt), dy(dyt);
  const View4<T> dw(dwt);
  const std::int64_t cg = dw.c, kg = dy.c / d.groups;
#pragma omp parallel for schedule(static) if (worth_threads(dw.n * cg * dw.h * dw.w * x.n * dy.h * dy.w))
  for (std::int64_t k = 0; k < dw.n; ++k) {
    const std::int64_t g = k / kg;
    for (std::int64_t c = 0; c < cg; ++c) {
      for (std::int64_t r = 0; r < dw.h; ++r) {
        for (std::int64_t s = 0; s < dw.w; ++s) {
          const std::int64_t off_w = s * d.dilation_w - d.pad_w;
          const Range ow = valid_outputs(off_w, d.stride_w, x.w, dy.w);
          double acc = 0.0;
          for (std::int64_t n = 0; n < x.n; ++n) {
            const T* xp = x.plane(n, g * cg + c);
            const T* dyp = dy.plane(n, k);
            for (std::int64_t oh = 0; oh < dy.h; ++oh) {
              const std::int64_t ih = oh * d.stride_h - d.pad_h + r * d.dilation_h;
              if (ih < 0 || ih >= x.h) continue;
              const T* xrow = xp + ih * x.sh;
              const T* dyrow = dyp + oh * dy.sh;
              for (std::int64_t o = ow.lo; o < ow.hi; ++o)
                acc += static_cast<double>(dyrow[o * dy.sw]) * xrow[(o * d.stride_w + off_w) * x.sw];
            }
          }
          dw.at(k, c, r, s) = static_cast<T>(acc);
        }
      }
    }
  }
}

void check_conv_shapes(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) {
  if (x.shape.rank() != 4 || w.shape.rank() != 4 || y.shape.rank() != 4 || x.dtype != w.dtype || x.dtype != y.dtype ||
      w.shape[1] * d.groups != x.shape[1] || w.shape[0] != y.shape[1] || x.shape[0] != y.shape[0])
    throw Error("ref conv2d: inconsistent tensors x " + x.to_string() + ", w " + w.to_string() + ", y " + y.to_string());
}

// A tensor's e4m3 image under its per-tensor scale (Kernels::conv2d_fp8_prepare's rule), the
// values held exactly in f64, contiguous in the source's layout; descale = max|t| / 448 in f32.
struct E4m3Image {
  std::vector<double> values;
  Tensor view;
  float descale = 1.0f;
};

E4m3Image quantize_e4m3(const Tensor& t) {
  E4m3Image q;
  q.values.resize(sz(t.numel()));
  q.view = Tensor::describe(DType::f64, t.shape, t.layout).with_data(q.values.data());
  dispatch(t.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View4<const T> in(t);
    const View4<double> out(q.view);
    float amax = 0.0f;  // exact: a 16-bit value widens exactly to f32
    for (std::int64_t i = 0; i < in.n; ++i)
      for (std::int64_t j = 0; j < in.c; ++j)
        for (std::int64_t k = 0; k < in.h; ++k)
          for (std::int64_t l = 0; l < in.w; ++l)
            amax = std::max(amax, std::fabs(static_cast<float>(static_cast<double>(in.at(i, j, k, l)))));
    float scale = 448.0f / amax;
    if (std::isfinite(scale) && scale > 0.0f) {
      q.descale = amax / 448.0f;
    } else {
      scale = 1.0f;  // all zero (or non-finite): the fallback scale, descale 1
    }
    for (std::int64_t i = 0; i < in.n; ++i)
      for (std::int64_t j = 0; j < in.c; ++j)
        for (std::int64_t k = 0; k < in.h; ++k)
          for (std::int64_t l = 0; l < in.w; ++l) {
            const float scaled = static_cast<float>(static_cast<double>(in.at(i, j, k, l))) * scale;  // f32 product
            out.at(i, j, k, l) = e4m3_bits_to_float(float_to_e4m3_bits(scaled));
          }
  });
  return q;
}

void check_fp8_operands(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                        const Tensor& residual, const Tensor& y) {
  if (std::string why = fp8_conv_refusal(d, x, w, y); !why.empty()) throw Unsupported("ref " + why);
  check_conv_shapes(d, x, w, y);
  if ((bias.shape.rank() != 0 && (bias.shape.rank() != 1 || bias.shape[0] != y.shape[1])) ||
      (residual.shape.rank() != 0 && (!(residual.shape == y.shape) || residual.dtype != y.dtype)))
    throw Unsupported("ref conv2d_fp8: needs bias [K] (or none) and a residual of y's shape and dtype, got bias " +
                      bias.to_string() + ", y " + y.to_string() +
                      (residual.shape.rank() != 0 ? ", residual " + residual.to_string() : ""));
}

}  // namespace

std::int64_t RefKernels::conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                                        ConvPasses /*passes*/) {
  check_tensor(x);
  check_tensor(w);
  check_tensor(y);
  check_conv_shapes(d, x, w, y);
  return 0;  // direct loops need no workspace
}

void RefKernels::conv2d_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y, Workspace ws) {
  if (deferred([=, this] { conv2d_forward(d, x, w, y, ws); })) return;
  check_conv_shapes(d, x, w, y);
  dispatch(x.dtype, [&](auto t) { conv_forward<decltype(t)>(d, x, w, y); });
}

void RefKernels::conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx,
                                      bool accumulate, Workspace ws) {
  if (deferred([=, this] { conv2d_backward_data(d, dy, w, dx, accumulate, ws); })) return;
  check_conv_shapes(d, dx, w, dy);
  dispatch(dy.dtype, [&](auto t) { conv_backward_data<decltype(t)>(d, dy, w, dx, accumulate); });
}

void RefKernels::conv2d_backward_filter(const Conv2dDesc& d, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                        Workspace ws) {
  if (deferred([=, this] { conv2d_backward_filter(d, x, dy, dw, ws); })) return;
  check_conv_shapes(d, x, dw, dy);
  dispatch(x.dtype, [&](auto t) { conv_backward_filter<decltype(t)>(d, x, dy, dw); });
}

std::int64_t RefKernels::conv2d_fp8_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                            const Tensor& residual, const Tensor& y, bool /*relu*/) {
  check_tensor(x);
  check_tensor(w);
  check_tensor(y);
  check_fp8_operands(d, x, w, bias, residual, y);
  return 0;
}

void RefKernels::conv2d_fp8_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                    const Tensor& residual, const Tensor& y, bool relu, Workspace ws) {
  if (deferred([=, this] { conv2d_fp8_forward(d, x, w, bias, residual, y, relu, ws); })) return;
  check_fp8_operands(d, x, w, bias, residual, y);
  if ((bias.shape.rank() != 0 && !bias.defined()) || (residual.shape.rank() != 0 && !residual.defined()))
    throw Error("ref conv2d_fp8_forward: bias or residual is a descriptor without data");
  const E4m3Image qx = quantize_e4m3(x), qw = quantize_e4m3(w);
  // Products of e4m3 values are exact in f64, their sums exact or far closer than the device's f32.
  std::vector<double> acc_values(sz(y.numel()));
  const Tensor acc_t = Tensor::describe(DType::f64, y.shape, y.layout).with_data(acc_values.data());
  conv_forward<double>(d, qx.view, qw.view, acc_t);
  const auto descale = static_cast<double>(qx.descale * qw.descale);  // the f32 product, as on the device
  dispatch(y.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View4<const double> acc(acc_t);
    const View4<T> out(y);
    const bool has_residual = residual.defined();
    const View4<const T> r(has_residual ? residual : y);  // y's view stands in, never read
#pragma omp parallel for schedule(static) if (worth_threads(y.numel()))
    for (std::int64_t k = 0; k < out.c; ++k) {
      const double b = bias.defined() ? load(bias, k * bias.strides[0]) : 0.0;
      for (std::int64_t n = 0; n < out.n; ++n)
        for (std::int64_t h = 0; h < out.h; ++h)
          for (std::int64_t l = 0; l < out.w; ++l) {
            double v = acc.at(n, k, h, l) * descale + b;
            if (has_residual) v += static_cast<double>(r.at(n, k, h, l));
            out.at(n, k, h, l) = static_cast<T>(relu ? (v > 0 ? v : 0.0) : v);
          }
    }
  });
}

}  // namespace ab::nn::ref
