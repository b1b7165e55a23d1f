// `accelbench inspect model.onnx`: what the file holds and what the engine makes of it at batch 1.
#include <fstream>
#include <sstream>

#include "onnx/internal.h"

namespace ab::onnx {

Inspection inspect(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot open ONNX model " + path.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  auto state = load_state(bytes.str(), path.filename().string(), path.parent_path());
  Inspection r;
  r.facts = state->facts;
  r.unsupported = state->unsupported;
  if (!r.unsupported.empty()) return r;
  const Model model(std::move(state));
  try {
    nn::GraphOptions o;
    o.training = false;
    nn::GraphBuilder b(o);
    const Imported imported = import(b, model, ImportOptions{1, Fold::fused});
    const nn::Graph g(std::move(b));
    r.parameters = g.parameter_count();
    r.flops_per_sample = g.forward_flops();
    for (const auto& op : g.report()) ++r.engine_ops[op.kind];
    r.fused = imported.fused;
  } catch (const UsageError& e) {
    r.error = e.what();
  }
  return r;
}

std::string to_text(const Inspection& i) {
  std::ostringstream out;
  const ModelFacts& f = i.facts;
  out << f.file_name << ": " << f.file_bytes << " bytes, sha256 " << f.sha256 << "\n"
      << "  opset " << f.opset << ", producer " << (f.producer.empty() ? "(none)" : f.producer) << "\n"
      << "  input" << (f.inputs.size() > 1 ? "s" : "");
  for (std::size_t k = 0; k < f.inputs.size(); ++k) {
    const InputFacts& in = f.inputs[k];
    out << (k ? ", '" : " '") << in.name << "' " << in.shape.to_string();
    if (in.indices) out << " token ids (rows " << in.index_rows << ")";
    else if (in.integer) out << " integers";
  }
  out << (f.symbolic_batch ? " (batch symbolic: bound per batch value)" : " (batch fixed)") << "; output '"
      << f.output_name << "'\n"
      << "  initializer elements " << f.initializer_elements << "\n  ONNX ops:";
  for (const auto& [op, count] : f.op_histogram) out << " " << op << " " << count << ";";
  out << "\n";
  if (!i.unsupported.empty()) {
    out << "  UNSUPPORTED (" << i.unsupported.size() << " op types; nothing can run until they map):\n";
    for (const auto& line : i.unsupported) out << "    " << line << "\n";
    return out.str();
  }
  if (!i.error.empty()) {
    out << "  NOT IMPORTABLE: " << i.error << "\n";
    return out.str();
  }
  out << "  engine graph at batch 1: " << i.parameters << " parameters, "
      << static_cast<double>(i.flops_per_sample) / 1e9 << " GFLOP per sample\n  engine ops:";
  for (const auto& [op, count] : i.engine_ops) out << " " << op << " " << count << ";";
  out << "\n  fused chains (fold=fused): " << i.fused.size() << "\n";
  for (const auto& line : i.fused) out << "    " << line << "\n";
  return out.str();
}

}  // namespace ab::onnx
