// The linear family: y = x w^T (+ bias) and its gradients through cuBLASLt (linear.cpp, on the
// foundation's plans, backend/cuda/lt_plan.h), one heuristic choice per GEMM shape, cached. Owns
// the cuBLASLt handle and workspace and the ones vectors the bias gradient's reduction GEMM reads.
// The entry points are nn::Kernels'.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "backend/cuda/check.h"
#include "backend/cuda/lt_plan.h"
#include "nn/cuda/common.h"
#include "nn/cuda/context.h"

namespace ab::nn::cuda {

// A column-major D[m, n] = op(A) op(B) (+ bias over rows) with its heuristic's first algorithm.
struct LtPlan {
  backend::cuda::LtMatmulPtr op;
  backend::cuda::LtLayoutPtr a, b, c;
  cublasLtMatmulAlgo_t algo{};
  std::string label;
};

// Column-major GEMM shape for cuBLASLt (the row-major tensors are viewed transposed).
struct GemmShape {
  DType dtype = DType::f32;
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  bool bias = false;       // epilogue: D += bias broadcast over columns (length m)
  bool allow_tf32 = true;  // f32 may use TF32 when set_tf32(true)
};

class LinearEngine {
 public:
  // Creates the cuBLASLt handle and workspace and fills the ones vectors (queued on the stream).
  explicit LinearEngine(EngineContext& ctx);
  LinearEngine(const LinearEngine&) = delete;
  LinearEngine& operator=(const LinearEngine&) = delete;

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y);
  void linear_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate);
  void linear_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias);

 private:
  LtPlan& lt_plan(const GemmShape& g);
  void matmul(const GemmShape& g, const void* a, const void* b, void* c, float beta, const void* bias);
  void column_sums(const Tensor& dy, const Tensor& dbias);
  const void* ones(DType t) const;  // ones_count_ ones of dtype t

  EngineContext& ctx_;
  backend::cuda::LtHandlePtr lt_;
  backend::cuda::DeviceBuffer lt_workspace_;
  backend::cuda::DeviceBuffer ones_;  // f32/f16/bf16 ones for the bias gradient's reduction GEMM
  std::int64_t ones_count_ = 0;
  std::unordered_map<Key, std::unique_ptr<LtPlan>, KeyHash> lt_plans_;
};

}  // namespace ab::nn::cuda
