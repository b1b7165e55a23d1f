// The host input pipeline: order per epoch and rank, the crop and normalisation, batches that do not
// depend on the thread count, errors from workers, the device feeder on the reference kernels,
// and the `pipeline` workload through the command line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "data/pipeline.h"
#include "nn/cuda/device_kernels.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using ab::data::Augment;
using ab::data::Image;
using ab::test::TempDir;
using Bytes = std::vector<std::uint8_t>;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// n random grey images h x w; sample i's label is i, so a batch's labels say which samples it holds.
ab::data::ImageSet indexed_set(std::int64_t n, std::int64_t h, std::int64_t w, std::uint64_t seed) {
  ab::data::ImageSet s{n, h, w, 1, Bytes(static_cast<std::size_t>(n * h * w)), {}, static_cast<int>(n), "test"};
  for (std::size_t i = 0; i < s.pixels.size(); ++i) s.pixels[i] = static_cast<std::uint8_t>(ab::mix64(seed, i));
  for (std::int64_t i = 0; i < n; ++i) s.labels.push_back(static_cast<std::int32_t>(i));
  return s;
}

TEST(EpochOrder, ShardsAreDisjointPermutationsFixedBySeedAndEpoch) {
  const std::uint64_t seed = ab::test::seed();
  const auto a = ab::data::epoch_order(103, seed, 0, 0, 1, true);
  EXPECT_EQ(a, ab::data::epoch_order(103, seed, 0, 0, 1, true));
  EXPECT_NE(a, ab::data::epoch_order(103, seed, 1, 0, 1, true)) << "each epoch its own order";
  EXPECT_EQ(std::set<std::int64_t>(a.begin(), a.end()).size(), 103u);
  std::vector<std::int64_t> identity(103);
  for (int i = 0; i < 103; ++i) identity[static_cast<std::size_t>(i)] = i;
  EXPECT_NE(a, identity);
  EXPECT_EQ(ab::data::epoch_order(103, seed, 4, 0, 1, false), identity);
  std::set<std::int64_t> seen;
  for (int rank = 0; rank < 4; ++rank) {
    const auto mine = ab::data::epoch_order(103, seed, 2, rank, 4, true);
    EXPECT_EQ(mine.size(), 25u) << "103 / 4: every rank as many, the rest left out";
    seen.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(seen.size(), 100u) << "no sample on two ranks";
  EXPECT_TRUE(
      contains(ab::test::error_message<ab::Error>([] { ab::data::epoch_order(10, 1, 0, 2, 2, true); }), "rank 2 of 2"));
}

TEST(Augment, CropsStayInsideAndFollowScaleAndRatio) {
  Augment a;
  const std::uint64_t seed = ab::test::seed();
  int flipped = 0;
  for (std::uint64_t key = 0; key < 500; ++key) {
    const auto box = ab::data::choose_crop(a, 300, 400, seed, key);
    const auto again = ab::data::choose_crop(a, 300, 400, seed, key);
    ASSERT_EQ(box.x, again.x);
    ASSERT_EQ(box.height, again.height);
    ASSERT_GE(box.y, 0);
    ASSERT_GE(box.x, 0);
    ASSERT_LE(box.y + box.height, 300);
    ASSERT_LE(box.x + box.width, 400);
    const double area = static_cast<double>(box.height * box.width) / (300.0 * 400.0);
    const double ratio = static_cast<double>(box.width) / static_cast<double>(box.height);
    ASSERT_GE(area, 0.08 * 0.95) << key;
    ASSERT_LE(area, 1.0) << key;
    ASSERT_GE(ratio, 0.75 * 0.97) << key;
    ASSERT_LE(ratio, 4.0 / 3.0 * 1.03) << key;
    flipped += box.flip ? 1 : 0;
  }
  EXPECT_GT(flipped, 200);
  EXPECT_LT(flipped, 300);
}

TEST(Augment, NormalisesEachChannelAndMirrors) {
  Image im{5, 7, 3, Bytes(105)};
  const std::uint64_t seed = ab::test::seed();
  for (std::size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<std::uint8_t>(ab::mix64(seed, i));
  Augment a;
  a.height = 5;
  a.width = 7;
  a.random_crop = false;
  a.dtype = ab::DType::f32;
  std::vector<float> out(105), mirrored(105);
  ab::data::augment_into(im, a, {0, 0, 5, 7, false}, out.data());
  ab::data::augment_into(im, a, {0, 0, 5, 7, true}, mirrored.data());
  for (std::size_t y = 0; y < 5; ++y)
    for (std::size_t x = 0; x < 7; ++x)
      for (std::size_t c = 0; c < 3; ++c) {
        const std::size_t at = (y * 7 + x) * 3 + c;
        const double want = (im.pixels[at] / 255.0 - a.mean[c]) / a.stddev[c];
        ASSERT_NEAR(out[at], want, 1e-5) << y << "," << x << "," << c;
        ASSERT_EQ(mirrored[at], out[(y * 7 + (6 - x)) * 3 + c]);
      }
  // 16-bit outputs are the f32 values rounded once.
  std::vector<std::uint16_t> bf16(105), f16(105);
  a.dtype = ab::DType::bf16;
  ab::data::augment_into(im, a, {0, 0, 5, 7, false}, bf16.data());
  a.dtype = ab::DType::f16;
  ab::data::augment_into(im, a, {0, 0, 5, 7, false}, f16.data());
  for (std::size_t i = 0; i < 105; ++i) {
    ASSERT_EQ(bf16[i], ab::float_to_bf16_bits(out[i])) << i;
    ASSERT_EQ(f16[i], ab::float_to_half_bits(out[i])) << i;
  }
}

TEST(Augment, PaddedCropsShiftTheImageOverBlackBorders) {
  Image im{5, 7, 1, Bytes(35)};
  const std::uint64_t seed = ab::test::seed();
  for (std::size_t i = 0; i < im.pixels.size(); ++i)
    im.pixels[i] = static_cast<std::uint8_t>(1 + ab::mix64(seed, i) % 255);
  Augment a;
  a.height = 5;
  a.width = 7;
  a.channels = 1;
  a.random_crop = false;
  a.flip = false;
  a.pad = 2;
  a.dtype = ab::DType::f32;
  std::set<std::pair<std::int64_t, std::int64_t>> offsets;
  std::vector<float> out(35);
  for (std::uint64_t key = 0; key < 200; ++key) {
    const auto box = ab::data::choose_crop(a, 5, 7, seed, key);
    ASSERT_TRUE(box.y >= 0 && box.y <= 4 && box.x >= 0 && box.x <= 4) << box.y << "," << box.x;
    ASSERT_EQ(box.height, 5);
    ASSERT_EQ(box.width, 7);
    offsets.insert({box.y, box.x});
    ab::data::augment_into(im, a, box, out.data());
    for (std::int64_t y = 0; y < 5; ++y)
      for (std::int64_t x = 0; x < 7; ++x) {
        const std::int64_t sy = y + box.y - 2, sx = x + box.x - 2;
        const double v =
            sy < 0 || sy >= 5 || sx < 0 || sx >= 7 ? 0.0 : im.pixels[static_cast<std::size_t>(sy * 7 + sx)];
        ASSERT_NEAR(out[static_cast<std::size_t>(y * 7 + x)], (v / 255.0 - a.mean[0]) / a.stddev[0], 1e-5) << key;
      }
  }
  EXPECT_EQ(offsets.size(), 25u) << "every shift of 0..4 in y and x occurs";
}

// Every batch of `batches` from a pipeline over `set`: pixels and labels.
std::vector<std::pair<Bytes, std::vector<std::int32_t>>> drain(const ab::data::ImageSet& set,
                                                               const ab::data::PipelineConfig& c, int batches) {
  ab::data::HostPipeline p(ab::data::raw_source(set), c, nullptr);
  std::vector<std::pair<Bytes, std::vector<std::int32_t>>> out;
  for (int b = 0; b < batches; ++b) {
    const auto batch = p.acquire();
    EXPECT_EQ(batch.index, b);
    EXPECT_EQ(batch.epoch, b / p.batches_per_epoch());
    const auto* px = static_cast<const std::uint8_t*>(batch.pixels);
    out.emplace_back(Bytes(px, px + p.batch_bytes()), std::vector<std::int32_t>(batch.labels, batch.labels + c.batch));
    p.release();
  }
  return out;
}

TEST(HostPipeline, BatchesFollowTheEpochOrderAndHoldEachSampleAugmented) {
  const auto set = indexed_set(23, 6, 5, ab::test::seed());
  ab::data::PipelineConfig c;
  c.batch = 4;
  c.threads = 3;
  c.seed = ab::test::seed();
  c.augment = {
      6, 5, 3, false, 0.08, 1, 0.75, 4.0 / 3.0, false, {0.5F, 0.4F, 0.3F}, {0.2F, 0.25F, 0.3F}, ab::DType::bf16};
  const auto batches = drain(set, c, 11);  // 5 batches an epoch (23 / 4): two epochs and one more
  for (int b = 0; b < 11; ++b) {
    const auto order = ab::data::epoch_order(23, c.seed, b / 5, 0, 1, true);
    for (std::int64_t s = 0; s < 4; ++s) {
      const std::int64_t want = order[static_cast<std::size_t>((b % 5) * 4 + s)];
      ASSERT_EQ(batches[static_cast<std::size_t>(b)].second[static_cast<std::size_t>(s)], want) << b << "," << s;
      std::vector<std::uint16_t> expect(6 * 5 * 3);
      ab::data::augment_into(ab::data::image_of(set, want), c.augment, {0, 0, 6, 5, false}, expect.data());
      ASSERT_EQ(std::memcmp(batches[static_cast<std::size_t>(b)].first.data() + s * 180, expect.data(), 180), 0)
          << b << "," << s;
    }
  }
}

TEST(HostPipeline, TheSeedAloneFixesTheBatchesWhateverTheThreadCount) {
  const auto set = indexed_set(40, 12, 10, ab::test::seed());
  ab::data::PipelineConfig c;
  c.batch = 6;
  c.seed = ab::test::seed();
  c.augment.height = c.augment.width = 8;  // random-resized crops and flips, grey to RGB
  c.threads = 1;
  const auto one = drain(set, c, 13);
  c.threads = 4;
  c.ring_batches = 5;
  const auto four = drain(set, c, 13);
  ASSERT_EQ(one.size(), four.size());
  for (std::size_t b = 0; b < one.size(); ++b) {
    EXPECT_EQ(one[b].second, four[b].second) << b;
    EXPECT_EQ(one[b].first, four[b].first) << b;
  }
  c.seed += 1;
  EXPECT_NE(drain(set, c, 1)[0].second, one[0].second) << "another seed, another order";
}

TEST(HostPipeline, RanksReadDisjointShards) {
  const auto set = indexed_set(30, 4, 4, ab::test::seed());
  ab::data::PipelineConfig c;
  c.batch = 5;
  c.threads = 2;
  c.augment.height = c.augment.width = 4;
  c.ranks = 3;
  std::set<std::int32_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    c.rank = rank;
    for (const auto& [pixels, labels] : drain(set, c, 2)) seen.insert(labels.begin(), labels.end());
  }
  EXPECT_EQ(seen.size(), 30u) << "three ranks of 10 samples each cover the epoch once";
}

TEST(HostPipeline, AWorkersDecodingErrorReachesTheConsumerNamingTheSample) {
  std::vector<std::vector<std::uint8_t>> files;
  const std::uint64_t seed = ab::test::seed();
  for (int i = 0; i < 8; ++i) {
    Image im{8, 8, 3, Bytes(192)};
    for (std::size_t k = 0; k < im.pixels.size(); ++k) im.pixels[k] = static_cast<std::uint8_t>(ab::mix64(seed + i, k));
    files.push_back(ab::data::encode_jpeg(im, 90));
  }
  files[5].resize(files[5].size() / 3);
  ab::data::PipelineConfig c;
  c.batch = 8;
  c.threads = 2;
  c.shuffle = false;
  c.augment.height = c.augment.width = 8;
  ab::data::HostPipeline p(ab::data::encoded_source(files, std::vector<std::int32_t>(8, 0), 1), c, nullptr);
  const std::string e = ab::test::error_message<ab::Error>([&] { p.acquire(); });
  EXPECT_TRUE(contains(e, "in-memory image 5: bad JPEG")) << e;
  EXPECT_TRUE(contains(ab::test::usage_error([&] {
                         c.batch = 9;
                         ab::data::HostPipeline(ab::data::encoded_source(files, std::vector<std::int32_t>(8, 0), 1), c,
                                                nullptr);
                       }),
                       "make no batch of 9"));
}

// The feeder's device batches, read back, against a pipeline of the same settings without one.
void expect_feeder_delivers_the_host_batches(ab::nn::Kernels& kernels) {
  const auto set = indexed_set(24, 9, 9, ab::test::seed());
  ab::data::PipelineConfig c;
  c.batch = 4;
  c.threads = 2;
  c.seed = ab::test::seed();
  c.augment.height = c.augment.width = 7;
  c.augment.dtype = ab::DType::f16;
  const auto want = drain(set, c, 9);
  ab::data::HostPipeline pipeline(ab::data::raw_source(set), c, &kernels);
  ab::data::DeviceFeeder feeder(pipeline, kernels);
  for (std::size_t b = 0; b < want.size(); ++b) {
    const auto& d = feeder.next();
    EXPECT_EQ(d.index, static_cast<std::int64_t>(b));
    EXPECT_EQ(d.pixels.shape, (ab::Shape{4, 7, 7, 3}));
    EXPECT_EQ(d.pixels.layout, ab::Layout::nhwc);
    Bytes px(static_cast<std::size_t>(d.pixels.size_bytes()));
    std::vector<std::int32_t> labels(4);
    kernels.download_bytes(d.pixels, 0, px.data(), d.pixels.size_bytes());
    kernels.download_bytes(d.labels, 0, labels.data(), 16);
    kernels.synchronize();
    EXPECT_EQ(px, want[b].first) << b;
    EXPECT_EQ(labels, want[b].second) << b;
  }
}

TEST(DeviceFeeder, DeviceBatchesAreTheHostBatchesInOrder) {
  auto kernels = ab::nn::make_ref_kernels();
  expect_feeder_delivers_the_host_batches(*kernels);
}

// From page-locked ring buffers over the CUDA kernels' stream.
TEST(DeviceFeederGpu, BatchesReachTheGpuUnchanged) {
  if (ab::backend::best_device() == "cpu") GTEST_SKIP() << "no CUDA device: a build without CUDA, or no GPU answers";
  auto backend = ab::backend::make_backend("cuda:0");
  auto kernels = ab::nn::make_device_kernels(*backend);
  expect_feeder_delivers_the_host_batches(*kernels);
}

// The workload on a folder written here (one file in it broken), two thread counts.
TEST(PipelineWorkload, RecordsRatesCpuTimeAndTheUnreadableFiles) {
  TempDir tmp;
  const std::uint64_t seed = ab::test::seed();
  for (int i = 0; i < 24; ++i) {
    Image im{40, 48, 3, Bytes(40 * 48 * 3)};
    for (std::size_t k = 0; k < im.pixels.size(); ++k) im.pixels[k] = static_cast<std::uint8_t>(ab::mix64(seed + i, k));
    const auto bytes = ab::data::encode_jpeg(im, 85);
    fs::create_directories(tmp.path() / "set" / (i % 2 ? "b" : "a"));
    std::ofstream(tmp.path() / "set" / (i % 2 ? "b" : "a") / (std::to_string(i) + ".jpg"), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::ofstream(tmp.path() / "set" / "a" / "broken.jpg") << "not a jpeg";
  const auto base = std::vector<std::string>{
      "run",         "pipeline", "--device",  "cpu",         "--option",   "folder=" + (tmp.path() / "set").string(),
      "--option",    "batch=8",  "--axis",    "image_px=32", "--min-time", "0.05",
      "--max-noise", "50",       "--timeout", "30",          "--quiet"};
  auto args = base;
  args.insert(args.end(), {"--axis", "threads=1,2", "--out", (tmp.path() / "out").string()});
  const auto ran = ab::test::accelbench(args);
  ASSERT_EQ(ran.code, 0) << ran.output;
  const auto records = ab::test::read_records(tmp.path() / "out");
  ASSERT_EQ(records.size(), 2u);
  for (const auto& r : records) {
    SCOPED_TRACE(r.dump());
    EXPECT_EQ(r["status"], "ok");
    EXPECT_GT(r["rates"]["samples_per_s"].get<double>(), 0.0);
    EXPECT_GT(r["metrics"]["cpu_ms_per_image"].get<double>(), 0.0);
    EXPECT_EQ(r["metrics"]["host_memory"], "plain");
    EXPECT_EQ(r["metrics"]["source_images"], 24);
    EXPECT_EQ(r["metrics"]["unreadable_files"], 1);
    EXPECT_TRUE(contains(r["metrics"]["unreadable_named"].get<std::string>(), "broken.jpg (no JPEG or PNG signature)"));
  }
  args = base;
  args.insert(args.end(), {"--axis", "threads=2", "--option", "feed=device", "--out", (tmp.path() / "fed").string()});
  const auto fed = ab::test::accelbench(args);
  ASSERT_EQ(fed.code, 0) << fed.output;
  const auto fed_records = ab::test::read_records(tmp.path() / "fed");
  ASSERT_EQ(fed_records.size(), 1u);
  EXPECT_EQ(fed_records[0]["status"], "ok");
  EXPECT_EQ(fed_records[0]["metrics"]["feed"], "device");
  EXPECT_GT(fed_records[0]["rates"]["samples_per_s"].get<double>(), 0.0);
  args = base;
  args.insert(args.end(),
              {"--axis", "threads=1", "--option", "unreadable=refuse", "--out", (tmp.path() / "refused").string()});
  const auto refused = ab::test::accelbench(args);
  EXPECT_EQ(refused.code, 1) << refused.output;
  const auto refused_records = ab::test::read_records(tmp.path() / "refused");
  ASSERT_EQ(refused_records.size(), 1u) << refused.output;
  EXPECT_EQ(refused_records[0]["status"], "error");
  const std::string reason = refused_records[0].value("reason", "");
  EXPECT_TRUE(contains(reason, "1 unreadable image files")) << reason;
  EXPECT_TRUE(contains(reason, "broken.jpg")) << reason;
}

}  // namespace
