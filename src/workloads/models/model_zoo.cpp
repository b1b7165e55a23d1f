// The model zoo, synthetic data, and the float64 reference logits the model workloads check against.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <numbers>

#include "core/checked.h"
#include "core/error.h"
#include "core/rng.h"
#include "backend/ref/ref.h"
#include "nn/kernels.h"
#include "nn/ops.h"
#include "workloads/models/models.h"

namespace ab::workloads::zoo {
namespace {

struct Entry {
  const char* name;
  ab::models::ResNetConfig (*make)();
};

ab::models::ResNetConfig tiny() { return ab::models::tiny_resnet(3, 10); }

const std::vector<Entry>& entries() {
  static const std::vector<Entry> all{{"resnet50", ab::models::resnet50},
                                      {"resnet101", ab::models::resnet101},
                                      {"resnext50_32x4d", ab::models::resnext50_32x4d},
                                      {"resnext101_32x4d", ab::models::resnext101_32x4d},
                                      {"resnext101_32x8d", ab::models::resnext101_32x8d},
                                      {"tiny_resnet", tiny},
                                      {"fashion_resnet", ab::models::fashion_resnet}};
  return all;
}

struct CompressionEntry {
  const char* name;
  ab::models::CompressionConfig (*make)();
};

const std::vector<CompressionEntry>& compression_entries() {
  static const std::vector<CompressionEntry> all{{"compression_ae", ab::models::compression_ae},
                                                 {"tiny_compression_ae", ab::models::tiny_compression_ae}};
  return all;
}

LanguageConfig gpt_entry(const ab::models::GptConfig& c) {
  LanguageConfig l;
  l.name = c.name, l.heads = c.heads, l.channels = c.channels, l.vocab = c.vocab, l.positions = c.positions;
  l.gpt = c;
  return l;
}

LanguageConfig bert_entry(const ab::models::BertConfig& c) {
  LanguageConfig l;
  l.name = c.name, l.heads = c.heads, l.channels = c.channels, l.vocab = c.vocab, l.positions = c.positions;
  l.masked = true;
  l.bert = c;
  return l;
}

const std::vector<LanguageConfig>& language_entries() {
  static const std::vector<LanguageConfig> all{
      gpt_entry(ab::models::gpt2_124m()),   gpt_entry(ab::models::gpt2_350m()), gpt_entry(ab::models::gpt2_774m()),
      gpt_entry(ab::models::gpt2_1558m()),  gpt_entry(ab::models::tiny_gpt2()), bert_entry(ab::models::bert_base()),
      bert_entry(ab::models::bert_large()), bert_entry(ab::models::tiny_bert())};
  return all;
}

}  // namespace

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& e : entries()) v.emplace_back(e.name);
    for (const auto& e : compression_entries()) v.emplace_back(e.name);
    for (const auto& e : language_entries()) v.emplace_back(e.name);
    return v;
  }();
  return names;
}

bool is_language_model(const std::string& name) {
  for (const auto& e : language_entries())
    if (name == e.name) return true;
  return false;
}

LanguageConfig language_config(const std::string& name) {
  for (const auto& e : language_entries())
    if (name == e.name) return e;
  throw UsageError("model '" + name + "' is not a language model");
}

ab::models::ResNetConfig model_config(const std::string& name) {
  std::string valid;
  for (const auto& e : entries()) {
    if (name == e.name) return e.make();
    valid += (valid.empty() ? "" : ", ") + std::string(e.name);
  }
  if (is_compression_model(name) || is_language_model(name))
    throw UsageError("model '" + name + "' is not an image classifier; classifiers: " + valid);
  throw UsageError("unknown model '" + name + "'; valid: " + valid);
}

bool is_compression_model(const std::string& name) {
  for (const auto& e : compression_entries())
    if (name == e.name) return true;
  return false;
}

ab::models::CompressionConfig compression_config(const std::string& name) {
  for (const auto& e : compression_entries())
    if (name == e.name) return e.make();
  throw UsageError("model '" + name + "' is not a compression autoencoder");
}

namespace {

ZooModel build_language_model(nn::GraphBuilder& b, const ModelSpec& s) {
  if (s.fold_batchnorm || s.fuse_batchnorm_relu || s.fuse_conv_epilogue || s.precision == Precision::fp8)
    throw UsageError("model '" + s.model + "' has no batch norm to fold or fuse and no fp8 layers");
  LanguageConfig c = language_config(s.model);
  c.gpt.dropout = c.bert.dropout = s.dropout;
  // Training graphs take the loss heads; inference graphs the heads that MLPerf Inference and a
  // generation's prefill time (models/bert.h, models/gpt.h).
  const ab::models::LanguageModel lm =
      c.masked ? ab::models::build_bert(b, c.bert, s.batch, s.seq,
                                        s.training ? ab::models::BertHead::masked_lm : ab::models::BertHead::qa)
               : ab::models::build_gpt(b, c.gpt, s.batch, s.seq,
                                       s.training ? ab::models::GptHead::loss : ab::models::GptHead::prefill);
  ZooModel m;
  m.language = true;
  m.masked = c.masked;
  m.mask_token = c.mask_token();
  m.classes = c.vocab;
  m.head = s.training ? "" : c.masked ? "qa" : "prefill";
  m.tokens = lm.tokens;
  m.labels = lm.labels;
  m.loss = lm.loss;
  m.output = lm.logits;
  return m;
}

}  // namespace

ZooModel build_zoo_model(nn::GraphBuilder& b, const ModelSpec& s) {
  if (is_onnx_model(s.model)) return build_onnx_model(b, s);
  if (is_language_model(s.model)) return build_language_model(b, s);
  if (s.dropout != 0.0) throw UsageError("dropout applies to the language models, not '" + s.model + "'");
  ZooModel m;
  if (s.fold_batchnorm && (s.training || is_compression_model(s.model)))
    throw UsageError("folding batch norms applies to inference of the ResNet classifiers, not " +
                     std::string(s.training ? "training" : "'" + s.model + "' (no batch norm)"));
  if (s.fuse_batchnorm_relu && is_compression_model(s.model))
    throw UsageError("fusing batch norm and ReLU applies to the ResNet classifiers, not '" + s.model +
                     "' (no batch norm)");
  // The e4m3 convolutions are the ResNets' folded ones (models::resnet refuses an unfused fp8 graph).
  if (s.precision == Precision::fp8 && is_compression_model(s.model))
    throw UsageError("precision fp8 runs the folded convolutions of the ResNet classifiers with their epilogue "
                     "inside, not '" + s.model + "' (no batch norm to fold)");
  if (is_compression_model(s.model)) {
    const ab::models::CompressionConfig c = compression_config(s.model);
    const ab::models::CompressionModel ae = ab::models::build_compression_ae(b, c, s.batch, s.image_px);
    m.compression = true;
    m.in_channels = c.in_channels;
    m.images = ae.images;
    m.output = ae.reconstruction;
    m.loss = ae.loss;
    m.mse = ae.mse;
    return m;
  }
  ab::models::ResNetConfig c = model_config(s.model);
  c.fold_batchnorm = s.fold_batchnorm;
  c.fuse_conv_epilogue = s.fold_batchnorm && s.fuse_conv_epilogue;
  c.fuse_batchnorm_relu = !s.fold_batchnorm && s.fuse_batchnorm_relu;
  m.in_channels = c.in_channels;
  m.classes = c.num_classes;
  if (s.training) {
    const ab::models::Classifier cl = ab::models::build_classifier(b, c, s.batch, s.image_px);
    m.images = cl.images;
    m.labels = cl.labels;
    m.output = cl.logits;
    m.loss = cl.loss;
  } else {
    m.images = b.input("images", Shape{s.batch, c.in_channels, s.image_px, s.image_px});
    m.output = ab::models::resnet(b, m.images, c);
    b.mark_output(m.output);
  }
  return m;
}

nn::ParameterValues folded_parameter_values(const ModelSpec& s) {
  // Parameters do not depend on the batch: plan the unfolded network at batch 1 (no bind, no
  // memory) for its initial values.
  ModelSpec unfolded = s;
  unfolded.fold_batchnorm = unfolded.fuse_conv_epilogue = false;
  unfolded.batch = 1;
  if (unfolded.precision == Precision::fp8) unfolded.precision = Precision::fp16;  // its storage; fp8 needs the fold
  nn::GraphBuilder b(graph_options(unfolded));
  build_zoo_model(b, unfolded);
  const nn::Graph g(std::move(b));
  return ab::models::fold_batchnorm_parameters(g.initial_parameter_values(),
                                               s.fuse_conv_epilogue ? ab::models::FoldedBias::on_convolution
                                                                    : ab::models::FoldedBias::on_batchnorm);
}

namespace {

// An ONNX model's batch: its first input's values (onnx_input_values).
SyntheticBatch onnx_batch(const ZooModel& m, std::uint64_t first, const ModelSpec& s) {
  SyntheticBatch b;
  b.images = onnx_input_values(m, first, s).at(0);
  return b;
}

}  // namespace

SyntheticBatch model_batch(const ZooModel& m, std::uint64_t first, const ModelSpec& s) {
  if (!m.input_dims.empty()) return onnx_batch(m, first, s);
  const std::int64_t batch = s.batch, image_px = s.image_px;
  if (m.language) {
    ab::models::TokenBatch t =
        m.masked ? ab::models::masked_copy_batch(kDataSeed, first, batch, s.seq, m.classes, m.mask_token)
                 : ab::models::copy_task_batch(kDataSeed, first, batch, s.seq, m.classes);
    return {.images = {}, .labels = std::move(t.labels), .tokens = std::move(t.tokens)};
  }
  if (!m.compression) return synthetic_batch(kDataSeed, first, batch, m.in_channels, image_px, m.classes);
  constexpr std::int64_t kPatterns = 10;  // as tiny_resnet's classes: ten cosine patterns, noise per image
  SyntheticBatch b = synthetic_batch(kDataSeed, first, batch, m.in_channels, image_px, kPatterns);
  for (double& v : b.images) v = std::clamp(v / 3.0, -0.5, 0.5);  // |cos cos| <= 1, noise in [-0.5, 0.5]
  b.labels.clear();
  return b;
}

nn::Value model_input(const ZooModel& m) { return m.language ? m.tokens : m.images; }

void upload_batch(nn::Graph& g, const ZooModel& m, std::uint64_t first, const ModelSpec& s) {
  if (!m.onnx_inputs.empty()) {
    const std::vector<std::vector<double>> values = onnx_input_values(m, first, s);
    for (std::size_t i = 0; i < values.size(); ++i) g.set_input(m.onnx_inputs[i].value, values[i]);
    return;
  }
  const SyntheticBatch data = model_batch(m, first, s);
  if (m.language) g.set_input(m.tokens, data.tokens);
  if (m.images.id >= 0) g.set_input(m.images, data.images);
  if (m.labels.id >= 0) g.set_input(m.labels, data.labels);
}

nlohmann::json reconstruction_quality(double mse) {
  return {{"mse", mse}, {"psnr_db", ab::models::psnr_db(mse)}};
}

const std::vector<std::string>& model_precisions() {
  static const std::vector<std::string> v{"fp32", "tf32", "bf16", "fp16"};
  return v;
}

const std::vector<std::string>& infer_precisions() {
  static const std::vector<std::string> v{"fp32", "tf32", "bf16", "fp16", "fp8"};
  return v;
}

Precision parse_model_precision(const std::string& name, bool training) {
  const std::vector<std::string>& names = training ? model_precisions() : infer_precisions();
  for (const auto& p : names)
    if (p == name) return parse_precision(name);
  std::string valid;
  for (const auto& p : names) valid += (valid.empty() ? "" : ", ") + p;
  if (training && name == "fp8")
    throw UsageError("precision 'fp8' is inference only (the infer workload); valid for training: " + valid);
  throw UsageError("precision '" + name + "' has no " + (training ? "training" : "inference") + " policy; valid: " +
                   valid);
}

namespace {
std::vector<std::string> model_choices() {
  std::vector<std::string> v = model_names();
  v.push_back("*.onnx");  // AxisSpec::choices: any value with this suffix
  return v;
}
}  // namespace

std::vector<AxisSpec> model_axes(const std::string& device_kind, const ModelAxesText& text) {
  const bool gpu = device_kind == "cuda";
  const auto one = [](const std::string& v) { return std::vector<std::string>{v}; };
  return {
      {"model", AxisKind::text, one(gpu ? "resnet50" : "tiny_resnet"), model_choices(),
       "network: a built-in one, or an ONNX file (PATH.onnx; infer only)"},
      {"batch", AxisKind::integer, gpu ? text.cuda_batches : text.host_batches, {}, text.batch_help},
      {"precision", AxisKind::text, one(gpu ? text.cuda_precision : "fp32"),
       text.precisions.empty() ? model_precisions() : text.precisions, text.precision_help},
      {"image_size", AxisKind::integer, one(gpu ? "224" : "16"), {}, "image height and width in pixels (image models)"},
      {"seq",
       AxisKind::integer,
       one("0"),
       {},
       "tokens per sequence (language models; at most the model's positions); 0 = the model's positions "
       "(GPT-2 1024, BERT 512)"},
      {"layout",
       AxisKind::text,
       one("auto"),
       {"auto", "nchw", "nhwc"},
       "activation memory layout; auto: nhwc for a convolutional network on a GPU, else nchw"}};
}

void add_fusion_metric(State& state, const ModelSpec& s, const nn::Kernels& k) {
  if (!s.fuse_conv_epilogue && !s.fuse_batchnorm_relu) return;
  const nn::Kernels::FusionCounts c = k.fusion_counts();
  state.add_metric("fusion", {{"fused_shapes", c.fused}, {"unfused_shapes", c.unfused}, {"notes", k.fusion_notes()}});
}

// layout=auto: NHWC on a GPU (cuDNN's fast layout, the fused and fp8 paths), NCHW on the CPU; but
// NCHW for an imported network of at most one Conv (ViT's patch embedding, BERT): its rank-4
// tensors are attention heads [B, H, T, D], which NHWC would store heads-innermost, turning every
// reshape and heads transpose into an element-wise permute (ViT-B/16 at batch 64 on an H200 spent
// 57% of its time in such reshapes). The built-in language models hold no rank-4 activations.
Layout layout_of(const std::string& axis, const std::string& model, bool gpu) {
  if (axis != "auto") return parse_layout(axis);
  if (!gpu || (is_onnx_model(model) && onnx_conv_count(model) <= 1)) return Layout::nchw;
  return Layout::nhwc;
}

void add_layout_metric(State& state, const ModelSpec& s) {
  if (state.get_text("layout") == "auto") state.add_metric("layout", std::string(to_string(s.layout)));
}

ModelSpec model_spec(const State& state, bool training) {
  ModelSpec spec;
  spec.model = state.get_text("model");
  spec.batch = state.get_int("batch");
  spec.image_px = state.get_int("image_size");
  spec.seq = state.get_int("seq");
  if (spec.seq == 0 && is_language_model(spec.model)) spec.seq = language_config(spec.model).positions;
  spec.precision = parse_model_precision(state.get_text("precision"), training);
  spec.layout = layout_of(state.get_text("layout"), spec.model, state.backend().info().kind == "cuda");
  spec.training = training;
  // Checked before any graph is planned: a batch of images whose size overflows 64 bits is refused
  // (`invalid`); one that fits in 64 bits but not in the device is left to the memory plan, whose
  // arena the bind refuses (`oom`, with the plan's size). Sizes below 1 are refused by train and infer.
  if (spec.batch < 1 || spec.image_px < 1 || spec.seq < 0) return spec;
  if (is_onnx_model(spec.model)) {
    // The file fixes the input; image_size does not apply (the records keep the model's size).
    const std::vector<std::int64_t> dims = onnx_input_dims(spec.model);
    spec.image_px = dims.size() == 4 ? dims[2] : 1;
    return spec;
  }
  if (is_language_model(spec.model)) {
    const LanguageConfig c = language_config(spec.model);
    ab::models::check_language_model(c.name, c.heads, c.channels, c.vocab, c.positions, spec.batch, spec.seq);
    checked_mul(checked_mul(checked_mul(spec.batch, spec.seq, "batch x seq"), c.vocab, "logits"), 8, "logits bytes");
    return spec;
  }
  const std::int64_t pixels = checked_mul(spec.image_px, spec.image_px, "image_size x image_size");
  checked_mul(checked_mul(checked_mul(spec.batch, 3, "batch x 3 channels"), pixels, "input elements"), 8,
              "input bytes");
  return spec;
}

SyntheticBatch synthetic_batch(std::uint64_t seed, std::uint64_t first, std::int64_t batch, std::int64_t channels,
                               std::int64_t image_px, std::int64_t classes) {
  SyntheticBatch b;
  const auto px = static_cast<std::size_t>(image_px);
  const std::size_t per_image = static_cast<std::size_t>(channels) * px * px;
  b.images.resize(static_cast<std::size_t>(batch) * per_image);
  b.labels.resize(static_cast<std::size_t>(batch));
  std::vector<double> row(px), col(px);
  const double two_pi = 2.0 * std::numbers::pi;
  for (std::int64_t n = 0; n < batch; ++n) {
    const std::uint64_t id = first + static_cast<std::uint64_t>(n);
    const auto label = static_cast<std::int64_t>(mix64(seed, id) % static_cast<std::uint64_t>(classes));
    b.labels[static_cast<std::size_t>(n)] = static_cast<double>(label);
    const std::uint64_t noise_seed = mix64(seed ^ 0x6e6f697365ULL, id);
    double* out = b.images.data() + static_cast<std::size_t>(n) * per_image;
    for (std::int64_t c = 0; c < channels; ++c) {
      // The class sets each channel's spatial frequencies and phases; the sample adds noise.
      const std::uint64_t key = static_cast<std::uint64_t>(label * channels + c);
      const double fh = static_cast<double>(1 + mix64(seed + 1, 4 * key) % 4);
      const double fw = static_cast<double>(1 + mix64(seed + 1, 4 * key + 1) % 4);
      const double ph = uniform(seed + 2, 2 * key, 0, two_pi), pw = uniform(seed + 2, 2 * key + 1, 0, two_pi);
      for (std::size_t i = 0; i < px; ++i) {
        row[i] = std::cos(two_pi * fh * static_cast<double>(i) / static_cast<double>(px) + ph);
        col[i] = std::cos(two_pi * fw * static_cast<double>(i) / static_cast<double>(px) + pw);
      }
      const std::size_t base = static_cast<std::size_t>(c) * px * px;
      for (std::size_t h = 0; h < px; ++h)
        for (std::size_t w = 0; w < px; ++w) {
          const std::size_t i = base + h * px + w;
          out[i] = row[h] * col[w] + uniform(noise_seed, i, -0.5, 0.5);
        }
    }
  }
  return b;
}

nn::GraphOptions graph_options(const ModelSpec& s) {
  nn::GraphOptions o;
  o.dtype = DType::f32;
  o.precision = s.precision;
  o.layout = s.layout;
  o.training = s.training;
  o.seed = 1;
  return o;
}

std::vector<double> reference_logits(const ModelSpec& s) {
  static std::mutex mutex;
  static std::map<std::string, std::vector<double>> cache;
  const bool language = is_language_model(s.model);
  const std::string key = s.model + "/" + (language ? "seq " + std::to_string(s.seq) : std::to_string(s.image_px)) +
                          "/" + std::string(to_string(s.layout)) + "/" + s.inputs_file;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  // Sample 0 alone, unfolded and unfused, in f64: the function every device graph of the point computes.
  ModelSpec ref = s;
  ref.batch = 1;
  ref.precision = Precision::fp32;
  ref.training = false;
  ref.fold_batchnorm = ref.fuse_conv_epilogue = ref.fuse_batchnorm_relu = false;
  nn::GraphOptions o = graph_options(ref);
  o.dtype = DType::f64;
  auto kernels = nn::make_ref_kernels();
  nn::GraphBuilder b(o);
  const ZooModel m = build_zoo_model(b, ref);
  if (m.compression) throw Error("reference_logits: '" + s.model + "' has no logits (an autoencoder)");
  nn::Graph g(std::move(b));
  g.bind(*kernels);
  set_model_parameters(g, m, ref);
  upload_batch(g, m, 0, ref);
  g.forward(false);
  std::vector<double> out = g.read(m.output);
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, out);
  return out;
}

// Logits of a randomly initialised network through ~50 layers: each layer rounds its output to
// the storage precision, so the error grows like sqrt(depth) x the unit roundoff; cuDNN's fp32
// algorithms (Winograd, FFT) add about 1e-5 per convolution.
// fp8: e4m3 keeps 3 mantissa bits (unit roundoff 2^-4 = 0.0625) and each fp8 convolution rounds
// both x and w to it. Measured on the reference kernels (batch 1, nchw, seed 1): tiny_resnet (one
// fp8 layer) 8.8e-3 at 16 px and 9.5e-3 at 32; resnet50 (52 fp8 layers) 0.092 / 0.100 / 0.065 at
// 16 / 32 / 64 px; resnet101 (103) 0.092 / 0.105 / 0.087; resnext50_32x4d (36) 0.058 / 0.061 /
// 0.039; resnext101_32x4d (70) 0.058 / 0.063 / 0.043; fp16 on resnet50 at 32 px: 1.2e-3. 0.25 is
// 4 units of e4m3 roundoff, 2.4x the largest of these. A random network's logits are close
// together, so top-1 can change even so (resnet50 at 32 px: it did; metrics.accuracy says).
double logits_tolerance(Precision p) {
  switch (p) {
    case Precision::fp32: return 2e-3;
    case Precision::tf32: return 3e-2;
    case Precision::fp16: return 3e-2;
    case Precision::bf16: return 1e-1;
    case Precision::fp8: return 2.5e-1;
    default: return 0;
  }
}

nlohmann::json logits_accuracy(const std::vector<double>& got, const std::vector<double>& want,
                               std::int64_t interleaved) {
  if (got.size() != want.size() || got.empty() || interleaved < 1 ||
      got.size() % static_cast<std::size_t>(interleaved) != 0)
    throw Error("logits_accuracy: " + std::to_string(got.size()) + " logits against " + std::to_string(want.size()) +
                " in " + std::to_string(interleaved) + " interleaved sets");
  // The argmax of each set (every interleaved-th logit from offset j): all must agree.
  const auto top1 = [interleaved](const std::vector<double>& v, std::size_t j) {
    std::size_t best = j;
    for (std::size_t i = j; i < v.size(); i += static_cast<std::size_t>(interleaved))
      if (v[i] > v[best]) best = i;
    return best;
  };
  bool agrees = true;
  for (std::size_t j = 0; j < static_cast<std::size_t>(interleaved); ++j)
    agrees = agrees && top1(got, j) == top1(want, j);
  return {{"logits_rel_error_vs_f64", backend::ref::rel_error(got, want)}, {"top1_agrees_f64", agrees}};
}

void add_fp8_metric(State& state, const ModelSpec& s, const nn::Graph& g, const std::string& fp8_layers) {
  if (s.precision != Precision::fp8) return;
  std::int64_t layers = 0, fallback = 0, slower = 0;
  std::vector<std::string> reasons;
  for (std::size_t i = 0; i < g.op_count(); ++i) {
    const nn::Fp8Choice* c = g.op(i).fp8_choice();  // convolutions and linear layers
    if (c == nullptr || !c->asked) continue;
    if (c->runs) {
      ++layers;
      continue;
    }
    ++fallback;
    const std::string& why = c->fallback_reason;
    // A layer left in 16 bits by the timing is counted, not listed: each reason names its shape.
    if (why.find(nn::kFp8SlowerReason) != std::string::npos)
      ++slower;
    else if (std::find(reasons.begin(), reasons.end(), why) == reasons.end())
      reasons.push_back(why);
  }
  // How the activations are scaled, since it decides what the point says about fp8 hardware: each
  // fp8 convolution first reads its 16-bit input twice (amax, then quantize), which costs more than
  // the narrower convolution saves on many of a ResNet's layers on an H200 (bench/HISTORY.md).
  state.add_metric("fp8", {{"layers", layers},
                           {"fallback_layers", fallback},
                           {"fallback_slower_layers", slower},
                           {"fallback_reasons", reasons},
                           {"layer_choice", fp8_layers},
                           {"activation_scaling", "dynamic per tensor: amax and quantize passes before each fp8 "
                                                  "convolution"}});
}

}  // namespace ab::workloads::zoo
