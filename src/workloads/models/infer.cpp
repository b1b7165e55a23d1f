// infer: one iteration = one forward pass (inference mode: batch norm with running statistics) of
// a zoo model on a fixed synthetic batch, replayed as one captured graph where the axis asks. Each
// sample of the timing is one forward, so the record's percentiles are per-batch latencies.
// Language models run their inference heads (BERT: question answering, GPT-2: prefill; models.h's
// ZooModel) on sequences of the seq axis, and count tokens beside sequences.
// Checked first: two replays give identical finite outputs, and the logits of sample 0 match the
// float64 reference (of the unfolded network, also with fold=on: the folded one must compute
// the same function); the compression autoencoder reports the PSNR of its reconstruction.
// The record carries what the precision costs (metrics.accuracy: the logits' error and top-1
// agreement against float64), and precision=fp8 which convolutions ran e4m3 (metrics.fp8).
// With a dataset axis the point also measures top-1 accuracy over the dataset's test split
// (metrics.dataset_accuracy) with the parameters of --option weights=FILE (train's save_weights),
// or of the untrained network without one (said in the metric), so a precision's accuracy cost
// stands beside its speed; loaded weights skip the float64 check (its oracle is the untrained network).
// docs/METHODOLOGY.md, "Training and inference".
#include <cmath>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "backend/ref/ref.h"
#include "core/error.h"
#include "nn/cuda/device_kernels.h"
#include "workloads/models/datasets.h"
#include "workloads/models/models.h"
#include "workloads/models/weights.h"

namespace ab::workloads::zoo {
namespace {

class Infer final : public Workload {
 public:
  std::string name() const override { return "infer"; }
  std::string description() const override {
    return "Inference latency and throughput of a ResNet / ResNeXt, a user's ONNX model (model=FILE.onnx), the "
           "image-compression autoencoder (plus the PSNR of its reconstruction), BERT (question-answering head, "
           "sequences and tokens/s) or GPT-2 (prefill: "
           "the last position's logits): one forward of the batch per iteration (CUDA-graph "
           "replay by default), one iteration per timing sample so time.median_s / p90_s / p99_s are per-batch "
           "latencies; logits checked against the float64 reference first. dataset=fashion-mnist: top-1 accuracy "
           "over its test split too (--option weights=FILE: trained parameters from train's save_weights).";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    const auto one = [](const char* v) { return std::vector<std::string>{v}; };
    std::vector<AxisSpec> axes = model_axes(
        device_kind, {.cuda_batches = {"1", "8", "32", "128", "256"},
                      .host_batches = {"1", "8"},
                      .batch_help = "images (or sequences) per forward",
                      .cuda_precision = "fp16",
                      .precision_help = "fp32, tf32 (fp32 storage, TF32 math), bf16, fp16 (weights and activations), "
                                        "fp8 (fp16 storage; each convolution with C and K multiples of 16 and groups "
                                        "1 in e4m3 with per-tensor dynamic scales where the backend has it, the rest "
                                        "fp16; needs fold=fused)",
                      .precisions = infer_precisions()});
    axes.insert(
        axes.end(),
        {{"graph", AxisKind::text, one("on"), {"on", "off"}, "replay the forward as one captured graph (CUDA graph)"},
         {"profile", AxisKind::text, one("off"), {"off", "on"}, "per-op times after timing"},
         {"fp8_layers",
          AxisKind::text,
          one("faster"),
          {"faster", "all"},
          "with precision=fp8: faster = a convolution runs e4m3 only where its whole fp8 call (quantization "
          "included) timed faster than its 16-bit call on this device (the CUDA engine; the reference runs every "
          "one in fp8); all = every convolution the backend can run in fp8"},
         // auto: fused for the ResNets (checked on an H200 and fastest there, bench/HISTORY.md), off
         // for models without batch norm, which refuse an explicit on or fused.
         {"fold",
          AxisKind::text,
          one("auto"),
          {"auto", "off", "on", "fused"},
          "fold each batch norm into its convolution: on = weights scaled, then one bias + residual + ReLU "
          "kernel; fused = that epilogue inside the convolution (cuDNN's conv + bias + add + ReLU where "
          "faster); auto = fused for models with batch norm (the ResNets), else off"},
         {"dataset",
          AxisKind::text,
          one(kSyntheticDataset),
          {},
          "synthetic = timing only; fashion-mnist or idx:DIR = also top-1 accuracy over its test split (image_size "
          "is the data's)"}});
    return axes;
  }
  std::vector<OptionSpec> options() const override {
    return {{"weights",
             AxisKind::text,
             "",
             {},
             "parameters to load (train --option save_weights=FILE writes them); \"\" = the untrained network"},
            {"inputs", AxisKind::text, "", {}, kOnnxInputsHelp},
            {"dump_outputs",
             AxisKind::text,
             "off",
             {"off", "on", "all"},
             "on: write the outputs of the checked batch as raw float32 to <run>/artifacts/<point>/outputs.f32 "
             "(metrics.outputs_file names it); all: those of every sample of the inputs file, run in batches of "
             "the point's batch (a whole batch each; the rest left out): how bench/compare_onnx.py compares "
             "logits with PyTorch's on the same samples at every batch size"}};
  }

  bool has_counter_pass() const override { return true; }
  void run(State& state) override {
    ModelSpec spec = model_spec(state, /*training=*/false);
    add_layout_metric(state, spec);
    spec.inputs_file = state.option_text("inputs");
    if (!spec.inputs_file.empty() && !is_onnx_model(spec.model))
      throw UsageError("the inputs option feeds ONNX models; '" + spec.model + "' runs its synthetic data");
    const bool language = is_language_model(spec.model);
    resolve_fold(state, spec);
    const bool use_graph = state.get_text("graph") == "on", profile = state.get_text("profile") == "on";
    const std::string fp8_layers = state.get_text("fp8_layers");
    if (spec.precision != Precision::fp8 && fp8_layers != "faster")
      state.skip("fp8_layers=" + fp8_layers + " chooses among fp8 convolutions: it applies to precision=fp8 only");
    if (spec.batch < 1 || spec.image_px < 1 || spec.seq < 0)
      throw UsageError("infer needs batch and image_size >= 1 and seq >= 0 (got " + state.point().label() + ")");

    const std::string dataset = state.get_text("dataset"), weights = state.option_text("weights");
    std::optional<data::ImageSet> test;
    if (is_real_dataset(dataset)) {
      test = load_dataset(dataset, "test");
      spec.image_px = test->height;
    }
    nn::GraphBuilder builder(graph_options(spec));
    const ZooModel m = build_zoo_model(builder, spec);
    if (test) check_dataset_fits(*test, m.in_channels, spec.layout, spec.model);
    std::unique_ptr<nn::Kernels> kernels = nn::make_device_kernels(state.backend());
    kernels->set_fp8_only_where_faster(fp8_layers == "faster");
    nn::Graph g(std::move(builder));
    const auto fwd = static_cast<double>(g.forward_flops()), batch = static_cast<double>(spec.batch);
    state.set_ceiling_key("gemm." + std::string(to_string(spec.precision)));
    nlohmann::json model = {{"name", spec.model}, {"parameters", g.parameter_count()}, {"ops", g.report().size()}};
    if (language) model["head"] = m.head;
    state.add_metric("model", model);
    if (!m.onnx.is_null()) {
      nlohmann::json onnx = m.onnx;
      onnx["parameters"] = g.parameter_count();
      onnx["gflops_per_sample"] = fwd / batch / 1e9;
      state.add_metric("onnx", onnx);
    }
    state.add_metric("gflops_per_sample", {{"forward", fwd / batch / 1e9}});
    state.add_metric("memory_plan", {{"arena_bytes", g.memory_plan().peak_bytes},
                                     {"live_bound_bytes", g.memory_plan().live_bound_bytes},
                                     {"no_reuse_bytes", g.memory_plan().total_bytes}});

    g.bind(*kernels);
    // Counted after bind: an fp8 convolution's bytes depend on whether the backend took it.
    double bytes = 0;
    for (const auto& op : g.report()) bytes += static_cast<double>(op.forward_bytes);
    const double tokens = language ? batch * static_cast<double>(spec.seq) : 0.0;
    state.set_counts({batch, fwd, bytes, "FLOP", tokens});
    add_fp8_metric(state, spec, g, fp8_layers);
    // The folded network computes what the unfolded one does from the same seed, so the logits
    // check against the (unfolded) float64 reference below holds for both.
    if (!weights.empty()) g.set_parameter_values(loaded_parameter_values(weights, spec));
    else set_model_parameters(g, m, spec);
    if (test) {
      const EvalSplit split = make_eval_split(*test, m.in_channels, g.tensor(m.images).dtype, spec.batch);
      state.add_metric("dataset_accuracy", {{"dataset", dataset},
                                            {"split", "test"},
                                            {"samples", split.count},
                                            {"top1", top1_accuracy(g, m.images, m.output, split)},
                                            {"weights", weights.empty() ? "initial (untrained)" : weights}});
    }
    upload_batch(g, m, 0, spec);
    const auto forward = [&] { g.forward(false); };
    forward();  // lazy initialisation outside the capture
    std::unique_ptr<nn::Replayable> captured;
    if (use_graph) captured = g.capture_step(nullptr);
    const std::function<void()> step = use_graph ? std::function<void()>([&] { captured->replay(); })
                                                 : std::function<void()>(forward);
    check_outputs(state, g, m, step, spec, /*against_reference=*/weights.empty());
    if (const std::string dump = state.option_text("dump_outputs"); dump != "off")
      dump_outputs(state, dump == "all" ? outputs_of_every_input(g, m, spec, step) : g.read(m.output));
    // The autoencoder's forward includes its loss, so that its distortion gives the PSNR.
    if (m.compression) {
      const nlohmann::json q = reconstruction_quality(g.read(m.mse)[0]);
      state.add_metric("mse", q["mse"]);
      state.add_metric("psnr_db", q["psnr_db"]);
    }
    state.add_metric("device_bytes_peak", kernels->allocator().peak_bytes());
    add_fusion_metric(state, spec, *kernels);

    measure::Settings settings = state.settings();
    settings.target_sample_s = 0;  // one forward per sample: the samples are latencies
    state.exec(step, settings);
    const auto& s = state.result()->summary;
    state.add_metric("latency_s", {{"p50", s.median}, {"p90", s.p90}, {"p99", s.p99}, {"mean", s.mean}, {"max", s.max}});

    // Eager, so that each op is a range of its own: the captured graph runs the same kernels.
    const OpCounterBytes measured = measure_op_counters(state, g, forward, {});
    if (profile) {
      g.set_profiling(true);
      forward();
      g.set_profiling(false);
      state.add_metric("profile",
                       write_op_profile(g.report(), state.artifact_dir(), measured.empty() ? nullptr : &measured));
    }
  }

 private:
  // A weights file's values for this graph: Error for another model's file; folded like the
  // initial values where the graph folds its batch norms.
  static nn::ParameterValues loaded_parameter_values(const std::string& path, const ModelSpec& spec) {
    WeightsFile w = load_weights(path);
    if (w.model != spec.model)
      throw UsageError("weights file " + path + " holds '" + w.model + "', not '" + spec.model + "'");
    if (!spec.fold_batchnorm) return std::move(w.values);
    return ab::models::fold_batchnorm_parameters(std::move(w.values), spec.fuse_conv_epilogue
                                                                          ? ab::models::FoldedBias::on_convolution
                                                                          : ab::models::FoldedBias::on_batchnorm);
  }

  // fold=auto is fused for the ResNets and off for models without batch norm, whose explicit on or
  // fused the zoo refuses; fp8 needs the fused epilogue, and runs no language model.
  static void resolve_fold(const State& state, ModelSpec& spec) {
    const bool has_batchnorm = !is_compression_model(spec.model) && !is_language_model(spec.model);
    std::string fold = state.get_text("fold");
    if (fold == "auto") fold = has_batchnorm ? "fused" : "off";
    if (spec.precision == Precision::fp8 && is_language_model(spec.model))
      throw UsageError("precision fp8 runs the ResNets' folded convolutions in e4m3; '" + spec.model +
                       "' runs fp32, tf32, bf16 or fp16");
    if (spec.precision == Precision::fp8 && fold != "fused")
      throw UsageError(
          "precision fp8 needs fold=fused (or auto, fused for the ResNets): only a convolution with its "
          "folded epilogue inside runs e4m3; fold=" +
          fold + " would run every layer in fp16" +
          (is_compression_model(spec.model) ? " ('" + spec.model + "' has no batch norm to fold)" : ""));
    spec.fold_batchnorm = fold != "off";
    spec.fuse_conv_epilogue = fold == "fused";
  }

  // The outputs of each whole batch of the inputs file's samples, in order; batch 0 is uploaded
  // again after, so the timed samples run what they would have.
  static std::vector<double> outputs_of_every_input(nn::Graph& g, const ZooModel& m, const ModelSpec& spec,
                                                    const std::function<void()>& step) {
    const std::int64_t samples = m.onnx_inputs.empty() ? 0 : onnx_input_file_samples(m, spec);
    if (samples < spec.batch)
      throw UsageError(
          "dump_outputs=all runs every sample of an ONNX model's inputs file (--option inputs=FILE) "
          "in batches of " +
          std::to_string(spec.batch) + "; " +
          (samples == 0 ? "this point has none" : "it holds " + std::to_string(samples) + " samples"));
    std::vector<double> all;
    for (std::int64_t first = 0; first + spec.batch <= samples; first += spec.batch) {
      upload_batch(g, m, static_cast<std::uint64_t>(first), spec);
      step();
      const std::vector<double> out = g.read(m.output);
      all.insert(all.end(), out.begin(), out.end());
    }
    upload_batch(g, m, 0, spec);
    return all;
  }

  static void dump_outputs(State& state, const std::vector<double>& values) {
    if (state.artifact_dir().empty()) throw UsageError("dump_outputs needs a run that keeps files (run --out)");
    std::filesystem::create_directories(state.artifact_dir());
    const std::filesystem::path file = state.artifact_dir() / "outputs.f32";
    const std::vector<float> f(values.begin(), values.end());
    std::ofstream out(file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(f.data()), static_cast<std::streamsize>(f.size() * sizeof(float)));
    if (!out) throw Error("cannot write " + file.string());
    state.add_metric("outputs_file", file.string());
  }

  // The same batch twice must give the same finite outputs (a capture that misses work or reads a
  // stale buffer shows here), and the logits of sample 0 must match the float64 reference: a
  // classifier's row, BERT's (start, end) pair of every token, GPT-2's last-position row.
  // The autoencoder has no such reference check: its quantiser rounds, so a last-bit difference
  // from f64 can move a latent into the next bin and the reconstructions differ by design.
  static void check_outputs(State& state, const nn::Graph& g, const ZooModel& m, const std::function<void()>& step,
                            const ModelSpec& spec, bool against_reference) {
    const char* what = m.compression ? "reconstruction element" : "logit";
    step();
    const std::vector<double> first = g.read(m.output);
    step();
    const std::vector<double> second = g.read(m.output);
    for (std::size_t i = 0; i < first.size(); ++i) {
      if (!std::isfinite(first[i]))
        throw CheckFailed{std::string(what) + " " + std::to_string(i) + " is not finite (" + std::to_string(first[i]) +
                          ")"};
      if (first[i] != second[i])
        throw CheckFailed{"two forwards of the same batch differ at " + std::string(what) + " " + std::to_string(i) +
                          ": " + std::to_string(first[i]) + " vs " + std::to_string(second[i])};
    }
    if (m.compression || !against_reference) return;
    const std::vector<double> want = reference_logits(spec);
    if (first.size() != want.size() * static_cast<std::size_t>(spec.batch))
      throw Error("infer: " + std::to_string(first.size()) + " logits for a batch of " + std::to_string(spec.batch) +
                  ", the reference has " + std::to_string(want.size()) + " per sample");
    const std::vector<double> got(first.begin(), first.begin() + static_cast<std::ptrdiff_t>(want.size()));
    // Recorded before the check, so a point that fails it still says by how much and on which class.
    const nlohmann::json accuracy = logits_accuracy(got, want, m.head == "qa" ? 2 : 1);
    state.add_metric("accuracy", accuracy);
    const std::string size = m.language ? "seq " + std::to_string(spec.seq) : std::to_string(spec.image_px) + " px";
    state.check(accuracy["logits_rel_error_vs_f64"].get<double>(), logits_tolerance(spec.precision),
                "logits of sample 0 against the float64 reference (" + spec.model + ", " + size +
                    ", inference); two forwards identical");
  }
};

}  // namespace

std::unique_ptr<Workload> make_infer() { return std::make_unique<Infer>(); }

}  // namespace ab::workloads::zoo
