// Optimizers: one step over a graph's parameters through the backend's update kernels. Each
// keeps its velocity buffers (allocated by bind, or on the first step) and counts its own FLOPs
// and bytes.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "nn/graph.h"
#include "nn/kernels.h"

namespace ab::nn {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string_view name() const = 0;
  // Allocates and zeroes moments() velocities per trainable parameter (in the parameter's dtype:
  // the f32 master under bf16/fp16), and the optimizer's own state (bind_state). A no-op when already bound to these
  // parameters; call it before capturing a step, which must not allocate (Graph::capture_step does).
  void bind(Kernels& k, const std::vector<Parameter>& params);
  bool bound_to(const std::vector<Parameter>& params) const;
  // Binds if needed, then updates every trainable parameter and refreshes its 16-bit copy (the
  // one the forward pass reads under bf16/fp16). skip_if (i32 [1], may be undefined) is read on
  // the device: non-zero leaves every parameter and velocity unchanged (fp16 loss scaling found a
  // non-finite gradient).
  void step(Kernels& k, std::vector<Parameter>& params, const Tensor& skip_if = {});
  // The learning rate is a host value passed with each update kernel: a captured step keeps the
  // one it was captured with (recapture after changing it).
  void set_learning_rate(double lr) { learning_rate_ = lr; }
  double learning_rate() const { return learning_rate_; }
  // Per step, for `elements` trainable parameter elements of `element_bytes` each.
  virtual std::int64_t flops(std::int64_t elements) const = 0;
  virtual std::int64_t bytes(std::int64_t elements, std::int64_t element_bytes) const = 0;

 protected:
  explicit Optimizer(double lr) : learning_rate_(lr) {}
  // Velocity tensors per parameter: SGD's momentum 1, Adam's two moments.
  virtual int moments() const { return 1; }
  // Allocates (and initialises) what the optimizer keeps besides the velocities; at bind.
  virtual void bind_state(Kernels& /*k*/) {}
  // Every trainable parameter's update and copy refresh; velocities[i * moments() + m] is
  // params[i]'s m-th (undefined for a frozen one). The default calls update() and casts per parameter.
  virtual void update_all(Kernels& k, const std::vector<Parameter>& params, const std::vector<Tensor>& velocities,
                          const Tensor& skip_if);
  virtual void update(Kernels& k, const Parameter& p, const Tensor& velocity, const Tensor& skip_if) = 0;

 private:
  double learning_rate_;
  Buffer velocity_;
  std::vector<Tensor> velocities_;
  const void* bound_to_ = nullptr;  // the first parameter's storage: which graph the velocities are for
};

// PyTorch's SGD with momentum and weight decay; the decay applies to every parameter unless
// `decay_norm_and_bias` is false (torchvision's --norm-weight-decay 0).
class Sgd final : public Optimizer {
 public:
  Sgd(double lr, double momentum, double weight_decay, bool decay_norm_and_bias = true)
      : Optimizer(lr), momentum_(momentum), weight_decay_(weight_decay), decay_norm_and_bias_(decay_norm_and_bias) {}
  std::string_view name() const override { return "sgd"; }
  std::int64_t flops(std::int64_t elements) const override { return 6 * elements; }
  std::int64_t bytes(std::int64_t elements, std::int64_t element_bytes) const override {
    return 5 * elements * element_bytes;  // read w, g, v; write w, v
  }

 private:
  // One fused call for all parameters (Kernels::sgd_update_many).
  void update_all(Kernels& k, const std::vector<Parameter>& params, const std::vector<Tensor>& velocities,
                  const Tensor& skip_if) override;
  void update(Kernels& k, const Parameter& p, const Tensor& velocity, const Tensor& skip_if) override;
  double decay_of(const Parameter& p) const;
  double momentum_, weight_decay_;
  bool decay_norm_and_bias_;
};

// LARS as MLPerf's ResNet reference runs it: layer-wise trust ratio for weights; batch-norm
// and bias parameters take plain momentum SGD without decay.
class Lars final : public Optimizer {
 public:
  Lars(double lr, double momentum, double weight_decay, double trust_coefficient = 0.001, double epsilon = 0.0)
      : Optimizer(lr), momentum_(momentum), weight_decay_(weight_decay), eta_(trust_coefficient), epsilon_(epsilon) {}
  std::string_view name() const override { return "lars"; }
  std::int64_t flops(std::int64_t elements) const override { return 10 * elements; }  // + two norms
  std::int64_t bytes(std::int64_t elements, std::int64_t element_bytes) const override {
    return 7 * elements * element_bytes;  // norms read w, g; update reads w, g, v, writes w, v
  }

 private:
  void update(Kernels& k, const Parameter& p, const Tensor& velocity, const Tensor& skip_if) override;
  double momentum_, weight_decay_, eta_, epsilon_;
};

// AdamW as GPT-2 trains (llm.c, nanoGPT): decoupled weight decay on weights only (not biases or
// norm parameters), the global gradient norm clipped to max_grad_norm (0: no clipping), and the
// step count kept on the device so that a captured step's bias corrections advance with each
// replay. All parameters in one fused call (Kernels::adamw_update_many).
class AdamW final : public Optimizer {
 public:
  AdamW(double lr, double beta1, double beta2, double epsilon, double weight_decay, double max_grad_norm)
      : Optimizer(lr),
        beta1_(beta1),
        beta2_(beta2),
        epsilon_(epsilon),
        weight_decay_(weight_decay),
        max_grad_norm_(max_grad_norm) {}
  std::string_view name() const override { return "adamw"; }
  std::int64_t flops(std::int64_t elements) const override { return (max_grad_norm_ > 0 ? 14 : 12) * elements; }
  std::int64_t bytes(std::int64_t elements, std::int64_t element_bytes) const override {
    // read w, g, m, v; write w, m, v (and the norm's read of g)
    return (max_grad_norm_ > 0 ? 8 : 7) * elements * element_bytes;
  }
  // The updates made so far (reads the device; not while capturing).
  std::int64_t steps_taken(Kernels& k) const;

 private:
  int moments() const override { return 2; }
  void bind_state(Kernels& k) override;
  void update_all(Kernels& k, const std::vector<Parameter>& params, const std::vector<Tensor>& velocities,
                  const Tensor& skip_if) override;
  void update(Kernels& k, const Parameter& p, const Tensor& velocity, const Tensor& skip_if) override;
  double beta1_, beta2_, epsilon_, weight_decay_, max_grad_norm_;
  Buffer state_;
  Tensor step_count_, grad_norm_squared_;  // i32 [1], f32 [1]
};

}  // namespace ab::nn
