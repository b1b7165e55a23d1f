// The transformer family: token + position embedding, LayerNorm, GELU, the global gradient norm,
// AdamW over many tensors with its device step counter, and the classifier's fused cross-entropy,
// on the project's own kernels (transformer.h). Checks operands (Unsupported with the reason) and
// owns one fixed scratch block for the reductions, allocated at construction, so a step (or a
// capture) never allocates. The entry points are nn::Kernels'. (Attention and the linear layers
// are other families'.)
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/cuda/check.h"
#include "nn/cuda/context.h"
#include "nn/kernels.h"

namespace ab::nn::cuda {

class TransformerEngine {
 public:
  // The reductions' scratch: the embedding backward's sort and partials at GPT-2 shapes (16384
  // rows of 768) take about 5 MiB, the loss 64 KiB per 16384 rows.
  static constexpr std::int64_t kScratchBytes = std::int64_t{64} << 20;

  explicit TransformerEngine(EngineContext& ctx);
  TransformerEngine(const TransformerEngine&) = delete;
  TransformerEngine& operator=(const TransformerEngine&) = delete;

  void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& y);
  void embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte, bool accumulate_wte,
                          const Tensor& dwpe);
  // mean and beta (dbeta) undefined: RMSNorm.
  void layernorm_forward(const LayerNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                         const Tensor& y, const Tensor& mean, const Tensor& rstd);
  void layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dx, bool accumulate, const Tensor& dgamma,
                          const Tensor& dbeta);
  void dropout(const char* kernel, const DropoutDesc& d, const Tensor& x, const Tensor& y, const Tensor& counter,
               bool accumulate);
  void gelu_forward(const Tensor& x, const Tensor& y);
  void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate);
  void sum_squares(const std::vector<Tensor>& tensors, const Tensor& out);
  // The contiguous f16 -> f32 and bf16 -> f32 pairs (and f32 -> f32 ones where `mode` accumulates
  // or scales) in one launch per 256 (widen_many); with the plain mode any other pair through
  // `cast_one` (the pointwise family's cast), else Unsupported.
  void cast_many(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts, const CastManyMode& mode,
                 const std::function<void(const Tensor&, const Tensor&)>& cast_one);
  void adamw_update(const AdamWStep& s, const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v);
  void adamw_update_many(const AdamWStep& s, const std::vector<AdamWTensors>& params);
  void count_step(const Tensor& counter, const Tensor& skip_if);
  void cross_entropy_fused(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                           const Tensor& seed);

 private:
  // Throws Unsupported naming the limit where `bytes` exceed the scratch block.
  void need_scratch(const char* kernel, std::int64_t bytes) const;

  EngineContext& ctx_;
  backend::cuda::DeviceBuffer scratch_;
};

}  // namespace ab::nn::cuda
