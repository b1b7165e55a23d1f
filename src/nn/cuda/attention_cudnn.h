// cuDNN's fused flash attention (its SDPA engines, what llm.c runs on Hopper) for one attention
// shape and pass, built on the backend API (cudnn_graph.h) as the composite operation graph those
// engines recognise: Q K^T, scale, causal mask, softmax with its log-sum-exp saved, P V forward;
// the backward rebuilds P from that statistic and forms dV, dK and dQ (dQ summed in f32 by
// atomics: not deterministic). The attention family chooses it per shape where it times faster
// than its own kernels (attention_engine.h).
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "nn/cuda/common.h"

namespace ab::nn::cuda {

// Strides in elements of a [B, H, T, D] operand.
using HeadStrides = std::array<std::int64_t, 4>;

struct SdpaShape {
  bool backward = false;
  DType dtype = DType::bf16;  // f16 or bf16
  std::int64_t batch = 0, heads = 0, queries = 0, keys = 0, dim = 0;
  bool causal = false;
  float scale = 0.0f;
  HeadStrides q{}, k{}, v{}, o{};
  HeadStrides dout{}, dq{}, dk{}, dv{};  // backward only
  auto operator<=>(const SdpaShape&) const = default;
  std::string to_string() const;
};

// Where cuDNN's fused attention cannot take the shape, why (empty where it may).
std::string sdpa_refusal(const SdpaShape& s);

struct SdpaOperands {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void* o = nullptr;       // forward's output, backward's input
  float* stats = nullptr;  // [B, H, Tq] log-sum-exp: forward's output, backward's input
  const void* dout = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

class SdpaPlan {
 public:
  // Builds the graph and every execution plan cuDNN's heuristics offer for it; throws Unsupported
  // where cuDNN has none. `handle` is bound to the stream the plan runs on.
  SdpaPlan(const SdpaShape& shape, cudnnHandle_t handle);
  ~SdpaPlan();
  SdpaPlan(const SdpaPlan&) = delete;
  SdpaPlan& operator=(const SdpaPlan&) = delete;

  int candidates() const;
  const std::string& candidate_name(int i) const;
  // Queues candidate `i` (the chosen one where -1) on `ops`; false where cuDNN refused the launch.
  bool run(const SdpaOperands& ops, int i = -1) const;
  void choose(int i);
  const std::string& label() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ab::nn::cuda
