#include "workloads/micro/conv_check.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/ref/ref.h"
#include "core/dtype.h"
#include "core/error.h"

namespace ab::workloads::micro {
namespace {

// Positions {0, size/2, size-1} without repeats.
std::vector<std::int64_t> spread(std::int64_t size, bool whole) {
  std::vector<std::int64_t> at;
  if (whole) {
    for (std::int64_t i = 0; i < size; ++i) at.push_back(i);
    return at;
  }
  at = {0, size / 2, size - 1};
  at.erase(std::unique(at.begin(), at.end()), at.end());
  return at;
}

std::size_t at4(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d, std::int64_t db, std::int64_t dc,
                std::int64_t dd) {
  return static_cast<std::size_t>(((a * db + b) * dc + c) * dd + d);
}

// y[n, k, p, q] = descale * (sum over c, r, s of x[n, c, p*u - pad + r, q*v - pad + s] w[k, c, r, s]) + bias[k].
double forward_at(const ConvShape& s, const ConvHostValues& v, std::int64_t n, std::int64_t k, std::int64_t p,
                  std::int64_t q) {
  double sum = 0;
  for (std::int64_t c = 0; c < s.c; ++c)
    for (std::int64_t r = 0; r < s.r; ++r) {
      const std::int64_t h = p * s.stride_h - s.pad_h + r;
      if (h < 0 || h >= s.h) continue;
      for (std::int64_t t = 0; t < s.s; ++t) {
        const std::int64_t w = q * s.stride_w - s.pad_w + t;
        if (w < 0 || w >= s.w) continue;
        sum += v.x[at4(n, c, h, w, s.c, s.h, s.w)] * v.w[at4(k, c, r, t, s.c, s.r, s.s)];
      }
    }
  return sum * v.forward_descale + (v.bias.empty() ? 0.0 : v.bias[static_cast<std::size_t>(k)]);
}

// dx[n, c, h, w] = sum over k, r, s of dy[n, k, p, q] w[k, c, r, s] where h = p*u - pad + r.
double backward_data_at(const ConvShape& s, const ConvHostValues& v, std::int64_t n, std::int64_t c, std::int64_t h,
                        std::int64_t w) {
  const std::int64_t P = s.p(), Q = s.q();
  double sum = 0;
  for (std::int64_t k = 0; k < s.k; ++k)
    for (std::int64_t r = 0; r < s.r; ++r) {
      const std::int64_t ph = h + s.pad_h - r;
      if (ph < 0 || ph % s.stride_h != 0 || ph / s.stride_h >= P) continue;
      for (std::int64_t t = 0; t < s.s; ++t) {
        const std::int64_t qw = w + s.pad_w - t;
        if (qw < 0 || qw % s.stride_w != 0 || qw / s.stride_w >= Q) continue;
        sum += v.y[at4(n, k, ph / s.stride_h, qw / s.stride_w, s.k, P, Q)] * v.w[at4(k, c, r, t, s.c, s.r, s.s)];
      }
    }
  return sum;
}

// dw[k, c, r, s] = sum over n, p, q of dy[n, k, p, q] x[n, c, p*u - pad + r, q*v - pad + s].
double backward_filter_at(const ConvShape& s, const ConvHostValues& v, std::int64_t k, std::int64_t c, std::int64_t r,
                          std::int64_t t) {
  const std::int64_t P = s.p(), Q = s.q();
  double sum = 0;
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t p = 0; p < P; ++p) {
      const std::int64_t h = p * s.stride_h - s.pad_h + r;
      if (h < 0 || h >= s.h) continue;
      for (std::int64_t q = 0; q < Q; ++q) {
        const std::int64_t w = q * s.stride_w - s.pad_w + t;
        if (w < 0 || w >= s.w) continue;
        sum += v.y[at4(n, k, p, q, s.k, P, Q)] * v.x[at4(n, c, h, w, s.c, s.h, s.w)];
      }
    }
  return sum;
}

}  // namespace

ConvCheckSample conv_check_sample(ConvPassKind pass, const ConvShape& s, const ConvHostValues& values,
                                  std::int64_t whole_limit_macs) {
  const ConvElements e = conv_elements(s);
  const std::int64_t macs = conv_flops(s) / 2;
  ConvCheckSample out;
  out.whole = macs <= whole_limit_macs;
  // The output's four dims and the values it is read from.
  const bool fwd = pass == ConvPassKind::forward, data = pass == ConvPassKind::backward_data;
  const std::int64_t d0 = fwd || data ? s.n : s.k;
  const std::int64_t d1 = fwd ? s.k : s.c;
  const std::int64_t d2 = fwd ? s.p() : data ? s.h : s.r;
  const std::int64_t d3 = fwd ? s.q() : data ? s.w : s.s;
  const std::vector<double>& output = fwd ? values.y : data ? values.x : values.w;
  const std::int64_t expected = fwd ? e.y : data ? e.x : e.w;
  if (static_cast<std::int64_t>(output.size()) != expected)
    throw Error("conv check: the output holds " + std::to_string(output.size()) + " values, the shape " +
                std::to_string(expected));
  for (const std::int64_t a : spread(d0, out.whole))
    for (const std::int64_t b : spread(d1, out.whole))
      for (const std::int64_t c : spread(d2, out.whole))
        for (const std::int64_t d : spread(d3, out.whole)) {
          out.got.push_back(output[at4(a, b, c, d, d1, d2, d3)]);
          out.want.push_back(fwd    ? forward_at(s, values, a, b, c, d)
                             : data ? backward_data_at(s, values, a, b, c, d)
                                    : backward_filter_at(s, values, a, b, c, d));
        }
  return out;
}

double quantize_e4m3_per_tensor(std::vector<double>& values) {
  float amax = 0;
  for (const double v : values) amax = std::max(amax, std::abs(static_cast<float>(v)));
  float scale = 448.0f / amax;
  if (!std::isfinite(scale) || scale <= 0) scale = 1.0f;
  for (double& v : values) v = e4m3_bits_to_float(float_to_e4m3_bits(static_cast<float>(v) * scale));
  return 1.0 / static_cast<double>(scale);
}

double conv_tolerance(const std::string& precision) {
  // GEMM's (output rounding, f32 accumulation), except fp32: cuDNN's Winograd and FFT algorithms
  // transform their operands in f32, which costs about ten times plain accumulation's error (the
  // engine's tests hold its f32 convolutions to 1e-4 of the largest value for the same reason).
  const Precision p = parse_precision(precision);
  if (p == Precision::fp32) return 1e-4;
  return backend::ref::gemm_tolerance(p);
}

}  // namespace ab::workloads::micro
