// Internal state shared by graph_builder.cpp and graph.cpp; not part of the module's interface.
#pragma once

#include <functional>
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
  // Per node and spec: the (node, spec) that owns a tied parameter's storage; its own for others.
  std::vector<std::vector<std::pair<int, int>>> owner;
  bool tied(std::size_t i, std::size_t j) const {
    return owner[i][j] != std::pair<int, int>(static_cast<int>(i), static_cast<int>(j));
  }
  std::vector<std::vector<bool>> dparams_accumulate;  // per node and spec (OpTensors::dparams_accumulate)
  // Per node and parameter: the gradient an op writes where it is staged (stages_gradient): an
  // arena buffer kept to the end of backward and cast (or, over micro-batches, added) into the f32
  // master gradient; -1: none.
  std::vector<std::vector<int>> grad16_buffer;
  // The op writes a staged gradient rather than the master: a 16-bit copy's, and every trainable
  // parameter's when micro-batches accumulate into the masters.
  bool stages_gradient(const ParamSpec& spec) const {
    return spec.trainable() && (is_16bit(spec.dtype) || options.micro_batches > 1);
  }
  std::vector<BufferLifetime> lifetimes;
  MemoryPlan plan;

  // Binding.
  Kernels* kernels = nullptr;
  Buffer arena, param_store, copy_store, grad_store, workspace, scaler_store;
  std::vector<Parameter> params;
  std::vector<std::vector<std::size_t>> param_index;  // per node and spec: index into params
  std::vector<OpTensors> bound;                       // per node
  // fp16 loss scaling, on the device: scale (f32 [1]), good_steps and found_nonfinite (i32 [1]),
  // and the scale before the last update (f32 [1]) to tell a skipped step afterwards.
  Tensor scale, good_steps, found_nonfinite, scale_before;
  // Where an op draws random numbers (dropout): i32 [1], advanced at each training forward.
  Buffer counter_store;
  Tensor step_counter;

  GradientSync* gradient_sync = nullptr;
  bool profiling = false;
  OpObserver* op_observer = nullptr;
  std::unique_ptr<measure::IterationTimer> timer;
  std::vector<double> forward_s, backward_s;
  // Inference: ops that no marked output depends on (an importer's rearrangements that a fused op
  // made unused): never run, not reported. Reshapes whose output is their input's bytes: never run,
  // reported moving none.
  std::vector<bool> dead, aliased;

  std::size_t n() const { return nodes.size(); }
  int fwd_step(std::size_t i) const { return static_cast<int>(i); }
  int bwd_step(std::size_t i) const { return static_cast<int>(2 * n() - 1 - i); }
  int end_step() const { return static_cast<int>(options.training ? 2 * n() : n()); }
  const ValueInfo& value(int id) const { return values[static_cast<std::size_t>(id)]; }
  Kernels& k() const {
    if (kernels == nullptr) throw Error("graph is not bound to a backend (call bind)");
    return *kernels;
  }
  bool loss_scaling() const { return options.precision == Precision::fp16; }
  void resolve_tied();
  void plan_gradients();
  void plan_parameter_gradients();
  void find_dead_ops();
  std::vector<int> alias_views(std::vector<int>& last);
  void plan_lifetimes();
  std::vector<int> share_passed_gradients();  // per value: the value whose gradient buffer it uses
  // The step, on State so that a captured step does not depend on where the Graph object lives.
  void run_forward(bool training);
  void run_backward(std::int64_t micro_batch);
  void run_update(Optimizer& optimizer);
  // A profiled op's seconds per call: its launches captured once (a CUDA graph on a GPU) and the
  // replays timed back to back, so the figure is what the op costs inside a captured step, not the
  // host's launch latency around one eager call (timed that way, ResNeXt-101's ops at batch 2 on
  // an H200 summed 21.2 ms for a 1.26 ms forward). Replaying re-runs the op, so in-place and accumulating ops leave
  // values that are not the step's, and batch norm's running statistics move: profile last, after
  // every figure that reads the graph (parameters and inputs stay as they were).
  double time_op(const std::function<void()>& body);
  Tensor view_of(int buffer, const Tensor& desc) const {
    if (buffer < 0) return desc;  // undefined: no storage
    return arena.view(desc, plan.offsets_bytes[static_cast<std::size_t>(buffer)]);
  }
};

Tensor graph_desc(const GraphOptions& o, DType dtype, const Shape& shape);

// A trainable parameter the op reads in 16 bits is kept as an f32 master plus that copy.
inline bool has_copy(const ParamSpec& spec) { return spec.trainable() && is_16bit(spec.dtype); }

}  // namespace ab::nn
