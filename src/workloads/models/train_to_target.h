// train's time-to-train mode (a dataset axis other than synthetic): epochs over the training split,
// each followed by an evaluation on the held-out split, until the evaluation reaches the target: an
// image classifier's top-1 accuracy (target_accuracy; images through the data pipeline) or a GPT's
// validation loss on a text or token file (target_loss, nats per token; target_task.h). MLPerf's
// timing rules: the time to train runs from run_start (after init: data read, graph built and
// bound, step captured) to the evaluation that reaches the target. Writes an MLPerf training log
// (mllog.h) into the point's artifacts. docs/METHODOLOGY.md, "Time to train".
#pragma once

#include <cstdint>
#include <string>

#include "dist/comm.h"
#include "workloads/models/models.h"
#include "workloads/models/train_options.h"

namespace ab::workloads::zoo {

struct TargetPoint {
  ModelSpec spec;  // image_size is the data's (the axis is ignored)
  std::string dataset;
  double target_accuracy = 0;  // image sets
  double target_loss = 0;      // text and token files: mean validation cross-entropy, nats per token
  std::uint64_t seed = 1;  // parameter initialisation, sample order and augmentation
  bool use_graph = true;
  // Data parallelism: gpus ranks of `comm` (one process per GPU, under a launcher, exactly gpus
  // of them), each training its shard of every epoch, the gradients averaged through
  // dist::DataParallel in buckets of bucket_mib; the batch is per GPU. Null comm: one process.
  std::int64_t gpus = 1;
  dist::Comm* comm = nullptr;
  double bucket_mib = 25;
  int rank() const { return comm != nullptr && gpus > 1 ? comm->rank() : 0; }
  int ranks() const { return comm != nullptr && gpus > 1 ? comm->size() : 1; }
};
// Skipped (saying why) for a launch that is not gpus processes, or host averaging (the CPU) with
// a captured step. Status ok with metrics.time_to_train; NotConverged (not_converged, with the best evaluation) when
// max_epochs or time_limit_s ends the run first, Diverged for a non-finite training loss, the
// scenario result interrupted on Ctrl-C; every evaluation made is in the record and the log in each case.
void train_to_target(State& state, const TargetPoint& p, const TrainOptions& o);

// The recipe's rate at optimizer step `step` for a peak rate: linear warm-up from 0 over
// warmup_epochs, then a cosine down to 1% of the peak at schedule_epochs, held after it; piecewise
// constant over lr_updates_per_epoch segments of each epoch (each segment takes its midpoint's rate).
double scheduled_lr(double peak, std::int64_t step, std::int64_t steps_per_epoch, const TrainOptions& o);
// The recipe's peak when the lr option is 0: 0.2 x global batch / 256.
double recipe_peak_lr(std::int64_t global_batch);

}  // namespace ab::workloads::zoo
