// The per-op kernel contract a backend implements: ops (nn/ops.h) call these, and know nothing of
// how a device computes. The reference implementation (nn/ref) is the float64-accumulating oracle;
// the CUDA backend implements the same interface with cuDNN, cuBLASLt and its own kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "measure/timer.h"

namespace ab::nn {

// Rank-4 tensors are logical NCHW (filters KCRS) in any layout; a kernel reads the strides.
struct Conv2dDesc {
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;
  std::int64_t dilation_h = 1, dilation_w = 1;
  std::int64_t groups = 1;
};

// The backward passes a convolution layer runs besides its forward pass: backward-data only where
// the layer's input needs a gradient (not the first layer's), backward-filter only in a training
// graph. conv2d_prepare readies (the CUDA kernels: searches) only these; the defaults ask for all.
struct ConvPasses {
  bool backward_data = true;
  bool backward_filter = true;
};

// Max pooling window; padded positions never win (they count as -infinity, as in PyTorch).
struct Pool2dDesc {
  std::int64_t window_h = 1, window_w = 1;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;
};

// PyTorch's conventions: normalise with the biased batch variance, update the running variance
// with the unbiased one; running = (1 - momentum) * running + momentum * batch.
struct BatchNormDesc {
  double epsilon = 1e-5;
  double momentum = 0.1;
};

// v = momentum * v + (g + weight_decay * w);  w -= learning_rate * v   (PyTorch's SGD).
// skip_if (i32 [1], may be undefined): when it holds non-zero the step changes nothing — fp16 loss
// scaling found a non-finite gradient. Read on the device, so a captured step needs no host sync.
struct SgdStep {
  double learning_rate = 0.1;
  double momentum = 0.9;
  double weight_decay = 0.0;
  Tensor skip_if;
};

// One parameter of Kernels::sgd_update_many: w, g, v as sgd_update takes them, its own weight
// decay, `copy` (may be undefined): the 16-bit copy the forward pass reads, cast from the new w,
// and `g_partner` (may be undefined): a second gradient of g's layout; the step then takes
// (g + g_partner) * 0.5 in f32 (the copy-engine averager's mean) for g.
struct SgdTensors {
  Tensor w, g, v, copy;
  double weight_decay = 0.0;
  Tensor g_partner;
};

// LARS (You et al. 2017, as in MLPerf's ResNet reference): with adapt, the layer's learning rate
// is scaled by trust = eta * |w| / (|g| + weight_decay * |w| + epsilon) (1 where a norm is 0);
// v = momentum * v + lr * trust * (g + weight_decay * w);  w -= v.
struct LarsStep {
  double learning_rate = 0.1;
  double momentum = 0.9;
  double weight_decay = 0.0;
  double trust_coefficient = 0.001;  // eta
  double epsilon = 0.0;
  bool adapt = true;  // false for batch-norm and bias parameters: plain momentum SGD
  Tensor skip_if;     // as in SgdStep
};

// The rate term's weight: loss = distortion + lambda * rate (Balle et al. weight the other way,
// rate + lambda * distortion; the two differ by a constant factor of the loss).
struct RateDistortionDesc {
  double lambda = 0.01;
};

// Dynamic loss scaling (fp16), PyTorch's GradScaler rule: after a step with a non-finite gradient
// scale *= backoff and the good-step count restarts; after growth_interval good steps in a row
// scale *= growth.
struct LossScaleRule {
  double growth = 2.0;
  double backoff = 0.5;
  std::int64_t growth_interval = 2000;
};

// LayerNorm over the last dimension of x [rows, C] (Ba et al. 2016): y = (x - mean) * rstd * gamma
// + beta with rstd = 1 / sqrt(var + epsilon), var the biased variance; the statistics (mean, rstd:
// f32 [rows]) are kept for backward, in f32 whatever x's precision (GPT-2 and BERT use 1e-5, 1e-12).
struct LayerNormDesc {
  double epsilon = 1e-5;
};

// Scaled dot-product attention over q, k, v [B, H, T, D] (any strides, so views into one fused
// QKV projection): o = softmax(q k^T * scale + mask) v, scale 0 meaning 1 / sqrt(D). causal masks
// key j > query i (GPT); key_lengths (i32 [B], may be undefined) masks keys j >= length of each
// sequence (BERT's padding). stats (f32 [B, H, T]) keeps each query row's log-sum-exp of its
// scaled, masked scores: what backward needs to rebuild the probabilities (flash attention's).
struct AttentionDesc {
  double scale = 0.0;
  bool causal = false;
  Tensor key_lengths{};
};

// Dropout (inverted, as PyTorch's): y = x * keep / (1 - probability), keep from dropout_mask.h's
// hash of (seed, the device counter's value, the element's index in x's logical order), so the
// mask costs no memory, backward rebuilds it, and each training forward (which advances the
// counter) draws a new one. probability in [0, 1).
struct DropoutDesc {
  double probability = 0.1;
  std::uint64_t seed = 0;
};

// cast_many's write: the micro-batches of an accumulated step add into the f32 master gradients
// (accumulate) and the last takes their mean (scale = 1 / micro-batches).
struct CastManyMode {
  bool accumulate = false;
  double scale = 1.0;
  bool plain() const { return !accumulate && scale == 1.0; }
};

// AdamW (Loshchilov & Hutter 2019; PyTorch's AdamW and llm.c's update): with g' = g * clip,
// m = beta1 m + (1 - beta1) g';  v = beta2 v + (1 - beta2) g'^2;
// w -= lr * (m / (1 - beta1^step) / (sqrt(v / (1 - beta2^step)) + epsilon) + weight_decay * w).
// clip = min(1, max_grad_norm / |g|_global) where max_grad_norm > 0 and grad_norm_squared (f32 [1],
// the sum of squares over every parameter's gradient, from Kernels::sum_squares) is defined, else 1.
// skip_if as in SgdStep.
struct AdamWStep {
  double learning_rate = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double weight_decay = 0.0;
  std::int64_t step = 1;  // 1 for the first update: the bias corrections' exponent
  // i32 [1] on the device, may be undefined: the update's number (1 for the first), read on the
  // device in place of `step`, so a captured step counts on. Kernels::count_step advances it.
  Tensor step_count{};
  double max_grad_norm = 0.0;
  Tensor grad_norm_squared{};
  Tensor skip_if{};
};

// One parameter of Kernels::adamw_update_many: w, g, m, v as adamw_update takes them (f32 master
// and moments, the f32 gradient), its own weight decay (GPT-2 decays matrices only), and `copy`
// (may be undefined): the 16-bit copy the forward pass reads, cast from the new w.
struct AdamWTensors {
  Tensor w, g, m, v, copy;
  double weight_decay = 0.0;
};

// The elementwise functions of Kernels::unary_forward (ONNX's names and defaults): sigmoid;
// hard_sigmoid max(0, min(1, alpha x + beta)); hard_swish x * max(0, min(1, x / 6 + 1/2)); silu
// x * sigmoid(x); leaky_relu x < 0 ? alpha x : x; clip min(max(x, alpha), beta); erf; gelu_erf
// x/2 (1 + erf(x / sqrt 2)); gelu_tanh as gelu_forward; sqrt; exp; tanh; neg; abs; reciprocal 1/x.
enum class UnaryKind {
  sigmoid,
  hard_sigmoid,
  hard_swish,
  silu,
  leaky_relu,
  clip,
  erf,
  gelu_erf,
  gelu_tanh,
  sqrt,
  exp,
  tanh,
  neg,
  abs,
  reciprocal
};
struct UnaryAttrs {
  UnaryAttrs() = default;
  UnaryAttrs(UnaryKind k, double a = 0, double b = 0) : kind(k), alpha(a), beta(b) {}  // NOLINT: {kind} reads well
  UnaryKind kind = UnaryKind::sigmoid;
  // leaky_relu alpha; hard_sigmoid alpha, beta (ONNX: 0.2, 0.5); clip alpha = min, beta = max
  double alpha = 0, beta = 0;
};
// Kernels::binary_forward: y = a OP b; pow is a^b, max and min as std::fmax/fmin would not be:
// NaN propagates from either operand (ONNX's Max and Min).
enum class BinaryKind { add, sub, mul, div, pow, max, min };

// A recorded sequence of kernel launches replayed with no host work: a CUDA graph on the GPU; on
// the reference backend, the recorded kernel calls with their arguments.
class Replayable {
 public:
  virtual ~Replayable() = default;
  virtual void replay() = 0;
};

// Scratch memory for one kernel call (cuDNN workspaces): the graph sizes it once, at bind time,
// from what prepare() asked for, and lends the same block to every op.
struct Workspace {
  void* data = nullptr;
  std::int64_t bytes = 0;
};

// Host memory for what a device reads from and writes back to the host often (a loadgen SUT's
// sample pool and results): page-locked on a GPU (cudaHostAlloc), so a copy to or from it is a
// DMA queued on the kernels' stream that returns at once and runs at link speed, where a copy
// from pageable memory is staged through a driver buffer by the CPU, synchronously. Plain memory
// on the reference. Owns the block; the kernels that made it need not outlive it.
class HostBuffer {
 public:
  using Free = void (*)(void*) noexcept;
  HostBuffer() = default;
  HostBuffer(void* data, std::int64_t bytes, Free free) : ptr_(data, free), bytes_(bytes) {}
  HostBuffer(HostBuffer&& o) noexcept : ptr_(std::move(o.ptr_)), bytes_(std::exchange(o.bytes_, 0)) {}
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    ptr_ = std::move(o.ptr_);
    bytes_ = std::exchange(o.bytes_, 0);
    return *this;
  }
  void* data() const { return ptr_.get(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_.get());
  }
  std::int64_t bytes() const { return bytes_; }

 private:
  static void no_free(void*) noexcept {}
  std::unique_ptr<void, Free> ptr_{nullptr, &no_free};
  std::int64_t bytes_ = 0;
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual std::string_view name() const = 0;  // "ref", "cuda"
  virtual Allocator& allocator() = 0;
  virtual std::unique_ptr<measure::IterationTimer> make_timer() = 0;
  virtual void synchronize() = 0;

  // Whole contiguous tensors to and from host bytes in the tensor's dtype.
  virtual void upload(const Tensor& dst, const void* host) = 0;
  virtual void download(const Tensor& src, void* host) = 0;
  virtual void fill(const Tensor& t, double value) = 0;

  // For moving single samples without a host-side gather: `bytes` bytes between host memory and
  // the contiguous tensor's storage starting `offset` bytes in (Error when the range leaves the
  // tensor). Queued on the kernels' stream and not waited for: `host` may be read or written until
  // synchronize(), so it must stay untouched until then; from allocate_host memory the copies
  // overlap the host's work (pageable memory may make them synchronous).
  virtual HostBuffer allocate_host(std::int64_t bytes) = 0;
  virtual void upload_bytes(const Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) = 0;
  virtual void download_bytes(const Tensor& src, std::int64_t offset, void* host, std::int64_t bytes) = 0;

  // Called once per layer when a graph is bound. Throws Unsupported with the reason where this
  // backend cannot store the tensor or run the configuration (the graph adds the layer's name).
  // conv2d_prepare returns the workspace bytes the convolution's forward pass and `passes` need;
  // the CUDA backend runs and caches its algorithm search per shape and pass here, so nothing is
  // searched while timing, and a backward pass the layer was prepared without is an Error.
  virtual void check_tensor(const Tensor& t) = 0;
  virtual std::int64_t conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                                      ConvPasses passes) = 0;

  // Backward kernels that produce an input gradient take `accumulate`: add into dx instead of
  // overwriting it (cuDNN's beta = 1). That is how a value feeding several layers (a residual
  // branch point) gets the sum of its gradients without a separate buffer and add.
  virtual void conv2d_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                              Workspace ws) = 0;
  virtual void conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx,
                                    bool accumulate, Workspace ws) = 0;
  virtual void conv2d_backward_filter(const Conv2dDesc& d, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                      Workspace ws) = 0;

  // x, y: [N, C, H, W]; gamma, beta, running and saved statistics: [C].
  virtual void batchnorm_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma,
                                          const Tensor& beta, const Tensor& running_mean,
                                          const Tensor& running_var, const Tensor& y, const Tensor& saved_mean,
                                          const Tensor& saved_invstd) = 0;
  virtual void batchnorm_forward_inference(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma,
                                           const Tensor& beta, const Tensor& running_mean,
                                           const Tensor& running_var, const Tensor& y) = 0;
  virtual void batchnorm_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                  const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx,
                                  bool accumulate, const Tensor& dgamma, const Tensor& dbeta) = 0;

  // Batch norm in training with what follows it in a ResNet: y = ReLU(BN(x) (+ z)), z (the block's
  // residual) may be undefined. Statistics as batchnorm_forward_training. `mask` is an i32 tensor
  // of bn_activation_mask_words(x) words the op keeps from forward to backward: room for what a
  // fused backward needs beyond y (cuDNN's reserve space, the ReLU's bit mask); the defaults do
  // not use it. prepare returns the workspace bytes backward needs.
  // Backward: g = dy * (y > 0); dz (+)= g where dz is defined; dx (+)= BN's input gradient of g;
  // dgamma, dbeta written. `residual`: forward had a z (dz may still be undefined, where z needs no
  // gradient). The defaults run the separate kernels (batch norm, add, ReLU in place on y;
  // relu_backward into dz or the workspace, then batchnorm_backward); a backend may fuse.
  virtual std::int64_t batchnorm_activation_prepare(const Tensor& x, const Tensor& z, const Tensor& mask);
  virtual void batchnorm_activation_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& z,
                                                     const Tensor& gamma, const Tensor& beta,
                                                     const Tensor& running_mean, const Tensor& running_var,
                                                     const Tensor& y, const Tensor& saved_mean,
                                                     const Tensor& saved_invstd, const Tensor& mask);
  virtual void batchnorm_activation_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& y,
                                             const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                             const Tensor& saved_mean, const Tensor& saved_invstd,
                                             const Tensor& mask, bool residual, const Tensor& dx,
                                             bool dx_accumulate, const Tensor& dz, bool dz_accumulate,
                                             const Tensor& dgamma, const Tensor& dbeta, Workspace ws);

  // Elementwise ops take operands of one shape and layout. ReLU's backward reads its output
  // (y > 0), so the input need not be kept and an in-place ReLU stays possible.
  virtual void relu_forward(const Tensor& x, const Tensor& y) = 0;
  virtual void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool accumulate) = 0;
  virtual void add_forward(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  virtual void copy_gradient(const Tensor& dy, const Tensor& dx, bool accumulate) = 0;  // dx (+)= dy
  // The fused inference epilogue of a convolution with its batch norm folded in (docs/ENGINE.md):
  // y = act(x + bias[c] (+ residual)), act = ReLU when `relu`, else identity. x, residual (may be
  // undefined) and y: [N, C, H, W] of one shape, layout and dtype (y may be x: in place); bias:
  // [C], of the batch-norm parameters' type (f32 beside 16-bit data) or x's. No backward: the op
  // exists in inference graphs only.
  virtual void bias_activation_forward(const Tensor& x, const Tensor& bias, const Tensor& residual, const Tensor& y,
                                       bool relu) = 0;
  // The same epilogue inside the convolution (inference only): y = act(conv(x, w) + bias[c]
  // (+ residual)), bias [C_out] in y's dtype (the type cuDNN's fused call takes; bias_activation_
  // forward accepts it too). The defaults run conv2d_forward, then bias_activation_forward in
  // place on y; a backend overrides both to fuse where that is faster. prepare returns the
  // workspace bytes, as conv2d_prepare does; `residual` and `bias` may be descriptors only.
  virtual std::int64_t conv2d_bias_activation_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                                      const Tensor& bias, const Tensor& residual, const Tensor& y,
                                                      bool relu);
  virtual void conv2d_bias_activation_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                              const Tensor& bias, const Tensor& residual, const Tensor& y, bool relu,
                                              Workspace ws);
  // The same epilogue around an fp8 (e4m3) convolution (inference only; GraphOptions precision fp8):
  //   y = act(conv(qx, qw) * (dx * dw) + bias[c] (+ residual)),
  // qx = e4m3(x * sx) with sx = 448 / max|x| of this call's x (per tensor; sx = 1 where 448 / max|x|
  // is not a finite positive number), dx = max|x| / 448 (1 with the fallback), both in f32; qw and
  // dw the same from w; e4m3 rounds to nearest even and saturates at +-448 (float_to_e4m3_bits).
  // The convolution accumulates the exact products qx * qw in f32 (only the summation order may
  // differ between backends); the descale (the f32 product dx * dw), bias, residual and ReLU
  // apply in f32 or wider (the reference: f64) and y is rounded once. x, w, bias, residual, y as conv2d_bias_activation (16-bit
  // x and y); groups must be 1. Backends quantize w once per parameter state: after
  // parameters_changed() the next forward quantizes again (Graph calls it after bind and
  // set_parameter_values, an inference graph's parameter writes; a caller writing parameter
  // memory directly must call it). prepare returns the
  // workspace bytes, as conv2d_prepare does; both throw Unsupported (with the reason) where this
  // backend cannot run the configuration in fp8, and the caller then runs it in 16 bits. The
  // defaults throw Unsupported.
  virtual std::int64_t conv2d_fp8_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                          const Tensor& residual, const Tensor& y, bool relu);
  virtual void conv2d_fp8_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                  const Tensor& residual, const Tensor& y, bool relu, Workspace ws);
  // Parameter memory was written: derived copies (fp8 weights) are stale. The default has none.
  virtual void parameters_changed() {}
  // With `only_where_faster` (a backend's default) a backend that can time both paths refuses an
  // fp8 configuration whose whole fp8 call (quantization included) is no faster than its 16-bit
  // call, naming both times, so the op runs it in 16 bits (TensorRT's rule for a precision it
  // allows); false takes fp8 wherever the backend can run it, to study the fp8 kernels themselves.
  // Set before the prepares it should govern. The default (the reference) always runs fp8.
  virtual void set_fp8_only_where_faster(bool) {}  // the refusal contains kFp8SlowerReason
  // Whether the backend may run cooperative kernels, whose blocks must all be resident at once
  // (cuDNN's persistent NHWC batch norm). Such a kernel cannot start while a kernel of another
  // stream holds SMs (a data-parallel step's all-reduce: bench/HISTORY.md's kernel timeline), so a
  // data-parallel run may want none; the CUDA engine then runs the project's NHWC batch-norm
  // kernels. Set before bind (plans are made there). The default (no such kernels) ignores it.
  virtual void set_cooperative_kernels(bool) {}

  virtual void maxpool_forward(const Pool2dDesc& d, const Tensor& x, const Tensor& y) = 0;
  // Routes dy to the first maximum of each window (row-major scan), as PyTorch does.
  virtual void maxpool_backward(const Pool2dDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy,
                                const Tensor& dx, bool accumulate) = 0;
  // x: [N, C, H, W] -> y: [N, C], the mean over H and W.
  virtual void global_avgpool_forward(const Tensor& x, const Tensor& y) = 0;
  virtual void global_avgpool_backward(const Tensor& dy, const Tensor& dx, bool accumulate) = 0;

  // x: [N, in], w: [out, in], bias: [out] (may be undefined), y: [N, out]; y = x w^T + bias.
  // x, y, dy and dx may have padded rows (stride[0] >= width, 16-byte aligned): a 50257-token
  // vocabulary's logits are stored 50304 wide, where the GEMMs run at full speed.
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) = 0;
  virtual void linear_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate) = 0;
  virtual void linear_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias) = 0;

  // logits: [N, K], labels: [N] i32 in [0, K), probs: [N, K] (kept for backward), loss: [1], the
  // mean over the batch. dlogits = dloss * (probs - onehot(labels)) / N.
  virtual void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                             const Tensor& loss) = 0;
  virtual void softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,
                                              const Tensor& dlogits, bool accumulate) = 0;

  // Learned compression (models/compression.h). round_forward: y = step * round(x / step), rounding
  // to the nearest integer with ties to even (torch.round); step 1 rounds to integers. One shape
  // and layout; a power-of-two step keeps the division exact.
  virtual void round_forward(const Tensor& x, const Tensor& y, double step) = 0;
  // The rate-distortion proxy: mse = mean((x_hat - x)^2), loss = mse + lambda * mean(|latent|)
  // (loss, mse: [1]; every sum in a fixed order). Backward: dx_hat (+)= dloss * 2 (x_hat - x) / n
  // and dlatent (+)= dloss * lambda * sign(latent) / n_latent (sign(0) = 0); an undefined gradient
  // tensor is skipped. x_hat and x share shape and layout; latent is any contiguous tensor.
  virtual void rate_distortion_forward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x,
                                       const Tensor& latent, const Tensor& loss, const Tensor& mse) = 0;
  virtual void rate_distortion_backward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x,
                                        const Tensor& latent, const Tensor& dloss, const Tensor& dx_hat,
                                        bool accumulate_x_hat, const Tensor& dlatent, bool accumulate_latent) = 0;

  // One optimizer step on one parameter tensor; v is its velocity (same shape, zeroed at start).
  virtual void sgd_update(const SgdStep& s, const Tensor& w, const Tensor& g, const Tensor& v) = 0;
  // The SGD step of many parameters (s.weight_decay ignored: each has its own), each followed by
  // the cast of its new value into its 16-bit copy where it has one. The default runs sgd_update
  // and cast per parameter; CUDA fuses them into a few launches (ResNet-50: 2 x 161 kernels else).
  virtual void sgd_update_many(const SgdStep& s, const std::vector<SgdTensors>& params);
  virtual void lars_update(const LarsStep& s, const Tensor& w, const Tensor& g, const Tensor& v) = 0;

  // Mixed precision. cast: dst = src converted (same shape, any of f64/f32/f16/bf16; rounding to
  // nearest even). unscale_and_check: g *= 1 / scale[0] (scale: f32 [1]) and found_nonfinite
  // (i32 [1]) is set to 1 when any element of g is NaN or Inf; it is never cleared here.
  // update_loss_scale applies LossScaleRule on the device (good_steps: i32 [1]) and clears
  // found_nonfinite for the next step.
  virtual void cast(const Tensor& src, const Tensor& dst) = 0;
  // cast(srcs[i], dsts[i]) for every i, in as few launches as the backend can (a step's 16-bit
  // parameter gradients into their f32 masters: 148 tensors in GPT-2). The default casts one by
  // one. With a mode other than the default (gradient accumulation's micro-batches summed into
  // the masters), dsts[i] = scale * (accumulate ? dsts[i] + srcs[i] : srcs[i]) with f32 dsts and
  // f32, f16 or bf16 srcs, contiguous; the default refuses it as Unsupported.
  virtual void cast_many(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts,
                         const CastManyMode& mode = {});
  virtual void unscale_and_check(const Tensor& g, const Tensor& scale, const Tensor& found_nonfinite) = 0;
  virtual void update_loss_scale(const LossScaleRule& rule, const Tensor& scale, const Tensor& good_steps,
                                 const Tensor& found_nonfinite) = 0;

  // Runs `body`'s host code once, recording its kernel launches without executing them, and
  // returns what replays them: the work runs only on replay (the first replay is the first
  // execution), and replay runs no host code, so host values passed to kernels (a learning rate,
  // a fill value) are those of the capture. Nothing in `body` may allocate, synchronize, upload or
  // download (the reference throws Error; a graph allocates everything at bind, so a step qualifies).
  virtual std::unique_ptr<Replayable> capture(const std::function<void()>& body) = 0;
  // Deterministic mode: algorithms and kernels that give bit-identical results run to run (no
  // atomics-order dependence); may be slower. The reference is always deterministic.
  virtual void set_deterministic(bool on) = 0;
  // fp32 convolutions and matmuls may use TF32 tensor cores (Precision::tf32); off by default.
  virtual void set_tf32(bool allowed) = 0;

  // Transformer kernels. Backends without them refuse (Unsupported), so a model that needs them
  // is skipped there with the reason. Token ids are i32; gradients of parameters are written
  // (or added to, where `accumulate` says), in the parameters' dtype.
  // y [B*T, C] = wte[tokens[b, t]] + wpe[t] for tokens [B, T], wte [V, C], wpe [P, C] (T <= P).
  virtual void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& y);
  // dwte (+)= the scatter of dy's rows by token, dwpe = dy summed over the batch per position; each
  // sum in a fixed order (deterministic), tied embeddings accumulate onto the classifier's dwte.
  virtual void embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte, bool accumulate_wte,
                                  const Tensor& dwpe);
  virtual void layernorm_forward(const LayerNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 const Tensor& y, const Tensor& mean, const Tensor& rstd);
  virtual void layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& dx, bool accumulate, const Tensor& dgamma,
                                  const Tensor& dbeta);
  // RMSNorm (Llama's): y = x * rstd * gamma per row of x [rows, C], rstd (f32 [rows]) =
  // 1 / sqrt(mean(x^2) + epsilon) in f32 statistics whatever the precision; backward writes (or
  // adds to) dx and writes dgamma, as layernorm_backward does without the mean and beta.
  virtual void rmsnorm_forward(const LayerNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& y,
                               const Tensor& rstd);
  virtual void rmsnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& rstd,
                                const Tensor& dx, bool accumulate, const Tensor& dgamma);
  // Dropout (DropoutDesc) over contiguous x, y (dx, dy) of one shape and float dtype; counter i32
  // [1] on the device. backward: dx (+)= dy * keep / (1 - probability) with forward's mask.
  virtual void dropout_forward(const DropoutDesc& d, const Tensor& x, const Tensor& y, const Tensor& counter);
  virtual void dropout_backward(const DropoutDesc& d, const Tensor& dy, const Tensor& dx, const Tensor& counter,
                                bool accumulate);
  // GELU, tanh form (GPT-2, BERT): y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  virtual void gelu_forward(const Tensor& x, const Tensor& y);
  virtual void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate);
  virtual void attention_forward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& o, const Tensor& stats);
  // dq, dk, dv written (not accumulated): they are views into one QKV gradient.
  virtual void attention_backward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& o, const Tensor& dout, const Tensor& stats, const Tensor& dq,
                                  const Tensor& dk, const Tensor& dv);
  // out (f32 [1]) = the sum of squares of every element of `tensors`: the global gradient norm's square.
  virtual void sum_squares(const std::vector<Tensor>& tensors, const Tensor& out);
  virtual void adamw_update(const AdamWStep& s, const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v);
  // The AdamW step of many parameters (s.weight_decay ignored: each has its own), each followed by
  // the cast of its new value into its 16-bit copy where it has one. The default runs adamw_update
  // and cast per parameter; CUDA fuses them into a few launches (GPT-2 124M: 148 tensors).
  virtual void adamw_update_many(const AdamWStep& s, const std::vector<AdamWTensors>& params);
  // counter (i32 [1]) += 1 unless skip_if (i32 [1], may be undefined) holds non-zero: AdamW's step
  // number kept on the device (AdamWStep::step_count).
  virtual void count_step(const Tensor& counter, const Tensor& skip_if);

  // The classifier's loss and its gradient in one pass over the logits, which the forward pass has
  // just written (over a 50k vocabulary the largest tensor of a GPT step: reading it once more for
  // backward would cost as much as the loss). logits [N, V] (rows may be padded: stride[0] >= V),
  // labels i32 [N], each in [0, V) or -1: a row that is not scored (padding, a BERT position that
  // is not masked). loss (f32 [1]) = the mean over scored rows of -log softmax(logits)[label]
  // (0 when none is). dlogits (may be undefined: inference; may be logits itself, in place) =
  // seed * (softmax(logits) - onehot(label)) / scored on scored rows, 0 on the others; seed (f32
  // [1] on the device, may be undefined: 1) is the gradient backward will give the loss (fp16's
  // loss scale), read on the device. Sums in a fixed order (deterministic).
  virtual void cross_entropy_fused(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                                   const Tensor& dlogits, const Tensor& seed);

  // The MLP's first layer with its activation (cuBLASLt's GELU_AUX_BIAS epilogue): pre = x w^T +
  // bias, y = gelu(pre) as gelu_forward; pre may be undefined (inference: nothing kept for
  // backward). Shapes as linear_forward. The default runs linear_forward, then gelu_forward.
  virtual void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& pre,
                                   const Tensor& y);
  // The data gradient of the layer that follows a GELU, through the GELU (the DGELU epilogue):
  // dx = gelu'(pre) * (dy w), written; pre and dx [N, in]. dbias (may be undefined; [in] of dy's
  // dtype) = the column sums of dx, written: the bias gradient of the layer before the GELU. The
  // default runs linear_backward_data, then gelu_backward in place on dx, then column_sums.
  virtual void linear_backward_data_gelu(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor& dx,
                                         const Tensor& dbias);
  // sums [C] = the sum over rows of x [N, C], written; sums of x's dtype. The default refuses as
  // the transformer kernels' do.
  virtual void column_sums(const Tensor& x, const Tensor& sums);

  // Generic inference kernels (the ONNX importer's ops): forward only; the defaults refuse
  // (Unsupported). Every operand is a strided view (any layout, views with offsets), its shape the
  // logical one (rank 4 is NCHW whatever the layout). Broadcasting is numpy's: shapes right-aligned,
  // each dim of an operand equal to the output's or 1. Floating operands share one dtype (f64, f32,
  // f16 or bf16) and compute in f32 or wider; y is rounded once.
  // y = f(x), one shape.
  virtual void unary_forward(const UnaryAttrs& a, const Tensor& x, const Tensor& y);
  // y = a OP b, a and b broadcast to y.
  virtual void binary_forward(BinaryKind kind, const Tensor& a, const Tensor& b, const Tensor& y);
  // out = cond != 0 ? x : y, all three broadcast to out; cond i8, i32, i64 or of out's dtype.
  virtual void where_forward(const Tensor& cond, const Tensor& x, const Tensor& y, const Tensor& out);
  // The data movement of concat, split, slice, transpose, reshape, expand and pad: element i of x in
  // logical row-major order is written to element i of y, so x and y need the same element count
  // and dtype (any dtype) but not the same shape (a reshape); x may repeat elements (stride 0: expand).
  virtual void copy_strided(const Tensor& x, const Tensor& y);
  // y = softmax(x) along `axis` (numerically stable: the row's maximum subtracted first).
  virtual void softmax_forward(int axis, const Tensor& x, const Tensor& y);
  // y = the mean of x over the dims where y (x's rank) has size 1 and x does not.
  virtual void reduce_mean_forward(const Tensor& x, const Tensor& y);
  // Average pooling of x [N, C, H, W]: padded positions count in the divisor only when
  // count_include_pad (the window's area), else the divisor is the window's real elements.
  virtual void avgpool_forward(const Pool2dDesc& d, bool count_include_pad, const Tensor& x, const Tensor& y);
  // x [N, C, H, W] -> y [N, C, OH, OW]: nearest = ONNX's asymmetric coordinates, floor
  // (in = floor(out * H / OH)); linear = bilinear with half-pixel centres, clamped at the edges
  // (PyTorch's align_corners=False).
  virtual void resize_forward(bool linear, const Tensor& x, const Tensor& y);
  // y [..., M, N] = a [..., M, K] b [..., K, N], batch dims broadcast; a, b and y contiguous
  // row-major (the op stages other views), rank >= 2, of one dtype.
  virtual void matmul_forward(const Tensor& a, const Tensor& b, const Tensor& y);
  // y = table indexed along `axis` by indices (i32, i64 or a float holding integers; negative ones
  // count from the end): y's shape is table's dims before axis, indices' dims, table's dims after.
  // An index outside [-dim, dim) is an Error on the reference; the CUDA kernels write 0 there.
  virtual void gather_forward(int axis, const Tensor& table, const Tensor& indices, const Tensor& y);

  // How many distinct shapes of the fused calls above (conv2d_bias_activation_*,
  // batchnorm_activation_*) run a backend's own fused kernels and how many run the separate
  // ones, as decided so far: records say whether a fused graph really fused on this device.
  // The reference (and every default) fuses nothing and counts nothing.
  struct FusionCounts {
    int fused = 0, unfused = 0;
  };
  virtual FusionCounts fusion_counts() const { return {}; }
  // One line per fusion decision behind the counts (shape, fused or not, why, the timings), sorted.
  virtual std::vector<std::string> fusion_notes() const { return {}; }
};

// The i32 words of a batch norm + activation's mask (Kernels::batchnorm_activation_*) for an
// input of `x_shape`: one bit per element (the ReLU's mask) and 4 KiB to spare for a backend's
// padding. A backend that needs more runs the unfused kernels.
inline std::int64_t bn_activation_mask_words(const Shape& x_shape) { return (x_shape.numel() + 31) / 32 + 1024; }

// Throws Error unless [offset, offset + bytes) lies within the contiguous tensor `t`; what
// upload_bytes and download_bytes check before copying (`what` names the call).
void check_byte_range(std::string_view what, const Tensor& t, std::int64_t offset, std::int64_t bytes);

// The operands every backend's fp8 convolution refuses: groups other than 1, C or K not a
// multiple of kFp8ConvChannelMultiple (cuDNN's fp8 convolutions read 16-byte vectors of e4m3
// channels; the reference refuses the same so that both backends take the same layers), x or y
// not f16/bf16. Returns why, or empty where the configuration may run (a backend may still refuse).
inline constexpr std::int64_t kFp8ConvChannelMultiple = 16;
std::string fp8_conv_refusal(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y);
// A linear layer's x [N, in], w [out, in] or y [N, out] as the 1x1 convolution's operand it is:
// [rows, cols, 1, 1] NHWC over the same bytes (Linear's fp8 path runs conv2d_fp8_* on these).
Tensor fp8_linear_view(const Tensor& t);
// fp8_conv_refusal for a linear layer's x, w and y (empty where the rule lets it run in fp8).
std::string fp8_linear_refusal(const Tensor& x, const Tensor& w, const Tensor& y);
// What a backend's refusal under set_fp8_only_where_faster(true) says (then both times).
inline constexpr const char* kFp8SlowerReason = "fp8 timed no faster than 16 bits";

// A device tensor to and from values, through a host staging copy in the tensor's own dtype and
// strides (the kernels move whole tensors as bytes).
void upload_values(Kernels& k, const Tensor& t, const std::vector<double>& values);
std::vector<double> download_values(Kernels& k, const Tensor& t);

// The reference kernels (nn/ref): host memory, f64/f32/f16/bf16 storage (16-bit values loaded
// exactly, stored rounded once to nearest even), float64 accumulation, and work split over
// outputs only, so results are bit-identical for any thread count.
std::unique_ptr<Kernels> make_ref_kernels();

}  // namespace ab::nn
