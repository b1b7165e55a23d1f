// Linear through cuBLASLt. Row-major [R, C] tensors are column-major [C, R] matrices, so with
// x [N, in], w [out, in], y [N, out] (column-major Xc [in, N], Wc [in, out], Yc [out, N]):
//   forward        Yc [out, N]  = Wc^T Xc        (+ bias over rows: the BIAS epilogue)
//   backward data  dXc [in, N]  = Wc dYc         (beta = 1 accumulates)
//   backward w     dWc [in, out] = Xc dYc^T
//   bias gradient  db [out]     = dYc 1_N        (a GEMM against a ones vector, in chunks of rows)
// f32 computes in f32 (TF32 when allowed), f16/bf16 in f32. One heuristic choice per shape, cached.
#include <algorithm>

#include "nn/cuda/linear_engine.h"
#include "nn/cuda/pointwise.h"

namespace ab::nn::cuda {
namespace {

cudaDataType_t lt_dtype(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: break;
  }
  throw Unsupported("cuda linear runs f32, f16 or bf16, not " + std::string(to_string(t)));
}

void require_matrix(const char* kernel, const Tensor& t, const char* what, DType dtype) {
  if (t.shape.rank() != 2 || !t.is_contiguous() || t.dtype != dtype || !t.defined())
    throw Unsupported(std::string("cuda ") + kernel + ": " + what + " must be a contiguous " +
                      std::string(to_string(dtype)) + " matrix, got " + t.to_string());
}

constexpr std::int64_t kLtWorkspaceBytes = std::int64_t{32} << 20;
constexpr std::int64_t kOnesCount = std::int64_t{1} << 16;  // rows reduced per bias-gradient GEMM

}  // namespace

LinearEngine::LinearEngine(EngineContext& ctx) : ctx_(ctx) {
  lt_ = backend::cuda::create_lt_handle(ctx_.label + " engine cuBLASLt handle");
  lt_workspace_ = backend::cuda::DeviceBuffer(kLtWorkspaceBytes, ctx_.label + " engine cuBLASLt workspace");
  ones_count_ = kOnesCount;
  ones_ = backend::cuda::DeviceBuffer(ones_count_ * (4 + 2 + 2), ctx_.label + " ones");
  auto* base = ones_.as<unsigned char>();
  cuda_pointwise::fill(ctx_.stream, DType::f32, base, ones_count_, 1.0);
  cuda_pointwise::fill(ctx_.stream, DType::f16, base + 4 * ones_count_, ones_count_, 1.0);
  cuda_pointwise::fill(ctx_.stream, DType::bf16, base + 6 * ones_count_, ones_count_, 1.0);
}

const void* LinearEngine::ones(DType t) const {
  const auto* base = ones_.as<const unsigned char>();
  switch (t) {
    case DType::f32: return base;
    case DType::f16: return base + 4 * ones_count_;
    case DType::bf16: return base + 6 * ones_count_;
    default: throw Unsupported("cuda: no ones vector for " + std::string(to_string(t)));
  }
}

LtPlan& LinearEngine::lt_plan(const GemmShape& g) {
  const bool tf32 = g.allow_tf32 && ctx_.modes.tf32 && g.dtype == DType::f32;
  Key key;
  for (std::int64_t v :
       {static_cast<std::int64_t>(g.dtype), std::int64_t{g.trans_a}, std::int64_t{g.trans_b}, g.m, g.n, g.k, g.lda,
        g.ldb, g.ldc, std::int64_t{g.bias}, std::int64_t{tf32}, std::int64_t{ctx_.modes.deterministic}})
    key.add(v);
  if (auto it = lt_plans_.find(key); it != lt_plans_.end()) return *it->second;

  auto plan = std::make_unique<LtPlan>();
  plan->label = "linear gemm " + std::string(to_string(g.dtype)) + (tf32 ? " (tf32)" : "") +
                " m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
                (g.trans_a ? " T" : " N") + (g.trans_b ? "T" : "N") + (g.bias ? " +bias" : "");
  const std::string& label = plan->label;
  const cudaDataType_t t = lt_dtype(g.dtype);
  plan->op = backend::cuda::make_lt_matmul(tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F,
                                           g.trans_a, g.trans_b, label);
  if (g.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;  // bias in D's dtype, one per row of D
    AB_CUBLAS_LAZY(
        cublasLtMatmulDescSetAttribute(plan->op.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
        label);
  }
  const auto layout = [&](std::int64_t rows, std::int64_t cols, std::int64_t ld) {
    return backend::cuda::make_lt_layout(t, rows, cols, ld, label);
  };
  plan->a = g.trans_a ? layout(g.k, g.m, g.lda) : layout(g.m, g.k, g.lda);
  plan->b = g.trans_b ? layout(g.n, g.k, g.ldb) : layout(g.k, g.n, g.ldb);
  plan->c = layout(g.m, g.n, g.ldc);

  backend::cuda::LtQuery q;
  q.op = plan->op.get();
  q.a = plan->a.get();
  q.b = plan->b.get();
  q.c = plan->c.get();
  q.workspace_bytes = lt_workspace_.bytes();
  // cuBLASLt is bit-reproducible run to run by design; deterministic mode also rules out split-K
  // reductions so no partial-sum order can depend on scheduling.
  q.no_split_reduction = ctx_.modes.deterministic;
  q.max_candidates = 1;
  const auto found = backend::cuda::lt_heuristic(lt_.get(), q, label);
  if (found.empty()) throw Unsupported("cuBLASLt offers no algorithm for " + label + " on " + ctx_.label);
  plan->algo = found.front().algo;
  return *lt_plans_.emplace(key, std::move(plan)).first->second;
}

void LinearEngine::matmul(const GemmShape& g, const void* a, const void* b, void* c, float beta, const void* bias) {
  LtPlan& p = lt_plan(g);
  if (g.bias)  // host-side attribute, read when the call is enqueued (and recorded by a capture)
    AB_CUBLAS_LAZY(cublasLtMatmulDescSetAttribute(p.op.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                   p.label);
  const float alpha = 1.0f;
  AB_CUBLAS_LAZY(
      cublasLtMatmul(lt_.get(), p.op.get(), &alpha, a, p.a.get(), b, p.b.get(), &beta, c, p.c.get(), c, p.c.get(),
                     &p.algo, lt_workspace_.get(), static_cast<std::size_t>(lt_workspace_.bytes()), ctx_.stream),
      p.label);
}

void LinearEngine::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  const char* k = "linear_forward";
  require_matrix(k, x, "x", x.dtype);
  require_matrix(k, w, "w", x.dtype);
  require_matrix(k, y, "y", x.dtype);
  const std::int64_t n = x.shape[0], in = x.shape[1], out = w.shape[0];
  if (w.shape[1] != in || y.shape[0] != n || y.shape[1] != out)
    throw Error("cuda linear_forward: shapes x " + x.to_string() + ", w " + w.to_string() + ", y " + y.to_string() +
                " do not match");
  if (bias.defined() && (bias.dtype != x.dtype || bias.numel() != out || !bias.is_contiguous()))
    throw Unsupported("cuda linear_forward: bias must be a contiguous " + std::string(to_string(x.dtype)) + " [" +
                      std::to_string(out) + "], got " + bias.to_string());
  GemmShape g;
  g.dtype = x.dtype;
  g.trans_a = true;
  g.m = out, g.n = n, g.k = in;
  g.lda = in, g.ldb = in, g.ldc = out;
  g.bias = bias.defined();
  matmul(g, w.data, x.data, y.data, 0.0f, bias.data);
}

void LinearEngine::linear_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate) {
  const char* k = "linear_backward_data";
  require_matrix(k, dy, "dy", dy.dtype);
  require_matrix(k, w, "w", dy.dtype);
  require_matrix(k, dx, "dx", dy.dtype);
  const std::int64_t n = dy.shape[0], out = dy.shape[1], in = w.shape[1];
  if (w.shape[0] != out || dx.shape[0] != n || dx.shape[1] != in)
    throw Error("cuda linear_backward_data: shapes dy " + dy.to_string() + ", w " + w.to_string() + ", dx " +
                dx.to_string() + " do not match");
  GemmShape g;
  g.dtype = dy.dtype;
  g.m = in, g.n = n, g.k = out;
  g.lda = in, g.ldb = out, g.ldc = in;
  matmul(g, w.data, dy.data, dx.data, accumulate ? 1.0f : 0.0f, nullptr);
}

void LinearEngine::linear_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias) {
  const char* k = "linear_backward_weights";
  require_matrix(k, x, "x", x.dtype);
  require_matrix(k, dy, "dy", x.dtype);
  require_matrix(k, dw, "dw", x.dtype);
  const std::int64_t n = x.shape[0], in = x.shape[1], out = dy.shape[1];
  if (dy.shape[0] != n || dw.shape[0] != out || dw.shape[1] != in)
    throw Error("cuda linear_backward_weights: shapes x " + x.to_string() + ", dy " + dy.to_string() + ", dw " +
                dw.to_string() + " do not match");
  GemmShape g;
  g.dtype = x.dtype;
  g.trans_b = true;
  g.m = in, g.n = out, g.k = n;
  g.lda = in, g.ldb = out, g.ldc = in;
  matmul(g, x.data, dy.data, dw.data, 0.0f, nullptr);
  if (dbias.defined()) column_sums(dy, dbias);
}

void LinearEngine::column_sums(const Tensor& dy, const Tensor& dbias) {
  const std::int64_t n = dy.shape[0], out = dy.shape[1];
  if (dbias.dtype != dy.dtype || dbias.numel() != out || !dbias.is_contiguous())
    throw Unsupported("cuda linear_backward_weights: dbias must be a contiguous " + std::string(to_string(dy.dtype)) +
                      " [" + std::to_string(out) + "], got " + dbias.to_string());
  // db [out] = dYc [out, rows] x ones [rows], chunk by chunk, accumulating after the first; the
  // sum stays in f32 (no TF32: it is a handful of FLOPs).
  const auto esize = static_cast<std::int64_t>(size_bytes(dy.dtype));
  for (std::int64_t start = 0; start < n; start += ones_count_) {
    const std::int64_t rows = std::min(ones_count_, n - start);
    GemmShape g;
    g.dtype = dy.dtype;
    g.allow_tf32 = false;
    g.m = out, g.n = 1, g.k = rows;
    g.lda = out, g.ldb = rows, g.ldc = out;
    matmul(g, static_cast<const unsigned char*>(dy.data) + start * out * esize, ones(dy.dtype), dbias.data,
           start == 0 ? 0.0f : 1.0f, nullptr);
  }
}

}  // namespace ab::nn::cuda
