// The attention family's entry points: operand checks (what the kernels take, refused with the
// reason as Unsupported), then one launch sequence on the engine's stream (attention.h).
#include "nn/cuda/attention_engine.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "nn/cuda/attention.h"
#include "nn/cuda/attention_variants.h"
#include "nn/cuda/gpu_sampler.h"

namespace ab::nn::cuda {
namespace {

namespace ca = cuda_attention;

[[noreturn]] void refuse(const char* kernel, const std::string& why) {
  throw Unsupported(std::string("cuda ") + kernel + ": " + why);
}

bool fits_int(std::int64_t v) { return v >= 0 && v <= std::numeric_limits<int>::max(); }

// q, o [B, H, Tq, D]; k, v [B, H, Tk, D], each with a contiguous last dim; stats f32 [B, H, Tq]
// contiguous; key_lengths i32 [B].
ca::Problem check(const char* kernel, const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& o, const Tensor& stats) {
  for (const Tensor* t : {&q, &k, &v, &o})
    if (t->shape.rank() != 4 || t->strides.rank() != 4 || t->strides[3] != 1)
      refuse(kernel, "needs [B, H, T, D] operands with a contiguous last dim, got " + t->to_string());
  const Shape& s = q.shape;
  if (!(o.shape == s) || !(k.shape == v.shape) || k.shape[0] != s[0] || k.shape[1] != s[1] || k.shape[3] != s[3])
    refuse(kernel, "needs q, o [B, H, Tq, D] and k, v [B, H, Tk, D], got " + q.to_string() + ", " + k.to_string() +
                       ", " + v.to_string() + ", " + o.to_string());
  if (q.dtype != k.dtype || q.dtype != v.dtype || q.dtype != o.dtype)
    refuse(kernel, "q, k, v and o must share one dtype, got " + q.to_string() + ", " + k.to_string() + ", " +
                       v.to_string() + ", " + o.to_string());
  if (q.dtype != DType::f32 && q.dtype != DType::f16 && q.dtype != DType::bf16)
    refuse(kernel, "dtype " + std::string(to_string(q.dtype)) + " is not supported (valid: f32, f16, bf16)");
  if (stats.dtype != DType::f32 || !(stats.shape == Shape{s[0], s[1], s[2]}) || !stats.is_contiguous())
    refuse(kernel, "needs contiguous f32 stats [B, H, Tq], got " + stats.to_string());
  if (s[3] < 1 || s[3] > ca::kMaxSimpleDim)
    refuse(kernel, "head dim " + std::to_string(s[3]) + " outside [1, " + std::to_string(ca::kMaxSimpleDim) + "]");
  if (!fits_int(s[0] * s[1]) || !fits_int(s[2]) || !fits_int(k.shape[2]))
    refuse(kernel, "B * H and the sequence lengths must fit in 32 bits, got " + q.to_string());
  if (d.causal && s[2] != k.shape[2]) refuse(kernel, "causal attention needs as many queries as keys");
  ca::Problem p;
  p.dtype = q.dtype;
  p.batch = static_cast<int>(s[0]);
  p.heads = static_cast<int>(s[1]);
  p.queries = static_cast<int>(s[2]);
  p.keys = static_cast<int>(k.shape[2]);
  p.dim = static_cast<int>(s[3]);
  p.scale = static_cast<float>(d.scale > 0 ? d.scale : 1.0 / std::sqrt(static_cast<double>(s[3])));
  p.causal = d.causal;
  if (d.key_lengths.defined()) {
    if (d.key_lengths.dtype != DType::i32 || d.key_lengths.shape.rank() != 1 || d.key_lengths.shape[0] != s[0])
      refuse(kernel, "key_lengths must be i32 [B], got " + d.key_lengths.to_string());
    p.key_lengths = d.key_lengths.as<const std::int32_t>();
    p.key_lengths_stride = d.key_lengths.strides[0];
  }
  return p;
}

ca::Heads heads(const Tensor& t) { return {t.data, t.strides[0], t.strides[1], t.strides[2]}; }

HeadStrides strides_of(const Tensor& t) { return {t.strides[0], t.strides[1], t.strides[2], t.strides[3]}; }

// The cuDNN shape of a call (key lengths: none, the caller checked).
SdpaShape sdpa_shape(bool backward, const ca::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& o) {
  SdpaShape s;
  s.backward = backward;
  s.dtype = p.dtype;
  s.batch = p.batch;
  s.heads = p.heads;
  s.queries = p.queries;
  s.keys = p.keys;
  s.dim = p.dim;
  s.causal = p.causal;
  s.scale = p.scale;
  s.q = strides_of(q);
  s.k = strides_of(k);
  s.v = strides_of(v);
  s.o = strides_of(o);
  return s;
}

bool report_choices() { return env_flag("AB_ATTENTION_CHOICES"); }

}  // namespace

AttentionEngine::AttentionEngine(EngineContext& ctx)
    : ctx_(ctx),
      row_dots_(kScratchRows * 4, ctx.label + " attention row-dot scratch"),
      dq_accum_(kDqAccumElements * 4, ctx.label + " attention dq accumulator") {
  ca::prepare();
}

const SdpaPlan* AttentionEngine::cudnn_plan(const SdpaShape& shape, const SdpaOperands& x,
                                            const std::function<void()>& own) {
  const ca::Implementation impl = ca::variants().implementation;
  if (impl == ca::Implementation::own) return nullptr;
  const auto key = std::make_pair(impl, shape);
  if (const auto it = cudnn_.find(key); it != cudnn_.end()) return it->second.get();
  if (!sdpa_refusal(shape).empty()) {  // decided once per shape: the reason's text is not rebuilt each call
    cudnn_[key] = nullptr;
    return nullptr;
  }
  if (ctx_.capturing()) return nullptr;  // plans are built and timed at an eager call
  std::unique_ptr<SdpaPlan> plan;
  try {
    plan = std::make_unique<SdpaPlan>(shape, ctx_.cudnn.get());
  } catch (const Error& e) {  // refused, or failed to build: the own kernels run it
    if (impl == ca::Implementation::cudnn) throw;
    if (report_choices()) std::fprintf(stderr, "%s: own kernels (%s)\n", shape.to_string().c_str(), e.what());
    cudnn_[key] = nullptr;
    return nullptr;
  }
  GpuSampler sampler(ctx_.stream, plan->label());
  double best_s = std::numeric_limits<double>::infinity();
  int best = -1;  // the own kernels
  std::string timed;
  if (impl == ca::Implementation::fastest) {
    const auto run_own = [&] {
      own();
      return true;
    };
    run_own();  // warms them
    best_s = time_candidate(sampler, run_own, best_s, plan->label() + ", own kernels");
    timed = "own " + format_us(best_s) + " us";
  }
  for (int i = 0; i < plan->candidates(); ++i) {
    const auto launch = [&] { return plan->run(x, i); };
    double t = std::numeric_limits<double>::infinity();
    if (launch()) t = time_candidate(sampler, launch, best_s, plan->label() + ", " + plan->candidate_name(i));
    cudaGetLastError();  // a refused launch leaves no work, only its status
    timed += (timed.empty() ? "" : ", ") + plan->candidate_name(i) + " " +
             (std::isfinite(t) ? format_us(t) + " us" : std::string("failed"));
    if (t < best_s) {
      best_s = t;
      best = i;
    }
  }
  AB_CUDA(cudaStreamSynchronize(ctx_.stream), plan->label());
  if (report_choices())
    std::fprintf(stderr, "%s: %s; timed: %s\n", plan->label().c_str(),
                 best < 0 ? "own kernels" : plan->candidate_name(best).c_str(), timed.c_str());
  if (best < 0 && impl == ca::Implementation::cudnn)
    throw Unsupported(plan->label() + ": every cuDNN plan failed to run: " + timed);
  if (best >= 0) plan->choose(best);
  auto& slot = cudnn_[key];
  slot = best < 0 ? nullptr : std::move(plan);
  return slot.get();
}

void AttentionEngine::attention_forward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& o, const Tensor& stats) {
  const ca::Problem p = check("attention_forward", d, q, k, v, o, stats);
  const auto own = [&] { ca::forward(ctx_.stream, p, heads(q), heads(k), heads(v), heads(o), stats.as<float>()); };
  if (!d.key_lengths.defined()) {
    const SdpaOperands x{.q = q.data, .k = k.data, .v = v.data, .o = o.data, .stats = stats.as<float>()};
    if (const SdpaPlan* plan = cudnn_plan(sdpa_shape(false, p, q, k, v, o), x, own)) {
      if (!plan->run(x)) throw Error(plan->label() + ": cudnnBackendExecute refused the chosen plan");
      return;
    }
  }
  own();
}

void AttentionEngine::attention_backward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& o, const Tensor& dout, const Tensor& stats, const Tensor& dq,
                                         const Tensor& dk, const Tensor& dv) {
  const ca::Problem p = check("attention_backward", d, q, k, v, o, stats);
  check("attention_backward", d, dq, dk, dv, dout, stats);
  if (dq.dtype != q.dtype)
    refuse("attention_backward",
           "the gradients must share the operands' dtype, got " + dq.to_string() + " for " + q.to_string());
  const std::int64_t rows = q.shape[0] * q.shape[1] * q.shape[2];
  if (rows > kScratchRows)
    refuse("attention_backward", "B * H * Tq = " + std::to_string(rows) +
                                     " query rows exceed the engine's scratch of " + std::to_string(kScratchRows));
  // The atomic dQ (faster; its sum's order varies) outside deterministic mode, where it fits.
  const bool atomic_dq = !ctx_.modes.deterministic && ca::variants().atomic_dq && rows * q.shape[3] <= kDqAccumElements;
  const auto own = [&] {
    ca::backward(ctx_.stream, p, heads(q), heads(k), heads(v), heads(o), heads(dout), stats.as<const float>(),
                 heads(dq), heads(dk), heads(dv), row_dots_.as<float>(), atomic_dq ? dq_accum_.as<float>() : nullptr);
  };
  // cuDNN's backward sums dQ by atomics: not in deterministic mode.
  if (!d.key_lengths.defined() && !ctx_.modes.deterministic) {
    SdpaShape shape = sdpa_shape(true, p, q, k, v, o);
    shape.dout = strides_of(dout);
    shape.dq = strides_of(dq);
    shape.dk = strides_of(dk);
    shape.dv = strides_of(dv);
    const SdpaOperands x{.q = q.data,
                         .k = k.data,
                         .v = v.data,
                         .o = o.data,
                         .stats = const_cast<float*>(stats.as<const float>()),
                         .dout = dout.data,
                         .dq = dq.data,
                         .dk = dk.data,
                         .dv = dv.data};
    if (const SdpaPlan* plan = cudnn_plan(shape, x, own)) {
      if (!plan->run(x)) throw Error(plan->label() + ": cudnnBackendExecute refused the chosen plan");
      return;
    }
  }
  own();
}

}  // namespace ab::nn::cuda
