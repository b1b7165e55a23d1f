#include "workloads/models/train_to_target.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <thread>

#include "data/pipeline.h"
#include "measure/timer.h"
#include "nn/cuda/device_kernels.h"
#include "nn/optim.h"
#include "workloads/models/datasets.h"
#include "workloads/models/mllog.h"
#include "workloads/models/weights.h"

namespace ab::workloads::zoo {
namespace {

constexpr double kMomentum = 0.9;
constexpr double kRecipeLrPer256 = 0.2;
constexpr double kFinalLrFraction = 0.01;
// The loss is read (a device synchronisation) every this many steps and at each epoch's end; the
// epoch's train loss is the mean of those reads.
constexpr std::int64_t kLossEvery = 10;

std::string number(double v) { return nlohmann::json(v).dump(); }

struct Evaluation {
  std::int64_t epoch = 0;
  double accuracy = 0, train_loss = 0, time_s = 0, lr = 0;
};

// How the run ended: converged, or why not.
struct Outcome {
  std::string status = "converged";  // converged, not_converged, diverged, interrupted
  std::string reason;
};

struct Run {
  ModelSpec spec;
  ZooModel model;
  std::unique_ptr<nn::Kernels> kernels;
  std::unique_ptr<nn::Graph> graph;
  std::unique_ptr<nn::Sgd> opt;
  std::unique_ptr<nn::Replayable> captured;
  double captured_lr = -1;
  std::unique_ptr<data::HostPipeline> pipeline;
  EvalSplit eval;
  std::int64_t train_samples = 0, steps = 0;
  std::vector<Evaluation> curve;
  MlLog log;
  double init_start_s = 0, run_start_s = 0;

  // One optimizer step at `lr` on the batch already uploaded. A captured step keeps the rate it
  // was captured with, so a new rate recaptures it (after the replays in flight finish).
  void step(double lr, bool use_graph) {
    if (!use_graph) {
      opt->set_learning_rate(lr);
      graph->forward();
      graph->backward();
      graph->update(*opt);
      return;
    }
    if (lr != captured_lr) {
      kernels->synchronize();
      opt->set_learning_rate(lr);
      captured = graph->capture_step(opt.get());
      captured_lr = lr;
    }
    captured->replay();
  }
  // The pipeline's next batch into the graph's inputs (pageable host memory: each copy is staged
  // before upload returns, so the ring slot goes back to the workers at once).
  void upload_next_batch() {
    const data::HostBatch b = pipeline->acquire();
    kernels->upload(graph->tensor(model.images), b.pixels);
    kernels->upload(graph->tensor(model.labels), b.labels);
    pipeline->release();
  }
};

int data_threads(const TrainOptions& o) {
  if (o.data_threads > 0) return static_cast<int>(o.data_threads);
  return static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1U, 8U));
}

// Init: the data read and prepared, the graph built and bound, the first step run eagerly (kernels
// that pick algorithms by timing do so outside a capture) and captured at the first rate.
void init(State& state, const TargetPoint& p, const TrainOptions& o, Run& r) {
  data::ImageSet train = load_dataset(p.dataset, "train");
  const data::ImageSet test = load_dataset(p.dataset, "test");
  r.spec = p.spec;
  if (train.height != train.width || test.height != train.height || test.width != train.width)
    throw UsageError(p.dataset + ": train and test images must be square and of one size (" +
                     std::to_string(train.height) + "x" + std::to_string(train.width) + ", test " +
                     std::to_string(test.height) + "x" + std::to_string(test.width) + ")");
  r.spec.image_px = train.height;
  nn::GraphOptions options = graph_options(r.spec);
  options.seed = p.seed;
  nn::GraphBuilder builder(options);
  r.model = build_zoo_model(builder, r.spec);
  if (r.model.compression || r.model.language || r.model.classes < train.classes)
    throw UsageError("time to train needs an image classifier of at least " + std::to_string(train.classes) +
                     " classes; '" + r.spec.model + "' is not one");
  check_dataset_fits(train, r.model.in_channels, r.spec.layout, r.spec.model);
  r.kernels = nn::make_device_kernels(state.backend());
  r.graph = std::make_unique<nn::Graph>(std::move(builder));
  const double peak = o.lr > 0 ? o.lr : recipe_peak_lr(r.spec.batch);
  r.opt = std::make_unique<nn::Sgd>(peak, kMomentum, o.weight_decay);
  r.graph->bind(*r.kernels);
  const DType input = r.graph->tensor(r.model.images).dtype;
  r.train_samples = train.count;
  r.eval = make_eval_split(test, r.model.in_channels, input, r.spec.batch);
  data::PipelineConfig config;
  config.batch = r.spec.batch;
  config.threads = data_threads(o);
  config.seed = p.seed;
  config.augment = train_augment(train, r.model.in_channels, input, o.pad, o.flip == "on");
  r.pipeline = std::make_unique<data::HostPipeline>(data::raw_source(std::move(train)), config, nullptr);
  if (r.pipeline->batches_per_epoch() < 1)
    throw UsageError(p.dataset + ": " + std::to_string(r.train_samples) + " training images make no batch of " +
                     std::to_string(r.spec.batch));
  const double fwd = static_cast<double>(r.graph->forward_flops()),
               bwd = static_cast<double>(r.graph->backward_flops());
  const auto batch = static_cast<double>(r.spec.batch);
  state.set_counts({1.0, (fwd + bwd) / batch, 0.0, "FLOP"});  // per training sample: the rate is samples/s
  state.add_metric("model", {{"name", r.spec.model}, {"parameters", r.graph->parameter_count()}});
  state.add_metric("dataset", {{"name", p.dataset},
                               {"train_samples", r.train_samples},
                               {"eval_samples", r.eval.count},
                               {"image_px", r.spec.image_px},
                               {"data_threads", config.threads}});
}

void log_hyperparameters(const TargetPoint& p, const TrainOptions& o, Run& r, const std::string& platform) {
  MlLog& log = r.log;
  log.event("submission_benchmark", r.spec.model);
  log.event("submission_org", "accelbench");
  log.event("submission_division", "open");
  log.event("submission_status", "research");
  log.event("submission_platform", platform);
  log.event("seed", p.seed);
  log.event("global_batch_size", r.spec.batch);
  log.event("train_samples", r.train_samples);
  log.event("eval_samples", r.eval.count);
  log.event("opt_name", "sgd");
  log.event("opt_base_learning_rate", r.opt->learning_rate());
  log.event("opt_learning_rate_warmup_epochs", o.warmup_epochs);
  log.event("opt_learning_rate_decay_schedule", "cosine to 1% at epoch " + nlohmann::json(o.schedule_epochs).dump());
  log.event("opt_weight_decay", o.weight_decay);
  log.event("opt_momentum", kMomentum);
  log.event("target_accuracy", p.target_accuracy);
}

// One epoch of steps; false when the run must stop inside it (outcome says why).
bool train_epoch(State& state, const TargetPoint& p, const TrainOptions& o, Run& r, std::int64_t epoch, double peak,
                 double& loss_out, Outcome& outcome) {
  const std::int64_t per_epoch = r.pipeline->batches_per_epoch();
  double loss_sum = 0;
  std::int64_t loss_reads = 0;
  for (std::int64_t i = 0; i < per_epoch; ++i) {
    r.upload_next_batch();
    r.step(scheduled_lr(peak, r.steps, per_epoch, o), p.use_graph);
    ++r.steps;
    if (i % kLossEvery == kLossEvery - 1 || i == per_epoch - 1) {
      const double loss = r.graph->read(r.model.loss)[0];
      if (!std::isfinite(loss)) {
        outcome = {"diverged", "training loss is " + std::to_string(loss) + " at step " + std::to_string(r.steps) +
                                   " (epoch " + std::to_string(epoch) + ")"};
        return false;
      }
      loss_sum += loss;
      ++loss_reads;
    }
    const auto* cancel = state.cancel_flag();
    if (cancel != nullptr && cancel->load()) {
      outcome = {"interrupted", "interrupted in epoch " + std::to_string(epoch)};
      return false;
    }
    if (measure::monotonic_seconds() - r.run_start_s > o.time_limit_s) {
      outcome = {"not_converged",
                 "time_limit_s (" + number(o.time_limit_s) + " s) passed in epoch " + std::to_string(epoch)};
      return false;
    }
  }
  loss_out = loss_sum / static_cast<double>(std::max<std::int64_t>(loss_reads, 1));
  return true;
}

// The epochs until the target, a stop condition, or a failure.
Outcome train_epochs(State& state, const TargetPoint& p, const TrainOptions& o, Run& r) {
  const double peak = r.opt->learning_rate();
  Outcome outcome;
  for (std::int64_t epoch = 1; epoch <= o.max_epochs; ++epoch) {
    r.log.start("epoch_start", nullptr, {{"epoch_num", epoch}});
    double loss = 0;
    const bool whole = train_epoch(state, p, o, r, epoch, peak, loss, outcome);
    r.log.end("epoch_stop", nullptr, {{"epoch_num", epoch}});
    if (!whole) return outcome;
    r.log.start("eval_start", nullptr, {{"epoch_num", epoch}});
    const double accuracy = top1_accuracy(*r.graph, r.model.images, r.model.output, r.eval);
    r.log.end("eval_stop", nullptr, {{"epoch_num", epoch}});
    r.log.event("eval_accuracy", accuracy, {{"epoch_num", epoch}});
    r.curve.push_back({epoch, accuracy, loss, measure::monotonic_seconds() - r.run_start_s, r.opt->learning_rate()});
    if (accuracy >= p.target_accuracy) return outcome;
    if (measure::monotonic_seconds() - r.run_start_s > o.time_limit_s)
      return {"not_converged",
              "time_limit_s (" + number(o.time_limit_s) + " s) passed after epoch " + std::to_string(epoch)};
  }
  return {"not_converged", "max_epochs (" + std::to_string(o.max_epochs) + ") reached"};
}

nlohmann::json curve_json(const std::vector<Evaluation>& curve) {
  nlohmann::json out = nlohmann::json::array();
  for (const Evaluation& e : curve)
    out.push_back({{"epoch", e.epoch},
                   {"accuracy", e.accuracy},
                   {"train_loss", e.train_loss},
                   {"time_s", e.time_s},
                   {"lr", e.lr}});
  return out;
}

// The record's time_to_train block and the scenario window the runner takes the energy from.
void record(State& state, const TargetPoint& p, const Run& r, const Outcome& outcome, double run_stop_s) {
  double best = 0;
  for (const Evaluation& e : r.curve) best = std::max(best, e.accuracy);
  const bool converged = outcome.status == "converged";
  nlohmann::json t = {{"status", outcome.status},
                      {"target_accuracy", p.target_accuracy},
                      {"seed", p.seed},
                      {"epochs", r.curve.size()},
                      {"best_accuracy", best},
                      {"final_accuracy", r.curve.empty() ? 0.0 : r.curve.back().accuracy},
                      {"init_s", r.run_start_s - r.init_start_s},
                      {"run_s", run_stop_s - r.run_start_s},
                      {"steps", r.steps},
                      {"curve", curve_json(r.curve)}};
  if (converged) t["time_to_train_s"] = run_stop_s - r.run_start_s;
  if (!outcome.reason.empty()) t["stop_reason"] = outcome.reason;
  if (!r.log.path().empty()) t["mllog"] = r.log.path().filename().string();
  state.add_metric("time_to_train", t);
  ScenarioReport window;
  window.window_start_s = r.run_start_s;
  window.window_end_s = run_stop_s;
  window.samples = static_cast<double>(r.steps * r.spec.batch);
  window.samples_per_s = run_stop_s > r.run_start_s ? window.samples / (run_stop_s - r.run_start_s) : 0.0;
  window.interrupted = outcome.status == "interrupted";
  state.set_scenario_result(window);
}

}  // namespace

double recipe_peak_lr(std::int64_t global_batch) { return kRecipeLrPer256 * static_cast<double>(global_batch) / 256.0; }

double scheduled_lr(double peak, std::int64_t step, std::int64_t steps_per_epoch, const TrainOptions& o) {
  const auto updates = static_cast<double>(o.lr_updates_per_epoch);
  const double segment = std::floor(static_cast<double>(step) * updates / static_cast<double>(steps_per_epoch));
  const double epoch = (segment + 0.5) / updates;  // the segment's midpoint, in epochs
  if (epoch < o.warmup_epochs) return peak * epoch / o.warmup_epochs;
  const double t = std::min(1.0, (epoch - o.warmup_epochs) / (o.schedule_epochs - o.warmup_epochs));
  return peak * (kFinalLrFraction + (1 - kFinalLrFraction) * 0.5 * (1 + std::cos(std::numbers::pi * t)));
}

void train_to_target(State& state, const TargetPoint& p, const TrainOptions& o) {
  if (!(p.target_accuracy > 0 && p.target_accuracy <= 1))
    throw UsageError("target_accuracy must be in (0, 1] with a dataset (got " + number(p.target_accuracy) + ")");
  Run r;
  if (!state.artifact_dir().empty()) r.log = MlLog(state.artifact_dir() / "mllog.txt");
  r.init_start_s = measure::monotonic_seconds();
  r.log.start("init_start");
  init(state, p, o, r);
  log_hyperparameters(p, o, r, state.backend().info().name);
  // One forward and backward on a blank batch, no update, before any capture: kernels that pick an
  // algorithm by timing it (cuBLASLt's candidates) can only do so eagerly. No training data is
  // seen before run_start (MLPerf's rule); only the batch norms' running statistics move.
  if (p.use_graph) {
    for (const nn::Value v : {r.model.images, r.model.labels}) {  // zero bytes: 0.0 and label 0 in any dtype
      const Tensor t = r.graph->tensor(v);
      r.kernels->upload(t, std::vector<std::uint8_t>(static_cast<std::size_t>(t.size_bytes()), 0).data());
    }
    r.graph->forward();
    r.graph->backward();
  }
  r.kernels->synchronize();
  r.log.end("init_stop");
  r.run_start_s = measure::monotonic_seconds();
  r.log.start("run_start");
  Outcome outcome;
  try {
    outcome = train_epochs(state, p, o, r);
    r.kernels->synchronize();
  } catch (const std::exception& e) {
    // A failure in flight (a device error, a pipeline worker's): what was evaluated is kept.
    r.log.end("run_stop", nullptr, {{"status", "aborted"}});
    record(state, p, r, {"error", e.what()}, measure::monotonic_seconds());
    throw;
  }
  const double run_stop_s = measure::monotonic_seconds();
  r.log.end("run_stop", nullptr, {{"status", outcome.status == "converged" ? "success" : "aborted"}});
  record(state, p, r, outcome, run_stop_s);
  if (!o.save_weights.empty()) save_weights(o.save_weights, {r.spec.model, r.graph->parameter_values()});
  if (outcome.status == "diverged") throw Diverged{outcome.reason};
  if (outcome.status == "not_converged") {
    double best = 0;
    for (const Evaluation& e : r.curve) best = std::max(best, e.accuracy);
    const std::string best_text = r.curve.empty() ? "no evaluation made" : "best accuracy " + number(best);
    throw NotConverged{outcome.reason + "; " + best_text + " of target " + number(p.target_accuracy)};
  }
}

}  // namespace ab::workloads::zoo
