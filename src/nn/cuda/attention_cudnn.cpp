// The composite SDPA graphs of attention_cudnn.h. Operand tensors are [B, H, T, D] with the
// caller's strides; K enters the forward as K^T (dims [B, H, D, Tk], its strides swapped) and V
// the backward as V^T, as cuDNN's fused engines expect. The backward needs two f32 buffers beside
// the engine's own workspace: the rows' sum(dO * O) and the dQ accumulator; the plan owns them.
#include "nn/cuda/attention_cudnn.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <vector>

#include "backend/cuda/check.h"
#include "nn/cuda/cudnn_graph.h"

namespace ab::nn::cuda {
namespace {

using cudnn_graph::Desc;
using cudnn_graph::TensorSpec;
using Dims = std::vector<std::int64_t>;

// Variant-pack ids of the tensors with memory; the virtual ones count from kFirstVirtual.
enum : std::int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDout,
  kDq,
  kDk,
  kDv,
  kScale,
  kNegInf,
  kOne,
  kRowDots,
  kDqAccum,
  kFirstVirtual = 100
};

Dims dims_of(const HeadStrides& s) { return {s[0], s[1], s[2], s[3]}; }
// A [B, H, T, D] operand as [B, H, D, T] (K^T, V^T): the same memory, the last two swapped.
Dims swapped(const HeadStrides& s) { return {s[0], s[1], s[3], s[2]}; }

// The graph as it is built: descriptors kept alive, operations in order, fresh virtual ids.
class GraphBuilder {
 public:
  explicit GraphBuilder(const std::string& label) : label_(label) {}

  const Desc& tensor(const char* name, std::int64_t id, cudnnDataType_t type, Dims dims, Dims strides) {
    return keep_.emplace_back(cudnn_graph::make_tensor({name, id, type, std::move(dims), std::move(strides)}, label_));
  }
  const Desc& virt(const char* name, cudnnDataType_t type, Dims dims, Dims strides) {
    return keep_.emplace_back(cudnn_graph::make_tensor(
        {name, next_virtual_++, type, std::move(dims), std::move(strides), /*is_virtual=*/true}, label_));
  }
  // A float scalar passed by host pointer in the variant pack.
  const Desc& scalar(const char* name, std::int64_t id) {
    return keep_.emplace_back(cudnn_graph::make_tensor(
        {name, id, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, 16, /*by_value=*/true}, label_));
  }

  void matmul(const char* name, const Desc& a, const Desc& b, const Desc& c) {
    Desc& mm = keep_.emplace_back(CUDNN_BACKEND_MATMUL_DESCRIPTOR, std::string(name) + " matmul", label_);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    AB_SET(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    mm.finalize();
    Desc& op = keep_.emplace_back(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, std::string(name) + " operation", label_);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    add(op);
  }
  // y = mode(x, b, t); b and t optional; `axis` for GEN_INDEX.
  void pointwise(const char* name, cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc* t,
                 const Desc& y, cudnnDataType_t math = CUDNN_DATA_FLOAT, std::int64_t axis = -1) {
    Desc& pw = keep_.emplace_back(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, std::string(name) + " pointwise", label_);
    AB_SET(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    AB_SET(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0) AB_SET(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize();
    Desc& op =
        keep_.emplace_back(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, std::string(name) + " operation", label_);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) AB_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t != nullptr) AB_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    add(op);
  }
  void reduction(const char* name, cudnnReduceTensorOp_t mode, const Desc& x, const Desc& y) {
    Desc& r = keep_.emplace_back(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, std::string(name) + " reduction", label_);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    AB_SET(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    AB_SET(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    r.finalize();
    Desc& op =
        keep_.emplace_back(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, std::string(name) + " operation", label_);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    add(op);
  }
  void reshape(const char* name, const Desc& x, const Desc& y) {
    Desc& op = keep_.emplace_back(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, std::string(name) + " operation", label_);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    AB_SET_DESC(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    add(op);
  }

  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }
  std::deque<Desc> release() { return std::move(keep_); }

 private:
  void add(Desc& op) {
    op.finalize();
    ops_.push_back(op.get());
  }
  const std::string& label_;
  std::deque<Desc> keep_;  // a deque: references stay valid as it grows
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::int64_t next_virtual_ = kFirstVirtual;
};

// The causal mask on scores `s` (keys after the query set to -inf): the GEN_INDEX rows and
// columns, their comparison and a select.
const Desc& causal_mask(GraphBuilder& g, const Desc& s, const Desc& neg_inf, const Dims& dims, const Dims& strides) {
  const Desc& row = g.virt("row index", CUDNN_DATA_INT32, dims, strides);
  const Desc& col = g.virt("column index", CUDNN_DATA_INT32, dims, strides);
  g.pointwise("row index", CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
  g.pointwise("column index", CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
  const Desc& keep = g.virt("causal keep", CUDNN_DATA_BOOLEAN, dims, strides);
  g.pointwise("row >= column", CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  const Desc& masked = g.virt("masked scores", CUDNN_DATA_FLOAT, dims, strides);
  g.pointwise("causal select", CUDNN_POINTWISE_BINARY_SELECT, s, &neg_inf, &keep, masked);
  return masked;
}

struct Geometry {
  std::int64_t b, h, tq, tk, d;
  Dims scores, score_strides, rows, row_strides, scores_t, scores_t_strides;
  explicit Geometry(const SdpaShape& s)
      : b(s.batch),
        h(s.heads),
        tq(s.queries),
        tk(s.keys),
        d(s.dim),
        scores{b, h, tq, tk},
        score_strides{h * tq * tk, tq * tk, tk, 1},
        rows{b, h, tq, 1},
        row_strides{h * tq, tq, 1, 1},
        scores_t{b, h, tk, tq},
        scores_t_strides{h * tq * tk, tq * tk, 1, tk} {}
};

// scale * q k^T, f32 [B, H, Tq, Tk]: how both passes begin.
const Desc& scaled_scores(GraphBuilder& g, const Geometry& x, const Desc& q, const Desc& kt, const Desc& scale) {
  const Desc& raw = g.virt("q k^T", CUDNN_DATA_FLOAT, x.scores, x.score_strides);
  g.matmul("q k^T", q, kt, raw);
  const Desc& scaled = g.virt("scaled scores", CUDNN_DATA_FLOAT, x.scores, x.score_strides);
  g.pointwise("scale", CUDNN_POINTWISE_MUL, raw, &scale, nullptr, scaled);
  return scaled;
}

void build_forward(GraphBuilder& g, const SdpaShape& s, cudnnDataType_t io) {
  const Geometry x(s);
  const Desc& q = g.tensor("q", kQ, io, {x.b, x.h, x.tq, x.d}, dims_of(s.q));
  const Desc& kt = g.tensor("k^T", kK, io, {x.b, x.h, x.d, x.tk}, swapped(s.k));
  const Desc& v = g.tensor("v", kV, io, {x.b, x.h, x.tk, x.d}, dims_of(s.v));
  const Desc& o = g.tensor("o", kO, io, {x.b, x.h, x.tq, x.d}, dims_of(s.o));
  const Desc& stats = g.tensor("stats", kStats, CUDNN_DATA_FLOAT, x.rows, x.row_strides);
  const Desc& scale = g.scalar("scale", kScale);

  const Desc& scaled = scaled_scores(g, x, q, kt, scale);
  const Desc* scores = &scaled;
  if (s.causal) scores = &causal_mask(g, scaled, g.scalar("-inf", kNegInf), x.scores, x.score_strides);

  const Desc& max = g.virt("row max", CUDNN_DATA_FLOAT, x.rows, x.row_strides);
  g.reduction("row max", CUDNN_REDUCE_TENSOR_MAX, *scores, max);
  const Desc& shifted = g.virt("scores - max", CUDNN_DATA_FLOAT, x.scores, x.score_strides);
  g.pointwise("subtract max", CUDNN_POINTWISE_SUB, *scores, &max, nullptr, shifted);
  const Desc& e = g.virt("exp", CUDNN_DATA_FLOAT, x.scores, x.score_strides);
  g.pointwise("exp", CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, e);
  const Desc& sum = g.virt("row sum", CUDNN_DATA_FLOAT, x.rows, x.row_strides);
  g.reduction("row sum", CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const Desc& log_sum = g.virt("log row sum", CUDNN_DATA_FLOAT, x.rows, x.row_strides);
  g.pointwise("log", CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, log_sum);
  g.pointwise("log-sum-exp", CUDNN_POINTWISE_ADD, max, &log_sum, nullptr, stats);
  const Desc& p = g.virt("probabilities", io, x.scores, x.score_strides);
  g.pointwise("normalise", CUDNN_POINTWISE_DIV, e, &sum, nullptr, p);
  g.matmul("p v", p, v, o);
}

void build_backward(GraphBuilder& g, const SdpaShape& s, cudnnDataType_t io) {
  const Geometry x(s);
  const Dims qd{x.b, x.h, x.tq, x.d}, kd{x.b, x.h, x.tk, x.d};
  const Desc& q = g.tensor("q", kQ, io, qd, dims_of(s.q));
  const Desc& kt = g.tensor("k^T", kK, io, {x.b, x.h, x.d, x.tk}, swapped(s.k));
  const Desc& vt = g.tensor("v^T", kV, io, {x.b, x.h, x.d, x.tk}, swapped(s.v));
  const Desc& o = g.tensor("o", kO, io, qd, dims_of(s.o));
  const Desc& dout = g.tensor("dO", kDout, io, qd, dims_of(s.dout));
  const Desc& stats = g.tensor("stats", kStats, CUDNN_DATA_FLOAT, x.rows, x.row_strides);
  const Desc& dq = g.tensor("dQ", kDq, io, qd, dims_of(s.dq));
  const Desc& dk = g.tensor("dK", kDk, io, kd, dims_of(s.dk));
  const Desc& dv = g.tensor("dV", kDv, io, kd, dims_of(s.dv));
  const Desc& scale = g.scalar("scale", kScale);
  const Desc& one = g.scalar("one", kOne);

  // Di = rowsum(dO * O), kept in memory for the engine.
  const Desc& prod = g.virt("dO * O", CUDNN_DATA_FLOAT, qd, {x.h * x.tq * x.d, x.tq * x.d, x.h * x.d, 1});
  g.pointwise("dO * O", CUDNN_POINTWISE_MUL, dout, &o, nullptr, prod);
  const Desc& dots = g.virt("rowsum(dO * O)", CUDNN_DATA_FLOAT, x.rows, x.row_strides);
  g.reduction("rowsum(dO * O)", CUDNN_REDUCE_TENSOR_ADD, prod, dots);
  const Desc& row_dots = g.tensor("row dots", kRowDots, CUDNN_DATA_FLOAT, x.rows, x.row_strides);
  g.pointwise("row dots", CUDNN_POINTWISE_MUL, dots, &one, nullptr, row_dots);

  // P = exp(scale q k^T - stats), masked.
  const Desc& scaled = scaled_scores(g, x, q, kt, scale);
  const Desc& shifted = g.virt("scores - stats", CUDNN_DATA_FLOAT, x.scores, x.score_strides);
  g.pointwise("subtract stats", CUDNN_POINTWISE_SUB, scaled, &stats, nullptr, shifted);
  const Desc* logits = &shifted;
  if (s.causal) logits = &causal_mask(g, shifted, g.scalar("-inf", kNegInf), x.scores, x.score_strides);
  const Desc& p = g.virt("probabilities", CUDNN_DATA_FLOAT, x.scores, x.score_strides);
  g.pointwise("exp", CUDNN_POINTWISE_EXP, *logits, nullptr, nullptr, p);

  // dV = P^T dO.
  const Desc& pt = g.virt("p^T", io, x.scores_t, x.scores_t_strides);
  g.reshape("p^T", p, pt);
  g.matmul("p^T dO", pt, dout, dv);

  // dS = P * (dO V^T - Di) * scale.
  const Desc& dp = g.virt("dO v^T", CUDNN_DATA_FLOAT, x.scores, x.score_strides);
  g.matmul("dO v^T", dout, vt, dp);
  const Desc& centred = g.virt("dP - Di", CUDNN_DATA_FLOAT, x.scores, x.score_strides);
  g.pointwise("dP - Di", CUDNN_POINTWISE_SUB, dp, &row_dots, nullptr, centred);
  const Desc& ds_unscaled = g.virt("p (dP - Di)", CUDNN_DATA_FLOAT, x.scores, x.score_strides);
  g.pointwise("p (dP - Di)", CUDNN_POINTWISE_MUL, centred, &p, nullptr, ds_unscaled);
  const Desc& ds = g.virt("dS", CUDNN_DATA_FLOAT, x.scores, x.score_strides);
  g.pointwise("dS scale", CUDNN_POINTWISE_MUL, ds_unscaled, &scale, nullptr, ds);

  // dK = dS^T Q; dQ = dS K, summed in f32 then stored.
  const Desc& dst = g.virt("dS^T", io, x.scores_t, x.scores_t_strides);
  g.reshape("dS^T", ds, dst);
  g.matmul("dS^T q", dst, q, dk);
  const Desc& k = g.virt("k", io, kd, dims_of(s.k));
  g.reshape("k", kt, k);
  const Desc& dq_accum =
      g.tensor("dQ accumulator", kDqAccum, CUDNN_DATA_FLOAT, qd, {x.h * x.tq * x.d, x.tq * x.d, x.d, 1});
  g.matmul("dS k", ds, k, dq_accum);
  g.pointwise("dQ store", CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, nullptr, dq);
}

std::int64_t round_up(std::int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

std::string SdpaShape::to_string() const {
  const auto i = [](std::int64_t n) { return std::to_string(n); };
  return std::string("cudnn sdpa ") + (backward ? "backward" : "forward") + " " + std::string(ab::to_string(dtype)) +
         " [B " + i(batch) + ", H " + i(heads) + ", Tq " + i(queries) + ", Tk " + i(keys) + ", D " + i(dim) + "]" +
         (causal ? " causal" : "") + " q strides " + cudnn_graph::dims_text(dims_of(q));
}

std::string sdpa_refusal(const SdpaShape& s) {
  if (s.dtype != DType::f16 && s.dtype != DType::bf16) return "cuDNN's fused attention takes f16 or bf16";
  if (s.dim % 8 != 0 || s.dim > 128) return "cuDNN's fused attention takes head dims of multiples of 8 up to 128";
  if (s.causal && s.queries != s.keys) return "the causal graph takes as many queries as keys";
  for (const HeadStrides* t : {&s.q, &s.k, &s.v, &s.o})
    if ((*t)[3] != 1) return "cuDNN's fused attention needs a contiguous head dim";
  return {};
}

struct SdpaPlan::Impl {
  SdpaShape shape;
  std::string label;
  cudnnHandle_t handle = nullptr;
  std::deque<Desc> keep;
  std::unique_ptr<Desc> graph;
  std::vector<std::unique_ptr<Desc>> configs;
  std::vector<cudnn_graph::Candidate> candidates;
  int chosen = 0;
  float scale = 1.0f, one = 1.0f, neg_inf = -std::numeric_limits<float>::infinity();
  // [row dots f32 [B H Tq]] [dQ accumulator f32 [B H Tq D]] [the engine's workspace]
  backend::cuda::DeviceBuffer scratch;
  std::int64_t row_dots_offset = 0, dq_accum_offset = 0, workspace_offset = 0;
};

SdpaPlan::SdpaPlan(const SdpaShape& shape, cudnnHandle_t handle) : impl_(std::make_unique<Impl>()) {
  Impl& p = *impl_;
  p.shape = shape;
  p.label = shape.to_string();
  if (std::string why = sdpa_refusal(shape); !why.empty()) throw Unsupported(p.label + ": " + why);
  p.handle = handle;
  p.scale = shape.scale;
  const cudnnDataType_t io = shape.dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  GraphBuilder g(p.label);
  if (shape.backward) build_backward(g, shape, io);
  else build_forward(g, shape, io);
  p.graph = cudnn_graph::make_graph(handle, g.ops(), p.label);
  p.keep = g.release();
  std::string refusals;
  cudnn_graph::try_heuristics(handle, *p.graph, CUDNN_HEUR_MODE_A, p.label, refusals, p.candidates, p.configs);
  if (p.candidates.empty())
    cudnn_graph::try_heuristics(handle, *p.graph, CUDNN_HEUR_MODE_FALLBACK, p.label, refusals, p.candidates, p.configs);
  if (p.candidates.empty())
    throw Unsupported(p.label + ": no cuDNN engine accepts the graph (cuDNN " + std::to_string(cudnnGetVersion()) +
                      ")" + refusals);
  std::int64_t workspace = 0;
  for (const auto& c : p.candidates) workspace = std::max(workspace, c.workspace_bytes);
  const std::int64_t rows = shape.batch * shape.heads * shape.queries;
  if (shape.backward) {
    p.dq_accum_offset = round_up(rows * 4);
    p.workspace_offset = p.dq_accum_offset + round_up(rows * shape.dim * 4);
  }
  p.scratch = backend::cuda::DeviceBuffer(p.workspace_offset + round_up(workspace) + 256, p.label + " workspace");
}

SdpaPlan::~SdpaPlan() = default;

int SdpaPlan::candidates() const { return static_cast<int>(impl_->candidates.size()); }
const std::string& SdpaPlan::candidate_name(int i) const {
  return impl_->candidates.at(static_cast<std::size_t>(i)).name;
}
void SdpaPlan::choose(int i) { impl_->chosen = std::clamp(i, 0, candidates() - 1); }
const std::string& SdpaPlan::label() const { return impl_->label; }

bool SdpaPlan::run(const SdpaOperands& x, int i) const {
  const Impl& p = *impl_;
  const auto& plan = *p.candidates.at(static_cast<std::size_t>(i < 0 ? p.chosen : i)).plan;
  auto* base = static_cast<unsigned char*>(p.scratch.get());
  const auto in = [](const void* ptr) { return const_cast<void*>(ptr); };
  std::vector<std::int64_t> ids{kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs{in(x.q), in(x.k), in(x.v), x.o, x.stats, in(&p.scale)};
  if (p.shape.causal) {
    ids.push_back(kNegInf);
    ptrs.push_back(in(&p.neg_inf));
  }
  if (p.shape.backward) {
    ids.insert(ids.end(), {kDout, kDq, kDk, kDv, kOne, kRowDots, kDqAccum});
    ptrs.insert(ptrs.end(),
                {in(x.dout), x.dq, x.dk, x.dv, in(&p.one), base + p.row_dots_offset, base + p.dq_accum_offset});
  }
  return cudnn_graph::execute(p.handle, plan, ids, ptrs, base + p.workspace_offset, p.label) == CUDNN_STATUS_SUCCESS;
}

}  // namespace ab::nn::cuda
