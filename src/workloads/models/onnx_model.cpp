// The zoo's ONNX case: a model axis value ending in .onnx is a user's file, imported (src/onnx)
// into the same inference graph, passes and checks as a built-in classifier. Builds without the
// ONNX libraries refuse such a value with the reason; this is the one place that knows.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "core/error.h"
#include "core/rng.h"
#include "workloads/models/models.h"

#ifdef ACCELBENCH_WITH_ONNX
#include "onnx/onnx.h"
#endif

namespace ab::workloads::zoo {

bool is_onnx_model(const std::string& name) { return name.size() > 5 && name.ends_with(".onnx"); }

const char* const kOnnxInputsHelp =
    "ONNX models: FILE for the first input, or NAME:FILE,NAME:FILE per input; raw little-endian samples "
    "(float32 for a float input, int64 for token ids or a mask; row-major, the input's shape without the "
    "batch, one sample after another) used instead of the synthetic data; inputs named by no file stay "
    "synthetic. infer: at least `batch` samples, for the checks and the timed batch; loadgen: at least "
    "`max_batch`, the SUT's pool of distinct samples";

void set_model_parameters(nn::Graph& g, const ZooModel& m, const ModelSpec& s) {
  if (m.parameters) g.set_parameter_values(*m.parameters);
  else if (s.fold_batchnorm) g.set_parameter_values(folded_parameter_values(s));
}

#ifndef ACCELBENCH_WITH_ONNX

namespace {
[[noreturn]] void no_onnx(const std::string& path) {
  throw UsageError("'" + path +
                   "' is an ONNX model, and this build of accelbench has no ONNX support: install "
                   "libonnx-dev and libprotobuf-dev (scripts/install-deps.sh) and rebuild");
}
}  // namespace

ZooModel build_onnx_model(nn::GraphBuilder&, const ModelSpec& s) { no_onnx(s.model); }
std::vector<std::int64_t> onnx_input_dims(const std::string& path) { no_onnx(path); }
std::size_t onnx_input_count(const std::string& path) { no_onnx(path); }
std::int64_t onnx_conv_count(const std::string& path) { no_onnx(path); }
std::vector<std::vector<double>> onnx_input_values(const ZooModel&, std::uint64_t, const ModelSpec& s) {
  no_onnx(s.model);
}
std::int64_t onnx_input_file_samples(const ZooModel&, const ModelSpec& s) { no_onnx(s.model); }
std::string inspect_onnx(const std::string& path, bool*) { no_onnx(path); }

#else

namespace {

// The last model loaded, by path: a sweep's points (and the float64 reference) share one load.
std::shared_ptr<const onnx::Model> load(const std::string& path) {
  static std::mutex mutex;
  static std::string loaded_path;
  static std::shared_ptr<const onnx::Model> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded_path != path || !loaded) {
    loaded.reset();
    loaded = onnx::Model::load(path);
    loaded_path = path;
  }
  return loaded;
}

onnx::Fold fold_of(const ModelSpec& s) {
  if (!s.fold_batchnorm) return onnx::Fold::off;
  return s.fuse_conv_epilogue ? onnx::Fold::fused : onnx::Fold::on;
}

nlohmann::json record_block(const onnx::ModelFacts& f, const std::vector<std::string>& fused) {
  return {{"file", f.file_name},
          {"bytes", f.file_bytes},
          {"sha256", f.sha256},
          {"opset", f.opset},
          {"producer", f.producer},
          {"ops", f.op_histogram},
          {"input", f.input_name},
          {"input_shape", f.input_shape.to_string()},
          {"inputs",
           [&] {
             nlohmann::json list = nlohmann::json::array();
             for (const auto& in : f.inputs)
               list.push_back({{"name", in.name},
                               {"shape", in.shape.to_string()},
                               {"kind", in.indices   ? "token_ids"
                                        : in.integer ? "integers"
                                                     : "float"}});
             return list;
           }()},
          {"symbolic_batch", f.symbolic_batch},
          {"initializer_elements", f.initializer_elements},
          {"fused_chains", fused.size()}};
}

}  // namespace

ZooModel build_onnx_model(nn::GraphBuilder& b, const ModelSpec& s) {
  if (s.training) throw UsageError("ONNX models run inference only (infer, loadgen's model SUT), not training");
  if (s.dropout != 0.0) throw UsageError("dropout applies to the zoo's language models, not an ONNX model");
  const auto model = load(s.model);
  onnx::Imported imported = onnx::import(b, *model, {s.batch, fold_of(s)});
  ZooModel m;
  m.images = imported.input;
  m.output = imported.output;
  const std::vector<onnx::InputFacts>& inputs = model->facts().inputs;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    ZooModel::OnnxInput in{inputs[i].name,    imported.inputs.at(i), {},
                           inputs[i].integer, inputs[i].indices,     inputs[i].index_rows};
    const Shape shape = b.desc(in.value).shape;
    for (int k = 0; k < shape.rank(); ++k) in.dims.push_back(shape[k]);
    m.onnx_inputs.push_back(std::move(in));
  }
  const Shape in = b.desc(imported.input).shape, out = b.desc(imported.output).shape;
  for (int i = 0; i < in.rank(); ++i) m.input_dims.push_back(in[i]);
  m.in_channels = in.rank() > 1 ? in[1] : 1;
  m.classes = out.rank() > 1 ? out[out.rank() - 1] : 1;
  m.parameters = std::make_shared<const nn::ParameterValues>(std::move(imported.parameters));
  m.onnx = record_block(model->facts(), imported.fused);
  return m;
}

std::vector<std::int64_t> onnx_input_dims(const std::string& path) {
  const Shape s = load(path)->facts().input_shape;
  std::vector<std::int64_t> dims;
  for (int i = 0; i < s.rank(); ++i) dims.push_back(s[i]);
  return dims;
}

std::size_t onnx_input_count(const std::string& path) { return load(path)->facts().inputs.size(); }

std::int64_t onnx_conv_count(const std::string& path) {
  const auto& ops = load(path)->facts().op_histogram;
  const auto it = ops.find("Conv");
  return it == ops.end() ? 0 : it->second;
}

namespace {

// `inputs`: FILE (the first input) or NAME:FILE,NAME:FILE; the file named for `input`, or "".
std::string inputs_file_of(const std::string& option, const ZooModel& m, std::size_t input) {
  if (option.empty()) return "";
  bool named = false;
  std::string found;
  std::size_t start = 0;
  while (start <= option.size()) {
    const std::size_t end = std::min(option.find(',', start), option.size());
    const std::string item = option.substr(start, end - start);
    const std::size_t colon = item.find(':');
    const std::string name = colon == std::string::npos ? "" : item.substr(0, colon);
    const bool is_input = std::any_of(m.onnx_inputs.begin(), m.onnx_inputs.end(),
                                      [&](const ZooModel::OnnxInput& in) { return in.name == name; });
    if (is_input) {
      named = true;
      if (name == m.onnx_inputs[input].name) found = item.substr(colon + 1);
    } else if (option.find(',') != std::string::npos) {
      throw UsageError("inputs: '" + item + "' names no input of the model (NAME:FILE, NAME one of its inputs)");
    }
    start = end + 1;
  }
  if (!named) return input == 0 ? option : "";  // one FILE: the first input's
  return found;
}

// An input's values in a raw inputs file: float32 for a float input, int64 for an integer one.
std::size_t value_bytes(const ZooModel::OnnxInput& in) { return in.integer ? sizeof(std::int64_t) : sizeof(float); }

// Values of one sample: every dimension's but the batch's.
std::int64_t values_per_sample(const ZooModel::OnnxInput& in) {
  std::int64_t n = 1;
  for (std::size_t k = 1; k < in.dims.size(); ++k) n *= in.dims[k];
  return n;
}

// Samples first.. of a raw file.
std::vector<double> read_input_file(const std::string& path, const ZooModel::OnnxInput& in, std::uint64_t first,
                                    std::size_t count, std::int64_t per_sample) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw UsageError("cannot open the inputs file " + path);
  const std::size_t width = value_bytes(in);
  std::vector<char> raw(count * width);
  file.seekg(static_cast<std::streamoff>(first * static_cast<std::uint64_t>(per_sample) * width));
  file.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  if (!file)
    throw UsageError("the inputs file " + path + " holds fewer than " +
                     std::to_string(first + count / static_cast<std::size_t>(per_sample)) + " samples of " +
                     std::to_string(per_sample) + (in.integer ? " int64" : " float32") + " values for input '" +
                     in.name + "'");
  std::vector<double> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (in.integer) {
      std::int64_t x = 0;
      std::memcpy(&x, raw.data() + i * width, width);
      if (in.indices && (x < 0 || x >= in.index_rows))
        throw UsageError("the inputs file " + path + ": token id " + std::to_string(x) + " of input '" + in.name +
                         "' is outside [0, " + std::to_string(in.index_rows) + ")");
      v[i] = static_cast<double>(x);
    } else {
      float x = 0;
      std::memcpy(&x, raw.data() + i * width, width);
      v[i] = x;
    }
  }
  return v;
}

std::vector<double> synthetic_input(const ZooModel& m, const ZooModel::OnnxInput& in, std::uint64_t first,
                                    std::size_t count, std::int64_t per_sample, std::int64_t batch) {
  const auto& d = in.dims;
  if (!in.integer && d.size() == 4 && d[2] == d[3])
    return synthetic_batch(kDataSeed, first, batch, d[1], d[2], std::max<std::int64_t>(m.classes, 1)).images;
  const bool segments = in.name.find("token_type") != std::string::npos;
  std::vector<double> v(count, in.indices ? 0.0 : 1.0);
  const std::uint64_t offset = first * static_cast<std::uint64_t>(per_sample);
  if (!in.integer)
    for (std::size_t i = 0; i < count; ++i) v[i] = uniform(kDataSeed, offset + i, -1.0, 1.0);
  else if (in.indices && !segments)
    for (std::size_t i = 0; i < count; ++i)
      v[i] =
          static_cast<double>(mix64(kDataSeed ^ 0x746f6bULL, offset + i) % static_cast<std::uint64_t>(in.index_rows));
  return v;
}

}  // namespace

std::vector<std::vector<double>> onnx_input_values(const ZooModel& m, std::uint64_t first, const ModelSpec& s) {
  std::vector<std::vector<double>> values;
  for (std::size_t i = 0; i < m.onnx_inputs.size(); ++i) {
    const ZooModel::OnnxInput& in = m.onnx_inputs[i];
    const std::int64_t per_sample = values_per_sample(in);
    const auto count = static_cast<std::size_t>(s.batch * per_sample);
    const std::string file = inputs_file_of(s.inputs_file, m, i);
    values.push_back(file.empty() ? synthetic_input(m, in, first, count, per_sample, s.batch)
                                  : read_input_file(file, in, first, count, per_sample));
  }
  return values;
}

std::int64_t onnx_input_file_samples(const ZooModel& m, const ModelSpec& s) {
  std::int64_t fewest = -1;
  for (std::size_t i = 0; i < m.onnx_inputs.size(); ++i) {
    const std::string file = inputs_file_of(s.inputs_file, m, i);
    if (file.empty()) continue;
    const ZooModel::OnnxInput& in = m.onnx_inputs[i];
    const std::int64_t sample_bytes = values_per_sample(in) * static_cast<std::int64_t>(value_bytes(in));
    if (sample_bytes <= 0) continue;  // an input of no values bounds nothing
    std::error_code ec;
    const auto bytes = static_cast<std::int64_t>(std::filesystem::file_size(file, ec));
    if (ec) throw UsageError("cannot read the size of the inputs file " + file + ": " + ec.message());
    const std::int64_t samples = bytes / sample_bytes;
    fewest = fewest < 0 ? samples : std::min(fewest, samples);
  }
  return std::max<std::int64_t>(fewest, 0);
}

std::string inspect_onnx(const std::string& path, bool* importable) {
  const onnx::Inspection i = onnx::inspect(path);
  *importable = i.unsupported.empty() && i.error.empty();
  return onnx::to_text(i);
}

#endif

}  // namespace ab::workloads::zoo
