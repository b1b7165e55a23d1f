// One point = one scenario run of the load generator (a server point with target_qps = 0 is a
// search for the peak QPS plus its verification run). The record gets the run's `scenario` block;
// the MLLOG summary and detail logs go to the point's artifact folder. docs/METHODOLOGY.md,
// "Inference scenarios".
#include "workloads/loadgen.h"

#include <algorithm>
#include <optional>

#include "backend/ref/ref.h"
#include "core/error.h"
#include "results/results.h"
#include "scenarios/scenarios.h"
#include "scenarios/suts.h"
#include "system/build_info.h"
#include "workloads/models/models.h"

namespace ab::workloads {
namespace {

namespace sc = ab::scenarios;

constexpr std::uint64_t kFaultyDropEvery = 1000;
constexpr std::int64_t kCheckEdge = 96;

// The compute SUT's layer: C[batch, n] = A[batch, k] W[k, n] per batch of samples.
struct Layer {
  Precision precision;
  std::int64_t n, k;
};
Layer layer_for(const std::string& device_kind) {
  return device_kind == "cuda" ? Layer{Precision::bf16, 4096, 4096} : Layer{Precision::fp32, 1024, 1024};
}

// Runs one GEMM per batch, m = the batch padded up to a power of two (or max_batch): plans per
// bucket are made on the batcher's worker thread, which makes the device current there.
class GemmExecutor final : public sc::BatchExecutor {
 public:
  GemmExecutor(backend::Backend& be, Layer layer, std::size_t max_batch) : be_(be), layer_(layer) {
    for (std::size_t b = 1; b < max_batch; b *= 2) buckets_.push_back(b);
    buckets_.push_back(max_batch);
  }
  std::string describe() const override {
    return "gemm " + std::string(to_string(layer_.precision)) + " layer k=" + std::to_string(layer_.k) +
           " n=" + std::to_string(layer_.n) + " on " + be_.info().id;
  }
  void prepare() override {
    for (std::size_t b : buckets_)
      plans_.push_back(be_.make_gemm({layer_.precision, static_cast<std::int64_t>(b), layer_.n, layer_.k, false, false}));
  }
  void run(std::span<const sc::QuerySample> batch) override {
    const auto it = std::lower_bound(buckets_.begin(), buckets_.end(), batch.size());
    const auto i = static_cast<std::size_t>(it - buckets_.begin());
    plans_[i]->run();        // enqueued on the backend's stream
    be_.synchronize();       // the batch's results are ready when this returns
    padded_samples_ += buckets_[i];
  }
  std::string algorithm() const { return plans_.empty() ? "" : plans_.back()->algorithm(); }
  const std::vector<std::size_t>& buckets() const { return buckets_; }
  std::uint64_t padded_samples() const { return padded_samples_; }

 private:
  backend::Backend& be_;
  Layer layer_;
  std::vector<std::size_t> buckets_;
  std::vector<std::unique_ptr<backend::GemmPlan>> plans_;
  std::uint64_t padded_samples_ = 0;
};

// Checks the layer's GEMM against the float64 reference at a small size, as every gemm point does.
void check_layer(State& state, const Layer& layer, std::int64_t max_batch) {
  backend::GemmDesc d{layer.precision, std::min(max_batch, kCheckEdge), std::min(layer.n, kCheckEdge),
                      std::min(layer.k, kCheckEdge), false, false};
  auto plan = state.backend().make_gemm(d);
  plan->run();
  const auto want = backend::ref::gemm(d, plan->a_values(), plan->b_values());
  state.check(backend::ref::rel_error(plan->c_values(), want), backend::ref::gemm_tolerance(layer.precision),
              "layer GEMM against float64 reference at " + std::to_string(d.m) + "x" + std::to_string(d.n) + "x" +
                  std::to_string(d.k));
}

std::string version_string() {
  const auto& b = system::build_info();
  return "accelbench " + b.version + " @ " + b.git_commit.substr(0, 12) + (b.git_dirty ? "-dirty" : "");
}

class Loadgen final : public Workload {
 public:
  std::string name() const override { return "loadgen"; }
  std::string description() const override {
    return "Inference under load (MLPerf LoadGen's measurement): single-stream (p90 latency), multi-stream "
           "(8 samples a query, p99 query latency), server (Poisson arrivals, p99 bound, peak-QPS search), offline "
           "(throughput) against a system under test: null (completes at once: the load generator's own cost), "
           "gemm (a dense layer per batch behind a dynamic batcher), a zoo model by name (resnet50, bert_large...: its "
           "inference graph per batch behind the dynamic batcher, images or sequences of `seq` tokens in and logits "
           "out), faulty (drops every 1000th sample). "
           "VALID/INVALID with the failed constraints; MLLOG logs under the run's artifacts/.";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    std::vector<std::string> suts{"null", "gemm", "faulty"};
    // The model SUT runs classifiers and language models (images or tokens in, logits out); the
    // compression autoencoders are not offered.
    for (const auto& m : zoo::model_names())
      if (!zoo::is_compression_model(m)) suts.push_back(m);
    suts.push_back("*.onnx");  // a user's ONNX model file
    std::vector<std::string> precisions{"auto"};
    precisions.insert(precisions.end(), zoo::model_precisions().begin(), zoo::model_precisions().end());
    return {{"scenario",
             AxisKind::text,
             {"single-stream", "multi-stream", "server", "offline"},
             {"single-stream", "multi-stream", "server", "offline"},
             "MLPerf scenario"},
            {"sut",
             AxisKind::text,
             {"gemm"},
             suts,
             "system under test: null, gemm (dense layer, dynamic batcher), faulty (drops every 1000th sample), or a "
             "model (resnet50, bert_large... or an ONNX file, PATH.onnx: inference graph per batch, dynamic batcher)"},
            {"precision",
             AxisKind::text,
             {"auto"},
             precisions,
             "gemm and model SUTs: auto = bf16 gemm / fp16 model on a GPU, fp32 on a CPU"},
            {"image_size", AxisKind::integer, {device_kind == "cuda" ? "224" : "16"}, {}, "model SUTs: image pixels"},
            {"seq",
             AxisKind::integer,
             {"0"},
             {},
             "language-model SUTs: tokens per sample (at most the model's positions); 0 = the positions "
             "(GPT-2 1024, BERT 512)"},
            {"preset",
             AxisKind::text,
             {"quick"},
             {"quick", "mlperf"},
             "run rules: quick (1 s), mlperf (600 s and the official query counts; needs --timeout above 600)"},
            {"target_qps",
             AxisKind::real,
             {"0"},
             {},
             "server: Poisson QPS, 0 = search the peak; offline: expected samples/s, 0 = probe"},
            {"latency_bound_ms",
             AxisKind::real,
             {"0"},
             {},
             "latency bound: server p99 (0 = 10 ms, MLPerf's default); single-/multi-stream: on the early-stopping "
             "estimate (0 = none)"},
            {"max_batch", AxisKind::integer, {"8"}, {}, "gemm and model SUTs: largest batch the dynamic batcher forms"},
            {"max_wait_us",
             AxisKind::integer,
             {"1000"},
             {},
             "gemm and model SUTs: longest a sample waits for its batch to fill (server, multi-stream)"},
            {"samples", AxisKind::integer, {"1024"}, {}, "performance sample count of the sample library"}};
  }
  std::vector<OptionSpec> options() const override {
    return {{"inputs", AxisKind::text, "", {}, zoo::kOnnxInputsHelp}};
  }

  void run(State& state) override {
    const sc::Scenario scenario = sc::parse_scenario(state.get_text("scenario"));
    const sc::Preset preset = sc::parse_preset(state.get_text("preset"));
    const std::string sut_kind = state.get_text("sut");
    const double target_qps = state.get_real("target_qps"), bound_ms = state.get_real("latency_bound_ms");
    const std::int64_t max_batch = state.get_int("max_batch"), max_wait_us = state.get_int("max_wait_us");
    const std::int64_t samples = state.get_int("samples");
    const std::string precision = state.get_text("precision");
    const std::int64_t image_px = state.get_int("image_size"), seq = state.get_int("seq");
    const std::string inputs = state.option_text("inputs");
    if (!inputs.empty() && !zoo::is_onnx_model(sut_kind))
      throw UsageError("the inputs option feeds an ONNX model SUT; '" + sut_kind + "' runs its synthetic data");
    if (max_batch < 1 || max_wait_us < 0 || samples < 1 || bound_ms < 0 || target_qps < 0)
      throw UsageError("loadgen needs max_batch >= 1, samples >= 1, and max_wait_us, latency_bound_ms, target_qps >= 0");
    const bool streams = scenario == sc::Scenario::single_stream || scenario == sc::Scenario::multi_stream;
    if (streams && target_qps > 0) state.skip("target_qps applies to the server and offline scenarios");

    sc::Settings s = sc::preset_settings(preset, scenario);
    s.timeout_s = state.settings().timeout_s;
    s.target_qps = target_qps;
    if (bound_ms > 0) s.latency_bound_s = bound_ms / 1e3;
    // The batcher waits only where samples arrive apart: single-stream and offline dispatch at once.
    const bool waits = scenario == sc::Scenario::server || scenario == sc::Scenario::multi_stream;
    const sc::BatcherSettings batcher{static_cast<std::size_t>(max_batch), waits ? static_cast<double>(max_wait_us) * 1e-6 : 0.0};
    sc::check_settings(s);

    std::unique_ptr<sc::SystemUnderTest> sut;
    sc::BatchingSut* batching = nullptr;
    GemmExecutor* gemm = nullptr;
    sc::BatchExecutor* model = nullptr;
    const bool gpu = state.backend().info().kind == "cuda";
    Layer layer = layer_for(state.backend().info().kind);
    if (precision != "auto") layer.precision = parse_precision(precision);
    const auto& models = zoo::model_names();
    if (sut_kind == "null") {
      sut = std::make_unique<sc::NullSut>();
    } else if (sut_kind == "faulty") {
      sut = std::make_unique<sc::FaultySut>(kFaultyDropEvery);
    } else if (std::find(models.begin(), models.end(), sut_kind) != models.end() || zoo::is_onnx_model(sut_kind)) {
      const zoo::ModelSutSpec spec{
          sut_kind,
          precision != "auto" ? zoo::parse_model_precision(precision) : (gpu ? Precision::fp16 : Precision::fp32),
          image_px,
          zoo::layout_of("auto", sut_kind, gpu),
          seq,
          inputs};
      zoo::check_model_sut(spec, batcher.max_batch);
      sc::check_batcher(s, batcher);
      state.set_counts(
          {1.0, zoo::forward_flops_per_sample(spec), 0.0, "FLOP", static_cast<double>(zoo::tokens_per_sample(spec))});
      auto exec = zoo::make_model_executor(state.backend(), spec, batcher.max_batch);
      model = exec.get();
      auto b = std::make_unique<sc::BatchingSut>(sut_kind, batcher, std::move(exec));
      batching = b.get();
      sut = std::move(b);
    } else {
      sc::check_batcher(s, batcher);
      check_layer(state, layer, max_batch);
      auto exec = std::make_unique<GemmExecutor>(state.backend(), layer, batcher.max_batch);
      gemm = exec.get();
      auto b = std::make_unique<sc::BatchingSut>("gemm", batcher, std::move(exec));
      batching = b.get();
      sut = std::move(b);
      state.set_counts({1.0, 2.0 * static_cast<double>(layer.n * layer.k), 0.0, "FLOP"});
    }
    if (!gemm && !model) state.set_counts({1.0, 0.0, 0.0, "FLOP"});

    sc::SyntheticLibrary library(static_cast<std::size_t>(samples), static_cast<std::size_t>(samples));
    std::optional<sc::SearchResult> search;
    sc::RunResult result;
    if (scenario == sc::Scenario::server && s.target_qps <= 0) {
      search = sc::find_peak_qps(*sut, library, s, state.cancel_flag());
      result = search->final;
    } else {
      result = sc::run(*sut, library, s, state.cancel_flag());
    }

    nlohmann::json summary = sc::to_json(result);
    if (search) summary["search"] = sc::to_json(*search);
    summary["sut"] = gemm ? gemm->describe() + ", dynamic batcher" : model ? model->describe() + ", dynamic batcher" : sut->name();
    summary["sample_library"] = {{"name", library.name()}, {"total_samples", samples}, {"performance_samples", samples}};
    if (!state.artifact_dir().empty()) {
      const sc::LogInfo info{version_string(), summary["sut"].get<std::string>(), library.name(),
                             library.total_sample_count(), library.performance_sample_count(), results::utc_now_iso8601()};
      sc::write_mllog(state.artifact_dir(), result, search ? &*search : nullptr, info);
      const auto rel = state.artifact_dir().parent_path().filename() / state.artifact_dir().filename();
      summary["logs"] = {{"summary", (rel / "mlperf_log_summary.txt").string()}, {"detail", (rel / "mlperf_log_detail.txt").string()}};
    }
    if (batching != nullptr) {
      const auto st = batching->stats();
      state.add_metric("batcher", {{"max_batch", batcher.max_batch}, {"max_wait_us", batcher.max_wait_s * 1e6},
                                   {"batches", st.batches}, {"samples", st.samples},
                                   {"mean_batch", st.batches ? static_cast<double>(st.samples) / static_cast<double>(st.batches) : 0.0},
                                   {"batch_sizes", st.batch_sizes}});
      if (gemm != nullptr) {
        state.add_metric("layer", {{"precision", std::string(to_string(layer.precision))}, {"n", layer.n}, {"k", layer.k},
                                   {"buckets", gemm->buckets()}, {"padded_samples", gemm->padded_samples()}});
        state.add_metric("algorithm", gemm->algorithm());
      }
      if (model != nullptr) state.add_metric("model", zoo::model_executor_summary(*model));
    }
    state.set_scenario_result({summary, result.window_start_s, result.window_end_s,
                               static_cast<double>(result.samples_completed), result.completed_samples_per_s,
                               result.interrupted});
    if (!result.sut_failure.empty()) throw Error("the system under test failed: " + result.sut_failure);
  }
};

}  // namespace

std::unique_ptr<Workload> make_loadgen() { return std::make_unique<Loadgen>(); }

}  // namespace ab::workloads
