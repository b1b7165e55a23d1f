// train: one iteration = one training step (forward, backward, optimizer update) of a zoo model
// on a fixed synthetic batch, replayed as one captured graph where the axis asks. Before timing, a
// loss trajectory of `trajectory_steps` steps reads the loss after every step: a non-finite loss
// makes the point "diverged"; the compression autoencoder also records the PSNR of its
// reconstruction after the trajectory. With gpus > 1 (under a launcher) the ranks train data
// parallel (dist/data_parallel). docs/METHODOLOGY.md, "Training and inference".
// With a dataset axis (fashion-mnist; text:FILE for a GPT) the point trains to target_accuracy
// (target_loss) instead (train_to_target.h; docs/METHODOLOGY.md, "Time to train"); with an image dataset
// and target_accuracy=0, or an image folder (folder:DIR), the timed steps read real batches through the
// input pipeline (train_feed.h).
#include <cmath>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/data_parallel/data_parallel.h"
#include "nn/cuda/device_kernels.h"
#include "nn/optim.h"
#include "workloads/models/datasets.h"
#include "workloads/models/models.h"
#include "workloads/models/train_feed.h"
#include "workloads/models/train_options.h"
#include "workloads/models/train_to_target.h"

namespace ab::workloads::zoo {
namespace {

constexpr double kMomentum = 0.9;
constexpr double kSgdWeightDecay = 1e-4;   // torchvision's ResNet recipe
constexpr double kLarsWeightDecay = 5e-5;  // MLPerf's ResNet reference with LARS
constexpr double kLarsEta = 0.001;

// comm_engine's values: "auto" and the backend's engines.
std::vector<std::string> comm_engine_names() {
  std::vector<std::string> names{"auto"};
  for (const std::string& n : backend::averager_engine_names()) names.push_back(n);
  return names;
}

// The compression autoencoder's SGD rate. Its loss is a mean over pixels of small squared errors
// (about 0.02 at the start), so its gradients are orders of magnitude below a classifier's, and
// the classifiers' 0.1 x batch/256 barely moves it; Balle et al. train with Adam, which the
// engine lacks. 10 improved the tiny model on the reference kernels steadily (models_test); not
// tuned for the full-size model.
constexpr double kAutoencoderSgdLr = 10.0;

// The optimizer axis's "auto": AdamW for language models, SGD for the others.
std::string resolved_optimizer(const std::string& name, const ZooModel& m) {
  if (name != "auto") return name;
  return m.language ? "adamw" : "sgd";
}

// lr = 0 picks the recipe's rate: SGD 0.1 per 256 images (Goyal et al. 2017, linear scaling),
// LARS MLPerf's base rate of the order of 10 at batch 3072, scaled the same way; the autoencoder's
// SGD rate is kAutoencoderSgdLr at any batch (its loss is a mean over the batch's pixels); AdamW
// kAdamWLr.
std::unique_ptr<nn::Optimizer> make_optimizer(const std::string& name, double lr, std::int64_t batch,
                                              bool autoencoder) {
  const double per_256 = static_cast<double>(batch) / 256.0;
  if (name == "adamw")
    return std::make_unique<nn::AdamW>(lr > 0 ? lr : kAdamWLr, kAdamWBeta1, kAdamWBeta2, kAdamWEpsilon,
                                       kAdamWWeightDecay, kAdamWMaxGradNorm);
  if (name == "sgd")
    return std::make_unique<nn::Sgd>(lr > 0 ? lr : autoencoder ? kAutoencoderSgdLr : 0.1 * per_256, kMomentum,
                                     kSgdWeightDecay);
  if (name == "lars")
    return std::make_unique<nn::Lars>(lr > 0 ? lr : 0.8 * per_256, kMomentum, kLarsWeightDecay, kLarsEta);
  throw UsageError("unknown optimizer '" + name + "'; valid: auto, sgd, lars, adamw");
}

// The comm_dtype axis: grad (nullopt: the gradients' own dtype), bf16, fp16.
std::optional<DType> comm_wire_dtype(const std::string& name) {
  if (name == "grad") return std::nullopt;
  if (name == "bf16") return DType::bf16;
  if (name == "fp16") return DType::f16;
  throw UsageError("unknown comm_dtype '" + name + "'; valid: grad, bf16, fp16");
}

std::string text(double v) {
  if (std::isnan(v)) return "NaN";
  std::ostringstream o;
  o << v;
  return o.str();
}

// The point's axes beyond the model's, parsed once.
struct TrainPoint {
  ModelSpec asked;  // batch: per GPU (weak scaling) or global (strong)
  std::string optimizer, fuse, comm_dtype, comm_engine_text;
  std::optional<backend::AveragerEngine> comm_engine;  // nullopt: auto
  bool use_graph = true, profile = false, strong = false;
  std::int64_t gpus = 1;
  std::int64_t accumulate = 1;  // micro-batches per optimizer step
  double bucket_mib = 25;
};

TrainPoint parse_point(const State& state) {
  TrainPoint p;
  p.asked = model_spec(state, /*training=*/true);
  p.optimizer = state.get_text("optimizer");
  p.fuse = state.get_text("fuse");
  p.comm_dtype = state.get_text("comm_dtype");
  p.comm_engine_text = state.get_text("comm_engine");
  if (p.comm_engine_text != "auto") p.comm_engine = backend::parse_averager_engine(p.comm_engine_text);
  p.use_graph = state.get_text("graph") == "on";
  p.profile = state.get_text("profile") == "on";
  p.strong = state.get_text("scaling") == "strong";
  p.gpus = state.get_int("gpus");
  p.accumulate = state.get_int("accumulate");
  p.bucket_mib = state.get_real("bucket_mib");
  return p;
}

// The ranks of the launch and which of them train (0..gpus-1; the others idle through a scaling
// sweep's smaller points but take part in every collective call).
struct Ranks {
  dist::Comm& comm;
  std::int64_t gpus;
  int world() const { return comm.size(); }
  bool active() const { return comm.rank() < gpus; }
  // Runs `step` on the training ranks; every rank agrees on its outcome before the next collective.
  void together(const std::function<void()>& step) const {
    if (world() > 1)
      on_all_ranks(comm, [&] {
        if (active()) step();
      });
    else
      step();
  }
};

// Time to train (train_to_target.h), on one GPU or data parallel on gpus of them; of the
// synthetic mode's data-parallel axes only bucket_mib applies to it yet.
void run_to_target(State& state, const TrainPoint& p, const TrainOptions& o) {
  if (p.accumulate != 1) state.skip("time to train runs without accumulation (accumulate=1)");
  TargetPoint t{.spec = p.asked,
                .dataset = state.get_text("dataset"),
                .target_accuracy = state.get_real("target_accuracy"),
                .target_loss = state.get_real("target_loss"),
                .seed = static_cast<std::uint64_t>(state.get_int("seed")),
                .use_graph = p.use_graph,
                .gpus = p.gpus,
                .comm = &dist::world(),
                .bucket_mib = p.bucket_mib};
  t.spec.fuse_batchnorm_relu = p.fuse == "on" || (p.fuse == "auto" && !is_language_model(p.asked.model));
  t.spec.dropout = o.dropout;
  train_to_target(state, t, o);
}

// Why the point cannot run here, or "" (a launch too small, a data-parallel choice the backend
// has no way to run); each reason names what would run it.
std::string skip_reason(const backend::DeviceInfo& device, const TrainPoint& p, const TrainOptions& o, int world) {
  const std::string& kind = device.kind;
  const std::string& id = device.id;
  const bool dp = p.gpus > 1, host = kind != "cuda";
  const bool copy = p.comm_engine == backend::AveragerEngine::copy_engines;
  const std::string gpus = std::to_string(p.gpus);
  if (p.gpus > world)
    return "gpus=" + gpus + " needs " + gpus + " processes, one per GPU (mpirun -np " + gpus +
           " or srun); this launch has " + std::to_string(world);
  if (p.strong && p.asked.batch % p.gpus != 0)
    return "strong scaling splits batch=" + std::to_string(p.asked.batch) + " over gpus=" + gpus + ": not a multiple";
  if (dp && copy && host)
    return "comm_engine=copy copies between GPUs; data parallelism on " + id + " averages through the host";
  if (dp && copy && p.gpus != 2) return "comm_engine=copy averages between exactly 2 GPUs, not gpus=" + gpus;
  if (dp && o.comm_mean == "update" && host)
    return "comm_mean=update averages the copy engines' gradients in the update; data parallelism on " + id +
           " averages through the host";
  if (dp && o.comm_mean == "update" &&
      (p.comm_engine == backend::AveragerEngine::nccl || (!p.comm_engine && p.comm_dtype != "grad")))
    return "comm_mean=update averages in the update the two gradients the copy engines bring (comm_engine=copy "
           "or auto with comm_dtype=grad); comm_engine=" + p.comm_engine_text + " comm_dtype=" + p.comm_dtype +
           " averages with NCCL, which leaves the mean in place";
  if (dp && copy && p.comm_dtype != "grad")
    return "comm_engine=copy moves the gradients in their own dtype; comm_dtype=" + p.comm_dtype +
           " needs comm_engine=nccl";
  if (dp && p.use_graph && host)
    return "data parallelism on " + id + " averages through the host, which a captured step cannot hold: use graph=off";
  return "";
}

// What a rank trains with: the model and its data, the bound graph, the optimizer, the step.
struct Trainer {
  ModelSpec spec;                 // spec.batch: this rank's share of one micro-batch
  std::int64_t global_batch = 0;  // the samples one optimizer step trains on, over every rank and micro-batch
  std::unique_ptr<nn::Kernels> kernels;
  std::unique_ptr<nn::Graph> graph;
  std::unique_ptr<nn::Optimizer> opt;
  ZooModel model;
  std::unique_ptr<dist::DataParallel> dp;
  std::unique_ptr<nn::Replayable> captured;
  std::function<void()> step = [] {};  // the step as timed; idle ranks of a scaling sweep take no part
  std::unique_ptr<TrainFeed> feed;     // real data: each step's batch (null: the fixed synthetic batch)
  bool scaled() const { return spec.precision == Precision::fp16; }  // dynamic loss scaling
  void eager_step() {
    for (std::int64_t m = 0; m < graph->options().micro_batches; ++m) {
      graph->forward();
      graph->backward(m);
    }
    graph->update(*opt);
  }
};

class Train final : public Workload {
 public:
  std::string name() const override { return "train"; }
  std::string description() const override {
    return "Training throughput of a ResNet / ResNeXt, the image-compression autoencoder or GPT-2 (images or "
           "sequences/s, tokens/s, TFLOP/s of forward + backward + update, % of the "
           "measured GEMM ceiling of the precision): one step per iteration on a fixed synthetic batch, or with "
           "dataset=folder:DIR (or a dataset and target_accuracy=0) on a new batch each step from the input pipeline "
           "(record: feed), CUDA-graph replay by default; a loss trajectory is read first (NaN/Inf: status diverged; "
           "the autoencoder adds the PSNR of its reconstruction after it). profile=on writes a per-op table (time, "
           "FLOPs, bytes) to the point's artifacts. dataset=fashion-mnist: time to train to "
           "target_accuracy (MLPerf's rules: epochs with an evaluation after each, time from run start to the "
           "evaluation that reaches it, energy, the accuracy curve, an MLPerf log in the artifacts; not_converged "
           "when max_epochs or time_limit_s ends it); dataset=text:FILE: a GPT's time to train to target_loss.";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override;
  std::vector<OptionSpec> options() const override { return TrainOptions::specs(); }
  std::string scaling_axis() const override { return "gpus"; }
  bool has_counter_pass() const override { return true; }

  void run(State& state) override {
    const TrainPoint p = parse_point(state);
    add_layout_metric(state, p.asked);
    const TrainOptions o = TrainOptions::from(state);
    validate(state, p, o);
    const std::string dataset = state.get_text("dataset");
    if (trains_to_target(dataset, state.get_real("target_accuracy"))) return run_to_target(state, p, o);
    const Ranks ranks{dist::world(), p.gpus};
    if (const std::string why = skip_reason(state.backend().info(), p, o, ranks.world()); !why.empty()) state.skip(why);
    const bool fed = is_real_dataset(dataset);
    if (fed && (p.gpus != 1 || ranks.world() != 1 || p.accumulate != 1))
      state.skip(
          "training from a dataset's batches runs on one GPU in one process without accumulation (gpus=1, "
          "accumulate=1)");
    Trainer t;
    build(state, p, o, ranks, t);
    if (fed)
      t.feed = make_train_feed(state, dataset, o, static_cast<std::uint64_t>(state.get_int("seed")), *t.graph, t.model,
                               t.spec);
    if (p.gpus > 1) attach_data_parallel(state, p, o, ranks, t);
    run_trajectory(state, p, o, ranks, t);
    time_steps(state, o, ranks, t);
    check_and_profile(state, p, ranks, t);
  }

 private:
  static void validate(const State& state, const TrainPoint& p, const TrainOptions& o) {
    o.validate();
    if (p.asked.batch < 1 || p.asked.image_px < 1 || p.asked.seq < 0 || p.gpus < 1 || p.accumulate < 1 ||
        !(p.bucket_mib > 0) || !std::isfinite(p.bucket_mib))
      throw UsageError("train needs batch, image_size, gpus, accumulate >= 1, seq >= 0 and bucket_mib > 0 (got " +
                       state.point().label() + ")");
  }

  // Build and plan first (no memory): a layer that does not fit this image size fails here,
  // naming the layer, and the counts are known before anything is allocated. Then bind and upload
  // this rank's slice of one global batch (samples rank * batch on), which every step trains on.
  static void build(State& state, const TrainPoint& p, const TrainOptions& o, const Ranks& ranks, Trainer& t) {
    t.spec = p.asked;
    const bool has_batchnorm = !is_compression_model(t.spec.model) && !is_language_model(t.spec.model);
    t.spec.fuse_batchnorm_relu = p.fuse == "on" || (p.fuse == "auto" && has_batchnorm);
    t.spec.dropout = o.dropout;
    if (p.strong) t.spec.batch = p.asked.batch / p.gpus;
    t.global_batch = t.spec.batch * p.gpus * p.accumulate;
    ranks.together([&] {
      nn::GraphOptions options = graph_options(t.spec);
      options.micro_batches = p.accumulate;
      nn::GraphBuilder builder(options);
      t.model = build_zoo_model(builder, t.spec);
      // Kernels before the graph and optimizer: their memory comes from its allocator.
      t.kernels = nn::make_device_kernels(state.backend());
      t.graph = std::make_unique<nn::Graph>(std::move(builder));
      t.opt = make_optimizer(resolved_optimizer(p.optimizer, t.model), o.lr, t.global_batch, t.model.compression);
      set_counts_and_plan_metrics(state, *t.graph, *t.opt, t.spec, p.gpus, p.accumulate);
      state.add_metric("optimizer", std::string(t.opt->name()));
      state.add_metric("learning_rate", t.opt->learning_rate());
      t.graph->bind(*t.kernels);
      upload_batch(*t.graph, t.model, static_cast<std::uint64_t>(ranks.comm.rank() * t.spec.batch), t.spec);
    });
  }

  // Every rank of the launch takes part in creating the communicator; the training ranks attach.
  static void attach_data_parallel(State& state, const TrainPoint& p, const TrainOptions& o, const Ranks& ranks,
                                   Trainer& t) {
    const bool update_can_mean = p.optimizer == "sgd" && t.spec.precision != Precision::fp16;
    const auto bucket_bytes = std::max<std::int64_t>(1, std::llround(p.bucket_mib * 1024 * 1024));
    const dist::DataParallelConfig config{
        .gpus = static_cast<int>(p.gpus),
        .bucket_bytes = bucket_bytes,
        .tail_bucket_bytes = std::min<std::int64_t>(bucket_bytes, std::llround(o.tail_bucket_mib * 1024 * 1024)),
        .wire_dtype = comm_wire_dtype(p.comm_dtype),
        .engine = p.comm_engine,
        .mean_in_update = o.comm_mean == "auto" ? std::nullopt : std::optional<bool>(o.comm_mean == "update"),
        .update_can_mean = update_can_mean};
    on_all_ranks(ranks.comm, [&] { t.dp = std::make_unique<dist::DataParallel>(state.backend(), ranks.comm, config); });
    ranks.together([&] {
      if (o.comm_mean == "update" && !update_can_mean)
        throw UsageError("comm_mean=update needs optimizer=sgd without fp16 loss scaling (its check reads the "
                         "averaged gradients); use comm_mean=kernel");
      t.dp->attach(*t.graph, *t.kernels);
      state.add_metric("data_parallel", {{"gpus", p.gpus},
                                         {"processes", ranks.world()},
                                         {"scaling", p.strong ? "strong" : "weak"},
                                         {"batch_per_gpu", t.spec.batch},
                                         {"global_batch", t.global_batch},
                                         {"bucket_bytes", config.bucket_bytes},
                                         {"tail_bucket_bytes", config.tail_bucket_bytes},
                                         {"comm_dtype", p.comm_dtype},
                                         {"wire_dtype", std::string(to_string(t.dp->wire_dtype()))},
                                         {"allreduce_bytes_per_step", t.dp->allreduce_bytes_per_step()},
                                         {"buckets", t.dp->bucket_count()},
                                         {"averaging", t.dp->describe()},
                                         {"averaging_fallback", t.dp->averaging_fallback()}});
    });
  }

  // The step as timed (captured once: capture_step binds the optimizer first, so replays allocate
  // nothing; or launched op by op), then `trajectory_steps` of it with the loss read after each.
  // Every step runs on every training rank (a rank that stopped early would leave the others
  // waiting in an all-reduce); the first non-finite loss is reported after.
  static void run_trajectory(State& state, const TrainPoint& p, const TrainOptions& o, const Ranks& ranks, Trainer& t) {
    ranks.together([&] {
      // One forward and backward first, outside any capture and changing no parameter: kernels
      // that choose an algorithm by timing it at a shape's first call (cuBLASLt's candidates) can
      // only do so eagerly. Both step modes run it, so their trajectories stay equal.
      t.graph->forward();
      t.graph->backward();
      if (p.use_graph) t.captured = t.graph->capture_step(t.opt.get());
      t.step = p.use_graph ? std::function<void()>([&t] { t.captured->replay(); })
                           : std::function<void()>([&t] { t.eager_step(); });
      if (t.feed)
        t.step = [&t, run = t.step] {  // the batch's copy is timed with its step
          t.feed->next();
          run();
        };
    });
    std::vector<double> losses;
    double mse = 0;
    ranks.together([&] {
      std::int64_t skipped = 0;
      if (t.scaled()) state.add_metric("steps_skipped", skipped);
      std::string bad;
      for (std::int64_t i = 0; i < o.trajectory_steps; ++i) {
        t.step();
        const double loss = t.graph->read(t.model.loss)[0];
        losses.push_back(loss);
        if (t.scaled() && t.graph->last_step_skipped()) ++skipped;
        if (!std::isfinite(loss) && bad.empty())
          bad = "loss is " + text(loss) + " in the loss trajectory (step " + std::to_string(i + 1) + ")";
      }
      state.add_metric("loss_trajectory", losses);
      if (t.scaled()) state.add_metric("steps_skipped", skipped);
      if (!bad.empty()) throw Diverged{bad};
      // The distortion of the last trajectory step's reconstruction (before that step's update).
      if (t.model.compression) mse = t.graph->read(t.model.mse)[0];
      if (t.scaled()) state.add_metric("loss_scale_after_trajectory", t.graph->loss_scale());
      state.add_metric("device_bytes_peak", t.kernels->allocator().peak_bytes());
      add_fusion_metric(state, t.spec, *t.kernels);  // after steps ran: a refusal at a first call counts
    });
    // The global batch's figures: each training rank's loss (and distortion) is a mean over its
    // share of the batch, so their mean is what one GPU reports for the whole batch, and a scaling
    // sweep's trajectories compare across GPU counts. Every rank takes part; idle ones send none.
    if (ranks.world() > 1) {
      losses.push_back(mse);
      losses = dist::mean_over_training_ranks(ranks.comm, static_cast<int>(p.gpus),
                                              ranks.active() ? losses : std::vector<double>{});
      mse = losses.back();
      losses.pop_back();
      state.add_metric("loss_trajectory", losses);
    }
    state.add_metric("loss_first", losses.front());
    state.add_metric("loss_last", losses.back());
    if (t.model.compression) {
      const nlohmann::json q = reconstruction_quality(mse);
      state.add_metric("mse", q["mse"]);
      state.add_metric("psnr_db", q["psnr_db"]);
    }
  }

  // Harness-timed (lock step under a launcher); each sample holds at least steps_per_sample steps.
  static void time_steps(State& state, const TrainOptions& o, const Ranks& ranks, Trainer& t) {
    measure::Settings settings = state.settings();
    settings.min_iterations_per_sample = o.steps_per_sample_on(state.backend().info().kind);
    if (t.feed) t.feed->start_window();
    state.exec(t.step, settings, static_cast<int>(ranks.gpus));
    if (t.feed) t.feed->record(state);
  }

  static void check_and_profile(State& state, const TrainPoint& p, const Ranks& ranks, Trainer& t) {
    ranks.together([&] {
      const double final_loss = t.graph->read(t.model.loss)[0];
      state.add_metric("loss_after_timing", final_loss);
      if (t.scaled()) state.add_metric("loss_scale_after_timing", t.graph->loss_scale());
      if (!std::isfinite(final_loss)) throw Diverged{"loss is " + text(final_loss) + " after the timed steps"};
      const OpCounterBytes measured = count_step(state, ranks, t);
      if (p.profile) {
        t.graph->set_profiling(true);
        t.eager_step();
        t.graph->set_profiling(false);
        state.add_metric("profile", write_op_profile(t.graph->report(), state.artifact_dir(),
                                                     measured.empty() ? nullptr : &measured));
      }
    });
  }

  // One eager step with each op a range and the update one more. In one process only: the
  // profiler's replays of a rank's step would have to meet the other ranks' collectives.
  static OpCounterBytes count_step(State& state, const Ranks& ranks, Trainer& t) {
    if (ranks.world() > 1) {
      state.counters_unavailable("counters are read in a one-process run (this launch has " +
                                 std::to_string(ranks.world()) + " ranks)");
      return {};
    }
    const auto ops = [&t] {
      for (std::int64_t m = 0; m < t.graph->options().micro_batches; ++m) {
        t.graph->forward();
        t.graph->backward(m);
      }
    };
    return measure_op_counters(state, *t.graph, ops, [&t] { t.graph->update(*t.opt); });
  }

  static void set_counts_and_plan_metrics(State& state, const nn::Graph& g, const nn::Optimizer& opt,
                                          const ModelSpec& spec, std::int64_t gpus, std::int64_t accumulate) {
    const std::int64_t params = g.parameter_count();
    const auto micros = static_cast<double>(accumulate);
    double pass_bytes = 0;
    for (const auto& op : g.report()) pass_bytes += static_cast<double>(op.forward_bytes + op.backward_bytes);
    // fp32 master weights, gradients, moments once a step; each micro-batch's forward and backward.
    const double bytes = static_cast<double>(opt.bytes(params, 4)) + pass_bytes * micros;
    const auto fwd = static_cast<double>(g.forward_flops()), bwd = static_cast<double>(g.backward_flops());
    const auto batch = static_cast<double>(spec.batch), ranks = static_cast<double>(gpus);
    // An iteration is one step of every rank: the global batch's samples, FLOPs and bytes.
    const double samples = batch * ranks * micros;
    const double tokens = is_language_model(spec.model) ? samples * static_cast<double>(spec.seq) : 0.0;
    state.set_counts({samples, ((fwd + bwd) * micros + static_cast<double>(opt.flops(params))) * ranks, bytes * ranks,
                      "FLOP", tokens});
    // The ceiling is one GPU's: only a one-GPU point is placed against it.
    if (gpus == 1) state.set_ceiling_key("gemm." + std::string(to_string(spec.precision)));
    const auto& plan = g.memory_plan();
    state.add_metric("model", {{"name", spec.model}, {"parameters", params}, {"ops", g.op_count()}});
    state.add_metric("gflops_per_sample", {{"forward", fwd / batch / 1e9}, {"backward", bwd / batch / 1e9},
                                           {"optimizer", static_cast<double>(opt.flops(params)) / batch / 1e9}});
    state.add_metric("memory_plan", {{"arena_bytes", plan.peak_bytes}, {"live_bound_bytes", plan.live_bound_bytes},
                                     {"no_reuse_bytes", plan.total_bytes}});
  }
};

std::vector<AxisSpec> Train::axes(const std::string& device_kind) const {
  const auto one = [](const char* v) { return std::vector<std::string>{v}; };
  std::vector<AxisSpec> axes = model_axes(
      device_kind, {.cuda_batches = {"256"},
                    .host_batches = {"16"},
                    .batch_help = "images (or sequences) per step",
                    .cuda_precision = "bf16",
                    .precision_help = "fp32, tf32 (fp32 storage, TF32 math), bf16 / fp16 (fp32 master weights; "
                                      "fp16 with dynamic loss scaling); fp8 is inference only (infer)",
                    .precisions = model_precisions()});
  axes.insert(
      axes.end(),
      {{"optimizer",
        AxisKind::text,
        one("auto"),
        {"auto", "sgd", "lars", "adamw"},
        "SGD with momentum, LARS (MLPerf's ResNet), or AdamW (GPT-2's, gradient norm clipped to 1); auto = AdamW "
        "for language models, else SGD"},
       {"accumulate",
        AxisKind::integer,
        one("1"),
        {},
        "micro-batches per optimizer step (gradient accumulation): each forward and backward runs `batch` samples "
        "(per GPU), the update steps once on the mean of their gradients, so a step trains on batch x accumulate "
        "(x gpus) samples"},
       {"graph", AxisKind::text, one("on"), {"on", "off"}, "replay the step as one captured graph (CUDA graph)"},
       // auto: on for the ResNets (checked on an H200 and faster there, bench/HISTORY.md), off for
       // models without batch norm, which refuse an explicit on.
       {"fuse",
        AxisKind::text,
        one("auto"),
        {"auto", "off", "on"},
        "ResNets: each batch norm, the residual add and the ReLU after it as one op (cuDNN's fused NHWC "
        "16-bit kernels where it takes them); auto = on for models with batch norm"},
       {"profile", AxisKind::text, one("off"), {"off", "on"}, "per-op times after timing (slower step)"},
       {"gpus",
        AxisKind::integer,
        one("1"),
        {},
        "data-parallel GPUs, one process each (under mpirun/srun; gpus=k trains on ranks 0..k-1)"},
       {"scaling",
        AxisKind::text,
        one("weak"),
        {"weak", "strong"},
        "weak: batch is per GPU; strong: batch is global, split over the GPUs"},
       {"bucket_mib",
        AxisKind::real,
        one("25"),
        {},
        "data parallelism: gradient all-reduce bucket size (MiB; DDP's 25)"},
       {"comm_dtype",
        AxisKind::text,
        one("grad"),
        {"grad", "bf16", "fp16"},
        "data parallelism: the dtype the gradients are all-reduced in; grad = their own (f32), bf16 / fp16 = "
        "each bucket cast to it and back (PyTorch DDP's bf16/fp16_compress_hook)"},
       {"comm_engine", AxisKind::text, one("auto"), comm_engine_names(),
        "data parallelism on GPUs: nccl = NCCL all-reduces; copy = 2 GPUs of one host, each copying the other's "
        "buckets with a copy engine and averaging them in with one short kernel (no kernel waits for the peer); "
        "auto = copy where it applies (gpus=2, comm_dtype=grad, one host), else nccl"},
       {"dataset",
        AxisKind::text,
        one(kSyntheticDataset),
        {},
        "synthetic = one fixed batch, timed steps (throughput); fashion-mnist or idx:DIR = time to train: epochs "
        "over the training split with an evaluation after each until target_accuracy (image_size is the data's); "
        "folder:DIR (a subfolder of JPEG/PNG files per class), or an image dataset with target_accuracy=0 = timed "
        "steps on batches from the input pipeline (--option decoder=cpu|nvjpeg, data_threads); text:FILE (each "
        "byte a token) or tokens:FILE (uint16) = a GPT's time to train to target_loss on the file's last 10% "
        "held out"},
       {"target_accuracy",
        AxisKind::real,
        one("0.92"),
        {},
        "with a dataset: the top-1 accuracy on the held-out split that ends the run (MLPerf's quality target); "
        "0 = the throughput mode on the dataset's batches; not used by the synthetic mode or folder:DIR"},
       {"target_loss",
        AxisKind::real,
        one("1.5"),
        {},
        "with text:FILE or tokens:FILE: the mean cross-entropy (nats per token) on the held-out tail that ends "
        "the run; not used by the synthetic mode"},
       {"seed",
        AxisKind::integer,
        one("1"),
        {},
        "with a dataset: sample order and augmentation (time to train: also parameter initialisation); seed=1:5 "
        "repeats for MLPerf's olympic mean of the time to train"}});
  return axes;
}

}  // namespace

std::unique_ptr<Workload> make_train() { return std::make_unique<Train>(); }

}  // namespace ab::workloads::zoo
