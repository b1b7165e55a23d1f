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
  // wte accumulates where a tied classifier's backward wrote its gradient first.
  k.embedding_backward(t.in[0], t.dout[0], t.dparams[0], t.dparams_accumulate[0], t.dparams[1]);
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
  std::vector<ParamSpec> specs{{"weight", Shape{c}, ParamRole::norm_scale, {ParamInit::Dist::ones, 0.0}, t}};
  if (!rms_) specs.push_back({"bias", Shape{c}, ParamRole::norm_shift, {ParamInit::Dist::zeros, 0.0}, t});
  return specs;
}

std::vector<Tensor> LayerNorm::saved() const {
  // f32 beside 16-bit data; an f64 graph (gradient checks) keeps them in f64, which its central
  // differences need: rounded statistics would make y a step function of x.
  const Shape rows{in_[0].shape[0]};
  const DType t = wide_dtype(in_[0].dtype);
  if (rms_) return {Tensor::describe(t, rows)};                   // 1/std
  return {Tensor::describe(t, rows), Tensor::describe(t, rows)};  // mean, 1/std
}

void LayerNorm::forward(Kernels& k, const OpTensors& t) {
  if (rms_) k.rmsnorm_forward(desc_, t.in[0], t.params[0], t.out[0], t.saved[0]);
  else k.layernorm_forward(desc_, t.in[0], t.params[0], t.params[1], t.out[0], t.saved[0], t.saved[1]);
}

void LayerNorm::backward(Kernels& k, const OpTensors& t) {
  // The parameters' gradients are always wanted; dx only where the input needs one.
  const Tensor dx = t.din[0];
  if (!dx.defined())
    throw Unsupported("layer '" + name() + "' (" + std::string(kind()) + "): backward without an input gradient");
  if (rms_) k.rmsnorm_backward(t.in[0], t.dout[0], t.params[0], t.saved[0], dx, t.din_accumulate[0], t.dparams[0]);
  else
    k.layernorm_backward(t.in[0], t.dout[0], t.params[0], t.saved[0], t.saved[1], dx, t.din_accumulate[0], t.dparams[0],
                         t.dparams[1]);
}

std::int64_t LayerNorm::flops(Pass p) const {
  // Forward per element: sum, subtract, square-sum, scale, shift (5; RMSNorm's square-sum and
  // scale, 3); backward about twice that.
  const std::int64_t n = in_[0].numel(), per = rms_ ? 3 : 5;
  return p == Pass::forward ? per * n : 2 * per * n;
}

std::int64_t LayerNorm::bytes(Pass p) const {
  const std::int64_t n = in_[0].numel(), rows = in_[0].shape[0], c = in_[0].shape[1], e = element_bytes();
  const std::int64_t tables = rms_ ? 1 : 2;  // gamma (and beta); 1/std (and the mean)
  const std::int64_t stats = tables * rows * bytes_of(wide_dtype(in_[0].dtype)), params = tables * c * e;
  if (p == Pass::forward) return 2 * n * e + params + stats;
  return 3 * n * e + params + stats + params;  // x, dy, dx; gamma; statistics; dgamma, dbeta
}

// ---- Dropout

std::vector<Tensor> Dropout::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  require_float(in[0]);
  require(desc_.probability >= 0 && desc_.probability < 1,
          "probability must be in [0, 1), got " + std::to_string(desc_.probability));
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

void Dropout::forward(Kernels& k, const OpTensors& t) {
  if (t.training) k.dropout_forward(desc_, t.in[0], t.out[0], t.step_counter);
  else k.cast(t.in[0], t.out[0]);  // the identity
}

void Dropout::backward(Kernels& k, const OpTensors& t) {
  if (t.din[0].defined()) k.dropout_backward(desc_, t.dout[0], t.din[0], t.step_counter, t.din_accumulate[0]);
}

std::int64_t Dropout::flops(Pass) const { return out_[0].numel(); }  // a multiply per element

std::int64_t Dropout::bytes(Pass) const { return 2 * out_[0].numel() * bytes_of(out_[0].dtype); }

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

// ---- MLP

std::vector<Tensor> Mlp::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes one input, got " + std::to_string(in.size()));
  require(in[0].shape.rank() == 2, "input must be [N, C], got " + in[0].shape.to_string());
  require_float(in[0]);
  require(hidden_ >= 1, "hidden features must be >= 1");
  return {Tensor::describe(in[0].dtype, in[0].shape)};
}

std::vector<ParamSpec> Mlp::parameters() const {
  const std::int64_t c = in_.empty() ? 0 : in_[0].shape[1];
  const DType t = in_.empty() ? DType::f32 : in_[0].dtype;
  const ParamInit w{ParamInit::Dist::normal, std_}, proj{ParamInit::Dist::normal, proj_std_};
  return {{"c_fc.weight", Shape{hidden_, c}, ParamRole::weight, w, t},
          {"c_fc.bias", Shape{hidden_}, ParamRole::bias, {}, t},
          {"c_proj.weight", Shape{c, hidden_}, ParamRole::weight, proj, t},
          {"c_proj.bias", Shape{c}, ParamRole::bias, {}, t}};
}

std::vector<Tensor> Mlp::saved() const {
  // The GELU's input is kept for backward alone: an inference graph plans no bytes for it.
  const Shape h{in_[0].shape[0], hidden_}, pre = training_ ? h : Shape{0, hidden_};
  return {Tensor::describe(in_[0].dtype, pre), Tensor::describe(in_[0].dtype, h)};  // gelu's input, its output
}

void Mlp::forward(Kernels& k, const OpTensors& t) {
  const Tensor& pre = t.saved[0];
  const Tensor& h = t.saved[1];
  k.linear_gelu_forward(t.in[0], t.params[0], t.params[1], t.training && training_ ? pre : Tensor{}, h);
  k.linear_forward(h, t.params[2], t.params[3], t.out[0]);
}

void Mlp::backward(Kernels& k, const OpTensors& t) {
  const Tensor& pre = t.saved[0];
  const Tensor& h = t.saved[1];
  k.linear_backward_weights(h, t.dout[0], t.dparams[2], t.dparams[3]);
  const Tensor& dpre = h;  // h is read: its bytes take the gradient of the GELU's input
  // c_fc's bias gradient with dpre (its column sums), not by the weight-gradient GEMM's epilogue.
  k.linear_backward_data_gelu(t.dout[0], t.params[2], pre, dpre, t.dparams[1]);
  k.linear_backward_weights(t.in[0], dpre, t.dparams[0], Tensor{});
  if (t.din[0].defined()) k.linear_backward_data(dpre, t.params[0], t.din[0], t.din_accumulate[0]);
}

std::int64_t Mlp::flops(Pass p) const {
  // Two GEMMs of N x C x hidden forward (plus bias and GELU), three or four backward.
  const std::int64_t n = in_[0].shape[0], c = in_[0].shape[1], gemm = 2 * n * c * hidden_;
  const std::int64_t pointwise = n * (hidden_ + c);
  if (p == Pass::forward) return 2 * gemm + pointwise + 8 * n * hidden_;
  return (input_needs_grad(0) ? 4 : 3) * gemm + pointwise + 14 * n * hidden_;
}

std::int64_t Mlp::bytes(Pass p) const {
  // Forward: x, W1, b1 in, pre (training) and h out; h, W2, b2 in, y out. Backward: h, dy, dW2, db2; dy, W2,
  // pre, dpre; x, dpre, dW1, db1; dpre, W1, dx.
  const std::int64_t n = in_[0].shape[0], c = in_[0].shape[1], e = element_bytes();
  const std::int64_t x = n * c, h = n * hidden_, w = c * hidden_;
  if (p == Pass::forward) return (x + w + hidden_ + (training_ ? 2 : 1) * h + h + w + c + x) * e;
  const std::int64_t data = input_needs_grad(0) ? h + w + x : 0;
  return (h + x + w + c + x + w + 2 * h + x + h + w + hidden_ + data) * e;
}

// ---- classifier + loss

std::vector<Tensor> ClassifierLoss::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 2, "takes x and the labels, got " + std::to_string(in.size()) + " inputs");
  require(in[0].shape.rank() == 2, "x must be [N, C], got " + in[0].shape.to_string());
  require_float(in[0]);
  require(in[1].dtype == DType::i32 && in[1].shape == Shape{in[0].shape[0]},
          "labels must be i32 [" + std::to_string(in[0].shape[0]) + "], got " + in[1].to_string());
  require(vocab_ >= 1, "the vocabulary must be >= 1");
  return {Tensor::describe(wide_dtype(in[0].dtype), Shape{1})};
}

std::vector<ParamSpec> ClassifierLoss::parameters() const {
  const std::int64_t c = in_.empty() ? 0 : in_[0].shape[1];
  const DType t = in_.empty() ? DType::f32 : in_[0].dtype;
  std::vector<ParamSpec> p{{"weight", Shape{vocab_, c}, ParamRole::weight, {ParamInit::Dist::normal, 0.02}, t}};
  if (bias_) p.push_back({"bias", Shape{vocab_}, ParamRole::bias, {}, t});
  return p;
}

std::vector<Tensor> ClassifierLoss::saved() const {
  return {Tensor::describe(in_[0].dtype, Shape{in_[0].shape[0], padded_vocab()})};
}

Tensor ClassifierLoss::logits(const OpTensors& t) const {
  Tensor v = t.saved[0];
  v.shape = Shape{in_[0].shape[0], vocab_};
  v.strides = {padded_vocab(), 1};
  return v;
}

namespace {

// Rows [first, first + count) of a matrix [R, C] (any row stride): a view of the same bytes.
Tensor row_block(const Tensor& t, std::int64_t first, std::int64_t count) {
  if (!t.defined()) return t;
  Tensor v = t;
  v.shape = t.shape.rank() == 1 ? Shape{count} : Shape{count, t.shape[1]};
  v.data = static_cast<char*>(t.data) + first * t.strides[0] * static_cast<std::int64_t>(size_bytes(t.dtype));
  return v;
}

// Columns [first, first + count) of a matrix [R, C] with unit column stride.
Tensor column_block(const Tensor& t, std::int64_t first, std::int64_t count) {
  Tensor v = t;
  v.shape = Shape{t.shape[0], count};
  v.data = static_cast<char*>(t.data) + first * static_cast<std::int64_t>(size_bytes(t.dtype));
  return v;
}

// The vocabulary in two GEMMs: its largest multiple of 128 and the rest (GPT-2's 50257 = 50176 +
// 81), so that the big one has whole tiles; the tail's GEMMs are 0.16% of the work. On an H200
// the GPT-2 124M step (B16 x 1024, bf16) took 51.7 ms with one GEMM over the 50257 rows and
// 33.3 ms split (bench/HISTORY.md). Here, not in the linear engine, because the vocabulary is the
// one output this wide and odd; the engine's other shapes are multiples of 128.
struct VocabBlock {
  std::int64_t first, count;
};
std::vector<VocabBlock> vocab_blocks(std::int64_t vocab) {
  const std::int64_t aligned = vocab / 128 * 128;
  std::vector<VocabBlock> blocks;
  if (aligned > 0) blocks.push_back({0, aligned});
  if (vocab > aligned) blocks.push_back({aligned, vocab - aligned});
  return blocks;
}

}  // namespace

void ClassifierLoss::forward(Kernels& k, const OpTensors& t) {
  const Tensor l = logits(t);
  for (const VocabBlock& b : vocab_blocks(vocab_))
    k.linear_forward(t.in[0], row_block(t.params[0], b.first, b.count),
                     bias_ ? row_block(t.params[1], b.first, b.count) : Tensor{}, column_block(l, b.first, b.count));
  k.cross_entropy_fused(l, t.in[1], t.out[0], t.training ? l : Tensor{}, t.loss_seed);
}

void ClassifierLoss::backward(Kernels& k, const OpTensors& t) {
  if (!t.training) throw Error("layer '" + name() + "' (classifier_loss): backward after an evaluation forward");
  if (t.dparams_accumulate[0])
    throw Unsupported("layer '" + name() +
                      "' (classifier_loss): its weight's gradient is written, never added to; "
                      "tie the embedding to the classifier, not the classifier to a later layer");
  const Tensor dlogits = logits(t);  // forward left the gradient there
  bool first = true;
  for (const VocabBlock& b : vocab_blocks(vocab_)) {
    const Tensor dl = column_block(dlogits, b.first, b.count);
    k.linear_backward_weights(t.in[0], dl, row_block(t.dparams[0], b.first, b.count),
                              bias_ ? row_block(t.dparams[1], b.first, b.count) : Tensor{});
    if (t.din[0].defined())
      k.linear_backward_data(dl, row_block(t.params[0], b.first, b.count), t.din[0], t.din_accumulate[0] || !first);
    first = false;
  }
}

std::int64_t ClassifierLoss::flops(Pass p) const {
  const std::int64_t n = in_[0].shape[0], c = in_[0].shape[1], gemm = 2 * n * c * vocab_;
  if (p == Pass::forward) return gemm + 6 * n * vocab_;  // the softmax, loss and gradient per logit
  return (input_needs_grad(0) ? 2 : 1) * gemm;
}

std::int64_t ClassifierLoss::bytes(Pass p) const {
  // Forward: x, W, the logits written, then read and overwritten by their gradient. Backward: the
  // gradient read by each GEMM, with x, W, dW (and dx).
  const std::int64_t n = in_[0].shape[0], c = in_[0].shape[1], e = element_bytes();
  const std::int64_t logits = n * vocab_, x = n * c, w = vocab_ * c, labels = n * 4;
  if (p == Pass::forward) return (x + w + 3 * logits) * e + labels;
  const std::int64_t data = input_needs_grad(0) ? logits + w + x : 0;
  return (logits + x + w + data) * e;
}

// ---- last-position logits

std::vector<Tensor> LastPositionLogits::do_infer(const std::vector<Tensor>& in) {
  require(in.size() == 1, "takes x, got " + std::to_string(in.size()) + " inputs");
  require(in[0].shape.rank() == 2, "x must be [B*T, C], got " + in[0].shape.to_string());
  require_float(in[0]);
  require(vocab_ >= 1 && seq_ >= 1, "the vocabulary and the sequence length must be >= 1");
  require(in[0].shape[0] % seq_ == 0,
          "x's " + std::to_string(in[0].shape[0]) + " rows are not whole sequences of " + std::to_string(seq_));
  return {Tensor::describe(in[0].dtype, Shape{in[0].shape[0] / seq_, vocab_})};
}

std::vector<ParamSpec> LastPositionLogits::parameters() const {
  const std::int64_t c = in_.empty() ? 0 : in_[0].shape[1];
  const DType t = in_.empty() ? DType::f32 : in_[0].dtype;
  return {{"weight", Shape{vocab_, c}, ParamRole::weight, {ParamInit::Dist::normal, 0.02}, t}};
}

std::int64_t LastPositionLogits::prepare(Kernels& k, const OpTensors& descs) {
  if (training_) fail("is inference only (the last positions' logits); a training graph takes classifier_loss");
  return Op::prepare(k, descs);
}

Tensor LastPositionLogits::last_rows(const Tensor& x) const {
  Tensor v = x;
  v.shape = Shape{x.shape[0] / seq_, x.shape[1]};
  v.strides = {seq_ * x.strides[0], 1};
  if (x.data != nullptr)
    v.data = static_cast<char*>(x.data) + (seq_ - 1) * x.strides[0] * static_cast<std::int64_t>(size_bytes(x.dtype));
  return v;
}

void LastPositionLogits::forward(Kernels& k, const OpTensors& t) {
  const Tensor x = last_rows(t.in[0]);
  for (const VocabBlock& b : vocab_blocks(vocab_))
    k.linear_forward(x, row_block(t.params[0], b.first, b.count), Tensor{}, column_block(t.out[0], b.first, b.count));
}

void LastPositionLogits::backward(Kernels&, const OpTensors&) {
  throw Error("layer '" + name() + "' (last_position_logits): inference only, no backward");
}

std::int64_t LastPositionLogits::flops(Pass p) const {
  return p == Pass::forward ? 2 * out_[0].numel() * in_[0].shape[1] : 0;
}

std::int64_t LastPositionLogits::bytes(Pass p) const {
  // The last rows of x and the weight read, the logits written.
  const std::int64_t rows = out_[0].shape[0], c = in_[0].shape[1];
  return p == Pass::forward ? (rows * c + vocab_ * c + rows * vocab_) * element_bytes() : 0;
}

// ---- builder helpers

Value embedding(GraphBuilder& b, const std::string& name, Value tokens, std::int64_t vocab, std::int64_t positions,
                std::int64_t channels) {
  return b.add1(std::make_unique<Embedding>(name, vocab, positions, channels, activation_dtype(b.options())), {tokens});
}
Value layernorm(GraphBuilder& b, const std::string& name, Value x, double epsilon) {
  return b.add1(std::make_unique<LayerNorm>(name, epsilon), {x});
}
Value rmsnorm(GraphBuilder& b, const std::string& name, Value x, double epsilon) {
  return b.add1(LayerNorm::rms(name, epsilon), {x});
}
Value dropout(GraphBuilder& b, const std::string& name, Value x, double probability) {
  if (probability == 0.0) return x;
  std::uint64_t seed = 0xcbf29ce484222325ull ^ b.options().seed;  // FNV-1a over the name
  for (const char ch : name) seed = (seed ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return b.add1(std::make_unique<Dropout>(name, probability, seed), {x});
}
Value gelu(GraphBuilder& b, const std::string& name, Value x) { return b.add1(std::make_unique<Gelu>(name), {x}); }
Value attention(GraphBuilder& b, const std::string& name, Value qkv, std::int64_t heads, std::int64_t seq, bool causal) {
  return b.add1(std::make_unique<Attention>(name, heads, seq, causal), {qkv});
}
Value mlp(GraphBuilder& b, const std::string& name, Value x, std::int64_t hidden, double std, double proj_std) {
  return b.add1(std::make_unique<Mlp>(name, hidden, std, proj_std), {x});
}
Value classifier_loss(GraphBuilder& b, const std::string& name, Value x, Value labels, std::int64_t vocab,
                      const std::string& tied_to, bool bias) {
  return b.add1(std::make_unique<ClassifierLoss>(name, vocab, tied_to, bias), {x, labels});
}
Value last_position_logits(GraphBuilder& b, const std::string& name, Value x, std::int64_t vocab, std::int64_t seq,
                           const std::string& tied_to) {
  return b.add1(std::make_unique<LastPositionLogits>(name, vocab, seq, tied_to), {x});
}

}  // namespace ab::nn
