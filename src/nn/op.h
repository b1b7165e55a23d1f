// The Op interface: one layer of a static graph. An op infers its output shapes from its inputs
// and attributes, declares its parameters, runs forward and backward through Kernels, and counts
// its own FLOPs and bytes (rules in docs/ENGINE.md), so every model figure is traceable to an op.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "nn/kernels.h"

namespace ab::nn {

enum class Pass { forward, backward };

// What a parameter is, which decides its initialisation and how optimizers treat it (LARS does
// not adapt or decay norm and bias parameters; running statistics are state, not trained).
enum class ParamRole { weight, bias, norm_scale, norm_shift, running_stat };

struct ParamInit {
  enum class Dist { zeros, ones, normal, uniform };
  Dist dist = Dist::zeros;
  double scale = 0.0;  // normal: standard deviation; uniform: bound b of U(-b, b)
};

// 16-bit data keeps its batch-norm parameters and statistics, softmax probabilities and the loss
// in f32 (cuDNN requires it of batch norm; the loss wants the range); wider types keep their own.
inline bool is_16bit(DType t) { return t == DType::f16 || t == DType::bf16; }
inline bool is_float(DType t) { return t == DType::f32 || t == DType::f64 || is_16bit(t); }
inline DType wide_dtype(DType t) { return is_16bit(t) ? DType::f32 : t; }

struct ParamSpec {
  std::string name;  // "weight", "bias", "running_mean", ... (PyTorch's names)
  Shape shape;
  ParamRole role = ParamRole::weight;
  ParamInit init;
  // The type the op reads the parameter in. A trainable 16-bit parameter is stored by the graph
  // as an f32 master (what the optimizer updates) plus the 16-bit copy the op reads.
  DType dtype = DType::f32;
  bool trainable() const { return role != ParamRole::running_stat; }
};

// The tensors of one op call, bound once by the graph and reused every step. Gradient tensors
// are undefined (null data) where none is computed: an input that needs no gradient (the images,
// the labels) or a running statistic.
struct OpTensors {
  std::vector<Tensor> in, out, params, saved;
  std::vector<Tensor> din, dout, dparams;
  std::vector<bool> din_accumulate;  // add into din[i] rather than overwrite it
  // Add into dparams[j] rather than overwrite it: a tied parameter whose other user's backward ran
  // first. An op whose kernels cannot accumulate that gradient throws Unsupported.
  std::vector<bool> dparams_accumulate;
  // On the op that produces the graph's loss: the gradient backward will seed the loss with (f32
  // [1] on the device: fp16's loss scale), or undefined for 1. A loss op that computes its input's
  // gradient during forward (the fused classifier) reads it.
  Tensor loss_seed;
  // On ops that draw random numbers (Op::draws_random): the graph's step counter (i32 [1] on the
  // device), advanced at the start of each training forward, so each draws anew on every replay.
  Tensor step_counter;
  Workspace workspace;
  bool training = true;  // batch statistics (training) or running statistics (inference)
};

// Thrown for a layer the graph cannot build: the message names the layer, its kind and the reason.
class LayerError : public Error {
 public:
  using Error::Error;
};

// An op built to run e4m3 (GraphOptions precision fp8) asks the kernels at prepare; where they
// refuse (Unsupported) it runs in 16 bits and keeps the reason.
struct Fp8Choice {
  bool asked = false;           // built to run in fp8
  bool runs = false;            // after prepare: the kernels took it
  std::string fallback_reason;  // after prepare: why it runs in 16 bits; else empty
};

class Op {
 public:
  explicit Op(std::string name) : name_(std::move(name)) {}
  virtual ~Op() = default;
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  const std::string& name() const { return name_; }
  virtual std::string_view kind() const = 0;  // "conv2d", "batchnorm2d", ...

  // Output descriptors (dtype and shape; the graph sets layout and strides) from the inputs'.
  // Remembers both for the cost functions. Throws LayerError naming the layer and the reason.
  std::vector<Tensor> infer(const std::vector<Tensor>& inputs);
  // The layout rank-4 output `slot` is stored in. Built-in ops store theirs, and read their rank-4
  // inputs, in the graph's; the generic ops read any strides (reads_any_layout) and keep the layout
  // that spares a copy (InferenceOp). The builder then records the outputs as placed.
  virtual Layout output_layout(std::size_t /*slot*/, Layout graph) const { return graph; }
  virtual bool reads_any_layout() const { return false; }
  void set_placed_outputs(std::vector<Tensor> placed);
  const std::vector<Tensor>& inputs() const { return in_; }
  const std::vector<Tensor>& outputs() const { return out_; }

  virtual std::vector<ParamSpec> parameters() const { return {}; }
  // The full name ("embed.wte") of a parameter an earlier op declares which parameters()[i] is
  // (GPT-2's classifier reads the token embedding), or empty. A tied parameter has no storage of
  // its own, is not counted again, and the ops' gradients are summed; shape, dtype and role must
  // match the owner's.
  virtual std::string tied_to(std::size_t /*param*/) const { return {}; }
  // The values bind() sets parameters()[i] to (logical row-major order) in place of its ParamInit's
  // draw: a constant's; empty (the default) draws from the ParamInit.
  virtual std::vector<double> initial_values(std::size_t /*param*/) const { return {}; }
  // Tensors written by forward and read by backward besides inputs and outputs (batch statistics).
  virtual std::vector<Tensor> saved() const { return {}; }
  // Which activations backward reads: the memory planner keeps exactly these alive.
  virtual bool backward_reads_input(int /*i*/) const { return false; }
  virtual bool backward_reads_output(int /*i*/) const { return false; }
  // Whether input i's gradient is the output's gradient unchanged (add): the planner may then give
  // both one buffer, and backward skips the copy for an input whose gradient shares it.
  virtual bool passes_gradient_through(int /*i*/) const { return false; }
  // Whether the op reads OpTensors::step_counter (dropout).
  virtual bool draws_random() const { return false; }

  // Set by the graph for the cost model: whether the graph trains (batch norm's forward differs)
  // and whether input i's gradient is computed (the first layer's is not, which removes a
  // convolution's data gradient from both the work and the count).
  void set_context(bool training, std::vector<bool> input_needs_grad) {
    training_ = training;
    needs_grad_ = std::move(input_needs_grad);
  }
  bool input_needs_grad(int i) const { return needs_grad_.empty() || needs_grad_[static_cast<std::size_t>(i)]; }
  // Set by the graph's planner: input i's gradient shares the output gradient's buffer, so
  // backward moves no bytes for it (the cost model counts none).
  void set_shared_gradient(int i) {
    if (shared_grad_.size() <= static_cast<std::size_t>(i)) shared_grad_.resize(static_cast<std::size_t>(i) + 1, false);
    shared_grad_[static_cast<std::size_t>(i)] = true;
  }
  bool shares_gradient(int i) const {
    return static_cast<std::size_t>(i) < shared_grad_.size() && shared_grad_[static_cast<std::size_t>(i)];
  }

  // What an op built to run e4m3 (ConvBiasActivation, Linear) ran; null for every other op.
  virtual const Fp8Choice* fp8_choice() const { return nullptr; }

  // Checks the backend can run this layer (descriptors only, no data) and returns the workspace
  // bytes it needs. The default checks every tensor's storage type; convolution asks for its
  // algorithm. Throws Unsupported; the graph prefixes the layer's name.
  virtual std::int64_t prepare(Kernels& k, const OpTensors& descs);
  virtual void forward(Kernels& k, const OpTensors& t) = 0;
  virtual void backward(Kernels& k, const OpTensors& t) = 0;

  // Per call, for the batch in the inferred shapes. A multiply-add is 2 FLOPs; bytes count each
  // kernel's operands read once and results written once (docs/ENGINE.md).
  virtual std::int64_t flops(Pass p) const = 0;
  virtual std::int64_t bytes(Pass p) const = 0;

 protected:
  virtual std::vector<Tensor> do_infer(const std::vector<Tensor>& inputs) = 0;
  // Throws LayerError "layer 'NAME' (KIND): reason" unless `ok`.
  void require(bool ok, const std::string& reason) const;
  [[noreturn]] void fail(const std::string& reason) const;
  // Shared input checks: a floating-point dtype; a convolution's geometry against an input
  // [N, C, H, W] (counts and kernel >= 1, stride and dilation >= 1, padding >= 0, channels
  // divisible by groups). Conv2d and ConvTranspose2d check the same things.
  void require_float(const Tensor& t) const;
  void require_conv_geometry(const Tensor& x, std::int64_t out_channels, std::int64_t kernel_h,
                             std::int64_t kernel_w, const Conv2dDesc& c) const;
  // Inputs x and an optional residual (bias_act, conv_bias_act, bn_act): one or two inputs, the
  // residual of the output's shape and x's dtype.
  void require_optional_residual(const std::vector<Tensor>& in, const Shape& out_shape) const;
  std::int64_t element_bytes() const;  // of the first input's dtype
  static std::int64_t bytes_of(DType t) { return static_cast<std::int64_t>(size_bytes(t)); }

  std::vector<Tensor> in_, out_;
  std::vector<bool> needs_grad_, shared_grad_;
  bool training_ = true;

 private:
  std::string name_;
};

}  // namespace ab::nn
