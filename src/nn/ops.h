// The layers of the engine and one-line helpers that add them to a graph. Each op is a thin
// adapter between the graph's bound tensors and the Kernels contract, plus its cost model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "nn/graph.h"
#include "nn/op.h"

namespace ab::nn {

struct Conv2dAttrs {
  std::int64_t out_channels = 1;
  std::int64_t kernel_h = 1, kernel_w = 1;
  Conv2dDesc conv;  // stride, padding, dilation, groups
};

// No bias: in the models here a batch norm follows every convolution.
class Conv2d final : public Op {
 public:
  Conv2d(std::string name, const Conv2dAttrs& a) : Op(std::move(name)), a_(a) {}
  std::string_view kind() const override { return "conv2d"; }
  std::vector<ParamSpec> parameters() const override;
  bool backward_reads_input(int i) const override { return i == 0; }
  std::int64_t prepare(Kernels& k, const OpTensors& descs) override;
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;
  std::int64_t macs() const;  // multiply-adds of the forward pass
  const Conv2dAttrs& attrs() const { return a_; }
  // The backward passes backward() runs in the graph's context (set_context), which prepare asks for.
  ConvPasses passes() const;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  Conv2dAttrs a_;
};

class BatchNorm2d final : public Op {
 public:
  BatchNorm2d(std::string name, const BatchNormDesc& d = {}) : Op(std::move(name)), d_(d) {}
  std::string_view kind() const override { return "batchnorm2d"; }
  std::vector<ParamSpec> parameters() const override;  // weight, bias, running_mean, running_var
  std::vector<Tensor> saved() const override;           // batch mean and 1/sqrt(var + eps)
  bool backward_reads_input(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  BatchNormDesc d_;
};

// Batch norm, the residual add that ends a ResNet block (optional) and the ReLU as one op (kind
// "bn_act"): y = ReLU(BN(x) (+ z)). Parameters and statistics are BatchNorm2d's, under the same
// names, so values move between fused and unfused graphs by name. Training runs
// Kernels::batchnorm_activation_* (cuDNN's fused NHWC kernels where it takes them); inference runs
// the batch norm with running statistics, then add and ReLU in place. Backward reads x and y (its
// ReLU mask) and keeps the kernels' mask (saved).
class BatchNormActivation final : public Op {
 public:
  BatchNormActivation(std::string name, const BatchNormDesc& d = {}) : Op(name), bn_(std::move(name), d), d_(d) {}
  std::string_view kind() const override { return "bn_act"; }
  std::vector<ParamSpec> parameters() const override;  // weight, bias, running_mean, running_var
  std::vector<Tensor> saved() const override;           // batch mean, 1/sqrt(var + eps), the i32 mask
  bool backward_reads_input(int i) const override { return i == 0; }
  bool backward_reads_output(int i) const override { return i == 0; }
  std::int64_t prepare(Kernels& k, const OpTensors& descs) override;
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  bool residual() const { return in_.size() > 1; }
  BatchNorm2d bn_;  // batch norm's shape rules, parameters (same names) and saved statistics
  BatchNormDesc d_;
};

class Relu final : public Op {
 public:
  using Op::Op;
  std::string_view kind() const override { return "relu"; }
  bool backward_reads_output(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
};

// The residual add: y = a + b, both of one shape.
class Add final : public Op {
 public:
  using Op::Op;
  std::string_view kind() const override { return "add"; }
  bool passes_gradient_through(int /*i*/) const override { return true; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
};

// Inference only: the epilogue of a convolution whose batch norm was folded into its weights
// (models::fold_batchnorm_parameters): y = act(x + bias[c] (+ residual)), act = ReLU or identity,
// in one kernel where the unfolded graph runs a batch norm, a ReLU and (block ends) an add.
// Inputs x [N, C, H, W] and optionally a residual of the same shape; parameter "bias" [C], of the
// batch-norm parameters' type (f32 beside 16-bit data) and role bias. A training graph is refused
// at bind: the folded parameters are not the trained ones, so there is nothing to differentiate.
class BiasActivation final : public Op {
 public:
  BiasActivation(std::string name, bool relu) : Op(std::move(name)), relu_(relu) {}
  std::string_view kind() const override { return "bias_act"; }
  std::vector<ParamSpec> parameters() const override;
  std::int64_t prepare(Kernels& k, const OpTensors& descs) override;
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;  // throws Error
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;
  bool relu() const { return relu_; }

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  bool relu_;
};

// Inference only: a convolution with its folded batch norm's epilogue inside it, y = act(conv(x, w)
// + bias[c] (+ residual)) (Kernels::conv2d_bias_activation_forward), where a folded graph would run
// conv2d then bias_act. Parameters "weight" (as Conv2d's) and "bias" [C_out], both of x's dtype
// (cuDNN's fused call takes a 16-bit bias beside 16-bit data). Inputs x and optionally a residual of
// the output's shape. Training graphs are refused at bind, as bias_act's are.
// With `fp8` (GraphOptions precision fp8): the convolution runs on e4m3 operands with per-tensor
// dynamic scales (Kernels::conv2d_fp8_forward); where the backend refuses the configuration at
// prepare (Unsupported), the op runs the 16-bit path instead and keeps the refusal's reason.
class ConvBiasActivation final : public Op {
 public:
  ConvBiasActivation(std::string name, const Conv2dAttrs& a, bool relu, bool fp8 = false)
      : Op(name), conv_(std::move(name), a), relu_(relu) {
    fp8_.asked = fp8;
  }
  std::string_view kind() const override { return "conv_bias_act"; }
  std::vector<ParamSpec> parameters() const override;
  std::int64_t prepare(Kernels& k, const OpTensors& descs) override;
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;  // throws Error
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;
  const Conv2dAttrs& attrs() const { return conv_.attrs(); }
  std::int64_t macs() const { return conv_.macs(); }
  bool relu() const { return relu_; }
  bool fp8() const { return fp8_.asked; }      // asked to run in fp8
  bool runs_fp8() const { return fp8_.runs; }  // after prepare: the backend took it
  // After prepare: why an fp8 op runs in 16 bits (the backend's Unsupported message); else empty.
  const std::string& fp8_fallback_reason() const { return fp8_.fallback_reason; }
  const Fp8Choice* fp8_choice() const override { return &fp8_; }

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  Conv2d conv_;  // the convolution's shape rules, parameters and cost
  bool relu_;
  Fp8Choice fp8_;
};

class MaxPool2d final : public Op {
 public:
  MaxPool2d(std::string name, const Pool2dDesc& d) : Op(std::move(name)), d_(d) {}
  std::string_view kind() const override { return "maxpool2d"; }
  bool backward_reads_input(int i) const override { return i == 0; }
  bool backward_reads_output(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  Pool2dDesc d_;
};

// [N, C, H, W] -> [N, C]: torchvision's AdaptiveAvgPool2d((1, 1)) followed by flatten.
class GlobalAvgPool final : public Op {
 public:
  using Op::Op;
  std::string_view kind() const override { return "global_avgpool"; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
};

// [N, in] -> [N, out] with weight [out, in] and bias [out], PyTorch's default initialisation, or
// `weight_init` with zero biases (GPT-2 and BERT: N(0, 0.02)).
// With `fp8` (inference graphs of precision fp8): x [N, in] and w [out, in] run as the e4m3 1x1
// convolution they are (Kernels::conv2d_fp8_*, on the same bytes viewed [N, in, 1, 1] NHWC), where
// the kernels take it; else the 16-bit GEMM, keeping the reason (as ConvBiasActivation).
class Linear final : public Op {
 public:
  Linear(std::string name, std::int64_t out_features, bool bias = true, bool fp8 = false,
         std::optional<ParamInit> weight_init = std::nullopt)
      : Op(std::move(name)), out_features_(out_features), bias_(bias), weight_init_(weight_init) {
    fp8_.asked = fp8;
  }
  std::string_view kind() const override { return "linear"; }
  std::vector<ParamSpec> parameters() const override;
  bool backward_reads_input(int i) const override { return i == 0; }
  std::int64_t prepare(Kernels& k, const OpTensors& descs) override;
  const Fp8Choice* fp8_choice() const override { return &fp8_; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;
  std::int64_t macs() const;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  std::int64_t out_features_;
  bool bias_;
  std::optional<ParamInit> weight_init_;
  Fp8Choice fp8_;
};

// (logits [N, K], labels [N] i32) -> mean loss [1]; keeps the probabilities for backward.
class SoftmaxCrossEntropy final : public Op {
 public:
  using Op::Op;
  std::string_view kind() const override { return "softmax_cross_entropy"; }
  std::vector<Tensor> saved() const override;
  bool backward_reads_input(int i) const override { return i == 1; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
};

// ---- transformer layers (ops_transformer.cpp)

// (tokens [B, T] i32) -> [B*T, C] in `dtype`: the token's row of wte [V, C] plus the position's row of
// wpe [P, C] (GPT-2's wte and wpe; BERT adds its token-type row elsewhere). T <= P.
class Embedding final : public Op {
 public:
  Embedding(std::string name, std::int64_t vocab, std::int64_t positions, std::int64_t channels,
            DType dtype = DType::f32)
      : Op(std::move(name)), vocab_(vocab), positions_(positions), channels_(channels), dtype_(dtype) {}
  std::string_view kind() const override { return "embedding"; }
  std::vector<ParamSpec> parameters() const override;
  bool backward_reads_input(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  std::int64_t vocab_, positions_, channels_;
  DType dtype_;  // of the rows and tables: the graph's activation dtype
};

// [N, C] -> [N, C] normalised over C with a learned scale and shift; mean and 1/std [N] kept (f32
// beside 16-bit data, the data's own type otherwise). LayerNorm::rms: RMSNorm (Llama's): scaled by
// 1 / sqrt(mean(x^2) + epsilon), no mean subtracted and no shift; 1/std kept.
class LayerNorm final : public Op {
 public:
  LayerNorm(std::string name, double epsilon = 1e-5) : Op(std::move(name)), desc_{epsilon} {}
  static std::unique_ptr<LayerNorm> rms(std::string name, double epsilon = 1e-6) {
    auto op = std::make_unique<LayerNorm>(std::move(name), epsilon);
    op->rms_ = true;
    return op;
  }
  std::string_view kind() const override { return rms_ ? "rmsnorm" : "layernorm"; }
  std::vector<ParamSpec> parameters() const override;
  std::vector<Tensor> saved() const override;
  bool backward_reads_input(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  LayerNormDesc desc_;
  bool rms_ = false;
};

// GELU, tanh form, elementwise; backward reads the input.
class Gelu final : public Op {
 public:
  using Op::Op;
  std::string_view kind() const override { return "gelu"; }
  bool backward_reads_input(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
};

// Dropout (DropoutDesc, inverted): in a training forward y = x * keep / (1 - probability) with a
// mask drawn anew each step from (seed, the graph's step counter); in an inference forward y = x.
// Backward rebuilds the mask (nothing saved). `seed` tells the graph's dropout ops apart.
class Dropout final : public Op {
 public:
  Dropout(std::string name, double probability, std::uint64_t seed) : Op(std::move(name)), desc_{probability, seed} {}
  std::string_view kind() const override { return "dropout"; }
  bool draws_random() const override { return true; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  DropoutDesc desc_;
};

// Multi-head self-attention core: (qkv [B*T, 3C], the fused projection's output laid out as
// [B, T, 3, H, D], optional key_lengths [B] i32) -> [B*T, C] laid out as [B, T, H, D]; the
// softmax's log-sum-exp [B, H, T] kept for backward (f32, or f64 in an f64 graph). `seq` is T; C = heads x head_dim.
class Attention final : public Op {
 public:
  Attention(std::string name, std::int64_t heads, std::int64_t seq, bool causal)
      : Op(std::move(name)), heads_(heads), seq_(seq), causal_(causal) {}
  std::string_view kind() const override { return "attention"; }
  std::vector<Tensor> saved() const override;
  bool backward_reads_input(int) const override { return true; }
  bool backward_reads_output(int) const override { return true; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;
  // Query-key pairs the masks leave per head and sequence: T^2, or T(T+1)/2 when causal.
  std::int64_t visible_pairs() const;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  AttentionDesc desc(const OpTensors& t) const;
  std::int64_t heads_, seq_;
  bool causal_;
};

// A transformer's MLP as one op (kind "mlp"): y = c_proj(gelu(c_fc(x))), x [N, C] -> [N, C] through
// `hidden` features, so that the GELU runs in the GEMMs' epilogues both ways (Kernels::
// linear_gelu_forward, linear_backward_data_gelu). Parameters c_fc.weight [hidden, C], c_fc.bias,
// c_proj.weight [C, hidden], c_proj.bias (Hugging Face GPT-2's names), N(0, std) weights with
// c_proj's std `proj_std` (GPT-2 scales it by 1/sqrt(2 layers)), zero biases. Keeps the GELU's
// input and output [N, hidden] for backward (an inference graph plans the output alone); backward
// writes the GELU input's gradient over the kept output once c_proj's weight gradient has read it.
class Mlp final : public Op {
 public:
  Mlp(std::string name, std::int64_t hidden, double std, double proj_std)
      : Op(std::move(name)), hidden_(hidden), std_(std), proj_std_(proj_std) {}
  std::string_view kind() const override { return "mlp"; }
  std::vector<ParamSpec> parameters() const override;
  std::vector<Tensor> saved() const override;
  bool backward_reads_input(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  std::int64_t hidden_;
  double std_, proj_std_;
};

// The language-model head and its loss as one op (kind "classifier_loss"): (x [N, C], labels [N]
// i32, -1 where a row is not scored) -> the mean cross-entropy [1] of logits = x weight^T over a
// vocabulary of V. The logits [N, V] are kept in rows padded to a multiple of 128 (GEMMs at full
// speed) and overwritten by their gradient in the same pass that computes the loss
// (Kernels::cross_entropy_fused), so the largest tensor of a GPT step is written once and read
// twice (both backward GEMMs). Its weight [V, C] may be tied to the token embedding (`tied_to`,
// GPT-2 and BERT), else N(0, 0.02); `bias` adds a zero-initialised bias [V] (BERT's decoder). In a training graph it
// must produce the graph's loss (its gradient is the one backward seeds); an evaluation forward computes the loss only.
class ClassifierLoss final : public Op {
 public:
  ClassifierLoss(std::string name, std::int64_t vocab, std::string tied_to = {}, bool bias = false)
      : Op(std::move(name)), vocab_(vocab), tied_to_(std::move(tied_to)), bias_(bias) {}
  std::string_view kind() const override { return "classifier_loss"; }
  std::vector<ParamSpec> parameters() const override;
  std::string tied_to(std::size_t i) const override { return i == 0 ? tied_to_ : std::string{}; }
  std::vector<Tensor> saved() const override;  // the padded logits, then their gradient
  bool backward_reads_input(int i) const override { return i == 0; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;
  std::int64_t padded_vocab() const { return (vocab_ + 127) / 128 * 128; }

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  Tensor logits(const OpTensors& t) const;  // [N, V] over the saved rows of padded_vocab()
  std::int64_t vocab_;
  std::string tied_to_;
  bool bias_;
};

// A causal language model's inference head (kind "last_position_logits"): x [B*T, C] -> the logits
// [B, V] = x_last weight^T of each sequence's last position, what a generation's prefill needs
// (Hugging Face's logits_to_keep=1). The last rows are read where they lie (a view of x with a row
// stride of T x C), not gathered. Weight [V, C], tied as ClassifierLoss's may be; the vocabulary's
// GEMMs split as its. Inference only: a training graph is refused at bind (train the loss head).
class LastPositionLogits final : public Op {
 public:
  LastPositionLogits(std::string name, std::int64_t vocab, std::int64_t seq, std::string tied_to = {})
      : Op(std::move(name)), vocab_(vocab), seq_(seq), tied_to_(std::move(tied_to)) {}
  std::string_view kind() const override { return "last_position_logits"; }
  std::vector<ParamSpec> parameters() const override;
  std::string tied_to(std::size_t i) const override { return i == 0 ? tied_to_ : std::string{}; }
  std::int64_t prepare(Kernels& k, const OpTensors& descs) override;
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;  // throws Error
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  Tensor last_rows(const Tensor& x) const;  // [B, C] view of x's rows T-1, 2T-1, ...
  std::int64_t vocab_, seq_;
  std::string tied_to_;
};

// ---- learned compression (ops_compress.cpp; models/compression.h)

struct ConvTranspose2dAttrs {
  std::int64_t out_channels = 1;
  std::int64_t kernel_h = 1, kernel_w = 1;
  Conv2dDesc conv;  // stride, padding, dilation, groups, as PyTorch's ConvTranspose2d
  std::int64_t output_padding_h = 0, output_padding_w = 0;  // < max(stride, dilation)
};

// The transposed convolution (PyTorch's ConvTranspose2d, no bias): the adjoint of the convolution
// of the same geometry from the (larger) output to the input, so it runs on the Kernels
// convolution calls with the roles swapped: its forward is that convolution's backward-data, its
// data gradient the convolution's forward, its weight gradient the backward-filter with x and dy
// swapped. Weight [in, out / groups, R, S] (PyTorch's layout = the swapped convolution's KCRS).
// H_out = (H - 1) * stride - 2 * pad + dilation * (R - 1) + output_padding + 1.
class ConvTranspose2d final : public Op {
 public:
  ConvTranspose2d(std::string name, const ConvTranspose2dAttrs& a) : Op(std::move(name)), a_(a) {}
  std::string_view kind() const override { return "conv_transpose2d"; }
  std::vector<ParamSpec> parameters() const override;
  bool backward_reads_input(int i) const override { return i == 0; }
  std::int64_t prepare(Kernels& k, const OpTensors& descs) override;
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;
  std::int64_t macs() const;  // multiply-adds of the forward pass (= the swapped convolution's)
  // The swapped convolution's passes: backward-data always (the forward), backward-filter when
  // training; its forward (the data gradient) is always prepared.
  ConvPasses passes() const;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  ConvTranspose2dAttrs a_;
  std::int64_t conv_workspace_ = 0;  // of the convolution calls; an accumulating data gradient's scratch follows
};

// Rounds to the nearest multiple of `step` (step 1: the nearest integer; ties to even) in training
// and inference; backward passes the gradient through unchanged (the straight-through estimator:
// rounding's true derivative is 0 almost everywhere, which would stop the encoder learning). A
// step below 1 is the uniform quantiser's bin width: it sets how many bins the latent spans.
class QuantizeSte final : public Op {
 public:
  explicit QuantizeSte(std::string name, double step = 1.0) : Op(std::move(name)), step_(step) {}
  std::string_view kind() const override { return "quantize_ste"; }
  bool passes_gradient_through(int /*i*/) const override { return true; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  double step_;
};

// (x_hat, x, latent) -> (loss [1], mse [1]): loss = mse(x_hat, x) + lambda * mean(|latent|).
// The L1 term is a proxy for the rate: the bits an entropy coder spends on a latent grow with its
// magnitude (a Laplacian prior's code length is |y| / b + const), but no entropy model is learned
// here, so the loss is not a bit count. mse is the distortion alone (PSNR); it gets no gradient.
class RateDistortionLoss final : public Op {
 public:
  RateDistortionLoss(std::string name, const RateDistortionDesc& d) : Op(std::move(name)), d_(d) {}
  std::string_view kind() const override { return "rate_distortion_loss"; }
  bool backward_reads_input(int /*i*/) const override { return true; }
  void forward(Kernels& k, const OpTensors& t) override;
  void backward(Kernels& k, const OpTensors& t) override;
  std::int64_t flops(Pass p) const override;
  std::int64_t bytes(Pass p) const override;

 private:
  std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) override;
  RateDistortionDesc d_;
};

// Helpers that add one layer to a graph and return its output.
Value conv2d(GraphBuilder& b, const std::string& name, Value x, const Conv2dAttrs& a);
Value batchnorm2d(GraphBuilder& b, const std::string& name, Value x, const BatchNormDesc& d = {});
Value relu(GraphBuilder& b, const std::string& name, Value x);
// y = ReLU(BN(x) (+ residual)); residual may be undefined.
Value batchnorm_activation(GraphBuilder& b, const std::string& name, Value x, Value residual,
                           const BatchNormDesc& d = {});
Value add(GraphBuilder& b, const std::string& name, Value x, Value y);
// residual may be undefined (id -1): then y = act(x + bias).
Value bias_activation(GraphBuilder& b, const std::string& name, Value x, Value residual, bool relu);
// residual may be undefined: then y = act(conv(x) + bias). fp8: see ConvBiasActivation.
Value conv_bias_activation(GraphBuilder& b, const std::string& name, Value x, const Conv2dAttrs& a, Value residual,
                           bool relu, bool fp8 = false);
Value maxpool2d(GraphBuilder& b, const std::string& name, Value x, const Pool2dDesc& d);
Value global_avgpool(GraphBuilder& b, const std::string& name, Value x);
Value linear(GraphBuilder& b, const std::string& name, Value x, std::int64_t out_features, bool bias = true,
             bool fp8 = false, std::optional<ParamInit> weight_init = std::nullopt);
Value softmax_cross_entropy(GraphBuilder& b, const std::string& name, Value logits, Value labels);
Value conv_transpose2d(GraphBuilder& b, const std::string& name, Value x, const ConvTranspose2dAttrs& a);
Value quantize_ste(GraphBuilder& b, const std::string& name, Value x, double step = 1.0);
// Transformer layers (GPT-2, BERT); attention's qkv is the fused projection's [B*T, 3C] output.
Value embedding(GraphBuilder& b, const std::string& name, Value tokens, std::int64_t vocab, std::int64_t positions,
                std::int64_t channels);
Value layernorm(GraphBuilder& b, const std::string& name, Value x, double epsilon = 1e-5);
Value rmsnorm(GraphBuilder& b, const std::string& name, Value x, double epsilon = 1e-6);
// x itself where probability is 0 (no op); the op's seed from the graph's seed and its name.
Value dropout(GraphBuilder& b, const std::string& name, Value x, double probability);
Value gelu(GraphBuilder& b, const std::string& name, Value x);
Value attention(GraphBuilder& b, const std::string& name, Value qkv, std::int64_t heads, std::int64_t seq, bool causal);
Value mlp(GraphBuilder& b, const std::string& name, Value x, std::int64_t hidden, double std, double proj_std);
Value classifier_loss(GraphBuilder& b, const std::string& name, Value x, Value labels, std::int64_t vocab,
                      const std::string& tied_to = {}, bool bias = false);
Value last_position_logits(GraphBuilder& b, const std::string& name, Value x, std::int64_t vocab, std::int64_t seq,
                           const std::string& tied_to = {});
// Generic inference ops (ops_generic.h; the ONNX importer's): forward only, a training graph using
// one is refused at bind. UnaryKind, UnaryAttrs and BinaryKind are in nn/kernels.h.
Value unary(GraphBuilder& b, const std::string& name, Value x, const UnaryAttrs& a);
// numpy broadcasting of both operands ([N, C, H, W] * [N, C, 1, 1], [N, C, H, W] + [C, 1, 1]).
Value binary(GraphBuilder& b, const std::string& name, Value x, Value y, BinaryKind kind);
// A non-trainable parameter-backed tensor (role running_stat, parameter "<name>.value") that bind
// initialises to `values` (logical row-major order); in the activation dtype unless one is given.
Value constant(GraphBuilder& b, const std::string& name, const Shape& shape, const std::vector<double>& values);
Value constant(GraphBuilder& b, const std::string& name, const Shape& shape, const std::vector<double>& values,
               DType dtype);
Value concat(GraphBuilder& b, const std::string& name, const std::vector<Value>& xs, int axis);
std::vector<Value> split(GraphBuilder& b, const std::string& name, Value x, int axis,
                         const std::vector<std::int64_t>& sizes);
// One entry per dim, normalised: 0 <= start, steps >= 1; an end past the dim is clamped.
Value slice(GraphBuilder& b, const std::string& name, Value x, const std::vector<std::int64_t>& starts,
            const std::vector<std::int64_t>& ends, const std::vector<std::int64_t>& steps);
Value transpose(GraphBuilder& b, const std::string& name, Value x, const std::vector<int>& perm);
// Same element count, in logical row-major order: a copy, except in an inference graph where x and
// the result are both row-major (not NHWC rank 4), where the result is x's own bytes (Graph's plan).
Value reshape(GraphBuilder& b, const std::string& name, Value x, const Shape& shape);
Value softmax(GraphBuilder& b, const std::string& name, Value x, int axis);
// No axes: every dim (ONNX's default).
Value reduce_mean(GraphBuilder& b, const std::string& name, Value x, const std::vector<int>& axes, bool keepdims);
Value avgpool2d(GraphBuilder& b, const std::string& name, Value x, const Pool2dDesc& d, bool count_include_pad);
// Constant mode, one entry per dim; a negative entry crops.
Value pad(GraphBuilder& b, const std::string& name, Value x, const std::vector<std::int64_t>& begins,
          const std::vector<std::int64_t>& ends, double value);
// x [N, C, H, W] -> [N, C, out_h, out_w]; nearest = ONNX asymmetric + floor, linear = bilinear half_pixel.
Value resize(GraphBuilder& b, const std::string& name, Value x, std::int64_t out_h, std::int64_t out_w, bool linear);
// Batched [..., M, K] x [..., K, N], batch dims broadcast (numpy); both of rank >= 2.
Value matmul(GraphBuilder& b, const std::string& name, Value a, Value bm);
// indices i32, i64 or a float holding integers; negative ones count from the end.
Value gather(GraphBuilder& b, const std::string& name, Value table, Value indices, int axis);
Value where(GraphBuilder& b, const std::string& name, Value cond, Value x, Value y);
// The output shape is the broadcast of x's and `shape` (ONNX's Expand).
Value expand(GraphBuilder& b, const std::string& name, Value x, const Shape& shape);
// Normalises over dims axis..end; parameters "weight" (ones) and "bias" (zeros) of that trailing shape.
Value layer_norm(GraphBuilder& b, const std::string& name, Value x, int axis, double epsilon);
struct RateDistortion {
  Value loss, mse;
};
RateDistortion rate_distortion_loss(GraphBuilder& b, const std::string& name, Value x_hat, Value x, Value latent,
                                    const RateDistortionDesc& d = {});

}  // namespace ab::nn
