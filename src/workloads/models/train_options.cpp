#include "workloads/models/train_options.h"

#include <cmath>

#include "core/error.h"

namespace ab::workloads::zoo {

std::vector<OptionSpec> TrainOptions::specs() {
  const TrainOptions d;
  const auto number = [](double v) {
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
    return s;
  };
  return {
      {"lr",
       AxisKind::real,
       number(d.lr),
       {},
       "learning rate; 0 = sgd 0.1 x batch/256 (autoencoders: 10), lars 0.8 x batch/256; time to train: the "
       "schedule's peak, 0 = 0.2 x batch/256"},
      {"trajectory_steps",
       AxisKind::integer,
       std::to_string(d.trajectory_steps),
       {},
       "steps whose loss is read before timing (at least 1)"},
      {"steps_per_sample",
       AxisKind::integer,
       std::to_string(d.steps_per_sample),
       {},
       "back-to-back steps in each timed sample, at least (0: " + std::to_string(kGpuStepsPerSample) +
           " on GPUs, 1 elsewhere; more when a step is shorter than the sample target; at most " +
           std::to_string(kMaxStepsPerSample) + ")"},
      // 1 MiB: in a traced 2-GPU ResNet-50 step the last copy shrank from 17 MB to 1.6 MB and the
      // step's growth over one GPU from 0.41 to 0.27 ms (bench/HISTORY.md).
      {"tail_bucket_mib",
       AxisKind::real,
       number(d.tail_bucket_mib),
       {},
       "data parallelism: the first layers' gradients (backward's last) in a bucket of their own of at least "
       "this many MiB (at most bucket_mib), so that little is left to average after backward (0: none; the "
       "bucket_mib walk's remainder)"},
      {"dropout",
       AxisKind::real,
       number(d.dropout),
       {},
       "language models: hidden dropout probability in [0, 1) (after the embeddings and on each residual "
       "branch, as Hugging Face's GPT-2 and BERT place it; not on the attention probabilities); 0 = none, the "
       "throughput setting"},
      {"comm_mean",
       AxisKind::text,
       d.comm_mean,
       {"auto", "kernel", "update"},
       "data parallelism with copy engines: where the two ranks' gradients are averaged; kernel = a mean kernel "
       "per bucket beside backward, update = inside the SGD update (one pass less over the gradients); auto = "
       "update for sgd without fp16 loss scaling, else kernel"},
      {"max_epochs",
       AxisKind::integer,
       std::to_string(d.max_epochs),
       {},
       "time to train (dataset axis): epochs before the run stops not_converged"},
      {"time_limit_s",
       AxisKind::real,
       number(d.time_limit_s),
       {},
       "time to train: seconds of training (init excluded) before the run stops not_converged"},
      {"warmup_epochs",
       AxisKind::real,
       number(d.warmup_epochs),
       {},
       "time to train: epochs of linear learning-rate warm-up from 0 to the peak (lr)"},
      {"schedule_epochs",
       AxisKind::real,
       number(d.schedule_epochs),
       {},
       "time to train: the cosine decay ends at 1% of the peak at this epoch and holds there"},
      {"lr_updates_per_epoch",
       AxisKind::integer,
       std::to_string(d.lr_updates_per_epoch),
       {},
       "time to train: the rate changes this many times an epoch (a captured step is recaptured each time)"},
      {"weight_decay", AxisKind::real, number(d.weight_decay), {}, "time to train: SGD weight decay (every parameter)"},
      {"pad",
       AxisKind::integer,
       std::to_string(d.pad),
       {},
       "time to train: random crop after padding each side by this many pixels (0: none)"},
      {"flip", AxisKind::text, d.flip, {"on", "off"}, "with a dataset: random horizontal flip"},
      {"data_threads",
       AxisKind::integer,
       std::to_string(d.data_threads),
       {},
       "with a dataset: input pipeline worker threads (0: min(8, cores))"},
      {"decoder",
       AxisKind::text,
       d.decoder,
       {"cpu", "nvjpeg"},
       "throughput mode on real data: cpu = the pipeline's worker threads decode (libjpeg-turbo) and augment; "
       "nvjpeg = nvJPEG decodes each batch on the GPU and a kernel augments it there (dataset=folder:DIR)"},
      {"save_weights",
       AxisKind::text,
       d.save_weights,
       {},
       "time to train: write the trained parameters to this file (infer --option weights=FILE reads it)"}};
}

TrainOptions TrainOptions::from(const State& state) {
  TrainOptions o;
  o.lr = state.option_real("lr");
  o.trajectory_steps = state.option_int("trajectory_steps");
  o.steps_per_sample = state.option_int("steps_per_sample");
  o.tail_bucket_mib = state.option_real("tail_bucket_mib");
  o.comm_mean = state.option_text("comm_mean");
  o.dropout = state.option_real("dropout");
  o.max_epochs = state.option_int("max_epochs");
  o.time_limit_s = state.option_real("time_limit_s");
  o.warmup_epochs = state.option_real("warmup_epochs");
  o.schedule_epochs = state.option_real("schedule_epochs");
  o.lr_updates_per_epoch = state.option_int("lr_updates_per_epoch");
  o.weight_decay = state.option_real("weight_decay");
  o.pad = state.option_int("pad");
  o.flip = state.option_text("flip");
  o.data_threads = state.option_int("data_threads");
  o.decoder = state.option_text("decoder");
  o.save_weights = state.option_text("save_weights");
  return o;
}

void TrainOptions::validate() const {
  std::string bad;
  const auto refuse = [&bad](bool wrong, const std::string& what) {
    if (wrong) bad += (bad.empty() ? "" : "; ") + what;
  };
  refuse(trajectory_steps < 1, "trajectory_steps >= 1 (got " + std::to_string(trajectory_steps) + ")");
  refuse(steps_per_sample < 0 || steps_per_sample > kMaxStepsPerSample,
         "steps_per_sample in 0.." + std::to_string(kMaxStepsPerSample) + " (got " + std::to_string(steps_per_sample) + ")");
  refuse(!(tail_bucket_mib >= 0) || !std::isfinite(tail_bucket_mib), "tail_bucket_mib >= 0");
  refuse(!(lr >= 0) || !std::isfinite(lr), "a finite lr >= 0");
  refuse(!(dropout >= 0 && dropout < 1), "dropout in [0, 1)");
  refuse(max_epochs < 1, "max_epochs >= 1");
  refuse(!(time_limit_s > 0), "time_limit_s > 0");
  refuse(!(warmup_epochs >= 0) || !std::isfinite(warmup_epochs), "a finite warmup_epochs >= 0");
  refuse(!(schedule_epochs > warmup_epochs) || !std::isfinite(schedule_epochs), "schedule_epochs > warmup_epochs");
  refuse(lr_updates_per_epoch < 1, "lr_updates_per_epoch >= 1");
  refuse(!(weight_decay >= 0) || !std::isfinite(weight_decay), "a finite weight_decay >= 0");
  refuse(pad < 0 || pad > 64, "pad in 0..64");
  refuse(data_threads < 0 || data_threads > 256, "data_threads in 0..256");
  if (!bad.empty()) throw UsageError("train needs " + bad);
}

std::int64_t TrainOptions::steps_per_sample_on(const std::string& device_kind) const {
  if (steps_per_sample > 0) return steps_per_sample;
  return device_kind == "cuda" ? kGpuStepsPerSample : 1;
}

}  // namespace ab::workloads::zoo
