// cuBLASLt plans, the CUDA foundation's part that both of the library's users build on: the GEMM
// micro-benchmark (gemm_lt.cpp) and the engine's linear layers (nn/cuda/linear.cpp), each of which
// times the heuristic's candidates. RAII owners for the descriptors, the heuristic query with the
// refusals it may answer filtered out, and an algorithm's description.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace ab::backend::cuda {

struct LtMatmulDeleter {
  void operator()(cublasLtMatmulDesc_t d) const noexcept { cublasLtMatmulDescDestroy(d); }
};
struct LtLayoutDeleter {
  void operator()(cublasLtMatrixLayout_t l) const noexcept { cublasLtMatrixLayoutDestroy(l); }
};
struct LtPreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const noexcept { cublasLtMatmulPreferenceDestroy(p); }
};
using LtMatmulPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, LtMatmulDeleter>;
using LtLayoutPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LtLayoutDeleter>;
using LtPreferencePtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, LtPreferenceDeleter>;

// D = op(A) op(B): a matmul descriptor computing in `compute` with scale type `scale`, its
// transposes set (an epilogue, if any, is the caller's attribute to add).
LtMatmulPtr make_lt_matmul(cublasComputeType_t compute, cudaDataType_t scale, bool trans_a, bool trans_b,
                           const std::string& what);
// A column-major rows x cols matrix of `type` with leading dimension `ld`.
LtLayoutPtr make_lt_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           const std::string& what);

// What the heuristic is asked for one matmul (C and D share the layout `c`).
struct LtQuery {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::int64_t workspace_bytes = 0;  // the most an algorithm may use
  bool no_split_reduction = false;   // only algorithms without split-K reductions (deterministic sums)
  int max_candidates = 1;
};
// cuBLASLt's usable algorithms for the query, best first by its heuristic, at most
// max_candidates; empty where it has none (NOT_SUPPORTED included). Any other failure throws
// Error naming `what`.
std::vector<cublasLtMatmulHeuristicResult_t> lt_heuristic(cublasLtHandle_t lt, const LtQuery& q,
                                                          const std::string& what);

// "cublasLt algo 21 tile 128x256 stages 64x4 splitK 1": what a result record or a plan label says
// of the algorithm a GEMM ran.
std::string describe_lt_algo(const cublasLtMatmulAlgo_t& algo);

}  // namespace ab::backend::cuda
