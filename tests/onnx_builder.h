// Builds ONNX models in C++ through the protobuf API (the tests have no PyTorch): nodes with
// attributes, initializers of seeded random values, the input and output value infos.
#pragma once

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/graph.h"
#include "nn/kernels.h"

namespace ab::onnx_test {

// Seeded values in [lo, hi), each a float32 (what an initializer stores): the same numbers go into
// the ONNX initializer and the native graph.
inline std::vector<double> random_values(std::uint64_t seed, std::int64_t count, double lo = -1.0, double hi = 1.0) {
  std::vector<double> v(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(uniform(seed, i, lo, hi));
  return v;
}

// max |got - want| / max |want|; a zero reference fails (it proves nothing).
inline double max_rel_diff(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  EXPECT_GT(scale, 0.0) << "a zero reference proves nothing";
  return diff / scale;
}

// The native graphs the imported ones are held to: float64 inference on the reference kernels.
inline nn::GraphOptions f64_inference() {
  nn::GraphOptions o;
  o.dtype = DType::f64;
  o.training = false;
  return o;
}

// Binds `b` on the reference kernels, sets the parameters and input, and returns `out` after one
// inference pass.
inline std::vector<double> run(nn::GraphBuilder&& b, nn::Value in, nn::Value out, const nn::ParameterValues& values,
                               const std::vector<double>& x) {
  b.mark_output(out);
  auto kernels = nn::make_ref_kernels();
  nn::Graph g(std::move(b));
  g.bind(*kernels);
  g.set_parameter_values(values);
  g.set_input(in, x);
  g.forward(false);
  return g.read(out);
}

inline std::int64_t count_of(const std::vector<std::int64_t>& dims) {
  std::int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

class OnnxBuilder {
 public:
  explicit OnnxBuilder(std::int64_t opset = 17) {
    model_.set_ir_version(8);
    model_.set_producer_name("accelbench-tests");
    auto* o = model_.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
  }

  // A graph input; a dim of -1 is symbolic ("N").
  void input(const std::string& name, const std::vector<std::int64_t>& dims,
             int elem_type = ::onnx::TensorProto_DataType_FLOAT) {
    value_info(graph()->add_input(), name, dims, elem_type);
  }
  void output(const std::string& name, const std::vector<std::int64_t>& dims = {}) {
    value_info(graph()->add_output(), name, dims, ::onnx::TensorProto_DataType_FLOAT);
  }

  // A float initializer (raw data, as PyTorch writes them); returns its name.
  const std::string& init(const std::string& name, const std::vector<std::int64_t>& dims,
                          const std::vector<double>& values) {
    ::onnx::TensorProto* t = graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(::onnx::TensorProto_DataType_FLOAT);
    for (auto d : dims) t->add_dims(d);
    std::vector<float> f(values.begin(), values.end());
    t->set_raw_data(std::string(reinterpret_cast<const char*>(f.data()), f.size() * sizeof(float)));
    return name;
  }
  const std::string& init_ints(const std::string& name, const std::vector<std::int64_t>& dims,
                               const std::vector<std::int64_t>& values) {
    ::onnx::TensorProto* t = graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(::onnx::TensorProto_DataType_INT64);
    for (auto d : dims) t->add_dims(d);
    for (auto v : values) t->add_int64_data(v);
    return name;
  }

  ::onnx::NodeProto* node(const std::string& op, const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs, const std::string& name = {}) {
    ::onnx::NodeProto* n = graph()->add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? op + "_" + std::to_string(graph()->node_size()) : name);
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    return n;
  }

  static void attr(::onnx::NodeProto* n, const std::string& name, std::int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto_AttributeType_INT);
    a->set_i(v);
  }
  static void attr(::onnx::NodeProto* n, const std::string& name, double v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto_AttributeType_FLOAT);
    a->set_f(static_cast<float>(v));
  }
  static void attr(::onnx::NodeProto* n, const std::string& name, const std::vector<std::int64_t>& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto_AttributeType_INTS);
    for (auto e : v) a->add_ints(e);
  }
  static void attr(::onnx::NodeProto* n, const std::string& name, const std::string& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto_AttributeType_STRING);
    a->set_s(v);
  }

  ::onnx::ModelProto& model() { return model_; }
  ::onnx::GraphProto* graph() { return model_.mutable_graph(); }
  std::string bytes() const { return model_.SerializeAsString(); }

 private:
  static void value_info(::onnx::ValueInfoProto* v, const std::string& name, const std::vector<std::int64_t>& dims,
                         int elem_type) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(elem_type);
    auto* shape = t->mutable_shape();
    for (auto d : dims) {
      auto* dim = shape->add_dim();
      if (d < 0) dim->set_dim_param("N");
      else dim->set_dim_value(d);
    }
  }
  ::onnx::ModelProto model_;
};

}  // namespace ab::onnx_test
