#include "workloads/models/train_feed.h"

#include <algorithm>
#include <optional>
#include <thread>

#include <sys/resource.h>

#include "core/error.h"
#include "data/device.h"
#include "data/pipeline.h"
#include "measure/timer.h"
#include "workloads/models/datasets.h"

namespace ab::workloads::zoo {
namespace {

constexpr const char* kFolderPrefix = "folder:";

double process_cpu_seconds() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// What the feed reads: a folder's files (decoded by the workers or nvJPEG) or an IDX set's pixels.
struct FedSource {
  std::shared_ptr<const data::SampleSource> source;
  std::string name;
  bool folder = false;
  std::vector<data::UnreadableFile> unreadable;
};

FedSource open_source(const std::string& dataset) {
  if (!is_folder_dataset(dataset)) {
    data::ImageSet set = load_dataset(dataset, "train");
    return {data::raw_source(std::move(set)), dataset + ":train", false, {}};
  }
  data::ImageFolder f = data::scan_image_folder(dataset.substr(std::string(kFolderPrefix).size()), false);
  auto unreadable = f.unreadable;
  return {data::folder_source(std::move(f)), dataset, true, std::move(unreadable)};
}

// The training augmentation at the model's input: ImageNet's RandomResizedCrop and flip, the
// set's normalisation (ImageNet's for a folder, Fashion-MNIST's for the IDX sets).
data::PipelineConfig feed_config(const FedSource& s, const TrainOptions& o, std::uint64_t seed, DType input,
                                 const ZooModel& model, const ModelSpec& spec) {
  data::PipelineConfig c;
  c.batch = spec.batch;
  c.threads = o.data_threads > 0 ? static_cast<int>(o.data_threads)
                                 : static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1U, 8U));
  c.seed = seed;
  c.augment.height = c.augment.width = spec.image_px;
  c.augment.channels = model.in_channels;
  c.augment.flip = o.flip == "on";
  c.augment.dtype = input;
  if (!s.folder) {
    c.augment.mean.fill(kFashionMnistMean);
    c.augment.stddev.fill(kFashionMnistStd);
  }
  return c;
}

void check_model_takes(const FedSource& s, const ZooModel& model, const ModelSpec& spec) {
  if (model.compression || model.language || model.images.id < 0 || model.labels.id < 0 ||
      model.classes < s.source->classes())
    throw UsageError("training from " + s.name + " needs an image classifier of at least " +
                     std::to_string(s.source->classes()) + " classes; '" + spec.model + "' is not one");
  if (model.in_channels != 3 && (s.folder || model.in_channels != 1))
    throw UsageError(spec.model + " takes " + std::to_string(model.in_channels) + "-channel images; " + s.name +
                     " feeds 3-channel batches (1 for an IDX set)");
  if (model.in_channels > 1 && spec.layout != Layout::nhwc)
    throw UsageError(spec.model + " on " + s.name + " needs layout=nhwc: the data pipeline writes NHWC batches");
}

// What both feeds share: the graph's inputs, the window's clocks, the record's common fields.
class FeedBase : public TrainFeed {
 public:
  FeedBase(State& state, FedSource source, data::PipelineConfig config, nn::Graph& graph, const ZooModel& model)
      : backend_(state.backend()),
        kernels_(graph.kernels()),
        graph_(graph),
        model_(model),
        source_(std::move(source)),
        config_(std::move(config)) {}

  void start_window() override {
    kernels_.synchronize();
    window_start_s_ = measure::monotonic_seconds();
    process_cpu_start_s_ = process_cpu_seconds();
    batches_at_start_ = batches_;
    start_counters();
  }

  void record(State& state) override {
    kernels_.synchronize();
    const double window_s = measure::monotonic_seconds() - window_start_s_;
    const auto images = static_cast<double>((batches_ - batches_at_start_) * config_.batch);
    const auto per_image_ms = [&](double s) { return images > 0 ? 1e3 * s / images : 0.0; };
    const double wait_s = feed_wait_s();
    nlohmann::json f = {{"dataset", source_.name},
                        {"source_images", source_.source->size()},
                        {"threads", config_.threads},
                        {"images", images},
                        {"window_s", window_s},
                        {"images_per_s", window_s > 0 ? images / window_s : 0.0},
                        {"cpu_ms_per_image", per_image_ms(decoder_cpu_s())},
                        {"process_cpu_ms_per_image", per_image_ms(process_cpu_seconds() - process_cpu_start_s_)},
                        {"feed_wait_s", wait_s},
                        {"feed_stall_share", window_s > 0 ? wait_s / window_s : 0.0}};
    if (source_.folder) f["unreadable_files"] = source_.unreadable.size();
    if (!source_.unreadable.empty()) f["unreadable_named"] = data::list_unreadable(source_.unreadable);
    describe(f);
    state.add_metric("feed", f);
  }

 protected:
  // Batch b into the step's inputs, on the compute stream after whatever made b ready there.
  void copy_in(const data::DeviceFeeder::DeviceBatch& b) {
    data::copy_into(backend_, kernels_, graph_.tensor(model_.images), b.pixels);
    data::copy_into(backend_, kernels_, graph_.tensor(model_.labels), b.labels);
    ++batches_;
  }
  virtual void start_counters() = 0;
  virtual double decoder_cpu_s() const = 0;  // since start_counters
  virtual double feed_wait_s() = 0;          // since start_counters
  virtual void describe(nlohmann::json& f) const = 0;

  backend::Backend& backend_;
  nn::Kernels& kernels_;
  nn::Graph& graph_;
  const ZooModel& model_;
  FedSource source_;
  data::PipelineConfig config_;

 private:
  std::int64_t batches_ = 0, batches_at_start_ = 0;
  double window_start_s_ = 0, process_cpu_start_s_ = 0;
};

// Worker threads into the pinned ring; the DeviceFeeder's copy stream (events on a GPU) brings
// batch k+1 while step k runs. A stall is the training thread waiting in acquire() for the workers.
class HostFeed final : public FeedBase {
 public:
  HostFeed(State& state, FedSource source, data::PipelineConfig config, nn::Graph& graph, const ZooModel& model)
      : FeedBase(state, std::move(source), std::move(config), graph, model),
        pipeline_(source_.source, config_, &kernels_),
        feeder_(pipeline_, kernels_, data::make_copy_queue(backend_, kernels_)) {}
  void next() override { copy_in(feeder_.next()); }

 private:
  void start_counters() override { at_start_ = pipeline_.stats(); }
  double decoder_cpu_s() const override { return pipeline_.stats().worker_cpu_s - at_start_.worker_cpu_s; }
  double feed_wait_s() override { return pipeline_.stats().acquire_wait_s - at_start_.acquire_wait_s; }
  void describe(nlohmann::json& f) const override {
    const bool gpu = backend_.info().kind == "cuda";
    f["decoder"] = "cpu";
    f["host_memory"] = gpu ? "pinned" : "plain";
    f["copies"] = gpu ? "copy stream" : "kernels' stream";
  }

  data::HostPipeline pipeline_;
  data::DeviceFeeder feeder_;  // after the pipeline: destroyed first
  data::HostPipeline::Stats at_start_;
};

// nvJPEG decodes each batch and a kernel augments it, one batch ahead on a stream of their own
// (data::decode_ahead), so batch k+1's decode runs beside step k. A stall is the compute stream
// waiting for a decoded batch (timed by events); the training thread's time in the decoder is beside it.
class NvjpegFeed final : public FeedBase {
 public:
  NvjpegFeed(State& state, FedSource source, data::PipelineConfig config, nn::Graph& graph, const ZooModel& model)
      : FeedBase(state, std::move(source), std::move(config), graph, model),
        decoder_(data::decode_ahead(backend_, [this](backend::Backend& decode) {
          return data::make_nvjpeg_decoder(source_.source, config_, decode, kernels_, "auto");
        })) {}
  void next() override {
    const double from = measure::monotonic_seconds();
    const auto& b = decoder_->next();
    in_next_s_ += measure::monotonic_seconds() - from;
    copy_in(b);
  }

 private:
  void start_counters() override {
    cpu_at_start_ = decoder_->host_cpu_s();
    wait_at_start_ = decoder_->device_wait_s();
    in_next_at_start_ = in_next_s_;
  }
  double decoder_cpu_s() const override { return decoder_->host_cpu_s() - cpu_at_start_; }
  double feed_wait_s() override { return decoder_->device_wait_s() - wait_at_start_; }
  void describe(nlohmann::json& f) const override {
    f["decoder"] = "nvjpeg";
    f["threads"] = 1;
    f["nvjpeg_engine"] = decoder_->backend_name();
    f["decode_stream"] = "own, one batch ahead";
    f["host_in_decoder_s"] = in_next_s_ - in_next_at_start_;
  }

  std::unique_ptr<data::GpuDecoder> decoder_;
  double in_next_s_ = 0, in_next_at_start_ = 0, cpu_at_start_ = 0, wait_at_start_ = 0;
};

}  // namespace

bool is_folder_dataset(const std::string& dataset) {
  return dataset.starts_with(kFolderPrefix) && dataset.size() > std::string(kFolderPrefix).size();
}

bool trains_to_target(const std::string& dataset, double target_accuracy) {
  if (is_text_dataset(dataset)) return true;  // a GPT's run to target_loss; the feed takes images only
  return is_real_dataset(dataset) && !is_folder_dataset(dataset) && target_accuracy != 0;
}

std::unique_ptr<TrainFeed> make_train_feed(State& state, const std::string& dataset, const TrainOptions& o,
                                           std::uint64_t seed, nn::Graph& graph, const ZooModel& model,
                                           const ModelSpec& spec) {
  const bool nvjpeg = o.decoder == "nvjpeg";
  if (nvjpeg && !data::nvjpeg_in_build()) state.skip(data::kNoNvjpeg);
  if (nvjpeg && state.backend().info().kind != "cuda")
    state.skip("nvJPEG decodes on a GPU; this point's device is the CPU");
  FedSource source = open_source(dataset);
  if (nvjpeg && !source.folder)
    throw UsageError("decoder=nvjpeg decodes JPEG files: use dataset=folder:DIR (" + dataset + " holds raw pixels)");
  check_model_takes(source, model, spec);
  const DType input = graph.tensor(model.images).dtype;
  data::PipelineConfig config = feed_config(source, o, seed, input, model, spec);
  if (nvjpeg) return std::make_unique<NvjpegFeed>(state, std::move(source), std::move(config), graph, model);
  return std::make_unique<HostFeed>(state, std::move(source), std::move(config), graph, model);
}

}  // namespace ab::workloads::zoo
