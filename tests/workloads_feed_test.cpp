// Tests for train's throughput mode on real data (train_feed.h), through the command line on the
// reference kernels: a tiny ResNet trains from a JPEG folder written here (fresh random every run)
// with a finite, falling loss and a record that says how it was fed; an unreadable file is counted
// and named, a truncated one names itself in the error; the same seed gives the same batches at
// any thread count; an IDX set with target_accuracy=0 feeds the throughput mode. On a GPU (skipped
// without one): the captured step reads each batch through the copy stream, and through nvJPEG.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/rng.h"
#include "data/data.h"
#include "data/device.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Bytes = std::vector<std::uint8_t>;
using ab::test::TempDir;
using ab::test::write_bytes;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

constexpr std::int64_t kPx = 48, kImages = 48;  // 48 px: nvJPEG's GPU test decodes 48-112 px files

// Class 0 horizontal, class 1 vertical colour stripes (period 8 px, random phase and tint, noise),
// as JPEGs in root/<class>/<i>.jpg.
fs::path write_stripe_folder(const fs::path& root, std::uint64_t seed) {
  for (std::int64_t i = 0; i < kImages; ++i) {
    const std::int64_t label = i % 2;
    const auto phase = static_cast<std::int64_t>(ab::mix64(seed, 2 * i) % 8);
    ab::data::Image im{kPx, kPx, 3, Bytes(kPx * kPx * 3)};
    for (std::int64_t y = 0; y < kPx; ++y)
      for (std::int64_t x = 0; x < kPx; ++x)
        for (std::int64_t c = 0; c < 3; ++c) {
          const bool on = (((label == 0 ? y : x) + phase) / 4) % 2 == 1;
          const double noise = ab::uniform(ab::mix64(seed, 2 * i + 1), (y * kPx + x) * 3 + c, -30, 30);
          im.pixels[static_cast<std::size_t>((y * kPx + x) * 3 + c)] = static_cast<std::uint8_t>(
              std::clamp((on ? 200.0 : 50.0) + noise + 10.0 * static_cast<double>(c), 0.0, 255.0));
        }
    write_bytes(root / std::to_string(label) / (std::to_string(i) + ".jpg"), ab::data::encode_jpeg(im, 95));
  }
  return root;
}

std::vector<std::string> train_args(const fs::path& folder, const fs::path& out, const std::vector<std::string>& more) {
  std::vector<std::string> a{"run",         "train",
                             "--device",    "cpu",
                             "--axis",      "model=tiny_resnet",
                             "--axis",      "layout=nhwc",
                             "--axis",      "batch=8",
                             "--axis",      "image_size=16",
                             "--axis",      "dataset=folder:" + folder.string(),
                             "--option",    "lr=0.1",
                             "--option",    "trajectory_steps=24",
                             "--min-time",  "0.05",
                             "--max-noise", "50",
                             "--timeout",   "30",
                             "--quiet",     "--out",
                             out.string()};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// The one record of a run; `exit_code` 1 where the point is to fail.
json run_one(const std::vector<std::string>& args, const fs::path& out, int exit_code = 0) {
  const auto ran = ab::test::accelbench(args);
  EXPECT_EQ(ran.code, exit_code) << ran.output;
  const auto records = ab::test::read_records(out);
  if (records.size() != 1) {
    ADD_FAILURE() << records.size() << " records: " << ran.output;
    return json::object();
  }
  return records[0];
}

double mean(const json& v, std::size_t from, std::size_t to) {
  double s = 0;
  for (std::size_t i = from; i < to; ++i) s += v[i].get<double>();
  return s / static_cast<double>(to - from);
}

TEST(TrainFeed, TrainsFromAFolderAndRecordsHowItWasFed) {
  TempDir tmp;
  const fs::path folder = write_stripe_folder(tmp.path() / "set", ab::test::seed());
  write_bytes(folder / "0" / "broken.jpg", Bytes{'n', 'o', 't', ' ', 'j', 'p', 'e', 'g'});
  const json r = run_one(train_args(folder, tmp.path() / "out", {"--option", "data_threads=2"}), tmp.path() / "out");
  SCOPED_TRACE(r.dump());
  ASSERT_EQ(r["status"], "ok");
  const json& losses = r["metrics"]["loss_trajectory"];
  ASSERT_EQ(losses.size(), 24u);
  for (const auto& l : losses) EXPECT_TRUE(std::isfinite(l.get<double>()));
  EXPECT_LT(mean(losses, 18, 24), mean(losses, 0, 6)) << "the loss does not fall over the trajectory";
  const json& f = r["metrics"]["feed"];
  EXPECT_EQ(f["decoder"], "cpu");
  EXPECT_EQ(f["threads"], 2);
  EXPECT_EQ(f["host_memory"], "plain");
  EXPECT_EQ(f["dataset"], "folder:" + folder.string());
  EXPECT_EQ(f["source_images"], kImages);
  EXPECT_GT(f["images"].get<double>(), 0.0);
  EXPECT_EQ(static_cast<std::int64_t>(f["images"].get<double>()) % 8, 0);
  EXPECT_GT(f["images_per_s"].get<double>(), 0.0);
  EXPECT_GT(f["cpu_ms_per_image"].get<double>(), 0.0);
  EXPECT_GT(f["process_cpu_ms_per_image"].get<double>(), 0.0);
  EXPECT_GE(f["feed_wait_s"].get<double>(), 0.0);
  EXPECT_GE(f["feed_stall_share"].get<double>(), 0.0);
  EXPECT_LE(f["feed_stall_share"].get<double>(), 1.0);
  EXPECT_EQ(f["unreadable_files"], 1);
  EXPECT_TRUE(contains(f["unreadable_named"].get<std::string>(), "broken.jpg (no JPEG or PNG signature)"));
  EXPECT_FALSE(r["metrics"].contains("time_to_train")) << "a folder feeds the throughput mode";
}

// A file with a JPEG signature that ends early passes the scan and fails its decode: the point's
// error names it.
TEST(TrainFeed, ATruncatedJpegNamesItselfInTheError) {
  TempDir tmp;
  const fs::path folder = write_stripe_folder(tmp.path() / "set", ab::test::seed());
  Bytes cut = ab::data::read_file_bytes(folder / "1" / "1.jpg");
  cut.resize(cut.size() / 3);
  write_bytes(folder / "1" / "1.jpg", cut);
  const json r = run_one(train_args(folder, tmp.path() / "out", {"--option", "data_threads=1"}), tmp.path() / "out", 1);
  SCOPED_TRACE(r.dump());
  EXPECT_EQ(r["status"], "error");
  EXPECT_TRUE(contains(r.value("reason", ""), "1.jpg")) << "the error does not name the file";
}

// The batches depend on the seed alone: the same seed at 1 and 3 threads trains the same losses
// (the reference kernels are deterministic), another seed other ones.
TEST(TrainFeed, TheSameSeedGivesTheSameBatchesAtAnyThreadCount) {
  TempDir tmp;
  const fs::path folder = write_stripe_folder(tmp.path() / "set", ab::test::seed());
  const auto losses = [&](const std::string& seed, const std::string& threads) {
    const fs::path out = tmp.path() / ("out" + seed + "_" + threads);
    const json r =
        run_one(train_args(folder, out, {"--axis", "seed=" + seed, "--option", "data_threads=" + threads}), out);
    EXPECT_EQ(r.value("status", ""), "ok") << r.dump();
    return r["metrics"]["loss_trajectory"];
  };
  const json a = losses("3", "1");
  EXPECT_EQ(a, losses("3", "3"));
  EXPECT_NE(a, losses("4", "1"));
}

// fashion-mnist / idx:DIR train to target_accuracy; with target_accuracy=0 they feed the
// throughput mode (grey replicated to the model's 3 channels).
TEST(TrainFeed, AnIdxSetWithTargetZeroFeedsTheThroughputMode) {
  TempDir tmp;
  const std::uint64_t seed = ab::test::seed();
  Bytes pixels, labels;
  for (std::uint32_t i = 0; i < 64; ++i) {
    labels.push_back(static_cast<std::uint8_t>(i % 4));
    for (std::uint32_t k = 0; k < 12 * 12; ++k) pixels.push_back(static_cast<std::uint8_t>(ab::mix64(seed + i, k)));
  }
  write_bytes(tmp.path() / "idx" / "train-images-idx3-ubyte", ab::test::idx_file({64, 12, 12}, pixels));
  write_bytes(tmp.path() / "idx" / "train-labels-idx1-ubyte", ab::test::idx_file({64}, labels));
  const fs::path out = tmp.path() / "out";
  const json r = run_one({"run",         "train",
                          "--device",    "cpu",
                          "--axis",      "model=tiny_resnet",
                          "--axis",      "layout=nhwc",
                          "--axis",      "batch=8",
                          "--axis",      "image_size=16",
                          "--axis",      "dataset=idx:" + (tmp.path() / "idx").string(),
                          "--axis",      "target_accuracy=0",
                          "--option",    "trajectory_steps=4",
                          "--min-time",  "0.05",
                          "--max-noise", "50",
                          "--timeout",   "30",
                          "--quiet",     "--out",
                          out.string()},
                         out);
  SCOPED_TRACE(r.dump());
  ASSERT_EQ(r["status"], "ok");
  EXPECT_EQ(r["metrics"]["feed"]["source_images"], 64);
  EXPECT_FALSE(r["metrics"]["feed"].contains("unreadable_files"));
  EXPECT_FALSE(r["metrics"].contains("time_to_train"));
}

bool has_gpu() { return ab::backend::best_device() != "cpu"; }

// On a GPU with the step captured: the host pipeline through the copy stream, and nvJPEG.
TEST(TrainFeedGpu, TrainsFromAFolderThroughTheCopyStreamAndNvjpeg) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device: a build without CUDA, or no GPU answers";
  TempDir tmp;
  const fs::path folder = write_stripe_folder(tmp.path() / "set", ab::test::seed());
  for (const std::string decoder : {"cpu", "nvjpeg"}) {
    if (decoder == "nvjpeg" && !ab::data::nvjpeg_in_build()) continue;
    SCOPED_TRACE(decoder);
    const fs::path out = tmp.path() / decoder;
    auto args = train_args(folder, out,
                           {"--option", "decoder=" + decoder, "--axis", "graph=on", "--axis", "precision=bf16",
                            "--option", "data_threads=2"});
    args[3] = "cuda:0";
    const json r = run_one(args, out);
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    for (const auto& l : r["metrics"]["loss_trajectory"]) EXPECT_TRUE(std::isfinite(l.get<double>()));
    EXPECT_LT(mean(r["metrics"]["loss_trajectory"], 18, 24), mean(r["metrics"]["loss_trajectory"], 0, 6));
    const json& f = r["metrics"]["feed"];
    EXPECT_EQ(f["decoder"], decoder);
    EXPECT_GT(f["images_per_s"].get<double>(), 0.0);
    if (decoder == "cpu") {
      EXPECT_EQ(f["host_memory"], "pinned");
      EXPECT_EQ(f["copies"], "copy stream");
    }
  }
}

}  // namespace
