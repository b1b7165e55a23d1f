// Graph binding and execution: prepare layers on a backend, allocate, initialise parameters, and
// run the fixed forward/backward/update sequence (optionally timing each op).
#include <cmath>
#include <numbers>

#include "core/rng.h"
#include "nn/graph_internal.h"
#include "nn/optim.h"

namespace ab::nn {
namespace {

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// Values drawn from (seed, parameter name): a layer's initial weights do not depend on what else
// the graph holds or in which order it was built.
std::vector<double> initial_values(const ParamSpec& spec, std::uint64_t seed, const std::string& name) {
  const std::uint64_t key = mix64(seed, fnv1a(name));
  std::vector<double> v(static_cast<std::size_t>(spec.shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    switch (spec.init.dist) {
      case ParamInit::Dist::zeros: v[i] = 0.0; break;
      case ParamInit::Dist::ones: v[i] = 1.0; break;
      case ParamInit::Dist::uniform: v[i] = uniform(key, i, -spec.init.scale, spec.init.scale); break;
      case ParamInit::Dist::normal: {
        // Box-Muller; 1 - u is in (0, 1], so the log is finite.
        const double u1 = uniform(key, 2 * i, 0.0, 1.0), u2 = uniform(key, 2 * i + 1, 0.0, 1.0);
        v[i] = spec.init.scale * std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * std::numbers::pi * u2);
        break;
      }
    }
  }
  return v;
}

std::string layer_prefix(const Op& op) { return "layer '" + op.name() + "' (" + std::string(op.kind()) + "): "; }

}  // namespace

void Graph::bind(Kernels& kernels) {
  State& s = *s_;
  s.kernels = &kernels;
  s.params.clear();
  s.bound.assign(s.n(), OpTensors{});

  // Parameters and gradients in two blocks, each tensor aligned like an arena buffer.
  std::vector<std::vector<Tensor>> param_descs(s.n());
  std::int64_t param_bytes = 0, grad_bytes = 0;
  for (std::size_t i = 0; i < s.n(); ++i)
    for (const auto& spec : s.specs[i]) {
      param_descs[i].push_back(graph_desc(s.options, s.options.dtype, spec.shape));
      param_bytes += align_up(param_descs[i].back().size_bytes());
      if (spec.trainable()) grad_bytes += align_up(param_descs[i].back().size_bytes());
    }

  // Describe every op's tensors (no data yet) and let the backend refuse what it cannot run.
  std::int64_t workspace_bytes = 0;
  for (std::size_t i = 0; i < s.n(); ++i) {
    const Node& node = s.nodes[i];
    OpTensors& t = s.bound[i];
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      const auto v = static_cast<std::size_t>(node.inputs[j]);
      t.in.push_back(s.values[v].desc);
      t.din.push_back(s.values[v].desc);
    }
    for (int o : node.outputs) {
      t.out.push_back(s.value(o).desc);
      t.dout.push_back(s.value(o).desc);
    }
    t.params = param_descs[i];
    t.dparams = param_descs[i];
    t.saved = node.op->saved();
    for (auto& d : t.saved) d = graph_desc(s.options, d.dtype, d.shape);
    t.din_accumulate = s.din_accumulate[i];
    try {
      workspace_bytes = std::max(workspace_bytes, node.op->prepare(kernels, t));
    } catch (const LayerError&) {
      throw;
    } catch (const Unsupported& e) {
      throw Unsupported(layer_prefix(*node.op) + e.what());
    } catch (const Error& e) {
      throw LayerError(layer_prefix(*node.op) + e.what());
    }
  }
  for (const auto& v : s.values)
    if (v.producer < 0) try {
        kernels.check_tensor(v.desc);
      } catch (const Unsupported& e) {
        throw Unsupported("input '" + v.name + "': " + e.what());
      }

  Allocator& alloc = kernels.allocator();
  s.arena = Buffer(alloc, s.plan.peak_bytes);
  s.workspace = Buffer(alloc, workspace_bytes);
  s.param_store = Buffer(alloc, param_bytes);
  s.grad_store = Buffer(alloc, grad_bytes);

  std::int64_t param_offset = 0, grad_offset = 0;
  for (std::size_t i = 0; i < s.n(); ++i) {
    const Node& node = s.nodes[i];
    OpTensors& t = s.bound[i];
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      const auto v = static_cast<std::size_t>(node.inputs[j]);
      t.in[j] = s.view_of(s.value_buffer[v], s.values[v].desc);
      // Written only by an op that runs backward, for an input that needs a gradient.
      const bool writes = s.runs_backward[i] && s.values[v].requires_grad;
      t.din[j] = writes ? s.view_of(s.grad_buffer[v], s.values[v].desc) : s.values[v].desc;
    }
    for (std::size_t j = 0; j < node.outputs.size(); ++j) {
      const auto v = static_cast<std::size_t>(node.outputs[j]);
      t.out[j] = s.view_of(s.value_buffer[v], s.values[v].desc);
      t.dout[j] = s.view_of(s.grad_buffer[v], s.values[v].desc);
    }
    for (std::size_t j = 0; j < t.saved.size(); ++j) t.saved[j] = s.view_of(s.saved_buffer[i][j], t.saved[j]);
    t.workspace = Workspace{s.workspace.data(), s.workspace.size_bytes()};
    for (std::size_t j = 0; j < s.specs[i].size(); ++j) {
      const ParamSpec& spec = s.specs[i][j];
      Parameter p;
      p.name = node.op->name() + "." + spec.name;
      p.spec = spec;
      p.value = s.param_store.view(param_descs[i][j], param_offset);
      param_offset += align_up(p.value.size_bytes());
      if (spec.trainable()) {
        p.grad = s.grad_store.view(param_descs[i][j], grad_offset);
        grad_offset += align_up(p.grad.size_bytes());
      }
      t.params[j] = p.value;
      t.dparams[j] = p.grad.defined() ? p.grad : param_descs[i][j];
      // Initialise through a host staging copy in the tensor's own dtype and strides.
      std::vector<unsigned char> host(static_cast<std::size_t>(p.value.size_bytes()));
      Tensor staging = p.value;
      staging.data = host.data();
      staging.device = DeviceKind::host;
      write_host(staging, initial_values(spec, s.options.seed, p.name));
      kernels.upload(p.value, host.data());
      s.params.push_back(std::move(p));
    }
  }
  if (s.profiling) s.timer = kernels.make_timer();
}

Kernels& Graph::kernels() const { return s_->k(); }

Tensor Graph::tensor(Value v) const {
  const auto id = static_cast<std::size_t>(v.id);
  if (v.id < 0 || id >= s_->values.size()) throw Error("value " + std::to_string(v.id) + " does not exist");
  s_->k();
  return s_->view_of(s_->value_buffer[id], s_->values[id].desc);
}

Tensor Graph::grad(Value v) const {
  const auto id = static_cast<std::size_t>(v.id);
  if (v.id < 0 || id >= s_->values.size()) throw Error("value " + std::to_string(v.id) + " does not exist");
  s_->k();
  return s_->view_of(s_->grad_buffer[id], s_->values[id].desc);
}

std::vector<Parameter>& Graph::parameters() { return s_->params; }

void Graph::set_input(Value v, const std::vector<double>& values) {
  const Tensor t = tensor(v);
  std::vector<unsigned char> host(static_cast<std::size_t>(t.size_bytes()));
  Tensor staging = t;
  staging.data = host.data();
  staging.device = DeviceKind::host;
  write_host(staging, values);
  s_->k().upload(t, host.data());
}

std::vector<double> Graph::read(Value v) const { return read(tensor(v)); }

std::vector<double> Graph::read(const Tensor& t) const {
  if (!t.defined()) throw Error("read: tensor " + t.to_string() + " has no storage");
  std::vector<unsigned char> host(static_cast<std::size_t>(t.size_bytes()));
  s_->k().download(t, host.data());
  Tensor staging = t;
  staging.data = host.data();
  staging.device = DeviceKind::host;
  return read_host(staging);
}

void Graph::set_profiling(bool on) {
  s_->profiling = on;
  if (on && s_->kernels != nullptr && !s_->timer) s_->timer = s_->kernels->make_timer();
}

void Graph::forward(bool training) {
  State& s = *s_;
  Kernels& k = s.k();
  for (std::size_t i = 0; i < s.n(); ++i) {
    s.bound[i].training = training;
    Op& op = *s.nodes[i].op;
    if (s.profiling)
      s.forward_s[i] = s.timer->time_batch([&] { op.forward(k, s.bound[i]); }, 1);
    else
      op.forward(k, s.bound[i]);
  }
}

void Graph::backward() {
  State& s = *s_;
  Kernels& k = s.k();
  if (!s.options.training) throw Error("backward on an inference graph");
  if (s.grad_buffer[static_cast<std::size_t>(s.loss)] < 0) return;  // nothing trainable
  k.fill(grad(Value{s.loss}), 1.0);
  for (std::size_t i = s.n(); i-- > 0;) {
    if (!s.runs_backward[i]) continue;
    Op& op = *s.nodes[i].op;
    for (int o : s.zero_grads[i]) k.fill(grad(Value{o}), 0.0);
    if (s.profiling)
      s.backward_s[i] = s.timer->time_batch([&] { op.backward(k, s.bound[i]); }, 1);
    else
      op.backward(k, s.bound[i]);
  }
}

void Graph::update(Optimizer& optimizer) {
  if (!s_->options.training) throw Error("update on an inference graph");
  optimizer.step(s_->k(), s_->params);
}

}  // namespace ab::nn
