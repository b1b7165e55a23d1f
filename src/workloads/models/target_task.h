// The model-specific half of time to train (train_to_target.h): what the one epoch and evaluation
// loop of train_to_target.cpp asks of a model and its data. An image classifier on an image set
// (top-1 accuracy, higher is better; image_target.cpp) or a GPT on a token stream (the mean
// validation cross-entropy in nats per token, lower is better; text_target.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/graph.h"
#include "nn/optim.h"
#include "workloads/models/mllog.h"
#include "workloads/models/train_to_target.h"

namespace ab::workloads::zoo {

// The quality an evaluation measures and the target that ends the run.
struct Quality {
  std::string name;  // "accuracy" or "loss": the record's target_<name>, best_<name>, final_<name>, the curve's <name>
  bool higher_is_better = true;
  double target = 0;
  bool reached(double value) const { return higher_is_better ? value >= target : value <= target; }
  double better(double a, double b) const;  // the better of two evaluations
};

// The bound model the loop trains: its kernels, graph, optimizer and the values it reads and writes.
struct TargetModel {
  ModelSpec spec;
  std::unique_ptr<nn::Kernels> kernels;
  std::unique_ptr<nn::Graph> graph;
  std::unique_ptr<nn::Optimizer> opt;
  nn::Value loss;
  std::vector<nn::Value> inputs;  // zeroed for init's blank forward and backward
  // The kernels (before the graph: its memory comes from their allocator), the graph, its bind.
  void bind(State& state, nn::GraphBuilder builder, std::unique_ptr<nn::Optimizer> optimizer);
};

class TargetTask {
 public:
  virtual ~TargetTask() = default;
  virtual const Quality& quality() const = 0;
  virtual std::int64_t steps_per_epoch() const = 0;
  virtual std::int64_t train_samples() const = 0;
  virtual std::int64_t eval_samples() const = 0;
  // The next training batch into the graph's inputs.
  virtual void upload_next_batch(nn::Graph& g) = 0;
  // One evaluation of the held-out split (forward(false) of the training graph).
  virtual double evaluate(nn::Graph& g) = 0;
  // The optimizer's MLPerf hyperparameter events (opt_name and its own; the loop logs the rest).
  virtual void log_optimizer(MlLog& log) const = 0;
};

// Reads the data, builds and binds the model into `m`, records metrics.dataset and the point's counts.
std::unique_ptr<TargetTask> make_image_task(State& state, const TargetPoint& p, const TrainOptions& o, TargetModel& m);
std::unique_ptr<TargetTask> make_text_task(State& state, const TargetPoint& p, const TrainOptions& o, TargetModel& m);

}  // namespace ab::workloads::zoo
