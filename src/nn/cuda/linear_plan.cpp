// The linear family's GEMM plans (linear_engine.h): descriptors, epilogue and the algorithm choice.
// cuBLASLt's heuristic ranks its candidates by a model, and for transformer shapes (16k rows, K of
// 768 or 3072, N up to 50304) its first is not always the fastest, so at a plan's first call the
// first kTimedCandidates are run on the call's own operands, queued behind a GPU spin so events
// time the GPU's work alone (gpu_sampler.h), and the fastest median wins; the call itself then
// runs with it. Two cases take the heuristic's first instead: a shape first met inside a
// CUDA-graph capture (nothing may be synchronised or timed there), and deterministic mode, where
// the choice must not depend on timing noise (two processes must pick the same kernel to give the
// same bits; split-K reductions are excluded there as well).
#include <algorithm>
#include <limits>
#include <utility>

#include "nn/cuda/gpu_sampler.h"
#include "nn/cuda/linear_engine.h"

namespace ab::nn::cuda {
namespace {

constexpr int kTimedCandidates = 8;

cudaDataType_t lt_dtype(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: break;
  }
  throw Unsupported("cuda linear runs f32, f16 or bf16, not " + std::string(to_string(t)));
}

cublasLtEpilogue_t lt_epilogue(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case LtEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::gelu: return CUBLASLT_EPILOGUE_GELU;
    case LtEpilogue::gelu_bias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case LtEpilogue::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case LtEpilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case LtEpilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case LtEpilogue::bgradb: return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

const char* epilogue_name(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::none: return "";
    case LtEpilogue::bias: return " +bias";
    case LtEpilogue::gelu: return " +gelu";
    case LtEpilogue::gelu_bias: return " +gelu_bias";
    case LtEpilogue::gelu_aux: return " +gelu_aux";
    case LtEpilogue::gelu_aux_bias: return " +gelu_aux_bias";
    case LtEpilogue::dgelu: return " +dgelu";
    case LtEpilogue::bgradb: return " +bgradb";
  }
  return "";
}

bool reads_or_writes_bias(LtEpilogue e) {
  return e == LtEpilogue::bias || e == LtEpilogue::gelu_bias || e == LtEpilogue::gelu_aux_bias ||
         e == LtEpilogue::bgradb;
}
bool uses_aux(LtEpilogue e) {
  return e == LtEpilogue::gelu_aux || e == LtEpilogue::gelu_aux_bias || e == LtEpilogue::dgelu;
}

// The power of two a pointer is aligned to, up to 256: kernels the heuristic offers depend on it
// (vector widths), so a plan is made per alignment class.
std::int64_t alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  return v == 0 ? 256 : static_cast<std::int64_t>(std::min<std::uintptr_t>(v & (~v + 1), 256));
}

std::string plan_label(const GemmShape& g, bool tf32) {
  return "linear gemm " + std::string(to_string(g.dtype)) + (tf32 ? " (tf32)" : "") + " m=" + std::to_string(g.m) +
         " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) + (g.trans_a ? " T" : " N") +
         (g.trans_b ? "T" : "N") + " ld " + std::to_string(g.lda) + "/" + std::to_string(g.ldb) + "/" +
         std::to_string(g.ldc) + epilogue_name(g.epilogue) +
         (uses_aux(g.epilogue) ? " aux ld " + std::to_string(g.aux_ld) : "") + (g.accumulate ? " +=" : "") +
         (g.batch > 1 ? " batch " + std::to_string(g.batch) + " strides " + std::to_string(g.stride_a) + "/" +
                            std::to_string(g.stride_b) + "/" + std::to_string(g.stride_c)
                      : "");
}

}  // namespace

void LinearEngine::set_pointers(const LtPlan& p, const GemmShape& g, const GemmOperands& ops) {
  // Host-side attributes, read when the call is enqueued (and recorded by a capture).
  if (reads_or_writes_bias(g.epilogue))
    AB_CUBLAS_LAZY(
        cublasLtMatmulDescSetAttribute(p.op.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ops.bias, sizeof(ops.bias)),
        p.label);
  if (uses_aux(g.epilogue))
    AB_CUBLAS_LAZY(cublasLtMatmulDescSetAttribute(p.op.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ops.aux,
                                                  sizeof(ops.aux)),
                   p.label);
}

cublasStatus_t LinearEngine::launch(const LtPlan& p, const cublasLtMatmulAlgo_t& algo, const GemmShape& g,
                                    const GemmOperands& ops) {
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  return cublasLtMatmul(lt_.get(), p.op.get(), &alpha, ops.a, p.a.get(), ops.b, p.b.get(), &beta, ops.c, p.c.get(),
                        ops.c, p.c.get(), &algo, lt_workspace_.get(), static_cast<std::size_t>(lt_workspace_.bytes()),
                        ctx_.stream);
}

LtPlan& LinearEngine::lt_plan(const GemmShape& g, const GemmOperands& ops) {
  const bool tf32 = g.allow_tf32 && ctx_.modes.tf32 && g.dtype == DType::f32;
  Key key;
  for (std::int64_t v : {static_cast<std::int64_t>(g.dtype), std::int64_t{g.trans_a}, std::int64_t{g.trans_b}, g.m, g.n,
                         g.k, g.lda, g.ldb, g.ldc, static_cast<std::int64_t>(g.epilogue), g.aux_ld,
                         std::int64_t{g.accumulate}, std::int64_t{tf32}, std::int64_t{ctx_.modes.deterministic},
                         alignment(ops.a), alignment(ops.b), alignment(ops.c), alignment(ops.bias), alignment(ops.aux)})
    key.add(v);
  for (std::int64_t v : {g.batch, g.stride_a, g.stride_b, g.stride_c}) key.add(v);
  if (auto it = lt_plans_.find(key); it != lt_plans_.end()) return *it->second;

  auto plan = std::make_unique<LtPlan>();
  plan->label = plan_label(g, tf32);
  plan->gelu = g.epilogue == LtEpilogue::gelu || g.epilogue == LtEpilogue::gelu_bias ||
               g.epilogue == LtEpilogue::gelu_aux || g.epilogue == LtEpilogue::gelu_aux_bias ||
               g.epilogue == LtEpilogue::dgelu;
  const std::string& label = plan->label;
  const cudaDataType_t t = lt_dtype(g.dtype);
  plan->op = backend::cuda::make_lt_matmul(tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F,
                                           g.trans_a, g.trans_b, label);
  const cublasLtEpilogue_t epilogue = lt_epilogue(g.epilogue);
  AB_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
            label);
  if (uses_aux(g.epilogue))
    AB_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.aux_ld,
                                             sizeof(g.aux_ld)),
              label);
  set_pointers(*plan, g, ops);  // the heuristic reads the pointers' alignment
  const auto layout = [&](std::int64_t rows, std::int64_t cols, std::int64_t ld) {
    return backend::cuda::make_lt_layout(t, rows, cols, ld, label);
  };
  plan->a = g.trans_a ? layout(g.k, g.m, g.lda) : layout(g.m, g.k, g.lda);
  plan->b = g.trans_b ? layout(g.n, g.k, g.ldb) : layout(g.k, g.n, g.ldb);
  plan->c = layout(g.m, g.n, g.ldc);
  if (g.batch > 1) {
    const auto batched = [&](const backend::cuda::LtLayoutPtr& l, std::int64_t stride) {
      const auto count = static_cast<std::int32_t>(g.batch);
      AB_CUBLAS(cublasLtMatrixLayoutSetAttribute(l.get(), CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
                label);
      AB_CUBLAS(cublasLtMatrixLayoutSetAttribute(l.get(), CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                 sizeof(stride)),
                label);
    };
    batched(plan->a, g.stride_a);
    batched(plan->b, g.stride_b);
    batched(plan->c, g.stride_c);
  }

  backend::cuda::LtQuery q;
  q.op = plan->op.get();
  q.a = plan->a.get();
  q.b = plan->b.get();
  q.c = plan->c.get();
  q.workspace_bytes = lt_workspace_.bytes();
  // cuBLASLt is bit-reproducible run to run for one algorithm; deterministic mode also rules out
  // split-K reductions so no partial-sum order can depend on scheduling.
  q.no_split_reduction = ctx_.modes.deterministic;
  q.max_candidates = kTimedCandidates;
  const auto found = backend::cuda::lt_heuristic(lt_.get(), q, label);
  if (found.empty()) {
    plan->choice = "cuBLASLt offers no algorithm on " + ctx_.label;
  } else {
    choose_algorithm(*plan, g, ops, found);
  }
  return *lt_plans_.emplace(key, std::move(plan)).first->second;
}

void LinearEngine::choose_algorithm(LtPlan& plan, const GemmShape& g, const GemmOperands& ops,
                                    const std::vector<cublasLtMatmulHeuristicResult_t>& found) {
  plan.usable = true;
  plan.algo = found.front().algo;
  const char* why = found.size() == 1          ? "the heuristic's only candidate"
                    : ctx_.capturing()         ? "the heuristic's first (first met inside a capture)"
                    : ctx_.modes.deterministic ? "the heuristic's first (deterministic mode)"
                                               : nullptr;
  if (why != nullptr) {
    plan.choice = backend::cuda::describe_lt_algo(plan.algo) + ", " + why;
    return;
  }
  // Runs overwrite D (and the GELU input, the bias gradient), which the real call rewrites after;
  // where D is also read (beta = 1, or D is the GELU input) they write a scratch D instead.
  GemmOperands run = ops;
  backend::cuda::DeviceBuffer scratch;
  if (g.accumulate || ops.c == ops.aux) {
    const std::int64_t bytes =
        ((g.batch - 1) * g.stride_c + g.ldc * (g.n - 1) + g.m) * static_cast<std::int64_t>(size_bytes(g.dtype));
    try {
      scratch = backend::cuda::DeviceBuffer(bytes, plan.label + ", timing scratch D");
    } catch (const OutOfMemory&) {
      plan.choice = backend::cuda::describe_lt_algo(plan.algo) + ", the heuristic's first (no memory to time on)";
      return;
    }
    AB_CUDA(cudaMemsetAsync(scratch.get(), 0, static_cast<std::size_t>(bytes), ctx_.stream), plan.label);
    run.c = scratch.get();
  }
  set_pointers(plan, g, run);
  const std::string what = plan.label + ", algorithm timing";
  GpuSampler sampler(ctx_.stream, what);
  double best_s = std::numeric_limits<double>::infinity();
  std::size_t best = 0;
  std::string log;
  for (std::size_t i = 0; i < found.size(); ++i) {
    const cublasLtMatmulAlgo_t& algo = found[i].algo;
    log += " " + std::to_string(i + 1) + ":";
    if (launch(plan, algo, g, run) != CUBLAS_STATUS_SUCCESS) {  // the warm-up run; a refusal queues nothing
      cudaGetLastError();
      log += "refused";
      continue;
    }
    const double s = time_candidate(
        sampler, [&] { return launch(plan, algo, g, run) == CUBLAS_STATUS_SUCCESS; }, best_s, what);
    log += format_us(s) + "us";
    if (s < best_s) best_s = s, best = i;
  }
  AB_CUDA(cudaStreamSynchronize(ctx_.stream), what);  // the scratch D is freed on return
  if (best_s == std::numeric_limits<double>::infinity()) {
    plan.usable = false;
    plan.choice =
        "cuBLASLt refused all " + std::to_string(found.size()) + " candidates of its heuristic on " + ctx_.label;
    return;
  }
  plan.algo = found[best].algo;
  plan.choice = backend::cuda::describe_lt_algo(plan.algo) + ", " + format_us(best_s) + " us, heuristic rank " +
                std::to_string(best + 1) + " of " + std::to_string(found.size()) + " timed (us by rank:" + log + ")";
}

bool LinearEngine::matmul(const GemmShape& g, const GemmOperands& ops) {
  LtPlan& p = lt_plan(g, ops);
  if (!p.usable) {
    if (g.epilogue == LtEpilogue::none || g.epilogue == LtEpilogue::bias) throw Unsupported(p.label + ": " + p.choice);
    return false;
  }
  set_pointers(p, g, ops);
  AB_CUBLAS_LAZY(launch(p, p.algo, g, ops), p.label);
  return true;
}

void LinearEngine::count_fusions(Kernels::FusionCounts& counts) const {
  for (const auto& [key, plan] : lt_plans_)
    if (plan->gelu) ++(plan->usable ? counts.fused : counts.unfused);
}

std::vector<std::string> LinearEngine::choices() const {
  std::vector<std::string> out;
  for (const auto& [key, plan] : lt_plans_) out.push_back(plan->label + ": " + plan->choice);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ab::nn::cuda
