// Internal to the CUDA engine kernels: the Kernels implementation split over kernels.cpp
// (memory, elementwise, capture), kernels_optim.cpp (optimizers, mixed precision),
// conv.cpp, norm_pool.cpp and linear.cpp. Every
// per-shape object (cuDNN descriptors, chosen algorithms, cuBLASLt layouts) is built once and
// cached by a key of dtypes, shapes, strides and attributes, so a step only looks plans up.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/check.h"
#include "nn/cuda/allocator.h"
#include "nn/cuda/common.h"
#include "nn/cuda/conv_fp8.h"
#include "nn/cuda/kernels.h"
#include "nn/kernels.h"

namespace ab::nn::cuda {

// Operand checks of the entry points, naming the kernel. require_flat: one shape, strides and
// dtype, contiguous (the kernels walk flat arrays; else Unsupported); require_scalar: `dtype` [1]
// (else Error); skip_flag: an optimizer's skip_if as the device pointer its kernels read, or null.
void require_flat(const char* kernel, const Tensor& a, const Tensor& b);
void require_scalar(const char* kernel, const char* what, const Tensor& t, DType dtype);
const std::int32_t* skip_flag(const Tensor& skip_if);

// One pass of a convolution: its own descriptor (the chosen algorithm fixes the math type) and
// algorithm; algo < 0 where no algorithm fitted (the pass then refuses to run, naming why).
// searched: false until a conv2d_prepare asked for the pass (a backward pass no layer of this
// configuration runs is never searched, and calling it is an Error).
struct ConvPass {
  bool searched = false;
  ConvDescPtr conv;
  int algo = -1;
  std::int64_t workspace_bytes = 0;
  double time_s = 0;    // the chosen algorithm's timed GPU time per call
  std::string choice;   // the chosen algorithm and every candidate's time, for reports
  std::string refusal;
};

// The folded epilogue act(conv + bias (+ residual)) of one (ReLU, residual) combination: cuDNN's
// fused cudnnConvolutionBiasActivationForward where it timed faster than the plain forward
// followed by the bias_act kernel (fused = true), else those two (cuDNN may run the fused call as
// separate kernels, or slower ones, for some shapes).
struct ConvEpilogue {
  bool searched = false, fused = false;
  ConvPass pass;             // the fused call's descriptor, algorithm and workspace
  TensorDescPtr bias;        // [1, C, 1, 1] in y's dtype
  ActivationDescPtr act;     // ReLU, or identity
  double unfused_s = 0;      // the plain forward plus bias_act, timed the same way
};

struct ConvPlan {
  TensorDescPtr x, y;
  FilterDescPtr w;
  ConvPass fwd, bwd_data, bwd_filter;
  std::array<ConvEpilogue, 4> epilogue;  // index: relu + 2 * residual
  std::string label;
};

// cuDNN's fused batch norm + (add +) ReLU for NHWC 16-bit training (the *Ex API with bnOps
// BN_ACTIVATION or BN_ADD_ACTIVATION, persistent mode): usable where cuDNN sized it and its reserve
// space fits the op's mask (nn::bn_activation_mask_words); `note` says which, or why not.
struct BnFusion {
  bool queried = false, usable = false;
  bool timed = false;  // a trial forward + backward ran at bind and decided `usable` by time
  std::int64_t fwd_workspace_bytes = 0, bwd_workspace_bytes = 0, reserve_bytes = 0;
  std::string note;
};

struct BnPlan {
  TensorDescPtr x;      // x, y, dy and dx share one shape and strides
  TensorDescPtr param;  // [1, C, 1, 1] in float (double for f64 activations)
  cudnnBatchNormMode_t mode = CUDNN_BATCHNORM_SPATIAL;  // of the *Ex path; the plain API runs spatial
  bool use_ex = false;  // the *Ex API with a workspace from bn_workspace_
  std::int64_t fwd_workspace_bytes = 0, bwd_workspace_bytes = 0;
  ActivationDescPtr relu;           // for the fused variants
  std::array<BnFusion, 2> fusion;   // index: with a residual
  std::string label;
};

// One fp8 convolution configuration (shape, bias type, residual, ReLU): cuDNN's graph with the whole
// epilogue, or (separate_epilogue) the convolution and descale alone followed by the bias_act
// kernel where cuDNN refused the residual inside the graph. A refused configuration keeps its
// reason (plan null) so that it is not searched again.
struct Fp8Layer {
  std::unique_ptr<Fp8ConvPlan> plan;
  bool separate_epilogue = false;
  std::string note, refusal;
  double fp8_s = 0, sixteen_s = 0;  // the timed comparison (0: not timed)
};

// A weight tensor's e4m3 image, its descale and its layer's bias widened to f32, made on the first
// forward after parameters_changed() and kept by the weight's address.
struct Fp8Weights {
  backend::cuda::DeviceBuffer q;
  backend::cuda::DeviceBuffer scalars;  // amax, descale (a line each), then the bias f32 [K]
  const void* bias_source = nullptr;
  std::int64_t weight_bytes = 0, bias_count = 0;  // what the buffers were made for
  bool fresh = false;
  float* descale() const { return reinterpret_cast<float*>(scalars.as<unsigned char>() + kAllocAlignment); }
  float* bias_f32() const { return reinterpret_cast<float*>(scalars.as<unsigned char>() + 2 * kAllocAlignment); }
};

struct PoolPlan {
  PoolDescPtr pool;
  TensorDescPtr x, y;
};

struct LtMatmulDeleter {
  void operator()(cublasLtMatmulDesc_t d) const noexcept { cublasLtMatmulDescDestroy(d); }
};
struct LtLayoutDeleter {
  void operator()(cublasLtMatrixLayout_t l) const noexcept { cublasLtMatrixLayoutDestroy(l); }
};
using LtMatmulPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, LtMatmulDeleter>;
using LtLayoutPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LtLayoutDeleter>;

// A column-major D[m, n] = op(A) op(B) (+ bias over rows) with its heuristic's first algorithm.
struct LtPlan {
  LtMatmulPtr op;
  LtLayoutPtr a, b, c;
  cublasLtMatmulAlgo_t algo{};
  std::string label;
};

// Column-major GEMM shape for cuBLASLt (the row-major tensors are viewed transposed).
struct GemmShape {
  DType dtype = DType::f32;
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  bool bias = false;        // epilogue: D += bias broadcast over columns (length m)
  bool allow_tf32 = true;   // f32 may use TF32 when set_tf32(true)
};

class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(backend::Backend& backend);
  ~CudaKernels() override;

  std::string_view name() const override { return "cuda"; }
  Allocator& allocator() override;
  std::unique_ptr<measure::IterationTimer> make_timer() override { return backend_.make_timer(); }
  void synchronize() override;
  void upload(const Tensor& dst, const void* host) override;
  void download(const Tensor& src, void* host) override;
  HostBuffer allocate_host(std::int64_t bytes) override;
  void upload_bytes(const Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) override;
  void download_bytes(const Tensor& src, std::int64_t offset, void* host, std::int64_t bytes) override;
  void fill(const Tensor& t, double value) override;
  void check_tensor(const Tensor& t) override;
  std::int64_t conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                              ConvPasses passes) override;

  std::int64_t conv2d_bias_activation_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                              const Tensor& bias, const Tensor& residual, const Tensor& y,
                                              bool relu) override;
  void conv2d_bias_activation_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Tensor& residual, const Tensor& y, bool relu, Workspace ws) override;

  std::int64_t conv2d_fp8_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                  const Tensor& residual, const Tensor& y, bool relu) override;
  void conv2d_fp8_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                          const Tensor& residual, const Tensor& y, bool relu, Workspace ws) override;
  void parameters_changed() override;
  void set_fp8_only_where_faster(bool only) override { fp8_only_where_faster_ = only; }
  void set_cooperative_kernels(bool allowed) override { cooperative_ = allowed; }
  std::vector<std::string> fp8_notes() const;

  void conv2d_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y, Workspace ws) override;
  void conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate,
                            Workspace ws) override;
  void conv2d_backward_filter(const Conv2dDesc& d, const Tensor& x, const Tensor& dy, const Tensor& dw,
                              Workspace ws) override;

  void batchnorm_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
                                  const Tensor& saved_mean, const Tensor& saved_invstd) override;
  void batchnorm_forward_inference(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& running_mean, const Tensor& running_var, const Tensor& y) override;
  void batchnorm_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx, bool accumulate,
                          const Tensor& dgamma, const Tensor& dbeta) override;

  std::int64_t batchnorm_activation_prepare(const Tensor& x, const Tensor& z, const Tensor& mask) override;
  void batchnorm_activation_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& z,
                                             const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                                             const Tensor& running_var, const Tensor& y, const Tensor& saved_mean,
                                             const Tensor& saved_invstd, const Tensor& mask) override;
  void batchnorm_activation_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy,
                                     const Tensor& gamma, const Tensor& beta, const Tensor& saved_mean,
                                     const Tensor& saved_invstd, const Tensor& mask, bool residual, const Tensor& dx,
                                     bool dx_accumulate, const Tensor& dz, bool dz_accumulate, const Tensor& dgamma,
                                     const Tensor& dbeta, Workspace ws) override;
  // What the fused batch norm + ReLU path decided per shape (for tests and reports).
  std::vector<std::string> bn_fusion_notes() const;
  FusionCounts fusion_counts() const override;
  std::vector<std::string> fusion_notes() const override { return bn_fusion_notes(); }

  void relu_forward(const Tensor& x, const Tensor& y) override;
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool accumulate) override;
  void add_forward(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void copy_gradient(const Tensor& dy, const Tensor& dx, bool accumulate) override;
  void bias_activation_forward(const Tensor& x, const Tensor& bias, const Tensor& residual, const Tensor& y,
                               bool relu) override;

  void maxpool_forward(const Pool2dDesc& d, const Tensor& x, const Tensor& y) override;
  void maxpool_backward(const Pool2dDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
                        bool accumulate) override;
  void global_avgpool_forward(const Tensor& x, const Tensor& y) override;
  void global_avgpool_backward(const Tensor& dy, const Tensor& dx, bool accumulate) override;

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) override;
  void linear_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate) override;
  void linear_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias) override;

  void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                     const Tensor& loss) override;
  void softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,
                                      const Tensor& dlogits, bool accumulate) override;

  void round_forward(const Tensor& x, const Tensor& y, double step) override;
  void rate_distortion_forward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x, const Tensor& latent,
                               const Tensor& loss, const Tensor& mse) override;
  void rate_distortion_backward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x, const Tensor& latent,
                                const Tensor& dloss, const Tensor& dx_hat, bool accumulate_x_hat, const Tensor& dlatent,
                                bool accumulate_latent) override;

  void sgd_update(const SgdStep& s, const Tensor& w, const Tensor& g, const Tensor& v) override;
  void sgd_update_many(const SgdStep& s, const std::vector<SgdTensors>& params) override;
  void lars_update(const LarsStep& s, const Tensor& w, const Tensor& g, const Tensor& v) override;

  void cast(const Tensor& src, const Tensor& dst) override;
  void unscale_and_check(const Tensor& g, const Tensor& scale, const Tensor& found_nonfinite) override;
  void update_loss_scale(const LossScaleRule& rule, const Tensor& scale, const Tensor& good_steps,
                         const Tensor& found_nonfinite) override;

  std::unique_ptr<Replayable> capture(const std::function<void()>& body) override;
  void set_deterministic(bool on) override { deterministic_ = on; }
  void set_tf32(bool allowed) override { tf32_ = allowed; }

  const CudaKernelStats& stats() const { return stats_; }
  std::vector<std::string> conv_choices() const;

 private:
  // conv.cpp
  Key conv_key(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) const;
  // For a kernel call: the cached plan, or where none is (a direct call without conv2d_prepare)
  // one searched now for every pass.
  ConvPlan& conv_plan(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y);
  // The cached plan with forward and `passes` searched: a cached plan lacking a pass is extended.
  ConvPlan& prepared_conv_plan(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                               ConvPasses passes);
  std::unique_ptr<ConvPlan> build_conv_plan(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y);
  // Searches forward (if not yet) and the passes in `passes` not searched yet.
  void search_conv_passes(ConvPlan& plan, const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                          ConvPasses passes);
  // Times the fused epilogue call against the plain forward (searched already) plus bias_act.
  void search_conv_epilogue(ConvPlan& plan, ConvEpilogue& e, const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                            const Tensor& y, bool relu, bool residual);
  // The epilogue entry of (relu, residual), searched now where no prepare did (outside a capture).
  ConvEpilogue& conv_epilogue(ConvPlan& plan, const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                              bool relu, bool residual);
  // search_scratch_ grown to hold `operand_bytes` plus a workspace of up to `cap_bytes` (reduced,
  // down to none, where memory is short); returns its base.
  unsigned char* search_operands(std::int64_t operand_bytes, std::int64_t& cap_bytes, const std::string& label);
  std::int64_t conv_workspace_cap() const;
  // conv_fp8_layer.cpp: the cached fp8 configuration (built now outside a capture; throws
  // Unsupported, also for a cached refusal) and the weights' e4m3 image, quantized where stale.
  Fp8Layer& fp8_layer(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Tensor& residual, const Tensor& y, bool relu);
  Fp8Weights& fp8_weights(const Tensor& w, const Tensor& bias, const Fp8Layer& layer);
  // Why the layer should run in 16 bits: its whole fp8 call (amax, quantize, convolution, epilogue)
  // timed on scratch operands no faster than the 16-bit call the op would run instead (the
  // searched conv2d_bias_activation); empty where fp8 is faster or the 16-bit call cannot run.
  std::string fp8_slower_than_16bit(Fp8Layer& layer, const Conv2dDesc& d, const Tensor& x, const Tensor& w,
                                    const Tensor& bias, const Tensor& residual, const Tensor& y, bool relu);
  // A write into a tensor starting at `data` (upload, fill, cast): the e4m3 image of a weight or
  // bias there is stale (memory a freed weight held may come back as another tensor).
  void fp8_weights_written(const void* data) {
    if (fp8_weights_.empty()) return;
    for (auto& [address, fw] : fp8_weights_)
      if (address == data || fw.bias_source == data) fw.fresh = false;
  }
  // norm_pool.cpp
  BnPlan& bn_plan(const Tensor& x);
  std::int64_t bn_ex_workspace_bytes(const Tensor& x);
  std::int64_t bn_scratch_bytes(const Tensor& x) const;  // the project's batch-norm kernels' scratch
  void* bn_scratch(const Tensor& x, const char* kernel);
  // The fused batch norm + ReLU entry for x (with a residual or not), queried once; null where x
  // is not NHWC 16-bit or cuDNN cannot run it with a reserve space of mask_bytes.
  BnFusion* bn_fusion(const Tensor& x, bool residual, std::int64_t mask_bytes);
  // At bind: runs cuDNN's fused forward + backward once on random operands (a refusal or error
  // makes it unusable) and times it against the project's fused forward + the separate backward;
  // the faster stays (f.usable).
  void time_bn_fusion(BnFusion& f, const Tensor& x, bool residual, std::int64_t mask_bytes);
  PoolPlan& pool_plan(const Pool2dDesc& d, const Tensor& x, const Tensor& y);
  // linear.cpp
  LtPlan& lt_plan(const GemmShape& g);
  void matmul(const GemmShape& g, const void* a, const void* b, void* c, float beta, const void* bias);
  void column_sums(const Tensor& dy, const Tensor& dbias);

  void release_search_scratch() noexcept;
  bool capturing() const;
  const void* ones(DType t) const;  // ones_count_ ones of dtype t

  backend::Backend& backend_;
  int device_ = 0;
  std::string label_;
  cudaStream_t stream_ = nullptr;
  int cc_major_ = 0, cc_minor_ = 0;
  DeviceAllocator alloc_;
  CudnnHandlePtr cudnn_;
  backend::cuda::LtHandlePtr lt_;
  backend::cuda::DeviceBuffer lt_workspace_;
  backend::cuda::DeviceBuffer lars_scratch_;
  backend::cuda::DeviceBuffer xent_scratch_;  // the loss's per-row partials, grown at bind
  backend::cuda::DeviceBuffer rd_scratch_;    // the rate-distortion loss's per-block partials
  backend::cuda::DeviceBuffer ones_;  // f32/f16/bf16 ones for the bias gradient's reduction GEMM
  std::int64_t ones_count_ = 0;
  backend::cuda::DeviceBuffer bn_workspace_;  // grown at bind (check_tensor) for the BN *Ex kernels
  backend::cuda::DeviceBuffer bn_scratch_;    // grown at bind (check_tensor) for cuda_batchnorm
  backend::cuda::DeviceBuffer search_scratch_;  // conv algorithm search operands, freed after binding
  bool deterministic_ = false;
  bool tf32_ = false;
  CudaKernelStats stats_;

  std::unordered_map<Key, std::unique_ptr<ConvPlan>, KeyHash> conv_plans_;
  std::unordered_map<Key, std::unique_ptr<BnPlan>, KeyHash> bn_plans_;
  std::unordered_map<Key, std::unique_ptr<PoolPlan>, KeyHash> pool_plans_;
  std::unordered_map<Key, std::unique_ptr<LtPlan>, KeyHash> lt_plans_;
  std::unordered_map<Key, std::unique_ptr<Fp8Layer>, KeyHash> fp8_layers_;
  bool fp8_only_where_faster_ = true;
  bool cooperative_ = true;  // cuDNN's persistent (cooperative) batch-norm kernels allowed
  std::unordered_map<const void*, Fp8Weights> fp8_weights_;
};

}  // namespace ab::nn::cuda
