// The mapping driver: binds the batch, walks the nodes in order, evaluates on the host what is
// constant (a value's Shape included, which makes PyTorch's shape subgraphs static), builds chains
// (groups) at their last node, and hands every other node to its op's mapping function.
#include <algorithm>
#include <sstream>

#include "core/checked.h"
#include "nn/ops.h"
#include "onnx/groups.h"
#include "onnx/internal.h"

namespace ab::onnx {

std::vector<std::int64_t> to_dims(const Shape& s) {
  std::vector<std::int64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(s[i]);
  return d;
}

Shape to_shape(const std::vector<std::int64_t>& d, const std::string& what) {
  if (d.size() > static_cast<std::size_t>(Shape::kMaxRank))
    throw UsageError(what + ": rank " + std::to_string(d.size()) + " is above the engine's " +
                     std::to_string(Shape::kMaxRank));
  Shape s;
  std::int64_t n = 1;
  for (auto v : d) {
    if (v < 0) throw UsageError(what + ": negative dimension in " + dims_text(d));
    n = checked_mul(n, v, what);
    s.push_back(v);
  }
  return s;
}

const MapTable& mappings() {
  static const MapTable table = [] {
    MapTable t;
    add_layer_mappings(t);
    add_generic_mappings(t);
    return t;
  }();
  return table;
}

const Slot& Ctx::slot(const std::string& tensor, const Node& n) const {
  const auto it = slots.find(tensor);
  if (it == slots.end()) refuse(n, "its input '" + tensor + "' is not computed (an op the importer skipped?)");
  return it->second;
}

bool Ctx::is_constant(const std::string& tensor) const {
  const auto it = slots.find(tensor);
  return it != slots.end() && it->second.constant.has_value();
}

const HostTensor& Ctx::constant(const Node& n, std::size_t input) const {
  if (!has_input(n, input)) refuse(n, "input " + std::to_string(input) + " is missing");
  const Slot& sl = slot(n.inputs[input], n);
  if (!sl.constant) refuse(n, "input " + std::to_string(input) + " ('" + n.inputs[input] + "') must be a constant");
  return *sl.constant;
}

std::vector<std::int64_t> Ctx::shape(const Node& n, std::size_t input) const {
  if (!has_input(n, input)) refuse(n, "input " + std::to_string(input) + " is missing");
  const Slot& sl = slot(n.inputs[input], n);
  return sl.constant ? sl.constant->dims : sl.shape;
}

nn::Value Ctx::value(const Node& n, std::size_t input) { return value_as(n, input, shape(n, input)); }

nn::Value Ctx::value_as(const Node& n, std::size_t input, const std::vector<std::int64_t>& dims) {
  if (!has_input(n, input)) refuse(n, "input " + std::to_string(input) + " is missing");
  const std::string& tensor = n.inputs[input];
  Slot& sl = slots.at(tensor);
  nn::Value have = sl.value;
  if (sl.constant) {
    // Made once per tensor; the slot stays a constant for the host evaluation of later nodes.
    auto [it, fresh] = graph_constants.try_emplace(tensor);
    if (fresh) {
      std::vector<double> values(static_cast<std::size_t>(sl.constant->numel()));
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = sl.constant->value(i);
      const std::string name = unique_name(tensor + ".const");
      it->second = nn::constant(b, name, to_shape(sl.constant->dims, n.name), values);
      params[name + ".value"] = std::move(values);
    }
    have = it->second;
  }
  if (to_dims(b.desc(have).shape) == dims) return have;
  if (element_count(dims, n.name) != b.desc(have).numel())
    refuse(n, "input '" + tensor + "' " + dims_text(shape(n, input)) + " cannot be viewed as " + dims_text(dims));
  // A copy in the engine (its graph has no aliasing views); kept, so later readers share it.
  const nn::Value v = nn::reshape(b, unique_name(tensor + ".view"), have, to_shape(dims, n.name));
  if (!sl.constant && dims == sl.shape) sl.value = v;
  return v;
}

void Ctx::set(const std::string& tensor, nn::Value v) {
  slots[tensor] = Slot{std::nullopt, v, to_dims(b.desc(v).shape)};
}

void Ctx::set_view(const std::string& tensor, nn::Value v, std::vector<std::int64_t> shape) {
  slots[tensor] = Slot{std::nullopt, v, std::move(shape)};
}

void Ctx::set_constant(const std::string& tensor, HostTensor t) { slots[tensor] = Slot{std::move(t), {}, {}}; }

std::string Ctx::unique_name(const std::string& base) {
  const int n = names_used[base]++;
  return n == 0 ? base : base + "#" + std::to_string(n);
}

void Ctx::refuse(const Node& n, const std::string& why) const {
  throw UsageError(n.op + " node '" + n.name + "': " + why);
}

namespace {

// Evaluates the node on the host where its inputs are constants (or, for Shape, known shapes).
bool try_fold(Ctx& c, const Node& n) {
  if (n.op == "Shape" && c.has_input(n, 0)) {  // of a computed tensor too: its shape is static here
    c.set_constant(n.outputs.at(0), shape_of(c.shape(n, 0), n));
    return true;
  }
  const auto& evals = host_evaluators();
  const auto it = evals.find(n.op);
  if (it == evals.end()) return false;
  std::vector<const HostTensor*> ins;
  for (std::size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i].empty()) {
      ins.push_back(nullptr);
      continue;
    }
    if (!c.is_constant(n.inputs[i])) return false;
    ins.push_back(&*c.slots.at(n.inputs[i]).constant);
  }
  std::vector<HostTensor> outs = it->second(n, ins);
  if (outs.size() < n.outputs.size()) c.refuse(n, "too many outputs");
  for (std::size_t i = 0; i < n.outputs.size(); ++i) c.set_constant(n.outputs[i], std::move(outs[i]));
  return true;
}

// Each input at [batch, ...]: token ids as i32, a mask (another integer input) in the activation
// dtype marked integral, floats in the activation dtype.
void bind_inputs(Ctx& c, const Model::State& s, std::int64_t batch) {
  if (batch < 1) throw UsageError("batch must be at least 1");
  for (const InputInfo& in : s.inputs) {
    std::vector<std::int64_t> dims = in.dims;
    if (dims[0] < 0) dims[0] = batch;
    else if (dims[0] != batch)
      throw UsageError("input '" + in.name + "' has a fixed batch of " + std::to_string(dims[0]) + ", not " +
                       std::to_string(batch) + ": re-export with a dynamic batch (dynamic_axes / dynamic_shapes)");
    const Shape shape = to_shape(dims, "input '" + in.name + "'");
    checked_mul(shape.numel(), 8, "input '" + in.name + "' bytes");
    c.set(in.name, in.indices ? c.b.input(in.name, shape, DType::i32) : c.b.input(in.name, shape));
    c.slots[in.name].integral = in.integer;
  }
}

}  // namespace

void map_node(Ctx& c, const Node& n) {
  if (try_fold(c, n)) return;
  const auto it = mappings().find(n.op);
  if (it == mappings().end()) c.refuse(n, "needs constant inputs (only its host evaluation exists)");
  it->second(c, n);
}

Imported import(nn::GraphBuilder& b, const Model& m, const ImportOptions& options) {
  const Model::State& s = m.state();
  if (!s.unsupported.empty()) throw UsageError(s.facts.file_name + ": unsupported ops (see accelbench inspect)");
  // As models::resnet: only conv_bias_act runs e4m3, and an unfused graph would run none.
  if (b.options().precision == Precision::fp8 && options.fold != Fold::fused)
    throw UsageError(s.facts.file_name +
                     ": precision fp8 runs the convolutions with their folded epilogue inside (fold=fused); "
                     "an unfused graph would run no layer in fp8");
  Ctx c{b, s, options.fold, options.batch, {}, {}, {}, {}, {}};
  for (const auto& [name, t] : s.constants) c.set_constant(name, t);
  bind_inputs(c, s, options.batch);
  const std::vector<Group> groups = plan_groups(s, options.fold);
  std::vector<int> group_of(s.nodes.size(), -1);
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (int i : groups[g].nodes) group_of[static_cast<std::size_t>(i)] = static_cast<int>(g);
  for (std::size_t i = 0; i < s.nodes.size(); ++i) {
    const Node& n = s.nodes[i];
    const int g = group_of[i];
    // Inputs and outputs are read with at(): a node with fewer than its op takes (a corrupt file)
    // is refused here, by name, rather than read past.
    try {
      if (g >= 0) {
        // A chain is built at its last node, when every input of its nodes exists.
        if (groups[static_cast<std::size_t>(g)].nodes.back() == static_cast<int>(i)) {
          const Group& group = groups[static_cast<std::size_t>(g)];
          if (group.kind == "attention") build_attention(c, group);
          else build_group(c, group);
        }
        continue;
      }
      map_node(c, n);
    } catch (const std::out_of_range&) {
      c.refuse(n, "has fewer inputs or outputs than the op takes (a corrupt file?)");
    }
  }
  Imported out;
  out.input = c.slots.at(s.facts.input_name).value;
  for (const InputInfo& in : s.inputs) out.inputs.push_back(c.slots.at(in.name).value);
  const Node last{"Output", s.facts.output_name, {s.facts.output_name}, {}, nullptr};
  if (!c.slots.contains(s.facts.output_name)) throw UsageError("output '" + s.facts.output_name + "' is not computed");
  if (c.is_constant(s.facts.output_name)) throw UsageError("output '" + s.facts.output_name + "' is a constant");
  out.output = c.value(last, 0);
  b.mark_output(out.output);
  if (b.options().precision == Precision::fp8 && c.fp8_layers == 0)
    throw UsageError(s.facts.file_name +
                     ": precision fp8 finds no layer to run e4m3 (a convolution or linear layer with groups 1 and "
                     "input and output channels multiples of 16); it would run fp16 under an fp8 label");
  out.parameters = std::move(c.params);
  out.fused = std::move(c.fused);
  return out;
}

}  // namespace ab::onnx
