// Reference kernels: memory, elementwise ops, linear, the loss and the optimizer updates.
#include "nn/ref/ref_kernels.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

namespace ab::nn::ref {

void require_same_flat(const char* kernel, const Tensor& a, const Tensor& b) {
  if (!(a.shape == b.shape) || !(a.strides == b.strides) || !a.is_contiguous() || a.dtype != b.dtype)
    throw Unsupported(std::string("ref ") + kernel + ": operands must be contiguous with one shape, layout and dtype (" +
                      a.to_string() + " vs " + b.to_string() + ")");
}

std::unique_ptr<measure::IterationTimer> RefKernels::make_timer() {
  return std::make_unique<measure::SteadyClockTimer>();
}

void RefKernels::upload(const Tensor& dst, const void* host) {
  if (dst.size_bytes() > 0) std::memcpy(dst.data, host, static_cast<std::size_t>(dst.size_bytes()));
}

void RefKernels::download(const Tensor& src, void* host) {
  if (src.size_bytes() > 0) std::memcpy(host, src.data, static_cast<std::size_t>(src.size_bytes()));
}

void RefKernels::fill(const Tensor& t, double value) {
  if (!t.is_contiguous()) throw Unsupported("ref fill: tensor " + t.to_string() + " is not contiguous");
  const std::int64_t n = t.numel();
  if (t.dtype == DType::i32) {
    auto* p = t.as<std::int32_t>();
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::int32_t>(value);
    return;
  }
  dispatch(t.dtype, [&](auto z) {
    using T = decltype(z);
    auto* p = t.as<T>();
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(value);
  });
}

void RefKernels::check_tensor(const Tensor& t) {
  if (t.device != DeviceKind::host) throw Unsupported("the ref kernels run on host memory only");
  if (t.dtype != DType::f32 && t.dtype != DType::f64 && t.dtype != DType::i32)
    throw Unsupported("the ref kernels store f32 or f64 (and i32 labels), not " + std::string(to_string(t.dtype)) +
                      "; reduced precisions run on a device backend");
}

// ---- elementwise

void RefKernels::relu_forward(const Tensor& x, const Tensor& y) {
  require_same_flat("relu_forward", x, y);
  dispatch(x.dtype, [&](auto z) {
    using T = decltype(z);
    const T* in = x.as<T>();
    T* out = y.as<T>();
    for (std::int64_t i = 0; i < x.numel(); ++i) out[i] = in[i] > T(0) ? in[i] : T(0);
  });
}

void RefKernels::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool accumulate) {
  require_same_flat("relu_backward", y, dy);
  require_same_flat("relu_backward", y, dx);
  dispatch(y.dtype, [&](auto z) {
    using T = decltype(z);
    const T *out = y.as<T>(), *g = dy.as<T>();
    T* d = dx.as<T>();
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      const T v = out[i] > T(0) ? g[i] : T(0);
      d[i] = accumulate ? d[i] + v : v;
    }
  });
}

void RefKernels::add_forward(const Tensor& a, const Tensor& b, const Tensor& y) {
  require_same_flat("add_forward", a, b);
  require_same_flat("add_forward", a, y);
  dispatch(a.dtype, [&](auto z) {
    using T = decltype(z);
    const T *pa = a.as<T>(), *pb = b.as<T>();
    T* out = y.as<T>();
    for (std::int64_t i = 0; i < a.numel(); ++i) out[i] = pa[i] + pb[i];
  });
}

void RefKernels::copy_gradient(const Tensor& dy, const Tensor& dx, bool accumulate) {
  require_same_flat("copy_gradient", dy, dx);
  dispatch(dy.dtype, [&](auto z) {
    using T = decltype(z);
    const T* g = dy.as<T>();
    T* d = dx.as<T>();
    for (std::int64_t i = 0; i < dy.numel(); ++i) d[i] = accumulate ? d[i] + g[i] : g[i];
  });
}

// ---- linear

void RefKernels::linear_forward(const Tensor& xt, const Tensor& wt, const Tensor& bt, const Tensor& yt) {
  dispatch(xt.dtype, [&](auto z) {
    using T = decltype(z);
    const View2<const T> x(xt), w(wt);
    const View2<T> y(yt);
    const T* b = bt.defined() ? bt.as<const T>() : nullptr;
    const std::int64_t bs = bt.defined() ? bt.strides[0] : 0;
#pragma omp parallel for schedule(static) if (worth_threads(y.rows * y.cols * x.cols))
    for (std::int64_t no = 0; no < y.rows * y.cols; ++no) {
      const std::int64_t n = no / y.cols, o = no % y.cols;
      double acc = b ? static_cast<double>(b[o * bs]) : 0.0;
      for (std::int64_t i = 0; i < x.cols; ++i) acc += static_cast<double>(x.at(n, i)) * w.at(o, i);
      y.at(n, o) = static_cast<T>(acc);
    }
  });
}

void RefKernels::linear_backward_data(const Tensor& dyt, const Tensor& wt, const Tensor& dxt, bool accumulate) {
  dispatch(dyt.dtype, [&](auto z) {
    using T = decltype(z);
    const View2<const T> dy(dyt), w(wt);
    const View2<T> dx(dxt);
#pragma omp parallel for schedule(static) if (worth_threads(dx.rows * dx.cols * dy.cols))
    for (std::int64_t ni = 0; ni < dx.rows * dx.cols; ++ni) {
      const std::int64_t n = ni / dx.cols, i = ni % dx.cols;
      double acc = 0.0;
      for (std::int64_t o = 0; o < dy.cols; ++o) acc += static_cast<double>(dy.at(n, o)) * w.at(o, i);
      dx.at(n, i) = static_cast<T>(accumulate ? static_cast<double>(dx.at(n, i)) + acc : acc);
    }
  });
}

void RefKernels::linear_backward_weights(const Tensor& xt, const Tensor& dyt, const Tensor& dwt, const Tensor& dbt) {
  dispatch(xt.dtype, [&](auto z) {
    using T = decltype(z);
    const View2<const T> x(xt), dy(dyt);
    const View2<T> dw(dwt);
#pragma omp parallel for schedule(static) if (worth_threads(dw.rows * dw.cols * x.rows))
    for (std::int64_t oi = 0; oi < dw.rows * dw.cols; ++oi) {
      const std::int64_t o = oi / dw.cols, i = oi % dw.cols;
      double acc = 0.0;
      for (std::int64_t n = 0; n < x.rows; ++n) acc += static_cast<double>(dy.at(n, o)) * x.at(n, i);
      dw.at(o, i) = static_cast<T>(acc);
    }
    if (dbt.defined()) {
      T* db = dbt.as<T>();
      for (std::int64_t o = 0; o < dy.cols; ++o) {
        double acc = 0.0;
        for (std::int64_t n = 0; n < dy.rows; ++n) acc += dy.at(n, o);
        db[o * dbt.strides[0]] = static_cast<T>(acc);
      }
    }
  });
}

// ---- softmax cross-entropy

void RefKernels::softmax_cross_entropy_forward(const Tensor& zt, const Tensor& labels, const Tensor& pt,
                                               const Tensor& loss) {
  dispatch(zt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View2<const T> z(zt);
    const View2<T> p(pt);
    const auto* label = labels.as<const std::int32_t>();
    double total = 0.0;
    std::vector<double> e(sz(z.cols));
    for (std::int64_t n = 0; n < z.rows; ++n) {
      const std::int64_t y = label[n * labels.strides[0]];
      if (y < 0 || y >= z.cols)
        throw Error("softmax_cross_entropy: label " + std::to_string(y) + " of sample " + std::to_string(n) +
                    " outside [0, " + std::to_string(z.cols) + ")");
      double m = z.at(n, 0);
      for (std::int64_t k = 1; k < z.cols; ++k) m = std::max(m, static_cast<double>(z.at(n, k)));
      double sum = 0.0;
      for (std::int64_t k = 0; k < z.cols; ++k) sum += e[sz(k)] = std::exp(static_cast<double>(z.at(n, k)) - m);
      for (std::int64_t k = 0; k < z.cols; ++k) p.at(n, k) = static_cast<T>(e[sz(k)] / sum);
      total += std::log(sum) - (static_cast<double>(z.at(n, y)) - m);  // -log softmax(z)[y], stable
    }
    *loss.as<T>() = static_cast<T>(total / static_cast<double>(z.rows));
  });
}

void RefKernels::softmax_cross_entropy_backward(const Tensor& pt, const Tensor& labels, const Tensor& dloss,
                                                const Tensor& dzt, bool accumulate) {
  dispatch(pt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View2<const T> p(pt);
    const View2<T> dz(dzt);
    const auto* label = labels.as<const std::int32_t>();
    const double scale = static_cast<double>(*dloss.as<const T>()) / static_cast<double>(p.rows);
    for (std::int64_t n = 0; n < p.rows; ++n)
      for (std::int64_t k = 0; k < p.cols; ++k) {
        const double onehot = k == label[n * labels.strides[0]] ? 1.0 : 0.0;
        const double g = scale * (static_cast<double>(p.at(n, k)) - onehot);
        dz.at(n, k) = static_cast<T>(accumulate ? static_cast<double>(dz.at(n, k)) + g : g);
      }
  });
}

// ---- optimizers

namespace {

// Loss scaling's verdict, read where a device kernel would read it.
bool skipped(const Tensor& skip_if) { return skip_if.defined() && *skip_if.as<const std::int32_t>() != 0; }

}  // namespace

void RefKernels::sgd_update(const SgdStep& s, const Tensor& w, const Tensor& g, const Tensor& v) {
  require_same_flat("sgd_update", w, g);
  require_same_flat("sgd_update", w, v);
  if (skipped(s.skip_if)) return;
  dispatch(w.dtype, [&](auto zero) {
    using T = decltype(zero);
    T *pw = w.as<T>(), *pv = v.as<T>();
    const T* pg = g.as<const T>();
    for (std::int64_t i = 0; i < w.numel(); ++i) {
      const double d = static_cast<double>(pg[i]) + s.weight_decay * static_cast<double>(pw[i]);
      const double vel = s.momentum * static_cast<double>(pv[i]) + d;
      pv[i] = static_cast<T>(vel);
      pw[i] = static_cast<T>(static_cast<double>(pw[i]) - s.learning_rate * vel);
    }
  });
}

void RefKernels::lars_update(const LarsStep& s, const Tensor& w, const Tensor& g, const Tensor& v) {
  require_same_flat("lars_update", w, g);
  require_same_flat("lars_update", w, v);
  if (skipped(s.skip_if)) return;
  dispatch(w.dtype, [&](auto zero) {
    using T = decltype(zero);
    T *pw = w.as<T>(), *pv = v.as<T>();
    const T* pg = g.as<const T>();
    double trust = 1.0;
    if (s.adapt) {
      double w2 = 0.0, g2 = 0.0;
      for (std::int64_t i = 0; i < w.numel(); ++i) {
        w2 += static_cast<double>(pw[i]) * pw[i];
        g2 += static_cast<double>(pg[i]) * pg[i];
      }
      const double wn = std::sqrt(w2), gn = std::sqrt(g2);
      if (wn > 0 && gn > 0) trust = s.trust_coefficient * wn / (gn + s.weight_decay * wn + s.epsilon);
    }
    const double lr = s.learning_rate * trust;
    for (std::int64_t i = 0; i < w.numel(); ++i) {
      const double d = static_cast<double>(pg[i]) + s.weight_decay * static_cast<double>(pw[i]);
      const double vel = s.momentum * static_cast<double>(pv[i]) + lr * d;
      pv[i] = static_cast<T>(vel);
      pw[i] = static_cast<T>(static_cast<double>(pw[i]) - vel);
    }
  });
}

// ---- mixed precision

namespace {

// Any floating element at `offset` elements from t.data, widened exactly to double.
double load_any(const Tensor& t, std::int64_t offset) {
  switch (t.dtype) {
    case DType::f64: return t.as<const double>()[offset];
    case DType::f32: return t.as<const float>()[offset];
    case DType::f16: return half_bits_to_float(t.as<const std::uint16_t>()[offset]);
    case DType::bf16: return bf16_bits_to_float(t.as<const std::uint16_t>()[offset]);
    default: throw Unsupported("ref: no floating load from " + std::string(to_string(t.dtype)));
  }
}

void store_any(const Tensor& t, std::int64_t offset, double v) {
  switch (t.dtype) {
    case DType::f64: t.as<double>()[offset] = v; break;
    case DType::f32: t.as<float>()[offset] = static_cast<float>(v); break;
    case DType::f16: t.as<std::uint16_t>()[offset] = float_to_half_bits(static_cast<float>(v)); break;
    case DType::bf16: t.as<std::uint16_t>()[offset] = float_to_bf16_bits(static_cast<float>(v)); break;
    default: throw Unsupported("ref: no floating store to " + std::string(to_string(t.dtype)));
  }
}

void require_scalar(const char* kernel, const char* what, const Tensor& t, DType dtype) {
  if (t.dtype != dtype || t.numel() != 1 || !t.defined())
    throw Error(std::string("ref ") + kernel + ": " + what + " must be " + std::string(to_string(dtype)) +
                "[1], got " + t.to_string());
}

class RecordedCall final : public Replayable {
 public:
  explicit RecordedCall(std::function<void()> body) : body_(std::move(body)) {}
  void replay() override { body_(); }

 private:
  std::function<void()> body_;
};

}  // namespace

void RefKernels::cast(const Tensor& src, const Tensor& dst) {
  if (!(src.shape == dst.shape) || !(src.strides == dst.strides) || !src.is_contiguous())
    throw Unsupported("ref cast: operands must be contiguous with one shape and layout (" + src.to_string() + " vs " +
                      dst.to_string() + ")");
  for (std::int64_t i = 0; i < src.numel(); ++i) store_any(dst, i, load_any(src, i));
}

void RefKernels::unscale_and_check(const Tensor& g, const Tensor& scale, const Tensor& found_nonfinite) {
  require_scalar("unscale_and_check", "scale", scale, DType::f32);
  require_scalar("unscale_and_check", "found_nonfinite", found_nonfinite, DType::i32);
  if (!g.is_contiguous()) throw Unsupported("ref unscale_and_check: gradient " + g.to_string() + " is not contiguous");
  // The reciprocal in f32, as PyTorch's GradScaler forms it; exact for the power-of-two scales.
  const double inv = static_cast<float>(1.0 / static_cast<double>(*scale.as<const float>()));
  bool bad = false;
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    const double in = load_any(g, i), out = in * inv;
    bad = bad || !std::isfinite(in) || !std::isfinite(out);
    store_any(g, i, out);
  }
  if (bad) *found_nonfinite.as<std::int32_t>() = 1;
}

void RefKernels::update_loss_scale(const LossScaleRule& rule, const Tensor& scale, const Tensor& good_steps,
                                   const Tensor& found_nonfinite) {
  require_scalar("update_loss_scale", "scale", scale, DType::f32);
  require_scalar("update_loss_scale", "good_steps", good_steps, DType::i32);
  require_scalar("update_loss_scale", "found_nonfinite", found_nonfinite, DType::i32);
  float& s = *scale.as<float>();
  std::int32_t& good = *good_steps.as<std::int32_t>();
  std::int32_t& found = *found_nonfinite.as<std::int32_t>();
  if (found != 0) {
    s = static_cast<float>(s * rule.backoff);
    good = 0;
  } else if (good + 1 >= rule.growth_interval) {
    // PyTorch keeps the old scale where growing would overflow it.
    const auto grown = static_cast<float>(s * rule.growth);
    if (std::isfinite(grown)) s = grown;
    good = 0;
  } else {
    ++good;
  }
  found = 0;
}

std::unique_ptr<Replayable> RefKernels::capture(const std::function<void()>& body) {
  return std::make_unique<RecordedCall>(body);
}

}  // namespace ab::nn::ref

namespace ab::nn {

std::unique_ptr<Kernels> make_ref_kernels() { return std::make_unique<ref::RefKernels>(); }

}  // namespace ab::nn
