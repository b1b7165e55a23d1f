// GEMM through cuBLASLt: C = op(A) op(B), column-major, alpha = 1, beta = 0. The algorithm is the
// fastest of cuBLASLt's heuristic candidates, timed on the real operands when the plan is made.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/context.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/lt_plan.h"
#include "core/error.h"
#include "core/rng.h"

namespace ab::backend::cuda {
namespace {

constexpr int kMaxCandidates = 16;
constexpr int kWarmupRuns = 2;
constexpr int kTimedRuns = 5;
constexpr double kSearchBudgetS = 2.0;  // stop timing further candidates after this much wall time

// Storage and compute types per precision, as the precision table in the design fixes them.
struct LtTypes {
  DType ab;
  DType c;
  cudaDataType_t ab_cuda;
  cudaDataType_t c_cuda;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

LtTypes lt_types(Precision p) {
  switch (p) {
    case Precision::fp32: return {DType::f32, DType::f32, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case Precision::tf32:
      return {DType::f32, DType::f32, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F};
    case Precision::fp16: return {DType::f16, DType::f16, CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case Precision::bf16:
      return {DType::bf16, DType::bf16, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case Precision::fp8:
      return {DType::f8e4m3, DType::bf16, CUDA_R_8F_E4M3, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case Precision::int8: return {DType::i8, DType::i32, CUDA_R_8I, CUDA_R_32I, CUBLAS_COMPUTE_32I, CUDA_R_32I};
  }
  throw Error("gemm: unknown precision");
}

std::string describe(const GemmDesc& d) {
  return "gemm " + std::string(to_string(d.precision)) + " m=" + std::to_string(d.m) + " n=" + std::to_string(d.n) +
         " k=" + std::to_string(d.k) + " " + (d.trans_a ? "T" : "N") + (d.trans_b ? "T" : "N");
}

// Rejects what cuBLASLt cannot run before anything is allocated, with the reason a user can act on.
void check_supported(const GemmDesc& d, const Context& ctx) {
  if (d.m <= 0 || d.n <= 0 || d.k <= 0) throw Error(describe(d) + ": m, n and k must be positive");
  const bool narrow = d.precision == Precision::fp8 || d.precision == Precision::int8;
  if (!narrow) return;
  const std::string name(to_string(d.precision));
  if (d.precision == Precision::fp8 && ctx.cc_major * 10 + ctx.cc_minor < 89)
    throw Unsupported("fp8 GEMM needs compute capability 8.9 or newer; " + ctx.label + " is " +
                      std::to_string(ctx.cc_major) + "." + std::to_string(ctx.cc_minor));
  if (!d.trans_a || d.trans_b)
    throw Unsupported(name + " GEMM in cuBLASLt needs the TN layout (trans_a=T, trans_b=N)");
  // TN stores A as k x m and B as k x n, so k is both leading dimensions. What cuBLASLt 13 accepted
  // on an H200 (heuristic probe over m, k in 4..80): int8 needs k % 4 == 0 (4-byte aligned columns of
  // A and B, as the IMMA rules in the cuBLAS docs say); fp8 needs k % 16 == 0 and m % 8 == 0
  // (16-byte aligned columns of A, B and the bf16 C). n is free in both.
  if (d.precision == Precision::int8 && d.k % 4 != 0)
    throw Unsupported("int8 GEMM in cuBLASLt needs k a multiple of 4 (4-byte aligned columns of A and B); " +
                      describe(d));
  if (d.precision == Precision::fp8 && (d.k % 16 != 0 || d.m % 8 != 0))
    throw Unsupported("fp8 GEMM in cuBLASLt needs k a multiple of 16 and m a multiple of 8 (16-byte aligned "
                      "columns); " + describe(d));
}

class LtGemm final : public GemmPlan {
 public:
  LtGemm(ContextPtr ctx, const GemmDesc& d) : ctx_(std::move(ctx)), desc_(d), types_(lt_types(d.precision)) {
    label_ = describe(d) + " on " + ctx_->label;
    check_supported(d, *ctx_);
    ctx_->activate();
    create_descriptors();
    // Allocate and fill before asking for algorithms: an impossible size reports OutOfMemory.
    a_ = DeviceBuffer(d.m * d.k * static_cast<std::int64_t>(size_bytes(types_.ab)), label_ + ", A");
    b_ = DeviceBuffer(d.k * d.n * static_cast<std::int64_t>(size_bytes(types_.ab)), label_ + ", B");
    c_ = DeviceBuffer(d.m * d.n * static_cast<std::int64_t>(size_bytes(types_.c)), label_ + ", C");
    const std::uint64_t seed = fresh_seed();
    fill_random(types_.ab, a_.get(), d.m * d.k, seed, ctx_->sm_count, ctx_->s(), label_ + ", A");
    fill_random(types_.ab, b_.get(), d.k * d.n, mix64(seed, 1), ctx_->sm_count, ctx_->s(), label_ + ", B");
    AB_CUDA(cudaMemsetAsync(c_.get(), 0, static_cast<std::size_t>(c_.bytes()), ctx_->s()), label_ + ", C");
    select_algorithm();
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  void run() override { AB_CUBLAS(matmul(algo_), label_); }

  std::string algorithm() const override { return algorithm_; }

  std::vector<double> a_values() override { return download(a_, types_.ab, desc_.m * desc_.k, "A"); }
  std::vector<double> b_values() override { return download(b_, types_.ab, desc_.k * desc_.n, "B"); }
  std::vector<double> c_values() override { return download(c_, types_.c, desc_.m * desc_.n, "C"); }
  std::vector<double> values_at(GemmOperand which, const std::vector<std::int64_t>& indices) override {
    const DeviceBuffer& buf = which == GemmOperand::a ? a_ : which == GemmOperand::b ? b_ : c_;
    const DType t = which == GemmOperand::c ? types_.c : types_.ab;
    const auto elem = static_cast<std::int64_t>(size_bytes(t));
    ctx_->activate();
    std::vector<unsigned char> host(indices.size() * static_cast<std::size_t>(elem));
    // Runs of consecutive indices travel as one copy (a column of a column-major operand).
    for (std::size_t first = 0; first < indices.size();) {
      std::size_t last = first + 1;
      while (last < indices.size() && indices[last] == indices[last - 1] + 1) ++last;
      if (indices[first] < 0 || (indices[last - 1] + 1) * elem > buf.bytes())
        throw Error(label_ + ": operand index out of range");
      AB_CUDA(cudaMemcpyAsync(host.data() + first * static_cast<std::size_t>(elem),
                              static_cast<const unsigned char*>(buf.get()) + indices[first] * elem,
                              (last - first) * static_cast<std::size_t>(elem), cudaMemcpyDeviceToHost, ctx_->s()),
              label_ + ", copy a sample to host");
      first = last;
    }
    ctx_->sync(label_ + ", copy a sample to host");
    return to_doubles(t, host.data(), indices.size());
  }

 private:
  cublasStatus_t matmul(const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(ctx_->lt.get(), op_.get(), alpha(), a_.get(), a_layout_.get(), b_.get(), b_layout_.get(),
                          beta(), c_.get(), c_layout_.get(), c_.get(), c_layout_.get(), &algo,
                          ctx_->workspace.get(), static_cast<std::size_t>(ctx_->workspace.bytes()), ctx_->s());
  }

  const void* alpha() const { return types_.scale == CUDA_R_32I ? static_cast<const void*>(&alpha_i_) : &alpha_f_; }
  const void* beta() const { return types_.scale == CUDA_R_32I ? static_cast<const void*>(&beta_i_) : &beta_f_; }

  void create_descriptors() {
    op_ = make_lt_matmul(types_.compute, types_.scale, desc_.trans_a, desc_.trans_b, label_);
    // fp8: CUBLASLT_MATMUL_DESC_FAST_ACCUM stays at its default 0, as torch._scaled_mm leaves it;
    // no scale pointers, so A and B scales are 1.
    const std::int64_t a_rows = desc_.trans_a ? desc_.k : desc_.m;
    const std::int64_t a_cols = desc_.trans_a ? desc_.m : desc_.k;
    const std::int64_t b_rows = desc_.trans_b ? desc_.n : desc_.k;
    const std::int64_t b_cols = desc_.trans_b ? desc_.k : desc_.n;
    a_layout_ = make_lt_layout(types_.ab_cuda, a_rows, a_cols, a_rows, label_ + ", A layout");
    b_layout_ = make_lt_layout(types_.ab_cuda, b_rows, b_cols, b_rows, label_ + ", B layout");
    c_layout_ = make_lt_layout(types_.c_cuda, desc_.m, desc_.n, desc_.m, label_ + ", C layout");
  }

  std::vector<cublasLtMatmulHeuristicResult_t> candidates() {
    LtQuery q;
    q.op = op_.get();
    q.a = a_layout_.get();
    q.b = b_layout_.get();
    q.c = c_layout_.get();
    q.workspace_bytes = ctx_->workspace.bytes();
    q.max_candidates = kMaxCandidates;
    std::vector<cublasLtMatmulHeuristicResult_t> usable = lt_heuristic(ctx_->lt.get(), q, label_);
    if (usable.empty())
      throw Unsupported("cuBLASLt offers no algorithm for " + describe(desc_) + " on " + ctx_->label +
                        " (compute capability " + std::to_string(ctx_->cc_major) + "." +
                        std::to_string(ctx_->cc_minor) + ")");
    return usable;
  }

  // Mean seconds of one run with this algorithm, or a negative value if cuBLASLt refuses it.
  double time_candidate(const cublasLtMatmulAlgo_t& algo, cudaEvent_t start, cudaEvent_t stop) {
    for (int i = 0; i < kWarmupRuns; ++i)
      if (matmul(algo) != CUBLAS_STATUS_SUCCESS) return -1;
    AB_CUDA(cudaEventRecord(start, ctx_->s()), label_ + ", algorithm search");
    for (int i = 0; i < kTimedRuns; ++i)
      if (matmul(algo) != CUBLAS_STATUS_SUCCESS) {
        ctx_->sync(label_ + ", algorithm search");
        return -1;
      }
    AB_CUDA(cudaEventRecord(stop, ctx_->s()), label_ + ", algorithm search");
    AB_CUDA(cudaEventSynchronize(stop), label_ + ", algorithm search");
    float ms = 0;
    AB_CUDA(cudaEventElapsedTime(&ms, start, stop), label_ + ", algorithm search");
    return static_cast<double>(ms) * 1e-3 / kTimedRuns;
  }

  void select_algorithm() {
    const auto found = candidates();
    const EventPtr start = create_event(label_);
    const EventPtr stop = create_event(label_);
    const auto t0 = std::chrono::steady_clock::now();
    double best_s = std::numeric_limits<double>::infinity();
    int timed = 0;
    std::size_t best_rank = 0;
    for (std::size_t i = 0; i < found.size(); ++i) {
      const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (timed > 0 && elapsed_s > kSearchBudgetS) break;
      const double t = time_candidate(found[i].algo, start.get(), stop.get());
      if (t < 0) continue;
      ++timed;
      if (t < best_s) {
        best_s = t;
        best_rank = i;
        algo_ = found[i].algo;
      }
    }
    if (timed == 0)
      throw Unsupported("cuBLASLt refused all " + std::to_string(found.size()) + " heuristic candidates for " +
                        describe(desc_) + " on " + ctx_->label);
    // Leave C holding the chosen algorithm's result, whatever ran last in the search.
    run();
    algorithm_ = describe_lt_algo(algo_) + " (heuristic rank " + std::to_string(best_rank + 1) + ", best of " +
                 std::to_string(timed) + " timed of " + std::to_string(found.size()) + " heuristic candidates)";
  }

  std::vector<double> download(const DeviceBuffer& buf, DType t, std::int64_t count, const char* what) {
    ctx_->activate();
    std::vector<unsigned char> host(static_cast<std::size_t>(buf.bytes()));
    AB_CUDA(cudaMemcpyAsync(host.data(), buf.get(), host.size(), cudaMemcpyDeviceToHost, ctx_->s()),
            label_ + ", copy " + what + " to host");
    ctx_->sync(label_ + ", copy " + what + " to host");
    return to_doubles(t, host.data(), static_cast<std::size_t>(count));
  }

  ContextPtr ctx_;
  GemmDesc desc_;
  LtTypes types_;
  std::string label_;
  LtMatmulPtr op_;
  LtLayoutPtr a_layout_, b_layout_, c_layout_;
  DeviceBuffer a_, b_, c_;
  cublasLtMatmulAlgo_t algo_{};
  std::string algorithm_;
  float alpha_f_ = 1.0f, beta_f_ = 0.0f;
  std::int32_t alpha_i_ = 1, beta_i_ = 0;
};

}  // namespace

std::unique_ptr<GemmPlan> make_gemm_plan(ContextPtr ctx, const GemmDesc& desc) {
  return std::make_unique<LtGemm>(std::move(ctx), desc);
}

}  // namespace ab::backend::cuda
