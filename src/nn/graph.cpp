// Graph: gradient flow, lifetimes and the memory plan (at construction); binding to a backend;
// the fixed forward/backward/update sequence; the per-op report.
#include <algorithm>
#include <map>
#include <set>

#include "nn/graph_internal.h"
#include "nn/ops_generic.h"

namespace ab::nn {

Graph::Graph(GraphBuilder&& builder) : s_(std::make_unique<State>()) {
  GraphBuilder::State& b = *builder.s_;
  s_->options = b.options;
  s_->values = std::move(b.values);
  s_->nodes = std::move(b.nodes);
  s_->loss = b.loss;
  if (s_->options.training && s_->loss < 0) throw Error("a training graph needs a loss (GraphBuilder::set_loss)");
  if (s_->options.micro_batches < 1)
    throw UsageError("micro_batches must be at least 1, got " + std::to_string(s_->options.micro_batches));
  for (const auto& node : s_->nodes) s_->specs.push_back(node.op->parameters());
  s_->resolve_tied();
  s_->plan_gradients();
  s_->plan_parameter_gradients();
  s_->find_dead_ops();
  s_->plan_lifetimes();
  s_->plan = plan_memory(s_->lifetimes);
  s_->forward_s.assign(s_->n(), 0.0);
  s_->backward_s.assign(s_->n(), 0.0);
}

Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;

void Graph::State::resolve_tied() {
  std::map<std::string, std::pair<int, int>> declared;
  owner.assign(n(), {});
  for (std::size_t i = 0; i < n(); ++i)
    for (std::size_t j = 0; j < specs[i].size(); ++j) {
      const ParamSpec& spec = specs[i][j];
      const std::string name = nodes[i].op->name() + "." + spec.name;
      const std::string tied_to = nodes[i].op->tied_to(j);
      if (tied_to.empty()) {
        owner[i].emplace_back(static_cast<int>(i), static_cast<int>(j));
        declared.emplace(name, owner[i].back());
        continue;
      }
      const auto it = declared.find(tied_to);
      if (it == declared.end())
        throw Error("parameter '" + name + "' is tied to '" + tied_to + "', which no earlier layer declares");
      const ParamSpec& o =
          specs[static_cast<std::size_t>(it->second.first)][static_cast<std::size_t>(it->second.second)];
      if (o.shape != spec.shape || o.dtype != spec.dtype || o.trainable() != spec.trainable())
        throw Error("parameter '" + name + "' (" + spec.shape.to_string() + ") is tied to '" + tied_to + "' (" +
                    o.shape.to_string() + "): shapes, dtypes and roles must match");
      owner[i].push_back(it->second);
    }
}

// A tied parameter's gradient is the sum of its users' contributions: in backward order the first
// user writes it and the others add to it, and the owner (the earliest layer) is the last, so its
// backward finishes the gradient (the 16-bit cast into the master, the data-parallel hand-off).
void Graph::State::plan_parameter_gradients() {
  dparams_accumulate.assign(n(), {});
  std::set<std::pair<int, int>> written;
  for (std::size_t i = n(); i-- > 0;) {
    dparams_accumulate[i].assign(specs[i].size(), false);
    if (!runs_backward[i]) continue;
    for (std::size_t j = 0; j < specs[i].size(); ++j) {
      if (!specs[i][j].trainable()) continue;
      const auto key = owner[i][j];
      dparams_accumulate[i][j] = written.count(key) > 0;
      written.insert(key);
      if (tied(i, j) && !runs_backward[static_cast<std::size_t>(key.first)])
        throw Error("parameter '" + nodes[i].op->name() + "." + specs[i][j].name + "' is tied to '" +
                    nodes[i].op->tied_to(j) + "', whose layer computes no gradient");
    }
  }
}

void Graph::State::plan_gradients() {
  runs_backward.assign(n(), false);
  din_accumulate.assign(n(), {});
  zero_grads.assign(n(), {});
  has_grad.assign(values.size(), false);
  std::vector<bool> written(values.size(), false);
  if (options.training && value(loss).requires_grad) has_grad[static_cast<std::size_t>(loss)] = true;
  // Reverse order is the backward order: the first op met that writes a gradient overwrites it,
  // later ones accumulate into it.
  for (std::size_t i = n(); i-- > 0;) {
    Node& node = nodes[i];
    bool any_out = false;
    for (int o : node.outputs) any_out = any_out || has_grad[static_cast<std::size_t>(o)];
    bool trainable = false;
    for (const auto& spec : specs[i]) trainable = trainable || spec.trainable();
    bool any_in = false;
    for (int in : node.inputs) any_in = any_in || value(in).requires_grad;
    runs_backward[i] = options.training && any_out && (trainable || any_in);
    std::vector<bool> needs(node.inputs.size(), false);
    din_accumulate[i].assign(node.inputs.size(), false);
    if (runs_backward[i]) {
      for (int o : node.outputs)
        if (!has_grad[static_cast<std::size_t>(o)]) {
          has_grad[static_cast<std::size_t>(o)] = true;
          zero_grads[i].push_back(o);
        }
      for (std::size_t s = 0; s < node.inputs.size(); ++s) {
        const auto in = static_cast<std::size_t>(node.inputs[s]);
        if (!values[in].requires_grad) continue;
        needs[s] = true;
        din_accumulate[i][s] = written[in];
        written[in] = true;
        has_grad[in] = true;
      }
    }
    node.op->set_context(options.training, needs);
  }
}

void Graph::State::find_dead_ops() {
  dead.assign(n(), false);
  std::vector<bool> needed(values.size(), false);
  bool any_output = false;
  for (std::size_t v = 0; v < values.size(); ++v) {
    needed[v] = values[v].keep;
    any_output = any_output || values[v].keep;
  }
  if (options.training || !any_output) return;  // nothing marked: whatever the caller reads is live
  for (std::size_t i = n(); i-- > 0;) {
    const Node& node = nodes[i];
    bool live = node.outputs.empty();
    for (int o : node.outputs) live = live || needed[static_cast<std::size_t>(o)];
    dead[i] = !live;
    if (live)
      for (int in : node.inputs) needed[static_cast<std::size_t>(in)] = true;
  }
}

// Inference: a view whose copy would write the bytes as they lie (a reshape between row-major
// tensors, a transpose into its permuted strides: ViewCopy::keeps_bytes) makes its output its
// input's buffer (the root of a chain of such views), alive until the last reader of any of them
// (`last` extended), and the op runs nothing. Inference ops write only their own outputs,
// so no op writes the shared bytes after the root's producer. Per value: its root, or -1.
std::vector<int> Graph::State::alias_views(std::vector<int>& last) {
  std::vector<int> alias_of(values.size(), -1);
  aliased.assign(n(), false);
  for (std::size_t i = 0; i < n() && !options.training; ++i) {
    const auto* view = dynamic_cast<const ViewCopy*>(nodes[i].op.get());
    if (view == nullptr || nodes[i].inputs.size() != 1 || nodes[i].outputs.size() != 1) continue;
    const auto in = static_cast<std::size_t>(nodes[i].inputs[0]), out = static_cast<std::size_t>(nodes[i].outputs[0]);
    if (!view->keeps_bytes(values[in].desc, values[out].desc)) continue;
    const int root = alias_of[in] >= 0 ? alias_of[in] : static_cast<int>(in);
    alias_of[out] = root;
    last[static_cast<std::size_t>(root)] = std::max(last[static_cast<std::size_t>(root)], last[out]);
    aliased[i] = true;
  }
  return alias_of;
}

void Graph::State::plan_lifetimes() {
  value_buffer.assign(values.size(), -1);
  grad_buffer.assign(values.size(), -1);
  saved_buffer.assign(n(), {});
  std::vector<int> last(values.size()), grad_first(values.size(), -1);
  for (std::size_t v = 0; v < values.size(); ++v) {
    const ValueInfo& info = values[v];
    last[v] = info.producer >= 0 ? fwd_step(static_cast<std::size_t>(info.producer)) : 0;
    if (info.producer >= 0 && runs_backward[static_cast<std::size_t>(info.producer)] &&
        nodes[static_cast<std::size_t>(info.producer)].op->backward_reads_output(info.producer_slot))
      last[v] = std::max(last[v], bwd_step(static_cast<std::size_t>(info.producer)));
    // Graph inputs stay intact for the whole step: a benchmark writes a batch once and replays
    // steps on it, which it could not if backward reused the input's bytes.
    if (info.keep || info.producer < 0) last[v] = end_step();
  }
  for (std::size_t i = 0; i < n(); ++i) {
    const Node& node = nodes[i];
    for (std::size_t s = 0; s < node.inputs.size(); ++s) {
      const auto in = static_cast<std::size_t>(node.inputs[s]);
      last[in] = std::max(last[in], fwd_step(i));
      if (runs_backward[i] && node.op->backward_reads_input(static_cast<int>(s)))
        last[in] = std::max(last[in], bwd_step(i));
      // The gradient is first written by the last consumer in forward order (first in backward).
      if (runs_backward[i] && has_grad[in]) grad_first[in] = std::max(grad_first[in], static_cast<int>(i));
    }
  }
  const std::vector<int> alias_of = alias_views(last);
  for (std::size_t v = 0; v < values.size(); ++v) {
    if (alias_of[v] >= 0) continue;
    const ValueInfo& info = values[v];
    const int first = info.producer >= 0 ? fwd_step(static_cast<std::size_t>(info.producer)) : 0;
    value_buffer[v] = static_cast<int>(lifetimes.size());
    lifetimes.push_back({info.desc.size_bytes(), first, last[v], info.name});
  }
  for (std::size_t v = 0; v < values.size(); ++v)
    if (alias_of[v] >= 0) value_buffer[v] = value_buffer[static_cast<std::size_t>(alias_of[v])];
  const std::vector<int> grad_root = share_passed_gradients();
  for (std::size_t v = 0; v < values.size(); ++v) {
    if (!has_grad[v] || grad_root[v] != static_cast<int>(v)) continue;
    const ValueInfo& info = values[v];
    // A graph input's gradient is kept to the end of the step for the caller to read.
    const int end = info.producer >= 0 ? bwd_step(static_cast<std::size_t>(info.producer)) : end_step();
    int first = grad_first[v] >= 0 ? bwd_step(static_cast<std::size_t>(grad_first[v])) : -1;
    if (first < 0) first = end;  // zero-filled just before its producer's backward
    // The loss's gradient is seeded when backward starts, whichever op produced the loss.
    if (static_cast<int>(v) == loss) first = std::min(first, bwd_step(n() - 1));
    grad_buffer[v] = static_cast<int>(lifetimes.size());
    lifetimes.push_back({info.desc.size_bytes(), first, end, "grad " + info.name});
  }
  // A shared gradient lives in its root's buffer, kept until the last member's producer has read it.
  for (std::size_t v = 0; v < values.size(); ++v) {
    const auto r = static_cast<std::size_t>(grad_root[v]);
    if (!has_grad[v] || r == v) continue;
    grad_buffer[v] = grad_buffer[r];
    BufferLifetime& life = lifetimes[static_cast<std::size_t>(grad_buffer[r])];
    life.last_step = std::max(life.last_step, bwd_step(static_cast<std::size_t>(values[v].producer)));
    life.label += " = grad " + values[v].name;
  }
  grad16_buffer.assign(n(), {});
  for (std::size_t i = 0; i < n(); ++i)
    for (std::size_t j = 0; j < specs[i].size(); ++j) {
      const ParamSpec& spec = specs[i][j];
      grad16_buffer[i].push_back(-1);
      if (!runs_backward[i] || !stages_gradient(spec)) continue;
      if (tied(i, j)) {  // the owner's buffer, alive from this user's backward on
        const auto [on, os] = owner[i][j];
        const int buffer = grad16_buffer[static_cast<std::size_t>(on)][static_cast<std::size_t>(os)];
        grad16_buffer[i].back() = buffer;
        BufferLifetime& life = lifetimes[static_cast<std::size_t>(buffer)];
        life.first_step = std::min(life.first_step, bwd_step(i));
        continue;
      }
      grad16_buffer[i].back() = static_cast<int>(lifetimes.size());
      const std::int64_t bytes = Tensor::describe(spec.dtype, spec.shape).size_bytes();
      // Kept to the end of backward, where a step without data parallelism casts them all at once.
      lifetimes.push_back(
          {bytes, bwd_step(i), bwd_step(0),
           "grad " + nodes[i].op->name() + "." + spec.name + " (" + std::string(to_string(spec.dtype)) + ")"});
    }
  for (std::size_t i = 0; i < n(); ++i) {
    const auto saved = nodes[i].op->saved();
    for (std::size_t j = 0; j < saved.size(); ++j) {
      saved_buffer[i].push_back(static_cast<int>(lifetimes.size()));
      const int end = runs_backward[i] ? bwd_step(i) : fwd_step(i);
      lifetimes.push_back({saved[j].size_bytes(), fwd_step(i), end,
                           nodes[i].op->name() + ":saved" + std::to_string(j)});
    }
  }
}

// An op that passes a gradient through unchanged (add) would copy its output gradient into each
// input's. Instead the input's gradient may live in the output gradient's buffer (its "root"),
// which removes the copy and the buffer, when it is safe: this op writes the input's gradient first
// (no accumulation yet), the input has a producer (graph inputs keep their own gradient), and
// from this op's backward on, no later write into one member of the group (an accumulation by
// another consumer) lands before another member's producer has read its gradient. In a
// bottleneck block this shares the residual add's gradient with both branches.
std::vector<int> Graph::State::share_passed_gradients() {
  std::vector<int> root(values.size());
  for (std::size_t v = 0; v < values.size(); ++v) root[v] = static_cast<int>(v);
  if (!options.training) return root;
  std::vector<std::vector<int>> writes(values.size());  // backward steps writing the value's gradient
  for (std::size_t i = 0; i < n(); ++i)
    if (runs_backward[i])
      for (int in : nodes[i].inputs)
        if (value(in).requires_grad) writes[static_cast<std::size_t>(in)].push_back(bwd_step(i));
  const auto last_read = [&](int v) { return bwd_step(static_cast<std::size_t>(value(v).producer)); };
  const auto compatible = [&](int x, int y, int from_step) {
    for (int w : writes[static_cast<std::size_t>(x)])
      if (w > from_step && w <= last_read(y)) return false;
    for (int w : writes[static_cast<std::size_t>(y)])
      if (w > from_step && w <= last_read(x)) return false;
    return true;
  };
  std::vector<std::vector<int>> members(values.size());  // per root, the values sharing its buffer
  for (std::size_t i = n(); i-- > 0;) {
    const Node& node = nodes[i];
    if (!runs_backward[i] || node.outputs.size() != 1) continue;
    const int out = node.outputs[0];
    if (!has_grad[static_cast<std::size_t>(out)] || out == loss) continue;
    const auto r = static_cast<std::size_t>(root[static_cast<std::size_t>(out)]);
    for (std::size_t s = 0; s < node.inputs.size(); ++s) {
      const int in = node.inputs[s];
      const auto iv = static_cast<std::size_t>(in);
      if (!node.op->passes_gradient_through(static_cast<int>(s)) || !has_grad[iv] || din_accumulate[i][s] ||
          value(in).producer < 0 || root[iv] != in || std::count(node.inputs.begin(), node.inputs.end(), in) != 1)
        continue;
      bool ok = compatible(in, static_cast<int>(r), bwd_step(i));
      for (int m : members[r]) ok = ok && compatible(in, m, bwd_step(i));
      if (!ok) continue;
      root[iv] = static_cast<int>(r);
      members[r].push_back(in);
      node.op->set_shared_gradient(static_cast<int>(s));
    }
  }
  return root;
}

const GraphOptions& Graph::options() const { return s_->options; }
const Op& Graph::op(std::size_t i) const { return *s_->nodes.at(i).op; }
std::size_t Graph::op_count() const { return s_->n(); }
const std::vector<BufferLifetime>& Graph::buffers() const { return s_->lifetimes; }
const MemoryPlan& Graph::memory_plan() const { return s_->plan; }

std::int64_t Graph::parameter_count() const {
  std::int64_t total = 0;
  for (std::size_t i = 0; i < s_->n(); ++i)
    for (std::size_t j = 0; j < s_->specs[i].size(); ++j)
      if (s_->specs[i][j].trainable() && !s_->tied(i, j)) total += s_->specs[i][j].shape.numel();
  return total;
}

std::int64_t Graph::forward_flops() const {
  std::int64_t total = 0;
  for (std::size_t i = 0; i < s_->n(); ++i)
    if (!s_->dead[i]) total += s_->nodes[i].op->flops(Pass::forward);
  return total;
}

std::int64_t Graph::backward_flops() const {
  std::int64_t total = 0;
  for (std::size_t i = 0; i < s_->n(); ++i)
    if (s_->runs_backward[i]) total += s_->nodes[i].op->flops(Pass::backward);
  return total;
}

std::vector<OpReport> Graph::report() const {
  std::vector<OpReport> rows;
  for (std::size_t i = 0; i < s_->n(); ++i) {
    if (s_->dead[i]) continue;
    const Op& op = *s_->nodes[i].op;
    OpReport r;
    r.name = op.name();
    r.kind = std::string(op.kind());
    r.out_shape = op.outputs().empty() ? Shape{} : op.outputs()[0].shape;
    for (std::size_t j = 0; j < s_->specs[i].size(); ++j)
      if (s_->specs[i][j].trainable() && !s_->tied(i, j)) r.params += s_->specs[i][j].shape.numel();
    r.forward_flops = op.flops(Pass::forward);
    r.forward_bytes = s_->aliased[i] ? 0 : op.bytes(Pass::forward);
    if (s_->runs_backward[i]) {
      r.backward_flops = op.flops(Pass::backward);
      r.backward_bytes = op.bytes(Pass::backward);
    }
    r.forward_s = s_->forward_s[i];
    r.backward_s = s_->backward_s[i];
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace ab::nn
