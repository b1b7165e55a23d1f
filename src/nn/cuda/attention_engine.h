// The attention family: scaled dot-product attention forward and backward (nn::Kernels'
// attention_forward/backward) on the project's own kernels (attention.h: fused flash-attention
// kernels for f16/bf16 at head dims 64 and 128, plain ones for the rest) or on cuDNN's fused
// attention (attention_cudnn.h), chosen per shape and pass by timing both at the shape's first
// eager call (the backward keeps the own deterministic kernel in deterministic mode). Owns the
// backward pass's scratch (row dots, the f32 dQ accumulator of the atomic path) and cuDNN's plans,
// allocated before any capture so that no captured call allocates.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "backend/cuda/check.h"
#include "nn/cuda/attention_cudnn.h"
#include "nn/cuda/attention_variants.h"
#include "nn/cuda/context.h"
#include "nn/kernels.h"

namespace ab::nn::cuda {

class AttentionEngine {
 public:
  // Query rows (B * H * Tq over one call) the backward scratch holds: 4M (GPT-2 124M at B=16,
  // T=1024 needs 196,608; 16 MiB of device memory).
  static constexpr std::int64_t kScratchRows = std::int64_t{1} << 22;
  // Elements (B * H * Tq * D) the atomic dQ's f32 accumulator holds: 32M (128 MiB; GPT-2 124M
  // at B=16, T=1024 needs 12.6M). Outside deterministic mode, a larger problem falls back to the
  // deterministic dQ pass.
  static constexpr std::int64_t kDqAccumElements = std::int64_t{1} << 25;

  explicit AttentionEngine(EngineContext& ctx);
  AttentionEngine(const AttentionEngine&) = delete;
  AttentionEngine& operator=(const AttentionEngine&) = delete;

  void attention_forward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                         const Tensor& stats);
  void attention_backward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                          const Tensor& dout, const Tensor& stats, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv);

 private:
  // cuDNN's plan for `shape` where it was chosen (null: the own kernels run `own`), deciding at the
  // shape's first call outside a capture by timing `own` against each of cuDNN's plans on the call's
  // operands (the caller then runs the winner, so the outputs are the winner's).
  const SdpaPlan* cudnn_plan(const SdpaShape& shape, const SdpaOperands& x, const std::function<void()>& own);

  EngineContext& ctx_;
  // Per implementation asked for (attention_variants.h) and shape; null: the own kernels were
  // faster, or cuDNN could not build the graph.
  std::map<std::pair<cuda_attention::Implementation, SdpaShape>, std::unique_ptr<SdpaPlan>> cudnn_;
  backend::cuda::DeviceBuffer row_dots_;  // Di = rowsum(dO * O), f32 [kScratchRows]
  backend::cuda::DeviceBuffer dq_accum_;  // f32 [kDqAccumElements]
};

}  // namespace ab::nn::cuda
