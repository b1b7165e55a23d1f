// Loading: parse the ModelProto, check the opset, the input and every tensor reference, read the
// initializers, fold what does not depend on the batch, and list the ops no mapping takes.
#include <algorithm>
#include <climits>
#include <fstream>
#include <set>
#include <sstream>

#include <onnx/defs/schema.h>

#include "onnx/internal.h"
#include "onnx/sha256.h"

namespace ab::onnx {
namespace {

std::int64_t default_opset(const pb::ModelProto& m) {
  for (const auto& o : m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") return o.version();
  throw UsageError("the model imports no opset of the default ONNX domain");
}

void check_opset(std::int64_t opset) {
  if (opset < kMinOpset || opset > max_opset())
    throw UsageError("opset " + std::to_string(opset) + " is outside the range this build imports (" +
                     std::to_string(kMinOpset) + ".." + std::to_string(max_opset()) +
                     (opset < kMinOpset ? "): re-export with opset_version >= 13"
                                        : ", the newest this build's libonnx knows): re-export with an older opset"));
}

// The graph inputs that are not initializers: float tensors, or int64/int32 ones (token ids, an
// attention mask), whose dims are fixed but for a symbolic (or -1) batch in dim 0, the same in all.
InputInfo read_one_input(const pb::ValueInfoProto& in) {
  if (!in.type().has_tensor_type()) throw UsageError("input '" + in.name() + "' is not a tensor");
  const auto& tt = in.type().tensor_type();
  InputInfo info;
  info.name = in.name();
  info.elem_type = tt.elem_type();
  info.integer = info.elem_type == pb::TensorProto_DataType_INT64 || info.elem_type == pb::TensorProto_DataType_INT32;
  if (!info.integer && info.elem_type != pb::TensorProto_DataType_FLOAT &&
      info.elem_type != pb::TensorProto_DataType_FLOAT16 && info.elem_type != pb::TensorProto_DataType_DOUBLE &&
      info.elem_type != pb::TensorProto_DataType_BFLOAT16)
    throw UsageError("input '" + in.name() + "' has data type " + std::to_string(info.elem_type) +
                     "; the importer takes float inputs and int64 or int32 ones (token ids, masks)");
  if (!tt.has_shape() || tt.shape().dim_size() == 0 || tt.shape().dim_size() > Shape::kMaxRank)
    throw UsageError("input '" + in.name() + "' has no shape of rank 1.." + std::to_string(Shape::kMaxRank));
  for (int i = 0; i < tt.shape().dim_size(); ++i) {
    const auto& d = tt.shape().dim(i);
    const bool fixed = d.has_dim_value() && d.dim_value() > 0;
    if (i == 0 && !fixed && (!d.has_dim_value() || d.dim_value() == -1)) {
      info.dims.push_back(-1);
      continue;
    }
    if (!fixed || d.dim_value() > (std::int64_t{1} << 24))
      throw UsageError("input '" + in.name() + "' dimension " + std::to_string(i) + " is " +
                       (d.has_dim_param()   ? "symbolic ('" + d.dim_param() + "')"
                        : d.has_dim_value() ? std::to_string(d.dim_value())
                                            : "unknown") +
                       ": only the batch (dimension 0) may be dynamic; re-export with a fixed size");
    info.dims.push_back(d.dim_value());
  }
  std::vector<std::int64_t> at_one = info.dims;
  at_one[0] = std::max<std::int64_t>(at_one[0], 1);
  element_count(at_one, "input '" + in.name() + "'");
  return info;
}

void read_inputs(const pb::GraphProto& g, Model::State& s) {
  for (const auto& in : g.input())
    if (!s.constants.contains(in.name())) s.inputs.push_back(read_one_input(in));
  if (s.inputs.empty()) throw UsageError("the model has no input besides its initializers");
  if (s.inputs.size() > kMaxInputs)
    throw UsageError("the model has " + std::to_string(s.inputs.size()) + " inputs; the importer takes at most " +
                     std::to_string(kMaxInputs));
  for (const InputInfo& in : s.inputs)
    if (in.dims[0] != s.inputs[0].dims[0])
      throw UsageError("inputs '" + s.inputs[0].name + "' and '" + in.name +
                       "' differ in their batch dimension (dimension 0): one batch binds them all");
  s.facts.input_name = s.inputs[0].name;
  s.facts.symbolic_batch = s.inputs[0].dims[0] < 0;
  for (auto d : s.inputs[0].dims) s.facts.input_shape.push_back(d < 0 ? 1 : d);
}

// Which integer inputs index a Gather's table (token ids), and the fewest rows such a table has:
// those become i32 engine inputs; any other integer input (a mask) a float one of integer values.
void classify_inputs(Model::State& s) {
  for (InputInfo& in : s.inputs) {
    if (!in.integer) continue;
    bool only_indices = true;
    for (const Node& n : s.nodes)
      for (std::size_t i = 0; i < n.inputs.size(); ++i) {
        if (n.inputs[i] != in.name || n.op == "Shape") continue;
        const auto table = n.op == "Gather" && i == 1 ? s.constants.find(n.inputs[0]) : s.constants.end();
        if (table == s.constants.end() || table->second.dims.empty()) {
          only_indices = false;
          continue;
        }
        const auto rank = static_cast<std::int64_t>(table->second.dims.size());
        const std::int64_t axis = attr_int(n, "axis", 0);
        const std::int64_t rows = axis >= -rank && axis < rank
                                      ? table->second.dims[static_cast<std::size_t>(axis < 0 ? axis + rank : axis)]
                                      : 0;
        in.index_rows = in.index_rows == 0 ? rows : std::min(in.index_rows, rows);
      }
    in.indices = only_indices && in.index_rows > 0;
  }
  for (const InputInfo& in : s.inputs)
    s.facts.inputs.push_back({in.name,
                              [&] {
                                std::vector<std::int64_t> d = in.dims;
                                d[0] = std::max<std::int64_t>(d[0], 1);
                                return to_shape(d, in.name);
                              }(),
                              in.integer, in.indices, in.index_rows});
}

HostTensor constant_node_value(const Node& n, const std::filesystem::path& dir) {
  for (const auto& a : n.proto->attribute()) {
    if (a.name() == "value") return read_tensor(a.t(), dir);
    if (a.name() == "value_float") return make_reals({}, {static_cast<double>(a.f())});
    if (a.name() == "value_floats") return make_reals({a.floats_size()}, {a.floats().begin(), a.floats().end()});
    if (a.name() == "value_int") return make_ints({}, {a.i()});
    if (a.name() == "value_ints") return make_ints({a.ints_size()}, {a.ints().begin(), a.ints().end()});
  }
  throw UsageError("Constant node '" + n.name +
                   "' has no value the importer reads (value, value_float(s), value_int(s))");
}

// Folds a node whose inputs are all constant where the host evaluates its op; false otherwise.
bool fold_node(const Node& n, Model::State& s, const std::filesystem::path& dir) {
  if (n.op == "Constant") {
    if (n.outputs.size() != 1) throw UsageError("Constant node '" + n.name + "' must have one output");
    s.constants[n.outputs[0]] = constant_node_value(n, dir);
    return true;
  }
  const auto& evals = host_evaluators();
  const auto it = evals.find(n.op);
  if (it == evals.end()) return false;
  std::vector<const HostTensor*> ins;
  for (const auto& name : n.inputs) {
    if (name.empty()) {
      ins.push_back(nullptr);
      continue;
    }
    const auto c = s.constants.find(name);
    if (c == s.constants.end()) return false;
    ins.push_back(&c->second);
  }
  std::vector<HostTensor> outs = it->second(n, ins);
  if (outs.size() < n.outputs.size()) throw UsageError(n.op + " node '" + n.name + "' has too many outputs");
  for (std::size_t i = 0; i < n.outputs.size(); ++i) s.constants[n.outputs[i]] = std::move(outs[i]);
  return true;
}

void list_unsupported(Model::State& s) {
  std::map<std::string, std::vector<std::string>> missing;
  for (const Node& n : s.nodes) {
    const bool standard = n.proto->domain().empty() || n.proto->domain() == "ai.onnx";
    const std::string op = standard ? n.op : n.proto->domain() + "::" + n.op;
    if (!standard || (!mappings().contains(n.op) && !host_evaluators().contains(n.op))) missing[op].push_back(n.name);
  }
  for (const auto& [op, names] : missing) {
    std::string line = op + " (" + std::to_string(names.size()) + "): ";
    for (std::size_t i = 0; i < names.size() && i < 8; ++i) line += (i ? ", " : "") + names[i];
    if (names.size() > 8) line += ", ...";
    s.unsupported.push_back(line);
  }
}

void read_nodes(Model::State& s, const std::filesystem::path& dir) {
  const pb::GraphProto& g = s.proto.graph();
  std::set<std::string> defined;
  for (const InputInfo& in : s.inputs) defined.insert(in.name);
  for (const auto& [name, value] : s.constants) defined.insert(name);
  std::map<std::string, int> seen_names;
  for (int i = 0; i < g.node_size(); ++i) {
    Node n;
    n.proto = &g.node(i);
    n.op = n.proto->op_type();
    n.name = n.proto->name().empty() ? n.op + "_" + std::to_string(i) : n.proto->name();
    if (seen_names[n.name]++ > 0) n.name += "#" + std::to_string(i);
    n.inputs.assign(n.proto->input().begin(), n.proto->input().end());
    n.outputs.assign(n.proto->output().begin(), n.proto->output().end());
    ++s.facts.op_histogram[n.op];
    for (const auto& in : n.inputs)
      if (!in.empty() && !defined.contains(in))
        throw UsageError(n.op + " node '" + n.name + "' reads '" + in +
                         "', which no earlier node, initializer or input defines (a corrupt or unsorted graph)");
    for (const auto& out : n.outputs) defined.insert(out);
    if (n.op.empty()) throw UsageError("node " + std::to_string(i) + " has no op type (a corrupt file?)");
    bool folded = false;
    try {
      folded = fold_node(n, s, dir);
    } catch (const std::out_of_range&) {
      throw UsageError(n.op + " node '" + n.name + "' has fewer inputs or outputs than the op takes (a corrupt file?)");
    }
    if (!folded) s.nodes.push_back(std::move(n));
  }
  const std::string& out = s.facts.output_name;
  if (!defined.contains(out)) throw UsageError("output '" + out + "' is defined by no node");
}

}  // namespace

std::int64_t max_opset() {
  const auto& map = pb::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  const auto it = map.find("");
  return it == map.end() ? kMinOpset : it->second.second;
}

std::unique_ptr<Model::State> load_state(const std::string& bytes, const std::string& file_name,
                                         const std::filesystem::path& dir) {
  auto s = std::make_unique<Model::State>();
  s->facts.file_name = file_name;
  s->facts.file_bytes = static_cast<std::int64_t>(bytes.size());
  if (bytes.size() > static_cast<std::size_t>(INT_MAX))
    throw UsageError(file_name +
                     " is over 2 GB: save the weights as external data (onnx.save_model(..., "
                     "save_as_external_data=True))");
  if (bytes.empty() || !s->proto.ParseFromString(bytes))
    throw UsageError(file_name + " is not an ONNX model (empty, truncated or corrupt: protobuf parsing failed)");
  if (!s->proto.has_graph() || s->proto.graph().node_size() == 0)
    throw UsageError(file_name + " holds no graph nodes (truncated or not an ONNX model)");
  s->facts.sha256 = sha256_hex(bytes);
  s->facts.opset = default_opset(s->proto);
  check_opset(s->facts.opset);
  s->facts.producer =
      s->proto.producer_name() + (s->proto.producer_version().empty() ? "" : " " + s->proto.producer_version());
  const pb::GraphProto& g = s->proto.graph();
  for (const auto& init : g.initializer()) {
    HostTensor t = read_tensor(init, dir);
    s->facts.initializer_elements += t.numel();
    s->constants[init.name()] = std::move(t);
  }
  s->proto.mutable_graph()->clear_initializer();  // the values live in `constants` now
  read_inputs(g, *s);
  if (g.output_size() < 1) throw UsageError(file_name + ": the graph has no output");
  s->facts.output_name = g.output(0).name();
  read_nodes(*s, dir);
  classify_inputs(*s);
  list_unsupported(*s);
  return s;
}

Model::Model(std::unique_ptr<State> s) : s_(std::move(s)) {}
Model::~Model() = default;
const ModelFacts& Model::facts() const { return s_->facts; }

std::shared_ptr<const Model> Model::parse(const std::string& bytes, const std::string& file_name,
                                          const std::filesystem::path& dir) {
  auto s = load_state(bytes, file_name, dir);
  if (!s->unsupported.empty()) {
    std::string list;
    for (const auto& line : s->unsupported) list += "\n  " + line;
    throw UsageError(file_name + ": " + std::to_string(s->unsupported.size()) +
                     " op type(s) have no mapping onto the engine (docs/ONNX.md lists those that do):" + list);
  }
  return std::make_shared<const Model>(std::move(s));
}

std::shared_ptr<const Model> Model::load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot open ONNX model " + path.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in && !in.eof()) throw UsageError("cannot read ONNX model " + path.string());
  return parse(bytes.str(), path.filename().string(), path.parent_path());
}

}  // namespace ab::onnx
