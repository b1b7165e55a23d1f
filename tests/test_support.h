// Helpers shared by the test files: replayable random seeds, skips that CI turns into failures,
// running the accelbench binary, a scratch folder, exception-message capture, and a tiny ResNet
// trained on a synthetic image task (the learnability tests of every kernel backend).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "measure/measure.h"
#include "models/resnet.h"
#include "nn/kernels.h"
#include "nn/optim.h"

namespace ab::test {

// ---------------------------------------------------------------------------------------------
// Stopping settings for tests of what a point records, not of how steady the machine is: a point
// stops after its minimum time and samples whatever its spread (under a 20% rule a loaded two-core
// CI machine held training points for their whole 5 s timeout).

// Below Hopper (compute capability 9.0): the build targets sm_90, and cuDNN's fp8 convolutions
// need Hopper or newer; the fp8 GPU tests skip there and nowhere else.
inline bool below_hopper(const backend::DeviceInfo& info) {
  return std::stod(info.compute_capability.empty() ? "0" : info.compute_capability) < 9.0;
}

inline measure::Settings record_settings() {
  measure::Settings s;
  s.min_time_s = 0.02;
  s.warmup_s = 0;
  s.timeout_s = 5;
  s.max_noise_pct = 100;
  s.min_samples = 5;
  s.target_sample_s = 1e-3;
  return s;
}

// Every record of the runs under `out` (each points.jsonl below it), in file order.
// The records of the one run under `out`/runs (a failed expectation where there are more or none).
inline std::vector<nlohmann::json> only_run_records(const std::filesystem::path& out) {
  std::vector<std::filesystem::path> runs;
  for (const auto& e : std::filesystem::directory_iterator(out / "runs"))
    if (e.is_directory()) runs.push_back(e.path());
  EXPECT_EQ(runs.size(), 1u) << "run folders under " << out;
  std::vector<nlohmann::json> records;
  if (runs.empty()) return records;
  std::ifstream in(runs[0] / "points.jsonl");
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

inline std::vector<nlohmann::json> read_records(const std::filesystem::path& out) {
  std::vector<nlohmann::json> records;
  for (const auto& e : std::filesystem::recursive_directory_iterator(out))
    if (e.path().filename() == "points.jsonl") {
      std::ifstream in(e.path());
      for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
    }
  return records;
}

// ---------------------------------------------------------------------------------------------
// Files the data tests write: bytes as given (parent folders made), and an IDX file of unsigned
// bytes (MNIST's format: magic 0x0000 08 <rank>, big-endian 32-bit dims, then the values).

inline void write_bytes(const std::filesystem::path& p, const std::vector<std::uint8_t>& b) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline std::vector<std::uint8_t> idx_file(const std::vector<std::uint32_t>& dims,
                                          const std::vector<std::uint8_t>& values) {
  std::vector<std::uint8_t> b{0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
  for (const std::uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(d >> s));
  b.insert(b.end(), values.begin(), values.end());
  return b;
}

// ---------------------------------------------------------------------------------------------
// Random seeds a failure can be replayed from. Each test has one base seed: AB_TEST_SEED where set,
// else a fresh one (new random inputs every run). The test's first seed() is the base itself, the
// n-th after it mix64(base, n), so AB_TEST_SEED=<base> replays every seed the test drew. The
// listener in test_main.cpp draws the base when a test starts and prints it when the test fails.

struct TestSeeds {
  std::uint64_t base = 0;
  std::uint64_t drawn = 0;  // seeds handed out in the current test
};

inline TestSeeds& test_seeds() {
  static TestSeeds seeds;
  return seeds;
}

// AB_TEST_SEED's value, or nothing where unset; a value that is not a whole number is refused.
inline std::optional<std::uint64_t> seed_from_environment() {
  const char* env = std::getenv("AB_TEST_SEED");
  if (env == nullptr || *env == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (errno != 0 || *end != '\0' || *env == '-')
    throw std::invalid_argument(std::string("AB_TEST_SEED='") + env + "' is not an unsigned 64-bit integer");
  return static_cast<std::uint64_t>(v);
}

// The next seed of the current test (see TestSeeds).
inline std::uint64_t seed() {
  TestSeeds& s = test_seeds();
  const std::uint64_t n = s.drawn++;
  return n == 0 ? s.base : mix64(s.base, n);
}

// ---------------------------------------------------------------------------------------------
// Skips that CI refuses. A test whose tool is missing (mpirun, the browser, the chart scripts)
// skips with the reason; where AB_REQUIRE lists that tool (comma-separated, e.g. "mpi,browser,charts",
// set by scripts/test.sh on CI) the same test fails instead, so a broken machine cannot pass green.

inline bool required(std::string_view what) {
  const char* env = std::getenv("AB_REQUIRE");
  if (env == nullptr) return false;
  std::string_view list(env);
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    if (list.substr(0, comma) == what) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

// Skips the test (or fails it, where AB_REQUIRE names `what`) with `why`. A statement, as GTEST_SKIP.
#define AB_SKIP_OR_REQUIRE(what, why)                                                           \
  do {                                                                                          \
    if (::ab::test::required(what))                                                             \
      FAIL() << why << " (AB_REQUIRE names '" << what << "': this machine must run the test)";  \
    else                                                                                        \
      GTEST_SKIP() << why;                                                                      \
  } while (false)

// ---------------------------------------------------------------------------------------------
// Running commands and the accelbench binary of this build.

struct Ran {
  int code = -1;       // the exit status; -1 where the command did not exit normally
  std::string output;  // what the command wrote to stdout (callers add 2>&1 for stderr)
};

// `s` in single quotes for sh, its own single quotes escaped.
inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `cmd` under sh and returns its exit status and stdout.
inline Ran shell(const std::string& cmd) {
  Ran r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[65536];
  std::size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline const std::string& accelbench_path() {
  static const std::string path = std::string(AB_TEST_BINARY_DIR) + "/src/cli/accelbench";
  return path;
}

// accelbench with `args` (each quoted), stdout and stderr together.
inline Ran accelbench(const std::vector<std::string>& args) {
  std::string cmd = quote(accelbench_path());
  for (const auto& a : args) cmd += " " + quote(a);
  return shell(cmd + " 2>&1");
}

// ---------------------------------------------------------------------------------------------

// A fresh folder under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ab_test_XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  // Writes `text` to path()/rel, creating the folders on the way.
  void write(const std::filesystem::path& rel, const std::string& text) const {
    std::filesystem::create_directories((path_ / rel).parent_path());
    std::ofstream(path_ / rel) << text;
  }

 private:
  std::filesystem::path path_;
};

// The message of the E that `f` throws; fails the test if it throws nothing or another type.
template <typename E, typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected another exception type, got: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected an exception, nothing was thrown";
  return {};
}

template <typename F>
std::string usage_error(F&& f) {
  return error_message<UsageError>(std::forward<F>(f));
}

// ---------------------------------------------------------------------------------------------
// Learning a synthetic task: 8x8 one-channel images whose class sets a pattern (horizontal
// stripes, vertical stripes, checkerboard, 2x2 blocks) with random phase, amplitude and Gaussian
// noise.

inline constexpr std::int64_t kPatternPx = 8, kPatternBatch = 32, kPatternClasses = 4;

struct PatternBatch {
  std::vector<double> images, labels;
};

inline PatternBatch pattern_batch(std::uint64_t seed, std::uint64_t batch_index) {
  PatternBatch b;
  for (std::int64_t i = 0; i < kPatternBatch; ++i) {
    const std::uint64_t id = batch_index * kPatternBatch + static_cast<std::uint64_t>(i);
    const auto label = static_cast<int>(mix64(seed, 4 * id) % kPatternClasses);
    const auto phase = static_cast<std::int64_t>(mix64(seed, 4 * id + 1) % 2);
    const double amplitude = uniform(seed, 4 * id + 2, 0.5, 1.5);
    b.labels.push_back(label);
    for (std::int64_t h = 0; h < kPatternPx; ++h)
      for (std::int64_t w = 0; w < kPatternPx; ++w) {
        const std::int64_t bit = label == 0 ? h : label == 1 ? w : label == 2 ? h + w : h / 2 + w / 2;
        const auto px = static_cast<std::uint64_t>(h * kPatternPx + w);
        const double u1 = uniform(seed + id + 1, 2 * px, 0, 1), u2 = uniform(seed + id + 1, 2 * px + 1, 0, 1);
        const double noise = 0.5 * std::sqrt(-2 * std::log(1 - u1)) * std::cos(2 * std::numbers::pi * u2);
        b.images.push_back(amplitude * (((bit + phase) % 2) ? 1.0 : -1.0) + noise);
      }
  }
  return b;
}

struct TrainRun {
  std::vector<double> losses;
  double accuracy = 0;
};

struct TinyTraining {
  std::uint64_t data_seed = 1, init_seed = 1;
  int steps = 100;
  bool lars = false;
  int eval_batches = 0;  // held-out batches scored with running statistics after training
  Layout layout = Layout::nchw;
};

// Trains models::tiny_resnet on `kernels` with SGD (or LARS) and returns every step's loss.
inline TrainRun train_tiny(nn::Kernels& kernels, const TinyTraining& t) {
  nn::GraphOptions o;
  o.seed = t.init_seed;
  o.layout = t.layout;
  nn::GraphBuilder b(o);
  const models::Classifier m =
      models::build_classifier(b, models::tiny_resnet(1, kPatternClasses), kPatternBatch, kPatternPx);
  nn::Graph g(std::move(b));
  g.bind(kernels);
  nn::Sgd sgd(0.05, 0.9, 5e-4);
  nn::Lars lars_opt(0.2, 0.9, 5e-4, 0.05);
  nn::Optimizer& opt = t.lars ? static_cast<nn::Optimizer&>(lars_opt) : sgd;
  TrainRun r;
  for (int step = 0; step < t.steps; ++step) {
    const PatternBatch batch = pattern_batch(t.data_seed, static_cast<std::uint64_t>(step));
    g.set_input(m.images, batch.images);
    g.set_input(m.labels, batch.labels);
    g.forward();
    g.backward();
    g.update(opt);
    r.losses.push_back(g.read(m.loss)[0]);
  }
  int correct = 0;
  for (int e = 0; e < t.eval_batches; ++e) {
    const PatternBatch batch = pattern_batch(t.data_seed, 1'000'000 + static_cast<std::uint64_t>(e));  // held out
    g.set_input(m.images, batch.images);
    g.set_input(m.labels, batch.labels);
    g.forward(/*training=*/false);  // running statistics
    const auto logits = g.read(m.logits);
    for (std::int64_t i = 0; i < kPatternBatch; ++i) {
      const auto row = logits.begin() + i * kPatternClasses;
      const auto best = std::max_element(row, row + kPatternClasses) - row;
      correct += best == static_cast<long>(batch.labels[static_cast<std::size_t>(i)]) ? 1 : 0;
    }
  }
  if (t.eval_batches > 0) r.accuracy = correct / static_cast<double>(t.eval_batches * kPatternBatch);
  return r;
}

// (loss(x_i + h) - loss(x_i - h)) / 2h for element i of the host-visible tensor x whose values are
// `values` (restored before returning): the central difference gradient checks compare with.
template <class Loss>
double central_difference(const Tensor& x, std::vector<double>& values, std::size_t i, double h, Loss&& loss) {
  const double x0 = values[i];
  values[i] = x0 + h;
  write_host(x, values);
  const double up = loss();
  values[i] = x0 - h;
  write_host(x, values);
  const double down = loss();
  values[i] = x0;
  write_host(x, values);
  return (up - down) / (2 * h);
}

// Non-trivial batch-norm values, as after training (the initial ones, gamma 1, beta 0, mean 0 and
// var 1, would fold into a near no-op): gamma, beta, running mean and variance of every batch norm
// set to fresh random values, positive variances.
inline void randomise_batchnorms(nn::ParameterValues& values, std::uint64_t seed) {
  std::uint64_t counter = 0;
  int found = 0;
  for (auto& [name, v] : values) {
    if (!name.ends_with(".running_var")) continue;
    const std::string bn = name.substr(0, name.size() - std::string(".running_var").size());
    ++found;
    for (auto& x : v) x = uniform(seed, counter++, 0.3, 2.0);
    for (auto& x : values.at(bn + ".running_mean")) x = uniform(seed, counter++, -0.5, 0.5);
    for (auto& x : values.at(bn + ".weight")) x = uniform(seed, counter++, 0.5, 1.5);
    for (auto& x : values.at(bn + ".bias")) x = uniform(seed, counter++, -0.5, 0.5);
  }
  ASSERT_GT(found, 0);
}

// Mean of the last n values.
inline double mean_tail(const std::vector<double>& v, std::size_t n) {
  double s = 0;
  for (std::size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

}  // namespace ab::test
