// The linear family: y = x w^T (+ bias), its gradients, and the MLP's GELU fused into the GEMMs,
// through cuBLASLt (linear.cpp, on the foundation's plans, backend/cuda/lt_plan.h). One plan per
// GEMM shape, epilogue and operand alignment, cached; its algorithm is the fastest of the
// heuristic's first candidates, timed once at the plan's first call (the heuristic's first inside
// a CUDA-graph capture and in deterministic mode). Owns the cuBLASLt handle and workspace and the
// ones vectors of the bias gradient's fallback reduction GEMM. The entry points are nn::Kernels'.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/lt_plan.h"
#include "nn/cuda/common.h"
#include "nn/cuda/context.h"

namespace ab::nn::cuda {

// What the GEMM does after the product (cublasLtEpilogue_t) and the vector or matrix it touches:
// bias (read, one per row of D), the GELU input `aux` (written by gelu_aux*, read by dgelu) and the
// bias gradient (bgradb: written, the sums of B's columns over k, one per column of D).
enum class LtEpilogue { none, bias, gelu, gelu_bias, gelu_aux, gelu_aux_bias, dgelu, bgradb };

// Column-major GEMM shape for cuBLASLt (the row-major tensors are viewed transposed).
struct GemmShape {
  DType dtype = DType::f32;
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  LtEpilogue epilogue = LtEpilogue::none;
  std::int64_t aux_ld = 0;  // the GELU input's leading dimension (gelu_aux*, dgelu)
  bool accumulate = false;  // beta = 1: D += op(A) op(B)
  bool allow_tf32 = true;   // f32 may use TF32 when set_tf32(true)
  // Strided batched: `batch` GEMMs, operand i of GEMM b at b * stride (elements; 0 broadcasts).
  std::int64_t batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// The device pointers of one call. bias: the bias read, or the bias gradient bgradb writes.
struct GemmOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;
  void* aux = nullptr;
};

// D = op(A) op(B) with its epilogue and chosen algorithm; `choice` says which and how it was chosen.
struct LtPlan {
  backend::cuda::LtMatmulPtr op;
  backend::cuda::LtLayoutPtr a, b, c;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  // false: cuBLASLt offers nothing for this epilogue (the caller composes)
  bool gelu = false;    // a GELU epilogue: counted by fusion_counts
  std::string label, choice;
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
  void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& pre, const Tensor& y);
  void linear_backward_data_gelu(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor& dx,
                                 const Tensor& dbias);
  // The generic matmul (Kernels::matmul_forward): y [..., M, N] = a [..., M, K] b [..., K, N],
  // row-major, batch dims broadcast: one GEMM where b has no batch (a's batch folds into M), a
  // strided batched GEMM where each operand's batch is whole or absent, else one per batch.
  void matmul_forward(const Tensor& a, const Tensor& b, const Tensor& y);
  // sums[c] = the sum over rows of x[:, c]: the project's kernel (one read of x, f32 sums in a
  // fixed order).
  void column_sums(const Tensor& x, const Tensor& sums);

  // One line per plan made so far, sorted: the GEMM (shape, epilogue) and its algorithm, or why
  // cuBLASLt had none for the epilogue (the call then ran the separate kernels).
  std::vector<std::string> choices() const;
  // Adds the GELU-fused plans (linear_gelu_forward, linear_backward_data_gelu) to `counts`: fused
  // where cuBLASLt ran the epilogue, unfused where the call composed the separate kernels.
  void count_fusions(Kernels::FusionCounts& counts) const;

 private:
  LtPlan& lt_plan(const GemmShape& g, const GemmOperands& ops);
  void choose_algorithm(LtPlan& plan, const GemmShape& g, const GemmOperands& ops,
                        const std::vector<cublasLtMatmulHeuristicResult_t>& found);
  void set_pointers(const LtPlan& p, const GemmShape& g, const GemmOperands& ops);
  cublasStatus_t launch(const LtPlan& p, const cublasLtMatmulAlgo_t& algo, const GemmShape& g, const GemmOperands& ops);
  // Runs the GEMM; false (nothing queued) where cuBLASLt has no algorithm for g's epilogue.
  bool matmul(const GemmShape& g, const GemmOperands& ops);
  void column_sums(const Tensor& x, std::int64_t ld, const Tensor& sums);
  void column_sums_by_gemm(const Tensor& dy, std::int64_t ld, const Tensor& dbias);
  const void* ones(DType t) const;  // ones_count_ ones of dtype t

  EngineContext& ctx_;
  backend::cuda::LtHandlePtr lt_;
  backend::cuda::DeviceBuffer lt_workspace_;
  backend::cuda::DeviceBuffer ones_;  // f32/f16/bf16 ones for the bias gradient's reduction GEMM
  std::int64_t ones_count_ = 0;
  backend::cuda::DeviceBuffer column_scratch_;  // column_sums' partials
  std::unordered_map<Key, std::unique_ptr<LtPlan>, KeyHash> lt_plans_;
};

}  // namespace ab::nn::cuda
