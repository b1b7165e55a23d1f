// Reference kernels: the optimizer updates (SGD, LARS) and mixed precision (casts, loss scaling).
#include <cmath>
#include <cstdint>
#include <string>

#include "nn/ref/ref_kernels.h"

namespace ab::nn::ref {

// ---- optimizers

namespace {

// Loss scaling's verdict, read where a device kernel would read it (at run time, not at capture).
bool skipped(const Tensor& skip_if) { return skip_if.defined() && *skip_if.as<const std::int32_t>() != 0; }

}  // namespace

void RefKernels::sgd_update(const SgdStep& s, const Tensor& w, const Tensor& g, const Tensor& v) {
  if (deferred([=, this] { sgd_update(s, w, g, v); })) return;
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
  if (deferred([=, this] { lars_update(s, w, g, v); })) return;
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

void require_scalar(const char* kernel, const char* what, const Tensor& t, DType dtype) {
  if (t.dtype != dtype || t.numel() != 1 || !t.defined())
    throw Error(std::string("ref ") + kernel + ": " + what + " must be " + std::string(to_string(dtype)) +
                "[1], got " + t.to_string());
}

}  // namespace

void RefKernels::cast(const Tensor& src, const Tensor& dst) {
  if (deferred([=, this] { cast(src, dst); })) return;
  if (!(src.shape == dst.shape) || !(src.strides == dst.strides) || !src.is_contiguous())
    throw Unsupported("ref cast: operands must be contiguous with one shape and layout (" + src.to_string() + " vs " +
                      dst.to_string() + ")");
  for (std::int64_t i = 0; i < src.numel(); ++i) store(dst, i, load(src, i));
}

void RefKernels::cast_many(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts, const CastManyMode& mode) {
  if (mode.plain()) return Kernels::cast_many(srcs, dsts);
  if (deferred([=, this] { cast_many(srcs, dsts, mode); })) return;
  if (srcs.size() != dsts.size())
    throw Error("ref cast_many: " + std::to_string(srcs.size()) + " sources for " + std::to_string(dsts.size()) +
                " destinations");
  for (std::size_t t = 0; t < srcs.size(); ++t) {
    const Tensor &src = srcs[t], &dst = dsts[t];
    if (!(src.shape == dst.shape) || !src.is_contiguous() || !dst.is_contiguous())
      throw Unsupported("ref cast_many: operands must be contiguous with one shape (" + src.to_string() + " vs " +
                        dst.to_string() + ")");
    for (std::int64_t i = 0; i < src.numel(); ++i)
      store(dst, i, mode.scale * (mode.accumulate ? load(dst, i) + load(src, i) : load(src, i)));
  }
}

void RefKernels::unscale_and_check(const Tensor& g, const Tensor& scale, const Tensor& found_nonfinite) {
  if (deferred([=, this] { unscale_and_check(g, scale, found_nonfinite); })) return;
  require_scalar("unscale_and_check", "scale", scale, DType::f32);
  require_scalar("unscale_and_check", "found_nonfinite", found_nonfinite, DType::i32);
  if (!g.is_contiguous()) throw Unsupported("ref unscale_and_check: gradient " + g.to_string() + " is not contiguous");
  // The reciprocal in f32, as PyTorch's GradScaler forms it; exact for power-of-two scales.
  const double inv = static_cast<float>(1.0 / static_cast<double>(*scale.as<const float>()));
  bool bad = false;
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    const double in = load(g, i), out = in * inv;
    bad = bad || !std::isfinite(in) || !std::isfinite(out);
    store(g, i, out);
  }
  if (bad) *found_nonfinite.as<std::int32_t>() = 1;
}

void RefKernels::update_loss_scale(const LossScaleRule& rule, const Tensor& scale, const Tensor& good_steps,
                                   const Tensor& found_nonfinite) {
  if (deferred([=, this] { update_loss_scale(rule, scale, good_steps, found_nonfinite); })) return;
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

}  // namespace ab::nn::ref
