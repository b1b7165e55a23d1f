// The zoo's ONNX case: a model axis value ending in .onnx is a user's file, imported (src/onnx)
// into the same inference graph, passes and checks as a built-in classifier. Builds without the
// ONNX libraries refuse such a value with the reason; this is the one place that knows.
#include <fstream>
#include <mutex>

#include "core/error.h"
#include "workloads/models/models.h"

#ifdef ACCELBENCH_WITH_ONNX
#include "onnx/onnx.h"
#endif

namespace ab::workloads::zoo {

bool is_onnx_model(const std::string& name) { return name.size() > 5 && name.ends_with(".onnx"); }

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

std::string inspect_onnx(const std::string& path, bool* importable) {
  const onnx::Inspection i = onnx::inspect(path);
  *importable = i.unsupported.empty() && i.error.empty();
  return onnx::to_text(i);
}

#endif

}  // namespace ab::workloads::zoo
