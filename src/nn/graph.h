// The static graph: built once from a model function, shapes inferred as layers are added,
// activation memory planned by lifetime, then bound to a backend and run as a fixed sequence
// (forward, backward, update) every step. Per-op FLOPs, bytes and, on request, times.
#pragma once

#include <cstdint>
#include <map>
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
  DType dtype = DType::f32;  // storage under Precision::fp32; ref also runs f64 (gradient checks)
  // The precision policy (docs/ENGINE.md):
  //  fp32  everything in `dtype`.
  //  tf32  f32 storage; convolutions and matmuls may use TF32 (Kernels::set_tf32 at bind).
  //  bf16  activations and their gradients in bf16; convolution and linear parameters as f32
  //        masters (what the optimizer updates) with the bf16 copies the ops read, refreshed after
  //        each update; batch-norm parameters and statistics, probabilities and the loss in f32.
  //  fp16  as bf16 in f16, plus dynamic loss scaling (GradScaler's rule, `loss_scale_rule`)
  //        kept on the device: a step with a non-finite gradient changes no parameter.
  //  fp8   inference only (training = false): stored as fp16 (f16 activations and parameters);
  //        the ops built to run e4m3 (ConvBiasActivation's fp8 flag) quantize their operands
  //        themselves and fall back to f16 where the backend refuses. No other op changes.
  // tf32, bf16, fp16 and fp8 set the types themselves: `dtype` must stay f32.
  Precision precision = Precision::fp32;
  bool deterministic = false;  // bit-identical results run to run (Kernels::set_deterministic at bind)
  double initial_loss_scale = 65536.0;  // fp16: PyTorch's GradScaler default, 2^16
  LossScaleRule loss_scale_rule;        // fp16
  Layout layout = Layout::nchw;
  bool training = true;        // plan backward and update; false plans an inference-only graph
  // Gradient accumulation: a step runs forward and backward this many times (micro-batches, each
  // on the inputs as they are then) and one update on the mean of their parameter gradients. Above
  // 1, every trainable parameter's op writes a gradient of its own that backward adds into the f32
  // master gradient (one more parameter-sized buffer under fp32 and tf32).
  std::int64_t micro_batches = 1;
  std::uint64_t seed = 1;      // parameter initialisation
};

// The storage type of activations and their gradients under the options' precision policy.
// Throws UsageError for a precision the graph does not run (int8; fp8 in a training graph) or a
// dtype the policy overrides.
DType activation_dtype(const GraphOptions& o);

class GraphBuilder {
 public:
  explicit GraphBuilder(GraphOptions options = {});
  GraphBuilder(GraphBuilder&&) noexcept;
  ~GraphBuilder();

  // A graph input the caller fills before forward (images, labels). `requires_grad` asks for its
  // gradient too (gradient checks); images and labels need none. The first form stores it in
  // the activation dtype (bf16 under the bf16 policy).
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
  // v, or v copied into the graph's layout where it is rank 4 and in the other (before a built-in op).
  Value in_graph_layout(Value v);
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
  Tensor value;      // bound after bind(); the f32 master where `copy` is defined
  Tensor grad;       // undefined for running statistics and in an inference graph; f32 beside a 16-bit copy, and
                     // unscaled (fp16)
  Tensor copy;       // bf16/fp16: the 16-bit copy the op reads, `value` rounded; else undefined
  // Data parallelism with the mean in the update (DataParallel::set_mean_in_update): the peer
  // rank's gradient, laid out as `grad`; the optimizer steps on (grad + grad_partner) / 2. Else undefined.
  Tensor grad_partner;
};

// Parameter values by name (Parameter::name, "layer1.0.conv1.weight"), each in logical row-major
// order: how values move between graphs (a folded inference graph's from its unfolded twin's,
// models::fold_batchnorm_parameters) or in from a test.
using ParameterValues = std::map<std::string, std::vector<double>>;

// Data parallelism's hook into backward (dist/data_parallel/buckets.h): told as each parameter's gradient
// becomes final, in backward order, so that its all-reduce can start while backward goes on; and
// asked to finish (the step's stream waits for every reduction) before the fp16 unscale and the
// update, so all ranks check and apply the same averaged gradients. Calls are enqueue-only: a
// step with a sync can still be captured.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual void begin() = 0;                            // before the first op's backward
  virtual void ready(std::size_t parameter_index) = 0;  // index into Graph::parameters()
  virtual void finish() = 0;
};

// Told around each op's forward and backward of an eager step (a counter pass marks each op as a
// range with it); the op's index into Graph::op / report().
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void begin(std::size_t op, bool backward) = 0;
  virtual void end(std::size_t op, bool backward) = 0;
};

class Graph {
 public:
  // Plans the graph: which gradients exist, each buffer's lifetime, the arena layout. No memory.
  explicit Graph(GraphBuilder&& builder);
  ~Graph();
  Graph(Graph&&) noexcept;

  const GraphOptions& options() const;
  std::int64_t parameter_count() const;  // trainable elements
  std::int64_t forward_flops() const;    // of the ops that run (an inference graph leaves out unused ones)
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
  // The values bind() initialises the parameters to (from options().seed and each name), computed
  // on the host; needs no bind, so a graph that is only planned can supply them.
  ParameterValues initial_parameter_values() const;
  // After bind: every parameter's value (the f32 master beside a 16-bit copy), and the write that
  // replaces them all (refreshing the 16-bit copies, as bind does). The names must be exactly the
  // graph's and each size its parameter's; Error names the first that is not. Not while capturing.
  ParameterValues parameter_values() const;
  void set_parameter_values(const ParameterValues& values);
  void set_input(Value v, const std::vector<double>& values);  // logical row-major order
  std::vector<double> read(Value v) const;
  std::vector<double> read(const Tensor& t) const;

  // The fixed sequence. forward(false) uses running statistics (evaluation on a training graph).
  // None of them allocates or waits for the host, so a step can be captured (capture_step).
  // backward() seeds the loss gradient with 1 (fp16: with the loss scale), and under bf16/fp16
  // casts each 16-bit parameter gradient into its f32 master gradient (fp16: then unscales and
  // checks every parameter gradient). update() steps the optimizer (fp16: skipped on the device
  // if a gradient was non-finite), refreshes the 16-bit copies and (fp16) updates the loss scale.
  // With micro-batches (GraphOptions::micro_batches = n), a step is forward + backward(m) for m =
  // 0..n-1, then update: backward(0) writes the master gradients, later ones add into them, and
  // the last divides by n and alone hands gradients to data parallelism and unscales (fp16).
  void forward(bool training = true);
  void backward(std::int64_t micro_batch = 0);
  void update(Optimizer& optimizer);

  // Records one whole step for replay with no host work: forward(true) + backward(m) for each
  // micro-batch m, then update(*optimizer) on a training graph, forward(false) for an inference graph or a null
  // optimizer. Binds the optimizer first (a captured step must not allocate). Nothing runs at
  // capture; each replay() runs the step on the inputs then in place. Host values are frozen at
  // capture (the learning rate), and the graph, its kernels and the optimizer must outlive the
  // result. Throws Error while profiling (timing synchronises).
  std::unique_ptr<Replayable> capture_step(Optimizer* optimizer);

  // fp16 loss scaling (outside the step: these read or write the device and synchronise). The
  // scale the next step will use (1 without loss scaling); whether the last update() was skipped
  // for a non-finite gradient; set_loss_scale restarts the scale (and the good-step count).
  double loss_scale() const;
  bool last_step_skipped() const;
  void set_loss_scale(double scale);

  // Data parallelism (dist/data_parallel/buckets.h): null for none. The sync must outlive the graph's use
  // of it (and any step captured while it was set).
  void set_gradient_sync(GradientSync* sync);

  // Per-op timing: each op's forward and backward is timed with the backend's timer (which
  // synchronises), so a profiled step is slower than a plain one; report() shows the times.
  void set_profiling(bool on);
  // Null for none. Eager steps only: capture_step throws while one is set.
  void set_op_observer(OpObserver* observer);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ab::nn
