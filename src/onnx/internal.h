// The importer's own types: host tensors (constants), nodes, the loaded model's state, and the
// mapping context that turns nodes into engine ops. Not part of the module's interface.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "core/error.h"
#include "nn/graph.h"
#include "onnx/onnx.h"

namespace ab::onnx {

namespace pb = ::onnx;

// A constant on the host: float types as double, integer and bool types as int64 (exact: shapes,
// indices, Slice's INT64_MAX ends).
struct HostTensor {
  bool integer = false;
  std::int32_t dtype = pb::TensorProto_DataType_FLOAT;  // the ONNX element type it came as
  std::vector<std::int64_t> dims;
  std::vector<double> real;
  std::vector<std::int64_t> ints;

  std::int64_t numel() const { return static_cast<std::int64_t>(integer ? ints.size() : real.size()); }
  double value(std::size_t i) const { return integer ? static_cast<double>(ints[i]) : real[i]; }
  std::vector<double> values() const;           // every element as a real (parameter values)
  std::int64_t int_value(std::size_t i) const;  // UsageError for a non-integral or huge real
};
HostTensor make_ints(std::vector<std::int64_t> dims, std::vector<std::int64_t> values);
HostTensor make_reals(std::vector<std::int64_t> dims, std::vector<double> values);
// Elements of `dims`; UsageError above kMaxConstantElements (a corrupt shape must not allocate).
std::int64_t element_count(const std::vector<std::int64_t>& dims, const std::string& what);
constexpr std::int64_t kMaxConstantElements = std::int64_t{1} << 32;
std::string dims_text(const std::vector<std::int64_t>& dims);

struct Node {
  std::string op, name;                      // name: the node's, or "<op>_<index>" where the file gives none
  std::vector<std::string> inputs, outputs;  // "" for an omitted optional input
  const pb::NodeProto* proto = nullptr;      // its attributes (owned by Model::State::proto)
};

std::int64_t attr_int(const Node& n, const std::string& name, std::int64_t fallback);
double attr_float(const Node& n, const std::string& name, double fallback);
std::string attr_string(const Node& n, const std::string& name, const std::string& fallback);
std::vector<std::int64_t> attr_ints(const Node& n, const std::string& name);
bool has_attr(const Node& n, const std::string& name);

// A TensorProto's values (raw_data, typed fields, or external data under `dir`); UsageError for an
// unsupported element type, a size that does not match the dims, or missing external data.
HostTensor read_tensor(const pb::TensorProto& t, const std::filesystem::path& dir);

// A graph input: float, or integer (int64/int32) whose values an engine input holds as i32 where
// it only indexes Gather tables (token ids), else in the activation dtype (a 0/1 mask).
struct InputInfo {
  std::string name;
  std::vector<std::int64_t> dims;  // -1 at a symbolic batch
  std::int32_t elem_type = pb::TensorProto_DataType_FLOAT;
  bool integer = false;
  bool indices = false;         // integer, read only as Gather indices (and by Shape)
  std::int64_t index_rows = 0;  // the fewest rows of a table it indexes; 0 if none
};
constexpr std::size_t kMaxInputs = 16;

struct Model::State {
  pb::ModelProto proto;  // initializers cleared once read; nodes keep their attributes here
  ModelFacts facts;
  std::map<std::string, HostTensor> constants;  // initializers, Constant nodes, folded nodes
  std::vector<Node> nodes;                      // the nodes left to map, in file (topological) order
  std::vector<InputInfo> inputs;                // in the file's order; the first is facts.input_name
  std::vector<std::string> unsupported;         // "Op (count): node, node, ..."
};
// Parses, validates and folds; unsupported ops are listed in the state, not thrown (inspect).
std::unique_ptr<Model::State> load_state(const std::string& bytes, const std::string& file_name,
                                         const std::filesystem::path& dir);

// ---- host evaluation (fold.cpp)

// Evaluates `n` on constant inputs where an evaluator exists for its op; nullopt where none does.
// UsageError for inputs the op cannot take (naming the node).
using HostEval = std::function<std::vector<HostTensor>(const Node&, const std::vector<const HostTensor*>&)>;
const std::map<std::string, HostEval>& host_evaluators();
// Shape's output for a tensor of `dims` (its start and end attributes, opset 15).
HostTensor shape_of(const std::vector<std::int64_t>& dims, const Node& n);
// numpy broadcasting of two shapes; UsageError naming `what` where they do not broadcast.
std::vector<std::int64_t> broadcast_dims(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b,
                                         const std::string& what);
// Negative axes counted from the end; UsageError outside [-rank, rank).
int normalize_axis(std::int64_t axis, std::int64_t rank, const Node& n);
// Output dims of the shape ops, shared by the host evaluation and the engine mapping (views).
std::vector<std::int64_t> reshape_dims(const std::vector<std::int64_t>& in, const HostTensor& target, bool allowzero,
                                       const Node& n);
std::vector<std::int64_t> flatten_dims(const std::vector<std::int64_t>& in, std::int64_t axis, const Node& n);
std::vector<std::int64_t> squeeze_dims(const std::vector<std::int64_t>& in, const HostTensor* axes, const Node& n);
// A Transpose node's perm: its attribute, or (none given) the dims reversed, as ONNX defines it.
std::vector<std::int64_t> transpose_perm(const Node& n, std::size_t rank);
std::vector<std::int64_t> unsqueeze_dims(const std::vector<std::int64_t>& in, const HostTensor& axes, const Node& n);
// Slice's inputs 1..4 normalised to one (start, end, step) per dim, clamped as ONNX says.
struct SliceRanges {
  std::vector<std::int64_t> starts, ends, steps, out_dims;
};
SliceRanges slice_ranges(const std::vector<std::int64_t>& in, const std::vector<const HostTensor*>& inputs,
                         const Node& n);

// ---- mapping onto engine ops (import.cpp, map_*.cpp)

// An ONNX tensor during mapping: a constant, or an engine value with the shape the ONNX graph
// gives it (`shape`), which may differ from the engine value's own (a view not yet made: a
// GlobalAveragePool's [N, C] read as [N, C, 1, 1]; materialised by Ctx::value when an op needs it).
struct Slot {
  std::optional<HostTensor> constant;
  nn::Value value;
  std::vector<std::int64_t> shape;
  bool integral = false;  // integer values in a float engine value (an integer input's, views and casts of it)
};

struct Ctx;
using MapFn = void (*)(Ctx&, const Node&);
using MapTable = std::map<std::string, MapFn>;
void add_layer_mappings(MapTable& t);    // ops the engine had (map_layers.cpp)
void add_generic_mappings(MapTable& t);  // elementwise, shape and transformer ops (map_ops.cpp)
const MapTable& mappings();

// A chain of nodes built as one unit at its last node (Conv+BN+Add+Relu, the erf GELU).
struct Group {
  std::vector<int> nodes;            // indices into State::nodes, in order
  std::string kind;                  // "conv", "gelu", "linear" or "attention"
  std::map<std::string, int> roles;  // attention: each matched node by its part ("scores", "softmax", ...)
};

struct Ctx {
  nn::GraphBuilder& b;
  const Model::State& s;
  Fold fold;
  std::int64_t batch;
  std::map<std::string, Slot> slots;
  std::map<std::string, nn::Value> graph_constants;  // constants an op reads, as nn::constant values
  nn::ParameterValues params;
  std::vector<std::string> fused;
  std::map<std::string, int> names_used;
  int fp8_layers = 0;  // convolutions and linear layers built to run e4m3 (an fp8 graph)

  const Slot& slot(const std::string& tensor, const Node& n) const;
  bool is_constant(const std::string& tensor) const;
  const HostTensor& constant(const Node& n, std::size_t input) const;  // UsageError if not constant
  bool has_input(const Node& n, std::size_t i) const { return i < n.inputs.size() && !n.inputs[i].empty(); }
  // The engine value of input i at its ONNX shape (a reshape view where it differs; a constant
  // becomes an nn::constant of the graph).
  nn::Value value(const Node& n, std::size_t input);
  // The same, viewed with `dims` (same element count): nn::linear's [rows, K].
  nn::Value value_as(const Node& n, std::size_t input, const std::vector<std::int64_t>& dims);
  std::vector<std::int64_t> shape(const Node& n, std::size_t input) const;
  void set(const std::string& tensor, nn::Value v);  // shape from the engine value
  void set_view(const std::string& tensor, nn::Value v, std::vector<std::int64_t> shape);
  void set_constant(const std::string& tensor, HostTensor t);
  std::string unique_name(const std::string& base);
  [[noreturn]] void refuse(const Node& n, const std::string& why) const;
};

// A node on its own: evaluated on the host where its inputs are constant, else its op's mapping.
void map_node(Ctx& c, const Node& n);

std::vector<std::int64_t> to_dims(const Shape& s);
Shape to_shape(const std::vector<std::int64_t>& d, const std::string& what);

}  // namespace ab::onnx
