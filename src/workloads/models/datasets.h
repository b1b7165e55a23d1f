// Real data for the model workloads: the dataset axis's names, the splits they read, the
// augmentation train applies, and top-1 accuracy of a graph's logits over an evaluation split.
// docs/METHODOLOGY.md, "Time to train".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "data/data.h"
#include "data/pipeline.h"
#include "nn/graph.h"

namespace ab::workloads::zoo {

// The dataset axis: "synthetic" (the fixed generated batch, the throughput mode), "fashion-mnist"
// (data::fashion_mnist_dir(): Debian's package or ACCELBENCH_FASHION_MNIST) or "idx:DIR" (a folder
// laid out as MNIST's: train-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz], ...).
inline constexpr const char* kSyntheticDataset = "synthetic";
bool is_real_dataset(const std::string& name);  // anything but "synthetic"
// "train" or "test" of the named dataset; UsageError for a name that is none of the above, Error
// (naming the file and the fault) for missing, truncated or inconsistent files.
data::ImageSet load_dataset(const std::string& name, const std::string& split);

// Fashion-MNIST's pixel mean and standard deviation over the training split (x / 255).
inline constexpr float kFashionMnistMean = 0.2860F, kFashionMnistStd = 0.3530F;
// What each training sample becomes: padded by `pad` pixels, cut back to its size at random,
// mirrored with probability 1/2 (`flip`), normalised, in `dtype` with `channels` channels.
data::Augment train_augment(const data::ImageSet& set, std::int64_t channels, DType dtype, std::int64_t pad, bool flip);

// An evaluation split ready to upload: every image normalised (no augmentation) in the graph's
// input dtype, padded with blank images to whole batches; `count` are real.
struct EvalSplit {
  std::int64_t count = 0, batch = 0, sample_bytes = 0;
  std::vector<std::uint8_t> pixels;  // batches() * batch samples, NHWC (= NCHW for one channel)
  std::vector<std::int32_t> labels;  // count
  std::int64_t batches() const { return (count + batch - 1) / batch; }
};
EvalSplit make_eval_split(const data::ImageSet& set, std::int64_t channels, DType dtype, std::int64_t batch);

// Top-1 accuracy of `logits` ([batch, classes], the graph's output) over the split: each batch
// uploaded into `images`, one forward(false) (running statistics on a training graph), the
// padding's predictions ignored. Error where the images tensor is not the split's batch layout.
double top1_accuracy(nn::Graph& g, nn::Value images, nn::Value logits, const EvalSplit& split);

// The model's input must take the set's images: Error naming both where channels differ or the
// layout would need a transpose (3-channel inputs in NCHW: the pipeline writes NHWC).
void check_dataset_fits(const data::ImageSet& set, std::int64_t model_channels, Layout layout,
                        const std::string& model);

}  // namespace ab::workloads::zoo
