// The attention family: scaled dot-product attention forward and backward (nn::Kernels'
// attention_forward/backward) on the project's own kernels (attention.h: fused flash-attention
// kernels for f16/bf16 at head dims 64 and 128, plain ones for the rest). Owns the backward
// pass's scratch (row dots, the f32 dQ accumulator of the atomic path), allocated once here so
// that no call allocates (graphs capture them).
#pragma once

#include <cstdint>

#include "backend/cuda/check.h"
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
  EngineContext& ctx_;
  backend::cuda::DeviceBuffer row_dots_;  // Di = rowsum(dO * O), f32 [kScratchRows]
  backend::cuda::DeviceBuffer dq_accum_;  // f32 [kDqAccumElements]
};

}  // namespace ab::nn::cuda
