// The workloads that run the engine's models: `train` (one training step per iteration) and
// `infer` (one forward per iteration), the model zoo they share, and the model executor the
// loadgen workload puts behind its dynamic batcher. docs/METHODOLOGY.md, "Training and inference".
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/collectives.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "dist/comm.h"
#include "models/compression.h"
#include "models/resnet.h"
#include "nn/data_parallel.h"
#include "nn/graph.h"
#include "scenarios/suts.h"
#include "workloads/workload.h"

namespace ab::workloads::zoo {

std::unique_ptr<Workload> make_train();
std::unique_ptr<Workload> make_infer();

// --- The model zoo ------------------------------------------------------------------------------

// resnet50, resnet101, resnext..., tiny_resnet (classifiers); compression_ae, tiny_compression_ae
// (the image-compression autoencoder, models/compression.h).
const std::vector<std::string>& model_names();
// The named classifier; throws UsageError listing the valid names (and for an autoencoder's name).
// tiny_resnet takes 3 channels and 10 classes.
ab::models::ResNetConfig model_config(const std::string& name);
// Whether the name is one of the compression autoencoders (no labels; the workloads report PSNR).
bool is_compression_model(const std::string& name);
// The named autoencoder (compression_ae: N = 128, M = 192); UsageError for another name.
ab::models::CompressionConfig compression_config(const std::string& name);
const std::vector<std::string>& model_precisions();  // fp32, tf32, bf16, fp16: training and inference
const std::vector<std::string>& infer_precisions();  // those and fp8 (e4m3 convolutions, inference only)
// Refuses precisions the engine has no policy for, and fp8 for training (UsageError listing the
// valid ones).
Precision parse_model_precision(const std::string& name, bool training = true);

// The axes train and infer share, in their order: model, batch, precision, image_size, layout.
// Defaults are per device kind (cuda: the full-size network; otherwise tiny_resnet, fp32, 16 px);
// what the two workloads differ in comes from the caller.
struct ModelAxesText {
  std::vector<std::string> cuda_batches, host_batches;  // batch defaults on cuda / elsewhere
  std::string batch_help;
  std::string cuda_precision;  // precision default on cuda (fp32 elsewhere)
  std::string precision_help;
  std::vector<std::string> precisions;  // the precision axis's choices (model_precisions() where empty)
};
std::vector<AxisSpec> model_axes(const std::string& device_kind, const ModelAxesText& text);

// Images of `batch` samples from index `first` on: each sample's label and pixels depend only on
// (seed, its index), so a sample is the same whatever batch holds it. Pixels are a label-dependent
// separable cosine pattern plus uniform noise (learnable, not constant); logical NCHW order.
struct SyntheticBatch {
  std::vector<double> images, labels;
};
SyntheticBatch synthetic_batch(std::uint64_t seed, std::uint64_t first, std::int64_t batch, std::int64_t channels,
                               std::int64_t image_px, std::int64_t classes);
constexpr std::uint64_t kDataSeed = 0x1ab5eed;

// What a point builds: the network, its input size and the graph options.
struct ModelSpec {
  std::string model;
  std::int64_t batch = 1;
  std::int64_t image_px = 224;
  Precision precision = Precision::fp32;
  Layout layout = Layout::nchw;
  bool training = true;
  // Inference of a classifier only: batch norms folded into the convolutions
  // (ResNetConfig::fold_batchnorm); the graph then takes folded_parameter_values(spec) after bind.
  bool fold_batchnorm = false;
  // With fold_batchnorm: the epilogue inside each convolution (ResNetConfig::fuse_conv_epilogue).
  bool fuse_conv_epilogue = false;
  // Unfolded ResNets: batch norm (+ residual) + ReLU as one op (ResNetConfig::fuse_batchnorm_relu).
  bool fuse_batchnorm_relu = false;
};
nn::GraphOptions graph_options(const ModelSpec& s);

// A zoo model built into a graph as train and infer run it: a classifier (images, labels, logits;
// its softmax cross-entropy loss on a training graph) or the compression autoencoder (images,
// reconstruction, its rate-distortion loss and mse in either graph; no labels). Values a model
// lacks are undefined (id -1).
struct ZooModel {
  bool compression = false;
  std::int64_t in_channels = 3, classes = 0;  // classes: 0 for the autoencoder
  nn::Value images, labels, output, loss, mse;  // output: the logits or the reconstruction
};
// Builds the model of `s` into b (whose options come from graph_options(s)). UsageError for
// fold_batchnorm on a training graph or the autoencoder (which has no batch norm), and for fp8
// other than on a classifier with fold_batchnorm and fuse_conv_epilogue (the only fp8 layers).
ZooModel build_zoo_model(nn::GraphBuilder& b, const ModelSpec& s);
// The values a folded classifier's graph (s.fold_batchnorm) must hold to compute what the unfolded
// one computes from its initial parameters (same seed): those, folded on the host
// (models::fold_batchnorm_parameters). For Graph::set_parameter_values after bind.
nn::ParameterValues folded_parameter_values(const ModelSpec& s);
// The model's batch of synthetic data from sample `first` on: synthetic_batch's images for a
// classifier; for the autoencoder the same images scaled from [-1.5, 1.5] into [-0.5, 0.5] (a
// range of 1, which its PSNR assumes; models/compression.h says why centred) and no labels.
SyntheticBatch model_batch(const ZooModel& m, std::uint64_t first, std::int64_t batch, std::int64_t image_px);
// The point's reconstruction quality, for records: {"mse": m, "psnr_db": 10 log10(1 / m)} (range 1).
nlohmann::json reconstruction_quality(double mse);
// The point's values of the axes model_axes() declares.
ModelSpec model_spec(const State& state, bool training);
// Records metrics.fusion = {fused_shapes, unfused_shapes} (Kernels::fusion_counts) where the spec
// asks for a fused graph (fold=fused, fuse=on): whether it really fused on this device.
void add_fusion_metric(State& state, const ModelSpec& s, const nn::Kernels& k);

// The network's logits for image 0 of the synthetic data in float64 on the reference kernels
// (inference mode, the same parameter seed), cached per (model, size, layout): the oracle the
// device's logits are checked against.
std::vector<double> reference_logits(const ModelSpec& s);
// Relative error tolerated between device and float64 logits at each precision (docs/METHODOLOGY.md).
double logits_tolerance(Precision p);
// What the point's precision costs, for records: {"logits_rel_error_vs_f64": rel_error(got, want),
// "top1_agrees_f64": argmax(got) == argmax(want)} (image 0's logits against reference_logits).
nlohmann::json logits_accuracy(const std::vector<double>& got, const std::vector<double>& want);
// Records metrics.fp8 = {layers, fallback_layers, fallback_slower_layers, fallback_reasons,
// layer_choice} of a bound fp8 graph: how many convolutions built to run e4m3
// (nn::ConvBiasActivation::fp8) do, how many the backend left in 16 bits because fp8 timed no
// faster, the distinct other reasons, and the infer axis fp8_layers. Nothing for another precision.
void add_fp8_metric(State& state, const ModelSpec& s, const nn::Graph& g, const std::string& fp8_layers);

// Per-op table of a profiled step: <dir>/ops.json and <dir>/ops.csv (time, FLOPs, bytes, rates and
// arithmetic intensity per op); returns the per-kind summary for the record's metrics.
nlohmann::json write_op_profile(const std::vector<nn::OpReport>& ops, const std::filesystem::path& dir);

// --- Data parallelism ---------------------------------------------------------------------------

// The gradient averaging of a data-parallel `train` point over ranks 0..gpus-1 of the launch:
// NCCL (ncclAvg on a side stream, overlapped with backward) on CUDA; on host backends the
// launch's own exchange (dist::Comm, for tests on the CPU: gpus must then be the launch's size).
// Every rank of the launch constructs it (the NCCL id goes to all); only ranks below `gpus`
// attach it to their graph.
class DataParallel {
 public:
  DataParallel(backend::Backend& backend, dist::Comm& comm, int gpus, std::int64_t bucket_bytes,
               const backend::CommOptions& comm_options = {}, bool high_priority = false);
  ~DataParallel();
  // The bucket reduced last holds only the first parameters, at least this many bytes (0: none;
  // nn::BucketedGradientSync). Before attach.
  void set_tail_bucket_bytes(std::int64_t bytes) { tail_bucket_bytes_ = bytes; }
  // A complete bucket's all-reduce waits for this many more ops' backward (nn::BucketedGradientSync).
  void set_bucket_delay_ops(int ops) { bucket_delay_ops_ = ops; }
  // Communicate the gradients in `wire` (bf16 or f16; nullopt, the default: in their own dtype,
  // untouched), as PyTorch DDP's bf16/fp16 compress hooks do: each bucket is rounded to it, averaged
  // in it and widened back (NCCL: on the side stream, through a staging buffer allocated at
  // attach; host: the same roundings, with the sum in float64). attach refuses (UsageError) a
  // wire type for gradients that are not f32. Before attach.
  void set_comm_dtype(std::optional<DType> wire) { comm_dtype_ = wire; }
  // How the CUDA ranks average (backend::AveragerEngine). copy_engines needs 2 ranks on one host
  // and gradients communicated in their own dtype: attach throws Unsupported otherwise. nullopt
  // (the default) takes copy engines where those hold (on two hosts it falls back to NCCL and
  // averaging_fallback() says why), NCCL elsewhere. Host averaging ignores it. Before attach.
  void set_averager_engine(std::optional<backend::AveragerEngine> engine) { engine_ = engine; }
  // Where the two ranks' gradients are averaged with copy engines: in the optimizer's update
  // (each parameter's grad_partner: the peer's gradient; one pass less over the gradients, and no
  // mean kernel beside backward) or by a kernel per bucket. nullopt (the default): in the update
  // when `update_can` (the optimizer averages in its update: SGD; not with fp16 loss scaling, whose
  // check reads the averaged gradients), else by the kernel. true with another averaging than copy
  // engines: attach throws UsageError. Before attach.
  void set_mean_in_update(std::optional<bool> in_update, bool update_can) {
    mean_in_update_ = in_update;
    update_can_mean_ = update_can;
  }
  // Buckets the bound graph's gradients and installs the sync (Graph::set_gradient_sync).
  void attach(nn::Graph& graph, nn::Kernels& kernels);
  std::size_t bucket_count() const;
  // "nccl", "copy engines" or "host": what attach chose; "copy engines, mean in the update" for that.
  std::string describe() const;
  const std::string& averaging_fallback() const { return fallback_; }  // why not copy engines; "" if none
  // After attach: the dtype the gradients travel in, and the bytes one step's all-reduces take
  // from each rank (the buckets' elements, alignment padding included, in that dtype).
  DType wire_dtype() const { return wire_; }
  std::int64_t allreduce_bytes_per_step() const { return allreduce_bytes_; }

 private:
  dist::Comm& comm_;
  int gpus_;
  std::int64_t bucket_bytes_, tail_bucket_bytes_ = 0;
  int bucket_delay_ops_ = 0;
  std::optional<DType> comm_dtype_;  // nullopt: the gradients' own
  DType wire_ = DType::f32;
  std::int64_t allreduce_bytes_ = 0;
  bool high_priority_;  // the all-reduces' stream at the device's top priority
  std::optional<backend::AveragerEngine> engine_;  // nullopt: chosen at attach
  backend::AveragerEngine used_ = backend::AveragerEngine::nccl;
  std::string fallback_;
  std::optional<bool> mean_in_update_;
  bool update_can_mean_ = false, mean_in_update_used_ = false;
  std::unique_ptr<backend::CollectiveGroup> group_;  // CUDA; null on idle ranks and host backends
  std::unique_ptr<nn::GradientAverager> averager_;
  std::unique_ptr<nn::BucketedGradientSync> sync_;
};
std::unique_ptr<DataParallel> make_data_parallel(backend::Backend& backend, dist::Comm& comm, int gpus,
                                                 std::int64_t bucket_bytes, const backend::CommOptions& comm_options = {},
                                                 bool high_priority = false);

// --- The loadgen system under test -------------------------------------------------------------

// One inference graph per batch bucket (powers of two up to max_batch), each captured once; a
// batch copies its samples' images from a host pool into the bucket's input, replays the forward
// and copies the logits back. Graphs are built and bound in prepare(), on the batcher's thread.
struct ModelSutSpec {
  std::string model;
  Precision precision = Precision::fp16;
  std::int64_t image_px = 224;
  Layout layout = Layout::nhwc;
};
std::unique_ptr<scenarios::BatchExecutor> make_model_executor(backend::Backend& backend, const ModelSutSpec& spec,
                                                              std::size_t max_batch);
// The executor's model, buckets and padded sample count; null for another executor.
nlohmann::json model_executor_summary(const scenarios::BatchExecutor& executor);
// Forward FLOPs per sample of the SUT's model (for the loadgen record's counts).
double forward_flops_per_sample(const ModelSutSpec& spec);

}  // namespace ab::workloads::zoo
