// Reference batch norm (training, inference, backward) and pooling (max, global average). Data
// tensors share one storage type; batch-norm parameters and statistics may be of another (f32).
#include <cmath>
#include <limits>
#include <vector>

#include "nn/ref/ref_kernels.h"

namespace ab::nn::ref {
namespace {

// Calls f(n, h, w) over one channel's elements in a fixed order.
template <typename V, typename F>
void each_in_channel(const V& x, F&& f) {
  for (std::int64_t n = 0; n < x.n; ++n)
    for (std::int64_t h = 0; h < x.h; ++h)
      for (std::int64_t w = 0; w < x.w; ++w) f(n, h, w);
}

// Element c of a [C] tensor (parameters and statistics: f32 beside 16-bit data, as cuDNN wants).
double get1(const Tensor& t, std::int64_t c) { return load(t, c * t.strides[0]); }
void set1(const Tensor& t, std::int64_t c, double v) { store(t, c * t.strides[0], v); }

}  // namespace

void RefKernels::batchnorm_forward_training(const BatchNormDesc& d, const Tensor& xt, const Tensor& gamma,
                                            const Tensor& beta, const Tensor& rmean, const Tensor& rvar,
                                            const Tensor& yt, const Tensor& smean, const Tensor& sinvstd) {
  if (deferred([=, this] { batchnorm_forward_training(d, xt, gamma, beta, rmean, rvar, yt, smean, sinvstd); }))
    return;
  dispatch(xt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View4<const T> x(xt);
    const View4<T> y(yt);
    const auto m = static_cast<double>(x.n * x.h * x.w);
#pragma omp parallel for schedule(static) if (worth_threads(3 * xt.numel()))
    for (std::int64_t c = 0; c < x.c; ++c) {
      // Two passes (mean, then squared deviations): the oracle does not lose digits to cancellation.
      double sum = 0.0;
      each_in_channel(x, [&](auto n, auto h, auto w) { sum += x.at(n, c, h, w); });
      const double mean = sum / m;
      double sq = 0.0;
      each_in_channel(x, [&](auto n, auto h, auto w) {
        const double dv = x.at(n, c, h, w) - mean;
        sq += dv * dv;
      });
      const double var = sq / m, invstd = 1.0 / std::sqrt(var + d.epsilon);
      const double scale = get1(gamma, c) * invstd, shift = get1(beta, c);
      each_in_channel(x, [&](auto n, auto h, auto w) {
        y.at(n, c, h, w) = static_cast<T>((x.at(n, c, h, w) - mean) * scale + shift);
      });
      const double unbiased = m > 1 ? var * m / (m - 1) : var;
      set1(rmean, c, (1 - d.momentum) * get1(rmean, c) + d.momentum * mean);
      set1(rvar, c, (1 - d.momentum) * get1(rvar, c) + d.momentum * unbiased);
      set1(smean, c, mean);
      set1(sinvstd, c, invstd);
    }
  });
}

void RefKernels::batchnorm_forward_inference(const BatchNormDesc& d, const Tensor& xt, const Tensor& gamma,
                                             const Tensor& beta, const Tensor& rmean, const Tensor& rvar,
                                             const Tensor& yt) {
  if (deferred([=, this] { batchnorm_forward_inference(d, xt, gamma, beta, rmean, rvar, yt); })) return;
  dispatch(xt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View4<const T> x(xt);
    const View4<T> y(yt);
#pragma omp parallel for schedule(static) if (worth_threads(xt.numel()))
    for (std::int64_t c = 0; c < x.c; ++c) {
      const double invstd = 1.0 / std::sqrt(get1(rvar, c) + d.epsilon);
      const double scale = get1(gamma, c) * invstd, mean = get1(rmean, c), shift = get1(beta, c);
      each_in_channel(x, [&](auto n, auto h, auto w) {
        y.at(n, c, h, w) = static_cast<T>((x.at(n, c, h, w) - mean) * scale + shift);
      });
    }
  });
}

void RefKernels::batchnorm_backward(const BatchNormDesc& d, const Tensor& xt, const Tensor& dyt, const Tensor& gamma,
                                    const Tensor& smean, const Tensor& sinvstd, const Tensor& dxt, bool accumulate,
                                    const Tensor& dgamma, const Tensor& dbeta) {
  if (deferred([=, this] { batchnorm_backward(d, xt, dyt, gamma, smean, sinvstd, dxt, accumulate, dgamma, dbeta); }))
    return;
  dispatch(xt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View4<const T> x(xt), dy(dyt);
    const auto m = static_cast<double>(x.n * x.h * x.w);
#pragma omp parallel for schedule(static) if (worth_threads(2 * xt.numel()))
    for (std::int64_t c = 0; c < x.c; ++c) {
      const double mean = get1(smean, c), invstd = get1(sinvstd, c);
      double sum_dy = 0.0, sum_dy_xhat = 0.0;
      each_in_channel(x, [&](auto n, auto h, auto w) {
        const double g = dy.at(n, c, h, w);
        sum_dy += g;
        sum_dy_xhat += g * (x.at(n, c, h, w) - mean) * invstd;
      });
      if (dgamma.defined()) set1(dgamma, c, sum_dy_xhat);
      if (dbeta.defined()) set1(dbeta, c, sum_dy);
      if (!dxt.defined()) continue;
      const View4<T> dx(dxt);
      const double k = get1(gamma, c) * invstd;
      each_in_channel(x, [&](auto n, auto h, auto w) {
        const double xhat = (x.at(n, c, h, w) - mean) * invstd;
        const double g = k * (dy.at(n, c, h, w) - sum_dy / m - xhat * sum_dy_xhat / m);
        T& out = dx.at(n, c, h, w);
        out = static_cast<T>(accumulate ? static_cast<double>(out) + g : g);
      });
    }
  });
}

// ---- the fused inference epilogue (a folded batch norm's shift, the residual add, ReLU)

void RefKernels::bias_activation_forward(const Tensor& xt, const Tensor& bias, const Tensor& residual,
                                         const Tensor& yt, bool relu) {
  if (deferred([=, this] { bias_activation_forward(xt, bias, residual, yt, relu); })) return;
  const auto same = [&](const Tensor& t) { return t.shape == xt.shape && t.dtype == xt.dtype; };
  if (xt.shape.rank() != 4 || !same(yt) || (residual.defined() && !same(residual)) || bias.shape.rank() != 1 ||
      bias.shape[0] != xt.shape[1])
    throw Unsupported("ref bias_activation_forward: needs x, y (and residual) of one [N, C, H, W] shape and dtype and "
                      "bias [C], got x " + xt.to_string() + ", y " + yt.to_string() + ", bias " + bias.to_string() +
                      (residual.defined() ? ", residual " + residual.to_string() : ""));
  dispatch(xt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View4<const T> x(xt);
    const View4<T> y(yt);
    const bool has_residual = residual.defined();
    const View4<const T> r(has_residual ? residual : xt);  // x's view stands in, never read
#pragma omp parallel for schedule(static) if (worth_threads(xt.numel()))
    for (std::int64_t c = 0; c < x.c; ++c) {
      const double b = get1(bias, c);
      each_in_channel(x, [&](auto n, auto h, auto w) {
        double v = static_cast<double>(x.at(n, c, h, w)) + b;
        if (has_residual) v += static_cast<double>(r.at(n, c, h, w));
        y.at(n, c, h, w) = static_cast<T>(relu ? (v > 0 ? v : 0.0) : v);
      });
    }
  });
}

namespace {

// The flat input index (h * W + w) of the first maximum in output (oh, ow)'s window; -1 if the
// window is all padding (the op's shape rule prevents it).
template <typename T>
std::int64_t window_argmax(const Pool2dDesc& d, const T* plane, std::int64_t sh, std::int64_t sw, std::int64_t h,
                           std::int64_t w, std::int64_t oh, std::int64_t ow, double* best_value) {
  double best = -std::numeric_limits<double>::infinity();
  std::int64_t arg = -1;
  for (std::int64_t r = 0; r < d.window_h; ++r) {
    const std::int64_t ih = oh * d.stride_h - d.pad_h + r;
    if (ih < 0 || ih >= h) continue;
    for (std::int64_t s = 0; s < d.window_w; ++s) {
      const std::int64_t iw = ow * d.stride_w - d.pad_w + s;
      if (iw < 0 || iw >= w) continue;
      const double v = plane[ih * sh + iw * sw];
      if (arg < 0 || v > best) {
        best = v;
        arg = ih * w + iw;
      }
    }
  }
  *best_value = best;
  return arg;
}

}  // namespace

void RefKernels::maxpool_forward(const Pool2dDesc& d, const Tensor& xt, const Tensor& yt) {
  if (deferred([=, this] { maxpool_forward(d, xt, yt); })) return;
  dispatch(xt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View4<const T> x(xt);
    const View4<T> y(yt);
#pragma omp parallel for schedule(static) if (worth_threads(yt.numel() * d.window_h * d.window_w))
    for (std::int64_t nc = 0; nc < x.n * x.c; ++nc) {
      const std::int64_t n = nc / x.c, c = nc % x.c;
      for (std::int64_t oh = 0; oh < y.h; ++oh)
        for (std::int64_t ow = 0; ow < y.w; ++ow) {
          double best = 0;
          window_argmax(d, x.plane(n, c), x.sh, x.sw, x.h, x.w, oh, ow, &best);
          y.at(n, c, oh, ow) = static_cast<T>(best);
        }
    }
  });
}

void RefKernels::maxpool_backward(const Pool2dDesc& d, const Tensor& xt, const Tensor& yt, const Tensor& dyt,
                                  const Tensor& dxt, bool accumulate) {
  if (deferred([=, this] { maxpool_backward(d, xt, yt, dyt, dxt, accumulate); })) return;
  dispatch(xt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View4<const T> x(xt), dy(dyt);
    const View4<T> dx(dxt);
#pragma omp parallel if (worth_threads(dyt.numel() * d.window_h * d.window_w))
    {
      std::vector<double> acc(sz(x.h * x.w));
#pragma omp for schedule(static)
      for (std::int64_t nc = 0; nc < x.n * x.c; ++nc) {
        const std::int64_t n = nc / x.c, c = nc % x.c;
        for (std::int64_t h = 0; h < x.h; ++h)
          for (std::int64_t w = 0; w < x.w; ++w) acc[sz(h * x.w + w)] = accumulate ? static_cast<double>(dx.at(n, c, h, w)) : 0.0;
        for (std::int64_t oh = 0; oh < dy.h; ++oh)
          for (std::int64_t ow = 0; ow < dy.w; ++ow) {
            double best = 0;
            const std::int64_t arg = window_argmax(d, x.plane(n, c), x.sh, x.sw, x.h, x.w, oh, ow, &best);
            if (arg >= 0) acc[sz(arg)] += dy.at(n, c, oh, ow);
          }
        for (std::int64_t h = 0; h < x.h; ++h)
          for (std::int64_t w = 0; w < x.w; ++w) dx.at(n, c, h, w) = static_cast<T>(acc[sz(h * x.w + w)]);
      }
    }
  });
}

void RefKernels::global_avgpool_forward(const Tensor& xt, const Tensor& yt) {
  if (deferred([=, this] { global_avgpool_forward(xt, yt); })) return;
  dispatch(xt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View4<const T> x(xt);
    const View2<T> y(yt);
    const auto area = static_cast<double>(x.h * x.w);
#pragma omp parallel for schedule(static) if (worth_threads(xt.numel()))
    for (std::int64_t nc = 0; nc < x.n * x.c; ++nc) {
      const std::int64_t n = nc / x.c, c = nc % x.c;
      double sum = 0.0;
      for (std::int64_t h = 0; h < x.h; ++h)
        for (std::int64_t w = 0; w < x.w; ++w) sum += x.at(n, c, h, w);
      y.at(n, c) = static_cast<T>(sum / area);
    }
  });
}

void RefKernels::global_avgpool_backward(const Tensor& dyt, const Tensor& dxt, bool accumulate) {
  if (deferred([=, this] { global_avgpool_backward(dyt, dxt, accumulate); })) return;
  dispatch(dyt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View2<const T> dy(dyt);
    const View4<T> dx(dxt);
    const auto area = static_cast<double>(dx.h * dx.w);
#pragma omp parallel for schedule(static) if (worth_threads(dxt.numel()))
    for (std::int64_t nc = 0; nc < dx.n * dx.c; ++nc) {
      const std::int64_t n = nc / dx.c, c = nc % dx.c;
      const double g = dy.at(n, c) / area;
      for (std::int64_t h = 0; h < dx.h; ++h)
        for (std::int64_t w = 0; w < dx.w; ++w) {
          T& out = dx.at(n, c, h, w);
          out = static_cast<T>(accumulate ? static_cast<double>(out) + g : g);
        }
    }
  });
}

}  // namespace ab::nn::ref
