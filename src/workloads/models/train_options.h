// The train workload's tuning knobs: one value per run (`--option name=value`, a suite step's
// `options:`), never swept. What a user compares (model, batch, precision, gpus, the
// data-parallel bucket size, wire dtype and engine) stays an axis.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workloads/workload.h"

namespace ab::workloads::zoo {

// GPT-2's AdamW as llm.c and nanoGPT train it: betas (0.9, 0.95), decay 0.1 on weights, the
// gradient norm clipped to 1, rate 3e-4 (llm.c's default): train's optimizer=adamw, and the
// language models' time to train on a text file.
inline constexpr double kAdamWLr = 3e-4, kAdamWBeta1 = 0.9, kAdamWBeta2 = 0.95, kAdamWEpsilon = 1e-8;
inline constexpr double kAdamWWeightDecay = 0.1, kAdamWMaxGradNorm = 1.0;

struct TrainOptions {
  double lr = 0;                        // 0: the recipe's rate (train.cpp, make_optimizer)
  std::int64_t trajectory_steps = 30;   // steps whose loss is read before timing
  std::int64_t steps_per_sample = 0;    // floor of back-to-back steps per timed sample; 0: the device's
  // The first layers' gradients (backward's last) in a bucket of their own of at least this many
  // MiB (capped at bucket_mib); 0: none.
  double tail_bucket_mib = 1;
  std::string comm_mean = "auto";       // copy engines' mean: auto, kernel, update
  double dropout = 0;                   // language models' hidden dropout probability

  // Time to train (a dataset axis other than synthetic; train_to_target.cpp): the recipe.
  std::int64_t max_epochs = 30;            // the run stops not_converged after this many
  double time_limit_s = 1800;              // ... or once the run (init excluded) passes this
  double warmup_epochs = 1;                // linear warm-up of the rate from 0 to its peak
  double schedule_epochs = 10;             // cosine from the peak down to 1% of it at this epoch, then held
  std::int64_t lr_updates_per_epoch = 10;  // the rate is piecewise constant: a captured step is recaptured
  double weight_decay = 5e-4;              // SGD's, on every parameter
  std::int64_t pad = 2;                    // random crop: pad each side, cut the image's size back at random
  std::string flip = "on";                 // random horizontal mirror
  std::int64_t data_threads = 0;           // pipeline workers; 0: min(8, cores)
  std::string decoder = "cpu";             // throughput mode on real data: cpu (the workers) or nvjpeg
  std::string save_weights;                // write the trained parameters here (weights.h's format); "": none

  // On a GPU a timed sample holds at least this many back-to-back steps, as a training loop runs
  // them and as bench/compare_ddp.py times PyTorch: one step per sample would time each graph
  // launch's host latency, and under a launcher every sample's start skew between the ranks.
  static constexpr std::int64_t kGpuStepsPerSample = 5;
  static constexpr std::int64_t kMaxStepsPerSample = 1000;

  // The declarations `accelbench list` shows, with these defaults.
  static std::vector<OptionSpec> specs();
  // The run's values (State::option_*).
  static TrainOptions from(const State& state);
  // UsageError naming each value out of its range and the range.
  void validate() const;
  // The floor of steps per sample on a device kind: steps_per_sample, or its default there.
  std::int64_t steps_per_sample_on(const std::string& device_kind) const;
};

}  // namespace ab::workloads::zoo
