// train's throughput mode on real data: each step's batch comes from the input pipeline (worker
// threads decode and augment into a pinned ring, the DeviceFeeder copies it on a copy stream while
// the step before runs) or from nvJPEG on the GPU, and is copied into the step's fixed input
// tensors on the compute stream, so a captured step reads every batch. The record's `feed` block
// says whether the pipeline kept up. docs/METHODOLOGY.md, "Input pipeline".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nn/graph.h"
#include "workloads/models/models.h"
#include "workloads/models/train_options.h"

namespace ab::workloads::zoo {

// The dispatch of a train point: a dataset other than synthetic trains to target_accuracy (the
// time-to-train mode) unless target_accuracy is 0 or the dataset is an image folder (folder:DIR
// has no held-out split); those feed the throughput mode. A text or token file always trains to
// target_loss (the feed takes images only).
bool trains_to_target(const std::string& dataset, double target_accuracy);
// "folder:DIR": a folder with one subfolder per class of JPEG/PNG files (data::scan_image_folder).
bool is_folder_dataset(const std::string& dataset);

class TrainFeed {
 public:
  virtual ~TrainFeed() = default;
  // Queues the next batch into the graph's images and labels on the compute stream (before the
  // step that reads them is queued).
  virtual void next() = 0;
  // The timed window: from here to record(), which adds the `feed` metric (images/s, host CPU per
  // image, time the training thread waited on the feed and its share of the window).
  virtual void start_window() = 0;
  virtual void record(State& state) = 0;
};

// The feed of `dataset` into `model`'s inputs at spec's batch and image size (the graph bound on
// `kernels`): RandomResizedCrop and flip, normalised in the input's dtype. Unreadable files of a
// folder are left out, counted and named in the record. UsageError for a model that takes no
// images, too few classes, or a layout the NHWC batches do not fit; Unsupported (the point
// skipped) for nvjpeg where this build or device has none.
std::unique_ptr<TrainFeed> make_train_feed(State& state, const std::string& dataset, const TrainOptions& o,
                                           std::uint64_t seed, nn::Graph& graph, const ZooModel& model,
                                           const ModelSpec& spec);

}  // namespace ab::workloads::zoo
