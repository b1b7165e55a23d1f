// The transformer family's entry points (transformer_engine.h): operand checks, then the launchers
// of transformer.h on the engine's stream.
#include "nn/cuda/transformer_engine.h"

#include <map>
#include <string>

#include "nn/cuda/common.h"
#include "nn/cuda/transformer.h"
#include "nn/dropout_mask.h"

namespace ab::nn::cuda {
namespace {

namespace tx = cuda_transformer;

[[noreturn]] void refuse(const char* kernel, const std::string& why) {
  throw Unsupported(std::string("cuda ") + kernel + ": " + why);
}

bool is_activation(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

// A contiguous [rows, cols] tensor of an activation dtype.
bool is_matrix(const Tensor& t) { return t.shape.rank() == 2 && t.is_contiguous() && is_activation(t.dtype); }
// A contiguous f32 [n] vector (LayerNorm's statistics).
bool is_f32_vector(const Tensor& t, std::int64_t n) {
  return t.dtype == DType::f32 && t.shape.rank() == 1 && t.shape[0] == n && t.is_contiguous();
}
// A contiguous [C] parameter of f32 or the activations' dtype.
bool is_param(const Tensor& t, std::int64_t channels, DType activation) {
  return t.shape.rank() == 1 && t.shape[0] == channels && t.is_contiguous() &&
         (t.dtype == DType::f32 || t.dtype == activation);
}
// Rows `stride[0] >= cols` apart, unit column stride: a padded vocabulary's logits.
bool is_padded_matrix(const Tensor& t) {
  return t.shape.rank() == 2 && t.strides[1] == 1 && t.strides[0] >= t.shape[1] && is_activation(t.dtype);
}

void check_embedding(const char* kernel, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                     const Tensor& rows) {
  if (tokens.dtype != DType::i32 || tokens.shape.rank() != 2 || !tokens.is_contiguous())
    refuse(kernel, "tokens must be contiguous i32 [B, T], got " + tokens.to_string());
  if (!is_matrix(wte) || !is_matrix(wpe) || !is_matrix(rows) || wte.shape[1] != rows.shape[1] ||
      wpe.shape[1] != rows.shape[1] || rows.shape[0] != tokens.numel() || wte.dtype != wpe.dtype)
    refuse(kernel, "needs contiguous wte [V, C], wpe [P, C] of one dtype and rows [B*T, C], got " + wte.to_string() +
                       ", " + wpe.to_string() + ", " + rows.to_string() + " for tokens " + tokens.to_string());
  if (tokens.shape[1] > wpe.shape[0])
    refuse(kernel, "a sequence of " + std::to_string(tokens.shape[1]) + " tokens is longer than the model's " +
                       std::to_string(wpe.shape[0]) + " positions");
}

const std::int32_t* counter_of(const char* kernel, const char* what, const Tensor& t) {
  if (!t.defined()) return nullptr;
  require_scalar(kernel, what, t, DType::i32);
  return t.as<const std::int32_t>();
}

}  // namespace

TransformerEngine::TransformerEngine(EngineContext& ctx)
    : ctx_(ctx), scratch_(kScratchBytes, ctx.label + " transformer scratch") {}

void TransformerEngine::need_scratch(const char* kernel, std::int64_t bytes) const {
  if (bytes > scratch_.bytes())
    refuse(kernel, "needs " + std::to_string(bytes) + " bytes of scratch, above the engine's fixed " +
                       std::to_string(scratch_.bytes()) + " (TransformerEngine::kScratchBytes)");
}

void TransformerEngine::embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& y) {
  check_embedding("embedding_forward", tokens, wte, wpe, y);
  if (y.dtype != wte.dtype) refuse("embedding_forward", "y must have the tables' dtype, got " + y.to_string());
  tx::embedding_forward(ctx_.stream, y.dtype, tokens.as<const std::int32_t>(), wte.data, wpe.data, y.data, y.shape[0],
                        tokens.shape[1], y.shape[1], wte.shape[0]);
}

void TransformerEngine::embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte,
                                           bool accumulate_wte, const Tensor& dwpe) {
  check_embedding("embedding_backward", tokens, dwte, dwpe, dy);
  const std::int64_t need = tx::embedding_backward_scratch_bytes(dy.shape[0], dy.shape[1], dwte.shape[0]);
  need_scratch("embedding_backward", need);
  tx::embedding_backward(ctx_.stream, dy.dtype, dy.data, dwte.dtype, tokens.as<const std::int32_t>(), dwte.data,
                         accumulate_wte, dwpe.data, dy.shape[0], tokens.shape[1], dy.shape[1], dwte.shape[0],
                         dwpe.shape[0], scratch_.get(), scratch_.bytes());
}

void TransformerEngine::layernorm_forward(const LayerNormDesc& d, const Tensor& x, const Tensor& gamma,
                                          const Tensor& beta, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const bool rms = !mean.defined() && !beta.defined();
  if (!is_matrix(x) || !(y.shape == x.shape) || y.dtype != x.dtype || !y.is_contiguous() ||
      !is_param(gamma, x.shape[1], x.dtype) ||
      (!rms &&
       (!is_param(beta, x.shape[1], x.dtype) || beta.dtype != gamma.dtype || !is_f32_vector(mean, x.shape[0]))) ||
      !is_f32_vector(rstd, x.shape[0]))
    refuse(rms ? "rmsnorm_forward" : "layernorm_forward",
           "needs contiguous x, y [rows, C] of one dtype, gamma and beta [C] of f32 or x's "
           "dtype, f32 mean and rstd [rows]; got " +
               x.to_string() + ", " + y.to_string() + ", " + gamma.to_string() + ", " + beta.to_string() + ", " +
               mean.to_string() + ", " + rstd.to_string());
  if (!(d.epsilon > 0)) throw Error("cuda layernorm_forward: epsilon must be > 0");
  tx::layernorm_forward(ctx_.stream, x.dtype, gamma.dtype, x.data, gamma.data, rms ? nullptr : beta.data, y.data,
                        rms ? nullptr : mean.as<float>(), rstd.as<float>(), x.shape[0], x.shape[1], d.epsilon);
}

void TransformerEngine::layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                                           const Tensor& rstd, const Tensor& dx, bool accumulate, const Tensor& dgamma,
                                           const Tensor& dbeta) {
  const auto like_x = [&](const Tensor& t) { return t.shape == x.shape && t.dtype == x.dtype && t.is_contiguous(); };
  const bool rms = !mean.defined() && !dbeta.defined();
  if (!is_matrix(x) || !like_x(dy) || !like_x(dx) || !is_param(gamma, x.shape[1], x.dtype) ||
      !is_param(dgamma, x.shape[1], x.dtype) || dgamma.dtype != gamma.dtype ||
      (!rms &&
       (!is_param(dbeta, x.shape[1], x.dtype) || dbeta.dtype != gamma.dtype || !is_f32_vector(mean, x.shape[0]))) ||
      !is_f32_vector(rstd, x.shape[0]))
    refuse(rms ? "rmsnorm_backward" : "layernorm_backward",
           "needs contiguous x, dy, dx [rows, C] of one dtype, gamma, dgamma, dbeta [C] of "
           "f32 or x's dtype, f32 mean and rstd [rows]; got " +
               x.to_string() + ", " + dy.to_string() + ", " + dx.to_string() + ", " + gamma.to_string() + ", " +
               dgamma.to_string() + ", " + mean.to_string());
  if (x.shape[1] > tx::layernorm_max_channels())
    refuse("layernorm_backward", "C = " + std::to_string(x.shape[1]) + " is above the " +
                                     std::to_string(tx::layernorm_max_channels()) + " it takes");
  need_scratch("layernorm_backward", tx::layernorm_backward_scratch_bytes(x.shape[0], x.shape[1]));
  tx::layernorm_backward(ctx_.stream, x.dtype, gamma.dtype, x.data, dy.data, gamma.data,
                         rms ? nullptr : mean.as<const float>(), rstd.as<const float>(), dx.data, accumulate,
                         dgamma.data, rms ? nullptr : dbeta.data, x.shape[0], x.shape[1], scratch_.as<float>());
}

void TransformerEngine::dropout(const char* kernel, const DropoutDesc& d, const Tensor& x, const Tensor& y,
                                const Tensor& counter, bool accumulate) {
  require_flat(kernel, x, y);
  if (!(d.probability >= 0 && d.probability < 1))
    throw Error(std::string("cuda ") + kernel + ": probability must be in [0, 1), got " +
                std::to_string(d.probability));
  if (counter.dtype != DType::i32 || counter.numel() != 1)
    refuse(kernel, "the counter must be i32 [1], got " + counter.to_string());
  tx::dropout(ctx_.stream, x.dtype, x.data, y.data, x.numel(), d.seed, counter.as<const std::int32_t>(),
              dropout_threshold(d.probability), static_cast<float>(1.0 / (1.0 - d.probability)), accumulate);
}

void TransformerEngine::gelu_forward(const Tensor& x, const Tensor& y) {
  require_flat("gelu_forward", x, y);
  tx::gelu_forward(ctx_.stream, x.dtype, x.data, y.data, x.numel());
}

void TransformerEngine::gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate) {
  require_flat("gelu_backward", x, dy);
  require_flat("gelu_backward", x, dx);
  tx::gelu_backward(ctx_.stream, x.dtype, x.data, dy.data, dx.data, x.numel(), accumulate);
}

void TransformerEngine::sum_squares(const std::vector<Tensor>& tensors, const Tensor& out) {
  require_scalar("sum_squares", "out", out, DType::f32);
  std::vector<tx::SquaresTensor> list;
  list.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    if (!t.is_contiguous() || !is_activation(t.dtype))
      refuse("sum_squares", "tensors must be contiguous f32, f16 or bf16, got " + t.to_string());
    list.push_back({t.data, t.numel(), t.dtype});
  }
  need_scratch("sum_squares", tx::sum_squares_scratch_bytes(static_cast<std::int64_t>(list.size())));
  tx::sum_squares(ctx_.stream, list, out.as<float>(), scratch_.as<float>());
}

void TransformerEngine::cast_many(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts,
                                  const CastManyMode& mode,
                                  const std::function<void(const Tensor&, const Tensor&)>& cast_one) {
  if (srcs.size() != dsts.size())
    throw Error("cuda cast_many: " + std::to_string(srcs.size()) + " sources for " + std::to_string(dsts.size()) +
                " destinations");
  std::vector<tx::WidenTensor> bf16, f16, f32;
  for (std::size_t i = 0; i < srcs.size(); ++i) {
    const Tensor &s = srcs[i], &d = dsts[i];
    const bool narrow = s.dtype == DType::bf16 || s.dtype == DType::f16;
    const bool widen = (narrow || (s.dtype == DType::f32 && !mode.plain())) && d.dtype == DType::f32 &&
                       s.is_contiguous() && d.is_contiguous() && s.numel() == d.numel() && s.layout == d.layout;
    if (!widen) {
      if (!mode.plain())
        throw Unsupported(
            "cuda cast_many: accumulating or scaling takes contiguous f32, f16 or bf16 sources into "
            "f32 of as many elements, got " +
            s.to_string() + " into " + d.to_string());
      cast_one(s, d);
      continue;
    }
    (s.dtype == DType::bf16 ? bf16 : s.dtype == DType::f16 ? f16 : f32).push_back({s.data, d.as<float>(), s.numel()});
  }
  const tx::WidenMode wide{.accumulate = mode.accumulate, .scale = static_cast<float>(mode.scale)};
  if (!bf16.empty()) tx::widen_many(ctx_.stream, DType::bf16, bf16, wide);
  if (!f16.empty()) tx::widen_many(ctx_.stream, DType::f16, f16, wide);
  if (!f32.empty()) tx::widen_many(ctx_.stream, DType::f32, f32, wide);
}

void TransformerEngine::adamw_update(const AdamWStep& s, const Tensor& w, const Tensor& g, const Tensor& m,
                                     const Tensor& v) {
  adamw_update_many(s,
                    {AdamWTensors{.w = w, .g = g, .m = m, .v = v, .copy = Tensor{}, .weight_decay = s.weight_decay}});
}

void TransformerEngine::adamw_update_many(const AdamWStep& s, const std::vector<AdamWTensors>& params) {
  if (!s.step_count.defined() && s.step < 1)
    throw Error("cuda adamw_update: step counts from 1, got " + std::to_string(s.step));
  if (s.grad_norm_squared.defined())
    require_scalar("adamw_update", "grad_norm_squared", s.grad_norm_squared, DType::f32);
  const tx::AdamWScalars scalars{s.learning_rate,
                                 s.beta1,
                                 s.beta2,
                                 s.epsilon,
                                 s.max_grad_norm,
                                 s.step,
                                 counter_of("adamw_update", "step_count", s.step_count),
                                 s.grad_norm_squared.defined() ? s.grad_norm_squared.as<const float>() : nullptr,
                                 skip_flag(s.skip_if)};
  // One launch group per copy dtype (f32: no copy).
  std::map<DType, std::vector<tx::AdamWParam>> groups;
  for (const AdamWTensors& p : params) {
    require_flat("adamw_update", p.w, p.g);
    require_flat("adamw_update", p.w, p.m);
    require_flat("adamw_update", p.w, p.v);
    if (p.w.dtype != DType::f32)
      refuse("adamw_update", "masters, gradients and moments must be f32, got " + p.w.to_string());
    if (p.copy.defined()) {
      if ((p.copy.dtype != DType::f16 && p.copy.dtype != DType::bf16) || !(p.copy.shape == p.w.shape) ||
          !p.copy.is_contiguous())
        refuse("adamw_update_many", "a copy must be a contiguous f16 or bf16 tensor of its master's shape, got " +
                                        p.copy.to_string() + " for " + p.w.to_string());
      ctx_.written(p.copy.data);
    }
    groups[p.copy.defined() ? p.copy.dtype : DType::f32].push_back({p.w.as<float>(), p.g.as<const float>(),
                                                                    p.m.as<float>(), p.v.as<float>(), p.copy.data,
                                                                    p.w.numel(), p.weight_decay});
  }
  for (const auto& [copy_t, group] : groups) tx::adamw_update_many(ctx_.stream, group, copy_t, scalars);
}

void TransformerEngine::count_step(const Tensor& counter, const Tensor& skip_if) {
  require_scalar("count_step", "counter", counter, DType::i32);
  tx::count_step(ctx_.stream, counter.as<std::int32_t>(), counter_of("count_step", "skip_if", skip_if));
}

void TransformerEngine::cross_entropy_fused(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                                            const Tensor& dlogits, const Tensor& seed) {
  const std::int64_t rows = logits.shape.rank() == 2 ? logits.shape[0] : -1;
  if (!is_padded_matrix(logits) || labels.dtype != DType::i32 || labels.shape.rank() != 1 || labels.shape[0] != rows ||
      !labels.is_contiguous() ||
      (dlogits.defined() &&
       (!is_padded_matrix(dlogits) || !(dlogits.shape == logits.shape) || dlogits.dtype != logits.dtype)))
    refuse("cross_entropy_fused",
           "needs logits [N, V] (rows may be padded), i32 labels [N] and dlogits like logits; "
           "got " +
               logits.to_string() + ", " + labels.to_string() + (dlogits.defined() ? ", " + dlogits.to_string() : ""));
  require_scalar("cross_entropy_fused", "loss", loss, DType::f32);
  if (seed.defined()) require_scalar("cross_entropy_fused", "seed", seed, DType::f32);
  need_scratch("cross_entropy_fused", tx::cross_entropy_scratch_bytes(rows));
  tx::cross_entropy_fused(ctx_.stream, logits.dtype, logits.data, logits.strides[0], labels.as<const std::int32_t>(),
                          loss.as<float>(), dlogits.defined() ? dlogits.data : nullptr,
                          dlogits.defined() ? dlogits.strides[0] : 0, seed.defined() ? seed.as<const float>() : nullptr,
                          rows, logits.shape[1], scratch_.get());
}

}  // namespace ab::nn::cuda
