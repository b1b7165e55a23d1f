// The workloads that run the engine's models: `train` (one training step per iteration) and
// `infer` (one forward per iteration), the model zoo they share, and the model executor the
// loadgen workload puts behind its dynamic batcher. docs/METHODOLOGY.md, "Training and inference".
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "models/bert.h"
#include "models/compression.h"
#include "models/gpt.h"
#include "models/resnet.h"
#include "nn/graph.h"
#include "scenarios/suts.h"
#include "workloads/workload.h"

namespace ab::workloads::zoo {

std::unique_ptr<Workload> make_train();
std::unique_ptr<Workload> make_infer();

// --- The model zoo ------------------------------------------------------------------------------

// resnet50, resnet101, resnext..., tiny_resnet, fashion_resnet (classifiers; models/resnet.h); compression_ae,
// tiny_compression_ae (the image-compression autoencoder, models/compression.h); gpt2_124m ... gpt2_1558m, tiny_gpt2
// (language models, models/gpt.h); bert_base, bert_large, tiny_bert (models/bert.h).
const std::vector<std::string>& model_names();
// Whether the name is one of the language models (tokens in, no images; the seq axis applies).
bool is_language_model(const std::string& name);
// A language model of the zoo: GPT-2 (causal, next-token labels) or BERT (masked-LM labels).
struct LanguageConfig {
  std::string name;
  bool masked = false;  // BERT: the masked copy task, mask token 103 ([MASK]) or the last id
  std::int64_t heads = 0, channels = 0, vocab = 0, positions = 0;
  ab::models::GptConfig gpt;    // where !masked
  ab::models::BertConfig bert;  // where masked
  std::int64_t mask_token() const { return vocab > 103 ? 103 : vocab - 1; }
};
// The named language model; UsageError for another name.
LanguageConfig language_config(const std::string& name);
// The named classifier; throws UsageError listing the valid names (and for an autoencoder's name).
// tiny_resnet takes 3 channels and 10 classes.
ab::models::ResNetConfig model_config(const std::string& name);
// Whether the model axis names an ONNX file (a value ending in .onnx): a user's model, imported
// (src/onnx) for inference; the zoo's functions below take it where they take a classifier.
bool is_onnx_model(const std::string& name);
// Whether the name is one of the compression autoencoders (no labels; the workloads report PSNR).
bool is_compression_model(const std::string& name);
// The named autoencoder (compression_ae: N = 128, M = 192); UsageError for another name.
ab::models::CompressionConfig compression_config(const std::string& name);
const std::vector<std::string>& model_precisions();  // fp32, tf32, bf16, fp16: training and inference
const std::vector<std::string>& infer_precisions();  // those and fp8 (e4m3 convolutions, inference only)
// Refuses precisions the engine has no policy for, and fp8 for training (UsageError listing the
// valid ones).
Precision parse_model_precision(const std::string& name, bool training = true);

// The axes train and infer share, in their order: model, batch, precision, image_size, seq, layout.
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
  std::vector<double> images, labels, tokens;
};
SyntheticBatch synthetic_batch(std::uint64_t seed, std::uint64_t first, std::int64_t batch, std::int64_t channels,
                               std::int64_t image_px, std::int64_t classes);
constexpr std::uint64_t kDataSeed = 0x1ab5eed;

// What a point builds: the network, its input size and the graph options.
struct ModelSpec {
  std::string model;
  std::int64_t batch = 1;  // images, or sequences of a language model
  std::int64_t image_px = 224;
  std::int64_t seq = 1024;  // tokens per sequence (language models; the axis's 0 becomes the positions)
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
  // Language models: hidden dropout probability (GptConfig::dropout, BertConfig::dropout).
  double dropout = 0.0;
  // An ONNX model's inputs (infer's option `inputs`): FILE for the first input, or
  // NAME:FILE,NAME:FILE per input; raw little-endian samples in the input's row-major order, float32
  // for a float input and int64 for an integer one. Inputs it names no file for are synthetic
  // (onnx_input_values); empty: all synthetic.
  std::string inputs_file;
};
nn::GraphOptions graph_options(const ModelSpec& s);

// A zoo model built into a graph as train and infer run it: a classifier (images, labels, logits;
// its softmax cross-entropy loss on a training graph), the compression autoencoder (images,
// reconstruction, its rate-distortion loss and mse in either graph; no labels) or a language model
// (tokens; on a training graph labels and the loss, on an inference graph its inference head's
// logits: BERT's question answering [B*T, 2], GPT-2's prefill [B, V]). Values a model lacks are
// undefined (id -1).
struct ZooModel {
  bool compression = false;
  bool language = false;  // tokens in; labels are the next tokens, or BERT's masked ones
  bool masked = false;
  std::int64_t mask_token = 0;
  std::int64_t in_channels = 3, classes = 0;    // classes: 0 for the autoencoder; the vocabulary of a language model
  std::string head;                             // a language model's inference head: "qa" or "prefill"
  nn::Value images, labels, output, loss, mse;  // output: the logits or the reconstruction
  nn::Value tokens;
  // An ONNX model: its first input's dims at this batch, every input (the first is `images`), its
  // weights by the graph's names (for set_model_parameters), and the record's `onnx` block.
  std::vector<std::int64_t> input_dims;
  struct OnnxInput {
    std::string name;
    nn::Value value;
    std::vector<std::int64_t> dims;  // at this batch
    bool integer = false;            // int64/int32 in the file
    bool indices = false;            // token ids: read only as Gather indices
    std::int64_t index_rows = 0;     // the fewest rows of the tables they index
  };
  std::vector<OnnxInput> onnx_inputs;
  std::shared_ptr<const nn::ParameterValues> parameters;
  nlohmann::json onnx;
};
// What a batch is written into: the tokens of a language model, else the images.
nn::Value model_input(const ZooModel& m);
// Builds the model of `s` into b (whose options come from graph_options(s)). UsageError for
// fold_batchnorm on a training graph or the autoencoder (which has no batch norm), and for fp8
// other than on a classifier with fold_batchnorm and fuse_conv_epilogue (the only fp8 layers).
ZooModel build_zoo_model(nn::GraphBuilder& b, const ModelSpec& s);
// After bind: the weights an ONNX model's graph holds (m.parameters), or a folded classifier's
// (folded_parameter_values); nothing for a graph whose initial values are its weights.
void set_model_parameters(nn::Graph& g, const ZooModel& m, const ModelSpec& s);
// An ONNX model built into b (build_zoo_model's ONNX case): UsageError for a training graph, fp8,
// a build without ONNX support, and every refusal of the importer (src/onnx/onnx.h).
ZooModel build_onnx_model(nn::GraphBuilder& b, const ModelSpec& s);
// The ONNX model's first input's dims at batch 1, and its count of inputs (both load and validate
// the file; UsageError as above).
std::vector<std::int64_t> onnx_input_dims(const std::string& path);
std::size_t onnx_input_count(const std::string& path);
// How many Conv nodes the file holds (layout=auto: a network of more than one is convolutional).
std::int64_t onnx_conv_count(const std::string& path);
// Every input's values for samples first.. (in m.onnx_inputs' order): the inputs file's where
// s.inputs_file names one for it; else synthetic: a float [N, C, S, S] input the built-in models'
// images, another float input uniform noise in [-1, 1); token ids uniform in [0, index_rows), but 0
// for an input named like token_type_ids (one segment); another integer input (an attention mask)
// ones. Each value depends only on (seed, sample, element).
std::vector<std::vector<double>> onnx_input_values(const ZooModel& m, std::uint64_t first, const ModelSpec& s);
// How many whole samples s.inputs_file holds for every input of m (the fewest over the inputs it
// names); 0 where it names none.
std::int64_t onnx_input_file_samples(const ZooModel& m, const ModelSpec& s);
// What infer's and loadgen's `inputs` option takes (the option's help text, one for both).
extern const char* const kOnnxInputsHelp;
// `accelbench inspect FILE.onnx`: the report of onnx::inspect (importable: whether nothing is
// unsupported), or UsageError without ONNX support and for a file that does not parse.
std::string inspect_onnx(const std::string& path, bool* importable);
// The values a folded classifier's graph (s.fold_batchnorm) must hold to compute what the unfolded
// one computes from its initial parameters (same seed): those, folded on the host
// (models::fold_batchnorm_parameters). For Graph::set_parameter_values after bind.
nn::ParameterValues folded_parameter_values(const ModelSpec& s);
// The model's batch of synthetic data from sample `first` on: synthetic_batch's images for a
// classifier; for the autoencoder the same images scaled from [-1.5, 1.5] into [-0.5, 0.5] (a
// range of 1, which its PSNR assumes; models/compression.h says why centred) and no labels; for a
// language model the copy task's tokens and next-token labels (models::copy_task_batch), or for
// BERT its masked form (models::masked_copy_batch).
SyntheticBatch model_batch(const ZooModel& m, std::uint64_t first, const ModelSpec& s);
// Uploads model_batch(m, first, s) into the graph's inputs.
void upload_batch(nn::Graph& g, const ZooModel& m, std::uint64_t first, const ModelSpec& s);
// The point's reconstruction quality, for records: {"mse": m, "psnr_db": 10 log10(1 / m)} (range 1).
nlohmann::json reconstruction_quality(double mse);
// The point's values of the axes model_axes() declares.
ModelSpec model_spec(const State& state, bool training);
// The layout axis's value for `model` on a GPU or not: an explicit one as it is; auto (the
// default) NHWC on a GPU but for an ONNX file of at most one Conv, NCHW otherwise.
Layout layout_of(const std::string& axis, const std::string& model, bool gpu);
// Records metrics.layout, what layout=auto chose for the point (nothing for an explicit layout).
void add_layout_metric(State& state, const ModelSpec& s);
// Records metrics.fusion = {fused_shapes, unfused_shapes} (Kernels::fusion_counts) where the spec
// asks for a fused graph (fold=fused, fuse=on): whether it really fused on this device.
void add_fusion_metric(State& state, const ModelSpec& s, const nn::Kernels& k);

// The inference graph's logits for sample 0 of the synthetic data (model_batch) in float64 on the
// reference kernels (unfolded, the same parameter seed), cached per (model, image size or
// sequence length, layout): the oracle the device's logits are checked against. A classifier's
// [classes], BERT's question-answering [seq, 2], GPT-2's prefill [vocab]. Error for an autoencoder.
std::vector<double> reference_logits(const ModelSpec& s);
// Relative error tolerated between device and float64 logits at each precision (docs/METHODOLOGY.md).
double logits_tolerance(Precision p);
// What the point's precision costs, for records: {"logits_rel_error_vs_f64": rel_error(got, want),
// "top1_agrees_f64": argmax(got) == argmax(want)} (sample 0's logits against reference_logits).
// With `interleaved` = k the logits are k sets laid out one element of each in turn (BERT's
// (start, end) pairs: 2), and top-1 agrees where it does in every set (the same answer span).
nlohmann::json logits_accuracy(const std::vector<double>& got, const std::vector<double>& want,
                               std::int64_t interleaved = 1);
// Records metrics.fp8 = {layers, fallback_layers, fallback_slower_layers, fallback_reasons,
// layer_choice} of a bound fp8 graph: how many convolutions built to run e4m3
// (nn::ConvBiasActivation::fp8) do, how many the backend left in 16 bits because fp8 timed no
// faster, the distinct other reasons, and the infer axis fp8_layers. Nothing for another precision.
void add_fp8_metric(State& state, const ModelSpec& s, const nn::Graph& g, const std::string& fp8_layers);

// DRAM bytes measured by a counter pass, by range name: "<op>:forward", "<op>:backward", "update".
using OpCounterBytes = std::map<std::string, double>;
std::string op_range_name(const std::string& op, bool backward);

// Per-op table of a profiled step: <dir>/ops.json and <dir>/ops.csv (time, FLOPs, bytes, rates and
// arithmetic intensity per op; with `measured`, each pass's measured DRAM bytes and their ratio to
// the modelled bytes); returns the per-kind summary for the record's metrics.
nlohmann::json write_op_profile(const std::vector<nn::OpReport>& ops, const std::filesystem::path& dir,
                                const OpCounterBytes* measured = nullptr);

// The counter pass of a model where the run asks for counters (State::measure_counters): `ops`
// (an eager forward, or forward + backward of each micro-batch) with each op's forward and backward
// a range, then `update` (the optimizer's step; may be empty) as the range "update". Records
// metrics.counters, writes the per-op table with the measured bytes to the point's artifacts, and
// returns those bytes (empty where counters are off or unavailable).
OpCounterBytes measure_op_counters(State& state, nn::Graph& graph, const std::function<void()>& ops,
                                   const std::function<void()>& update);

// --- The loadgen system under test -------------------------------------------------------------

// One inference graph per batch bucket (powers of two up to max_batch), each captured once; a
// batch copies its samples' images (a language model's tokens; every input of an ONNX model, each
// synthetic as onnx_input_values makes it) from a host pool into the bucket's inputs, replays the
// forward and copies the logits back. Graphs are built and bound in prepare(),
// on the batcher's thread.
struct ModelSutSpec {
  std::string model;
  Precision precision = Precision::fp16;
  std::int64_t image_px = 224;
  Layout layout = Layout::nhwc;
  std::int64_t seq = 0;  // tokens per sample of a language model (0: its positions)
  // ONNX models: the samples of the pool from these files (infer's `inputs` option), not synthetic.
  std::string inputs_file;
};
std::unique_ptr<scenarios::BatchExecutor> make_model_executor(backend::Backend& backend, const ModelSutSpec& spec,
                                                              std::size_t max_batch);
// UsageError, before anything is built, for what the SUT cannot run: an autoencoder, an unknown
// name, an image size below 1, a language model's sequence beyond its positions (or below 0).
void check_model_sut(const ModelSutSpec& spec, std::size_t max_batch);
// The executor's model, buckets and padded sample count; null for another executor.
nlohmann::json model_executor_summary(const scenarios::BatchExecutor& executor);
// Forward FLOPs per sample of the SUT's model, and a language model's tokens per sample (0 for an
// image model), for the loadgen record's counts.
double forward_flops_per_sample(const ModelSutSpec& spec);
std::int64_t tokens_per_sample(const ModelSutSpec& spec);

}  // namespace ab::workloads::zoo
