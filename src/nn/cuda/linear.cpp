// Linear through cuBLASLt. Row-major [R, C] tensors are column-major [C, R] matrices whose leading
// dimension is the row stride (padded rows are free), so with x [N, in], w [out, in], y [N, out]
// (column-major Xc [in, N], Wc [in, out], Yc [out, N]):
//   forward        Yc [out, N]  = Wc^T Xc        (+ bias over rows: the BIAS epilogue; with the
//                                                 GELU: GELU_AUX_BIAS writes pre as the aux matrix)
//   backward data  dXc [in, N]  = Wc dYc         (beta = 1 accumulates; through the GELU: DGELU
//                                                 reads pre as the aux matrix; a bias gradient [in]
//                                                 is then the project's column sums of dXc)
//   backward w     dWc [in, out] = Xc dYc^T      (+ bias gradient db [out] = dYc 1_N, the sums of
//                                                 B's columns over k: the BGRADB epilogue)
// Where cuBLASLt has no algorithm for an epilogue (a dtype, an aux leading dimension that is not a
// multiple of 8) the call runs the separate kernels: nn::Kernels' default composition, and for
// the bias gradient a GEMM against a ones vector, in chunks of rows. f32 computes in f32 (TF32
// when allowed), f16/bf16 in f32. Plans and the algorithm choice: linear_plan.cpp.
#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "nn/broadcast.h"
#include "nn/cuda/linear_engine.h"
#include "nn/cuda/pointwise.h"
#include "nn/cuda/transformer.h"

namespace ab::nn::cuda {
namespace {

// The leading dimension cuBLASLt reads a row-major [rows, cols] operand with: its row stride,
// which may exceed cols (padded rows); columns must be unit-stride.
std::int64_t row_stride(const char* kernel, const Tensor& t, const char* what, DType dtype) {
  if (!t.defined() || t.shape.rank() != 2 || t.dtype != dtype || t.strides[1] != 1 ||
      (t.shape[0] > 1 && t.strides[0] < t.shape[1]))
    throw Unsupported(std::string("cuda ") + kernel + ": " + what + " must be a " + std::string(to_string(dtype)) +
                      " matrix with unit column stride and a row stride of at least its width, got " + t.to_string() +
                      " strides " + t.strides.to_string());
  return std::max<std::int64_t>({t.strides[0], t.shape[1], 1});
}

void require_vector(const char* kernel, const Tensor& t, const char* what, DType dtype, std::int64_t length) {
  if (t.dtype != dtype || t.numel() != length || !t.is_contiguous())
    throw Unsupported(std::string("cuda ") + kernel + ": " + what + " must be a contiguous " +
                      std::string(to_string(dtype)) + " [" + std::to_string(length) + "], got " + t.to_string());
}

[[noreturn]] void shape_mismatch(const char* kernel, const char* a, const Tensor& ta, const char* b, const Tensor& tb,
                                 const char* c, const Tensor& tc) {
  throw Error(std::string("cuda ") + kernel + ": shapes " + a + " " + ta.to_string() + ", " + b + " " + tb.to_string() +
              ", " + c + " " + tc.to_string() + " do not match");
}

// cuBLASLt's GELU input matrix needs a leading dimension divisible by 8.
constexpr std::int64_t kAuxLdMultiple = 8;

// Yc [out, N] = Wc^T Xc with `epilogue` (bias and aux operands as it needs them).
GemmShape forward_shape(const char* k, const Tensor& x, const Tensor& w, const Tensor& y) {
  GemmShape g;
  g.dtype = x.dtype;
  g.lda = row_stride(k, w, "w", x.dtype);
  g.ldb = row_stride(k, x, "x", x.dtype);
  g.ldc = row_stride(k, y, "y", x.dtype);
  const std::int64_t n = x.shape[0], in = x.shape[1], out = w.shape[0];
  if (w.shape[1] != in || y.shape[0] != n || y.shape[1] != out) shape_mismatch(k, "x", x, "w", w, "y", y);
  g.trans_a = true;
  g.m = out, g.n = n, g.k = in;
  return g;
}

// dXc [in, N] = Wc dYc.
GemmShape backward_data_shape(const char* k, const Tensor& dy, const Tensor& w, const Tensor& dx) {
  GemmShape g;
  g.dtype = dy.dtype;
  g.lda = row_stride(k, w, "w", dy.dtype);
  g.ldb = row_stride(k, dy, "dy", dy.dtype);
  g.ldc = row_stride(k, dx, "dx", dy.dtype);
  const std::int64_t n = dy.shape[0], out = dy.shape[1], in = w.shape[1];
  if (w.shape[0] != out || dx.shape[0] != n || dx.shape[1] != in) shape_mismatch(k, "dy", dy, "w", w, "dx", dx);
  g.m = in, g.n = n, g.k = out;
  return g;
}

constexpr std::int64_t kLtWorkspaceBytes = std::int64_t{32} << 20;
constexpr std::int64_t kOnesCount = std::int64_t{1} << 16;  // rows reduced per bias-gradient GEMM
constexpr std::int64_t kColumnScratchBytes = std::int64_t{4} << 20;  // column_sums' partials: 1M columns

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
  column_scratch_ = backend::cuda::DeviceBuffer(kColumnScratchBytes, ctx_.label + " column sums' partials");
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

void LinearEngine::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  const char* k = "linear_forward";
  GemmShape g = forward_shape(k, x, w, y);
  if (bias.defined()) require_vector(k, bias, "bias", x.dtype, g.m);
  g.epilogue = bias.defined() ? LtEpilogue::bias : LtEpilogue::none;
  matmul(g, {w.data, x.data, y.data, bias.data, nullptr});
}

void LinearEngine::linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& pre,
                                       const Tensor& y) {
  const char* k = "linear_gelu_forward";
  GemmShape g = forward_shape(k, x, w, y);
  if (bias.defined()) require_vector(k, bias, "bias", x.dtype, g.m);
  if (pre.defined()) {
    g.aux_ld = row_stride(k, pre, "pre", x.dtype);
    if (!(pre.shape == y.shape)) shape_mismatch(k, "x", x, "pre", pre, "y", y);
  }
  if (pre.defined() && g.aux_ld % kAuxLdMultiple == 0)
    g.epilogue = bias.defined() ? LtEpilogue::gelu_aux_bias : LtEpilogue::gelu_aux;
  else if (!pre.defined()) g.epilogue = bias.defined() ? LtEpilogue::gelu_bias : LtEpilogue::gelu;
  if (g.epilogue != LtEpilogue::none && matmul(g, {w.data, x.data, y.data, bias.data, pre.data})) return;
  ctx_.kernels.Kernels::linear_gelu_forward(x, w, bias, pre, y);
}

void LinearEngine::linear_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate) {
  GemmShape g = backward_data_shape("linear_backward_data", dy, w, dx);
  g.accumulate = accumulate;
  matmul(g, {w.data, dy.data, dx.data, nullptr, nullptr});
}

void LinearEngine::linear_backward_data_gelu(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor& dx,
                                             const Tensor& dbias) {
  const char* k = "linear_backward_data_gelu";
  GemmShape g = backward_data_shape(k, dy, w, dx);
  g.aux_ld = row_stride(k, pre, "pre", dy.dtype);
  if (!(pre.shape == dx.shape)) shape_mismatch(k, "dy", dy, "pre", pre, "dx", dx);
  if (dbias.defined()) require_vector(k, dbias, "dbias", dy.dtype, dx.shape[1]);
  if (g.aux_ld % kAuxLdMultiple == 0) {
    // DGELU, then the bias gradient by the project's column sums. Not DGELU_BGRAD: on an H200 its
    // bias gradient ran as a separate cuBLASLt pass of 325 us at [16384, 3072] (x12 in a GPT-2
    // step: 3.9 ms, where DGELU with the column sums took 2.6 ms for the GEMM and its bias).
    g.epilogue = LtEpilogue::dgelu;
    if (matmul(g, {w.data, dy.data, dx.data, nullptr, pre.data})) {
      if (dbias.defined()) column_sums(dx, g.ldc, dbias);
      return;
    }
  }
  ctx_.kernels.Kernels::linear_backward_data_gelu(dy, w, pre, dx, dbias);
}

void LinearEngine::linear_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias) {
  const char* k = "linear_backward_weights";
  GemmShape g;
  g.dtype = x.dtype;
  g.lda = row_stride(k, x, "x", x.dtype);
  g.ldb = row_stride(k, dy, "dy", x.dtype);
  g.ldc = row_stride(k, dw, "dw", x.dtype);
  const std::int64_t n = x.shape[0], in = x.shape[1], out = dy.shape[1];
  if (dy.shape[0] != n || dw.shape[0] != out || dw.shape[1] != in) shape_mismatch(k, "x", x, "dy", dy, "dw", dw);
  if (dbias.defined()) require_vector(k, dbias, "dbias", dy.dtype, out);
  g.trans_b = true;
  g.m = in, g.n = out, g.k = n;
  const GemmOperands ops{x.data, dy.data, dw.data, dbias.data, nullptr};
  if (dbias.defined()) {
    // The bias gradient with the weight GEMM (BGRADB). Where cuBLASLt has no BGRADB kernel for
    // the case, the ones-vector reduction below runs after a plain GEMM.
    g.epilogue = LtEpilogue::bgradb;
    if (matmul(g, ops)) return;
    g.epilogue = LtEpilogue::none;
  }
  matmul(g, ops);
  if (dbias.defined()) column_sums_by_gemm(dy, g.ldb, dbias);
}

void LinearEngine::matmul_forward(const Tensor& a, const Tensor& b, const Tensor& y) {
  const char* k = "matmul_forward";
  const int ra = a.shape.rank(), rb = b.shape.rank(), ry = y.shape.rank();
  for (const Tensor* t : {&a, &b, &y})
    if (t->shape.rank() < 2 || t->dtype != y.dtype || !(t->strides == contiguous_strides(t->shape, Layout::nchw)))
      throw Unsupported(std::string("cuda ") + k +
                        ": operands must be row-major contiguous of rank >= 2 and one dtype, got " + a.to_string() +
                        " x " + b.to_string() + " -> " + y.to_string());
  const std::int64_t M = a.shape[ra - 2], K = a.shape[ra - 1], N = b.shape[rb - 1];
  if (b.shape[rb - 2] != K || y.shape[ry - 2] != M || y.shape[ry - 1] != N) shape_mismatch(k, "a", a, "b", b, "y", y);
  // Row-major Y [M, N] is column-major Yc [N, M] = Bc [N, K] Ac [K, M].
  GemmShape g;
  g.dtype = y.dtype;
  g.m = N, g.n = M, g.k = K;
  g.lda = N, g.ldb = K, g.ldc = N;
  const std::int64_t batch = y.numel() / std::max<std::int64_t>(M * N, 1);
  const std::int64_t batch_a = a.numel() / std::max<std::int64_t>(M * K, 1),
                     batch_b = b.numel() / std::max<std::int64_t>(K * N, 1);
  if (batch_b == 1) {  // a's batch rows are one taller matrix
    g.n = M * batch;
    matmul(g, {b.data, a.data, y.data, nullptr, nullptr});
    return;
  }
  if ((batch_a == batch || batch_a == 1) && batch_b == batch) {
    g.batch = batch;
    g.stride_a = K * N, g.stride_b = batch_a == 1 ? 0 : M * K, g.stride_c = M * N;
    matmul(g, {b.data, a.data, y.data, nullptr, nullptr});
    return;
  }
  // Batch dims broadcast both ways ([2, 1] x [1, 3]): one GEMM per output matrix.
  Tensor yb = y, ab = a, bb = b;
  for (Tensor* t : {&yb, &ab, &bb}) {
    const int r = t->shape.rank() - 2;
    Shape dims, strides;
    for (int d = 0; d < r; ++d) dims.push_back(t->shape[d]), strides.push_back(t->strides[d]);
    t->shape = dims, t->strides = strides;
  }
  const StridedIndex ix = broadcast_index(k, yb, {ab, bb});
  const auto e = static_cast<std::int64_t>(size_bytes(y.dtype));
  for (std::int64_t i = 0; i < batch; ++i) {
    std::int64_t o[kMaxIndexOperands];
    ix.offsets(i, o);
    matmul(g, {static_cast<const char*>(b.data) + o[2] * e, static_cast<const char*>(a.data) + o[1] * e,
               static_cast<char*>(y.data) + o[0] * e, nullptr, nullptr});
  }
}

void LinearEngine::column_sums(const Tensor& x, const Tensor& sums) {
  const char* k = "column_sums";
  if (x.shape.rank() != 2) throw Unsupported(std::string("cuda ") + k + ": x must be [N, C], got " + x.to_string());
  require_vector(k, sums, "sums", x.dtype, x.shape[1]);
  column_sums(x, row_stride(k, x, "x", x.dtype), sums);
}

void LinearEngine::column_sums(const Tensor& x, std::int64_t ld, const Tensor& sums) {
  if (x.shape[1] * 4 > kColumnScratchBytes) {
    column_sums_by_gemm(x, ld, sums);
    return;
  }
  cuda_transformer::column_sums(ctx_.stream, x.dtype, x.data, ld, x.shape[0], x.shape[1], sums.data,
                                column_scratch_.as<float>(), kColumnScratchBytes);
}

void LinearEngine::column_sums_by_gemm(const Tensor& dy, std::int64_t ld, const Tensor& dbias) {
  const std::int64_t n = dy.shape[0], out = dy.shape[1];
  // db [out] = dYc [out, rows] x ones [rows], chunk by chunk, accumulating after the first; the
  // sum stays in f32 (no TF32: it is a handful of FLOPs).
  const auto esize = static_cast<std::int64_t>(size_bytes(dy.dtype));
  for (std::int64_t start = 0; start < n; start += ones_count_) {
    const std::int64_t rows = std::min(ones_count_, n - start);
    GemmShape g;
    g.dtype = dy.dtype;
    g.allow_tf32 = false;
    g.m = out, g.n = 1, g.k = rows;
    g.lda = ld, g.ldb = rows, g.ldc = out;
    g.accumulate = start > 0;
    matmul(g, {static_cast<const unsigned char*>(dy.data) + start * ld * esize, ones(dy.dtype), dbias.data, nullptr,
               nullptr});
  }
}

}  // namespace ab::nn::cuda
