// train: one iteration = one training step (forward, backward, optimizer update) of a zoo model
// on a fixed synthetic batch, replayed as one captured graph where the axis asks. Before timing, a
// loss trajectory of `trajectory_steps` steps reads the loss after every step: a non-finite loss
// makes the point "diverged". docs/METHODOLOGY.md, "Training and inference".
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "nn/device/device_kernels.h"
#include "nn/optim.h"
#include "workloads/models/models.h"

namespace ab::workloads::zoo {
namespace {

constexpr double kMomentum = 0.9;
constexpr double kSgdWeightDecay = 1e-4;   // torchvision's ResNet recipe
constexpr double kLarsWeightDecay = 5e-5;  // MLPerf's ResNet reference with LARS
constexpr double kLarsEta = 0.001;

// lr = 0 picks the recipe's rate: SGD 0.1 per 256 images (Goyal et al. 2017, linear scaling),
// LARS MLPerf's base rate of the order of 10 at batch 3072, scaled the same way.
std::unique_ptr<nn::Optimizer> make_optimizer(const std::string& name, double lr, std::int64_t batch) {
  const double per_256 = static_cast<double>(batch) / 256.0;
  if (name == "sgd") return std::make_unique<nn::Sgd>(lr > 0 ? lr : 0.1 * per_256, kMomentum, kSgdWeightDecay);
  if (name == "lars")
    return std::make_unique<nn::Lars>(lr > 0 ? lr : 0.8 * per_256, kMomentum, kLarsWeightDecay, kLarsEta);
  throw UsageError("unknown optimizer '" + name + "'; valid: sgd, lars");
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
    return "Training throughput of a ResNet / ResNeXt (images/s, TFLOP/s of forward + backward + update, % of the "
           "measured GEMM ceiling of the precision): one step per iteration on a fixed synthetic batch, CUDA-graph "
           "replay by default; a loss trajectory is read first (NaN/Inf: status diverged). profile=on writes a "
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
                                        "fp16 with dynamic loss scaling)"});
    axes.insert(
        axes.end(),
        {{"optimizer", AxisKind::text, one("sgd"), {"sgd", "lars"}, "SGD with momentum, or LARS (MLPerf)"},
         {"lr", AxisKind::real, one("0"), {}, "learning rate; 0 = sgd 0.1 x batch/256, lars 0.8 x batch/256"},
         {"graph", AxisKind::text, one("on"), {"on", "off"}, "replay the step as one captured graph (CUDA graph)"},
         {"trajectory_steps", AxisKind::integer, one("30"), {}, "steps whose loss is read before timing"},
         {"profile", AxisKind::text, one("off"), {"off", "on"}, "per-op times after timing (slower step)"}});
    return axes;
  }

  void run(State& state) override {
    const ModelSpec spec = model_spec(state, /*training=*/true);
    const ab::models::ResNetConfig cfg = model_config(spec.model);
    const double lr = state.get_real("lr");
    const std::int64_t trajectory_steps = state.get_int("trajectory_steps");
    const bool use_graph = state.get_text("graph") == "on", profile = state.get_text("profile") == "on";
    if (spec.batch < 1 || spec.image_px < 1 || trajectory_steps < 1 || !(lr >= 0) || !std::isfinite(lr))
      throw UsageError("train needs batch, image_size, trajectory_steps >= 1 and a finite lr >= 0 (got " +
                       state.point().label() + ")");

    // Build and plan first (no memory): a layer that does not fit this image size fails here,
    // naming the layer, and the counts are known before anything is allocated.
    nn::GraphBuilder builder(graph_options(spec));
    const ab::models::Classifier m = ab::models::build_classifier(builder, cfg, spec.batch, spec.image_px);
    // Kernels before the graph and optimizer: their memory comes from its allocator.
    std::unique_ptr<nn::Kernels> kernels = nn::make_device_kernels(state.backend());
    nn::Graph g(std::move(builder));
    std::unique_ptr<nn::Optimizer> opt = make_optimizer(state.get_text("optimizer"), lr, spec.batch);
    set_counts_and_plan_metrics(state, g, *opt, spec);
    state.add_metric("learning_rate", opt->learning_rate());

    g.bind(*kernels);
    {
      const SyntheticBatch data = synthetic_batch(kDataSeed, 0, spec.batch, cfg.in_channels, spec.image_px, cfg.num_classes);
      g.set_input(m.images, data.images);  // uploaded once: every step trains on this batch
      g.set_input(m.labels, data.labels);
    }

    const bool scaled = spec.precision == Precision::fp16;
    std::vector<double> losses;
    std::int64_t skipped = 0;
    const auto record_loss = [&](const char* when) {
      const double loss = g.read(m.loss)[0];
      losses.push_back(loss);
      state.add_metric("loss_trajectory", losses);
      if (scaled && g.last_step_skipped()) state.add_metric("steps_skipped", ++skipped);
      if (!std::isfinite(loss))
        throw Diverged{"loss is " + text(loss) + " " + when + " (step " + std::to_string(losses.size()) + ")"};
    };
    const auto eager_step = [&] {
      g.forward();
      g.backward();
      g.update(*opt);
    };
    // The step as timed: captured once (capture_step binds the optimizer first, so replays allocate
    // nothing), or launched op by op.
    std::unique_ptr<nn::Replayable> captured;
    if (use_graph) captured = g.capture_step(opt.get());
    const std::function<void()> step = use_graph ? std::function<void()>([&] { captured->replay(); })
                                                 : std::function<void()>(eager_step);
    if (scaled) state.add_metric("steps_skipped", skipped);
    for (std::int64_t i = 0; i < trajectory_steps; ++i) {
      step();
      record_loss("in the loss trajectory");
    }
    state.add_metric("loss_first", losses.front());
    state.add_metric("loss_last", losses.back());
    if (scaled) state.add_metric("loss_scale_after_trajectory", g.loss_scale());
    state.add_metric("device_bytes_peak", kernels->allocator().peak_bytes());

    state.exec(step);
    const double final_loss = g.read(m.loss)[0];
    state.add_metric("loss_after_timing", final_loss);
    if (scaled) state.add_metric("loss_scale_after_timing", g.loss_scale());
    if (!std::isfinite(final_loss)) throw Diverged{"loss is " + text(final_loss) + " after the timed steps"};

    if (profile) {
      g.set_profiling(true);
      eager_step();
      g.set_profiling(false);
      state.add_metric("profile", write_op_profile(g.report(), state.artifact_dir()));
    }
  }

 private:
  static void set_counts_and_plan_metrics(State& state, const nn::Graph& g, const nn::Optimizer& opt,
                                          const ModelSpec& spec) {
    const std::int64_t params = g.parameter_count();
    double bytes = static_cast<double>(opt.bytes(params, 4));  // fp32 master weights, gradients, velocity
    for (const auto& op : g.report()) bytes += static_cast<double>(op.forward_bytes + op.backward_bytes);
    const auto fwd = static_cast<double>(g.forward_flops()), bwd = static_cast<double>(g.backward_flops());
    const auto batch = static_cast<double>(spec.batch);
    state.set_counts({batch, fwd + bwd + static_cast<double>(opt.flops(params)), bytes, "FLOP"});
    state.set_ceiling_key("gemm." + std::string(to_string(spec.precision)));
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
