// The static graph: built once from a model function, shapes inferred as layers are added,
// activation memory planned by lifetime, then bound to a backend and run as a fixed sequence
// (forward, backward, update) every step. Per-op FLOPs, bytes and, on request, times.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/kernels.h"
#include "nn/op.h"
#include "nn/planner.h"

namespace ab::nn {

class Optimizer;

// A tensor flowing between layers, by index into the graph's values.
struct Value {
  int id = -1;
};

struct GraphOptions {
  DType dtype = DType::f32;  // activations and parameters; ref also runs f64 (gradient checks)
  // The precision policy: fp32 (dtype as given), tf32 (f32 storage, TF32 math), bf16 (bf16
  // activations and weights, fp32 master weights and batch-norm parameters), fp16 (as bf16, plus
  // dynamic loss scaling). bf16/fp16 override dtype for activations.
  Precision precision = Precision::fp32;
  bool deterministic = false;  // bit-identical results run to run (Kernels::set_deterministic)
  Layout layout = Layout::nchw;
  bool training = true;        // plan backward and update; false plans an inference-only graph
  std::uint64_t seed = 1;      // parameter initialisation
};

class GraphBuilder {
 public:
  explicit GraphBuilder(GraphOptions options = {});
  GraphBuilder(GraphBuilder&&) noexcept;
  ~GraphBuilder();

  // A graph input the caller fills before forward (images, labels). `requires_grad` asks for its
  // gradient too (gradient checks); images and labels need none.
  Value input(const std::string& name, const Shape& shape, bool requires_grad = false);
  Value input(const std::string& name, const Shape& shape, DType dtype);
  // Adds a layer: infers its outputs now, so a bad configuration fails at the line that made it.
  std::vector<Value> add(std::unique_ptr<Op> op, const std::vector<Value>& inputs);
  Value add1(std::unique_ptr<Op> op, const std::vector<Value>& inputs);  // single-output layers
  // The scalar backward starts from (its gradient is seeded with 1).
  void set_loss(Value v);
  // Keeps a value readable after the step (logits, the loss).
  void mark_output(Value v);

  const Tensor& desc(Value v) const;
  const GraphOptions& options() const;

 private:
  friend class Graph;
  struct State;
  std::unique_ptr<State> s_;
};

// One row of the per-op table; times are filled while profiling (else 0).
struct OpReport {
  std::string name, kind;
  Shape out_shape;
  std::int64_t params = 0;  // trainable elements
  std::int64_t forward_flops = 0, backward_flops = 0;
  std::int64_t forward_bytes = 0, backward_bytes = 0;
  double forward_s = 0, backward_s = 0;
};

struct Parameter {
  std::string name;  // "layer1.0.conv1.weight"
  ParamSpec spec;
  Tensor value;      // bound after bind()
  Tensor grad;       // undefined for running statistics
};

class Graph {
 public:
  // Plans the graph: which gradients exist, each buffer's lifetime, the arena layout. No memory.
  explicit Graph(GraphBuilder&& builder);
  ~Graph();
  Graph(Graph&&) noexcept;

  const GraphOptions& options() const;
  std::int64_t parameter_count() const;  // trainable elements
  std::int64_t forward_flops() const;
  std::int64_t backward_flops() const;   // 0 for an inference graph
  std::vector<OpReport> report() const;
  const Op& op(std::size_t i) const;
  std::size_t op_count() const;
  // The activation plan: one lifetime per value, gradient and saved tensor; steps 0..n-1 run
  // forward op i at step i, steps n..2n-1 run backward op i at step 2n-1-i.
  const std::vector<BufferLifetime>& buffers() const;
  const MemoryPlan& memory_plan() const;

  // Binds to a backend: prepares every layer (an Unsupported or Error names the layer), allocates
  // the arena, parameters, gradients and workspace, and initialises parameters from the seed.
  void bind(Kernels& kernels);
  Kernels& kernels() const;

  Tensor tensor(Value v) const;  // bound views; valid only while the value is alive in the step
  Tensor grad(Value v) const;    // undefined where the value has no gradient
  std::vector<Parameter>& parameters();
  void set_input(Value v, const std::vector<double>& values);  // logical row-major order
  std::vector<double> read(Value v) const;
  std::vector<double> read(const Tensor& t) const;

  // The fixed sequence. forward(false) uses running statistics (evaluation on a training graph).
  void forward(bool training = true);
  void backward();
  void update(Optimizer& optimizer);

  // Per-op timing: each op's forward and backward is timed with the backend's timer (which
  // synchronises), so a profiled step is slower than a plain one; report() shows the times.
  void set_profiling(bool on);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ab::nn
