// The data path's device side (data/device.h): the feeder's ordering of copies, compute and ring
// slots on a scripted copy queue (runs everywhere); on a GPU the copy stream, the augmentation
// kernel bit for bit against augment_into and nvJPEG decoding against the host pipeline (skip
// without a GPU, or without nvJPEG in the build); the `pipeline` workload's decoder axis.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/rng.h"
#include "data/device.h"
#include "data/pipeline.h"
#include "nn/cuda/device_kernels.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using ab::data::Image;
using Bytes = std::vector<std::uint8_t>;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Copies that land only when their ticket completes: when the host waits for it, or when the test
// says the step that read it ran (land). A ring slot released before its copy completed would be
// refilled by the workers first, and the batch would arrive wrong.
class ScriptedCopies final : public ab::data::CopyQueue {
 public:
  std::vector<std::string> log;
  void wait_for_compute() override { log.emplace_back("copy waits for compute"); }
  void upload(const ab::Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) override {
    pending_.push_back({recorded_ + 1, static_cast<std::uint8_t*>(dst.data) + offset, host, bytes});
    log.emplace_back("upload");
  }
  std::int64_t record() override {
    log.push_back("record " + std::to_string(++recorded_));
    return recorded_;
  }
  void compute_waits(std::int64_t ticket) override { log.push_back("compute waits " + std::to_string(ticket)); }
  bool finished(std::int64_t ticket) override { return ticket <= completed_; }
  void wait(std::int64_t ticket) override {
    log.push_back("host waits " + std::to_string(ticket));
    complete(ticket);
  }
  void land(std::int64_t ticket) { complete(ticket); }

 private:
  struct Copy {
    std::int64_t ticket;
    std::uint8_t* dst;
    const void* src;
    std::int64_t bytes;
  };
  void complete(std::int64_t ticket) {
    for (const auto& c : pending_)
      if (c.ticket <= ticket && c.ticket > completed_) std::memcpy(c.dst, c.src, static_cast<std::size_t>(c.bytes));
    completed_ = std::max(completed_, ticket);
  }
  std::vector<Copy> pending_;
  std::int64_t recorded_ = 0, completed_ = 0;
};

ab::data::ImageSet random_set(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t channels,
                              std::uint64_t seed) {
  ab::data::ImageSet s{n, h, w, channels, Bytes(static_cast<std::size_t>(n * h * w * channels)), {}, 7, "test"};
  for (std::size_t i = 0; i < s.pixels.size(); ++i) s.pixels[i] = static_cast<std::uint8_t>(ab::mix64(seed, i));
  for (std::int64_t i = 0; i < n; ++i) s.labels.push_back(static_cast<std::int32_t>(i % 7));
  return s;
}

// `batches` host batches of `source` under `c`: pixels and labels of each.
std::vector<std::pair<Bytes, std::vector<std::int32_t>>> host_batches(
    std::shared_ptr<const ab::data::SampleSource> source, const ab::data::PipelineConfig& c, int batches) {
  ab::data::HostPipeline p(std::move(source), c, nullptr);
  std::vector<std::pair<Bytes, std::vector<std::int32_t>>> out;
  for (int b = 0; b < batches; ++b) {
    const auto batch = p.acquire();
    const auto* px = static_cast<const std::uint8_t*>(batch.pixels);
    out.emplace_back(Bytes(px, px + p.batch_bytes()), std::vector<std::int32_t>(batch.labels, batch.labels + c.batch));
    p.release();
  }
  return out;
}

ab::data::PipelineConfig small_config() {
  ab::data::PipelineConfig c;
  c.batch = 3;
  c.threads = 2;
  c.ring_batches = 2;  // the fewest: the feeder must give each slot back before it takes a third
  c.seed = ab::test::seed();
  c.augment.height = c.augment.width = 6;
  c.augment.dtype = ab::DType::bf16;
  return c;
}

// How far the "GPU" is: every copy queued has landed before each next() (ahead); the batch handed
// out lands before the test reads it (consumed: a step ran on it); nothing lands until the host
// waits (lagging: the test reads batch b after the next call, which must have waited for it).
enum class Gpu { ahead, consumed, lagging };

void expect_batch(const ab::data::DeviceFeeder::DeviceBatch& d,
                  const std::pair<Bytes, std::vector<std::int32_t>>& want) {
  Bytes px(static_cast<std::size_t>(d.pixels.size_bytes()));
  std::memcpy(px.data(), d.pixels.data, px.size());
  std::vector<std::int32_t> labels(3);
  std::memcpy(labels.data(), d.labels.data, 12);
  EXPECT_EQ(px, want.first);
  EXPECT_EQ(labels, want.second);
}

void expect_ordered_feeding(Gpu gpu) {
  const auto set = random_set(20, 8, 9, 1, ab::test::seed());
  const auto c = small_config();
  const int steps = 13;  // 6 batches an epoch: two epochs and one more
  const auto want = host_batches(ab::data::raw_source(set), c, steps);
  auto kernels = ab::nn::make_ref_kernels();
  ab::data::HostPipeline pipeline(ab::data::raw_source(set), c, kernels.get());
  auto queue = std::make_unique<ScriptedCopies>();
  ScriptedCopies& copies = *queue;
  ab::data::DeviceFeeder feeder(pipeline, *kernels, std::move(queue));
  const ab::data::DeviceFeeder::DeviceBatch* previous = nullptr;
  for (int b = 0; b < steps; ++b) {
    SCOPED_TRACE("batch " + std::to_string(b));
    if (gpu == Gpu::ahead && b > 0) copies.land(b + 1);  // the newest ticket (batch b's): every copy queued
    copies.log.clear();
    const auto& d = feeder.next();
    EXPECT_EQ(d.index, b);
    EXPECT_EQ(d.epoch, b / 6);
    const auto at = std::find(copies.log.begin(), copies.log.end(), "compute waits " + std::to_string(b + 1));
    ASSERT_NE(at, copies.log.end()) << "the batch handed out is one the compute stream waits for";
    // Then the next batch's copy, behind the compute stream's work so far.
    const auto copy_wait = std::find(at, copies.log.end(), "copy waits for compute");
    ASSERT_NE(copy_wait, copies.log.end());
    ASSERT_GE(copies.log.end() - copy_wait, 4);
    EXPECT_EQ(*(copy_wait + 1), "upload");
    EXPECT_EQ(*(copy_wait + 3), "record " + std::to_string(b + 2));
    const auto waited = std::find_if(copies.log.begin(), copies.log.end(),
                                     [](const std::string& s) { return contains(s, "host waits"); });
    if (gpu == Gpu::lagging && b > 0) {
      ASSERT_NE(waited, copies.log.end()) << "every slot the feeder may hold was held: it waits for the oldest";
      EXPECT_EQ(*waited, "host waits " + std::to_string(b));
      expect_batch(*previous, want[static_cast<std::size_t>(b - 1)]);
    } else {
      EXPECT_EQ(waited, copies.log.end()) << "no wait while a slot is free";
    }
    EXPECT_EQ(feeder.held(), gpu == Gpu::ahead && b > 0 ? 1 : 2);
    if (gpu != Gpu::lagging) copies.land(b + 1);
    if (gpu != Gpu::lagging) expect_batch(d, want[static_cast<std::size_t>(b)]);
    previous = &d;
  }
}

TEST(DeviceFeederOrder, AGpuAheadGetsEverySlotBackAtOnce) { expect_ordered_feeding(Gpu::ahead); }
TEST(DeviceFeederOrder, SlotsGoBackAsTheirCopiesLand) { expect_ordered_feeding(Gpu::consumed); }
TEST(DeviceFeederOrder, ALaggingGpuMakesTheHostWaitForTheOldestCopy) { expect_ordered_feeding(Gpu::lagging); }

TEST(DeviceFeederOrder, OffAGpuTheCopiesRunOnTheKernelsStream) {
  auto backend = ab::backend::make_backend("cpu");
  auto kernels = ab::nn::make_ref_kernels();
  const auto set = random_set(12, 8, 9, 1, ab::test::seed());
  const auto c = small_config();
  const auto want = host_batches(ab::data::raw_source(set), c, 5);
  ab::data::HostPipeline pipeline(ab::data::raw_source(set), c, kernels.get());
  ab::data::DeviceFeeder feeder(pipeline, *kernels, ab::data::make_copy_queue(*backend, *kernels));
  for (std::size_t b = 0; b < want.size(); ++b) {
    const auto& d = feeder.next();
    Bytes px(static_cast<std::size_t>(d.pixels.size_bytes()));
    kernels->download_bytes(d.pixels, 0, px.data(), d.pixels.size_bytes());
    kernels->synchronize();
    EXPECT_EQ(px, want[b].first) << b;
  }
  EXPECT_THROW(ab::data::augment_on_gpu(*backend, {Image{}}, {ab::data::CropBox{}}, c.augment), ab::Unsupported);
  EXPECT_THROW(ab::data::make_nvjpeg_decoder(ab::data::raw_source(set), c, *backend, *kernels, "auto"),
               ab::Unsupported);
}

bool has_gpu() { return ab::backend::best_device() != "cpu"; }

// Every output type, grey and colour sources, random-resized crops with flips, and padded crops.
TEST(GpuAugment, MatchesTheHostBitForBit) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device: a build without CUDA, or no GPU answers";
  auto backend = ab::backend::make_backend("cuda:0");
  const std::uint64_t seed = ab::test::seed();
  for (const ab::DType dtype : {ab::DType::f32, ab::DType::f16, ab::DType::bf16})
    for (const std::int64_t channels : {1, 3})
      for (const bool padded : {false, true}) {
        SCOPED_TRACE(std::string(ab::to_string(dtype)) + " channels " + std::to_string(channels) +
                     (padded ? " padded" : ""));
        ab::data::Augment a;
        a.height = 17;
        a.width = 23;
        a.dtype = dtype;
        a.random_crop = !padded;
        a.pad = padded ? 3 : 0;
        std::vector<Image> images;
        std::vector<ab::data::CropBox> boxes;
        for (std::uint64_t i = 0; i < 6; ++i) {
          const auto h = static_cast<std::int64_t>(20 + ab::mix64(seed, i) % 40);
          const auto w = static_cast<std::int64_t>(15 + ab::mix64(seed, 100 + i) % 50);
          Image im{h, w, channels, Bytes(static_cast<std::size_t>(h * w * channels))};
          for (std::size_t k = 0; k < im.pixels.size(); ++k)
            im.pixels[k] = static_cast<std::uint8_t>(ab::mix64(seed + i, k));
          boxes.push_back(ab::data::choose_crop(a, im.height, im.width, seed, i));
          images.push_back(std::move(im));
        }
        const Bytes gpu = ab::data::augment_on_gpu(*backend, images, boxes, a);
        const auto sample =
            static_cast<std::size_t>(a.height * a.width * 3 * static_cast<std::int64_t>(size_bytes(dtype)));
        ASSERT_EQ(gpu.size(), sample * images.size());
        for (std::size_t i = 0; i < images.size(); ++i) {
          Bytes host(sample);
          ab::data::augment_into(images[i], a, boxes[i], host.data());
          EXPECT_EQ(Bytes(gpu.begin() + static_cast<std::ptrdiff_t>(i * sample),
                          gpu.begin() + static_cast<std::ptrdiff_t>((i + 1) * sample)),
                    host)
              << "image " << i;
        }
      }
}

TEST(DeviceFeederGpu, TheCopyStreamDeliversTheHostBatches) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device: a build without CUDA, or no GPU answers";
  auto backend = ab::backend::make_backend("cuda:0");
  auto kernels = ab::nn::make_device_kernels(*backend);
  const auto set = random_set(40, 30, 26, 3, ab::test::seed());
  auto c = small_config();
  c.augment.height = c.augment.width = 24;
  const auto want = host_batches(ab::data::raw_source(set), c, 20);
  ab::data::HostPipeline pipeline(ab::data::raw_source(set), c, kernels.get());
  ab::data::DeviceFeeder feeder(pipeline, *kernels, ab::data::make_copy_queue(*backend, *kernels));
  for (std::size_t b = 0; b < want.size(); ++b) {
    const auto& d = feeder.next();
    Bytes px(static_cast<std::size_t>(d.pixels.size_bytes()));
    std::vector<std::int32_t> labels(3);
    kernels->download_bytes(d.pixels, 0, px.data(), d.pixels.size_bytes());
    kernels->download_bytes(d.labels, 0, labels.data(), 12);
    kernels->synchronize();
    EXPECT_EQ(px, want[b].first) << b;
    EXPECT_EQ(labels, want[b].second) << b;
  }
}

// Smooth pictures (a gradient and a low-frequency wave per channel), so two JPEG decoders' rounding
// and chroma upsampling differ by a few levels at most.
std::vector<Bytes> smooth_jpegs(int n, std::uint64_t seed) {
  std::vector<Bytes> files;
  for (int i = 0; i < n; ++i) {
    const auto h = static_cast<std::int64_t>(48 + ab::mix64(seed, static_cast<std::uint64_t>(i)) % 64);
    const auto w = static_cast<std::int64_t>(48 + ab::mix64(seed + 1, static_cast<std::uint64_t>(i)) % 64);
    Image im{h, w, 3, Bytes(static_cast<std::size_t>(h * w * 3))};
    const double phase = static_cast<double>(ab::mix64(seed + 2, static_cast<std::uint64_t>(i)) % 628) / 100.0;
    for (std::int64_t y = 0; y < h; ++y)
      for (std::int64_t x = 0; x < w; ++x)
        for (std::int64_t ch = 0; ch < 3; ++ch)
          im.pixels[static_cast<std::size_t>((y * w + x) * 3 + ch)] =
              static_cast<std::uint8_t>(128 + 60 * std::sin(phase + 0.05 * static_cast<double>(x + 2 * ch * y)) +
                                        0.5 * static_cast<double>(y - h / 2));
    files.push_back(ab::data::encode_jpeg(im, 95));
  }
  return files;
}

TEST(NvjpegGpu, DecodesAndAugmentsLikeTheHostPipeline) {
  if (!ab::data::nvjpeg_in_build()) GTEST_SKIP() << ab::data::kNoNvjpeg;
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device answers";
  auto backend = ab::backend::make_backend("cuda:0");
  auto kernels = ab::nn::make_device_kernels(*backend);
  const auto files = smooth_jpegs(40, ab::test::seed());
  std::vector<std::int32_t> labels;
  for (int i = 0; i < 40; ++i) labels.push_back(i);
  std::shared_ptr<const ab::data::SampleSource> source = ab::data::encoded_source(files, labels, 40);
  ab::data::PipelineConfig c;
  c.batch = 8;
  c.threads = 1;
  c.seed = ab::test::seed();
  c.augment.height = c.augment.width = 32;
  c.augment.dtype = ab::DType::f32;
  const auto want = host_batches(source, c, 7);  // 5 batches an epoch: into the second epoch
  for (const std::string engine : {"auto", "gpu"}) {
    SCOPED_TRACE(engine);
    auto decoder = ab::data::make_nvjpeg_decoder(source, c, *backend, *kernels, engine);
    EXPECT_TRUE(decoder->backend_name() == "hardware" || decoder->backend_name() == "gpu") << decoder->backend_name();
    for (std::size_t b = 0; b < want.size(); ++b) {
      const auto& d = decoder->next();
      EXPECT_EQ(d.index, static_cast<std::int64_t>(b));
      std::vector<float> px(static_cast<std::size_t>(d.pixels.numel()));
      std::vector<std::int32_t> got_labels(8);
      kernels->download_bytes(d.pixels, 0, px.data(), d.pixels.size_bytes());
      kernels->download_bytes(d.labels, 0, got_labels.data(), 32);
      kernels->synchronize();
      EXPECT_EQ(got_labels, want[b].second) << "the host pipeline's order, batch " << b;
      std::vector<float> host(px.size());
      std::memcpy(host.data(), want[b].first.data(), host.size() * 4);
      double worst = 0, sum = 0;
      for (std::size_t k = 0; k < px.size(); ++k) {
        const double diff = std::abs(static_cast<double>(px[k]) - host[k]);
        worst = std::max(worst, diff);
        sum += diff;
      }
      // One level is 1/255/std = 0.017 to 0.018 after normalisation: a mean under 2 levels, no
      // pixel more than 12 away (a wrong box, flip or order is tens of levels everywhere).
      EXPECT_LT(sum / static_cast<double>(px.size()), 0.035) << "batch " << b;
      EXPECT_LT(worst, 0.21) << "batch " << b;
    }
  }
}

// decode_ahead (a stream of its own, one batch ahead) gives the plain decoder's batches bit for
// bit and in order, each read by work queued on the compute stream before the next call: the
// downloads are queued and waited for only at the end, so a decode that overwrote a batch still
// to be read, or a read before its decode finished, would show.
TEST(NvjpegGpu, DecodingAheadGivesTheSameBatchesInOrder) {
  if (!ab::data::nvjpeg_in_build()) GTEST_SKIP() << ab::data::kNoNvjpeg;
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device answers";
  auto backend = ab::backend::make_backend("cuda:0");
  auto kernels = ab::nn::make_device_kernels(*backend);
  const auto files = smooth_jpegs(24, ab::test::seed());
  std::vector<std::int32_t> labels(24);
  for (int i = 0; i < 24; ++i) labels[static_cast<std::size_t>(i)] = i;
  std::shared_ptr<const ab::data::SampleSource> source = ab::data::encoded_source(files, labels, 24);
  ab::data::PipelineConfig c;
  c.batch = 6;
  c.seed = ab::test::seed();
  c.augment.height = c.augment.width = 32;
  const auto batches = [&](ab::data::GpuDecoder& decoder) {
    std::vector<std::vector<std::uint8_t>> out(7);  // 4 batches an epoch: into the second epoch
    std::vector<std::vector<std::int32_t>> out_labels(out.size(), std::vector<std::int32_t>(6));
    for (std::size_t b = 0; b < out.size(); ++b) {
      const auto& d = decoder.next();
      EXPECT_EQ(d.index, static_cast<std::int64_t>(b));
      out[b].resize(static_cast<std::size_t>(d.pixels.size_bytes()));
      kernels->download_bytes(d.pixels, 0, out[b].data(), d.pixels.size_bytes());
      kernels->download_bytes(d.labels, 0, out_labels[b].data(), 24);
    }
    kernels->synchronize();
    return std::make_pair(out, out_labels);
  };
  auto plain = ab::data::make_nvjpeg_decoder(source, c, *backend, *kernels, "auto");
  const auto want = batches(*plain);
  auto ahead = ab::data::decode_ahead(*backend, [&](ab::backend::Backend& decode) {
    return ab::data::make_nvjpeg_decoder(source, c, decode, *kernels, "auto");
  });
  const auto got = batches(*ahead);
  EXPECT_EQ(got.second, want.second) << "labels out of order";
  for (std::size_t b = 0; b < want.first.size(); ++b) EXPECT_TRUE(got.first[b] == want.first[b]) << "batch " << b;
  EXPECT_GE(ahead->device_wait_s(), 0.0);
}

// The decoder axis on the CPU: the cpu decoder's records carry CPU use per image and images/s per
// core; an nvjpeg point skips and says why.
TEST(PipelineWorkload, RecordsPerCoreRatesAndSkipsNvjpegOffAGpu) {
  ab::test::TempDir tmp;
  const auto set = random_set(24, 40, 48, 3, ab::test::seed());
  for (std::int64_t i = 0; i < set.count; ++i) {
    const fs::path dir = tmp.path() / "set" / std::to_string(set.labels[static_cast<std::size_t>(i)]);
    fs::create_directories(dir);
    const auto bytes = ab::data::encode_jpeg(ab::data::image_of(set, i), 85);
    std::ofstream(dir / (std::to_string(i) + ".jpg"), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  const auto ran = ab::test::accelbench({"run",
                                         "pipeline",
                                         "--device",
                                         "cpu",
                                         "--option",
                                         "folder=" + (tmp.path() / "set").string(),
                                         "--option",
                                         "batch=8",
                                         "--axis",
                                         "image_px=32",
                                         "--axis",
                                         "threads=2",
                                         "--axis",
                                         "decoder=cpu,nvjpeg",
                                         "--min-time",
                                         "0.05",
                                         "--max-noise",
                                         "50",
                                         "--timeout",
                                         "30",
                                         "--quiet",
                                         "--out",
                                         (tmp.path() / "out").string()});
  ASSERT_EQ(ran.code, 0) << ran.output;
  const auto records = ab::test::read_records(tmp.path() / "out");
  ASSERT_EQ(records.size(), 2u);
  for (const auto& r : records) {
    SCOPED_TRACE(r.dump());
    if (r["params"]["decoder"] == "nvjpeg") {
      EXPECT_EQ(r["status"], "skipped");
      EXPECT_TRUE(contains(r.value("reason", ""), "nvJPEG")) << r.value("reason", "");
      continue;
    }
    ASSERT_EQ(r["status"], "ok");
    const auto& m = r["metrics"];
    EXPECT_EQ(m["decoding_cores"], 2);
    const double rate = r["rates"]["samples_per_s"].get<double>();
    EXPECT_NEAR(m["images_per_s_per_core"].get<double>(), rate / 2, rate * 1e-9);
    EXPECT_GT(m["process_cpu_ms_per_image"].get<double>(), 0.0);
    EXPECT_GT(m["cpu_ms_per_image"].get<double>(), 0.0);
  }
}

}  // namespace
