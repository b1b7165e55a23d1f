// Tests for train's time to train of a GPT on a text file, on the reference kernels: tiny_gpt2 on
// sentences of a small grammar written here (fresh random every run) reaches a reachable
// validation loss with a falling curve and its MLPerf log matching the record; a target out of
// reach ends not_converged with every evaluation kept; empty, too short and unfit files are
// refused with clear messages; one seed gives the same losses, and seeds the olympic mean. On a
// GPU, the same target in each training precision.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/data.h"
#include "test_support.h"
#include "tta_support.h"

namespace ab::workloads {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::run_points;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// `sentences` of "the <adjective> <noun> <verb> a <noun>." with each word drawn from a short list:
// most bytes follow from the ones before, so a tiny model's loss falls fast from ln 256.
std::string grammar_text(std::uint64_t seed, int sentences) {
  const std::vector<std::string> adjectives{"red", "small", "quiet", "old"};
  const std::vector<std::string> nouns{"cat", "dog", "bird", "fish"};
  const std::vector<std::string> verbs{"sees", "likes", "follows", "finds"};
  const auto pick = [seed](const std::vector<std::string>& words, std::uint64_t i) -> const std::string& {
    return words[mix64(seed, i) % words.size()];
  };
  std::string text;
  for (int s = 0; s < sentences; ++s) {
    const auto k = static_cast<std::uint64_t>(4 * s);
    text += "the " + pick(adjectives, k) + " " + pick(nouns, k + 1) + " " + pick(verbs, k + 2) + " a " +
            pick(nouns, k + 3) + ". ";
  }
  return text;
}

fs::path write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// tiny_gpt2 (2 layers of 64 channels, positions 64) on windows of 32 bytes, a few short epochs.
std::vector<std::string> text_recipe(const fs::path& file, const std::string& target) {
  return {"model=tiny_gpt2",
          "batch=8",
          "seq=32",
          "dataset=text:" + file.string(),
          "target_loss=" + target,
          "lr=0.003",
          "warmup_epochs=0.5",
          "schedule_epochs=6",
          "max_epochs=6"};
}

TEST(TimeToTrainText, ReachesAReachableLossWithAFallingCurveAndItsLog) {
  test::TempDir tmp;
  const std::string text = grammar_text(test::seed(), 320);
  const fs::path file = write_text(tmp.path() / "grammar.txt", text);
  const auto records = run_points("train", text_recipe(file, "1.2"), tmp.path() / "run");
  ASSERT_EQ(records.size(), 1U);
  const json& r = records[0];
  ASSERT_EQ(r["status"], "ok") << r.dump(2);
  const json& t = r["metrics"]["time_to_train"];
  EXPECT_EQ(t["status"], "converged");
  EXPECT_EQ(t["target_loss"], 1.2);
  const std::vector<double> loss = test::curve_of(r, "loss");
  ASSERT_EQ(loss.size(), t["epochs"].get<std::size_t>());
  EXPECT_LE(loss.back(), 1.2);
  EXPECT_LT(loss.front(), std::log(256.0));  // below the untrained model's uniform guess
  for (std::size_t i = 0; i + 1 < loss.size(); ++i) {
    EXPECT_GT(loss[i], 1.2) << "stopped late at epoch " << i + 1;
    EXPECT_LT(loss[i + 1], loss[i]) << "the loss rose after epoch " << i + 1;
  }
  EXPECT_EQ(t["final_loss"].get<double>(), loss.back());
  EXPECT_GT(t["time_to_train_s"].get<double>(), 0);
  const json& d = r["metrics"]["dataset"];
  EXPECT_EQ(d["tokenizer"], "bytes");
  EXPECT_EQ(d["vocabulary"], 256);
  EXPECT_EQ(d["train_tokens"].get<std::size_t>() + d["eval_tokens"].get<std::size_t>(), text.size());
  EXPECT_EQ(d["eval_tokens"].get<std::size_t>(), text.size() / 10);
  EXPECT_EQ(d["eval_windows"].get<std::int64_t>(), (static_cast<std::int64_t>(text.size() / 10) - 1) / 32);

  // The log's eval_accuracy lines carry the losses, named as such, as does target_accuracy.
  const std::vector<json> log = test::mllog_of(tmp.path() / "run", r);
  std::vector<double> logged;
  for (const auto& l : log) {
    if (l["key"] == "eval_accuracy") {
      EXPECT_EQ(l["metadata"]["metric"], "loss");
      logged.push_back(l["value"].get<double>());
    }
    if (l["key"] == "target_accuracy") {
      EXPECT_EQ(l["value"], 1.2);
      EXPECT_EQ(l["metadata"]["metric"], "loss");
    }
    if (l["key"] == "opt_name") {
      EXPECT_EQ(l["value"], "adamw");
    }
  }
  EXPECT_EQ(logged, loss);
  const std::vector<std::string> keys = test::keys_of(log);
  EXPECT_LT(test::position(keys, "opt_adamw_beta_2"), std::ssize(keys));
  EXPECT_EQ(keys.back(), "run_stop");
  EXPECT_EQ(log.back()["metadata"]["status"], "success");
}

TEST(TimeToTrainText, AnUnreachableLossIsNotConvergedWithEveryEvaluationKept) {
  test::TempDir tmp;
  const fs::path file = write_text(tmp.path() / "grammar.txt", grammar_text(test::seed(), 160));
  std::vector<std::string> args = text_recipe(file, "0.001");
  args.push_back("max_epochs=2");
  const auto records = run_points("train", args, tmp.path() / "run");
  ASSERT_EQ(records.size(), 1U);
  const json& r = records[0];
  ASSERT_EQ(r["status"], "not_converged") << r.dump(2);
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "max_epochs (2)") &&
              contains(r["reason"].get<std::string>(), "best loss"))
      << r["reason"];
  const json& t = r["metrics"]["time_to_train"];
  EXPECT_FALSE(t.contains("time_to_train_s"));
  const std::vector<double> loss = test::curve_of(r, "loss");
  ASSERT_EQ(loss.size(), 2U);
  EXPECT_EQ(t["best_loss"].get<double>(), *std::min_element(loss.begin(), loss.end()));
  std::vector<double> logged;
  const std::vector<json> log = test::mllog_of(tmp.path() / "run", r);
  for (const auto& l : log)
    if (l["key"] == "eval_accuracy") logged.push_back(l["value"].get<double>());
  EXPECT_EQ(logged, loss);
  EXPECT_EQ(log.back()["metadata"]["status"], "aborted");
}

TEST(TimeToTrainText, EmptyShortAndUnfitFilesAreRefusedClearly) {
  test::TempDir tmp;
  const auto run_on = [&](const std::string& dataset, const std::string& model = "tiny_gpt2") {
    std::vector<std::string> args = text_recipe("unused", "1.0");
    args[0] = "model=" + model;
    args[3] = "dataset=" + dataset;
    return run_points("train", args)[0];
  };
  const fs::path empty = write_text(tmp.path() / "empty.txt", "");
  json r = run_on("text:" + empty.string());
  EXPECT_EQ(r["status"], "error");
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "empty")) << r["reason"];
  // 200 bytes: a held-out tail of 20, less than one window of 33.
  const fs::path short_file = write_text(tmp.path() / "short.txt", grammar_text(1, 20).substr(0, 200));
  r = run_on("text:" + short_file.string());
  EXPECT_EQ(r["status"], "invalid");
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "held-out tail") &&
              contains(r["reason"].get<std::string>(), "20 tokens"))
      << r["reason"];
  // 4000 bytes: 3600 training bytes make 112 windows of 32, fewer than a batch of 200.
  const fs::path medium = write_text(tmp.path() / "medium.txt", std::string(4000, 'a'));
  std::vector<std::string> big_batch = text_recipe(medium, "1.0");
  big_batch[1] = "batch=200";
  r = run_points("train", big_batch)[0];
  EXPECT_EQ(r["status"], "invalid");
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "less than one batch of 200")) << r["reason"];
  // A token file with a token beyond tiny_gpt2's 64, a masked model, an image set's model.
  const fs::path tokens = tmp.path() / "t.bin";
  data::write_tokens(tokens, std::vector<std::uint16_t>(3000, 70));
  r = run_on("tokens:" + tokens.string());
  EXPECT_EQ(r["status"], "invalid");
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "token 70 is outside tiny_gpt2's vocabulary of 64"))
      << r["reason"];
  r = run_on("text:" + medium.string(), "tiny_bert");
  EXPECT_EQ(r["status"], "invalid");
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "causal language model")) << r["reason"];
  r = run_on("text:" + medium.string(), "tiny_resnet");
  EXPECT_EQ(r["status"], "invalid");
  std::vector<std::string> no_target = text_recipe(medium, "0");
  r = run_points("train", no_target)[0];
  EXPECT_EQ(r["status"], "invalid");
  EXPECT_TRUE(contains(r["reason"].get<std::string>(), "target_loss")) << r["reason"];
}

TEST(TimeToTrainText, ASeedGivesTheSameLossesAndSeedsTheOlympicMean) {
  test::TempDir tmp;
  const fs::path file = write_text(tmp.path() / "grammar.txt", grammar_text(test::seed(), 160));
  std::vector<std::string> args = text_recipe(file, "2.2");
  args.push_back("seed=1:3");
  const auto records = run_points("train", args);
  ASSERT_EQ(records.size(), 3U);
  std::vector<double> times;
  for (const auto& r : records) {
    ASSERT_EQ(r["status"], "ok") << r.dump(2);
    times.push_back(r["metrics"]["time_to_train"]["time_to_train_s"].get<double>());
  }
  EXPECT_NE(test::curve_of(records[0], "loss"), test::curve_of(records[1], "loss"));  // another seed, another run
  const json& o = records[2]["metrics"]["time_to_train_olympic"];
  std::sort(times.begin(), times.end());
  EXPECT_EQ(o["runs"], 3);
  EXPECT_EQ(o["olympic_mean_s"].get<double>(), times[1]);
  args.back() = "seed=2";
  const auto again = run_points("train", args);
  ASSERT_EQ(again.size(), 1U);
  ASSERT_EQ(again[0]["status"], "ok") << again[0].dump(2);
  EXPECT_EQ(test::curve_of(again[0], "loss"), test::curve_of(records[1], "loss"));
}

// The same on the CUDA engine in each training precision, the step captured and replayed (each
// change of the rate recaptures it; AdamW's step count lives on the device across captures).
TEST(TimeToTrainTextGpu, ReachesTheLossInEachPrecision) {
  try {
    backend::make_backend("cuda:0");
  } catch (const Error& e) {
    GTEST_SKIP() << "no CUDA device: " << e.what();
  }
  test::TempDir tmp;
  const fs::path file = write_text(tmp.path() / "grammar.txt", grammar_text(test::seed(), 320));
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    std::vector<std::string> args = text_recipe(file, "1.2");
    args.push_back(std::string("precision=") + precision);
    const json r = run_points("train", args, tmp.path() / "run", "cuda:0")[0];
    ASSERT_EQ(r["status"], "ok") << r.dump(2);
    const std::vector<double> loss = test::curve_of(r, "loss");
    ASSERT_FALSE(loss.empty());
    EXPECT_LE(loss.back(), 1.2);
  }
}

}  // namespace
}  // namespace ab::workloads
