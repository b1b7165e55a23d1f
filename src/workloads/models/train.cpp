// train: one iteration = one training step (forward, backward, optimizer update) of a zoo model
// on a fixed synthetic batch, replayed as one captured graph where the axis asks. Before timing, a
// loss trajectory of `trajectory_steps` steps reads the loss after every step: a non-finite loss
// makes the point "diverged"; the compression autoencoder also records the PSNR of its
// reconstruction after the trajectory. docs/METHODOLOGY.md, "Training and inference".
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/lockstep.h"
#include "nn/cuda/device_kernels.h"
#include "nn/optim.h"
#include "workloads/models/models.h"

namespace ab::workloads::zoo {
namespace {

constexpr double kMomentum = 0.9;
constexpr double kSgdWeightDecay = 1e-4;   // torchvision's ResNet recipe
constexpr double kLarsWeightDecay = 5e-5;  // MLPerf's ResNet reference with LARS
constexpr double kLarsEta = 0.001;
constexpr std::int64_t kMaxCommCtas = 64;  // NCCL's channel limit (MAXCHANNELS)
constexpr std::int64_t kMaxBucketDelayOps = 1000;
// On a GPU a timed sample holds at least this many back-to-back steps, as a training loop runs
// them and as bench/compare_ddp.py times PyTorch: one step per sample would time each graph
// launch's host latency, and under a launcher every sample's start skew between the ranks.
constexpr std::int64_t kGpuStepsPerSample = 5;
constexpr std::int64_t kMaxStepsPerSample = 1000;

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

// Element-wise mean of the training ranks' vectors (ranks 0..gpus-1; idle ranks pass none), summed
// in rank order so that every rank gets the same bits.
std::vector<double> mean_over_training_ranks(dist::Comm& comm, std::int64_t gpus, const std::vector<double>& mine) {
  dist::Packer out;
  out.put(static_cast<std::int64_t>(mine.size()));
  for (const double v : mine) out.put(v);
  const std::vector<dist::Bytes> all = comm.allgather(out.bytes());
  std::vector<double> sum;
  for (std::size_t r = 0; r < static_cast<std::size_t>(gpus); ++r) {
    dist::Unpacker in(all[r]);
    const auto n = static_cast<std::size_t>(in.get_int());
    if (r == 0) sum.assign(n, 0.0);
    if (n != sum.size()) throw Error("data parallelism: the ranks' loss trajectories differ in length");
    for (double& v : sum) v += in.get_double();
  }
  for (double& v : sum) v /= static_cast<double>(gpus);
  return sum;
}

// lr = 0 picks the recipe's rate: SGD 0.1 per 256 images (Goyal et al. 2017, linear scaling),
// LARS MLPerf's base rate of the order of 10 at batch 3072, scaled the same way; the autoencoder's
// SGD rate is kAutoencoderSgdLr at any batch (its loss is a mean over the batch's pixels).
std::unique_ptr<nn::Optimizer> make_optimizer(const std::string& name, double lr, std::int64_t batch,
                                              bool autoencoder) {
  const double per_256 = static_cast<double>(batch) / 256.0;
  if (name == "sgd")
    return std::make_unique<nn::Sgd>(lr > 0 ? lr : autoencoder ? kAutoencoderSgdLr : 0.1 * per_256, kMomentum,
                                     kSgdWeightDecay);
  if (name == "lars")
    return std::make_unique<nn::Lars>(lr > 0 ? lr : 0.8 * per_256, kMomentum, kLarsWeightDecay, kLarsEta);
  throw UsageError("unknown optimizer '" + name + "'; valid: sgd, lars");
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

class Train final : public Workload {
 public:
  std::string name() const override { return "train"; }
  std::string description() const override {
    return "Training throughput of a ResNet / ResNeXt or the image-compression autoencoder (images/s, TFLOP/s of forward + backward + update, % of the "
           "measured GEMM ceiling of the precision): one step per iteration on a fixed synthetic batch, CUDA-graph "
           "replay by default; a loss trajectory is read first (NaN/Inf: status diverged; the autoencoder adds the "
           "PSNR of its reconstruction after it). profile=on writes a "
           "per-op table (time, FLOPs, bytes) to the point's artifacts.";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    const auto one = [](const char* v) { return std::vector<std::string>{v}; };
    std::vector<AxisSpec> axes = model_axes(
        device_kind, {.cuda_batches = {"256"},
                      .host_batches = {"16"},
                      .batch_help = "images per step",
                      .cuda_precision = "bf16",
                      .precision_help = "fp32, tf32 (fp32 storage, TF32 math), bf16 / fp16 (fp32 master weights; "
                                        "fp16 with dynamic loss scaling); fp8 is inference only (infer)",
                      .precisions = model_precisions()});
    axes.insert(
        axes.end(),
        {{"optimizer", AxisKind::text, one("sgd"), {"sgd", "lars"}, "SGD with momentum, or LARS (MLPerf)"},
         {"lr", AxisKind::real, one("0"), {},
          "learning rate; 0 = sgd 0.1 x batch/256 (autoencoders: 10), lars 0.8 x batch/256"},
         {"graph", AxisKind::text, one("on"), {"on", "off"}, "replay the step as one captured graph (CUDA graph)"},
         // auto: on for the ResNets (checked on an H200 and faster there, bench/HISTORY.md), off for
         // models without batch norm, which refuse an explicit on.
         {"fuse", AxisKind::text, one("auto"), {"auto", "off", "on"},
          "ResNets: each batch norm, the residual add and the ReLU after it as one op (cuDNN's fused NHWC "
          "16-bit kernels where it takes them); auto = on for models with batch norm"},
         {"trajectory_steps", AxisKind::integer, one("30"), {}, "steps whose loss is read before timing"},
         {"steps_per_sample", AxisKind::integer, one("0"), {},
          "back-to-back steps in each timed sample, at least (0: " + std::to_string(kGpuStepsPerSample) +
              " on GPUs, 1 elsewhere; more when a step is shorter than the sample target)"},
         {"profile", AxisKind::text, one("off"), {"off", "on"}, "per-op times after timing (slower step)"},
         {"gpus", AxisKind::integer, one("1"), {},
          "data-parallel GPUs, one process each (under mpirun/srun; gpus=k trains on ranks 0..k-1)"},
         {"scaling", AxisKind::text, one("weak"), {"weak", "strong"},
          "weak: batch is per GPU; strong: batch is global, split over the GPUs"},
         {"bucket_mib", AxisKind::real, one("25"), {}, "data parallelism: gradient all-reduce bucket size (MiB; DDP's 25)"},
         // 1 MiB: in a traced 2-GPU ResNet-50 step the last copy shrank from 17 MB to 1.6 MB and the
         // step's growth over one GPU from 0.41 to 0.27 ms (bench/HISTORY.md).
         {"tail_bucket_mib", AxisKind::real, one("1"), {},
          "data parallelism: the first layers' gradients (backward's last) in a bucket of their own of at least "
          "this many MiB (at most bucket_mib), so that little is left to average after backward (0: none; the "
          "bucket_mib walk's remainder)"},
         {"bucket_delay_ops", AxisKind::integer, one("0"), {},
          "data parallelism: ops whose backward is enqueued after a bucket completes before its all-reduce is (on "
          "an H200 an all-reduce enqueued just before a batch norm holds back cuDNN's cooperative kernel)"},
         {"comm_ctas", AxisKind::integer, one("0"), {},
          "data parallelism on GPUs: most SMs an all-reduce may occupy (NCCL maxCTAs; 0 = NCCL's choice), "
          "leaving the rest to the backward pass it overlaps"},
         {"comm_priority", AxisKind::text, one("normal"), {"normal", "high"},
          "data parallelism on GPUs: the all-reduces' stream priority (high: their blocks take SMs ahead of "
          "queued backward kernels)"},
         {"cooperative_kernels", AxisKind::text, one("on"), {"on", "off"},
          "on GPUs: off = no kernel that needs every SM at once (cuDNN's persistent batch norm; the project's "
          "NHWC kernels instead), which an all-reduce running beside it would hold back"},
         {"comm_dtype", AxisKind::text, one("grad"), {"grad", "bf16", "fp16"},
          "data parallelism: the dtype the gradients are all-reduced in; grad = their own (f32), bf16 / fp16 = "
          "each bucket cast to it and back (PyTorch DDP's bf16/fp16_compress_hook)"},
         {"comm_engine", AxisKind::text, one("auto"), comm_engine_names(),
          "data parallelism on GPUs: nccl = NCCL all-reduces; copy = 2 GPUs of one host, each copying the other's "
          "buckets with a copy engine and averaging them in with one short kernel (no kernel waits for the peer); "
          "auto = copy where it applies (gpus=2, comm_dtype=grad, one host), else nccl"},
         {"comm_mean", AxisKind::text, one("auto"), {"auto", "kernel", "update"},
          "data parallelism with copy engines: where the two ranks' gradients are averaged; kernel = a mean kernel "
          "per bucket beside backward, update = inside the SGD update (one pass less over the gradients); auto = "
          "update for sgd without fp16 loss scaling, else kernel"}});
    return axes;
  }

  void run(State& state) override {
    const ModelSpec asked = model_spec(state, /*training=*/true);
    const double lr = state.get_real("lr");
    const std::int64_t trajectory_steps = state.get_int("trajectory_steps"), gpus = state.get_int("gpus");
    const std::int64_t steps_per_sample = state.get_int("steps_per_sample");
    const double bucket_mib = state.get_real("bucket_mib"), tail_bucket_mib = state.get_real("tail_bucket_mib");
    const std::int64_t comm_ctas = state.get_int("comm_ctas"), bucket_delay_ops = state.get_int("bucket_delay_ops");
    const bool comm_high_priority = state.get_text("comm_priority") == "high";
    const std::string comm_dtype = state.get_text("comm_dtype");
    const std::string comm_engine_text = state.get_text("comm_engine");
    const std::optional<backend::AveragerEngine> comm_engine =
        comm_engine_text == "auto" ? std::nullopt : std::optional(backend::parse_averager_engine(comm_engine_text));
    const bool copy_engines = comm_engine == backend::AveragerEngine::copy_engines;
    const std::string comm_mean = state.get_text("comm_mean");
    const bool cooperative = state.get_text("cooperative_kernels") == "on";
    const bool use_graph = state.get_text("graph") == "on", profile = state.get_text("profile") == "on";
    const bool strong = state.get_text("scaling") == "strong";
    if (asked.batch < 1 || asked.image_px < 1 || trajectory_steps < 1 || !(lr >= 0) || !std::isfinite(lr) ||
        gpus < 1 || !(bucket_mib > 0) || !std::isfinite(bucket_mib) || !(tail_bucket_mib >= 0) ||
        !std::isfinite(tail_bucket_mib) || steps_per_sample < 0 || steps_per_sample > kMaxStepsPerSample ||
        comm_ctas < 0 || comm_ctas > kMaxCommCtas || bucket_delay_ops < 0 || bucket_delay_ops > kMaxBucketDelayOps)
      throw UsageError("train needs batch, image_size, trajectory_steps, gpus >= 1, bucket_mib > 0, tail_bucket_mib >= 0, "
                       "steps_per_sample in 0.." + std::to_string(kMaxStepsPerSample) + ", bucket_delay_ops in 0.." +
                       std::to_string(kMaxBucketDelayOps) + ", comm_ctas in 0.." + std::to_string(kMaxCommCtas) +
                       " and a finite lr >= 0 (got " + state.point().label() + ")");
    dist::Comm& comm = dist::world();
    const int world = comm.size(), rank = comm.rank();
    if (gpus > world)
      state.skip("gpus=" + std::to_string(gpus) + " needs " + std::to_string(gpus) + " processes, one per GPU (mpirun -np " +
                 std::to_string(gpus) + " or srun); this launch has " + std::to_string(world));
    if (strong && asked.batch % gpus != 0)
      state.skip("strong scaling splits batch=" + std::to_string(asked.batch) + " over gpus=" + std::to_string(gpus) +
                 ": not a multiple");
    if (gpus > 1 && (comm_ctas > 0 || comm_high_priority) && state.backend().info().kind != "cuda")
      state.skip("comm_ctas and comm_priority set NCCL's communicator and stream; data parallelism on " +
                 state.backend().info().id + " averages through the host");
    if (gpus > 1 && copy_engines && state.backend().info().kind != "cuda")
      state.skip("comm_engine=copy copies between GPUs; data parallelism on " + state.backend().info().id +
                 " averages through the host");
    if (gpus > 1 && copy_engines && gpus != 2)
      state.skip("comm_engine=copy averages between exactly 2 GPUs, not gpus=" + std::to_string(gpus));
    if (gpus > 1 && comm_mean == "update" && state.backend().info().kind != "cuda")
      state.skip("comm_mean=update averages the copy engines' gradients in the update; data parallelism on " +
                 state.backend().info().id + " averages through the host");
    if (gpus > 1 && comm_mean == "update" &&
        (comm_engine == backend::AveragerEngine::nccl || (!comm_engine && comm_dtype != "grad")))
      state.skip("comm_mean=update averages in the update the two gradients the copy engines bring (comm_engine=copy "
                 "or auto with comm_dtype=grad); comm_engine=" + comm_engine_text + " comm_dtype=" + comm_dtype +
                 " averages with NCCL, which leaves the mean in place");
    if (gpus > 1 && copy_engines && comm_dtype != "grad")
      state.skip("comm_engine=copy moves the gradients in their own dtype; comm_dtype=" + comm_dtype + " needs comm_engine=nccl");
    if (!cooperative && state.backend().info().kind != "cuda")
      state.skip("cooperative_kernels=off chooses among the CUDA engine's batch-norm kernels; " +
                 state.backend().info().id + " runs none that need every core at once");
    if (gpus > 1 && use_graph && state.backend().info().kind != "cuda")
      state.skip("data parallelism on " + state.backend().info().id +
                 " averages through the host, which a captured step cannot hold: use graph=off");
    ModelSpec spec = asked;  // spec.batch: this rank's share
    const std::string fuse = state.get_text("fuse");
    spec.fuse_batchnorm_relu = fuse == "on" || (fuse == "auto" && !is_compression_model(spec.model));
    if (strong) spec.batch = asked.batch / gpus;
    const std::int64_t global_batch = spec.batch * gpus;
    const bool active = rank < gpus;
    // Every step that can fail on one rank is agreed on before the next collective call.
    const auto together = [&](const std::function<void()>& step) {
      if (world > 1)
        on_all_ranks(comm, [&] {
          if (active) step();
        });
      else
        step();
    };

    // Build and plan first (no memory): a layer that does not fit this image size fails here,
    // naming the layer, and the counts are known before anything is allocated.
    std::unique_ptr<nn::Kernels> kernels;
    std::unique_ptr<nn::Graph> g;
    std::unique_ptr<nn::Optimizer> opt;
    ZooModel m;
    together([&] {
      nn::GraphBuilder builder(graph_options(spec));
      m = build_zoo_model(builder, spec);
      // Kernels before the graph and optimizer: their memory comes from its allocator.
      kernels = nn::make_device_kernels(state.backend());
      kernels->set_cooperative_kernels(cooperative);
      g = std::make_unique<nn::Graph>(std::move(builder));
      opt = make_optimizer(state.get_text("optimizer"), lr, global_batch, m.compression);
      set_counts_and_plan_metrics(state, *g, *opt, spec, gpus);
      state.add_metric("learning_rate", opt->learning_rate());
      g->bind(*kernels);
      // Each rank trains on its own slice of one global batch: samples rank*batch on.
      const SyntheticBatch data = model_batch(m, static_cast<std::uint64_t>(rank * spec.batch), spec.batch, spec.image_px);
      g->set_input(m.images, data.images);  // uploaded once: every step trains on this batch
      if (!m.compression) g->set_input(m.labels, data.labels);
    });
    const auto bucket_bytes = std::max<std::int64_t>(1, std::llround(bucket_mib * 1024 * 1024));
    const std::int64_t tail_bucket_bytes =
        std::min<std::int64_t>(bucket_bytes, std::llround(tail_bucket_mib * 1024 * 1024));
    std::unique_ptr<DataParallel> dp;
    if (gpus > 1) {  // then world > 1: every rank takes part in creating the communicator
      on_all_ranks(comm, [&] {
        dp = make_data_parallel(state.backend(), comm, static_cast<int>(gpus), bucket_bytes,
                                backend::CommOptions{.max_ctas = static_cast<int>(comm_ctas)}, comm_high_priority);
      });
      together([&] {
        dp->set_tail_bucket_bytes(tail_bucket_bytes);
        dp->set_bucket_delay_ops(static_cast<int>(bucket_delay_ops));
        dp->set_comm_dtype(comm_wire_dtype(comm_dtype));
        dp->set_averager_engine(comm_engine);
        const bool update_can_mean = state.get_text("optimizer") == "sgd" && spec.precision != Precision::fp16;
        if (comm_mean == "update" && !update_can_mean)
          throw UsageError("comm_mean=update needs optimizer=sgd without fp16 loss scaling (its check reads the "
                           "averaged gradients); use comm_mean=kernel");
        dp->set_mean_in_update(comm_mean == "auto" ? std::nullopt : std::optional<bool>(comm_mean == "update"),
                               update_can_mean);
        dp->attach(*g, *kernels);
        state.add_metric("data_parallel", {{"gpus", gpus},
                                           {"processes", world},
                                           {"scaling", strong ? "strong" : "weak"},
                                           {"batch_per_gpu", spec.batch},
                                           {"global_batch", global_batch},
                                           {"bucket_bytes", bucket_bytes},
                                           {"tail_bucket_bytes", tail_bucket_bytes},
                                           {"bucket_delay_ops", bucket_delay_ops},
                                           {"comm_max_ctas", comm_ctas},
                                           {"comm_priority", comm_high_priority ? "high" : "normal"},
                                           {"comm_dtype", comm_dtype},
                                           {"wire_dtype", std::string(to_string(dp->wire_dtype()))},
                                           {"allreduce_bytes_per_step", dp->allreduce_bytes_per_step()},
                                           {"buckets", dp->bucket_count()},
                                           {"averaging", dp->describe()},
                                           {"averaging_fallback", dp->averaging_fallback()}});
      });
    }

    const bool scaled = spec.precision == Precision::fp16;
    std::vector<double> losses;
    double mse = 0;
    std::int64_t skipped = 0;
    const auto eager_step = [&] {
      g->forward();
      g->backward();
      g->update(*opt);
    };
    // The step as timed: captured once (capture_step binds the optimizer first, so replays allocate
    // nothing), or launched op by op.
    std::unique_ptr<nn::Replayable> captured;
    std::function<void()> step = [] {};  // idle ranks of a scaling sweep take no part
    together([&] {
      if (use_graph) captured = g->capture_step(opt.get());
      step = use_graph ? std::function<void()>([&] { captured->replay(); }) : std::function<void()>(eager_step);
    });
    // Every step of the trajectory runs on every active rank (a rank that stopped early would
    // leave the others waiting in an all-reduce); the first non-finite loss is reported after.
    together([&] {
      if (scaled) state.add_metric("steps_skipped", skipped);
      std::string bad;
      for (std::int64_t i = 0; i < trajectory_steps; ++i) {
        step();
        const double loss = g->read(m.loss)[0];
        losses.push_back(loss);
        if (scaled && g->last_step_skipped()) ++skipped;
        if (!std::isfinite(loss) && bad.empty())
          bad = "loss is " + text(loss) + " in the loss trajectory (step " + std::to_string(i + 1) + ")";
      }
      state.add_metric("loss_trajectory", losses);
      if (scaled) state.add_metric("steps_skipped", skipped);
      if (!bad.empty()) throw Diverged{bad};
      // The distortion of the last trajectory step's reconstruction (before that step's update).
      if (m.compression) mse = g->read(m.mse)[0];
      if (scaled) state.add_metric("loss_scale_after_trajectory", g->loss_scale());
      state.add_metric("device_bytes_peak", kernels->allocator().peak_bytes());
      add_fusion_metric(state, spec, *kernels);  // after steps ran: a refusal at a first call counts
    });
    // The global batch's figures: each training rank's loss (and distortion) is a mean over its
    // share of the batch, so their mean is what one GPU reports for the whole batch, and a scaling
    // sweep's trajectories compare across GPU counts. Every rank takes part; idle ones send none.
    if (world > 1) {
      losses.push_back(mse);
      losses = mean_over_training_ranks(comm, gpus, active ? losses : std::vector<double>{});
      mse = losses.back();
      losses.pop_back();
      state.add_metric("loss_trajectory", losses);
    }
    state.add_metric("loss_first", losses.front());
    state.add_metric("loss_last", losses.back());
    if (m.compression) {
      const nlohmann::json q = reconstruction_quality(mse);
      state.add_metric("mse", q["mse"]);
      state.add_metric("psnr_db", q["psnr_db"]);
    }

    measure::Settings settings = state.settings();
    settings.min_iterations_per_sample =
        steps_per_sample > 0 ? steps_per_sample : state.backend().info().kind == "cuda" ? kGpuStepsPerSample : 1;
    if (world > 1) {
      auto timer = state.backend().make_timer();
      const dist::LockstepResult measured = dist::measure_lockstep(comm, *timer, step, settings, state.cancel_flag());
      state.set_result(measured.result);
      std::vector<double> times;  // the training ranks' own step times
      for (std::size_t r = 0; r < static_cast<std::size_t>(gpus); ++r) times.push_back(measured.ranks[r].median_s);
      const auto [lo, hi] = std::minmax_element(times.begin(), times.end());
      state.add_metric("rank_step_time_s", {{"min", *lo},
                                            {"avg", std::accumulate(times.begin(), times.end(), 0.0) / static_cast<double>(times.size())},
                                            {"max", *hi}});
    } else {
      state.exec(step, settings);
    }
    record_scaling(state, gpus, global_batch);

    together([&] {
      const double final_loss = g->read(m.loss)[0];
      state.add_metric("loss_after_timing", final_loss);
      if (scaled) state.add_metric("loss_scale_after_timing", g->loss_scale());
      if (!std::isfinite(final_loss)) throw Diverged{"loss is " + text(final_loss) + " after the timed steps"};
      if (profile) {
        g->set_profiling(true);
        eager_step();
        g->set_profiling(false);
        state.add_metric("profile", write_op_profile(g->report(), state.artifact_dir()));
      }
    });
  }

 private:
  // The single-GPU rate of each configuration measured earlier in this process (the point's
  // label less `gpus` and the data-parallel knobs), so a scaling sweep gpus=1,2,4 records its efficiency at every count after
  // the first: rate(k) / (k x rate(1)). Weak scaling keeps the per-GPU batch, strong the global.
  static std::map<std::string, double>& single_gpu_rates() {
    static std::map<std::string, double> rates;
    return rates;
  }
  static std::string single_gpu_key(const State& state) {
    std::string key;
    for (const auto& [axis, value] : state.point().values)  // the data-parallel knobs change nothing at gpus=1
      if (axis != "gpus" && axis != "bucket_mib" && axis != "tail_bucket_mib" && axis != "bucket_delay_ops" &&
          axis != "comm_ctas" && axis != "comm_priority" && axis != "comm_dtype" && axis != "comm_engine" &&
          axis != "comm_mean")
        key += axis + "=" + value + " ";
    return key;
  }
  static void record_scaling(State& state, std::int64_t gpus, std::int64_t global_batch) {
    std::map<std::string, double>& single_gpu_rate = single_gpu_rates();
    if (!state.result() || !(state.result()->summary.median > 0)) return;
    const double rate = static_cast<double>(global_batch) / state.result()->summary.median;
    const std::string key = single_gpu_key(state);
    if (gpus == 1) {
      single_gpu_rate[key] = rate;
      return;
    }
    const auto it = single_gpu_rate.find(key);
    if (it == single_gpu_rate.end()) return;
    state.add_metric("scaling_efficiency", rate / (static_cast<double>(gpus) * it->second));
    state.add_metric("single_gpu_samples_per_s", it->second);
  }

  static void set_counts_and_plan_metrics(State& state, const nn::Graph& g, const nn::Optimizer& opt,
                                          const ModelSpec& spec, std::int64_t gpus) {
    const std::int64_t params = g.parameter_count();
    double bytes = static_cast<double>(opt.bytes(params, 4));  // fp32 master weights, gradients, velocity
    for (const auto& op : g.report()) bytes += static_cast<double>(op.forward_bytes + op.backward_bytes);
    const auto fwd = static_cast<double>(g.forward_flops()), bwd = static_cast<double>(g.backward_flops());
    const auto batch = static_cast<double>(spec.batch), ranks = static_cast<double>(gpus);
    // An iteration is one step of every rank: the global batch's samples, FLOPs and bytes.
    state.set_counts({batch * ranks, (fwd + bwd + static_cast<double>(opt.flops(params))) * ranks, bytes * ranks, "FLOP"});
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

}  // namespace

std::unique_ptr<Workload> make_train() { return std::make_unique<Train>(); }

}  // namespace ab::workloads::zoo
