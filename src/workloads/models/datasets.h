// Real data for the model workloads: the dataset axis's names, the splits they read, the
// augmentation train applies, top-1 accuracy of a graph's logits over an evaluation split, and the
// token splits of a text or token file.
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
// "text:FILE" (any file, byte-tokenized: each byte a token, vocabulary 256) or "tokens:FILE"
// (uint16 tokens, llm.c's format with or without its header): a language model's data.
bool is_text_dataset(const std::string& name);
// "train" or "test" of the named dataset; UsageError for a name that is none of the above, Error
// (naming the file and the fault) for missing, truncated or inconsistent files.
data::ImageSet load_dataset(const std::string& name, const std::string& split);

// A text dataset's tokens: the first (1 - kHeldOutShare) of the stream trains, the rest (its tail,
// cut at a token) is held out for evaluation.
inline constexpr double kHeldOutShare = 0.1;
struct TokenSplits {
  std::vector<std::uint16_t> train, held_out;
  std::int64_t vocabulary = 0;  // 256 for text:FILE; 0 for tokens:FILE (the model's own)
  std::string tokenizer;        // "bytes" or "file"
};
// UsageError for a name that is neither; Error (naming the file) for one that cannot be read, an
// empty file or a token file that fails its checks.
TokenSplits load_token_splits(const std::string& name);

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
