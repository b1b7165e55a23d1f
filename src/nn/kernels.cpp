// The Kernels contract's default compositions: a backend that has no fused kernel for a call runs
// the unfused ones, so every backend computes every op and a fused one is an optimisation only.
#include "nn/kernels.h"

#include "core/error.h"

namespace ab::nn {

std::int64_t Kernels::conv2d_bias_activation_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                                     const Tensor& /*bias*/, const Tensor& /*residual*/,
                                                     const Tensor& y, bool /*relu*/) {
  return conv2d_prepare(d, x, w, y, ConvPasses{false, false});  // inference: the forward pass only
}

void Kernels::conv2d_bias_activation_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                             const Tensor& residual, const Tensor& y, bool relu, Workspace ws) {
  conv2d_forward(d, x, w, y, ws);
  bias_activation_forward(y, bias, residual, y, relu);
}

void Kernels::cast_many(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts, const CastManyMode& mode) {
  if (srcs.size() != dsts.size())
    throw Error("cast_many: " + std::to_string(srcs.size()) + " sources for " + std::to_string(dsts.size()) +
                " destinations");
  if (!mode.plain())
    throw Unsupported(std::string(name()) +
                      " kernels: cast_many that accumulates or scales (gradient "
                      "accumulation) is not implemented");
  for (std::size_t i = 0; i < srcs.size(); ++i) cast(srcs[i], dsts[i]);
}

void Kernels::sgd_update_many(const SgdStep& s, const std::vector<SgdTensors>& params) {
  for (const SgdTensors& p : params) {
    if (p.g_partner.defined())
      throw Unsupported(std::string(name()) + " kernels: an SGD step that averages two gradients is CUDA's fused "
                        "update only (data parallelism's mean in the update)");
    SgdStep one = s;
    one.weight_decay = p.weight_decay;
    sgd_update(one, p.w, p.g, p.v);
    if (p.copy.defined()) cast(p.w, p.copy);
  }
}

namespace {
[[noreturn]] void no_transformer_kernel(std::string_view backend, const char* kernel) {
  throw Unsupported(std::string(backend) + " kernels have no " + kernel + " (transformer ops)");
}
}  // namespace

void Kernels::embedding_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_transformer_kernel(name(), "embedding_forward");
}
void Kernels::embedding_backward(const Tensor&, const Tensor&, const Tensor&, bool, const Tensor&) {
  no_transformer_kernel(name(), "embedding_backward");
}
void Kernels::layernorm_forward(const LayerNormDesc&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, const Tensor&) {
  no_transformer_kernel(name(), "layernorm_forward");
}
void Kernels::layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, bool, const Tensor&, const Tensor&) {
  no_transformer_kernel(name(), "layernorm_backward");
}
void Kernels::rmsnorm_forward(const LayerNormDesc&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_transformer_kernel(name(), "rmsnorm_forward");
}
void Kernels::rmsnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                               const Tensor&) {
  no_transformer_kernel(name(), "rmsnorm_backward");
}
void Kernels::dropout_forward(const DropoutDesc&, const Tensor&, const Tensor&, const Tensor&) {
  no_transformer_kernel(name(), "dropout_forward");
}
void Kernels::dropout_backward(const DropoutDesc&, const Tensor&, const Tensor&, const Tensor&, bool) {
  no_transformer_kernel(name(), "dropout_backward");
}
void Kernels::gelu_forward(const Tensor&, const Tensor&) { no_transformer_kernel(name(), "gelu_forward"); }
void Kernels::gelu_backward(const Tensor&, const Tensor&, const Tensor&, bool) {
  no_transformer_kernel(name(), "gelu_backward");
}
void Kernels::attention_forward(const AttentionDesc&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&) {
  no_transformer_kernel(name(), "attention_forward");
}
void Kernels::attention_backward(const AttentionDesc&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_transformer_kernel(name(), "attention_backward");
}
void Kernels::sum_squares(const std::vector<Tensor>&, const Tensor&) { no_transformer_kernel(name(), "sum_squares"); }
void Kernels::adamw_update(const AdamWStep&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_transformer_kernel(name(), "adamw_update");
}
void Kernels::count_step(const Tensor&, const Tensor&) { no_transformer_kernel(name(), "count_step"); }
void Kernels::cross_entropy_fused(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_transformer_kernel(name(), "cross_entropy_fused");
}

void Kernels::adamw_update_many(const AdamWStep& s, const std::vector<AdamWTensors>& params) {
  for (const AdamWTensors& p : params) {
    AdamWStep one = s;
    one.weight_decay = p.weight_decay;
    adamw_update(one, p.w, p.g, p.m, p.v);
    if (p.copy.defined()) cast(p.w, p.copy);
  }
}

void Kernels::linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& pre,
                                  const Tensor& y) {
  if (!pre.defined()) {
    linear_forward(x, w, bias, y);
    return gelu_forward(y, y);
  }
  linear_forward(x, w, bias, pre);
  gelu_forward(pre, y);
}

void Kernels::linear_backward_data_gelu(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor& dx,
                                        const Tensor& dbias) {
  linear_backward_data(dy, w, dx, false);
  gelu_backward(pre, dx, dx, false);
  if (dbias.defined()) column_sums(dx, dbias);
}

void Kernels::column_sums(const Tensor&, const Tensor&) { no_transformer_kernel(name(), "column_sums"); }

std::string fp8_conv_refusal(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) {
  const std::string label = "fp8 convolution of x " + x.to_string() + ", w " + w.to_string() + ": ";
  if (d.groups != 1) return label + "groups = 1 only, got " + std::to_string(d.groups);
  if (x.shape.rank() != 4 || w.shape.rank() != 4) return label + "needs rank-4 x and w";
  const std::int64_t c = x.shape[1], k = w.shape[0];
  if (c % kFp8ConvChannelMultiple != 0 || k % kFp8ConvChannelMultiple != 0)
    return label + "C and K must be multiples of " + std::to_string(kFp8ConvChannelMultiple) +
           " (cuDNN's 16-byte e4m3 channel vectors), got C = " + std::to_string(c) + ", K = " + std::to_string(k);
  const auto half = [](DType t) { return t == DType::f16 || t == DType::bf16; };
  if (!half(x.dtype) || !half(y.dtype))
    return label + "x and y must be f16 or bf16, got x " + std::string(to_string(x.dtype)) + ", y " +
           std::string(to_string(y.dtype));
  return {};
}

Tensor fp8_linear_view(const Tensor& t) {
  if (t.shape.rank() != 2) return t;  // refused as a convolution operand, naming its shape
  return Tensor::describe(t.dtype, Shape{t.shape[0], t.shape[1], 1, 1}, Layout::nhwc, t.device).with_data(t.data);
}

std::string fp8_linear_refusal(const Tensor& x, const Tensor& w, const Tensor& y) {
  return fp8_conv_refusal(Conv2dDesc{}, fp8_linear_view(x), fp8_linear_view(w), fp8_linear_view(y));
}

std::int64_t Kernels::conv2d_fp8_prepare(const Conv2dDesc&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                        const Tensor&, bool) {
  throw Unsupported("the " + std::string(name()) + " kernels have no fp8 convolution");
}

void Kernels::conv2d_fp8_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                 const Tensor& residual, const Tensor& y, bool relu, Workspace) {
  conv2d_fp8_prepare(d, x, w, bias, residual, y, relu);  // throws
}

std::int64_t Kernels::batchnorm_activation_prepare(const Tensor& x, const Tensor& /*z*/, const Tensor& /*mask*/) {
  return x.size_bytes();  // the ReLU's gradient where it cannot go into dz
}

void Kernels::batchnorm_activation_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& z,
                                                    const Tensor& gamma, const Tensor& beta,
                                                    const Tensor& running_mean, const Tensor& running_var,
                                                    const Tensor& y, const Tensor& saved_mean,
                                                    const Tensor& saved_invstd, const Tensor& /*mask*/) {
  batchnorm_forward_training(d, x, gamma, beta, running_mean, running_var, y, saved_mean, saved_invstd);
  if (z.defined()) add_forward(y, z, y);
  relu_forward(y, y);
}

void Kernels::batchnorm_activation_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& y,
                                            const Tensor& dy, const Tensor& gamma, const Tensor& /*beta*/,
                                            const Tensor& saved_mean, const Tensor& saved_invstd,
                                            const Tensor& /*mask*/, bool /*residual*/, const Tensor& dx,
                                            bool dx_accumulate, const Tensor& dz, bool dz_accumulate,
                                            const Tensor& dgamma, const Tensor& dbeta, Workspace ws) {
  // The ReLU's gradient once: straight into dz where dz is overwritten (it is the residual's whole
  // gradient), else into the workspace (and added to dz from there).
  Tensor g = dz;
  if (!dz.defined() || dz_accumulate) {
    if (ws.bytes < dy.size_bytes())
      throw Error("batchnorm_activation_backward: needs a workspace of " + std::to_string(dy.size_bytes()) +
                  " bytes, got " + std::to_string(ws.bytes) + " (size it from batchnorm_activation_prepare)");
    g = dy.with_data(ws.data);
  }
  relu_backward(y, dy, g, false);
  if (dz.defined() && dz_accumulate) copy_gradient(g, dz, true);
  batchnorm_backward(d, x, g, gamma, saved_mean, saved_invstd, dx, dx_accumulate, dgamma, dbeta);
}

}  // namespace ab::nn
