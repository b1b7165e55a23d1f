// The transformer layers: token + position embedding, LayerNorm, GELU and the attention core
// (the projections around it are Linear ops). FLOPs and bytes per docs/ENGINE.md's rules; the
// attention counts the query-key pairs its mask leaves (flash attention skips masked blocks).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/graph.h"
#include "nn/ops.h"

namespace ab::nn {

// ---- Embedding

std::vector<Tensor> Embedding::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes the tokens, got " + std::to_string(in.size()) + " inputs");
  require(vocab_ >= 1 && positions_ >= 1 && channels_ >= 1, "vocabulary, positions and channels must be >= 1");
  require(in[0].dtype == DType::i32 && in[0].shape.rank() == 2,
          "tokens must be i32 [B, T], got " + in[0].to_string());
  require(in[0].shape[1] <= positions_, "a sequence of " + std::to_string(in[0].shape[1]) +
                                            " tokens is longer than the model's " + std::to_string(positions_) +
                                            " positions");
  require_float(Tensor::describe(dtype_, Shape{1}));
  return {Tensor::describe(dtype_, Shape{in[0].shape[0] * in[0].shape[1], channels_})};
}

std::vector<ParamSpec> Embedding::parameters() const {
  // GPT-2's initialisation (Hugging Face's initializer_range): N(0, 0.02) for both tables.
  const DType t = out_.empty() ? DType::f32 : out_[0].dtype;
  return {{"wte", Shape{vocab_, channels_}, ParamRole::weight, {ParamInit::Dist::normal, 0.02}, t},
          {"wpe", Shape{positions_, channels_}, ParamRole::weight, {ParamInit::Dist::normal, 0.02}, t}};
}

void Embedding::forward(Kernels& k, const OpTensors& t) { k.embedding_forward(t.in[0], t.params[0], t.params[1], t.out[0]); }

void Embedding::backward(Kernels& k, const OpTensors& t) {
  k.embedding_backward(t.in[0], t.dout[0], t.dparams[0], /*accumulate_wte=*/false, t.dparams[1]);
}

std::int64_t Embedding::flops(Pass) const { return out_[0].numel(); }  // one add per output element

std::int64_t Embedding::bytes(Pass p) const {
  // Forward: tokens, a row of each table and the output row per token. Backward: dy, the tokens
  // and both gradient tables written whole (unseen rows are zeroed).
  const std::int64_t rows = out_[0].numel(), e = bytes_of(out_[0].dtype), tokens = in_[0].numel() * 4;
  if (p == Pass::forward) return tokens + 3 * rows * e;
  return tokens + rows * e + (vocab_ + positions_) * channels_ * e;
}

// ---- LayerNorm

std::vector<Tensor> LayerNorm::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  require(in[0].shape.rank() == 2, "input must be [N, C], got " + in[0].shape.to_string());
  require_float(in[0]);
  require(desc_.epsilon > 0, "epsilon must be > 0");
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

std::vector<ParamSpec> LayerNorm::parameters() const {
  const std::int64_t c = in_.empty() ? 0 : in_[0].shape[1];
  const DType t = in_.empty() ? DType::f32 : in_[0].dtype;
  return {{"weight", Shape{c}, ParamRole::norm_scale, {ParamInit::Dist::ones, 0.0}, t},
          {"bias", Shape{c}, ParamRole::norm_shift, {ParamInit::Dist::zeros, 0.0}, t}};
}

std::vector<Tensor> LayerNorm::saved() const {
  // f32 beside 16-bit data; an f64 graph (gradient checks) keeps them in f64, which its central
  // differences need: rounded statistics would make y a step function of x.
  const Shape rows{in_[0].shape[0]};
  const DType t = wide_dtype(in_[0].dtype);
  return {Tensor::describe(t, rows), Tensor::describe(t, rows)};  // mean, 1/std
}

void LayerNorm::forward(Kernels& k, const OpTensors& t) {
  k.layernorm_forward(desc_, t.in[0], t.params[0], t.params[1], t.out[0], t.saved[0], t.saved[1]);
}

void LayerNorm::backward(Kernels& k, const OpTensors& t) {
  // The parameters' gradients are always wanted; dx only where the input needs one.
  const Tensor dx = t.din[0];
  if (dx.defined())
    k.layernorm_backward(t.in[0], t.dout[0], t.params[0], t.saved[0], t.saved[1], dx, t.din_accumulate[0], t.dparams[0],
                         t.dparams[1]);
  else
    throw Unsupported("layer '" + name() + "' (layernorm): backward without an input gradient");
}

std::int64_t LayerNorm::flops(Pass p) const {
  // Forward per element: sum, subtract, square-sum, scale, shift (5); backward about twice that.
  const std::int64_t n = in_[0].numel();
  return p == Pass::forward ? 5 * n : 10 * n;
}

std::int64_t LayerNorm::bytes(Pass p) const {
  const std::int64_t n = in_[0].numel(), rows = in_[0].shape[0], c = in_[0].shape[1], e = element_bytes();
  const std::int64_t stats = 2 * rows * bytes_of(wide_dtype(in_[0].dtype)), params = 2 * c * e;
  if (p == Pass::forward) return 2 * n * e + params + stats;
  return 3 * n * e + params + stats + params;  // x, dy, dx; gamma; statistics; dgamma, dbeta
}

// ---- GELU

std::vector<Tensor> Gelu::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  require_float(in[0]);
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

void Gelu::forward(Kernels& k, const OpTensors& t) { k.gelu_forward(t.in[0], t.out[0]); }

void Gelu::backward(Kernels& k, const OpTensors& t) {
  if (t.din[0].defined()) k.gelu_backward(t.in[0], t.dout[0], t.din[0], t.din_accumulate[0]);
}

// Per element: the cubic, tanh and the products (about 8 forward, 14 with the derivative).
std::int64_t Gelu::flops(Pass p) const { return (p == Pass::forward ? 8 : 14) * in_[0].numel(); }

std::int64_t Gelu::bytes(Pass p) const { return (p == Pass::forward ? 2 : 3) * in_[0].numel() * element_bytes(); }

// ---- Attention

namespace {

// A [B, H, T, D] view of part `part` (0 q, 1 k, 2 v) of rows laid out [B, T, parts, H, D].
Tensor head_view(const Tensor& rows, std::int64_t parts, std::int64_t part, std::int64_t heads, std::int64_t seq) {
  const std::int64_t width = rows.shape[1] / parts, dim = width / heads, batch = rows.shape[0] / seq;
  Tensor v = Tensor::describe(rows.dtype, Shape{batch, heads, seq, dim}, Layout::nchw, rows.device);
  v.strides = {seq * parts * width, dim, parts * width, 1};
  v.data = rows.data == nullptr ? nullptr
                                : static_cast<char*>(rows.data) + part * width * static_cast<std::int64_t>(size_bytes(rows.dtype));
  return v;
}

}  // namespace

std::vector<Tensor> Attention::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1 || in.size() == 2, "takes qkv and optional key lengths, got " + std::to_string(in.size()));
  const Tensor& qkv = in[0];
  require(qkv.shape.rank() == 2 && qkv.shape[1] % 3 == 0, "qkv must be [B*T, 3C], got " + qkv.shape.to_string());
  require_float(qkv);
  require(heads_ >= 1 && seq_ >= 1, "heads and sequence length must be >= 1");
  const std::int64_t width = qkv.shape[1] / 3;
  require(width % heads_ == 0, std::to_string(heads_) + " heads do not divide the width " + std::to_string(width));
  require(qkv.shape[0] % seq_ == 0, "qkv's " + std::to_string(qkv.shape[0]) + " rows are not whole sequences of " +
                                        std::to_string(seq_));
  if (in.size() == 2)
    require(in[1].dtype == DType::i32 && in[1].shape == Shape{qkv.shape[0] / seq_},
            "key lengths must be i32 [B], got " + in[1].to_string());
  return {Tensor::describe(qkv.dtype, Shape{qkv.shape[0], width})};
}

std::vector<Tensor> Attention::saved() const {
  const std::int64_t batch = in_[0].shape[0] / seq_;
  return {Tensor::describe(wide_dtype(in_[0].dtype), Shape{batch, heads_, seq_})};  // as LayerNorm's statistics
}

AttentionDesc Attention::desc(const OpTensors& t) const {
  return {.scale = 0.0, .causal = causal_, .key_lengths = t.in.size() == 2 ? t.in[1] : Tensor{}};
}

void Attention::forward(Kernels& k, const OpTensors& t) {
  k.attention_forward(desc(t), head_view(t.in[0], 3, 0, heads_, seq_), head_view(t.in[0], 3, 1, heads_, seq_),
                      head_view(t.in[0], 3, 2, heads_, seq_), head_view(t.out[0], 1, 0, heads_, seq_), t.saved[0]);
}

void Attention::backward(Kernels& k, const OpTensors& t) {
  if (!t.din[0].defined()) return;
  if (t.din_accumulate[0])
    throw Unsupported("layer '" + name() + "' (attention): the qkv gradient is written, never accumulated");
  k.attention_backward(desc(t), head_view(t.in[0], 3, 0, heads_, seq_), head_view(t.in[0], 3, 1, heads_, seq_),
                       head_view(t.in[0], 3, 2, heads_, seq_), head_view(t.out[0], 1, 0, heads_, seq_),
                       head_view(t.dout[0], 1, 0, heads_, seq_), t.saved[0], head_view(t.din[0], 3, 0, heads_, seq_),
                       head_view(t.din[0], 3, 1, heads_, seq_), head_view(t.din[0], 3, 2, heads_, seq_));
}

std::int64_t Attention::visible_pairs() const { return causal_ ? seq_ * (seq_ + 1) / 2 : seq_ * seq_; }

std::int64_t Attention::flops(Pass p) const {
  // Two matrix products forward (q k^T, p v), four backward (dp, dq, dk, dv), over the pairs the
  // mask leaves; a padding mask is data, so its pairs count as visible. The softmax: ~5 per pair.
  const std::int64_t batch = in_[0].shape[0] / seq_, dim = out_[0].shape[1] / heads_;
  const std::int64_t pairs = batch * heads_ * visible_pairs();
  return p == Pass::forward ? 4 * pairs * dim + 5 * pairs : 8 * pairs * dim + 5 * pairs;
}

std::int64_t Attention::bytes(Pass p) const {
  // A fused kernel reads q, k and v and writes o and the statistics once; backward reads them and
  // do, and writes dq, dk and dv. Scores stay on chip.
  const std::int64_t qkv = in_[0].numel() * element_bytes(), o = out_[0].numel() * element_bytes();
  const std::int64_t stats = (in_[0].shape[0] / seq_) * heads_ * seq_ * bytes_of(wide_dtype(in_[0].dtype));
  if (p == Pass::forward) return qkv + o + stats;
  return qkv + 2 * o + stats + qkv;
}

// ---- builder helpers

Value embedding(GraphBuilder& b, const std::string& name, Value tokens, std::int64_t vocab, std::int64_t positions,
                std::int64_t channels) {
  return b.add1(std::make_unique<Embedding>(name, vocab, positions, channels, activation_dtype(b.options())), {tokens});
}
Value layernorm(GraphBuilder& b, const std::string& name, Value x, double epsilon) {
  return b.add1(std::make_unique<LayerNorm>(name, epsilon), {x});
}
Value gelu(GraphBuilder& b, const std::string& name, Value x) { return b.add1(std::make_unique<Gelu>(name), {x}); }
Value attention(GraphBuilder& b, const std::string& name, Value qkv, std::int64_t heads, std::int64_t seq, bool causal) {
  return b.add1(std::make_unique<Attention>(name, heads, seq, causal), {qkv});
}

}  // namespace ab::nn
