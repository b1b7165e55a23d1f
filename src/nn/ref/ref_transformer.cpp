// Reference kernels of the transformer ops: token + position embedding, LayerNorm, GELU (tanh
// form), scaled dot-product attention (causal and padding masks), the global gradient norm, AdamW
// with its device step counter, and the classifier's fused cross-entropy. Every sum in float64 in
// a fixed order; operands read and written through load/store, so any floating storage type and
// any strides are taken (16-bit values rounded once on store).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "nn/dropout_mask.h"
#include "nn/ref/ref_kernels.h"

namespace ab::nn::ref {
namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

std::int64_t at2(const Tensor& t, std::int64_t i, std::int64_t j) { return i * t.strides[0] + j * t.strides[1]; }
std::int64_t at3(const Tensor& t, std::int64_t i, std::int64_t j, std::int64_t k) {
  return i * t.strides[0] + j * t.strides[1] + k * t.strides[2];
}
std::int64_t at4(const Tensor& t, std::int64_t i, std::int64_t j, std::int64_t k, std::int64_t l) {
  return i * t.strides[0] + j * t.strides[1] + k * t.strides[2] + l * t.strides[3];
}

[[noreturn]] void bad_operands(const std::string& kernel, const std::string& why) {
  throw Error("ref " + kernel + ": " + why);
}

// tokens i32 [B, T]; wte [V, C]; wpe [P, C]; rows [B*T, C]; T <= P; every token in [0, V).
void check_embedding(const std::string& kernel, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                     const Tensor& rows) {
  if (tokens.dtype != DType::i32 || tokens.shape.rank() != 2)
    bad_operands(kernel, "tokens must be i32 [B, T], got " + tokens.to_string());
  const std::int64_t batch = tokens.shape[0], seq = tokens.shape[1];
  if (wte.shape.rank() != 2 || wpe.shape.rank() != 2 || rows.shape.rank() != 2 || wte.shape[1] != rows.shape[1] ||
      wpe.shape[1] != rows.shape[1] || rows.shape[0] != batch * seq)
    bad_operands(kernel, "needs wte [V, C], wpe [P, C] and rows [B*T, C], got " + wte.to_string() + ", " +
                             wpe.to_string() + ", " + rows.to_string() + " for tokens " + tokens.to_string());
  if (seq > wpe.shape[0])
    bad_operands(kernel, "a sequence of " + std::to_string(seq) + " tokens is longer than the model's " +
                             std::to_string(wpe.shape[0]) + " positions");
  const std::int64_t vocab = wte.shape[0];
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < seq; ++t) {
      const std::int64_t id = tokens.as<const std::int32_t>()[at2(tokens, b, t)];
      if (id < 0 || id >= vocab)
        bad_operands(kernel, "token " + std::to_string(id) + " at [" + std::to_string(b) + ", " + std::to_string(t) +
                                 "] outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
}

std::int64_t token(const Tensor& tokens, std::int64_t row) {
  const std::int64_t seq = tokens.shape[1];
  return tokens.as<const std::int32_t>()[at2(tokens, row / seq, row % seq)];
}

// x, dy, dx [rows, C]; gamma, beta, dgamma, dbeta [C]; mean, rstd [rows].
void check_layernorm(const std::string& kernel, const Tensor& x, const Tensor& y, const Tensor& gamma,
                     const Tensor& mean) {
  if (x.shape.rank() != 2 || !(x.shape == y.shape) || gamma.shape.rank() != 1 || gamma.shape[0] != x.shape[1] ||
      mean.shape.rank() != 1 || mean.shape[0] != x.shape[0])
    bad_operands(kernel, "needs x and y [rows, C], gamma [C], statistics [rows], got " + x.to_string() + ", " +
                             y.to_string() + ", " + gamma.to_string() + ", " + mean.to_string());
}

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x))); }
double gelu_derivative(double x) {
  const double th = std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x * x);
}

// The shapes attention reads: q, o [B, H, Tq, D]; k, v [B, H, Tk, D]; stats [B, H, Tq].
struct AttentionShape {
  std::int64_t batch, heads, queries, keys, dim;
  double scale;
};

AttentionShape check_attention(const std::string& kernel, const AttentionDesc& d, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& o, const Tensor& stats) {
  const auto same4 = [](const Tensor& a, const Tensor& b) {
    return a.shape.rank() == 4 && b.shape.rank() == 4 && a.shape[0] == b.shape[0] && a.shape[1] == b.shape[1] &&
           a.shape[3] == b.shape[3];
  };
  if (!same4(q, k) || !same4(q, v) || !same4(q, o) || !(k.shape == v.shape) || !(q.shape == o.shape) ||
      stats.shape.rank() != 3 || stats.shape[0] != q.shape[0] || stats.shape[1] != q.shape[1] ||
      stats.shape[2] != q.shape[2])
    bad_operands(kernel, "needs q, o [B, H, Tq, D], k, v [B, H, Tk, D] and stats [B, H, Tq], got " + q.to_string() +
                             ", " + k.to_string() + ", " + v.to_string() + ", " + o.to_string() + ", " +
                             stats.to_string());
  if (q.dtype != k.dtype || q.dtype != v.dtype || q.dtype != o.dtype)
    bad_operands(kernel, "q, k, v and o must share one dtype");
  const AttentionShape s{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3],
                         d.scale > 0 ? d.scale : 1.0 / std::sqrt(static_cast<double>(q.shape[3]))};
  if (d.causal && s.queries != s.keys) bad_operands(kernel, "causal attention needs as many queries as keys");
  if (d.key_lengths.defined()) {
    if (d.key_lengths.dtype != DType::i32 || d.key_lengths.shape.rank() != 1 || d.key_lengths.shape[0] != s.batch)
      bad_operands(kernel, "key_lengths must be i32 [B], got " + d.key_lengths.to_string());
    for (std::int64_t b = 0; b < s.batch; ++b) {
      const std::int64_t len = d.key_lengths.as<const std::int32_t>()[b * d.key_lengths.strides[0]];
      if (len < 1 || len > s.keys)
        bad_operands(kernel, "key length " + std::to_string(len) + " of sequence " + std::to_string(b) +
                                 " outside [1, " + std::to_string(s.keys) + "]");
    }
  }
  return s;
}

// The keys query i of sequence b may see: [0, end).
std::int64_t visible_keys(const AttentionDesc& d, const AttentionShape& s, std::int64_t b, std::int64_t i) {
  std::int64_t end = d.causal ? i + 1 : s.keys;
  if (d.key_lengths.defined()) end = std::min<std::int64_t>(end, d.key_lengths.as<const std::int32_t>()[b * d.key_lengths.strides[0]]);
  return end;
}

// Row i's scaled scores against keys [0, end) of head (b, h).
std::vector<double> scores(const AttentionShape& s, const Tensor& q, const Tensor& k, std::int64_t b, std::int64_t h,
                           std::int64_t i, std::int64_t end) {
  std::vector<double> row(sz(end));
  for (std::int64_t j = 0; j < end; ++j) {
    double dot = 0.0;
    for (std::int64_t c = 0; c < s.dim; ++c) dot += load(q, at4(q, b, h, i, c)) * load(k, at4(k, b, h, j, c));
    row[sz(j)] = dot * s.scale;
  }
  return row;
}

// i32 [1] device scalars (step counters, skip flags).
void check_counter(const std::string& kernel, const char* what, const Tensor& t) {
  if (t.dtype != DType::i32 || t.numel() != 1)
    bad_operands(kernel, std::string(what) + " must be i32 [1], got " + t.to_string());
}

// AdamWStep's step: step_count's value where it is defined, else `step`; from 1 on.
std::int64_t step_number(const std::string& kernel, const AdamWStep& s) {
  std::int64_t step = s.step;
  if (s.step_count.defined()) {
    check_counter(kernel, "step_count", s.step_count);
    step = *s.step_count.as<const std::int32_t>();
  }
  if (step < 1) bad_operands(kernel, "step counts from 1, got " + std::to_string(step));
  return step;
}

// logits [N, V] (any strides: padded rows); labels i32 [N] in [0, V) or -1; dlogits (if defined)
// logits' shape; loss and seed (if defined) [1]. Returns the number of scored rows.
std::int64_t check_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                                 const Tensor& seed) {
  const std::string kernel = "cross_entropy_fused";
  if (logits.shape.rank() != 2 || labels.dtype != DType::i32 || labels.shape.rank() != 1 ||
      labels.shape[0] != logits.shape[0] || loss.numel() != 1 || (seed.defined() && seed.numel() != 1) ||
      (dlogits.defined() && !(dlogits.shape == logits.shape)))
    bad_operands(kernel, "needs logits [N, V], i32 labels [N], loss [1], dlogits like logits and seed [1], got " +
                             logits.to_string() + ", " + labels.to_string() + ", " + loss.to_string() +
                             (dlogits.defined() ? ", " + dlogits.to_string() : "") +
                             (seed.defined() ? ", " + seed.to_string() : ""));
  std::int64_t scored = 0;
  for (std::int64_t r = 0; r < logits.shape[0]; ++r) {
    const std::int64_t label = labels.as<const std::int32_t>()[r * labels.strides[0]];
    if (label < -1 || label >= logits.shape[1])
      bad_operands(kernel, "label " + std::to_string(label) + " of row " + std::to_string(r) + " outside [0, " +
                               std::to_string(logits.shape[1]) + ") and not -1 (unscored)");
    scored += label >= 0 ? 1 : 0;
  }
  return scored;
}

}  // namespace

void RefKernels::embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& y) {
  if (deferred([=, this] { embedding_forward(tokens, wte, wpe, y); })) return;
  check_embedding("embedding_forward", tokens, wte, wpe, y);
  const std::int64_t seq = tokens.shape[1], channels = y.shape[1];
  for (std::int64_t r = 0; r < y.shape[0]; ++r) {
    const std::int64_t id = token(tokens, r), t = r % seq;
    for (std::int64_t c = 0; c < channels; ++c)
      store(y, at2(y, r, c), load(wte, at2(wte, id, c)) + load(wpe, at2(wpe, t, c)));
  }
}

void RefKernels::embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte, bool accumulate_wte,
                                    const Tensor& dwpe) {
  if (deferred([=, this] { embedding_backward(tokens, dy, dwte, accumulate_wte, dwpe); })) return;
  check_embedding("embedding_backward", tokens, dwte, dwpe, dy);
  const std::int64_t seq = tokens.shape[1], channels = dy.shape[1];
  const std::int64_t vocab = dwte.shape[0], positions = dwpe.shape[0];
  // Rows are summed in increasing order into float64 sums: the same bits whatever the tokens' order.
  std::vector<double> wte_sum(sz(vocab * channels), 0.0), wpe_sum(sz(positions * channels), 0.0);
  if (accumulate_wte)
    for (std::int64_t v = 0; v < vocab; ++v)
      for (std::int64_t c = 0; c < channels; ++c) wte_sum[sz(v * channels + c)] = load(dwte, at2(dwte, v, c));
  for (std::int64_t r = 0; r < dy.shape[0]; ++r) {
    const std::int64_t id = token(tokens, r), t = r % seq;
    for (std::int64_t c = 0; c < channels; ++c) {
      const double g = load(dy, at2(dy, r, c));
      wte_sum[sz(id * channels + c)] += g;
      wpe_sum[sz(t * channels + c)] += g;
    }
  }
  for (std::int64_t v = 0; v < vocab; ++v)
    for (std::int64_t c = 0; c < channels; ++c) store(dwte, at2(dwte, v, c), wte_sum[sz(v * channels + c)]);
  for (std::int64_t p = 0; p < positions; ++p)
    for (std::int64_t c = 0; c < channels; ++c) store(dwpe, at2(dwpe, p, c), wpe_sum[sz(p * channels + c)]);
}

namespace {

// LayerNorm and (mean and beta undefined) RMSNorm over the rows of x.
void norm_forward(const char* kernel, double epsilon, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const bool rms = !mean.defined();
  check_layernorm(kernel, x, y, gamma, rstd);
  if (!(epsilon > 0)) bad_operands(kernel, "epsilon must be > 0");
  const std::int64_t channels = x.shape[1];
  for (std::int64_t r = 0; r < x.shape[0]; ++r) {
    double sum = 0.0;
    for (std::int64_t c = 0; c < channels && !rms; ++c) sum += load(x, at2(x, r, c));
    const double mu = sum / static_cast<double>(channels);
    double squares = 0.0;
    for (std::int64_t c = 0; c < channels; ++c) squares += (load(x, at2(x, r, c)) - mu) * (load(x, at2(x, r, c)) - mu);
    const double inv = 1.0 / std::sqrt(squares / static_cast<double>(channels) + epsilon);
    if (!rms) store(mean, r * mean.strides[0], mu);
    store(rstd, r * rstd.strides[0], inv);
    // y from the statistics as stored, as backward will read them.
    const double mu_s = rms ? 0.0 : load(mean, r * mean.strides[0]), inv_s = load(rstd, r * rstd.strides[0]);
    for (std::int64_t c = 0; c < channels; ++c)
      store(y, at2(y, r, c),
            (load(x, at2(x, r, c)) - mu_s) * inv_s * load(gamma, c * gamma.strides[0]) +
                (rms ? 0.0 : load(beta, c * beta.strides[0])));
  }
}

void norm_backward(const char* kernel, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                   const Tensor& rstd, const Tensor& dx, bool accumulate, const Tensor& dgamma, const Tensor& dbeta) {
  const bool rms = !mean.defined();
  check_layernorm(kernel, x, dy, gamma, rstd);
  const std::int64_t channels = x.shape[1];
  const auto n = static_cast<double>(channels);
  std::vector<double> gamma_sum(sz(channels), 0.0), beta_sum(sz(channels), 0.0), xhat(sz(channels)), g(sz(channels));
  for (std::int64_t r = 0; r < x.shape[0]; ++r) {
    const double mu = rms ? 0.0 : load(mean, r * mean.strides[0]), inv = load(rstd, r * rstd.strides[0]);
    double g_mean = 0.0, gx_mean = 0.0;
    for (std::int64_t c = 0; c < channels; ++c) {
      const double grad = load(dy, at2(dy, r, c));
      xhat[sz(c)] = (load(x, at2(x, r, c)) - mu) * inv;
      g[sz(c)] = grad * load(gamma, c * gamma.strides[0]);
      g_mean += g[sz(c)];
      gx_mean += g[sz(c)] * xhat[sz(c)];
      gamma_sum[sz(c)] += grad * xhat[sz(c)];
      beta_sum[sz(c)] += grad;
    }
    g_mean = rms ? 0.0 : g_mean / n;  // no mean subtracted, so no term through it
    gx_mean /= n;
    for (std::int64_t c = 0; c < channels; ++c) {
      const double v = inv * (g[sz(c)] - g_mean - xhat[sz(c)] * gx_mean);
      store(dx, at2(dx, r, c), accumulate ? load(dx, at2(dx, r, c)) + v : v);
    }
  }
  for (std::int64_t c = 0; c < channels; ++c) {
    store(dgamma, c * dgamma.strides[0], gamma_sum[sz(c)]);
    if (!rms) store(dbeta, c * dbeta.strides[0], beta_sum[sz(c)]);
  }
}

}  // namespace

void RefKernels::layernorm_forward(const LayerNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  if (deferred([=, this] { layernorm_forward(d, x, gamma, beta, y, mean, rstd); })) return;
  if (!mean.defined() || !beta.defined()) bad_operands("layernorm_forward", "needs mean and beta");
  norm_forward("layernorm_forward", d.epsilon, x, gamma, beta, y, mean, rstd);
}

void RefKernels::layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                                    const Tensor& rstd, const Tensor& dx, bool accumulate, const Tensor& dgamma,
                                    const Tensor& dbeta) {
  if (deferred([=, this] { layernorm_backward(x, dy, gamma, mean, rstd, dx, accumulate, dgamma, dbeta); })) return;
  if (!mean.defined() || !dbeta.defined()) bad_operands("layernorm_backward", "needs mean and dbeta");
  norm_backward("layernorm_backward", x, dy, gamma, mean, rstd, dx, accumulate, dgamma, dbeta);
}

void RefKernels::rmsnorm_forward(const LayerNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& y,
                                 const Tensor& rstd) {
  if (deferred([=, this] { rmsnorm_forward(d, x, gamma, y, rstd); })) return;
  norm_forward("rmsnorm_forward", d.epsilon, x, gamma, Tensor{}, y, Tensor{}, rstd);
}

void RefKernels::rmsnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& rstd,
                                  const Tensor& dx, bool accumulate, const Tensor& dgamma) {
  if (deferred([=, this] { rmsnorm_backward(x, dy, gamma, rstd, dx, accumulate, dgamma); })) return;
  norm_backward("rmsnorm_backward", x, dy, gamma, Tensor{}, rstd, dx, accumulate, dgamma, Tensor{});
}

namespace {

// y (+)= x * keep / (1 - p) over the elements, in their logical order.
void dropout(const char* kernel, const DropoutDesc& d, const Tensor& x, const Tensor& y, const Tensor& counter,
             bool accumulate) {
  require_same_flat(kernel, x, y);
  if (!(d.probability >= 0 && d.probability < 1)) bad_operands(kernel, "probability must be in [0, 1)");
  if (counter.dtype != DType::i32 || counter.numel() != 1) bad_operands(kernel, "counter must be i32 [1]");
  const std::uint64_t stream = dropout_stream(d.seed, *counter.as<const std::int32_t>());
  const std::uint32_t threshold = dropout_threshold(d.probability);
  const double scale = 1.0 / (1.0 - d.probability);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double v = dropout_keeps(stream, static_cast<std::uint64_t>(i), threshold) ? load(x, i) * scale : 0.0;
    store(y, i, accumulate ? load(y, i) + v : v);
  }
}

}  // namespace

void RefKernels::dropout_forward(const DropoutDesc& d, const Tensor& x, const Tensor& y, const Tensor& counter) {
  if (deferred([=, this] { dropout_forward(d, x, y, counter); })) return;
  dropout("dropout_forward", d, x, y, counter, false);
}

void RefKernels::dropout_backward(const DropoutDesc& d, const Tensor& dy, const Tensor& dx, const Tensor& counter,
                                  bool accumulate) {
  if (deferred([=, this] { dropout_backward(d, dy, dx, counter, accumulate); })) return;
  dropout("dropout_backward", d, dy, dx, counter, accumulate);
}

void RefKernels::gelu_forward(const Tensor& x, const Tensor& y) {
  if (deferred([=, this] { gelu_forward(x, y); })) return;
  require_same_flat("gelu_forward", x, y);
  for (std::int64_t i = 0; i < x.numel(); ++i) store(y, i, gelu(load(x, i)));
}

void RefKernels::gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate) {
  if (deferred([=, this] { gelu_backward(x, dy, dx, accumulate); })) return;
  require_same_flat("gelu_backward", x, dy);
  require_same_flat("gelu_backward", x, dx);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double v = load(dy, i) * gelu_derivative(load(x, i));
    store(dx, i, accumulate ? load(dx, i) + v : v);
  }
}

void RefKernels::attention_forward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& o, const Tensor& stats) {
  if (deferred([=, this] { attention_forward(d, q, k, v, o, stats); })) return;
  const AttentionShape s = check_attention("attention_forward", d, q, k, v, o, stats);
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads; ++h)
      for (std::int64_t i = 0; i < s.queries; ++i) {
        const std::int64_t end = visible_keys(d, s, b, i);
        const std::vector<double> row = scores(s, q, k, b, h, i, end);
        const double top = *std::max_element(row.begin(), row.end());
        double sum = 0.0;
        for (const double x : row) sum += std::exp(x - top);
        const double lse = top + std::log(sum);
        store(stats, at3(stats, b, h, i), lse);
        for (std::int64_t c = 0; c < s.dim; ++c) {
          double acc = 0.0;
          for (std::int64_t j = 0; j < end; ++j) acc += std::exp(row[sz(j)] - lse) * load(v, at4(v, b, h, j, c));
          store(o, at4(o, b, h, i, c), acc);
        }
      }
}

void RefKernels::attention_backward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& o, const Tensor& dout, const Tensor& stats, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv) {
  if (deferred([=, this] { attention_backward(d, q, k, v, o, dout, stats, dq, dk, dv); })) return;
  const AttentionShape s = check_attention("attention_backward", d, q, k, v, o, stats);
  check_attention("attention_backward", d, dq, dk, dv, dout, stats);
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads; ++h) {
      std::vector<double> dk_sum(sz(s.keys * s.dim), 0.0), dv_sum(sz(s.keys * s.dim), 0.0);
      for (std::int64_t i = 0; i < s.queries; ++i) {
        const std::int64_t end = visible_keys(d, s, b, i);
        std::vector<double> p = scores(s, q, k, b, h, i, end), ds(sz(end));
        const double lse = load(stats, at3(stats, b, h, i));
        double row_dot = 0.0;  // sum_j p_ij dP_ij, which equals do_i . o_i
        for (std::int64_t j = 0; j < end; ++j) {
          p[sz(j)] = std::exp(p[sz(j)] - lse);
          double dp = 0.0;
          for (std::int64_t c = 0; c < s.dim; ++c) dp += load(dout, at4(dout, b, h, i, c)) * load(v, at4(v, b, h, j, c));
          ds[sz(j)] = dp;
          row_dot += p[sz(j)] * dp;
        }
        for (std::int64_t j = 0; j < end; ++j) ds[sz(j)] = p[sz(j)] * (ds[sz(j)] - row_dot);
        for (std::int64_t c = 0; c < s.dim; ++c) {
          double acc = 0.0;
          for (std::int64_t j = 0; j < end; ++j) acc += ds[sz(j)] * load(k, at4(k, b, h, j, c));
          store(dq, at4(dq, b, h, i, c), acc * s.scale);
        }
        for (std::int64_t j = 0; j < end; ++j)
          for (std::int64_t c = 0; c < s.dim; ++c) {
            dk_sum[sz(j * s.dim + c)] += ds[sz(j)] * s.scale * load(q, at4(q, b, h, i, c));
            dv_sum[sz(j * s.dim + c)] += p[sz(j)] * load(dout, at4(dout, b, h, i, c));
          }
      }
      for (std::int64_t j = 0; j < s.keys; ++j)
        for (std::int64_t c = 0; c < s.dim; ++c) {
          store(dk, at4(dk, b, h, j, c), dk_sum[sz(j * s.dim + c)]);
          store(dv, at4(dv, b, h, j, c), dv_sum[sz(j * s.dim + c)]);
        }
    }
}

void RefKernels::sum_squares(const std::vector<Tensor>& tensors, const Tensor& out) {
  if (deferred([=, this] { sum_squares(tensors, out); })) return;
  double total = 0.0;
  for (const Tensor& t : tensors) {
    if (!t.is_contiguous()) bad_operands("sum_squares", "tensors must be contiguous, got " + t.to_string());
    for (std::int64_t i = 0; i < t.numel(); ++i) total += load(t, i) * load(t, i);
  }
  store(out, 0, total);
}

void RefKernels::adamw_update(const AdamWStep& s, const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v) {
  if (deferred([=, this] { adamw_update(s, w, g, m, v); })) return;
  require_same_flat("adamw_update", w, g);
  require_same_flat("adamw_update", w, m);
  require_same_flat("adamw_update", w, v);
  // The step number as the device holds it now (a replay of a captured step reads it here).
  const std::int64_t step = step_number("adamw_update", s);
  if (s.skip_if.defined() && *s.skip_if.as<const std::int32_t>() != 0) return;
  double clip = 1.0;
  if (s.max_grad_norm > 0 && s.grad_norm_squared.defined()) {
    const double norm = std::sqrt(load(s.grad_norm_squared, 0));
    if (norm > s.max_grad_norm) clip = s.max_grad_norm / norm;
  }
  const double beta1_correction = 1.0 - std::pow(s.beta1, static_cast<double>(step));
  const double beta2_correction = 1.0 - std::pow(s.beta2, static_cast<double>(step));
  for (std::int64_t i = 0; i < w.numel(); ++i) {
    const double grad = load(g, i) * clip, weight = load(w, i);
    const double mom = s.beta1 * load(m, i) + (1.0 - s.beta1) * grad;
    const double var = s.beta2 * load(v, i) + (1.0 - s.beta2) * grad * grad;
    store(m, i, mom);
    store(v, i, var);
    const double update = mom / beta1_correction / (std::sqrt(var / beta2_correction) + s.epsilon);
    store(w, i, weight - s.learning_rate * (update + s.weight_decay * weight));
  }
}

void RefKernels::count_step(const Tensor& counter, const Tensor& skip_if) {
  if (deferred([=, this] { count_step(counter, skip_if); })) return;
  check_counter("count_step", "counter", counter);
  if (skip_if.defined()) {
    check_counter("count_step", "skip_if", skip_if);
    if (*skip_if.as<const std::int32_t>() != 0) return;
  }
  ++*counter.as<std::int32_t>();
}

void RefKernels::cross_entropy_fused(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                                     const Tensor& dlogits, const Tensor& seed) {
  if (deferred([=, this] { cross_entropy_fused(logits, labels, loss, dlogits, seed); })) return;
  const std::int64_t scored = check_cross_entropy(logits, labels, loss, dlogits, seed);
  const std::int64_t rows = logits.shape[0], vocab = logits.shape[1];
  const double scale = (seed.defined() ? load(seed, 0) : 1.0) / static_cast<double>(std::max<std::int64_t>(scored, 1));
  std::vector<double> row(sz(vocab));
  double total = 0.0;  // rows in increasing order
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t label = labels.as<const std::int32_t>()[r * labels.strides[0]];
    // The whole row is read before dlogits (which may be logits itself) is written.
    for (std::int64_t c = 0; c < vocab; ++c) row[sz(c)] = load(logits, at2(logits, r, c));
    const double top = *std::max_element(row.begin(), row.end());
    double sum = 0.0;
    for (const double x : row) sum += std::exp(x - top);
    const double lse = top + std::log(sum);
    if (label >= 0) total += lse - row[sz(label)];
    if (!dlogits.defined()) continue;
    for (std::int64_t c = 0; c < vocab; ++c) {
      const double grad = label < 0 ? 0.0 : scale * (std::exp(row[sz(c)] - lse) - (c == label ? 1.0 : 0.0));
      store(dlogits, at2(dlogits, r, c), grad);
    }
  }
  store(loss, 0, scored > 0 ? total / static_cast<double>(scored) : 0.0);
}

}  // namespace ab::nn::ref
