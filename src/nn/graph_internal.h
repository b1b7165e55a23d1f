// Internal state shared by graph_builder.cpp and graph.cpp; not part of the module's interface.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "measure/timer.h"
#include "nn/graph.h"

namespace ab::nn {

struct ValueInfo {
  std::string name;
  Tensor desc;
  int producer = -1;  // node index; -1 for a graph input
  int producer_slot = 0;
  bool requires_grad = false;  // depends on a trainable parameter or a requires_grad input
  bool keep = false;           // alive until the end of the step (outputs, the loss)
};

struct Node {
  std::unique_ptr<Op> op;
  std::vector<int> inputs, outputs;  // value ids
};

struct GraphBuilder::State {
  GraphOptions options;
  std::vector<ValueInfo> values;
  std::vector<Node> nodes;
  std::set<std::string> names;
  int loss = -1;
};

// Everything a built graph knows; see graph.h for the step numbering.
struct Graph::State {
  GraphOptions options;
  std::vector<ValueInfo> values;
  std::vector<Node> nodes;
  int loss = -1;

  // Planning (no memory).
  std::vector<bool> runs_backward;                // per node
  std::vector<bool> has_grad;                     // per value: a gradient buffer exists
  std::vector<std::vector<bool>> din_accumulate;  // per node and input slot
  std::vector<std::vector<int>> zero_grads;       // per node: output grads nobody writes, zeroed first
  std::vector<int> value_buffer, grad_buffer;     // per value: index into lifetimes (-1: none)
  std::vector<std::vector<int>> saved_buffer;     // per node
  std::vector<std::vector<ParamSpec>> specs;      // per node
  std::vector<BufferLifetime> lifetimes;
  MemoryPlan plan;

  // Binding.
  Kernels* kernels = nullptr;
  Buffer arena, param_store, grad_store, workspace;
  std::vector<Parameter> params;
  std::vector<OpTensors> bound;  // per node

  bool profiling = false;
  std::unique_ptr<measure::IterationTimer> timer;
  std::vector<double> forward_s, backward_s;

  std::size_t n() const { return nodes.size(); }
  int fwd_step(std::size_t i) const { return static_cast<int>(i); }
  int bwd_step(std::size_t i) const { return static_cast<int>(2 * n() - 1 - i); }
  int end_step() const { return static_cast<int>(options.training ? 2 * n() : n()); }
  const ValueInfo& value(int id) const { return values[static_cast<std::size_t>(id)]; }
  Kernels& k() const {
    if (kernels == nullptr) throw Error("graph is not bound to a backend (call bind)");
    return *kernels;
  }
  void plan_gradients();
  void plan_lifetimes();
  Tensor view_of(int buffer, const Tensor& desc) const {
    if (buffer < 0) return desc;  // undefined: no storage
    return arena.view(desc, plan.offsets_bytes[static_cast<std::size_t>(buffer)]);
  }
};

Tensor graph_desc(const GraphOptions& o, DType dtype, const Shape& shape);

}  // namespace ab::nn
