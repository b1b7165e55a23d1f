// Reference kernels: memory, capture, elementwise ops, learned compression, linear and the loss
// (the optimizer updates and mixed precision: ref_optim.cpp).
#include "nn/ref/ref_kernels.h"

#include <cstring>
#include <utility>

namespace ab::nn {

void check_byte_range(std::string_view what, const Tensor& t, std::int64_t offset, std::int64_t bytes) {
  if (!t.is_contiguous()) throw Error(std::string(what) + ": tensor " + t.to_string() + " is not contiguous");
  if (offset < 0 || bytes < 0 || offset > t.size_bytes() - bytes)
    throw Error(std::string(what) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                ") are outside tensor " + t.to_string() + " of " + std::to_string(t.size_bytes()) + " bytes");
}

}  // namespace ab::nn

namespace ab::nn::ref {

void require_same_flat(const char* kernel, const Tensor& a, const Tensor& b) {
  if (!(a.shape == b.shape) || !(a.strides == b.strides) || !a.is_contiguous() || a.dtype != b.dtype)
    throw Unsupported(std::string("ref ") + kernel + ": operands must be contiguous with one shape, layout and dtype (" +
                      a.to_string() + " vs " + b.to_string() + ")");
}

double load(const Tensor& t, std::int64_t offset) {
  switch (t.dtype) {
    case DType::f64: return t.as<const double>()[offset];
    case DType::f32: return t.as<const float>()[offset];
    case DType::f16: return t.as<const Half>()[offset];
    case DType::bf16: return t.as<const BFloat16>()[offset];
    default: throw Unsupported("ref: " + std::string(to_string(t.dtype)) + " is not f64, f32, f16 or bf16");
  }
}

void store(const Tensor& t, std::int64_t offset, double v) {
  switch (t.dtype) {
    case DType::f64: t.as<double>()[offset] = v; break;
    case DType::f32: t.as<float>()[offset] = static_cast<float>(v); break;
    case DType::f16: t.as<Half>()[offset] = Half(v); break;
    case DType::bf16: t.as<BFloat16>()[offset] = BFloat16(v); break;
    default: throw Unsupported("ref: " + std::string(to_string(t.dtype)) + " is not f64, f32, f16 or bf16");
  }
}

// ---- memory and capture

void* RefAllocator::allocate(std::int64_t bytes) {
  if (*capturing_)
    throw Error("ref: allocation of " + std::to_string(bytes) +
                " bytes while capturing; a captured step must allocate nothing (allocate at bind)");
  void* p = host_.allocate(bytes);
  if (p != nullptr) note_allocate(bytes);
  return p;
}

void RefAllocator::deallocate(void* p, std::int64_t bytes) noexcept {
  if (p == nullptr) return;
  host_.deallocate(p, bytes);
  note_deallocate(bytes);
}

namespace {

class Tape final : public Replayable {
 public:
  explicit Tape(std::vector<std::function<void()>> calls) : calls_(std::move(calls)) {}
  void replay() override {
    for (const auto& call : calls_) call();
  }

 private:
  std::vector<std::function<void()>> calls_;
};

}  // namespace

std::unique_ptr<Replayable> RefKernels::capture(const std::function<void()>& body) {
  if (capturing_) throw Error("ref capture: already capturing (captures do not nest)");
  std::vector<std::function<void()>> calls;
  capturing_ = true;
  tape_ = &calls;
  try {
    body();
  } catch (...) {
    capturing_ = false;
    tape_ = nullptr;
    throw;
  }
  capturing_ = false;
  tape_ = nullptr;
  return std::make_unique<Tape>(std::move(calls));
}

void RefKernels::refuse_while_capturing(const char* what) const {
  if (capturing_)
    throw Error(std::string("ref: ") + what +
                " while capturing; a captured step must not wait for or copy to/from the host");
}

std::unique_ptr<measure::IterationTimer> RefKernels::make_timer() {
  return std::make_unique<measure::SteadyClockTimer>();
}

void RefKernels::synchronize() { refuse_while_capturing("synchronize"); }

void RefKernels::upload(const Tensor& dst, const void* host) {
  refuse_while_capturing("upload");
  if (dst.size_bytes() > 0) std::memcpy(dst.data, host, static_cast<std::size_t>(dst.size_bytes()));
}

void RefKernels::download(const Tensor& src, void* host) {
  refuse_while_capturing("download");
  if (src.size_bytes() > 0) std::memcpy(host, src.data, static_cast<std::size_t>(src.size_bytes()));
}

HostBuffer RefKernels::allocate_host(std::int64_t bytes) {
  if (bytes < 0) throw Error("ref allocate_host: " + std::to_string(bytes) + " bytes");
  if (bytes == 0) return {};
  return HostBuffer(::operator new(sz(bytes)), bytes, [](void* p) noexcept { ::operator delete(p); });
}

void RefKernels::upload_bytes(const Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) {
  refuse_while_capturing("upload_bytes");
  check_byte_range("ref upload_bytes", dst, offset, bytes);
  if (bytes > 0) std::memcpy(dst.as<unsigned char>() + offset, host, sz(bytes));
}

void RefKernels::download_bytes(const Tensor& src, std::int64_t offset, void* host, std::int64_t bytes) {
  refuse_while_capturing("download_bytes");
  check_byte_range("ref download_bytes", src, offset, bytes);
  if (bytes > 0) std::memcpy(host, src.as<const unsigned char>() + offset, sz(bytes));
}

void RefKernels::fill(const Tensor& t, double value) {
  if (deferred([=, this] { fill(t, value); })) return;
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
  if (t.dtype != DType::f32 && t.dtype != DType::f64 && t.dtype != DType::f16 && t.dtype != DType::bf16 &&
      t.dtype != DType::i32 && t.dtype != DType::i64 && t.dtype != DType::i8)
    throw Unsupported("the ref kernels store f64, f32, f16 or bf16 (and i8, i32, i64 integers), not " +
                      std::string(to_string(t.dtype)));
}

// ---- elementwise

void RefKernels::relu_forward(const Tensor& x, const Tensor& y) {
  if (deferred([=, this] { relu_forward(x, y); })) return;
  require_same_flat("relu_forward", x, y);
  dispatch(x.dtype, [&](auto z) {
    using T = decltype(z);
    const T* in = x.as<T>();
    T* out = y.as<T>();
    for (std::int64_t i = 0; i < x.numel(); ++i) out[i] = static_cast<double>(in[i]) > 0 ? in[i] : T(0.0);
  });
}

void RefKernels::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool accumulate) {
  if (deferred([=, this] { relu_backward(y, dy, dx, accumulate); })) return;
  require_same_flat("relu_backward", y, dy);
  require_same_flat("relu_backward", y, dx);
  dispatch(y.dtype, [&](auto z) {
    using T = decltype(z);
    const T *out = y.as<T>(), *g = dy.as<T>();
    T* d = dx.as<T>();
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      const double v = static_cast<double>(out[i]) > 0 ? static_cast<double>(g[i]) : 0.0;
      d[i] = static_cast<T>(accumulate ? static_cast<double>(d[i]) + v : v);
    }
  });
}

void RefKernels::add_forward(const Tensor& a, const Tensor& b, const Tensor& y) {
  if (deferred([=, this] { add_forward(a, b, y); })) return;
  require_same_flat("add_forward", a, b);
  require_same_flat("add_forward", a, y);
  dispatch(a.dtype, [&](auto z) {
    using T = decltype(z);
    const T *pa = a.as<T>(), *pb = b.as<T>();
    T* out = y.as<T>();
    for (std::int64_t i = 0; i < a.numel(); ++i)
      out[i] = static_cast<T>(static_cast<double>(pa[i]) + static_cast<double>(pb[i]));
  });
}

void RefKernels::copy_gradient(const Tensor& dy, const Tensor& dx, bool accumulate) {
  if (deferred([=, this] { copy_gradient(dy, dx, accumulate); })) return;
  require_same_flat("copy_gradient", dy, dx);
  dispatch(dy.dtype, [&](auto z) {
    using T = decltype(z);
    const T* g = dy.as<T>();
    T* d = dx.as<T>();
    for (std::int64_t i = 0; i < dy.numel(); ++i)
      d[i] = accumulate ? static_cast<T>(static_cast<double>(d[i]) + static_cast<double>(g[i])) : g[i];
  });
}

// ---- learned compression: rounding and the rate-distortion proxy

void RefKernels::round_forward(const Tensor& x, const Tensor& y, double step) {
  if (deferred([=, this] { round_forward(x, y, step); })) return;
  if (!(step > 0) || !std::isfinite(step)) throw Error("ref round_forward: step must be positive and finite");
  require_same_flat("round_forward", x, y);
  dispatch(x.dtype, [&](auto z) {
    using T = decltype(z);
    const T* in = x.as<T>();
    T* out = y.as<T>();
    // nearbyint in the default rounding mode: nearest, ties to even (torch.round).
    for (std::int64_t i = 0; i < x.numel(); ++i) out[i] = static_cast<T>(step * std::nearbyint(static_cast<double>(in[i]) / step));
  });
}

namespace {

// Calls f(offset) for every element of a contiguous tensor in logical (NCHW) order, so sums over it
// are the same bits in either layout.
template <typename F>
void for_each_logical(const Tensor& t, F&& f) {
  if (t.shape.rank() != 4) {
    for (std::int64_t i = 0; i < t.numel(); ++i) f(i);
    return;
  }
  for (std::int64_t n = 0; n < t.shape[0]; ++n)
    for (std::int64_t c = 0; c < t.shape[1]; ++c)
      for (std::int64_t h = 0; h < t.shape[2]; ++h)
        for (std::int64_t w = 0; w < t.shape[3]; ++w)
          f(n * t.strides[0] + c * t.strides[1] + h * t.strides[2] + w * t.strides[3]);
}

double sign_of(double v) { return v > 0 ? 1.0 : v < 0 ? -1.0 : 0.0; }

}  // namespace

void RefKernels::rate_distortion_forward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x,
                                         const Tensor& latent, const Tensor& loss, const Tensor& mse) {
  if (deferred([=, this] { rate_distortion_forward(d, x_hat, x, latent, loss, mse); })) return;
  require_same_flat("rate_distortion_forward", x_hat, x);
  require_same_flat("rate_distortion_forward", latent, latent);
  double squares = 0.0, l1 = 0.0;
  for_each_logical(x_hat, [&](std::int64_t i) {
    const double e = load(x_hat, i) - load(x, i);
    squares += e * e;
  });
  for_each_logical(latent, [&](std::int64_t i) { l1 += std::fabs(load(latent, i)); });
  const double distortion = squares / static_cast<double>(x_hat.numel());
  store(mse, 0, distortion);
  store(loss, 0, distortion + d.lambda * l1 / static_cast<double>(latent.numel()));
}

void RefKernels::rate_distortion_backward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x,
                                          const Tensor& latent, const Tensor& dloss, const Tensor& dx_hat,
                                          bool accumulate_x_hat, const Tensor& dlatent, bool accumulate_latent) {
  if (deferred([=, this] {
        rate_distortion_backward(d, x_hat, x, latent, dloss, dx_hat, accumulate_x_hat, dlatent, accumulate_latent);
      }))
    return;
  const double g = load(dloss, 0);
  if (dx_hat.defined()) {
    require_same_flat("rate_distortion_backward", x_hat, x);
    require_same_flat("rate_distortion_backward", x_hat, dx_hat);
    const double scale = 2.0 * g / static_cast<double>(x_hat.numel());
    for (std::int64_t i = 0; i < x_hat.numel(); ++i) {
      const double v = scale * (load(x_hat, i) - load(x, i));
      store(dx_hat, i, accumulate_x_hat ? load(dx_hat, i) + v : v);
    }
  }
  if (dlatent.defined()) {
    require_same_flat("rate_distortion_backward", latent, dlatent);
    const double scale = g * d.lambda / static_cast<double>(latent.numel());
    for (std::int64_t i = 0; i < latent.numel(); ++i) {
      const double v = scale * sign_of(load(latent, i));
      store(dlatent, i, accumulate_latent ? load(dlatent, i) + v : v);
    }
  }
}

// ---- linear (x, w, y, dx, dy, dw in one type; the bias and its gradient in any)

namespace {

void require_same_dtype(const char* kernel, const Tensor& a, const Tensor& b, const Tensor& c) {
  if (a.dtype != b.dtype || a.dtype != c.dtype)
    throw Unsupported(std::string("ref ") + kernel + ": operands must share one dtype (" + a.to_string() + ", " +
                      b.to_string() + ", " + c.to_string() + ")");
}

// Rows may be padded (any strides: View2 reads them), but the shapes must fit: [rows, cols].
void require_shape(const char* kernel, const char* what, const Tensor& t, std::int64_t rows, std::int64_t cols) {
  if (t.shape.rank() != 2 || t.shape[0] != rows || t.shape[1] != cols)
    throw Error(std::string("ref ") + kernel + ": " + what + " is " + t.to_string() + ", not [" + std::to_string(rows) +
                ", " + std::to_string(cols) + "]");
}

void require_bias(const char* kernel, const char* what, const Tensor& t, std::int64_t length) {
  if (t.defined() && (t.shape.rank() != 1 || t.shape[0] != length))
    throw Error(std::string("ref ") + kernel + ": " + what + " is " + t.to_string() + ", not [" +
                std::to_string(length) + "]");
}

// The first two operands' rows and widths fix the shapes a linear kernel's three matrices must have.
struct LinearDims {
  std::int64_t n = 0, in = 0, out = 0;
};

LinearDims dims_of(const char* kernel, const Tensor& rows_of, const char* rows_name, const Tensor& w) {
  if (rows_of.shape.rank() != 2 || w.shape.rank() != 2)
    throw Error(std::string("ref ") + kernel + ": " + rows_name + " " + rows_of.to_string() + " and w " +
                w.to_string() + " must be matrices");
  return {rows_of.shape[0], w.shape[1], w.shape[0]};
}

}  // namespace

void RefKernels::linear_forward(const Tensor& xt, const Tensor& wt, const Tensor& bt, const Tensor& yt) {
  if (deferred([=, this] { linear_forward(xt, wt, bt, yt); })) return;
  require_same_dtype("linear_forward", xt, wt, yt);
  const LinearDims d = dims_of("linear_forward", xt, "x", wt);
  require_shape("linear_forward", "x", xt, d.n, d.in);
  require_shape("linear_forward", "y", yt, d.n, d.out);
  require_bias("linear_forward", "bias", bt, d.out);
  dispatch(xt.dtype, [&](auto z) {
    using T = decltype(z);
    const View2<const T> x(xt), w(wt);
    const View2<T> y(yt);
    std::vector<double> bias(sz(y.cols), 0.0);
    if (bt.defined())
      for (std::int64_t o = 0; o < y.cols; ++o) bias[sz(o)] = load(bt, o * bt.strides[0]);
#pragma omp parallel for schedule(static) if (worth_threads(y.rows * y.cols * x.cols))
    for (std::int64_t no = 0; no < y.rows * y.cols; ++no) {
      const std::int64_t n = no / y.cols, o = no % y.cols;
      double acc = bias[sz(o)];
      for (std::int64_t i = 0; i < x.cols; ++i) acc += static_cast<double>(x.at(n, i)) * w.at(o, i);
      y.at(n, o) = static_cast<T>(acc);
    }
  });
}

void RefKernels::linear_backward_data(const Tensor& dyt, const Tensor& wt, const Tensor& dxt, bool accumulate) {
  if (deferred([=, this] { linear_backward_data(dyt, wt, dxt, accumulate); })) return;
  require_same_dtype("linear_backward_data", dyt, wt, dxt);
  const LinearDims d = dims_of("linear_backward_data", dyt, "dy", wt);
  require_shape("linear_backward_data", "dy", dyt, d.n, d.out);
  require_shape("linear_backward_data", "dx", dxt, d.n, d.in);
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
  if (deferred([=, this] { linear_backward_weights(xt, dyt, dwt, dbt); })) return;
  require_same_dtype("linear_backward_weights", xt, dyt, dwt);
  const LinearDims d = dims_of("linear_backward_weights", xt, "x", dwt);
  require_shape("linear_backward_weights", "x", xt, d.n, d.in);
  require_shape("linear_backward_weights", "dy", dyt, d.n, d.out);
  require_bias("linear_backward_weights", "dbias", dbt, d.out);
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
    if (dbt.defined())
      for (std::int64_t o = 0; o < dy.cols; ++o) {
        double acc = 0.0;
        for (std::int64_t n = 0; n < dy.rows; ++n) acc += dy.at(n, o);
        store(dbt, o * dbt.strides[0], acc);
      }
  });
}

void RefKernels::column_sums(const Tensor& xt, const Tensor& st) {
  if (deferred([=, this] { column_sums(xt, st); })) return;
  if (xt.shape.rank() != 2) throw Error("ref column_sums: x " + xt.to_string() + " must be a matrix");
  if (!st.defined()) throw Error("ref column_sums: sums undefined");
  require_same_dtype("column_sums", xt, st, st);
  require_bias("column_sums", "sums", st, xt.shape[1]);
  dispatch(xt.dtype, [&](auto z) {
    using T = decltype(z);
    const View2<const T> x(xt);
    for (std::int64_t c = 0; c < x.cols; ++c) {
      double acc = 0.0;
      for (std::int64_t n = 0; n < x.rows; ++n) acc += x.at(n, c);
      store(st, c * st.strides[0], acc);
    }
  });
}

// ---- softmax cross-entropy (logits and their gradient in one type; probs, loss, dloss in any)

void RefKernels::softmax_cross_entropy_forward(const Tensor& zt, const Tensor& labels, const Tensor& pt,
                                               const Tensor& loss) {
  if (deferred([=, this] { softmax_cross_entropy_forward(zt, labels, pt, loss); })) return;
  dispatch(zt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View2<const T> z(zt);
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
      for (std::int64_t k = 0; k < z.cols; ++k) store(pt, n * pt.strides[0] + k * pt.strides[1], e[sz(k)] / sum);
      total += std::log(sum) - (static_cast<double>(z.at(n, y)) - m);  // -log softmax(z)[y], stable
    }
    store(loss, 0, total / static_cast<double>(z.rows));
  });
}

void RefKernels::softmax_cross_entropy_backward(const Tensor& pt, const Tensor& labels, const Tensor& dloss,
                                                const Tensor& dzt, bool accumulate) {
  if (deferred([=, this] { softmax_cross_entropy_backward(pt, labels, dloss, dzt, accumulate); })) return;
  dispatch(dzt.dtype, [&](auto zero) {
    using T = decltype(zero);
    const View2<T> dz(dzt);
    const auto* label = labels.as<const std::int32_t>();
    const double scale = load(dloss, 0) / static_cast<double>(dz.rows);
    for (std::int64_t n = 0; n < dz.rows; ++n)
      for (std::int64_t k = 0; k < dz.cols; ++k) {
        const double onehot = k == label[n * labels.strides[0]] ? 1.0 : 0.0;
        const double g = scale * (load(pt, n * pt.strides[0] + k * pt.strides[1]) - onehot);
        dz.at(n, k) = static_cast<T>(accumulate ? static_cast<double>(dz.at(n, k)) + g : g);
      }
  });
}

}  // namespace ab::nn::ref

namespace ab::nn {

std::unique_ptr<Kernels> make_ref_kernels() { return std::make_unique<ref::RefKernels>(); }

}  // namespace ab::nn
