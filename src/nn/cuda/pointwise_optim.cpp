// The pointwise family's optimizer steps and mixed precision: SGD (one parameter, or all of them
// fused: Kernels::sgd_update_many), LARS, casts and fp16 loss scaling, on cuda_pointwise's kernels.
#include <map>
#include <utility>
#include <vector>

#include "nn/cuda/pointwise.h"
#include "nn/cuda/pointwise_engine.h"

namespace ab::nn::cuda {

void PointwiseEngine::sgd_update(const SgdStep& s, const Tensor& w, const Tensor& g, const Tensor& v) {
  require_flat("sgd_update", w, g);
  require_flat("sgd_update", w, v);
  cuda_pointwise::sgd_update(ctx_.stream, w.dtype, w.data, g.data, v.data, w.numel(), s, skip_flag(s.skip_if));
}

void PointwiseEngine::sgd_update_many(const SgdStep& s, const std::vector<SgdTensors>& params) {
  // f32 masters fused, in one group per copy dtype and partner presence; anything else through the
  // per-parameter default.
  std::map<std::pair<DType, bool>, std::vector<cuda_pointwise::SgdSegment>> fused;
  std::vector<SgdTensors> rest;
  for (const SgdTensors& p : params) {
    require_flat("sgd_update_many", p.w, p.g);
    require_flat("sgd_update_many", p.w, p.v);
    const bool copy_fits = !p.copy.defined() || ((p.copy.dtype == DType::f16 || p.copy.dtype == DType::bf16) &&
                                                 p.copy.shape == p.w.shape && p.copy.strides == p.w.strides);
    if (p.g_partner.defined()) require_flat("sgd_update_many (partner gradient)", p.g, p.g_partner);
    if (p.w.dtype != DType::f32 || !copy_fits) {
      rest.push_back(p);
      continue;
    }
    if (p.copy.defined()) ctx_.written(p.copy.data);
    fused[{p.copy.defined() ? p.copy.dtype : DType::f32, p.g_partner.defined()}].push_back(
        {p.w.as<float>(), p.g.as<const float>(), p.v.as<float>(), p.copy.data, p.w.numel(), p.weight_decay,
         p.g_partner.defined() ? p.g_partner.as<const float>() : nullptr});
  }
  for (const auto& [key, segments] : fused)
    cuda_pointwise::sgd_update_many(ctx_.stream, segments, key.first, s, skip_flag(s.skip_if));
  if (!rest.empty()) ctx_.kernels.Kernels::sgd_update_many(s, rest);
}

void PointwiseEngine::lars_update(const LarsStep& s, const Tensor& w, const Tensor& g, const Tensor& v) {
  require_flat("lars_update", w, g);
  require_flat("lars_update", w, v);
  cuda_pointwise::lars_update(ctx_.stream, w.dtype, w.data, g.data, v.data, w.numel(), s, skip_flag(s.skip_if),
                              lars_scratch_.as<float>());
}

void PointwiseEngine::cast(const Tensor& src, const Tensor& dst) {
  ctx_.written(dst.data);
  if (!(src.shape == dst.shape) || !(src.strides == dst.strides) || !src.is_contiguous())
    throw Unsupported("cuda cast: operands must be contiguous with one shape and layout (" + src.to_string() + " vs " +
                      dst.to_string() + ")");
  cuda_pointwise::cast(ctx_.stream, src.dtype, src.data, dst.dtype, dst.data, src.numel());
}

void PointwiseEngine::unscale_and_check(const Tensor& g, const Tensor& scale, const Tensor& found_nonfinite) {
  require_scalar("unscale_and_check", "scale", scale, DType::f32);
  require_scalar("unscale_and_check", "found_nonfinite", found_nonfinite, DType::i32);
  if (!g.is_contiguous()) throw Unsupported("cuda unscale_and_check: gradient " + g.to_string() + " is not contiguous");
  cuda_pointwise::unscale_and_check(ctx_.stream, g.dtype, g.data, g.numel(), scale.as<const float>(),
                                    found_nonfinite.as<std::int32_t>());
}

void PointwiseEngine::update_loss_scale(const LossScaleRule& rule, const Tensor& scale, const Tensor& good_steps,
                                        const Tensor& found_nonfinite) {
  require_scalar("update_loss_scale", "scale", scale, DType::f32);
  require_scalar("update_loss_scale", "good_steps", good_steps, DType::i32);
  require_scalar("update_loss_scale", "found_nonfinite", found_nonfinite, DType::i32);
  cuda_pointwise::update_loss_scale(ctx_.stream, rule, scale.as<float>(), good_steps.as<std::int32_t>(),
                                    found_nonfinite.as<std::int32_t>());
}

}  // namespace ab::nn::cuda
