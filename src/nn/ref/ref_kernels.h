// The reference kernels: host memory, f64/f32/f16/bf16 storage, every sum in float64. Loops are
// split over outputs only (each output summed by one thread in a fixed order), so results are
// bit-identical for any thread count. Slow on purpose; small problems and CI only.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/kernels.h"

namespace ab::nn::ref {

inline std::size_t sz(std::int64_t i) { return static_cast<std::size_t>(i); }

// Rounds a double to float with round-to-odd (inexact results get the odd neighbour toward zero).
// Narrowing that float once more to a 16-bit format, to nearest even, then gives the correctly
// rounded 16-bit value of the double, where double -> float -> 16 bits could round twice.
inline float to_float_round_odd(double v) {
  float f = static_cast<float>(v);
  if (std::isfinite(f) && static_cast<double>(f) != v) {
    auto bits = std::bit_cast<std::uint32_t>(f);
    if (std::fabs(static_cast<double>(f)) > std::fabs(v)) --bits;  // one step toward zero
    f = std::bit_cast<float>(bits | 1u);
  }
  return f;
}

inline double half_bits_to_double(std::uint16_t h) {  // exact; inline for the kernels' inner loops
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const double v = static_cast<double>(mant) * 0x1p-24;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// 16-bit storage types: loads widen exactly, stores round once to nearest even. The implicit
// conversions let the kernel templates below run on them as on float and double.
struct Half {
  std::uint16_t bits;
  Half() = default;
  Half(double v) : bits(float_to_half_bits(to_float_round_odd(v))) {}  // NOLINT: implicit on purpose
  operator double() const { return half_bits_to_double(bits); }        // NOLINT
  static Half from_bits(std::uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};
struct BFloat16 {
  std::uint16_t bits;
  BFloat16() = default;
  BFloat16(double v) : bits(float_to_bf16_bits(to_float_round_odd(v))) {}  // NOLINT
  operator double() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }  // NOLINT
  static BFloat16 from_bits(std::uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

// Calls f(T{}) with T the storage type of a floating tensor.
template <typename F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); break;
    case DType::f64: f(double{}); break;
    case DType::f16: f(Half{}); break;
    case DType::bf16: f(BFloat16{}); break;
    default:
      throw Unsupported("the ref kernels store f64, f32, f16 or bf16 (and i32 labels), not " +
                        std::string(to_string(t)));
  }
}

// Any floating element `offset` elements past t.data, widened exactly; and the rounded store.
// For operands whose type may differ from the main one (batch-norm parameters and statistics, the
// loss, probabilities, a bias): a switch per element, cheap next to the main loops.
double load(const Tensor& t, std::int64_t offset);
void store(const Tensor& t, std::int64_t offset, double v);

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

// Host memory that refuses to allocate while a step is being captured (a CUDA graph could not
// replay an allocation), so a capture that would allocate fails on the CPU too.
class RefAllocator final : public Allocator {
 public:
  explicit RefAllocator(const bool* capturing) : capturing_(capturing) {}
  DeviceKind device() const override { return DeviceKind::host; }
  void* allocate(std::int64_t bytes) override;
  void deallocate(void* p, std::int64_t bytes) noexcept override;

 private:
  const bool* capturing_;
  HostAllocator host_;
};

// Not final: tests derive from it to watch calls (set_deterministic, set_tf32) or to refuse.
class RefKernels : public Kernels {
 public:
  std::string_view name() const override { return "ref"; }
  Allocator& allocator() override { return allocator_; }
  std::unique_ptr<measure::IterationTimer> make_timer() override;
  void synchronize() override;
  void upload(const Tensor& dst, const void* host) override;
  void download(const Tensor& src, void* host) override;
  // Plain host memory; the byte-range copies are memcpy, done when they return.
  HostBuffer allocate_host(std::int64_t bytes) override;
  void upload_bytes(const Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) override;
  void download_bytes(const Tensor& src, std::int64_t offset, void* host, std::int64_t bytes) override;
  void fill(const Tensor& t, double value) override;
  void check_tensor(const Tensor& t) override;
  // Checks the operands only: the direct loops need no search and no workspace for any pass.
  std::int64_t conv2d_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y,
                              ConvPasses passes) override;

  void conv2d_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& y, Workspace) override;
  void conv2d_backward_data(const Conv2dDesc& d, const Tensor& dy, const Tensor& w, const Tensor& dx, bool accumulate,
                            Workspace) override;
  void conv2d_backward_filter(const Conv2dDesc& d, const Tensor& x, const Tensor& dy, const Tensor& dw,
                              Workspace) override;

  // fp8: x and w quantized on every call (so parameters_changed() stays the default no-op), the
  // e4m3 values held exactly in f64 and convolved by conv2d_forward's loops, the epilogue in f64, y
  // rounded once. Refuses what fp8_conv_refusal names, as the CUDA kernels do (so no f32 x); an
  // undefined bias (no shape) adds nothing; no workspace.
  std::int64_t conv2d_fp8_prepare(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                                  const Tensor& residual, const Tensor& y, bool relu) override;
  void conv2d_fp8_forward(const Conv2dDesc& d, const Tensor& x, const Tensor& w, const Tensor& bias,
                          const Tensor& residual, const Tensor& y, bool relu, Workspace) override;

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
  void column_sums(const Tensor& x, const Tensor& sums) override;

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

  // Transformer kernels (ref_transformer.cpp); attention materialises each query row's scores.
  void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& y) override;
  void embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte, bool accumulate_wte,
                          const Tensor& dwpe) override;
  void layernorm_forward(const LayerNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                         const Tensor& y, const Tensor& mean, const Tensor& rstd) override;
  void layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                          const Tensor& dx, bool accumulate, const Tensor& dgamma, const Tensor& dbeta) override;
  void rmsnorm_forward(const LayerNormDesc& d, const Tensor& x, const Tensor& gamma, const Tensor& y,
                       const Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& rstd, const Tensor& dx,
                        bool accumulate, const Tensor& dgamma) override;
  void dropout_forward(const DropoutDesc& d, const Tensor& x, const Tensor& y, const Tensor& counter) override;
  void dropout_backward(const DropoutDesc& d, const Tensor& dy, const Tensor& dx, const Tensor& counter,
                        bool accumulate) override;
  void gelu_forward(const Tensor& x, const Tensor& y) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate) override;
  void attention_forward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                         const Tensor& stats) override;
  void attention_backward(const AttentionDesc& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                          const Tensor& dout, const Tensor& stats, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv) override;
  void sum_squares(const std::vector<Tensor>& tensors, const Tensor& out) override;
  void adamw_update(const AdamWStep& s, const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v) override;
  void count_step(const Tensor& counter, const Tensor& skip_if) override;
  void cross_entropy_fused(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                           const Tensor& seed) override;

  // Generic inference kernels (ref_generic.cpp): any strides, every dtype load/store takes.
  void unary_forward(const UnaryAttrs& a, const Tensor& x, const Tensor& y) override;
  void binary_forward(BinaryKind kind, const Tensor& a, const Tensor& b, const Tensor& y) override;
  void where_forward(const Tensor& cond, const Tensor& x, const Tensor& y, const Tensor& out) override;
  void copy_strided(const Tensor& x, const Tensor& y) override;
  void softmax_forward(int axis, const Tensor& x, const Tensor& y) override;
  void reduce_mean_forward(const Tensor& x, const Tensor& y) override;
  void avgpool_forward(const Pool2dDesc& d, bool count_include_pad, const Tensor& x, const Tensor& y) override;
  void resize_forward(bool linear, const Tensor& x, const Tensor& y) override;
  void matmul_forward(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void gather_forward(int axis, const Tensor& table, const Tensor& indices, const Tensor& y) override;

  void sgd_update(const SgdStep& s, const Tensor& w, const Tensor& g, const Tensor& v) override;
  void lars_update(const LarsStep& s, const Tensor& w, const Tensor& g, const Tensor& v) override;

  void cast(const Tensor& src, const Tensor& dst) override;
  void cast_many(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts,
                 const CastManyMode& mode = {}) override;
  void unscale_and_check(const Tensor& g, const Tensor& scale, const Tensor& found_nonfinite) override;
  void update_loss_scale(const LossScaleRule& rule, const Tensor& scale, const Tensor& good_steps,
                         const Tensor& found_nonfinite) override;
  // Runs `body` on the host with every kernel call queued (arguments copied) instead of executed;
  // replay() makes the queued calls. As with a CUDA graph, the work runs only on replay, host
  // code in `body` runs only at capture, and host values (a learning rate) are frozen then.
  // Allocating, synchronize, upload and download throw while capturing.
  std::unique_ptr<Replayable> capture(const std::function<void()>& body) override;
  // The reference is exact and deterministic, and has no TF32: both are no-ops.
  void set_deterministic(bool) override {}
  void set_tf32(bool) override {}

 protected:
  // While capturing, queues `call` (which repeats the kernel call) and returns true.
  template <typename F>
  bool deferred(F&& call) {
    if (tape_ == nullptr) return false;
    tape_->emplace_back(std::forward<F>(call));
    return true;
  }
  void refuse_while_capturing(const char* what) const;

 private:
  bool capturing_ = false;
  std::vector<std::function<void()>>* tape_ = nullptr;
  RefAllocator allocator_{&capturing_};
};

// Throws Unsupported unless all tensors are contiguous with one shape and one layout, the form
// the elementwise loops below walk as flat arrays.
void require_same_flat(const char* kernel, const Tensor& a, const Tensor& b);

}  // namespace ab::nn::ref
