// GraphBuilder: records inputs and layers, inferring shapes as each layer is added.
#include <cmath>
#include <limits>

#include "nn/graph_internal.h"
#include "nn/ops_generic.h"

namespace ab::nn {

DType activation_dtype(const GraphOptions& o) {
  switch (o.precision) {
    case Precision::fp32: return o.dtype;
    case Precision::fp8:
      // e4m3's 3 mantissa bits and the per-call dynamic scales serve a forward pass; gradients
      // and weight updates would need a scaling scheme of their own (none here).
      if (o.training)
        throw UsageError("graph precision fp8 is inference only (training = false); train in fp32, tf32, bf16 or fp16");
      [[fallthrough]];
    case Precision::tf32:
    case Precision::bf16:
    case Precision::fp16:
      if (o.dtype != DType::f32)
        throw UsageError("graph precision " + std::string(to_string(o.precision)) +
                         " sets the storage types itself; leave dtype at f32 (got " + std::string(to_string(o.dtype)) +
                         ")");
      if (o.precision == Precision::bf16) return DType::bf16;
      return o.precision == Precision::fp16 || o.precision == Precision::fp8 ? DType::f16 : DType::f32;
    default:
      throw UsageError("graph precision must be fp32, tf32, bf16, fp16 or fp8 (inference only), got " +
                       std::string(to_string(o.precision)));
  }
}

GraphBuilder::GraphBuilder(GraphOptions options) : s_(std::make_unique<State>()) {
  activation_dtype(options);  // validates
  if (options.precision == Precision::fp16) {
    const LossScaleRule& r = options.loss_scale_rule;
    if (!(options.initial_loss_scale > 0) || !std::isfinite(static_cast<float>(options.initial_loss_scale)))
      throw UsageError("initial_loss_scale must be positive and finite in f32, got " +
                       std::to_string(options.initial_loss_scale));
    if (!(r.growth > 1) || !(r.backoff > 0 && r.backoff < 1) || r.growth_interval < 1 ||
        r.growth_interval > std::numeric_limits<std::int32_t>::max())
      throw UsageError("loss scale rule needs growth > 1, 0 < backoff < 1 and growth_interval >= 1 (got " +
                       std::to_string(r.growth) + ", " + std::to_string(r.backoff) + ", " +
                       std::to_string(r.growth_interval) + ")");
  }
  s_->options = options;
}
GraphBuilder::GraphBuilder(GraphBuilder&&) noexcept = default;
GraphBuilder::~GraphBuilder() = default;

namespace {

// Rank-4 tensors take the graph's layout; others are row-major.
Tensor place(const GraphOptions& o, DType dtype, const Shape& shape) {
  return Tensor::describe(dtype, shape, shape.rank() == 4 ? o.layout : Layout::nchw);
}

}  // namespace

Tensor graph_desc(const GraphOptions& o, DType dtype, const Shape& shape) { return place(o, dtype, shape); }

Value GraphBuilder::input(const std::string& name, const Shape& shape, bool requires_grad) {
  ValueInfo v;
  v.name = name;
  v.desc = place(s_->options, activation_dtype(s_->options), shape);
  v.requires_grad = requires_grad;
  s_->values.push_back(std::move(v));
  return Value{static_cast<int>(s_->values.size()) - 1};
}

Value GraphBuilder::input(const std::string& name, const Shape& shape, DType dtype) {
  ValueInfo v;
  v.name = name;
  v.desc = place(s_->options, dtype, shape);
  s_->values.push_back(std::move(v));
  return Value{static_cast<int>(s_->values.size()) - 1};
}

Value GraphBuilder::in_graph_layout(Value v) {
  if (v.id < 0 || v.id >= static_cast<int>(s_->values.size())) return v;  // add() names the bad id
  const Tensor& d = s_->values[static_cast<std::size_t>(v.id)].desc;
  if (d.shape.rank() != 4 || same_order(d.shape, d.strides, contiguous_strides(d.shape, s_->options.layout))) return v;
  std::string name = s_->values[static_cast<std::size_t>(v.id)].name + ".relayout";
  for (int k = 2; s_->names.count(name) != 0; ++k)
    name = s_->values[static_cast<std::size_t>(v.id)].name + ".relayout" + std::to_string(k);
  return add1(std::make_unique<ViewCopy>(name, ViewCopy::Mode::relayout, std::vector<std::int64_t>{}), {v});
}

std::vector<Value> GraphBuilder::add(std::unique_ptr<Op> op, const std::vector<Value>& given) {
  if (!op) throw Error("GraphBuilder::add: null op");
  const std::string label = "layer '" + op->name() + "' (" + std::string(op->kind()) + "): ";
  if (s_->names.count(op->name()) != 0) throw LayerError(label + "the name is already used");
  // A built-in op reads rank-4 inputs in the graph's layout: one a generic op left in the other
  // is copied into it first.
  std::vector<Value> inputs = given;
  if (!op->reads_any_layout())
    for (Value& in : inputs) in = in_graph_layout(in);
  Node node;
  std::vector<Tensor> descs;
  bool requires_grad = false;
  for (Value in : inputs) {
    if (in.id < 0 || in.id >= static_cast<int>(s_->values.size()))
      throw LayerError(label + "input value " + std::to_string(in.id) + " does not exist");
    descs.push_back(s_->values[static_cast<std::size_t>(in.id)].desc);
    requires_grad = requires_grad || s_->values[static_cast<std::size_t>(in.id)].requires_grad;
    node.inputs.push_back(in.id);
  }
  std::vector<Tensor> outs = op->infer(descs);
  for (std::size_t i = 0; i < outs.size(); ++i)
    outs[i] = Tensor::describe(outs[i].dtype, outs[i].shape,
                               outs[i].shape.rank() == 4 ? op->output_layout(i, s_->options.layout) : Layout::nchw);
  op->set_placed_outputs(outs);
  for (const auto& spec : op->parameters()) requires_grad = requires_grad || spec.trainable();
  std::vector<Value> result;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    ValueInfo v;
    v.name = op->name() + (outs.size() > 1 ? ":" + std::to_string(i) : "");
    v.desc = outs[i];
    v.producer = static_cast<int>(s_->nodes.size());
    v.producer_slot = static_cast<int>(i);
    v.requires_grad = requires_grad;
    s_->values.push_back(std::move(v));
    node.outputs.push_back(static_cast<int>(s_->values.size()) - 1);
    result.push_back(Value{node.outputs.back()});
  }
  s_->names.insert(op->name());
  node.op = std::move(op);
  s_->nodes.push_back(std::move(node));
  return result;
}

Value GraphBuilder::add1(std::unique_ptr<Op> op, const std::vector<Value>& inputs) {
  const std::string label = op ? "layer '" + op->name() + "' (" + std::string(op->kind()) + "): " : "";
  auto outs = add(std::move(op), inputs);
  if (outs.size() != 1) throw LayerError(label + "has " + std::to_string(outs.size()) + " outputs, expected one");
  return outs[0];
}

void GraphBuilder::set_loss(Value v) {
  const Tensor& d = desc(v);
  if (d.numel() != 1) throw Error("the loss must be a scalar, got " + d.shape.to_string());
  s_->loss = v.id;
  mark_output(v);
}

void GraphBuilder::mark_output(Value v) {
  desc(v);  // validates
  s_->values[static_cast<std::size_t>(v.id)].keep = true;
}

const Tensor& GraphBuilder::desc(Value v) const {
  if (v.id < 0 || v.id >= static_cast<int>(s_->values.size()))
    throw Error("value " + std::to_string(v.id) + " does not exist");
  return s_->values[static_cast<std::size_t>(v.id)].desc;
}

const GraphOptions& GraphBuilder::options() const { return s_->options; }

}  // namespace ab::nn
