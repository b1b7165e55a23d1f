// The reference kernels: host memory, f32 or f64 storage, every sum in float64. Loops are split
// over outputs only (each output summed by one thread in a fixed order), so results are
// bit-identical for any thread count. Slow on purpose; small problems and CI only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "nn/kernels.h"

namespace ab::nn::ref {

inline std::size_t sz(std::int64_t i) { return static_cast<std::size_t>(i); }

// Calls f(T{}) with T the storage type of a floating tensor.
template <typename F>
void dispatch(DType t, F&& f) {
  if (t == DType::f32)
    f(float{});
  else if (t == DType::f64)
    f(double{});
  else
    throw Unsupported("the ref kernels store f32 or f64, not " + std::string(to_string(t)));
}

// Strided element access to a rank-4 tensor, logical [N, C, H, W] (or [K, C, R, S]).
template <typename T>
struct View4 {
  T* p;
  std::int64_t n, c, h, w;
  std::int64_t sn, sc, sh, sw;
  explicit View4(const Tensor& t)
      : p(static_cast<T*>(t.data)), n(t.shape[0]), c(t.shape[1]), h(t.shape[2]), w(t.shape[3]),
        sn(t.strides[0]), sc(t.strides[1]), sh(t.strides[2]), sw(t.strides[3]) {}
  T& at(std::int64_t i, std::int64_t j, std::int64_t k, std::int64_t l) const {
    return p[i * sn + j * sc + k * sh + l * sw];
  }
  T* plane(std::int64_t i, std::int64_t j) const { return p + i * sn + j * sc; }
};

// Strided access to a rank-2 tensor [rows, cols].
template <typename T>
struct View2 {
  T* p;
  std::int64_t rows, cols, sr, sc;
  explicit View2(const Tensor& t)
      : p(static_cast<T*>(t.data)), rows(t.shape[0]), cols(t.shape[1]), sr(t.strides[0]), sc(t.strides[1]) {}
  T& at(std::int64_t i, std::int64_t j) const { return p[i * sr + j * sc]; }
};

// Threads start only where a call has enough work (multiply-adds or element visits) to repay
// them: on the tiny problems of the tests, threads spinning at barriers of a loaded 2-core CI
// machine cost several times what they save. Results do not depend on this choice.
inline constexpr std::int64_t kParallelMinWork = std::int64_t{1} << 21;
inline bool worth_threads(std::int64_t work) { return work >= kParallelMinWork; }

class RefKernels final : public Kernels {
 public:
  std::string_view name() const override { return "ref"; }
  Allocator& allocator() override { return allocator_; }
  std::unique_ptr<measure::IterationTimer> make_timer() override;
  void synchronize() override {}
  void upload(const Tensor& dst, const void* host) override;
  void download(const Tensor& src, void* host) override;
  void fill(const Tensor& t, double value) override;
  void check_tensor(const Tensor& t) override;
  std::int64_t conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y) override;

  void conv2d_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y, Workspace) override;
  void conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate,
                            Workspace) override;
  void conv2d_backward_filter(const Conv2dDesc& d, const Tensor& x, const Tensor& dy, const Tensor& dw,
                              Workspace) override;

  void batchnorm_forward_training(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
                                  const Tensor& saved_mean, const Tensor& saved_invstd) override;
  void batchnorm_forward_inference(const BatchNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& running_mean, const Tensor& running_var, const Tensor& y) override;
  void batchnorm_backward(const BatchNormDesc& d, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx, bool accumulate,
                          const Tensor& dgamma, const Tensor& dbeta) override;

  void relu_forward(const Tensor& x, const Tensor& y) override;
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool accumulate) override;
  void add_forward(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void copy_gradient(const Tensor& dy, const Tensor& dx, bool accumulate) override;

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

  void sgd_update(const SgdStep& s, const Tensor& w, const Tensor& g, const Tensor& v) override;
  void lars_update(const LarsStep& s, const Tensor& w, const Tensor& g, const Tensor& v) override;

  void cast(const Tensor& src, const Tensor& dst) override;
  void unscale_and_check(const Tensor& g, const Tensor& scale, const Tensor& found_nonfinite) override;
  void update_loss_scale(const LossScaleRule& rule, const Tensor& scale, const Tensor& good_steps,
                         const Tensor& found_nonfinite) override;
  // Records `body` without running it; replay() runs it. The work happens only on replay, as
  // with a CUDA graph, so code that captures is tested honestly on the CPU.
  std::unique_ptr<Replayable> capture(const std::function<void()>& body) override;
  // The reference is exact and deterministic, and has no TF32: both are no-ops.
  void set_deterministic(bool) override {}
  void set_tf32(bool) override {}

 private:
  HostAllocator allocator_;
};

// Throws Unsupported unless all tensors are contiguous with one shape and one layout, the form
// the elementwise loops below walk as flat arrays.
void require_same_flat(const char* kernel, const Tensor& a, const Tensor& b);

}  // namespace ab::nn::ref
