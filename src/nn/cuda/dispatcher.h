// Internal to the CUDA engine: nn::Kernels on one GPU as a thin dispatcher over one engine per op
// family. Memory, host copies, synchronisation and CUDA-graph capture are its own (dispatcher.cpp);
// every other entry point forwards to the family that computes it:
//   ConvEngine      convolution: algorithm search, fused epilogue, fp8      conv_engine.h
//   NormPoolEngine  batch norm (plain and fused with ReLU), max/avg pooling  norm_pool_engine.h
//   LinearEngine    linear layers through cuBLASLt                          linear_engine.h
//   PointwiseEngine elementwise ops, losses, optimizers, mixed precision    pointwise_engine.h
//   AttentionEngine scaled dot-product attention (fused flash kernels)      attention_engine.h
//   TransformerEngine embedding, LayerNorm, GELU, gradient norm, AdamW,     transformer_engine.h
//                   the fused classifier loss
// The families share one EngineContext (context.h): stream, allocator, cuDNN handle, modes and the
// searches' scratch. docs/ENGINE.md says how a new family joins.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "nn/cuda/attention_engine.h"
#include "nn/cuda/context.h"
#include "nn/cuda/conv_engine.h"
#include "nn/cuda/generic.h"
#include "nn/cuda/kernels.h"
#include "nn/cuda/linear_engine.h"
#include "nn/cuda/norm_pool_engine.h"
#include "nn/cuda/pointwise_engine.h"
#include "nn/cuda/transformer_engine.h"
#include "nn/kernels.h"

namespace ab::nn::cuda {

class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(backend::Backend& backend);
  ~CudaKernels() override;
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  // ---- memory, copies, capture (dispatcher.cpp)
  std::string_view name() const override { return "cuda"; }
  Allocator& allocator() override;
  std::unique_ptr<measure::IterationTimer> make_timer() override { return ctx_.backend.make_timer(); }
  void synchronize() override;
  void upload(const Tensor& dst, const void* host) override;
  void download(const Tensor& src, void* host) override;
  HostBuffer allocate_host(std::int64_t bytes) override;
  void upload_bytes(const Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) override;
  void download_bytes(const Tensor& src, std::int64_t offset, void* host, std::int64_t bytes) override;
  void fill(const Tensor& t, double value) override;
  void check_tensor(const Tensor& t) override;
  std::unique_ptr<Replayable> capture(const std::function<void()>& body) override;
  void set_deterministic(bool on) override { ctx_.modes.deterministic = on; }
  void set_tf32(bool allowed) override { ctx_.modes.tf32 = allowed; }
  void set_fp8_only_where_faster(bool only) override { ctx_.modes.fp8_only_where_faster = only; }
  void set_cooperative_kernels(bool allowed) override { ctx_.modes.cooperative = allowed; }
  FusionCounts fusion_counts() const override;
  std::vector<std::string> fusion_notes() const override { return norm_pool_.bn_fusion_notes(); }

  // ---- convolution
  std::int64_t conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                              ConvPasses passes) override {
    return conv_.conv2d_prepare(d, x, w, y, passes);
  }
  void conv2d_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y, Workspace ws) override {
    conv_.conv2d_forward(d, x, w, y, ws);
  }
  void conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate,
                            Workspace ws) override {
    conv_.conv2d_backward_data(d, dy, w, dx, accumulate, ws);
  }
  void conv2d_backward_filter(const Conv2dDesc& d, const Tensor& x, const Tensor& dy, const Tensor& dw,
                              Workspace ws) override {
    conv_.conv2d_backward_filter(d, x, dy, dw, ws);
  }
  std::int64_t conv2d_bias_activation_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                              const Tensor& residual, const Tensor& y, bool relu) override {
    return conv_.conv2d_bias_activation_prepare(d, x, w, bias, residual, y, relu);
  }
  void conv2d_bias_activation_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Tensor& residual, const Tensor& y, bool relu, Workspace ws) override {
    conv_.conv2d_bias_activation_forward(d, x, w, bias, residual, y, relu, ws);
  }
  std::int64_t conv2d_fp8_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                  const Tensor& residual, const Tensor& y, bool relu) override {
    return conv_.conv2d_fp8_prepare(d, x, w, bias, residual, y, relu);
  }
  void conv2d_fp8_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                          const Tensor& residual, const Tensor& y, bool relu, Workspace ws) override {
    conv_.conv2d_fp8_forward(d, x, w, bias, residual, y, relu, ws);
  }
  void parameters_changed() override { conv_.parameters_changed(); }

  // ---- normalisation and pooling
  void batchnorm_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
                                  const Tensor& saved_mean, const Tensor& saved_invstd) override {
    norm_pool_.batchnorm_forward_training(d, x, gamma, beta, running_mean, running_var, y, saved_mean, saved_invstd);
  }
  void batchnorm_forward_inference(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& running_mean, const Tensor& running_var, const Tensor& y) override {
    norm_pool_.batchnorm_forward_inference(d, x, gamma, beta, running_mean, running_var, y);
  }
  void batchnorm_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx, bool accumulate,
                          const Tensor& dgamma, const Tensor& dbeta) override {
    norm_pool_.batchnorm_backward(d, x, dy, gamma, saved_mean, saved_invstd, dx, accumulate, dgamma, dbeta);
  }
  std::int64_t batchnorm_activation_prepare(const Tensor& x, const Tensor& z, const Tensor& mask) override {
    return norm_pool_.batchnorm_activation_prepare(x, z, mask);
  }
  void batchnorm_activation_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& z,
                                             const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                                             const Tensor& running_var, const Tensor& y, const Tensor& saved_mean,
                                             const Tensor& saved_invstd, const Tensor& mask) override {
    norm_pool_.batchnorm_activation_forward_training(d, x, z, gamma, beta, running_mean, running_var, y, saved_mean,
                                                     saved_invstd, mask);
  }
  void batchnorm_activation_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy,
                                     const Tensor& gamma, const Tensor& beta, const Tensor& saved_mean,
                                     const Tensor& saved_invstd, const Tensor& mask, bool residual, const Tensor& dx,
                                     bool dx_accumulate, const Tensor& dz, bool dz_accumulate, const Tensor& dgamma,
                                     const Tensor& dbeta, Workspace ws) override {
    norm_pool_.batchnorm_activation_backward(d, x, y, dy, gamma, beta, saved_mean, saved_invstd, mask, residual, dx,
                                             dx_accumulate, dz, dz_accumulate, dgamma, dbeta, ws);
  }
  void maxpool_forward(const Pool2dDesc& d, const Tensor& x, const Tensor& y) override {
    norm_pool_.maxpool_forward(d, x, y);
  }
  void maxpool_backward(const Pool2dDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
                        bool accumulate) override {
    norm_pool_.maxpool_backward(d, x, y, dy, dx, accumulate);
  }
  void global_avgpool_forward(const Tensor& x, const Tensor& y) override { norm_pool_.global_avgpool_forward(x, y); }
  void global_avgpool_backward(const Tensor& dy, const Tensor& dx, bool accumulate) override {
    norm_pool_.global_avgpool_backward(dy, dx, accumulate);
  }

  // ---- linear
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) override {
    linear_.linear_forward(x, w, bias, y);
  }
  void linear_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate) override {
    linear_.linear_backward_data(dy, w, dx, accumulate);
  }
  void linear_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias) override {
    linear_.linear_backward_weights(x, dy, dw, dbias);
  }
  void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& pre,
                           const Tensor& y) override {
    linear_.linear_gelu_forward(x, w, bias, pre, y);
  }
  void linear_backward_data_gelu(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor& dx,
                                 const Tensor& dbias) override {
    linear_.linear_backward_data_gelu(dy, w, pre, dx, dbias);
  }
  void column_sums(const Tensor& x, const Tensor& sums) override { linear_.column_sums(x, sums); }

  // ---- pointwise, losses, optimizers
  void relu_forward(const Tensor& x, const Tensor& y) override { pointwise_.relu_forward(x, y); }
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool accumulate) override {
    pointwise_.relu_backward(y, dy, dx, accumulate);
  }
  void add_forward(const Tensor& a, const Tensor& b, const Tensor& y) override { pointwise_.add_forward(a, b, y); }
  void copy_gradient(const Tensor& dy, const Tensor& dx, bool accumulate) override {
    pointwise_.copy_gradient(dy, dx, accumulate);
  }
  void bias_activation_forward(const Tensor& x, const Tensor& bias, const Tensor& residual, const Tensor& y,
                               bool relu) override {
    pointwise_.bias_activation_forward(x, bias, residual, y, relu);
  }
  void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                     const Tensor& loss) override {
    pointwise_.softmax_cross_entropy_forward(logits, labels, probs, loss);
  }
  void softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,
                                      const Tensor& dlogits, bool accumulate) override {
    pointwise_.softmax_cross_entropy_backward(probs, labels, dloss, dlogits, accumulate);
  }
  void round_forward(const Tensor& x, const Tensor& y, double step) override { pointwise_.round_forward(x, y, step); }
  void rate_distortion_forward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x, const Tensor& latent,
                               const Tensor& loss, const Tensor& mse) override {
    pointwise_.rate_distortion_forward(d, x_hat, x, latent, loss, mse);
  }
  void rate_distortion_backward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x, const Tensor& latent,
                                const Tensor& dloss, const Tensor& dx_hat, bool accumulate_x_hat, const Tensor& dlatent,
                                bool accumulate_latent) override {
    pointwise_.rate_distortion_backward(d, x_hat, x, latent, dloss, dx_hat, accumulate_x_hat, dlatent,
                                        accumulate_latent);
  }
  void sgd_update(const SgdStep& s, const Tensor& w, const Tensor& g, const Tensor& v) override {
    pointwise_.sgd_update(s, w, g, v);
  }
  void sgd_update_many(const SgdStep& s, const std::vector<SgdTensors>& params) override {
    pointwise_.sgd_update_many(s, params);
  }
  void lars_update(const LarsStep& s, const Tensor& w, const Tensor& g, const Tensor& v) override {
    pointwise_.lars_update(s, w, g, v);
  }
  void cast(const Tensor& src, const Tensor& dst) override { pointwise_.cast(src, dst); }
  void unscale_and_check(const Tensor& g, const Tensor& scale, const Tensor& found_nonfinite) override {
    pointwise_.unscale_and_check(g, scale, found_nonfinite);
  }
  void update_loss_scale(const LossScaleRule& rule, const Tensor& scale, const Tensor& good_steps,
                         const Tensor& found_nonfinite) override {
    pointwise_.update_loss_scale(rule, scale, good_steps, found_nonfinite);
  }

  // ---- attention
  void attention_forward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                         const Tensor& stats) override {
    attention_.attention_forward(d, q, k, v, o, stats);
  }
  void attention_backward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                          const Tensor& dout, const Tensor& stats, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv) override {
    attention_.attention_backward(d, q, k, v, o, dout, stats, dq, dk, dv);
  }

  // ---- transformer (attention and linear + GELU are other families')
  void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& y) override {
    transformer_.embedding_forward(tokens, wte, wpe, y);
  }
  void embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte, bool accumulate_wte,
                          const Tensor& dwpe) override {
    transformer_.embedding_backward(tokens, dy, dwte, accumulate_wte, dwpe);
  }
  void layernorm_forward(const LayerNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                         const Tensor& y, const Tensor& mean, const Tensor& rstd) override {
    transformer_.layernorm_forward(d, x, gamma, beta, y, mean, rstd);
  }
  void layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dx, bool accumulate, const Tensor& dgamma,
                          const Tensor& dbeta) override {
    transformer_.layernorm_backward(x, dy, gamma, mean, rstd, dx, accumulate, dgamma, dbeta);
  }
  void rmsnorm_forward(const LayerNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& y,
                       const Tensor& rstd) override {
    transformer_.layernorm_forward(d, x, gamma, Tensor{}, y, Tensor{}, rstd);
  }
  void rmsnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& rstd, const Tensor& dx,
                        bool accumulate, const Tensor& dgamma) override {
    transformer_.layernorm_backward(x, dy, gamma, Tensor{}, rstd, dx, accumulate, dgamma, Tensor{});
  }
  void dropout_forward(const DropoutDesc& d, const Tensor& x, const Tensor& y, const Tensor& counter) override {
    transformer_.dropout("dropout_forward", d, x, y, counter, false);
  }
  void dropout_backward(const DropoutDesc& d, const Tensor& dy, const Tensor& dx, const Tensor& counter,
                        bool accumulate) override {
    transformer_.dropout("dropout_backward", d, dy, dx, counter, accumulate);
  }
  void gelu_forward(const Tensor& x, const Tensor& y) override { transformer_.gelu_forward(x, y); }
  void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate) override {
    transformer_.gelu_backward(x, dy, dx, accumulate);
  }
  void sum_squares(const std::vector<Tensor>& tensors, const Tensor& out) override {
    transformer_.sum_squares(tensors, out);
  }
  void cast_many(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts,
                 const CastManyMode& mode = {}) override {
    transformer_.cast_many(srcs, dsts, mode, [this](const Tensor& s, const Tensor& d) { cast(s, d); });
  }
  void adamw_update(const AdamWStep& s, const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v) override {
    transformer_.adamw_update(s, w, g, m, v);
  }
  void adamw_update_many(const AdamWStep& s, const std::vector<AdamWTensors>& params) override {
    transformer_.adamw_update_many(s, params);
  }
  void count_step(const Tensor& counter, const Tensor& skip_if) override { transformer_.count_step(counter, skip_if); }
  void cross_entropy_fused(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                           const Tensor& seed) override {
    transformer_.cross_entropy_fused(logits, labels, loss, dlogits, seed);
  }

  // ---- generic inference ops (generic.h; matmul through the linear family's cuBLASLt plans)
  void unary_forward(const UnaryAttrs& a, const Tensor& x, const Tensor& y) override {
    cuda_generic::unary_forward(ctx_.stream, a, x, y);
  }
  void binary_forward(BinaryKind kind, const Tensor& a, const Tensor& b, const Tensor& y) override {
    cuda_generic::binary_forward(ctx_.stream, kind, a, b, y);
  }
  void where_forward(const Tensor& cond, const Tensor& x, const Tensor& y, const Tensor& out) override {
    cuda_generic::where_forward(ctx_.stream, cond, x, y, out);
  }
  void copy_strided(const Tensor& x, const Tensor& y) override { cuda_generic::copy_strided(ctx_.stream, x, y); }
  void softmax_forward(int axis, const Tensor& x, const Tensor& y) override {
    cuda_generic::softmax_forward(ctx_.stream, axis, x, y);
  }
  void reduce_mean_forward(const Tensor& x, const Tensor& y) override {
    cuda_generic::reduce_mean_forward(ctx_.stream, x, y);
  }
  void avgpool_forward(const Pool2dDesc& d, bool count_include_pad, const Tensor& x, const Tensor& y) override {
    cuda_generic::avgpool_forward(ctx_.stream, d, count_include_pad, x, y);
  }
  void resize_forward(bool linear, const Tensor& x, const Tensor& y) override {
    cuda_generic::resize_forward(ctx_.stream, linear, x, y);
  }
  void matmul_forward(const Tensor& a, const Tensor& b, const Tensor& y) override { linear_.matmul_forward(a, b, y); }
  void gather_forward(int axis, const Tensor& table, const Tensor& indices, const Tensor& y) override {
    cuda_generic::gather_forward(ctx_.stream, axis, table, indices, y);
  }

  // ---- reports (kernels.h's cuda_* functions)
  const CudaKernelStats& stats() const { return conv_.stats(); }
  std::vector<std::string> conv_choices() const { return conv_.conv_choices(); }
  std::vector<std::string> linear_choices() const { return linear_.choices(); }
  std::vector<std::string> fp8_notes() const { return conv_.fp8_notes(); }
  std::vector<std::string> bn_fusion_notes() const { return norm_pool_.bn_fusion_notes(); }

 private:
  // The context first: the families hold references to it and are destroyed before it.
  EngineContext ctx_;
  ConvEngine conv_;
  NormPoolEngine norm_pool_;
  PointwiseEngine pointwise_;
  LinearEngine linear_;
  AttentionEngine attention_;
  TransformerEngine transformer_;
};

}  // namespace ab::nn::cuda
