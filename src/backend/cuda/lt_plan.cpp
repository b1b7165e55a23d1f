#include "backend/cuda/lt_plan.h"

#include "backend/cuda/check.h"
#include "backend/cuda/lt_names.h"

namespace ab::backend::cuda {
namespace {

template <typename T>
T algo_attribute(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  std::size_t written = 0;
  AB_CUBLAS(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written), "algorithm config");
  return value;
}

}  // namespace

LtMatmulPtr make_lt_matmul(cublasComputeType_t compute, cudaDataType_t scale, bool trans_a, bool trans_b,
                           const std::string& what) {
  cublasLtMatmulDesc_t raw = nullptr;
  AB_CUBLAS(cublasLtMatmulDescCreate(&raw, compute, scale), what);
  LtMatmulPtr op(raw);
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  AB_CUBLAS(cublasLtMatmulDescSetAttribute(raw, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), what);
  AB_CUBLAS(cublasLtMatmulDescSetAttribute(raw, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), what);
  return op;
}

LtLayoutPtr make_lt_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           const std::string& what) {
  cublasLtMatrixLayout_t raw = nullptr;
  AB_CUBLAS(
      cublasLtMatrixLayoutCreate(&raw, type, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), ld),
      what);
  return LtLayoutPtr(raw);
}

std::vector<cublasLtMatmulHeuristicResult_t> lt_heuristic(cublasLtHandle_t lt, const LtQuery& q,
                                                          const std::string& what) {
  cublasLtMatmulPreference_t raw = nullptr;
  AB_CUBLAS(cublasLtMatmulPreferenceCreate(&raw), what);
  const LtPreferencePtr pref(raw);
  const auto ws = static_cast<std::uint64_t>(q.workspace_bytes);
  AB_CUBLAS(cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), what);
  if (q.no_split_reduction) {
    const std::uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE;
    AB_CUBLAS(
        cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)),
        what);
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(q.max_candidates));
  int returned = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(lt, q.op, q.a, q.b, q.c, q.c, raw, q.max_candidates, results.data(), &returned);
  if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED)
    throw_cublas(status, "cublasLtMatmulAlgoGetHeuristic", what);
  std::vector<cublasLtMatmulHeuristicResult_t> usable;
  if (status == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < returned; ++i)
      if (results[static_cast<std::size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
        usable.push_back(results[static_cast<std::size_t>(i)]);
  return usable;
}

std::string describe_lt_algo(const cublasLtMatmulAlgo_t& algo) {
  return "cublasLt algo " + std::to_string(algo_attribute<std::int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
         tile_name(algo_attribute<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID)) + " stages " +
         stages_name(algo_attribute<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " splitK " +
         std::to_string(algo_attribute<std::int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
}

}  // namespace ab::backend::cuda
