#include "workloads/models/train_to_target.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "dist/data_parallel/data_parallel.h"
#include "harness/ranks.h"
#include "measure/timer.h"
#include "nn/cuda/device_kernels.h"
#include "nn/optim.h"
#include "workloads/models/datasets.h"
#include "workloads/models/mllog.h"
#include "workloads/models/target_task.h"
#include "workloads/models/weights.h"

namespace ab::workloads::zoo {
namespace {

constexpr double kRecipeLrPer256 = 0.2;
constexpr double kFinalLrFraction = 0.01;
// The loss is read (a device synchronisation) every this many steps and at each epoch's end; the
// epoch's train loss is the mean of those reads.
constexpr std::int64_t kLossEvery = 10;

std::string number(double v) { return nlohmann::json(v).dump(); }

struct Evaluation {
  std::int64_t epoch = 0;
  double quality = 0, train_loss = 0, time_s = 0, lr = 0;
};

// How the run ended: converged, or why not.
struct Outcome {
  std::string status = "converged";  // converged, not_converged, diverged, interrupted
  std::string reason;
};

// Severities of the outcomes ranks agree on; the gravest of any rank's wins.
const std::vector<std::string>& outcome_order() {
  static const std::vector<std::string> order{"converged", "not_converged", "interrupted", "diverged"};
  return order;
}

struct Run {
  TargetModel m;
  dist::Comm* comm = nullptr;  // null: one process
  std::unique_ptr<dist::DataParallel> dp;
  std::unique_ptr<TargetTask> task;
  std::unique_ptr<nn::Replayable> captured;
  double captured_lr = -1;
  std::int64_t steps = 0;
  std::vector<Evaluation> curve;
  MlLog log;
  double init_start_s = 0, run_start_s = 0;

  // One optimizer step at `lr` on the batch already uploaded. A captured step keeps the rate it
  // was captured with, so a new rate recaptures it (after the replays in flight finish).
  void step(double lr, bool use_graph) {
    if (!use_graph) {
      m.opt->set_learning_rate(lr);
      m.graph->forward();
      m.graph->backward();
      m.graph->update(*m.opt);
      return;
    }
    if (lr != captured_lr) {
      m.kernels->synchronize();
      m.opt->set_learning_rate(lr);
      captured = m.graph->capture_step(m.opt.get());
      captured_lr = lr;
    }
    captured->replay();
  }
  const Quality& quality() const { return task->quality(); }
  int ranks() const { return comm != nullptr ? comm->size() : 1; }
  // Every rank's decision at a check point, the same on all (a rank that left the loop alone would
  // leave the others waiting in an all-reduce): the gravest of them, "converged" to go on.
  Outcome agree(const Outcome& mine) const {
    if (ranks() == 1) return mine;
    const auto& order = outcome_order();
    const auto code = static_cast<double>(std::find(order.begin(), order.end(), mine.status) - order.begin());
    const auto all = static_cast<std::size_t>(dist::max_over_ranks(*comm, code));
    if (static_cast<double>(all) == code) return mine;
    return {order[all], order[all] + " on another rank"};
  }
  // Rank 0's figure on every rank (evaluations: each rank evaluates the whole held-out split on the
  // same parameters; rank 0's result decides).
  double from_rank0(double value) const {
    if (ranks() == 1) return value;
    dist::Bytes bytes(sizeof value);
    std::memcpy(bytes.data(), &value, sizeof value);
    comm->broadcast(bytes, 0);
    std::memcpy(&value, bytes.data(), sizeof value);
    return value;
  }
  double best() const {
    double b = curve.front().quality;
    for (const Evaluation& e : curve) b = quality().better(b, e.quality);
    return b;
  }
};

void log_hyperparameters(const TargetPoint& p, const TrainOptions& o, Run& r, const std::string& platform) {
  MlLog& log = r.log;
  log.event("submission_benchmark", r.m.spec.model);
  log.event("submission_org", "accelbench");
  log.event("submission_division", "open");
  log.event("submission_status", "research");
  log.event("submission_platform", platform);
  log.event("seed", p.seed);
  log.event("global_batch_size", r.m.spec.batch * r.ranks());
  log.event("train_samples", r.task->train_samples());
  log.event("eval_samples", r.task->eval_samples());
  r.task->log_optimizer(log);
  log.event("opt_base_learning_rate", r.m.opt->learning_rate());
  log.event("opt_learning_rate_warmup_epochs", o.warmup_epochs);
  log.event("opt_learning_rate_decay_schedule", "cosine to 1% at epoch " + nlohmann::json(o.schedule_epochs).dump());
  // MLPerf's language models log their lower-is-better loss under the accuracy keys too.
  const Quality& q = r.quality();
  log.event("target_accuracy", q.target,
            q.higher_is_better ? nlohmann::json::object() : nlohmann::json{{"metric", q.name}});
}

// Where the run must stop after a step: Ctrl-C or the time limit, or "converged" to go on.
Outcome limits(const State& state, const TrainOptions& o, const Run& r, std::int64_t epoch) {
  const auto* cancel = state.cancel_flag();
  if (cancel != nullptr && cancel->load()) return {"interrupted", "interrupted in epoch " + std::to_string(epoch)};
  if (measure::monotonic_seconds() - r.run_start_s > o.time_limit_s)
    return {"not_converged",
            "time_limit_s (" + number(o.time_limit_s) + " s) passed in epoch " + std::to_string(epoch)};
  return {};
}

// One epoch of steps; false when the run must stop inside it (outcome says why). In one process
// the limits are checked after every step; data parallel, all ranks decide together at the loss reads.
bool train_epoch(State& state, const TargetPoint& p, const TrainOptions& o, Run& r, std::int64_t epoch, double peak,
                 double& loss_out, Outcome& outcome) {
  const std::int64_t per_epoch = r.task->steps_per_epoch();
  double loss_sum = 0;
  std::int64_t loss_reads = 0;
  for (std::int64_t i = 0; i < per_epoch; ++i) {
    r.task->upload_next_batch(*r.m.graph);
    r.step(scheduled_lr(peak, r.steps, per_epoch, o), p.use_graph);
    ++r.steps;
    const bool read = i % kLossEvery == kLossEvery - 1 || i == per_epoch - 1;
    if (!read && r.ranks() > 1) continue;
    Outcome now;
    if (read) {
      const double loss = r.m.graph->read(r.m.loss)[0];
      if (std::isfinite(loss)) {
        loss_sum += loss;
        ++loss_reads;
      } else {
        now = {"diverged", "training loss is " + std::to_string(loss) + " at step " + std::to_string(r.steps) +
                               " (epoch " + std::to_string(epoch) + ")"};
      }
    }
    if (now.status == "converged") now = limits(state, o, r, epoch);
    now = r.agree(now);
    if (now.status != "converged") {
      outcome = now;
      return false;
    }
  }
  // The epoch's train loss: each rank's is over its shard, their mean the global batch's.
  loss_out = loss_sum / static_cast<double>(std::max<std::int64_t>(loss_reads, 1));
  if (r.ranks() > 1) loss_out = dist::mean_over_training_ranks(*r.comm, r.ranks(), {loss_out})[0];
  return true;
}

// The epochs until the target, a stop condition, or a failure.
Outcome train_epochs(State& state, const TargetPoint& p, const TrainOptions& o, Run& r) {
  const double peak = r.m.opt->learning_rate();
  const Quality& q = r.quality();
  const nlohmann::json metric = q.higher_is_better ? nlohmann::json::object() : nlohmann::json{{"metric", q.name}};
  Outcome outcome;
  for (std::int64_t epoch = 1; epoch <= o.max_epochs; ++epoch) {
    r.log.start("epoch_start", nullptr, {{"epoch_num", epoch}});
    double loss = 0;
    const bool whole = train_epoch(state, p, o, r, epoch, peak, loss, outcome);
    r.log.end("epoch_stop", nullptr, {{"epoch_num", epoch}});
    if (!whole) return outcome;
    r.log.start("eval_start", nullptr, {{"epoch_num", epoch}});
    const double value = r.from_rank0(r.task->evaluate(*r.m.graph));
    r.log.end("eval_stop", nullptr, {{"epoch_num", epoch}});
    nlohmann::json meta = {{"epoch_num", epoch}};
    meta.update(metric);
    r.log.event("eval_accuracy", value, meta);
    r.curve.push_back({epoch, value, loss, measure::monotonic_seconds() - r.run_start_s, r.m.opt->learning_rate()});
    if (!std::isfinite(value))
      return {"diverged",
              "evaluation " + q.name + " is " + std::to_string(value) + " after epoch " + std::to_string(epoch)};
    if (q.reached(value)) return outcome;
    const bool late = measure::monotonic_seconds() - r.run_start_s > o.time_limit_s;
    const Outcome after = r.agree(late ? Outcome{"not_converged", "time_limit_s (" + number(o.time_limit_s) +
                                                                      " s) passed after epoch " + std::to_string(epoch)}
                                       : Outcome{});
    if (after.status != "converged") return after;
  }
  return {"not_converged", "max_epochs (" + std::to_string(o.max_epochs) + ") reached"};
}

nlohmann::json curve_json(const std::vector<Evaluation>& curve, const Quality& q) {
  nlohmann::json out = nlohmann::json::array();
  for (const Evaluation& e : curve)
    out.push_back(
        {{"epoch", e.epoch}, {q.name, e.quality}, {"train_loss", e.train_loss}, {"time_s", e.time_s}, {"lr", e.lr}});
  return out;
}

// The record's time_to_train block and the scenario window the runner takes the energy from.
void record(State& state, const TargetPoint& p, const Run& r, const Outcome& outcome, double run_stop_s) {
  const Quality& q = r.quality();
  const bool converged = outcome.status == "converged";
  nlohmann::json t = {
      {"status", outcome.status},
      {"target_" + q.name, q.target},
      {"seed", p.seed},
      {"epochs", r.curve.size()},
      {"best_" + q.name, r.curve.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.best())},
      {"final_" + q.name, r.curve.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.curve.back().quality)},
      {"init_s", r.run_start_s - r.init_start_s},
      {"run_s", run_stop_s - r.run_start_s},
      {"steps", r.steps},
      {"curve", curve_json(r.curve, q)}};
  if (converged) t["time_to_train_s"] = run_stop_s - r.run_start_s;
  if (!outcome.reason.empty()) t["stop_reason"] = outcome.reason;
  if (!r.log.path().empty()) t["mllog"] = r.log.path().filename().string();
  state.add_metric("time_to_train", t);
  ScenarioReport window;
  window.window_start_s = r.run_start_s;
  window.window_end_s = run_stop_s;
  window.samples = static_cast<double>(r.steps * r.m.spec.batch * r.ranks());
  window.samples_per_s = run_stop_s > r.run_start_s ? window.samples / (run_stop_s - r.run_start_s) : 0.0;
  window.interrupted = outcome.status == "interrupted";
  state.set_scenario_result(window);
}

// One forward and backward on a blank batch, no update, before any capture: kernels that pick an
// algorithm by timing it (cuBLASLt's candidates) can only do so eagerly. No training data is
// seen before run_start (MLPerf's rule); only the batch norms' running statistics move.
void blank_step(TargetModel& m) {
  for (const nn::Value v : m.inputs) {  // zero bytes: 0.0, label 0 and token 0 in any dtype
    const Tensor t = m.graph->tensor(v);
    m.kernels->upload(t, std::vector<std::uint8_t>(static_cast<std::size_t>(t.size_bytes()), 0).data());
  }
  m.graph->forward();
  m.graph->backward();
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

namespace {

// A launch of exactly gpus processes; host averaging (the CPU's) only with eager steps.
void check_launch(State& state, const TargetPoint& p) {
  const int world = p.comm != nullptr ? p.comm->size() : 1;
  if (world != p.gpus)
    state.skip("time to train with gpus=" + std::to_string(p.gpus) + " runs in a launch of exactly " +
               std::to_string(p.gpus) + " processes, one per GPU (mpirun -np " + std::to_string(p.gpus) +
               "); this launch has " + std::to_string(world));
  if (p.gpus > 1 && p.use_graph && state.backend().info().kind != "cuda")
    state.skip("data parallelism on " + state.backend().info().id +
               " averages through the host, which a captured step cannot hold: use graph=off");
}

// Data, model and (data parallel) the gradient averaging, every rank sharing the first failure.
void init_on_all_ranks(State& state, const TargetPoint& p, const TrainOptions& o, bool text, Run& r) {
  const auto init = [&] { r.task = text ? make_text_task(state, p, o, r.m) : make_image_task(state, p, o, r.m); };
  if (r.comm == nullptr) return init();
  harness::on_all_ranks(*r.comm, init);
  const auto bucket_bytes = std::max<std::int64_t>(1, std::llround(p.bucket_mib * 1024 * 1024));
  dist::DataParallelConfig config;
  config.gpus = r.ranks();
  config.bucket_bytes = bucket_bytes;
  harness::on_all_ranks(*r.comm, [&] {
    r.dp = std::make_unique<dist::DataParallel>(state.backend(), *r.comm, config);
    r.dp->attach(*r.m.graph, *r.m.kernels);
  });
  state.add_metric("data_parallel", {{"gpus", r.ranks()},
                                     {"batch_per_gpu", r.m.spec.batch},
                                     {"global_batch", r.m.spec.batch * r.ranks()},
                                     {"bucket_bytes", bucket_bytes},
                                     {"buckets", r.dp->bucket_count()},
                                     {"averaging", r.dp->describe()},
                                     {"evaluation", "every rank evaluates the whole split; rank 0's result decides"}});
}

}  // namespace

double Quality::better(double a, double b) const { return higher_is_better ? std::max(a, b) : std::min(a, b); }

void TargetModel::bind(State& state, nn::GraphBuilder builder, std::unique_ptr<nn::Optimizer> optimizer) {
  kernels = nn::make_device_kernels(state.backend());
  graph = std::make_unique<nn::Graph>(std::move(builder));
  opt = std::move(optimizer);
  graph->bind(*kernels);
  state.add_metric("model", {{"name", spec.model}, {"parameters", graph->parameter_count()}});
}

void train_to_target(State& state, const TargetPoint& p, const TrainOptions& o) {
  const bool text = is_text_dataset(p.dataset);
  if (!text && !(p.target_accuracy > 0 && p.target_accuracy <= 1))
    throw UsageError("target_accuracy must be in (0, 1] with an image dataset (got " + number(p.target_accuracy) + ")");
  if (text && (!(p.target_loss > 0) || !std::isfinite(p.target_loss)))
    throw UsageError("target_loss must be a finite loss > 0 (nats per token) with a text dataset (got " +
                     number(p.target_loss) + ")");
  check_launch(state, p);
  Run r;
  r.comm = p.ranks() > 1 ? p.comm : nullptr;
  if (!state.artifact_dir().empty() && p.rank() == 0) r.log = MlLog(state.artifact_dir() / "mllog.txt");
  r.init_start_s = measure::monotonic_seconds();
  r.log.start("init_start");
  init_on_all_ranks(state, p, o, text, r);
  log_hyperparameters(p, o, r, state.backend().info().name);
  if (p.use_graph) blank_step(r.m);
  r.m.kernels->synchronize();
  r.log.end("init_stop");
  r.run_start_s = measure::monotonic_seconds();
  r.log.start("run_start");
  Outcome outcome;
  try {
    outcome = train_epochs(state, p, o, r);
    r.m.kernels->synchronize();
  } catch (const std::exception& e) {
    // A failure in flight (a device error, a pipeline worker's): what was evaluated is kept.
    r.log.end("run_stop", nullptr, {{"status", "aborted"}});
    record(state, p, r, {"error", e.what()}, measure::monotonic_seconds());
    throw;
  }
  const double run_stop_s = measure::monotonic_seconds();
  r.log.end("run_stop", nullptr, {{"status", outcome.status == "converged" ? "success" : "aborted"}});
  record(state, p, r, outcome, run_stop_s);
  if (!o.save_weights.empty() && p.rank() == 0)
    save_weights(o.save_weights, {r.m.spec.model, r.m.graph->parameter_values()});
  if (outcome.status == "diverged") throw Diverged{outcome.reason};
  if (outcome.status == "not_converged") {
    const Quality& q = r.quality();
    const std::string best = r.curve.empty() ? "no evaluation made" : "best " + q.name + " " + number(r.best());
    throw NotConverged{outcome.reason + "; " + best + " of target " + number(q.target)};
  }
}

}  // namespace ab::workloads::zoo
