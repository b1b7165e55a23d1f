// `pipeline`: the input pipeline (src/data) alone, at each thread count: images/s decoded and
// augmented into batches on the host's worker threads, or on the GPU through nvJPEG, with the CPU
// time per image and the images/s per core (docs/METHODOLOGY.md, "Input pipeline").
#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <sys/resource.h>

#include "core/error.h"
#include "data/device.h"
#include "data/pipeline.h"
#include "nn/cuda/device_kernels.h"
#include "workloads/micro/micro.h"

namespace ab::workloads::micro {
namespace {

std::vector<std::string> thread_counts() {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<std::string> v;
  for (int t = 1; t < cores; t *= 2) v.push_back(std::to_string(t));
  v.push_back(std::to_string(cores));
  return v;
}

std::string listed(const std::vector<data::UnreadableFile>& bad) {
  std::string s;
  for (std::size_t i = 0; i < std::min<std::size_t>(bad.size(), 10); ++i)
    s += (i ? "; " : "") + bad[i].path.string() + " (" + bad[i].reason + ")";
  return s;
}

class Pipeline final : public Workload {
 public:
  std::string name() const override { return "pipeline"; }
  std::string description() const override {
    return "The input pipeline: worker threads decode JPEG/PNG and augment (random-resized crop, flip, normalise, "
           "NHWC 16-bit) into a ring of pinned batches, or (decoder=nvjpeg) nvJPEG decodes each batch on the GPU and a "
           "kernel augments it there. images/s, CPU ms per image and images/s per core by thread count, on --option "
           "folder=DIR or on JPEGs made in memory from Fashion-MNIST.";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    std::vector<std::string> decoders{"cpu"};
    if (device_kind == "cuda") decoders.emplace_back("nvjpeg");
    return {{"decoder",
             AxisKind::text,
             decoders,
             {"cpu", "nvjpeg"},
             "cpu: worker threads decode (libjpeg-turbo) and augment; nvjpeg: nvJPEG decodes a batch on the GPU and a "
             "kernel augments it there"},
            {"threads", AxisKind::integer, thread_counts(), {}, "decoding and augmenting worker threads (cpu decoder)"},
            {"image_px", AxisKind::integer, {"224"}, {}, "side of the augmented output, pixels"}};
  }
  std::vector<OptionSpec> options() const override {
    return {
        {"folder",
         AxisKind::text,
         "",
         {},
         "image folder (a subfolder per class); empty: JPEGs made from Fashion-MNIST"},
        {"source_px", AxisKind::integer, "224", {}, "side of the JPEGs made from Fashion-MNIST"},
        {"images", AxisKind::integer, "1024", {}, "Fashion-MNIST images made into JPEGs"},
        {"quality", AxisKind::integer, "90", {}, "JPEG quality of the made set"},
        {"batch", AxisKind::integer, "64", {}, "images per batch (one batch per iteration)"},
        {"dtype", AxisKind::text, "bf16", {"bf16", "f16", "f32"}, "output element type"},
        {"unreadable",
         AxisKind::text,
         "skip",
         {"skip", "refuse"},
         "files of the folder that are no JPEG/PNG: left out, counted and named in the record, or refused"},
        {"feed",
         AxisKind::text,
         "host",
         {"host", "device"},
         "host: batches end in the pinned ring; device: each is also copied to the device (the feeder)"},
        {"nvjpeg_engine",
         AxisKind::text,
         "auto",
         {"auto", "hardware", "gpu"},
         "nvJPEG backend: the GPU's JPEG engines (hardware), its GPU-assisted hybrid (gpu), or hardware where the GPU "
         "has them (auto)"},
        {"seed", AxisKind::integer, "1", {}, "order and augmentation seed"}};
  }
  void run(State& state) override {
    const bool nvjpeg = state.get_text("decoder") == "nvjpeg";
    if (nvjpeg && !data::nvjpeg_in_build()) state.skip(data::kNoNvjpeg);
    if (nvjpeg && state.backend().info().kind != "cuda")
      state.skip("nvJPEG decodes on a GPU; this point's device is the CPU");
    if (nvjpeg && state.get_int("threads") != 1)
      state.skip("nvJPEG: one host thread reads the files and feeds the GPU decoder (threads=1 only)");
    auto source = source_for(state);
    const data::PipelineConfig config = config_for(state);
    // Page-locked through the engine's kernels where the device is a GPU; plain memory on the host.
    const bool to_device = nvjpeg || state.option_text("feed") == "device";
    std::unique_ptr<nn::Kernels> kernels;
    if (to_device || state.backend().info().kind == "cuda") kernels = nn::make_device_kernels(state.backend());
    state.set_counts({static_cast<double>(config.batch), 0.0, 0.0, "FLOP"});
    const double process_before = process_cpu_seconds();
    double images = 0, decoder_cpu_s = 0;
    int cores = config.threads;
    if (nvjpeg) {
      auto decoder =
          data::make_nvjpeg_decoder(source, config, state.backend(), *kernels, state.option_text("nvjpeg_engine"));
      decoder->next();  // the first batch sizes nvJPEG's buffers: outside the window
      kernels->synchronize();
      const double cpu_before = decoder->host_cpu_s();
      std::int64_t batches = 0;
      state.exec([&] {
        decoder->next();
        ++batches;
      });
      kernels->synchronize();
      images = static_cast<double>(batches * config.batch);
      decoder_cpu_s = decoder->host_cpu_s() - cpu_before;
      cores = 1;
      state.add_metric("nvjpeg_engine", decoder->backend_name());
    } else {
      data::HostPipeline pipeline(source, config, kernels.get());
      std::optional<data::DeviceFeeder> feeder;
      if (to_device) feeder.emplace(pipeline, *kernels, data::make_copy_queue(state.backend(), *kernels));
      const auto before = pipeline.stats();
      state.exec([&] {
        if (feeder) {
          feeder->next();
        } else {
          pipeline.acquire();
          pipeline.release();
        }
      });
      if (kernels) kernels->synchronize();
      const auto after = pipeline.stats();
      images = static_cast<double>(after.samples - before.samples);
      decoder_cpu_s = after.worker_cpu_s - before.worker_cpu_s;
      state.add_metric("host_memory", state.backend().info().kind == "cuda" ? "pinned" : "plain");
      state.add_metric("feed", state.option_text("feed"));
    }
    record_cpu(state, images, decoder_cpu_s, process_cpu_seconds() - process_before, cores, config.batch);
    state.add_metric("source_images", source->size());
    state.add_metric("mean_encoded_bytes", source->encoded_bytes() / std::max<std::int64_t>(source->size(), 1));
  }

 private:
  static double process_cpu_seconds() {
    rusage ru{};
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  }

  static data::PipelineConfig config_for(State& state) {
    data::PipelineConfig config;
    config.threads = static_cast<int>(state.get_int("threads"));
    config.batch = state.option_int("batch");
    config.seed = static_cast<std::uint64_t>(state.option_int("seed"));
    config.augment.height = config.augment.width = state.get_int("image_px");
    config.augment.dtype = parse_dtype(state.option_text("dtype"));
    if (config.threads < 1 || config.threads > 1024) throw UsageError("pipeline needs threads in 1..1024");
    if (config.augment.height < 8 || config.augment.height > 4096)
      throw UsageError("pipeline needs image_px in 8..4096");
    return config;
  }

  // CPU time per image: the decoding threads' own clocks (the workers, or the thread feeding nvJPEG)
  // and the whole process's (getrusage: the harness's threads too), over the measured window and the
  // images it finished; images/s per core divides the point's rate by the cores that decode.
  static void record_cpu(State& state, double images, double decoder_cpu_s, double process_cpu_s, int cores,
                         std::int64_t batch) {
    const double cpu_ms_per_image = images > 0 ? 1e3 * decoder_cpu_s / images : 0.0;
    state.add_metric("cpu_ms_per_image", cpu_ms_per_image);
    state.add_metric("images_per_cpu_s", cpu_ms_per_image > 0 ? 1e3 / cpu_ms_per_image : 0.0);
    state.add_metric("process_cpu_ms_per_image", images > 0 ? 1e3 * process_cpu_s / images : 0.0);
    state.add_metric("decoding_cores", cores);
    const auto& result = state.result();
    if (result && result->summary.median > 0)
      state.add_metric("images_per_s_per_core", static_cast<double>(batch) / result->summary.median / cores);
  }

  // The source for the point's options, kept between points: making the JPEG set takes seconds.
  std::shared_ptr<const data::SampleSource> source_for(State& state) {
    const std::string folder = state.option_text("folder");
    const std::string key = folder + "|" + state.option_text("source_px") + "|" + state.option_text("images") + "|" +
                            state.option_text("quality") + "|" + state.option_text("unreadable");
    std::lock_guard lock(mutex_);
    auto& cached = sources_[key];
    if (!cached.source) cached = make_source(state, folder);
    state.add_metric("source", cached.description);
    if (!folder.empty()) {
      state.add_metric("unreadable_files", cached.unreadable.size());
      if (!cached.unreadable.empty()) state.add_metric("unreadable_named", listed(cached.unreadable));
    }
    return cached.source;
  }

  struct Cached {
    std::shared_ptr<const data::SampleSource> source;
    std::string description;
    std::vector<data::UnreadableFile> unreadable;
  };

  static Cached make_source(State& state, const std::string& folder) {
    if (!folder.empty()) {
      data::ImageFolder f = data::scan_image_folder(folder, state.option_text("unreadable") == "refuse");
      auto unreadable = f.unreadable;
      return {data::folder_source(std::move(f)), "folder:" + folder, std::move(unreadable)};
    }
    const std::int64_t px = state.option_int("source_px"), images = state.option_int("images");
    const auto quality = static_cast<int>(state.option_int("quality"));
    if (px < 8 || px > 4096 || images < 1 || quality < 1 || quality > 100)
      throw UsageError("pipeline needs source_px in 8..4096, images >= 1 and quality in 1..100");
    data::ImageSet set;
    try {
      set = data::read_fashion_mnist("train");
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      state.skip(std::string(e.what()) + "; or give --option folder=DIR");
    }
    return {data::jpeg_source(set, px, quality, images),
            "fashion-mnist:train as " + std::to_string(px) + " px JPEG (quality " + std::to_string(quality) +
                "), in memory",
            {}};
  }

  std::mutex mutex_;
  std::map<std::string, Cached> sources_;
};

}  // namespace

std::unique_ptr<Workload> make_pipeline() { return std::make_unique<Pipeline>(); }

}  // namespace ab::workloads::micro
