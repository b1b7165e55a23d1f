#include "workloads/models/datasets.h"

#include <algorithm>

#include "core/error.h"
#include "nn/kernels.h"

namespace ab::workloads::zoo {

bool is_real_dataset(const std::string& name) { return name != kSyntheticDataset; }

bool is_text_dataset(const std::string& name) {
  return (name.starts_with("text:") && name.size() > 5) || (name.starts_with("tokens:") && name.size() > 7);
}

TokenSplits load_token_splits(const std::string& name) {
  if (!is_text_dataset(name))
    throw UsageError("dataset '" + name + "' is no text dataset: text:FILE (bytes as tokens) or tokens:FILE (uint16)");
  const bool bytes = name.starts_with("text:");
  const std::string path = name.substr(name.find(':') + 1);
  std::vector<std::uint16_t> tokens = bytes ? data::tokenize_text_file(path) : data::read_tokens(path);
  if (tokens.empty()) throw Error(path + " holds no tokens");
  TokenSplits s;
  s.vocabulary = bytes ? data::kByteVocabulary : 0;
  s.tokenizer = bytes ? "bytes" : "file";
  const auto held = static_cast<std::size_t>(static_cast<double>(tokens.size()) * kHeldOutShare);
  const auto cut = static_cast<std::ptrdiff_t>(tokens.size() - held);
  s.held_out.assign(tokens.begin() + cut, tokens.end());
  tokens.resize(static_cast<std::size_t>(cut));
  s.train = std::move(tokens);
  return s;
}

data::ImageSet load_dataset(const std::string& name, const std::string& split) {
  if (name == "fashion-mnist") return data::read_fashion_mnist(split);
  if (name.starts_with("idx:") && name.size() > 4) {
    data::ImageSet s = data::read_fashion_mnist(split, name.substr(4));
    s.source = name + ":" + split;
    return s;
  }
  if (is_text_dataset(name))
    throw UsageError("dataset '" + name + "' holds tokens, for a language model (tiny_gpt2, gpt2_*), not images");
  throw UsageError(
      "dataset '" + name +
      "': synthetic, fashion-mnist, idx:DIR (a folder of MNIST-layout IDX files), folder:DIR (JPEG/PNG files in "
      "a subfolder per class: train's throughput mode), text:FILE or tokens:FILE (a language model's)");
}

namespace {

data::Augment base_augment(const data::ImageSet& set, std::int64_t channels, DType dtype) {
  data::Augment a;
  a.height = set.height;
  a.width = set.width;
  a.channels = channels;
  a.random_crop = false;
  a.flip = false;
  a.mean.fill(kFashionMnistMean);
  a.stddev.fill(kFashionMnistStd);
  a.dtype = dtype;
  return a;
}

}  // namespace

data::Augment train_augment(const data::ImageSet& set, std::int64_t channels, DType dtype, std::int64_t pad,
                            bool flip) {
  data::Augment a = base_augment(set, channels, dtype);
  a.pad = pad;
  a.flip = flip;
  return a;
}

EvalSplit make_eval_split(const data::ImageSet& set, std::int64_t channels, DType dtype, std::int64_t batch) {
  if (batch < 1 || set.count < 1) throw Error("evaluation split of " + set.source + ": no images or batch < 1");
  EvalSplit e;
  e.count = set.count;
  e.batch = batch;
  e.sample_bytes = set.height * set.width * channels * static_cast<std::int64_t>(size_bytes(dtype));
  e.pixels.assign(static_cast<std::size_t>(e.batches() * batch * e.sample_bytes), 0);
  e.labels = set.labels;
  const data::Augment a = base_augment(set, channels, dtype);
  const data::CropBox whole{0, 0, set.height, set.width, false};
  for (std::int64_t i = 0; i < set.count; ++i)
    data::augment_into(data::image_of(set, i), a, whole, e.pixels.data() + i * e.sample_bytes);
  // The padding is blank black images, normalised as any other (their predictions are ignored).
  if (e.batches() * batch > e.count) {
    data::Image black{set.height, set.width, set.channels, {}};
    black.pixels.assign(static_cast<std::size_t>(set.image_bytes()), 0);
    for (std::int64_t i = e.count; i < e.batches() * batch; ++i)
      data::augment_into(black, a, whole, e.pixels.data() + i * e.sample_bytes);
  }
  return e;
}

double top1_accuracy(nn::Graph& g, nn::Value images, nn::Value logits, const EvalSplit& split) {
  const Tensor in = g.tensor(images);
  if (!in.is_contiguous() || in.size_bytes() != split.batch * split.sample_bytes)
    throw Error("evaluation: the images input " + in.to_string() + " does not hold a batch of " +
                std::to_string(split.batch) + " samples of " + std::to_string(split.sample_bytes) + " bytes");
  std::int64_t correct = 0;
  for (std::int64_t b = 0; b < split.batches(); ++b) {
    g.kernels().upload(in, split.pixels.data() + b * split.batch * split.sample_bytes);
    g.forward(false);
    const std::vector<double> out = g.read(logits);
    const auto classes = static_cast<std::int64_t>(out.size()) / split.batch;
    for (std::int64_t i = 0; i < split.batch && b * split.batch + i < split.count; ++i) {
      const auto row = out.begin() + i * classes;
      const auto predicted = std::max_element(row, row + classes) - row;
      correct += predicted == split.labels[static_cast<std::size_t>(b * split.batch + i)] ? 1 : 0;
    }
  }
  return static_cast<double>(correct) / static_cast<double>(split.count);
}

void check_dataset_fits(const data::ImageSet& set, std::int64_t model_channels, Layout layout,
                        const std::string& model) {
  if (set.channels != model_channels && !(set.channels == 1 && model_channels == 3))
    throw UsageError(model + " takes " + std::to_string(model_channels) + "-channel images; " + set.source + " has " +
                     std::to_string(set.channels) + " (fashion_resnet takes Fashion-MNIST's one channel)");
  if (model_channels > 1 && layout != Layout::nhwc)
    throw UsageError(model + " on " + set.source + " needs layout=nhwc: the data pipeline writes NHWC batches");
}

}  // namespace ab::workloads::zoo
