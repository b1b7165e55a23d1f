// Time to train an image classifier (target_task.h): the training split through the host
// pipeline, top-1 accuracy on the test split, SGD with momentum. docs/METHODOLOGY.md, "Time to train".
#include <algorithm>
#include <thread>

#include "core/error.h"
#include "data/pipeline.h"
#include "workloads/models/datasets.h"
#include "workloads/models/target_task.h"

namespace ab::workloads::zoo {
namespace {

constexpr double kMomentum = 0.9;

int data_threads(const TrainOptions& o) {
  if (o.data_threads > 0) return static_cast<int>(o.data_threads);
  return static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1U, 8U));
}

class ImageTask final : public TargetTask {
 public:
  ImageTask(double target_accuracy, const TrainOptions& o) : quality_{"accuracy", true, target_accuracy}, o_(o) {}
  const Quality& quality() const override { return quality_; }
  std::int64_t steps_per_epoch() const override { return pipeline_->batches_per_epoch(); }
  std::int64_t train_samples() const override { return train_samples_; }
  std::int64_t eval_samples() const override { return eval_.count; }

  // The pipeline's next batch into the graph's inputs (pageable host memory: each copy is staged
  // before upload returns, so the ring slot goes back to the workers at once).
  void upload_next_batch(nn::Graph& g) override {
    const data::HostBatch b = pipeline_->acquire();
    g.kernels().upload(g.tensor(model_.images), b.pixels);
    g.kernels().upload(g.tensor(model_.labels), b.labels);
    pipeline_->release();
  }
  double evaluate(nn::Graph& g) override { return top1_accuracy(g, model_.images, model_.output, eval_); }
  void log_optimizer(MlLog& log) const override {
    log.event("opt_name", "sgd");
    log.event("opt_weight_decay", o_.weight_decay);
    log.event("opt_momentum", kMomentum);
  }

  // The data read and prepared, the graph built and bound, the pipeline started.
  void init(State& state, const TargetPoint& p, TargetModel& m) {
    data::ImageSet train = load_dataset(p.dataset, "train");
    const data::ImageSet test = load_dataset(p.dataset, "test");
    m.spec = p.spec;
    if (train.height != train.width || test.height != train.height || test.width != train.width)
      throw UsageError(p.dataset + ": train and test images must be square and of one size (" +
                       std::to_string(train.height) + "x" + std::to_string(train.width) + ", test " +
                       std::to_string(test.height) + "x" + std::to_string(test.width) + ")");
    m.spec.image_px = train.height;
    nn::GraphOptions options = graph_options(m.spec);
    options.seed = p.seed;
    nn::GraphBuilder builder(options);
    model_ = build_zoo_model(builder, m.spec);
    if (model_.compression || model_.language || model_.classes < train.classes)
      throw UsageError("time to train on an image set needs an image classifier of at least " +
                       std::to_string(train.classes) + " classes; '" + m.spec.model + "' is not one");
    check_dataset_fits(train, model_.in_channels, m.spec.layout, m.spec.model);
    const double peak = o_.lr > 0 ? o_.lr : recipe_peak_lr(m.spec.batch * p.ranks());  // of the global batch
    m.bind(state, std::move(builder), std::make_unique<nn::Sgd>(peak, kMomentum, o_.weight_decay));
    m.loss = model_.loss;
    m.inputs = {model_.images, model_.labels};
    const DType input = m.graph->tensor(model_.images).dtype;
    train_samples_ = train.count;
    eval_ = make_eval_split(test, model_.in_channels, input, m.spec.batch);
    data::PipelineConfig config;
    config.batch = m.spec.batch;
    config.threads = data_threads(o_);
    config.seed = p.seed;
    config.rank = p.rank();
    config.ranks = p.ranks();
    config.augment = train_augment(train, model_.in_channels, input, o_.pad, o_.flip == "on");
    pipeline_ = std::make_unique<data::HostPipeline>(data::raw_source(std::move(train)), config, nullptr);
    if (pipeline_->batches_per_epoch() < 1)
      throw UsageError(p.dataset + ": " + std::to_string(train_samples_) + " training images make no batch of " +
                       std::to_string(m.spec.batch) + " on each of " + std::to_string(p.ranks()) + " ranks");
    const double fwd = static_cast<double>(m.graph->forward_flops()),
                 bwd = static_cast<double>(m.graph->backward_flops());
    state.set_counts({1.0, (fwd + bwd) / static_cast<double>(m.spec.batch), 0.0, "FLOP"});  // per training sample
    state.add_metric("dataset", {{"name", p.dataset},
                                 {"train_samples", train_samples_},
                                 {"eval_samples", eval_.count},
                                 {"image_px", m.spec.image_px},
                                 {"data_threads", config.threads}});
  }

 private:
  Quality quality_;
  TrainOptions o_;
  ZooModel model_;
  std::unique_ptr<data::HostPipeline> pipeline_;
  EvalSplit eval_;
  std::int64_t train_samples_ = 0;
};

}  // namespace

std::unique_ptr<TargetTask> make_image_task(State& state, const TargetPoint& p, const TrainOptions& o, TargetModel& m) {
  auto task = std::make_unique<ImageTask>(p.target_accuracy, o);
  task->init(state, p, m);
  return task;
}

}  // namespace ab::workloads::zoo
