#include "nn/optim.h"

#include "core/error.h"

namespace ab::nn {

bool Optimizer::bound_to(const std::vector<Parameter>& params) const {
  const void* key = params.empty() ? nullptr : params[0].value.data;
  return velocities_.size() == params.size() * static_cast<std::size_t>(moments()) && bound_to_ == key;
}

void Optimizer::bind(Kernels& k, const std::vector<Parameter>& params) {
  if (bound_to(params)) return;
  // One zeroed block holds every trainable parameter's velocities.
  const auto per = static_cast<std::size_t>(moments());
  bound_to_ = params.empty() ? nullptr : params[0].value.data;
  velocities_.assign(params.size() * per, Tensor{});
  std::int64_t total = 0;
  for (const auto& p : params)
    if (p.spec.trainable()) total += static_cast<std::int64_t>(per) * align_up(p.value.size_bytes());
  velocity_ = Buffer(k.allocator(), total);
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].spec.trainable()) continue;
    for (std::size_t m = 0; m < per; ++m) {
      Tensor& v = velocities_[i * per + m];
      v = velocity_.view(params[i].value, offset);
      offset += align_up(params[i].value.size_bytes());
      k.fill(v, 0.0);
    }
  }
  bind_state(k);
}

void Optimizer::step(Kernels& k, std::vector<Parameter>& params, const Tensor& skip_if) {
  bind(k, params);
  for (const Parameter& p : params)
    if (p.spec.trainable() && !p.grad.defined()) throw Error("optimizer: parameter " + p.name + " has no gradient");
  update_all(k, params, velocities_, skip_if);
}

void Optimizer::update_all(Kernels& k, const std::vector<Parameter>& params, const std::vector<Tensor>& velocities,
                           const Tensor& skip_if) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].spec.trainable()) continue;
    if (params[i].grad_partner.defined())
      throw Unsupported("optimizer " + std::string(name()) + " takes averaged gradients; only sgd averages in its update");
    update(k, params[i], velocities[i], skip_if);
    if (params[i].copy.defined()) k.cast(params[i].value, params[i].copy);
  }
}

namespace {

bool is_norm_or_bias(ParamRole r) {
  return r == ParamRole::bias || r == ParamRole::norm_scale || r == ParamRole::norm_shift;
}

}  // namespace

double Sgd::decay_of(const Parameter& p) const {
  return (decay_norm_and_bias_ || !is_norm_or_bias(p.spec.role)) ? weight_decay_ : 0.0;
}

void Sgd::update(Kernels& k, const Parameter& p, const Tensor& velocity, const Tensor& skip_if) {
  k.sgd_update(SgdStep{learning_rate(), momentum_, decay_of(p), skip_if}, p.value, p.grad, velocity);
}

void Sgd::update_all(Kernels& k, const std::vector<Parameter>& params, const std::vector<Tensor>& velocities,
                     const Tensor& skip_if) {
  std::vector<SgdTensors> all;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (params[i].spec.trainable())
      all.push_back({params[i].value, params[i].grad, velocities[i], params[i].copy, decay_of(params[i]),
                     params[i].grad_partner});
  k.sgd_update_many(SgdStep{learning_rate(), momentum_, 0.0, skip_if}, all);
}

void Lars::update(Kernels& k, const Parameter& p, const Tensor& velocity, const Tensor& skip_if) {
  LarsStep s;
  s.skip_if = skip_if;
  s.learning_rate = learning_rate();
  s.momentum = momentum_;
  s.trust_coefficient = eta_;
  s.epsilon = epsilon_;
  s.adapt = !is_norm_or_bias(p.spec.role);
  s.weight_decay = s.adapt ? weight_decay_ : 0.0;
  k.lars_update(s, p.value, p.grad, velocity);
}

void AdamW::bind_state(Kernels& k) {
  state_ = Buffer(k.allocator(), 2 * kAllocAlignment);
  step_count_ = state_.view(Tensor::describe(DType::i32, Shape{1}), 0);
  grad_norm_squared_ = state_.view(Tensor::describe(DType::f32, Shape{1}), kAllocAlignment);
  k.fill(step_count_, 0.0);
  k.fill(grad_norm_squared_, 0.0);
}

std::int64_t AdamW::steps_taken(Kernels& k) const {
  if (!step_count_.defined()) return 0;
  std::int32_t n = 0;
  k.download(step_count_, &n);
  return n;
}

void AdamW::update_all(Kernels& k, const std::vector<Parameter>& params, const std::vector<Tensor>& velocities,
                       const Tensor& skip_if) {
  std::vector<AdamWTensors> all;
  std::vector<Tensor> grads;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = params[i];
    if (!p.spec.trainable()) continue;
    if (p.grad_partner.defined())
      throw Unsupported("optimizer adamw takes averaged gradients; only sgd averages in its update");
    const double decay = p.spec.role == ParamRole::weight ? weight_decay_ : 0.0;
    all.push_back({p.value, p.grad, velocities[2 * i], velocities[2 * i + 1], p.copy, decay});
    grads.push_back(p.grad);
  }
  AdamWStep s;
  s.learning_rate = learning_rate();
  s.beta1 = beta1_;
  s.beta2 = beta2_;
  s.epsilon = epsilon_;
  s.step_count = step_count_;
  s.max_grad_norm = max_grad_norm_;
  s.skip_if = skip_if;
  if (max_grad_norm_ > 0) {
    k.sum_squares(grads, grad_norm_squared_);
    s.grad_norm_squared = grad_norm_squared_;
  }
  k.count_step(step_count_, skip_if);
  k.adamw_update_many(s, all);
}

void AdamW::update(Kernels&, const Parameter&, const Tensor&, const Tensor&) {
  throw Error("adamw updates every parameter in one call (update_all)");
}

}  // namespace ab::nn
