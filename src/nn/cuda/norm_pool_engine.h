// The normalisation and pooling family: batch norm (the project's kernels, batchnorm.cu, on
// [N*H*W, C] memory; cuDNN for the rest: norm_pool.cpp), batch norm + (residual add +) ReLU fused
// by cuDNN where it timed clearly faster (bn_fusion.cpp), max pooling through cuDNN and global
// average pooling on the project's kernels. Owns the batch-norm plans, workspace and scratch, sized
// at bind so a step (or a capture) never allocates. The entry points are nn::Kernels'.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/check.h"
#include "nn/cuda/common.h"
#include "nn/cuda/context.h"
#include "nn/kernels.h"

namespace ab::nn::cuda {

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
  TensorDescPtr x;                                      // x, y, dy and dx share one shape and strides
  TensorDescPtr param;                                  // [1, C, 1, 1] in float (double for f64 activations)
  cudnnBatchNormMode_t mode = CUDNN_BATCHNORM_SPATIAL;  // of the *Ex path; the plain API runs spatial
  bool use_ex = false;                                  // the *Ex API with a workspace from bn_workspace_
  std::int64_t fwd_workspace_bytes = 0, bwd_workspace_bytes = 0;
  ActivationDescPtr relu;          // for the fused variants
  std::array<BnFusion, 2> fusion;  // index: with a residual
  std::string label;
};

struct PoolPlan {
  PoolDescPtr pool;
  TensorDescPtr x, y;
};

class NormPoolEngine {
 public:
  explicit NormPoolEngine(EngineContext& ctx) : ctx_(ctx) {}
  NormPoolEngine(const NormPoolEngine&) = delete;
  NormPoolEngine& operator=(const NormPoolEngine&) = delete;

  // At bind (check_tensor): every activation-shaped tensor may meet a batch norm, so the *Ex
  // workspace and the project's kernels' scratch grow to fit it now.
  void reserve_for(const Tensor& t);

  void batchnorm_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
                                  const Tensor& saved_mean, const Tensor& saved_invstd);
  void batchnorm_forward_inference(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& running_mean, const Tensor& running_var, const Tensor& y);
  void batchnorm_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx, bool accumulate,
                          const Tensor& dgamma, const Tensor& dbeta);

  std::int64_t batchnorm_activation_prepare(const Tensor& x, const Tensor& z, const Tensor& mask);
  void batchnorm_activation_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& z,
                                             const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                                             const Tensor& running_var, const Tensor& y, const Tensor& saved_mean,
                                             const Tensor& saved_invstd, const Tensor& mask);
  void batchnorm_activation_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy,
                                     const Tensor& gamma, const Tensor& beta, const Tensor& saved_mean,
                                     const Tensor& saved_invstd, const Tensor& mask, bool residual, const Tensor& dx,
                                     bool dx_accumulate, const Tensor& dz, bool dz_accumulate, const Tensor& dgamma,
                                     const Tensor& dbeta, Workspace ws);

  void maxpool_forward(const Pool2dDesc& d, const Tensor& x, const Tensor& y);
  void maxpool_backward(const Pool2dDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
                        bool accumulate);
  void global_avgpool_forward(const Tensor& x, const Tensor& y);
  void global_avgpool_backward(const Tensor& dy, const Tensor& dx, bool accumulate);

  // What the fused batch norm + ReLU path decided per shape (cuda_bn_fusion_notes, fusion_notes)
  // and how many shapes it fused (Kernels::fusion_counts).
  std::vector<std::string> bn_fusion_notes() const;
  void count_fusions(Kernels::FusionCounts& counts) const;

 private:
  // norm_pool.cpp
  BnPlan& bn_plan(const Tensor& x);
  std::int64_t bn_ex_workspace_bytes(const Tensor& x);
  std::int64_t bn_scratch_bytes(const Tensor& x) const;  // the project's batch-norm kernels' scratch
  void* bn_scratch(const Tensor& x, const char* kernel);
  PoolPlan& pool_plan(const Pool2dDesc& d, const Tensor& x, const Tensor& y);
  // bn_fusion.cpp: the fused batch norm + ReLU entry for x (with a residual or not), queried once;
  // null where x is not NHWC 16-bit or cuDNN cannot run it with a reserve space of mask_bytes.
  BnFusion* bn_fusion(const Tensor& x, bool residual, std::int64_t mask_bytes);
  // At bind: runs cuDNN's fused forward + backward once on random operands (a refusal or error
  // makes it unusable) and times it against the project's fused forward + the separate backward;
  // the faster stays (f.usable).
  void time_bn_fusion(BnFusion& f, const Tensor& x, bool residual, std::int64_t mask_bytes);

  EngineContext& ctx_;
  backend::cuda::DeviceBuffer bn_workspace_;  // grown at bind (reserve_for) for the BN *Ex kernels
  backend::cuda::DeviceBuffer bn_scratch_;    // grown at bind (reserve_for) for batchnorm.cu
  std::unordered_map<Key, std::unique_ptr<BnPlan>, KeyHash> bn_plans_;
  std::unordered_map<Key, std::unique_ptr<PoolPlan>, KeyHash> pool_plans_;
};

}  // namespace ab::nn::cuda
