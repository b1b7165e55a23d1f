// Graph binding and execution: prepare layers on a backend, allocate, initialise parameters, and
// run the fixed forward/backward/update sequence (optionally timing each op).
#include <algorithm>
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
std::vector<double> initial_values(const Op& op, std::size_t param, const ParamSpec& spec, std::uint64_t seed,
                                   const std::string& name) {
  if (std::vector<double> given = op.initial_values(param); !given.empty()) return given;
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

// Device tensors to and from values, through a host staging copy in the tensor's own dtype and
// strides (the kernels move whole tensors as bytes).
void upload_values(Kernels& k, const Tensor& t, const std::vector<double>& values) {
  std::vector<unsigned char> host(static_cast<std::size_t>(t.size_bytes()));
  Tensor staging = t;
  staging.data = host.data();
  staging.device = DeviceKind::host;
  write_host(staging, values);
  k.upload(t, host.data());
}

std::vector<double> download_values(Kernels& k, const Tensor& t) {
  std::vector<unsigned char> host(static_cast<std::size_t>(t.size_bytes()));
  k.download(t, host.data());
  Tensor staging = t;
  staging.data = host.data();
  staging.device = DeviceKind::host;
  return read_host(staging);
}

void Graph::bind(Kernels& kernels) {
  State& s = *s_;
  s.kernels = &kernels;
  s.params.clear();
  s.param_index.assign(s.n(), {});
  s.bound.assign(s.n(), OpTensors{});
  kernels.set_deterministic(s.options.deterministic);
  kernels.set_tf32(s.options.precision == Precision::tf32);

  // Parameters (f32 masters beside 16-bit copies), the copies, and the gradients in three blocks,
  // each tensor aligned like an arena buffer. `read` is what the op reads: the copy or the value.
  std::vector<std::vector<Tensor>> master_descs(s.n()), read_descs(s.n());
  std::int64_t param_bytes = 0, copy_bytes = 0, grad_bytes = 0;
  for (std::size_t i = 0; i < s.n(); ++i)
    for (std::size_t j = 0; j < s.specs[i].size(); ++j) {
      const ParamSpec& spec = s.specs[i][j];
      read_descs[i].push_back(graph_desc(s.options, spec.dtype, spec.shape));
      master_descs[i].push_back(has_copy(spec) ? graph_desc(s.options, DType::f32, spec.shape) : read_descs[i].back());
      if (s.tied(i, j)) continue;  // the owner's storage
      param_bytes += align_up(master_descs[i].back().size_bytes());
      if (has_copy(spec)) copy_bytes += align_up(read_descs[i].back().size_bytes());
      // An inference graph computes no gradient, so it holds none.
      if (spec.trainable() && s.options.training) grad_bytes += align_up(master_descs[i].back().size_bytes());
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
    t.params = read_descs[i];
    t.dparams = read_descs[i];
    t.saved = node.op->saved();
    for (auto& d : t.saved) d = graph_desc(s.options, d.dtype, d.shape);
    t.din_accumulate = s.din_accumulate[i];
    t.dparams_accumulate = s.dparams_accumulate[i];
    try {
      workspace_bytes = std::max(workspace_bytes, node.op->prepare(kernels, t));
      for (std::size_t j = 0; j < s.specs[i].size(); ++j)
        if (has_copy(s.specs[i][j])) kernels.check_tensor(master_descs[i][j]);
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
  s.copy_store = Buffer(alloc, copy_bytes);
  s.grad_store = Buffer(alloc, grad_bytes);

  std::int64_t param_offset = 0, copy_offset = 0, grad_offset = 0;
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
      if (s.tied(i, j)) {  // read and written through the owner's tensors (bound earlier)
        const auto [on, os] = s.owner[i][j];
        const OpTensors& o = s.bound[static_cast<std::size_t>(on)];
        t.params[j] = o.params[static_cast<std::size_t>(os)];
        t.dparams[j] = o.dparams[static_cast<std::size_t>(os)];
        s.param_index[i].push_back(s.param_index[static_cast<std::size_t>(on)][static_cast<std::size_t>(os)]);
        continue;
      }
      Parameter p;
      p.name = node.op->name() + "." + spec.name;
      p.spec = spec;
      p.value = s.param_store.view(master_descs[i][j], param_offset);
      param_offset += align_up(p.value.size_bytes());
      if (has_copy(spec)) {
        p.copy = s.copy_store.view(read_descs[i][j], copy_offset);
        copy_offset += align_up(p.copy.size_bytes());
      }
      if (spec.trainable() && s.options.training) {
        p.grad = s.grad_store.view(master_descs[i][j], grad_offset);
        grad_offset += align_up(p.grad.size_bytes());
      }
      t.params[j] = p.copy.defined() ? p.copy : p.value;
      if (s.stages_gradient(spec))  // the op writes its own gradient; backward casts (adds) it into p.grad
        t.dparams[j] = s.view_of(s.grad16_buffer[i][j], read_descs[i][j]);
      else
        t.dparams[j] = p.grad.defined() ? p.grad : read_descs[i][j];
      upload_values(kernels, p.value, initial_values(*s.nodes[i].op, j, spec, s.options.seed, p.name));
      if (p.copy.defined()) kernels.cast(p.value, p.copy);
      s.param_index[i].push_back(s.params.size());
      s.params.push_back(std::move(p));
    }
  }

  if (s.loss_scaling()) {
    // Four scalars, each aligned as a buffer would be.
    s.scaler_store = Buffer(alloc, 4 * kAllocAlignment);
    const Tensor f32 = Tensor::describe(DType::f32, Shape{1}), i32 = Tensor::describe(DType::i32, Shape{1});
    s.scale = s.scaler_store.view(f32, 0);
    s.good_steps = s.scaler_store.view(i32, kAllocAlignment);
    s.found_nonfinite = s.scaler_store.view(i32, 2 * kAllocAlignment);
    s.scale_before = s.scaler_store.view(f32, 3 * kAllocAlignment);
    set_loss_scale(s.options.initial_loss_scale);
  }
  bool draws = false;
  for (const Node& node : s.nodes) draws = draws || node.op->draws_random();
  if (draws) {
    s.counter_store = Buffer(alloc, kAllocAlignment);
    s.step_counter = s.counter_store.view(Tensor::describe(DType::i32, Shape{1}), 0);
    kernels.fill(s.step_counter, 0.0);
    for (std::size_t i = 0; i < s.n(); ++i)
      if (s.nodes[i].op->draws_random()) s.bound[i].step_counter = s.step_counter;
  }
  if (s.loss >= 0 && s.value(s.loss).producer >= 0)
    s.bound[static_cast<std::size_t>(s.value(s.loss).producer)].loss_seed = s.loss_scaling() ? s.scale : Tensor{};
  if (s.profiling) s.timer = kernels.make_timer();
  kernels.parameters_changed();  // initialised above
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

void Graph::set_input(Value v, const std::vector<double>& values) { upload_values(s_->k(), tensor(v), values); }

ParameterValues Graph::initial_parameter_values() const {
  const State& s = *s_;
  ParameterValues out;
  for (std::size_t i = 0; i < s.n(); ++i)
    for (std::size_t j = 0; j < s.specs[i].size(); ++j) {
      const ParamSpec& spec = s.specs[i][j];
      if (s.tied(i, j)) continue;
      const std::string name = s.nodes[i].op->name() + "." + spec.name;
      out[name] = initial_values(*s.nodes[i].op, j, spec, s.options.seed, name);
    }
  return out;
}

ParameterValues Graph::parameter_values() const {
  s_->k();  // bound, or Error
  ParameterValues out;
  for (const Parameter& p : s_->params) out[p.name] = read(p.value);
  return out;
}

void Graph::set_parameter_values(const ParameterValues& values) {
  Kernels& k = s_->k();
  for (const Parameter& p : s_->params) {
    const auto it = values.find(p.name);
    if (it == values.end()) throw Error("set_parameter_values: no value for parameter '" + p.name + "'");
    if (static_cast<std::int64_t>(it->second.size()) != p.value.numel())
      throw Error("set_parameter_values: parameter '" + p.name + "' has " + std::to_string(p.value.numel()) +
                  " elements, got " + std::to_string(it->second.size()));
  }
  if (values.size() != s_->params.size())
    for (const auto& [name, v] : values) {
      bool known = false;
      for (const Parameter& p : s_->params) known = known || p.name == name;
      if (!known) throw Error("set_parameter_values: the graph has no parameter '" + name + "'");
    }
  for (const Parameter& p : s_->params) {
    upload_values(k, p.value, values.at(p.name));
    if (p.copy.defined()) k.cast(p.value, p.copy);
  }
  k.parameters_changed();
}

std::vector<double> Graph::read(Value v) const { return read(tensor(v)); }

std::vector<double> Graph::read(const Tensor& t) const {
  if (!t.defined()) throw Error("read: tensor " + t.to_string() + " has no storage");
  return download_values(s_->k(), t);
}

void Graph::set_profiling(bool on) {
  s_->profiling = on;
  if (on && s_->kernels != nullptr && !s_->timer) s_->timer = s_->kernels->make_timer();
}

void Graph::set_gradient_sync(GradientSync* sync) { s_->gradient_sync = sync; }
void Graph::set_op_observer(OpObserver* observer) { s_->op_observer = observer; }

double Graph::State::time_op(const std::function<void()>& body) {
  constexpr double kTargetS = 1e-3;        // replays per op: about a millisecond's worth,
  constexpr std::int64_t kMaxReplays = 50;  // so that tiny ops queue up on the device
  const std::unique_ptr<Replayable> op = k().capture(body);
  const double once_s = timer->time_batch([&] { op->replay(); }, 1);  // also the first launch's set-up
  const auto replays = std::clamp<std::int64_t>(std::llround(kTargetS / std::max(once_s, 1e-9)), 1, kMaxReplays);
  return timer->time_batch([&] { op->replay(); }, replays) / static_cast<double>(replays);
}

void Graph::forward(bool training) { s_->run_forward(training); }
void Graph::backward(std::int64_t micro_batch) { s_->run_backward(micro_batch); }
void Graph::update(Optimizer& optimizer) { s_->run_update(optimizer); }

void Graph::State::run_forward(bool training) {
  Kernels& kk = k();
  if (training && step_counter.defined()) kk.count_step(step_counter, Tensor{});  // a new dropout mask
  for (std::size_t i = 0; i < n(); ++i) {
    bound[i].training = training;
    Op& op = *nodes[i].op;
    if (dead[i] || aliased[i]) continue;  // unused, or its output is its input's bytes
    if (op_observer != nullptr) op_observer->begin(i, false);
    if (profiling)
      forward_s[i] = time_op([&] { op.forward(kk, bound[i]); });
    else
      op.forward(kk, bound[i]);
    if (op_observer != nullptr) op_observer->end(i, false);
  }
}

void Graph::State::run_backward(std::int64_t micro_batch) {
  Kernels& kk = k();
  if (!options.training) throw Error("backward on an inference graph");
  const std::int64_t micros = options.micro_batches;
  if (micro_batch < 0 || micro_batch >= micros)
    throw Error("backward: micro-batch " + std::to_string(micro_batch) + " of " + std::to_string(micros));
  const auto loss_id = static_cast<std::size_t>(loss);
  if (grad_buffer[loss_id] < 0) return;  // nothing trainable
  // The seed is a device copy of the scale, not a host value, so a captured step keeps scaling.
  const Tensor dloss = view_of(grad_buffer[loss_id], values[loss_id].desc);
  if (loss_scaling())
    kk.cast(scale, dloss);
  else
    kk.fill(dloss, 1.0);
  // The last micro-batch completes the gradients: the mean over the micro-batches, then data
  // parallelism's hand-over and fp16's unscale.
  const bool last = micro_batch == micros - 1;
  const CastManyMode widen{.accumulate = micro_batch > 0, .scale = last ? 1.0 / static_cast<double>(micros) : 1.0};
  GradientSync* sync = last ? gradient_sync : nullptr;
  if (sync != nullptr) sync->begin();
  // Staged parameter gradients are widened into their f32 masters as each op finishes where data
  // parallelism hands each gradient on at once (and where each op is timed with its casts); else
  // all in one call after backward (GPT-2: one launch for 148 tensors).
  const bool cast_each = sync != nullptr || profiling;
  std::vector<Tensor> wide_from, wide_to;
  for (std::size_t i = n(); i-- > 0;) {
    if (!runs_backward[i]) continue;
    Op& op = *nodes[i].op;
    if (op_observer != nullptr) op_observer->begin(i, true);
    for (int o : zero_grads[i]) kk.fill(view_of(grad_buffer[static_cast<std::size_t>(o)], value(o).desc), 0.0);
    const auto body = [&] {
      op.backward(kk, bound[i]);
      for (std::size_t j = 0; j < specs[i].size(); ++j) {
        if (grad16_buffer[i][j] < 0 || tied(i, j)) continue;
        const Tensor& wide = params[param_index[i][j]].grad;
        if (!cast_each) {
          wide_from.push_back(bound[i].dparams[j]);
          wide_to.push_back(wide);
        } else if (widen.plain()) {
          kk.cast(bound[i].dparams[j], wide);
        } else {
          kk.cast_many({bound[i].dparams[j]}, {wide}, widen);
        }
      }
    };
    if (profiling)
      backward_s[i] = time_op(body);
    else
      body();
    if (op_observer != nullptr) op_observer->end(i, true);
    if (sync != nullptr)
      for (std::size_t j = 0; j < specs[i].size(); ++j)
        if (specs[i][j].trainable() && !tied(i, j)) sync->ready(param_index[i][j]);
  }
  if (!wide_from.empty()) kk.cast_many(wide_from, wide_to, widen);
  if (sync != nullptr) sync->finish();
  if (loss_scaling() && last)
    for (std::size_t i = 0; i < n(); ++i) {
      if (!runs_backward[i]) continue;
      for (std::size_t j = 0; j < specs[i].size(); ++j)
        if (specs[i][j].trainable() && !tied(i, j))
          kk.unscale_and_check(params[param_index[i][j]].grad, scale, found_nonfinite);
    }
}

void Graph::State::run_update(Optimizer& optimizer) {
  if (!options.training) throw Error("update on an inference graph");
  Kernels& kk = k();
  optimizer.step(kk, params, loss_scaling() ? found_nonfinite : Tensor{});  // refreshes the 16-bit copies too
  if (loss_scaling()) {
    kk.cast(scale, scale_before);
    kk.update_loss_scale(options.loss_scale_rule, scale, good_steps, found_nonfinite);
  }
}

std::unique_ptr<Replayable> Graph::capture_step(Optimizer* optimizer) {
  State& s = *s_;
  Kernels& k = s.k();
  if (s.profiling)
    throw Error("capture_step: per-op profiling synchronises; call set_profiling(false) before capturing");
  if (s.op_observer != nullptr) throw Error("capture_step: an op observer is set; it sees eager steps only");
  const bool train = s.options.training && optimizer != nullptr;
  if (train) optimizer->bind(k, s.params);
  State* state = &s;
  return k.capture([state, optimizer, train] {
    if (!train) return state->run_forward(false);
    for (std::int64_t m = 0; m < state->options.micro_batches; ++m) {
      state->run_forward(true);
      state->run_backward(m);
    }
    state->run_update(*optimizer);
  });
}

double Graph::loss_scale() const {
  if (!s_->loss_scaling()) return 1.0;
  return read(s_->scale)[0];
}

bool Graph::last_step_skipped() const {
  if (!s_->loss_scaling()) return false;
  // A skipped step is the only update that lowers the scale (backoff < 1); at 0 every step skips.
  const double now = read(s_->scale)[0], before = read(s_->scale_before)[0];
  return now < before || now == 0.0;
}

void Graph::set_loss_scale(double scale) {
  State& s = *s_;
  if (!s.loss_scaling()) throw Error("set_loss_scale: the graph's precision is not fp16 (no loss scaling)");
  if (!(scale > 0) || !std::isfinite(static_cast<float>(scale)))
    throw UsageError("loss scale must be positive and finite in f32, got " + std::to_string(scale));
  Kernels& k = s.k();
  k.fill(s.scale, scale);
  k.fill(s.scale_before, scale);
  k.fill(s.good_steps, 0.0);
  k.fill(s.found_nonfinite, 0.0);
}

}  // namespace ab::nn
