// The loadgen system under test that runs a zoo model: per batch, each sample's image (a language
// model's tokens; every input of an ONNX model: token ids, attention mask, token types) is copied
// from a page-locked host pool straight into its row of each input of the smallest captured graph
// that holds the batch, the forward replays, the batch's logits come back to page-locked host
// memory, and one stream synchronisation makes the batch complete. The samples start on the host,
// as MLPerf's sample library holds them; nothing is gathered or staged by the CPU.
#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "nn/cuda/device_kernels.h"
#include "workloads/models/models.h"

namespace ab::workloads::zoo {
namespace {

// One inference graph of a fixed batch; members in this order so the capture goes before the graph.
struct Bucket {
  std::size_t batch = 0;
  std::unique_ptr<nn::Graph> graph;
  ZooModel model;  // inputs: model_inputs(model); logits: model.output
  std::unique_ptr<nn::Replayable> forward;
};

// What a batch is written into: every input of an ONNX model in its file's order, else the one
// input (images, or a language model's tokens).
std::vector<nn::Value> model_inputs(const ZooModel& m) {
  if (m.onnx_inputs.empty()) return {model_input(m)};
  std::vector<nn::Value> values;
  for (const ZooModel::OnnxInput& in : m.onnx_inputs) values.push_back(in.value);
  return values;
}

// One input's samples in the device's storage format, one after another (the batch dimension is
// outermost in NCHW and NHWC alike, of the tokens [B, T] and of an ONNX model's every input).
struct PoolInput {
  nn::HostBuffer samples;  // page-locked on a GPU: copies are DMA, queued without a wait
  std::int64_t sample_bytes = 0;
};

ModelSpec spec_for(const ModelSutSpec& s, std::size_t batch) {
  ModelSpec m;
  m.model = s.model;
  m.batch = static_cast<std::int64_t>(batch);
  m.image_px = s.image_px;
  m.precision = s.precision;
  m.layout = s.layout;
  m.seq = s.seq;
  m.inputs_file = s.inputs_file;
  if (m.seq == 0 && is_language_model(s.model)) m.seq = language_config(s.model).positions;
  m.training = false;
  // An ONNX model runs as infer's default does: conv chains folded, the epilogue inside.
  m.fold_batchnorm = m.fuse_conv_epilogue = is_onnx_model(s.model);
  return m;
}

// The batch sizes with a captured graph: 1, 2, 4, 8, then every multiple of 8, and max_batch.
// Powers of two padded a batch of 33 to 64 (ResNet-50 server runs padded 30%); steps of 8 pad at
// most 7 samples (under 25% from a batch of 25 on, 11% at 64), and keep batches tensor-core
// multiples. Each bucket is its own graph with its own weights and arena, so memory grows with
// the sum of the sizes: 1,103 samples' activations for max_batch 128, against 255 for powers of two.
std::vector<std::size_t> bucket_sizes(std::size_t max_batch) {
  std::vector<std::size_t> sizes;
  for (std::size_t b = 1; b < std::min<std::size_t>(max_batch, 8); b *= 2) sizes.push_back(b);
  for (std::size_t b = 8; b < max_batch; b += 8) sizes.push_back(b);
  sizes.push_back(max_batch);
  return sizes;
}

class ModelBatchExecutor final : public scenarios::BatchExecutor {
 public:
  ModelBatchExecutor(backend::Backend& be, ModelSutSpec spec, std::size_t max_batch)
      : be_(be), spec_(std::move(spec)), sizes_(bucket_sizes(max_batch)) {}
  std::string describe() const override {
    const std::string size = is_language_model(spec_.model)
                                 ? "seq " + std::to_string(spec_for(spec_, 1).seq)
                                 : std::to_string(spec_.image_px) + " px " + std::string(to_string(spec_.layout));
    return spec_.model + " " + std::string(to_string(spec_.precision)) + " " + size + " on " + be_.info().id;
  }

  void prepare() override {
    const auto started = std::chrono::steady_clock::now();
    kernels_ = nn::make_device_kernels(be_);
    for (std::size_t b : sizes_) {
      auto bucket = std::make_unique<Bucket>();
      bucket->batch = b;
      nn::GraphBuilder builder(graph_options(spec_for(spec_, b)));
      bucket->model = build_zoo_model(builder, spec_for(spec_, b));
      if (bucket->model.compression) throw UsageError("the model SUT runs classifiers and language models");
      bucket->graph = std::make_unique<nn::Graph>(std::move(builder));
      bucket->graph->bind(*kernels_);
      set_model_parameters(*bucket->graph, bucket->model, spec_for(spec_, b));
      buckets_.push_back(std::move(bucket));
    }
    // The sample pool: max_batch distinct samples of every input (synthetic as infer's are, from
    // sample 0 on), in page-locked memory.
    Bucket& largest = *buckets_.back();
    upload_batch(*largest.graph, largest.model, 0, spec_for(spec_, largest.batch));
    for (const nn::Value& input : model_inputs(largest.model)) {
      const Tensor t = largest.graph->tensor(input);
      PoolInput& in = pool_.emplace_back();
      in.sample_bytes = t.size_bytes() / static_cast<std::int64_t>(largest.batch);
      in.samples = kernels_->allocate_host(t.size_bytes());
      kernels_->download(t, in.samples.data());
    }
    std::int64_t logits_bytes = 0;
    for (auto& b : buckets_) {
      Bucket& bucket = *b;
      const std::vector<nn::Value> inputs = model_inputs(bucket.model);
      for (std::size_t i = 0; i < inputs.size(); ++i)
        kernels_->upload(bucket.graph->tensor(inputs[i]), pool_[i].samples.data());
      bucket.graph->forward(false);  // lazy initialisation outside the capture
      bucket.forward = bucket.graph->capture_step(nullptr);
      logits_bytes = std::max(logits_bytes, bucket.graph->tensor(bucket.model.output).size_bytes());
    }
    logits_host_ = kernels_->allocate_host(logits_bytes);
    kernels_->synchronize();
    device_bytes_ = kernels_->allocator().bytes_in_use();
    prepare_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }

  void run(std::span<const scenarios::QuerySample> batch) override {
    const auto it = std::lower_bound(sizes_.begin(), sizes_.end(), batch.size());
    if (it == sizes_.end()) throw Error("a batch of " + std::to_string(batch.size()) + " is above max_batch");
    Bucket& bucket = *buckets_[static_cast<std::size_t>(it - sizes_.begin())];
    const std::vector<nn::Value> inputs = model_inputs(bucket.model);
    for (std::size_t i = 0; i < inputs.size(); ++i)
      copy_samples(batch, bucket.graph->tensor(inputs[i]), pool_[i], bucket.batch);
    bucket.forward->replay();
    const Tensor logits = bucket.graph->tensor(bucket.model.output);
    const std::int64_t logit_row_bytes = logits.size_bytes() / static_cast<std::int64_t>(bucket.batch);
    kernels_->download_bytes(logits, 0, logits_host_.data(), logit_row_bytes * static_cast<std::int64_t>(batch.size()));
    kernels_->synchronize();  // the batch's logits are on the host when this returns
    padded_samples_ += bucket.batch;
  }

  nlohmann::json summary() const {
    nlohmann::json size = {{"image_size", spec_.image_px}, {"layout", std::string(to_string(spec_.layout))}};
    if (is_language_model(spec_.model)) size = {{"seq", spec_for(spec_, 1).seq}};
    nlohmann::json s = {{"model", spec_.model},
                        {"precision", std::string(to_string(spec_.precision))},
                        {"buckets", sizes_},
                        {"padded_samples", padded_samples_},
                        {"device_bytes", device_bytes_},
                        {"inputs", pool_.size()},
                        {"inputs_file", spec_.inputs_file},
                        {"pinned_host_bytes", pinned_host_bytes()},
                        {"prepare_s", prepare_s_}};
    s.update(size);
    return s;
  }

 private:
  // The batch's samples of one input from the pool into its rows of `input` (a bucket's); every
  // copy is queued without a wait, and samples at consecutive pool places go in one copy.
  void copy_samples(std::span<const scenarios::QuerySample> batch, const Tensor& input, const PoolInput& pool,
                    std::size_t bucket_batch) {
    const std::uint64_t pool_samples = buckets_.back()->batch;
    const auto* samples = pool.samples.as<const unsigned char>();
    const auto rows = [&pool](std::size_t n) { return static_cast<std::int64_t>(n) * pool.sample_bytes; };
    for (std::size_t i = 0; i < batch.size();) {
      const std::uint64_t first = batch[i].index % pool_samples;
      std::size_t n = 1;
      while (i + n < batch.size() && batch[i + n].index % pool_samples == first + n) ++n;
      kernels_->upload_bytes(input, rows(i), samples + rows(static_cast<std::size_t>(first)), rows(n));
      i += n;
    }
    if (batch.size() < bucket_batch) {
      // Padding rows hold zeros (token 0 of a language model, a mask of zeros), not what the arena
      // last held there: each row's result depends on its own row only (inference batch norm,
      // attention within a sequence), but a padded row then computes the same thing every time.
      Tensor pad = input;
      pad.shape[0] = static_cast<std::int64_t>(bucket_batch - batch.size());
      pad.strides = contiguous_strides(pad.shape, pad.layout);
      pad.data = input.as<unsigned char>() + rows(batch.size());
      kernels_->fill(pad, 0.0);
    }
  }

  std::int64_t pinned_host_bytes() const {
    std::int64_t bytes = logits_host_.bytes();
    for (const PoolInput& in : pool_) bytes += in.samples.bytes();
    return bytes;
  }

  backend::Backend& be_;
  ModelSutSpec spec_;
  std::vector<std::size_t> sizes_;
  std::unique_ptr<nn::Kernels> kernels_;  // before the buckets: their memory comes from it
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<PoolInput> pool_;  // per input of the model, in model_inputs' order
  nn::HostBuffer logits_host_;   // page-locked on a GPU, as the pool
  std::uint64_t padded_samples_ = 0;
  std::int64_t device_bytes_ = 0;  // the kernels' allocations after prepare: graphs' weights, arenas, workspaces
  double prepare_s_ = 0;           // building, binding (the CUDA algorithm search) and capturing every bucket
};

}  // namespace

std::unique_ptr<scenarios::BatchExecutor> make_model_executor(backend::Backend& backend, const ModelSutSpec& spec,
                                                              std::size_t max_batch) {
  if (max_batch < 1) throw UsageError("max_batch must be at least 1");
  check_model_sut(spec, max_batch);
  return std::make_unique<ModelBatchExecutor>(backend, spec, max_batch);
}

void check_model_sut(const ModelSutSpec& spec, std::size_t max_batch) {
  if (is_compression_model(spec.model))
    throw UsageError("the model SUT runs classifiers and language models, not the autoencoder '" + spec.model + "'");
  if (is_onnx_model(spec.model)) {
    onnx_input_count(spec.model);  // loads and validates the file (UsageError with the reason)
    return;
  }
  if (!is_language_model(spec.model)) {
    model_config(spec.model);  // UsageError for an unknown name
    if (spec.image_px < 1) throw UsageError("image_size must be at least 1");
    return;
  }
  const LanguageConfig c = language_config(spec.model);
  const ModelSpec m = spec_for(spec, max_batch);
  if (spec.seq < 0) throw UsageError("seq must be at least 0 (0: the model's " + std::to_string(c.positions) + ")");
  ab::models::check_language_model(c.name, c.heads, c.channels, c.vocab, c.positions, m.batch, m.seq);
}

nlohmann::json model_executor_summary(const scenarios::BatchExecutor& executor) {
  const auto* m = dynamic_cast<const ModelBatchExecutor*>(&executor);
  return m != nullptr ? m->summary() : nlohmann::json();
}

double forward_flops_per_sample(const ModelSutSpec& spec) {
  const ModelSpec one = spec_for(spec, 1);
  nn::GraphBuilder builder(graph_options(one));
  build_zoo_model(builder, one);
  return static_cast<double>(nn::Graph(std::move(builder)).forward_flops());
}

std::int64_t tokens_per_sample(const ModelSutSpec& spec) {
  return is_language_model(spec.model) ? spec_for(spec, 1).seq : 0;
}

}  // namespace ab::workloads::zoo
