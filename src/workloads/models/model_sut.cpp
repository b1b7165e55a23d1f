// The loadgen system under test that runs a zoo model: per batch, the samples' images go from a
// host pool into the input of the smallest captured graph that holds them, the forward replays,
// and the logits come back to the host before the batch is reported complete.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "nn/device/device_kernels.h"
#include "workloads/models/models.h"

namespace ab::workloads::zoo {
namespace {

// One inference graph of a fixed batch; members in this order so the capture goes before the graph.
struct Bucket {
  std::size_t batch = 0;
  std::unique_ptr<nn::Graph> graph;
  nn::Value images, logits;
  std::unique_ptr<nn::Replayable> forward;
};

ModelSpec spec_for(const ModelSutSpec& s, std::size_t batch) {
  ModelSpec m;
  m.model = s.model;
  m.batch = static_cast<std::int64_t>(batch);
  m.image_px = s.image_px;
  m.precision = s.precision;
  m.layout = s.layout;
  m.training = false;
  return m;
}

class ModelBatchExecutor final : public scenarios::BatchExecutor {
 public:
  ModelBatchExecutor(backend::Backend& be, ModelSutSpec spec, std::size_t max_batch)
      : be_(be), spec_(std::move(spec)), cfg_(model_config(spec_.model)) {
    for (std::size_t b = 1; b < max_batch; b *= 2) sizes_.push_back(b);
    sizes_.push_back(max_batch);
  }
  std::string describe() const override {
    return spec_.model + " " + std::string(to_string(spec_.precision)) + " " + std::to_string(spec_.image_px) +
           " px " + std::string(to_string(spec_.layout)) + " on " + be_.info().id;
  }

  void prepare() override {
    kernels_ = nn::make_device_kernels(be_);
    for (std::size_t b : sizes_) {
      auto bucket = std::make_unique<Bucket>();
      bucket->batch = b;
      nn::GraphBuilder builder(graph_options(spec_for(spec_, b)));
      bucket->images = builder.input("images", Shape{static_cast<std::int64_t>(b), cfg_.in_channels, spec_.image_px,
                                                     spec_.image_px});
      bucket->logits = ab::models::resnet(builder, bucket->images, cfg_);
      builder.mark_output(bucket->logits);
      bucket->graph = std::make_unique<nn::Graph>(std::move(builder));
      bucket->graph->bind(*kernels_);
      buckets_.push_back(std::move(bucket));
    }
    // The sample pool: max_batch distinct images in the device's storage format, one after
    // another (the batch dimension is outermost in NCHW and NHWC alike).
    Bucket& largest = *buckets_.back();
    largest.graph->set_input(largest.images, synthetic_batch(kDataSeed, 0, static_cast<std::int64_t>(largest.batch),
                                                             cfg_.in_channels, spec_.image_px, cfg_.num_classes)
                                                 .images);
    const Tensor pool_tensor = largest.graph->tensor(largest.images);
    sample_bytes_ = static_cast<std::size_t>(pool_tensor.size_bytes()) / largest.batch;
    pool_.resize(static_cast<std::size_t>(pool_tensor.size_bytes()));
    kernels_->download(pool_tensor, pool_.data());
    staging_.resize(pool_.size());
    std::int64_t logits_bytes = 0;
    for (auto& b : buckets_) {
      Bucket& bucket = *b;
      kernels_->upload(bucket.graph->tensor(bucket.images), pool_.data());
      bucket.graph->forward(false);  // lazy initialisation outside the capture
      bucket.forward = bucket.graph->capture_step(nullptr);
      logits_bytes = std::max(logits_bytes, bucket.graph->tensor(bucket.logits).size_bytes());
    }
    logits_host_.resize(static_cast<std::size_t>(logits_bytes));
    kernels_->synchronize();
  }

  void run(std::span<const scenarios::QuerySample> batch) override {
    const auto it = std::lower_bound(sizes_.begin(), sizes_.end(), batch.size());
    if (it == sizes_.end()) throw Error("a batch of " + std::to_string(batch.size()) + " is above max_batch");
    Bucket& bucket = *buckets_[static_cast<std::size_t>(it - sizes_.begin())];
    const std::size_t pool_samples = buckets_.back()->batch;
    for (std::size_t i = 0; i < batch.size(); ++i)
      std::memcpy(staging_.data() + i * sample_bytes_,
                  pool_.data() + static_cast<std::size_t>(batch[i].index % pool_samples) * sample_bytes_, sample_bytes_);
    kernels_->upload(bucket.graph->tensor(bucket.images), staging_.data());
    bucket.forward->replay();
    kernels_->download(bucket.graph->tensor(bucket.logits), logits_host_.data());
    kernels_->synchronize();  // the batch's logits are on the host when this returns
    padded_samples_ += bucket.batch;
  }

  nlohmann::json summary() const {
    return {{"model", spec_.model},          {"precision", std::string(to_string(spec_.precision))},
            {"image_size", spec_.image_px},  {"layout", std::string(to_string(spec_.layout))},
            {"buckets", sizes_},             {"padded_samples", padded_samples_}};
  }

 private:
  backend::Backend& be_;
  ModelSutSpec spec_;
  ab::models::ResNetConfig cfg_;
  std::vector<std::size_t> sizes_;
  std::unique_ptr<nn::Kernels> kernels_;  // before the buckets: their memory comes from it
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<unsigned char> pool_, staging_, logits_host_;
  std::size_t sample_bytes_ = 0;
  std::uint64_t padded_samples_ = 0;
};

}  // namespace

std::unique_ptr<scenarios::BatchExecutor> make_model_executor(backend::Backend& backend, const ModelSutSpec& spec,
                                                              std::size_t max_batch) {
  if (max_batch < 1) throw UsageError("max_batch must be at least 1");
  return std::make_unique<ModelBatchExecutor>(backend, spec, max_batch);
}

nlohmann::json model_executor_summary(const scenarios::BatchExecutor& executor) {
  const auto* m = dynamic_cast<const ModelBatchExecutor*>(&executor);
  return m != nullptr ? m->summary() : nlohmann::json();
}

double forward_flops_per_sample(const ModelSutSpec& spec) {
  const ab::models::ResNetConfig cfg = model_config(spec.model);
  nn::GraphBuilder builder(graph_options(spec_for(spec, 1)));
  const nn::Value images = builder.input("images", Shape{1, cfg.in_channels, spec.image_px, spec.image_px});
  builder.mark_output(ab::models::resnet(builder, images, cfg));
  return static_cast<double>(nn::Graph(std::move(builder)).forward_flops());
}

}  // namespace ab::workloads::zoo
