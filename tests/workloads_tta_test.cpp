// Tests for train's time-to-train mode and infer's dataset accuracy on the reference kernels: a
// tiny ResNet on a tiny learnable IDX set written here (fresh random every run) reaches a low
// target with its MLPerf log checked against the record; a target out of reach ends
// not_converged with every evaluation kept, an exploding loss diverged; bad files give clear
// statuses; MLPerf's olympic mean over seeds; weights files round trip; infer with the saved
// weights measures the accuracy training's last evaluation did.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/rng.h"
#include "data/data.h"
#include "harness/runner.h"
#include "results/derived.h"
#include "test_support.h"
#include "tta_support.h"
#include "workloads/models/datasets.h"
#include "workloads/models/mllog.h"
#include "workloads/models/train_options.h"
#include "workloads/models/train_to_target.h"
#include "workloads/models/weights.h"
#include "workloads/registry.h"

namespace ab::workloads {
using namespace ab::harness;
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Bytes = std::vector<std::uint8_t>;
using ab::test::idx_file;
using ab::test::keys_of;
using ab::test::mllog_of;
using ab::test::position;
using ab::test::run_points;
using ab::test::write_bytes;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

constexpr std::uint32_t kPx = 8, kClasses = 4;

// n images of kPx x kPx whose class sets a pattern (horizontal stripes, vertical stripes,
// checkerboard, 2x2 blocks) at a random phase with noise: learnable by a tiny ResNet in a few epochs.
void write_pattern_split(const fs::path& dir, const std::string& stem, std::uint32_t n, std::uint64_t seed) {
  Bytes pixels, labels;
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto label = static_cast<std::uint32_t>(mix64(seed, 3 * i) % kClasses);
    const auto phase = static_cast<std::uint32_t>(mix64(seed, 3 * i + 1) % 2);
    labels.push_back(static_cast<std::uint8_t>(label));
    for (std::uint32_t h = 0; h < kPx; ++h)
      for (std::uint32_t w = 0; w < kPx; ++w) {
        const std::uint32_t bit = label == 0 ? h : label == 1 ? w : label == 2 ? h + w : h / 2 + w / 2;
        const double noise = uniform(mix64(seed, 3 * i + 2), h * kPx + w, -60, 60);
        pixels.push_back(static_cast<std::uint8_t>(std::clamp(((bit + phase) % 2 ? 200.0 : 55.0) + noise, 0.0, 255.0)));
      }
  }
  write_bytes(dir / (stem + "-images-idx3-ubyte"), idx_file({n, kPx, kPx}, pixels));
  write_bytes(dir / (stem + "-labels-idx1-ubyte"), idx_file({n}, labels));
}

// A dataset folder for dataset=idx:DIR.
std::string write_pattern_set(const fs::path& dir) {
  const std::uint64_t seed = test::seed();
  write_pattern_split(dir, "train", 512, seed);
  write_pattern_split(dir, "t10k", 96, seed + 1);
  return "idx:" + dir.string();
}

// The tiny ResNet's recipe for the pattern set: few epochs, a rate that learns it quickly.
std::vector<std::string> tiny_recipe(const std::string& dataset, const std::string& target) {
  return {"model=tiny_resnet",
          "layout=nhwc",
          "batch=16",
          "dataset=" + dataset,
          "target_accuracy=" + target,
          "lr=0.1",
          "warmup_epochs=0.5",
          "schedule_epochs=6",
          "max_epochs=8",
          "data_threads=2"};
}

TEST(TimeToTrain, ReachesALowTargetAndItsLogMatchesTheRecord) {
  test::TempDir tmp;
  const std::string dataset = write_pattern_set(tmp.path() / "data");
  const fs::path weights = tmp.path() / "tiny.abw";
  std::vector<std::string> args = tiny_recipe(dataset, "0.7");
  args.push_back("save_weights=" + weights.string());
  const auto records = run_points("train", args, tmp.path() / "run");
  ASSERT_EQ(records.size(), 1U);
  const json& r = records[0];
  ASSERT_EQ(r["status"], "ok") << r.dump(2);
  const json& t = r["metrics"]["time_to_train"];
  EXPECT_EQ(t["status"], "converged");
  const std::vector<double> acc = test::curve_of(r, "accuracy");
  ASSERT_EQ(acc.size(), t["epochs"].get<std::size_t>());
  EXPECT_GE(acc.back(), 0.7);
  for (std::size_t i = 0; i + 1 < acc.size(); ++i) EXPECT_LT(acc[i], 0.7) << "stopped late at epoch " << i + 1;
  EXPECT_GT(t["time_to_train_s"].get<double>(), 0);
  EXPECT_GE(t["run_s"].get<double>(), t["time_to_train_s"].get<double>());
  EXPECT_GT(t["init_s"].get<double>(), 0);
  EXPECT_EQ(r["metrics"]["dataset"]["train_samples"], 512);
  EXPECT_EQ(r["metrics"]["dataset"]["eval_samples"], 96);

  const std::vector<json> log = mllog_of(tmp.path() / "run", r);
  const std::vector<std::string> keys = keys_of(log);
  for (const char* key : {"init_start", "init_stop", "run_start", "run_stop", "submission_benchmark",
                          "global_batch_size", "opt_base_learning_rate", "train_samples", "eval_samples", "seed"})
    EXPECT_LT(position(keys, key), std::ssize(keys)) << key << " missing";
  EXPECT_EQ(keys.front(), "init_start");
  EXPECT_LT(position(keys, "init_stop"), position(keys, "run_start"));
  EXPECT_EQ(keys.back(), "run_stop");
  EXPECT_EQ(log.back()["metadata"]["status"], "success");
  EXPECT_EQ(log.back()["event_type"], "INTERVAL_END");
  // Each epoch: epoch_start, epoch_stop, eval_start, eval_stop, eval_accuracy, in that order.
  std::vector<double> logged;
  std::int64_t epoch = 0;
  for (const auto& l : log) {
    ASSERT_TRUE(l["metadata"].contains("file") && l["metadata"].contains("lineno")) << l.dump();
    EXPECT_EQ(l["namespace"], "");
    const std::string key = l["key"];
    if (key == "epoch_start") {
      EXPECT_EQ(l["metadata"]["epoch_num"], ++epoch);
    }
    if (key == "eval_accuracy") {
      EXPECT_EQ(l["event_type"], "POINT_IN_TIME");
      EXPECT_EQ(l["metadata"]["epoch_num"], epoch);
      logged.push_back(l["value"].get<double>());
    }
  }
  EXPECT_EQ(logged, acc);
  for (std::size_t i = 1; i < log.size(); ++i) EXPECT_GE(log[i]["time_ms"], log[i - 1]["time_ms"]);

  // infer with the saved weights measures the accuracy of training's last evaluation (fp32, the
  // same function: fold=off runs the same batch norms on running statistics).
  const auto inferred = run_points("infer", {"model=tiny_resnet", "layout=nhwc", "batch=16", "dataset=" + dataset,
                                             "fold=off", "graph=off", "weights=" + weights.string()});
  ASSERT_EQ(inferred.size(), 1U);
  ASSERT_EQ(inferred[0]["status"], "ok") << inferred[0].dump(2);
  EXPECT_EQ(inferred[0]["metrics"]["dataset_accuracy"]["top1"].get<double>(), acc.back());
  EXPECT_EQ(inferred[0]["metrics"]["dataset_accuracy"]["samples"], 96);
  // Without weights the accuracy is the untrained network's, and says so; another model's file is refused.
  const json untrained = run_points(
      "infer", {"model=tiny_resnet", "layout=nhwc", "batch=16", "dataset=" + dataset, "fold=off", "graph=off"})[0];
  ASSERT_EQ(untrained["status"], "ok") << untrained.dump(2);
  EXPECT_EQ(untrained["metrics"]["dataset_accuracy"]["weights"], "initial (untrained)");
  const json other = run_points("infer", {"model=fashion_resnet", "batch=16", "dataset=" + dataset, "fold=off",
                                          "graph=off", "weights=" + weights.string()})[0];
  EXPECT_EQ(other["status"], "invalid");
  EXPECT_TRUE(contains(other["reason"].get<std::string>(), "holds 'tiny_resnet'")) << other["reason"];
}

TEST(TimeToTrain, AnUnreachableTargetIsNotConvergedWithEveryEvaluationKept) {
  test::TempDir tmp;
  const std::string dataset = write_pattern_set(tmp.path() / "data");
  std::vector<std::string> args = tiny_recipe(dataset, "1.0");
  args.push_back("max_epochs=2");
  // Labels beyond reach: the test split's labels shuffled away from its images.
  write_pattern_split(tmp.path() / "data", "t10k", 96, test::seed() + 7);
  {
    Bytes labels;
    for (std::uint32_t i = 0; i < 96; ++i) labels.push_back(static_cast<std::uint8_t>(i % kClasses));
    write_bytes(tmp.path() / "data" / "t10k-labels-idx1-ubyte", idx_file({96}, labels));
  }
  const auto records = run_points("train", args, tmp.path() / "run");
  ASSERT_EQ(records.size(), 1U);
  const json& r = records[0];
  ASSERT_EQ(r["status"], "not_converged") << r.dump(2);
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "max_epochs (2)") &&
              contains(r["reason"].get<std::string>(), "best accuracy"))
      << r["reason"];
  const json& t = r["metrics"]["time_to_train"];
  EXPECT_EQ(t["status"], "not_converged");
  EXPECT_FALSE(t.contains("time_to_train_s"));
  const std::vector<double> acc = test::curve_of(r, "accuracy");
  ASSERT_EQ(acc.size(), 2U);
  EXPECT_EQ(t["best_accuracy"].get<double>(), *std::max_element(acc.begin(), acc.end()));
  const std::vector<json> log = mllog_of(tmp.path() / "run", r);
  std::vector<double> logged;
  for (const auto& l : log)
    if (l["key"] == "eval_accuracy") logged.push_back(l["value"].get<double>());
  EXPECT_EQ(logged, acc);
  EXPECT_EQ(log.back()["key"], "run_stop");
  EXPECT_EQ(log.back()["metadata"]["status"], "aborted");
}

TEST(TimeToTrain, AnExplodingLossIsDivergedWithTheLogClosed) {
  test::TempDir tmp;
  const std::string dataset = write_pattern_set(tmp.path() / "data");
  std::vector<std::string> args = tiny_recipe(dataset, "0.99");
  args.push_back("lr=1e30");
  const auto records = run_points("train", args, tmp.path() / "run");
  ASSERT_EQ(records.size(), 1U);
  ASSERT_EQ(records[0]["status"], "diverged") << records[0].dump(2);
  EXPECT_TRUE(contains(records[0]["reason"].get<std::string>(), "training loss is")) << records[0]["reason"];
  EXPECT_EQ(records[0]["metrics"]["time_to_train"]["status"], "diverged");
  const std::vector<json> log = mllog_of(tmp.path() / "run", records[0]);
  EXPECT_EQ(log.back()["key"], "run_stop");
  EXPECT_EQ(log.back()["metadata"]["status"], "aborted");
}

TEST(TimeToTrain, BadFilesGiveAClearStatus) {
  test::TempDir tmp;
  const fs::path dir = tmp.path() / "data";
  const std::string dataset = write_pattern_set(dir);
  const auto run_with = [&] { return run_points("train", tiny_recipe(dataset, "0.5"))[0]; };
  const fs::path images = dir / "train-images-idx3-ubyte";
  Bytes good;
  {
    std::ifstream in(images, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(good.size(), 100U);
  Bytes corrupt = good;
  corrupt[2] = 0x0D;  // element type float
  write_bytes(images, corrupt);
  json r = run_with();
  EXPECT_EQ(r["status"], "error");
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), images.string()) &&
              contains(r["reason"].get<std::string>(), "element type"))
      << r["reason"];
  write_bytes(images, Bytes(good.begin(), good.end() - 100));
  r = run_with();
  EXPECT_EQ(r["status"], "error");
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "truncated")) << r["reason"];
  write_bytes(images, good);
  write_pattern_split(dir, "t10k", 96, 3);
  write_bytes(dir / "t10k-labels-idx1-ubyte", idx_file({95}, Bytes(95, 1)));
  r = run_with();
  EXPECT_EQ(r["status"], "error");
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "labels do not match images")) << r["reason"];
  r = run_points("train", tiny_recipe("idx:" + (tmp.path() / "nowhere").string(), "0.5"))[0];
  EXPECT_EQ(r["status"], "error");
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "not found")) << r["reason"];
  r = run_points("train", tiny_recipe("imagenet", "0.5"))[0];
  EXPECT_EQ(r["status"], "invalid");
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "fashion-mnist")) << r["reason"];
}

TEST(TimeToTrain, SeedsGiveTheOlympicMeanOnTheLastRecord) {
  test::TempDir tmp;
  const std::string dataset = write_pattern_set(tmp.path() / "data");
  std::vector<std::string> args = tiny_recipe(dataset, "0.6");
  args.push_back("seed=1:3");
  const auto records = run_points("train", args);
  ASSERT_EQ(records.size(), 3U);
  std::vector<double> times;
  for (const auto& r : records) {
    ASSERT_EQ(r["status"], "ok") << r.dump(2);
    times.push_back(r["metrics"]["time_to_train"]["time_to_train_s"].get<double>());
  }
  EXPECT_FALSE(records[0]["metrics"].contains("time_to_train_olympic"));
  EXPECT_FALSE(records[1]["metrics"].contains("time_to_train_olympic"));
  const json& o = records[2]["metrics"]["time_to_train_olympic"];
  std::sort(times.begin(), times.end());
  EXPECT_EQ(o["runs"], 3);
  EXPECT_EQ(o["olympic_mean_s"].get<double>(), times[1]);  // three runs: the middle one
}

// The same on the CUDA engine in each training precision, the step captured and replayed (the
// rate's changes recapture it). infer's graph is another graph (cuDNN may pick other algorithms for
// its shapes), so its accuracy may differ from training's last evaluation by one image's call.
TEST(TimeToTrainGpu, ReachesTheTargetInEachPrecisionAndInferAgrees) {
  try {
    backend::make_backend("cuda:0");
  } catch (const Error& e) {
    GTEST_SKIP() << "no CUDA device: " << e.what();
  }
  test::TempDir tmp;
  const std::string dataset = write_pattern_set(tmp.path() / "data");
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const fs::path weights = tmp.path() / (std::string(precision) + ".abw");
    std::vector<std::string> args = tiny_recipe(dataset, "0.7");
    args.push_back(std::string("precision=") + precision);
    args.push_back("save_weights=" + weights.string());
    const json r = run_points("train", args, tmp.path() / "run", "cuda:0")[0];
    ASSERT_EQ(r["status"], "ok") << r.dump(2);
    const std::vector<double> acc = test::curve_of(r, "accuracy");
    ASSERT_FALSE(acc.empty());
    EXPECT_GE(acc.back(), 0.7);
    const json inferred = run_points("infer",
                                     {"model=tiny_resnet", "batch=16", "dataset=" + dataset, "fold=off",
                                      std::string("precision=") + precision, "weights=" + weights.string()},
                                     {}, "cuda:0")[0];
    ASSERT_EQ(inferred["status"], "ok") << inferred.dump(2);
    EXPECT_NEAR(inferred["metrics"]["dataset_accuracy"]["top1"].get<double>(), acc.back(), 1.0 / 96 + 1e-12);
  }
}

TEST(OlympicMean, DropsTheFastestAndSlowestAndAllowsOneUnconvergedRun) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_DOUBLE_EQ(*results::olympic_mean({5, 1, 4, 2, 3}).mean_s, 3.0);
  EXPECT_DOUBLE_EQ(*results::olympic_mean({10, 30, 20, 40}).mean_s, 25.0);
  const results::OlympicMean one_failed = results::olympic_mean({4, inf, 2, 3, 1});
  EXPECT_DOUBLE_EQ(*one_failed.mean_s, 3.0);
  EXPECT_EQ(one_failed.converged, 4U);
  const results::OlympicMean two_failed = results::olympic_mean({4, inf, 2, inf, 1});
  EXPECT_FALSE(two_failed.mean_s);
  EXPECT_TRUE(contains(two_failed.why_none, "2 of 5 runs did not converge")) << two_failed.why_none;
  EXPECT_FALSE(results::olympic_mean({1, 2}).mean_s);
}

TEST(Weights, RoundTripAndBadFilesAreRefused) {
  test::TempDir tmp;
  const std::uint64_t seed = test::seed();
  zoo::WeightsFile w{"tiny_resnet", {}};
  for (int t = 0; t < 3; ++t) {
    std::vector<double>& v = w.values["layer" + std::to_string(t) + ".weight"];
    for (std::uint64_t i = 0; i < 17 + 5 * static_cast<std::uint64_t>(t); ++i)
      v.push_back(static_cast<double>(static_cast<float>(uniform(seed + static_cast<std::uint64_t>(t), i, -3, 3))));
  }
  const fs::path path = tmp.path() / "w.abw";
  zoo::save_weights(path, w);
  const zoo::WeightsFile back = zoo::load_weights(path);
  EXPECT_EQ(back.model, "tiny_resnet");
  EXPECT_EQ(back.values, w.values);
  const auto size = fs::file_size(path);
  fs::resize_file(path, size - 4);
  EXPECT_TRUE(contains(test::error_message<Error>([&] { zoo::load_weights(path); }), "truncated in tensor layer2"));
  tmp.write("plain.txt", "not weights at all");
  EXPECT_TRUE(contains(test::error_message<Error>([&] { zoo::load_weights(tmp.path() / "plain.txt"); }),
                       "not an accelbench weights file"));
}

TEST(TimeToTrain, TheScheduleWarmsUpPeaksAndEndsAtOnePercent) {
  zoo::TrainOptions o;
  o.warmup_epochs = 1;
  o.schedule_epochs = 5;
  o.lr_updates_per_epoch = 4;
  const std::int64_t per_epoch = 100;
  EXPECT_DOUBLE_EQ(zoo::scheduled_lr(1.0, 0, per_epoch, o), 0.125);   // the first quarter's midpoint
  EXPECT_DOUBLE_EQ(zoo::scheduled_lr(1.0, 24, per_epoch, o), 0.125);  // constant inside a segment
  EXPECT_DOUBLE_EQ(zoo::scheduled_lr(1.0, 25, per_epoch, o), 0.375);
  double previous = 2;
  for (std::int64_t s = 100; s < 700; s += 25) {
    const double lr = zoo::scheduled_lr(1.0, s, per_epoch, o);
    EXPECT_LE(lr, previous);
    previous = lr;
  }
  EXPECT_DOUBLE_EQ(zoo::scheduled_lr(1.0, 900, per_epoch, o), 0.01);
  EXPECT_DOUBLE_EQ(zoo::recipe_peak_lr(512), 0.4);
}

TEST(MlLog, LinesAreWrittenAsMlperfLoggingWritesThem) {
  nlohmann::ordered_json meta{{"file", "train.py"}, {"lineno", 12}, {"epoch_num", 3}};
  EXPECT_EQ(zoo::mllog_line(1700000000123.0, "POINT_IN_TIME", "eval_accuracy", 0.5, meta),
            R"(:::MLLOG {"namespace": "", "time_ms": 1700000000123, "event_type": "POINT_IN_TIME", "key": )"
            R"("eval_accuracy", "value": 0.5, "metadata": {"file": "train.py", "lineno": 12, "epoch_num": 3}})");
}

TEST(Datasets, FashionMnistFromTheDebianPackage) {
  const fs::path dir = data::fashion_mnist_dir();
  if (!fs::exists(dir / "t10k-images-idx3-ubyte.gz") && !fs::exists(dir / "t10k-images-idx3-ubyte"))
    AB_SKIP_OR_REQUIRE("fashion-mnist", "no Fashion-MNIST in " + dir.string());
  const data::ImageSet test = zoo::load_dataset("fashion-mnist", "test");
  EXPECT_EQ(test.count, 10000);
  EXPECT_EQ(test.height, 28);
  EXPECT_EQ(test.classes, 10);
  // Its normalisation constants are the training split's pixel statistics.
  const data::ImageSet train = zoo::load_dataset("fashion-mnist", "train");
  double sum = 0, squares = 0;
  for (const std::uint8_t p : train.pixels) {
    sum += p / 255.0;
    squares += (p / 255.0) * (p / 255.0);
  }
  const auto n = static_cast<double>(train.pixels.size());
  EXPECT_NEAR(sum / n, zoo::kFashionMnistMean, 1e-3);
  EXPECT_NEAR(std::sqrt(squares / n - (sum / n) * (sum / n)), zoo::kFashionMnistStd, 1e-3);
}

}  // namespace
}  // namespace ab::workloads
