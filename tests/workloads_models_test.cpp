// Tests for src/workloads/models: the model zoo and synthetic data, the train and infer workloads
// on the reference kernels (tiny ResNet, small images: counts, loss trajectory, diverged status,
// latency percentiles, the per-op profile; the tiny language models' inference heads), the model
// system under test behind loadgen, the accelbench binary running train end to end, and (where a
// GPU answers) the language models' inference on the CUDA engine.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <sys/wait.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/collectives.h"
#include "core/error.h"
#include "harness/runner.h"
#include "test_support.h"
#include "tta_support.h"
#include "workloads/models/models.h"
#include "workloads/registry.h"

namespace ab::workloads {
using namespace ab::harness;
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::plan_of;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<json> run_plan(const std::vector<PlanEntry>& plan, const fs::path& artifact_dir = {},
                           const std::string& device = "cpu",
                           const measure::Settings& settings = test::record_settings()) {
  auto be = backend::make_backend(device);
  std::vector<json> records;
  RunnerHooks hooks;
  hooks.sink = [&records](const json& r) { records.push_back(r); };
  hooks.artifact_dir = artifact_dir;
  Runner runner(*be, settings, json::object(), "run-models", hooks, nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(plan, cancel);
  return records;
}

std::vector<json> run_points(const std::string& workload, const std::vector<std::string>& args,
                             const fs::path& artifact_dir = {}) {
  return run_plan(plan_of(workload, args), artifact_dir);
}

std::vector<double> trajectory(const json& r) { return r["metrics"]["loss_trajectory"].get<std::vector<double>>(); }

// ---------------------------------------------------------------------------------------------
// The zoo and the data

TEST(ModelZoo, NamesBuildAndBadNamesListTheValidOnes) {
  int autoencoders = 0, language = 0;
  for (const auto& name : zoo::model_names()) {
    if (zoo::is_language_model(name)) {
      ++language;
      EXPECT_EQ(zoo::language_config(name).name, name);
    } else if (zoo::is_compression_model(name)) {
      ++autoencoders;
      EXPECT_GE(zoo::compression_config(name).channels, 1);
    } else {
      EXPECT_EQ(zoo::model_config(name).name, name);
      continue;
    }
    const std::string msg = test::usage_error([&] { zoo::model_config(name); });
    EXPECT_TRUE(contains(msg, "not an image classifier") && contains(msg, "resnet50")) << msg;
  }
  EXPECT_EQ(autoencoders, 2);
  EXPECT_EQ(language, 8);  // four GPT-2s, two BERTs and a tiny one of each
  EXPECT_EQ(zoo::compression_config("compression_ae").latent_channels, 192);
  EXPECT_FALSE(zoo::is_compression_model("resnet50"));
  const std::string msg = test::usage_error([] { zoo::model_config("resnet49"); });
  EXPECT_TRUE(contains(msg, "resnet49") && contains(msg, "resnet50") && contains(msg, "tiny_resnet")) << msg;
  EXPECT_EQ(zoo::parse_model_precision("bf16"), Precision::bf16);
  // fp8 is an inference policy: training refuses it with the reason and the valid list.
  const std::string p = test::usage_error([] { zoo::parse_model_precision("fp8"); });
  EXPECT_TRUE(contains(p, "'fp8' is inference only") && contains(p, "fp32, tf32, bf16, fp16")) << p;
  EXPECT_EQ(zoo::parse_model_precision("fp8", /*training=*/false), Precision::fp8);
  const std::string i = test::usage_error([] { zoo::parse_model_precision("int8", false); });
  EXPECT_TRUE(contains(i, "no inference policy") && contains(i, "fp32, tf32, bf16, fp16, fp8")) << i;
}

TEST(ModelZoo, AxesRefuseUnknownPrecisionAndModelWithTheValidList) {
  for (const char* w : {"train", "infer"}) {
    const std::string p = test::usage_error([w] { plan_for(find_workload(w), "cpu", {parse_axis_argument("precision=int8")}); });
    EXPECT_TRUE(contains(p, "int8") && contains(p, "bf16") && contains(p, "fp16")) << p;
    const std::string m = test::usage_error([w] { plan_for(find_workload(w), "cuda", {parse_axis_argument("model=vgg16")}); });
    EXPECT_TRUE(contains(m, "vgg16") && contains(m, "resnext101_32x8d")) << m;
  }
  // fp8: an infer precision (and in its help), refused by train with the training precisions.
  EXPECT_EQ(plan_for(find_workload("infer"), "cpu", {parse_axis_argument("precision=fp8")}).size(), 2u);  // batch 1, 8
  for (const auto& a : find_workload("infer").axes("cuda")) {
    if (a.name == "precision") {
      EXPECT_TRUE(contains(a.help, "fp8")) << a.help;
    }
  }
  const std::string t = test::usage_error([] { plan_for(find_workload("train"), "cpu", {parse_axis_argument("precision=fp8")}); });
  EXPECT_TRUE(contains(t, "'fp8'") && contains(t, "fp32, tf32, bf16, fp16") && !contains(t, "fp16, fp8")) << t;
}

TEST(SyntheticBatch, EachSampleDependsOnlyOnItsIndex) {
  const std::uint64_t seed = test::seed();
  const auto a = zoo::synthetic_batch(seed, 0, 4, 3, 8, 10);
  const auto b = zoo::synthetic_batch(seed, 2, 2, 3, 8, 10);
  ASSERT_EQ(a.images.size(), 4u * 3 * 8 * 8);
  ASSERT_EQ(b.images.size(), 2u * 3 * 8 * 8);
  const std::size_t per = 3 * 8 * 8;
  for (std::size_t i = 0; i < 2 * per; ++i) ASSERT_EQ(a.images[2 * per + i], b.images[i]) << i;
  EXPECT_EQ(a.labels[2], b.labels[0]);
  EXPECT_EQ(a.labels[3], b.labels[1]);
  for (double l : a.labels) EXPECT_TRUE(l >= 0 && l < 10 && l == std::floor(l)) << l;
  double lo = a.images[0], hi = a.images[0];
  for (double v : a.images) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_GT(hi - lo, 1.0) << "images must not be constant";
  EXPECT_LE(hi, 1.5);
  EXPECT_GE(lo, -1.5);
}

TEST(ModelZoo, CompressionBatchIsCentredImagesWithoutLabels) {
  zoo::ZooModel m;
  m.compression = true;
  zoo::ModelSpec s;
  s.batch = 2;
  s.image_px = 8;
  const auto b = zoo::model_batch(m, 3, s);
  const auto raw = zoo::synthetic_batch(zoo::kDataSeed, 3, 2, 3, 8, 10);
  ASSERT_EQ(b.images.size(), raw.images.size());
  EXPECT_TRUE(b.labels.empty());
  double lo = b.images[0], hi = b.images[0];
  for (std::size_t i = 0; i < b.images.size(); ++i) {
    ASSERT_EQ(b.images[i], std::clamp(raw.images[i] / 3.0, -0.5, 0.5)) << i;
    lo = std::min(lo, b.images[i]), hi = std::max(hi, b.images[i]);
  }
  EXPECT_GE(lo, -0.5);
  EXPECT_LE(hi, 0.5);
  EXPECT_GT(hi - lo, 0.3) << "images must not be constant";
}

// ---------------------------------------------------------------------------------------------
// train

TEST(Train, TinyResnetPointCountsAndALossThatFalls) {
  const auto records = run_points("train", {"batch=16", "image_size=12", "trajectory_steps=30", "lr=0.05"});
  ASSERT_EQ(records.size(), 1u);
  const json& r = records[0];
  ASSERT_EQ(r["status"], "ok") << r.dump();
  EXPECT_EQ(r["params"]["model"], "tiny_resnet");
  EXPECT_EQ(r["counts"]["samples"], 16.0);
  const auto& gf = r["metrics"]["gflops_per_sample"];
  EXPECT_GT(gf["forward"].get<double>(), 0.0);
  // Backward is about twice the forward (the stem convolution has no data gradient).
  EXPECT_GT(gf["backward"].get<double>(), 1.5 * gf["forward"].get<double>());
  EXPECT_NEAR(r["counts"]["flops"].get<double>(),
              16e9 * (gf["forward"].get<double>() + gf["backward"].get<double>() + gf["optimizer"].get<double>()), 1.0);
  EXPECT_GT(r["counts"]["bytes"].get<double>(), 0.0);
  EXPECT_GT(r["rates"]["samples_per_s"].get<double>(), 0.0);
  EXPECT_GT(r["rates"]["tflops"].get<double>(), 0.0);
  EXPECT_GT(r["metrics"]["model"]["parameters"].get<double>(), 1000.0);
  EXPECT_GT(r["metrics"]["memory_plan"]["arena_bytes"].get<double>(), 0.0);
  const auto losses = trajectory(r);
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_EQ(r["metrics"]["loss_first"], losses.front());
  EXPECT_EQ(r["metrics"]["loss_last"], losses.back());
  // Ten classes: the first loss is near ln 10 = 2.30; 30 steps on one batch must bring it well down.
  EXPECT_NEAR(losses.front(), std::log(10.0), 0.7);
  double tail = 0;
  for (std::size_t i = 25; i < 30; ++i) tail += losses[i] / 5;
  EXPECT_LT(tail, 0.7 * losses.front()) << "loss " << losses.front() << " -> " << tail;
  EXPECT_TRUE(std::isfinite(r["metrics"]["loss_after_timing"].get<double>()));
}

// The full-size autoencoder (N = 128, M = 192) on 16x16 images: the counts come from its ops, the
// recipe's SGD rate (10) brings the rate-distortion loss down, and the PSNR after the trajectory
// is that of its mse.
TEST(Train, CompressionAePointReportsPsnrAndALossThatFalls) {
  // A step of the full-size codec takes about a second under the sanitizers (1.4 s on a loaded CI
  // machine): the record settings' 5 s would end the point before its fifth sample.
  measure::Settings settings = test::record_settings();
  settings.timeout_s = 60;
  const auto records =
      run_plan(plan_of("train", {"model=compression_ae", "batch=2", "image_size=16", "trajectory_steps=16"}), {}, "cpu",
               settings);
  ASSERT_EQ(records.size(), 1u);
  const json& r = records[0];
  ASSERT_EQ(r["status"], "ok") << r.dump();
  const json& m = r["metrics"];
  EXPECT_EQ(m["model"]["parameters"], 2'886'400);
  EXPECT_EQ(m["learning_rate"], 10.0);
  const auto& gf = m["gflops_per_sample"];
  EXPECT_GT(gf["forward"].get<double>(), 0.03);  // about 37.7 MFLOP per 16x16 image
  EXPECT_GT(gf["backward"].get<double>(), 1.9 * gf["forward"].get<double>());
  EXPECT_NEAR(r["counts"]["flops"].get<double>(),
              2e9 * (gf["forward"].get<double>() + gf["backward"].get<double>() + gf["optimizer"].get<double>()), 1.0);
  const auto losses = trajectory(r);
  ASSERT_EQ(losses.size(), 16u);
  EXPECT_GT(losses.front(), 0.01);  // the centred images' variance is about 0.037
  EXPECT_LT(losses.back(), 0.8 * losses.front()) << losses.front() << " -> " << losses.back();
  const double mse = m["mse"].get<double>();
  EXPECT_GT(mse, 0.0);
  EXPECT_LE(mse, losses.back());  // the loss adds the rate term to the distortion
  EXPECT_DOUBLE_EQ(m["psnr_db"].get<double>(), 10 * std::log10(1 / mse));
  EXPECT_GT(m["psnr_db"].get<double>(), 10 * std::log10(1 / losses.front()));
}

TEST(Train, CapturedAndEagerStepsGiveTheSameTrajectory) {
  const auto records = run_points("train", {"batch=8", "image_size=8", "trajectory_steps=6", "graph=on,off",
                                            "optimizer=lars", "layout=nhwc"});
  ASSERT_EQ(records.size(), 2u);
  for (const auto& r : records) ASSERT_EQ(r["status"], "ok") << r.dump();
  EXPECT_EQ(trajectory(records[0]), trajectory(records[1]));
  EXPECT_NE(trajectory(records[0]).front(), trajectory(records[0]).back()) << "LARS must change the weights";
}

// fuse=on: batch norm (+ residual) + ReLU as one op trains the same trajectory with 9 ops fewer;
// the default (auto) is on for a ResNet and off for the autoencoder (no batch norm), which refuses on.
TEST(Train, FusedBatchNormReluGivesTheSameTrajectoryWithFewerOps) {
  const auto records =
      run_points("train", {"batch=8", "image_size=8", "trajectory_steps=6", "fuse=off,on,auto", "layout=nhwc"});
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[2]["params"]["fuse"], "auto");
  EXPECT_EQ(records[2]["metrics"]["model"]["ops"], records[1]["metrics"]["model"]["ops"]);
  EXPECT_EQ(trajectory(records[2]), trajectory(records[1]));
  for (const auto& r : records) ASSERT_EQ(r["status"], "ok") << r.dump();
  ASSERT_EQ(records[0]["params"]["fuse"], "off");
  EXPECT_EQ(trajectory(records[0]), trajectory(records[1]));
  EXPECT_EQ(records[0]["metrics"]["model"]["ops"].get<int>() - records[1]["metrics"]["model"]["ops"].get<int>(), 9);
  EXPECT_EQ(records[0]["metrics"]["model"]["parameters"], records[1]["metrics"]["model"]["parameters"]);
  EXPECT_FALSE(records[0]["metrics"].contains("fusion"));
  EXPECT_EQ(records[1]["metrics"]["fusion"]["fused_shapes"], 0);  // the reference fuses nothing
  const auto ae = run_points("train", {"model=tiny_compression_ae", "fuse=on", "batch=2", "image_size=16"});
  ASSERT_EQ(ae.size(), 1u);
  EXPECT_EQ(ae[0]["status"], "invalid") << ae[0].dump();
  const auto ae_auto = run_points("train", {"model=tiny_compression_ae", "batch=2", "image_size=16", "trajectory_steps=2"});
  ASSERT_EQ(ae_auto.size(), 1u);
  EXPECT_EQ(ae_auto[0]["status"], "ok") << ae_auto[0].dump();
  EXPECT_FALSE(ae_auto[0]["metrics"].contains("fusion"));
}

TEST(Train, NonFiniteLossIsDivergedAndTheSweepGoesOn) {
  std::vector<PlanEntry> plan = plan_of("train", {"batch=8", "image_size=8", "trajectory_steps=8", "lr=1e38"});
  const auto next = plan_of("train", {"batch=8", "image_size=8", "trajectory_steps=8", "lr=0.01"});
  plan.insert(plan.end(), next.begin(), next.end());
  const auto records = run_plan(plan);
  ASSERT_EQ(records.size(), 2u);
  const json& bad = records[0];
  EXPECT_EQ(bad["status"], "diverged") << bad.dump();
  EXPECT_TRUE(contains(bad.value("reason", ""), "loss is")) << bad.dump();
  EXPECT_FALSE(bad.contains("rates"));
  ASSERT_TRUE(bad["metrics"].contains("loss_trajectory"));
  EXPECT_EQ(records[1]["status"], "ok") << records[1].dump();
}

TEST(Train, OutOfMemoryIsOomAndTheSweepGoesOn) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts on an allocation above 1 TiB instead of failing it";
#else
  // 2^20 images of 4096x4096 need an arena of hundreds of TB, beyond any address space: bind
  // fails before anything is touched.
  auto be = backend::make_backend("cpu");
  auto plan = plan_for(find_workload("train"), "cpu",
                       {parse_axis_argument("batch=1048576"), parse_axis_argument("image_size=4096")});
  const auto small = plan_for(find_workload("train"), "cpu",
                              {parse_axis_argument("batch=2"), parse_axis_argument("image_size=8")},
                              {{"trajectory_steps", "2"}});
  plan.insert(plan.end(), small.begin(), small.end());
  std::vector<json> records;
  RunnerHooks hooks;
  hooks.sink = [&records](const json& r) { records.push_back(r); };
  Runner runner(*be, test::record_settings(), json::object(), "run-oom", hooks, nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(plan, cancel);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["status"], "oom") << records[0].dump();
  EXPECT_GT(records[0]["metrics"]["memory_plan"]["arena_bytes"].get<double>(), 1e14);
  EXPECT_EQ(records[1]["status"], "ok") << records[1].dump();
#endif
}

TEST(Train, ProfileWritesThePerOpTable) {
  test::TempDir dir;
  const auto records = run_points("train", {"batch=4", "image_size=8", "trajectory_steps=2", "profile=on"}, dir.path());
  ASSERT_EQ(records.size(), 1u);
  const json& r = records[0];
  ASSERT_EQ(r["status"], "ok") << r.dump();
  const json& p = r["metrics"]["profile"];
  EXPECT_GT(p["total"]["time_s"].get<double>(), 0.0);
  EXPECT_TRUE(p["by_kind"].contains("conv2d"));
  const fs::path ops = dir.path() / "artifacts" / "0" / "ops.json";
  ASSERT_TRUE(fs::exists(ops));
  const json table = json::parse(std::ifstream(ops));
  ASSERT_EQ(table["ops"].size(), r["metrics"]["model"]["ops"].get<std::size_t>());
  double flops = 0;
  for (const auto& op : table["ops"]) {
    flops += op["forward"]["flops"].get<double>() + op["backward"]["flops"].get<double>();
    EXPECT_GE(op["forward"]["time_s"].get<double>(), 0.0);
  }
  EXPECT_NEAR(flops, 4e9 * (r["metrics"]["gflops_per_sample"]["forward"].get<double>() +
                            r["metrics"]["gflops_per_sample"]["backward"].get<double>()), 1.0);
  std::ifstream csv(dir.path() / "artifacts" / "0" / "ops.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_TRUE(contains(header, "flops_per_byte")) << header;
}

// A text axis of train on GPUs: its one default, and `bad` refused listing the valid values.
void expect_text_axis(const std::string& name, const std::string& default_value, const std::string& bad,
                      const std::string& valid) {
  const std::string msg =
      test::usage_error([&] { plan_for(find_workload("train"), "cpu", {parse_axis_argument(name + "=" + bad)}); });
  EXPECT_TRUE(contains(msg, name + " '" + bad + "'") && contains(msg, "valid: " + valid)) << msg;
  int found = 0;
  for (const auto& a : find_workload("train").axes("cuda"))
    if (a.name == name) {
      ++found;
      EXPECT_EQ(a.defaults, std::vector<std::string>{default_value});
    }
  EXPECT_EQ(found, 1) << name;
}

// comm_dtype (the dtype the data-parallel gradients are all-reduced in): the gradients' own by
// default; an unknown value is refused with the valid list.
TEST(Train, CommDtypeAxisDefaultsToTheGradientsOwnAndRefusesUnknownValues) {
  expect_text_axis("comm_dtype", "grad", "fp8", "grad, bf16, fp16");
  EXPECT_EQ(plan_for(find_workload("train"), "cpu", {parse_axis_argument("comm_dtype=grad,bf16,fp16")}).size(), 3u);
}

TEST(Train, CommEngineAxisDefaultsToAutoAndRefusesUnknownValues) {
  expect_text_axis("comm_engine", "auto", "gloo", "auto, nccl, copy");
  EXPECT_THROW(backend::parse_averager_engine("Copy"), UsageError);
  EXPECT_EQ(backend::parse_averager_engine("copy"), backend::AveragerEngine::copy_engines);
}

// comm_mean (where copy engines' two gradients are averaged) is an option: auto by default, an
// unknown value refused listing the valid ones, and the record's options block says what ran.
TEST(Train, CommMeanOptionDefaultsToAutoAndRefusesUnknownValues) {
  const std::string msg =
      test::usage_error([] { plan_for(find_workload("train"), "cpu", {}, {{"comm_mean", "host"}}); });
  EXPECT_TRUE(contains(msg, "comm_mean 'host'") && contains(msg, "valid: auto, kernel, update")) << msg;
  int found = 0;
  for (const auto& o : find_workload("train").options())
    if (o.name == "comm_mean") {
      ++found;
      EXPECT_EQ(o.default_value, "auto");
    }
  EXPECT_EQ(found, 1);
  for (const auto& a : find_workload("train").axes("cuda")) EXPECT_NE(a.name, "comm_mean") << "an option, not an axis";
  const auto records = run_points("train", {"model=tiny_resnet", "batch=2", "image_size=8", "trajectory_steps=1",
                                            "comm_mean=kernel"});
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["options"]["comm_mean"], "kernel") << records[0].dump();
  EXPECT_EQ(records[0]["options"]["trajectory_steps"], 1) << records[0].dump();
  EXPECT_EQ(records[0]["options"]["tail_bucket_mib"], 1.0) << records[0].dump();
}

// An option the workload does not declare is refused, listing the ones it does; so is a value
// not of the option's kind, and a list (an option has one value per run).
TEST(Train, UnknownOptionsAndMalformedValuesAreRefused) {
  const std::string unknown =
      test::usage_error([] { plan_for(find_workload("train"), "cpu", {}, {{"comm_ctas", "8"}}); });
  EXPECT_TRUE(contains(unknown, "train has no option 'comm_ctas'") &&
              contains(unknown, "valid: lr, trajectory_steps, steps_per_sample, tail_bucket_mib, dropout, comm_mean"))
      << unknown;
  const std::string kind = test::usage_error([] { plan_for(find_workload("train"), "cpu", {}, {{"trajectory_steps", "2.5"}}); });
  EXPECT_TRUE(contains(kind, "'2.5' is not an integer (option trajectory_steps)")) << kind;
  const std::string list = test::usage_error([] { plan_for(find_workload("train"), "cpu", {}, {{"lr", "0.1,0.2"}}); });
  EXPECT_TRUE(contains(list, "is not a number (option lr)")) << list;
  // The tuning knobs that never beat their defaults are gone, as axes and as options.
  for (const char* removed : {"comm_ctas", "comm_priority", "bucket_delay_ops", "cooperative_kernels"})
    EXPECT_THROW(plan_for(find_workload("train"), "cpu", {parse_axis_argument(std::string(removed) + "=1")}), UsageError)
        << removed;
}

// steps_per_sample: the timed samples' floor of back-to-back steps (0 = the device's default);
// negative or absurd counts are invalid, and the record's samples hold at least the steps asked
// for (40: more than the ~5 ms sample target alone gives a step of this model on the reference).
TEST(Train, StepsPerSampleSetsTheSamplesStepsAndRefusesBadCounts) {
  for (const std::string bad : {"-1", "1001"}) {
    const auto records = run_points("train", {"model=tiny_resnet", "batch=2", "image_size=8", "trajectory_steps=1",
                                              "steps_per_sample=" + bad});
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0]["status"], "invalid") << records[0].dump();
    EXPECT_TRUE(contains(records[0].dump(), "steps_per_sample in 0..1000")) << records[0].dump();
  }
  std::vector<PlanEntry> plan;
  for (const std::string steps : {"0", "40"}) {
    const auto part = plan_of("train", {"model=tiny_resnet", "batch=2", "image_size=8", "trajectory_steps=1",
                                        "steps_per_sample=" + steps});
    plan.insert(plan.end(), part.begin(), part.end());
  }
  const auto records = run_plan(plan);
  ASSERT_EQ(records.size(), 2u);
  for (const auto& r : records) ASSERT_EQ(r["status"], "ok") << r.dump();
  EXPECT_LT(records[0]["time"]["iterations_per_sample"].get<int>(), 40) << records[0].dump();
  EXPECT_GE(records[1]["time"]["iterations_per_sample"].get<int>(), 40) << records[1].dump();
}

// trajectory_steps, tail_bucket_mib and lr out of range are invalid points, each named with its range.
TEST(Train, OptionsOutOfRangeAreInvalidSayingWhy) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"trajectory_steps=0", "trajectory_steps >= 1"}, {"tail_bucket_mib=-1", "tail_bucket_mib >= 0"},
      {"lr=-0.5", "a finite lr >= 0"}};
  for (const auto& [arg, why] : cases) {
    const auto records = run_points("train", {"model=tiny_resnet", "batch=2", "image_size=8", arg});
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0]["status"], "invalid") << records[0].dump();
    EXPECT_TRUE(contains(records[0].value("reason", ""), why)) << arg << ": " << records[0].dump();
  }
}

TEST(Train, NonPositiveSizesAreInvalid) {
  const auto records = run_points("train", {"model=resnet50", "batch=1", "image_size=0", "trajectory_steps=1"});
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["status"], "invalid") << records[0].dump();
}

// A language model: tokens per step and their rate, AdamW chosen by optimizer=auto, the copy
// task's loss falling from ln(vocabulary), and the model's limits refused as invalid.
TEST(Train, TinyGptPointCountsTokensAndALossThatFalls) {
  const auto records = run_points("train", {"model=tiny_gpt2", "batch=4", "seq=16", "trajectory_steps=40", "lr=0.01"});
  ASSERT_EQ(records.size(), 1u);
  const json& r = records[0];
  ASSERT_EQ(r["status"], "ok") << r.dump();
  EXPECT_EQ(r["params"]["optimizer"], "auto");
  EXPECT_EQ(r["metrics"]["optimizer"], "adamw");
  EXPECT_EQ(r["counts"]["samples"], 4.0);
  EXPECT_EQ(r["counts"]["tokens"], 64.0);
  EXPECT_NEAR(r["rates"]["tokens_per_s"].get<double>(), 16 * r["rates"]["samples_per_s"].get<double>(),
              1e-9 * r["rates"]["tokens_per_s"].get<double>());
  const auto losses = trajectory(r);
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_NEAR(losses.front(), std::log(64.0), 0.3);
  EXPECT_LT(losses.back(), 0.85 * losses.front()) << "loss " << losses.front() << " -> " << losses.back();
}

// Gradient accumulation on the fixed batch: two micro-batches of the same samples average to the
// one-batch gradient exactly, so the loss trajectory is the same bits while the step counts (and
// times) twice the samples, tokens and forward-backward FLOPs.
TEST(Train, AccumulatedMicroBatchesTrainLikeOneBatchAndCountEach) {
  const auto records =
      run_points("train", {"model=tiny_gpt2", "batch=2", "seq=8", "accumulate=1,2", "trajectory_steps=6"});
  ASSERT_EQ(records.size(), 2u);
  for (const json& r : records) ASSERT_EQ(r["status"], "ok") << r.dump();
  const json& one = records[0]["params"]["accumulate"] == 1 ? records[0] : records[1];
  const json& two = records[0]["params"]["accumulate"] == 1 ? records[1] : records[0];
  EXPECT_EQ(trajectory(one), trajectory(two));
  EXPECT_EQ(one["counts"]["samples"], 2.0);
  EXPECT_EQ(two["counts"]["samples"], 4.0);
  EXPECT_EQ(two["counts"]["tokens"], 32.0);
  const double flops_one = one["counts"]["flops"].get<double>(), flops_two = two["counts"]["flops"].get<double>();
  // One more micro-batch's forward and backward; the update runs once a step.
  const json& per_sample = one["metrics"]["gflops_per_sample"];
  const double pass = (per_sample["forward"].get<double>() + per_sample["backward"].get<double>()) * 1e9 * 2;
  EXPECT_NEAR(flops_two - flops_one, pass, 1e-9 * pass);
  const auto bad = run_points("train", {"model=tiny_gpt2", "batch=2", "seq=8", "accumulate=0", "trajectory_steps=1"});
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0]["status"], "invalid") << bad[0].dump();
}

TEST(Train, DropoutIsALanguageModelOptionInRange) {
  const auto records =
      run_points("train", {"model=tiny_gpt2", "batch=4", "seq=16", "trajectory_steps=30", "lr=0.01", "dropout=0.1"});
  ASSERT_EQ(records.size(), 1u);
  ASSERT_EQ(records[0]["status"], "ok") << records[0].dump();
  EXPECT_EQ(records[0]["options"]["dropout"], 0.1) << records[0]["options"].dump();
  const auto losses = trajectory(records[0]);
  EXPECT_LT(losses.back(), 0.9 * losses.front());
  for (const auto& bad : {std::vector<std::string>{"model=tiny_resnet", "batch=2", "image_size=12", "dropout=0.1"},
                          std::vector<std::string>{"model=tiny_gpt2", "batch=2", "seq=8", "dropout=1"}}) {
    const auto r = run_points("train", bad);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0]["status"], "invalid") << r[0].dump();
  }
}

TEST(Train, LanguageModelBatchBeyondMemoryIsOomAndTheSweepGoesOn) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts on an allocation above 1 TiB instead of failing it";
#else
  // 65536 sequences of 1024 tokens: the logits alone are 3.4e12 f32 values (13.5 TB), an arena no
  // machine has.
  auto plan = plan_of("train", {"model=gpt2_124m", "batch=65536", "seq=1024"});
  const auto small = plan_of("train", {"model=tiny_gpt2", "batch=2", "seq=8", "trajectory_steps=2"});
  plan.insert(plan.end(), small.begin(), small.end());
  const auto records = run_plan(plan);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["status"], "oom") << records[0].dump();
  EXPECT_GT(records[0]["metrics"]["memory_plan"]["arena_bytes"].get<double>(), 1.35e13);
  EXPECT_EQ(records[1]["status"], "ok") << records[1].dump();
#endif
}

TEST(Train, LanguageModelLimitsAreInvalidSayingWhy) {
  const auto records = run_points("train", {"model=tiny_gpt2", "batch=1", "seq=65", "trajectory_steps=1"});
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["status"], "invalid") << records[0].dump();
  EXPECT_TRUE(contains(records[0].dump(), "longer than its 64 positions")) << records[0].dump();
}

// ---------------------------------------------------------------------------------------------
// infer

TEST(Infer, LatencyPercentilesOfOneForwardPerSample) {
  const auto records = run_points("infer", {"batch=1,4", "image_size=12"});
  ASSERT_EQ(records.size(), 2u);
  for (const auto& r : records) {
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    EXPECT_EQ(r["counts"]["samples"], r["params"]["batch"].get<double>());
    EXPECT_EQ(r["time"]["iterations_per_sample"], 1);
    const auto& lat = r["metrics"]["latency_s"];
    EXPECT_EQ(lat["p50"], r["time"]["median_s"]);
    EXPECT_EQ(lat["p99"], r["time"]["p99_s"]);
    EXPECT_GT(lat["p50"].get<double>(), 0.0);
    EXPECT_GE(lat["p99"].get<double>(), lat["p50"].get<double>());
    EXPECT_EQ(r["check"]["passed"], true);
    EXPECT_LE(r["check"]["rel_error"].get<double>(), 1e-5);
    EXPECT_GT(r["rates"]["samples_per_s"].get<double>(), 0.0);
    EXPECT_GT(r["metrics"]["gflops_per_sample"]["forward"].get<double>(), 0.0);
    // What the precision costs: the check's error and the class it picks, against float64.
    EXPECT_EQ(r["metrics"]["accuracy"]["logits_rel_error_vs_f64"], r["check"]["rel_error"]);
    EXPECT_EQ(r["metrics"]["accuracy"]["top1_agrees_f64"], true);
    EXPECT_FALSE(r["metrics"].contains("fp8"));
  }
}

TEST(Infer, LogitsAccuracyIsTheRelativeErrorAndTopOneAgreement) {
  const json same = zoo::logits_accuracy({1, 3, 2}, {1, 3, 2});
  EXPECT_EQ(same["logits_rel_error_vs_f64"], 0.0);
  EXPECT_EQ(same["top1_agrees_f64"], true);
  const json moved = zoo::logits_accuracy({1, 2, 3}, {1, 3, 2});  // the argmax moves from class 1 to 2
  EXPECT_NEAR(moved["logits_rel_error_vs_f64"].get<double>(), std::sqrt(2.0 / 14.0), 1e-15);
  EXPECT_EQ(moved["top1_agrees_f64"], false);
  EXPECT_THROW(zoo::logits_accuracy({1, 2}, {1, 2, 3}), Error);
}

// precision=fp8 end to end on the reference kernels: tiny_resnet's one eligible convolution
// (layer2.0.downsample.0, 16 -> 32 channels; every other one has C or K of 3, 4 or 8) runs e4m3,
// the logits pass fp8's check against float64 and lose more than fp16's do, and the record says
// which layers ran fp8 and what it cost.
TEST(Infer, Fp8TinyResnetPassesItsCheckAndReportsLayersAndAccuracy) {
  const auto records = run_points("infer", {"precision=fp16,fp8", "batch=2", "image_size=16"});
  ASSERT_EQ(records.size(), 2u);
  std::map<std::string, json> by;
  for (const auto& r : records) by[r["params"]["precision"].get<std::string>()] = r;
  const json &fp8 = by.at("fp8"), &fp16 = by.at("fp16");
  SCOPED_TRACE(fp8.dump());
  ASSERT_EQ(fp8["status"], "ok");
  ASSERT_EQ(fp16["status"], "ok") << fp16.dump();
  EXPECT_EQ(fp8["params"]["fold"], "auto");  // fused for a ResNet
  EXPECT_EQ(fp8["check"]["passed"], true);
  EXPECT_EQ(fp8["metrics"]["fp8"]["layers"], 1);
  EXPECT_EQ(fp8["metrics"]["fp8"]["fallback_layers"], 0);
  EXPECT_EQ(fp8["metrics"]["fp8"]["fallback_reasons"], json::array());
  EXPECT_NE(fp8["metrics"]["fp8"]["activation_scaling"].get<std::string>().find("dynamic"), std::string::npos);
  EXPECT_FALSE(fp16["metrics"].contains("fp8"));
  const json& acc = fp8["metrics"]["accuracy"];
  EXPECT_EQ(acc["logits_rel_error_vs_f64"], fp8["check"]["rel_error"]);
  EXPECT_EQ(acc["top1_agrees_f64"], true);
  // One layer in e4m3 (3 mantissa bits) costs several times fp16's whole-network error (about
  // 9e-3 against 4e-4 measured), yet well inside fp8's tolerance.
  const double e8 = acc["logits_rel_error_vs_f64"].get<double>();
  const double e16 = fp16["metrics"]["accuracy"]["logits_rel_error_vs_f64"].get<double>();
  EXPECT_GT(e8, 5 * e16);
  EXPECT_LT(e8, fp8["check"]["tolerance"].get<double>() / 5);
  EXPECT_EQ(fp8["counts"]["flops"], fp16["counts"]["flops"]);
  EXPECT_NE(fp8["counts"]["bytes"], fp16["counts"]["bytes"]);  // the fp8 layer's quantize passes and e4m3 weights
}

// fp8_layers chooses among fp8 convolutions: with another precision its non-default value is a
// skipped point saying so; with fp8 the record says which choice ran (the reference runs every
// eligible layer in fp8 either way: it has no 16-bit time to compare with).
TEST(Infer, Fp8LayersAppliesToFp8OnlyAndIsRecorded) {
  const auto records =
      run_points("infer", {"precision=fp16,fp8", "fp8_layers=faster,all", "batch=1", "image_size=16"});
  ASSERT_EQ(records.size(), 4u);
  int skipped = 0, ok = 0;
  for (const auto& r : records) {
    SCOPED_TRACE(r.dump());
    const std::string precision = r["params"]["precision"], choice = r["params"]["fp8_layers"];
    if (precision == "fp16" && choice == "all") {
      ++skipped;
      EXPECT_EQ(r["status"], "skipped");
      EXPECT_TRUE(contains(r["reason"].get<std::string>(), "precision=fp8 only"));
      continue;
    }
    ++ok;
    ASSERT_EQ(r["status"], "ok");
    if (precision == "fp8") {
      EXPECT_EQ(r["metrics"]["fp8"]["layer_choice"], choice);
      EXPECT_EQ(r["metrics"]["fp8"]["layers"], 1);
      EXPECT_EQ(r["metrics"]["fp8"]["fallback_slower_layers"], 0);
    }
  }
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(ok, 3);
}

// fp8 needs the fused epilogue (fold=fused; auto resolves to it): fold=off or on, and the
// autoencoder (nothing to fold), are invalid points that say why; train has no fp8 (the axis).
TEST(Infer, Fp8WithoutFusedConvolutionsIsInvalidWithTheReason) {
  const auto records = run_points("infer", {"precision=fp8", "fold=off,on", "batch=1", "image_size=8"});
  ASSERT_EQ(records.size(), 2u);
  for (const auto& r : records) {
    EXPECT_EQ(r["status"], "invalid") << r.dump();
    const std::string why = r.value("reason", "");
    EXPECT_TRUE(contains(why, "fp8 needs fold=fused") && contains(why, "fold=" + r["params"]["fold"].get<std::string>()))
        << why;
  }
  const auto ae = run_points("infer", {"model=tiny_compression_ae", "precision=fp8", "batch=1", "image_size=16"});
  ASSERT_EQ(ae.size(), 1u);
  EXPECT_EQ(ae[0]["status"], "invalid") << ae[0].dump();
  EXPECT_TRUE(contains(ae[0].value("reason", ""), "no batch norm to fold")) << ae[0].dump();
  // The zoo refuses the same graphs for callers that build them directly.
  zoo::ModelSpec s;
  s.model = "tiny_resnet";
  s.image_px = 8;
  s.training = false;
  s.precision = Precision::fp8;
  s.fold_batchnorm = true;
  nn::GraphBuilder b(zoo::graph_options(s));
  const std::string msg = test::usage_error([&] { zoo::build_zoo_model(b, s); });
  EXPECT_TRUE(contains(msg, "precision fp8") && contains(msg, "unfused")) << msg;
}

// fold=on: batch norms folded into the convolutions (one bias_act op where a batch norm, ReLU and
// add ran) computes the same logits, checked against the unfolded network's f64 reference, with
// fewer ops and FLOPs; fold=fused moves each bias_act into its convolution (conv_bias_act). The
// record's params say which; the default, auto, is fused. Refused for the autoencoder (no batch norm),
// whose auto is off (CompressionAutoencodersReportThePsnrOfTheirReconstruction runs it).
TEST(Infer, FoldedBatchNormsGiveTheReferenceLogitsWithFewerOps) {
  const auto records =
      run_points("infer", {"fold=off,on,fused,auto", "batch=2", "image_size=12", "layout=nchw,nhwc"});
  ASSERT_EQ(records.size(), 8u);
  std::map<std::string, const json*> by;
  for (const auto& r : records) {
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    EXPECT_EQ(r["check"]["passed"], true);
    EXPECT_LE(r["check"]["rel_error"].get<double>(), 1e-5);
    by[r["params"]["fold"].get<std::string>() + "/" + r["params"]["layout"].get<std::string>()] = &r;
  }
  ASSERT_EQ(by.size(), 8u);
  for (const std::string layout : {"nchw", "nhwc"}) {
    const json &off = *by.at("off/" + layout), &on = *by.at("on/" + layout), &fused = *by.at("fused/" + layout);
    EXPECT_EQ(by.at("auto/" + layout)->at("metrics").at("model"), fused["metrics"]["model"]);
    // tiny_resnet: the stem's ReLU and, in each of its two blocks, three ReLUs and the add.
    EXPECT_EQ(off["metrics"]["model"]["ops"].get<int>() - on["metrics"]["model"]["ops"].get<int>(), 9);
    // Fused: its 9 bias_acts (stem, three per block, two projections) went into their convolutions.
    EXPECT_EQ(on["metrics"]["model"]["ops"].get<int>() - fused["metrics"]["model"]["ops"].get<int>(), 9);
    EXPECT_EQ(fused["metrics"]["model"]["parameters"], on["metrics"]["model"]["parameters"]);
    EXPECT_LT(on["metrics"]["gflops_per_sample"]["forward"].get<double>(),
              off["metrics"]["gflops_per_sample"]["forward"].get<double>());
    EXPECT_LT(on["counts"]["bytes"].get<double>(), off["counts"]["bytes"].get<double>());
    EXPECT_LT(fused["counts"]["bytes"].get<double>(), on["counts"]["bytes"].get<double>());
    // Whether the device fused: the reference composes every call, so no shape counts as fused.
    EXPECT_EQ(fused["metrics"]["fusion"],
              (json{{"fused_shapes", 0}, {"unfused_shapes", 0}, {"notes", json::array()}}));
    EXPECT_FALSE(on["metrics"].contains("fusion"));
  }
  const auto ae =
      run_points("infer", {"model=tiny_compression_ae", "fold=on,fused", "batch=1", "image_size=16"});
  ASSERT_EQ(ae.size(), 2u);
  for (const auto& r : ae) EXPECT_EQ(r["status"], "invalid") << r.dump();
}

TEST(Infer, CompressionAutoencodersReportThePsnrOfTheirReconstruction) {
  const auto records =
      run_points("infer", {"model=compression_ae,tiny_compression_ae", "batch=2", "image_size=16", "layout=nhwc"});
  ASSERT_EQ(records.size(), 2u);
  for (const auto& r : records) {
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    EXPECT_EQ(r["counts"]["samples"], 2.0);
    EXPECT_GT(r["metrics"]["latency_s"]["p50"].get<double>(), 0.0);
    EXPECT_GT(r["rates"]["samples_per_s"].get<double>(), 0.0);
    const double mse = r["metrics"]["mse"].get<double>();
    EXPECT_GT(mse, 0.0);  // untrained: far from the images
    EXPECT_DOUBLE_EQ(r["metrics"]["psnr_db"].get<double>(), 10 * std::log10(1 / mse));
    EXPECT_FALSE(r.contains("check") && r["check"].contains("rel_error"));  // no f64 reference for a quantiser
  }
  EXPECT_EQ(records[0]["metrics"]["model"]["parameters"], 2'886'400);
}

TEST(Infer, ReferenceLogitsDoNotDependOnTheBatchOrLayout) {
  zoo::ModelSpec s;
  s.model = "tiny_resnet";
  s.image_px = 8;
  s.training = false;
  const auto a = zoo::reference_logits(s);
  s.layout = Layout::nhwc;
  s.batch = 7;
  const auto b = zoo::reference_logits(s);
  ASSERT_EQ(a.size(), 10u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-12 * (1 + std::fabs(a[i])));
  EXPECT_GT(std::fabs(a[0] - a[1]) + std::fabs(a[2] - a[3]), 0.0);
}

// A language model's inference: its head (BERT's question answering, GPT-2's prefill), sequences
// and tokens counted, and sample 0's logits checked against float64 (the reference's own float32
// here: well inside the check). seq=0 is the model's positions.
TEST(Infer, LanguageModelsRunTheirInferenceHeadsAndCountTokens) {
  const auto records = run_points("infer", {"model=tiny_bert,tiny_gpt2", "batch=1,3", "seq=16,0"});
  ASSERT_EQ(records.size(), 8u);
  for (const auto& r : records) {
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    const std::string model = r["params"]["model"];
    const double batch = r["params"]["batch"].get<double>();
    const double seq = r["params"]["seq"] == 0 ? 64.0 : r["params"]["seq"].get<double>();  // tiny: 64 positions
    EXPECT_EQ(r["metrics"]["model"]["head"], model == "tiny_bert" ? "qa" : "prefill");
    EXPECT_EQ(r["counts"]["samples"], batch);
    EXPECT_EQ(r["counts"]["tokens"], batch * seq);
    EXPECT_NEAR(r["rates"]["tokens_per_s"].get<double>(), seq * r["rates"]["samples_per_s"].get<double>(),
                1e-9 * r["rates"]["tokens_per_s"].get<double>());
    EXPECT_EQ(r["metrics"]["latency_s"]["p50"], r["time"]["median_s"]);
    EXPECT_EQ(r["time"]["iterations_per_sample"], 1);
    EXPECT_EQ(r["check"]["passed"], true);
    EXPECT_LE(r["check"]["rel_error"].get<double>(), 1e-5);
    EXPECT_EQ(r["metrics"]["accuracy"]["logits_rel_error_vs_f64"], r["check"]["rel_error"]);
    EXPECT_EQ(r["metrics"]["accuracy"]["top1_agrees_f64"], true);
    EXPECT_GT(r["counts"]["flops"].get<double>(), 0.0);
    EXPECT_FALSE(r["metrics"].contains("fusion"));  // fold=auto is off: nothing to fold
  }
  // BERT's cost grows with the sequence: seq 64 (0) costs more per sample than seq 16.
  std::map<std::string, double> gflops;
  for (const auto& r : records)
    gflops[r["params"]["model"].get<std::string>() + "/" + r["params"]["seq"].dump()] =
        r["metrics"]["gflops_per_sample"]["forward"].get<double>();
  EXPECT_GT(gflops.at("tiny_bert/0"), 4 * gflops.at("tiny_bert/16"));
  EXPECT_GT(gflops.at("tiny_gpt2/0"), gflops.at("tiny_gpt2/16"));
}

// The 16-bit policies on the reference kernels: rounded at every op, inside their tolerances, and
// bf16 (8 bits of mantissa) further from float64 than fp16 (11).
TEST(Infer, LanguageModelPrecisionsPassTheirChecks) {
  const auto records = run_points("infer", {"model=tiny_bert,tiny_gpt2", "batch=2", "seq=32", "precision=bf16,fp16"});
  ASSERT_EQ(records.size(), 4u);
  std::map<std::string, double> error;
  for (const auto& r : records) {
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    EXPECT_EQ(r["check"]["passed"], true);
    error[r["params"]["model"].get<std::string>() + "/" + r["params"]["precision"].get<std::string>()] =
        r["check"]["rel_error"].get<double>();
  }
  for (const std::string model : {"tiny_bert", "tiny_gpt2"}) {
    EXPECT_GT(error.at(model + "/fp16"), 0.0) << model;
    EXPECT_GT(error.at(model + "/bf16"), error.at(model + "/fp16")) << model;
  }
}

TEST(Infer, LanguageModelBadInputIsInvalidSayingWhy) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"model=tiny_gpt2", "seq=65"}, "longer than its 64 positions"},
      {{"model=tiny_bert", "seq=-1"}, "seq >= 0"},
      {{"model=tiny_bert", "seq=8", "fold=on"}, "no batch norm to fold"},
      {{"model=tiny_gpt2", "seq=8", "precision=fp8"}, "runs fp32, tf32, bf16 or fp16"}};
  for (const auto& [args, why] : cases) {
    std::vector<std::string> a = args;
    a.push_back("batch=1");
    const auto records = run_points("infer", a);
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0]["status"], "invalid") << records[0].dump();
    EXPECT_TRUE(contains(records[0].value("reason", ""), why)) << why << ": " << records[0].dump();
  }
}

TEST(Infer, ReferenceLogitsOfALanguageModelAreSampleZerosHead) {
  zoo::ModelSpec s;
  s.training = false;
  s.seq = 8;
  s.model = "tiny_bert";
  const auto qa = zoo::reference_logits(s);
  EXPECT_EQ(qa.size(), 16u);  // (start, end) of each of the 8 tokens
  s.batch = 5;
  EXPECT_EQ(zoo::reference_logits(s), qa);
  s.model = "tiny_gpt2";
  EXPECT_EQ(zoo::reference_logits(s).size(), 64u);  // the vocabulary, at the last position
  s.seq = 9;
  EXPECT_NE(zoo::reference_logits(s), zoo::reference_logits([&] {
              zoo::ModelSpec t = s;
              t.seq = 8;
              return t;
            }()));
  // Top-1 of interleaved (start, end) pairs agrees only where both argmaxes do.
  EXPECT_EQ(zoo::logits_accuracy({1, 0, 0, 2}, {1, 0, 0, 2}, 2)["top1_agrees_f64"], true);
  EXPECT_EQ(zoo::logits_accuracy({1, 0, 0, 2}, {1, 3, 0, 2}, 2)["top1_agrees_f64"], false);  // the end moved
  EXPECT_THROW(zoo::logits_accuracy({1, 0, 0}, {1, 0, 0}, 2), Error);
}

// On a GPU (skipped without one): the tiny models and BERT-base / GPT-2 124M at a short sequence
// through the CUDA engine, captured and eager, each checked against float64 before it is timed.
TEST(InferGpu, LanguageModelsPassTheirChecksOnTheGpu) {
  try {
    backend::make_backend("cuda:0");
  } catch (const Error& e) {
    GTEST_SKIP() << "no CUDA device: " << e.what();
  }
  auto plan =
      plan_of("infer", {"model=tiny_bert,tiny_gpt2", "batch=1,4", "seq=64", "precision=fp32,bf16,fp16", "graph=on,off"},
              "cuda");
  const auto big = plan_of("infer", {"model=bert_base,gpt2_124m", "batch=2", "seq=128", "precision=bf16"}, "cuda");
  plan.insert(plan.end(), big.begin(), big.end());
  const auto records = run_plan(plan, {}, "cuda:0");
  ASSERT_EQ(records.size(), 26u);
  for (const auto& r : records) {
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    EXPECT_EQ(r["check"]["passed"], true);
    EXPECT_GT(r["rates"]["tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(r["metrics"]["device_bytes_peak"].get<double>(), 0.0);
  }
}

// ---------------------------------------------------------------------------------------------
// loadgen with the model system under test

TEST(ModelSut, SingleStreamRunsTheTinyResnet) {
  const auto records = run_points("loadgen", {"sut=tiny_resnet", "scenario=single-stream", "image_size=8", "samples=64"});
  ASSERT_EQ(records.size(), 1u);
  const json& r = records[0];
  ASSERT_EQ(r["status"], "ok") << r.dump();
  EXPECT_TRUE(contains(r["scenario"]["sut"].get<std::string>(), "tiny_resnet")) << r["scenario"].dump();
  EXPECT_GT(r["scenario"]["completed_samples_per_s"].get<double>(), 0.0);
  EXPECT_EQ(r["metrics"]["model"]["model"], "tiny_resnet");
  EXPECT_GT(r["metrics"]["batcher"]["batches"].get<double>(), 0.0);
  EXPECT_GT(r["counts"]["flops"].get<double>(), 0.0);
}

TEST(ModelSut, ExecutorRunsEveryBucket) {
  auto be = backend::make_backend("cpu");
  zoo::ModelSutSpec spec{"tiny_resnet", Precision::fp32, 8, Layout::nchw, 0, ""};
  auto exec = zoo::make_model_executor(*be, spec, 5);
  exec->prepare();
  std::vector<scenarios::QuerySample> batch;
  for (std::uint64_t n = 1; n <= 5; ++n) {
    batch.push_back({n, n * 7});
    exec->run(batch);
  }
  const json s = zoo::model_executor_summary(*exec);
  EXPECT_EQ(s["buckets"], json::array({1, 2, 4, 5}));
  EXPECT_EQ(s["padded_samples"], 1 + 2 + 4 + 4 + 5);
}

// Above 8 the buckets step by 8, so a batch pads by at most 7 (powers of two padded 17 to 32).
// Sample indices past the pool wrap, runs of consecutive ones share a copy, and the summary
// reports the memory the buckets took.
TEST(ModelSut, BucketsStepByEightAboveEightAndReportTheirMemory) {
  auto be = backend::make_backend("cpu");
  zoo::ModelSutSpec spec{"tiny_resnet", Precision::fp32, 8, Layout::nchw, 0, ""};
  auto exec = zoo::make_model_executor(*be, spec, 20);
  exec->prepare();
  std::uint64_t id = 0;
  const auto run = [&](std::size_t n, std::uint64_t first, std::uint64_t step) {
    std::vector<scenarios::QuerySample> batch;
    for (std::size_t i = 0; i < n; ++i) batch.push_back({id++, first + i * step});
    exec->run(batch);
  };
  run(9, 3, 1);    // one run of consecutive samples -> bucket 16
  run(17, 15, 1);  // wraps past the pool of 20 -> bucket 20
  run(20, 5, 7);   // scattered -> bucket 20
  run(3, 40, 13);  // -> bucket 4
  run(8, 0, 1);    // exactly a bucket
  EXPECT_THROW(run(21, 0, 1), Error);
  const json s = zoo::model_executor_summary(*exec);
  EXPECT_EQ(s["buckets"], json::array({1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(s["padded_samples"], 16 + 20 + 20 + 4 + 8);
  EXPECT_GT(s["device_bytes"].get<double>(), 0.0);
  const double image_bytes = 3 * 8 * 8 * 4;  // f32 3x8x8
  EXPECT_GE(s["pinned_host_bytes"].get<double>(), 20 * image_bytes);  // the pool, plus the logits
  EXPECT_GT(s["prepare_s"].get<double>(), 0.0);
}

// Language models behind the batcher: a sample is a sequence of `seq` tokens, its logits the
// head's (BERT: every token's start and end; GPT-2: the last position's vocabulary).
TEST(ModelSut, LanguageModelsRunBehindTheBatcher) {
  auto be = backend::make_backend("cpu");
  for (const char* model : {"tiny_bert", "tiny_gpt2"}) {
    SCOPED_TRACE(model);
    zoo::ModelSutSpec spec{model, Precision::fp32, 8, Layout::nchw, 16, ""};
    auto exec = zoo::make_model_executor(*be, spec, 5);
    exec->prepare();
    std::vector<scenarios::QuerySample> batch;
    for (std::uint64_t n = 1; n <= 5; ++n) {
      batch.push_back({n, n * 3});
      exec->run(batch);
    }
    const json s = zoo::model_executor_summary(*exec);
    EXPECT_EQ(s["seq"], 16);
    EXPECT_FALSE(s.contains("image_size"));
    EXPECT_EQ(s["buckets"], json::array({1, 2, 4, 5}));
    EXPECT_GE(s["pinned_host_bytes"].get<double>(), 5 * 16 * 4);  // the pool of i32 tokens, plus the logits
    EXPECT_TRUE(contains(exec->describe(), "seq 16")) << exec->describe();
    EXPECT_EQ(zoo::tokens_per_sample(spec), 16);
  }
  zoo::ModelSutSpec positions{"tiny_gpt2", Precision::fp32, 8, Layout::nchw, 0, ""};
  EXPECT_EQ(zoo::tokens_per_sample(positions), 64);
  zoo::ModelSutSpec too_long{"tiny_bert", Precision::fp32, 8, Layout::nchw, 65, ""};
  const std::string msg = test::usage_error([&] { zoo::make_model_executor(*be, too_long, 4); });
  EXPECT_TRUE(contains(msg, "longer than its 64 positions")) << msg;
  zoo::ModelSutSpec autoencoder{"tiny_compression_ae", Precision::fp32, 8, Layout::nchw, 0, ""};
  EXPECT_TRUE(contains(test::usage_error([&] { zoo::make_model_executor(*be, autoencoder, 4); }), "autoencoder"));
}

TEST(ModelSut, LoadgenRunsALanguageModelWithItsSequenceLength) {
  // Single-stream only: offline's 1,024-sample minimum takes longer than the test's 5 s timeout
  // on a loaded two-core machine running the reference kernels.
  const auto records =
      run_points("loadgen", {"sut=tiny_bert", "scenario=single-stream", "seq=16", "samples=64", "max_batch=4"});
  ASSERT_EQ(records.size(), 1u);
  for (const auto& r : records) {
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    EXPECT_TRUE(contains(r["scenario"]["sut"].get<std::string>(), "tiny_bert fp32 seq 16"));
    EXPECT_EQ(r["metrics"]["model"]["seq"], 16);
    EXPECT_EQ(r["counts"]["tokens"], 16.0);
    EXPECT_GT(r["counts"]["flops"].get<double>(), 0.0);
    EXPECT_GT(r["scenario"]["completed_samples_per_s"].get<double>(), 0.0);
  }
  const auto bad = run_points("loadgen", {"sut=tiny_gpt2", "scenario=single-stream", "seq=65", "samples=64"});
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0]["status"], "invalid") << bad[0].dump();
  EXPECT_TRUE(contains(bad[0].value("reason", ""), "longer than its 64 positions")) << bad[0].dump();
}

// ---------------------------------------------------------------------------------------------
// The binary

// accelbench with `args` (split by the shell), stdout and stderr together.
test::Ran run_cli(const std::string& args) { return test::shell(test::quote(test::accelbench_path()) + " " + args + " 2>&1"); }

TEST(Cli, RunTrainWritesAnOkRecord) {
  if (!fs::exists(test::accelbench_path())) GTEST_SKIP() << "accelbench not built";
  test::TempDir dir;
  const test::Ran o = run_cli("run train --device cpu --min-time 0.05 --max-noise 100 --axis batch=4 --axis image_size=8 "
                            "--option trajectory_steps=3 --out " + dir.path().string());
  ASSERT_EQ(o.code, 0) << o.output;
  std::vector<json> records;
  for (const auto& e : fs::directory_iterator(dir.path() / "runs"))
    if (fs::exists(e.path() / "points.jsonl")) {
      std::ifstream f(e.path() / "points.jsonl");
      for (std::string line; std::getline(f, line);) records.push_back(json::parse(line));
    }
  ASSERT_EQ(records.size(), 1u) << o.output;
  EXPECT_EQ(records[0]["workload"], "train");
  EXPECT_EQ(records[0]["status"], "ok");
  EXPECT_GT(records[0]["rates"]["samples_per_s"].get<double>(), 0.0);
  EXPECT_EQ(records[0]["options"]["trajectory_steps"], 3) << records[0].dump();
  EXPECT_EQ(records[0]["metrics"]["loss_trajectory"].size(), 3u);

  const test::Ran bad = run_cli("run train --device cpu --axis precision=fp8 --out " + dir.path().string());
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "fp8") && contains(bad.output, "fp16")) << bad.output;
}

}  // namespace
}  // namespace ab::workloads
